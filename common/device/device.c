/* device.c: tagged allocation, copies, streams, events and timers for both
 * backends (see device.h).
 *
 * Each allocation is recorded in a host-side table (pointer -> size, tag and
 * kind), so mem_free can give back exactly what was counted, to the
 * allocator it came from. The table is a simple open list: programs make a
 * few dozen allocations at start and none inside the training loop. A lock
 * guards it: a communication thread may grow its buffers while the main
 * thread grows a kernel's workspace.
 *
 * Streams and events are thin wrappers: on CUDA around cudaStream_t and
 * cudaEvent_t (device_cuda.cu), on the CPU placeholders whose calls do
 * nothing, because every CPU operation is finished when its call returns. */
#include "common/device/device.h" /* mem_alloc, copies, streams, timers */

#include "common/core/util.h" /* fatal, log_info, exit codes, flag parsing */

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define HUGE_PAGE ((size_t)2 << 20)

#ifdef USE_CUDA
#include "common/device/cuda_runtime_glue.h" /* the CUDA runtime behind C calls */
#endif

static Backend active_backend = BACKEND_CPU;
#ifdef USE_CUDA
static int active_gpu = 0; /* this rank's GPU */
#endif
static char active_name[160] = "cpu";
static size_t limit_bytes = 0;
static int dry_run = 0; /* device_set_dry: record allocations, compute and copy nothing */
static size_t current[SPACE_COUNT][CAT_COUNT];
static size_t peak[SPACE_COUNT][CAT_COUNT];
static size_t current_total[SPACE_COUNT];
static size_t peak_total[SPACE_COUNT];

/* Which allocator a buffer came from, so mem_free gives it back to that one. */
typedef enum { FROM_CALLOC, FROM_CUDA_MALLOC, FROM_CUDA_HOST_ALLOC, FROM_ALIGNED, FROM_DRY } Allocator;

typedef struct {
    void *ptr;
    size_t bytes;
    Space space;
    Category cat;
    Allocator from;
} Allocation;
static Allocation *allocations = NULL;
static int allocation_count = 0, allocation_capacity = 0;
static pthread_mutex_t allocation_lock = PTHREAD_MUTEX_INITIALIZER; /* the table and the counters */

/* The three streams; `native` is the cudaStream_t on the CUDA backend. */
struct DeviceStream {
    StreamKind kind;
    void *native;
};
static DeviceStream streams[STREAM_COUNT] = {
    {STREAM_COMPUTE, NULL}, {STREAM_COMM, NULL}, {STREAM_COPY, NULL}};

struct DeviceEvent {
    void *native; /* cudaEvent_t on the CUDA backend; NULL on the CPU */
};

static const char *space_names[SPACE_COUNT] = {"device", "host"};
static const char *category_names[CAT_COUNT] = {"params", "grads",     "optimizer", "activations",
                                                "comm",   "workspace", "gathered",  "buckets"};
const char *space_name(Space s) {
    return space_names[s];
}
const char *category_name(Category c) {
    return category_names[c];
}

int device_cuda_available(void) {
#ifdef USE_CUDA
    return cuda_device_count() > 0;
#else
    return 0;
#endif
}

void device_set_dry(int dry) {
    dry_run = dry;
}

int device_dry(void) {
    return dry_run;
}

Backend device_init(const char *choice, int local_rank) {
    int want_cuda;
    if (strcmp(choice, "auto") == 0)
        want_cuda = device_cuda_available();
    else if (strcmp(choice, "cpu") == 0)
        want_cuda = 0;
    else if (strcmp(choice, "cuda") == 0)
        want_cuda = 1;
    else
        fatal(EXIT_USAGE, "--device: unknown device '%s' (valid: auto, cpu, cuda)", choice);

    if (!want_cuda || dry_run) {
        active_backend = BACKEND_CPU;
        snprintf(active_name, sizeof active_name, dry_run ? "dry:cpu" : "cpu");
        return active_backend;
    }
#ifdef USE_CUDA
    int count = cuda_device_count();
    if (count <= 0)
        fatal(EXIT_USAGE, "--device cuda: no CUDA GPU is visible on this machine (use --device cpu)");
    char gpu[128];
    active_gpu = local_rank % count;
    cuda_select_device(active_gpu, gpu, sizeof gpu);
    active_backend = BACKEND_CUDA;
    for (int k = 0; k < STREAM_COUNT; k++) streams[k].native = cuda_stream(k);
    snprintf(active_name, sizeof active_name, "cuda:%s", gpu);
    return active_backend;
#else
    (void)local_rank;
    fatal(EXIT_USAGE,
          "--device cuda: this build has no CUDA backend (nvcc was not found, or it was built with "
          "CUDA=0); use --device cpu");
#endif
}

