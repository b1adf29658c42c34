/* cpu_adam_ref.h: AdamW on the host, for ZeRO-Offload (chapter 06).
 *
 * A placeholder with the interface of the SIMD CPU AdamW (cpu_adam.h, written
 * alongside): one scalar loop, the kernel table's adamw_update formula
 * (kernels.h) element by element. The fast one replaces this file and
 * cpu_adam_ref.c; call sites use only cpu_adamw. */
#ifndef CPU_ADAM_H
#define CPU_ADAM_H

#include "half.h" /* HalfFormat */

#include <stddef.h>
#include <stdint.h>

typedef struct {
    float lr, beta1, beta2, eps, weight_decay, grad_scale;
    int t; /* 1-based update number */
} CpuAdamArgs;

/* AdamW over master[0..n) (fp32) from fp32 grads, moments m, v; when out16 !=
 * NULL also writes the 16-bit rounding (format fmt) of the updated master
 * weights into out16[0..n) in the same pass. The same results as the kernel
 * table's adamw_update / adamw_update_half. */
void cpu_adamw(float *master, const float *grads, float *m, float *v, size_t n, const CpuAdamArgs *a,
               uint16_t *out16, HalfFormat fmt);

#endif
