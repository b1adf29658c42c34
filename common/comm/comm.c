/* comm.c: MPI (and NCCL) behind comm.h.
 *
 * The collectives here are the library's: MPI_Allreduce and friends, or
 * NCCL's on GPUs. The course writes its own all-reduce in ring.c and compares
 * the two (02_data_parallel/commbench).
 *
 * Every call on device buffers has the same shape: count the bytes, order
 * the communication stream after the buffer's producers (comm_stream_after),
 * then either NCCL on that stream, or MPI on a host view of the buffer (the
 * buffer itself on the CPU, the group's staging copy on the staged
 * transport), and wait until the result is in place. */
#include "common/comm/comm.h" /* collectives and messages between ranks */

#include "common/device/device.h" /* mem_alloc, copies, streams, timers */
#include "common/core/half.h" /* bf16 and fp16 conversions */
#ifdef USE_CUDA
#include "common/device/cuda_runtime_glue.h" /* the CUDA runtime behind C calls */
#endif
#include "common/core/util.h" /* fatal, log_info, exit codes, flag parsing */
#include "common/comm/watchdog.h" /* the flight recorder and --timeout */

#include <mpi.h>
#include <omp.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#ifdef USE_NCCL
#include <cuda_runtime.h>
#include <nccl.h>
#endif

struct CommGroup {
    MPI_Comm mpi;
    int rank, size;
    /* What one call of this group needs, so that threads using different
     * groups share nothing (comm.h, "Threads"); all made on first use. */
    DeviceEvent *inputs_ready; /* recorded on the compute stream by a call without `ready` */
    DeviceEvent *done;         /* recorded on the communication stream after a call's work */
    void *staging;             /* host copy of device buffers (staged transport): pinned, host/comm */
    size_t staging_bytes;
    WatchGroup *watch; /* its entries in the flight recorder (watchdog.h) */
    int nap_us;        /* > 0: an MPI collective waits by testing, sleeping this long between tests */
    int counter;       /* comm_group_count_into's counter + 1; 0: none */
#ifdef USE_NCCL
    ncclComm_t nccl;
#endif
};

static CommGroup world_group;
static int local_rank = 0;
static int local_size = 1; /* ranks on this rank's machine */
static CommTransport transport = COMM_MPI;
static int dry = 0; /* comm_init_dry: the world is a number; nothing is sent, every byte is counted */
static CommLedger ledger; /* bytes and calls per kind of call and counter, under bytes_lock (comm_ledger) */
static pthread_mutex_t bytes_lock = PTHREAD_MUTEX_INITIALIZER;

#define MPI_CHECK(call)                                                                                      \
    do {                                                                                                     \
        int mpi_status_ = (call);                                                                            \
        if (mpi_status_ != MPI_SUCCESS) {                                                                    \
            char mpi_text_[MPI_MAX_ERROR_STRING];                                                            \
            int mpi_len_ = 0;                                                                                \
            MPI_Error_string(mpi_status_, mpi_text_, &mpi_len_);                                             \
            char mpi_where_[2048];                                                                           \
            watchdog_explain(mpi_where_, sizeof mpi_where_); /* ranks elsewhere? */                          \
            fatal(EXIT_RUNTIME, "MPI error at %s:%d: %s%s", __FILE__, __LINE__, mpi_text_, mpi_where_);      \
        }                                                                                                    \
    } while (0)

/* The flight recorder's view of a group: its members' world ranks. */
static WatchGroup *watch_group(MPI_Comm comm) {
    int size;
    MPI_Comm_size(comm, &size);
    int *mine = xcalloc(size, sizeof(int)), *world = xcalloc(size, sizeof(int));
    MPI_Group group, world_members;
    MPI_Comm_group(comm, &group);
    MPI_Comm_group(MPI_COMM_WORLD, &world_members);
    for (int i = 0; i < size; i++) mine[i] = i;
    MPI_Group_translate_ranks(group, size, mine, world_members, world);
    MPI_Group_free(&group);
    MPI_Group_free(&world_members);
    WatchGroup *w = watchdog_group_create(world, size);
    free(mine);
    free(world);
    return w;
}

static void abort_job(int exit_code) {
    MPI_Abort(MPI_COMM_WORLD, exit_code);
    exit(exit_code);
}

/* The CPU time of a rank that shares its cores (comm.h, "Cores"). Without
 * OMP_NUM_THREADS, OpenMP would give every rank as many threads as it may
 * run on: all the machine's cores when mpirun does not bind the ranks. */
static void default_thread_count(void) {
    const char *set = getenv("OMP_NUM_THREADS");
    if (set && set[0]) return; /* the user's choice (config.c checks it) */
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    int share = cores > 0 && local_size > 0 ? (int)(cores / local_size) : 1;
    int threads = omp_get_max_threads(); /* the cores this rank is bound to */
    if (share < threads) threads = share;
    omp_set_num_threads(threads > 0 ? threads : 1);
}

