/* kernels_dry.c: the table of kernels.h for a dry run (device.h, "The dry run").
 *
 * A dry run performs a rank's start-up and one step with the code a real run
 * uses, to learn what it allocates and sends, on a device that computes
 * nothing. Every operation here does nothing to its outputs, except what the
 * CPU backend's own operation would do to memory.csv: grow its workspaces
 * (the attention's tiles, the rounded operands of a 16-bit matmul), through
 * the CPU's own functions, in the same order. Outputs keep the zeros every dry
 * buffer holds, so a loss, a norm or an overflow check reads a healthy 0.
 *
 * Each operation also counts, from its arguments, the work it would do
 * (work_ledger.h): its FLOPs, the matrix products' 2 M N K apart, and the
 * bytes it reads and writes (4 per float, 2 per 16-bit value, 4 per token).
 * What the CPU backend computes is what is counted: attention's tiles of
 * ATTENTION_TILE query rows against keys 0..(the tile's last row), as
 * attention_cpu.c multiplies them; a backward that adds reads its gradient
 * too. The operations' own FLOPs per element, beside the products:
 *
 *   embedding       forward 1 (wte + wpe), backward 2 (dwte, dwpe)
 *   layernorm       forward 8, backward 14 per element
 *   linear          the product, + 1 per output with a bias (backward: dbias's sum)
 *   attention       forward: q k^T and p v, softmax 5 per score; backward: the
 *                   scores again, dout v^T, ds k, ds^T q, p^T dout, 6 per score
 *   attention_merge 4 per output element
 *   gelu            forward 8, backward 16 per element
 *   residual        forward 1, backward 2 per element
 *   cross-entropy   forward 4, backward 2 per logit
 *   moe             gather 0, scatter_add 1, combine 2, combine_backward 4 per
 *                   element of a slot's row (N K C)
 *   sum_squares 2, scale 1, casts 1, accumulate_half 2 per element; fill_zero 0
 *   AdamW           counted as parameters updated (adam_params) and its bytes:
 *                   params, grads, m, v read; params, m, v written */
#include "common/kernels/attention.h" /* attention's kernels and workspace */
#include "common/kernels/kernels.h" /* ops(): the kernel table */
#include "common/kernels/work_ledger.h" /* a dry run's counted work */

enum { F32 = 4, F16 = 2 }; /* bytes per value */

/* Query rows x keys of causal attention over `rows` positions, as the CPU backend tiles it
 * (causal: each tile of queries against keys 0..its last row; else all `rows` keys). */
static double attention_scores(int rows, int causal) {
    double scores = 0;
    for (int t0 = 0; t0 < rows; t0 += ATTENTION_TILE) {
        int tile = rows - t0 < ATTENTION_TILE ? rows - t0 : ATTENTION_TILE;
        scores += (double)tile * (causal ? t0 + tile : rows);
    }
    return scores;
}

/* A product out(N,OC) = inp(N,C) @ weight(OC,C)^T, or one of its two backward products. */
static void count_linear(int N, int C, int OC, int with_bias, int value_bytes) {
    double products = 2.0 * N * C * OC, bias = with_bias ? (double)N * OC : 0.0;
    work_add(products + bias, products,
             ((double)N * C + (double)OC * C) * value_bytes + (double)N * OC * F32 + (with_bias ? OC * F32 : 0));
}
static void count_linear_input(int N, int C, int OC, int value_bytes) {
    double products = 2.0 * N * C * OC; /* dinp(N,C) += dout(N,OC) @ weight(OC,C) */
    work_add(products, products, ((double)N * OC + (double)OC * C) * value_bytes + 2.0 * N * C * F32);
}
static void count_linear_weight(int N, int C, int OC, int with_bias, int value_bytes) {
    double products = 2.0 * N * C * OC, bias = with_bias ? (double)N * OC : 0.0;
    work_add(products + bias, products,
             ((double)N * OC + (double)N * C) * value_bytes + 2.0 * OC * C * F32 + (with_bias ? 2.0 * OC * F32 : 0));
}
/* Attention of B x NH heads over `rows` query rows (hs = C / NH): forward's two products and
 * softmax, or backward's five products and the scores' gradient. */
