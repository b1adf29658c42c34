/* kernels_cuda.cu: the CUDA backend of kernels.h (CUDA kernels, matmuls through cuBLAS).
 *
 * Mirrors kernels_cpu.c function for function: the same names, the same
 * order, the same formulas (and, where it is cheap, the same order of
 * floating-point additions), so the two agree far inside the 1e-4 that
 * tests/test_parity.c allows. What differs is how work is spread over threads:
 *   - elementwise kernels: one thread per element, size_t indices;
 *   - row kernels (layernorm, softmax): one warp per row, reduced with shuffles;
 *   - column sums (dbias, layernorm dweight/dbias): one block per 32 columns,
 *     each thread sums a fixed subset of rows, then a fixed-order tree.
 * No kernel uses atomics: every reduction has an order fixed by the shapes,
 * so a run is bit-identical each time on the same GPU (cuBLAS is too, with its
 * default settings), which the determinism and resume tests rely on.
 * All work is issued on the default stream, so it runs in program order. */
#include "cuda_common.cuh"

#include "device.h"
#include "kernels.h"

#include <limits.h>
#include <math.h>

#define LAYERNORM_EPS 1e-5f
#define GELU_SCALE 0.7978845608028654f /* sqrt(2 / pi) */

#define WARP_SIZE 32
/* Threads per block, a multiple of WARP_SIZE. */
#define BLOCK_SIZE 256
/* Row kernels: one warp per row. */
#define ROWS_PER_BLOCK (BLOCK_SIZE / WARP_SIZE)
/* Column sums: a block owns COLUMN_TILE columns (one coalesced warp load per
 * row) and COLUMN_ROW_GROUPS threads per column, each summing every 16th row. */
#define COLUMN_TILE 32
#define COLUMN_ROW_GROUPS 16
/* sum_squares: a fixed block count, so the order of additions depends only on n. */
#define SUM_BLOCKS 256

/* ---------------------------------------------------------------------------
 * Launch and reduction helpers
 * ------------------------------------------------------------------------- */

/* Blocks needed for `items` work items at `per_block` each. */
static unsigned int blocks_for(size_t items, size_t per_block) {
    size_t blocks = (items + per_block - 1) / per_block;
    if (blocks > INT_MAX) fatal(EXIT_RUNTIME, "kernel launch: %zu blocks exceed the grid limit", blocks);
    return (unsigned int)blocks;
}

/* Butterfly reductions over the 32 lanes of a warp: every lane ends with the
 * result, and the order of operations is fixed. */
static __device__ float warp_sum(float x) {
    for (int offset = WARP_SIZE / 2; offset > 0; offset /= 2) x += __shfl_xor_sync(0xffffffffu, x, offset);
    return x;
}
static __device__ double warp_sum(double x) {
    for (int offset = WARP_SIZE / 2; offset > 0; offset /= 2) x += __shfl_xor_sync(0xffffffffu, x, offset);
    return x;
}
static __device__ float warp_max(float x) {
    for (int offset = WARP_SIZE / 2; offset > 0; offset /= 2)
        x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, offset));
    return x;
}

/* Block-wide reductions (blockDim.x a multiple of 32, every thread calls):
 * warps reduce, lane 0 of each warp posts to shared memory, then every warp
 * reduces the posted values, so every thread returns the result. The first
 * barrier lets the function be called twice in a row safely. */
static __device__ double block_sum(double x) {
    __shared__ double posted[WARP_SIZE];
    int lane = threadIdx.x % WARP_SIZE, warp = threadIdx.x / WARP_SIZE, warps = blockDim.x / WARP_SIZE;
    x = warp_sum(x);
    __syncthreads();
    if (lane == 0) posted[warp] = x;
    __syncthreads();
    return warp_sum(lane < warps ? posted[lane] : 0.0);
}
static __device__ float block_max(float x) {
    __shared__ float posted[WARP_SIZE];
    int lane = threadIdx.x % WARP_SIZE, warp = threadIdx.x / WARP_SIZE, warps = blockDim.x / WARP_SIZE;
    x = warp_max(x);
    __syncthreads();
    if (lane == 0) posted[warp] = x;
    __syncthreads();
    return warp_max(lane < warps ? posted[lane] : -INFINITY);
}

