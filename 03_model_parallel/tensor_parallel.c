/* tensor_parallel.c: see tensor_parallel.h. */
#include "03_model_parallel/tensor_parallel.h" /* 03: tensor parallelism */

#include "common/device/device.h" /* mem_alloc, copies, streams, timers */
#include "common/kernels/kernels.h" /* ops(): the kernel table */
#include "common/comm/optimizer_agree.h" /* grad_norm_agree across ranks */
#include "common/core/util.h" /* fatal, log_info, exit codes, flag parsing */

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void tp_allreduce(TensorGroup *tp, float *buf, size_t count) {
    device_sync();
    double start = wall_ms();
    comm_allreduce(tp->group, buf, count, COMM_SUM);
    tp->comm_ms += wall_ms() - start;
}
void tp_allgather(TensorGroup *tp, const float *send, float *recv, size_t count) {
    device_sync();
    double start = wall_ms();
    comm_allgather(tp->group, send, recv, count);
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

/* How tensor t of model cfg is divided: the blocks' four matrices (and the
 * biases of the column-parallel ones), and wte and the head by vocabulary rows.
 * An MoE block's router and experts are held whole, as the layernorms are. */
static SliceKind slice_of(const ParamTensor *t, const ModelConfig *cfg) {
    int L = cfg->layers;
    if (param_expert_tensor(cfg, t)) return SLICE_NONE;
    if (t->layer == LAYER_EMBEDDING) return t->kind == EMBEDDING_WTE ? SLICE_ROWS : SLICE_NONE;
    if (t->layer == L) return t->kind == HEAD_LM_HEAD ? SLICE_ROWS : SLICE_NONE;
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
        SliceKind kind = slice_of(t, cfg);
        tm->slice[i] = kind;
        if (kind == SLICE_COLS || (t->rows == 1 && kind != SLICE_NONE))
            t->cols /= tp;
        else if (kind != SLICE_NONE)
            t->rows /= tp;
    }
    param_table_layout(&local); /* offsets of the smaller tensors */
    local.cfg.vocab_parts = tp; /* the logits of this rank's rows of the head (model.h) */
    gpt_init(&tm->model, local);
}

/* Carve one block's activations (or, with base NULL, count them). */
static float *carve(float *base, size_t *used, size_t count) {
    float *p = base ? base + *used : NULL;
    *used += count;
    return p;
}

int tp_first_block(const TensorParallelModel *tm) {
    return tm->first_unit > 0 ? tm->first_unit : 0;
}
int tp_last_block(const TensorParallelModel *tm) {
    int L = tm->model.cfg.layers;
    return tm->last_unit < L ? tm->last_unit : L - 1;
}

/* Blocks first..last. With recompute (tm->recompute) the blocks share one
 * set of values, as in model.c, and keep only their outputs res3. */
