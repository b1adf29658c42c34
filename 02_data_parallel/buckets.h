/* buckets.h: gradient buckets all-reduced while the backward pass goes on
 * (--dp-mode overlap).
 *
 * The gradient buffer is cut, from its end (the head, whose gradients the
 * backward pass finishes first) towards its start (the embedding), into
 * contiguous buckets of about --bucket-mb, at tensor boundaries. A bucket is
 * ready once every layer it holds is done: that is this chapter's launch
 * rule (buckets_layer_done). Ready buckets go, in order, to a bucketed
 * all-reduce (02_data_parallel/bucketed.h), whose worker thread all-reduces them while
 * the main thread computes the gradients of earlier layers. On a GPU,
 * launching a bucket records an event on the compute stream right after
 * the kernels of the layer that completed it, and NCCL (on the
 * communication stream) waits for that event only, so the all-reduce runs
 * while the backward kernels of earlier layers do. */
#ifndef BUCKETS_H
#define BUCKETS_H

#include "02_data_parallel/bucketed.h" /* 02: a collective run bucket by bucket */
#include "common/comm/comm.h" /* collectives and messages between ranks */
#include "common/model/model.h" /* GPT, its forward and backward */

#include <stddef.h>

typedef struct {
    size_t lo, hi;            /* elements [lo, hi) of the gradient buffer */
    int lowest_layer;         /* the earliest layer with a tensor in it (LAYER_EMBEDDING = -1) */
    int launched;             /* handed to the communication thread this step */
    int launched_after_layer; /* the layer whose completion launched it */
} Bucket;

typedef struct {
    Bucket *buckets; /* buckets[0] ends at the buffer's end; the last starts at 0 */
    int count;
    BucketedCollective *allreduce; /* bucket i of it is buckets[i] */
    double busy_ms;                /* time its thread spent all-reducing this step */
} BucketSync;

/* Buckets over `grads` (the model's, or mixed precision's 16-bit ones: dtype
 * says which), laid out like the model's table; bucket_bytes of that type.
 * The `skips` ranges of it (whole tensors, summed elsewhere: data_parallel.h's
 * ranges held apart; NULL, 0: none) are in no bucket, and no bucket spans one. */
void buckets_create(BucketSync *bs, const GPT *model, void *grads, CommDtype dtype, size_t bucket_bytes,
                    CommGroup *group, int use_ring, const BucketRange *skip, int skips);
void buckets_destroy(BucketSync *bs);
/* Start of a step: no bucket launched yet. */
void buckets_begin_step(BucketSync *bs);
/* The backward pass finished `layer` (every layer above it is finished too):
 * launch each bucket that is now complete. A UnitHook. */
void buckets_layer_done(int layer, void *bucket_sync);
/* Wait until every bucket is all-reduced; returns the ms spent waiting. */
double buckets_wait(BucketSync *bs);
/* Print the buckets and when the last step launched each (rank 0). */
void buckets_print(const BucketSync *bs);

#endif
