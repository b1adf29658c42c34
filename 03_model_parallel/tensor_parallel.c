/* tensor_parallel.c: see tensor_parallel.h. */
#include "tensor_parallel.h"

#include "device.h"
#include "kernels.h"
#include "util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *tensor_parallel_problem(const ModelConfig *cfg, int tp) {
    static char message[256];
    if (cfg->heads % tp != 0)
        snprintf(message, sizeof message,
                 "--tp %d does not divide --heads %d: tensor parallelism gives every rank whole heads "
                 "(valid: a divisor of the heads)",
                 tp, cfg->heads);
    else if (4 * cfg->dmodel % tp != 0)
        snprintf(message, sizeof message,
                 "--tp %d does not divide the MLP width 4 x --dmodel = %d (valid: a divisor of %d)", tp,
                 4 * cfg->dmodel, 4 * cfg->dmodel);
    else
        return NULL;
    return message;
}

/* The all-reduce of the group, timed (device work queued before it counts as compute). */
static void tp_allreduce(TensorGroup *tp, float *buf, size_t count) {
    device_sync();
    double start = wall_ms();
    comm_allreduce(tp->group, buf, count, COMM_SUM);
    tp->comm_ms += wall_ms() - start;
}

/* ---- the parallel linear layers ---- */

void column_parallel_forward(TensorGroup *tp, float *out_local, const float *inp, const float *weight_local,
                             const float *bias_local, int N, int C, int OC_local) {
    /* EXERCISE 03.1 BEGIN: the column-parallel linear layer (course.md, exercise 03.1) */
    (void)tp; /* f: the input is already whole on every rank */
    gpt_linear_forward(tp->matmuls, out_local, inp, weight_local, bias_local, N, C, OC_local);
    /* EXERCISE 03.1 END */
}

void column_parallel_backward(TensorGroup *tp, float *dinp, float *dweight_local, float *dbias_local,
                              const float *dout_local, const float *inp, const float *weight_local, int N,
                              int C, int OC_local) {
    /* EXERCISE 03.1 BEGIN: the column-parallel linear layer (course.md, exercise 03.1) */
    const KernelOps *k = ops();
    k->fill_zero(dinp, (size_t)N * C);
    /* this rank's outputs' share of dinp; the weight's and bias's gradients are whole for its rows */
    gpt_linear_backward(tp->matmuls, dinp, dweight_local, dbias_local, dout_local, inp, weight_local, N, C,
                        OC_local);
    tp_allreduce(tp, dinp, (size_t)N * C); /* f's conjugate: sum the shares */
    /* EXERCISE 03.1 END */
}

void row_parallel_forward(TensorGroup *tp, float *out, const float *inp_local, const float *weight_local,
                          const float *bias, int N, int C_local, int OC) {
    /* EXERCISE 03.2 BEGIN: the row-parallel linear layer (course.md, exercise 03.2) */
    /* Each rank's product is a partial sum over its C_local inputs. The bias
     * is added by rank 0 only, so that the sum counts it once. */
    gpt_linear_forward(tp->matmuls, out, inp_local, weight_local, tp->rank == 0 ? bias : NULL, N, C_local,
                       OC);
    tp_allreduce(tp, out, (size_t)N * OC); /* g: sum the partial outputs */
    /* EXERCISE 03.2 END */
}

void row_parallel_backward(TensorGroup *tp, float *dinp_local, float *dweight_local, float *dbias,
                           const float *dout, const float *inp_local, const float *weight_local, int N,
                           int C_local, int OC) {
    /* EXERCISE 03.2 BEGIN: the row-parallel linear layer (course.md, exercise 03.2) */
    (void)tp; /* g's conjugate: dout is already whole on every rank */
    gpt_linear_backward(tp->matmuls, dinp_local, dweight_local, dbias, dout, inp_local, weight_local, N,
                        C_local, OC);
    /* EXERCISE 03.2 END */
}

/* ---- the local parameter table ---- */

/* How tensor t of a model of L blocks is divided: only the blocks' four matrices (and the
 * biases of the column-parallel ones) are sliced. */
