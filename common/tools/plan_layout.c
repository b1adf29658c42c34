/* plan_layout.c: see plan_layout.h. Each chapter's function lists the
 * buffers that chapter allocates, in its order, with the size functions it
 * allocates with; the names in the comments are the buffers' `what` in
 * mem_alloc, so a learner can find each in the chapter's code. */
#include "plan_layout.h"

#include "attention.h"
#include "kernels.h"
#include "layer_split.h"
#include "model.h"
#include "param_table.h"
#include "util.h"

#include <math.h>
#include <stdlib.h>

void plan_model_state(double P, double shard_n, int stage, int half, double *params, double *grads,
                      double *optimizer) {
    double eb = half ? 2 : 4;                        /* bytes of a parameter and a gradient */
    double opt_n = stage == 0 ? P : shard_n;         /* elements this rank updates */
    *params = (stage < 3 ? P : shard_n) * eb;        /* whole, or this rank's shard (stage 3) */
    *grads = (stage < 2 ? P : shard_n) * eb;         /* whole, or this rank's shard (stages 2-3) */
    *optimizer = opt_n * 8 + (half ? opt_n * 4 : 0); /* Adam's m and v; 16 bits: fp32 master weights */
}

static void add(PlanMemory *m, Space space, Category cat, size_t bytes) {
    m->bytes[space][cat] += bytes;
}

static int half_of(const Config *cfg) {
    return cfg->precision != PRECISION_FP32;
}

/* A rank's micro-batch: B sequences of T tokens. */
static int micro_sequences(const Config *cfg, const PlanLayout *l) {
    return cfg->batch / l->dp / cfg->micro;
}

/* The CPU kernels' workspaces a rank's step grows: the attention's, and in
 * 16 bits the matmul operands of the linear layers it runs (its blocks, in
 * local widths under tensor parallelism; the head where it holds it). */
static void add_kernel_workspaces(PlanMemory *m, const Config *cfg, const PlanLayout *l, int T, int tp,
                                  int head) {
    /* --cp: the fused attention runs on the diagonal's chunks of T / 2 tokens (context_parallel.h) */
    add(m, SPACE_DEVICE, CAT_WORKSPACE, attention_workspace_bytes_cpu(l->cp > 1 ? T / 2 : T, l->threads));
    if (!half_of(cfg)) return;
    LinearShape shapes[GPT_LINEAR_SHAPES];
    int n = gpt_linear_shapes(&cfg->model, shapes), C = cfg->model.dmodel;
    shapes[0].out = 3 * C / tp, shapes[1].in = C / tp, shapes[2].out = 4 * C / tp, shapes[3].in = 4 * C / tp;
    int B = micro_sequences(cfg, l);
    add(m, SPACE_DEVICE, CAT_WORKSPACE, half_matmul_workspace_bytes_cpu(B * T, shapes, head ? n : n - 1));
}

/* What every chapter's step holds besides the model state: the activations
 * of one micro-batch (activations_create_model or a whole-model range),
 * the scratch (scratch_create), and the kernels' workspaces grown during
 * step 1 (the CPU attention's; the 16-bit matmuls' operands). */
static void add_step_buffers(PlanMemory *m, const Config *cfg, const PlanLayout *l, int first_block) {
    const ModelConfig *mc = &cfg->model;
    int B = micro_sequences(cfg, l), T = mc->seq;
    size_t acts = cfg->recompute || first_block != LAYER_EMBEDDING
                      ? activation_bytes_range(mc, B, T, first_block, mc->layers, cfg->recompute)
                      : activation_bytes(mc, B, T);
    add(m, SPACE_DEVICE, CAT_ACTIVATIONS, acts);                  /* "activations" */
    add(m, SPACE_DEVICE, CAT_WORKSPACE, scratch_bytes(mc, B, T)); /* "activation gradients" */
    if (cfg->recompute) add(m, SPACE_DEVICE, CAT_ACTIVATIONS, recompute_block_bytes(mc, B, T));
    add_kernel_workspaces(m, cfg, l, T, 1, 1);
}

size_t plan_ring_chunk_bytes(size_t count, int n, int eb) {
    if (n == 1 || count == 0) return 0; /* ring.c returns before it allocates */
    size_t chunk = count / n + 1;
    return chunk * eb + (eb == 4 ? 0 : chunk * sizeof(float));
}

/* Chunk c of n over count elements (ring.c's ring_chunk_begin, written again). */
static size_t ring_chunk_numel(size_t count, int n, int c) {
    c = ((c % n) + n) % n;
    return count / n + ((size_t)c < count % n ? 1 : 0);
}

