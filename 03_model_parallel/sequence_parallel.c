/* sequence_parallel.c: see sequence_parallel.h. */
#include "03_model_parallel/sequence_parallel.h" /* 03: sequence parallelism (--sp) */

#include "common/device/device.h" /* mem_alloc, copies, streams, timers */
#include "common/kernels/kernels.h" /* ops(): the kernel table */
#include "common/core/util.h" /* fatal, log_info, exit codes, flag parsing */

#include <stdio.h>

const char *sequence_parallel_problem(int B, int T, int tp) {
    static char message[200];
    if (T % tp == 0) return NULL;
    snprintf(
        message, sizeof message,
        "--sp splits each micro-batch's tokens over the %d tp ranks, but --seq %d is not a multiple of %d "
        "(valid: --seq a multiple of --tp)",
        tp, T, tp);
    (void)B;
    return message;
}

/* The group's reduce-scatter, timed as tp_allreduce. */
static void tp_reduce_scatter(TensorGroup *tp, const float *send, float *recv, size_t count) {
    device_sync();
    double start = wall_ms();
    comm_reduce_scatter(tp->group, send, recv, count, COMM_SUM);
    tp->comm_ms += wall_ms() - start;
}

/* Row-parallel forward into this rank's rows of the sum: the partial
 * product (bias on rank 0, as row_parallel_forward), then a reduce-scatter. */
static void sp_row_parallel_forward(TensorParallelModel *tm, float *out_rows, const float *inp_local,
                                    const float *weight_local, const float *bias, int N, int C_local,
                                    int OC) {
    TensorGroup *tp = tm->tp;
    gpt_linear_forward(tp->matmuls, tm->sp_whole, inp_local, weight_local, tp->rank == 0 ? bias : NULL, N,
                       C_local, OC);
    tp_reduce_scatter(tp, tm->sp_whole, out_rows, (size_t)N / tp->size * OC);
}

/* Column-parallel backward from this rank's rows of the input: gathered
 * again for the weight gradient, and this rank's rows of the summed input
 * gradient (a reduce-scatter: f's conjugate) OVERWRITE dinp_rows. */
static void sp_column_parallel_backward(TensorParallelModel *tm, float *dinp_rows, float *dweight_local,
                                        float *dbias_local, const float *dout_local, const float *inp_rows,
                                        const float *weight_local, int N, int C, int OC_local) {
    TensorGroup *tp = tm->tp;
    size_t rows_C = (size_t)N / tp->size * C;
    tp_allgather(tp, inp_rows, tm->sp_whole, rows_C);
    ops()->fill_zero(tm->scratch.dln, (size_t)N * C);
    gpt_linear_backward(tp->matmuls, tm->scratch.dln, dweight_local, dbias_local, dout_local, tm->sp_whole,
                        weight_local, N, C, OC_local);
    tp_reduce_scatter(tp, tm->scratch.dln, dinp_rows, rows_C);
}

/* A layernorm's backward on this rank's rows (dinp += ...): its weight and
 * bias gradients are partial sums over the rows, summed over the group into
 * the whole ones every rank of a replicated tensor holds. */
static void sp_layernorm_backward(TensorParallelModel *tm, float *dinp, float *dweight, float *dbias,
                                  const float *dout, const float *inp, const float *weight, const float *mean,
                                  const float *rstd, int rows, int C) {
    const KernelOps *k = ops();
    float *part = tm->sp_ln_grads; /* (2C): from this micro-batch's rows only */
    k->fill_zero(part, 2 * (size_t)C);
    k->layernorm_backward(dinp, part, part + C, dout, inp, weight, mean, rstd, rows, C);
    tp_allreduce(tm->tp, part, 2 * (size_t)C);
    k->residual_forward(dweight, dweight, part, C);
    k->residual_forward(dbias, dbias, part + C, C);
}

/* tp_block_forward with the layernorm and residual regions in rows. The
 * first block takes its rows of the whole embedding output; the last
 * gathers its output whole for the head. */
static void sp_block_forward(int l, const float *input, int B, int T, void *context) {
    TensorParallelModel *tm = context;
    const KernelOps *k = ops();
    TensorGroup *tp = tm->tp;
    int C = tm->model.cfg.dmodel, Cl = tm->C_local, Hl = tm->H_local, N = B * T, R = N / tp->size;
    size_t RC = (size_t)R * C;
    float **w = tm->m->w.block[l];
    BlockActs *b = &tm->now->block[l];
    Scratch *s = &tm->scratch;
    const float *x = l == tp_first_block(tm) ? input + tp->rank * RC : input;
    /* attention half: layernorm on the rows, all-gather, heads, reduce-scatter, residual on the rows */
    k->layernorm_forward(b->ln1, b->ln1_mean, b->ln1_rstd, x, w[BLOCK_LN1W], w[BLOCK_LN1B], R, C);
    tp_allgather(tp, b->ln1, tm->sp_whole, RC);
    column_parallel_forward(tp, b->qkv, tm->sp_whole, w[BLOCK_QKVW], w[BLOCK_QKVB], N, C, 3 * Cl);
    k->attention_forward(b->atty, b->lse, b->qkv, B, T, Cl, tm->NH_local);
    sp_row_parallel_forward(tm, s->branch, b->atty, w[BLOCK_ATTPROJW], w[BLOCK_ATTPROJB], N, Cl, C);
    k->residual_forward(b->res2, x, s->branch, RC);
    /* MLP half, the same */
    k->layernorm_forward(b->ln2, b->ln2_mean, b->ln2_rstd, b->res2, w[BLOCK_LN2W], w[BLOCK_LN2B], R, C);
    tp_allgather(tp, b->ln2, tm->sp_whole, RC);
    const float *branch = s->branch; /* this rank's rows of the MLP half's output */
    if (moe_layer(&tm->model.cfg, l)) { /* the experts whole on every rank, on every token: keep our rows */
        gpt_moe_forward(tm->m, tm->now, s, l, tm->sp_whole, s->branch, B, T);
        if (tp->rank != 0) tm->now->moe.stats = (MoeStats){0}; /* the routing reported once: tp rank 0 */
        branch = s->branch + tp->rank * RC;
    } else {
        column_parallel_forward(tp, b->fch, tm->sp_whole, w[BLOCK_FCW], w[BLOCK_FCB], N, C, Hl);
        k->gelu_forward(s->gelu, b->fch, (size_t)N * Hl);
        sp_row_parallel_forward(tm, s->branch, s->gelu, w[BLOCK_FCPROJW], w[BLOCK_FCPROJB], N, Hl, C);
    }
    if (l == tp_last_block(tm)) {
        k->residual_forward(tm->sp_rows, b->res2, branch, RC);
        tp_allgather(tp, tm->sp_rows, b->res3, RC);
    } else {
        k->residual_forward(b->res3, b->res2, branch, RC);
    }
}