/* Row-major matmul through column-major cuBLAS, with the arguments of
 * cblas_sgemm(CblasRowMajor, ...) so each call reads like its CPU twin:
 *   C(M,N) = alpha * op(A)(M,K) @ op(B)(K,N) + beta * C,  lda/ldb/ldc = row lengths.
 * The mapping: a row-major (M,N) matrix is, byte for byte, the column-major
 * (N,M) matrix C^T. So we ask cuBLAS for C^T = op(B)^T @ op(A)^T: swap the two
 * operands, swap M and N, keep each operand's transpose flag and leading
 * dimension. The batched form repeats this over `batch` matrices spaced by the
 * given strides (in elements). */
static void sgemm_rowmajor_batched(bool trans_a, bool trans_b, int M, int N, int K, float alpha,
                                   const float *A, int lda, long long stride_a, const float *B, int ldb,
                                   long long stride_b, float beta, float *Cm, int ldc, long long stride_c,
                                   int batch) {
    cublas_check(cublasSgemmStridedBatched(cublas_handle, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N,
                                           trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, N, M, K, &alpha, B, ldb,
                                           stride_b, A, lda, stride_a, &beta, Cm, ldc, stride_c, batch));
}
static void sgemm_rowmajor(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float *A,
                           int lda, const float *B, int ldb, float beta, float *Cm, int ldc) {
    cublas_check(cublasSgemm(cublas_handle, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N,
                             trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, N, M, K, &alpha, B, ldb, A, lda, &beta, Cm,
                             ldc));
}

/* ---------------------------------------------------------------------------
 * Kernels, in the order of kernels.h
 * ------------------------------------------------------------------------- */

/* out[n,c] = wte[tokens[n], c] + wpe[t, c], one thread per element */
static __global__ void embedding_forward_kernel(float *out, const int *tokens, const float *wte,
                                                const float *wpe, int T, int C, size_t total) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= total) return;
    size_t n = i / C;
    int c = (int)(i % C), t = (int)(n % T);
    out[i] = wte[(size_t)tokens[n] * C + c] + wpe[(size_t)t * C + c];
}

/* dwpe[t,c] += dout[b,t,c] for b = 0..B-1 in order, one thread per (t,c) */
static __global__ void embedding_backward_wpe_kernel(float *dwpe, const float *dout, int B, int T, int C) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)T * C) return;
    float acc = dwpe[i];
    for (int b = 0; b < B; b++) acc += dout[(size_t)b * T * C + i];
    dwpe[i] = acc;
}

/* dwte[v,:] += dout[n,:] for every n with tokens[n] == v, n in order.
 * One block per vocabulary row, threads over channels: each row has a single
 * owner, so there is no race and no atomic, and the summation order is the
 * CPU's. The tokens are read in chunks of BLOCK_SIZE; one vote skips the
 * (usual) chunks in which v does not occur. */
static __global__ void embedding_backward_wte_kernel(float *dwte, const float *dout, const int *tokens, int N,
                                                     int C) {
    __shared__ int chunk[BLOCK_SIZE];
    int v = blockIdx.x;
    float *row = dwte + (size_t)v * C;
    for (int start = 0; start < N; start += BLOCK_SIZE) {
        int n = start + threadIdx.x;
        int token = n < N ? tokens[n] : -1;
        chunk[threadIdx.x] = token;
        if (!__syncthreads_or(token == v)) continue; /* barrier too: the block agrees */
        int count = min(N - start, BLOCK_SIZE);
        for (int j = 0; j < count; j++) {
            if (chunk[j] != v) continue;
            const float *g = dout + (size_t)(start + j) * C;
            for (int c = threadIdx.x; c < C; c += BLOCK_SIZE) row[c] += g[c];
        }
        __syncthreads(); /* everyone is done with chunk before it is overwritten */
    }
}

/* One warp per row: mean and variance in double, then normalise. */
static __global__ void layernorm_forward_kernel(float *out, float *mean, float *rstd, const float *inp,
                                                const float *weight, const float *bias, int N, int C) {
    size_t n = (size_t)blockIdx.x * ROWS_PER_BLOCK + threadIdx.x / WARP_SIZE;
    int lane = threadIdx.x % WARP_SIZE;
    if (n >= (size_t)N) return; /* the whole warp leaves, so shuffles stay full-warp */
    const float *x = inp + n * C;
    double sum = 0.0;
    for (int c = lane; c < C; c += WARP_SIZE) sum += x[c];
    float m = (float)(warp_sum(sum) / C);
    double var = 0.0;
    for (int c = lane; c < C; c += WARP_SIZE) var += (double)(x[c] - m) * (x[c] - m);
    float s = 1.0f / sqrtf((float)(warp_sum(var) / C) + LAYERNORM_EPS);
    float *o = out + n * C;
    for (int c = lane; c < C; c += WARP_SIZE) o[c] = (x[c] - m) * s * weight[c] + bias[c];
    if (lane == 0) {
        mean[n] = m;
        rstd[n] = s;
    }
}

