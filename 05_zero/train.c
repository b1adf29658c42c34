/* 05_zero/train.c: data parallelism without redundancy (ZeRO stages 0-3).
 *
 * Chapter 02's loop, with the model state cut across the N ranks instead of
 * copied onto each (zero.h has the table of what each stage keeps). Every
 * rank still trains on 1/N of the global batch and the gradients are still
 * summed over the ranks, so the losses are chapter 01's; what changes is
 * which collective moves which state, and how much memory each rank needs:
 *
 *   for each micro-batch of this rank's share:
 *       data -> forward (stage 3: gather each unit, free it after)
 *            -> backward (stages 2-3: reduce-scatter each unit's gradient as it is done)
 *   stages 0-1: sum the gradients (0: all-reduce; 1: reduce-scatter)
 *   gradient norm from the slices -> clip -> AdamW on this rank's slices
 *   stages 1-2: all-gather the updated parameters -> log
 *
 * With --precision bf16|fp16 the parameters, gradients and collectives are
 * 16 bits and the optimizer keeps fp32 master weights of its slices (zero.h);
 * fp16 scales the loss and skips a step that overflowed on any rank. */
#include "comm.h"
#include "config.h"
#include "device.h"
#include "evaluate.h"
#include "grid.h"
#include "harness.h"
#include "mixed.h"
#include "model.h"
#include "optim.h"
#include "util.h"
#include "zero.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#define PROGRAM "05_zero/train"

/* ---- this chapter's flags ---- */
typedef struct {
    int stage;          /* --zero 0..3 */
    int prefetch;       /* --prefetch K: stage 3 gathers K units ahead */
    int print_schedule; /* print stage 3's gather/free schedule */
    int ranks;          /* the world size, for the checks */
} ZeroFlags;

/* --help's section and one row per flag (config.h says how to add one) */
static const Flag zero_flags[] = {
    {.type = FLAG_SECTION,
     .help = "ZeRO data parallel (run with mpirun -np N; the model state is sharded over the N ranks)"},
    {"--zero", FLAG_INT, FIELD(ZeroFlags, stage), 0, 3, .def = "1", .usage = "--zero 0|1|2|3",
     .help = "0: every rank holds everything, gradients all-reduced (chapter 02's\n"
             "flat mode); 1: optimizer state sharded; 2: gradients too; 3: parameters\n"
             "too (default {default}). Any number of ranks: every unit is padded to a\n"
             "multiple of N (zeros nobody updates), so N may exceed a unit's size"},
    {"--prefetch", FLAG_INT, FIELD(ZeroFlags, prefetch), 0, 64, .def = "1", .usage = "--prefetch K",
     .help = "stage 3: gather the next K units (on a communication thread) while\n"
             "the current one computes, 0..64 (default {default}; needs --zero 3)"},
    {"--print-schedule", FLAG_SWITCH, FIELD(ZeroFlags, print_schedule), .usage = "--print-schedule",
     .help = "stage 3: print one micro-batch's gather/free schedule (needs --zero 3)"},
    {0},
};

/* Stage 3's flags mean nothing below it: refused, not ignored. Each rank
 * needs a whole number of micro-batches of at least one sequence. */
static void check_zero_layout(const Config *cfg, const void *values) {
    const ZeroFlags *f = values;
    if (flag_given(cfg, "--prefetch") && f->stage != 3)
        fatal(EXIT_USAGE, "--prefetch needs --zero 3 (only stage 3 gathers parameters)");
    if (f->print_schedule && f->stage != 3)
        fatal(EXIT_USAGE, "--print-schedule needs --zero 3 (only stage 3 has a gather/free schedule)");
    int sequences_per_micro = f->ranks * cfg->micro;
    if (cfg->batch < sequences_per_micro || cfg->batch % sequences_per_micro)
        fatal(EXIT_USAGE, "--batch %d does not split into %d ranks x --micro %d (valid: a multiple of %d)",
              cfg->batch, f->ranks, cfg->micro, sequences_per_micro);
}

