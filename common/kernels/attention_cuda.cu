/* attention_cuda.cu: fused causal self-attention on CUDA ("flash" attention),
 * the twin of attention_cpu.c. The contract is kernels.h's.
 *
 * Why fuse. Written as matmuls, attention stores the probabilities P of every
 * head, a (T,T) matrix: B*NH*T*T floats per block, 0.4 GB per block for the
 * gpt2 preset (B 8, NH 12, T 1024), read and written by a softmax kernel and
 * two more matmuls, and its gradient as large again. Moving those bytes, not
 * the arithmetic, bounds the step. Here a block of threads takes a tile of 64
 * queries, walks the key tiles (only those at or below the diagonal: the
 * causal mask halves the work), computes the scores of one tile in registers,
 * keeps a running maximum and sum per row (the "online softmax": when the
 * maximum grows, what was accumulated is rescaled by exp(old - new)), and adds
 * P @ V into its output, so P never leaves the chip. What is saved for
 * backward is one number per row, lse = log(sum exp(x)); backward recomputes
 * any probability as p = exp(x - lse), tile by tile.
 *
 * Backward without atomics. dK and dV of a key tile sum over every query
 * after it; dQ of a query tile sums over every key before it. One kernel owns
 * a key tile (dK, dV), another owns a query tile (dQ), and each sums in a fixed
 * order, so the result is bit-identical run to run (the determinism and resume
 * tests rely on that). The price: the scores and dP are computed twice.
 *   D = rowsum(dout * out)                       attention_delta_kernel
 *   dS = P * (dP - D) * scale, dP = dout V^T     (softmax backward, per tile)
 *   dV += P^T dout,  dK += dS^T Q                attention_dkdv_kernel
 *   dQ += dS K                                   attention_dq_kernel
 *
 * Tensor cores. Each warp owns 16 rows and multiplies with the m16n8k8 TF32
 * MMA instruction (mma.sync). TF32 keeps 10 of fp32's 23 mantissa bits; to
 * stay fp32-accurate (the parity tests hold the CPU's fp32 to 1e-4, the
 * course's default is strict fp32) every product is done three times:
 * a*b ~ big(a)*big(b) + big(a)*small(b) + small(a)*big(b), where big(x) is x
 * rounded to TF32 and small(x) = x - big(x) (the "3xTF32" split; the dropped
 * small*small term is ~2^-22 relative). With COURSE_TF32=1, as for cuBLAS,
 * and in a 16-bit run (--precision bf16/fp16, whose matmul inputs carry 7 or
 * 10 mantissa bits anyway; COURSE_TF32=0 refuses), one plain TF32 product is
 * used: cuda_attention_tf32().
 *
 * Layout. q, k and v are read in place from qkv (B,T,3C) (row stride 3C) and
 * out, dqkv written in place: no transposes, no (B,NH,T,hs) copies. A tile in
 * shared memory is [row][d], d padded to HSP (16, 32, 64 or 128, zeros beyond
 * hs) with a row stride of HSP + 4 floats, which makes both ways the MMA
 * fragments read it free of bank conflicts. Head sizes above 128 take a
 * simple one-warp-per-row path (attention_rows_*), slow but the same math.
 * Ring attention's three pieces (context parallelism) take that path's form
 * too, for any head size (attention_block_*, attention_merge; written for
 * correctness first, not yet tiled). */
#include "common/device/cuda_common.cuh" /* cuda_check, blocks_for, the streams */

#include "common/kernels/attention.h" /* attention's kernels and workspace */
#include "common/device/device.h" /* mem_alloc, copies, streams, timers */

#include <math.h>
#include <stdint.h>

#define TILE 64 /* queries per block, keys per tile */
#define WARPS 4 /* 16 rows each */
#define THREADS (WARPS * 32)
#define NT (TILE / 8) /* 8-wide MMA column tiles across a tile */
#define LOG2E 1.4426950408889634f
#define LN2 0.6931471805599453f

/* ---------------------------------------------------------------------------
 * One MMA: d(16x8) += a(16x8) @ b(8x8), TF32 inputs, fp32 accumulate.
 * Fragment layout (PTX ISA, mma.m16n8k8 .tf32), with g = lane / 4, t = lane % 4:
 *   a: a0 (row g, col t)  a1 (g+8, t)  a2 (g, t+4)  a3 (g+8, t+4)
 *   b: b0 (row t, col g)  b1 (t+4, g)
 *   d: d0 (g, 2t)  d1 (g, 2t+1)  d2 (g+8, 2t)  d3 (g+8, 2t+1)
 * ------------------------------------------------------------------------- */
static __device__ __forceinline__ uint32_t to_tf32(float x) {
    uint32_t r;
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(x));
    return r;
}

