/* cpu_adam_ref.c: see cpu_adam_ref.h (the scalar placeholder). */
#include "cpu_adam_ref.h"

#include <math.h>

void cpu_adamw(float *master, const float *grads, float *m, float *v, size_t n, const CpuAdamArgs *a,
               uint16_t *out16, HalfFormat fmt) {
    float bias1 = 1.0f - powf(a->beta1, (float)a->t);
    float bias2 = 1.0f - powf(a->beta2, (float)a->t);
#pragma omp parallel for
    for (size_t i = 0; i < n; i++) {
        float g = grads[i] * a->grad_scale;
        float mi = a->beta1 * m[i] + (1.0f - a->beta1) * g;
        float vi = a->beta2 * v[i] + (1.0f - a->beta2) * g * g;
        m[i] = mi;
        v[i] = vi;
        float mhat = mi / bias1, vhat = vi / bias2;
        master[i] -= a->lr * (mhat / (sqrtf(vhat) + a->eps) + a->weight_decay * master[i]);
        if (out16) out16[i] = half_from_float(master[i], fmt);
    }
}
