/* kernels.h: the math of a GPT training step, as one table of operations.
 *
 * Two backends implement this table with identical semantics:
 *   kernels_cpu.c  (C + OpenMP, matmuls through CBLAS/OpenBLAS)
 *   kernels_cuda.cu (CUDA kernels, matmuls through cuBLAS)
 * Each backend's functions carry the same names and signatures in files that
 * mirror each other; the table below is how the model calls whichever backend
 * device_init() chose (ops()), and how the parity tests call both.
 *
 * Letters used in shapes:
 *   B  sequences in the (micro-)batch     T  sequence length (tokens)
 *   C  model width (dmodel)               NH attention heads, hs = C / NH
 *   V  vocabulary size                    N  rows = B * T
 *   OC output channels of a linear layer
 * Tensors are row-major; (B,T,C) means index (b*T + t)*C + c.
 *
 * Conventions every backend follows:
 *   - Pointers are DEVICE buffers of the active backend (device.h).
 *   - Every *_backward ADDS into its gradient outputs (dinp += ..., dweight
 *     += ...). Callers zero activation gradients before the backward pass;
 *     parameter gradients accumulate over micro-batches until zeroed.
 *   - A NULL bias (and its gradient) means "no bias".
 *   - Shapes are runtime values; nothing is baked in. */
#ifndef KERNELS_H
#define KERNELS_H

