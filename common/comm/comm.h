/* comm.h: communication between ranks, for chapters 02 to 06.
 *
 * Ranks are processes started by `mpirun -np N`; a program started without
 * mpirun is a world of one. Every collective works on a group (CommGroup)
 * made by splitting the world: the data-parallel, tensor-parallel and
 * pipeline groups of the later chapters.
 *
 * Buffers are DEVICE buffers of the active backend (device.h), so a chapter
 * never cares where they live. Three transports, chosen by comm_select():
 *   mpi    : CPU backend, MPI on the buffers directly;
 *   nccl   : CUDA backend with one GPU per rank, NCCL on the device buffers;
 *   staged : CUDA backend without NCCL (or several ranks on one GPU): copy to
 *            host memory, MPI, copy back.
 * Each collective counts the bytes this rank sends, as the algorithm the
 * course teaches would send them (ring: 2(n-1)/n * S for an all-reduce), so
 * chapters can report communication volume.
 *
 * Order on a GPU (device.h, "Streams and events"). NCCL and the staging
 * copies run on the communication stream, which first waits for an event on
 * the compute stream: by default one recorded when the call is made (so the
 * kernels queued before the call, which wrote the buffers, come first), or
 * the `ready` event a caller of a *_typed collective recorded itself right
 * after the kernels that wrote the buffer (the bucketed collective does, so
 * that it does not also wait for kernels queued since). There is no
 * device-wide synchronize. Every call returns when its result is in place:
 * the host waits for the communication stream, so whatever is queued next,
 * on any stream, sees the result.
 *
 * Threads. A group is used by one thread at a time; different threads may
 * use different groups at once (the bucketed collective's worker thread has
 * its own duplicate of its group). Each group owns what its calls need: its
 * MPI and NCCL communicators, its event, and its staging buffer (pinned
 * host memory, host/comm in memory.csv, grown on demand); only the byte
 * counter is shared, under a lock. MPI is started with MPI_THREAD_MULTIPLE.
 *
 * Cores. A rank's OpenMP threads and its communication thread
 * (comm_worker.h) share the cores the rank runs on: mpirun binds each of up
 * to 2 ranks to one core of its own, and leaves more ranks unbound. Two
 * defaults keep them from starving each other on a CPU:
 *   - threads: without OMP_NUM_THREADS a rank gets cores / (ranks on its
 *     machine) OpenMP threads (at least 1, at most the cores it is bound to),
 *     not OpenMP's default of every core it may run on, which oversubscribes
 *     the machine as soon as ranks are not bound;
 *   - waiting: a blocking MPI call polls for its messages, and Open MPI polls
 *     without pause unless the machine is oversubscribed, so a communication
 *     thread waiting for another rank would keep its core from the compute
 *     thread beside it (a prefetching run was up to 13x slower than one
 *     without on a loaded 2-core machine). comm_init sets Open MPI's
 *     mpi_yield_when_idle (OMPI_MCA_mpi_yield_when_idle=1 unless exported
 *     otherwise): a poll that finds nothing yields the core. Yielding alone
 *     still leaves a collective of two communication threads to progress
 *     only when both happen to run, which on cores kept busy by computation
 *     is when the computation stops; so the worker's group naps
 *     (comm_group_nap_while_waiting): it tests its collective every few
 *     microseconds and sleeps in between, and a thread waking from sleep
 *     gets the core at once, long enough to move the bytes on.
 * OMP_WAIT_POLICY=passive (OpenMP threads that wait sleep) is still the
 * course's advice where more threads than cores run (README, "Threads").
 *
 * Any error ends the whole job (MPI_Abort) with a message naming the rank:
 * no rank is ever left waiting in a collective. Every call is an entry of
 * the flight recorder, and a rank that waits in one longer than --timeout
 * ends the job naming the ranks that never arrived (watchdog.h); every call
 * is also a fault point of the tests (util.h). */
#ifndef COMM_H
#define COMM_H

