/* kernels_cuda.cu: the CUDA backend of kernels.h (CUDA kernels, matmuls through cuBLAS).
 *
 * Mirrors kernels_cpu.c function for function: the same names, the same
 * order, the same formulas (and, where it is cheap, the same order of
 * floating-point additions), so the two agree far inside the 1e-4 that
 * tests/test_parity.c allows. What differs is how work is spread over threads:
 *   - elementwise kernels: one thread per element, size_t indices;
 *   - row kernels (layernorm): one warp per row, reduced with shuffles;
 *   - attention: fused tiles on tensor cores, in attention_cuda.cu (ring
 *     attention's blocks there too: one warp per row, plain fp32);
 *   - column sums (dbias, layernorm dweight/dbias): blocks of 32 columns by
 *     256 rows, each thread sums a fixed subset of rows, then fixed-order
 *     sums of the partial results;
 * No kernel uses atomics: every reduction has an order fixed by the shapes,
 * so a run is bit-identical each time on the same GPU (cuBLAS is too, with its
 * default settings), which the determinism and resume tests rely on.
 * All work (launches, cuBLAS, memsets, the one copy back in sum_squares) is
 * issued on compute_stream (cuda_common.cuh), so it runs in program order. */
#include "common/device/cuda_common.cuh" /* cuda_check, blocks_for, the streams */

#include "common/kernels/attention.h" /* attention's kernels and workspace */
#include "common/device/device.h" /* mem_alloc, copies, streams, timers */
#include "common/kernels/kernel_math.h" /* per-element formulas of both backends */
#include "common/kernels/kernels.h" /* ops(): the kernel table */

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
/* ...over chunks of this many rows, one block per (column tile, chunk). */
#define COLUMN_CHUNK_ROWS 256
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
 * dimension. */
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

/* embedding_forward on a slice of wte's rows: 0 where another rank holds the token's row */
static __global__ void embedding_forward_rows_kernel(float *out, const int *tokens, const float *wte,
                                                     const float *wpe, int T, int C, int first, int rows,
                                                     size_t total) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= total) return;
    size_t n = i / C;
    int c = (int)(i % C), t = (int)(n % T), row = tokens[n] - first;
    out[i] = row >= 0 && row < rows ? wte[(size_t)row * C + c] + wpe[(size_t)t * C + c] : 0.0f;
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
 * owner, so there is no race and no atomic, and the summation order is fixed.
 * The tokens are read in chunks of BLOCK_SIZE; each warp votes which of its 32
 * are v, and the matching positions are packed into a list (in order), so
 * that the sum runs over the list without a test per token: the loads of
 * several rows are then in flight at once, which matters for frequent bytes
 * (the space is about one token in six). A thread adds its channel in a
 * register and writes the row once. */