double plan_ring_sent_bytes(size_t count, int n, int r, int eb) {
    double elements = 0;
    for (int s = 0; s < n - 1; s++) /* reduce-scatter: chunk r-s; all-gather: chunk r+1-s */
        elements += ring_chunk_numel(count, n, r - s) + ring_chunk_numel(count, n, r + 1 - s);
    return elements * eb;
}

static size_t largest_of(const size_t *counts, int n) {
    size_t largest = 0;
    for (int i = 0; i < n; i++) largest = counts[i] > largest ? counts[i] : largest;
    return largest;
}

/* 02's all-reduces of one step, their element counts: flat the whole
 * gradient, naive each tensor, overlap each bucket (buckets.c: tensors from
 * the last, a bucket closed once it holds --bucket-mb). Returns how many. */
static int dp_allreduce_counts(const ParamTable *t, const PlanLayout *l, int eb, size_t *counts) {
    if (l->dp_mode == DP_FLAT) {
        counts[0] = t->num_params;
        return 1;
    }
    int n = 0;
    size_t lo = 0, hi = 0, bucket_bytes = (size_t)l->bucket_bytes;
    for (int k = t->num_tensors - 1; k >= 0; k--) {
        const ParamTensor *x = &t->tensors[k];
        if (l->dp_mode == DP_NAIVE) {
            counts[n++] = x->numel;
            continue;
        }
        if (hi == 0) hi = x->offset + x->numel; /* open a bucket */
        lo = x->offset;
        if ((hi - lo) * eb >= bucket_bytes || k == 0) counts[n++] = hi - lo, hi = 0;
    }
    return n;
}

/* 01 and 02: the whole model on every rank (gpt_create, or mixed_create's
 * 16-bit parameters, gradients, fp32 master weights and two unit-sized fp32
 * workspaces), AdamW over every element. */
static void whole_model(const Config *cfg, const PlanLayout *l, const ParamTable *t, PlanMemory *m) {
    double params, grads, optimizer;
    plan_model_state(t->num_params, t->num_params, 0, half_of(cfg), &params, &grads, &optimizer);
    add(m, SPACE_DEVICE, CAT_PARAMS, params);
    add(m, SPACE_DEVICE, CAT_GRADS, grads);
    add(m, SPACE_DEVICE, CAT_OPTIMIZER, optimizer);
    if (half_of(cfg)) /* "unit weights (fp32)", "unit gradients (fp32)" */
        add(m, SPACE_DEVICE, CAT_WORKSPACE,
            2 * table_largest_unit(t, LAYER_EMBEDDING, cfg->model.layers) * 4);
    add_step_buffers(m, cfg, l, LAYER_EMBEDDING);
    if (l->ring) { /* "ring all-reduce chunk": grown to the step's largest all-reduce, never shrunk */
        int eb = half_of(cfg) ? 2 : 4;
        size_t *counts = xcalloc(t->num_tensors, sizeof(size_t));
        size_t largest = largest_of(counts, dp_allreduce_counts(t, l, eb, counts));
        add(m, SPACE_DEVICE, CAT_COMM, plan_ring_chunk_bytes(largest, l->dp, eb));
        free(counts);
    }
}

/* 05 (zero_create_precision, then the step's buffers, then the whole model
 * for evaluation). */
static void zero_model(const Config *cfg, const PlanLayout *l, const ParamTable *t, PlanMemory *m) {
    int stage = l->zero, half = half_of(cfg), L = cfg->model.layers;
    size_t N = l->dp, eb = half ? 2 : 4, P = t->num_params;
    size_t S = shard_largest_slice(t, LAYER_EMBEDDING, L, l->dp), max_unit = N * S;
    double params, grads, optimizer;
    plan_model_state(P, shard_numel(t, l->dp), stage, half, &params, &grads, &optimizer);
    add(m, SPACE_DEVICE, CAT_PARAMS, params);
    add(m, SPACE_DEVICE, CAT_GRADS, grads);
    add(m, SPACE_DEVICE, CAT_OPTIMIZER, optimizer);
    if (half) /* mixed_units_create: "unit weights (fp32)", "unit gradients (fp32)" */
        add(m, SPACE_DEVICE, CAT_WORKSPACE, 2 * table_largest_unit(t, LAYER_EMBEDDING, L) * 4);
    if (stage >= 2) { /* two ZeroGradBuffers: "unit gradient", "gradient slice"; 16 bits: "(fp32)" */
        add(m, SPACE_DEVICE, CAT_BUCKETS, 2 * (max_unit + S) * eb);
        if (half) add(m, SPACE_DEVICE, CAT_BUCKETS, S * 4);
    }
    if (stage == 1 || stage == 2)
        add(m, SPACE_DEVICE, CAT_COMM, (S + max_unit) * eb); /* "unit slice", "padded unit" */
    if (stage == 3) { /* the pool of "gathered unit"s: prefetch + 1, at most the computations */
        int uses = 2 * (L + 2), pool = l->prefetch + 1 < uses ? l->prefetch + 1 : uses;
        add(m, SPACE_DEVICE, CAT_GATHERED, (size_t)pool * max_unit * eb);
    }
    add_step_buffers(m, cfg, l, LAYER_EMBEDDING);
    if (stage == 3 || half)
        add(m, SPACE_DEVICE, CAT_WORKSPACE, P * 4); /* "the whole model in fp32 for evaluation" */
}