#include "common/core/half.h" /* bf16 and fp16 conversions */

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct KernelOps {
    const char *name; /* "cpu" or "cuda" */

    /* out(B,T,C) = wte[tokens[b,t]] + wpe[t].  wte (V,C), wpe (maxT,C), tokens (B,T) in 0..V-1 */
    void (*embedding_forward)(float *out, const int *tokens, const float *wte, const float *wpe, int B, int T,
                              int C);
    /* dwte[tokens[b,t]] += dout[b,t];  dwpe[t] += sum_b dout[b,t] */
    void (*embedding_backward)(float *dwte, float *dwpe, const float *dout, const int *tokens, int B, int T,
                               int C, int V);

    /* out(N,C) = (inp - mean) * rstd * weight + bias, per row; saves mean(N), rstd(N). eps = 1e-5 */
    void (*layernorm_forward)(float *out, float *mean, float *rstd, const float *inp, const float *weight,
                              const float *bias, int N, int C);
    void (*layernorm_backward)(float *dinp, float *dweight, float *dbias, const float *dout, const float *inp,
                               const float *weight, const float *mean, const float *rstd, int N, int C);

    /* out(N,OC) = inp(N,C) @ weight(OC,C)^T + bias(OC) */
    void (*linear_forward)(float *out, const float *inp, const float *weight, const float *bias, int N, int C,
                           int OC);
    /* dinp += dout @ weight;  dweight += dout^T @ inp;  dbias += column sums of dout.
     * It is the two calls below, in this order, and gives their bits. */
    void (*linear_backward)(float *dinp, float *dweight, float *dbias, const float *dout, const float *inp,
                            const float *weight, int N, int C, int OC);
    /* Its two halves, for zero-bubble pipelines (04_pipeline/schedule.h): the
     * input gradient, which the previous layer waits for (B), and the weight
     * gradient, which nobody waits for (W) and which can run later, from a
     * kept dout and inp.  input: dinp += dout @ weight.  weight: dweight +=
     * dout^T @ inp; dbias += column sums of dout. */
    void (*linear_backward_input)(float *dinp, const float *dout, const float *weight, int N, int C, int OC);
    void (*linear_backward_weight)(float *dweight, float *dbias, const float *dout, const float *inp, int N,
                                   int C, int OC);
    /* The same two with 16-bit matmul inputs (mixed precision, half.h): each
     * GEMM's two inputs (inp and weight; dout and weight; dout and inp) rounded
     * to `format`, their products accumulated in fp32; bias and dbias in fp32.
     * CUDA: cublasGemmEx on tensor cores, CUBLAS_COMPUTE_32F. CPU: cblas_sgemm on
     * the rounded values (the products are exact in fp32; the installed
     * OpenBLAS has no 16-bit GEMM, kernels_cpu.c says why). */
    void (*linear_forward_half)(float *out, const float *inp, const float *weight, const float *bias, int N,
                                int C, int OC, HalfFormat format);
    void (*linear_backward_half)(float *dinp, float *dweight, float *dbias, const float *dout,
                                 const float *inp, const float *weight, int N, int C, int OC,
                                 HalfFormat format);
    /* its two halves, as linear_backward_input and _weight */
    void (*linear_backward_input_half)(float *dinp, const float *dout, const float *weight, int N, int C,
                                       int OC, HalfFormat format);
    void (*linear_backward_weight_half)(float *dweight, float *dbias, const float *dout, const float *inp,
                                        int N, int C, int OC, HalfFormat format);

    /* Causal self-attention, fused ("flash" style): the (T,T) matrix of
     * probabilities is never stored. qkv (B,T,3C) holds q | k | v, each (C) =
     * NH heads of hs. With scores x = q k^T / sqrt(hs) over keys 0..t (the
     * causal mask), out (B,T,C) = softmax(x) @ v, heads concatenated, and
     * lse (B,NH,T) = log(sum over keys 0..t of exp(x)) per query row: the one
     * number per row that backward needs to recompute any probability,
     * p = exp(x - lse). Workspace is the backend's (O(tile x T) per thread on
     * the CPU, O(B x NH x T) on CUDA), never O(T x T) per head. */
    void (*attention_forward)(float *out, float *lse, const float *qkv, int B, int T, int C, int NH);
    /* dqkv (B,T,3C) += ...; from dout (B,T,C) and the forward's qkv, out and
     * lse. Recomputes the probabilities tile by tile. */
    void (*attention_backward)(float *dqkv, const float *dout, const float *qkv, const float *out,
                               const float *lse, int B, int T, int C, int NH);

    /* Ring attention's pieces (context parallelism, 03_model_parallel/
     * context_parallel.h): a rank holds some chunks of each sequence, and
     * attention runs block by block, a chunk of queries against a chunk of
     * keys that came round the ring. Every chunk is `rows` positions; the
     * buffers hold T rows per sequence and the pointers point at the chunk's
     * first row: q into a qkv buffer (B,T,3C), kv into a k | v buffer
     * (B,T,2C), dout, out (B,T,C), lse (B,NH,T). causal: the two chunks are
     * the same positions (the mask of attention_forward); else every key
     * precedes every query and all are seen.
     *   block_forward: block_out, block_lse (laid out as out, lse): the
     *     softmax over this block's keys only.
     *   merge: (out, lse) and (block_out, block_lse), two softmaxes over
     *     disjoint sets of keys, into one over both: with
     *     lse = log(e^lse1 + e^lse2), out = e^(lse1-lse) out1 + e^(lse2-lse) out2
     *     (each out is a weighted mean of its values, its weights summing to
     *     1; e^lse is the sum it was normalised by).
     *   block_backward: dq += ..., dkv += ... from the WHOLE attention's
     *     out and lse (p = exp(x - lse) is then the true probability). */
    void (*attention_block_forward)(float *block_out, float *block_lse, const float *q, const float *kv,
                                    int B, int T, int rows, int C, int NH, int causal);
    void (*attention_merge)(float *out, float *lse, const float *block_out, const float *block_lse, int B,
                            int T, int rows, int C, int NH);
    void (*attention_block_backward)(float *dq, float *dkv, const float *dout, const float *out,
                                     const float *lse, const float *q, const float *kv, int B, int T,
                                     int rows, int C, int NH, int causal);

    /* GELU, tanh form: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) */
    void (*gelu_forward)(float *out, const float *inp, size_t n);
    void (*gelu_backward)(float *dinp, const float *inp, const float *dout, size_t n);

    /* out = a + b */
    void (*residual_forward)(float *out, const float *a, const float *b, size_t n);
    /* da += dout;  db += dout */
    void (*residual_backward)(float *da, float *db, const float *dout, size_t n);

    /* Softmax cross-entropy over V classes per row of Vp >= V logits (the padded
     * vocabulary, model_config.h: vocab_padded). losses(N) = -log softmax(logits[:V])[target];
     * probs(N,Vp) = softmax(logits[:V]), saved for backward, and 0 in the Vp - V padded
     * columns, whose logits are never read: padded rows are never predicted. targets (N)
     * must be in 0..V-1 (there is no ignore index: every token counts). */
    void (*crossentropy_forward)(float *losses, float *probs, const float *logits, const int *targets, int N,
                                 int V, int Vp);
    /* dlogits += (probs - onehot(target)) * dloss, where dloss is d(total loss)/d(each row's loss),
     * e.g. 1/(tokens in the global batch) for a mean. Rows of V columns: called with Vp, the
     * padded columns get (0 - 0) * dloss, nothing. */
    void (*crossentropy_backward)(float *dlogits, const float *probs, const int *targets, float dloss, int N,
                                  int V);

    /* ---- the vocabulary split over ranks (tensor parallelism, Megatron's
     * vocab-parallel embedding and cross-entropy; 03_model_parallel/
     * tensor_parallel.h) ----
     * A rank holds `rows` rows of wte (and of the head), global rows first ..
     * first + rows - 1, as wte (rows, C). With first 0 and rows the whole
     * padded vocabulary these are the operations above.
     * embedding_forward_rows: out(B,T,C) = wte[token - first] + wpe[t] where
     *   this rank holds the token's row, else 0: summed over the ranks, every
     *   token's row is counted once, with the bits of embedding_forward.
     * embedding_backward_rows: dwte[token - first] += dout for the tokens held;
     *   dwpe[t] += sum_b dout[b,t] for every token (wpe is whole everywhere). */
    void (*embedding_forward_rows)(float *out, const int *tokens, const float *wte, const float *wpe, int B,
                                   int T, int C, int first, int rows);
    void (*embedding_backward_rows)(float *dwte, float *dwpe, const float *dout, const int *tokens, int B,
                                    int T, int C, int first, int rows);
    /* The cross-entropy from a slice of each row's logits: logits (N,Vl), this
     * rank's Vl columns, global columns first .. first + Vl - 1, of which the
     * first `cols` are tokens (the rest padding: never predicted). Three steps
     * with communication between them (model.c, head_loss_slice):
     *   slice_max:    row_max(N) = the max of the row's cols logits (-Inf if none)
     *      -> the ranks' maxima gathered: maxes (parts, N)
     *   slice_sums:   row_max(N) = the max over the parts of maxes;
     *                 sums(2,N): sums[n] = sum of exp(z - row_max) over the cols
     *                 (accumulated in double), sums[N + n] = z[target] - row_max
     *                 where this rank holds the target's column, else 0
     *      -> sums all-reduced over the ranks
     *   slice_finish: probs(N,Vl) = exp(z - row_max) / sums[n], 0 past cols;
     *                 losses(N) = log(sums[n]) - sums[N + n]
     * crossentropy_backward_rows: dlogits(N,Vl) += (probs - onehot(target -
     *   first)) * dloss: crossentropy_backward on a slice. */
    void (*crossentropy_slice_max)(float *row_max, const float *logits, int N, int cols, int Vl);
    void (*crossentropy_slice_sums)(float *sums, float *row_max, const float *maxes, int parts,
                                    const float *logits, const int *targets, int N, int cols, int Vl,
                                    int first);
    void (*crossentropy_slice_finish)(float *losses, float *probs, const float *logits, const float *row_max,
                                      const float *sums, int N, int cols, int Vl);
    void (*crossentropy_backward_rows)(float *dlogits, const float *probs, const int *targets, float dloss,
                                       int N, int Vl, int first);

    /* ---- a mixture of experts (common/model/moe.h): tokens to their experts and back ----
     * Each of N tokens has K slots (one per chosen expert); slot (n,k) is
     * index n*K + k of pos and gate. The R dispatched rows are grouped by
     * expert; pos[n*K+k] is the row of slot (n,k), or -1 where the slot was
     * dropped (past its expert's capacity); src[i] is the token of row i.
     *   moe_gather:      out(R,C) row i = inp(N,C) row src[i]
     *   moe_scatter_add: dinp(N,C) row n += sum over k of dout(R,C) row pos[n*K+k]
     *                    (gather's backward, summed per token in k order: the same bits
     *                    on every backend, no atomics)
     *   moe_combine:     out(N,C) row n = sum over k of gate[n*K+k] * y(R,C) row
     *                    pos[n*K+k] (written, not added; 0 where every slot was dropped)
     *   moe_combine_backward: dy row pos[n*K+k] += gate[n*K+k] * dout(N,C) row n;
     *                    dgate[n*K+k] += dout row n . y row pos[n*K+k] (dropped slots: nothing) */
    void (*moe_gather)(float *out, const float *inp, const int *src, int R, int C);
    void (*moe_scatter_add)(float *dinp, const float *dout, const int *pos, int N, int K, int C);
    void (*moe_combine)(float *out, const float *y, const int *pos, const float *gate, int N, int K, int C);
    void (*moe_combine_backward)(float *dy, float *dgate, const float *dout, const float *y, const int *pos,
                                 const float *gate, int N, int K, int C);

    /* Sum of squares of x(n), accumulated in double: the building block of the
     * global gradient norm (a shard's partial sum can be all-reduced). */
    double (*sum_squares)(const float *x, size_t n);
    /* sum_squares of 16-bit values (in double, chunked like sum_squares): Inf or
     * NaN when any element is, which is how an fp16 overflow is found */
    double (*sum_squares_half)(const uint16_t *x, size_t n, HalfFormat format);

    /* AdamW on n elements (any contiguous slice of the parameter buffer):
     *   g = grads * grad_scale              (grad_scale carries clipping)
     *   m = beta1 m + (1-beta1) g;  v = beta2 v + (1-beta2) g^2
     *   mhat = m / (1-beta1^t);  vhat = v / (1-beta2^t)
     *   params -= lr * (mhat / (sqrt(vhat) + eps) + weight_decay * params)
     * t is the 1-based optimizer step. */
    void (*adamw_update)(float *params, const float *grads, float *m, float *v, size_t n, float lr,
                         float beta1, float beta2, float eps, float weight_decay, float grad_scale, int t);
    /* AdamW (the formula above) on fp32 master weights from 16-bit gradients,
     * then params(n) = master rounded to `format`: what forward reads next */
    void (*adamw_update_half)(float *master, uint16_t *params, const uint16_t *grads, float *m, float *v,
                              size_t n, float lr, float beta1, float beta2, float eps, float weight_decay,
                              float grad_scale, int t, HalfFormat format);

    /* x(n) = 0 */
    void (*fill_zero)(float *x, size_t n);
    /* the same for 16-bit x */
    void (*fill_zero_half)(uint16_t *x, size_t n);
    /* x(n) *= factor */
    void (*scale)(float *x, size_t n, float factor);

    /* ---- mixed precision: 16-bit values held as bits (half.h) ----
     * out(n) = inp rounded to `format`, to nearest with ties to even, beyond
     * the range +-Inf, NaN kept (half.h's rules, the same bits on every backend) */
    void (*cast_to_half)(uint16_t *out, const float *inp, size_t n, HalfFormat format);
    /* out(n) = inp, exactly (every 16-bit value is a float) */
    void (*cast_from_half)(float *out, const uint16_t *inp, size_t n, HalfFormat format);
    /* acc(n) = round(acc + add): a unit's fp32 gradients added into 16-bit storage */
    void (*accumulate_half)(uint16_t *acc, const float *add, size_t n, HalfFormat format);

    /* Free the workspaces the backend grew on demand (attention, norms, 16-bit matmul operands).
     * Called at exit by device_shutdown(); the next call grows them again. */
    void (*release_workspaces)(void);
} KernelOps;