void comm_init(int *argc, char ***argv) {
    int provided;
    /* before MPI starts, which reads it (Open MPI; comm.h, "Cores"); a value
     * the user exported stays */
    setenv("OMPI_MCA_mpi_yield_when_idle", "1", 0);
    MPI_CHECK(MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided));
    /* errors come back as codes, so fatal() can name the rank and abort everyone */
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    world_group.mpi = MPI_COMM_WORLD;
    MPI_Comm_rank(MPI_COMM_WORLD, &world_group.rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world_group.size);
    set_abort_hook(abort_job);
    if (world_group.size > 1) set_error_rank(world_group.rank);
    set_log_rank(world_group.rank, world_group.size);
    world_group.watch = watch_group(MPI_COMM_WORLD);
    MPI_Comm node;
    MPI_CHECK(
        MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, world_group.rank, MPI_INFO_NULL, &node));
    MPI_Comm_rank(node, &local_rank);
    MPI_Comm_size(node, &local_size);
    MPI_Comm_free(&node);
    default_thread_count();
    if (provided < MPI_THREAD_MULTIPLE && world_group.rank == 0)
        log_info(
            "note: this MPI does not support MPI_THREAD_MULTIPLE; overlap runs communication serially\n");
}

static void dry_abort(int exit_code) {
    exit(exit_code);
}

void comm_init_dry(int world_size, int rank) {
    if (world_size < 1 || rank < 0 || rank >= world_size)
        fatal(EXIT_USAGE, "--rank %d of --world %d (valid: 0..%d)", rank, world_size, world_size - 1);
    dry = 1;
    world_group.mpi = MPI_COMM_NULL;
    world_group.rank = rank;
    world_group.size = world_size;
    set_abort_hook(dry_abort);
    if (world_size > 1) set_error_rank(rank);
    set_log_rank(0, world_size); /* this process speaks as rank 0 would: it is the whole job here */
    local_rank = 0;
    local_size = world_size; /* threads as for a job of world_size ranks on this machine */
    default_thread_count();
}

int comm_dry(void) {
    return dry;
}

static void release_group(CommGroup *g);
static void free_sum_ops(void);

void comm_finalize(void) {
    if (dry) return;
    watchdog_stop();
    release_group(&world_group);
    free_sum_ops();
    MPI_Finalize();
}

CommGroup *comm_world(void) {
    return &world_group;
}
/* A dry run's group made by a plain comm_split: its members are not known
 * (only comm_split_by says who the other ranks are). */
static void require_members(const CommGroup *g, const char *call) {
    if (g->size < 0)
        fatal(EXIT_RUNTIME,
              "dry run: %s on a group made by comm_split, whose members a dry run cannot know "
              "(make it with comm_split_by)",
              call);
}
int comm_rank(const CommGroup *g) {
    require_members(g, "comm_rank");
    return g->rank;
}
int comm_size(const CommGroup *g) {
    require_members(g, "comm_size");
    return g->size;
}
int comm_local_rank(void) {
    return local_rank;
}

CommGroup *comm_split(CommGroup *parent, int color, int key) {
    CommGroup *g = xcalloc(1, sizeof *g);
    if (dry) { /* members unknown: fine for the host values it may carry, refused for the rest */
        g->mpi = MPI_COMM_NULL;
        g->rank = g->size = -1;
        return g;
    }
    MPI_CHECK(MPI_Comm_split(parent->mpi, color, key, &g->mpi));
    MPI_Comm_set_errhandler(g->mpi, MPI_ERRORS_RETURN);
    MPI_Comm_rank(g->mpi, &g->rank);
    MPI_Comm_size(g->mpi, &g->size);
    g->watch = watch_group(g->mpi);
    return g;
}

CommGroup *comm_split_by(CommGroup *parent, int (*color_of)(const void *ctx, int parent_rank, int *key),
                         const void *ctx) {
    require_members(parent, "comm_split_by");
    int key, color = color_of(ctx, parent->rank, &key);
    if (!dry) return comm_split(parent, color, key);
    /* MPI_Comm_split's order: by key, then by the rank in the parent */
    CommGroup *g = xcalloc(1, sizeof *g);
    g->mpi = MPI_COMM_NULL;
    for (int r = 0; r < parent->size; r++) {
        int other_key, other = color_of(ctx, r, &other_key);
        if (other != color) continue;
        g->size++;
        if (other_key < key || (other_key == key && r < parent->rank)) g->rank++;
    }
    return g;
}

void comm_group_free(CommGroup *g) {
    if (!g || g == &world_group) return;
    if (dry) {
        free(g);
        return;
    }
    release_group(g);
    watchdog_group_free(g->watch);
    MPI_CHECK(MPI_Comm_free(&g->mpi));
    free(g);
}

/* Ranks that share a GPU take turns on it (the driver time-slices their
 * contexts), so their step times do not show what chapters 02-04 teach about
 * speed; losses, memory and bytes sent still do. Say so once, on rank 0, when
 * any machine has more ranks than GPUs. */
static void warn_if_sharing_gpus(void) {
#ifdef USE_CUDA
    if (device_backend() != BACKEND_CUDA) return;
    int gpus = cuda_device_count();
    double worst = comm_allreduce_double(&world_group, gpus > 0 ? (double)local_size / gpus : 0.0, 1);
    if (worst > 1.0)
        log_info("warning: up to %.0f ranks share each GPU: they take turns on it, so step times do not show "
                 "the speed-ups of chapters 02-04 (losses, memory and bytes sent do); see course.md, "
                 "\"Reading GPU runs\"\n",
                 worst);
#endif
}

