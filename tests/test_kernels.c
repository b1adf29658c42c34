/* test_kernels.c: every CPU kernel checked against plain double-precision math.
 *
 *   build/tests/test_kernels [--seed S] [--verbose] [kernel]
 *
 * For each kernel of kernels_cpu.c this program
 *   1. runs the float forward on fresh random inputs and compares it with a
 *      reference forward written here in double precision with plain loops;
 *   2. checks the backward with a random projection: for the loss
 *      L = sum(out * w) with random weights w, dL/dout = w, so the float
 *      backward called with dout = w must return dL/d(input), which we also
 *      get from central finite differences of the double reference,
 *      (L(x + h) - L(x - h)) / 2h, one input element at a time.
 * Gradient buffers are pre-filled with random values before the backward and
 * the fill is subtracted afterwards, so a kernel that overwrites instead of
 * adding (kernels.h: every *_backward ADDS) fails. (Attention's second,
 * causal check starts from a zeroed buffer.)
 * The conversions to and from 16 bits (casts) are compared exactly with a
 * rounding computed in double (nearbyint at the format's unit in the last place).
 * AdamW and sum_squares have no backward; they are compared with their
 * formulas computed in double.
 *
 * Sizes are odd on purpose (T=17, C=48 as 3 heads of 16, V=67, OC=37) so that
 * no kernel passes by assuming multiples of 4, 32 or 64; attention, which
 * works in tiles of 64 queries, is also checked with T=130 and T=1, and with
 * 1 and 3 threads (the bits must not change). Inputs change every
 * run; the seed is printed first, and --seed reproduces a run (each kernel
 * draws from its own stream, so `--seed S layernorm` repeats exactly the
 * layernorm of a full run with seed S).
 *
 * Output: one line per kernel, "PASS name max_err=.. tol=.. (worst: ..)" or
 * "FAIL name <element> ...". Exit status 0 when all pass, 1 when one fails,
 * 2 on bad arguments. --verbose also prints every compared tensor's error. */
#include "common/kernels/kernels.h" /* ops(): the kernel table */
#include "common/model/mixed.h" /* mixed precision: 16-bit weights, loss scaling */
#include "common/model/moe.h" /* MoE buffers and routing */
#include "common/core/util.h" /* fatal, log_info, exit codes, flag parsing */

#include <float.h>
#include <math.h>
#include <omp.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* Test sizes (letters as in kernels.h). */
#define TEST_B 3
#define TEST_T 17
#define TEST_MAXT 20 /* rows of wpe; rows T..MAXT-1 must get no gradient */
#define TEST_C 48
#define TEST_NH 3 /* hs = 16 */
#define TEST_V 67
#define TEST_OC 37
#define TEST_N (TEST_B * TEST_T)
#define TEST_ELEMENTWISE_N 2003 /* gelu, residual */

/* Tolerances. Every comparison is "max |kernel - reference| <= rtol * scale",
 * with scale the largest |reference| in the tensor (1 when that is 0).
 * Measured over 1000 seeds (1 to 3 threads), the worst float-vs-double error
 * of a correct kernel is 4e-7 of scale (forward), 5e-7 (gradients) and
 * 2.4e-7 (AdamW).
 *  - Forward: float kernels summing at most ~50 terms; 2e-5 is a ~50x margin.
 *  - Gradients: central differences of the double reference with h = 1e-5
 *    are exact to ~1e-9 (truncation ~h^2, rounding ~1e-16 |L| / h), so the
 *    error measured is the float kernel's own; 5e-5 is a ~100x margin, while
 *    a wrong formula (a lost factor, a wrong sign, a missing term) is off by
 *    1e-2 of scale or more.
 *  - AdamW: three float steps against double; 2e-5 (~80x) still sees a missing
 *    weight decay (lr * wd = 1e-3 of a parameter per step).
 *  - sum_squares accumulates in double: only the order of the additions
 *    differs from the reference (~1e-13 relative); 1e-10 fails a float
 *    accumulator (~1e-5 off over a million elements). */
#define FD_STEP 1e-5
#define FORWARD_RTOL 2e-5
#define GRAD_RTOL 5e-5
#define ADAMW_RTOL 2e-5
#define SUM_SQUARES_RTOL 1e-10
#define FD_SAMPLES 200 /* random elements per tensor where checking all of them is slow */

/* ---- randomness and buffers ---------------------------------------------- */

static uint64_t rng_state;

static double uniform(double lo, double hi) {
    return lo + (hi - lo) * (rng_next_u32(&rng_state) / 4294967296.0);
}
static int random_int(int n) {
    return (int)(rng_next_u32(&rng_state) % (uint32_t)n);
}

/* Every buffer of one kernel's check comes from check_alloc and is released
 * by release_all() once the check is done. */
#define MAX_CHECK_BUFFERS 128
static void *check_buffers[MAX_CHECK_BUFFERS];
static int check_buffer_count = 0;

static void *check_alloc(size_t bytes) {
    if (check_buffer_count == MAX_CHECK_BUFFERS)
        fatal(EXIT_RUNTIME, "test_kernels: too many buffers in one check");
    return check_buffers[check_buffer_count++] = xcalloc(1, bytes);
}

static void release_all(void) {
    for (int i = 0; i < check_buffer_count; i++) free(check_buffers[i]);
    check_buffer_count = 0;
}

static float *random_floats(size_t n, double lo, double hi) {
    float *x = check_alloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) x[i] = (float)uniform(lo, hi);
    return x;
}

static float *copy_floats(const float *x, size_t n) {
    float *y = check_alloc(n * sizeof(float));
    memcpy(y, x, n * sizeof(float));
    return y;
}

/* The double copy the reference works on: the same values the kernel saw. */
static double *to_double(const float *x, size_t n) {
    double *y = check_alloc(n * sizeof(double));
    for (size_t i = 0; i < n; i++) y[i] = x[i];
    return y;
}

static double *doubles(size_t n) {
    return check_alloc(n * sizeof(double));
}