static __device__ __forceinline__ void mma_tf32(float d[4], const uint32_t a[4], const uint32_t b[2]) {
    asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

/* An operand fragment as TF32: big = x rounded to TF32, and for the 3xTF32
 * product also small = x - big (exact in fp32), rounded. */
template <int N, bool X3> struct Tf32Frag { uint32_t big[N], small[N]; };

/* From fp32 values in registers (the A operands, and P, dS). */
template <int N, bool X3> static __device__ __forceinline__ Tf32Frag<N, X3> split(const float (&x)[N]) {
    Tf32Frag<N, X3> f;
#pragma unroll
    for (int i = 0; i < N; i++) {
        f.big[i] = to_tf32(x[i]);
        if (X3) f.small[i] = to_tf32(x[i] - __uint_as_float(f.big[i]));
    }
    return f;
}

/* A right-hand fragment from a tile in shared memory. PREP: the tile was
 * prepared (prepare_tile below): big parts at tile[i], small ones a plane
 * further. Otherwise the tile holds fp32 values: split them here for 3xTF32,
 * or, for one TF32 product, hand over the fp32 bits as they are (the tensor
 * core reads the TF32 bits of each value and ignores the low 13 mantissa
 * bits, so no conversion instruction is needed). */
template <int HSP, bool X3, bool PREP>
static __device__ __forceinline__ Tf32Frag<2, X3> right_frag(const float *tile, int i0, int i1) {
    constexpr int PLANE = TILE * (HSP + 4);
    Tf32Frag<2, X3> f;
    if (PREP || !X3) {
        f.big[0] = __float_as_uint(tile[i0]);
        f.big[1] = __float_as_uint(tile[i1]);
        if (X3) {
            f.small[0] = __float_as_uint(tile[PLANE + i0]);
            f.small[1] = __float_as_uint(tile[PLANE + i1]);
        }
        return f;
    }
    const float x[2] = {tile[i0], tile[i1]};
    return split<2, X3>(x);
}

/* d += a @ b: one TF32 product, or three (small terms first, so that they are
 * not lost against the large one). */
template <bool X3>
static __device__ __forceinline__ void mma_f32(float d[4], const Tf32Frag<4, X3> &a,
                                               const Tf32Frag<2, X3> &b) {
    if (X3) {
        mma_tf32(d, a.small, b.big);
        mma_tf32(d, a.big, b.small);
    }
    mma_tf32(d, a.big, b.big);
}

/* ---------------------------------------------------------------------------
 * The two shapes of product every step below is made of. A warp owns rows
 * row0..row0+15 of the left operand; tiles live in shared memory as [row][d]
 * with stride S = HSP + 4. The left operand's tile holds fp32 values (a
 * fragment is split once and used for 8 products); the right operand's tile
 * is read by every warp, so with 3xTF32 it pays to split it into TF32 parts
 * once, when it is loaded (PREP), where it is used often enough (the dK/dV
 * kernel: four products per loaded tile).
 * ------------------------------------------------------------------------- */

/* acc(16 x 8*NT) += A(16 x HSP) @ B(8*NT x HSP)^T: scores Q K^T, dP = dO V^T,
 * and their transposes. Straight-line code (no tests inside the loops), so
 * that the compiler can issue shared-memory loads well ahead of the MMAs
 * that use them; masked columns are computed and then set to zero. */
template <int HSP, bool X3, bool PREP>
static __device__ __forceinline__ void rows_times_rows_t(float acc[NT][4], const float *A, const float *Bm) {
    constexpr int S = HSP + 4;
    int g = threadIdx.x % 32 / 4, t = threadIdx.x % 4;
#pragma unroll
    for (int kk = 0; kk < HSP / 8; kk++) {
        const float a_values[4] = {A[g * S + kk * 8 + t], A[(g + 8) * S + kk * 8 + t],
                                   A[g * S + kk * 8 + t + 4], A[(g + 8) * S + kk * 8 + t + 4]};
        Tf32Frag<4, X3> a = split<4, X3>(a_values);
#pragma unroll
        for (int nt = 0; nt < NT; nt++) {
            int row = (nt * 8 + g) * S + kk * 8;
            mma_f32<X3>(acc[nt], a, right_frag<HSP, X3, PREP>(Bm, row + t, row + t + 4));
        }
    }
}

/* out(16 x HSP) += P(16 x 8*NT) @ M(8*NT x HSP), P in registers as left by
 * rows_times_rows_t (zeros where masked), M a tile in shared memory:
 * O += P V, dV += P^T dO, dK += dS^T Q, dQ += dS K.
 * The accumulator layout of P is not the a-fragment layout, but a product
 * sums over k in any order: let a-fragment column t stand for key 2t and
 * column t+4 for key 2t+1, and read M's rows in the same order. Then the
 * registers are used as they are, with no shuffles. */
template <int HSP, bool X3, bool PREP>
static __device__ __forceinline__ void regs_times_tile(float out[HSP / 8][4], const float p[NT][4],
                                                       const float *M) {
    constexpr int S = HSP + 4;
    int g = threadIdx.x % 32 / 4, t = threadIdx.x % 4;
#pragma unroll
    for (int nt = 0; nt < NT; nt++) {
        const float a_values[4] = {p[nt][0], p[nt][2], p[nt][1], p[nt][3]};
        Tf32Frag<4, X3> a = split<4, X3>(a_values);
        int row0 = (nt * 8 + 2 * t) * S;
#pragma unroll
        for (int dn = 0; dn < HSP / 8; dn++)
            mma_f32<X3>(out[dn], a, right_frag<HSP, X3, PREP>(M, row0 + dn * 8 + g, row0 + S + dn * 8 + g));
    }
}

/* Copy rows row0..row0+TILE-1 (d < hs) of a (T, row_stride) view into a
 * shared [TILE][HSP+4] tile, zeros outside, with cp.async: the copies go
 * from global to shared memory without passing through registers, so a
 * thread can have all of its copies in flight at once and the tile costs
 * about one memory latency, not one per element. 16-byte copies when rows
 * are 16-byte aligned (hs and C multiples of 4), else 4-byte ones. A source
 * size of 0 makes the copy write zeros (rows past T, d past hs). Before the
 * tile is read: wait_copies() (each thread's own copies), then __syncthreads(). */
static __device__ __forceinline__ void copy_async(float *dst, const float *src, int bytes, bool valid) {
    uint32_t dst_shared = (uint32_t)__cvta_generic_to_shared(dst);
    if (bytes == 16)
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst_shared), "l"(src),
                     "r"(valid ? 16 : 0));
    else
        asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" ::"r"(dst_shared), "l"(src),
                     "r"(valid ? 4 : 0));
}

