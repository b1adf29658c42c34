/* attention_cpu.c: causal self-attention on the CPU, tiled so that no (T,T)
 * matrix is ever stored (kernels.h states the contract, attention.h the names;
 * attention_cuda.cu is the GPU twin).
 *
 * What is tiled. For one sequence b and head h the scores are
 * x = q k^T / sqrt(hs), a (T,T) matrix of which the causal mask keeps the
 * lower triangle. Instead of building all of it, each (b, h) walks its queries
 * in tiles of ATTENTION_TILE = 64 rows. The tile of queries [t0, t1) sees only
 * keys 0 .. t1-1, so its scores are a (t1 - t0) x t1 block: one matrix product
 * makes the block, the softmax finishes it row by row, a second product turns
 * it into the tile's rows of out, and the next tile overwrites it.
 *
 * Why memory is O(tile x T) per thread. A thread works on one (b, h) and one
 * tile at a time, so it needs 64 x T floats of scores (two such blocks in
 * backward), whatever B and NH are. Saving the probabilities for backward
 * instead costs B x NH x T x T floats per block, the only activation that
 * grows with the square of the sequence length.
 *
 * What lse is, and how backward uses it. Forward keeps one number per query
 * row t: lse[t] = log(sum over keys j <= t of exp(x[t][j])), computed stably
 * as max + log(sum exp(x - max)). Any probability is then
 *     p[t][j] = exp(x[t][j] - lse[t])        (never above 1: no max needed)
 * so backward recomputes a tile's scores with the same product as forward
 * and has its probabilities back. The softmax backward needs one more number
 * per row, D[t] = sum_j p[t][j] dp[t][j] with dp = dout v^T; because
 * out[t] = sum_j p[t][j] v[j], that is D[t] = dot(dout[t], out[t]), a dot
 * product of width hs with the forward's saved output. Then
 *     ds[t][j] = p[t][j] (dp[t][j] - D[t]) / sqrt(hs)     (0 for j > t)
 *     dq += ds k,   dk += ds^T q,   dv += p^T dout.
 * This is the flash-attention recipe (Dao et al., 2022): pay one more q k^T
 * product per tile in backward to keep B x NH x T floats instead of
 * B x NH x T x T.
 *
 * Threads and determinism. The (b, h) pairs are split over OpenMP threads
 * (static schedule). A pair writes only head h's columns of sequence b (of
 * out, lse and dqkv), so pairs never collide. Its products are BLAS calls on
 * strided views of qkv (leading dimension 3C, no copies) that run
 * single-threaded inside the parallel loop (OpenBLAS's OpenMP build does so
 * in a parallel region). Every sum therefore has an order fixed by the
 * shapes, and results do not depend on the number of threads. */
#include "common/kernels/attention.h" /* attention's kernels and workspace */
#include "common/device/device.h" /* mem_alloc, copies, streams, timers */
#include "common/kernels/simd_cpu.h" /* the CPU kernels' vector helpers */
#include "common/core/util.h" /* fatal, log_info, exit codes, flag parsing */

#include <cblas.h>
#include <math.h>
#include <omp.h>

/* One allocation holds every thread's blocks: thread i owns the floats
 * [i * per_thread, (i + 1) * per_thread), per_thread = 2 x ATTENTION_TILE x T
 * (forward uses the first half). It grows when a call needs more (a longer T,
 * more threads) and is kept between calls, so a training step allocates
 * nothing; attention_release_cpu() frees it. One host thread at a time may
 * call the attention functions (the OpenMP threads inside share this block). */
static float *workspace;
static size_t workspace_floats;

static size_t floats_per_thread(int T) {
    return (size_t)2 * ATTENTION_TILE * T;
}

size_t attention_workspace_bytes_cpu(int T, int threads) {
    return (size_t)threads * floats_per_thread(T) * sizeof(float);
}

static float *workspace_for(int T) {
    size_t need = attention_workspace_bytes_cpu(T, omp_get_max_threads()) / sizeof(float);
    if (need > workspace_floats) {
        mem_free(workspace);
        workspace = mem_alloc(cpu_kernel_space(), CAT_WORKSPACE, need * sizeof(float), "attention workspace");
        workspace_floats = need;
    }
    return workspace;
}

void attention_workspace_grow_cpu(int rows) {
    workspace_for(rows);
}

void attention_release_cpu(void) {
    mem_free(workspace);
    workspace = NULL;
    workspace_floats = 0;
}

/* Query rows [t0, t0 + tile_rows(t0, T)) form one tile. */
static int tile_rows(int t0, int T) {
    return T - t0 < ATTENTION_TILE ? T - t0 : ATTENTION_TILE;
}

/* One row of a tile's scores x (keys floats, the first `valid` of them not
 * masked) becomes its probabilities, 0 for the masked ones; returns the row's
 * lse = log(sum exp(x)), computed as max + log(sum exp(x - max)). */