#include "common/model/model_config.h" /* ModelConfig */
#include "common/device/device.h" /* mem_alloc, copies, streams, timers */

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct CommGroup CommGroup;

typedef enum { COMM_SUM, COMM_AVG } ReduceOp;
typedef enum { COMM_MPI, COMM_NCCL, COMM_STAGED } CommTransport;

/* The element type of a collective's buffers: fp32, or the 16-bit formats
 * of mixed precision (--precision, half.h: the values held as their bits in
 * uint16_t). Bytes are counted with the real element size, so a 16-bit
 * gradient all-reduce sends half of an fp32 one. How each transport carries them:
 *   nccl   : NCCL's own types (ncclFloat, ncclBfloat16, ncclHalf); partial
 *            sums are rounded to 16 bits as they travel round the ring.
 *   mpi    : MPI_FLOAT for fp32. MPI has no 16-bit float type: 16-bit
 *            buffers go as MPI_UINT16_T with a user-defined sum
 *            (MPI_Op_create) that widens each pair to fp32, adds and rounds,
 *            so partial sums are rounded to 16 bits here too.
 *   staged : the device bytes copied to host memory as they are (2 or 4 per
 *            element), then as mpi, then copied back.
 * COMM_AVG divides by the group size: NCCL's ncclAvg, or a scaling of the
 * host buffer after MPI's sum. */
typedef enum { COMM_F32 = 0, COMM_BF16, COMM_F16 } CommDtype;
size_t comm_dtype_bytes(CommDtype dtype);
const char *comm_dtype_name(CommDtype dtype);
/* The type gradients are stored in under --precision (mixed.h): fp32, bf16, fp16. */
CommDtype comm_dtype_of(Precision precision);

/* Start MPI (or a world of one without mpirun); registers the rank with the
 * error and logging helpers of util.h and MPI_Abort as the abort hook. */
void comm_init(int *argc, char ***argv);
void comm_finalize(void);
/* The dry run (--dry-run --world N --rank R, harness.h): instead of
 * comm_init, a world of world_size ranks of which this process is `rank`,
 * without MPI. Every collective and point-to-point call then returns at once
 * (buffers keep what they hold) after counting its bytes exactly as the real
 * call does, into the same counters (per group and grid axis); host values
 * come back as this rank's own (a sum over the ranks is this rank's share,
 * an agreement is this rank's verdict, a gather sees this rank's value from
 * every rank). Groups must come from comm_split_by, whose color function
 * tells a dry run the other ranks' colors; a plain comm_split's group has
 * unknown members and may carry only host values (its comm_rank and
 * comm_size, and any collective of bytes on it, end the run naming the call).
 * Without OMP_NUM_THREADS a dry rank gets the threads of a rank of a
 * world_size-rank job on this machine ("Cores"). */
void comm_init_dry(int world_size, int rank);
int comm_dry(void); /* 1 after comm_init_dry */

/* Start-up messages on the world, before any training traffic (the ranks'
 * agreement on their configuration, agreement.h): plain MPI, outside the byte
 * ledger and the flight recorder. Gather `bytes` from every rank into `all`
 * (world size x bytes) on rank 0; broadcast rank 0's `buf` to every rank.
 * Not in a dry run, which has no other rank: ranks_agree answers for its own
 * there without them. */
void comm_startup_gather(const void *mine, size_t bytes, void *all);
void comm_startup_broadcast(void *buf, size_t bytes);

CommGroup *comm_world(void);
int comm_rank(const CommGroup *g);
int comm_size(const CommGroup *g);
/* Ranks rank within the node (which GPU to use). */
int comm_local_rank(void);
/* Split parent into groups of equal color, ordered by key (collective over parent). */
CommGroup *comm_split(CommGroup *parent, int color, int key);
/* comm_split with the color and key of every rank of the parent written as a
 * function: color_of(ctx, r, &key) returns parent rank r's color and sets its
 * key. A real run calls it for this rank only; a dry run for every rank, to
 * know the group's size and this rank's place in it without asking them. */