static double dot(const double *a, const double *b, size_t n) {
    double s = 0.0;
    for (size_t i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}

static int verbose = 0; /* --verbose: one line per compared tensor */

/* ---- verdicts ------------------------------------------------------------- */

/* The outcome of one kernel's checks: the comparison closest to (or furthest
 * past) its tolerance. The kernel passes when worst_ratio <= 1. */
typedef struct {
    double worst_ratio; /* max over compared elements of err / tol; -1 before any */
    double err, tol;    /* of that element */
    char where[256];    /* the element and both values */
} Verdict;

#define NO_INDEX SIZE_MAX /* a scalar: no [index] in messages */

static void record(Verdict *v, const char *tensor, size_t index, double got, double want, double tol) {
    double err = fabs(got - want);
    double ratio = isnan(err) ? INFINITY : err / tol;
    if (ratio > v->worst_ratio) {
        char element[32] = "";
        if (index != NO_INDEX) snprintf(element, sizeof element, "[%zu]", index);
        v->worst_ratio = ratio;
        v->err = err;
        v->tol = tol;
        snprintf(v->where, sizeof v->where, "%s%s kernel=%.9g reference=%.9g", tensor, element, got, want);
    }
}

/* A check that is not a tolerance: fails the kernel outright. */
static void fail(Verdict *v, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void fail(Verdict *v, const char *fmt, ...) {
    if (v->worst_ratio == INFINITY) return; /* keep the first failure */
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(v->where, sizeof v->where, fmt, ap);
    va_end(ap);
    v->worst_ratio = INFINITY;
    v->err = NAN;
    v->tol = 0.0;
}

/* got[k] against want[k] for k < count; index[k] names the element (NULL:
 * k, or nothing for a single value). */
static void compare(Verdict *v, const char *tensor, const double *got, const double *want,
                    const size_t *index, size_t count, double rtol) {
    double scale = 0.0;
    for (size_t k = 0; k < count; k++) scale = fmax(scale, fabs(want[k]));
    if (scale == 0.0) scale = 1.0;
    for (size_t k = 0; k < count; k++)
        record(v, tensor, index ? index[k] : count == 1 ? NO_INDEX : k, got[k], want[k], rtol * scale);
    if (verbose) {
        double max_err = 0.0;
        for (size_t k = 0; k < count; k++) max_err = fmax(max_err, fabs(got[k] - want[k]));
        printf("  %-28s %8zu compared  max_err=%.2e tol=%.2e  err/tol=%.1e\n", tensor, count, max_err,
               rtol * scale, max_err / (rtol * scale));
    }
}

static void compare_forward(Verdict *v, const char *tensor, const float *got, const double *want, size_t n) {
    compare(v, tensor, to_double(got, n), want, NULL, n, FORWARD_RTOL);
}

/* ---- finite differences --------------------------------------------------- */

/* Which elements of a tensor get a finite-difference check. */
typedef struct {
    size_t *index;
    size_t count, capacity;
} Sample;

static void sample_add(Sample *s, size_t i) {
    if (s->count == s->capacity)
        fatal(EXIT_RUNTIME, "test_kernels: sample capacity %zu exceeded", s->capacity);
    s->index[s->count++] = i;
}

/* Every element of a tensor of n. */
static Sample sample_all(size_t n) {
    Sample s = {check_alloc(n * sizeof(size_t)), 0, n};
    for (size_t i = 0; i < n; i++) sample_add(&s, i);
    return s;
}

/* The first and last elements and `random_count` random ones (all of them
 * when that is as many), with room for `extra` chosen by the caller. */
static Sample sample_some(size_t n, size_t random_count, size_t extra) {
    if (random_count + 2 >= n) random_count = n - 2;
    Sample s = {check_alloc((random_count + 2 + extra) * sizeof(size_t)), 0, random_count + 2 + extra};
    sample_add(&s, 0);
    sample_add(&s, n - 1);
    for (size_t k = 0; k < random_count; k++)
        sample_add(&s, random_count == n - 2 ? k + 1 : (size_t)(uniform(0.0, 1.0) * n) % n);
    return s;
}

/* The reference loss L = sum(reference_out * w) for the current inputs. */
typedef double (*LossFn)(void *ctx);

/* Compares grad - prefill (the kernel's contribution) with central
 * differences of loss() in x on the sampled elements. x is the double copy of
 * the input that loss() reads; it is restored after each probe. */
static void check_gradient(Verdict *v, const char *tensor, const float *grad, const float *prefill, double *x,
                           const Sample *s, LossFn loss, void *ctx) {
    double *got = doubles(s->count), *want = doubles(s->count);
    for (size_t k = 0; k < s->count; k++) {
        size_t i = s->index[k];
        double saved = x[i];
        x[i] = saved + FD_STEP;
        double loss_plus = loss(ctx);
        x[i] = saved - FD_STEP;
        double loss_minus = loss(ctx);
        x[i] = saved;
        want[k] = (loss_plus - loss_minus) / (2.0 * FD_STEP);
        got[k] = (double)grad[i] - (prefill ? (double)prefill[i] : 0.0);
    }
    compare(v, tensor, got, want, s->index, s->count, GRAD_RTOL);
}

/* ---- reference forwards in double (plain loops, the formulas of kernels.h) -- */

static void ref_embedding(double *out, const int *tokens, const double *wte, const double *wpe, int B, int T,
                          int C) {
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
            for (int c = 0; c < C; c++)
                out[(b * T + t) * C + c] = wte[tokens[b * T + t] * C + c] + wpe[t * C + c];
}

static void ref_layernorm(double *out, double *mean, double *rstd, const double *inp, const double *weight,
                          const double *bias, int N, int C) {
    for (int n = 0; n < N; n++) {
        const double *x = inp + n * C;
        double m = 0.0, var = 0.0;
        for (int c = 0; c < C; c++) m += x[c];
        m /= C;
        for (int c = 0; c < C; c++) var += (x[c] - m) * (x[c] - m);
        var /= C;
        double s = 1.0 / sqrt(var + 1e-5);
        for (int c = 0; c < C; c++) out[n * C + c] = (x[c] - m) * s * weight[c] + bias[c];
        mean[n] = m;
        rstd[n] = s;
    }
}

static void ref_linear(double *out, const double *inp, const double *weight, const double *bias, int N, int C,
                       int OC) {
    for (int n = 0; n < N; n++)
        for (int o = 0; o < OC; o++) {
            double s = bias ? bias[o] : 0.0;
            for (int c = 0; c < C; c++) s += inp[n * C + c] * weight[o * C + c];
            out[n * OC + o] = s;
        }
}

/* out (B,T,C) and lse (B,NH,T) as kernels.h defines them; row (T) is scratch. */
static void ref_attention(double *out, double *lse, double *row, const double *qkv, int B, int T, int C,
                          int NH) {
    int hs = C / NH;
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++)
            for (int t = 0; t < T; t++) {
                /* scores of query t against keys 0..t: the causal mask never looks further */
                const double *q = qkv + (b * T + t) * 3 * C + h * hs;
                double maxval = -INFINITY, sum = 0.0;
                for (int t2 = 0; t2 <= t; t2++) {
                    const double *k = qkv + (b * T + t2) * 3 * C + C + h * hs;
                    double score = 0.0;
                    for (int i = 0; i < hs; i++) score += q[i] * k[i];
                    row[t2] = score / sqrt((double)hs);
                    maxval = fmax(maxval, row[t2]);
                }
                for (int t2 = 0; t2 <= t; t2++) sum += exp(row[t2] - maxval);
                lse[(b * NH + h) * T + t] = maxval + log(sum);
                for (int i = 0; i < hs; i++) {
                    double o = 0.0;
                    for (int t2 = 0; t2 <= t; t2++)
                        o += exp(row[t2] - maxval) / sum * qkv[(b * T + t2) * 3 * C + 2 * C + h * hs + i];
                    out[(b * T + t) * C + h * hs + i] = o;
                }
            }
}

static double ref_gelu_of(double x) {
    return 0.5 * x * (1.0 + tanh(sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
}

static void ref_crossentropy(double *losses, double *probs, const double *logits, const int *targets, int N,
                             int V) {
    for (int n = 0; n < N; n++) {
        const double *z = logits + n * V;
        double maxval = -INFINITY, sum = 0.0;
        for (int v = 0; v < V; v++) maxval = fmax(maxval, z[v]);
        for (int v = 0; v < V; v++) sum += exp(z[v] - maxval);
        for (int v = 0; v < V; v++) probs[n * V + v] = exp(z[v] - maxval) / sum;
        losses[n] = log(sum) - (z[targets[n]] - maxval);
    }
}

/* ---- embedding ------------------------------------------------------------- */

typedef struct {
    const int *tokens;
    double *wte, *wpe, *w, *out;
} EmbeddingLoss;

static double embedding_loss(void *ctx) {
    EmbeddingLoss *e = ctx;
    ref_embedding(e->out, e->tokens, e->wte, e->wpe, TEST_B, TEST_T, TEST_C);
    return dot(e->out, e->w, TEST_N * TEST_C);
}

static void check_embedding(Verdict *v) {
    const int B = TEST_B, T = TEST_T, C = TEST_C, V = TEST_V, N = TEST_N;
    const size_t n_out = (size_t)N * C, n_wte = (size_t)V * C, n_wpe = (size_t)TEST_MAXT * C;
    int *tokens = check_alloc(N * sizeof(int));
    for (int i = 0; i < N; i++) tokens[i] = random_int(V);
    tokens[1] = tokens[0]; /* a token repeated within a sequence */
    tokens[T] = tokens[0]; /* and at the same position of another sequence */
    tokens[2] = 0;         /* the first and last rows of wte */
    tokens[N - 1] = V - 1;
    float *wte = random_floats(n_wte, -1, 1), *wpe = random_floats(n_wpe, -1, 1);
    float *out = check_alloc(n_out * sizeof(float));

    kernels_cpu.embedding_forward(out, tokens, wte, wpe, B, T, C);
    EmbeddingLoss loss = {
        .tokens = tokens, .wte = to_double(wte, n_wte), .wpe = to_double(wpe, n_wpe), .out = doubles(n_out)};
    ref_embedding(loss.out, tokens, loss.wte, loss.wpe, B, T, C);
    compare_forward(v, "out", out, loss.out, n_out);

    float *w = random_floats(n_out, -1, 1);
    loss.w = to_double(w, n_out);
    float *dwte_fill = random_floats(n_wte, -1, 1), *dwte = copy_floats(dwte_fill, n_wte);
    float *dwpe_fill = random_floats(n_wpe, -1, 1), *dwpe = copy_floats(dwpe_fill, n_wpe);
    kernels_cpu.embedding_backward(dwte, dwpe, w, tokens, B, T, C, V);
    /* Both tables are small: check every element, including the rows that no
     * token (or position) uses, whose gradient must stay the fill. */
    Sample all_wte = sample_all(n_wte), all_wpe = sample_all(n_wpe);
    check_gradient(v, "dwte", dwte, dwte_fill, loss.wte, &all_wte, embedding_loss, &loss);
    check_gradient(v, "dwpe", dwpe, dwpe_fill, loss.wpe, &all_wpe, embedding_loss, &loss);
}

/* ---- layernorm ------------------------------------------------------------- */

typedef struct {
    double *inp, *weight, *bias, *w, *out, *mean, *rstd;
} LayernormLoss;

static double layernorm_loss(void *ctx) {
    LayernormLoss *l = ctx;
    ref_layernorm(l->out, l->mean, l->rstd, l->inp, l->weight, l->bias, TEST_N, TEST_C);
    return dot(l->out, l->w, TEST_N * TEST_C);
}

static void check_layernorm(Verdict *v) {
    const int N = TEST_N, C = TEST_C;
    const size_t n = (size_t)N * C;
    /* Rows with their own offset and spread, so mean and rstd matter. */
    float *inp = check_alloc(n * sizeof(float));
    for (int r = 0; r < N; r++) {
        double offset = uniform(-3, 3), spread = uniform(0.3, 3);
        for (int c = 0; c < C; c++) inp[r * C + c] = (float)(offset + spread * uniform(-1, 1));
    }
    float *weight = random_floats(C, -1.5, 1.5), *bias = random_floats(C, -1, 1);
    float *out = check_alloc(n * sizeof(float)), *mean = check_alloc(N * sizeof(float));
    float *rstd = check_alloc(N * sizeof(float));

    kernels_cpu.layernorm_forward(out, mean, rstd, inp, weight, bias, N, C);
    LayernormLoss loss = {.inp = to_double(inp, n),
                          .weight = to_double(weight, C),
                          .bias = to_double(bias, C),
                          .out = doubles(n),
                          .mean = doubles(N),
                          .rstd = doubles(N)};
    ref_layernorm(loss.out, loss.mean, loss.rstd, loss.inp, loss.weight, loss.bias, N, C);
    compare_forward(v, "out", out, loss.out, n);
    compare_forward(v, "mean", mean, loss.mean, N);
    compare_forward(v, "rstd", rstd, loss.rstd, N);

    float *w = random_floats(n, -1, 1);
    loss.w = to_double(w, n);
    float *dinp_fill = random_floats(n, -1, 1), *dweight_fill = random_floats(C, -1, 1);
    float *dbias_fill = random_floats(C, -1, 1);
    float *dinp = copy_floats(dinp_fill, n), *dweight = copy_floats(dweight_fill, C);
    float *dbias = copy_floats(dbias_fill, C);
    kernels_cpu.layernorm_backward(dinp, dweight, dbias, w, inp, weight, mean, rstd, N, C);
    Sample all_inp = sample_all(n), all_c = sample_all(C);
    check_gradient(v, "dinp", dinp, dinp_fill, loss.inp, &all_inp, layernorm_loss, &loss);
    check_gradient(v, "dweight", dweight, dweight_fill, loss.weight, &all_c, layernorm_loss, &loss);
    check_gradient(v, "dbias", dbias, dbias_fill, loss.bias, &all_c, layernorm_loss, &loss);
}

/* ---- linear ---------------------------------------------------------------- */

typedef struct {
    double *inp, *weight, *bias, *w, *out; /* bias NULL: no bias */
} LinearLoss;

static double linear_loss(void *ctx) {
    LinearLoss *l = ctx;
    ref_linear(l->out, l->inp, l->weight, l->bias, TEST_N, TEST_C, TEST_OC);
    return dot(l->out, l->w, TEST_N * TEST_OC);
}

static void check_linear_variant(Verdict *v, int with_bias) {
    const int N = TEST_N, C = TEST_C, OC = TEST_OC;
    const size_t n_in = (size_t)N * C, n_out = (size_t)N * OC, n_w = (size_t)OC * C;
    float *inp = random_floats(n_in, -1, 1), *weight = random_floats(n_w, -1, 1);
    float *bias = with_bias ? random_floats(OC, -1, 1) : NULL;
    float *out = check_alloc(n_out * sizeof(float));

    kernels_cpu.linear_forward(out, inp, weight, bias, N, C, OC);
    LinearLoss loss = {.inp = to_double(inp, n_in),
                       .weight = to_double(weight, n_w),
                       .bias = bias ? to_double(bias, OC) : NULL,
                       .out = doubles(n_out)};
    ref_linear(loss.out, loss.inp, loss.weight, loss.bias, N, C, OC);
    compare_forward(v, with_bias ? "out" : "out (no bias)", out, loss.out, n_out);

    float *w = random_floats(n_out, -1, 1);
    loss.w = to_double(w, n_out);
    float *dinp_fill = random_floats(n_in, -1, 1), *dweight_fill = random_floats(n_w, -1, 1);
    float *dbias_fill = with_bias ? random_floats(OC, -1, 1) : NULL;
    float *dinp = copy_floats(dinp_fill, n_in), *dweight = copy_floats(dweight_fill, n_w);
    float *dbias = with_bias ? copy_floats(dbias_fill, OC) : NULL;
    kernels_cpu.linear_backward(dinp, dweight, dbias, w, inp, weight, N, C, OC);
    Sample some_inp = sample_some(n_in, FD_SAMPLES, 0), some_weight = sample_some(n_w, FD_SAMPLES, 0);
    check_gradient(v, with_bias ? "dinp" : "dinp (no bias)", dinp, dinp_fill, loss.inp, &some_inp,
                   linear_loss, &loss);
    check_gradient(v, with_bias ? "dweight" : "dweight (no bias)", dweight, dweight_fill, loss.weight,
                   &some_weight, linear_loss, &loss);
    if (with_bias) {
        Sample all_bias = sample_all(OC);
        check_gradient(v, "dbias", dbias, dbias_fill, loss.bias, &all_bias, linear_loss, &loss);
    }
}

static void check_linear(Verdict *v) {
    check_linear_variant(v, 1);
    check_linear_variant(v, 0);
}

/* ---- attention ------------------------------------------------------------- */

/* The shapes attention is checked on. The kernel works on tiles of 64 query
 * rows, so besides the common odd shape there is one with several tiles and a
 * short last one (130 = 64 + 64 + 2, with hs = 5), and one with a single
 * token. */
typedef struct {
    int B, T, C, NH;
    int fd_samples; /* random elements of qkv per gradient check */
} AttentionShape;

static const AttentionShape attention_shapes[] = {
    {TEST_B, TEST_T, TEST_C, TEST_NH, 3 * FD_SAMPLES},
    {2, 130, 10, 2, FD_SAMPLES},
    {2, 1, TEST_C, TEST_NH, FD_SAMPLES},
};

typedef struct {
    AttentionShape shape;
    double *qkv, *w, *out, *lse, *row;
} AttentionLoss;

static double attention_loss(void *ctx) {
    AttentionLoss *a = ctx;
    const AttentionShape *s = &a->shape;
    ref_attention(a->out, a->lse, a->row, a->qkv, s->B, s->T, s->C, s->NH);
    return dot(a->out, a->w, (size_t)s->B * s->T * s->C);
}

/* "tensor (T=..)": which shape a line of the verdict is about. */
static const char *tensor_at(int T, const char *tensor) {
    static char name[64];
    snprintf(name, sizeof name, "%s (T=%d)", tensor, T);
    return name;
}

static void check_attention_shape(Verdict *v, const AttentionShape *shape) {
    const int B = shape->B, T = shape->T, C = shape->C, NH = shape->NH, hs = C / NH;
    const size_t n_qkv = (size_t)B * T * 3 * C, n_out = (size_t)B * T * C, n_lse = (size_t)B * NH * T;
    /* Entries in [-2, 2]: scores of order 1, so softmax is neither flat nor saturated. */
    float *qkv = random_floats(n_qkv, -2, 2);
    float *out = random_floats(n_out, -1, 1), *lse = random_floats(n_lse, -1, 1); /* all overwritten */

    kernels_cpu.attention_forward(out, lse, qkv, B, T, C, NH);
    AttentionLoss loss = {.shape = *shape,
                          .qkv = to_double(qkv, n_qkv),
                          .out = doubles(n_out),
                          .lse = doubles(n_lse),
                          .row = doubles(T)};
    ref_attention(loss.out, loss.lse, loss.row, loss.qkv, B, T, C, NH);
    compare_forward(v, tensor_at(T, "out"), out, loss.out, n_out);
    compare_forward(v, tensor_at(T, "lse"), lse, loss.lse, n_lse);

    /* The sample: random elements of q, k and v, plus each part's first and
     * last channel at the first and last position of the first and last
     * sequence (the last key is seen by one query only, the first by all). */
    Sample some = sample_some(n_qkv, shape->fd_samples, 12);
    for (int part = 0; part < 3; part++) {
        sample_add(&some, (size_t)part * C);
        sample_add(&some, (size_t)part * C + hs - 1);
        sample_add(&some, ((size_t)(B - 1) * T + T - 1) * 3 * C + part * C);
        sample_add(&some, ((size_t)(B - 1) * T + T - 1) * 3 * C + part * C + C - 1);
    }

    /* 1. dout everywhere; the backward gets the forward's out and lse. */
    float *w = random_floats(n_out, -1, 1);
    loss.w = to_double(w, n_out);
    float *dqkv_fill = random_floats(n_qkv, -1, 1), *dqkv = copy_floats(dqkv_fill, n_qkv);
    kernels_cpu.attention_backward(dqkv, w, qkv, out, lse, B, T, C, NH);
    check_gradient(v, tensor_at(T, "dqkv"), dqkv, dqkv_fill, loss.qkv, &some, attention_loss, &loss);

    /* 2. Through the causal mask: with dout zero after position t0, the loss
     * depends on nothing at positions > t0 (their queries' outputs are not in
     * it, and their keys and values are masked for every query up to t0), so
     * their gradient must be exactly 0, and the rest must still match finite
     * differences. A zeroed gradient buffer this time. (With T = 1 there is
     * no future: t0 = 0 and the check is the first one without a prefill.) */
    int t0 = T > 1 ? random_int(T - 1) : 0;
    float *w_causal = copy_floats(w, n_out);
    for (int b = 0; b < B; b++)
        for (int t = t0 + 1; t < T; t++)
            for (int c = 0; c < C; c++) w_causal[((size_t)b * T + t) * C + c] = 0.0f;
    loss.w = to_double(w_causal, n_out);
    float *dqkv_causal = check_alloc(n_qkv * sizeof(float));
    kernels_cpu.attention_backward(dqkv_causal, w_causal, qkv, out, lse, B, T, C, NH);
    for (int b = 0; b < B; b++)
        for (int t = t0 + 1; t < T; t++)
            for (int c = 0; c < 3 * C; c++) {
                size_t i = ((size_t)b * T + t) * 3 * C + c;
                if (dqkv_causal[i] != 0.0f)
                    fail(v,
                         "dqkv[%zu] (T=%d: b %d, t %d, channel %d of 3C) is %g with dout zero after t0=%d; "
                         "the future must contribute nothing",
                         i, T, b, t, c, dqkv_causal[i], t0);
            }
    check_gradient(v, tensor_at(T, "dqkv (dout zero after t0)"), dqkv_causal, NULL, loss.qkv, &some,
                   attention_loss, &loss);

    /* 3. The thread count changes nothing: one thread and three give the same bits. */
    int threads = omp_get_max_threads();
    float *out_by[2], *lse_by[2], *dqkv_by[2];
    for (int k = 0; k < 2; k++) {
        omp_set_num_threads(k == 0 ? 1 : 3);
        out_by[k] = check_alloc(n_out * sizeof(float));
        lse_by[k] = check_alloc(n_lse * sizeof(float));
        dqkv_by[k] = copy_floats(dqkv_fill, n_qkv);
        kernels_cpu.attention_forward(out_by[k], lse_by[k], qkv, B, T, C, NH);
        kernels_cpu.attention_backward(dqkv_by[k], w, qkv, out_by[k], lse_by[k], B, T, C, NH);
    }
    omp_set_num_threads(threads);
    if (memcmp(out_by[0], out_by[1], n_out * sizeof(float)) != 0 ||
        memcmp(lse_by[0], lse_by[1], n_lse * sizeof(float)) != 0 ||
        memcmp(dqkv_by[0], dqkv_by[1], n_qkv * sizeof(float)) != 0)
        fail(v, "T=%d: out, lse or dqkv differ between 1 and 3 threads", T);
}

static void check_attention(Verdict *v) {
    for (size_t i = 0; i < sizeof attention_shapes / sizeof attention_shapes[0]; i++)
        check_attention_shape(v, &attention_shapes[i]);
    kernels_cpu.release_workspaces();
}

/* ---- ring attention's blocks and their merge ------------------------------
 * Context parallelism (03_model_parallel/context_parallel.h) computes the
 * causal attention of a sequence block by block: a chunk of queries against
 * each chunk of keys at or before it (the same chunk causally), merged by the
 * log-sum-exp rule (kernels.h, attention_merge: exercise 03.3). Checked
 * against the fused attention of the whole sequence (itself checked against
 * the double reference above): out and lse after the merges, in two orders
 * of the blocks (the diagonal first, as the ring has it, and last), and
 * the gradients of q, k and v summed over the blocks. The second shape's
 * scores are in the hundreds: a merge that exponentiates lse without
 * subtracting the larger one first overflows there. */
static void check_ring_attention_shape(Verdict *v, int B, int T, int rows, int C, int NH, double q_range) {
    const size_t n_qkv = (size_t)B * T * 3 * C, n_out = (size_t)B * T * C, n_lse = (size_t)B * NH * T;
    const size_t n_kv = (size_t)B * T * 2 * C;
    float *qkv = random_floats(n_qkv, -2, 2);
    for (size_t r = 0; r < (size_t)B * T; r++)
        for (int c = 0; c < C; c++) qkv[r * 3 * C + c] *= (float)(q_range / 2.0); /* the queries' scale */
    float *out = check_alloc(n_out * sizeof(float)), *lse = check_alloc(n_lse * sizeof(float));
    kernels_cpu.attention_forward(out, lse, qkv, B, T, C, NH);
    float *kv = check_alloc(n_kv * sizeof(float)); /* k | v of every position, as the ring passes them */
    for (size_t r = 0; r < (size_t)B * T; r++)
        memcpy(kv + r * 2 * C, qkv + r * 3 * C + C, 2 * C * sizeof(float));

    char name[64];
    for (int diagonal_first = 0; diagonal_first < 2; diagonal_first++) {
        float *ring_out = check_alloc(n_out * sizeof(float)), *ring_lse = check_alloc(n_lse * sizeof(float));
        float *block_out = check_alloc(n_out * sizeof(float)),
              *block_lse = check_alloc(n_lse * sizeof(float));
        for (int i = 0; i < T / rows; i++) {
            for (int n = 0; n <= i; n++) {
                int j = diagonal_first ? (i - n) : n; /* the key chunk */
                size_t q0 = (size_t)i * rows, k0 = (size_t)j * rows;
                float *o = n ? block_out : ring_out, *l = n ? block_lse : ring_lse;
                kernels_cpu.attention_block_forward(o + q0 * C, l + q0, qkv + q0 * 3 * C, kv + k0 * 2 * C, B,
                                                    T, rows, C, NH, i == j);
                if (n)
                    kernels_cpu.attention_merge(ring_out + q0 * C, ring_lse + q0, o + q0 * C, l + q0, B, T,
                                                rows, C, NH);
            }
        }
        snprintf(name, sizeof name, "out (T=%d, chunks of %d%s)", T, rows,
                 diagonal_first ? ", diagonal first" : "");
        compare_forward(v, name, ring_out, to_double(out, n_out), n_out);
        snprintf(name, sizeof name, "lse (T=%d, chunks of %d%s)", T, rows,
                 diagonal_first ? ", diagonal first" : "");
        compare_forward(v, name, ring_lse, to_double(lse, n_lse), n_lse);
    }

    /* backward: each block adds its part of dq and of d(k|v), from the whole attention's out and lse */
    float *dout = random_floats(n_out, -1, 1);
    float *dqkv = check_alloc(n_qkv * sizeof(float)), *ring_dqkv = check_alloc(n_qkv * sizeof(float));
    float *ring_dkv = check_alloc(n_kv * sizeof(float));
    kernels_cpu.attention_backward(dqkv, dout, qkv, out, lse, B, T, C, NH);
    for (int i = 0; i < T / rows; i++)
        for (int j = 0; j <= i; j++) {
            size_t q0 = (size_t)i * rows, k0 = (size_t)j * rows;
            kernels_cpu.attention_block_backward(ring_dqkv + q0 * 3 * C, ring_dkv + k0 * 2 * C, dout + q0 * C,
                                                 out + q0 * C, lse + q0, qkv + q0 * 3 * C, kv + k0 * 2 * C, B,
                                                 T, rows, C, NH, i == j);
        }
    for (size_t r = 0; r < (size_t)B * T; r++)
        memcpy(ring_dqkv + r * 3 * C + C, ring_dkv + r * 2 * C, 2 * C * sizeof(float));
    snprintf(name, sizeof name, "dqkv (T=%d, chunks of %d)", T, rows);
    compare(v, name, to_double(ring_dqkv, n_qkv), to_double(dqkv, n_qkv), NULL, n_qkv, GRAD_RTOL);
}

static void check_ring_attention(Verdict *v) {
    check_ring_attention_shape(v, 2, 24, 6, 48, 3, 2.0);    /* 4 chunks of 6: three merges for the last */
    check_ring_attention_shape(v, 1, 130, 65, 32, 2, 60.0); /* tiles of 64 inside a chunk; scores ~ 100s */
    kernels_cpu.release_workspaces();
}

/* ---- gelu ------------------------------------------------------------------ */

typedef struct {
    double *inp, *w;
} GeluLoss;

static double gelu_loss(void *ctx) {
    GeluLoss *g = ctx;
    double s = 0.0;
    for (size_t i = 0; i < TEST_ELEMENTWISE_N; i++) s += ref_gelu_of(g->inp[i]) * g->w[i];
    return s;
}

static void check_gelu(Verdict *v) {
    const size_t n = TEST_ELEMENTWISE_N;
    /* [-5, 5] covers both tails, where tanh saturates, and the bend near 0. */
    float *inp = random_floats(n, -5, 5), *out = check_alloc(n * sizeof(float));
    inp[1] = 0.0f;

    kernels_cpu.gelu_forward(out, inp, n);
    GeluLoss loss = {.inp = to_double(inp, n)};
    double *ref_out = doubles(n);
    for (size_t i = 0; i < n; i++) ref_out[i] = ref_gelu_of(loss.inp[i]);
    compare_forward(v, "out", out, ref_out, n);

    float *w = random_floats(n, -1, 1);
    loss.w = to_double(w, n);
    float *dinp_fill = random_floats(n, -1, 1), *dinp = copy_floats(dinp_fill, n);
    kernels_cpu.gelu_backward(dinp, inp, w, n);
    Sample all = sample_all(n);
    check_gradient(v, "dinp", dinp, dinp_fill, loss.inp, &all, gelu_loss, &loss);
}

/* ---- residual -------------------------------------------------------------- */

typedef struct {
    double *a, *b, *w;
} ResidualLoss;

static double residual_loss(void *ctx) {
    ResidualLoss *r = ctx;
    double s = 0.0;
    for (size_t i = 0; i < TEST_ELEMENTWISE_N; i++) s += (r->a[i] + r->b[i]) * r->w[i];
    return s;
}

static void check_residual(Verdict *v) {
    const size_t n = TEST_ELEMENTWISE_N;
    float *a = random_floats(n, -1, 1), *b = random_floats(n, -1, 1), *out = check_alloc(n * sizeof(float));

    kernels_cpu.residual_forward(out, a, b, n);
    ResidualLoss loss = {.a = to_double(a, n), .b = to_double(b, n)};
    double *ref_out = doubles(n);
    for (size_t i = 0; i < n; i++) ref_out[i] = loss.a[i] + loss.b[i];
    compare_forward(v, "out", out, ref_out, n);

    float *w = random_floats(n, -1, 1);
    loss.w = to_double(w, n);
    float *da_fill = random_floats(n, -1, 1), *db_fill = random_floats(n, -1, 1);
    float *da = copy_floats(da_fill, n), *db = copy_floats(db_fill, n);
    kernels_cpu.residual_backward(da, db, w, n);
    Sample all = sample_all(n);
    check_gradient(v, "da", da, da_fill, loss.a, &all, residual_loss, &loss);
    check_gradient(v, "db", db, db_fill, loss.b, &all, residual_loss, &loss);
}

/* ---- the mixture of experts: moving tokens, and the routing's gradient -------- */

/* TEST_B sequences of TEST_T tokens, K = 2 of E = 3 experts each, capacity
 * factor 0.5: some choices dropped. The routing (moe.h's moe_route, on random
 * logits) gives the rows: gather, combine and their backwards are checked on
 * it; then moe_route_backward against central differences of the routing's
 * objective in double with the choices held fixed (they are a step function:
 * its slope is that of the weights and of the balancing loss):
 *   L(z) = sum over slots of c * gate + T dloss * coef * E * sum over sequences
 *          and experts of f_e * mean_t p[e],   gate = p[e_k] / sum_j p[e_j]
 * (the objective adds coef times the balancing loss's mean over the sequences:
 * 1 / sequences = T dloss, with dloss = 1 / (sequences T) per token loss). */
enum { MOE_E = 3, MOE_K = 2 };

typedef struct {
    const MoeLayerActs *la;
    int B, T, E, K;             /* the routing's shape */
    double *f;                  /* (B, E) each sequence's fraction of its T K choices per expert */
    double *z, *c, dloss, coef; /* the logits (N, E), the gates' weights (N K) */
    double *x, *y, *gate, *w, *out; /* gather / combine: inputs, weights of the projection, output */
    int rows;
} MoeLoss;

static void ref_softmax(double *p, const double *z, int E) {
    double max = z[0], sum = 0.0;
    for (int e = 1; e < E; e++) max = fmax(max, z[e]);
    for (int e = 0; e < E; e++) sum += exp(z[e] - max);
    for (int e = 0; e < E; e++) p[e] = exp(z[e] - max) / sum;
}

/* f (B, E): the share of each sequence's T K choices that named each expert,
 * counted from the choices themselves (the dropped ones too). */
static double *ref_choice_fractions(const MoeLayerActs *la, int B, int T, int E, int K) {
    double *f = doubles((size_t)B * E);
    for (int n = 0; n < B * T; n++)
        for (int k = 0; k < K; k++) f[(size_t)(n / T) * E + la->expert_h[n * K + k]] += 1.0 / (T * K);
    return f;
}

/* The balancing loss of the batch, summed over its sequences: coef E sum_e f_e P_e each. */
static double ref_balance_sum(const MoeLoss *l) {
    double total = 0.0, p[MAX_EXPERTS];
    for (int b = 0; b < l->B; b++) {
        double P[MAX_EXPERTS] = {0};
        for (int t = 0; t < l->T; t++) {
            ref_softmax(p, l->z + ((size_t)b * l->T + t) * l->E, l->E);
            for (int e = 0; e < l->E; e++) P[e] += p[e] / l->T;
        }
        for (int e = 0; e < l->E; e++) total += l->coef * l->E * l->f[(size_t)b * l->E + e] * P[e];
    }
    return total;
}

static double routing_loss(void *ctx) {
    const MoeLoss *l = ctx;
    const int N = l->B * l->T, E = l->E, K = l->K;
    double loss = 0.0, p[MAX_EXPERTS];
    for (int n = 0; n < N; n++) {
        ref_softmax(p, l->z + (size_t)n * E, E);
        const int *chosen = l->la->expert_h + (size_t)n * K;
        double S = 0.0;
        for (int k = 0; k < K; k++) S += p[chosen[k]];
        for (int k = 0; k < K; k++) loss += l->c[n * K + k] * p[chosen[k]] / S;
    }
    return loss + l->T * l->dloss * ref_balance_sum(l);
}

static double gather_loss(void *ctx) {
    const MoeLoss *l = ctx;
    double loss = 0.0;
    for (int i = 0; i < l->rows; i++)
        for (int c = 0; c < TEST_C; c++)
            loss += l->x[(size_t)l->la->src_h[i] * TEST_C + c] * l->w[(size_t)i * TEST_C + c];
    return loss;
}

static void ref_combine(double *out, const MoeLoss *l) {
    for (int n = 0; n < TEST_N; n++)
        for (int c = 0; c < TEST_C; c++) {
            double sum = 0.0;
            for (int k = 0; k < MOE_K; k++) {
                int row = l->la->pos_h[n * MOE_K + k];
                if (row >= 0) sum += l->gate[n * MOE_K + k] * l->y[(size_t)row * TEST_C + c];
            }
            out[(size_t)n * TEST_C + c] = sum;
        }
}

static double combine_loss(void *ctx) {
    MoeLoss *l = ctx;
    ref_combine(l->out, l);
    return dot(l->out, l->w, (size_t)TEST_N * TEST_C);
}

/* The host arrays moe_route fills, for B sequences of T tokens, K of E experts each. */
static MoeLayerActs routing_buffers(int B, int T, int E, int K) {
    size_t N = (size_t)B * T, NK = N * K;
    return (MoeLayerActs){.probs_h = check_alloc(N * E * sizeof(float)),
                          .expert_h = check_alloc(NK * sizeof(int)),
                          .gate_h = check_alloc(NK * sizeof(float)),
                          .pos_h = check_alloc(NK * sizeof(int)),
                          .src_h = check_alloc(NK * sizeof(int)),
                          .choices_h = check_alloc((size_t)B * E * sizeof(float)),
                          .count_h = check_alloc(E * sizeof(int))};
}

static void check_moe(Verdict *v) {
    const int N = TEST_N, C = TEST_C, E = MOE_E, K = MOE_K, NK = N * K;
    MoeConfig moe = {.experts = E, .top_k = K, .every = 1, .capacity_factor = 0.5f, .aux_coef = 0.3f};
    MoeLayerActs la = routing_buffers(TEST_B, TEST_T, E, K);
    float *logits = random_floats((size_t)N * E, -2, 2);
    MoeStats stats = {0};
    moe_route(&moe, logits, TEST_B, TEST_T, &la, &stats);
    int R = la.rows;
    if (stats.dropped <= 0 || R + stats.dropped != NK)
        fail(v, "routing: %d rows and %.0f dropped of %d choices (expected some dropped, the rest rows)", R,
             stats.dropped, NK);
    MoeLoss loss = {.la = &la, .rows = R, .B = TEST_B, .T = TEST_T, .E = E, .K = K};
    loss.f = ref_choice_fractions(&la, TEST_B, TEST_T, E, K);

    /* gather: out(R,C) row i = inp row src[i]; its backward, the scatter-add by pos */
    float *inp = random_floats((size_t)N * C, -1, 1), *gathered = check_alloc((size_t)R * C * sizeof(float));
    kernels_cpu.moe_gather(gathered, inp, la.src_h, R, C);
    loss.x = to_double(inp, (size_t)N * C);
    double *ref_gathered = doubles((size_t)R * C);
    for (int i = 0; i < R; i++)
        for (int c = 0; c < C; c++) ref_gathered[(size_t)i * C + c] = loss.x[(size_t)la.src_h[i] * C + c];
    compare_forward(v, "gathered", gathered, ref_gathered, (size_t)R * C);
    float *w_rows = random_floats((size_t)R * C, -1, 1);
    loss.w = to_double(w_rows, (size_t)R * C);
    float *dinp_fill = random_floats((size_t)N * C, -1, 1), *dinp = copy_floats(dinp_fill, (size_t)N * C);
    kernels_cpu.moe_scatter_add(dinp, w_rows, la.pos_h, N, K, C);
    Sample all_inp = sample_all((size_t)N * C);
    check_gradient(v, "dinp (scatter_add)", dinp, dinp_fill, loss.x, &all_inp, gather_loss, &loss);

    /* combine: out(N,C) = sum_k gate * y row pos; its backward, dy and dgate */
    float *y = random_floats((size_t)R * C, -1, 1), *gate = random_floats(NK, 0, 1);
    float *combined = check_alloc((size_t)N * C * sizeof(float));
    kernels_cpu.moe_combine(combined, y, la.pos_h, gate, N, K, C);
    loss.y = to_double(y, (size_t)R * C);
    loss.gate = to_double(gate, NK);
    loss.out = doubles((size_t)N * C);
    ref_combine(loss.out, &loss);
    compare_forward(v, "combined", combined, loss.out, (size_t)N * C);
    float *w_tokens = random_floats((size_t)N * C, -1, 1);
    loss.w = to_double(w_tokens, (size_t)N * C);
    float *dy_fill = random_floats((size_t)R * C, -1, 1), *dgate_fill = random_floats(NK, -1, 1);
    float *dy = copy_floats(dy_fill, (size_t)R * C), *dgate = copy_floats(dgate_fill, NK);
    kernels_cpu.moe_combine_backward(dy, dgate, w_tokens, y, la.pos_h, gate, N, K, C);
    Sample all_y = sample_all((size_t)R * C), all_gate = sample_all(NK);
    check_gradient(v, "dy", dy, dy_fill, loss.y, &all_y, combine_loss, &loss);
    check_gradient(v, "dgate", dgate, dgate_fill, loss.gate, &all_gate, combine_loss, &loss);

    /* the routing: the router's logit gradient from the gates' and the balancing loss's */
    float *c = random_floats(NK, -1, 1), *dlogits = check_alloc((size_t)N * E * sizeof(float));
    for (int slot = 0; slot < NK; slot++) /* a dropped slot adds nothing: its gate's gradient is 0 */
        if (la.pos_h[slot] < 0) c[slot] = 0.0f;
    loss.z = to_double(logits, (size_t)N * E);
    loss.c = to_double(c, NK);
    loss.dloss = 0.7;
    loss.coef = moe.aux_coef;
    moe_route_backward(&moe, &la, c, (float)loss.dloss, TEST_B, TEST_T, dlogits);
    Sample all_z = sample_all((size_t)N * E);
    check_gradient(v, "dlogits (routing)", dlogits, NULL, loss.z, &all_z, routing_loss, &loss);
}

/* ---- exercise 01.4: the balancing loss and its gradient ------------------------ */

/* moe_route's balancing loss (stats.aux_sum: coef E sum_e f_e P_e summed over
 * the sequences) against ref_balance_sum, from the logits in double and the
 * choices counted here; then moe_route_backward against central differences
 * of routing_loss, first with the gates' gradient zero (the balancing loss
 * alone), then with a random one (both: a backward that adds the balancing
 * part to what it has not set, or overwrites the gates' part, fails). Shapes
 * that tell the wrong answers apart: B = 3 sequences (a loss over the whole
 * batch is not the mean of the sequences'), K = 1, 2 and 3 (f is a share of
 * T K choices, not of T tokens), capacity factors that drop (f counts the
 * choices before capacity, not the rows kept), odd E, several coefficients
 * and scales dloss. */
static void check_moe_balance(Verdict *v) {
    static const struct {
        int E, K;
        float capacity_factor, coef;
    } cases[] = {{5, 1, 0.0f, 0.3f}, {3, 2, 0.5f, 0.7f}, {4, 3, 1.25f, 1.0f}, {7, 2, 0.8f, 0.01f}};
    const int B = TEST_B, T = TEST_T, N = B * T;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const int E = cases[i].E, K = cases[i].K;
        MoeConfig moe = {.experts = E, .top_k = K, .every = 1, .capacity_factor = cases[i].capacity_factor,
                         .aux_coef = cases[i].coef};
        MoeLayerActs la = routing_buffers(B, T, E, K);
        float *logits = random_floats((size_t)N * E, -2, 2);
        MoeStats stats = {0};
        moe_route(&moe, logits, B, T, &la, &stats);
        MoeLoss loss = {.la = &la, .B = B, .T = T, .E = E, .K = K, .coef = moe.aux_coef};
        loss.f = ref_choice_fractions(&la, B, T, E, K);
        loss.z = to_double(logits, (size_t)N * E);
        char name[64];
        double want = ref_balance_sum(&loss);
        snprintf(name, sizeof name, "aux_sum (E %d, K %d)", E, K);
        compare(v, name, &stats.aux_sum, &want, NULL, 1, FORWARD_RTOL);

        float *dgate = check_alloc((size_t)N * K * sizeof(float)), *dlogits = check_alloc((size_t)N * E * sizeof(float));
        loss.c = doubles((size_t)N * K);
        loss.dloss = uniform(0.2, 2.0);
        Sample all_z = sample_all((size_t)N * E);
        for (int with_gates = 0; with_gates < 2; with_gates++) {
            for (int slot = 0; slot < N * K; slot++) {
                dgate[slot] = with_gates && la.pos_h[slot] >= 0 ? (float)uniform(-1, 1) : 0.0f;
                loss.c[slot] = dgate[slot];
            }
            moe_route_backward(&moe, &la, dgate, (float)loss.dloss, B, T, dlogits);
            snprintf(name, sizeof name, "dlogits (E %d, K %d%s)", E, K, with_gates ? ", gates too" : "");
            check_gradient(v, name, dlogits, NULL, loss.z, &all_z, routing_loss, &loss);
        }
    }
}

/* ---- crossentropy ---------------------------------------------------------- */

/* The backward takes one dloss for every row (d total / d row loss), so the
 * projection here is L = dloss * sum(losses) with a random scalar dloss. */
typedef struct {
    const int *targets;
    double *logits, *losses, *probs;
    double dloss;
} CrossentropyLoss;

static double crossentropy_loss(void *ctx) {
    CrossentropyLoss *x = ctx;
    ref_crossentropy(x->losses, x->probs, x->logits, x->targets, TEST_N, TEST_V);
    double s = 0.0;
    for (int n = 0; n < TEST_N; n++) s += x->losses[n];
    return x->dloss * s;
}

static void check_crossentropy(Verdict *v) {
    const int N = TEST_N, V = TEST_V;
    const size_t n = (size_t)N * V;
    int *targets = check_alloc(N * sizeof(int));
    for (int i = 0; i < N; i++) targets[i] = random_int(V);
    targets[0] = 0;
    targets[1] = 0; /* a repeated target */
    targets[N - 1] = V - 1;
    float *logits = random_floats(n, -4, 4);
    float *losses = check_alloc(N * sizeof(float)), *probs = check_alloc(n * sizeof(float));

    kernels_cpu.crossentropy_forward(losses, probs, logits, targets, N, V, V);
    CrossentropyLoss loss = {
        .targets = targets, .logits = to_double(logits, n), .losses = doubles(N), .probs = doubles(n)};
    ref_crossentropy(loss.losses, loss.probs, loss.logits, targets, N, V);
    compare_forward(v, "losses", losses, loss.losses, N);
    compare_forward(v, "probs", probs, loss.probs, n);

    float dloss = (float)(uniform(0.2, 1.0) * (random_int(2) ? 1 : -1));
    loss.dloss = dloss;
    float *dlogits_fill = random_floats(n, -1, 1), *dlogits = copy_floats(dlogits_fill, n);
    kernels_cpu.crossentropy_backward(dlogits, probs, targets, dloss, N, V);
    /* Random logits rarely land on a target; add every row's target logit. */
    Sample some = sample_some(n, FD_SAMPLES, N);
    for (int r = 0; r < N; r++) sample_add(&some, (size_t)r * V + targets[r]);
    check_gradient(v, "dlogits", dlogits, dlogits_fill, loss.logits, &some, crossentropy_loss, &loss);
}

/* ---- the vocabulary split over ranks (kernels.h) ---------------------------
 * The V = TEST_V columns padded to 3 x 24 = 72 and split over 3 "ranks" of
 * Vl = 24 columns, the last holding 19 tokens and 5 padding columns; the
 * collectives between the steps written out here (the maxima gathered, the
 * sums added). The losses and probabilities must be the whole softmax's (in
 * double), the gradient a finite difference's, the padding never predicted;
 * the embedding's slices must sum to the whole lookup bit for bit. */
enum { SPLIT_PARTS = 3, SPLIT_VL = 24 };

static void check_vocab_split(Verdict *v) {
    const int N = TEST_N, V = TEST_V, P = SPLIT_PARTS, Vl = SPLIT_VL, Vp = P * Vl;
    int *targets = check_alloc(N * sizeof(int));
    for (int i = 0; i < N; i++) targets[i] = random_int(V);
    targets[0] = 0;
    targets[1] = Vl;        /* the first column of the second part */
    targets[N - 1] = V - 1; /* the last token, in the part with padding */
    float *slices[SPLIT_PARTS], *probs[SPLIT_PARTS], *losses[SPLIT_PARTS];
    float *maxes = check_alloc((size_t)P * N * sizeof(float)), *row_max = check_alloc(N * sizeof(float));
    float *sums = check_alloc(2 * (size_t)N * sizeof(float)),
          *part = check_alloc(2 * (size_t)N * sizeof(float));
    float *logits = random_floats((size_t)N * V, -4, 4);
    for (int p = 0; p < P; p++) { /* this part's columns; the padding's logits are garbage, never read */
        slices[p] = random_floats((size_t)N * Vl, -50, 50);
        for (int n = 0; n < N; n++)
            for (int c = 0; c < Vl && p * Vl + c < V; c++) slices[p][n * Vl + c] = logits[n * V + p * Vl + c];
        probs[p] = check_alloc((size_t)N * Vl * sizeof(float));
        losses[p] = check_alloc(N * sizeof(float));
    }
    int cols[SPLIT_PARTS];
    for (int p = 0; p < P; p++) {
        cols[p] = V - p * Vl < Vl ? V - p * Vl : Vl;
        kernels_cpu.crossentropy_slice_max(maxes + (size_t)p * N, slices[p], N, cols[p], Vl);
    }
    memset(sums, 0, 2 * (size_t)N * sizeof(float));
    for (int p = 0; p < P; p++) { /* the all-reduce: every part's sums added */
        kernels_cpu.crossentropy_slice_sums(part, row_max, maxes, P, slices[p], targets, N, cols[p], Vl,
                                            p * Vl);
        for (int i = 0; i < 2 * N; i++) sums[i] += part[i];
    }
    for (int p = 0; p < P; p++)
        kernels_cpu.crossentropy_slice_finish(losses[p], probs[p], slices[p], row_max, sums, N, cols[p], Vl);

    CrossentropyLoss loss = {.targets = targets,
                             .logits = to_double(logits, (size_t)N * V),
                             .losses = doubles(N),
                             .probs = doubles((size_t)N * V)};
    ref_crossentropy(loss.losses, loss.probs, loss.logits, targets, N, V);
    float *whole_probs = check_alloc((size_t)N * V * sizeof(float));
    for (int p = 0; p < P; p++) {
        compare_forward(v, "losses", losses[p], loss.losses, N); /* every part has the whole loss */
        for (int n = 0; n < N; n++)
            for (int c = 0; c < Vl; c++) {
                float pr = probs[p][n * Vl + c];
                if (c < cols[p])
                    whole_probs[n * V + p * Vl + c] = pr;
                else if (pr != 0.0f)
                    fail(v, "probs: padding column %d of part %d has probability %g (want 0)", p * Vl + c, p,
                         pr);
            }
    }
    compare_forward(v, "probs", whole_probs, loss.probs, (size_t)N * V);

    float dloss = (float)(uniform(0.2, 1.0) * (random_int(2) ? 1 : -1));
    loss.dloss = dloss;
    float *fill = random_floats((size_t)N * Vp, -1, 1), *dlogits = check_alloc((size_t)N * V * sizeof(float));
    float *fill_real = check_alloc((size_t)N * V * sizeof(float));
    for (int p = 0; p < P; p++) {
        float *d = copy_floats(fill + (size_t)p * N * Vl, (size_t)N * Vl);
        kernels_cpu.crossentropy_backward_rows(d, probs[p], targets, dloss, N, Vl, p * Vl);
        for (int n = 0; n < N; n++)
            for (int c = 0; c < Vl; c++) {
                float want_fill = fill[(size_t)p * N * Vl + n * Vl + c];
                if (c < cols[p]) {
                    dlogits[n * V + p * Vl + c] = d[n * Vl + c];
                    fill_real[n * V + p * Vl + c] = want_fill;
                } else if (d[n * Vl + c] != want_fill) {
                    fail(v, "dlogits: padding column %d of part %d changed", p * Vl + c, p);
                }
            }
    }
    Sample some = sample_some((size_t)N * V, FD_SAMPLES, N);
    for (int r = 0; r < N; r++) sample_add(&some, (size_t)r * V + targets[r]);
    check_gradient(v, "dlogits", dlogits, fill_real, loss.logits, &some, crossentropy_loss, &loss);

    /* the embedding: each part's rows (0 for the others' tokens) add up to the lookup */
    const int B = TEST_B, T = TEST_T, C = TEST_C;
    const size_t n_out = (size_t)N * C, n_wte = (size_t)Vp * C, n_wpe = (size_t)TEST_MAXT * C;
    float *wte = random_floats(n_wte, -1, 1), *wpe = random_floats(n_wpe, -1, 1);
    float *want = check_alloc(n_out * sizeof(float)), *got = check_alloc(n_out * sizeof(float));
    float *mine = check_alloc(n_out * sizeof(float));
    kernels_cpu.embedding_forward(want, targets, wte, wpe, B, T, C);
    memset(got, 0, n_out * sizeof(float));
    for (int p = 0; p < P; p++) {
        kernels_cpu.embedding_forward_rows(mine, targets, wte + (size_t)p * Vl * C, wpe, B, T, C, p * Vl, Vl);
        for (size_t i = 0; i < n_out; i++) got[i] += mine[i];
    }
    if (memcmp(got, want, n_out * sizeof(float)) != 0)
        fail(v, "embedding_forward_rows: the parts' sum is not the lookup");
    float *dout = random_floats(n_out, -1, 1);
    float *dwte_want = random_floats(n_wte, -1, 1), *dwte = copy_floats(dwte_want, n_wte);
    float *dwpe_fill = random_floats(n_wpe, -1, 1), *dwpe_want = copy_floats(dwpe_fill, n_wpe);
    kernels_cpu.embedding_backward(dwte_want, dwpe_want, dout, targets, B, T, C, V);
    for (int p = 0; p < P; p++) { /* wpe is whole on every part: each makes its whole gradient */
        float *dwpe = copy_floats(dwpe_fill, n_wpe);
        kernels_cpu.embedding_backward_rows(dwte + (size_t)p * Vl * C, dwpe, dout, targets, B, T, C, p * Vl,
                                            Vl);
        if (memcmp(dwpe, dwpe_want, n_wpe * sizeof(float)) != 0)
            fail(v, "embedding_backward_rows: part %d's dwpe is not the whole one", p);
    }
    if (memcmp(dwte, dwte_want, n_wte * sizeof(float)) != 0)
        fail(v, "embedding_backward_rows: the parts' dwte rows are not the whole one");
}

/* ---- adamw ----------------------------------------------------------------- */

static void check_adamw(Verdict *v) {
    const size_t n = 1003;
    const int steps = 3;
    /* Odd hyperparameters: grad_scale != 1 and weight decay large enough to see. */
    const float lr = 1e-2f, beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f, weight_decay = 0.1f, grad_scale = 0.7f;
    float *params = random_floats(n, -1, 1);
    float *m = random_floats(n, -0.1, 0.1), *vv = random_floats(n, 0, 0.01); /* v >= 0 */
    /* Every 7th element starts with empty moments and gets tiny gradients, so
     * sqrt(vhat) is below eps there and where eps sits in the formula shows. */
    for (size_t i = 0; i < n; i += 7) m[i] = vv[i] = 0.0f;
    double *ref_params = to_double(params, n), *ref_m = to_double(m, n), *ref_v = to_double(vv, n);
    float *grads = check_alloc(n * sizeof(float));

    for (int t = 1; t <= steps; t++) {
        /* gradients spread over nine orders of magnitude */
        for (size_t i = 0; i < n; i++) {
            double magnitude = i % 7 == 0 ? uniform(1e-10, 1e-9) : pow(10.0, uniform(-6, 0));
            grads[i] = (float)(magnitude * (random_int(2) ? 1 : -1));
        }
        kernels_cpu.adamw_update(params, grads, m, vv, n, lr, beta1, beta2, eps, weight_decay, grad_scale, t);
        /* the formula of kernels.h, in double, on the same float hyperparameters */
        double b1 = beta1, b2 = beta2, bias1 = 1.0 - pow(b1, t), bias2 = 1.0 - pow(b2, t);
        for (size_t i = 0; i < n; i++) {
            double g = (double)grads[i] * (double)grad_scale;
            ref_m[i] = b1 * ref_m[i] + (1.0 - b1) * g;
            ref_v[i] = b2 * ref_v[i] + (1.0 - b2) * g * g;
            double mhat = ref_m[i] / bias1, vhat = ref_v[i] / bias2;
            ref_params[i] -=
                (double)lr * (mhat / (sqrt(vhat) + (double)eps) + (double)weight_decay * ref_params[i]);
        }
    }
    compare(v, "params", to_double(params, n), ref_params, NULL, n, ADAMW_RTOL);
    compare(v, "m", to_double(m, n), ref_m, NULL, n, ADAMW_RTOL);
    compare(v, "v", to_double(vv, n), ref_v, NULL, n, ADAMW_RTOL);
}

/* ---- sum_squares ----------------------------------------------------------- */

static void check_sum_squares(Verdict *v) {
    /* Sizes below, at and around the kernel's 64 chunks, and one large and prime. */
    const size_t sizes[] = {0, 1, 5, 63, 64, 65, 1000, 1000003};
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
        size_t n = sizes[s];
        float *x = random_floats(n + 1, -1, 1); /* one extra element past n: must not be summed */
        x[n] = 1e6f;
        double want = 0.0;
        for (size_t i = 0; i < n; i++) want += (double)x[i] * x[i];
        double got = kernels_cpu.sum_squares(x, n);
        char tensor[48];
        snprintf(tensor, sizeof tensor, "sum_squares(n=%zu)", n);
        compare(v, tensor, &got, &want, NULL, 1, SUM_SQUARES_RTOL);
    }
}

/* ---- conversions to and from 16 bits ---------------------------------------- */

/* The formats by their numbers, not their bits: significant bits (with the
 * implicit one), exponent of the smallest normal, exponent bias, largest finite. */
typedef struct {
    const char *name;
    HalfFormat format;
    int significant_bits, min_exponent, bias;
    double max;
} HalfSpec;
static const HalfSpec half_specs[] = {
    {"bf16", HALF_BF16, 8, -126, 127, 0x1.fep127},
    {"fp16", HALF_F16, 11, -14, 15, 65504.0},
};

/* The value of `spec` nearest to x, ties to even, computed in double and
 * independently of half.h: scale x so that one unit in the last place is 1,
 * round with nearbyint (the default rounding mode is to nearest, ties to
 * even), scale back. Below the smallest normal the unit stays that of the
 * smallest normal (subnormals); past the largest finite value: Inf. */
static double ref_half_round(double x, const HalfSpec *spec) {
    if (isnan(x) || isinf(x) || x == 0.0) return x;
    int e;
    frexp(fabs(x), &e); /* |x| = f 2^e, f in [0.5, 1): the leading bit is 2^(e-1) */
    int lead = e - 1 < spec->min_exponent ? spec->min_exponent : e - 1;
    double unit = ldexp(1.0, lead - (spec->significant_bits - 1));
    double r = nearbyint(x / unit) * unit;
    return fabs(r) > spec->max ? copysign(INFINITY, x) : r;
}

/* The value of 16-bit pattern h from its fields: sign, exponent, mantissa. */
static double ref_half_value(uint16_t h, const HalfSpec *spec) {
    int mantissa_bits = spec->significant_bits - 1, exponent_bits = 15 - mantissa_bits;
    int sign = h >> 15, exponent = (h >> mantissa_bits) & ((1 << exponent_bits) - 1);
    int mantissa = h & ((1 << mantissa_bits) - 1);
    double value;
    if (exponent == (1 << exponent_bits) - 1)
        value = mantissa ? NAN : INFINITY;
    else if (exponent == 0)
        value = ldexp(mantissa, 1 - spec->bias - mantissa_bits);
    else
        value = ldexp(1.0 + ldexp(mantissa, -mantissa_bits), exponent - spec->bias);
    return sign ? -value : value;
}

static float float_of_bits(uint32_t u) {
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}

/* Same value, NaN for NaN, and the same sign for zeros. */
static int same_value(double got, double want) {
    if (isnan(want)) return isnan(got);
    return got == want && signbit(got) == signbit(want);
}

static void check_casts_of(Verdict *v, const HalfSpec *spec) {
    /* The edges, written out: specials, ties at every scale, the range's ends. */
    const float edges[] = {
        0.0f,        -0.0f,       INFINITY,        -INFINITY,     NAN,           -NAN,     1.0f,
        -1.0f,       FLT_MAX,     -FLT_MAX,        FLT_MIN,       FLT_TRUE_MIN,  65504.0f, 65505.0f,
        65519.0f,    65520.0f,    65536.0f,        -65520.0f,     1e5f,          3.0e38f, /* fp16's top */
        0x1p-14f,    0x1p-15f,    0x1p-24f,        0x1p-25f,      0x1.0001p-25f, 0x1p-26f, 0x1.8p-24f,
        0x1.4p-23f,                                                              /* fp16's bottom */
        0x1.008p0f,  0x1.018p0f,  0x1.0080002p0f,  0x1.004p0f,    0x1.00cp0f,    /* bf16 ties (even, odd) and
                                                                                    near */
        0x1.002p0f,  0x1.006p0f,  0x1.0020002p0f,  0x1.008p-130f, 0x1.018p-130f, /* fp16 ties; bf16 subnormals
                                                                                  */
        0x1.fep127f, 0x1.ffp127f, 0x1.fefffep127f, /* bf16's largest, halfway past it, just below halfway */
    };
    size_t n_edges = sizeof edges / sizeof edges[0];
    /* Then random bit patterns (every exponent), values around fp16's range,
     * and constructed ties: a kept part, exactly half of the dropped part. */
    size_t n = n_edges + 3 * 20000;
    float *x = check_alloc(n * sizeof(float));
    memcpy(x, edges, sizeof edges);
    int dropped = 24 - spec->significant_bits; /* float bits below the format's last place */
    for (size_t i = n_edges; i < n; i++) {
        size_t kind = (i - n_edges) % 3;
        uint32_t u = rng_next_u32(&rng_state);
        if (kind == 0) x[i] = float_of_bits(u);
        if (kind == 1) x[i] = (float)(uniform(-1, 1) * ldexp(1.0, random_int(48) - 30));
        if (kind == 2) x[i] = float_of_bits((u & ~((1u << dropped) - 1u)) | (1u << (dropped - 1)));
    }
    uint16_t *h = check_alloc(n * sizeof(uint16_t));
    float *back = check_alloc(n * sizeof(float));
    kernels_cpu.cast_to_half(h, x, n, spec->format);
    kernels_cpu.cast_from_half(back, h, n, spec->format);
    for (size_t i = 0; i < n; i++) {
        double want = ref_half_round(x[i], spec);
        if (!same_value(back[i], want))
            fail(v, "%s: %a rounds to %a (bits %04x), the reference says %a", spec->name, x[i], back[i], h[i],
                 want);
    }
    /* Back to float, every one of the 65536 patterns, and again to 16 bits. */
    uint16_t *all = check_alloc(65536 * sizeof(uint16_t)), *again = check_alloc(65536 * sizeof(uint16_t));
    float *values = check_alloc(65536 * sizeof(float));
    for (size_t i = 0; i < 65536; i++) all[i] = (uint16_t)i;
    kernels_cpu.cast_from_half(values, all, 65536, spec->format);
    kernels_cpu.cast_to_half(again, values, 65536, spec->format);
    for (size_t i = 0; i < 65536; i++) {
        double want = ref_half_value(all[i], spec);
        if (!same_value(values[i], want))
            fail(v, "%s: bits %04zx read as %a, the reference says %a", spec->name, i, values[i], want);
        if (!isnan(want) && again[i] != all[i])
            fail(v, "%s: bits %04zx came back as %04x", spec->name, i, again[i]);
    }
}

static void check_casts(Verdict *v) {
    for (size_t s = 0; s < sizeof half_specs / sizeof half_specs[0]; s++) check_casts_of(v, &half_specs[s]);
    if (v->worst_ratio < 0) { /* exact checks only: report a pass as no error at all */
        v->worst_ratio = 0.0;
        v->err = 0.0;
        v->tol = 0.0;
        snprintf(v->where, sizeof v->where, "every value equals the reference");
    }
}

/* The kernels of 16-bit storage, exactly: adamw_update_half against the fp32
 * adamw_update (checked above) on the same gradients, then the rounding of
 * its result; accumulate_half against rounding the float sum; sum_squares_half
 * against a double sum of the values, Inf and NaN passing through. */
static void check_mixed_of(Verdict *v, const HalfSpec *spec) {
    const size_t n = 1003;
    HalfFormat f = spec->format;
    float *grads = random_floats(n, -1e-3, 1e-3), *master = random_floats(n, -1, 1);
    float *m = random_floats(n, -0.1, 0.1), *vv = random_floats(n, 0, 0.01);
    uint16_t *grads16 = check_alloc(n * sizeof(uint16_t)), *params16 = check_alloc(n * sizeof(uint16_t));
    kernels_cpu.cast_to_half(grads16, grads, n, f);
    kernels_cpu.cast_from_half(grads, grads16, n, f); /* the values the 16-bit gradients hold */
    float *params = copy_floats(master, n), *m32 = copy_floats(m, n), *v32 = copy_floats(vv, n);
    kernels_cpu.adamw_update_half(master, params16, grads16, m, vv, n, 1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.7f,
                                  2, f);
    kernels_cpu.adamw_update(params, grads, m32, v32, n, 1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.7f, 2);
    for (size_t i = 0; i < n; i++) {
        if (master[i] != params[i] || m[i] != m32[i] || vv[i] != v32[i])
            fail(v, "%s adamw_update_half[%zu]: master %a, fp32 adamw %a", spec->name, i, master[i],
                 params[i]);
        if (!same_value(ref_half_value(params16[i], spec), ref_half_round(master[i], spec)))
            fail(v, "%s adamw_update_half[%zu]: 16-bit weight %04x is not the master %a rounded", spec->name,
                 i, params16[i], master[i]);
    }
    float *add = random_floats(n, -10, 10);
    uint16_t *acc = check_alloc(n * sizeof(uint16_t));
    memcpy(acc, grads16, n * sizeof(uint16_t));
    kernels_cpu.accumulate_half(acc, add, n, f);
    for (size_t i = 0; i < n; i++) {
        float sum = (float)ref_half_value(grads16[i], spec) + add[i];
        if (!same_value(ref_half_value(acc[i], spec), ref_half_round(sum, spec)))
            fail(v, "%s accumulate_half[%zu]: %04x, expected %a rounded", spec->name, i, acc[i], sum);
    }
    double want = 0.0;
    for (size_t i = 0; i < n; i++) want += ref_half_value(acc[i], spec) * ref_half_value(acc[i], spec);
    double got = kernels_cpu.sum_squares_half(acc, n, f);
    record(v, spec->name, NO_INDEX, got, want, SUM_SQUARES_RTOL * want);
    acc[n / 2] = half_from_float(INFINITY, f);
    if (!isinf(kernels_cpu.sum_squares_half(acc, n, f)))
        fail(v, "%s sum_squares_half misses an Inf", spec->name);
    acc[n / 3] = half_from_float(NAN, f);
    if (!isnan(kernels_cpu.sum_squares_half(acc, n, f)))
        fail(v, "%s sum_squares_half misses a NaN", spec->name);
    kernels_cpu.fill_zero_half(acc, n - 1);
    for (size_t i = 0; i < n - 1; i++)
        if (acc[i] != 0) fail(v, "%s fill_zero_half left %04x at %zu", spec->name, acc[i], i);
    float after[1];
    kernels_cpu.cast_from_half(after, &acc[n - 1], 1, f);
    if (after[0] == 0.0f && add[n - 1] != 0.0f) fail(v, "%s fill_zero_half zeroed past n", spec->name);
}

static void check_mixed(Verdict *v) {
    for (size_t s = 0; s < sizeof half_specs / sizeof half_specs[0]; s++) check_mixed_of(v, &half_specs[s]);
}

/* fp16's loss-scale rule (mixed.h: loss_scaler_update, exercise 05.4),
 * step by step against sequences worked by hand: clean (.) and overflowing
 * (X) steps, and after each the skip and the scale for the next step. */
typedef struct {
    const char *name;
    float loss_scale; /* --loss-scale: 0 dynamic */
    int window;
    const char *steps;   /* one character per step: . clean, X overflow */
    const char *skipped; /* 1 where the step is skipped */
    float scales[16];    /* the scale after each step */
} ScalerCase;

static const ScalerCase scaler_cases[] = {
    /* the count of clean steps restarts at an overflow (step 5): the doubling comes 2 clean steps later */
    {"dynamic, window 2",
     0.0f,
     2,
     "..X.X...",
     "00101000",
     {65536, 131072, 65536, 65536, 32768, 32768, 65536, 65536}},
    /* a run of overflows halves each time; the window-th clean step (not the one after) doubles */
    {"dynamic, window 3",
     0.0f,
     3,
     "XXX...X...",
     "1110001000",
     {32768, 16384, 8192, 8192, 8192, 16384, 8192, 8192, 8192, 16384}},
    /* a fixed scale skips overflowing steps and never moves */
    {"fixed 1024",
     1024.0f,
     2,
     "..X..XX..",
     "001001100",
     {1024, 1024, 1024, 1024, 1024, 1024, 1024, 1024, 1024}},
};

static void check_loss_scale(Verdict *v) {
    for (size_t c = 0; c < sizeof scaler_cases / sizeof scaler_cases[0]; c++) {
        const ScalerCase *sc = &scaler_cases[c];
        LossScaler ls;
        loss_scaler_start(&ls, PRECISION_FP16, sc->loss_scale, sc->window);
        for (int i = 0; sc->steps[i]; i++) {
            int skipped = loss_scaler_update(&ls, sc->steps[i] == '.');
            if (skipped != sc->skipped[i] - '0' || ls.scale != sc->scales[i]) {
                fail(v, "%s, steps %.*s: step %d %s with the scale then %g (expected %s, %g)", sc->name,
                     i + 1, sc->steps, i + 1, skipped ? "skipped" : "taken", ls.scale,
                     sc->skipped[i] == '1' ? "skipped" : "taken", sc->scales[i]);
                break;
            }
        }
    }
    /* bf16 (and fp32): no scaling, never a skip */
    LossScaler ls;
    loss_scaler_start(&ls, PRECISION_BF16, 0.0f, 2);
    if (loss_scaler_update(&ls, 0) || loss_scaler_update(&ls, 1) || ls.scale != 1.0f)
        fail(v, "bf16: a step was skipped or the scale left 1 (%g)", ls.scale);
    record(v, "loss scale", NO_INDEX, 0.0, 0.0, 1.0);
}

/* The matmuls with 16-bit inputs: the same as the fp32 kernels (checked
 * above) run on the inputs rounded to the format, dbias from the unrounded
 * dout; and not the fp32 result itself (the rounding happened). */
static float *rounded_copy(const float *x, size_t n, HalfFormat format) {
    float *y = check_alloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) y[i] = half_to_float(half_from_float(x[i], format), format);
    return y;
}