template <int HSP>
static __device__ void load_tile(float *tile, const float *src, int row0, int T, size_t row_stride, int hs,
                                 bool aligned) {
    constexpr int S = HSP + 4;
    int width = aligned ? 4 : 1; /* floats per copy */
    for (int i = threadIdx.x * width; i < TILE * HSP; i += THREADS * width) {
        int r = i / HSP, d = i % HSP, row = row0 + r;
        bool valid = row < T && d < hs; /* with width 4, hs % 4 == 0: all four or none */
        const float *from = valid ? src + (size_t)row * row_stride + d : src;
        copy_async(tile + r * S + d, from, width * 4, valid);
    }
    asm volatile("cp.async.commit_group;");
}

/* Wait for this thread's copies. */
static __device__ __forceinline__ void wait_copies(void) {
    asm volatile("cp.async.wait_all;" ::: "memory");
}

/* Turn a loaded tile into a prepared one for 3xTF32, in place: TF32 big parts
 * where the values were, the small parts one plane (TILE x S floats)
 * further. Each thread converts the elements it copied (the same index walk
 * as load_tile), so wait_copies() is all it needs first; a __syncthreads()
 * must follow before other threads read the tile. */
template <int HSP> static __device__ void prepare_tile(float *tile, bool aligned) {
    constexpr int S = HSP + 4, PLANE = TILE * S;
    int width = aligned ? 4 : 1;
    for (int i = threadIdx.x * width; i < TILE * HSP; i += THREADS * width)
        for (int j = 0; j < width; j++) {
            int at = (i + j) / HSP * S + (i + j) % HSP;
            float x = tile[at];
            uint32_t big = to_tf32(x);
            tile[at] = __uint_as_float(big);
            tile[PLANE + at] = __uint_as_float(to_tf32(x - __uint_as_float(big)));
        }
}

/* The 2 x 2*NT values of a row-tile a thread holds: rows g and g+8, columns
 * nt*8 + 2t and +1 (the d layout above). Helpers name them. */
static __device__ __forceinline__ int frag_row(int i) {
    return threadIdx.x % 32 / 4 + (i >= 2 ? 8 : 0);
}
static __device__ __forceinline__ int frag_col(int nt, int i) {
    return nt * 8 + 2 * (threadIdx.x % 4) + (i & 1);
}

/* ---------------------------------------------------------------------------
 * Forward: grid (query tiles, B*NH), one block per 64 queries of one head.
 * ------------------------------------------------------------------------- */
template <int HSP, bool X3>
static __global__ void __launch_bounds__(THREADS)
    attention_forward_kernel(float *out, float *lse, const float *qkv, int T, int C, int NH, float scale,
                             bool aligned) {
    constexpr int S = HSP + 4;
    extern __shared__ float smem[];
    float *qs = smem, *ks = qs + TILE * S, *vs = ks + TILE * S;
    int q_tile = gridDim.x - 1 - blockIdx.x; /* the longest rows (most key tiles) start first */
    int bh = blockIdx.y, b = bh / NH, h = bh % NH, hs = C / NH;
    size_t row3 = 3 * (size_t)C;
    const float *q = qkv + (size_t)b * T * row3 + (size_t)h * hs, *k = q + C, *v = q + 2 * C;
    int warp = threadIdx.x / 32, q0 = q_tile * TILE + warp * 16; /* this warp's first query */

    load_tile<HSP>(qs, q, q_tile * TILE, T, row3, hs, aligned);
    float o[HSP / 8][4] = {};
    float row_max[2] = {-INFINITY, -INFINITY}; /* running max of x*log2(e), rows g and g+8 */
    float row_sum[2] = {0.0f, 0.0f};           /* this thread's part of sum exp2(x*log2e - max) */
    float scale2 = scale * LOG2E;              /* exp(x) = exp2(x * log2 e): exp2 is the fast one */

    for (int kt = 0; kt <= q_tile; kt++) {
        __syncthreads(); /* everyone is done with the previous K and V */
        load_tile<HSP>(ks, k, kt * TILE, T, row3, hs, aligned);
        load_tile<HSP>(vs, v, kt * TILE, T, row3, hs, aligned);
        wait_copies();
        __syncthreads();
        float x[NT][4] = {};
        rows_times_rows_t<HSP, X3, false>(x, qs + warp * 16 * S, ks);
        float tile_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
#pragma unroll
            for (int i = 0; i < 4; i++) {
                int query = q0 + frag_row(i), key = kt * TILE + frag_col(nt, i);
                x[nt][i] = (key <= query && key < T) ? x[nt][i] * scale2 : -INFINITY; /* the causal mask */
                tile_max[i / 2] = fmaxf(tile_max[i / 2], x[nt][i]);
            }
        float correction[2];
#pragma unroll
        for (int r = 0; r < 2; r++) {
            /* the four threads of a row hold its columns: reduce across them */
            tile_max[r] = fmaxf(tile_max[r], __shfl_xor_sync(0xffffffffu, tile_max[r], 1));
            tile_max[r] = fmaxf(tile_max[r], __shfl_xor_sync(0xffffffffu, tile_max[r], 2));
            float new_max = fmaxf(row_max[r], tile_max[r]);
            correction[r] = new_max == -INFINITY ? 1.0f : exp2f(row_max[r] - new_max);
            row_max[r] = new_max;
            row_sum[r] *= correction[r];
        }
#pragma unroll
        for (int dn = 0; dn < HSP / 8; dn++)
#pragma unroll
            for (int i = 0; i < 4; i++) o[dn][i] *= correction[i / 2];
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
#pragma unroll
            for (int i = 0; i < 4; i++) {
                float m = row_max[i / 2];
                x[nt][i] = x[nt][i] == -INFINITY ? 0.0f : exp2f(x[nt][i] - m); /* now p, unnormalised */
                row_sum[i / 2] += x[nt][i];
            }
        regs_times_tile<HSP, X3, false>(o, x, vs);
    }

#pragma unroll
    for (int r = 0; r < 2; r++) {
        row_sum[r] += __shfl_xor_sync(0xffffffffu, row_sum[r], 1);
        row_sum[r] += __shfl_xor_sync(0xffffffffu, row_sum[r], 2);
    }
#pragma unroll
    for (int dn = 0; dn < HSP / 8; dn++)
#pragma unroll
        for (int i = 0; i < 4; i++) {
            int query = q0 + frag_row(i), d = frag_col(dn, i);
            if (query < T && d < hs)
                out[((size_t)b * T + query) * C + (size_t)h * hs + d] = o[dn][i] / row_sum[i / 2];
        }
    if (threadIdx.x % 4 == 0)
#pragma unroll
        for (int r = 0; r < 2; r++) {
            int query = q0 + frag_row(2 * r);
            if (query < T) lse[(size_t)bh * T + query] = (row_max[r] + log2f(row_sum[r])) * LN2;
        }
}