static SliceKind slice_of(const ParamTensor *t, int L) {
    if (t->layer == LAYER_EMBEDDING || t->layer == L) return SLICE_NONE;
    switch ((BlockTensor)t->kind) {
    case BLOCK_QKVW:
    case BLOCK_QKVB:
        return SLICE_QKV_ROWS;
    case BLOCK_FCW:
    case BLOCK_FCB:
        return SLICE_ROWS;
    case BLOCK_ATTPROJW:
    case BLOCK_FCPROJW:
        return SLICE_COLS;
    default:
        return SLICE_NONE;
    }
}

size_t tensor_parallel_global_index(const ParamTensor *whole, SliceKind kind, int rank, int tp, size_t e) {
    /* A bias (rows == 1) is sliced like the rows of its weight: one element per output. */
    int vector = whole->rows == 1;
    size_t out_units = vector ? (size_t)whole->cols : (size_t)whole->rows,
           in_units = vector ? 1 : whole->cols;
    switch (kind) {
    case SLICE_QKV_ROWS: {
        size_t third = out_units / 3, width = third / tp; /* C and C/tp */
        size_t row = e / in_units, col = e % in_units;
        size_t part = row / width, j = row % width; /* q, k or v; unit within this rank's heads */
        return (part * third + rank * width + j) * in_units + col;
    }
    case SLICE_ROWS: {
        size_t width = out_units / tp;
        return rank * width * in_units + e; /* rows are contiguous */
    }
    case SLICE_COLS: {
        size_t width = whole->cols / tp, row = e / width, col = e % width;
        return row * whole->cols + rank * width + col;
    }
    default:
        return e;
    }
}

/* The local table: the whole table's names and order, sliced shapes. */
static void build_local_table(TensorParallelModel *tm, const ModelConfig *cfg, int tp) {
    ParamTable local;
    param_table_build(&local, cfg);
    tm->slice = xcalloc(local.num_tensors, sizeof(SliceKind));
    for (int i = 0; i < local.num_tensors; i++) {
        ParamTensor *t = &local.tensors[i];
        SliceKind kind = slice_of(t, cfg->layers);
        tm->slice[i] = kind;
        if (kind == SLICE_COLS || (t->rows == 1 && kind != SLICE_NONE))
            t->cols /= tp;
        else if (kind != SLICE_NONE)
            t->rows /= tp;
    }
    param_table_layout(&local); /* offsets of the smaller tensors */
    gpt_init(&tm->model, local);
}

/* Carve one block's activations (or, with base NULL, count them). */
static float *carve(float *base, size_t *used, size_t count) {
    float *p = base ? base + *used : NULL;
    *used += count;
    return p;
}

/* The blocks held: first and last. */
static int first_block(const TensorParallelModel *tm) {
    return tm->first_unit > 0 ? tm->first_unit : 0;
}
static int last_block(const TensorParallelModel *tm) {
    int L = tm->model.cfg.layers;
    return tm->last_unit < L ? tm->last_unit : L - 1;
}

/* With recompute (tm->recompute) the blocks share one set of values, as in
 * model.c, and keep only their outputs res3. */
static size_t carve_blocks(const TensorParallelModel *tm, Activations *a, float *base, int B, int T) {
    size_t BT = (size_t)B * T, C = tm->model.cfg.dmodel, Cl = tm->C_local, Hl = tm->H_local, used = 0;
    for (int l = first_block(tm); l <= last_block(tm); l++) {
        BlockActs *b = &a->block[l];
        if (tm->recompute && l > first_block(tm)) {
            *b = a->block[first_block(tm)]; /* the shared set */
            b->res3 = carve(base, &used, BT * C);
            continue;
        }
        b->ln1 = carve(base, &used, BT * C);
        b->ln1_mean = carve(base, &used, BT);
        b->ln1_rstd = carve(base, &used, BT);
        b->qkv = carve(base, &used, BT * 3 * Cl);
        b->atty = carve(base, &used, BT * Cl);
        b->lse = carve(base, &used, (size_t)B * tm->NH_local * T);
        b->res2 = carve(base, &used, BT * C);
        b->ln2 = carve(base, &used, BT * C);
        b->ln2_mean = carve(base, &used, BT);
        b->ln2_rstd = carve(base, &used, BT);
        b->fch = carve(base, &used, BT * Hl);
        b->res3 = carve(base, &used, BT * C);
    }
    return used;
}