static __global__ void embedding_backward_wte_kernel(float *dwte, const float *dout, const int *tokens, int N,
                                                     int C, int first) {
    __shared__ int matches[BLOCK_SIZE];
    __shared__ int warp_counts[BLOCK_SIZE / WARP_SIZE];
    int v = blockIdx.x, lane = threadIdx.x % WARP_SIZE, warp = threadIdx.x / WARP_SIZE;
    float *row = dwte + (size_t)v * C;
    for (int c0 = 0; c0 < C; c0 += BLOCK_SIZE) { /* channels c0 .. c0 + BLOCK_SIZE - 1 */
        int c = c0 + threadIdx.x;
        float sum = 0.0f;
        for (int start = 0; start < N; start += BLOCK_SIZE) {
            int n = start + threadIdx.x;
            bool match = n < N && tokens[n] == v + first; /* row v of a slice starting at first */
            unsigned int ballot = __ballot_sync(0xffffffffu, match);
            if (lane == 0) warp_counts[warp] = __popc(ballot);
            __syncthreads();
            int before = 0, count = 0;
            for (int w = 0; w < BLOCK_SIZE / WARP_SIZE; w++) {
                before += w < warp ? warp_counts[w] : 0;
                count += warp_counts[w];
            }
            if (match) matches[before + __popc(ballot & ((1u << lane) - 1))] = n;
            __syncthreads();
            if (c < C)
#pragma unroll 4
                for (int j = 0; j < count; j++) sum += dout[(size_t)matches[j] * C + c];
            __syncthreads(); /* everyone is done with matches and warp_counts before they are overwritten */
        }
        if (c < C) row[c] += sum;
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

/* EXERCISE 01.1 BEGIN: layernorm backward (course.md, exercise 01.1) */
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
/* EXERCISE 01.1 END */

/* Column sums over N rows: dbias[c] += sum_n dout[n,c] (linear layers), and
 * for layernorm also dweight[c] += sum_n dout[n,c] * xhat[n,c], xhat = (inp -
 * mean) * rstd. Two passes, so that every SM has work even when C is small
 * (C = 768 gives 24 column tiles) and N large:
 *   1. block (column tile, row chunk): thread (x, y) sums, in double, rows
 *      y, y + 16, ... of its chunk of COLUMN_CHUNK_ROWS rows in column x (a
 *      warp reads 32 neighbouring floats: coalesced); row y = 0 adds the 16
 *      sums in order and writes the chunk's partial sum;
 *   2. one thread per column adds the chunks' partial sums in order.
 * No atomics: the order of every addition is fixed by the shapes. */
static __global__ void column_partials_kernel(double *partial_w, double *partial_b, const float *dout,
                                              const float *inp, const float *mean, const float *rstd, int N,
                                              int C) {
    __shared__ double w_part[COLUMN_ROW_GROUPS][COLUMN_TILE];
    __shared__ double b_part[COLUMN_ROW_GROUPS][COLUMN_TILE];
    int c = blockIdx.x * COLUMN_TILE + threadIdx.x, chunk = blockIdx.y;
    int first = chunk * COLUMN_CHUNK_ROWS, end = min(N, first + COLUMN_CHUNK_ROWS);
    double w = 0.0, b = 0.0;
    if (c < C)
        for (int n = first + threadIdx.y; n < end; n += COLUMN_ROW_GROUPS) {
            size_t i = (size_t)n * C + c;
            float g = dout[i];
            if (inp) w += (double)g * (inp[i] - mean[n]) * rstd[n];
            b += g;
        }
    w_part[threadIdx.y][threadIdx.x] = w;
    b_part[threadIdx.y][threadIdx.x] = b;
    __syncthreads();
    if (threadIdx.y == 0 && c < C) {
        double w_total = 0.0, b_total = 0.0;
        for (int r = 0; r < COLUMN_ROW_GROUPS; r++) {
            w_total += w_part[r][threadIdx.x];
            b_total += b_part[r][threadIdx.x];
        }
        if (inp) partial_w[(size_t)chunk * C + c] = w_total;
        partial_b[(size_t)chunk * C + c] = b_total;
    }
}

static __global__ void column_partials_add_kernel(float *out_w, float *out_b, const double *partial_w,
                                                  const double *partial_b, int chunks, int C) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    double w = 0.0, b = 0.0;
    for (int k = 0; k < chunks; k++) {
        if (out_w) w += partial_w[(size_t)k * C + c];
        b += partial_b[(size_t)k * C + c];
    }
    if (out_w) out_w[c] += (float)w;
    out_b[c] += (float)b;
}

/* out[n,o] += bias[o], one thread per element */
static __global__ void add_bias_kernel(float *out, const float *bias, int OC, size_t total) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= total) return;
    out[i] += bias[i % OC];
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

/* ---- a mixture of experts: one thread per element of a token's row (kernels.h) ---- */

static __global__ void moe_gather_kernel(float *out, const float *inp, const int *src, int R, int C) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)R * C) return;
    size_t row = i / C, c = i % C;
    out[i] = inp[(size_t)src[row] * C + c];
}

/* Each output element sums its token's slots in k order: no atomics, the CPU's bits. */
static __global__ void moe_scatter_add_kernel(float *dinp, const float *dout, const int *pos, int N, int K,
                                              int C) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)N * C) return;
    size_t n = i / C, c = i % C;
    float acc = dinp[i];
    for (int k = 0; k < K; k++) {
        int row = pos[n * K + k];
        if (row >= 0) acc += dout[(size_t)row * C + c];
    }
    dinp[i] = acc;
}

static __global__ void moe_combine_kernel(float *out, const float *y, const int *pos, const float *gate, int N,
                                          int K, int C) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)N * C) return;
    size_t n = i / C, c = i % C;
    float acc = 0.0f;
    for (int k = 0; k < K; k++) {
        int row = pos[n * K + k];
        if (row >= 0) acc += gate[n * K + k] * y[(size_t)row * C + c];
    }
    out[i] = acc;
}

/* dy: one thread per element of a slot's row (each row is one slot's: no two threads
 * write the same element). */
static __global__ void moe_combine_dy_kernel(float *dy, const float *dout, const int *pos, const float *gate,
                                             int N, int K, int C) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)N * K * C) return;
    size_t slot = i / C, c = i % C, n = slot / K;
    int row = pos[slot];
    if (row >= 0) dy[(size_t)row * C + c] += gate[slot] * dout[n * C + c];
}