/* One element of a backward tile: x (a raw score q.k) becomes the probability
 * p = exp(x * scale - lse) = exp2(x * scale2 - lse2), 0 where masked (scale2
 * and lse2 are scale and lse times log2 e), and dp (dout.v) becomes
 * dS = p (dp - D) scale, the gradient of q.k. */
static __device__ __forceinline__ void softmax_backward(float &x, float &dp, bool live, float scale,
                                                        float scale2, float lse2, float D) {
    x = live ? exp2f(x * scale2 - lse2) : 0.0f;
    dp = x * (dp - D) * scale;
}

/* ---------------------------------------------------------------------------
 * Backward, 1: D[b,h,t] = sum_d dout[b,t,h,d] * out[b,t,h,d], one warp per row.
 * ------------------------------------------------------------------------- */
static __global__ void attention_delta_kernel(float *delta, const float *dout, const float *out, int T, int C,
                                              int NH, size_t rows) {
    size_t row = (size_t)blockIdx.x * WARPS + threadIdx.x / 32; /* (b*NH + h)*T + t */
    if (row >= rows) return;
    int lane = threadIdx.x % 32, hs = C / NH, t = (int)(row % T);
    size_t bh = row / T, b = bh / NH, h = bh % NH;
    size_t base = (b * T + t) * C + h * hs;
    float sum = 0.0f;
    for (int d = lane; d < hs; d += 32) sum += dout[base + d] * out[base + d];
    for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
    if (lane == 0) delta[row] = sum;
}

/* Backward, 2: dK and dV of one key tile, summing over the query tiles at and
 * after it. Grid (key tiles, B*NH). A warp owns 16 keys; it works with
 * transposed tiles: x^T = K Q^T, P^T, dP^T = V dO^T, dS^T. */
template <int HSP, bool X3>
static __global__ void __launch_bounds__(THREADS)
    attention_dkdv_kernel(float *dqkv, const float *dout, const float *qkv, const float *lse,
                          const float *delta, int T, int C, int NH, float scale, bool aligned) {
    constexpr int S = HSP + 4, PLANES = X3 ? 2 : 1;
    extern __shared__ float smem[];
    float *ks = smem, *vs = ks + TILE * S;                    /* fp32 */
    float *qs = vs + TILE * S, *dos = qs + PLANES * TILE * S; /* prepared */
    float *lse_s = dos + PLANES * TILE * S, *delta_s = lse_s + TILE;
    int k_tile = blockIdx.x, q_tiles = gridDim.x;
    int bh = blockIdx.y, b = bh / NH, h = bh % NH, hs = C / NH;
    size_t row3 = 3 * (size_t)C;
    const float *q = qkv + (size_t)b * T * row3 + (size_t)h * hs, *k = q + C, *v = q + 2 * C;
    const float *dO = dout + (size_t)b * T * C + (size_t)h * hs;
    int warp = threadIdx.x / 32, k0 = k_tile * TILE + warp * 16; /* this warp's first key */
    float scale2 = scale * LOG2E;

    load_tile<HSP>(ks, k, k_tile * TILE, T, row3, hs, aligned);
    load_tile<HSP>(vs, v, k_tile * TILE, T, row3, hs, aligned);
    float dk[HSP / 8][4] = {}, dv[HSP / 8][4] = {};
    for (int qt = k_tile; qt < q_tiles; qt++) {
        __syncthreads();
        load_tile<HSP>(qs, q, qt * TILE, T, row3, hs, aligned);
        load_tile<HSP>(dos, dO, qt * TILE, T, C, hs, aligned);
        for (int i = threadIdx.x; i < TILE; i += THREADS) {
            int query = qt * TILE + i;
            lse_s[i] = query < T ? lse[(size_t)bh * T + query] * LOG2E : 0.0f;
            delta_s[i] = query < T ? delta[(size_t)bh * T + query] : 0.0f;
        }
        wait_copies();
        if (X3) {
            prepare_tile<HSP>(qs, aligned);
            prepare_tile<HSP>(dos, aligned);
        }
        __syncthreads();
        float p[NT][4] = {}, dp[NT][4] = {};
        rows_times_rows_t<HSP, X3, X3>(p, ks + warp * 16 * S, qs);
        rows_times_rows_t<HSP, X3, X3>(dp, vs + warp * 16 * S, dos);
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
#pragma unroll
            for (int i = 0; i < 4; i++) {
                int key = k0 + frag_row(i), col = frag_col(nt, i), query = qt * TILE + col;
                softmax_backward(p[nt][i], dp[nt][i], query >= key && query < T, scale, scale2, lse_s[col],
                                 delta_s[col]);
            }
        regs_times_tile<HSP, X3, X3>(dv, p, dos);
        regs_times_tile<HSP, X3, X3>(dk, dp, qs);
    }
#pragma unroll
    for (int dn = 0; dn < HSP / 8; dn++)
#pragma unroll
        for (int i = 0; i < 4; i++) {
            int key = k0 + frag_row(i), d = frag_col(dn, i);
            if (key >= T || d >= hs) continue;
            float *row = dqkv + ((size_t)b * T + key) * row3 + (size_t)h * hs + d;
            row[C] += dk[dn][i];
            row[2 * (size_t)C] += dv[dn][i];
        }
}