CommTransport comm_select(const char *choice) {
    int cuda = device_backend() == BACKEND_CUDA;
    if (dry) { /* the CPU backend's transport (config.c refuses --device cuda and --comm nccl) */
        transport = COMM_MPI;
        return transport;
    }
    if (strcmp(choice, "mpi") == 0) {
        transport = cuda ? COMM_STAGED : COMM_MPI;
    } else if (strcmp(choice, "nccl") == 0) {
        if (!cuda) fatal(EXIT_USAGE, "--comm nccl needs --device cuda (NCCL moves GPU buffers)");
#ifdef USE_NCCL
        transport = COMM_NCCL;
#else
        fatal(EXIT_USAGE, "--comm nccl: this build has no NCCL (nccl.h was not found); use --comm mpi");
#endif
    } else if (strcmp(choice, "auto") == 0) {
        transport = cuda ? COMM_STAGED : COMM_MPI;
#ifdef USE_NCCL
        /* NCCL wants one GPU per rank: ranks sharing a GPU use the staged path */
        int gpus_on_node = 0;
        cudaGetDeviceCount(&gpus_on_node);
        int crowded = local_rank >= gpus_on_node;
        double any_crowded = comm_allreduce_double(&world_group, crowded, 1);
        if (cuda && any_crowded == 0.0) transport = COMM_NCCL;
#endif
    } else {
        fatal(EXIT_USAGE, "--comm: unknown transport '%s' (valid: auto, nccl, mpi)", choice);
    }
    warn_if_sharing_gpus();
    return transport;
}

const char *comm_transport_name(void) {
    switch (transport) {
    case COMM_NCCL:
        return "nccl";
    case COMM_STAGED:
        return "mpi (host-staged)";
    default:
        return "mpi";
    }
}

/* ---- element types ---- */

size_t comm_dtype_bytes(CommDtype dtype) {
    return dtype == COMM_F32 ? 4 : 2;
}

const char *comm_dtype_name(CommDtype dtype) {
    switch (dtype) {
    case COMM_F32:
        return "fp32";
    case COMM_BF16:
        return "bf16";
    case COMM_F16:
        return "fp16";
    }
    return "an unknown type";
}

CommDtype comm_dtype_of(Precision precision) {
    return precision == PRECISION_BF16 ? COMM_BF16 : precision == PRECISION_FP16 ? COMM_F16 : COMM_F32;
}

static void check_dtype(CommDtype dtype, const char *call) {
    if (dtype != COMM_F32 && dtype != COMM_BF16 && dtype != COMM_F16)
        fatal(EXIT_RUNTIME, "%s: unknown element type %d (valid: COMM_F32, COMM_BF16, COMM_F16)", call,
              (int)dtype);
}

/* ---- 16-bit sums for MPI, which has no 16-bit float type ----
 * The buffers go as MPI_UINT16_T; the sum is an operation of our own that
 * widens each pair to fp32, adds, and rounds back (half.h), so partial sums
 * are rounded to 16 bits as they travel, as NCCL's are. */

static void sum_16(void *in, void *inout, int *len, HalfFormat format) {
    const uint16_t *a = in;
    uint16_t *b = inout;
    for (int i = 0; i < *len; i++)
        b[i] = half_from_float(half_to_float(a[i], format) + half_to_float(b[i], format), format);
}
static void sum_bf16(void *in, void *inout, int *len, MPI_Datatype *type) {
    (void)type;
    sum_16(in, inout, len, HALF_BF16);
}
static void sum_f16(void *in, void *inout, int *len, MPI_Datatype *type) {
    (void)type;
    sum_16(in, inout, len, HALF_F16);
}

static MPI_Op sum_ops[2] = {MPI_OP_NULL, MPI_OP_NULL}; /* bf16, fp16: made on first use */

static void free_sum_ops(void) {
    for (int i = 0; i < 2; i++)
        if (sum_ops[i] != MPI_OP_NULL) MPI_CHECK(MPI_Op_free(&sum_ops[i]));
}

static MPI_Datatype mpi_type(CommDtype dtype) {
    return dtype == COMM_F32 ? MPI_FLOAT : MPI_UINT16_T;
}

static MPI_Op mpi_sum(CommDtype dtype) {
    if (dtype == COMM_F32) return MPI_SUM;
    int i = dtype == COMM_BF16 ? 0 : 1;
    if (sum_ops[i] == MPI_OP_NULL) MPI_CHECK(MPI_Op_create(i == 0 ? sum_bf16 : sum_f16, 1, &sum_ops[i]));
    return sum_ops[i];
}

static void count_sent(const CommGroup *g, CommKind kind, double bytes) {
    require_members(g, "a collective");
    pthread_mutex_lock(&bytes_lock);
    int column = g->counter ? g->counter - 1 : COMM_COUNTERS;
    ledger.bytes[kind][column] += bytes;
    ledger.calls[kind][column] += 1;
    pthread_mutex_unlock(&bytes_lock);
}

/* ---- order: the communication stream after the buffer's producers ---- */

/* Make the communication stream wait (on the GPU, the host goes on) for
 * `ready`, or for everything queued on the compute stream so far; returns
 * that stream. The CPU has nothing to wait for. */
static DeviceStream *comm_stream_after(CommGroup *g, DeviceEvent *ready) {
    DeviceStream *comm = device_stream(STREAM_COMM);
    if (device_backend() != BACKEND_CUDA) return comm;
    if (!ready) {
        if (!g->inputs_ready) g->inputs_ready = device_event_create();
        device_event_record(g->inputs_ready, device_stream(STREAM_COMPUTE));
        ready = g->inputs_ready;
    }
    device_stream_wait(comm, ready);
    return comm;
}