/* dgate: one block per slot, a dot product of C elements (in double, then rounded once). */
static __global__ void moe_combine_dgate_kernel(float *dgate, const float *dout, const float *y, const int *pos,
                                                int K, int C) {
    size_t slot = blockIdx.x, n = slot / K;
    int row = pos[slot];
    if (row < 0) return; /* the whole block leaves together */
    double dot = 0.0;
    for (int c = threadIdx.x; c < C; c += blockDim.x) dot += (double)dout[n * C + c] * y[(size_t)row * C + c];
    dot = block_sum(dot);
    if (threadIdx.x == 0) dgate[slot] += (float)dot;
}

/* One block per row n: max, exp and sum (in double), normalise, loss. */
static __global__ void crossentropy_forward_kernel(float *losses, float *probs, const float *logits,
                                                   const int *targets, int V, int Vp) {
    size_t n = blockIdx.x;
    const float *z = logits + n * Vp;
    float *p = probs + n * Vp;
    for (int v = V + threadIdx.x; v < Vp; v += blockDim.x) p[v] = 0.0f; /* padded rows: never predicted */
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

/* The cross-entropy from a slice of the logits (kernels.h), one block per row. */
static __global__ void crossentropy_slice_max_kernel(float *row_max, const float *logits, int cols, int Vl) {
    size_t n = blockIdx.x;
    const float *z = logits + n * Vl;
    float maxval = -INFINITY;
    for (int v = threadIdx.x; v < cols; v += blockDim.x) maxval = fmaxf(maxval, z[v]);
    maxval = block_max(maxval);
    if (threadIdx.x == 0) row_max[n] = maxval;
}

/* EXERCISE 03.4 BEGIN: the vocabulary-parallel cross-entropy (course.md, exercise 03.4) */
static __global__ void crossentropy_slice_sums_kernel(float *sums, float *row_max, const float *maxes,
                                                      int parts, const float *logits, const int *targets,
                                                      int N, int cols, int Vl, int first) {
    size_t n = blockIdx.x;
    const float *z = logits + n * Vl;
    float maxval = -INFINITY;
    for (int p = 0; p < parts; p++) maxval = fmaxf(maxval, maxes[(size_t)p * N + n]);
    double sum = 0.0;
    for (int v = threadIdx.x; v < cols; v += blockDim.x) sum += expf(z[v] - maxval);
    sum = block_sum(sum);
    if (threadIdx.x == 0) {
        int target = targets[n] - first;
        row_max[n] = maxval;
        sums[n] = (float)sum;
        sums[N + n] = target >= 0 && target < cols ? z[target] - maxval : 0.0f;
    }
}

static __global__ void crossentropy_slice_finish_kernel(float *losses, float *probs, const float *logits,
                                                        const float *row_max, const float *sums, int N,
                                                        int cols, int Vl) {
    size_t n = blockIdx.x;
    const float *z = logits + n * Vl;
    float *p = probs + n * Vl;
    double sum = sums[n];
    float inv = (float)(1.0 / sum), maxval = row_max[n];
    for (int v = threadIdx.x; v < Vl; v += blockDim.x) p[v] = v < cols ? expf(z[v] - maxval) * inv : 0.0f;
    if (threadIdx.x == 0) losses[n] = (float)(log(sum) - sums[N + n]);
}

static __global__ void crossentropy_backward_rows_kernel(float *dlogits, const float *probs, const int *targets,
                                                         float dloss, int Vl, int first, size_t total) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= total) return;
    size_t n = i / Vl;
    int v = (int)(i % Vl);
    dlogits[i] += (probs[i] - (v + first == targets[n] ? 1.0f : 0.0f)) * dloss;
}
/* EXERCISE 03.4 END */

/* Pass 1: SUM_BLOCKS blocks stride over x, each leaving one partial sum. */
/* Of x when given, else of the 16-bit h. */
static __global__ void sum_squares_partial_kernel(double *partial, const float *x, const uint16_t *h,
                                                  size_t n, HalfFormat format) {
    double s = 0.0;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        s += square_at(x, h, i, format);
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
    if (i < n)
        adamw_element(&params[i], grads[i], &m[i], &v[i], lr, beta1, beta2, bias1, bias2, eps, weight_decay,
                      grad_scale);
}

/* The conversions are half.h's, the very functions the CPU calls. */
static __global__ void cast_to_half_kernel(uint16_t *out, const float *inp, size_t n, HalfFormat format) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = half_from_float(inp[i], format);
}