/* tp_block_backward in rows: the output gradient is gathered whole for each
 * row-parallel layer (whose input and weight gradients then need nothing
 * more), and each column-parallel layer's input gradient reduce-scattered.
 * The last block takes its rows of the head's whole gradient; the first
 * gathers its input gradient whole for the embedding. */
static void sp_block_backward(int l, const float *input, const float *doutput, float *dinput, int B, int T,
                              void *context) {
    TensorParallelModel *tm = context;
    const KernelOps *k = ops();
    TensorGroup *tp = tm->tp;
    int C = tm->model.cfg.dmodel, Cl = tm->C_local, Hl = tm->H_local, N = B * T, R = N / tp->size;
    size_t RC = (size_t)R * C;
    float **w = tm->m->w.block[l], **g = tm->m->g.block[l];
    BlockActs *b = &tm->now->block[l];
    Scratch *s = &tm->scratch;
    int first = l == tp_first_block(tm);
    const float *x = first ? input + tp->rank * RC : input;
    const float *dout = l == tp_last_block(tm) ? doutput + tp->rank * RC : doutput;
    /* MLP half: res3 = res2 + fcproj(...) passes dout to both */
    copy_on_device(s->dmid, dout, RC * sizeof(float));
    tp_allgather(tp, dout, tm->sp_whole, RC);
    if (moe_layer(&tm->model.cfg, l)) { /* every rank the whole backward, on every token: keep our rows */
        tp_allgather(tp, b->ln2, s->branch, RC); /* the experts' input, whole again */
        k->fill_zero(s->dln, (size_t)N * C);
        gpt_moe_backward(tm->m, tm->now, s, l, s->branch, tm->sp_whole, s->dln, B, T);
        copy_on_device(s->dbranch, s->dln + tp->rank * RC, RC * sizeof(float));
    } else {
        k->gelu_forward(s->gelu, b->fch, (size_t)N * Hl);
        k->fill_zero(s->dfch_gelu, (size_t)N * Hl);
        row_parallel_backward(tp, s->dfch_gelu, g[BLOCK_FCPROJW], g[BLOCK_FCPROJB], tm->sp_whole, s->gelu,
                              w[BLOCK_FCPROJW], N, Hl, C);
        k->fill_zero(s->dfch, (size_t)N * Hl);
        k->gelu_backward(s->dfch, b->fch, s->dfch_gelu, (size_t)N * Hl);
        sp_column_parallel_backward(tm, s->dbranch, g[BLOCK_FCW], g[BLOCK_FCB], s->dfch, b->ln2, w[BLOCK_FCW],
                                    N, C, Hl);
    }
    sp_layernorm_backward(tm, s->dmid, g[BLOCK_LN2W], g[BLOCK_LN2B], s->dbranch, b->res2, w[BLOCK_LN2W],
                          b->ln2_mean, b->ln2_rstd, R, C);
    /* attention half: res2 = x + attproj(...), the same with dmid */
    float *din = first ? tm->sp_rows : dinput;
    copy_on_device(din, s->dmid, RC * sizeof(float));
    tp_allgather(tp, s->dmid, tm->sp_whole, RC);
    k->fill_zero(s->datty, (size_t)N * Cl);
    row_parallel_backward(tp, s->datty, g[BLOCK_ATTPROJW], g[BLOCK_ATTPROJB], tm->sp_whole, b->atty,
                          w[BLOCK_ATTPROJW], N, Cl, C);
    k->fill_zero(s->dqkv, (size_t)N * 3 * Cl);
    k->attention_backward(s->dqkv, s->datty, b->qkv, b->atty, b->lse, B, T, Cl, tm->NH_local);
    sp_column_parallel_backward(tm, s->dbranch, g[BLOCK_QKVW], g[BLOCK_QKVB], s->dqkv, b->ln1, w[BLOCK_QKVW],
                                N, C, 3 * Cl);
    sp_layernorm_backward(tm, din, g[BLOCK_LN1W], g[BLOCK_LN1B], s->dbranch, x, w[BLOCK_LN1W], b->ln1_mean,
                          b->ln1_rstd, R, C);
    if (first) tp_allgather(tp, din, dinput, RC); /* the embedding's backward reads every row */
}

void sequence_parallel_enable(TensorParallelModel *tm, int sp) {
    tm->sp = sp;
    if (sp) tm->sp_blocks = (UnitHooks){.block_forward = sp_block_forward, .block_backward = sp_block_backward, .context = tm};
}