/* The host waits until the communication stream has done what this call
 * queued on it (not what other threads queued since). */
static void comm_stream_finish(CommGroup *g, DeviceStream *comm) {
    if (device_backend() != BACKEND_CUDA) return;
    if (!g->done) g->done = device_event_create();
    device_event_record(g->done, comm);
    device_event_sync(g->done);
}

/* ---- staging: device buffers through host memory ---- */

/* The group's staging buffer, grown to at least `bytes`. */
static char *stage(CommGroup *g, size_t bytes) {
    if (bytes > g->staging_bytes) {
        mem_free(g->staging);
        g->staging = mem_alloc_pinned(CAT_COMM, bytes, "host staging of device buffers");
        g->staging_bytes = bytes;
    }
    return g->staging;
}

/* Bring `bytes` of a device buffer to host memory for MPI: the buffer itself
 * unless staged; staged, into `host` on the communication stream, waited for. */
static void *to_host(CommGroup *g, DeviceStream *comm, void *host, const void *dev, size_t bytes) {
    if (transport != COMM_STAGED) return (void *)dev;
    copy_to_host_async(host, dev, bytes, comm);
    comm_stream_finish(g, comm);
    return host;
}

/* Put MPI's result back into the device buffer (staged only). */
static void to_device(CommGroup *g, DeviceStream *comm, void *dev, const void *host, size_t bytes) {
    if (transport != COMM_STAGED) return;
    copy_to_device_async(dev, host, bytes, comm);
    comm_stream_finish(g, comm);
}

/* Where MPI reads or writes a device buffer of `bytes`: itself, or (staged)
 * the part of the staging buffer at `offset`. */
static void *host_side(CommGroup *g, void *dev, size_t offset, size_t bytes_total) {
    return transport == COMM_STAGED ? stage(g, bytes_total) + offset : dev;
}

#ifdef USE_NCCL
#define NCCL_CHECK(call)                                                                                     \
    do {                                                                                                     \
        ncclResult_t nccl_status_ = (call);                                                                  \
        if (nccl_status_ != ncclSuccess)                                                                     \
            fatal(EXIT_RUNTIME, "NCCL error at %s:%d: %s", __FILE__, __LINE__,                               \
                  ncclGetErrorString(nccl_status_));                                                         \
    } while (0)

static ncclComm_t nccl_of(CommGroup *g) {
    if (!g->nccl) {
        ncclUniqueId id;
        if (g->rank == 0) NCCL_CHECK(ncclGetUniqueId(&id));
        MPI_CHECK(MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, g->mpi));
        NCCL_CHECK(ncclCommInitRank(&g->nccl, g->size, id, g->rank));
    }
    return g->nccl;
}

static ncclDataType_t nccl_type(CommDtype dtype) {
    switch (dtype) {
    case COMM_BF16:
        return ncclBfloat16;
    case COMM_F16:
        return ncclHalf;
    default:
        return ncclFloat;
    }
}

static ncclRedOp_t nccl_op(ReduceOp op) {
    return op == COMM_AVG ? ncclAvg : ncclSum;
}

static cudaStream_t nccl_stream(DeviceStream *comm) {
    return (cudaStream_t)device_stream_handle(comm);
}
#endif

static void release_group(CommGroup *g) {
    mem_free(g->staging);
    g->staging = NULL;
    g->staging_bytes = 0;
    device_event_destroy(g->inputs_ready);
    device_event_destroy(g->done);
    g->inputs_ready = g->done = NULL;
#ifdef USE_NCCL
    if (g->nccl) NCCL_CHECK(ncclCommDestroy(g->nccl));
    g->nccl = NULL;
#endif
}

/* ---- collectives ---- */

/* Average = sum / size, applied to the host buffer MPI produced (16-bit
 * values: widened, scaled, rounded back). */
static void scale(void *host, size_t count, CommDtype dtype, float factor) {
    if (dtype == COMM_F32) {
        float *x = host;
        for (size_t i = 0; i < count; i++) x[i] *= factor;
        return;
    }
    HalfFormat format = dtype == COMM_BF16 ? HALF_BF16 : HALF_F16;
    uint16_t *h = host;
    for (size_t i = 0; i < count; i++) h[i] = half_from_float(half_to_float(h[i], format) * factor, format);
}

/* MPI counts are ints. */
static int mpi_count(size_t count) {
    if (count > 2147483647u)
        fatal(EXIT_RUNTIME, "a message of %zu elements is too large for one MPI call", count);
    return (int)count;
}

void comm_group_nap_while_waiting(CommGroup *g, int nap_us) {
    g->nap_us = nap_us > 0 ? nap_us : 0;
}

/* Wait for a collective started with MPI_I* on a group that naps (comm.h,
 * "Cores"): a test every nap_us; between tests the thread sleeps, and each
 * wake-up takes the core back from the computation only for as long as one
 * test moves the collective on. */
static void finish_request(CommGroup *g, MPI_Request *request) {
    struct timespec nap = {0, 1000L * g->nap_us};
    for (;;) {
        int done = 0;
        MPI_CHECK(MPI_Test(request, &done, MPI_STATUS_IGNORE));
        if (done) return;
        nanosleep(&nap, NULL);
    }
}

