/* model_parallel.c: see model_parallel.h. */
#include "03_model_parallel/model_parallel.h" /* 03: one model held by a group of ranks */

#include "common/device/device.h" /* mem_alloc, copies, streams, timers */
#include "common/run/evaluate.h" /* validation loss and sampling */
#include "common/kernels/kernels.h" /* ops(): the kernel table */
#include "common/model/layer_split.h" /* which blocks each stage runs */
#include "common/run/layout_rules.h" /* shared refusals of a layout */
#include "common/comm/optimizer_agree.h" /* grad_norm_agree across ranks */
#include "03_model_parallel/sequence_parallel.h" /* 03: sequence parallelism (--sp) */
#include "03_model_parallel/ulysses.h" /* 03: Ulysses (--cp-mode ulysses) */
#include "common/core/util.h" /* fatal, log_info, exit codes, flag parsing */

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* --help's section and one row per flag (config.h says how to add one) */
const Flag model_parallel_flags[] = {
    {.type = FLAG_SECTION,
     .help = "model parallel (run with mpirun -np N; N = dp x cp x model-parallel ranks)"},
    {"--mp", FLAG_CHOICE, FIELD(ModelParallelFlags, mp), .choices = "layer|tensor", .noun = "split",
     .def = "layer", .usage = "--mp layer|tensor",
     .help = "layer: contiguous blocks of layers per rank, activations sent from rank to\n"
             "rank; tensor: every block's matrices sliced over the ranks (default {default})"},
    {"--split", FLAG_TEXT, FIELD(ModelParallelFlags, split), .usage = "--split A,B,...",
     .help = "layer: blocks per stage, one number (>= 1) per stage, summing to --layers, or\n"
             "flops: balance the forward FLOPs (the head's matmul and the attention counted, the\n"
             "embedding's lookup free) (default: balance the parameters)"},
    {"--tp", FLAG_INT, FIELD(ModelParallelFlags, tp), 1, 1024, .usage = "--tp N",
     .help = "tensor: ranks per model copy (chapter 04: per stage); must divide --heads\n"
             "and 4 x --dmodel (default: --mp tensor world / --dp / --cp; chapter 04's stages 1)"},
    {"--dp", FLAG_INT, FIELD(ModelParallelFlags, dp), 1, 100000, .def = "1", .usage = "--dp D",
     .help = "data-parallel replicas of the model-parallel group (default {default})"},
    {"--sp", FLAG_SWITCH, FIELD(ModelParallelFlags, sp), .usage = "--sp",
     .help = "tensor: sequence parallelism, the layernorm and residual regions in T/tp\n"
             "rows per rank; reduce-scatter and all-gather instead of all-reduce"},
    {"--cp", FLAG_INT, FIELD(ModelParallelFlags, cp), 1, 1024, .def = "1", .usage = "--cp N",
     .help = "context parallel: each sequence split over N ranks, attention as a ring or\n"
             "on a head split (--cp-mode); --seq a multiple of 2N (default {default})"},
    {"--cp-order", FLAG_CHOICE, FIELD(ModelParallelFlags, cp_order), .choices = "zigzag|contiguous",
     .noun = "order", .def = "zigzag", .usage = "--cp-order ORDER",
     .help = "zigzag|contiguous: the chunks of 2N a cp rank holds: r and 2N-1-r (balanced\n"
             "under the causal mask), or 2r and 2r+1 (default {default})"},
    {"--cp-send", FLAG_CHOICE, FIELD(ModelParallelFlags, cp_send), .choices = "auto|posted|blocking",
     .noun = "way", .def = "auto", .usage = "--cp-send HOW",
     .help = "auto|posted|blocking: the ring's sends posted before each block's computation\n"
             "(overlapped; the mpi transport of CPU ranks only), or exchanged after it (any\n"
             "transport); auto: posted where the transport can (default {default})"},
    {"--cp-mode", FLAG_CHOICE, FIELD(ModelParallelFlags, cp_mode), .choices = "ring|ulysses", .noun = "mode",
     .def = "ring", .usage = "--cp-mode ring|ulysses",
     .help = "ring: attention round a ring of cp ranks; ulysses: an all-to-all turns the\n"
             "sequence split into a head split, attention runs on NH/N heads of the whole\n"
             "sequence, and back (--heads a multiple of N; not with tensor parallelism)\n"
             "(default {default})"},
    {"--alltoall", FLAG_CHOICE, FIELD(ModelParallelFlags, alltoall), .choices = "library|pairwise",
     .noun = "all-to-all", .def = "library", .usage = "--alltoall library|pairwise",
     .help = "ulysses (and chapter 03's --ep): the library's all-to-all or the course's\n"
             "own, pairwise on point-to-point messages (default {default})"},
    {0},
};