static size_t carve_scratch(TensorParallelModel *tm, float *base, int B, int T) {
    size_t BT = (size_t)B * T, C = tm->model.cfg.dmodel, Cl = tm->C_local, Hl = tm->H_local, used = 0;
    Scratch *s = &tm->scratch;
    s->B = B;
    s->T = T;
    s->branch = carve(base, &used, BT * C);
    s->dresid[0] = carve(base, &used, BT * C);
    s->dresid[1] = carve(base, &used, BT * C);
    s->dmid = carve(base, &used, BT * C);
    s->dbranch = carve(base, &used, BT * C);
    s->dln = carve(base, &used, BT * C);
    s->datty = carve(base, &used, BT * Cl);
    s->dqkv = carve(base, &used, BT * 3 * Cl);
    s->dfch = carve(base, &used, BT * Hl);
    s->dfch_gelu = carve(base, &used, BT * Hl);
    s->gelu = carve(base, &used, BT * Hl);
    s->dlogits = carve(base, &used, BT * tm->model.cfg.vocab);
    return used;
}

void tp_model_create_range(TensorParallelModel *tm, const ModelConfig *cfg, uint64_t seed, TensorGroup *tp,
                           int first_unit, int last_unit, int B, int T, int recompute, Precision precision) {
    memset(tm, 0, sizeof *tm);
    tm->tp = tp;
    tm->recompute = recompute;
    tm->first_unit = first_unit;
    tm->last_unit = last_unit;
    tm->C_local = cfg->dmodel / tp->size;
    tm->NH_local = cfg->heads / tp->size;
    tm->H_local = 4 * cfg->dmodel / tp->size;
    ParamTable whole;
    param_table_build(&whole, cfg);
    tm->global_params = whole.num_params;
    build_local_table(tm, cfg, tp->size);
    GPT *m = &tm->model;
    gpt_set_range(m, first_unit, last_unit); /* param_first, param_count of the held units */

    /* the norm's parts (tp_grad_shards, tp_grad_shards_once): the held tensors, offsets in the held buffer */
    tm->norm_spans = xcalloc(m->num_tensors, sizeof(GradSpan));
    tm->once_spans = xcalloc(m->num_tensors, sizeof(GradSpan));
    for (int i = 0; i < m->num_tensors; i++) {
        const ParamTensor *t = &m->tensors[i];
        if (t->layer < first_unit || t->layer > last_unit) continue;
        int replicated = tm->slice[i] == SLICE_NONE;
        GradSpan span = {t->offset - m->param_first, t->numel, replicated};
        tm->norm_spans[tm->num_spans++] = span;
        span.replicated = 0;
        if (!replicated || tp->rank == 0) tm->once_spans[tm->num_once_spans++] = span;
    }

    tp->matmuls = m; /* the parallel layers' matmuls: 16-bit inputs under mixed precision */
    tm->m = m;
    tm->mx = &tm->mixed;
    param_table_free(&whole);
    if (!tp->caller_storage) { /* parameters: each local element starts from its whole tensor's value */
        size_t bytes = m->param_count * sizeof(float);
        float *host = xmalloc(bytes);
        tp_initial_values(tm, seed, host);
        if (precision == PRECISION_FP32) {
            gpt_alloc_range(m, first_unit, last_unit); /* this rank's slices of the held units */
            copy_to_device(m->params, host, bytes);
        } else {
            mixed_create_units(&tm->mixed, m, first_unit, last_unit, host, precision_format(precision));
        }
        free(host);
    }

    size_t floats = carve_scratch(tm, NULL, B, T);
    carve_scratch(tm, mem_alloc(SPACE_DEVICE, CAT_WORKSPACE, floats * sizeof(float), "activation gradients"),
                  B, T);
}

