/* kernels_dry.c: the table of kernels.h for a dry run (device.h, "The dry run").
 *
 * A dry run performs a rank's start-up and one step with the code a real run
 * uses, to learn what it allocates and sends, on a device that computes
 * nothing. Every operation here does nothing to its outputs, except what the
 * CPU backend's own operation would do to memory.csv: grow its workspaces
 * (the attention's tiles, the rounded operands of a 16-bit matmul), through
 * the CPU's own functions, in the same order. Outputs keep the zeros every dry
 * buffer holds, so a loss, a norm or an overflow check reads a healthy 0. */
#include "attention.h"
#include "kernels.h"

static void embedding_forward(float *out, const int *tokens, const float *wte, const float *wpe, int B, int T,
                              int C) {
    (void)out, (void)tokens, (void)wte, (void)wpe, (void)B, (void)T, (void)C;
}
static void embedding_backward(float *dwte, float *dwpe, const float *dout, const int *tokens, int B, int T,
                               int C, int V) {
    (void)dwte, (void)dwpe, (void)dout, (void)tokens, (void)B, (void)T, (void)C, (void)V;
}
static void layernorm_forward(float *out, float *mean, float *rstd, const float *inp, const float *weight,
                              const float *bias, int N, int C) {
    (void)out, (void)mean, (void)rstd, (void)inp, (void)weight, (void)bias, (void)N, (void)C;
}
static void layernorm_backward(float *dinp, float *dweight, float *dbias, const float *dout, const float *inp,
                               const float *weight, const float *mean, const float *rstd, int N, int C) {
    (void)dinp, (void)dweight, (void)dbias, (void)dout, (void)inp, (void)weight, (void)mean, (void)rstd;
    (void)N, (void)C;
}
static void linear_forward(float *out, const float *inp, const float *weight, const float *bias, int N, int C,
                           int OC) {
    (void)out, (void)inp, (void)weight, (void)bias, (void)N, (void)C, (void)OC;
}
static void linear_backward(float *dinp, float *dweight, float *dbias, const float *dout, const float *inp,
                            const float *weight, int N, int C, int OC) {
    (void)dinp, (void)dweight, (void)dbias, (void)dout, (void)inp, (void)weight, (void)N, (void)C, (void)OC;
}
static void linear_backward_input(float *dinp, const float *dout, const float *weight, int N, int C, int OC) {
    (void)dinp, (void)dout, (void)weight, (void)N, (void)C, (void)OC;
}
static void linear_backward_weight(float *dweight, float *dbias, const float *dout, const float *inp, int N,
                                   int C, int OC) {
    (void)dweight, (void)dbias, (void)dout, (void)inp, (void)N, (void)C, (void)OC;
}
static void linear_forward_half(float *out, const float *inp, const float *weight, const float *bias, int N,
                                int C, int OC, HalfFormat format) {
    (void)out, (void)inp, (void)weight, (void)bias, (void)format;
    half_matmul_grow_cpu(HALF_MATMUL_FORWARD, N, C, OC);
}
static void linear_backward_input_half(float *dinp, const float *dout, const float *weight, int N, int C,
                                       int OC, HalfFormat format) {
    (void)dinp, (void)dout, (void)weight, (void)format;
    half_matmul_grow_cpu(HALF_MATMUL_BACKWARD_INPUT, N, C, OC);
}
static void linear_backward_weight_half(float *dweight, float *dbias, const float *dout, const float *inp,
                                        int N, int C, int OC, HalfFormat format) {
    (void)dweight, (void)dbias, (void)dout, (void)inp, (void)format;
    half_matmul_grow_cpu(HALF_MATMUL_BACKWARD_WEIGHT, N, C, OC);
}
static void linear_backward_half(float *dinp, float *dweight, float *dbias, const float *dout,
                                 const float *inp, const float *weight, int N, int C, int OC,
                                 HalfFormat format) {
    linear_backward_input_half(dinp, dout, weight, N, C, OC, format);
    linear_backward_weight_half(dweight, dbias, dout, inp, N, C, OC, format);
}
static void attention_forward(float *out, float *lse, const float *qkv, int B, int T, int C, int NH) {
    (void)out, (void)lse, (void)qkv, (void)B, (void)C, (void)NH;
    attention_workspace_grow_cpu(T);
}
static void attention_backward(float *dqkv, const float *dout, const float *qkv, const float *out,
                               const float *lse, int B, int T, int C, int NH) {
    (void)dqkv, (void)dout, (void)qkv, (void)out, (void)lse, (void)B, (void)C, (void)NH;
    attention_workspace_grow_cpu(T);
}
static void attention_block_forward(float *block_out, float *block_lse, const float *q, const float *kv,
                                    int B, int T, int rows, int C, int NH, int causal) {
    (void)block_out, (void)block_lse, (void)q, (void)kv, (void)B, (void)T, (void)C, (void)NH, (void)causal;
    attention_workspace_grow_cpu(rows);
}
static void attention_merge(float *out, float *lse, const float *block_out, const float *block_lse, int B,
                            int T, int rows, int C, int NH) {
    (void)out, (void)lse, (void)block_out, (void)block_lse, (void)B, (void)T, (void)rows, (void)C, (void)NH;
}
static void attention_block_backward(float *dq, float *dkv, const float *dout, const float *out,
                                     const float *lse, const float *q, const float *kv, int B, int T,
                                     int rows, int C, int NH, int causal) {
    (void)dq, (void)dkv, (void)dout, (void)out, (void)lse, (void)q, (void)kv, (void)B, (void)T, (void)C;
    (void)NH, (void)causal;
    attention_workspace_grow_cpu(rows);
}
static void gelu_forward(float *out, const float *inp, size_t n) {
    (void)out, (void)inp, (void)n;
}
static void gelu_backward(float *dinp, const float *inp, const float *dout, size_t n) {
    (void)dinp, (void)inp, (void)dout, (void)n;
}
static void residual_forward(float *out, const float *a, const float *b, size_t n) {
    (void)out, (void)a, (void)b, (void)n;
}
static void residual_backward(float *da, float *db, const float *dout, size_t n) {
    (void)da, (void)db, (void)dout, (void)n;
}
static void crossentropy_forward(float *losses, float *probs, const float *logits, const int *targets, int N,
                                 int V, int Vp) {
    (void)losses, (void)probs, (void)logits, (void)targets, (void)N, (void)V, (void)Vp;
}
static void crossentropy_backward(float *dlogits, const float *probs, const int *targets, float dloss, int N,
                                  int V) {
    (void)dlogits, (void)probs, (void)targets, (void)dloss, (void)N, (void)V;
}
static void embedding_forward_rows(float *out, const int *tokens, const float *wte, const float *wpe, int B,
                                   int T, int C, int first, int rows) {
    (void)out, (void)tokens, (void)wte, (void)wpe, (void)B, (void)T, (void)C, (void)first, (void)rows;
}
static void embedding_backward_rows(float *dwte, float *dwpe, const float *dout, const int *tokens, int B,
                                    int T, int C, int first, int rows) {
    (void)dwte, (void)dwpe, (void)dout, (void)tokens, (void)B, (void)T, (void)C, (void)first, (void)rows;
}
static void crossentropy_slice_max(float *row_max, const float *logits, int N, int cols, int Vl) {
    (void)row_max, (void)logits, (void)N, (void)cols, (void)Vl;
}
static void crossentropy_slice_sums(float *sums, float *row_max, const float *maxes, int parts,
                                    const float *logits, const int *targets, int N, int cols, int Vl,
                                    int first) {
    (void)sums, (void)row_max, (void)maxes, (void)parts, (void)logits, (void)targets, (void)N, (void)cols;
    (void)Vl, (void)first;
}
static void crossentropy_slice_finish(float *losses, float *probs, const float *logits, const float *row_max,
                                      const float *sums, int N, int cols, int Vl) {
    (void)losses, (void)probs, (void)logits, (void)row_max, (void)sums, (void)N, (void)cols, (void)Vl;
}
static void crossentropy_backward_rows(float *dlogits, const float *probs, const int *targets, float dloss,
                                       int N, int Vl, int first) {
    (void)dlogits, (void)probs, (void)targets, (void)dloss, (void)N, (void)Vl, (void)first;
}
static double sum_squares(const float *x, size_t n) {
    (void)x, (void)n;
    return 0.0;
}
static double sum_squares_half(const uint16_t *x, size_t n, HalfFormat format) {
    (void)x, (void)n, (void)format;
    return 0.0;
}
static void adamw_update(float *params, const float *grads, float *m, float *v, size_t n, float lr,
                         float beta1, float beta2, float eps, float weight_decay, float grad_scale, int t) {
    (void)params, (void)grads, (void)m, (void)v, (void)n, (void)lr, (void)beta1, (void)beta2, (void)eps;
    (void)weight_decay, (void)grad_scale, (void)t;
}
static void adamw_update_half(float *master, uint16_t *params, const uint16_t *grads, float *m, float *v,
                              size_t n, float lr, float beta1, float beta2, float eps, float weight_decay,
                              float grad_scale, int t, HalfFormat format) {
    (void)master, (void)params, (void)grads, (void)m, (void)v, (void)n, (void)lr, (void)beta1, (void)beta2;
    (void)eps, (void)weight_decay, (void)grad_scale, (void)t, (void)format;
}
static void fill_zero(float *x, size_t n) {
    (void)x, (void)n;
}
static void fill_zero_half(uint16_t *x, size_t n) {
    (void)x, (void)n;
}
static void scale(float *x, size_t n, float factor) {
    (void)x, (void)n, (void)factor;
}
static void cast_to_half(uint16_t *out, const float *inp, size_t n, HalfFormat format) {
    (void)out, (void)inp, (void)n, (void)format;
}
static void cast_from_half(float *out, const uint16_t *inp, size_t n, HalfFormat format) {
    (void)out, (void)inp, (void)n, (void)format;
}
static void accumulate_half(uint16_t *acc, const float *add, size_t n, HalfFormat format) {
    (void)acc, (void)add, (void)n, (void)format;
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
