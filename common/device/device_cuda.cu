/* device_cuda.cu: the CUDA runtime services behind device.c (see cuda_runtime_glue.h).
 *
 * device.c keeps the bookkeeping (tags, budgets, peaks) in plain C; this file
 * is the thin layer that actually talks to the GPU: pick the device, create
 * the streams and the cuBLAS handle, allocate, copy, order, synchronise and
 * time. Every call is checked and a failure ends the program naming the file
 * and line. */
#include "common/device/cuda_common.cuh" /* cuda_check, blocks_for, the streams */

#include "common/device/cuda_runtime_glue.h" /* the CUDA runtime behind C calls */
#include "common/device/device.h" /* mem_alloc, copies, streams, timers */

#include <cuda_profiler_api.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

cublasHandle_t cublas_handle = NULL;
cudaStream_t compute_stream = NULL;
/* STREAM_COMPUTE, STREAM_COMM, STREAM_COPY (device.h); [0] is compute_stream. */
static cudaStream_t streams[STREAM_COUNT];
static bool tf32_enabled = false;
static bool tf32_refused = false; /* COURSE_TF32=0: strict fp32 everywhere */
static bool mixed_precision = false;

bool cuda_tf32_enabled(void) {
    return tf32_enabled;
}
bool cuda_attention_tf32(void) {
    return tf32_enabled || (mixed_precision && !tf32_refused);
}
extern "C" void cuda_set_mixed_precision(int mixed) {
    mixed_precision = mixed != 0;
}

extern "C" int cuda_device_count(void) {
    int count = 0;
    /* No driver, no device, or a broken install all mean "no GPU" here: the
     * caller then falls back to (or asks for) the CPU backend. */
    if (cudaGetDeviceCount(&count) != cudaSuccess) {
        (void)cudaGetLastError(); /* clear the sticky error so later calls start clean */
        return 0;
    }
    return count;
}

extern "C" void cuda_select_device(int device, char *name, size_t name_len) {
    cuda_check(cudaSetDevice(device));
    cudaDeviceProp prop;
    cuda_check(cudaGetDeviceProperties(&prop, device));
    snprintf(name, name_len, "%s", prop.name);

    /* Non-blocking: none of them waits for the legacy default stream (or it
     * for them). Communication gets the highest priority, so that when the
     * GPU is full of backward kernels, the blocks of a collective that the
     * other ranks are waiting for are scheduled first. */
    if (!streams[STREAM_COMPUTE]) {
        int least = 0, greatest = 0;
        cuda_check(cudaDeviceGetStreamPriorityRange(&least, &greatest));
        cuda_check(cudaStreamCreateWithPriority(&streams[STREAM_COMPUTE], cudaStreamNonBlocking, least));
        cuda_check(cudaStreamCreateWithPriority(&streams[STREAM_COMM], cudaStreamNonBlocking, greatest));
        cuda_check(cudaStreamCreateWithPriority(&streams[STREAM_COPY], cudaStreamNonBlocking, least));
        compute_stream = streams[STREAM_COMPUTE];
    }
    if (!cublas_handle) cublas_check(cublasCreate(&cublas_handle));
    cublas_check(cublasSetStream(cublas_handle, compute_stream));
    /* Strict fp32 by default, so the CUDA backend matches the CPU one to
     * ~1e-6 and the parity tests mean something. TF32 tensor cores (10-bit
     * mantissa inputs) are several times faster on Ampere and later; opt in
     * with COURSE_TF32=1 when speed matters more than parity. */
    const char *tf32 = getenv("COURSE_TF32");
    tf32_enabled = tf32 && strcmp(tf32, "1") == 0;
    tf32_refused = tf32 && strcmp(tf32, "0") == 0;
    cublas_check(
        cublasSetMathMode(cublas_handle, tf32_enabled ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH));
}

extern "C" void *cuda_stream(int kind) {
    return (void *)streams[kind];
}

extern "C" void cuda_profiler(int on) {
    cuda_check(cudaDeviceSynchronize());
    cuda_check(on ? cudaProfilerStart() : cudaProfilerStop());
}

extern "C" void cuda_shutdown(void) {
    if (cublas_handle) cublas_check(cublasDestroy(cublas_handle));
    cublas_handle = NULL;
}

extern "C" void cuda_bind_thread(int device) {
    cuda_check(cudaSetDevice(device));
}

