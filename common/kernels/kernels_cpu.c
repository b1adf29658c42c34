/* kernels_cpu.c: the CPU backend of kernels.h (C + OpenMP, matmuls through CBLAS).
 *
 * Mirrors kernels_cuda.cu function for function. Attention, the one kernel
 * with a workspace of its own, lives in attention_cpu.c (attention.h); the
 * table at the end points at it. Every reduction here has a fixed order that
 * does not depend on the number of threads, so a run gives bit-identical
 * results each time on the same machine, which the determinism and
 * checkpoint-resume tests rely on. */
#include "common/kernels/attention.h" /* attention's kernels and workspace */
#include "common/device/device.h" /* mem_alloc, copies, streams, timers */
#include "common/kernels/kernel_math.h" /* per-element formulas of both backends */
#include "common/kernels/kernels.h" /* ops(): the kernel table */
#include "common/kernels/simd_cpu.h" /* the CPU kernels' vector helpers */
#include "common/core/util.h" /* fatal, log_info, exit codes, flag parsing */

#include <cblas.h>
#include <math.h>
#include <string.h>

#define LAYERNORM_EPS 1e-5f
#define GELU_SCALE 0.7978845608028654f /* sqrt(2 / pi) */

/* The elementwise loops run over blocks of ELEMENT_BLOCK floats: the
 * OpenMP loop hands whole blocks to threads (no two threads write into one
 * cache line) and each block is one call of a function with vector clones
 * (simd_cpu.h). GELU's tanh goes through vexpf: libm's expf and tanhf are
 * calls that keep a loop scalar, and GELU was a third of a CPU step with them. */
#define ELEMENT_BLOCK 8192

/* Below this many floats (4 MiB) one thread clears or copies faster than waking the
 * others: on the 2-core development machine, with passive waiting, 2 MiB took
 * 168 us on one thread and 176 us on two, 6 MiB 581 us and 378 us. */
#define PARALLEL_FILL_FLOATS (1 << 20)

static void embedding_forward(float *out, const int *tokens, const float *wte, const float *wpe, int B, int T,
                              int C) {
#pragma omp parallel for collapse(2)
    for (int b = 0; b < B; b++) {
        for (int t = 0; t < T; t++) {
            float *o = out + ((size_t)b * T + t) * C;
            const float *tok_row = wte + (size_t)tokens[b * T + t] * C;
            const float *pos_row = wpe + (size_t)t * C;
            for (int c = 0; c < C; c++) o[c] = tok_row[c] + pos_row[c];
        }
    }
}

static void embedding_backward(float *dwte, float *dwpe, const float *dout, const int *tokens, int B, int T,
                               int C, int V) {
    (void)V;
    /* Threads own disjoint channel ranges, so scattering into rows of dwte
     * needs no atomics and the summation order is fixed. */
#pragma omp parallel
    {
#pragma omp for schedule(static)
        for (int c = 0; c < C; c++) {
            for (int b = 0; b < B; b++) {
                for (int t = 0; t < T; t++) {
                    float g = dout[((size_t)b * T + t) * C + c];
                    dwte[(size_t)tokens[b * T + t] * C + c] += g;
                    dwpe[(size_t)t * C + c] += g;
                }
            }
        }
    }
}

/* One row of layernorm forward. The sums run in double, in vector lanes
 * (omp simd: the order of additions is fixed by the width of the clone). */
CPU_VECTOR_CLONES static void layernorm_forward_row(float *o, float *mean, float *rstd, const float *x,
                                                    const float *weight, const float *bias, int C) {
    double sum = 0.0;
#pragma omp simd reduction(+ : sum)
    for (int c = 0; c < C; c++) sum += x[c];
    float m = (float)(sum / C);
    double var = 0.0;
#pragma omp simd reduction(+ : var)
    for (int c = 0; c < C; c++) var += (double)(x[c] - m) * (x[c] - m);
    float s = 1.0f / sqrtf((float)(var / C) + LAYERNORM_EPS);
    for (int c = 0; c < C; c++) o[c] = (x[c] - m) * s * weight[c] + bias[c];
    *mean = m;
    *rstd = s;
}