Backend device_backend(void) {
    return active_backend;
}

Space cpu_kernel_space(void) {
    return active_backend == BACKEND_CPU ? SPACE_DEVICE : SPACE_HOST;
}

#ifdef USE_CUDA
static int profile_step(void) {
    const char *text = getenv("COURSE_PROFILE_STEP");
    return text ? atoi(text) : 0;
}
#endif

void profile_step_begin(int step) {
#ifdef USE_CUDA
    if (active_backend == BACKEND_CUDA && step == profile_step()) cuda_profiler(1);
#else
    (void)step;
#endif
}

void profile_step_end(int step) {
#ifdef USE_CUDA
    if (active_backend == BACKEND_CUDA && step == profile_step()) cuda_profiler(0);
#else
    (void)step;
#endif
}

/* What device_shutdown runs first: the kernels' workspaces (kernels.c). */
enum { MAX_SHUTDOWN_HOOKS = 4 };
static void (*shutdown_hooks[MAX_SHUTDOWN_HOOKS])(void);

void device_on_shutdown(void (*release)(void)) {
    for (int i = 0; i < MAX_SHUTDOWN_HOOKS; i++) {
        if (shutdown_hooks[i] == release) return;
        if (!shutdown_hooks[i]) {
            shutdown_hooks[i] = release;
            return;
        }
    }
    fatal(EXIT_RUNTIME, "device_on_shutdown: more than %d functions registered", MAX_SHUTDOWN_HOOKS);
}

void device_shutdown(void) {
    for (int i = 0; i < MAX_SHUTDOWN_HOOKS && shutdown_hooks[i]; i++) shutdown_hooks[i]();
#ifdef USE_CUDA
    if (active_backend == BACKEND_CUDA) cuda_shutdown();
#endif
}

void device_bind_thread(void) {
#ifdef USE_CUDA
    if (active_backend == BACKEND_CUDA) cuda_bind_thread(active_gpu);
#endif
}
void device_set_mixed_precision(int mixed) {
#ifdef USE_CUDA
    if (active_backend == BACKEND_CUDA) cuda_set_mixed_precision(mixed);
#else
    (void)mixed;
#endif
}
const char *device_name(void) {
    return active_name;
}

void device_set_limit(size_t bytes) {
    limit_bytes = bytes;
}

static void format_bytes(char *buf, size_t len, size_t bytes) {
    const char *units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    double value = (double)bytes;
    int u = 0;
    while (value >= 1024.0 && u < 4) {
        value /= 1024.0;
        u++;
    }
    snprintf(buf, len, u == 0 ? "%.0f %s" : "%.2f %s", value, units[u]);
}

static void out_of_memory(Space space, Category cat, size_t bytes, const char *what, const char *why) {
    char req[32], used[32], budget[32];
    format_bytes(req, sizeof req, bytes);
    format_bytes(used, sizeof used, current_total[space]);
    format_bytes(budget, sizeof budget, limit_bytes);
    if (space == SPACE_DEVICE && limit_bytes)
        fatal(
            EXIT_USAGE,
            "out of device memory: allocating %s for %s (%s/%s) would exceed the budget: %s already in use, "
            "budget %s (--device-mem-limit)",
            req, what, space_name(space), category_name(cat), used, budget);
    fatal(EXIT_USAGE, "out of %s memory: allocating %s for %s (%s/%s) failed (%s); %s already in use",
          space_name(space), req, what, space_name(space), category_name(cat), why, used);
}

/* Host memory the machine has. Linux hands out address space freely and
 * kills the process later, so a request that cannot fit is refused up front. */
static size_t physical_memory_bytes(void) {
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    return pages > 0 && page > 0 ? (size_t)pages * (size_t)page : (size_t)-1;
}

