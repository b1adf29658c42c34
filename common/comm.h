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
 * Any error ends the whole job (MPI_Abort) with a message naming the rank:
 * no rank is ever left waiting in a collective. Only one thread at a time
 * may call into this layer. */
#ifndef COMM_H
#define COMM_H

#include "config.h"
#include "csvlog.h"

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct CommGroup CommGroup;

typedef enum { COMM_SUM, COMM_AVG } ReduceOp;
typedef enum { COMM_MPI, COMM_NCCL, COMM_STAGED } CommTransport;

/* Start MPI (or a world of one without mpirun); registers the rank with the
 * error and logging helpers of util.h and MPI_Abort as the abort hook. */
void comm_init(int *argc, char ***argv);
void comm_finalize(void);

/* config_parse for a job of many ranks: every rank reads and checks its own
 * command line and files, then the ranks agree before any collective of
 * training. When they all pass and their configuration records (config.h)
 * are equal, the run goes on. Otherwise rank 0 prints one message and every
 * rank leaves through MPI_Finalize: --help (exit 0), the same error on every
 * rank (exit 2, printed once), an error on some ranks (exit 2, the first
 * such rank named), or records that differ (exit 2, naming the first flag
 * or file that differs, its values and which ranks have them). */
void comm_parse_config(Config *cfg, int argc, char **argv, const char *program, const char *summary,
                       const CliExtra *extra);
/* The agreement alone, for a program with its own command line (commbench):
 * status 0 ready, 1 --help, 2 a usage error (message); record may be NULL.
 * Returns 1 when every rank asked for --help (rank 0 prints it, then all call
 * comm_finalize), 0 to go on; any disagreement or error ends the job as above. */
int comm_agree(int status, const char *message, const ConfigRecord *record);

CommGroup *comm_world(void);
int comm_rank(const CommGroup *g);
int comm_size(const CommGroup *g);
/* Ranks rank within the node (which GPU to use). */
int comm_local_rank(void);
/* Split parent into groups of equal color, ordered by key (collective over parent). */
CommGroup *comm_split(CommGroup *parent, int color, int key);
/* Free a group made by comm_split (collective over its ranks; before comm_finalize). */
void comm_free(CommGroup *g);

/* Choose the transport for device buffers: "auto", "nccl" or "mpi" (--comm).
 * Call after device_init. auto: nccl on CUDA when built with NCCL and every
 * rank of the world has its own GPU; staged on CUDA otherwise; mpi on the CPU.
 * An impossible choice ends the job with EXIT_USAGE. */
CommTransport comm_select(const char *choice);
const char *comm_transport_name(void);

/* ---- collectives on device buffers of floats ---- */
void comm_allreduce(CommGroup *g, float *buf, size_t count, ReduceOp op);
/* send (size * count) -> recv (count): this rank's block of the reduction */
void comm_reduce_scatter(CommGroup *g, const float *send, float *recv, size_t count, ReduceOp op);
/* send (count) -> recv (size * count), rank r's block at r * count */
void comm_allgather(CommGroup *g, const float *send, float *recv, size_t count);
void comm_broadcast(CommGroup *g, float *buf, size_t count, int root);
/* point to point within g; tags keep concurrent streams of messages apart */
void comm_send(CommGroup *g, const float *buf, size_t count, int dest, int tag);
void comm_recv(CommGroup *g, float *buf, size_t count, int source, int tag);
/* send to one rank and receive from another at once (never deadlocks) */
void comm_sendrecv(CommGroup *g, const float *send, size_t send_count, int dest, float *recv,
                   size_t recv_count, int source, int tag);

/* ---- small host values ---- */
double comm_allreduce_double(CommGroup *g, double value, int op_max); /* sum, or max when op_max */
/* Gather `bytes` from every rank into recv (size * bytes) on root. */
void comm_gather_bytes(CommGroup *g, const void *send, size_t bytes, void *recv, int root);
void comm_barrier(CommGroup *g);

/* memory.csv for the whole job: every rank's (space, category) peaks,
 * gathered and written by rank 0 into dir. Returns the largest device peak
 * of any rank (run.csv's peak_device_bytes), on every rank. */
size_t comm_write_memory_csv(CommGroup *world, const char *dir);

/* A step's times as the slowest rank saw them (max over g of step, forward,
 * backward, communication and optimizer milliseconds): what steps.csv shows. */
void comm_slowest_times(CommGroup *g, StepRecord *rec);

/* Bytes this rank has sent through the collectives and point-to-point calls. */
double comm_bytes_sent(void);

#ifdef __cplusplus
}
#endif
#endif
