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
 * Host memory comes in two kinds, both counted under `host`: ordinary
 * (mem_alloc) and pinned (mem_alloc_pinned: page-locked, so that the GPU's
 * copy engines can read and write it while kernels run).
 *
 * The backend (CPU or CUDA) is chosen once at start by device_init(); all
 * DEVICE pointers belong to that backend, and kernels.h's operations take them.
 * On a GPU, work goes onto three streams ordered by events (below). */
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
    CAT_GATHERED,    /* ZeRO-3: units' parameters all-gathered for a forward or backward */
    CAT_BUCKETS,     /* ZeRO-2/3: a unit's gradients between its backward and their reduce-scatter */
    CAT_COUNT
} Category;

const char *space_name(Space s);
const char *category_name(Category c);

/* Choose the backend: "auto" (cuda if a GPU is visible and the build has CUDA,
 * else cpu), "cpu" or "cuda". Unusable choices end the program with EXIT_USAGE.
 * local_rank picks the GPU (local_rank % device count) when several are visible. */
Backend device_init(const char *choice, int local_rank);
Backend device_backend(void);
/* Where the CPU kernels keep their workspaces: the CPU backend's "device" is
 * host memory, counted as the device's; when those kernels run beside the
 * CUDA backend (the parity tests), device memory is the GPU's, which the CPU
 * cannot touch, so they get host memory then. */
Space cpu_kernel_space(void);
/* At the end of a run, after the program freed its own buffers: free the
 * backend's on-demand workspaces and the cuBLAS handle, so that a leak check
 * (compute-sanitizer --leak-check full) finds nothing left. */
void device_shutdown(void);
/* Register a function device_shutdown calls first, to free memory that a
 * layer above grew on demand (the kernels' workspaces: kernels.c registers
 * theirs on first use). The device layer knows nothing of the kernels; this
 * is how it frees what they hold. Registering twice is harmless. */
void device_on_shutdown(void (*release)(void));
/* Make the chosen GPU current for the calling thread too (CUDA keeps the
 * current device per host thread); a thread that touches device buffers
 * calls this first. No-op on the CPU. */
void device_bind_thread(void);
/* The run keeps 16-bit matmul inputs (--precision bf16/fp16; the harness says
 * so after device_init). On CUDA the fused attention then multiplies with one
 * TF32 product (10 mantissa bits, more than bf16's 7 that its inputs already
 * carry) instead of strict fp32's three, as PyTorch's autocast runs attention
 * in 16 bits; COURSE_TF32=0 keeps it strict. No-op on the CPU, whose kernels
 * compute in fp32 either way. */
void device_set_mixed_precision(int mixed);
const char *device_name(void);   /* "cpu" or e.g. "cuda:NVIDIA H100 80GB HBM3" */
int device_cuda_available(void); /* built with CUDA and a GPU is visible */

/* The dry run (--dry-run, harness.h): switched on before device_init, it
 * makes the CPU backend a device that records and computes nothing.
 * mem_alloc and mem_alloc_pinned count every buffer exactly as before (tag,
 * bytes, peak; --device-mem-limit still refuses) but reserve address space
 * only (mmap with MAP_NORESERVE, never written: it reads as zeros and costs
 * no memory until touched, so a model of any size is "allocated" on a
 * laptop); copies do nothing (a copy into host memory the program did not
 * allocate here fills it with zeros, the value every dry buffer holds, so
 * what the host reads back is always the same); kernels.h's ops() is a
 * table of no-ops that grow the CPU backend's workspaces as it would
 * (kernels_dry.c); timers read 0. Code that writes big host buffers itself
 * (initial weights, chapter 06's CPU AdamW) asks device_dry() and skips. */
void device_set_dry(int dry);
int device_dry(void);
/* A host buffer of `bytes` zeros that is no tensor of the run (not in
 * memory.csv): the initial values a program builds before it uploads them.
 * In a dry run, address space only (it reads as zeros; its writers skip), so
 * a model of any size is planned on a laptop. Freed with host_scratch_free. */
void *host_scratch(size_t bytes);
void host_scratch_free(void *ptr, size_t bytes);

/* Budget for SPACE_DEVICE in bytes; 0 means unlimited. */
void device_set_limit(size_t bytes);

/* Tagged allocation. `what` names the buffer in error messages. Memory is
 * zero-filled. Failure (budget or the allocator itself) ends the program with
 * EXIT_USAGE and a message naming the tag, the request and the budget. */
void *mem_alloc(Space space, Category cat, size_t bytes, const char *what);
/* Pinned (page-locked) host memory, counted under SPACE_HOST like any host
 * buffer: cudaHostAlloc on the CUDA backend, where it is what lets an
 * asynchronous copy run while kernels run (from pageable memory CUDA copies
 * through a pinned buffer of its own, and the copy waits for the host); a
 * page-aligned allocation on the CPU backend (from 2 MiB up, aligned to and
 * backed by 2 MiB huge pages where the kernel grants them). Pinned pages cannot be swapped
 * out, so pin what moves often (staging, offloaded state), not everything.
 * Zero-filled; fails like mem_alloc. Free it with mem_free. */
void *mem_alloc_pinned(Category cat, size_t bytes, const char *what);
void mem_free(void *ptr); /* NULL is fine */