/* dinp, one warp per row. With xhat = (x - m) * s and dxhat = g * weight:
 * dx = s * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat)) */
static __global__ void layernorm_backward_dinp_kernel(float *dinp, const float *dout, const float *inp,
                                                      const float *weight, const float *mean,
                                                      const float *rstd, int N, int C) {
    size_t n = (size_t)blockIdx.x * ROWS_PER_BLOCK + threadIdx.x / WARP_SIZE;
    int lane = threadIdx.x % WARP_SIZE;
    if (n >= (size_t)N) return;
    const float *x = inp + n * C;
    const float *g = dout + n * C;
    float m = mean[n], s = rstd[n];
    double sum_dxhat = 0.0, sum_dxhat_xhat = 0.0;
    for (int c = lane; c < C; c += WARP_SIZE) {
        float xhat = (x[c] - m) * s;
        float dxhat = g[c] * weight[c];
        sum_dxhat += dxhat;
        sum_dxhat_xhat += (double)dxhat * xhat;
    }
    float mean_dxhat = (float)(warp_sum(sum_dxhat) / C);
    float mean_dxhat_xhat = (float)(warp_sum(sum_dxhat_xhat) / C);
    float *dx = dinp + n * C;
    for (int c = lane; c < C; c += WARP_SIZE) {
        float xhat = (x[c] - m) * s;
        dx[c] += s * (g[c] * weight[c] - mean_dxhat - xhat * mean_dxhat_xhat);
    }
}

/* dweight[c] += sum_n dout * xhat,  dbias[c] += sum_n dout.
 * Block (COLUMN_TILE, COLUMN_ROW_GROUPS) owns COLUMN_TILE columns: thread
 * (x, y) sums rows y, y + 16, y + 32, ... of column x (a warp reads 32
 * neighbouring floats: coalesced), then row y = 0 adds the 16 partial sums in
 * order. No atomics, fixed order. */
static __global__ void layernorm_backward_params_kernel(float *dweight, float *dbias, const float *dout,
                                                        const float *inp, const float *mean,
                                                        const float *rstd, int N, int C) {
    __shared__ double dw_part[COLUMN_ROW_GROUPS][COLUMN_TILE];
    __shared__ double db_part[COLUMN_ROW_GROUPS][COLUMN_TILE];
    int c = blockIdx.x * COLUMN_TILE + threadIdx.x;
    double dw = 0.0, db = 0.0;
    if (c < C) {
        for (int n = threadIdx.y; n < N; n += COLUMN_ROW_GROUPS) {
            size_t i = (size_t)n * C + c;
            float g = dout[i];
            dw += (double)g * (inp[i] - mean[n]) * rstd[n];
            db += g;
        }
    }
    dw_part[threadIdx.y][threadIdx.x] = dw;
    db_part[threadIdx.y][threadIdx.x] = db;
    __syncthreads();
    if (threadIdx.y == 0 && c < C) {
        double dw_total = 0.0, db_total = 0.0;
        for (int r = 0; r < COLUMN_ROW_GROUPS; r++) {
            dw_total += dw_part[r][threadIdx.x];
            db_total += db_part[r][threadIdx.x];
        }
        dweight[c] += (float)dw_total;
        dbias[c] += (float)db_total;
    }
}

/* out[n,o] += bias[o], one thread per element */
static __global__ void add_bias_kernel(float *out, const float *bias, int OC, size_t total) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= total) return;
    out[i] += bias[i % OC];
}

/* dbias[o] += sum_n dout[n,o]: the column-sum layout of layernorm_backward_params_kernel */
static __global__ void column_sums_add_kernel(float *dbias, const float *dout, int N, int OC) {
    __shared__ double part[COLUMN_ROW_GROUPS][COLUMN_TILE];
    int o = blockIdx.x * COLUMN_TILE + threadIdx.x;
    double sum = 0.0;
    if (o < OC)
        for (int n = threadIdx.y; n < N; n += COLUMN_ROW_GROUPS) sum += dout[(size_t)n * OC + o];
    part[threadIdx.y][threadIdx.x] = sum;
    __syncthreads();
    if (threadIdx.y == 0 && o < OC) {
        double total = 0.0;
        for (int r = 0; r < COLUMN_ROW_GROUPS; r++) total += part[r][threadIdx.x];
        dbias[o] += (float)total;
    }
}

