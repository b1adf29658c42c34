/* buckets.c: see buckets.h. */
#include "buckets.h"

#include "device.h"
#include "ring.h"
#include "util.h"

#include <stdlib.h>

void buckets_create(BucketSync *bs, const GPT *model, size_t bucket_bytes, CommGroup *group, int use_ring) {
    *bs = (BucketSync){0};
    bs->group = group;
    bs->grads = model->grads;
    bs->use_ring = use_ring;
    bs->buckets = xcalloc(model->num_tensors, sizeof(Bucket));
    /* Walk the tensors from the last to the first, closing a bucket once it
     * holds at least bucket_bytes. */
    Bucket *open = NULL;
    for (int k = model->num_tensors - 1; k >= 0; k--) {
        const ParamTensor *t = &model->tensors[k];
        if (!open) {
            open = &bs->buckets[bs->count++];
            open->hi = t->offset + t->numel;
            open->lowest_layer = t->layer;
        }
        open->lo = t->offset;
        if (t->layer < open->lowest_layer) open->lowest_layer = t->layer;
        if ((open->hi - open->lo) * sizeof(float) >= bucket_bytes) open = NULL;
    }
    bs->queue = xcalloc(bs->count, sizeof(int));
    pthread_mutex_init(&bs->lock, NULL);
    pthread_cond_init(&bs->changed, NULL);
}

/* The communication thread: all-reduce queued buckets in order, until stopped. */
static void *communicate(void *arg) {
    BucketSync *bs = arg;
    device_bind_thread(); /* on a GPU: this rank's GPU, not the thread default */
    pthread_mutex_lock(&bs->lock);
    for (;;) {
        while (bs->next == bs->queued && !bs->stop) pthread_cond_wait(&bs->changed, &bs->lock);
        if (bs->stop) break;
        Bucket *b = &bs->buckets[bs->queue[bs->next]];
        pthread_mutex_unlock(&bs->lock);
        double start = wall_ms();
        if (bs->use_ring)
            ring_allreduce(bs->group, bs->grads + b->lo, b->hi - b->lo, COMM_SUM);
        else
            comm_allreduce(bs->group, bs->grads + b->lo, b->hi - b->lo, COMM_SUM);
        double elapsed = wall_ms() - start;
        pthread_mutex_lock(&bs->lock);
        bs->comm_ms += elapsed;
        bs->next++;
        bs->done++;
        pthread_cond_broadcast(&bs->changed);
    }
    pthread_mutex_unlock(&bs->lock);
    return NULL;
}

void buckets_begin_step(BucketSync *bs) {
    if (!bs->thread_started) {
        if (pthread_create(&bs->thread, NULL, communicate, bs) != 0)
            fatal(EXIT_RUNTIME, "cannot start the communication thread");
        bs->thread_started = 1;
    }
    pthread_mutex_lock(&bs->lock);
    for (int i = 0; i < bs->count; i++) bs->buckets[i].launched = 0;
    bs->queued = bs->next = bs->done = 0;
    bs->comm_ms = 0.0;
    pthread_mutex_unlock(&bs->lock);
}

static void launch(BucketSync *bs, int index, int layer) {
    pthread_mutex_lock(&bs->lock);
    bs->buckets[index].launched = 1;
    bs->buckets[index].launched_after_layer = layer;
    bs->queue[bs->queued++] = index;
    pthread_cond_broadcast(&bs->changed);
    pthread_mutex_unlock(&bs->lock);
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
    double start = wall_ms();
    pthread_mutex_lock(&bs->lock);
    if (bs->queued != bs->count)
        fatal(EXIT_RUNTIME, "backward finished with %d of %d gradient buckets launched", bs->queued,
              bs->count);
    while (bs->done < bs->count) pthread_cond_wait(&bs->changed, &bs->lock);
    pthread_mutex_unlock(&bs->lock);
    return wall_ms() - start;
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
    if (bs->thread_started) {
        pthread_mutex_lock(&bs->lock);
        bs->stop = 1;
        pthread_cond_broadcast(&bs->changed);
        pthread_mutex_unlock(&bs->lock);
        pthread_join(bs->thread, NULL);
    }
    pthread_mutex_destroy(&bs->lock);
    pthread_cond_destroy(&bs->changed);
    free(bs->buckets);
    free(bs->queue);
}