static void check_linear_half_of(Verdict *v, const HalfSpec *spec) {
    const int N = TEST_N, C = TEST_C, OC = TEST_OC;
    const size_t n_in = (size_t)N * C, n_out = (size_t)N * OC, n_w = (size_t)OC * C;
    HalfFormat f = spec->format;
    float *inp = random_floats(n_in, -1, 1), *weight = random_floats(n_w, -1, 1),
          *bias = random_floats(OC, -1, 1);
    float *dout = random_floats(n_out, -1, 1);
    float *inp16 = rounded_copy(inp, n_in, f), *weight16 = rounded_copy(weight, n_w, f);
    float *dout16 = rounded_copy(dout, n_out, f);
    float *out = check_alloc(n_out * sizeof(float)), *want = check_alloc(n_out * sizeof(float));
    float *unrounded = check_alloc(n_out * sizeof(float));
    kernels_cpu.linear_forward_half(out, inp, weight, bias, N, C, OC, f);
    kernels_cpu.linear_forward(want, inp16, weight16, bias, N, C, OC);
    kernels_cpu.linear_forward(unrounded, inp, weight, bias, N, C, OC);
    char tensor[48];
    snprintf(tensor, sizeof tensor, "%s out", spec->name);
    compare_forward(v, tensor, out, to_double(want, n_out), n_out);
    double moved = 0.0;
    for (size_t i = 0; i < n_out; i++) moved = fmax(moved, fabs(out[i] - unrounded[i]));
    if (moved < 1e-4)
        fail(v, "%s linear_forward_half gives the fp32 result: the inputs were not rounded", spec->name);

    float *dinp = random_floats(n_in, -1, 1), *dweight = random_floats(n_w, -1, 1),
          *dbias = random_floats(OC, -1, 1);
    float *want_dinp = copy_floats(dinp, n_in), *want_dweight = copy_floats(dweight, n_w);
    float *want_dbias = copy_floats(dbias, OC);
    kernels_cpu.linear_backward_half(dinp, dweight, dbias, dout, inp, weight, N, C, OC, f);
    kernels_cpu.linear_backward(want_dinp, want_dweight, NULL, dout16, inp16, weight16, N, C, OC);
    float *scratch_dinp = check_alloc(n_in * sizeof(float)),
          *scratch_dweight = check_alloc(n_w * sizeof(float));
    kernels_cpu.linear_backward(scratch_dinp, scratch_dweight, want_dbias, dout, inp, weight, N, C, OC);
    snprintf(tensor, sizeof tensor, "%s dinp", spec->name);
    compare_forward(v, tensor, dinp, to_double(want_dinp, n_in), n_in);
    snprintf(tensor, sizeof tensor, "%s dweight", spec->name);
    compare_forward(v, tensor, dweight, to_double(want_dweight, n_w), n_w);
    snprintf(tensor, sizeof tensor, "%s dbias", spec->name);
    compare_forward(v, tensor, dbias, to_double(want_dbias, OC), OC);
}