/* Refuse what cannot fit: the device budget, and host memory the machine lacks. */
static void check_fits(Space space, Category cat, size_t bytes, const char *what) {
    if (space == SPACE_DEVICE && limit_bytes && current_total[space] + bytes > limit_bytes)
        out_of_memory(space, cat, bytes, what, "budget");
    if (dry_run) return; /* address space only: the machine's memory is not the question */
    int on_host = space == SPACE_HOST || active_backend == BACKEND_CPU;
    size_t host_in_use =
        current_total[SPACE_HOST] + (active_backend == BACKEND_CPU ? current_total[SPACE_DEVICE] : 0);
    if (on_host && host_in_use + bytes > physical_memory_bytes())
        out_of_memory(space, cat, bytes, what, "more than this machine's physical memory");
}

/* Enter an allocation in the table and the counters. */
static void counted(void *ptr, size_t bytes, Space space, Category cat, Allocator from) {
    if (allocation_count == allocation_capacity) {
        allocation_capacity = allocation_capacity ? 2 * allocation_capacity : 64;
        Allocation *grown = realloc(allocations, allocation_capacity * sizeof(Allocation));
        if (!grown) fatal(EXIT_RUNTIME, "out of host memory for the allocation table");
        allocations = grown;
    }
    allocations[allocation_count++] = (Allocation){ptr, bytes, space, cat, from};
    current[space][cat] += bytes;
    current_total[space] += bytes;
    if (current[space][cat] > peak[space][cat]) peak[space][cat] = current[space][cat];
    if (current_total[space] > peak_total[space]) peak_total[space] = current_total[space];
}

/* Address space that reads as zeros and is never written, so it costs no
 * memory (device.h, "The dry run"); MAP_FAILED when there is none. */
static void *address_space(size_t bytes) {
    return mmap(NULL, bytes ? bytes : 1, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1,
                0);
}

/* A dry run's buffer. */
static void *dry_alloc(Space space, Category cat, size_t bytes, const char *what) {
    void *ptr = address_space(bytes);
    if (ptr == MAP_FAILED) out_of_memory(space, cat, bytes, what, "mmap of address space for a dry run");
    return ptr;
}

void *host_scratch(size_t bytes) {
    if (!dry_run) return xcalloc(1, bytes ? bytes : 1);
    void *ptr = address_space(bytes);
    if (ptr == MAP_FAILED) fatal(EXIT_RUNTIME, "out of address space for %zu bytes of a dry run's host scratch", bytes);
    return ptr;
}

void host_scratch_free(void *ptr, size_t bytes) {
    if (!ptr) return;
    if (dry_run)
        munmap(ptr, bytes ? bytes : 1);
    else
        free(ptr);
}

void *mem_alloc(Space space, Category cat, size_t bytes, const char *what) {
    pthread_mutex_lock(&allocation_lock);
    check_fits(space, cat, bytes, what);
    void *ptr = NULL;
    Allocator from = FROM_CALLOC;
    if (dry_run) {
        counted(dry_alloc(space, cat, bytes, what), bytes, space, cat, FROM_DRY);
        void *dry = allocations[allocation_count - 1].ptr;
        pthread_mutex_unlock(&allocation_lock);
        return dry;
    }
#ifdef USE_CUDA
    if (space == SPACE_DEVICE && active_backend == BACKEND_CUDA) {
        ptr = cuda_alloc_zeroed(bytes ? bytes : 1);
        if (!ptr) out_of_memory(space, cat, bytes, what, "cudaMalloc");
        from = FROM_CUDA_MALLOC;
    }
#endif
    if (!ptr) {
        ptr = calloc(1, bytes ? bytes : 1);
        if (!ptr) out_of_memory(space, cat, bytes, what, "calloc");
    }
    counted(ptr, bytes, space, cat, from);
    pthread_mutex_unlock(&allocation_lock);
    return ptr;
}