/* What the run harness (harness.h) needs to know of this program: its
 * flags; steps.csv's bytes_sent and comm_busy_ms; every rank starts each
 * step together, the timeline's one time origin. */
static const RunSpec spec = {
    .program = PROGRAM,
    .summary = "Train a GPT with ZeRO: data parallelism with the model state sharded over the ranks.",
    .flags = {.flags = zero_flags, .check = check_zero_layout, .multi_rank = 1},
    .bytes_sent = 1,
    .comm_busy = 1,
    .barrier_each_step = 1};

/* Validation loss and the sample need the whole model in fp32: stage 3
 * gathers it for them, 16-bit runs widen it (every rank takes part; rank 0
 * uses it). Its buffer is allocated before step 1 and kept, because every
 * run evaluates at its last step: a budget that cannot hold it is refused
 * at start-up, not after the whole run has trained. NULL when the model is
 * held whole in fp32 already (stages 0-2 in fp32). */
static float *alloc_whole_model(const Zero *z) {
    if (!zero_needs_whole(z)) return NULL;
    return mem_alloc(SPACE_DEVICE, CAT_WORKSPACE, z->model->num_params * sizeof(float),
                     "the whole model in fp32 for evaluation");
}

static double evaluate_and_sample(Zero *z, float *whole, Activations *acts, Scratch *scratch,
                                  const Dataset *data, const Config *cfg, int sample, uint64_t *rng) {
    GPT *model = z->model;
    if (whole) zero_bind_whole(z, whole);
    double val_loss = NAN;
    if (comm_rank(z->group) == 0) {
        val_loss = evaluate_loss(model, acts, scratch, data, cfg);
        if (sample > 0) sample_text(model, acts, scratch, data, sample, rng);
    }
    if (whole) zero_unbind_whole(z);
    return val_loss;
}