void tp_initial_values(const TensorParallelModel *tm, uint64_t seed, float *host) {
    const GPT *m = tm->m;
    ParamTable whole;
    param_table_build(&whole, &m->cfg);
    for (int i = 0; i < m->num_tensors; i++) { /* the local and whole tables list the same tensors */
        const ParamTensor *t = &m->tensors[i];
        if (t->layer < tm->first_unit || t->layer > tm->last_unit) continue;
        for (size_t e = 0; e < t->numel; e++)
            host[t->offset - m->param_first + e] = param_init_value(
                t, seed,
                tensor_parallel_global_index(&whole.tensors[i], tm->slice[i], tm->tp->rank, tm->tp->size, e));
    }
    param_table_free(&whole);
}

void tp_model_move(TensorParallelModel *tm, GPT *model, MixedModel *mixed) {
    *model = *tm->m;
    *mixed = *tm->mx;
    tm->m = model;
    tm->tp->matmuls = model;
    tm->mx = mixed;
    if (mixed->params) { /* the 16-bit storage binds each unit's views into its model (mixed.h) */
        mixed->model = model;
        mixed->storage.context = mixed;
        model->storage = &mixed->storage;
    }
}

void tp_activations_create(const TensorParallelModel *tm, Activations *a, int B, int T) {
    /* the embedding and head parts are whole (model.c: the head's only where it is held); the
     * blocks, carved here with local widths, sit in a->block as usual */
    int L = tm->model.cfg.layers;
    activations_create_range(a, &tm->model.cfg, B, T, L, tm->last_unit == L ? L : L - 1, 0);
    size_t floats = carve_blocks(tm, a, NULL, B, T);
    carve_blocks(tm, a, mem_alloc(SPACE_DEVICE, CAT_ACTIVATIONS, floats * sizeof(float), "block activations"),
                 B, T);
}

void tp_activations_destroy(const TensorParallelModel *tm, Activations *a) {
    mem_free(a->block[first_block(tm)].ln1); /* the blocks' memory starts there */
    activations_destroy(a, &tm->model.cfg);
}

void tp_model_create(TensorParallelModel *tm, const ModelConfig *cfg, uint64_t seed, TensorGroup *tp, int B,
                     int T, int recompute, Precision precision) {
    tp_model_create_range(tm, cfg, seed, tp, LAYER_EMBEDDING, cfg->layers, B, T, recompute, precision);
    tp_activations_create(tm, &tm->acts, B, T);
}

void tp_model_destroy(TensorParallelModel *tm) {
    mem_free(tm->scratch.branch);
    if (tm->acts.block) tp_activations_destroy(tm, &tm->acts);
    free(tm->slice);
    free(tm->norm_spans);
    free(tm->once_spans);
    precision_destroy(tm->m, tm->mx);
    memset(tm, 0, sizeof *tm);
}

/* ---- forward and backward ---- */

/* One block up to fch, the last value its backward reads (what recompute
 * runs again, with its all-reduce), as block_forward_values in model.c. */
static void tp_block_forward_values(TensorParallelModel *tm, int l, const float *input, int B, int T) {
    const KernelOps *k = ops();
    int C = tm->model.cfg.dmodel, Cl = tm->C_local, Hl = tm->H_local, N = B * T;
    float **w = tm->m->w.block[l];
    BlockActs *b = &tm->now->block[l];
    Scratch *s = &tm->scratch;
    /* attention half: each rank computes its heads, attproj sums them (all-reduce 1) */
    k->layernorm_forward(b->ln1, b->ln1_mean, b->ln1_rstd, input, w[BLOCK_LN1W], w[BLOCK_LN1B], N, C);
    column_parallel_forward(tm->tp, b->qkv, b->ln1, w[BLOCK_QKVW], w[BLOCK_QKVB], N, C, 3 * Cl);
    k->attention_forward(b->atty, b->lse, b->qkv, B, T, Cl, tm->NH_local);
    row_parallel_forward(tm->tp, s->branch, b->atty, w[BLOCK_ATTPROJW], w[BLOCK_ATTPROJB], N, Cl, C);
    k->residual_forward(b->res2, input, s->branch, (size_t)N * C);
    /* MLP half: each rank computes 4C/tp hidden units */
    k->layernorm_forward(b->ln2, b->ln2_mean, b->ln2_rstd, b->res2, w[BLOCK_LN2W], w[BLOCK_LN2B], N, C);
    column_parallel_forward(tm->tp, b->fch, b->ln2, w[BLOCK_FCW], w[BLOCK_FCB], N, C, Hl);
}