static void layernorm_forward(float *out, float *mean, float *rstd, const float *inp, const float *weight,
                              const float *bias, int N, int C) {
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++)
        layernorm_forward_row(out + (size_t)n * C, &mean[n], &rstd[n], inp + (size_t)n * C, weight, bias, C);
}

static void layernorm_backward(float *dinp, float *dweight, float *dbias, const float *dout, const float *inp,
                               const float *weight, const float *mean, const float *rstd, int N, int C) {
    /* EXERCISE 01.1 BEGIN: layernorm backward (course.md, exercise 01.1) */
    /* dinp: rows are independent. */
#pragma omp parallel for
    for (int n = 0; n < N; n++) {
        const float *x = inp + (size_t)n * C;
        const float *g = dout + (size_t)n * C;
        float m = mean[n], s = rstd[n];
        /* with xhat = (x - m) * s and dxhat = g * weight:
         * dx = s * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat)) */
        double sum_dxhat = 0.0, sum_dxhat_xhat = 0.0;
        for (int c = 0; c < C; c++) {
            float xhat = (x[c] - m) * s;
            float dxhat = g[c] * weight[c];
            sum_dxhat += dxhat;
            sum_dxhat_xhat += (double)dxhat * xhat;
        }
        float mean_dxhat = (float)(sum_dxhat / C), mean_dxhat_xhat = (float)(sum_dxhat_xhat / C);
        float *dx = dinp + (size_t)n * C;
        for (int c = 0; c < C; c++) {
            float xhat = (x[c] - m) * s;
            dx[c] += s * (g[c] * weight[c] - mean_dxhat - xhat * mean_dxhat_xhat);
        }
    }
    /* dweight, dbias: threads own blocks of 64 channels and walk the rows in
     * order (whole cache lines per row; the order of each sum is fixed). */
#pragma omp parallel for schedule(static)
    for (int c0 = 0; c0 < C; c0 += 64) {
        int width = C - c0 < 64 ? C - c0 : 64;
        double dw[64] = {0}, db[64] = {0};
        for (int n = 0; n < N; n++) {
            const float *g = dout + (size_t)n * C + c0, *x = inp + (size_t)n * C + c0;
            for (int j = 0; j < width; j++) {
                dw[j] += (double)g[j] * (x[j] - mean[n]) * rstd[n];
                db[j] += g[j];
            }
        }
        for (int j = 0; j < width; j++) {
            dweight[c0 + j] += (float)dw[j];
            dbias[c0 + j] += (float)db[j];
        }
    }
    /* EXERCISE 01.1 END */
}

static void linear_forward(float *out, const float *inp, const float *weight, const float *bias, int N, int C,
                           int OC) {
    /* out(N,OC) = bias + inp(N,C) @ weight(OC,C)^T: the bias rows first, then
     * the product added onto them (beta = 1). With beta = 0 OpenBLAS would
     * clear out in a pass of its own, and the bias would be a third pass. */
    if (bias) {
#pragma omp parallel for schedule(static) if ((size_t)N * OC >= PARALLEL_FILL_FLOATS)
        for (int n = 0; n < N; n++) memcpy(out + (size_t)n * OC, bias, (size_t)OC * sizeof(float));
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, OC, C, 1.0f, inp, C, weight, C,
                bias ? 1.0f : 0.0f, out, OC);
}
/* dbias[o0 .. o0 + width) += column sums of dout(N,OC) there, width <= 64.
 * Blocks of 32 rows are summed in float (64 float accumulators fit in vector
 * registers; 64 doubles did not), and the blocks' sums in double, in order. */
CPU_VECTOR_CLONES static void column_sums(float *dbias, const float *dout, int N, int OC, int o0, int width) {
    double sum[64] = {0};
    for (int n0 = 0; n0 < N; n0 += 32) {
        float block[64] = {0};
        int n1 = N - n0 < 32 ? N : n0 + 32;
        for (int n = n0; n < n1; n++) {
            const float *row = dout + (size_t)n * OC + o0;
            for (int j = 0; j < width; j++) block[j] += row[j];
        }
        for (int j = 0; j < width; j++) sum[j] += block[j];
    }
    for (int j = 0; j < width; j++) dbias[o0 + j] += (float)sum[j];
}