CommGroup *comm_split_by(CommGroup *parent, int (*color_of)(const void *ctx, int parent_rank, int *key),
                         const void *ctx);
/* Free a group from comm_split (collective over the group), before comm_finalize. */
void comm_group_free(CommGroup *g);
/* From now on g's MPI all-gathers (and, on 2 ranks, its all-reduces and
 * reduce-scatters: a sum of more may come out in another order) wait by
 * testing every nap_us microseconds and sleeping in between (0: MPI's own
 * wait). For a thread that shares its core with computation ("Cores"). */
void comm_group_nap_while_waiting(CommGroup *g, int nap_us);

/* Choose the transport for device buffers: "auto", "nccl" or "mpi" (--comm).
 * Call after device_init. auto: nccl on CUDA when built with NCCL and every
 * rank of the world has its own GPU; staged on CUDA otherwise; mpi on the CPU.
 * An impossible choice ends the job with EXIT_USAGE. */
CommTransport comm_select(const char *choice);
const char *comm_transport_name(void);

/* ---- collectives on device buffers of any CommDtype ----
 * count is in elements. ready: an event recorded on the compute stream after
 * the kernels that wrote the input (and read the output last), or NULL for
 * "everything queued on the compute stream so far". */
void comm_allreduce_typed(CommGroup *g, void *buf, size_t count, CommDtype dtype, ReduceOp op,
                          DeviceEvent *ready);
/* send (size * count) -> recv (count): this rank's block of the reduction */
void comm_reduce_scatter_typed(CommGroup *g, const void *send, void *recv, size_t count, CommDtype dtype,
                               ReduceOp op, DeviceEvent *ready);
/* send (count) -> recv (size * count), rank r's block at r * count */
void comm_allgather_typed(CommGroup *g, const void *send, void *recv, size_t count, CommDtype dtype,
                          DeviceEvent *ready);
void comm_broadcast_typed(CommGroup *g, void *buf, size_t count, CommDtype dtype, int root,
                          DeviceEvent *ready);
/* send (size * count) -> recv (size * count): block j of this rank's send goes
 * to rank j, and arrives there as block r (this rank's) of its recv; each rank
 * sends (size - 1) * count elements, its own block staying (counted under
 * COMM_KIND_ALLTOALL). The library's: MPI_Alltoall, or NCCL's grouped sends
 * and receives. Expert parallelism's dispatch and combine and Ulysses'
 * sequence-to-heads exchange are this call; 03_model_parallel/alltoall.h
 * writes it by hand on point-to-point messages. */
void comm_alltoall_typed(CommGroup *g, const void *send, void *recv, size_t count, CommDtype dtype,
                         DeviceEvent *ready);

/* ---- collectives on device buffers of floats: the typed ones with COMM_F32, ready = NULL ---- */
void comm_allreduce(CommGroup *g, float *buf, size_t count, ReduceOp op);
/* send (size * count) -> recv (count): this rank's block of the reduction */
void comm_reduce_scatter(CommGroup *g, const float *send, float *recv, size_t count, ReduceOp op);
/* send (count) -> recv (size * count), rank r's block at r * count */
void comm_allgather(CommGroup *g, const float *send, float *recv, size_t count);
void comm_broadcast(CommGroup *g, float *buf, size_t count, int root);
/* point to point within g (fp32; ordered as ready = NULL); tags keep
 * concurrent streams of messages apart */
void comm_send(CommGroup *g, const float *buf, size_t count, int dest, int tag);
void comm_recv(CommGroup *g, float *buf, size_t count, int source, int tag);
/* send to one rank and receive from another at once (never deadlocks) */
void comm_sendrecv(CommGroup *g, const float *send, size_t send_count, int dest, float *recv,
                   size_t recv_count, int source, int tag);