/* Attention works on heads laid out (B,NH,T,hs), so that each (b,h) is one
 * contiguous (T,hs) matrix for the batched matmuls. Element i of such a tensor
 * sits at (b*T + t)*row + h*hs + d of a token-major tensor with `row` floats
 * per token (C for out and dout, 3C for qkv). */
static __device__ size_t token_major_index(size_t i, int T, int NH, int hs, size_t row) {
    int d = (int)(i % hs);
    size_t rest = i / hs;
    int t = (int)(rest % T);
    rest /= T;
    int h = (int)(rest % NH);
    size_t b = rest / NH;
    return (b * T + t) * row + (size_t)h * hs + d;
}

/* qkv (B,T,3C) -> q, k, v, each (B,NH,T,hs) */
static __global__ void split_qkv_kernel(float *q, float *k, float *v, const float *qkv, int T, int C, int NH,
                                        size_t total) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= total) return;
    const float *src = qkv + token_major_index(i, T, NH, C / NH, 3 * (size_t)C);
    q[i] = src[0];
    k[i] = src[C];
    v[i] = src[2 * (size_t)C];
}

/* (B,T,C) -> (B,NH,T,hs) */
static __global__ void split_heads_kernel(float *heads, const float *tokens, int T, int C, int NH,
                                          size_t total) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= total) return;
    heads[i] = tokens[token_major_index(i, T, NH, C / NH, C)];
}

/* (B,NH,T,hs) -> (B,T,C): heads concatenated again */
static __global__ void merge_heads_kernel(float *tokens, const float *heads, int T, int C, int NH,
                                          size_t total) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= total) return;
    tokens[token_major_index(i, T, NH, C / NH, C)] = heads[i];
}

/* dqkv (B,T,3C) += dq | dk | dv, each (B,NH,T,hs) */
static __global__ void merge_qkv_grads_kernel(float *dqkv, const float *dq, const float *dk, const float *dv,
                                              int T, int C, int NH, size_t total) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= total) return;
    float *dst = dqkv + token_major_index(i, T, NH, C / NH, 3 * (size_t)C);
    dst[0] += dq[i];
    dst[C] += dk[i];
    dst[2 * (size_t)C] += dv[i];
}

/* In place on att (rows of T, row index = (b*NH + h)*T + t), one warp per row:
 * scores q.k in, softmax(scores * scale) over keys 0..t out, zeros above the
 * diagonal (the causal mask). */
static __global__ void causal_softmax_kernel(float *att, float scale, int T, size_t rows) {
    size_t r = (size_t)blockIdx.x * ROWS_PER_BLOCK + threadIdx.x / WARP_SIZE;
    int lane = threadIdx.x % WARP_SIZE;
    if (r >= rows) return;
    int t = (int)(r % T);
    float *row = att + r * T;
    float maxval = -INFINITY;
    for (int t2 = lane; t2 <= t; t2 += WARP_SIZE) maxval = fmaxf(maxval, row[t2] * scale);
    maxval = warp_max(maxval);
    float sum = 0.0f;
    for (int t2 = lane; t2 <= t; t2 += WARP_SIZE) sum += expf(row[t2] * scale - maxval);
    sum = warp_sum(sum);
    for (int t2 = lane; t2 < T; t2 += WARP_SIZE)
        row[t2] = t2 <= t ? expf(row[t2] * scale - maxval) / sum : 0.0f;
}

/* In place on datt, one warp per row:
 * dscore = att * (datt - sum(att * datt)) * scale over keys 0..t, 0 above. */
static __global__ void causal_softmax_backward_kernel(float *datt, const float *att, float scale, int T,
                                                      size_t rows) {
    size_t r = (size_t)blockIdx.x * ROWS_PER_BLOCK + threadIdx.x / WARP_SIZE;
    int lane = threadIdx.x % WARP_SIZE;
    if (r >= rows) return;
    int t = (int)(r % T);
    const float *arow = att + r * T;
    float *drow = datt + r * T;
    float weighted = 0.0f;
    for (int t2 = lane; t2 <= t; t2 += WARP_SIZE) weighted += arow[t2] * drow[t2];
    weighted = warp_sum(weighted);
    for (int t2 = lane; t2 < T; t2 += WARP_SIZE)
        drow[t2] = t2 <= t ? arow[t2] * (drow[t2] - weighted) * scale : 0.0f;
}