/* 06's offload_create (or offload_create_slices) over a range of units:
 * n elements held on the device, its largest unit, and the shard of N
 * replicas (S: its largest slice, shard_n: its elements). */
static void add_offload_state(PlanMemory *m, const Config *cfg, const PlanLayout *l, size_t n, size_t largest,
                              size_t S, size_t shard_n) {
    int half = half_of(cfg);
    size_t N = l->dp, eb = half ? 2 : 4;
    add(m, SPACE_DEVICE, CAT_PARAMS, n * eb);
    if (half) add(m, SPACE_DEVICE, CAT_WORKSPACE, largest * 4);       /* "unit weights (fp32)" */
    add(m, SPACE_DEVICE, CAT_BUCKETS, N * S * 4);                     /* "unit gradient" */
    if (half && N > 1) add(m, SPACE_DEVICE, CAT_BUCKETS, N * S * eb); /* "unit gradient (16-bit)" */
    add(m, SPACE_DEVICE, CAT_BUCKETS, S * eb);                        /* "gradient slice to copy out" */
    if (N > 1)
        add(m, SPACE_DEVICE, CAT_COMM,
            2 * S * eb + N * S * eb);                   /* "updated slice copied in" x2, "gathered unit" */
    add(m, SPACE_HOST, CAT_OPTIMIZER, shard_n * 4 * 3); /* "master weights (host)", "Adam moments (host)" */
    add(m, SPACE_HOST, CAT_GRADS,
        shard_n * 4 * (l->dpu ? 2 : 1)); /* "gradient shard (host)", --dpu: a second */
    add(m, SPACE_HOST, CAT_COMM,
        shard_n * eb * (half ? 2 : 1)); /* "gradient slices from the device", "16-bit weights" */
}

/* 06 with one stage (offload_create over every unit; the pipeline's one
 * activation slot from block 0, its scratch, no neighbours' gradients). */
static void offload_model(const Config *cfg, const PlanLayout *l, const ParamTable *t, PlanMemory *m) {
    int L = cfg->model.layers;
    add_step_buffers(m, cfg, l, 0);
    add_offload_state(m, cfg, l, t->num_params, table_largest_unit(t, LAYER_EMBEDDING, L),
                      shard_largest_slice(t, LAYER_EMBEDDING, L, l->dp), shard_numel(t, l->dp));
}

/* Where `rank` sits in a model split: its stage and its tensor slice, and
 * the stage's blocks and units, chunk by chunk (layer_split.h). */
typedef struct {
    int stage, slice, chunks;
    int first_block[PLAN_MAX_CHUNKS], last_block[PLAN_MAX_CHUNKS];
    int first_unit[PLAN_MAX_CHUNKS], last_unit[PLAN_MAX_CHUNKS];
    int has_prev[PLAN_MAX_CHUNKS], has_next[PLAN_MAX_CHUNKS]; /* a piece before it, after it */
} StageOf;

static void stage_of(const Config *cfg, const PlanLayout *l, int rank, StageOf *st) {
    int P = l->pp, V = l->chunks > 1 ? l->chunks : 1, L = cfg->model.layers, blocks[MAX_LAYERS];
    int cp = l->cp > 1 ? l->cp : 1; /* grid.h: tp fastest, then cp, then pp */
    *st = (StageOf){.stage = rank / l->tp / cp % P, .slice = rank % l->tp, .chunks = V};
    int fb, lb, fu, lu;
    layer_split_stage(&cfg->model, l->split ? l->split : "", P * V, st->stage, blocks, &fb, &lb, &fu, &lu);
    for (int c = 0; c < V; c++) {
        StageChunk at = {st->stage, c};
        layer_split_chunk_range(blocks, P, at, &st->first_block[c], &st->last_block[c]);
        layer_split_units(st->first_block[c], st->last_block[c], layer_split_piece(at, P), P * V, L,
                          &st->first_unit[c], &st->last_unit[c]);
        st->has_prev[c] = layer_split_prev(at, P, V).stage >= 0;
        st->has_next[c] = layer_split_next(at, P, V).stage >= 0;
    }
}