void model_parallel_effective_flags(const Config *cfg, ModelParallelFlags *f) {
    (void)cfg;
    if (strcmp(f->mp, "tensor") == 0 && !f->tp) f->tp = f->ranks / f->dp / (f->cp > 1 ? f->cp : 1);
}

void model_parallel_check_flags(const Config *cfg, const ModelParallelFlags *f) {
    int ranks = f->ranks, dp = f->dp, cp = f->cp, L = cfg->model.layers;
    if (ranks % dp != 0)
        fatal(EXIT_USAGE,
              "a job of %d rank%s cannot hold --dp %d replicas (valid: world = dp x model-parallel ranks)",
              ranks, ranks == 1 ? "" : "s", dp);
    if (ranks % (dp * cp) != 0)
        fatal(EXIT_USAGE,
              "a job of %d rank%s cannot hold --dp %d x --cp %d (valid: world = dp x cp x model-parallel "
              "ranks)",
              ranks, ranks == 1 ? "" : "s", dp, cp);
    context_parallel_check_given(cfg, cp);
    if (cp > 1) {
        const char *problem = context_parallel_problem(cfg->model.seq, cp);
        if (problem) fatal(EXIT_USAGE, "%s", problem);
        if (f->sp) fatal(EXIT_USAGE, "--sp with --cp is not written yet (valid: one of them)");
    }
    int mp_size = ranks / (dp * cp); /* ranks per copy of the model */
    ulysses_check_flags(&cfg->model, cp, strcmp(f->mp, "tensor") == 0 ? mp_size : 1, f->cp_mode,
                        flag_given(cfg, "--alltoall") && !flag_given(cfg, "--ep"), flag_given(cfg, "--cp-send"));
    if (f->sp) {
        if (strcmp(f->mp, "tensor") != 0)
            fatal(EXIT_USAGE,
                  "--sp is sequence parallelism inside tensor parallelism (valid: with --mp tensor)");
        if (cfg->recompute)
            fatal(EXIT_USAGE, "--sp with --recompute is not written yet (valid: one of them)");
        const char *problem = sequence_parallel_problem(cfg->batch, cfg->model.seq, mp_size);
        if (problem) fatal(EXIT_USAGE, "%s", problem);
    }
    if (strcmp(f->mp, "tensor") == 0) {
        if (f->split[0])
            fatal(EXIT_USAGE, "--split is for --mp layer (tensor parallelism splits every layer)");
        if (f->tp && f->tp * dp * cp != ranks)
            fatal(EXIT_USAGE, "--dp %d x --tp %d = %d ranks, but the job has %d (valid: mpirun -np %d)", dp,
                  f->tp, dp * f->tp, ranks, dp * f->tp);
        const char *problem = tensor_parallel_problem(&cfg->model, mp_size);
        if (problem) fatal(EXIT_USAGE, "%s", problem);
    } else {
        if (f->tp) fatal(EXIT_USAGE, "--tp is for --mp tensor (the layer split has world / --dp stages)");
        if (mp_size > L)
            fatal(EXIT_USAGE,
                  "%d stages but the model has %d layers (valid: at most --layers ranks per model copy)",
                  mp_size, L);
        if (f->split[0] && !layer_split_by_flops(f->split)) {
            int blocks[MAX_LAYERS];
            layer_split_parse(f->split, mp_size, L, blocks);
        }
    }
    if (cfg->batch % (dp * cfg->micro) != 0)
        fatal(EXIT_USAGE, "--batch %d is not divisible by --dp %d x --micro %d (valid: a multiple of %d)",
              cfg->batch, dp, cfg->micro, dp * cfg->micro);
}