static void check_linear_half(Verdict *v) {
    for (size_t s = 0; s < sizeof half_specs / sizeof half_specs[0]; s++)
        check_linear_half_of(v, &half_specs[s]);
}

/* ---- main ------------------------------------------------------------------ */

typedef struct {
    const char *name;
    void (*check)(Verdict *v);
} KernelCheck;

static const KernelCheck checks[] = {
    {"embedding", check_embedding},
    {"layernorm", check_layernorm},
    {"linear", check_linear},
    {"attention", check_attention},
    {"ring_attention", check_ring_attention},
    {"gelu", check_gelu},
    {"residual", check_residual},
    {"crossentropy", check_crossentropy},
    {"vocab_split", check_vocab_split},
    {"moe", check_moe},
    {"moe_balance", check_moe_balance},
    {"adamw", check_adamw},
    {"sum_squares", check_sum_squares},
    {"casts", check_casts},
    {"mixed", check_mixed},
    {"linear_half", check_linear_half},
    {"loss_scale", check_loss_scale},
};
static const int check_count = sizeof checks / sizeof checks[0];

static void usage_error(const char *problem) {
    char names[256] = "";
    for (int i = 0; i < check_count; i++) {
        strncat(names, " ", sizeof names - strlen(names) - 1);
        strncat(names, checks[i].name, sizeof names - strlen(names) - 1);
    }
    fatal(EXIT_USAGE, "%s; usage: test_kernels [--seed S] [--verbose] [kernel], kernels:%s", problem, names);
}