/* dbias(OC) += column sums of dout(N,OC) */
static void bias_backward(float *dbias, const float *dout, int N, int OC) {
    /* threads own blocks of 64 columns and walk the rows in order */
#pragma omp parallel for schedule(static)
    for (int o0 = 0; o0 < OC; o0 += 64) column_sums(dbias, dout, N, OC, o0, OC - o0 < 64 ? OC - o0 : 64);
}

static void linear_backward_input(float *dinp, const float *dout, const float *weight, int N, int C, int OC) {
    /* dinp(N,C) += dout(N,OC) @ weight(OC,C) */
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, C, OC, 1.0f, dout, OC, weight, C, 1.0f, dinp,
                C);
}

static void linear_backward_weight(float *dweight, float *dbias, const float *dout, const float *inp, int N,
                                   int C, int OC) {
    /* dweight(OC,C) += dout^T(OC,N) @ inp(N,C) */
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, OC, C, N, 1.0f, dout, OC, inp, C, 1.0f, dweight, C);
    if (dbias) bias_backward(dbias, dout, N, OC);
}

static void linear_backward(float *dinp, float *dweight, float *dbias, const float *dout, const float *inp,
                            const float *weight, int N, int C, int OC) {
    linear_backward_input(dinp, dout, weight, N, C, OC);
    linear_backward_weight(dweight, dbias, dout, inp, N, C, OC);
}

/* ---- matmuls with 16-bit inputs ----
 * The operands rounded to 16 bits into workspaces grown on demand, then the
 * fp32 kernels above: the products of 16-bit values are exact in fp32 and
 * sgemm accumulates them in fp32, which is what a 16-bit GEMM with fp32
 * accumulation computes, at fp32's speed. OpenBLAS's own bf16 GEMM,
 * cblas_sbgemm, is declared by the installed cblas.h but missing from
 * Debian's libopenblas 0.3.21 (built without BUILD_BFLOAT16), and OpenBLAS has
 * no fp16 GEMM at all. */
enum { OPERAND_INP, OPERAND_WEIGHT, OPERAND_DOUT, OPERANDS };
static float *half_operand[OPERANDS];
static size_t half_operand_floats[OPERANDS];

/* a (count elements) rounded to `format`, as floats, in workspace `slot`. */
/* The floats of operand `slot` of an (N, C) x (OC, C) matmul. */
static size_t operand_floats(int slot, int N, int C, int OC) {
    return slot == OPERAND_INP ? (size_t)N * C : slot == OPERAND_WEIGHT ? (size_t)OC * C : (size_t)N * OC;
}

size_t half_matmul_workspace_bytes_cpu(int N, const LinearShape *shapes, int count) {
    size_t largest[OPERANDS] = {0}, bytes = 0;
    for (int slot = 0; slot < OPERANDS; slot++) {
        for (int i = 0; i < count; i++) {
            size_t n = operand_floats(slot, N, shapes[i].in, shapes[i].out);
            if (n > largest[slot]) largest[slot] = n;
        }
        bytes += largest[slot] * sizeof(float);
    }
    return bytes;
}

/* Workspace `slot`, grown to at least `count` floats. */
static float *half_operand_grown(int slot, size_t count) {
    if (count > half_operand_floats[slot]) {
        mem_free(half_operand[slot]);
        half_operand[slot] =
            mem_alloc(cpu_kernel_space(), CAT_WORKSPACE, count * sizeof(float), "16-bit matmul operand");
        half_operand_floats[slot] = count;
    }
    return half_operand[slot];
}

void half_matmul_grow_cpu(HalfMatmul which, int N, int C, int OC) {
    /* each call's two operands, in the order the functions below round them */
    static const int operands[3][2] = {[HALF_MATMUL_FORWARD] = {OPERAND_INP, OPERAND_WEIGHT},
                                       [HALF_MATMUL_BACKWARD_INPUT] = {OPERAND_DOUT, OPERAND_WEIGHT},
                                       [HALF_MATMUL_BACKWARD_WEIGHT] = {OPERAND_DOUT, OPERAND_INP}};
    for (int k = 0; k < 2; k++)
        half_operand_grown(operands[which][k], operand_floats(operands[which][k], N, C, OC));
}