/* Communication time of this rank. Device work queued before a message
 * counts as compute: finish it first. */
static double comm_clock(void) {
    device_sync();
    return wall_ms();
}

static void timed_send(ModelParallel *p, const float *buf, size_t count, int dest, int tag) {
    double start = comm_clock();
    comm_send(p->mp, buf, count, dest, tag);
    p->comm_ms += wall_ms() - start;
}

static void timed_recv(ModelParallel *p, float *buf, size_t count, int source, int tag) {
    double start = comm_clock();
    comm_recv(p->mp, buf, count, source, tag);
    p->comm_ms += wall_ms() - start;
}

/* --tie-embeddings (model_parallel.h: tied_wte): the first and last stage of
 * several hold the embedding and the head. */
static int tied_end(const ModelParallel *p) {
    return p->model.cfg.tied && p->stages > 1 && (p->stage == 0 || p->stage == p->stages - 1);
}

/* The first stage's wte in 16 bits: where it starts in the held 16-bit buffers (the stage's first unit). */
static size_t wte_at16(const ModelParallel *p) {
    return table_tensor(&p->model.table, LAYER_EMBEDDING, EMBEDDING_WTE)->offset - p->model.param_first;
}

static void tied_create(ModelParallel *p) {
    if (!tied_end(p)) return;
    p->tied_numel = table_tensor(&p->model.table, LAYER_EMBEDDING, EMBEDDING_WTE)->numel;
    p->tied_wte = mem_alloc(SPACE_DEVICE, CAT_WORKSPACE, p->tied_numel * sizeof(float),
                            p->stage == 0 ? "tied head's dwte from the last stage" : "tied head's wte");
    if (p->stage == 0) return;
    p->tied_dwte = mem_alloc(SPACE_DEVICE, CAT_WORKSPACE, p->tied_numel * sizeof(float), "tied head's dwte");
    p->model.w.lm_head = p->tied_wte;
    p->model.g.lm_head = p->tied_dwte;
}

/* Before a forward: the weights of the last update, first stage to last. */
static void tied_send_weights(ModelParallel *p) {
    if (!tied_end(p) || p->tied_fresh) return;
    if (p->stage == 0 && p->mixed.params) { /* 16 bits: wte as the 16-bit weights hold it, widened */
        ops()->cast_from_half(p->tied_wte, p->mixed.params + wte_at16(p), p->tied_numel, p->mixed.format);
        timed_send(p, p->tied_wte, p->tied_numel, p->stages - 1, TAG_EXCHANGE);
    } else if (p->stage == 0) {
        timed_send(p, p->model.w.wte, p->tied_numel, p->stages - 1, TAG_EXCHANGE);
    } else {
        timed_recv(p, p->tied_wte, p->tied_numel, 0, TAG_EXCHANGE);
    }
    p->tied_fresh = 1;
}

/* Forward of one micro-batch through this stage's units. Returns the sum of
 * the token losses on the last stage (with_loss), 0 elsewhere. */
static double stage_forward(ModelParallel *p, int with_loss, int B, int T) {
    size_t BTC = (size_t)B * T * p->model.cfg.dmodel;
    tied_send_weights(p);
    if (p->stage > 0)
        timed_recv(p, p->acts.encoded, BTC, p->stage - 1, TAG_ACTIVATIONS); /* idle until stage-1 is done */
    gpt_forward_range(&p->model, &p->acts, &p->scratch, p->model.first_unit, p->model.last_unit, with_loss,
                      NULL, B, T);
    if (p->stage < p->stages - 1) {
        timed_send(p, gpt_layer_output(&p->model, &p->acts, p->last_block), BTC, p->stage + 1,
                   TAG_ACTIVATIONS);
        return 0.0;
    }
    return with_loss ? gpt_loss_sum(&p->acts, B, T) : 0.0;
}

