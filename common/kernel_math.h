/* kernel_math.h: per-element formulas that both backends share, written once.
 *
 * kernels_cpu.c calls these in its loops and kernels_cuda.cu inside its
 * kernels, so the two compute them identically. (The fp32 AdamW of each
 * backend is written out in place instead: it is exercise 01.2.) */
#ifndef KERNEL_MATH_H
#define KERNEL_MATH_H

#include "half.h"

#include <math.h>
#include <stddef.h>

/* One element of kernels.h's AdamW on an fp32 master weight from a 16-bit
 * gradient; returns the new weight rounded to `format`. bias1 = 1 - beta1^t,
 * bias2 = 1 - beta2^t. */
HALF_FN uint16_t adamw_half_element(float *master, uint16_t grad, float *m, float *v, float lr, float beta1,
                                    float beta2, float bias1, float bias2, float eps, float weight_decay,
                                    float grad_scale, HalfFormat format) {
    float g = half_to_float(grad, format) * grad_scale;
    float mi = beta1 * *m + (1.0f - beta1) * g;
    float vi = beta2 * *v + (1.0f - beta2) * g * g;
    *m = mi;
    *v = vi;
    float mhat = mi / bias1, vhat = vi / bias2;
    *master -= lr * (mhat / (sqrtf(vhat) + eps) + weight_decay * *master);
    return half_from_float(*master, format);
}

/* Element i of a sum of squares: of x when given, else of the 16-bit h. */
HALF_FN double square_at(const float *x, const uint16_t *h, size_t i, HalfFormat format) {
    double xi = x ? (double)x[i] : (double)half_to_float(h[i], format);
    return xi * xi;
}

#endif