/* One block, as gpt_block_forward (model.c) with the four matrices split: a
 * BlockForwardFn, called by gpt_forward_range in place of gpt_block_forward. */
static void tp_block_forward(int l, const float *input, int B, int T, void *context) {
    TensorParallelModel *tm = context;
    const KernelOps *k = ops();
    int C = tm->model.cfg.dmodel, Hl = tm->H_local, N = B * T;
    float **w = tm->m->w.block[l];
    BlockActs *b = &tm->now->block[l];
    Scratch *s = &tm->scratch;
    tp_block_forward_values(tm, l, input, B, T);
    /* the rest of the MLP half: fcproj sums the ranks' hidden units (all-reduce 2) */
    k->gelu_forward(s->gelu, b->fch, (size_t)N * Hl);
    row_parallel_forward(tm->tp, s->branch, s->gelu, w[BLOCK_FCPROJW], w[BLOCK_FCPROJB], N, Hl, C);
    k->residual_forward(b->res3, b->res2, s->branch, (size_t)N * C);
}

/* One block, as gpt_block_backward: two all-reduces, inside
 * column_parallel_backward. A BlockBackwardFn. */
static void tp_block_backward(int l, const float *input, const float *doutput, float *dinput, int B, int T,
                              void *context) {
    TensorParallelModel *tm = context;
    const KernelOps *k = ops();
    int C = tm->model.cfg.dmodel, Cl = tm->C_local, Hl = tm->H_local, N = B * T;
    size_t NC = (size_t)N * C;
    float **w = tm->m->w.block[l], **g = tm->m->g.block[l];
    BlockActs *b = &tm->now->block[l];
    Scratch *s = &tm->scratch;
    if (tm->recompute) tp_block_forward_values(tm, l, input, B, T); /* this block's values, again */
    /* MLP half */
    k->fill_zero(s->dmid, NC);
    k->fill_zero(s->dbranch, NC);
    k->residual_backward(s->dmid, s->dbranch, doutput, NC);
    k->gelu_forward(s->gelu, b->fch, (size_t)N * Hl); /* recomputed, as in model.c */
    k->fill_zero(s->dfch_gelu, (size_t)N * Hl);
    row_parallel_backward(tm->tp, s->dfch_gelu, g[BLOCK_FCPROJW], g[BLOCK_FCPROJB], s->dbranch, s->gelu,
                          w[BLOCK_FCPROJW], N, Hl, C);
    k->fill_zero(s->dfch, (size_t)N * Hl);
    k->gelu_backward(s->dfch, b->fch, s->dfch_gelu, (size_t)N * Hl);
    column_parallel_backward(tm->tp, s->dln, g[BLOCK_FCW], g[BLOCK_FCB], s->dfch, b->ln2, w[BLOCK_FCW], N, C,
                             Hl);
    k->layernorm_backward(s->dmid, g[BLOCK_LN2W], g[BLOCK_LN2B], s->dln, b->res2, w[BLOCK_LN2W], b->ln2_mean,
                          b->ln2_rstd, N, C);
    /* attention half */
    k->fill_zero(dinput, NC);
    k->fill_zero(s->dbranch, NC);
    k->residual_backward(dinput, s->dbranch, s->dmid, NC);
    k->fill_zero(s->datty, (size_t)N * Cl);
    row_parallel_backward(tm->tp, s->datty, g[BLOCK_ATTPROJW], g[BLOCK_ATTPROJB], s->dbranch, b->atty,
                          w[BLOCK_ATTPROJW], N, Cl, C);
    k->fill_zero(s->dqkv, (size_t)N * 3 * Cl);
    k->attention_backward(s->dqkv, s->datty, b->qkv, b->atty, b->lse, B, T, Cl, tm->NH_local);
    column_parallel_backward(tm->tp, s->dln, g[BLOCK_QKVW], g[BLOCK_QKVB], s->dqkv, b->ln1, w[BLOCK_QKVW], N,
                             C, 3 * Cl);
    k->layernorm_backward(dinput, g[BLOCK_LN1W], g[BLOCK_LN1B], s->dln, input, w[BLOCK_LN1W], b->ln1_mean,
                          b->ln1_rstd, N, C);
}