/* --tie-embeddings on 04's stages (pipeline.h): the last stage holds a copy
 * of the embedding unit (tied_copy: its elements), and it and the first stage
 * exchange that unit's gradient each step (in_group: the stage is one of the two). */
static size_t tied_copy(const ModelConfig *mc, const PlanLayout *l, const ParamTable *t, const StageOf *st,
                        int *in_group) {
    int head = st->last_unit[st->chunks - 1] == mc->layers, embedding = st->first_unit[0] == LAYER_EMBEDDING;
    int tied = mc->tied && l->chapter >= 4 && !(head && embedding);
    if (in_group) *in_group = tied && (head || embedding);
    return tied && head ? table_unit(t, LAYER_EMBEDDING)->numel : 0;
}

/* A model split's all-reduces over the ranks holding the same weights
 * (data_parallel.c on what the rank holds): flat one of every element it
 * holds, naive one per tensor, a tensor-parallel rank's slices in local
 * widths (qkv, attproj's weight, fc and fcproj's weight cut over tp). */
static int split_allreduce_counts(const PlanLayout *l, const ParamTable *t, const StageOf *st, size_t *counts) {
    int n = 0;
    size_t held = 0;
    for (int c = 0; c < st->chunks; c++)
        for (int u = st->first_unit[c]; u <= st->last_unit[c]; u++) {
            const ParamUnit *unit = table_unit(t, u);
            for (int k = unit->first_tensor; k < unit->first_tensor + unit->num_tensors; k++) {
                const ParamTensor *x = &t->tensors[k];
                size_t numel = plan_tp_tensor_numel(x, t->cfg.layers, l->tp);
                held += numel;
                if (l->dp_mode == DP_NAIVE) counts[n++] = numel;
            }
        }
    if (tied_copy(&t->cfg, l, t, st, NULL)) { /* the tied copy's wte and wpe, summed like the rest */
        const ParamUnit *unit = table_unit(t, LAYER_EMBEDDING);
        for (int k = unit->first_tensor; k < unit->first_tensor + unit->num_tensors; k++) {
            held += t->tensors[k].numel;
            if (l->dp_mode == DP_NAIVE) counts[n++] = t->tensors[k].numel;
        }
    }
    if (l->dp_mode != DP_NAIVE) counts[n++] = held;
    return n;
}

/* The ring of the ranks holding rank's weights (grid.h's weight group: dp x cp, rank d x cp + c): its
 * size, and rank's position in it. */
static int weight_ring_position(const PlanLayout *l, int rank, int *size) {
    int cp = l->cp > 1 ? l->cp : 1;
    *size = l->dp * cp;
    return rank / (l->tp * cp * l->pp) * cp + rank / l->tp % cp;
}

/* 03 to 05 with a model split: a stage's units whole (--mp layer, --pp) or a
 * tensor slice of them (--mp tensor, --tp), the activation slots its
 * schedule keeps, its boundary buffers; AdamW over what it holds, or 05's
 * ZeRO-1/2 over the stage's data-parallel group. */
