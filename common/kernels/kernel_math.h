/* kernel_math.h: per-element formulas that both backends share, written once.
 *
 * kernels_cpu.c calls these in its loops and kernels_cuda.cu inside its
 * kernels, so the two compute them identically. AdamW's element is exercise
 * 01.2: every AdamW of the course (fp32 and 16-bit, CPU and GPU, and the
 * scalar path of chapter 06's host AdamW) calls adamw_element, so the
 * learner's formula is the only one, and a student copy holds no other. */
#ifndef KERNEL_MATH_H
#define KERNEL_MATH_H

#include "common/core/half.h" /* bf16 and fp16 conversions */
#include "common/core/util.h" /* fatal, log_info, exit codes, flag parsing */

#include <math.h>
#include <stddef.h>

#ifdef __CUDA_ARCH__
/* A stubbed exercise in a function the GPU also runs (make exercises):
 * exercise_not_implemented is a host function, so device code prints the
 * same message and stops the kernel instead. */
#define exercise_not_implemented(id, where) (printf("exercise %s not implemented: see %s\n", id, where), __trap())
#define exercise_reached(id) ((void)0) /* a traced copy (exercises.py --trace) traces the host only */
#endif

/* One element of kernels.h's AdamW, in fp32, each operation rounded to
 * float in this order (chapter 06's vector loops repeat the order lane by
 * lane): *param, *m and *v updated from the gradient grad.
 * bias1 = 1 - beta1^t, bias2 = 1 - beta2^t (the caller computes them once). */
HALF_FN void adamw_element(float *param, float grad, float *m, float *v, float lr, float beta1, float beta2,
                           float bias1, float bias2, float eps, float weight_decay, float grad_scale) {
    /* EXERCISE 01.2 BEGIN: the AdamW update (course.md, exercise 01.2) */
    float g = grad * grad_scale;
    float mi = beta1 * *m + (1.0f - beta1) * g;
    float vi = beta2 * *v + (1.0f - beta2) * g * g;
    *m = mi;
    *v = vi;
    float mhat = mi / bias1, vhat = vi / bias2;
    *param -= lr * (mhat / (sqrtf(vhat) + eps) + weight_decay * *param);
    /* EXERCISE 01.2 END */
}

#ifdef __CUDA_ARCH__
#undef exercise_not_implemented
#undef exercise_reached
#endif

/* The same on an fp32 master weight from a 16-bit gradient; returns the new
 * weight rounded to `format`. */
HALF_FN uint16_t adamw_half_element(float *master, uint16_t grad, float *m, float *v, float lr, float beta1,
                                    float beta2, float bias1, float bias2, float eps, float weight_decay,
                                    float grad_scale, HalfFormat format) {
    adamw_element(master, half_to_float(grad, format), m, v, lr, beta1, beta2, bias1, bias2, eps, weight_decay,
                  grad_scale);
    return half_from_float(*master, format);
}

/* Element i of a sum of squares: of x when given, else of the 16-bit h. */
HALF_FN double square_at(const float *x, const uint16_t *h, size_t i, HalfFormat format) {
    double xi = x ? (double)x[i] : (double)half_to_float(h[i], format);
    return xi * xi;
}

#endif