static __global__ void gelu_forward_kernel(float *out, const float *inp, size_t n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float x = inp[i];
    out[i] = 0.5f * x * (1.0f + tanhf(GELU_SCALE * (x + 0.044715f * x * x * x)));
}

static __global__ void gelu_backward_kernel(float *dinp, const float *inp, const float *dout, size_t n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float x = inp[i];
    float u = GELU_SCALE * (x + 0.044715f * x * x * x);
    float th = tanhf(u);
    float sech2 = 1.0f - th * th;
    float du_dx = GELU_SCALE * (1.0f + 3.0f * 0.044715f * x * x);
    dinp[i] += dout[i] * (0.5f * (1.0f + th) + 0.5f * x * sech2 * du_dx);
}

static __global__ void residual_forward_kernel(float *out, const float *a, const float *b, size_t n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    out[i] = a[i] + b[i];
}

static __global__ void residual_backward_kernel(float *da, float *db, const float *dout, size_t n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    da[i] += dout[i];
    db[i] += dout[i];
}

/* One block per row n: max, exp and sum (in double), normalise, loss. */
static __global__ void crossentropy_forward_kernel(float *losses, float *probs, const float *logits,
                                                   const int *targets, int V) {
    size_t n = blockIdx.x;
    const float *z = logits + n * V;
    float *p = probs + n * V;
    float maxval = -INFINITY;
    for (int v = threadIdx.x; v < V; v += blockDim.x) maxval = fmaxf(maxval, z[v]);
    maxval = block_max(maxval);
    double sum = 0.0;
    for (int v = threadIdx.x; v < V; v += blockDim.x) {
        p[v] = expf(z[v] - maxval);
        sum += p[v];
    }
    sum = block_sum(sum);
    float inv = (float)(1.0 / sum);
    for (int v = threadIdx.x; v < V; v += blockDim.x) p[v] *= inv; /* this thread wrote p[v] above */
    /* -log p[target] computed from the logits keeps precision for tiny p */
    if (threadIdx.x == 0) losses[n] = (float)(log(sum) - (z[targets[n]] - maxval));
}

static __global__ void crossentropy_backward_kernel(float *dlogits, const float *probs, const int *targets,
                                                    float dloss, int V, size_t total) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= total) return;
    size_t n = i / V;
    int v = (int)(i % V);
    dlogits[i] += (probs[i] - (v == targets[n] ? 1.0f : 0.0f)) * dloss;
}

/* Pass 1: SUM_BLOCKS blocks stride over x, each leaving one partial sum. */
static __global__ void sum_squares_partial_kernel(double *partial, const float *x, size_t n) {
    double s = 0.0;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        s += (double)x[i] * x[i];
    s = block_sum(s);
    if (threadIdx.x == 0) partial[blockIdx.x] = s;
}

/* Pass 2: one block adds the partial sums. */
static __global__ void sum_squares_final_kernel(double *total, const double *partial, int count) {
    double s = 0.0;
    for (int i = threadIdx.x; i < count; i += blockDim.x) s += partial[i];
    s = block_sum(s);
    if (threadIdx.x == 0) *total = s;
}

/* bias1 = 1 - beta1^t and bias2 = 1 - beta2^t come from the host, as on the CPU. */
static __global__ void adamw_update_kernel(float *params, const float *grads, float *m, float *v, size_t n,
                                           float lr, float beta1, float beta2, float bias1, float bias2,
                                           float eps, float weight_decay, float grad_scale) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float g = grads[i] * grad_scale;
    float mi = beta1 * m[i] + (1.0f - beta1) * g;
    float vi = beta2 * v[i] + (1.0f - beta2) * g * g;
    m[i] = mi;
    v[i] = vi;
    float mhat = mi / bias1, vhat = vi / bias2;
    params[i] -= lr * (mhat / (sqrtf(vhat) + eps) + weight_decay * params[i]);
}

static __global__ void scale_kernel(float *x, size_t n, float factor) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] *= factor;
}

/* ---------------------------------------------------------------------------
 * The operations of kernels.h (host side), same names as kernels_cpu.c
 * ------------------------------------------------------------------------- */

static void embedding_forward(float *out, const int *tokens, const float *wte, const float *wpe, int B, int T,
                              int C) {
    size_t total = (size_t)B * T * C;
    if (total == 0) return;
    embedding_forward_kernel<<<blocks_for(total, BLOCK_SIZE), BLOCK_SIZE>>>(out, tokens, wte, wpe, T, C,
                                                                            total);
    cuda_check(cudaGetLastError());
}

