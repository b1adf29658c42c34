/* cpu_adam.c: the host AdamW of ZeRO-Offload (cpu_adam.h says what and why).
 *
 * The scalar path (adamw_scalar) is the kernel table's AdamW element by
 * element (kernel_math.h); the AVX2 and AVX-512 loops do the same operations
 * in the same order on 8 or 16 lanes.
 * They are compiled for their instruction sets with target attributes, so
 * this file builds with the course's default flags (no -march) and runs on
 * any x86-64; the CPU is asked at run time which loops it can execute.
 *
 * Build note: the Makefile compiles this file with -ffp-contract=off. With
 * FMA available (the AVX-512 target implies it), gcc would otherwise fuse
 * `a * b + c` into one FMA, even between intrinsics, and the result would
 * differ from the kernel table's in the last bit. */
#include "06_offload/cpu_adam.h" /* 06: the host AdamW */

#include "common/kernels/kernel_math.h" /* per-element formulas of both backends */
#include "common/core/util.h" /* fatal, log_info, exit codes, flag parsing */

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define CPU_ADAM_X86 1
#endif

/* The constants of one update, computed once as the kernel table does. */
typedef struct {
    float lr, beta1, beta2, one_minus_beta1, one_minus_beta2, bias1, bias2, eps, weight_decay, grad_scale;
} Coeffs;

static Coeffs coeffs_of(const CpuAdamArgs *a) {
    return (Coeffs){
        .lr = a->lr,
        .beta1 = a->beta1,
        .beta2 = a->beta2,
        .one_minus_beta1 = 1.0f - a->beta1,
        .one_minus_beta2 = 1.0f - a->beta2,
        .bias1 = 1.0f - powf(a->beta1, (float)a->t),
        .bias2 = 1.0f - powf(a->beta2, (float)a->t),
        .eps = a->eps,
        .weight_decay = a->weight_decay,
        .grad_scale = a->grad_scale,
    };
}

/* ---- the scalar path: the definition of the arithmetic ---- */

/* AdamW on elements [0, n) of one chunk: kernel_math.h's adamw_element (exercise
 * 01.2), the very function of the kernel table's adamw_update. The vector
 * paths call it for the last n % (lanes x 2) elements of a chunk. */
static void adamw_scalar(float *p, const float *g, float *m, float *v, size_t n, const Coeffs *c,
                         uint16_t *out16, HalfFormat fmt) {
    for (size_t i = 0; i < n; i++) {
        adamw_element(&p[i], g[i], &m[i], &v[i], c->lr, c->beta1, c->beta2, c->bias1, c->bias2, c->eps,
                      c->weight_decay, c->grad_scale);
        if (out16) out16[i] = half_from_float(p[i], fmt);
    }
}

#ifdef CPU_ADAM_X86
/* ---- AVX2: 8 floats per register ---- */
#define AVX2 __attribute__((target("avx2,f16c")))

/* out[0..8) = x rounded to 16 bits as half.h rounds. bf16: integer
 * arithmetic on the float's bits (add 0x7fff plus the lowest kept bit, keep
 * the top half), NaN made quiet. fp16: the F16C conversion, which rounds to
 * nearest even like half.h, after replacing a NaN by the one quiet NaN
 * half.h returns (the hardware would keep the NaN's payload). */
AVX2 static inline void store_half8(uint16_t *out, __m256 x, HalfFormat fmt) {
    __m256i u = _mm256_castps_si256(x);
    __m256i is_nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff)),
                                        _mm256_set1_epi32(0x7f800000)); /* |x| above Inf's bits */
    __m128i h;
    if (fmt == HALF_BF16) {
        __m256i high = _mm256_srli_epi32(u, 16);
        __m256i rounding =
            _mm256_add_epi32(_mm256_set1_epi32(0x7fff), _mm256_and_si256(high, _mm256_set1_epi32(1)));
        __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(u, rounding), 16);
        __m256i quiet = _mm256_or_si256(high, _mm256_set1_epi32(0x40));
        __m256i r = _mm256_blendv_epi8(rounded, quiet, is_nan);
        /* 8 x 32 bits -> 8 x 16 bits: packus works per 128-bit lane, so gather
         * the two lanes' halves (64-bit pieces 0 and 2) into the low lane */
        r = _mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0x08);
        h = _mm256_castsi256_si128(r);
    } else {
        __m256i quiet_nan = _mm256_or_si256(_mm256_and_si256(u, _mm256_set1_epi32((int)0x80000000u)),
                                            _mm256_set1_epi32(0x7fc00000));
        x = _mm256_castsi256_ps(_mm256_blendv_epi8(u, quiet_nan, is_nan));
        h = _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT);
    }
    _mm_storeu_si128((__m128i *)out, h);
}

