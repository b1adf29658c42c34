/* test_cpu_adam.c: chapter 06's CPU AdamW (06_offload/cpu_adam.c) checked bit
 * for bit against a reference, on every path this CPU can run.
 *
 *   build/tests/test_cpu_adam parity [PATH]    against the kernel table (kernels_cpu.c's adamw_update,
 *                                              and adamw_update_half for the 16-bit write-back)
 *   build/tests/test_cpu_adam exercise [PATH]  against cpu_adam.c's own scalar path (exercise 06.1's
 *                                              grader: it does not need exercise 01.2's AdamW); PATH: avx2
 *   build/tests/test_cpu_adam speed PATH [MIN] PATH's speed over the scalar path's at 1 thread, the median
 *                                              of 7 interleaved timings of this thread's CPU time;
 *                                              fails below MIN (default 1.5); VERBOSE=1 prints each timing
 *   build/tests/test_cpu_adam path             the path cpu_adamw takes (COURSE_CPU_ADAM) and those supported
 *
 * Each comparison runs lengths that end anywhere relative to the vectors
 * (0, 1, 15, 17, 33, ... and past several OpenMP chunks), with the five
 * arrays starting at different misalignments, without and with the 16-bit
 * write-back in both formats, on 1 and 3 threads. Two kinds of inputs:
 * ordinary AdamW states (magnitudes from 2^-30 to 2^4, several step
 * numbers t, grad_scale and weight decay on and off), and master weights
 * with bit patterns chosen to stress the rounding (NaN with payloads,
 * signalling NaN, Inf, subnormals, ties in both 16-bit formats, fp16's
 * overflow edge at 65520) plus random bits. Guard zones around every array
 * must come back untouched: a tail loop that runs past n fails.
 *
 * Output: "PASS name ..." or "FAIL name <first difference>" per check; exit 0
 * when all pass, 1 when one fails, 2 on bad arguments. */
#include "06_offload/cpu_adam.h" /* 06: the host AdamW */
#include "common/kernels/kernels.h" /* ops(): the kernel table */
#include "common/core/util.h" /* fatal, log_info, exit codes, flag parsing */

#include <math.h>
#include <omp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define GUARD 64 /* elements of guard zone before and after each array */
#define GUARD_BITS 0x7fbadbadu

static uint64_t rng_state = 0x06adu;
static uint32_t next_bits(void) {
    rng_state = hash64(rng_state + 0x9e3779b97f4a7c15ull);
    return (uint32_t)(rng_state >> 32);
}
static float uniform(void) { /* [0, 1) */
    return (float)(next_bits() >> 8) / 16777216.0f;
}
/* A signed value whose magnitude spans 2^lo .. 2^hi. */
static float spread(int lo, int hi) {
    float x = ldexpf(1.0f + uniform(), lo + (int)(next_bits() % (uint32_t)(hi - lo + 1)));
    return next_bits() & 1 ? -x : x;
}

/* Master weights that stress the 16-bit rounding. */
static const uint32_t special_bits[] = {
    0x00000000u, 0x80000000u, 0x00000001u, 0x80000001u, 0x007fffffu, /* zeros, float subnormals */
    0x33000000u, 0x33000001u, 0x337fffffu, 0x33800000u, 0x33c00000u, /* around fp16's smallest subnormal */
    0x387fc000u, 0x387fe000u, 0x387ff000u, 0x38800000u,              /* fp16's subnormal/normal edge */
    0x477fe000u, 0x477fefffu, 0x477ff000u, 0x477ff001u, 0xc77ff000u, /* 65504, 65520: fp16 overflow */
    0x3f808000u, 0x3f818000u, 0x3f808001u, 0x3f80ffffu, 0xbf818000u, /* bf16 ties (even, odd), near ties */
    0x3f801000u, 0x3f803000u,                                        /* fp16 ties (even, odd) */
    0x7f7fffffu, 0xff7fffffu, 0x7f7f8000u,                           /* the largest floats: bf16 Inf */
    0x7f800000u, 0xff800000u, 0x7fc00000u, 0xffc00000u,              /* Inf, NaN */
    0x7f800001u, 0x7fa00000u, 0xffc12345u, 0x7fffffffu, 0xff80abcdu, /* NaNs with payloads, signalling */
};

