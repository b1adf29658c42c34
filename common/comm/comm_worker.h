/* comm_worker.h: collectives that run while the caller computes.
 *
 * A collective of comm.h returns when its result is in place, so a caller
 * that calls one waits for it. A CommWorker is a thread that calls them for
 * the caller instead: the caller queues a collective (comm_worker_allgather,
 * comm_worker_reduce_scatter), gets a ticket, goes on computing, and waits
 * for the ticket only where it needs the result. The worker runs the queued
 * collectives one at a time, in the order they were queued, on its own
 * duplicate of the group (its own MPI and NCCL communicators, as the
 * bucketed collective's worker: bucketed.h), which naps while an MPI
 * collective is in flight, so that on a CPU it shares its core with the
 * computation instead of polling it away (comm.h, "Cores").
 *
 *   caller : queue(gather 1) [compute 0]   wait(1) [compute 1] ...
 *   worker :                 [gather 1 ]           [gather 2 ] ...
 *
 * Chapter 02's overlapped all-reduce runs its buckets this way
 * (bucketed.h), chapter 05's ZeRO-3 prefetch gathers the next units, and its
 * reduce-scatters of each unit's gradients go through the same worker, so
 * that every rank issues its collectives in one order (on a GPU they share
 * the communication stream: two threads feeding it in different orders on
 * different ranks would deadlock NCCL).
 *
 * Order on a GPU. Queuing records an event on the compute stream, after the
 * kernels queued so far (those that wrote the input, and those that last
 * read the output buffer); the collective's communication-stream work waits
 * for that event only (comm.h's `ready`), not for kernels queued later: that
 * is the overlap. A ticket is done when its collective has returned, so the
 * kernels the caller queues after comm_worker_wait see the result. On the
 * CPU the same holds with plain threads: the input is final when queued.
 *
 * First come, first served, never reordered: the ranks' collectives pair up
 * in queue order, and a worker that chose by itself what to run next would
 * choose by timing, differently on different ranks. A caller that wants one
 * kind first queues it first (chapter 05 queues the next unit's gather ahead
 * of a reduce-scatter: zero.h, "Queue order").
 *
 * The buffers of a queued collective belong to the worker until its ticket
 * is waited for: the caller must not write the input or touch the output
 * before then. Every rank must queue the same collectives in the same order. */
#ifndef COMM_WORKER_H
#define COMM_WORKER_H

#include "common/comm/comm.h" /* collectives and messages between ranks */

#include <stddef.h>

typedef struct CommWorker CommWorker;

/* A worker for group g (collective over g: it duplicates g), with room for
 * `capacity` collectives queued and not yet done; a caller queuing more
 * waits for the oldest. Call after device_init. */
CommWorker *comm_worker_create(CommGroup *g, int capacity);
void comm_worker_destroy(CommWorker *w); /* collective; runs what is queued first */

/* Queue a collective (comm.h's, with the same arguments); returns its ticket. */
long comm_worker_allgather(CommWorker *w, const void *send, void *recv, size_t count, CommDtype dtype);
long comm_worker_reduce_scatter(CommWorker *w, const void *send, void *recv, size_t count, CommDtype dtype,
                                ReduceOp op);
long comm_worker_allreduce(CommWorker *w, void *buf, size_t count, CommDtype dtype, ReduceOp op);
/* An all-reduce of another implementation (the course's ring,
 * ring_allreduce_typed), called on the worker's group; it orders itself after
 * the compute stream, not after the event recorded here. */
long comm_worker_allreduce_with(CommWorker *w,
                                void (*allreduce)(CommGroup *g, void *buf, size_t count, CommDtype dtype,
                                                  ReduceOp op),
                                void *buf, size_t count, CommDtype dtype, ReduceOp op);

/* Wait until ticket's collective is done; returns the milliseconds this
 * call waited (0 when it was done already). start_ms and end_ms (may be
 * NULL) receive when the worker ran it, on wall_ms()'s clock; they are kept
 * in the ticket's slot, so asking for them after `capacity` later
 * collectives were queued ends the job. */
double comm_worker_wait(CommWorker *w, long ticket, double *start_ms, double *end_ms);
/* Wait for everything queued; returns the milliseconds waited. */
double comm_worker_wait_all(CommWorker *w);

#endif