int main(int argc, char **argv) {
    uint64_t seed = (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 32);
    const char *only = NULL;
    char problem[256];
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--seed") == 0) {
            char *end;
            if (i + 1 == argc) usage_error("--seed needs a value");
            seed = strtoull(argv[++i], &end, 10);
            if (*argv[i] == '\0' || *end != '\0') {
                snprintf(problem, sizeof problem, "--seed '%s' is not a number", argv[i]);
                usage_error(problem);
            }
        } else if (strcmp(argv[i], "--verbose") == 0) {
            verbose = 1;
        } else if (only == NULL && argv[i][0] != '-') {
            only = argv[i];
        } else {
            snprintf(problem, sizeof problem, "unexpected argument '%s'", argv[i]);
            usage_error(problem);
        }
    }
    int found = only == NULL;
    for (int i = 0; i < check_count; i++) found |= only && strcmp(only, checks[i].name) == 0;
    if (!found) {
        snprintf(problem, sizeof problem, "unknown kernel '%s'", only);
        usage_error(problem);
    }

    printf("seed %llu (rerun with --seed %llu)\n", (unsigned long long)seed, (unsigned long long)seed);
    int failures = 0;
    for (int i = 0; i < check_count; i++) {
        if (only && strcmp(only, checks[i].name) != 0) continue;
        /* Each kernel draws from its own stream: running one alone repeats it. */
        rng_state = hash64(seed ^ hash_string(checks[i].name));
        Verdict v = {.worst_ratio = -1.0};
        checks[i].check(&v);
        release_all();
        if (v.worst_ratio <= 1.0) {
            printf("PASS %s max_err=%.2e tol=%.2e (worst: %s)\n", checks[i].name, v.err, v.tol, v.where);
        } else if (isnan(v.err)) { /* an exact check failed (fail()) */
            printf("FAIL %s %s\n", checks[i].name, v.where);
            failures++;
        } else {
            printf("FAIL %s %s max_err=%.2e tol=%.2e\n", checks[i].name, v.where, v.err, v.tol);
            failures++;
        }
        fflush(stdout);
    }
    return failures ? 1 : 0;
}