/* The loop over the units is model.c's; only the blocks are this file's. */
UnitHooks tp_block_hooks(TensorParallelModel *tm) {
    return (UnitHooks){.block_forward = tp_block_forward, .block_backward = tp_block_backward, .context = tm};
}

void tp_forward(TensorParallelModel *tm, int with_loss, int B, int T) {
    UnitHooks sliced = tp_block_hooks(tm);
    tm->now = &tm->acts;
    gpt_forward_range(&tm->model, &tm->acts, &tm->scratch, LAYER_EMBEDDING, tm->model.cfg.layers, with_loss,
                      &sliced, B, T);
}

void tp_backward(TensorParallelModel *tm, float dloss, int B, int T) {
    UnitHooks sliced = tp_block_hooks(tm);
    tm->now = &tm->acts;
    gpt_backward_range(&tm->model, &tm->acts, &tm->scratch, LAYER_EMBEDDING, tm->model.cfg.layers, dloss,
                       NULL, NULL, &sliced, B, T);
}

GradShards tp_grad_shards(const TensorParallelModel *tm) {
    GradShards g = precision_grad_shards(tm->m, tm->mx);
    g.spans = tm->norm_spans;
    g.num_spans = tm->num_spans;
    g.agree = grad_norm_agree;
    g.sum_group = tm->tp->group;
    return g;
}

GradShards tp_grad_shards_once(const TensorParallelModel *tm, CommGroup *model_group) {
    GradShards g = tp_grad_shards(tm);
    g.spans = tm->once_spans;
    g.num_spans = tm->num_once_spans;
    g.sum_group = model_group;
    return g;
}

/* ---- checkpoints ---- */

void tp_checkpoint_layout(const TensorParallelModel *tm, const AdamW *opt, int replica, CkptLayout *l) {
    const GPT *m = tm->m;
    float *buffers[CKPT_ARRAYS] = {m->params, opt->m, opt->v};
    for (int a = 0; a < CKPT_ARRAYS; a++) ckpt_set_buffer(l, a, buffers[a], m->param_count, 0);
    ParamTable whole;
    param_table_build(&whole, &m->cfg);
    for (int i = 0; i < m->num_tensors; i++) { /* the local and whole tables list the same tensors */
        const ParamTensor *t = &m->tensors[i], *w = &whole.tensors[i];
        if (t->layer < tm->first_unit || t->layer > tm->last_unit) continue; /* another stage's */
        /* replica 0 writes; a replicated tensor, its tp rank 0 only */
        int writes = replica == 0 && (tm->slice[i] != SLICE_NONE || tm->tp->rank == 0);
        int r = tm->tp->rank, tp = tm->tp->size;
        for (size_t e = 0, n; e < t->numel; e += n) { /* runs contiguous in the slice and the whole tensor */
            size_t g = tensor_parallel_global_index(w, tm->slice[i], r, tp, e);
            for (n = 1;
                 e + n < t->numel && tensor_parallel_global_index(w, tm->slice[i], r, tp, e + n) == g + n;)
                n++;
            for (int a = 0; a < CKPT_ARRAYS; a++)
                ckpt_hold(l, a, w->offset + g, n, t->offset - m->param_first + e, writes);
        }
    }
    param_table_free(&whole);
}
