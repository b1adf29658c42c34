/* half.h: the two 16-bit floating-point formats of mixed precision, bit by bit.
 *
 *              sign  exponent  mantissa   largest finite   smallest normal   epsilon (1 ulp at 1)
 *   fp32  (float)  1      8        23       3.4e38           1.2e-38           2^-23 = 1.2e-7
 *   bf16           1      8         7       3.4e38           1.2e-38           2^-7  = 7.8e-3
 *   fp16 (half)    1      5        10       65504            6.1e-5            2^-10 = 9.8e-4
 *
 * bf16 is the top half of a float: the same exponent, so the same range, and
 * 16 fewer mantissa bits. fp16 keeps more mantissa but only 5 exponent bits:
 * values above 65504 overflow to Inf, values below 2^-14 become subnormal
 * (down to 2^-24) and then zero. That is why fp16 training scales the loss
 * (optim.h: LossScaler) and bf16 does not need to.
 *
 * A 16-bit value is held as its bits in a uint16_t. Rounding from float is to
 * nearest, ties to even (the IEEE default), with these rules at the edges:
 *   - beyond the largest finite value (after rounding): +-Inf;
 *   - Inf stays Inf, NaN stays NaN (quiet, sign kept);
 *   - subnormal results are rounded like any other (no flush to zero).
 * Converting back to float is exact: every 16-bit value is a float.
 *
 * The functions are written once, here, with integer operations only, and
 * both backends call them (kernels_cpu.c on the host, kernels_cuda.cu inside
 * its kernels): the conversions are identical on the CPU and the GPU by
 * construction, and tests/test_kernels.c checks them against an independent
 * computation in double. */
#ifndef HALF_H
#define HALF_H

#include <stdint.h>
#include <string.h>

#ifdef __CUDACC__
#define HALF_FN static inline __host__ __device__
#else
#define HALF_FN static inline
#endif

typedef enum { HALF_BF16 = 0, HALF_F16 = 1 } HalfFormat;

HALF_FN uint32_t half_float_bits(float x) {
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return u;
}

HALF_FN float half_bits_float(uint32_t u) {
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}

/* float -> bf16: drop the low 16 bits, rounding to nearest even. Adding
 * 0x7fff (+1 when the kept part is odd) carries into the kept bits exactly
 * when the dropped part is more than half, or half and the kept part odd; a
 * carry out of the largest finite value gives Inf, as it should. */
HALF_FN uint16_t bf16_from_float(float x) {
    uint32_t u = half_float_bits(x);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x0040u); /* NaN: keep it quiet */
    uint32_t rounding = 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)((u + rounding) >> 16);
}

HALF_FN float bf16_to_float(uint16_t h) {
    return half_bits_float((uint32_t)h << 16);
}

/* float -> fp16, rounding to nearest even. */
HALF_FN uint16_t f16_from_float(float x) {
    uint32_t u = half_float_bits(x);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t a = u & 0x7fffffffu;                            /* |x| */
    if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00u);  /* NaN */
    if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* >= 65520, halfway past 65504: Inf */
    if (a >= 0x38800000u) {                                  /* >= 2^-14: a normal fp16 */
        a -= (127u - 15u) << 23;                             /* re-bias the exponent */
        a += 0x0fffu + ((a >> 13) & 1u);                     /* round away the low 13 bits, ties to even */
        return (uint16_t)(sign | (a >> 13));
    }
    if (a <= 0x33000000u) return sign; /* <= 2^-25, half the smallest subnormal: zero (ties to even) */
    /* A subnormal fp16, h * 2^-24: the float's significand m (with its
     * implicit bit) times 2^(e-150) is h = m >> (126 - e), rounded. */
    uint32_t e = a >> 23, m = (a & 0x7fffffu) | 0x800000u;
    uint32_t shift = 126u - e; /* 14..24 */
    uint32_t h = m >> shift, rest = m & ((1u << shift) - 1u), half = 1u << (shift - 1u);
    if (rest > half || (rest == half && (h & 1u))) h++; /* may carry into the smallest normal: right */
    return (uint16_t)(sign | h);
}

HALF_FN float f16_to_float(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exponent = (h >> 10) & 0x1fu, mantissa = h & 0x3ffu;
    if (exponent == 0x1fu) return half_bits_float(sign | 0x7f800000u | (mantissa << 13)); /* Inf, NaN */
    if (exponent != 0) return half_bits_float(sign | ((exponent + 112u) << 23) | (mantissa << 13));
    if (mantissa == 0) return half_bits_float(sign); /* +-0 */
    /* subnormal mantissa * 2^-24: shift until the leading bit is the implicit one */
    uint32_t shift = 0;
    while (!(mantissa & 0x400u)) {
        mantissa <<= 1;
        shift++;
    }
    return half_bits_float(sign | ((113u - shift) << 23) | ((mantissa & 0x3ffu) << 13));
}

/* Either format. */
HALF_FN uint16_t half_from_float(float x, HalfFormat format) {
    return format == HALF_BF16 ? bf16_from_float(x) : f16_from_float(x);
}
HALF_FN float half_to_float(uint16_t h, HalfFormat format) {
    return format == HALF_BF16 ? bf16_to_float(h) : f16_to_float(h);
}

#endif