static void embedding_backward(float *dwte, float *dwpe, const float *dout, const int *tokens, int B, int T,
                               int C, int V) {
    if ((size_t)B * T * C == 0) return;
    embedding_backward_wpe_kernel<<<blocks_for((size_t)T * C, BLOCK_SIZE), BLOCK_SIZE>>>(dwpe, dout, B, T, C);
    cuda_check(cudaGetLastError());
    if (V == 0) return;
    embedding_backward_wte_kernel<<<V, BLOCK_SIZE>>>(dwte, dout, tokens, B * T, C);
    cuda_check(cudaGetLastError());
}

static void layernorm_forward(float *out, float *mean, float *rstd, const float *inp, const float *weight,
                              const float *bias, int N, int C) {
    if (N == 0) return;
    layernorm_forward_kernel<<<blocks_for(N, ROWS_PER_BLOCK), BLOCK_SIZE>>>(out, mean, rstd, inp, weight,
                                                                            bias, N, C);
    cuda_check(cudaGetLastError());
}

static void layernorm_backward(float *dinp, float *dweight, float *dbias, const float *dout, const float *inp,
                               const float *weight, const float *mean, const float *rstd, int N, int C) {
    if (N == 0 || C == 0) return;
    layernorm_backward_dinp_kernel<<<blocks_for(N, ROWS_PER_BLOCK), BLOCK_SIZE>>>(dinp, dout, inp, weight,
                                                                                  mean, rstd, N, C);
    cuda_check(cudaGetLastError());
    dim3 block(COLUMN_TILE, COLUMN_ROW_GROUPS);
    layernorm_backward_params_kernel<<<blocks_for(C, COLUMN_TILE), block>>>(dweight, dbias, dout, inp, mean,
                                                                            rstd, N, C);
    cuda_check(cudaGetLastError());
}

static void linear_forward(float *out, const float *inp, const float *weight, const float *bias, int N, int C,
                           int OC) {
    /* out(N,OC) = inp(N,C) @ weight(OC,C)^T */
    sgemm_rowmajor(false, true, N, OC, C, 1.0f, inp, C, weight, C, 0.0f, out, OC);
    size_t total = (size_t)N * OC;
    if (bias && total > 0) {
        add_bias_kernel<<<blocks_for(total, BLOCK_SIZE), BLOCK_SIZE>>>(out, bias, OC, total);
        cuda_check(cudaGetLastError());
    }
}

static void linear_backward(float *dinp, float *dweight, float *dbias, const float *dout, const float *inp,
                            const float *weight, int N, int C, int OC) {
    /* dinp(N,C) += dout(N,OC) @ weight(OC,C) */
    sgemm_rowmajor(false, false, N, C, OC, 1.0f, dout, OC, weight, C, 1.0f, dinp, C);
    /* dweight(OC,C) += dout^T(OC,N) @ inp(N,C) */
    sgemm_rowmajor(true, false, OC, C, N, 1.0f, dout, OC, inp, C, 1.0f, dweight, C);
    if (dbias && OC > 0) {
        dim3 block(COLUMN_TILE, COLUMN_ROW_GROUPS);
        column_sums_add_kernel<<<blocks_for(OC, COLUMN_TILE), block>>>(dbias, dout, N, OC);
        cuda_check(cudaGetLastError());
    }
}

/* Scratch for the per-head copies of attention: four (B,NH,T,hs) tensors.
 * It grows when a call needs more and is otherwise reused, so the training
 * loop allocates nothing (and memory.csv shows it under device/workspace). */
static float *attention_workspace = NULL;
static size_t attention_workspace_bytes = 0;

static float *attention_scratch(size_t bytes) {
    if (bytes > attention_workspace_bytes) {
        mem_free(attention_workspace);
        attention_workspace = (float *)mem_alloc(SPACE_DEVICE, CAT_WORKSPACE, bytes, "attention workspace");
        attention_workspace_bytes = bytes;
    }
    return attention_workspace;
}