extern const KernelOps kernels_cpu;
#ifdef USE_CUDA
extern const KernelOps kernels_cuda;
#endif

/* The table of the backend device_init() chose. */
const KernelOps *ops(void);

/* A linear layer's shape: `in` inputs, `out` outputs (linear_forward's C, OC). */
typedef struct {
    int in, out;
} LinearShape;
/* The bytes the CPU backend's 16-bit matmul workspaces grow to (device,
 * workspace) once linear_forward_half and linear_backward_half have run on
 * every layer of `shapes` with N rows: one buffer per operand kind (input,
 * weight, output gradient), each the largest of its kind. common/plan
 * predicts memory.csv with it. */
size_t half_matmul_workspace_bytes_cpu(int N, const LinearShape *shapes, int count);
/* The dry run (device.h; kernels_dry.c): grow the CPU backend's 16-bit matmul
 * workspaces as linear_forward_half, linear_backward_input_half or
 * linear_backward_weight_half of an (N, C) x (OC, C) matmul would, computing nothing. */
typedef enum { HALF_MATMUL_FORWARD, HALF_MATMUL_BACKWARD_INPUT, HALF_MATMUL_BACKWARD_WEIGHT } HalfMatmul;
void half_matmul_grow_cpu(HalfMatmul which, int N, int C, int OC);

/* The table of the dry run: every operation does nothing but grow the CPU
 * backend's workspaces as the CPU's own would; sums of squares are 0 (a
 * healthy, finite gradient). ops() returns it when device_dry(). */
extern const KernelOps kernels_dry;

#ifdef __cplusplus
}
#endif

#endif