static __global__ void cast_from_half_kernel(float *out, const uint16_t *inp, size_t n, HalfFormat format) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = half_to_float(inp[i], format);
}

static __global__ void accumulate_half_kernel(uint16_t *acc, const float *add, size_t n, HalfFormat format) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) acc[i] = half_from_float(half_to_float(acc[i], format) + add[i], format);
}

static __global__ void adamw_update_half_kernel(float *master, uint16_t *params, const uint16_t *grads,
                                                float *m, float *v, size_t n, float lr, float beta1,
                                                float beta2, float bias1, float bias2, float eps,
                                                float weight_decay, float grad_scale, HalfFormat format) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        params[i] = adamw_half_element(&master[i], grads[i], &m[i], &v[i], lr, beta1, beta2, bias1, bias2,
                                       eps, weight_decay, grad_scale, format);
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
    embedding_forward_kernel<<<blocks_for(total, BLOCK_SIZE), BLOCK_SIZE, 0, compute_stream>>>(
        out, tokens, wte, wpe, T, C, total);
    cuda_check(cudaGetLastError());
}

static void embedding_backward(float *dwte, float *dwpe, const float *dout, const int *tokens, int B, int T,
                               int C, int V) {
    if ((size_t)B * T * C == 0) return;
    embedding_backward_wpe_kernel<<<blocks_for((size_t)T * C, BLOCK_SIZE), BLOCK_SIZE, 0, compute_stream>>>(
        dwpe, dout, B, T, C);
    cuda_check(cudaGetLastError());
    if (V == 0) return;
    embedding_backward_wte_kernel<<<V, BLOCK_SIZE, 0, compute_stream>>>(dwte, dout, tokens, B * T, C, 0);
    cuda_check(cudaGetLastError());
}

static void embedding_forward_rows(float *out, const int *tokens, const float *wte, const float *wpe, int B,
                                   int T, int C, int first, int rows) {
    size_t total = (size_t)B * T * C;
    if (total == 0) return;
    embedding_forward_rows_kernel<<<blocks_for(total, BLOCK_SIZE), BLOCK_SIZE, 0, compute_stream>>>(
        out, tokens, wte, wpe, T, C, first, rows, total);
    cuda_check(cudaGetLastError());
}

static void embedding_backward_rows(float *dwte, float *dwpe, const float *dout, const int *tokens, int B,
                                    int T, int C, int first, int rows) {
    if ((size_t)B * T * C == 0) return;
    embedding_backward_wpe_kernel<<<blocks_for((size_t)T * C, BLOCK_SIZE), BLOCK_SIZE, 0, compute_stream>>>(
        dwpe, dout, B, T, C);
    cuda_check(cudaGetLastError());
    if (rows == 0) return;
    embedding_backward_wte_kernel<<<rows, BLOCK_SIZE, 0, compute_stream>>>(dwte, dout, tokens, B * T, C,
                                                                            first);
    cuda_check(cudaGetLastError());
}

/* The chunks' partial sums (two per column and chunk), grown on demand. */
static double *column_partials = NULL;
static size_t column_partials_bytes = 0;

/* out_b[c] += column sums of dout (N,C); with inp, also out_w[c] += column sums of dout * xhat. */
static void column_sums(float *out_w, float *out_b, const float *dout, const float *inp, const float *mean,
                        const float *rstd, int N, int C) {
    int chunks = (N + COLUMN_CHUNK_ROWS - 1) / COLUMN_CHUNK_ROWS;
    size_t bytes = 2 * (size_t)chunks * C * sizeof(double);
    if (bytes > column_partials_bytes) {
        mem_free(column_partials);
        column_partials = (double *)mem_alloc(SPACE_DEVICE, CAT_WORKSPACE, bytes, "column sums partials");
        column_partials_bytes = bytes;
    }
    double *partial_w = column_partials, *partial_b = column_partials + (size_t)chunks * C;
    dim3 grid(blocks_for(C, COLUMN_TILE), chunks), block(COLUMN_TILE, COLUMN_ROW_GROUPS);
    column_partials_kernel<<<grid, block, 0, compute_stream>>>(partial_w, partial_b, dout, inp, mean, rstd, N,
                                                               C);
    cuda_check(cudaGetLastError());
    column_partials_add_kernel<<<blocks_for(C, BLOCK_SIZE), BLOCK_SIZE, 0, compute_stream>>>(
        out_w, out_b, partial_w, partial_b, chunks, C);
    cuda_check(cudaGetLastError());
}