CPU_VECTOR_CLONES static float softmax_row(float *row, int valid, int keys) {
    float maxval = -INFINITY;
#pragma omp simd reduction(max : maxval)
    for (int j = 0; j < valid; j++) maxval = row[j] > maxval ? row[j] : maxval;
    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
    for (int j = 0; j < valid; j++) {
        row[j] = vexpf(row[j] - maxval);
        sum += row[j];
    }
    float inv_sum = 1.0f / sum;
    for (int j = 0; j < valid; j++) row[j] *= inv_sum;
    for (int j = valid; j < keys; j++) row[j] = 0.0f;
    return maxval + logf(sum);
}

/* One row of backward: p_row holds the scores x again and becomes the
 * probabilities p = exp(x - lse); ds_row holds dp = dout v^T and becomes
 * ds = p (dp - D) scale, with D = dot(dout, out) over the head's hs columns
 * (g_row, o_row). Masked keys get 0 in both. */
CPU_VECTOR_CLONES static void softmax_backward_row(float *p_row, float *ds_row, const float *g_row,
                                                   const float *o_row, int hs, float lse, float scale,
                                                   int valid, int keys) {
    float D = 0.0f;
#pragma omp simd reduction(+ : D)
    for (int i = 0; i < hs; i++) D += g_row[i] * o_row[i];
    for (int j = 0; j < valid; j++) {
        p_row[j] = vexpf(p_row[j] - lse);
        ds_row[j] = p_row[j] * (ds_row[j] - D) * scale;
    }
    for (int j = valid; j < keys; j++) p_row[j] = ds_row[j] = 0.0f;
}

/* The queries of a block, `rows` of them per sequence at q (rows of qkv:
 * stride 3C, T rows per sequence), against `rows` keys and values at kv
 * (stride kv_stride: 3C inside qkv, 2C in ring attention's k | v buffers; v
 * C floats after k). causal: query r sees keys 0..r; else all of them.
 * Writes out and lse (laid out as (B,T,C) and (B,NH,T), at the block's
 * first row). */
static void forward_tiles(float *out, float *lse, const float *q, const float *kv, int kv_stride, int B,
                          int T, int rows, int C, int NH, int causal) {
    int hs = C / NH, C3 = 3 * C;
    float scale = 1.0f / sqrtf((float)hs);
    float *blocks = workspace_for(rows);
    size_t per_thread = floats_per_thread(rows);
#pragma omp parallel for collapse(2) schedule(static)
    for (int b = 0; b < B; b++) {
        for (int h = 0; h < NH; h++) {
            float *p = blocks + omp_get_thread_num() * per_thread; /* (tile, keys) */
            const float *qh = q + (size_t)b * T * C3 + h * hs;
            const float *k = kv + (size_t)b * T * kv_stride + h * hs, *v = k + C;
            float *o = out + (size_t)b * T * C + h * hs;
            float *row_lse = lse + ((size_t)b * NH + h) * T;
            for (int t0 = 0; t0 < rows; t0 += ATTENTION_TILE) {
                int tile = tile_rows(t0, rows), keys = causal ? t0 + tile : rows;
                /* x(tile,keys) = scale * q(tile,hs) @ k(keys,hs)^T: the tile's queries, keys 0..keys-1 */
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, tile, keys, hs, scale,
                            qh + (size_t)t0 * C3, C3, k, kv_stride, 0.0f, p, keys);
                /* softmax over the keys each query sees; the future gets probability 0 */
                for (int r = 0; r < tile; r++)
                    row_lse[t0 + r] = softmax_row(p + (size_t)r * keys, causal ? t0 + r + 1 : keys, keys);
                /* out(tile,hs) = p(tile,keys) @ v(keys,hs), into head h's columns */
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, tile, hs, keys, 1.0f, p, keys, v,
                            kv_stride, 0.0f, o + (size_t)t0 * C, C);
            }
        }
    }
}

/* The backward of forward_tiles: dq (as q), dkv (as kv) += ..., from the
 * whole attention's out and lse (dout, out, lse laid out as forward's). */