/* Backward, 3: dQ of one query tile, summing over the key tiles up to it.
 * Grid (query tiles, B*NH); a warp owns 16 queries. */
template <int HSP, bool X3>
static __global__ void __launch_bounds__(THREADS)
    attention_dq_kernel(float *dqkv, const float *dout, const float *qkv, const float *lse,
                        const float *delta, int T, int C, int NH, float scale, bool aligned) {
    constexpr int S = HSP + 4;
    extern __shared__ float smem[];
    float *qs = smem, *dos = qs + TILE * S, *ks = dos + TILE * S, *vs = ks + TILE * S;
    int q_tile = gridDim.x - 1 - blockIdx.x;
    int bh = blockIdx.y, b = bh / NH, h = bh % NH, hs = C / NH;
    size_t row3 = 3 * (size_t)C;
    const float *q = qkv + (size_t)b * T * row3 + (size_t)h * hs, *k = q + C, *v = q + 2 * C;
    const float *dO = dout + (size_t)b * T * C + (size_t)h * hs;
    int warp = threadIdx.x / 32, q0 = q_tile * TILE + warp * 16;
    float scale2 = scale * LOG2E;

    load_tile<HSP>(qs, q, q_tile * TILE, T, row3, hs, aligned);
    load_tile<HSP>(dos, dO, q_tile * TILE, T, C, hs, aligned);
    float row_lse[2], row_delta[2];
#pragma unroll
    for (int r = 0; r < 2; r++) {
        int query = q0 + frag_row(2 * r);
        row_lse[r] = query < T ? lse[(size_t)bh * T + query] * LOG2E : 0.0f;
        row_delta[r] = query < T ? delta[(size_t)bh * T + query] : 0.0f;
    }
    float dq[HSP / 8][4] = {};
    for (int kt = 0; kt <= q_tile; kt++) {
        __syncthreads();
        load_tile<HSP>(ks, k, kt * TILE, T, row3, hs, aligned);
        load_tile<HSP>(vs, v, kt * TILE, T, row3, hs, aligned);
        wait_copies();
        __syncthreads();
        float p[NT][4] = {}, dp[NT][4] = {};
        rows_times_rows_t<HSP, X3, false>(p, qs + warp * 16 * S, ks);
        rows_times_rows_t<HSP, X3, false>(dp, dos + warp * 16 * S, vs);
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
#pragma unroll
            for (int i = 0; i < 4; i++) {
                int query = q0 + frag_row(i), key = kt * TILE + frag_col(nt, i);
                softmax_backward(p[nt][i], dp[nt][i], key <= query && key < T, scale, scale2, row_lse[i / 2],
                                 row_delta[i / 2]);
            }
        regs_times_tile<HSP, X3, false>(dq, dp, ks);
    }
#pragma unroll
    for (int dn = 0; dn < HSP / 8; dn++)
#pragma unroll
        for (int i = 0; i < 4; i++) {
            int query = q0 + frag_row(i), d = frag_col(dn, i);
            if (query < T && d < hs) dqkv[((size_t)b * T + query) * row3 + (size_t)h * hs + d] += dq[dn][i];
        }
}

/* ---------------------------------------------------------------------------
 * Head sizes above 128: one warp per row, plain fp32 FMAs, the same math.
 * Forward: a warp owns a query, walks its keys 0..t with the online softmax,
 * and accumulates the output row in place in `out` (lane owns d = lane + 32j).
 * ------------------------------------------------------------------------- */
static __device__ float warp_dot(const float *a, const float *b, int n) {
    float sum = 0.0f;
    for (int d = threadIdx.x % 32; d < n; d += 32) sum += a[d] * b[d];
    for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
    return sum;
}

static __global__ void attention_rows_forward_kernel(float *out, float *lse, const float *qkv, int T, int C,
                                                     int NH, float scale, size_t rows) {
    size_t row = (size_t)blockIdx.x * WARPS + threadIdx.x / 32;
    if (row >= rows) return;
    int lane = threadIdx.x % 32, hs = C / NH, t = (int)(row % T);
    size_t bh = row / T, b = bh / NH, h = bh % NH, row3 = 3 * (size_t)C;
    const float *q = qkv + (b * T + t) * row3 + h * hs;
    float *o = out + (b * T + t) * C + h * hs;
    for (int d = lane; d < hs; d += 32) o[d] = 0.0f;
    float m = -INFINITY, sum = 0.0f;
    for (int key = 0; key <= t; key++) {
        const float *kv = qkv + (b * T + key) * row3 + h * hs;
        float x = warp_dot(q, kv + C, hs) * scale;
        float new_m = fmaxf(m, x), correction = expf(m - new_m), p = expf(x - new_m);
        sum = sum * correction + p;
        for (int d = lane; d < hs; d += 32) o[d] = o[d] * correction + p * kv[2 * C + d];
        m = new_m;
    }
    for (int d = lane; d < hs; d += 32) o[d] /= sum;
    if (lane == 0) lse[row] = m + logf(sum);
}