static const float *half_operand_of(int slot, const float *a, size_t count, HalfFormat format) {
    float *values = half_operand_grown(slot, count);
#pragma omp parallel for
    for (size_t i = 0; i < count; i++) values[i] = half_to_float(half_from_float(a[i], format), format);
    return values;
}

static void linear_forward_half(float *out, const float *inp, const float *weight, const float *bias, int N,
                                int C, int OC, HalfFormat format) {
    linear_forward(out, half_operand_of(OPERAND_INP, inp, operand_floats(OPERAND_INP, N, C, OC), format),
                   half_operand_of(OPERAND_WEIGHT, weight, operand_floats(OPERAND_WEIGHT, N, C, OC), format),
                   bias, N, C, OC);
}

static void linear_backward_input_half(float *dinp, const float *dout, const float *weight, int N, int C,
                                       int OC, HalfFormat format) {
    linear_backward_input(
        dinp, half_operand_of(OPERAND_DOUT, dout, operand_floats(OPERAND_DOUT, N, C, OC), format),
        half_operand_of(OPERAND_WEIGHT, weight, operand_floats(OPERAND_WEIGHT, N, C, OC), format), N, C, OC);
}

static void linear_backward_weight_half(float *dweight, float *dbias, const float *dout, const float *inp,
                                        int N, int C, int OC, HalfFormat format) {
    linear_backward_weight(
        dweight, NULL, half_operand_of(OPERAND_DOUT, dout, operand_floats(OPERAND_DOUT, N, C, OC), format),
        half_operand_of(OPERAND_INP, inp, operand_floats(OPERAND_INP, N, C, OC), format), N, C, OC);
    if (dbias) bias_backward(dbias, dout, N, OC); /* a sum of fp32 values: not rounded */
}

static void linear_backward_half(float *dinp, float *dweight, float *dbias, const float *dout,
                                 const float *inp, const float *weight, int N, int C, int OC,
                                 HalfFormat format) {
    linear_backward_input_half(dinp, dout, weight, N, C, OC, format);
    linear_backward_weight_half(dweight, dbias, dout, inp, N, C, OC, format);
}

static void release_workspaces(void) {
    attention_release_cpu();
    for (int slot = 0; slot < OPERANDS; slot++) {
        mem_free(half_operand[slot]);
        half_operand[slot] = NULL;
        half_operand_floats[slot] = 0;
    }
}

CPU_VECTOR_CLONES static void gelu_forward_block(float *out, const float *inp, size_t n) {
    for (size_t i = 0; i < n; i++) {
        float x = inp[i];
        out[i] = 0.5f * x * (1.0f + vtanhf(GELU_SCALE * (x + 0.044715f * x * x * x)));
    }
}

static void gelu_forward(float *out, const float *inp, size_t n) {
#pragma omp parallel for schedule(static)
    for (size_t i0 = 0; i0 < n; i0 += ELEMENT_BLOCK)
        gelu_forward_block(out + i0, inp + i0, n - i0 < ELEMENT_BLOCK ? n - i0 : ELEMENT_BLOCK);
}

CPU_VECTOR_CLONES static void gelu_backward_block(float *dinp, const float *inp, const float *dout,
                                                  size_t n) {
    for (size_t i = 0; i < n; i++) {
        float x = inp[i];
        float u = GELU_SCALE * (x + 0.044715f * x * x * x);
        float th = vtanhf(u);
        float sech2 = 1.0f - th * th;
        float du_dx = GELU_SCALE * (1.0f + 3.0f * 0.044715f * x * x);
        dinp[i] += dout[i] * (0.5f * (1.0f + th) + 0.5f * x * sech2 * du_dx);
    }
}

static void gelu_backward(float *dinp, const float *inp, const float *dout, size_t n) {
#pragma omp parallel for schedule(static)
    for (size_t i0 = 0; i0 < n; i0 += ELEMENT_BLOCK)
        gelu_backward_block(dinp + i0, inp + i0, dout + i0, n - i0 < ELEMENT_BLOCK ? n - i0 : ELEMENT_BLOCK);
}

