/* cpu_adam.h: the host-side AdamW of ZeRO-Offload, fast enough that the CPU is
 * not what a step waits for.
 *
 * Offload keeps the fp32 master weights, Adam's moments m and v and the fp32
 * gradients in host memory; every step the CPU updates all of them. Each
 * parameter costs 16 bytes read (master, grad, m, v) and 12 written (master,
 * m, v), plus 2 written when the 16-bit copy for the device is produced in
 * the same pass: 28 or 30 bytes per parameter, a few arithmetic operations
 * each. A good update is therefore bounded by the memory bandwidth of the
 * host, not by its arithmetic, provided the arithmetic is done 8 or 16 lanes
 * at a time and on every core. That takes three things, all here:
 *   - SIMD: an AVX-512 path (16 floats per instruction) and an AVX2 path (8),
 *     chosen at run time from what the CPU reports, and a portable scalar
 *     path for everything else;
 *   - unrolling (two vectors per iteration), so the divider and the square
 *     root unit, which take many cycles per instruction, always have work;
 *   - OpenMP over fixed chunks of CPU_ADAM_CHUNK parameters.
 * The 16-bit rounding of the updated weights is fused into the same pass:
 * a separate cast would read the master weights a second time.
 *
 * Same bits as the kernel table. Every path computes exactly the kernel
 * table's adamw_update (kernels.h), operation for operation in the same
 * order with IEEE single precision: divisions stay divisions (no
 * reciprocal estimates) and no multiply and add are fused into one FMA
 * (the file is compiled with -ffp-contract=off: an FMA rounds once where
 * the reference rounds twice). The 16-bit write-back rounds as half.h does
 * (to nearest even, NaN quiet, Inf past the range), so it equals the kernel
 * table's adamw_update_half given the same gradients. tests/chapters/cpu_adam.bats
 * checks every path this CPU supports, bit for bit. (This holds with the
 * Makefile's flags, which give the kernel table no FMA either; built with
 * OPT=-march=native, gcc may fuse the kernel table's own loop, and the two
 * then differ in the last bit.)
 *
 * Choosing a path: cpu_adamw uses the widest path the CPU supports, or the
 * one named by the environment variable COURSE_CPU_ADAM (auto, scalar, avx2,
 * avx512), which the tests and 06_offload/adambench use to run each path;
 * naming a path this CPU cannot run ends the program with EXIT_USAGE. */
#ifndef CPU_ADAM_H
#define CPU_ADAM_H

#include "common/core/half.h" /* bf16 and fp16 conversions */

#include <stddef.h>
#include <stdint.h>

typedef struct {
    float lr, beta1, beta2, eps, weight_decay, grad_scale;
    int t; /* 1-based update number */
} CpuAdamArgs;

/* AdamW over master[0..n) (fp32) from fp32 grads, moments m, v; when out16 != NULL also writes the
 * 16-bit rounding (format fmt) of the updated master weights into out16[0..n) in the same pass.
 * The pointers need no particular alignment; the arrays must not overlap. The work is split
 * into chunks of CPU_ADAM_CHUNK parameters over the OpenMP threads, so a call on fewer
 * parameters than that runs on one thread (update large ranges, e.g. whole buckets, at a time);
 * called inside a parallel region it runs on the calling thread (no nested parallelism). */
void cpu_adamw(float *master, const float *grads, float *m, float *v, size_t n, const CpuAdamArgs *a,
               uint16_t *out16, HalfFormat fmt);

/* ---- the paths, for tests and benchmarks ---- */
typedef enum { CPU_ADAM_SCALAR = 0, CPU_ADAM_AVX2 = 1, CPU_ADAM_AVX512 = 2, CPU_ADAM_PATHS = 3 } CpuAdamPath;

/* Parameters per OpenMP work item: 8192 x 4 bytes x 4 arrays = 128 KiB. */
#define CPU_ADAM_CHUNK 8192

/* cpu_adamw on the given path (which the CPU must support). */
void cpu_adamw_on(CpuAdamPath path, float *master, const float *grads, float *m, float *v, size_t n,
                  const CpuAdamArgs *a, uint16_t *out16, HalfFormat fmt);
/* The path cpu_adamw uses: COURSE_CPU_ADAM when set, else the widest supported. */
CpuAdamPath cpu_adam_path(void);
/* 1 if this CPU (and its operating system) can run the path. */
int cpu_adam_path_supported(CpuAdamPath path);
const char *cpu_adam_path_name(CpuAdamPath path); /* "scalar", "avx2", "avx512" */
/* The path called `name`; returns 0 for an unknown name. */
int cpu_adam_path_parse(const char *name, CpuAdamPath *path);

#endif