static void layernorm_forward(float *out, float *mean, float *rstd, const float *inp, const float *weight,
                              const float *bias, int N, int C) {
    if (N == 0) return;
    layernorm_forward_kernel<<<blocks_for(N, ROWS_PER_BLOCK), BLOCK_SIZE, 0, compute_stream>>>(
        out, mean, rstd, inp, weight, bias, N, C);
    cuda_check(cudaGetLastError());
}

static void layernorm_backward(float *dinp, float *dweight, float *dbias, const float *dout, const float *inp,
                               const float *weight, const float *mean, const float *rstd, int N, int C) {
    /* EXERCISE 01.1 BEGIN: layernorm backward (course.md, exercise 01.1) */
    if (N == 0 || C == 0) return;
    layernorm_backward_dinp_kernel<<<blocks_for(N, ROWS_PER_BLOCK), BLOCK_SIZE, 0, compute_stream>>>(
        dinp, dout, inp, weight, mean, rstd, N, C);
    cuda_check(cudaGetLastError());
    column_sums(dweight, dbias, dout, inp, mean, rstd, N, C);
    /* EXERCISE 01.1 END */
}

static void linear_forward(float *out, const float *inp, const float *weight, const float *bias, int N, int C,
                           int OC) {
    /* out(N,OC) = inp(N,C) @ weight(OC,C)^T */
    sgemm_rowmajor(false, true, N, OC, C, 1.0f, inp, C, weight, C, 0.0f, out, OC);
    size_t total = (size_t)N * OC;
    if (bias && total > 0) {
        add_bias_kernel<<<blocks_for(total, BLOCK_SIZE), BLOCK_SIZE, 0, compute_stream>>>(out, bias, OC,
                                                                                          total);
        cuda_check(cudaGetLastError());
    }
}

static void linear_backward_input(float *dinp, const float *dout, const float *weight, int N, int C, int OC) {
    /* dinp(N,C) += dout(N,OC) @ weight(OC,C) */
    sgemm_rowmajor(false, false, N, C, OC, 1.0f, dout, OC, weight, C, 1.0f, dinp, C);
}

static void linear_backward_weight(float *dweight, float *dbias, const float *dout, const float *inp, int N,
                                   int C, int OC) {
    /* dweight(OC,C) += dout^T(OC,N) @ inp(N,C) */
    sgemm_rowmajor(true, false, OC, C, N, 1.0f, dout, OC, inp, C, 1.0f, dweight, C);
    if (dbias && OC > 0 && N > 0) column_sums(NULL, dbias, dout, NULL, NULL, NULL, N, OC);
}

static void linear_backward(float *dinp, float *dweight, float *dbias, const float *dout, const float *inp,
                            const float *weight, int N, int C, int OC) {
    linear_backward_input(dinp, dout, weight, N, C, OC);
    linear_backward_weight(dweight, dbias, dout, inp, N, C, OC);
}

/* ---- matmuls with 16-bit inputs: the two inputs of a GEMM rounded into
 * 16-bit workspaces (grown on demand), multiplied by cublasGemmEx on tensor
 * cores with fp32 accumulation (CUBLAS_COMPUTE_32F) into an fp32 result. */
static uint16_t *half_operand[2] = {NULL, NULL};
static size_t half_operand_elems[2] = {0, 0};

static const uint16_t *half_operand_of(int slot, const float *a, size_t count, HalfFormat format) {
    if (count > half_operand_elems[slot]) {
        mem_free(half_operand[slot]);
        half_operand[slot] = (uint16_t *)mem_alloc(SPACE_DEVICE, CAT_WORKSPACE, count * sizeof(uint16_t),
                                                   "16-bit matmul operand");
        half_operand_elems[slot] = count;
    }
    if (count > 0) {
        cast_to_half_kernel<<<blocks_for(count, BLOCK_SIZE), BLOCK_SIZE, 0, compute_stream>>>(
            half_operand[slot], a, count, format);
        cuda_check(cudaGetLastError());
    }
    return half_operand[slot];
}

