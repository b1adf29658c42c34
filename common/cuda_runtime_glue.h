/* cuda_runtime_glue.h: the few CUDA runtime services device.c needs, behind a
 * plain C interface so that the C sources never include CUDA headers.
 * Implemented in device_cuda.cu; only compiled and linked when USE_CUDA. */
#ifndef CUDA_RUNTIME_GLUE_H
#define CUDA_RUNTIME_GLUE_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Number of visible GPUs; 0 when none (or the driver is missing). Never fails. */
int cuda_device_count(void);
/* Make `device` current, create the cuBLAS handle; writes the GPU's name. */
void cuda_select_device(int device, char *name, size_t name_len);
/* cudaProfilerStart (on = 1) or cudaProfilerStop (0), after a synchronize. */
void cuda_profiler(int on);
/* Destroy the cuBLAS handle (and its workspace), at the end of a run. */
void cuda_shutdown(void);
/* Make `device` current for the calling thread (no cuBLAS handle). */
void cuda_bind_thread(int device);
/* cudaMalloc + zero fill; NULL when the GPU is out of memory. */
void *cuda_alloc_zeroed(size_t bytes);
void cuda_release(void *ptr);
void cuda_copy_h2d(void *dst, const void *src, size_t bytes);
void cuda_copy_d2h(void *dst, const void *src, size_t bytes);
void cuda_copy_d2d(void *dst, const void *src, size_t bytes);
void cuda_synchronize(void);
/* events[0], events[1]: created on first use. */
void cuda_timer_start(void **events);
double cuda_timer_stop_ms(void **events);

#ifdef __cplusplus
}
#endif
#endif