static void split_model(const Config *cfg, const PlanLayout *l, const ParamTable *t, int rank,
                        PlanMemory *m) {
    const ModelConfig *mc = &cfg->model;
    int cp = l->cp > 1 ? l->cp : 1; /* --cp: T / cp tokens of each sequence */
    int half = half_of(cfg), tp = l->tp, L = mc->layers, B = micro_sequences(cfg, l), T = mc->seq / cp;
    int tensor = tp > 1, pipeline = l->chapter >= 4, zero = l->chapter == 5 ? l->zero : 0;
    StageOf st;
    stage_of(cfg, l, rank, &st);
    int V = st.chunks, first_unit = st.first_unit[0], last_unit = st.last_unit[V - 1];
    size_t held = 0, largest = 0; /* elements this rank holds; its largest unit */
    for (int c = 0; c < V; c++)
        for (int u = st.first_unit[c]; u <= st.last_unit[c]; u++) {
            size_t n = tensor ? plan_tp_unit_numel(mc, u, tp) : table_unit(t, u)->numel;
            held += n;
            largest = n > largest ? n : largest;
        }
    int tied_group;
    size_t copy = tied_copy(mc, l, t, &st, &tied_group);
    held += copy; /* the tied copy of the embedding unit, after the stage's units */
    if (tied_group) add(m, SPACE_DEVICE, CAT_WORKSPACE, table_unit(t, LAYER_EMBEDDING)->numel * 4);
    /* "tied embedding gradient from the other end" */
    size_t N = l->dp, S = 0, shard_n = 0; /* the stage's shard over dp: its largest slice, its elements */
    for (int u = first_unit; u <= last_unit; u++) {
        size_t n = tensor ? plan_tp_unit_numel(mc, u, tp) : table_unit(t, u)->numel, slice = (n + N - 1) / N;
        shard_n += slice;
        S = slice > S ? slice : S;
    }
    if (l->chapter == 6) { /* offload_create (offload_create_slices) over the stage's units */
        add_offload_state(m, cfg, l, held, largest, S, shard_n);
    } else if (zero) { /* 05: zero_create_stage (or zero_create_slices) over the stage's units */
        size_t eb = half ? 2 : 4;
        add(m, SPACE_DEVICE, CAT_PARAMS, held * eb); /* "parameters" */
        add(m, SPACE_DEVICE, CAT_GRADS,
            (zero == 1 ? held : shard_n) * eb);                         /* "gradients", "gradient shard" */
        add(m, SPACE_DEVICE, CAT_OPTIMIZER, shard_n * (half ? 12 : 8)); /* Adam's m and v; "master weights" */
        if (half) /* mixed_units_create_range: "unit weights (fp32)", "unit gradients (fp32)" */
            add(m, SPACE_DEVICE, CAT_WORKSPACE, 2 * largest * 4);
        if (zero == 2) add(m, SPACE_DEVICE, CAT_BUCKETS, 2 * (N * S + S) * eb); /* two ZeroGradBuffers */
        if (zero == 2 && half) add(m, SPACE_DEVICE, CAT_BUCKETS, S * 4);        /* "gradient slice (fp32)" */
        add(m, SPACE_DEVICE, CAT_COMM, (S + N * S) * eb); /* "unit slice", "padded unit" */
    } else {
        double params, grads, optimizer;
        plan_model_state(held, held, 0, half, &params, &grads, &optimizer);
        add(m, SPACE_DEVICE, CAT_PARAMS, params);
        add(m, SPACE_DEVICE, CAT_GRADS, grads);
        add(m, SPACE_DEVICE, CAT_OPTIMIZER, optimizer);
        if (half)
            add(m, SPACE_DEVICE, CAT_WORKSPACE, 2 * largest * 4); /* "unit weights (fp32)", "... gradients" */
        if (l->ring) { /* "ring all-reduce chunk", of the largest all-reduce over the weight group */
            size_t *counts = xcalloc(t->num_tensors, sizeof(size_t));
            size_t most = largest_of(counts, split_allreduce_counts(l, t, &st, counts));
            int ring;
            weight_ring_position(l, rank, &ring);
            add(m, SPACE_DEVICE, CAT_COMM, plan_ring_chunk_bytes(most, ring, half ? 2 : 4));
            free(counts);
        }
    }
    /* the activation slots: 03 one micro-batch; 04-05 what the schedule keeps in flight */
    int slots[PLAN_MAX_CHUNKS] = {1};
    if (pipeline) plan_stage_slots(l->schedule, l->pp, V, cfg->micro, st.stage, slots);
    int posted = pipeline && (l->schedule == SCHED_INTERLEAVED || l->schedule == SCHED_ZB_H1);
    size_t boundary = (size_t)B * T * mc->dmodel * sizeof(float);
    for (int c = 0; c < V; c++) {
        size_t slot;
        if (tensor) /* tp_activations_create: the head's values whole, the blocks' in local widths */
            slot = activation_bytes_range(mc, B, T, L, st.last_unit[c] == L ? L : L - 1, 0) +
                   plan_tp_block_activation_bytes(mc, tp, B, T, st.first_block[c], st.last_block[c],
                                                  cfg->recompute, l->sp);
        else /* 03 names the slot's range from its first unit, 04 from its first block: the same bytes */
            slot = activation_bytes_range(mc, B, T, st.first_block[c], st.last_unit[c], cfg->recompute);
        add(m, SPACE_DEVICE, CAT_ACTIVATIONS, slots[c] * slot);
        if (l->schedule == SCHED_ZB_H1 && pipeline) /* "output gradients kept for W", per slot */
            add(m, SPACE_DEVICE, CAT_ACTIVATIONS,
                slots[c] * (tensor ? plan_tp_kept_grads_bytes(mc, tp, B, T, st.first_block[0],
                                                              st.last_block[V - 1], last_unit == L)
                                   : kept_grads_bytes(mc, B, T, st.first_unit[c], st.last_unit[c])));
        if (posted && st.has_prev[c]) /* "gradient posted to prev stage", per slot */
            add(m, SPACE_DEVICE, CAT_WORKSPACE, slots[c] * boundary);
    }
    if (tensor) {
        add(m, SPACE_DEVICE, CAT_WORKSPACE, plan_tp_scratch_bytes(mc, tp, B, T)); /* "activation gradients" */
        if (l->sp) /* "sp whole rows", "sp rows", "sp ln grads" */
            add(m, SPACE_DEVICE, CAT_WORKSPACE,
                ((size_t)B * T * mc->dmodel * (tp + 1) / tp + 2 * mc->dmodel) * 4);
    } else {
        add(m, SPACE_DEVICE, CAT_WORKSPACE, scratch_bytes(mc, B, T));
        if (cfg->recompute) add(m, SPACE_DEVICE, CAT_ACTIVATIONS, recompute_block_bytes(mc, B, T));
    }
    if (pipeline) { /* "gradient from next stage", "gradient to prev stage" */
        if (st.has_next[0] || st.has_next[V - 1]) add(m, SPACE_DEVICE, CAT_WORKSPACE, boundary);
        if (st.has_prev[0] || st.has_prev[V - 1]) add(m, SPACE_DEVICE, CAT_WORKSPACE, boundary);
    }
    if (cp > 1) { /* context_parallel_create: S = B x T/cp x 2C/tp floats, a rank's k | v */
        size_t S = (size_t)B * T * 2 * (mc->dmodel / tp) * 4;
        add(m, SPACE_DEVICE, CAT_ACTIVATIONS,
            2 * (size_t)B * mc->seq * sizeof(int)); /* "cp tokens", "targets" */
        add(m, SPACE_DEVICE, CAT_COMM, 4 * S);      /* "ring k|v", "ring d(k|v)" x2 */
        add(m, SPACE_DEVICE, CAT_WORKSPACE,
            S / 2 + (size_t)B * (mc->heads / tp) * T * 4                     /* "ring block out", lse */
                + 2 * (size_t)T * mc->dmodel * 4);                           /* "cp wpe", "cp dwpe" */
        if (cfg->sample)
            add(m, SPACE_DEVICE, CAT_WORKSPACE, vocab_padded(mc->vocab) * 4); /* "sampled logits" */
    }
    add_kernel_workspaces(m, cfg, l, T, tp, last_unit == L);
}