/* sgemm_rowmajor's contract with A (a_count elements) and B (b_count) rounded to `format`, alpha 1. */
static void gemm_half_rowmajor(bool trans_a, bool trans_b, int M, int N, int K, const float *A,
                               size_t a_count, int lda, const float *B, size_t b_count, int ldb, float beta,
                               float *Cm, int ldc, HalfFormat format) {
    const uint16_t *a = half_operand_of(0, A, a_count, format), *b = half_operand_of(1, B, b_count, format);
    cudaDataType type = format == HALF_BF16 ? CUDA_R_16BF : CUDA_R_16F;
    float alpha = 1.0f;
    cublas_check(cublasGemmEx(cublas_handle, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N,
                              trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, N, M, K, &alpha, b, type, ldb, a, type,
                              lda, &beta, Cm, CUDA_R_32F, ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

static void linear_forward_half(float *out, const float *inp, const float *weight, const float *bias, int N,
                                int C, int OC, HalfFormat format) {
    size_t NC = (size_t)N * C, OCC = (size_t)OC * C, total = (size_t)N * OC;
    gemm_half_rowmajor(false, true, N, OC, C, inp, NC, C, weight, OCC, C, 0.0f, out, OC, format);
    if (bias && total > 0) {
        add_bias_kernel<<<blocks_for(total, BLOCK_SIZE), BLOCK_SIZE, 0, compute_stream>>>(out, bias, OC,
                                                                                          total);
        cuda_check(cudaGetLastError());
    }
}

static void linear_backward_input_half(float *dinp, const float *dout, const float *weight, int N, int C,
                                       int OC, HalfFormat format) {
    size_t NOC = (size_t)N * OC, OCC = (size_t)OC * C;
    gemm_half_rowmajor(false, false, N, C, OC, dout, NOC, OC, weight, OCC, C, 1.0f, dinp, C, format);
}

static void linear_backward_weight_half(float *dweight, float *dbias, const float *dout, const float *inp,
                                        int N, int C, int OC, HalfFormat format) {
    size_t NC = (size_t)N * C, NOC = (size_t)N * OC;
    gemm_half_rowmajor(true, false, OC, C, N, dout, NOC, OC, inp, NC, C, 1.0f, dweight, C, format);
    if (dbias && OC > 0 && N > 0) column_sums(NULL, dbias, dout, NULL, NULL, NULL, N, OC);
}

static void linear_backward_half(float *dinp, float *dweight, float *dbias, const float *dout,
                                 const float *inp, const float *weight, int N, int C, int OC,
                                 HalfFormat format) {
    linear_backward_input_half(dinp, dout, weight, N, C, OC, format);
    linear_backward_weight_half(dweight, dbias, dout, inp, N, C, OC, format);
}

static void gelu_forward(float *out, const float *inp, size_t n) {
    if (n == 0) return;
    gelu_forward_kernel<<<blocks_for(n, BLOCK_SIZE), BLOCK_SIZE, 0, compute_stream>>>(out, inp, n);
    cuda_check(cudaGetLastError());
}

static void gelu_backward(float *dinp, const float *inp, const float *dout, size_t n) {
    if (n == 0) return;
    gelu_backward_kernel<<<blocks_for(n, BLOCK_SIZE), BLOCK_SIZE, 0, compute_stream>>>(dinp, inp, dout, n);
    cuda_check(cudaGetLastError());
}

static void residual_forward(float *out, const float *a, const float *b, size_t n) {
    if (n == 0) return;
    residual_forward_kernel<<<blocks_for(n, BLOCK_SIZE), BLOCK_SIZE, 0, compute_stream>>>(out, a, b, n);
    cuda_check(cudaGetLastError());
}

static void residual_backward(float *da, float *db, const float *dout, size_t n) {
    if (n == 0) return;
    residual_backward_kernel<<<blocks_for(n, BLOCK_SIZE), BLOCK_SIZE, 0, compute_stream>>>(da, db, dout, n);
    cuda_check(cudaGetLastError());
}

static void moe_gather(float *out, const float *inp, const int *src, int R, int C) {
    size_t n = (size_t)R * C;
    if (n == 0) return;
    moe_gather_kernel<<<blocks_for(n, BLOCK_SIZE), BLOCK_SIZE, 0, compute_stream>>>(out, inp, src, R, C);
    cuda_check(cudaGetLastError());
}

static void moe_scatter_add(float *dinp, const float *dout, const int *pos, int N, int K, int C) {
    size_t n = (size_t)N * C;
    if (n == 0) return;
    moe_scatter_add_kernel<<<blocks_for(n, BLOCK_SIZE), BLOCK_SIZE, 0, compute_stream>>>(dinp, dout, pos, N, K,
                                                                                          C);
    cuda_check(cudaGetLastError());
}

static void moe_combine(float *out, const float *y, const int *pos, const float *gate, int N, int K, int C) {
    size_t n = (size_t)N * C;
    if (n == 0) return;
    moe_combine_kernel<<<blocks_for(n, BLOCK_SIZE), BLOCK_SIZE, 0, compute_stream>>>(out, y, pos, gate, N, K,
                                                                                      C);
    cuda_check(cudaGetLastError());
}

static void moe_combine_backward(float *dy, float *dgate, const float *dout, const float *y, const int *pos,
                                 const float *gate, int N, int K, int C) {
    size_t n = (size_t)N * K * C;
    if (n == 0) return;
    moe_combine_dy_kernel<<<blocks_for(n, BLOCK_SIZE), BLOCK_SIZE, 0, compute_stream>>>(dy, dout, pos, gate, N,
                                                                                         K, C);
    cuda_check(cudaGetLastError());
    moe_combine_dgate_kernel<<<(unsigned)((size_t)N * K), BLOCK_SIZE, 0, compute_stream>>>(dgate, dout, y, pos,
                                                                                           K, C);
    cuda_check(cudaGetLastError());
}

static void crossentropy_forward(float *losses, float *probs, const float *logits, const int *targets, int N,
                                 int V, int Vp) {
    if (N == 0) return;
    crossentropy_forward_kernel<<<N, BLOCK_SIZE, 0, compute_stream>>>(losses, probs, logits, targets, V, Vp);
    cuda_check(cudaGetLastError());
}

static void crossentropy_slice_max(float *row_max, const float *logits, int N, int cols, int Vl) {
    if (N == 0) return;
    crossentropy_slice_max_kernel<<<N, BLOCK_SIZE, 0, compute_stream>>>(row_max, logits, cols, Vl);
    cuda_check(cudaGetLastError());
}

static void crossentropy_slice_sums(float *sums, float *row_max, const float *maxes, int parts,
                                    const float *logits, const int *targets, int N, int cols, int Vl,
                                    int first) {
    /* EXERCISE 03.4 BEGIN: the vocabulary-parallel cross-entropy (course.md, exercise 03.4) */
    if (N == 0) return;
    crossentropy_slice_sums_kernel<<<N, BLOCK_SIZE, 0, compute_stream>>>(sums, row_max, maxes, parts, logits,
                                                                          targets, N, cols, Vl, first);
    cuda_check(cudaGetLastError());
    /* EXERCISE 03.4 END */
}

static void crossentropy_slice_finish(float *losses, float *probs, const float *logits, const float *row_max,
                                      const float *sums, int N, int cols, int Vl) {
    /* EXERCISE 03.4 BEGIN: the vocabulary-parallel cross-entropy (course.md, exercise 03.4) */
    if (N == 0) return;
    crossentropy_slice_finish_kernel<<<N, BLOCK_SIZE, 0, compute_stream>>>(losses, probs, logits, row_max,
                                                                            sums, N, cols, Vl);
    cuda_check(cudaGetLastError());
    /* EXERCISE 03.4 END */
}

static void crossentropy_backward_rows(float *dlogits, const float *probs, const int *targets, float dloss,
                                       int N, int Vl, int first) {
    /* EXERCISE 03.4 BEGIN: the vocabulary-parallel cross-entropy (course.md, exercise 03.4) */
    size_t total = (size_t)N * Vl;
    if (total == 0) return;
    crossentropy_backward_rows_kernel<<<blocks_for(total, BLOCK_SIZE), BLOCK_SIZE, 0, compute_stream>>>(
        dlogits, probs, targets, dloss, Vl, first, total);
    cuda_check(cudaGetLastError());
    /* EXERCISE 03.4 END */
}

static void crossentropy_backward(float *dlogits, const float *probs, const int *targets, float dloss, int N,
                                  int V) {
    size_t total = (size_t)N * V;
    if (total == 0) return;
    crossentropy_backward_kernel<<<blocks_for(total, BLOCK_SIZE), BLOCK_SIZE, 0, compute_stream>>>(
        dlogits, probs, targets, dloss, V, total);
    cuda_check(cudaGetLastError());
}

/* SUM_BLOCKS partial sums followed by the total, allocated on first use. */
static double *sum_squares_buffer = NULL;

/* Of x(n) when given, else of the 16-bit h(n). */
static double two_pass_sum_squares(const float *x, const uint16_t *h, size_t n, HalfFormat format) {
    if (!sum_squares_buffer)
        sum_squares_buffer = (double *)mem_alloc(
            SPACE_DEVICE, CAT_WORKSPACE, (SUM_BLOCKS + 1) * sizeof(double), "sum_squares partial sums");
    double *partial = sum_squares_buffer, *total = sum_squares_buffer + SUM_BLOCKS;
    sum_squares_partial_kernel<<<SUM_BLOCKS, BLOCK_SIZE, 0, compute_stream>>>(partial, x, h, n, format);
    cuda_check(cudaGetLastError());
    sum_squares_final_kernel<<<1, BLOCK_SIZE, 0, compute_stream>>>(total, partial, SUM_BLOCKS);
    cuda_check(cudaGetLastError());
    double result = 0.0;
    cuda_check(cudaMemcpyAsync(&result, total, sizeof(double), cudaMemcpyDeviceToHost, compute_stream));
    cuda_check(cudaStreamSynchronize(compute_stream));
    return result;
}

static double sum_squares(const float *x, size_t n) {
    return two_pass_sum_squares(x, NULL, n, HALF_BF16);
}

static void adamw_update(float *params, const float *grads, float *m, float *v, size_t n, float lr,
                         float beta1, float beta2, float eps, float weight_decay, float grad_scale, int t) {
    if (n == 0) return;
    float bias1 = 1.0f - powf(beta1, (float)t);
    float bias2 = 1.0f - powf(beta2, (float)t);
    adamw_update_kernel<<<blocks_for(n, BLOCK_SIZE), BLOCK_SIZE, 0, compute_stream>>>(
        params, grads, m, v, n, lr, beta1, beta2, bias1, bias2, eps, weight_decay, grad_scale);
    cuda_check(cudaGetLastError());
}

static void fill_zero(float *x, size_t n) {
    cuda_check(cudaMemsetAsync(x, 0, n * sizeof(float), compute_stream));
}

static void scale(float *x, size_t n, float factor) {
    if (n == 0) return;
    scale_kernel<<<blocks_for(n, BLOCK_SIZE), BLOCK_SIZE, 0, compute_stream>>>(x, n, factor);
    cuda_check(cudaGetLastError());
}

static void cast_to_half(uint16_t *out, const float *inp, size_t n, HalfFormat format) {
    if (n == 0) return;
    cast_to_half_kernel<<<blocks_for(n, BLOCK_SIZE), BLOCK_SIZE, 0, compute_stream>>>(out, inp, n, format);
    cuda_check(cudaGetLastError());
}

static void cast_from_half(float *out, const uint16_t *inp, size_t n, HalfFormat format) {
    if (n == 0) return;
    cast_from_half_kernel<<<blocks_for(n, BLOCK_SIZE), BLOCK_SIZE, 0, compute_stream>>>(out, inp, n, format);
    cuda_check(cudaGetLastError());
}

static void accumulate_half(uint16_t *acc, const float *add, size_t n, HalfFormat format) {
    if (n == 0) return;
    accumulate_half_kernel<<<blocks_for(n, BLOCK_SIZE), BLOCK_SIZE, 0, compute_stream>>>(acc, add, n, format);
    cuda_check(cudaGetLastError());
}

static double sum_squares_half(const uint16_t *x, size_t n, HalfFormat format) {
    return two_pass_sum_squares(NULL, x, n, format);
}

static void adamw_update_half(float *master, uint16_t *params, const uint16_t *grads, float *m, float *v,
                              size_t n, float lr, float beta1, float beta2, float eps, float weight_decay,
                              float grad_scale, int t, HalfFormat format) {
    if (n == 0) return;
    float bias1 = 1.0f - powf(beta1, (float)t);
    float bias2 = 1.0f - powf(beta2, (float)t);
    adamw_update_half_kernel<<<blocks_for(n, BLOCK_SIZE), BLOCK_SIZE, 0, compute_stream>>>(
        master, params, grads, m, v, n, lr, beta1, beta2, bias1, bias2, eps, weight_decay, grad_scale,
        format);
    cuda_check(cudaGetLastError());
}

static void fill_zero_half(uint16_t *x, size_t n) {
    cuda_check(cudaMemsetAsync(x, 0, n * sizeof(uint16_t), compute_stream));
}

/* The buffers grown on demand: attention's row sums, column sums' and
 * sum_squares' partials, the 16-bit matmul operands. */
static void release_workspaces(void) {
    attention_release_cuda();
    mem_free(column_partials);
    column_partials = NULL;
    column_partials_bytes = 0;
    mem_free(sum_squares_buffer);
    sum_squares_buffer = NULL;
    for (int slot = 0; slot < 2; slot++) {
        mem_free(half_operand[slot]);
        half_operand[slot] = NULL;
        half_operand_elems[slot] = 0;
    }
}

extern "C" const KernelOps kernels_cuda = {
    .name = "cuda",
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
    .attention_forward = attention_forward_cuda,
    .attention_backward = attention_backward_cuda,
    .attention_block_forward = attention_block_forward_cuda,
    .attention_merge = attention_merge_cuda,
    .attention_block_backward = attention_block_backward_cuda,
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