/* Whether a sum over g may nap: MPI's nonblocking algorithms may add the
 * ranks' values in another order than the blocking ones, and the course's
 * losses stay the same bit for bit; a sum of two has one order. */
static int sum_may_nap(const CommGroup *g) {
    return g->nap_us && g->size == 2;
}

static void allreduce_run(CommGroup *g, void *buf, size_t count, CommDtype dtype, ReduceOp op,
                          DeviceEvent *ready) {
    check_dtype(dtype, "comm_allreduce");
    if (count == 0) return;
    size_t bytes = count * comm_dtype_bytes(dtype);
    count_sent(g, COMM_KIND_ALLREDUCE, 2.0 * (g->size - 1) / g->size * bytes);
    if (g->size == 1 || dry) return; /* the sum of one is itself, and so is its average */
    DeviceStream *comm = comm_stream_after(g, ready);
#ifdef USE_NCCL
    if (transport == COMM_NCCL) {
        NCCL_CHECK(
            ncclAllReduce(buf, buf, count, nccl_type(dtype), nccl_op(op), nccl_of(g), nccl_stream(comm)));
        comm_stream_finish(g, comm);
        return;
    }
#endif
    void *h = to_host(g, comm, host_side(g, buf, 0, bytes), buf, bytes);
    if (sum_may_nap(g)) {
        MPI_Request request;
        MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, h, mpi_count(count), mpi_type(dtype), mpi_sum(dtype), g->mpi,
                                 &request));
        finish_request(g, &request);
    } else {
        MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, h, mpi_count(count), mpi_type(dtype), mpi_sum(dtype), g->mpi));
    }
    if (op == COMM_AVG) scale(h, count, dtype, 1.0f / g->size);
    to_device(g, comm, buf, h, bytes);
}

static void reduce_scatter_run(CommGroup *g, const void *send, void *recv, size_t count, CommDtype dtype,
                               ReduceOp op, DeviceEvent *ready) {
    check_dtype(dtype, "comm_reduce_scatter");
    size_t bytes = count * comm_dtype_bytes(dtype), total = (size_t)g->size * bytes;
    count_sent(g, COMM_KIND_REDUCE_SCATTER, (double)(g->size - 1) / g->size * total);
    if (dry) return;
    DeviceStream *comm = comm_stream_after(g, ready);
#ifdef USE_NCCL
    if (transport == COMM_NCCL) {
        NCCL_CHECK(ncclReduceScatter(send, recv, count, nccl_type(dtype), nccl_op(op), nccl_of(g),
                                     nccl_stream(comm)));
        comm_stream_finish(g, comm);
        return;
    }
#endif
    /* staged: [ send (size * count) | recv (count) ] in the staging buffer */
    void *hs = to_host(g, comm, host_side(g, (void *)send, 0, total + bytes), send, total);
    void *hr = host_side(g, recv, total, total + bytes);
    if (sum_may_nap(g)) {
        MPI_Request request;
        MPI_CHECK(MPI_Ireduce_scatter_block(hs, hr, mpi_count(count), mpi_type(dtype), mpi_sum(dtype), g->mpi,
                                            &request));
        finish_request(g, &request);
    } else {
        MPI_CHECK(
            MPI_Reduce_scatter_block(hs, hr, mpi_count(count), mpi_type(dtype), mpi_sum(dtype), g->mpi));
    }
    if (op == COMM_AVG) scale(hr, count, dtype, 1.0f / g->size);
    to_device(g, comm, recv, hr, bytes);
}

static void allgather_run(CommGroup *g, const void *send, void *recv, size_t count, CommDtype dtype,
                          DeviceEvent *ready) {
    check_dtype(dtype, "comm_allgather");
    size_t bytes = count * comm_dtype_bytes(dtype), total = (size_t)g->size * bytes;
    count_sent(g, COMM_KIND_ALLGATHER, (double)(g->size - 1) * bytes);
    if (dry) return;
    DeviceStream *comm = comm_stream_after(g, ready);
#ifdef USE_NCCL
    if (transport == COMM_NCCL) {
        NCCL_CHECK(ncclAllGather(send, recv, count, nccl_type(dtype), nccl_of(g), nccl_stream(comm)));
        comm_stream_finish(g, comm);
        return;
    }
#endif
    /* staged: [ recv (size * count) | send (count) ] in the staging buffer */
    void *hs = to_host(g, comm, host_side(g, (void *)send, total, total + bytes), send, bytes);
    void *hr = host_side(g, recv, 0, total + bytes);
    if (g->nap_us) {
        MPI_Request request;
        MPI_CHECK(MPI_Iallgather(hs, mpi_count(count), mpi_type(dtype), hr, mpi_count(count), mpi_type(dtype),
                                 g->mpi, &request));
        finish_request(g, &request);
    } else {
        MPI_CHECK(MPI_Allgather(hs, mpi_count(count), mpi_type(dtype), hr, mpi_count(count), mpi_type(dtype),
                                g->mpi));
    }
    to_device(g, comm, recv, hr, total);
}