AVX2 static void adamw_avx2(float *p, const float *g, float *m, float *v, size_t n, const Coeffs *c,
                            uint16_t *out16, HalfFormat fmt) {
    size_t i = 0;
    /* EXERCISE 06.1 BEGIN: the vectorised AdamW inner loop (course.md, exercise 06.1) */
    const __m256 lr = _mm256_set1_ps(c->lr), beta1 = _mm256_set1_ps(c->beta1),
                 beta2 = _mm256_set1_ps(c->beta2);
    const __m256 one_minus_beta1 = _mm256_set1_ps(c->one_minus_beta1);
    const __m256 one_minus_beta2 = _mm256_set1_ps(c->one_minus_beta2);
    const __m256 bias1 = _mm256_set1_ps(c->bias1), bias2 = _mm256_set1_ps(c->bias2),
                 eps = _mm256_set1_ps(c->eps);
    const __m256 weight_decay = _mm256_set1_ps(c->weight_decay), grad_scale = _mm256_set1_ps(c->grad_scale);
    for (; i + 16 <= n; i += 16) {
        /* two registers per iteration (the compiler unrolls this loop of 2):
         * while one waits for its division, the other's can start */
        for (size_t j = i; j < i + 16; j += 8) {
            __m256 gj = _mm256_mul_ps(_mm256_loadu_ps(g + j), grad_scale);
            __m256 mj = _mm256_add_ps(_mm256_mul_ps(beta1, _mm256_loadu_ps(m + j)),
                                      _mm256_mul_ps(one_minus_beta1, gj));
            __m256 vj = _mm256_add_ps(_mm256_mul_ps(beta2, _mm256_loadu_ps(v + j)),
                                      _mm256_mul_ps(_mm256_mul_ps(one_minus_beta2, gj), gj));
            _mm256_storeu_ps(m + j, mj);
            _mm256_storeu_ps(v + j, vj);
            __m256 mhat = _mm256_div_ps(mj, bias1), vhat = _mm256_div_ps(vj, bias2);
            __m256 pj = _mm256_loadu_ps(p + j);
            __m256 step = _mm256_add_ps(_mm256_div_ps(mhat, _mm256_add_ps(_mm256_sqrt_ps(vhat), eps)),
                                        _mm256_mul_ps(weight_decay, pj));
            pj = _mm256_sub_ps(pj, _mm256_mul_ps(lr, step));
            _mm256_storeu_ps(p + j, pj);
            if (out16) store_half8(out16 + j, pj, fmt);
        }
    }
    /* EXERCISE 06.1 END */
    adamw_scalar(p + i, g + i, m + i, v + i, n - i, c, out16 ? out16 + i : NULL, fmt);
}

/* ---- AVX-512: 16 floats per register, the same loop ----
 * Part of exercise 06.1 too: at 16 lanes it is the AVX2 loop with wider
 * registers, so a student copy that kept it would hold the answer. On a CPU
 * with AVX-512, cpu_adamw takes this path by default. */
#define AVX512 __attribute__((target("avx512f")))