/* Backward of one micro-batch through this stage's units, in the reverse order. */
static void stage_backward(ModelParallel *p, float dloss, int B, int T) {
    size_t BTC = (size_t)B * T * p->model.cfg.dmodel;
    float *doutput = p->scratch.dresid[0]; /* the gradient of this stage's output (not on the last) */
    if (p->stage < p->stages - 1)
        timed_recv(p, doutput, BTC, p->stage + 1, TAG_GRADIENTS); /* idle until stage+1 is done */
    if (tied_end(p) && p->stage == 0) { /* the head's gradient of wte, before the lookups' */
        timed_recv(p, p->tied_wte, p->tied_numel, p->stages - 1, TAG_EXCHANGE);
        if (p->mixed.params) /* 16 bits: wte's gradient is bound only in its unit's backward */
            ops()->accumulate_half(p->mixed.grads + wte_at16(p), p->tied_wte, p->tied_numel, p->mixed.format);
        else
            ops()->residual_forward(p->model.g.wte, p->model.g.wte, p->tied_wte, p->tied_numel);
    }
    if (tied_end(p) && p->stage > 0) ops()->fill_zero(p->tied_dwte, p->tied_numel);
    UnitHooks final = {.after_backward = p->unit_final, .context = p->unit_final_context};
    const float *dinput = gpt_backward_range(&p->model, &p->acts, &p->scratch, p->model.first_unit,
                                             p->model.last_unit, dloss, doutput, NULL, &final, B, T);
    if (p->stage > 0) timed_send(p, dinput, BTC, p->stage - 1, TAG_GRADIENTS);
    if (tied_end(p) && p->stage > 0) timed_send(p, p->tied_dwte, p->tied_numel, 0, TAG_EXCHANGE);
}

int *model_parallel_tokens(ModelParallel *p) {
    return p->cp.size > 1 ? p->cp.tokens : p->tensor ? p->tpm.acts.tokens : p->acts.tokens;
}
int *model_parallel_targets(ModelParallel *p) {
    return p->cp.size > 1 ? p->cp.targets : p->tensor ? p->tpm.acts.targets : p->acts.targets;
}

/* Forward; returns this rank's share of the token-loss sum: the whole sum on
 * the one rank of the model-parallel group that reports it, 0 on the others,
 * so that summing over the world gives the global batch's loss sum. */
double model_parallel_forward(ModelParallel *p, int with_loss, int B, int T) {
    double loss_sum = 0.0;
    p->cp.comm_ms = 0.0;
    if (p->cp.size > 1) { /* --cp: this rank's positions of the sequences in cp.tokens */
        Activations *a = p->tensor ? &p->tpm.acts : &p->acts;
        context_parallel_select(&p->cp, a->tokens, a->targets, B);
        T /= p->cp.size;
    }
    if (p->tensor) {
        p->tp.comm_ms = 0.0;
        tp_forward(&p->tpm, with_loss, B, T);
        p->comm_ms += p->tp.comm_ms;
        /* every tp rank computed the (replicated) head; tp rank 0 reports it */
        loss_sum = with_loss && p->tp.rank == 0 ? gpt_loss_sum(&p->tpm.acts, B, T) : 0.0;
    } else {
        loss_sum = stage_forward(p, with_loss, B, T);
    }
    p->comm_ms += p->cp.comm_ms;
    return loss_sum;
}

void model_parallel_backward(ModelParallel *p, float dloss, int B, int T) {
    p->cp.comm_ms = 0.0;
    if (p->cp.size > 1) T /= p->cp.size;
    if (p->tensor) {
        p->tp.comm_ms = 0.0;
        tp_backward(&p->tpm, dloss, B, T);
        p->comm_ms += p->tp.comm_ms;
        for (int u = p->held->last_unit; p->unit_final && u >= p->held->first_unit; u--)
            p->unit_final(u, p->unit_final_context); /* every slice's gradient is final now */
    } else {
        stage_backward(p, dloss, B, T);
    }
    p->comm_ms += p->cp.comm_ms;
}