static void residual_forward(float *out, const float *a, const float *b, size_t n) {
#pragma omp parallel for
    for (size_t i = 0; i < n; i++) out[i] = a[i] + b[i];
}

static void residual_backward(float *da, float *db, const float *dout, size_t n) {
#pragma omp parallel for
    for (size_t i = 0; i < n; i++) {
        da[i] += dout[i];
        db[i] += dout[i];
    }
}

/* ---- a mixture of experts: moving rows (kernels.h) ---- */

static void moe_gather(float *out, const float *inp, const int *src, int R, int C) {
#pragma omp parallel for
    for (int i = 0; i < R; i++) memcpy(out + (size_t)i * C, inp + (size_t)src[i] * C, (size_t)C * sizeof(float));
}

static void moe_scatter_add(float *dinp, const float *dout, const int *pos, int N, int K, int C) {
#pragma omp parallel for
    for (int n = 0; n < N; n++)
        for (int k = 0; k < K; k++) {
            int row = pos[(size_t)n * K + k];
            if (row < 0) continue;
            float *d = dinp + (size_t)n * C;
            const float *g = dout + (size_t)row * C;
            for (int c = 0; c < C; c++) d[c] += g[c];
        }
}

static void moe_combine(float *out, const float *y, const int *pos, const float *gate, int N, int K, int C) {
#pragma omp parallel for
    for (int n = 0; n < N; n++) {
        float *o = out + (size_t)n * C;
        for (int c = 0; c < C; c++) o[c] = 0.0f;
        for (int k = 0; k < K; k++) {
            int row = pos[(size_t)n * K + k];
            if (row < 0) continue;
            float w = gate[(size_t)n * K + k];
            const float *v = y + (size_t)row * C;
            for (int c = 0; c < C; c++) o[c] += w * v[c];
        }
    }
}

static void moe_combine_backward(float *dy, float *dgate, const float *dout, const float *y, const int *pos,
                                 const float *gate, int N, int K, int C) {
#pragma omp parallel for
    for (int n = 0; n < N; n++)
        for (int k = 0; k < K; k++) {
            int row = pos[(size_t)n * K + k];
            if (row < 0) continue;
            float w = gate[(size_t)n * K + k];
            double dot = 0.0; /* in double, rounded once, as the CUDA backend's */
            const float *d = dout + (size_t)n * C, *v = y + (size_t)row * C;
            float *dv = dy + (size_t)row * C;
            for (int c = 0; c < C; c++) {
                dv[c] += w * d[c];
                dot += (double)d[c] * v[c];
            }
            dgate[(size_t)n * K + k] += (float)dot;
        }
}

/* One row of crossentropy forward: the softmax of z (V logits) into p, and
 * the row's loss -log p[target], computed from the logits (log of the sum
 * minus the target's shifted logit) to keep its precision for tiny p. */
CPU_VECTOR_CLONES static float crossentropy_row(float *p, const float *z, int target, int V) {
    float maxval = -INFINITY;
#pragma omp simd reduction(max : maxval)
    for (int v = 0; v < V; v++) maxval = z[v] > maxval ? z[v] : maxval;
    double sum = 0.0;
#pragma omp simd reduction(+ : sum)
    for (int v = 0; v < V; v++) {
        p[v] = vexpf(z[v] - maxval);
        sum += p[v];
    }
    float inv = (float)(1.0 / sum);
    for (int v = 0; v < V; v++) p[v] *= inv;
    return (float)(log(sum) - (z[target] - maxval));
}

static void crossentropy_forward(float *losses, float *probs, const float *logits, const int *targets, int N,
                                 int V, int Vp) {
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        float *p = probs + (size_t)n * Vp;
        losses[n] = crossentropy_row(p, logits + (size_t)n * Vp, targets[n], V);
        for (int v = V; v < Vp; v++) p[v] = 0.0f; /* padded rows: never predicted */
    }
}

static void crossentropy_backward(float *dlogits, const float *probs, const int *targets, float dloss, int N,
                                  int V) {
#pragma omp parallel for
    for (int n = 0; n < N; n++) {
        const float *p = probs + (size_t)n * V;
        float *d = dlogits + (size_t)n * V;
        for (int v = 0; v < V; v++) d[v] += (p[v] - (v == targets[n] ? 1.0f : 0.0f)) * dloss;
    }
}