static void alltoall_run(CommGroup *g, const void *send, void *recv, size_t count, CommDtype dtype,
                         DeviceEvent *ready) {
    check_dtype(dtype, "comm_alltoall");
    size_t bytes = count * comm_dtype_bytes(dtype), total = (size_t)g->size * bytes;
    count_sent(g, COMM_KIND_ALLTOALL, (double)(g->size - 1) * bytes);
    if (dry) return;
    DeviceStream *comm = comm_stream_after(g, ready);
#ifdef USE_NCCL
    if (transport == COMM_NCCL) { /* NCCL has no all-to-all: a group of sends and receives, one pair a rank */
        NCCL_CHECK(ncclGroupStart());
        for (int j = 0; j < g->size; j++) {
            NCCL_CHECK(ncclSend((const char *)send + (size_t)j * bytes, count, nccl_type(dtype), j, nccl_of(g),
                                nccl_stream(comm)));
            NCCL_CHECK(ncclRecv((char *)recv + (size_t)j * bytes, count, nccl_type(dtype), j, nccl_of(g),
                                nccl_stream(comm)));
        }
        NCCL_CHECK(ncclGroupEnd());
        comm_stream_finish(g, comm);
        return;
    }
#endif
    /* staged: [ send (size * count) | recv (size * count) ] in the staging buffer */
    void *hs = to_host(g, comm, host_side(g, (void *)send, 0, 2 * total), send, total);
    void *hr = host_side(g, recv, total, 2 * total);
    MPI_CHECK(MPI_Alltoall(hs, mpi_count(count), mpi_type(dtype), hr, mpi_count(count), mpi_type(dtype), g->mpi));
    to_device(g, comm, recv, hr, total);
}

static void broadcast_run(CommGroup *g, void *buf, size_t count, CommDtype dtype, int root,
                          DeviceEvent *ready) {
    check_dtype(dtype, "comm_broadcast");
    size_t bytes = count * comm_dtype_bytes(dtype);
    if (g->rank == root) count_sent(g, COMM_KIND_BROADCAST, (double)(g->size - 1) * bytes);
    if (dry) return;
    DeviceStream *comm = comm_stream_after(g, ready);
#ifdef USE_NCCL
    if (transport == COMM_NCCL) {
        NCCL_CHECK(ncclBroadcast(buf, buf, count, nccl_type(dtype), root, nccl_of(g), nccl_stream(comm)));
        comm_stream_finish(g, comm);
        return;
    }
#endif
    void *h = host_side(g, buf, 0, bytes);
    if (g->rank == root) to_host(g, comm, h, buf, bytes);
    MPI_CHECK(MPI_Bcast(h, mpi_count(count), mpi_type(dtype), root, g->mpi));
    to_device(g, comm, buf, h, bytes);
}

static void send_run(CommGroup *g, const float *buf, size_t count, int dest, int tag) {
    size_t bytes = count * sizeof(float);
    count_sent(g, COMM_KIND_SEND, (double)bytes);
    if (dry) return;
    DeviceStream *comm = comm_stream_after(g, NULL);
#ifdef USE_NCCL
    if (transport == COMM_NCCL) {
        NCCL_CHECK(ncclSend(buf, count, ncclFloat, dest, nccl_of(g), nccl_stream(comm)));
        comm_stream_finish(g, comm);
        return;
    }
#endif
    float *h = to_host(g, comm, host_side(g, (void *)buf, 0, bytes), buf, bytes);
    MPI_CHECK(MPI_Send(h, mpi_count(count), MPI_FLOAT, dest, tag, g->mpi));
}

static void recv_run(CommGroup *g, float *buf, size_t count, int source, int tag) {
    size_t bytes = count * sizeof(float);
    if (dry) return;                                 /* the buffer keeps its zeros */
    DeviceStream *comm = comm_stream_after(g, NULL); /* the buffer's last readers first */
#ifdef USE_NCCL
    if (transport == COMM_NCCL) {
        NCCL_CHECK(ncclRecv(buf, count, ncclFloat, source, nccl_of(g), nccl_stream(comm)));
        comm_stream_finish(g, comm);
        return;
    }
#endif
    float *h = host_side(g, buf, 0, bytes);
    MPI_CHECK(MPI_Recv(h, mpi_count(count), MPI_FLOAT, source, tag, g->mpi, MPI_STATUS_IGNORE));
    to_device(g, comm, buf, h, bytes);
}

static void sendrecv_run(CommGroup *g, const void *send, size_t send_count, int dest, void *recv,
                         size_t recv_count, int source, CommDtype dtype, int tag) {
    check_dtype(dtype, "comm_sendrecv_typed");
    size_t size = comm_dtype_bytes(dtype), send_bytes = send_count * size, recv_bytes = recv_count * size;
    count_sent(g, COMM_KIND_SEND, (double)send_bytes);
    if (dry) return;
    DeviceStream *comm = comm_stream_after(g, NULL);
#ifdef USE_NCCL
    if (transport == COMM_NCCL) {
        NCCL_CHECK(ncclGroupStart());
        NCCL_CHECK(ncclSend(send, send_count, nccl_type(dtype), dest, nccl_of(g), nccl_stream(comm)));
        NCCL_CHECK(ncclRecv(recv, recv_count, nccl_type(dtype), source, nccl_of(g), nccl_stream(comm)));
        NCCL_CHECK(ncclGroupEnd());
        comm_stream_finish(g, comm);
        return;
    }
#endif
    /* staged: [ send | recv ] in the staging buffer */
    size_t total = send_bytes + recv_bytes;
    void *hs = to_host(g, comm, host_side(g, (void *)send, 0, total), send, send_bytes);
    void *hr = host_side(g, recv, send_bytes, total);
    MPI_CHECK(MPI_Sendrecv(hs, mpi_count(send_count), mpi_type(dtype), dest, tag, hr, mpi_count(recv_count),
                           mpi_type(dtype), source, tag, g->mpi, MPI_STATUS_IGNORE));
    to_device(g, comm, recv, hr, recv_bytes);
}