int main(int argc, char **argv) {
    Config cfg;
    ZeroFlags zf = {0};
    Run run; /* start-up, logs, evaluation, saves and the summary: harness.h */
    run_start_ranks(&run, &cfg, &argc, &argv, &spec, &zf, &zf.ranks);
    int ranks = run.ranks;
    ProcessGrid grid; /* every rank a replica, dp = world, sharing the model state (grid.h) */
    grid_create(&grid, run.world, (GridShape){.dp = ranks, .pp = 1, .cp = 1, .tp = 1});

    /* ---- build: device, data, output files (the harness); the sharded model and optimizer ---- */
    run_prepare(&run);
    GPT model;
    Zero zero;
    zero_create_precision(&zero, &model, &cfg.model, cfg.seed, zf.stage, zf.prefetch, grid.dp_group,
                          cfg.precision);
    const UnitHooks *hooks = zero_hooks(&zero);
    int per_rank = cfg.batch / ranks; /* this rank's share of the global batch */
    int B = per_rank / cfg.micro, T = cfg.model.seq, L = cfg.model.layers;
    Activations acts;
    activations_create_model(&acts, &cfg.model, B, T, cfg.recompute);
    Scratch scratch;
    scratch_create(&scratch, &cfg.model, B, T, cfg.recompute);
    float *whole = alloc_whole_model(&zero);
    /* each rank writes and reads its own shards of the whole model's arrays */
    ckpt_layout_init(&run.ckpt, "%s: %d ranks, zero %d", PROGRAM, ranks, zf.stage);
    zero_checkpoint_layout(&zero, &run.ckpt);
    if (run_resume(&run, &zero.opt.t)) zero_weights_from_master(&zero); /* 16 bits: from the fp32 weights */

    char prefetch[32] = ""; /* stage 3 only: the other stages gather nothing */
    if (zf.stage == 3) snprintf(prefetch, sizeof prefetch, " | prefetch %d", zf.prefetch);
    log_info("%s | %d ranks | device %s | comm %s | zero %d%s | %zu parameters, %zu per shard | "
             "batch %d = %d ranks x %d micro-batches x %d sequences | %s\n",
             PROGRAM, ranks, device_name(), comm_transport_name(), zf.stage, prefetch, model.num_params,
             zero.shard_n, cfg.batch, ranks, cfg.micro, B, precision_name(cfg.precision));
    log_resumed(&cfg, run.first_step);
    if (zf.print_schedule) zero_print_schedule(zero.actions, zero.num_actions);

    for (int step = run.first_step; step < run.last_step; step++) {
        RunStep s = run_step_begin(&run, step); /* all ranks together: one time origin for the timeline */
        Timer timer = {0};
        zero_start_clock(&zero, step);

        /* ---- forward and backward over this rank's micro-batches ---- */
        zero_begin_step(&zero);
        double loss_sum = 0.0;
        for (int mb = 0; mb < cfg.micro; mb++) {
            int first_sequence = run.rank * per_rank + mb * B; /* where this piece sits in the global batch */
            data_upload_batch(&run.data, SPLIT_TRAIN, cfg.seed, step, first_sequence, B, T, acts.tokens,
                              acts.targets);
            zero_begin_micro(&zero, mb);

            timer_start(&timer);
            gpt_forward_range(&model, &acts, &scratch, LAYER_EMBEDDING, L, 1, hooks, B, T);
            loss_sum += gpt_loss_sum(&acts, B, T);
            s.rec.fwd_ms += timer_stop_ms(&timer);

            timer_start(&timer);
            gpt_backward_range(&model, &acts, &scratch, LAYER_EMBEDDING, L, run.dloss * s.loss_scale, NULL,
                               NULL, hooks, B, T);
            s.rec.bwd_ms += timer_stop_ms(&timer);
        }

        /* ---- communicate: sum the gradients (stages 2-3 did most of it during backward) ---- */
        zero_sync_grads(&zero);
        s.rec.loss = comm_allreduce_double(grid.dp_group, loss_sum, 0) / run.tokens_per_step;
        check_loss_finite(s.rec.loss, step + 1);

        /* ---- update: this rank's slices, then (stages 1-2) all-gather the parameters ---- */
        timer_start(&timer);
        OptimHyper hyper = optim_hyper(&cfg, step); /* lr_at_step's rate, betas, eps, wd, clip */
        s.rec.lr = hyper.lr;
        s.skipped = zero_step_update(&zero, &run.scaler, &hyper, step + 1, &s.rec.grad_norm);
        s.rec.opt_ms = timer_stop_ms(&timer);
        s.rec.comm_ms = zero.comm_ms;       /* waiting on communication, wherever in the step */
        s.comm_busy_ms = zero.comm_busy_ms; /* the collectives running, hidden or not */

        /* ---- log: the slowest rank's times; the whole model gathered for the evaluation ---- */
        if (run_step_done(&run, &s))
            s.rec.val_loss = evaluate_and_sample(&zero, whole, &acts, &scratch, &run.data, &cfg, 0, &run.rng);
        run_step_log(&run, &s);
    }
    if (cfg.sample > 0)
        evaluate_and_sample(&zero, whole, &acts, &scratch, &run.data, &cfg, cfg.sample, &run.rng);

    /* ---- timeline, run summary and memory: every rank's, gathered on rank 0 ---- */
    timeline_write(&zero.timeline, run.world, cfg.out);
    int ran = run.last_step - run.first_step;
    double bytes_per_step = ran ? run.bytes_sent / ran : 0.0; /* this rank's; the ranks send alike */
    char extra_values[64];
    snprintf(extra_values, sizeof extra_values, ",%d,%.0f,%s", zf.prefetch, bytes_per_step,
             precision_name(cfg.precision));
    run_layout(&run, ranks, 1, 1, zf.stage);
    run_finish(&run, model.num_params, ",prefetch,bytes_sent_per_step,precision", extra_values,
               "%.2f MiB sent per rank per step | CSVs, timeline.csv and trace.json in %s",
               bytes_per_step / BYTES_PER_MIB, cfg.out);

    mem_free(whole);
    scratch_destroy(&scratch);
    activations_destroy(&acts, &cfg.model);
    zero_destroy(&zero);
    gpt_destroy(&model);
    grid_destroy(&grid);
    run_end(&run);
    return 0;
}