typedef enum { INPUTS_ADAM, INPUTS_ROUNDING } Inputs;
typedef enum { REF_KERNEL_TABLE, REF_SCALAR_PATH } Reference;

/* One array with guard zones: data = base + GUARD + offset. */
typedef struct {
    uint32_t *base;
    size_t n, offset, elem_bytes;
} Guarded;

static void *guarded_alloc(Guarded *g, size_t n, size_t offset, size_t elem_bytes) {
    g->n = n;
    g->offset = offset;
    g->elem_bytes = elem_bytes;
    size_t words = ((n + 2 * GUARD + offset) * elem_bytes + 3) / 4 + 1;
    g->base = xmalloc(words * 4);
    for (size_t i = 0; i < words; i++) g->base[i] = GUARD_BITS;
    return (char *)g->base + (GUARD + offset) * elem_bytes;
}

/* 1 if the guard zones still hold their pattern. */
static int guards_intact(const Guarded *g) {
    const unsigned char *bytes = (const unsigned char *)g->base, pattern[4] = {0xad, 0xdb, 0xba, 0x7f};
    size_t start = (GUARD + g->offset) * g->elem_bytes, end = start + g->n * g->elem_bytes;
    size_t total = ((g->n + 2 * GUARD + g->offset) * g->elem_bytes + 3) / 4 * 4;
    for (size_t b = 0; b < total; b++)
        if ((b < start || b >= end) && bytes[b] != pattern[b % 4]) return 0;
    return 1;
}

static int failures = 0;
static char first_failure[512];

static void fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void fail(const char *fmt, ...) {
    if (failures++ == 0) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(first_failure, sizeof first_failure, fmt, ap);
        va_end(ap);
    }
}

static uint32_t bits_of(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    return u;
}

/* One case: n parameters, arrays at the given misalignments (in elements:
 * master, grads, m, v, out16), write-back none (-1) or in a format. */