void *mem_alloc_pinned(Category cat, size_t bytes, const char *what) {
    pthread_mutex_lock(&allocation_lock);
    check_fits(SPACE_HOST, cat, bytes, what);
    void *ptr = NULL;
    Allocator from = FROM_ALIGNED;
    if (dry_run) {
        counted(dry_alloc(SPACE_HOST, cat, bytes, what), bytes, SPACE_HOST, cat, FROM_DRY);
        void *dry = allocations[allocation_count - 1].ptr;
        pthread_mutex_unlock(&allocation_lock);
        return dry;
    }
#ifdef USE_CUDA
    if (active_backend == BACKEND_CUDA) {
        ptr = cuda_host_alloc_zeroed(bytes ? bytes : 1);
        if (!ptr) out_of_memory(SPACE_HOST, cat, bytes, what, "cudaHostAlloc");
        from = FROM_CUDA_HOST_ALLOC;
    }
#endif
    if (!ptr) {
        /* The CPU backend has no page locking to do; page alignment keeps
         * the buffer's placement what cudaHostAlloc would give. A buffer of
         * 2 MiB or more goes on a 2 MiB boundary and asks the kernel for huge
         * pages (transparent huge pages; Linux grants them to buffers that
         * ask when /sys/kernel/mm/transparent_hugepage/enabled says
         * "madvise", the usual setting): a pass over hundreds of MiB, like
         * chapter 06's host AdamW, then needs one address translation per
         * 2 MiB instead of per 4 KiB. 06_offload/adambench measured 10 to 15%
         * off the update on the 2-core development machine. */
        size_t page = bytes >= HUGE_PAGE ? HUGE_PAGE : 4096;
        size_t rounded = bytes ? (bytes + page - 1) / page * page : page;
        if (posix_memalign(&ptr, page, rounded) != 0)
            out_of_memory(SPACE_HOST, cat, bytes, what, "posix_memalign");
#ifdef MADV_HUGEPAGE
        if (page == HUGE_PAGE) madvise(ptr, rounded, MADV_HUGEPAGE); /* a request: no error if refused */
#endif
        memset(ptr, 0, rounded);
    }
    counted(ptr, bytes, SPACE_HOST, cat, from);
    pthread_mutex_unlock(&allocation_lock);
    return ptr;
}

void mem_free(void *ptr) {
    if (!ptr) return;
    pthread_mutex_lock(&allocation_lock);
    int i = 0;
    while (i < allocation_count && allocations[i].ptr != ptr) i++;
    if (i == allocation_count) fatal(EXIT_RUNTIME, "mem_free: %p was not allocated by mem_alloc", ptr);
    Allocation a = allocations[i];
    allocations[i] = allocations[--allocation_count];
    current[a.space][a.cat] -= a.bytes;
    current_total[a.space] -= a.bytes;
    pthread_mutex_unlock(&allocation_lock);
    switch (a.from) {
    case FROM_DRY:
        munmap(ptr, a.bytes ? a.bytes : 1);
        break;
#ifdef USE_CUDA
    case FROM_CUDA_MALLOC:
        cuda_release(ptr);
        break;
    case FROM_CUDA_HOST_ALLOC:
        cuda_host_release(ptr);
        break;
#endif
    default:
        free(ptr); /* calloc and posix_memalign */
    }
}

size_t mem_current_bytes(Space space, Category cat) {
    return current[space][cat];
}
size_t mem_peak_bytes(Space space, Category cat) {
    return peak[space][cat];
}
size_t mem_peak_total(Space space) {
    return peak_total[space];
}

/* A dry run's copy into host memory: nothing where the destination is a dry
 * buffer (it reads as zeros, as every dry device buffer does); zeros into
 * any other memory (a host variable), so what the host reads is always the same. */
static void dry_copy_to_host(void *dst_host, size_t bytes) {
    pthread_mutex_lock(&allocation_lock);
    int inside = 0;
    for (int i = 0; i < allocation_count && !inside; i++) {
        char *base = allocations[i].ptr;
        inside = allocations[i].from == FROM_DRY && (char *)dst_host >= base &&
                 (char *)dst_host + bytes <= base + allocations[i].bytes;
    }
    pthread_mutex_unlock(&allocation_lock);
    if (!inside) memset(dst_host, 0, bytes);
}

void copy_to_device(void *dst_device, const void *src_host, size_t bytes) {
    if (dry_run) return;
#ifdef USE_CUDA
    if (active_backend == BACKEND_CUDA) {
        cuda_copy_h2d(dst_device, src_host, bytes);
        return;
    }
#endif
    memcpy(dst_device, src_host, bytes);
}

void copy_to_host(void *dst_host, const void *src_device, size_t bytes) {
    if (dry_run) {
        dry_copy_to_host(dst_host, bytes);
        return;
    }
#ifdef USE_CUDA
    if (active_backend == BACKEND_CUDA) {
        cuda_copy_d2h(dst_host, src_device, bytes);
        return;
    }
#endif
    memcpy(dst_host, src_device, bytes);
}

void copy_on_device(void *dst_device, const void *src_device, size_t bytes) {
    if (dry_run) return;
#ifdef USE_CUDA
    if (active_backend == BACKEND_CUDA) {
        cuda_copy_d2d(dst_device, src_device, bytes);
        return;
    }
#endif
    memcpy(dst_device, src_device, bytes);
}