/* What this rank holds of the whole model's gradient (optimizer_step.h):
 * its stages' units, the parts added over the model-parallel group, or its
 * tensor slices and the replicated tensors, counted once. Every rank agrees
 * on the norm, and on an fp16 overflow anywhere, so that all of them skip
 * such a step. */
GradShards model_parallel_grad_shards(ModelParallel *p, CommGroup *world) {
    GradShards g = p->tensor ? tp_grad_shards(&p->tpm) : precision_grad_shards(&p->model, &p->mixed);
    if (!p->tensor) g.sum_group = p->mp;
    g.agree = grad_norm_agree;
    g.agree_group = world;
    return g;
}

void model_parallel_begin_step(ModelParallel *p, int step) {
    p->comm_ms = 0.0;
    p->tied_fresh = 0; /* updated since the last send */
    p->acts.moe.stats = p->tpm.acts.moe.stats = (MoeStats){0}; /* --experts: this step's routing (moe.h) */
    if (p->cp.size > 1) context_parallel_begin_step(&p->cp, step);
}

/* Mean validation loss over cfg->eval_batches global batches, each replica
 * taking its share of every batch (forward only). */
double model_parallel_evaluate(ModelParallel *p, const Dataset *data, const Config *cfg, int dp_index,
                               int B) {
    int T = cfg->model.seq, per_replica = cfg->batch / comm_size(p->dp);
    double loss_sum = 0.0, saved_comm_ms = p->comm_ms;
    context_parallel_pause(&p->cp); /* the ring's timeline is the training step's */
    p->tied_fresh = 0;              /* wte was updated after the step's forward */
    for (int e = 0; e < cfg->eval_batches; e++) {
        for (int mb = 0; mb < per_replica / B; mb++) {
            data_upload_batch(data, SPLIT_VAL, cfg->seed, e, dp_index * per_replica + mb * B, B, T,
                              model_parallel_tokens(p), model_parallel_targets(p));
            loss_sum += model_parallel_forward(p, 1, B, T);
        }
    }
    p->comm_ms = saved_comm_ms;
    return comm_allreduce_double(comm_world(), loss_sum, 0) / ((double)cfg->eval_batches * cfg->batch * T);
}

/* A text sample, as sample_text (common/evaluate.c) writes it, from the split
 * model: forward passes of one sequence; the logits are on the last stage
 * (layer split) or on every rank (tensor), and every stage needs each new
 * byte for the next context. */
/* --cp: the logits of position ctx-1 are on the cp rank that holds it (on
 * the last stage, in replica 0); summed over the world from there into
 * every rank, so that every rank draws the same byte. */
static int cp_sample_token(ModelParallel *p, int ctx, int V, int vocab_rows, float *row, float *logits,
                           uint64_t *rng) {
    int rows = p->cp.T / p->cp.size / 2, chunk = (ctx - 1) / rows, local = -1;
    for (int half = 0; half < 2; half++)
        if (context_parallel_chunk(p->cp.rank, p->cp.size, half, p->cp.zigzag) == chunk)
            local = half * rows + (ctx - 1) % rows;
    /* the logits: on the last stage, or sliced over the tp ranks (tp rank 0 gives them) */
    int holds = p->tensor || p->stage == p->stages - 1;
    Activations *a = p->tensor ? &p->tpm.acts : &p->acts;
    if (local >= 0 && holds && comm_rank(p->dp) == 0) {
        gpt_logits_row(p->tensor ? p->tpm.m : &p->model, a, local, logits); /* every tp rank takes part */
        if (p->tensor && p->tp.rank != 0) memset(logits, 0, V * sizeof(float));
        copy_to_device(row, logits, V * sizeof(float));
    } else {
        ops()->fill_zero(row, V);
    }
    comm_allreduce(comm_world(), row, V, COMM_SUM);
    copy_to_host(logits, row, V * sizeof(float));
    return sample_token(logits, vocab_rows, rng);
}