static void run_case(CpuAdamPath path, Reference reference, Inputs inputs, size_t n, const size_t offset[5],
                     int half, int threads) {
    static const int steps[] = {1, 2, 10, 1000};
    CpuAdamArgs a = {.lr = 1e-3f * (1.0f + uniform()),
                     .beta1 = 0.9f,
                     .beta2 = next_bits() & 1 ? 0.95f : 0.999f,
                     .eps = 1e-8f,
                     .weight_decay = next_bits() & 1 ? 0.1f : 0.0f,
                     .grad_scale = next_bits() & 1 ? 1.0f : 0.37f,
                     .t = steps[next_bits() % 4]};
    HalfFormat fmt = half < 0 ? HALF_BF16 : (HalfFormat)half;
    float *p0 = xmalloc((n + 1) * 4), *g = xmalloc((n + 1) * 4), *m0 = xmalloc((n + 1) * 4),
          *v0 = xmalloc((n + 1) * 4);
    uint16_t *g16 = xmalloc((n + 1) * 2);
    for (size_t i = 0; i < n; i++) {
        if (inputs == INPUTS_ADAM) {
            p0[i] = half >= 0 && i % 7 == 3 ? spread(-30, 17) : spread(-8, 1);
            g[i] = i % 11 == 5 ? 0.0f : spread(-30, 4);
            m0[i] = spread(-30, 2);
            v0[i] = fabsf(spread(-40, 4));
        } else {
            uint32_t u =
                i % 2 ? special_bits[(i / 2) % (sizeof special_bits / sizeof *special_bits)] : next_bits();
            memcpy(&p0[i], &u, 4);
            g[i] = m0[i] = v0[i] = 0.0f;
            a.weight_decay = 0.0f;
        }
        if (half >= 0) { /* the kernel table's 16-bit AdamW reads 16-bit gradients: use their values */
            g16[i] = half_from_float(g[i], fmt);
            g[i] = half_to_float(g16[i], fmt);
        }
    }

    /* the reference, on plain arrays */
    float *rp = xmalloc((n + 1) * 4), *rm = xmalloc((n + 1) * 4), *rv = xmalloc((n + 1) * 4);
    uint16_t *r16 = xmalloc((n + 1) * 2);
    memcpy(rp, p0, n * 4);
    memcpy(rm, m0, n * 4);
    memcpy(rv, v0, n * 4);
    omp_set_num_threads(threads);
    if (reference == REF_SCALAR_PATH)
        cpu_adamw_on(CPU_ADAM_SCALAR, rp, g, rm, rv, n, &a, half >= 0 ? r16 : NULL, fmt);
    else if (half >= 0)
        kernels_cpu.adamw_update_half(rp, r16, g16, rm, rv, n, a.lr, a.beta1, a.beta2, a.eps, a.weight_decay,
                                      a.grad_scale, a.t, fmt);
    else
        kernels_cpu.adamw_update(rp, g, rm, rv, n, a.lr, a.beta1, a.beta2, a.eps, a.weight_decay,
                                 a.grad_scale, a.t);

    /* the path under test, on misaligned arrays inside guard zones */
    Guarded gp, gg, gm, gv, g16out;
    float *p = guarded_alloc(&gp, n, offset[0], 4), *gr = guarded_alloc(&gg, n, offset[1], 4);
    float *m = guarded_alloc(&gm, n, offset[2], 4), *v = guarded_alloc(&gv, n, offset[3], 4);
    uint16_t *out16 = guarded_alloc(&g16out, n, offset[4], 2);
    memcpy(p, p0, n * 4);
    memcpy(gr, g, n * 4);
    memcpy(m, m0, n * 4);
    memcpy(v, v0, n * 4);
    cpu_adamw_on(path, p, gr, m, v, n, &a, half >= 0 ? out16 : NULL, fmt);

    const char *what = half < 0 ? "fp32" : fmt == HALF_BF16 ? "bf16" : "fp16";
    const char *kind = inputs == INPUTS_ADAM ? "adam" : "rounding";
    for (size_t i = 0; i < n; i++) {
        const char *name = NULL;
        uint32_t got = 0, want = 0;
        if (bits_of(p[i]) != bits_of(rp[i]))
            name = "master", got = bits_of(p[i]), want = bits_of(rp[i]);
        else if (bits_of(m[i]) != bits_of(rm[i]))
            name = "m", got = bits_of(m[i]), want = bits_of(rm[i]);
        else if (bits_of(v[i]) != bits_of(rv[i]))
            name = "v", got = bits_of(v[i]), want = bits_of(rv[i]);
        else if (half >= 0 && out16[i] != r16[i])
            name = "out16", got = out16[i], want = r16[i];
        if (name) {
            fail("%s path, %s inputs, %s, n=%zu, offsets %zu %zu %zu %zu %zu, %d threads: %s[%zu] = 0x%08x, "
                 "reference 0x%08x (master before: 0x%08x)",
                 cpu_adam_path_name(path), kind, what, n, offset[0], offset[1], offset[2], offset[3],
                 offset[4], threads, name, i, got, want, bits_of(p0[i]));
            break;
        }
    }
    if (!guards_intact(&gp) || !guards_intact(&gg) || !guards_intact(&gm) || !guards_intact(&gv) ||
        !guards_intact(&g16out))
        fail("%s path, %s, n=%zu, offsets %zu %zu %zu %zu %zu: wrote outside its arrays",
             cpu_adam_path_name(path), what, n, offset[0], offset[1], offset[2], offset[3], offset[4]);
    free(gp.base), free(gg.base), free(gm.base), free(gv.base), free(g16out.base);
    free(p0), free(g), free(m0), free(v0), free(g16), free(rp), free(rm), free(rv), free(r16);
}