static size_t carve_blocks(const TensorParallelModel *tm, Activations *a, float *base, int B, int T, int first,
                           int last) {
    size_t BT = (size_t)B * T, C = tm->model.cfg.dmodel, Cl = tm->C_local, Hl = tm->H_local, used = 0;
    size_t R = tm->sp ? BT / tm->tp->size : BT; /* rows of the layernorm and residual regions */
    for (int l = first; l <= last; l++) {
        BlockActs *b = &a->block[l];
        if (tm->recompute && l > first) {
            *b = a->block[first]; /* the shared set */
            b->res3 = carve(base, &used, BT * C);
            continue;
        }
        b->ln1 = carve(base, &used, R * C);
        b->ln1_mean = carve(base, &used, R);
        b->ln1_rstd = carve(base, &used, R);
        b->qkv = carve(base, &used, BT * 3 * Cl);
        b->atty = carve(base, &used, BT * Cl);
        b->lse = carve(base, &used, (size_t)B * tm->NH_local * T);
        b->res2 = carve(base, &used, R * C);
        b->ln2 = carve(base, &used, R * C);
        b->ln2_mean = carve(base, &used, R);
        b->ln2_rstd = carve(base, &used, R);
        b->fch = carve(base, &used, BT * Hl);
        b->res3 = carve(base, &used, (l == tp_last_block(tm) ? BT : R) * C); /* the head reads it whole */
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
    s->dlogits = carve(base, &used,
                       (size_t)head_piece_tokens(&tm->model.cfg, B * T) * vocab_rows_held(&tm->model.cfg));
    return used;
}

/* Whether unit u is held, and where a held tensor's elements start in the
 * held buffer (the held runs of units one after another). */
static int holds(const TensorParallelModel *tm, int unit) {
    return tm->held_at[unit + 1] != SIZE_MAX;
}
static size_t held_offset(const TensorParallelModel *tm, const ParamTensor *t) {
    return tm->held_at[t->layer + 1] + t->offset - table_unit(&tm->model.table, t->layer)->offset;
}

/* The vocabulary split's collectives (model.h, VocabSplit): over the group, timed. */
static void vocab_allreduce_sum(float *buf, size_t count, void *context) {
    tp_allreduce(context, buf, count);
}
static void vocab_allgather(const float *mine, float *all, size_t count, void *context) {
    tp_allgather(context, mine, all, count);
}

/* Storage for several runs of units in one buffer (fp32), each unit bound where it lies. */
static void alloc_runs(GPT *m, const TensorParallelModel *tm) {
    m->params = mem_alloc(SPACE_DEVICE, CAT_PARAMS, m->param_count * sizeof(float), "parameters");
    m->grads = mem_alloc(SPACE_DEVICE, CAT_GRADS, m->param_count * sizeof(float), "gradients");
    m->owns_storage = 1;
    for (int u = LAYER_EMBEDDING; u <= m->cfg.layers; u++) /* a pipeline's tied copy too */
        if (holds(tm, u)) gpt_bind_unit(m, u, m->params + tm->held_at[u + 1], m->grads + tm->held_at[u + 1]);
}

void tp_model_create_chunks(TensorParallelModel *tm, const ModelConfig *cfg, uint64_t seed, TensorGroup *tp,
                            const int *first_units, const int *last_units, int chunks, int B, int T,
                            int recompute, Precision precision) {
    memset(tm, 0, sizeof *tm);
    tm->tp = tp;
    tm->recompute = recompute;
    /* the range: the first run's first unit to the last unit of any run (a last run of units
     * before the range is a copy: 04's tied embedding on the last stage, pipeline.h) */
    tm->first_unit = first_units[0];
    tm->last_unit = last_units[chunks - 1];
    for (int c = 0; c < chunks; c++)
        tm->last_unit = last_units[c] > tm->last_unit ? last_units[c] : tm->last_unit;
    tm->C_local = cfg->dmodel / tp->size;
    tm->NH_local = cfg->heads / tp->size;
    tm->H_local = 4 * cfg->dmodel / tp->size;
    ParamTable whole;
    ModelConfig every = *cfg; /* the whole model's: every expert, under expert parallelism too */
    every.moe.parts = every.moe.part = 0;
    param_table_build(&whole, &every);
    tm->global_params = whole.num_params;
    build_local_table(tm, cfg, tp->size);
    GPT *m = &tm->model;
    tm->held_at = xmalloc((cfg->layers + 2) * sizeof(size_t));
    for (int u = LAYER_EMBEDDING; u <= cfg->layers; u++) tm->held_at[u + 1] = SIZE_MAX;
    size_t held = 0;
    for (int c = 0; c < chunks; c++)
        for (int u = first_units[c]; u <= last_units[c]; u++) {
            tm->held_at[u + 1] = held;
            held += table_unit(&m->table, u)->numel;
        }
    gpt_set_range(m, tm->first_unit, tm->last_unit); /* param_first: the held span's first element */
    m->param_count = held;                           /* of which the chunks' units are held */
    int own_runs = 0; /* runs of the range's units, a copy before it (the tied wte) not counted */
    for (int c = 0; c < chunks; c++) own_runs += first_units[c] >= tm->first_unit;
    if (own_runs > 1) m->unit_at = tm->held_at; /* several runs: where each unit is (gpt_held_offset) */

    /* the norm's parts (tp_grad_shards, tp_grad_shards_once): the held tensors, offsets in the held buffer */
    tm->norm_spans = xcalloc(m->num_tensors, sizeof(GradSpan));
    tm->once_spans = xcalloc(m->num_tensors, sizeof(GradSpan));
    for (int i = 0; i < m->num_tensors; i++) {
        const ParamTensor *t = &m->tensors[i];
        if (!holds(tm, t->layer) || t->layer < tm->first_unit) continue; /* not a copy: counted once */
        int replicated = tm->slice[i] == SLICE_NONE;
        GradSpan span = {held_offset(tm, t), t->numel, replicated};
        tm->norm_spans[tm->num_spans++] = span;
        span.replicated = 0;
        if (!replicated || tp->rank == 0) tm->once_spans[tm->num_once_spans++] = span;
    }

    if (tp->size > 1) { /* wte and the head by vocabulary rows: this rank's share, and how to sum */
        size_t stats = (size_t)(tp->size + 3) * head_piece_tokens(&m->cfg, B * T);
        tm->vocab = (VocabSplit){.parts = tp->size,
                                 .first_row = tp->rank * vocab_rows_held(&m->cfg),
                                 .stats = mem_alloc(SPACE_DEVICE, CAT_WORKSPACE, stats * sizeof(float),
                                                    "loss statistics"),
                                 .allreduce_sum = vocab_allreduce_sum,
                                 .allgather = vocab_allgather,
                                 .context = tp};
        m->vocab = &tm->vocab;
    }
    tp->matmuls = m; /* the parallel layers' matmuls: 16-bit inputs under mixed precision */
    tm->m = m;
    tm->mx = &tm->mixed;
    param_table_free(&whole);
    if (!tp->caller_storage) { /* parameters: each local element starts from its whole tensor's value */
        size_t bytes = m->param_count * sizeof(float);
        float *host = host_scratch(bytes); /* a dry run: address space only, and no weights written */
        if (!device_dry()) tp_initial_values(tm, seed, host);
        if (precision != PRECISION_FP32) {
            mixed_create_chunks(&tm->mixed, m, first_units, last_units, chunks, host,
                                precision_format(precision));
        } else {
            if (chunks == 1)
                gpt_alloc_range(m, tm->first_unit, tm->last_unit); /* this rank's slices of the held units */
            else
                alloc_runs(m, tm);
            copy_to_device(m->params, host, bytes);
        }
        host_scratch_free(host, bytes);
    }

    size_t floats = carve_scratch(tm, NULL, B, T);
    carve_scratch(tm, mem_alloc(SPACE_DEVICE, CAT_WORKSPACE, floats * sizeof(float), "activation gradients"),
                  B, T);
    moe_scratch_create(&tm->scratch.moe, &tm->model.cfg, B, T); /* the MoE blocks' gradients, whole */
}

void tp_model_create_range(TensorParallelModel *tm, const ModelConfig *cfg, uint64_t seed, TensorGroup *tp,
                           int first_unit, int last_unit, int B, int T, int recompute, Precision precision) {
    tp_model_create_chunks(tm, cfg, seed, tp, &first_unit, &last_unit, 1, B, T, recompute, precision);
}

void tp_initial_values(const TensorParallelModel *tm, uint64_t seed, float *host) {
    const GPT *m = tm->m;
    ParamTable whole;
    param_table_build(&whole, &m->cfg);
    for (int i = 0; i < m->num_tensors; i++) { /* the local and whole tables list the same tensors */
        const ParamTensor *t = &m->tensors[i];
        if (!holds(tm, t->layer)) continue;
        for (size_t e = 0; e < t->numel; e++)
            host[held_offset(tm, t) + e] = param_init_value(
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

void tp_activations_create_range(const TensorParallelModel *tm, Activations *a, int B, int T, int first_unit,
                                 int last_unit) {
    /* the embedding and head parts are model.c's (the head's only where it is held; its logits
     * this rank's vocabulary columns: the local cfg's vocab_parts); the blocks, carved here with
     * local widths, sit in a->block as usual */
    int L = tm->model.cfg.layers;
    int first = first_unit > 0 ? first_unit : 0, last = last_unit < L ? last_unit : L - 1;
    activations_create_range(a, &tm->model.cfg, B, T, L, last_unit == L ? L : L - 1, 0);
    size_t floats = carve_blocks(tm, a, NULL, B, T, first, last);
    carve_blocks(tm, a, mem_alloc(SPACE_DEVICE, CAT_ACTIVATIONS, floats * sizeof(float), "block activations"),
                 B, T, first, last);
    moe_acts_destroy(&a->moe); /* the head's range's (none): the MoE blocks' are the blocks' range */
    moe_acts_create(&a->moe, &tm->model.cfg, B, T, first_unit, last_unit);
}

void tp_activations_create(const TensorParallelModel *tm, Activations *a, int B, int T) {
    tp_activations_create_range(tm, a, B, T, tm->first_unit, tm->last_unit);
    if (tm->sp) {
        TensorParallelModel *w = (TensorParallelModel *)tm; /* its workspace, once per model */
        size_t BTC = (size_t)B * T * tm->model.cfg.dmodel;
        w->sp_whole = mem_alloc(SPACE_DEVICE, CAT_WORKSPACE, BTC * sizeof(float), "sp whole rows");
        w->sp_rows = mem_alloc(SPACE_DEVICE, CAT_WORKSPACE, BTC / tm->tp->size * sizeof(float), "sp rows");
        w->sp_ln_grads =
            mem_alloc(SPACE_DEVICE, CAT_WORKSPACE, 2 * tm->model.cfg.dmodel * sizeof(float), "sp ln grads");
    }
}

void tp_activations_destroy(const TensorParallelModel *tm, Activations *a) {
    TensorParallelModel *w = (TensorParallelModel *)tm; /* the sp workspace (tp_activations_create) */
    mem_free(w->sp_whole);
    mem_free(w->sp_rows);
    mem_free(w->sp_ln_grads);
    w->sp_whole = w->sp_rows = w->sp_ln_grads = NULL;
    int first = 0;
    while (first < tm->model.cfg.layers - 1 && !a->block[first].ln1) first++;
    mem_free(a->block[first].ln1); /* the blocks' memory starts at the first one carved */
    activations_destroy(a, &tm->model.cfg);
}

void tp_model_create(TensorParallelModel *tm, const ModelConfig *cfg, uint64_t seed, TensorGroup *tp, int B,
                     int T, int recompute, Precision precision) {
    tp_model_create_range(tm, cfg, seed, tp, LAYER_EMBEDDING, cfg->layers, B, T, recompute, precision);
    tp_activations_create(tm, &tm->acts, B, T);
}

void tp_model_destroy(TensorParallelModel *tm) {
    mem_free(tm->scratch.branch);
    moe_scratch_destroy(&tm->scratch.moe);
    mem_free(tm->vocab.stats);
    if (tm->acts.block) tp_activations_destroy(tm, &tm->acts);
    free(tm->slice);
    free(tm->held_at);
    free(tm->norm_spans);
    free(tm->once_spans);
    precision_destroy(tm->m, tm->mx);
    memset(tm, 0, sizeof *tm);
}

/* ---- forward and backward ---- */

/* Attention on this rank's heads: the fused kernel, or with a sequence split
 * (context parallelism, model.h) the split's ring over the cp ranks. */
static void heads_attention_forward(const TensorParallelModel *tm, BlockActs *b, int B, int T) {
    const SequenceSplit *seq = tm->m->sequence;
    if (seq)
        seq->attention_forward(b->atty, b->lse, b->qkv, B, T, tm->C_local, tm->NH_local, seq->context);
    else
        ops()->attention_forward(b->atty, b->lse, b->qkv, B, T, tm->C_local, tm->NH_local);
}
static void heads_attention_backward(const TensorParallelModel *tm, float *dqkv, BlockActs *b, Scratch *s, int B,
                                     int T) {
    const SequenceSplit *seq = tm->m->sequence;
    if (seq)
        seq->attention_backward(dqkv, s->datty, b->qkv, b->atty, b->lse, B, T, tm->C_local, tm->NH_local,
                                seq->context);
    else
        ops()->attention_backward(dqkv, s->datty, b->qkv, b->atty, b->lse, B, T, tm->C_local, tm->NH_local);
}

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
    heads_attention_forward(tm, b, B, T);
    row_parallel_forward(tm->tp, s->branch, b->atty, w[BLOCK_ATTPROJW], w[BLOCK_ATTPROJB], N, Cl, C);
    k->residual_forward(b->res2, input, s->branch, (size_t)N * C);
    /* MLP half: each rank computes 4C/tp hidden units (an MoE block: its experts follow ln2) */
    k->layernorm_forward(b->ln2, b->ln2_mean, b->ln2_rstd, b->res2, w[BLOCK_LN2W], w[BLOCK_LN2B], N, C);
    if (!moe_layer(&tm->model.cfg, l))
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
    if (moe_layer(&tm->model.cfg, l)) { /* the experts, whole on every rank: the same tokens, no all-reduce */
        gpt_moe_forward(tm->m, tm->now, s, l, b->ln2, s->branch, B, T);
        if (tm->tp->rank != 0) tm->now->moe.stats = (MoeStats){0}; /* the routing reported once: tp rank 0 */
    } else { /* the rest of the MLP half: fcproj sums the ranks' hidden units (all-reduce 2) */
        k->gelu_forward(s->gelu, b->fch, (size_t)N * Hl);
        row_parallel_forward(tm->tp, s->branch, s->gelu, w[BLOCK_FCPROJW], w[BLOCK_FCPROJB], N, Hl, C);
    }
    k->residual_forward(b->res3, b->res2, s->branch, (size_t)N * C);
}

/* A row-parallel layer's backward, or in B of a split backward only its
 * input's gradient (local: g's conjugate needs no communication). */
static void tp_row_backward(TensorParallelModel *tm, int input_only, float *dinp_local, float *dweight_local,
                            float *dbias, const float *dout, const float *inp_local, const float *weight_local,
                            int N, int C_local, int OC) {
    if (!input_only) {
        row_parallel_backward(tm->tp, dinp_local, dweight_local, dbias, dout, inp_local, weight_local, N,
                              C_local, OC);
        return;
    }
    gpt_linear_backward_input(tm->m, dinp_local, dout, weight_local, N, C_local, OC);
}

/* A column-parallel layer's backward, or in B only its input's gradient:
 * each rank's share of it, summed over the group (f's conjugate). */
static void tp_column_backward(TensorParallelModel *tm, int input_only, float *din_whole, float *dweight_local,
                               float *dbias_local, const float *dout_local, const float *inp,
                               const float *weight_local, int N, int C, int OC_local) {
    if (!input_only) {
        column_parallel_backward(tm->tp, din_whole, dweight_local, dbias_local, dout_local, inp, weight_local,
                                 N, C, OC_local);
        return;
    }
    size_t whole = (size_t)N * C;
    ops()->fill_zero(din_whole, whole);
    gpt_linear_backward_input(tm->m, din_whole, dout_local, weight_local, N, C, OC_local);
    tp_allreduce(tm->tp, din_whole, whole);
}

/* One block, as gpt_block_backward: two all-reduces, inside the
 * column-parallel layers' backward. With kept (B of a split backward) the
 * four weight gradients are left for W, and the linear layers' output
 * gradients (local widths where the layer's output is sliced) are made in
 * kept instead of the scratch. */
static void tp_block_backward_or_input(TensorParallelModel *tm, int l, const float *input, const float *doutput,
                                       float *dinput, BlockKeptGrads *kept, int B, int T) {
    const KernelOps *k = ops();
    int C = tm->model.cfg.dmodel, Cl = tm->C_local, Hl = tm->H_local, N = B * T, split = kept != NULL;
    size_t NC = (size_t)N * C;
    float **w = tm->m->w.block[l], **g = tm->m->g.block[l];
    BlockActs *b = &tm->now->block[l];
    Scratch *s = &tm->scratch;
    float *dfcproj = split ? kept->dout : s->dbranch, *dattproj = split ? kept->dmid : s->dbranch;
    float *dfch = split ? kept->dfch : s->dfch, *dqkv = split ? kept->dqkv : s->dqkv;
    if (tm->recompute) tp_block_forward_values(tm, l, input, B, T); /* this block's values, again */
    /* MLP half */
    k->fill_zero(s->dmid, NC);
    k->fill_zero(dfcproj, NC);
    k->residual_backward(s->dmid, dfcproj, doutput, NC);
    if (moe_layer(&tm->model.cfg, l)) { /* whole on every rank: dln whole too (split: its weights here, in B) */
        k->fill_zero(s->dln, NC);
        gpt_moe_backward(tm->m, tm->now, s, l, b->ln2, dfcproj, s->dln, B, T);
    } else {
        k->gelu_forward(s->gelu, b->fch, (size_t)N * Hl); /* recomputed, as in model.c */
        k->fill_zero(s->dfch_gelu, (size_t)N * Hl);
        tp_row_backward(tm, split, s->dfch_gelu, g[BLOCK_FCPROJW], g[BLOCK_FCPROJB], dfcproj, s->gelu,
                        w[BLOCK_FCPROJW], N, Hl, C);
        k->fill_zero(dfch, (size_t)N * Hl);
        k->gelu_backward(dfch, b->fch, s->dfch_gelu, (size_t)N * Hl);
        tp_column_backward(tm, split, s->dln, g[BLOCK_FCW], g[BLOCK_FCB], dfch, b->ln2, w[BLOCK_FCW], N, C, Hl);
    }
    k->layernorm_backward(s->dmid, g[BLOCK_LN2W], g[BLOCK_LN2B], s->dln, b->res2, w[BLOCK_LN2W], b->ln2_mean,
                          b->ln2_rstd, N, C);
    /* attention half */
    k->fill_zero(dinput, NC);
    k->fill_zero(dattproj, NC);
    k->residual_backward(dinput, dattproj, s->dmid, NC);
    k->fill_zero(s->datty, (size_t)N * Cl);
    tp_row_backward(tm, split, s->datty, g[BLOCK_ATTPROJW], g[BLOCK_ATTPROJB], dattproj, b->atty,
                    w[BLOCK_ATTPROJW], N, Cl, C);
    k->fill_zero(dqkv, (size_t)N * 3 * Cl);
    heads_attention_backward(tm, dqkv, b, s, B, T);
    tp_column_backward(tm, split, s->dln, g[BLOCK_QKVW], g[BLOCK_QKVB], dqkv, b->ln1, w[BLOCK_QKVW], N, C,
                       3 * Cl);
    k->layernorm_backward(dinput, g[BLOCK_LN1W], g[BLOCK_LN1B], s->dln, input, w[BLOCK_LN1W], b->ln1_mean,
                          b->ln1_rstd, N, C);
}

/* A BlockBackwardFn: the whole backward of a block. */
static void tp_block_backward(int l, const float *input, const float *doutput, float *dinput, int B, int T,
                              void *context) {
    tp_block_backward_or_input(context, l, input, doutput, dinput, NULL, B, T);
}

/* B of a block (a BlockBackwardFn of the split backward): into tm->kept. */
static void tp_block_backward_input(int l, const float *input, const float *doutput, float *dinput, int B,
                                    int T, void *context) {
    TensorParallelModel *tm = context;
    tp_block_backward_or_input(tm, l, input, doutput, dinput, &tm->kept->block[l], B, T);
}

/* W of a block (a BlockWeightFn): the four sliced layers' weight gradients
 * (and their biases'), each rank its own slices: no communication, but for
 * recompute's forward again (model.h says why W runs it once more). */
static void tp_block_backward_weight(int l, const float *input, int B, int T, void *context) {
    TensorParallelModel *tm = context;
    int C = tm->model.cfg.dmodel, Cl = tm->C_local, Hl = tm->H_local, N = B * T;
    float **g = tm->m->g.block[l];
    const BlockActs *b = &tm->now->block[l];
    if (tm->recompute) tp_block_forward_values(tm, l, input, B, T); /* this block's values, once more */
    const BlockKeptGrads *kept = &tm->kept->block[l];
    float *gelu = tm->scratch.gelu;
    if (!moe_layer(&tm->model.cfg, l)) { /* an MoE block's router and experts: in B */
        ops()->gelu_forward(gelu, b->fch, (size_t)N * Hl);
        gpt_linear_backward_weight(tm->m, g[BLOCK_FCPROJW], g[BLOCK_FCPROJB], kept->dout, gelu, N, Hl, C);
        gpt_linear_backward_weight(tm->m, g[BLOCK_FCW], g[BLOCK_FCB], kept->dfch, b->ln2, N, C, Hl);
    }
    gpt_linear_backward_weight(tm->m, g[BLOCK_ATTPROJW], g[BLOCK_ATTPROJB], kept->dmid, b->atty, N, Cl, C);
    gpt_linear_backward_weight(tm->m, g[BLOCK_QKVW], g[BLOCK_QKVB], kept->dqkv, b->ln1, N, C, 3 * Cl);
}

UnitHooks tp_split_hooks(TensorParallelModel *tm) {
    return (UnitHooks){.block_forward = tp_block_forward,
                       .block_backward = tp_block_backward_input,
                       .block_backward_weight = tp_block_backward_weight,
                       .context = tm};
}

/* Carve one micro-batch's kept gradients (or, with base NULL, count them). */
static size_t carve_kept(const TensorParallelModel *tm, KeptGrads *kg, float *base, int B, int T) {
    const ModelConfig *c = &tm->model.cfg;
    size_t BT = (size_t)B * T, used = 0;
    for (int l = tp_first_block(tm); l <= tp_last_block(tm); l++) {
        BlockKeptGrads *k = &kg->block[l];
        k->dout = carve(base, &used, BT * c->dmodel);
        k->dfch = carve(base, &used, BT * tm->H_local);
        k->dmid = carve(base, &used, BT * c->dmodel);
        k->dqkv = carve(base, &used, BT * 3 * tm->C_local);
    }
    if (tm->last_unit == c->layers && c->loss_chunks <= 1)
        kg->dlogits = carve(base, &used, BT * vocab_rows_held(c));
    return used;
}

void tp_kept_grads_create(const TensorParallelModel *tm, KeptGrads *kg, int B, int T) {
    *kg = (KeptGrads){.B = B, .T = T, .block = xcalloc(tm->model.cfg.layers, sizeof(BlockKeptGrads))};
    size_t floats = carve_kept(tm, kg, NULL, B, T);
    kg->storage = mem_alloc(SPACE_DEVICE, CAT_ACTIVATIONS, floats * sizeof(float), "output gradients kept for W");
    carve_kept(tm, kg, kg->storage, B, T);
}

/* The loop over the units is model.c's; only the blocks are this file's. */
UnitHooks tp_block_hooks(TensorParallelModel *tm) {
    if (tm->sp) return tm->sp_blocks; /* the blocks in rows (sequence_parallel_enable) */
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
    if (device_dry()) return; /* a dry run writes no checkpoint: its runs, element by element, unbuilt */
    ParamTable whole;
    ModelConfig every = m->cfg; /* the checkpoint's: every expert (the local table may hold a share) */
    every.moe.parts = every.moe.part = 0;
    param_table_build(&whole, &every);
    int expert_writers = m->cfg.moe.parts > 1 ? m->cfg.moe.parts : 1; /* replica d holds share d mod parts */
    for (int i = 0; i < m->num_tensors; i++) { /* the local and whole tables list the same tensors */
        const ParamTensor *t = &m->tensors[i], *w = &whole.tensors[i];
        if (!holds(tm, t->layer)) continue; /* another stage's */
        /* replica 0 writes (an expert tensor: replicas 0 .. parts-1, one per share of the experts);
         * a replicated tensor, its tp rank 0 only */
        int writers = param_expert_tensor(&m->cfg, t) ? expert_writers : 1;
        int writes = replica < writers && (tm->slice[i] != SLICE_NONE || tm->tp->rank == 0) &&
                     t->layer >= tm->first_unit; /* a copy (the tied wte) is read, not written */
        int r = tm->tp->rank, tp = tm->tp->size;
        for (size_t e = 0, n; e < t->numel; e += n) { /* runs contiguous in the slice and the whole tensor */
            size_t g = tensor_parallel_global_index(w, tm->slice[i], r, tp, e);
            for (n = 1;
                 e + n < t->numel && tensor_parallel_global_index(w, tm->slice[i], r, tp, e + n) == g + n;)
                n++;
            for (int a = 0; a < CKPT_ARRAYS; a++) /* a share of the experts: from its first element */
                ckpt_hold(l, a, w->offset + t->whole_first + g, n, held_offset(tm, t) + e, writes);
        }
    }
    param_table_free(&whole);
}