/* dQ of a query row (keys 0..t), and dK, dV of a key row (queries t..T-1). */
static __global__ void attention_rows_backward_kernel(float *dqkv, const float *dout, const float *qkv,
                                                      const float *lse, const float *delta, int T, int C,
                                                      int NH, float scale, size_t rows) {
    size_t row = (size_t)blockIdx.x * WARPS + threadIdx.x / 32;
    if (row >= rows) return;
    int lane = threadIdx.x % 32, hs = C / NH, t = (int)(row % T);
    size_t bh = row / T, b = bh / NH, h = bh % NH, row3 = 3 * (size_t)C;
    const float *q = qkv + (b * T + t) * row3 + h * hs, *k = q + C, *v = q + 2 * C;
    const float *g = dout + (b * T + t) * C + h * hs;
    float *dq = dqkv + (b * T + t) * row3 + h * hs, *dk = dq + C, *dv = dq + 2 * C;
    for (int key = 0; key <= t; key++) { /* this row as a query */
        const float *kv = qkv + (b * T + key) * row3 + h * hs;
        float p = expf(warp_dot(q, kv + C, hs) * scale - lse[row]);
        float ds = p * (warp_dot(g, kv + 2 * C, hs) - delta[row]) * scale;
        for (int d = lane; d < hs; d += 32) dq[d] += ds * kv[C + d];
    }
    for (int query = t; query < T; query++) { /* this row as a key */
        size_t qrow = bh * T + query;
        const float *qq = qkv + (b * T + query) * row3 + h * hs, *gq = dout + (b * T + query) * C + h * hs;
        float p = expf(warp_dot(qq, k, hs) * scale - lse[qrow]);
        float ds = p * (warp_dot(gq, v, hs) - delta[qrow]) * scale;
        for (int d = lane; d < hs; d += 32) {
            dv[d] += p * gq[d];
            dk[d] += ds * qq[d];
        }
    }
}

/* ---------------------------------------------------------------------------
 * Ring attention's pieces (kernels.h: attention_block_forward, _merge,
 * _block_backward; 03_model_parallel/context_parallel.h). Written for
 * correctness first, in the row path's style: one warp per (sequence, head,
 * row of the block), plain fp32 FMAs, no atomics, any head size. A block is
 * `rows` queries of a qkv buffer (row stride 3C) against `rows` keys of a
 * k | v buffer (row stride 2C, v C floats after k); every buffer holds T rows
 * per sequence and its pointer is at the block's first row, so row t of
 * sequence b is at (b*T + t) * stride, and lse's (b, h, t) at (b*NH + h)*T + t.
 * causal: query r sees keys 0..r (the two chunks are the same positions);
 * else all `rows` keys.
 * ------------------------------------------------------------------------- */

/* The warp's (b, h, r) out of its index (b*NH + h)*rows + r. */
struct BlockRow {
    size_t b, h;
    int r;
};
static __device__ BlockRow block_row(size_t index, int rows, int NH) {
    size_t bh = index / rows;
    return {bh / NH, bh % NH, (int)(index % rows)};
}

/* The softmax over this block's keys only: an online softmax over keys
 * 0..last, the output accumulated in place in block_out (lane owns
 * d = lane + 32j), as attention_rows_forward_kernel. */
static __global__ void attention_block_forward_kernel(float *block_out, float *block_lse, const float *q,
                                                      const float *kv, int T, int rows, int C, int NH,
                                                      int causal, float scale, size_t warps) {
    size_t index = (size_t)blockIdx.x * WARPS + threadIdx.x / 32;
    if (index >= warps) return;
    BlockRow at = block_row(index, rows, NH);
    int lane = threadIdx.x % 32, hs = C / NH, keys = causal ? at.r + 1 : rows;
    const float *qr = q + (at.b * T + at.r) * 3 * (size_t)C + at.h * hs;
    float *o = block_out + (at.b * T + at.r) * (size_t)C + at.h * hs;
    for (int d = lane; d < hs; d += 32) o[d] = 0.0f;
    float m = -INFINITY, sum = 0.0f;
    for (int key = 0; key < keys; key++) {
        const float *k = kv + (at.b * T + key) * 2 * (size_t)C + at.h * hs, *v = k + C;
        float x = warp_dot(qr, k, hs) * scale;
        float new_m = fmaxf(m, x), correction = expf(m - new_m), p = expf(x - new_m);
        sum = sum * correction + p;
        for (int d = lane; d < hs; d += 32) o[d] = o[d] * correction + p * v[d];
        m = new_m;
    }
    for (int d = lane; d < hs; d += 32) o[d] /= sum;
    if (lane == 0) block_lse[(at.b * NH + at.h) * T + at.r] = m + logf(sum);
}

/* EXERCISE 03.3 BEGIN: merge two partial attention results (course.md, exercise 03.3) */
/* (out, lse) and (block_out, block_lse) into the softmax over both key sets,
 * with attention_cpu.c's merge_row's arithmetic: every lane reads both lse
 * values, the lanes rescale the row's columns, then lane 0 writes the new lse. */
static __global__ void attention_merge_kernel(float *out, float *lse, const float *block_out,
                                              const float *block_lse, int T, int rows, int C, int NH,
                                              size_t warps) {
    size_t index = (size_t)blockIdx.x * WARPS + threadIdx.x / 32;
    if (index >= warps) return;
    BlockRow at = block_row(index, rows, NH);
    int lane = threadIdx.x % 32, hs = C / NH;
    size_t row = at.b * T + at.r, head_row = (at.b * NH + at.h) * T + at.r;
    float *o = out + row * C + at.h * hs;
    const float *ob = block_out + row * C + at.h * hs;
    float l = lse[head_row], lb = block_lse[head_row];
    float top = fmaxf(l, lb); /* the larger of the two: no exp() above 1 */
    float merged = top + logf(expf(l - top) + expf(lb - top));
    float keep = expf(l - merged), add = expf(lb - merged);
    for (int d = lane; d < hs; d += 32) o[d] = keep * o[d] + add * ob[d];
    __syncwarp(); /* every lane has read lse[head_row] */
    if (lane == 0) lse[head_row] = merged;
}
/* EXERCISE 03.3 END */

/* The block's row r as a query (dq over the keys it sees) and as a key (dk,
 * dv over the queries that see it), from the whole attention's out and lse:
 * p = exp(x - lse), D = dot(dout, out), ds = p (dp - D) scale, dp = dout.v.
 * Each warp writes only its own rows of dq and dkv: no atomics, a fixed
 * order. */