/* Every length, misalignment, write-back and thread count, on one path. */
static int compare_path(CpuAdamPath path, Reference reference) {
    static const size_t lengths[] = {0,
                                     1,
                                     2,
                                     5,
                                     7,
                                     8,
                                     9,
                                     15,
                                     16,
                                     17,
                                     31,
                                     32,
                                     33,
                                     47,
                                     63,
                                     64,
                                     65,
                                     100,
                                     257,
                                     1023,
                                     CPU_ADAM_CHUNK - 3,
                                     CPU_ADAM_CHUNK + 29,
                                     2 * CPU_ADAM_CHUNK,
                                     3 * CPU_ADAM_CHUNK + 45};
    static const size_t offsets[][5] = {{0, 0, 0, 0, 0}, {1, 2, 3, 0, 1}, {3, 1, 0, 2, 7}, {5, 5, 5, 5, 5}};
    int before = failures;
    size_t cases = 0;
    for (int inputs = INPUTS_ADAM; inputs <= INPUTS_ROUNDING; inputs++)
        for (size_t l = 0; l < sizeof lengths / sizeof *lengths; l++)
            for (size_t o = 0; o < sizeof offsets / sizeof *offsets; o++)
                for (int half = -1; half <= HALF_F16; half++)
                    for (int threads = 1; threads <= 3; threads += 2) {
                        if (lengths[l] < CPU_ADAM_CHUNK && threads > 1) continue; /* one chunk: one thread */
                        run_case(path, reference, (Inputs)inputs, lengths[l], offsets[o], half, threads);
                        cases++;
                    }
    const char *against = reference == REF_KERNEL_TABLE ? "the kernel table" : "the scalar path";
    if (failures > before) {
        printf("FAIL %s path against %s: %s\n", cpu_adam_path_name(path), against, first_failure);
        return 1;
    }
    printf("PASS %s path equals %s bit for bit (%zu cases: fp32, bf16, fp16 write-back; lengths 0..%zu; "
           "misaligned; 1 and 3 threads)\n",
           cpu_adam_path_name(path), against, cases, lengths[sizeof lengths / sizeof *lengths - 1]);
    return 0;
}

/* CPU time of this thread: on a shared machine, the time another process
 * holds the core is not counted (wall time would charge it to whoever was
 * running). With one OpenMP thread the update runs on this thread. */
static double thread_cpu_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
}

static double time_updates_ms(CpuAdamPath path, float *p, const float *g, float *m, float *v, size_t n,
                              uint16_t *out16, int updates) {
    CpuAdamArgs a = {
        .lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f, .grad_scale = 1.0f};
    double start = thread_cpu_ms();
    for (int k = 0; k < updates; k++) {
        a.t = k + 1;
        cpu_adamw_on(path, p, g, m, v, n, &a, out16, HALF_BF16);
    }
    return thread_cpu_ms() - start;
}

static int compare_doubles(const void *x, const void *y) {
    double a = *(const double *)x, b = *(const double *)y;
    return (a > b) - (a < b);
}

/* PATH's speed over the scalar path's, fp32 and with the bf16 write-back, on
 * one thread and 2^17 parameters (2 MiB of state: the arithmetic is timed,
 * not the memory). Timings alternate scalar, PATH, scalar, ... so that a
 * burst of load on a shared machine hits both; the median of 7 ratios. */