/* ---- the vocabulary split over ranks (kernels.h) ---- */

static void embedding_forward_rows(float *out, const int *tokens, const float *wte, const float *wpe, int B,
                                   int T, int C, int first, int rows) {
#pragma omp parallel for collapse(2)
    for (int b = 0; b < B; b++) {
        for (int t = 0; t < T; t++) {
            float *o = out + ((size_t)b * T + t) * C;
            int row = tokens[b * T + t] - first;
            if (row < 0 || row >= rows) { /* another rank's row: it adds the token */
                memset(o, 0, (size_t)C * sizeof(float));
                continue;
            }
            const float *tok_row = wte + (size_t)row * C;
            const float *pos_row = wpe + (size_t)t * C;
            for (int c = 0; c < C; c++) o[c] = tok_row[c] + pos_row[c];
        }
    }
}

static void embedding_backward_rows(float *dwte, float *dwpe, const float *dout, const int *tokens, int B,
                                    int T, int C, int first, int rows) {
    /* as embedding_backward: threads own channels, the order of additions is fixed */
#pragma omp parallel for schedule(static)
    for (int c = 0; c < C; c++) {
        for (int b = 0; b < B; b++) {
            for (int t = 0; t < T; t++) {
                float g = dout[((size_t)b * T + t) * C + c];
                int row = tokens[b * T + t] - first;
                if (row >= 0 && row < rows) dwte[(size_t)row * C + c] += g;
                dwpe[(size_t)t * C + c] += g;
            }
        }
    }
}

static void crossentropy_slice_max(float *row_max, const float *logits, int N, int cols, int Vl) {
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const float *z = logits + (size_t)n * Vl;
        float maxval = -INFINITY;
        for (int v = 0; v < cols; v++) maxval = z[v] > maxval ? z[v] : maxval;
        row_max[n] = maxval;
    }
}

static void crossentropy_slice_sums(float *sums, float *row_max, const float *maxes, int parts,
                                    const float *logits, const int *targets, int N, int cols, int Vl,
                                    int first) {
    /* EXERCISE 03.4 BEGIN: the vocabulary-parallel cross-entropy (course.md, exercise 03.4) */
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const float *z = logits + (size_t)n * Vl;
        float maxval = -INFINITY;
        for (int p = 0; p < parts; p++) maxval = maxes[(size_t)p * N + n] > maxval ? maxes[(size_t)p * N + n] : maxval;
        row_max[n] = maxval;
        double sum = 0.0;
        for (int v = 0; v < cols; v++) sum += vexpf(z[v] - maxval);
        sums[n] = (float)sum;
        int target = targets[n] - first;
        sums[N + n] = target >= 0 && target < cols ? z[target] - maxval : 0.0f;
    }
    /* EXERCISE 03.4 END */
}

static void crossentropy_slice_finish(float *losses, float *probs, const float *logits, const float *row_max,
                                      const float *sums, int N, int cols, int Vl) {
    /* EXERCISE 03.4 BEGIN: the vocabulary-parallel cross-entropy (course.md, exercise 03.4) */
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const float *z = logits + (size_t)n * Vl;
        float *p = probs + (size_t)n * Vl;
        double sum = sums[n];
        float inv = (float)(1.0 / sum);
        for (int v = 0; v < cols; v++) p[v] = vexpf(z[v] - row_max[n]) * inv;
        for (int v = cols; v < Vl; v++) p[v] = 0.0f; /* padded rows: never predicted */
        losses[n] = (float)(log(sum) - sums[N + n]);
    }
    /* EXERCISE 03.4 END */
}

static void crossentropy_backward_rows(float *dlogits, const float *probs, const int *targets, float dloss,
                                       int N, int Vl, int first) {
    /* EXERCISE 03.4 BEGIN: the vocabulary-parallel cross-entropy (course.md, exercise 03.4) */
#pragma omp parallel for
    for (int n = 0; n < N; n++) {
        const float *p = probs + (size_t)n * Vl;
        float *d = dlogits + (size_t)n * Vl;
        int target = targets[n] - first;
        for (int v = 0; v < Vl; v++) d[v] += (p[v] - (v == target ? 1.0f : 0.0f)) * dloss;
    }
    /* EXERCISE 03.4 END */
}