/* out[0..16) = x rounded to 16 bits, as store_half8. */
AVX512 static inline void store_half16(uint16_t *out, __m512 x, HalfFormat fmt) {
    __m512i u = _mm512_castps_si512(x);
    __mmask16 is_nan = _mm512_cmpgt_epi32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)),
                                               _mm512_set1_epi32(0x7f800000));
    __m256i h;
    if (fmt == HALF_BF16) {
        __m512i high = _mm512_srli_epi32(u, 16);
        __m512i rounding =
            _mm512_add_epi32(_mm512_set1_epi32(0x7fff), _mm512_and_si512(high, _mm512_set1_epi32(1)));
        __m512i rounded = _mm512_srli_epi32(_mm512_add_epi32(u, rounding), 16);
        __m512i quiet = _mm512_or_si512(high, _mm512_set1_epi32(0x40));
        h = _mm512_cvtepi32_epi16(_mm512_mask_blend_epi32(is_nan, rounded, quiet));
    } else {
        __m512i quiet_nan = _mm512_or_si512(_mm512_and_si512(u, _mm512_set1_epi32((int)0x80000000u)),
                                            _mm512_set1_epi32(0x7fc00000));
        x = _mm512_castsi512_ps(_mm512_mask_blend_epi32(is_nan, u, quiet_nan));
        h = _mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT);
    }
    _mm256_storeu_si256((__m256i *)out, h);
}

AVX512 static void adamw_avx512(float *p, const float *g, float *m, float *v, size_t n, const Coeffs *c,
                                uint16_t *out16, HalfFormat fmt) {
    size_t i = 0;
    /* EXERCISE 06.1 BEGIN: the vectorised AdamW inner loop (course.md, exercise 06.1) */
    const __m512 lr = _mm512_set1_ps(c->lr), beta1 = _mm512_set1_ps(c->beta1),
                 beta2 = _mm512_set1_ps(c->beta2);
    const __m512 one_minus_beta1 = _mm512_set1_ps(c->one_minus_beta1);
    const __m512 one_minus_beta2 = _mm512_set1_ps(c->one_minus_beta2);
    const __m512 bias1 = _mm512_set1_ps(c->bias1), bias2 = _mm512_set1_ps(c->bias2),
                 eps = _mm512_set1_ps(c->eps);
    const __m512 weight_decay = _mm512_set1_ps(c->weight_decay), grad_scale = _mm512_set1_ps(c->grad_scale);
    for (; i + 32 <= n; i += 32) {
        for (size_t j = i; j < i + 32; j += 16) {
            __m512 gj = _mm512_mul_ps(_mm512_loadu_ps(g + j), grad_scale);
            __m512 mj = _mm512_add_ps(_mm512_mul_ps(beta1, _mm512_loadu_ps(m + j)),
                                      _mm512_mul_ps(one_minus_beta1, gj));
            __m512 vj = _mm512_add_ps(_mm512_mul_ps(beta2, _mm512_loadu_ps(v + j)),
                                      _mm512_mul_ps(_mm512_mul_ps(one_minus_beta2, gj), gj));
            _mm512_storeu_ps(m + j, mj);
            _mm512_storeu_ps(v + j, vj);
            __m512 mhat = _mm512_div_ps(mj, bias1), vhat = _mm512_div_ps(vj, bias2);
            __m512 pj = _mm512_loadu_ps(p + j);
            __m512 step = _mm512_add_ps(_mm512_div_ps(mhat, _mm512_add_ps(_mm512_sqrt_ps(vhat), eps)),
                                        _mm512_mul_ps(weight_decay, pj));
            pj = _mm512_sub_ps(pj, _mm512_mul_ps(lr, step));
            _mm512_storeu_ps(p + j, pj);
            if (out16) store_half16(out16 + j, pj, fmt);
        }
    }
    /* EXERCISE 06.1 END */
    adamw_scalar(p + i, g + i, m + i, v + i, n - i, c, out16 ? out16 + i : NULL, fmt);
}
#endif

/* ---- choosing a path ---- */

static const char *const path_names[CPU_ADAM_PATHS] = {"scalar", "avx2", "avx512"};

const char *cpu_adam_path_name(CpuAdamPath path) {
    return (int)path >= 0 && (int)path < CPU_ADAM_PATHS ? path_names[path] : "unknown";
}

