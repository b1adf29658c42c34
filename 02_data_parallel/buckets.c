/* buckets.c: see buckets.h. */
#include "02_data_parallel/buckets.h" /* 02: gradient buckets during the backward */

#include "02_data_parallel/ring.h" /* 02: the ring all-reduce */
#include "common/core/util.h" /* fatal, log_info, exit codes, flag parsing */

#include <stdint.h>
#include <stdlib.h>

/* Whether elements [at, at + n) lie in one of the skipped ranges. */
static int skipped(const BucketRange *skip, int skips, size_t at, size_t n) {
    for (int i = 0; i < skips; i++)
        if (at >= skip[i].lo && at + n <= skip[i].hi) return 1;
    return 0;
}

void buckets_create(BucketSync *bs, const GPT *model, void *grads, CommDtype dtype, size_t bucket_bytes,
                    CommGroup *group, int use_ring, const BucketRange *skip, int skips) {
    *bs = (BucketSync){0};
    bs->buckets = xcalloc(model->num_tensors, sizeof(Bucket));
    /* Walk the held tensors from the buffer's end to its start, closing a
     * bucket once it holds at least bucket_bytes. */
    Bucket *open = NULL;
    size_t end = model->param_count; /* where the next tensor down must end */
    while (end > 0) {
        const ParamTensor *t = NULL;
        for (int k = 0; k < model->num_tensors && !t; k++) {
            size_t at = gpt_held_offset(model, &model->tensors[k]);
            if (at != SIZE_MAX && model->tensors[k].numel && at + model->tensors[k].numel == end)
                t = &model->tensors[k];
        }
        if (!t) fatal(EXIT_RUNTIME, "gradient buckets: no held tensor ends at element %zu", end);
        end = gpt_held_offset(model, t);
        if (skipped(skip, skips, end, t->numel)) { /* summed elsewhere: the bucket below starts afresh */
            open = NULL;
            continue;
        }
        if (!open) {
            open = &bs->buckets[bs->count++];
            open->hi = end + t->numel;
            open->lowest_layer = t->layer;
        }
        open->lo = end;
        if (t->layer < open->lowest_layer) open->lowest_layer = t->layer;
        if ((open->hi - open->lo) * comm_dtype_bytes(dtype) >= bucket_bytes) open = NULL;
    }
    /* The all-reduce of each bucket in place, summed (the loss is already a
     * mean over the global batch), by the library or the course's ring. */
    BucketRange *ranges = xcalloc(bs->count, sizeof(BucketRange));
    for (int i = 0; i < bs->count; i++) ranges[i] = (BucketRange){bs->buckets[i].lo, bs->buckets[i].hi};
    BucketedSpec spec = {BUCKETED_ALLREDUCE, dtype, COMM_SUM, use_ring ? ring_allreduce_typed : NULL};
    bs->allreduce = bucketed_create(group, &spec, ranges, bs->count, grads, NULL);
    free(ranges);
}

void buckets_begin_step(BucketSync *bs) {
    for (int i = 0; i < bs->count; i++) bs->buckets[i].launched = 0;
    bucketed_begin(bs->allreduce);
}

/* Bucket `index` holds final gradients once the kernels queued so far have
 * run: hand it to the all-reduce (on a GPU, after an event recorded now). */
static void launch(BucketSync *bs, int index, int layer) {
    bs->buckets[index].launched = 1;
    bs->buckets[index].launched_after_layer = layer;
    bucketed_ready(bs->allreduce, index);
}

void buckets_layer_done(int layer, void *bucket_sync) {
    BucketSync *bs = bucket_sync;
    /* EXERCISE 02.2 BEGIN: launch the buckets that are complete (course.md, exercise 02.2) */
    /* Every layer >= `layer` is finished, so a bucket whose earliest layer is
     * at or above it holds only final gradients. Launch in bucket order, the
     * order in which every rank launches them: ranks must enter the same
     * all-reduces in the same order. */
    for (int i = 0; i < bs->count; i++) {
        Bucket *b = &bs->buckets[i];
        if (!b->launched && b->lowest_layer >= layer) launch(bs, i, layer);
    }
    /* EXERCISE 02.2 END */
}

double buckets_wait(BucketSync *bs) {
    int launched = 0;
    for (int i = 0; i < bs->count; i++) launched += bs->buckets[i].launched;
    if (launched != bs->count)
        fatal(EXIT_RUNTIME, "backward finished with %d of %d gradient buckets launched", launched, bs->count);
    double waited_ms = bucketed_wait_all(bs->allreduce);
    bs->busy_ms = bucketed_busy_ms(bs->allreduce);
    return waited_ms;
}

void buckets_print(const BucketSync *bs) {
    log_info("bucket  elements                  layers  launched after layer\n");
    for (int i = 0; i < bs->count; i++) {
        const Bucket *b = &bs->buckets[i];
        log_info("%6d  [%9zu, %9zu)  >= %3d  %d\n", i, b->lo, b->hi, b->lowest_layer,
                 b->launched_after_layer);
    }
}

void buckets_destroy(BucketSync *bs) {
    bucketed_destroy(bs->allreduce);
    free(bs->buckets);
}