extern "C" void *cuda_alloc_zeroed(size_t bytes) {
    void *ptr = NULL;
    cudaError_t err = cudaMalloc(&ptr, bytes);
    if (err == cudaErrorMemoryAllocation) {
        /* Out of memory is the caller's to report (device.c names the tensor). */
        (void)cudaGetLastError();
        return NULL;
    }
    cuda_check(err);
    /* Zeroed before any stream can use it: the buffer may first be touched by
     * the communication or copy stream, which do not follow the compute one. */
    cuda_check(cudaMemsetAsync(ptr, 0, bytes, compute_stream));
    cuda_check(cudaStreamSynchronize(compute_stream));
    return ptr;
}

extern "C" void cuda_release(void *ptr) {
    cuda_check(cudaFree(ptr)); /* waits for the device first */
}

extern "C" void *cuda_host_alloc_zeroed(size_t bytes) {
    void *ptr = NULL;
    cudaError_t err = cudaHostAlloc(&ptr, bytes, cudaHostAllocDefault);
    if (err == cudaErrorMemoryAllocation) {
        (void)cudaGetLastError(); /* the caller reports it, naming the buffer */
        return NULL;
    }
    cuda_check(err);
    memset(ptr, 0, bytes);
    return ptr;
}

extern "C" void cuda_host_release(void *ptr) {
    cuda_check(cudaFreeHost(ptr));
}

/* The synchronous copies: in the compute stream's order, then waited for, so
 * that the caller may read (or reuse) the host buffer on return. */
extern "C" void cuda_copy_h2d(void *dst, const void *src, size_t bytes) {
    cuda_check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, compute_stream));
    cuda_check(cudaStreamSynchronize(compute_stream));
}

extern "C" void cuda_copy_d2h(void *dst, const void *src, size_t bytes) {
    cuda_check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, compute_stream));
    cuda_check(cudaStreamSynchronize(compute_stream));
}

extern "C" void cuda_copy_d2d(void *dst, const void *src, size_t bytes) {
    cuda_check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, compute_stream));
}

extern "C" void cuda_copy_d2d_2d(void *dst, size_t dst_pitch, const void *src, size_t src_pitch, size_t width,
                                 size_t rows) {
    cuda_check(cudaMemcpy2DAsync(dst, dst_pitch, src, src_pitch, width, rows, cudaMemcpyDeviceToDevice,
                                 compute_stream));
}

extern "C" void cuda_copy_h2d_async(void *dst, const void *src, size_t bytes, void *stream) {
    cuda_check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, (cudaStream_t)stream));
}

extern "C" void cuda_copy_d2h_async(void *dst, const void *src, size_t bytes, void *stream) {
    cuda_check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, (cudaStream_t)stream));
}

extern "C" void *cuda_event_create(void) {
    cudaEvent_t event;
    cuda_check(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
    return (void *)event;
}

extern "C" void cuda_event_destroy(void *event) {
    cuda_check(cudaEventDestroy((cudaEvent_t)event));
}

extern "C" void cuda_event_record(void *event, void *stream) {
    cuda_check(cudaEventRecord((cudaEvent_t)event, (cudaStream_t)stream));
}

extern "C" void cuda_stream_wait_event(void *stream, void *event) {
    cuda_check(cudaStreamWaitEvent((cudaStream_t)stream, (cudaEvent_t)event, 0));
}

extern "C" void cuda_event_synchronize(void *event) {
    cuda_check(cudaEventSynchronize((cudaEvent_t)event));
}

extern "C" void cuda_stream_synchronize(void *stream) {
    cuda_check(cudaStreamSynchronize((cudaStream_t)stream));
}

extern "C" void cuda_synchronize(void) {
    cuda_check(cudaDeviceSynchronize());
}

/* events[0] marks the start and events[1] the stop, both on the compute
 * stream, so the interval covers the work queued on it in between. */
extern "C" void cuda_timer_start(void **events) {
    for (int i = 0; i < 2; i++)
        if (!events[i]) cuda_check(cudaEventCreate((cudaEvent_t *)&events[i]));
    cuda_check(cudaEventRecord((cudaEvent_t)events[0], compute_stream));
}

extern "C" double cuda_timer_stop_ms(void **events) {
    if (!events[0] || !events[1]) fatal(EXIT_RUNTIME, "cuda_timer_stop_ms: the timer was never started");
    cuda_check(cudaEventRecord((cudaEvent_t)events[1], compute_stream));
    cuda_check(cudaEventSynchronize((cudaEvent_t)events[1]));
    float elapsed_ms = 0.0f;
    cuda_check(cudaEventElapsedTime(&elapsed_ms, (cudaEvent_t)events[0], (cudaEvent_t)events[1]));
    /* A stop ends the timer: release the events, so that timers declared
     * inside the training loop do not leak two events per step. */
    for (int i = 0; i < 2; i++) {
        cuda_check(cudaEventDestroy((cudaEvent_t)events[i]));
        events[i] = NULL;
    }
    return elapsed_ms;
}