void copy_on_device_2d(void *dst_device, size_t dst_pitch, const void *src_device, size_t src_pitch,
                       size_t width_bytes, size_t rows) {
    if (dry_run || rows == 0 || width_bytes == 0) return;
#ifdef USE_CUDA
    if (active_backend == BACKEND_CUDA) {
        cuda_copy_d2d_2d(dst_device, dst_pitch, src_device, src_pitch, width_bytes, rows);
        return;
    }
#endif
    for (size_t i = 0; i < rows; i++)
        memcpy((char *)dst_device + i * dst_pitch, (const char *)src_device + i * src_pitch, width_bytes);
}

void copy_to_device_async(void *dst_device, const void *src_host, size_t bytes, DeviceStream *stream) {
    if (dry_run) return;
#ifdef USE_CUDA
    if (active_backend == BACKEND_CUDA) {
        cuda_copy_h2d_async(dst_device, src_host, bytes, stream->native);
        return;
    }
#endif
    (void)stream;
    memcpy(dst_device, src_host, bytes);
}

void copy_to_host_async(void *dst_host, const void *src_device, size_t bytes, DeviceStream *stream) {
    if (dry_run) {
        dry_copy_to_host(dst_host, bytes);
        return;
    }
#ifdef USE_CUDA
    if (active_backend == BACKEND_CUDA) {
        cuda_copy_d2h_async(dst_host, src_device, bytes, stream->native);
        return;
    }
#endif
    (void)stream;
    memcpy(dst_host, src_device, bytes);
}

/* ---- streams and events: CUDA calls on the GPU, nothing on the CPU ---- */

DeviceStream *device_stream(StreamKind kind) {
    if ((int)kind < 0 || kind >= STREAM_COUNT)
        fatal(EXIT_RUNTIME, "device_stream: no stream of kind %d", kind);
    return &streams[kind];
}

void *device_stream_handle(DeviceStream *stream) {
    return stream->native;
}

DeviceEvent *device_event_create(void) {
    DeviceEvent *event = xcalloc(1, sizeof *event);
#ifdef USE_CUDA
    if (active_backend == BACKEND_CUDA) event->native = cuda_event_create();
#endif
    return event;
}

void device_event_destroy(DeviceEvent *event) {
    if (!event) return;
#ifdef USE_CUDA
    if (event->native) cuda_event_destroy(event->native);
#endif
    free(event);
}

#ifdef USE_CUDA
/* An event made before device_init() chose CUDA has no CUDA event behind it. */
static void *native_event(DeviceEvent *event) {
    if (!event->native) fatal(EXIT_RUNTIME, "a device event was created before device_init() chose CUDA");
    return event->native;
}
#endif

void device_event_record(DeviceEvent *event, DeviceStream *stream) {
#ifdef USE_CUDA
    if (active_backend == BACKEND_CUDA) cuda_event_record(native_event(event), stream->native);
#else
    (void)event;
    (void)stream;
#endif
}

void device_stream_wait(DeviceStream *stream, DeviceEvent *event) {
#ifdef USE_CUDA
    if (active_backend == BACKEND_CUDA) cuda_stream_wait_event(stream->native, native_event(event));
#else
    (void)stream;
    (void)event;
#endif
}

void device_event_sync(DeviceEvent *event) {
#ifdef USE_CUDA
    if (active_backend == BACKEND_CUDA) cuda_event_synchronize(native_event(event));
#else
    (void)event;
#endif
}

void device_stream_sync(DeviceStream *stream) {
#ifdef USE_CUDA
    if (active_backend == BACKEND_CUDA) cuda_stream_synchronize(stream->native);
#else
    (void)stream;
#endif
}

void device_sync(void) {
#ifdef USE_CUDA
    if (active_backend == BACKEND_CUDA) cuda_synchronize();
#endif
}

void timer_start(Timer *t) {
#ifdef USE_CUDA
    if (active_backend == BACKEND_CUDA) {
        cuda_timer_start(t->events);
        return;
    }
#endif
    t->start_ms = wall_ms();
}

double timer_stop_ms(Timer *t) {
    if (dry_run) return 0.0; /* nothing ran: a dry run's times are 0 */
#ifdef USE_CUDA
    if (active_backend == BACKEND_CUDA) return cuda_timer_stop_ms(t->events);
#endif
    return wall_ms() - t->start_ms;
}