/* ---- the calls of comm.h: each one a fault point, then an entry of the
 * flight recorder around the work ---- */

/* Every call on a group starts here: the tests' fault point `point` (util.h:
 * COURSE_FAULT_KILL kills this rank there; COURSE_FAULT_SKIP makes it skip
 * the call, returning SKIP), then its entry `op` in the flight recorder
 * with the group ranks it sends to and receives from (-1: none; both -1: a
 * collective), which op_end closes. */
enum { SKIP = -1 };
static int op_begin_message(CommGroup *g, const char *point, const char *op, int dest, int source,
                            size_t bytes) {
    fault_point(point);
    if (fault_skip(point)) return SKIP;
    if (dry) return 0; /* no flight recorder: nothing waits */
    return watchdog_begin(g->watch, op, dest, source, bytes);
}
static int op_begin(CommGroup *g, const char *name, size_t bytes) { /* a collective */
    return op_begin_message(g, name, name, -1, -1, bytes);
}
static void op_end(int entry) {
    if (!dry) watchdog_end(entry);
}

void comm_allreduce_typed(CommGroup *g, void *buf, size_t count, CommDtype dtype, ReduceOp op,
                          DeviceEvent *ready) {
    int entry = op_begin(g, "allreduce", count * comm_dtype_bytes(dtype));
    if (entry == SKIP) return;
    allreduce_run(g, buf, count, dtype, op, ready);
    op_end(entry);
}

void comm_reduce_scatter_typed(CommGroup *g, const void *send, void *recv, size_t count, CommDtype dtype,
                               ReduceOp op, DeviceEvent *ready) {
    int entry = op_begin(g, "reduce_scatter", g->size * count * comm_dtype_bytes(dtype));
    if (entry == SKIP) return;
    reduce_scatter_run(g, send, recv, count, dtype, op, ready);
    op_end(entry);
}

void comm_allgather_typed(CommGroup *g, const void *send, void *recv, size_t count, CommDtype dtype,
                          DeviceEvent *ready) {
    int entry = op_begin(g, "allgather", g->size * count * comm_dtype_bytes(dtype));
    if (entry == SKIP) return;
    allgather_run(g, send, recv, count, dtype, ready);
    op_end(entry);
}

void comm_alltoall_typed(CommGroup *g, const void *send, void *recv, size_t count, CommDtype dtype,
                         DeviceEvent *ready) {
    int entry = op_begin(g, "alltoall", g->size * count * comm_dtype_bytes(dtype));
    if (entry == SKIP) return;
    alltoall_run(g, send, recv, count, dtype, ready);
    op_end(entry);
}

void comm_broadcast_typed(CommGroup *g, void *buf, size_t count, CommDtype dtype, int root,
                          DeviceEvent *ready) {
    int entry = op_begin(g, "broadcast", count * comm_dtype_bytes(dtype));
    if (entry == SKIP) return;
    broadcast_run(g, buf, count, dtype, root, ready);
    op_end(entry);
}

void comm_send(CommGroup *g, const float *buf, size_t count, int dest, int tag) {
    int entry = op_begin_message(g, "send", "send", dest, -1, count * sizeof(float));
    if (entry == SKIP) return;
    send_run(g, buf, count, dest, tag);
    op_end(entry);
}

void comm_recv(CommGroup *g, float *buf, size_t count, int source, int tag) {
    int entry = op_begin_message(g, "recv", "recv", -1, source, count * sizeof(float));
    if (entry == SKIP) return;
    recv_run(g, buf, count, source, tag);
    op_end(entry);
}

void comm_sendrecv_typed(CommGroup *g, const void *send, size_t send_count, int dest, void *recv,
                         size_t recv_count, int source, CommDtype dtype, int tag) {
    int entry =
        op_begin_message(g, "sendrecv", "sendrecv", dest, source, send_count * comm_dtype_bytes(dtype));
    if (entry == SKIP) return;
    sendrecv_run(g, send, send_count, dest, recv, recv_count, source, dtype, tag);
    op_end(entry);
}

struct CommPosted {
    MPI_Request request;
    int dest; /* group rank it goes to */
};

CommPosted *comm_post_send(CommGroup *g, const float *buf, size_t count, int dest, int tag) {
    if (transport != COMM_MPI && !dry)
        fatal(EXIT_USAGE,
              "a posted send (a zero-bubble or interleaved pipeline schedule) runs on the mpi "
              "transport only yet (CPU ranks); this run uses %s",
              comm_transport_name());
    CommPosted *posted = xcalloc(1, sizeof *posted);
    posted->request = MPI_REQUEST_NULL;
    posted->dest = dest;
    /* a send, for the tests' faults; posted, for the flight recorder */
    int entry = op_begin_message(g, "send", "post_send", dest, -1, count * sizeof(float));
    if (entry == SKIP) return posted;
    count_sent(g, COMM_KIND_SEND, (double)(count * sizeof(float)));
    if (!dry) MPI_CHECK(MPI_Isend(buf, mpi_count(count), MPI_FLOAT, dest, tag, g->mpi, &posted->request));
    op_end(entry);
    return posted;
}

