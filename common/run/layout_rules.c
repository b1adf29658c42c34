/* layout_rules.c: see layout_rules.h. */
#include "common/run/layout_rules.h" /* shared refusals of a layout */

#include <stdio.h>

/* The message of a refusal, in one static buffer (layout_rules.h). */
static char message[320];

const char *tensor_parallel_problem(const ModelConfig *cfg, int tp) {
    if (cfg->heads % tp != 0)
        snprintf(message, sizeof message,
                 "--tp %d does not divide --heads %d: tensor parallelism gives every rank whole heads "
                 "(valid: a divisor of the heads)",
                 tp, cfg->heads);
    else if (4 * cfg->dmodel % tp != 0)
        snprintf(message, sizeof message,
                 "--tp %d does not divide the MLP width 4 x --dmodel = %d (valid: a divisor of %d)", tp,
                 4 * cfg->dmodel, 4 * cfg->dmodel);
    else if (vocab_padded(cfg->vocab) % tp != 0)
        snprintf(message, sizeof message,
                 "--tp %d does not divide the padded vocabulary of --vocab %d = %d rows: every rank holds "
                 "an equal share of wte and the head (valid: a --tp dividing %d, or a --vocab whose "
                 "multiple of 128 it divides)",
                 tp, cfg->vocab, vocab_padded(cfg->vocab), vocab_padded(cfg->vocab));
    else
        return NULL;
    return message;
}

const char *zero_flags_problem(const Config *cfg, int zero, int P, int T, int print_schedule) {
    const char *replica_flags[] = {"--dp-mode",        "--allreduce",     "--bucket-mb",
                                   "--check-replicas", "--print-buckets", NULL}; /* 04's whole replicas */
    for (const char **name = replica_flags; *name && (zero > 0 || (P == 1 && T == 1)); name++)
        if (flag_given(cfg, *name)) {
            snprintf(message, sizeof message,
                     "%s is chapter 04's, for whole replicas; ZeRO keeps them here (valid: --zero 0 "
                     "with --pp > 1 or --tp > 1)",
                     *name);
            return message;
        }
    if (flag_given(cfg, "--virtual") && (zero > 0 || (P == 1 && T == 1)))
        return "--virtual (interleaved chunks) with ZeRO is not written yet: a stage's shards are one "
               "range of units, and its chunks are not (valid: --zero 0 with --pp > 1)";
    if (flag_given(cfg, "--schedule") && P == 1 && T == 1)
        return "--schedule orders pipeline stages; with --pp 1 --tp 1 ZeRO runs its own one-stage "
               "step (valid: --schedule with --pp > 1 or --tp > 1)";
    if (flag_given(cfg, "--prefetch") && zero != 3)
        return "--prefetch needs --zero 3 (only stage 3 gathers parameters)";
    if (print_schedule && P == 1 && T == 1 && zero != 3)
        return "--print-schedule needs --zero 3 (only stage 3 has a gather/free schedule)";
    if (zero == 3 && P > 1) {
        snprintf(message, sizeof message,
                 "--zero 3 with --pp %d is refused: every stage would re-gather its parameters for every "
                 "micro-batch's forward and backward (DeepSpeed refuses it too; valid: --zero 0-2)",
                 P);
        return message;
    }
    if (zero == 3 && T > 1) {
        snprintf(message, sizeof message,
                 "--zero 3 with --tp %d is not written: stage 3's gather/free schedule runs in ZeRO's "
                 "one-stage trainer over whole units, and a tensor-parallel stage keeps its slices bound "
                 "for the whole step (valid: --zero 0-2)",
                 T);
        return message;
    }
    return NULL;
}
