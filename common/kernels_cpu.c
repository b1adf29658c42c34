/* kernels_cpu.c: the CPU backend of kernels.h (C + OpenMP, matmuls through CBLAS).
 *
 * Mirrors kernels_cuda.cu function for function. Every reduction here has a
 * fixed order that does not depend on the number of threads, so a run gives
 * bit-identical results each time on the same machine, which the determinism
 * and checkpoint-resume tests rely on. */
#include "kernels.h"
#include "util.h"

#include <cblas.h>
#include <math.h>
#include <string.h>

#define LAYERNORM_EPS 1e-5f
#define GELU_SCALE 0.7978845608028654f /* sqrt(2 / pi) */

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

static void layernorm_forward(float *out, float *mean, float *rstd, const float *inp, const float *weight,
                              const float *bias, int N, int C) {
#pragma omp parallel for
    for (int n = 0; n < N; n++) {
        const float *x = inp + (size_t)n * C;
        double sum = 0.0;
        for (int c = 0; c < C; c++) sum += x[c];
        float m = (float)(sum / C);
        double var = 0.0;
        for (int c = 0; c < C; c++) var += (double)(x[c] - m) * (x[c] - m);
        float s = 1.0f / sqrtf((float)(var / C) + LAYERNORM_EPS);
        float *o = out + (size_t)n * C;
        for (int c = 0; c < C; c++) o[c] = (x[c] - m) * s * weight[c] + bias[c];
        mean[n] = m;
        rstd[n] = s;
    }
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
    /* dweight, dbias: each thread owns a range of channels and sums over rows in order. */
#pragma omp parallel for schedule(static)
    for (int c = 0; c < C; c++) {
        double dw = 0.0, db = 0.0;
        for (int n = 0; n < N; n++) {
            float g = dout[(size_t)n * C + c];
            dw += (double)g * (inp[(size_t)n * C + c] - mean[n]) * rstd[n];
            db += g;
        }
        dweight[c] += (float)dw;
        dbias[c] += (float)db;
    }
    /* EXERCISE 01.1 END */
}

static void linear_forward(float *out, const float *inp, const float *weight, const float *bias, int N, int C,
                           int OC) {
    /* out(N,OC) = inp(N,C) @ weight(OC,C)^T */
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, OC, C, 1.0f, inp, C, weight, C, 0.0f, out, OC);
    if (bias) {
#pragma omp parallel for
        for (int n = 0; n < N; n++)
            for (int o = 0; o < OC; o++) out[(size_t)n * OC + o] += bias[o];
    }
}

static void linear_backward(float *dinp, float *dweight, float *dbias, const float *dout, const float *inp,
                            const float *weight, int N, int C, int OC) {
    /* dinp(N,C) += dout(N,OC) @ weight(OC,C) */
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, C, OC, 1.0f, dout, OC, weight, C, 1.0f, dinp, C);
    /* dweight(OC,C) += dout^T(OC,N) @ inp(N,C) */
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, OC, C, N, 1.0f, dout, OC, inp, C, 1.0f, dweight, C);
    if (dbias) {
#pragma omp parallel for schedule(static)
        for (int o = 0; o < OC; o++) {
            double sum = 0.0;
            for (int n = 0; n < N; n++) sum += dout[(size_t)n * OC + o];
            dbias[o] += (float)sum;
        }
    }
}

static void attention_forward(float *out, float *att, const float *qkv, int B, int T, int C, int NH) {
    int hs = C / NH;
    float scale = 1.0f / sqrtf((float)hs);
    size_t C3 = 3 * (size_t)C;
#pragma omp parallel for collapse(2)
    for (int b = 0; b < B; b++) {
        for (int h = 0; h < NH; h++) {
            const float *base = qkv + (size_t)b * T * C3;
            for (int t = 0; t < T; t++) {
                const float *q = base + t * C3 + h * hs;
                float *row = att + (((size_t)b * NH + h) * T + t) * T;
                /* scores against keys 0..t (the causal mask hides the rest) */
                float maxval = -INFINITY;
                for (int t2 = 0; t2 <= t; t2++) {
                    const float *k = base + t2 * C3 + C + h * hs;
                    float dot = 0.0f;
                    for (int i = 0; i < hs; i++) dot += q[i] * k[i];
                    row[t2] = dot * scale;
                    if (row[t2] > maxval) maxval = row[t2];
                }
                float sum = 0.0f;
                for (int t2 = 0; t2 <= t; t2++) {
                    row[t2] = expf(row[t2] - maxval);
                    sum += row[t2];
                }
                for (int t2 = 0; t2 <= t; t2++) row[t2] /= sum;
                for (int t2 = t + 1; t2 < T; t2++) row[t2] = 0.0f;
                /* weighted sum of the values */
                float *o = out + ((size_t)b * T + t) * C + h * hs;
                for (int i = 0; i < hs; i++) o[i] = 0.0f;
                for (int t2 = 0; t2 <= t; t2++) {
                    const float *v = base + t2 * C3 + 2 * C + h * hs;
                    for (int i = 0; i < hs; i++) o[i] += row[t2] * v[i];
                }
            }
        }
    }
}