void model_parallel_sample(ModelParallel *p, const Dataset *data, const Config *cfg, uint64_t *rng) {
    p->tied_fresh = 0; /* after the last update */
    int T = cfg->model.seq, V = vocab_padded(cfg->model.vocab), n = cfg->sample, cp = p->cp.size > 1,
        sp = p->tpm.sp;
    Activations *a = p->tensor ? &p->tpm.acts : &p->acts;
    int holds_logits = p->tensor || p->stage == p->stages - 1;
    context_parallel_pause(&p->cp);
    int *text = xmalloc(((size_t)32 + n) * sizeof(int)); /* the prompt is at most 32 tokens */
    int prompt_len = sample_prompt(data, T, text),
        rows = sample_rows(data, cfg->model.vocab); /* V: a row of logits */
    int *context = xcalloc(T, sizeof(int));
    float *logits = xmalloc(V * sizeof(float));
    float *row = cp ? mem_alloc(SPACE_DEVICE, CAT_WORKSPACE, V * sizeof(float), "sampled logits") : NULL;
    for (int i = 0; i < n; i++) {
        int len = prompt_len + i, ctx = len < T ? len : T; /* the model sees the last (at most T) tokens */
        for (int t = 0; t < ctx; t++) context[t] = text[len - ctx + t];
        /* --cp, --sp: always T tokens, cut into chunks or rows; the causal mask hides those after ctx */
        int tokens = cp || sp ? T : ctx;
        copy_to_device(model_parallel_tokens(p), context, tokens * sizeof(int));
        model_parallel_forward(p, 0, 1, tokens);
        int byte = 0;
        if (cp) {
            byte = cp_sample_token(p, ctx, V, rows, row, logits, rng);
        } else if (holds_logits) {
            gpt_logits_row(p->tensor ? p->tpm.m : &p->model, a, ctx - 1, logits); /* --tp: gathered */
            byte = sample_token(logits, rows, rng);
        }
        if (!p->tensor && !cp)
            byte = (int)comm_allreduce_double(p->mp, holds_logits ? byte : 0, 0); /* from the last stage */
        text[len] = byte;
    }
    if (comm_rank(comm_world()) == 0) sample_print(data, text, prompt_len, n);
    mem_free(row);
    free(text);
    free(context);
    free(logits);
}

/* ---- building this rank's part, and letting it go ---- */

/* This rank's part of the model (mp_index: its place in the model-parallel
 * group of mp_size ranks): its tensor slices, or its stage's blocks (--split,
 * else balanced by parameters); layout says which, for the header and the
 * checkpoint. */
