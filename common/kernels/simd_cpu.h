/* simd_cpu.h: what the CPU kernels (kernels_cpu.c, attention_cpu.c) share to
 * make their elementwise loops vector loops.
 *
 * Two tools. CPU_VECTOR_CLONES compiles a function twice, for the baseline the
 * Makefile targets (x86-64-v2: 4-float SSE vectors) and for x86-64-v3 (8-float
 * AVX2 vectors with fused multiply-add), and lets the loader pick the one the
 * machine runs at start-up. The binaries stay portable, and the loops that are
 * not matrix products (GELU, softmax, layernorm) run twice as wide where the
 * CPU can. OpenBLAS picks its own kernels the same way. A result may then
 * differ in its last bits between the two kinds of CPU (a fused a*b+c rounds
 * once), never on one machine.
 *
 * vexpf: expf written so that a loop of it vectorises (libm's expf is a call
 * that keeps a loop scalar). */
#ifndef SIMD_CPU_H
#define SIMD_CPU_H

#include <math.h>

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__SANITIZE_ADDRESS__)
#define CPU_VECTOR_CLONES __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define CPU_VECTOR_CLONES
#endif

/* Cephes' range reduction x = n ln2 + r and a degree-5 polynomial, 2^n
 * through the exponent bits. Within 2 ulp of expf; inputs below -87 give
 * exp(-87) (about 1.6e-38) rather than a denormal or 0. */
static inline float vexpf(float x) {
    x = x < -87.0f ? -87.0f : x;
    x = x > 88.0f ? 88.0f : x;
    float n = floorf(x * 1.44269504088896341f + 0.5f);
    float r = x - n * 0.693359375f + n * 2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    float y = p * r * r + r + 1.0f;
    union {
        int i;
        float f;
    } two_to_n = {.i = ((int)n + 127) << 23};
    return y * two_to_n.f;
}

static inline float vtanhf(float u) {
    return 1.0f - 2.0f / (vexpf(2.0f * u) + 1.0f);
}

#endif