/* the same for elements of any CommDtype (the ring all-reduce of 16-bit gradients) */
void comm_sendrecv_typed(CommGroup *g, const void *send, size_t send_count, int dest, void *recv,
                         size_t recv_count, int source, CommDtype dtype, int tag);
/* A posted send (MPI_Isend): it leaves now and the caller goes on computing;
 * the buffer belongs to the message until comm_wait_posted returns, and a
 * plain comm_recv on the other rank receives it. This is what the
 * zero-bubble and interleaved pipeline schedules post (04_pipeline/schedule.h).
 * On the mpi transport only, yet: NCCL would need its sends grouped or on
 * streams of their own (a send waiting on the one communication stream holds
 * up every call behind it), and the staged transport a staging buffer per
 * message in flight; both refuse, saying so. */
typedef struct CommPosted CommPosted;
CommPosted *comm_post_send(CommGroup *g, const float *buf, size_t count, int dest, int tag);
/* Wait until the message has left the buffer, and free *posted (NULL is fine). */
void comm_wait_posted(CommGroup *g, CommPosted *posted);

/* ---- small host values ---- */
double comm_allreduce_double(CommGroup *g, double value, int op_max); /* sum, or max when op_max */
/* 1 when flag is nonzero on every rank of g, else 0 on every rank: a decision all ranks share */
int comm_all(CommGroup *g, int flag);
/* Gather `bytes` from every rank into recv (size * bytes) on root. */
void comm_gather_bytes(CommGroup *g, const void *send, size_t bytes, void *recv, int root);
void comm_barrier(CommGroup *g);

/* values[0..count) := their maximum over g's ranks (host memory): the
 * slowest rank's times of a step (step_times_slowest, run_csv.h). */
void comm_max_doubles(CommGroup *g, double *values, int count);

/* Bytes this rank has sent through the collectives and point-to-point calls. */
double comm_bytes_sent(void);

/* Counted apart for some groups: a group marked with comm_group_count_into(g,
 * c) counts what it sends under counter c (the process grid marks each
 * axis's group with the axis, grid.h, so that a run can say how many bytes
 * each axis sent). -1: no counter (the default). comm_group_counter says a
 * group's, for a duplicate made of it. */
enum { COMM_COUNTERS = 5 }; /* the grid's four axes and expert parallelism's group (grid.h) */
void comm_group_count_into(CommGroup *g, int counter);
int comm_group_counter(const CommGroup *g);

/* Every byte sent, by the kind of call that sent it and the counter of its
 * group (column COMM_COUNTERS: groups without one), with the number of calls:
 * comm_bytes_sent is its sum, a run's bytes per grid axis its columns
 * (harness.h), and a dry run writes it as dry-comm.csv for the planner's
 * bytes per collective and the latency of each call. A send is comm_send,
 * comm_sendrecv's send and a posted send; a broadcast counts at its root; an
 * all-to-all counts the blocks that leave the rank. */
typedef enum {
    COMM_KIND_ALLREDUCE,
    COMM_KIND_REDUCE_SCATTER,
    COMM_KIND_ALLGATHER,
    COMM_KIND_BROADCAST,
    COMM_KIND_SEND,
    COMM_KIND_ALLTOALL,
    COMM_KINDS
} CommKind;
typedef struct {
    double bytes[COMM_KINDS][COMM_COUNTERS + 1];
    double calls[COMM_KINDS][COMM_COUNTERS + 1];
} CommLedger;
void comm_ledger(CommLedger *out);
/* "all-reduce", ... as dry-comm.csv and the planner say them (inline: the planner links no MPI) */
static inline const char *comm_kind_name(CommKind kind) {
    static const char *const names[COMM_KINDS] = {"all-reduce", "reduce-scatter", "all-gather",
                                                  "broadcast",  "send",           "all-to-all"};
    return kind >= 0 && kind < COMM_KINDS ? names[kind] : "?";
}

#ifdef __cplusplus
}
#endif
#endif