/* Fixed chunking: the order of additions depends only on n, not on threads. */
#define SUM_CHUNKS 64
/* Of x(n) when given, else of the 16-bit h(n). */
static double chunked_sum_squares(const float *x, const uint16_t *h, size_t n, HalfFormat format) {
    double partial[SUM_CHUNKS];
    size_t chunk = (n + SUM_CHUNKS - 1) / SUM_CHUNKS;
#pragma omp parallel for schedule(static)
    for (int k = 0; k < SUM_CHUNKS; k++) {
        size_t lo = k * chunk, hi = lo + chunk < n ? lo + chunk : n;
        double s = 0.0;
        for (size_t i = lo; i < hi; i++) s += square_at(x, h, i, format);
        partial[k] = s;
    }
    double total = 0.0;
    for (int k = 0; k < SUM_CHUNKS; k++) total += partial[k];
    return total;
}

static double sum_squares(const float *x, size_t n) {
    return chunked_sum_squares(x, NULL, n, HALF_BF16);
}

static void adamw_update(float *params, const float *grads, float *m, float *v, size_t n, float lr,
                         float beta1, float beta2, float eps, float weight_decay, float grad_scale, int t) {
    float bias1 = 1.0f - powf(beta1, (float)t);
    float bias2 = 1.0f - powf(beta2, (float)t);
#pragma omp parallel for
    for (size_t i = 0; i < n; i++)
        adamw_element(&params[i], grads[i], &m[i], &v[i], lr, beta1, beta2, bias1, bias2, eps, weight_decay,
                      grad_scale);
}

static void fill_zero(float *x, size_t n) {
#pragma omp parallel for schedule(static) if (n >= PARALLEL_FILL_FLOATS)
    for (size_t i0 = 0; i0 < n; i0 += ELEMENT_BLOCK)
        memset(x + i0, 0, (n - i0 < ELEMENT_BLOCK ? n - i0 : ELEMENT_BLOCK) * sizeof(float));
}

static void scale(float *x, size_t n, float factor) {
#pragma omp parallel for
    for (size_t i = 0; i < n; i++) x[i] *= factor;
}

static void cast_to_half(uint16_t *out, const float *inp, size_t n, HalfFormat format) {
#pragma omp parallel for
    for (size_t i = 0; i < n; i++) out[i] = half_from_float(inp[i], format);
}

static void cast_from_half(float *out, const uint16_t *inp, size_t n, HalfFormat format) {
#pragma omp parallel for
    for (size_t i = 0; i < n; i++) out[i] = half_to_float(inp[i], format);
}

static void accumulate_half(uint16_t *acc, const float *add, size_t n, HalfFormat format) {
#pragma omp parallel for
    for (size_t i = 0; i < n; i++) acc[i] = half_from_float(half_to_float(acc[i], format) + add[i], format);
}

static double sum_squares_half(const uint16_t *x, size_t n, HalfFormat format) {
    return chunked_sum_squares(NULL, x, n, format);
}

static void adamw_update_half(float *master, uint16_t *params, const uint16_t *grads, float *m, float *v,
                              size_t n, float lr, float beta1, float beta2, float eps, float weight_decay,
                              float grad_scale, int t, HalfFormat format) {
    float bias1 = 1.0f - powf(beta1, (float)t);
    float bias2 = 1.0f - powf(beta2, (float)t);
#pragma omp parallel for
    for (size_t i = 0; i < n; i++)
        params[i] = adamw_half_element(&master[i], grads[i], &m[i], &v[i], lr, beta1, beta2, bias1, bias2,
                                       eps, weight_decay, grad_scale, format);
}

static void fill_zero_half(uint16_t *x, size_t n) {
    memset(x, 0, n * sizeof(uint16_t));
}

const KernelOps kernels_cpu = {
    .name = "cpu",
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
    .attention_forward = attention_forward_cpu,
    .attention_backward = attention_backward_cpu,
    .attention_block_forward = attention_block_forward_cpu,
    .attention_merge = attention_merge_cpu,
    .attention_block_backward = attention_block_backward_cpu,
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
