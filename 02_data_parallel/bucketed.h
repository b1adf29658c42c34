/* bucketed.h: one collective over a large buffer, run bucket by bucket by a
 * worker thread while the caller goes on computing (chapter 02's overlapped
 * all-reduce; chapter 05's per-bucket reduce-scatter and all-gather).
 *
 * The buffer is cut into buckets, each a range [lo, hi) of it. The caller
 * marks a bucket ready as soon as its values are final (bucketed_ready); a
 * worker thread runs that bucket's collective, in the order the buckets were
 * marked, while the caller computes; the caller waits for one bucket or for
 * all of them at the end. Three operations, over a group of n ranks:
 *
 *   all-reduce     : full[lo, hi) summed (or averaged) over the ranks, in place;
 *   reduce-scatter : full[lo, hi) summed; rank r keeps the r-th of n equal
 *                    slices of it, in shard[lo/n, hi/n);
 *   all-gather     : every rank's shard[lo/n, hi/n) gathered into full[lo, hi).
 *
 * Padding. Reduce-scatter and all-gather cut a bucket into n equal slices,
 * so each bucket's length must be a multiple of n, and the buckets tile the
 * buffer from 0, so that rank r's slices follow one another in one
 * contiguous shard of (full length)/n elements. The caller lays the buffer
 * out that way: bucketed_cut pads the end of the last bucket with zeros; a
 * caller with its own boundaries (ZeRO's layer units) pads each range.
 *
 *   full (n = 3):  | bucket 0: 6 elements | bucket 1: 4 + 2 padding |
 *   shard rank 0:  | b0 [0,2)  | b1 [6,8)   |
 *   shard rank 1:  | b0 [2,4)  | b1 [8,10)  |
 *   shard rank 2:  | b0 [4,6)  | b1 [10,12) |   (elements of full)
 *
 * All-reduce needs no padding (any lengths), and its buckets may leave
 * gaps: elements in no bucket, which it leaves as they are.
 *
 * Order. On a GPU, bucketed_ready records an event on the compute stream,
 * after the kernels the caller queued before it (the ones that wrote the
 * bucket), and the bucket's collective makes the communication stream wait
 * for that event only, not for the kernels queued since: that is what lets
 * it overlap them. On the CPU a bucket is final when it is marked. A bucket
 * is done when its collective has returned (comm.h: the result is in place),
 * so what the caller queues after bucketed_wait_* sees the result.
 *
 * Every rank must mark the same buckets in the same order: the ranks'
 * collectives pair up in that order. The worker works on its own duplicate
 * of the group, so its messages never mix with the caller's on the group
 * (its own MPI and NCCL communicators and staging buffer). On a GPU all
 * groups share the communication stream: two bucketed collectives that run
 * at once must be fed in the same order on every rank, or NCCL deadlocks. */
#ifndef BUCKETED_H
#define BUCKETED_H

#include "common/comm/comm.h" /* collectives and messages between ranks */

#include <stddef.h>

typedef enum { BUCKETED_ALLREDUCE, BUCKETED_REDUCE_SCATTER, BUCKETED_ALLGATHER } BucketedOp;

typedef struct {
    size_t lo, hi; /* elements [lo, hi) of the full buffer */
} BucketRange;

typedef struct {
    BucketedOp op;
    CommDtype dtype;
    ReduceOp reduce; /* all-reduce and reduce-scatter: COMM_SUM or COMM_AVG */
    /* All-reduce only: another implementation, such as the course's ring
     * (ring_allreduce_typed); NULL for the library's (comm_allreduce_typed).
     * It orders itself after the compute stream, not after the bucket's event. */
    void (*allreduce)(CommGroup *g, void *buf, size_t count, CommDtype dtype, ReduceOp op);
} BucketedSpec;

typedef struct BucketedCollective BucketedCollective;

/* The simplest padded layout: `count` elements cut into buckets of
 * bucket_elems rounded up to a multiple of `multiple` (the group size for
 * reduce-scatter and all-gather, 1 for all-reduce); the last bucket takes
 * the rest, padded up to a multiple too. Element i stays at i; the full
 * buffer needs *padded_count elements, zeros past count. Returns the number
 * of buckets and *ranges (xcalloc'ed: free it). */
int bucketed_cut(size_t count, size_t bucket_elems, int multiple, BucketRange **ranges, size_t *padded_count);

/* Collective over g. ranges[b] is bucket b's range of `full` (the ranges
 * tile [0, total), in any order, an all-reduce's with gaps allowed;
 * checked). shard: total/n elements for reduce-scatter (the output) and
 * all-gather (the input), NULL for all-reduce. Collective over g (it
 * duplicates g). Call after device_init. */
BucketedCollective *bucketed_create(CommGroup *g, const BucketedSpec *spec, const BucketRange *ranges,
                                    int buckets, void *full, void *shard);
void bucketed_destroy(BucketedCollective *bc); /* collective; before comm_finalize */

/* A new round (one training step): no bucket marked yet. */
void bucketed_begin(BucketedCollective *bc);
/* Bucket b's input is final, or will be once the kernels queued so far have
 * run: queue its collective. Once per bucket per round. */
void bucketed_ready(BucketedCollective *bc, int b);
/* Wait until bucket b's collective is done (it must have been marked). */
void bucketed_wait(BucketedCollective *bc, int b);
/* Wait until every bucket is done (every one must have been marked this
 * round); returns the milliseconds spent waiting. */
double bucketed_wait_all(BucketedCollective *bc);
/* Milliseconds the worker spent in collectives this round (after bucketed_wait_all). */
double bucketed_busy_ms(BucketedCollective *bc);

#endif