static int speed(CpuAdamPath path, double min_ratio) {
    const size_t n = (size_t)1 << 17;
    const int updates = 8, rounds = 7;
    float *p = xmalloc(n * 4), *g = xmalloc(n * 4), *m = xmalloc(n * 4), *v = xmalloc(n * 4);
    uint16_t *out16 = xmalloc(n * 2);
    int failed = 0;
    omp_set_num_threads(1);
    for (int with16 = 0; with16 <= 1; with16++) {
        for (size_t i = 0; i < n; i++) p[i] = spread(-8, 1), g[i] = spread(-20, 0), m[i] = 0.0f, v[i] = 0.0f;
        double ratio[7];
        time_updates_ms(path, p, g, m, v, n, with16 ? out16 : NULL, 1); /* warm-up: pages, caches */
        for (int r = 0; r < rounds; r++) {
            double scalar_ms =
                time_updates_ms(CPU_ADAM_SCALAR, p, g, m, v, n, with16 ? out16 : NULL, updates);
            double path_ms = time_updates_ms(path, p, g, m, v, n, with16 ? out16 : NULL, updates);
            ratio[r] = scalar_ms / path_ms;
            if (getenv("VERBOSE"))
                printf("  scalar %.2f ms, %s %.2f ms\n", scalar_ms, cpu_adam_path_name(path), path_ms);
        }
        qsort(ratio, rounds, sizeof *ratio, compare_doubles);
        double median = ratio[rounds / 2];
        int ok = median >= min_ratio;
        failed |= !ok;
        printf(
            "%s speed %s%s, 1 thread: %.2fx the scalar path (median of %d; range %.2f-%.2f; floor %.2fx)\n",
            ok ? "PASS" : "FAIL", cpu_adam_path_name(path), with16 ? " with bf16 write-back" : "", median,
            rounds, ratio[0], ratio[rounds - 1], min_ratio);
    }
    free(p), free(g), free(m), free(v), free(out16);
    return failed;
}

static void usage_error(const char *problem) {
    fprintf(
        stderr,
        "error: %s\nusage: test_cpu_adam parity [PATH] | exercise [PATH] | speed PATH [MIN_RATIO] | path\n"
        "       PATH: scalar, avx2 or avx512\n",
        problem);
    exit(EXIT_USAGE);
}

static CpuAdamPath path_arg(const char *name) {
    CpuAdamPath path;
    char problem[256];
    if (!cpu_adam_path_parse(name, &path)) {
        snprintf(problem, sizeof problem, "unknown path '%s'", name);
        usage_error(problem);
    }
    if (!cpu_adam_path_supported(path)) {
        printf("SKIP %s: this CPU cannot run it\n", name);
        exit(0);
    }
    return path;
}

int main(int argc, char **argv) {
    if (argc < 2) usage_error("give a check");
    const char *check = argv[1];
    if (strcmp(check, "path") == 0 && argc == 2) {
        printf("path %s\nsupported", cpu_adam_path_name(cpu_adam_path()));
        for (int k = 0; k < CPU_ADAM_PATHS; k++)
            if (cpu_adam_path_supported((CpuAdamPath)k)) printf(" %s", cpu_adam_path_name((CpuAdamPath)k));
        printf("\n");
        return 0;
    }
    if ((strcmp(check, "parity") == 0 || strcmp(check, "exercise") == 0) && argc <= 3) {
        Reference reference = strcmp(check, "parity") == 0 ? REF_KERNEL_TABLE : REF_SCALAR_PATH;
        int failed = 0;
        if (argc == 3) return compare_path(path_arg(argv[2]), reference);
        if (reference == REF_SCALAR_PATH) return compare_path(path_arg("avx2"), reference);
        for (int k = 0; k < CPU_ADAM_PATHS; k++) {
            if (cpu_adam_path_supported((CpuAdamPath)k))
                failed |= compare_path((CpuAdamPath)k, reference);
            else
                printf("SKIP %s path: this CPU cannot run it\n", cpu_adam_path_name((CpuAdamPath)k));
        }
        return failed;
    }
    if (strcmp(check, "speed") == 0 && (argc == 3 || argc == 4)) {
        char *end = NULL;
        double min_ratio = argc == 4 ? strtod(argv[3], &end) : 1.5;
        if (argc == 4 && (*end != '\0' || !(min_ratio > 0.0)))
            usage_error("MIN_RATIO must be a positive number");
        return speed(path_arg(argv[2]), min_ratio);
    }
    usage_error("unknown check or wrong number of arguments");
}