size_t mem_current_bytes(Space space, Category cat);
size_t mem_peak_bytes(Space space, Category cat);
size_t mem_peak_total(Space space); /* peak of the sum over categories */

/* ---- Streams and events: the order of device work ----
 *
 * A GPU runs work from queues called streams: work on one stream runs in the
 * order it was queued, work on different streams may run at the same time.
 * The CUDA backend has three, all non-blocking (they never wait for CUDA's
 * legacy default stream, which nothing in the course uses):
 *   STREAM_COMPUTE : every kernel of kernels.h and every cuBLAS call, the
 *                    synchronous copies below, and the timers;
 *   STREAM_COMM    : NCCL's collectives and the staging copies of comm.c;
 *   STREAM_COPY    : asynchronous host<->device copies (copy_*_async), such as
 *                    the offloading of chapter 06.
 * Work on different streams is ordered only by events. An event marks a point
 * in one stream ("everything queued here so far"); another stream can be made
 * to wait for it without the host waiting, or the host can wait for it. Data
 * parallelism sends a gradient bucket exactly when it is final, and not when
 * every kernel queued so far is done:
 *
 *   compute: [backward of layers 11, 10] rec(b0) [backward of layers 9, 8] rec(b1) ...
 *   comm   :                       wait(b0) [all-reduce bucket 0]  wait(b1) [...]
 *
 * Everything on one stream was the old rule; it was correct because nothing
 * ran at the same time as anything else, which is also why nothing overlapped.
 * On the CPU backend a kernel, a copy or a collective is finished when its
 * call returns, so every order is kept already: the same calls exist and do
 * nothing (device_stream() returns a placeholder), and the chapters need no
 * #ifdef. device_sync() still means "everything on every stream is done". */
typedef enum { STREAM_COMPUTE = 0, STREAM_COMM, STREAM_COPY, STREAM_COUNT } StreamKind;
typedef struct DeviceStream DeviceStream;
typedef struct DeviceEvent DeviceEvent;

DeviceStream *device_stream(StreamKind kind);
/* cudaStream_t on the CUDA backend, for libraries that take one (NCCL);
 * NULL on the CPU. */
void *device_stream_handle(DeviceStream *stream);
/* Events are made after device_init() and used by one thread at a time. */
DeviceEvent *device_event_create(void);
void device_event_destroy(DeviceEvent *event); /* NULL is fine */
/* Mark the point reached by the work queued on `stream` so far (a later
 * record moves the mark). */
void device_event_record(DeviceEvent *event, DeviceStream *stream);
/* Work queued on `stream` from now on starts after the event's point; the
 * host does not wait. An event never recorded is already reached. */
void device_stream_wait(DeviceStream *stream, DeviceEvent *event);
/* The host waits until the event's point is reached / the stream is empty. */
void device_event_sync(DeviceEvent *event);
void device_stream_sync(DeviceStream *stream);

/* Copies between host memory and DEVICE buffers, and within the device.
 * Source and destination must not overlap. copy_to_device and copy_to_host
 * run after the work queued on the compute stream and return when the bytes
 * have arrived; copy_on_device is queued on the compute stream like a kernel. */
void copy_to_device(void *dst_device, const void *src_host, size_t bytes);
void copy_to_host(void *dst_host, const void *src_device, size_t bytes);
void copy_on_device(void *dst_device, const void *src_device, size_t bytes);
/* `rows` rows of width_bytes each, row i from src + i x src_pitch to dst + i x
 * dst_pitch (pitches in bytes, at least width_bytes): a strided block, queued
 * like copy_on_device (cudaMemcpy2DAsync on a GPU, a loop of memcpy on the
 * CPU). Ulysses' permutations between token rows and head blocks use it. */
void copy_on_device_2d(void *dst_device, size_t dst_pitch, const void *src_device, size_t src_pitch,
                       size_t width_bytes, size_t rows);

/* Asynchronous copies: queued on `stream` (normally STREAM_COPY) and returned
 * from at once on a GPU; the bytes have arrived once the stream has passed
 * the copy: record an event after it and wait for that (or sync the stream)
 * before the destination is read or the source overwritten. The copy does
 * not wait for the compute stream: when a kernel produces the source (or
 * still reads the destination), record an event on the compute stream and
 * make `stream` wait for it first. Host memory should be pinned
 * (mem_alloc_pinned) for the copy to overlap kernels. On the CPU: memcpy. */
void copy_to_device_async(void *dst_device, const void *src_host, size_t bytes, DeviceStream *stream);
void copy_to_host_async(void *dst_host, const void *src_device, size_t bytes, DeviceStream *stream);

/* Wait for all queued device work, on every stream (no-op on the CPU). */
void device_sync(void);

/* Timers: CUDA events on the compute stream on the GPU (they time the work
 * queued on it in between, and whatever the host waited for before queuing
 * the stop, such as a collective), the monotonic clock on the CPU.
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
 * `ncu --profile-from-start off` (common/scripts/profile_kernels.sh) sees exactly one
 * training step. No-ops otherwise, and on the CPU. */
void profile_step_begin(int step);
void profile_step_end(int step);

#ifdef __cplusplus
}
#endif

#endif