static void count_attention(int B, int rows, int key_rows, int C, int NH, int causal, int backward) {
    double scores = (double)B * NH * attention_scores(rows, causal), hs = (double)C / NH;
    double products = (backward ? 5.0 : 2.0) * 2.0 * scores * hs;
    double q = (double)B * rows * C, kv = (double)B * key_rows * 2 * C; /* floats read */
    double bytes = backward ? (2 * q + q + kv + 2 * q + 2 * kv) * F32 : (q + kv + q) * F32;
    work_add(products + (backward ? 6.0 : 5.0) * scores, products, bytes);
}
static void count_elementwise(double n, double flops_each, double values_moved, int value_bytes) {
    work_add(n * flops_each, 0.0, n * values_moved * value_bytes);
}

static void embedding_forward(float *out, const int *tokens, const float *wte, const float *wpe, int B, int T,
                              int C) {
    (void)out, (void)tokens, (void)wte, (void)wpe;
    double n = (double)B * T * C; /* read a row of wte and of wpe, write out; the tokens */
    work_add(n, 0.0, 3 * n * F32 + (double)B * T * F32);
}
static void embedding_backward(float *dwte, float *dwpe, const float *dout, const int *tokens, int B, int T,
                               int C, int V) {
    (void)dwte, (void)dwpe, (void)dout, (void)tokens, (void)V;
    double n = (double)B * T * C; /* dout read; a row of dwte and of dwpe read and written */
    work_add(2 * n, 0.0, 5 * n * F32 + (double)B * T * F32);
}
static void layernorm_forward(float *out, float *mean, float *rstd, const float *inp, const float *weight,
                              const float *bias, int N, int C) {
    (void)out, (void)mean, (void)rstd, (void)inp, (void)weight, (void)bias;
    double n = (double)N * C;
    work_add(8 * n, 0.0, (2 * n + 2.0 * C + 2.0 * N) * F32);
}
static void layernorm_backward(float *dinp, float *dweight, float *dbias, const float *dout, const float *inp,
                               const float *weight, const float *mean, const float *rstd, int N, int C) {
    (void)dinp, (void)dweight, (void)dbias, (void)dout, (void)inp, (void)weight, (void)mean, (void)rstd;
    double n = (double)N * C; /* dout, inp read, dinp read and written; the weight and its gradients */
    work_add(14 * n, 0.0, (4 * n + 5.0 * C + 2.0 * N) * F32);
}
static void linear_forward(float *out, const float *inp, const float *weight, const float *bias, int N, int C,
                           int OC) {
    (void)out, (void)inp, (void)weight;
    count_linear(N, C, OC, bias != NULL, F32);
}
static void linear_backward(float *dinp, float *dweight, float *dbias, const float *dout, const float *inp,
                            const float *weight, int N, int C, int OC) {
    (void)dinp, (void)dweight, (void)dout, (void)inp, (void)weight;
    count_linear_input(N, C, OC, F32);
    count_linear_weight(N, C, OC, dbias != NULL, F32);
}
static void linear_backward_input(float *dinp, const float *dout, const float *weight, int N, int C, int OC) {
    (void)dinp, (void)dout, (void)weight;
    count_linear_input(N, C, OC, F32);
}
static void linear_backward_weight(float *dweight, float *dbias, const float *dout, const float *inp, int N,
                                   int C, int OC) {
    (void)dweight, (void)dout, (void)inp;
    count_linear_weight(N, C, OC, dbias != NULL, F32);
}
static void linear_forward_half(float *out, const float *inp, const float *weight, const float *bias, int N,
                                int C, int OC, HalfFormat format) {
    (void)out, (void)inp, (void)weight, (void)format;
    half_matmul_grow_cpu(HALF_MATMUL_FORWARD, N, C, OC);
    count_linear(N, C, OC, bias != NULL, F16);
}
static void linear_backward_input_half(float *dinp, const float *dout, const float *weight, int N, int C,
                                       int OC, HalfFormat format) {
    (void)dinp, (void)dout, (void)weight, (void)format;
    half_matmul_grow_cpu(HALF_MATMUL_BACKWARD_INPUT, N, C, OC);
    count_linear_input(N, C, OC, F16);
}
static void linear_backward_weight_half(float *dweight, float *dbias, const float *dout, const float *inp,
                                        int N, int C, int OC, HalfFormat format) {
    (void)dweight, (void)dout, (void)inp, (void)format;
    half_matmul_grow_cpu(HALF_MATMUL_BACKWARD_WEIGHT, N, C, OC);
    count_linear_weight(N, C, OC, dbias != NULL, F16);
}
static void linear_backward_half(float *dinp, float *dweight, float *dbias, const float *dout,
                                 const float *inp, const float *weight, int N, int C, int OC,
                                 HalfFormat format) {
    linear_backward_input_half(dinp, dout, weight, N, C, OC, format);
    linear_backward_weight_half(dweight, dbias, dout, inp, N, C, OC, format);
}
static void attention_forward(float *out, float *lse, const float *qkv, int B, int T, int C, int NH) {
    (void)out, (void)lse, (void)qkv;
    attention_workspace_grow_cpu(T);
    count_attention(B, T, T, C, NH, 1, 0);
}
static void attention_backward(float *dqkv, const float *dout, const float *qkv, const float *out,
                               const float *lse, int B, int T, int C, int NH) {
    (void)dqkv, (void)dout, (void)qkv, (void)out, (void)lse;
    attention_workspace_grow_cpu(T);
    count_attention(B, T, T, C, NH, 1, 1);
}
static void attention_block_forward(float *block_out, float *block_lse, const float *q, const float *kv,
                                    int B, int T, int rows, int C, int NH, int causal) {
    (void)block_out, (void)block_lse, (void)q, (void)kv, (void)T;
    attention_workspace_grow_cpu(rows);
    count_attention(B, rows, rows, C, NH, causal, 0);
}
static void attention_merge(float *out, float *lse, const float *block_out, const float *block_lse, int B,
                            int T, int rows, int C, int NH) {
    (void)out, (void)lse, (void)block_out, (void)block_lse, (void)T, (void)NH;
    count_elementwise((double)B * rows * C, 4, 3, F32); /* out, block_out read, out written */
}
static void attention_block_backward(float *dq, float *dkv, const float *dout, const float *out,
                                     const float *lse, const float *q, const float *kv, int B, int T,
                                     int rows, int C, int NH, int causal) {
    (void)dq, (void)dkv, (void)dout, (void)out, (void)lse, (void)q, (void)kv, (void)T;
    attention_workspace_grow_cpu(rows);
    count_attention(B, rows, rows, C, NH, causal, 1);
}
static void gelu_forward(float *out, const float *inp, size_t n) {
    (void)out, (void)inp;
    count_elementwise((double)n, 8, 2, F32);
}
static void gelu_backward(float *dinp, const float *inp, const float *dout, size_t n) {
    (void)dinp, (void)inp, (void)dout;
    count_elementwise((double)n, 16, 4, F32);
}
static void residual_forward(float *out, const float *a, const float *b, size_t n) {
    (void)out, (void)a, (void)b;
    count_elementwise((double)n, 1, 3, F32);
}
static void residual_backward(float *da, float *db, const float *dout, size_t n) {
    (void)da, (void)db, (void)dout;
    count_elementwise((double)n, 2, 5, F32);
}
static void moe_gather(float *out, const float *inp, const int *src, int R, int C) {
    (void)out, (void)inp, (void)src;
    count_elementwise((double)R * C, 0, 2, F32);
}
static void moe_scatter_add(float *dinp, const float *dout, const int *pos, int N, int K, int C) {
    (void)dinp, (void)dout, (void)pos;
    count_elementwise((double)N * K * C, 1, 3, F32);
}
static void moe_combine(float *out, const float *y, const int *pos, const float *gate, int N, int K, int C) {
    (void)out, (void)y, (void)pos, (void)gate;
    count_elementwise((double)N * K * C, 2, 2, F32);
}
static void moe_combine_backward(float *dy, float *dgate, const float *dout, const float *y, const int *pos,
                                 const float *gate, int N, int K, int C) {
    (void)dy, (void)dgate, (void)dout, (void)y, (void)pos, (void)gate;
    count_elementwise((double)N * K * C, 4, 5, F32);
}
static void crossentropy_forward(float *losses, float *probs, const float *logits, const int *targets, int N,
                                 int V, int Vp) {
    (void)losses, (void)probs, (void)logits, (void)targets, (void)Vp;
    count_elementwise((double)N * V, 4, 2, F32); /* logits read, probs written */
}
static void crossentropy_backward(float *dlogits, const float *probs, const int *targets, float dloss, int N,
                                  int V) {
    (void)dlogits, (void)probs, (void)targets, (void)dloss;
    count_elementwise((double)N * V, 2, 3, F32);
}
static void embedding_forward_rows(float *out, const int *tokens, const float *wte, const float *wpe, int B,
                                   int T, int C, int first, int rows) {
    (void)first, (void)rows;
    embedding_forward(out, tokens, wte, wpe, B, T, C); /* its work: a row of wte (this rank's) and of wpe */
}
static void embedding_backward_rows(float *dwte, float *dwpe, const float *dout, const int *tokens, int B,
                                    int T, int C, int first, int rows) {
    (void)first;
    embedding_backward(dwte, dwpe, dout, tokens, B, T, C, rows); /* its work, on this rank's rows */
}
static void crossentropy_slice_max(float *row_max, const float *logits, int N, int cols, int Vl) {
    (void)row_max, (void)logits, (void)Vl;
    count_elementwise((double)N * cols, 1, 1, F32); /* a compare a logit */
}
static void crossentropy_slice_sums(float *sums, float *row_max, const float *maxes, int parts,
                                    const float *logits, const int *targets, int N, int cols, int Vl,
                                    int first) {
    (void)sums, (void)row_max, (void)maxes, (void)parts, (void)logits, (void)targets, (void)Vl, (void)first;
    count_elementwise((double)N * cols, 2, 1, F32); /* exp(logit - max), added */
}
static void crossentropy_slice_finish(float *losses, float *probs, const float *logits, const float *row_max,
                                      const float *sums, int N, int cols, int Vl) {
    (void)losses, (void)probs, (void)logits, (void)row_max, (void)sums, (void)Vl;
    count_elementwise((double)N * cols, 2, 2, F32); /* probs written from the logits */
}
static void crossentropy_backward_rows(float *dlogits, const float *probs, const int *targets, float dloss,
                                       int N, int Vl, int first) {
    (void)first;
    crossentropy_backward(dlogits, probs, targets, dloss, N, Vl); /* its work, on this rank's columns */
}
static double sum_squares(const float *x, size_t n) {
    (void)x;
    count_elementwise((double)n, 2, 1, F32);
    return 0.0;
}
static double sum_squares_half(const uint16_t *x, size_t n, HalfFormat format) {
    (void)x, (void)format;
    count_elementwise((double)n, 2, 1, F16);
    return 0.0;
}
static void adamw_update(float *params, const float *grads, float *m, float *v, size_t n, float lr,
                         float beta1, float beta2, float eps, float weight_decay, float grad_scale, int t) {
    (void)params, (void)grads, (void)m, (void)v, (void)lr, (void)beta1, (void)beta2, (void)eps;
    (void)weight_decay, (void)grad_scale, (void)t;
    work_add_adam((double)n, 7.0 * n * F32);
}
static void adamw_update_half(float *master, uint16_t *params, const uint16_t *grads, float *m, float *v,
                              size_t n, float lr, float beta1, float beta2, float eps, float weight_decay,
                              float grad_scale, int t, HalfFormat format) {
    (void)master, (void)params, (void)grads, (void)m, (void)v, (void)lr, (void)beta1, (void)beta2;
    (void)eps, (void)weight_decay, (void)grad_scale, (void)t, (void)format;
    work_add_adam((double)n, 6.0 * n * F32 + 2.0 * n * F16); /* master, m, v; 16-bit grads and params */
}
static void fill_zero(float *x, size_t n) {
    (void)x;
    count_elementwise((double)n, 0, 1, F32);
}
static void fill_zero_half(uint16_t *x, size_t n) {
    (void)x;
    count_elementwise((double)n, 0, 1, F16);
}
static void scale(float *x, size_t n, float factor) {
    (void)x, (void)factor;
    count_elementwise((double)n, 1, 2, F32);
}
static void cast_to_half(uint16_t *out, const float *inp, size_t n, HalfFormat format) {
    (void)out, (void)inp, (void)format;
    work_add((double)n, 0.0, (double)n * (F32 + F16));
}
static void cast_from_half(float *out, const uint16_t *inp, size_t n, HalfFormat format) {
    (void)out, (void)inp, (void)format;
    work_add((double)n, 0.0, (double)n * (F32 + F16));
}
static void accumulate_half(uint16_t *acc, const float *add, size_t n, HalfFormat format) {
    (void)acc, (void)add, (void)format;
    work_add(2.0 * n, 0.0, (double)n * (F32 + 2 * F16));
}
static void release_workspaces(void) {
    kernels_cpu.release_workspaces(); /* the workspaces are the CPU backend's */
}