static void backward_tiles(float *dq, float *dkv, const float *dout, const float *out, const float *lse,
                           const float *q, const float *kv, int kv_stride, int B, int T, int rows, int C,
                           int NH, int causal) {
    int hs = C / NH, C3 = 3 * C;
    float scale = 1.0f / sqrtf((float)hs);
    float *blocks = workspace_for(rows);
    size_t per_thread = floats_per_thread(rows);
#pragma omp parallel for collapse(2) schedule(static)
    for (int b = 0; b < B; b++) {
        for (int h = 0; h < NH; h++) {
            float *p = blocks + omp_get_thread_num() * per_thread; /* (tile, keys) */
            float *ds = p + (size_t)ATTENTION_TILE * rows;         /* (tile, keys) */
            const float *qh = q + (size_t)b * T * C3 + h * hs;
            const float *k = kv + (size_t)b * T * kv_stride + h * hs, *v = k + C;
            float *dqh = dq + (size_t)b * T * C3 + h * hs;
            float *dk = dkv + (size_t)b * T * kv_stride + h * hs, *dv = dk + C;
            const float *g = dout + (size_t)b * T * C + h * hs, *o = out + (size_t)b * T * C + h * hs;
            const float *row_lse = lse + ((size_t)b * NH + h) * T;
            for (int t0 = 0; t0 < rows; t0 += ATTENTION_TILE) {
                int tile = tile_rows(t0, rows), keys = causal ? t0 + tile : rows;
                const float *q_tile = qh + (size_t)t0 * C3, *g_tile = g + (size_t)t0 * C;
                /* the forward's scores again, and dp(tile,keys) = dout(tile,hs) @ v(keys,hs)^T */
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, tile, keys, hs, scale, q_tile, C3, k,
                            kv_stride, 0.0f, p, keys);
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, tile, keys, hs, 1.0f, g_tile, C, v,
                            kv_stride, 0.0f, ds, keys);
                for (int r = 0; r < tile; r++) {
                    int t = t0 + r;
                    softmax_backward_row(p + (size_t)r * keys, ds + (size_t)r * keys, g + (size_t)t * C,
                                         o + (size_t)t * C, hs, row_lse[t], scale, causal ? t + 1 : keys,
                                         keys);
                }
                /* x = scale q k^T:  dq(tile,hs) += ds @ k,  dk(keys,hs) += ds^T @ q */
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, tile, hs, keys, 1.0f, ds, keys, k,
                            kv_stride, 1.0f, dqh + (size_t)t0 * C3, C3);
                cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, keys, hs, tile, 1.0f, ds, keys, q_tile,
                            C3, 1.0f, dk, kv_stride);
                /* out = p v:  dv(keys,hs) += p^T @ dout */
                cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, keys, hs, tile, 1.0f, p, keys, g_tile, C,
                            1.0f, dv, kv_stride);
            }
        }
    }
}

/* The whole causal attention is one block: every query against every key of its sequence. */
void attention_forward_cpu(float *out, float *lse, const float *qkv, int B, int T, int C, int NH) {
    forward_tiles(out, lse, qkv, qkv + C, 3 * C, B, T, T, C, NH, 1);
}

void attention_backward_cpu(float *dqkv, const float *dout, const float *qkv, const float *out,
                            const float *lse, int B, int T, int C, int NH) {
    backward_tiles(dqkv, dqkv + C, dout, out, lse, qkv, qkv + C, 3 * C, B, T, T, C, NH, 1);
}

/* ---- ring attention's pieces (context parallelism, kernels.h) ----
 * The same tiles over one block of a longer sequence: `rows` queries of
 * qkv against `rows` keys of a k | v buffer (stride 2C) that came round the
 * ring. */
void attention_block_forward_cpu(float *out, float *lse, const float *q, const float *kv, int B, int T,
                                 int rows, int C, int NH, int causal) {
    forward_tiles(out, lse, q, kv, 2 * C, B, T, rows, C, NH, causal);
}

void attention_block_backward_cpu(float *dq, float *dkv, const float *dout, const float *out,
                                  const float *lse, const float *q, const float *kv, int B, int T, int rows,
                                  int C, int NH, int causal) {
    backward_tiles(dq, dkv, dout, out, lse, q, kv, 2 * C, B, T, rows, C, NH, causal);
}

/* One row of one head: (o, *l), a softmax over some keys, and (ob, lb),
 * one over other keys, become (o, *l), the softmax over both (kernels.h,
 * attention_merge, has the algebra). */
static void merge_row(float *o, float *l, const float *ob, float lb, int hs) {
    /* EXERCISE 03.3 BEGIN: merge two partial attention results (course.md, exercise 03.3) */
    float top = *l > lb ? *l : lb; /* the larger of the two: no exp() above 1 */
    float merged = top + logf(expf(*l - top) + expf(lb - top));
    float keep = expf(*l - merged), add = expf(lb - merged);
    for (int i = 0; i < hs; i++) o[i] = keep * o[i] + add * ob[i];
    *l = merged;
    /* EXERCISE 03.3 END */
}

void attention_merge_cpu(float *out, float *lse, const float *block_out, const float *block_lse, int B, int T,
                         int rows, int C, int NH) {
    int hs = C / NH;
#pragma omp parallel for collapse(2) schedule(static)
    for (int b = 0; b < B; b++) {
        for (int h = 0; h < NH; h++) {
            for (int r = 0; r < rows; r++) {
                size_t row = (size_t)b * T + r, head_row = ((size_t)b * NH + h) * T + r;
                merge_row(out + row * C + h * hs, lse + head_row, block_out + row * C + h * hs,
                          block_lse[head_row], hs);
            }
        }
    }
}