int cpu_adam_path_parse(const char *name, CpuAdamPath *path) {
    for (int k = 0; k < CPU_ADAM_PATHS; k++)
        if (strcmp(name, path_names[k]) == 0) {
            *path = (CpuAdamPath)k;
            return 1;
        }
    return 0;
}

/* __builtin_cpu_supports also asks whether the operating system saves the
 * wide registers (XGETBV), so a "yes" means the instructions can run. */
int cpu_adam_path_supported(CpuAdamPath path) {
    switch (path) {
    case CPU_ADAM_SCALAR:
        return 1;
#ifdef CPU_ADAM_X86
    case CPU_ADAM_AVX2:
        return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c");
    case CPU_ADAM_AVX512:
        return __builtin_cpu_supports("avx512f");
#endif
    default:
        return 0;
    }
}

/* The supported paths, "scalar avx2 ...", for error messages. */
static void supported_list(char *out, size_t size) {
    out[0] = '\0';
    for (int k = 0; k < CPU_ADAM_PATHS; k++)
        if (cpu_adam_path_supported((CpuAdamPath)k))
            snprintf(out + strlen(out), size - strlen(out), "%s%s", out[0] ? " " : "", path_names[k]);
}

CpuAdamPath cpu_adam_path(void) {
    const char *forced = getenv("COURSE_CPU_ADAM");
    char supported[64];
    if (forced && *forced && strcmp(forced, "auto") != 0) {
        CpuAdamPath path;
        if (!cpu_adam_path_parse(forced, &path))
            fatal(EXIT_USAGE, "COURSE_CPU_ADAM=%s: unknown path (expected auto, scalar, avx2 or avx512)",
                  forced);
        if (!cpu_adam_path_supported(path)) {
            supported_list(supported, sizeof supported);
            fatal(EXIT_USAGE, "COURSE_CPU_ADAM=%s: this CPU cannot run it (it supports: %s)", forced,
                  supported);
        }
        return path;
    }
    for (int k = CPU_ADAM_PATHS - 1; k > 0; k--)
        if (cpu_adam_path_supported((CpuAdamPath)k)) return (CpuAdamPath)k;
    return CPU_ADAM_SCALAR;
}

/* ---- the update: OpenMP over chunks, one path inside each ---- */

typedef void (*ChunkUpdate)(float *p, const float *g, float *m, float *v, size_t n, const Coeffs *c,
                            uint16_t *out16, HalfFormat fmt);

void cpu_adamw_on(CpuAdamPath path, float *master, const float *grads, float *m, float *v, size_t n,
                  const CpuAdamArgs *a, uint16_t *out16, HalfFormat fmt) {
    if (!cpu_adam_path_supported(path))
        fatal(EXIT_USAGE, "cpu_adamw: the %s path cannot run on this CPU", cpu_adam_path_name(path));
    ChunkUpdate update = adamw_scalar;
#ifdef CPU_ADAM_X86
    if (path == CPU_ADAM_AVX2) update = adamw_avx2;
    if (path == CPU_ADAM_AVX512) update = adamw_avx512;
#endif
    Coeffs c = coeffs_of(a);
    size_t chunks = (n + CPU_ADAM_CHUNK - 1) / CPU_ADAM_CHUNK;
    /* Static schedule: each thread gets one contiguous run of chunks, the
     * same run every step, so its pages stay near its core. */
#pragma omp parallel for schedule(static) if (chunks > 1)
    for (size_t k = 0; k < chunks; k++) {
        size_t first = k * CPU_ADAM_CHUNK, count = n - first < CPU_ADAM_CHUNK ? n - first : CPU_ADAM_CHUNK;
        update(master + first, grads + first, m + first, v + first, count, &c, out16 ? out16 + first : NULL,
               fmt);
    }
}

void cpu_adamw(float *master, const float *grads, float *m, float *v, size_t n, const CpuAdamArgs *a,
               uint16_t *out16, HalfFormat fmt) {
    cpu_adamw_on(cpu_adam_path(), master, grads, m, v, n, a, out16, fmt);
}