void model_parallel_build(ModelParallel *p, const Config *cfg, const ModelParallelFlags *f,
                          const ParamTable *table, int mp_index, int mp_size, int B, char *layout,
                          size_t layout_size) {
    int T = cfg->model.seq, L = cfg->model.layers;
    int T_held = f->cp > 1 ? T / f->cp : T; /* --cp N: this rank's T/N tokens of each sequence */
    /* --ep: of each MoE block only its experts (model_config.h's moe.parts) */
    int part = p->expert_parts > 1 ? comm_rank(p->dp) % p->expert_parts : 0;
    ModelConfig held = moe_part_config(&cfg->model, p->expert_parts, part);
    if (p->tensor) {
        p->tp = (TensorGroup){.group = p->mp, .rank = mp_index, .size = mp_size};
        tp_model_create_range(&p->tpm, &held, cfg->seed, &p->tp, LAYER_EMBEDDING, L, B, T_held,
                              cfg->recompute, cfg->precision);
        sequence_parallel_enable(&p->tpm, f->sp); /* --sp: the layernorm and residual regions in rows */
        tp_activations_create(&p->tpm, &p->tpm.acts, B, T_held);
        p->held = &p->tpm.model;
        p->held_mixed = &p->tpm.mixed;
        snprintf(layout, layout_size, "tensor parallel over %d ranks%s", mp_size,
                 f->sp ? ", sequence parallel" : "");
        return;
    }
    int blocks[MAX_LAYERS]; /* blocks per stage: at most one stage per layer */
    p->stages = mp_size;
    p->stage = mp_index;
    if (layer_split_by_flops(f->split))
        layer_split_balanced_flops(&cfg->model, mp_size, blocks); /* --split flops: balance the compute */
    else if (f->split[0])
        layer_split_parse(f->split, mp_size, L, blocks); /* --split 3,3 */
    else
        layer_split_balanced(table, mp_size, blocks); /* balance the parameters (common/layer_split.c) */
    layer_split_range(blocks, p->stage, &p->first_block, &p->last_block);
    int first_unit, last_unit; /* the embedding on stage 0, the head on the last (layer_split.h) */
    layer_split_units(p->first_block, p->last_block, p->stage, p->stages, L, &first_unit, &last_unit);
    precision_create_range(&p->model, &p->mixed, &held, cfg->seed, cfg->precision, first_unit,
                           last_unit); /* fp32 or 16-bit */
    tied_create(p);
    activations_create_range(&p->acts, &cfg->model, B, T_held, first_unit, last_unit, cfg->recompute);
    scratch_create(&p->scratch, &cfg->model, B, T_held, cfg->recompute);
    p->held = &p->model;
    p->held_mixed = &p->mixed;
    int n = snprintf(layout, layout_size, "layer split, blocks per stage");
    for (int s = 0; s < mp_size && n < (int)layout_size - 8; s++)
        n += snprintf(layout + n, layout_size - n, "%s%d", s ? "," : " ", blocks[s]);
}

void model_parallel_split_sequences(ModelParallel *p, const Config *cfg, const ModelParallelFlags *f,
                                    CommGroup *cp_group, int B, char *layout, size_t layout_size) {
    if (comm_size(cp_group) == 1) return;
    context_parallel_create(&p->cp, cp_group, &cfg->model, B, cfg->model.seq,
                            strcmp(f->cp_order, "zigzag") == 0, p->tensor ? p->tp.size : 1, f->cp_send,
                            strcmp(f->cp_mode, "ring") == 0);
    if (strcmp(f->cp_mode, "ulysses") == 0) /* attention on a head split instead (ulysses.h) */
        ulysses_create(&p->cp, &cfg->model, B, cfg->model.seq, strcmp(f->alltoall, "pairwise") == 0);
    (p->tensor ? p->tpm.m : &p->model)->sequence = &p->cp.split; /* the model's embedding and attention */
    size_t n = strlen(layout);
    if (p->cp.ulysses) { /* every rank attends over whole sequences: the order balances nothing here */
        log_info("context parallel: %d ranks per sequence, %s, Ulysses: attention on %d of %d heads, %s "
                 "all-to-all\n",
                 p->cp.size, f->cp_order, cfg->model.heads / p->cp.size, cfg->model.heads, f->alltoall);
        snprintf(layout + n, layout_size - n, ", cp %d %s ulysses", p->cp.size, f->cp_order);
        return;
    }
    char split[4 * 2 * MAX_CP + 64];
    context_parallel_describe(split, sizeof split, p->cp.size, p->cp.zigzag);
    log_info("context parallel: %d ranks per sequence, %s, sends %s | %s\n", p->cp.size, f->cp_order,
             p->cp.posted ? "posted" : "blocking", split);
    snprintf(layout + n, layout_size - n, ", cp %d %s", p->cp.size, f->cp_order);
}

/* What this rank holds of a checkpoint: its slices, or its stage's units,
 * written by replica dp_index's share (checkpoint.h). */
void model_parallel_checkpoint_layout(ModelParallel *p, AdamW *opt, int dp_index, int dp, CkptLayout *ckpt) {
    if (p->cp.size > 1) { /* the cp ranks hold the same weights, as the replicas do: one share each */
        dp_index = dp_index * p->cp.size + p->cp.rank;
        dp *= p->cp.size;
    }
    if (p->tensor)
        tp_checkpoint_layout(&p->tpm, opt, dp_index, ckpt);
    else
        ckpt_layout_range(ckpt, &p->model, opt, dp_index, dp);
}