const KernelOps kernels_dry = {
    .name = "dry",
    .embedding_forward = embedding_forward,
    .embedding_backward = embedding_backward,
    .layernorm_forward = layernorm_forward,
    .layernorm_backward = layernorm_backward,
    .linear_forward = linear_forward,
    .linear_backward = linear_backward,
    .linear_backward_input = linear_backward_input,
    .linear_backward_weight = linear_backward_weight,
    .linear_forward_half = linear_forward_half,
    .linear_backward_half = linear_backward_half,
    .linear_backward_input_half = linear_backward_input_half,
    .linear_backward_weight_half = linear_backward_weight_half,
    .attention_forward = attention_forward,
    .attention_backward = attention_backward,
    .attention_block_forward = attention_block_forward,
    .attention_merge = attention_merge,
    .attention_block_backward = attention_block_backward,
    .gelu_forward = gelu_forward,
    .gelu_backward = gelu_backward,
    .residual_forward = residual_forward,
    .residual_backward = residual_backward,
    .crossentropy_forward = crossentropy_forward,
    .crossentropy_backward = crossentropy_backward,
    .embedding_forward_rows = embedding_forward_rows,
    .embedding_backward_rows = embedding_backward_rows,
    .crossentropy_slice_max = crossentropy_slice_max,
    .crossentropy_slice_sums = crossentropy_slice_sums,
    .crossentropy_slice_finish = crossentropy_slice_finish,
    .crossentropy_backward_rows = crossentropy_backward_rows,
    .moe_gather = moe_gather,
    .moe_scatter_add = moe_scatter_add,
    .moe_combine = moe_combine,
    .moe_combine_backward = moe_combine_backward,
    .sum_squares = sum_squares,
    .sum_squares_half = sum_squares_half,
    .adamw_update = adamw_update,
    .adamw_update_half = adamw_update_half,
    .fill_zero = fill_zero,
    .fill_zero_half = fill_zero_half,
    .scale = scale,
    .cast_to_half = cast_to_half,
    .cast_from_half = cast_from_half,
    .accumulate_half = accumulate_half,
    .release_workspaces = release_workspaces,
};
