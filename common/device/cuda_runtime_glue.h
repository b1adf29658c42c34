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
/* Make `device` current, create the three streams (non-blocking) and the
 * cuBLAS handle, bound to the compute stream; writes the GPU's name. */
void cuda_select_device(int device, char *name, size_t name_len);
/* The cudaStream_t of StreamKind `kind` (device.h), made by cuda_select_device. */
void *cuda_stream(int kind);
/* cudaProfilerStart (on = 1) or cudaProfilerStop (0), after a synchronize. */
void cuda_profiler(int on);
/* Destroy the cuBLAS handle (and its workspace), at the end of a run. The
 * streams live as long as the process, as the CUDA context does. */
void cuda_shutdown(void);
/* device_set_mixed_precision (device.h): TF32 attention in 16-bit runs. */
void cuda_set_mixed_precision(int mixed);
/* Make `device` current for the calling thread (no cuBLAS handle). */
void cuda_bind_thread(int device);
/* cudaMalloc + zero fill (finished on return); NULL when the GPU is out of memory. */
void *cuda_alloc_zeroed(size_t bytes);
void cuda_release(void *ptr);
/* cudaHostAlloc (pinned host memory) + zero fill; NULL when it fails. */
void *cuda_host_alloc_zeroed(size_t bytes);
void cuda_host_release(void *ptr);
/* On the compute stream: h2d and d2h return when the copy is done, d2d is queued. */
void cuda_copy_h2d(void *dst, const void *src, size_t bytes);
void cuda_copy_d2h(void *dst, const void *src, size_t bytes);
void cuda_copy_d2d(void *dst, const void *src, size_t bytes);
void cuda_copy_d2d_2d(void *dst, size_t dst_pitch, const void *src, size_t src_pitch, size_t width,
                      size_t rows);
/* Queued on `stream` (a cudaStream_t); return at once. */
void cuda_copy_h2d_async(void *dst, const void *src, size_t bytes, void *stream);
void cuda_copy_d2h_async(void *dst, const void *src, size_t bytes, void *stream);
/* Events without timing (the cheap kind), and the waits between streams. */
void *cuda_event_create(void);
void cuda_event_destroy(void *event);
void cuda_event_record(void *event, void *stream);
void cuda_stream_wait_event(void *stream, void *event);
void cuda_event_synchronize(void *event);
void cuda_stream_synchronize(void *stream);
/* Every stream of the device. */
void cuda_synchronize(void);
/* events[0], events[1]: created on first use, recorded on the compute stream. */
void cuda_timer_start(void **events);
double cuda_timer_stop_ms(void **events);

#ifdef __cplusplus
}
#endif
#endif