static __global__ void attention_block_backward_kernel(float *dq, float *dkv, const float *dout,
                                                       const float *out, const float *lse, const float *q,
                                                       const float *kv, int T, int rows, int C, int NH,
                                                       int causal, float scale, size_t warps) {
    size_t index = (size_t)blockIdx.x * WARPS + threadIdx.x / 32;
    if (index >= warps) return;
    BlockRow at = block_row(index, rows, NH);
    int lane = threadIdx.x % 32, hs = C / NH, r = at.r;
    size_t C3 = 3 * (size_t)C, C2 = 2 * (size_t)C, lse_row0 = (at.b * NH + at.h) * T;
    /* row r as a query */
    const float *qr = q + (at.b * T + r) * C3 + at.h * hs;
    const float *g = dout + (at.b * T + r) * C + at.h * hs, *o = out + (at.b * T + r) * C + at.h * hs;
    float *dqr = dq + (at.b * T + r) * C3 + at.h * hs;
    float D = warp_dot(g, o, hs), row_lse = lse[lse_row0 + r];
    int keys = causal ? r + 1 : rows;
    for (int key = 0; key < keys; key++) {
        const float *k = kv + (at.b * T + key) * C2 + at.h * hs, *v = k + C;
        float p = expf(warp_dot(qr, k, hs) * scale - row_lse);
        float ds = p * (warp_dot(g, v, hs) - D) * scale;
        for (int d = lane; d < hs; d += 32) dqr[d] += ds * k[d];
    }
    /* row r as a key */
    const float *k = kv + (at.b * T + r) * C2 + at.h * hs, *v = k + C;
    float *dk = dkv + (at.b * T + r) * C2 + at.h * hs, *dv = dk + C;
    for (int query = causal ? r : 0; query < rows; query++) {
        const float *qq = q + (at.b * T + query) * C3 + at.h * hs;
        const float *gq = dout + (at.b * T + query) * C + at.h * hs;
        const float *oq = out + (at.b * T + query) * C + at.h * hs;
        float p = expf(warp_dot(qq, k, hs) * scale - lse[lse_row0 + query]);
        float ds = p * (warp_dot(gq, v, hs) - warp_dot(gq, oq, hs)) * scale;
        for (int d = lane; d < hs; d += 32) {
            dv[d] += p * gq[d];
            dk[d] += ds * qq[d];
        }
    }
}

/* Warps of WARPS per thread block, one per (b, h, row of the block). */
static unsigned block_grid(size_t warps) {
    return (unsigned)((warps + WARPS - 1) / WARPS);
}

extern "C" void attention_block_forward_cuda(float *out, float *lse, const float *q, const float *kv, int B,
                                             int T, int rows, int C, int NH, int causal) {
    size_t warps = (size_t)B * NH * rows;
    if (warps == 0 || C == 0) return;
    float scale = 1.0f / sqrtf((float)(C / NH));
    attention_block_forward_kernel<<<block_grid(warps), THREADS, 0, compute_stream>>>(
        out, lse, q, kv, T, rows, C, NH, causal, scale, warps);
    cuda_check(cudaGetLastError());
}

extern "C" void attention_merge_cuda(float *out, float *lse, const float *block_out, const float *block_lse,
                                     int B, int T, int rows, int C, int NH) {
    /* EXERCISE 03.3 BEGIN: merge two partial attention results (course.md, exercise 03.3) */
    size_t warps = (size_t)B * NH * rows;
    if (warps == 0 || C == 0) return;
    attention_merge_kernel<<<block_grid(warps), THREADS, 0, compute_stream>>>(out, lse, block_out, block_lse,
                                                                              T, rows, C, NH, warps);
    cuda_check(cudaGetLastError());
    /* EXERCISE 03.3 END */
}

extern "C" void attention_block_backward_cuda(float *dq, float *dkv, const float *dout, const float *out,
                                              const float *lse, const float *q, const float *kv, int B, int T,
                                              int rows, int C, int NH, int causal) {
    size_t warps = (size_t)B * NH * rows;
    if (warps == 0 || C == 0) return;
    float scale = 1.0f / sqrtf((float)(C / NH));
    attention_block_backward_kernel<<<block_grid(warps), THREADS, 0, compute_stream>>>(
        dq, dkv, dout, out, lse, q, kv, T, rows, C, NH, causal, scale, warps);
    cuda_check(cudaGetLastError());
}

/* ---------------------------------------------------------------------------
 * Host side: pick the kernel for the head size and precision.
 * ------------------------------------------------------------------------- */

/* D, (B,NH,T) floats, grown on demand (device/workspace in memory.csv). */
static float *delta_buffer = NULL;
static size_t delta_bytes = 0;

static float *delta_scratch(size_t bytes) {
    if (bytes > delta_bytes) {
        mem_free(delta_buffer);
        delta_buffer = (float *)mem_alloc(SPACE_DEVICE, CAT_WORKSPACE, bytes, "attention row sums (D)");
        delta_bytes = bytes;
    }
    return delta_buffer;
}

extern "C" void attention_release_cuda(void) {
    mem_free(delta_buffer);
    delta_buffer = NULL;
    delta_bytes = 0;
}

/* Dynamic shared memory beyond 48 KB must be asked for, once per kernel. */
template <typename Kernel> static void allow_shared_memory(Kernel kernel, size_t smem_bytes, bool *asked) {
    if (*asked) return;
    cuda_check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem_bytes));
    *asked = true;
}

/* Whether every row a tile copies starts on 16 bytes: cp.async's 16-byte form. */
static bool rows_aligned(const float *qkv, const float *dout, int C, int hs) {
    return hs % 4 == 0 && C % 4 == 0 && (uintptr_t)qkv % 16 == 0 && (uintptr_t)dout % 16 == 0;
}