static void attention_backward(float *dqkv, float *datt, const float *dout, const float *qkv, const float *att,
                               int B, int T, int C, int NH) {
    int hs = C / NH;
    float scale = 1.0f / sqrtf((float)hs);
    size_t C3 = 3 * (size_t)C;
    /* One (b, h) pair per iteration: it writes only head h's columns of batch
     * row b, so pairs never collide. */
#pragma omp parallel for collapse(2)
    for (int b = 0; b < B; b++) {
        for (int h = 0; h < NH; h++) {
            const float *base = qkv + (size_t)b * T * C3;
            float *dbase = dqkv + (size_t)b * T * C3;
            for (int t = 0; t < T; t++) {
                const float *arow = att + (((size_t)b * NH + h) * T + t) * T;
                float *drow = datt + (((size_t)b * NH + h) * T + t) * T;
                const float *g = dout + ((size_t)b * T + t) * C + h * hs;
                /* out = att @ v:  datt = g . v,  dv += att * g */
                for (int t2 = 0; t2 <= t; t2++) {
                    const float *v = base + t2 * C3 + 2 * C + h * hs;
                    float *dv = dbase + t2 * C3 + 2 * C + h * hs;
                    float dot = 0.0f;
                    for (int i = 0; i < hs; i++) {
                        dot += g[i] * v[i];
                        dv[i] += arow[t2] * g[i];
                    }
                    drow[t2] = dot;
                }
                /* softmax backward: dscore = att * (datt - sum(att * datt)) */
                float weighted = 0.0f;
                for (int t2 = 0; t2 <= t; t2++) weighted += arow[t2] * drow[t2];
                const float *q = base + t * C3 + h * hs;
                float *dq = dbase + t * C3 + h * hs;
                for (int t2 = 0; t2 <= t; t2++) {
                    float dscore = arow[t2] * (drow[t2] - weighted) * scale;
                    const float *k = base + t2 * C3 + C + h * hs;
                    float *dk = dbase + t2 * C3 + C + h * hs;
                    for (int i = 0; i < hs; i++) {
                        dq[i] += dscore * k[i];
                        dk[i] += dscore * q[i];
                    }
                }
            }
        }
    }
}

static void gelu_forward(float *out, const float *inp, size_t n) {
#pragma omp parallel for
    for (size_t i = 0; i < n; i++) {
        float x = inp[i];
        out[i] = 0.5f * x * (1.0f + tanhf(GELU_SCALE * (x + 0.044715f * x * x * x)));
    }
}

static void gelu_backward(float *dinp, const float *inp, const float *dout, size_t n) {
#pragma omp parallel for
    for (size_t i = 0; i < n; i++) {
        float x = inp[i];
        float u = GELU_SCALE * (x + 0.044715f * x * x * x);
        float th = tanhf(u);
        float sech2 = 1.0f - th * th;
        float du_dx = GELU_SCALE * (1.0f + 3.0f * 0.044715f * x * x);
        dinp[i] += dout[i] * (0.5f * (1.0f + th) + 0.5f * x * sech2 * du_dx);
    }
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

static void crossentropy_forward(float *losses, float *probs, const float *logits, const int *targets, int N,
                                 int V) {
#pragma omp parallel for
    for (int n = 0; n < N; n++) {
        const float *z = logits + (size_t)n * V;
        float *p = probs + (size_t)n * V;
        float maxval = -INFINITY;
        for (int v = 0; v < V; v++)
            if (z[v] > maxval) maxval = z[v];
        double sum = 0.0;
        for (int v = 0; v < V; v++) {
            p[v] = expf(z[v] - maxval);
            sum += p[v];
        }
        float inv = (float)(1.0 / sum);
        for (int v = 0; v < V; v++) p[v] *= inv;
        /* -log p[target] computed from the logits keeps precision for tiny p */
        losses[n] = (float)(log(sum) - (z[targets[n]] - maxval));
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

/* Fixed chunking: the order of additions depends only on n, not on threads. */
#define SUM_CHUNKS 64
static double sum_squares(const float *x, size_t n) {
    double partial[SUM_CHUNKS];
    size_t chunk = (n + SUM_CHUNKS - 1) / SUM_CHUNKS;
#pragma omp parallel for schedule(static)
    for (int k = 0; k < SUM_CHUNKS; k++) {
        size_t lo = k * chunk, hi = lo + chunk < n ? lo + chunk : n;
        double s = 0.0;
        for (size_t i = lo; i < hi; i++) s += (double)x[i] * x[i];
        partial[k] = s;
    }
    double total = 0.0;
    for (int k = 0; k < SUM_CHUNKS; k++) total += partial[k];
    return total;
}

static void adamw_update(float *params, const float *grads, float *m, float *v, size_t n, float lr, float beta1,
                         float beta2, float eps, float weight_decay, float grad_scale, int t) {
    /* EXERCISE 01.2 BEGIN: the AdamW update (course.md, exercise 01.2) */
    float bias1 = 1.0f - powf(beta1, (float)t);
    float bias2 = 1.0f - powf(beta2, (float)t);
#pragma omp parallel for
    for (size_t i = 0; i < n; i++) {
        float g = grads[i] * grad_scale;
        float mi = beta1 * m[i] + (1.0f - beta1) * g;
        float vi = beta2 * v[i] + (1.0f - beta2) * g * g;
        m[i] = mi;
        v[i] = vi;
        float mhat = mi / bias1, vhat = vi / bias2;
        params[i] -= lr * (mhat / (sqrtf(vhat) + eps) + weight_decay * params[i]);
    }
    /* EXERCISE 01.2 END */
}

static void fill_zero(float *x, size_t n) { memset(x, 0, n * sizeof(float)); }

static void scale(float *x, size_t n, float factor) {
#pragma omp parallel for
    for (size_t i = 0; i < n; i++) x[i] *= factor;
}

const KernelOps kernels_cpu = {
    .name = "cpu",
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
