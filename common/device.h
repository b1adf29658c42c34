/* device.h: where tensors live, and what they cost.
 *
 * Every buffer of the course is allocated here and tagged with
 *   a space    : DEVICE (the GPU; on the CPU backend, host memory standing in
 *                for it) or HOST (ordinary host memory, e.g. offloaded state),
 *   a category : what the bytes are for (params, grads, ...).
 * The layer keeps current and peak bytes per (space, category): this is what
 * memory.csv reports, and how a learner sees where training memory goes.
 * A device budget (--device-mem-limit) makes allocation fail cleanly past it,
 * on the CPU backend too, so "does it fit on a 16 GB GPU?" can be asked on a
 * laptop.
 *
 * The backend (CPU or CUDA) is chosen once at start by device_init(); all
 * DEVICE pointers belong to that backend, and kernels.h's operations take them. */
#ifndef DEVICE_H
#define DEVICE_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { BACKEND_CPU = 0, BACKEND_CUDA = 1 } Backend;

typedef enum { SPACE_DEVICE = 0, SPACE_HOST = 1, SPACE_COUNT } Space;

typedef enum {
    CAT_PARAMS = 0,  /* model weights */
    CAT_GRADS,       /* gradients of the weights */
    CAT_OPTIMIZER,   /* optimizer state (Adam m and v, master weights) */
    CAT_ACTIVATIONS, /* forward values saved for the backward pass */
    CAT_COMM,        /* communication buffers */
    CAT_WORKSPACE,   /* scratch: activation gradients, staging, kernel workspaces */
    CAT_COUNT
} Category;

const char *space_name(Space s);
const char *category_name(Category c);

/* Choose the backend: "auto" (cuda if a GPU is visible and the build has CUDA,
 * else cpu), "cpu" or "cuda". Unusable choices end the program with EXIT_USAGE.
 * local_rank picks the GPU (local_rank % device count) when several are visible. */
Backend device_init(const char *choice, int local_rank);
Backend device_backend(void);
/* At the end of a run, after the program freed its own buffers: free the
 * backend's on-demand workspaces and the cuBLAS handle, so that a leak check
 * (compute-sanitizer --leak-check full) finds nothing left. */
void device_shutdown(void);
/* Make the chosen GPU current for the calling thread too (CUDA keeps the
 * current device per host thread); a thread that touches device buffers
 * calls this first. No-op on the CPU. */
void device_bind_thread(void);
const char *device_name(void);   /* "cpu" or e.g. "cuda:NVIDIA H100 80GB HBM3" */
int device_cuda_available(void); /* built with CUDA and a GPU is visible */

/* Budget for SPACE_DEVICE in bytes; 0 means unlimited. */
void device_set_limit(size_t bytes);

/* Tagged allocation. `what` names the buffer in error messages. Memory is
 * zero-filled. Failure (budget or the allocator itself) ends the program with
 * EXIT_USAGE and a message naming the tag, the request and the budget. */
void *mem_alloc(Space space, Category cat, size_t bytes, const char *what);
void mem_free(void *ptr); /* NULL is fine */

size_t mem_current_bytes(Space space, Category cat);
size_t mem_peak_bytes(Space space, Category cat);
size_t mem_peak_total(Space space); /* peak of the sum over categories */

/* Copies between host memory and DEVICE buffers, and within the device.
 * Source and destination must not overlap. */
void copy_to_device(void *dst_device, const void *src_host, size_t bytes);
void copy_to_host(void *dst_host, const void *src_device, size_t bytes);
void copy_on_device(void *dst_device, const void *src_device, size_t bytes);

/* Wait for all queued device work (no-op on the CPU). */
void device_sync(void);

/* Timers: CUDA events on the GPU, the monotonic clock on the CPU.
 * Start from a zeroed Timer (Timer t = {0}); every stop must follow a start
 * (a stop ends the timer and releases its CUDA events; start it again to reuse it). */
typedef struct {
    double start_ms; /* CPU */
    void *events[2]; /* CUDA: cudaEvent_t start, stop */
} Timer;
void timer_start(Timer *t);
double timer_stop_ms(Timer *t); /* waits for the device; returns elapsed ms */

/* Profiling one step: with COURSE_PROFILE_STEP=N in the environment, the
 * CUDA profiler API is switched on for step N (1-based) only, so that
 * `ncu --profile-from-start off` (common/profile_kernels.sh) sees exactly one
 * training step. No-ops otherwise, and on the CPU. */
void profile_step_begin(int step);
void profile_step_end(int step);

/* Parse sizes such as "512", "64K", "1.5G" (binary multiples). Returns 0 on
 * success, -1 when the text is not a size. */
int parse_bytes(const char *text, size_t *out);

#ifdef __cplusplus
}
#endif

#endif