static void attention_forward(float *out, float *att, const float *qkv, int B, int T, int C, int NH) {
    int hs = C / NH;
    float scale = 1.0f / sqrtf((float)hs);
    size_t head_elems = (size_t)B * NH * T * hs; /* one (B,NH,T,hs) tensor */
    size_t rows = (size_t)B * NH * T;            /* rows of att */
    if (head_elems == 0) return;
    float *q = attention_scratch(4 * head_elems * sizeof(float));
    float *k = q + head_elems, *v = k + head_elems, *y = v + head_elems;
    long long mat = (long long)T * hs, sq = (long long)T * T; /* strides between heads */

    split_qkv_kernel<<<blocks_for(head_elems, BLOCK_SIZE), BLOCK_SIZE>>>(q, k, v, qkv, T, C, NH, head_elems);
    cuda_check(cudaGetLastError());
    /* per head: scores(T,T) = q(T,hs) @ k(T,hs)^T, written into att */
    sgemm_rowmajor_batched(false, true, T, T, hs, 1.0f, q, hs, mat, k, hs, mat, 0.0f, att, T, sq, B * NH);
    /* att = softmax(scores * scale) with the causal mask, zeros above the diagonal */
    causal_softmax_kernel<<<blocks_for(rows, ROWS_PER_BLOCK), BLOCK_SIZE>>>(att, scale, T, rows);
    cuda_check(cudaGetLastError());
    /* per head: y(T,hs) = att(T,T) @ v(T,hs); the zeros keep it causal */
    sgemm_rowmajor_batched(false, false, T, hs, T, 1.0f, att, T, sq, v, hs, mat, 0.0f, y, hs, mat, B * NH);
    merge_heads_kernel<<<blocks_for(head_elems, BLOCK_SIZE), BLOCK_SIZE>>>(out, y, T, C, NH, head_elems);
    cuda_check(cudaGetLastError());
}

static void attention_backward(float *dqkv, float *datt, const float *dout, const float *qkv,
                               const float *att, int B, int T, int C, int NH) {
    int hs = C / NH;
    float scale = 1.0f / sqrtf((float)hs);
    size_t head_elems = (size_t)B * NH * T * hs;
    size_t rows = (size_t)B * NH * T;
    if (head_elems == 0) return;
    float *q = attention_scratch(4 * head_elems * sizeof(float));
    float *k = q + head_elems, *v = k + head_elems, *dy = v + head_elems;
    long long mat = (long long)T * hs, sq = (long long)T * T;
    /* Gradients reuse the slots of inputs that are dead by then, so backward
     * needs no more scratch than forward: dv overwrites v (last read by the
     * datt matmul), dq overwrites dy (last read by the dv matmul), dk
     * overwrites k (last read by the dq matmul). */
    float *dv = v, *dq = dy, *dk = k;

    split_qkv_kernel<<<blocks_for(head_elems, BLOCK_SIZE), BLOCK_SIZE>>>(q, k, v, qkv, T, C, NH, head_elems);
    cuda_check(cudaGetLastError());
    split_heads_kernel<<<blocks_for(head_elems, BLOCK_SIZE), BLOCK_SIZE>>>(dy, dout, T, C, NH, head_elems);
    cuda_check(cudaGetLastError());
    /* y = att @ v:  datt(T,T) = dy(T,hs) @ v(T,hs)^T,  dv(T,hs) = att(T,T)^T @ dy(T,hs) */
    sgemm_rowmajor_batched(false, true, T, T, hs, 1.0f, dy, hs, mat, v, hs, mat, 0.0f, datt, T, sq, B * NH);
    sgemm_rowmajor_batched(true, false, T, hs, T, 1.0f, att, T, sq, dy, hs, mat, 0.0f, dv, hs, mat, B * NH);
    /* softmax backward, in place: datt becomes dscore (scale included) */
    causal_softmax_backward_kernel<<<blocks_for(rows, ROWS_PER_BLOCK), BLOCK_SIZE>>>(datt, att, scale, T,
                                                                                     rows);
    cuda_check(cudaGetLastError());
    /* scores = q @ k^T:  dq(T,hs) = dscore(T,T) @ k(T,hs),  dk(T,hs) = dscore(T,T)^T @ q(T,hs) */
    sgemm_rowmajor_batched(false, false, T, hs, T, 1.0f, datt, T, sq, k, hs, mat, 0.0f, dq, hs, mat, B * NH);
    sgemm_rowmajor_batched(true, false, T, hs, T, 1.0f, datt, T, sq, q, hs, mat, 0.0f, dk, hs, mat, B * NH);
    merge_qkv_grads_kernel<<<blocks_for(head_elems, BLOCK_SIZE), BLOCK_SIZE>>>(dqkv, dq, dk, dv, T, C, NH,
                                                                               head_elems);
    cuda_check(cudaGetLastError());
}

static void gelu_forward(float *out, const float *inp, size_t n) {
    if (n == 0) return;
    gelu_forward_kernel<<<blocks_for(n, BLOCK_SIZE), BLOCK_SIZE>>>(out, inp, n);
    cuda_check(cudaGetLastError());
}