int plan_replica_ranks(const PlanLayout *l) {
    return l->pp * (l->cp > 1 ? l->cp : 1) * l->tp;
}

int plan_forward_runs(const Config *cfg, const PlanLayout *l) {
    int pipeline = l->chapter == 4 || (l->chapter >= 5 && (l->pp > 1 || l->tp > 1));
    return cfg->recompute ? (pipeline && l->schedule == SCHED_ZB_H1 ? 3 : 2) : 1;
}

int plan_ranks(const PlanLayout *l) {
    return l->dp * plan_replica_ranks(l);
}

static int is_split(const PlanLayout *l) {
    return l->chapter == 3 || l->chapter == 4 || (l->chapter >= 5 && (l->pp > 1 || l->tp > 1));
}

void plan_memory(const Config *cfg, const PlanLayout *l, int rank, PlanMemory *m) {
    *m = (PlanMemory){0};
    ParamTable t;
    param_table_build(&t, &cfg->model);
    if (is_split(l))
        split_model(cfg, l, &t, rank, m);
    else if (l->chapter == 5)
        zero_model(cfg, l, &t, m);
    else if (l->chapter == 6)
        offload_model(cfg, l, &t, m);
    else
        whole_model(cfg, l, &t, m);
    param_table_free(&t);
}

/* A model split's messages: each micro-batch's activations (B x T x C fp32)
 * to the next piece and their gradient to the previous one; within a tensor
 * group two all-reduces of B x T x C fp32 per block forward, two backward,
 * one more with --recompute (the attention's, run again; under zb-h1 W runs
 * it once more); then the gradients of what the rank holds summed over its
 * replicas (chapter 02, once per step), or 05's ZeRO-1/2 over the stage's
 * dp group. */