template <int HSP, bool X3>
static void forward_tiled(float *out, float *lse, const float *qkv, int B, int T, int C, int NH,
                          float scale) {
    static bool asked = false;
    dim3 grid((T + TILE - 1) / TILE, B * NH);
    size_t smem = 3 * TILE * (HSP + 4) * sizeof(float); /* Q, K, V */
    allow_shared_memory(attention_forward_kernel<HSP, X3>, smem, &asked);
    bool aligned = rows_aligned(qkv, qkv, C, C / NH);
    attention_forward_kernel<HSP, X3>
        <<<grid, THREADS, smem, compute_stream>>>(out, lse, qkv, T, C, NH, scale, aligned);
    cuda_check(cudaGetLastError());
}

template <int HSP, bool X3>
static void backward_tiled(float *dqkv, const float *dout, const float *qkv, const float *lse,
                           const float *delta, int B, int T, int C, int NH, float scale) {
    static bool asked[2] = {false, false};
    dim3 grid((T + TILE - 1) / TILE, B * NH);
    size_t planes = X3 ? 2 : 1, tile_bytes = TILE * (HSP + 4) * sizeof(float);
    size_t smem_dkdv =
        (2 + 2 * planes) * tile_bytes + 2 * TILE * sizeof(float); /* K, V; Q, dO (prepared); lse, D */
    size_t smem_dq = 4 * tile_bytes;                              /* Q, dO, K, V */
    bool aligned = rows_aligned(qkv, dout, C, C / NH);
    allow_shared_memory(attention_dkdv_kernel<HSP, X3>, smem_dkdv, &asked[0]);
    attention_dkdv_kernel<HSP, X3>
        <<<grid, THREADS, smem_dkdv, compute_stream>>>(dqkv, dout, qkv, lse, delta, T, C, NH, scale, aligned);
    cuda_check(cudaGetLastError());
    allow_shared_memory(attention_dq_kernel<HSP, X3>, smem_dq, &asked[1]);
    attention_dq_kernel<HSP, X3>
        <<<grid, THREADS, smem_dq, compute_stream>>>(dqkv, dout, qkv, lse, delta, T, C, NH, scale, aligned);
    cuda_check(cudaGetLastError());
}

/* Strict fp32 (3xTF32) unless COURSE_TF32=1 allows plain TF32, as for cuBLAS,
 * or the run is a 16-bit one (cuda_attention_tf32). */
template <int HSP>
static void forward_at(float *out, float *lse, const float *qkv, int B, int T, int C, int NH, float scale) {
    if (cuda_attention_tf32())
        forward_tiled<HSP, false>(out, lse, qkv, B, T, C, NH, scale);
    else
        forward_tiled<HSP, true>(out, lse, qkv, B, T, C, NH, scale);
}
template <int HSP>
static void backward_at(float *dqkv, const float *dout, const float *qkv, const float *lse,
                        const float *delta, int B, int T, int C, int NH, float scale) {
    if (cuda_attention_tf32())
        backward_tiled<HSP, false>(dqkv, dout, qkv, lse, delta, B, T, C, NH, scale);
    else
        backward_tiled<HSP, true>(dqkv, dout, qkv, lse, delta, B, T, C, NH, scale);
}

/* The padded head size of the tiled kernels, or 0 for the row path. */
static int padded_head_size(int hs) {
    return hs <= 16 ? 16 : hs <= 32 ? 32 : hs <= 64 ? 64 : hs <= 128 ? 128 : 0;
}

extern "C" void attention_forward_cuda(float *out, float *lse, const float *qkv, int B, int T, int C,
                                       int NH) {
    if ((size_t)B * T * C == 0) return;
    int hs = C / NH;
    float scale = 1.0f / sqrtf((float)hs);
    switch (padded_head_size(hs)) {
    case 16:
        forward_at<16>(out, lse, qkv, B, T, C, NH, scale);
        break;
    case 32:
        forward_at<32>(out, lse, qkv, B, T, C, NH, scale);
        break;
    case 64:
        forward_at<64>(out, lse, qkv, B, T, C, NH, scale);
        break;
    case 128:
        forward_at<128>(out, lse, qkv, B, T, C, NH, scale);
        break;
    default: {
        size_t rows = (size_t)B * NH * T;
        attention_rows_forward_kernel<<<(unsigned)((rows + WARPS - 1) / WARPS), THREADS, 0, compute_stream>>>(
            out, lse, qkv, T, C, NH, scale, rows);
        cuda_check(cudaGetLastError());
    }
    }
}

extern "C" void attention_backward_cuda(float *dqkv, const float *dout, const float *qkv, const float *out,
                                        const float *lse, int B, int T, int C, int NH) {
    if ((size_t)B * T * C == 0) return;
    int hs = C / NH;
    float scale = 1.0f / sqrtf((float)hs);
    size_t rows = (size_t)B * NH * T;
    unsigned row_blocks = (unsigned)((rows + WARPS - 1) / WARPS);
    float *delta = delta_scratch(rows * sizeof(float));
    attention_delta_kernel<<<row_blocks, THREADS, 0, compute_stream>>>(delta, dout, out, T, C, NH, rows);
    cuda_check(cudaGetLastError());
    switch (padded_head_size(hs)) {
    case 16:
        backward_at<16>(dqkv, dout, qkv, lse, delta, B, T, C, NH, scale);
        break;
    case 32:
        backward_at<32>(dqkv, dout, qkv, lse, delta, B, T, C, NH, scale);
        break;
    case 64:
        backward_at<64>(dqkv, dout, qkv, lse, delta, B, T, C, NH, scale);
        break;
    case 128:
        backward_at<128>(dqkv, dout, qkv, lse, delta, B, T, C, NH, scale);
        break;
    default:
        attention_rows_backward_kernel<<<row_blocks, THREADS, 0, compute_stream>>>(
            dqkv, dout, qkv, lse, delta, T, C, NH, scale, rows);
        cuda_check(cudaGetLastError());
    }
}