static void gelu_backward(float *dinp, const float *inp, const float *dout, size_t n) {
    if (n == 0) return;
    gelu_backward_kernel<<<blocks_for(n, BLOCK_SIZE), BLOCK_SIZE>>>(dinp, inp, dout, n);
    cuda_check(cudaGetLastError());
}

static void residual_forward(float *out, const float *a, const float *b, size_t n) {
    if (n == 0) return;
    residual_forward_kernel<<<blocks_for(n, BLOCK_SIZE), BLOCK_SIZE>>>(out, a, b, n);
    cuda_check(cudaGetLastError());
}

static void residual_backward(float *da, float *db, const float *dout, size_t n) {
    if (n == 0) return;
    residual_backward_kernel<<<blocks_for(n, BLOCK_SIZE), BLOCK_SIZE>>>(da, db, dout, n);
    cuda_check(cudaGetLastError());
}

static void crossentropy_forward(float *losses, float *probs, const float *logits, const int *targets, int N,
                                 int V) {
    if (N == 0) return;
    crossentropy_forward_kernel<<<N, BLOCK_SIZE>>>(losses, probs, logits, targets, V);
    cuda_check(cudaGetLastError());
}

static void crossentropy_backward(float *dlogits, const float *probs, const int *targets, float dloss, int N,
                                  int V) {
    size_t total = (size_t)N * V;
    if (total == 0) return;
    crossentropy_backward_kernel<<<blocks_for(total, BLOCK_SIZE), BLOCK_SIZE>>>(dlogits, probs, targets,
                                                                                dloss, V, total);
    cuda_check(cudaGetLastError());
}

/* SUM_BLOCKS partial sums followed by the total, allocated on first use. */
static double *sum_squares_buffer = NULL;

static double sum_squares(const float *x, size_t n) {
    if (!sum_squares_buffer)
        sum_squares_buffer = (double *)mem_alloc(
            SPACE_DEVICE, CAT_WORKSPACE, (SUM_BLOCKS + 1) * sizeof(double), "sum_squares partial sums");
    double *partial = sum_squares_buffer, *total = sum_squares_buffer + SUM_BLOCKS;
    sum_squares_partial_kernel<<<SUM_BLOCKS, BLOCK_SIZE>>>(partial, x, n);
    cuda_check(cudaGetLastError());
    sum_squares_final_kernel<<<1, BLOCK_SIZE>>>(total, partial, SUM_BLOCKS);
    cuda_check(cudaGetLastError());
    double result = 0.0;
    cuda_check(cudaMemcpy(&result, total, sizeof(double), cudaMemcpyDeviceToHost));
    return result;
}

static void adamw_update(float *params, const float *grads, float *m, float *v, size_t n, float lr,
                         float beta1, float beta2, float eps, float weight_decay, float grad_scale, int t) {
    if (n == 0) return;
    float bias1 = 1.0f - powf(beta1, (float)t);
    float bias2 = 1.0f - powf(beta2, (float)t);
    adamw_update_kernel<<<blocks_for(n, BLOCK_SIZE), BLOCK_SIZE>>>(
        params, grads, m, v, n, lr, beta1, beta2, bias1, bias2, eps, weight_decay, grad_scale);
    cuda_check(cudaGetLastError());
}

static void fill_zero(float *x, size_t n) {
    cuda_check(cudaMemset(x, 0, n * sizeof(float)));
}

static void scale(float *x, size_t n, float factor) {
    if (n == 0) return;
    scale_kernel<<<blocks_for(n, BLOCK_SIZE), BLOCK_SIZE>>>(x, n, factor);
    cuda_check(cudaGetLastError());
}

extern "C" const KernelOps kernels_cuda = {
    .name = "cuda",
    .embedding_forward = embedding_forward,
    .embedding_backward = embedding_backward,
    .layernorm_forward = layernorm_forward,
    .layernorm_backward = layernorm_backward,
    .linear_forward = linear_forward,
    .linear_backward = linear_backward,
    .attention_forward = attention_forward,
    .attention_backward = attention_backward,
    .gelu_forward = gelu_forward,
    .gelu_backward = gelu_backward,
    .residual_forward = residual_forward,
    .residual_backward = residual_backward,
    .crossentropy_forward = crossentropy_forward,
    .crossentropy_backward = crossentropy_backward,
    .sum_squares = sum_squares,
    .adamw_update = adamw_update,
    .fill_zero = fill_zero,
    .scale = scale,
};