static void split_traffic(const Config *cfg, const PlanLayout *l, const ParamTable *t, int rank,
                          PlanTraffic *tr) {
    const ModelConfig *mc = &cfg->model;
    StageOf st;
    stage_of(cfg, l, rank, &st);
    double M = cfg->micro, eb = half_of(cfg) ? 2 : 4, N = l->dp, tp = l->tp, cp = l->cp > 1 ? l->cp : 1;
    double B = micro_sequences(cfg, l), T = mc->seq / cp, C = mc->dmodel; /* --cp: T / cp tokens a rank */
    double boundary = B * T * C * 4, held = 0, shard = 0, shard_w = 0;    /* shard_w: the units with a W */
    int V = st.chunks, units = 0, blocks = 0, units_w = 0;
    for (int c = 0; c < V; c++) {
        tr->send += M * boundary * (st.has_next[c] + st.has_prev[c]);
        tr->send_calls += M * (st.has_next[c] + st.has_prev[c]);
        blocks += st.last_block[c] - st.first_block[c] + 1;
        for (int u = st.first_unit[c]; u <= st.last_unit[c]; u++, units++) {
            double n = tp > 1 ? plan_tp_unit_numel(mc, u, l->tp) : table_unit(t, u)->numel;
            held += n;
            shard += ceil(n / N); /* the unit (or its tensor slice) padded to N slices */
            if (u != LAYER_EMBEDDING) shard_w += ceil(n / N), units_w++; /* zb-h1: the embedding has no W */
        }
    }
    int tied_group;
    held += tied_copy(mc, l, t, &st, &tied_group);
    if (tied_group) { /* the embedding unit's gradient to the other end of the pipeline, fp32 */
        tr->send += table_unit(t, LAYER_EMBEDDING)->numel * 4.0;
        tr->send_calls += 1;
    }
    if (tp > 1 && l->sp) { /* per block: 6 all-gathers and 4 reduce-scatters of B x T/tp x C fp32 rows, */
        double rows = boundary / tp; /* 2 all-reduces of the layernorms' 2C; the last block's output
                                        gathered forward, the first's input gradient backward */
        tr->allgather += (M * blocks * 6 + 2 * M) * (tp - 1) * rows,
            tr->allgather_calls += M * blocks * 6 + 2 * M;
        tr->reduce_scatter += M * blocks * 4 * (tp - 1) * rows, tr->reduce_scatter_calls += M * blocks * 4;
        tr->tp_allreduce_calls = M * blocks * 2;
        tr->tp_allreduce = tr->tp_allreduce_calls * 2 * (tp - 1) / tp * 2 * C * 4;
    } else if (tp > 1) { /* --recompute: the attention's again in B, and under zb-h1 once more in W */
        tr->tp_allreduce_calls = M * blocks * (4 + plan_forward_runs(cfg, l) - 1);
        tr->tp_allreduce = tr->tp_allreduce_calls * 2 * (tp - 1) / tp * boundary;
    }
    if (cp > 1) { /* the ring, per block: (cp-1) k|v forward (again with --recompute), (cp-1) k|v and
                     cp d(k|v) backward, each B x T/cp x 2C/tp fp32 (context_parallel.h) */
        double hops = (cp - 1) * (2 + (cfg->recompute ? 1 : 0)) + cp;
        tr->cp_send = M * blocks * hops * B * T * 2 * (C / tp) * 4, tr->cp_send_calls = M * blocks * hops;
        tr->send += tr->cp_send, tr->send_calls += tr->cp_send_calls;
    }
    int zero = l->chapter >= 5 ? l->zero : 0; /* 06: stage 2's collectives, and the copies */
    if (l->chapter == 6) tr->to_host = M * shard * eb, tr->to_device = shard * eb;
    if (l->chapter == 6 && l->schedule == SCHED_ZB_H1) tr->to_host += M * shard_w * eb; /* after B and W */
    if (N > 1 &&
        zero) { /* stage 1 reduce-scatters after the last backward, stage 2 each unit of every micro */
        tr->reduce_scatter = (N - 1) * shard * eb * (zero == 2 ? M : 1);
        tr->reduce_scatter_calls = units * (zero == 2 ? M : 1);
        if (zero == 2 && l->schedule == SCHED_ZB_H1) { /* B's and W's calls each reduce-scatter (zero.h) */
            tr->reduce_scatter += M * (N - 1) * shard_w * eb;
            tr->reduce_scatter_calls += M * units_w;
        }
        tr->allgather = (N - 1) * shard * eb, tr->allgather_calls = units;
    } else if (N * cp > 1 && l->ring) { /* the ring's chunks this rank passes on, call by call */
        size_t *counts = xcalloc(t->num_tensors, sizeof(size_t));
        int calls = split_allreduce_counts(l, t, &st, counts), ring, at = weight_ring_position(l, rank, &ring);
        for (int i = 0; i < calls; i++) tr->allreduce += plan_ring_sent_bytes(counts[i], ring, at, (int)eb);
        tr->allreduce_calls = calls;
        free(counts);
    } else if (N * cp > 1) { /* over the ranks holding the same weights: dp x cp */
        tr->allreduce = 2 * (N * cp - 1) / (N * cp) * held * eb;
        tr->allreduce_calls = 1;
    }
    tr->allreduce += tr->tp_allreduce, tr->allreduce_calls += tr->tp_allreduce_calls;
}

