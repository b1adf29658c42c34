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
#include "attention.h"
#include "device.h"
#include "simd_cpu.h"

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
        /* The CPU backend's "device" is host memory; when these kernels run
         * beside the CUDA backend (the parity tests), device memory would be
         * the GPU's, which the CPU cannot touch: ask for host memory then. */
        Space space = device_backend() == BACKEND_CPU ? SPACE_DEVICE : SPACE_HOST;
        workspace = mem_alloc(space, CAT_WORKSPACE, need * sizeof(float), "attention workspace");
        workspace_floats = need;
    }
    return workspace;
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

void attention_forward_cpu(float *out, float *lse, const float *qkv, int B, int T, int C, int NH) {
    int hs = C / NH, C3 = 3 * C;
    float scale = 1.0f / sqrtf((float)hs);
    float *blocks = workspace_for(T);
    size_t per_thread = floats_per_thread(T);
#pragma omp parallel for collapse(2) schedule(static)
    for (int b = 0; b < B; b++) {
        for (int h = 0; h < NH; h++) {
            float *p = blocks + omp_get_thread_num() * per_thread; /* (rows, keys) */
            const float *q = qkv + (size_t)b * T * C3 + h * hs, *k = q + C, *v = q + 2 * C;
            float *o = out + (size_t)b * T * C + h * hs;
            float *row_lse = lse + ((size_t)b * NH + h) * T;
            for (int t0 = 0; t0 < T; t0 += ATTENTION_TILE) {
                int rows = tile_rows(t0, T), keys = t0 + rows;
                /* x(rows,keys) = scale * q(rows,hs) @ k(keys,hs)^T: the tile's queries, keys 0..keys-1 */
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, keys, hs, scale,
                            q + (size_t)t0 * C3, C3, k, C3, 0.0f, p, keys);
                for (int r = 0; r < rows; r++) {
                    /* softmax over keys 0..t; the future gets probability 0 */
                    int t = t0 + r;
                    row_lse[t] = softmax_row(p + (size_t)r * keys, t + 1, keys);
                }
                /* out(rows,hs) = p(rows,keys) @ v(keys,hs), into head h's columns */
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, hs, keys, 1.0f, p, keys, v, C3,
                            0.0f, o + (size_t)t0 * C, C);
            }
        }
    }
}

void attention_backward_cpu(float *dqkv, const float *dout, const float *qkv, const float *out,
                            const float *lse, int B, int T, int C, int NH) {
    int hs = C / NH, C3 = 3 * C;
    float scale = 1.0f / sqrtf((float)hs);
    float *blocks = workspace_for(T);
    size_t per_thread = floats_per_thread(T);
#pragma omp parallel for collapse(2) schedule(static)
    for (int b = 0; b < B; b++) {
        for (int h = 0; h < NH; h++) {
            float *p = blocks + omp_get_thread_num() * per_thread; /* (rows, keys) */
            float *ds = p + (size_t)ATTENTION_TILE * T;            /* (rows, keys) */
            const float *q = qkv + (size_t)b * T * C3 + h * hs, *k = q + C, *v = q + 2 * C;
            float *dq = dqkv + (size_t)b * T * C3 + h * hs, *dk = dq + C, *dv = dq + 2 * C;
            const float *g = dout + (size_t)b * T * C + h * hs, *o = out + (size_t)b * T * C + h * hs;
            const float *row_lse = lse + ((size_t)b * NH + h) * T;
            for (int t0 = 0; t0 < T; t0 += ATTENTION_TILE) {
                int rows = tile_rows(t0, T), keys = t0 + rows;
                const float *q_tile = q + (size_t)t0 * C3, *g_tile = g + (size_t)t0 * C;
                /* the forward's scores again, and dp(rows,keys) = dout(rows,hs) @ v(keys,hs)^T */
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, keys, hs, scale, q_tile, C3, k, C3,
                            0.0f, p, keys);
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, keys, hs, 1.0f, g_tile, C, v, C3,
                            0.0f, ds, keys);
                for (int r = 0; r < rows; r++) {
                    int t = t0 + r;
                    softmax_backward_row(p + (size_t)r * keys, ds + (size_t)r * keys, g + (size_t)t * C,
                                         o + (size_t)t * C, hs, row_lse[t], scale, t + 1, keys);
                }
                /* x = scale q k^T:  dq(rows,hs) += ds @ k,  dk(keys,hs) += ds^T @ q */
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, hs, keys, 1.0f, ds, keys, k, C3,
                            1.0f, dq + (size_t)t0 * C3, C3);
                cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, keys, hs, rows, 1.0f, ds, keys, q_tile,
                            C3, 1.0f, dk, C3);
                /* out = p v:  dv(keys,hs) += p^T @ dout */
                cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, keys, hs, rows, 1.0f, p, keys, g_tile, C,
                            1.0f, dv, C3);
            }
        }
    }
}