void comm_wait_posted(CommGroup *g, CommPosted *posted) {
    if (!posted) return;
    int entry = op_begin_message(g, "wait_posted", "wait_posted", posted->dest, -1, 0);
    if (entry != SKIP && !dry) {
        MPI_CHECK(MPI_Wait(&posted->request, MPI_STATUS_IGNORE));
        op_end(entry);
    }
    free(posted);
}

void comm_allreduce(CommGroup *g, float *buf, size_t count, ReduceOp op) {
    comm_allreduce_typed(g, buf, count, COMM_F32, op, NULL);
}

void comm_reduce_scatter(CommGroup *g, const float *send, float *recv, size_t count, ReduceOp op) {
    comm_reduce_scatter_typed(g, send, recv, count, COMM_F32, op, NULL);
}

void comm_allgather(CommGroup *g, const float *send, float *recv, size_t count) {
    comm_allgather_typed(g, send, recv, count, COMM_F32, NULL);
}

void comm_broadcast(CommGroup *g, float *buf, size_t count, int root) {
    comm_broadcast_typed(g, buf, count, COMM_F32, root, NULL);
}

void comm_sendrecv(CommGroup *g, const float *send, size_t send_count, int dest, float *recv,
                   size_t recv_count, int source, int tag) {
    comm_sendrecv_typed(g, send, send_count, dest, recv, recv_count, source, COMM_F32, tag);
}

int comm_all(CommGroup *g, int flag) {
    int all = flag != 0, mine = all;
    int entry = op_begin(g, "host_allreduce", sizeof mine);
    if (entry == SKIP || dry) return all; /* dry: every rank as healthy as this one */
    MPI_CHECK(MPI_Allreduce(&mine, &all, 1, MPI_INT, MPI_LAND, g->mpi));
    op_end(entry);
    return all;
}

double comm_allreduce_double(CommGroup *g, double value, int op_max) {
    double result = value;
    int entry = op_begin(g, "host_allreduce", sizeof value);
    if (entry == SKIP || dry) return result; /* dry: this rank's own value (run.csv: its share) */
    MPI_CHECK(MPI_Allreduce(&value, &result, 1, MPI_DOUBLE, op_max ? MPI_MAX : MPI_SUM, g->mpi));
    op_end(entry);
    return result;
}

/* ---- start-up messages ---- */

/* A dry run has no other rank to hear from: its caller answers for itself (agreement.h). */
static void startup_needs_mpi(const char *call) {
    if (dry) fatal(EXIT_RUNTIME, "%s: a dry run has no other ranks (no MPI)", call);
}

void comm_startup_gather(const void *mine, size_t bytes, void *all) {
    startup_needs_mpi("comm_startup_gather");
    MPI_CHECK(MPI_Gather(mine, mpi_count(bytes), MPI_BYTE, all, mpi_count(bytes), MPI_BYTE, 0, MPI_COMM_WORLD));
}

void comm_startup_broadcast(void *buf, size_t bytes) {
    startup_needs_mpi("comm_startup_broadcast");
    MPI_CHECK(MPI_Bcast(buf, mpi_count(bytes), MPI_BYTE, 0, MPI_COMM_WORLD));
}

void comm_gather_bytes(CommGroup *g, const void *send, size_t bytes, void *recv, int root) {
    int entry = op_begin(g, "host_gather", bytes);
    if (entry == SKIP) return;
    if (dry) { /* every rank sent what this one did */
        if (comm_rank(g) == root)
            for (int r = 0; r < g->size; r++) memcpy((char *)recv + (size_t)r * bytes, send, bytes);
        return;
    }
    MPI_CHECK(MPI_Gather(send, mpi_count(bytes), MPI_BYTE, recv, mpi_count(bytes), MPI_BYTE, root, g->mpi));
    op_end(entry);
}

void comm_barrier(CommGroup *g) {
    int entry = op_begin(g, "barrier", 0);
    if (entry == SKIP || dry) return;
    MPI_CHECK(MPI_Barrier(g->mpi));
    op_end(entry);
}

double comm_bytes_sent(void) {
    CommLedger now;
    comm_ledger(&now);
    double sent = 0.0;
    for (int k = 0; k < COMM_KINDS; k++)
        for (int c = 0; c <= COMM_COUNTERS; c++) sent += now.bytes[k][c];
    return sent;
}

void comm_group_count_into(CommGroup *g, int counter) {
    if (counter < -1 || counter >= COMM_COUNTERS)
        fatal(EXIT_RUNTIME, "comm_group_count_into: counter %d (valid: -1 for none, 0..%d)", counter,
              COMM_COUNTERS - 1);
    g->counter = counter + 1;
}

int comm_group_counter(const CommGroup *g) {
    return g->counter - 1;
}

void comm_ledger(CommLedger *out) {
    pthread_mutex_lock(&bytes_lock);
    *out = ledger;
    pthread_mutex_unlock(&bytes_lock);
}

void comm_max_doubles(CommGroup *g, double *values, int count) {
    int entry = op_begin(g, "host_allreduce", (size_t)count * sizeof *values);
    if (entry == SKIP || dry) return;
    MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, values, count, MPI_DOUBLE, MPI_MAX, g->mpi));
    op_end(entry);
}