void model_parallel_destroy(ModelParallel *p, const Config *cfg) {
    if (p->cp.size > 1) { /* what the ring carried, against context_parallel.h's formula; its timeline */
        log_info("context parallel: %.0f bytes sent %s by rank 0\n", p->cp.bytes_sent,
                 p->cp.ulysses ? "in Ulysses' all-to-alls" : "round the ring");
        timeline_write(&p->cp.timeline, comm_world(), cfg->out); /* every rank has cp > 1 */
        context_parallel_destroy(&p->cp);
    }
    if (p->tensor) {
        tp_model_destroy(&p->tpm);
        return;
    }
    scratch_destroy(&p->scratch);
    activations_destroy(&p->acts, &cfg->model);
    mem_free(p->tied_wte);
    mem_free(p->tied_dwte);
    precision_destroy(&p->model, &p->mixed);
}

/* ---- the step's view of this rank's part (held_model.h) ---- */

static double held_part_forward(void *owner, int B, int T) {
    return model_parallel_forward(owner, 1, B, T);
}
static void held_part_backward(void *owner, float dloss, int B, int T, UnitHook unit_final, void *context) {
    ModelParallel *p = owner;
    p->unit_final = unit_final, p->unit_final_context = context;
    model_parallel_backward(p, dloss, B, T);
}
static GradShards held_part_grad_shards(void *owner, CommGroup *world) {
    return model_parallel_grad_shards(owner, world);
}
static void held_part_checkpoint_layout(void *owner, AdamW *opt, int dp_index, int dp, CkptLayout *ckpt) {
    model_parallel_checkpoint_layout(owner, opt, dp_index, dp, ckpt);
}
static double held_part_evaluate(void *owner, const Dataset *data, const Config *cfg, int dp_index, int B) {
    return model_parallel_evaluate(owner, data, cfg, dp_index, B);
}
static void held_part_sample(void *owner, const Dataset *data, const Config *cfg, uint64_t *rng) {
    model_parallel_sample(owner, data, cfg, rng);
}
static const HeldModelOps held_part_ops = {
    .forward = held_part_forward,
    .backward = held_part_backward,
    .grad_shards = held_part_grad_shards,
    .checkpoint_layout = held_part_checkpoint_layout,
    .evaluate = held_part_evaluate,
    .sample = held_part_sample,
};

void model_parallel_held(ModelParallel *p, HeldModel *h) {
    *h = (HeldModel){.model = p->held, .mixed = p->held_mixed, .ops = &held_part_ops, .owner = p};
    h->tokens = model_parallel_tokens(p), h->targets = model_parallel_targets(p);
    h->moe = p->tensor ? &p->tpm.acts.moe.stats : &p->acts.moe.stats; /* --tp: tp rank 0's */
}

GridShape model_parallel_shape(const ModelParallelFlags *f) {
    int mp_size = f->ranks / (f->dp * f->cp); /* ranks per copy of the model */
    int tensor = strcmp(f->mp, "tensor") == 0;
    return (GridShape){.dp = f->dp, .pp = tensor ? 1 : mp_size, .cp = f->cp, .tp = tensor ? mp_size : 1};
}

void model_parallel_create(ModelParallel *p, const Config *cfg, const ModelParallelFlags *f, int expert_parts,
                           const ParamTable *table, const ProcessGrid *grid, int B, char *layout,
                           size_t layout_size) {
    *p = (ModelParallel){.tensor = strcmp(f->mp, "tensor") == 0, .expert_parts = expert_parts};
    p->mp = p->tensor ? grid->tp_group : grid->pp_group; /* the ranks holding one copy of the model */
    p->dp = grid->dp_group;                              /* the ranks holding the same part of it */
    int mp_index = p->tensor ? grid->t : grid->p, mp_size = p->tensor ? grid->tp : grid->pp;
    model_parallel_build(p, cfg, f, table, mp_index, mp_size, B, layout, layout_size);
    model_parallel_split_sequences(p, cfg, f, grid->cp_group, B, layout, layout_size);
}