void plan_traffic(const Config *cfg, const PlanLayout *l, int rank, PlanTraffic *tr) {
    *tr = (PlanTraffic){0};
    ParamTable t;
    param_table_build(&t, &cfg->model);
    if (is_split(l)) {
        split_traffic(cfg, l, &t, rank, tr);
        param_table_free(&t);
        return;
    }
    double N = l->dp, eb = half_of(cfg) ? 2 : 4, P = t.num_params, M = cfg->micro;
    double shard = shard_numel(&t, l->dp) * eb; /* one rank's slices of every unit */
    double units = t.num_units, tensors = t.num_tensors, ring_sent = 0;
    size_t *counts = xcalloc(t.num_tensors, sizeof(size_t)); /* 02 --allreduce ring: the calls */
    int ring_calls = l->ring && l->dp > 1 ? dp_allreduce_counts(&t, l, (int)eb, counts) : 0;
    for (int i = 0; i < ring_calls; i++) ring_sent += plan_ring_sent_bytes(counts[i], l->dp, rank, (int)eb);
    free(counts);
    param_table_free(&t);
    if (l->chapter == 6) {
        tr->to_host = M * shard; /* this rank's gradient slices */
        tr->to_device = shard;   /* its updated slices */
    }
    if (l->dp == 1) return;
    if (l->chapter == 2 && l->ring) { /* the chunks this rank passes on round the ring, call by call */
        tr->allreduce = ring_sent;
        tr->allreduce_calls = ring_calls;
    } else if (l->chapter == 2 || (l->chapter == 5 && l->zero == 0)) {
        tr->allreduce = 2 * (N - 1) / N * P * eb; /* the gradients, once per step */
        /* naive: one call per tensor; overlap: one per bucket of about --bucket-mb */
        tr->allreduce_calls = l->chapter == 5 || l->dp_mode == DP_FLAT ? 1
                              : l->dp_mode == DP_NAIVE                 ? tensors
                                                                       : ceil(P * eb / l->bucket_bytes);
    } else if (l->chapter == 5 && l->zero <= 2) {
        /* stage 1 reduce-scatters after the last backward, stage 2 each unit of every micro-batch */
        tr->reduce_scatter = (N - 1) * shard * (l->zero == 2 ? M : 1);
        tr->reduce_scatter_calls = units * (l->zero == 2 ? M : 1);
        tr->allgather = (N - 1) * shard; /* the updated parameters, once per step */
        tr->allgather_calls = units;
    } else if (l->chapter == 5) {
        tr->allgather = 2 * M * (N - 1) * shard; /* every unit before its forward and its backward */
        tr->allgather_calls = 2 * M * units;
        tr->reduce_scatter = M * (N - 1) * shard;
        tr->reduce_scatter_calls = M * units;
    } else if (l->chapter == 6) {
        tr->reduce_scatter = M * (N - 1) * shard; /* each unit's gradient as backward finishes it */
        tr->reduce_scatter_calls = M * units;
        tr->allgather = (N - 1) * shard; /* the updated slices */
        tr->allgather_calls = units;
    }
}

void plan_axis_bytes(const PlanLayout *l, const PlanTraffic *t, double axis[4]) {
    double tp_gathers = l->sp ? t->reduce_scatter + t->allgather : 0; /* --sp: the tensor group's rows */
    axis[0] += t->allreduce - t->tp_allreduce + t->reduce_scatter + t->allgather - tp_gathers;
    axis[1] += t->send - t->cp_send;
    axis[2] += t->cp_send;
    axis[3] += t->tp_allreduce + tp_gathers;
}
