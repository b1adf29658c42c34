/* bucketed.c: see bucketed.h.
 *
 * The caller and the worker share a queue of bucket indices under one lock:
 * bucketed_ready appends, the worker takes them in order, and each finished
 * bucket is flagged done and announced on a condition variable that the
 * waits sleep on. The worker holds the lock only to take and to report, never
 * during a collective. */
#include "bucketed.h"

#include "device.h"
#include "util.h"

#include <pthread.h>
#include <stdlib.h>

struct BucketedCollective {
    CommGroup *group; /* the worker's own duplicate of the caller's group */
    int ranks;
    BucketedSpec spec;
    BucketRange *ranges;
    int count;
    char *full, *shard; /* as bytes: element e of bucket b is at (lo + e) * elem_bytes */
    size_t elem_bytes;
    DeviceEvent **ready; /* per bucket: recorded on the compute stream when marked */
    /* the worker and what it shares with the caller, under lock */
    pthread_t worker;
    pthread_mutex_t lock;
    pthread_cond_t changed;
    int *queue;         /* bucket indices in the order they were marked */
    int queued, next;   /* marked this round; taken by the worker */
    int *marked, *done; /* per bucket, this round */
    int finished;       /* buckets done this round */
    int stop;
    double comm_ms;
};

static size_t round_up(size_t x, size_t multiple) {
    return (x + multiple - 1) / multiple * multiple;
}

int bucketed_cut(size_t count, size_t bucket_elems, int multiple, BucketRange **ranges,
                 size_t *padded_count) {
    if (bucket_elems == 0 || multiple < 1)
        fatal(EXIT_RUNTIME,
              "bucketed_cut: buckets of %zu elements padded to a multiple of %d (valid: >= 1 each)",
              bucket_elems, multiple);
    size_t step = round_up(bucket_elems, (size_t)multiple), padded = round_up(count, (size_t)multiple);
    int buckets = (int)((count + step - 1) / step);
    *ranges = xcalloc(buckets ? buckets : 1, sizeof(BucketRange));
    for (int b = 0; b < buckets; b++) {
        (*ranges)[b].lo = (size_t)b * step;
        (*ranges)[b].hi = b + 1 < buckets ? (size_t)(b + 1) * step : padded;
    }
    *padded_count = padded;
    return buckets;
}

static int by_start(const void *a, const void *b) {
    size_t x = ((const BucketRange *)a)->lo, y = ((const BucketRange *)b)->lo;
    return (x > y) - (x < y);
}

/* The ranges must tile [0, total) without gaps or overlaps, and split into
 * equal slices where the operation slices them. */
static void check_ranges(const BucketRange *ranges, int count, int ranks, BucketedOp op) {
    BucketRange *sorted = xcalloc(count ? count : 1, sizeof(BucketRange));
    for (int b = 0; b < count; b++) sorted[b] = ranges[b];
    qsort(sorted, count, sizeof(BucketRange), by_start);
    size_t end = 0;
    for (int i = 0; i < count; i++) {
        size_t lo = sorted[i].lo, hi = sorted[i].hi;
        if (lo != end || hi <= lo)
            fatal(EXIT_RUNTIME,
                  "bucketed_create: the buckets do not tile the buffer: a bucket is [%zu, %zu), the one "
                  "before it ends at %zu",
                  lo, hi, end);
        if (op != BUCKETED_ALLREDUCE && (hi - lo) % ranks != 0)
            fatal(EXIT_RUNTIME,
                  "bucketed_create: the bucket [%zu, %zu) holds %zu elements, not a multiple of the %d ranks "
                  "(pad it: bucketed.h)",
                  lo, hi, hi - lo, ranks);
        end = hi;
    }
    free(sorted);
}

/* Bucket b's collective, on the worker's group; returns when it is done. */
static void run_collective(BucketedCollective *bc, int b) {
    const BucketedSpec *spec = &bc->spec;
    size_t lo = bc->ranges[b].lo, len = bc->ranges[b].hi - lo, e = bc->elem_bytes;
    void *bucket = bc->full + lo * e;
    /* reduce-scatter, all-gather: this rank's slice of len / ranks elements */
    size_t slice = len / bc->ranks;
    void *my_slice = spec->op == BUCKETED_ALLREDUCE ? NULL : bc->shard + lo / bc->ranks * e;
    switch (spec->op) {
    case BUCKETED_ALLREDUCE:
        if (spec->allreduce)
            spec->allreduce(bc->group, bucket, len, spec->dtype, spec->reduce);
        else
            comm_allreduce_typed(bc->group, bucket, len, spec->dtype, spec->reduce, bc->ready[b]);
        break;
    case BUCKETED_REDUCE_SCATTER:
        comm_reduce_scatter_typed(bc->group, bucket, my_slice, slice, spec->dtype, spec->reduce,
                                  bc->ready[b]);
        break;
    case BUCKETED_ALLGATHER:
        comm_allgather_typed(bc->group, my_slice, bucket, slice, spec->dtype, bc->ready[b]);
        break;
    }
}

/* The worker: run marked buckets in order until stopped. */
static void *work(void *arg) {
    BucketedCollective *bc = arg;
    device_bind_thread(); /* on a GPU: this rank's GPU, not the thread default */
    pthread_mutex_lock(&bc->lock);
    for (;;) {
        while (bc->next == bc->queued && !bc->stop) pthread_cond_wait(&bc->changed, &bc->lock);
        if (bc->next == bc->queued) break; /* stopped, nothing left */
        int b = bc->queue[bc->next++];
        pthread_mutex_unlock(&bc->lock);
        double start = wall_ms();
        run_collective(bc, b);
        double elapsed = wall_ms() - start;
        pthread_mutex_lock(&bc->lock);
        bc->comm_ms += elapsed;
        bc->done[b] = 1;
        bc->finished++;
        pthread_cond_broadcast(&bc->changed);
    }
    pthread_mutex_unlock(&bc->lock);
    return NULL;
}

BucketedCollective *bucketed_create(CommGroup *g, const BucketedSpec *spec, const BucketRange *ranges,
                                    int buckets, void *full, void *shard) {
    BucketedCollective *bc = xcalloc(1, sizeof *bc);
    bc->spec = *spec;
    bc->ranks = comm_size(g);
    bc->count = buckets;
    check_ranges(ranges, buckets, bc->ranks, spec->op);
    if (spec->op != BUCKETED_ALLREDUCE && !shard)
        fatal(EXIT_RUNTIME, "bucketed_create: reduce-scatter and all-gather need a shard buffer");
    if (spec->allreduce && spec->op != BUCKETED_ALLREDUCE)
        fatal(EXIT_RUNTIME, "bucketed_create: another all-reduce implementation is for all-reduces only");
    bc->elem_bytes = comm_dtype_bytes(spec->dtype);
    bc->full = full;
    bc->shard = shard;
    bc->ranges = xcalloc(buckets ? buckets : 1, sizeof(BucketRange));
    for (int b = 0; b < buckets; b++) bc->ranges[b] = ranges[b];
    bc->ready = xcalloc(buckets ? buckets : 1, sizeof(DeviceEvent *));
    for (int b = 0; b < buckets; b++) bc->ready[b] = device_event_create();
    bc->queue = xcalloc(buckets ? buckets : 1, sizeof(int));
    bc->marked = xcalloc(buckets ? buckets : 1, sizeof(int));
    bc->done = xcalloc(buckets ? buckets : 1, sizeof(int));
    bc->group = comm_split(g, 0, comm_rank(g)); /* the same ranks, in the same order */
    pthread_mutex_init(&bc->lock, NULL);
    pthread_cond_init(&bc->changed, NULL);
    if (pthread_create(&bc->worker, NULL, work, bc) != 0)
        fatal(EXIT_RUNTIME, "cannot start the communication thread of a bucketed collective");
    return bc;
}

/* Under the lock: wait until the worker has finished every marked bucket. */
static void drain(BucketedCollective *bc) {
    while (bc->finished < bc->queued) pthread_cond_wait(&bc->changed, &bc->lock);
}

void bucketed_begin(BucketedCollective *bc) {
    pthread_mutex_lock(&bc->lock);
    drain(bc); /* a round left unwaited finishes first */
    for (int b = 0; b < bc->count; b++) bc->marked[b] = bc->done[b] = 0;
    bc->queued = bc->next = bc->finished = 0;
    bc->comm_ms = 0.0;
    pthread_mutex_unlock(&bc->lock);
}

void bucketed_ready(BucketedCollective *bc, int b) {
    if (b < 0 || b >= bc->count)
        fatal(EXIT_RUNTIME, "bucketed_ready: no bucket %d (valid: 0 to %d)", b, bc->count - 1);
    pthread_mutex_lock(&bc->lock);
    if (bc->marked[b]) fatal(EXIT_RUNTIME, "bucketed_ready: bucket %d was marked twice in one round", b);
    /* After the kernels queued so far, among them the last that wrote bucket b. */
    device_event_record(bc->ready[b], device_stream(STREAM_COMPUTE));
    bc->marked[b] = 1;
    bc->queue[bc->queued++] = b;
    pthread_cond_broadcast(&bc->changed);
    pthread_mutex_unlock(&bc->lock);
}

void bucketed_wait(BucketedCollective *bc, int b) {
    pthread_mutex_lock(&bc->lock);
    if (b < 0 || b >= bc->count || !bc->marked[b])
        fatal(EXIT_RUNTIME, "bucketed_wait: bucket %d was not marked ready this round", b);
    while (!bc->done[b]) pthread_cond_wait(&bc->changed, &bc->lock);
    pthread_mutex_unlock(&bc->lock);
}

double bucketed_wait_all(BucketedCollective *bc) {
    double start = wall_ms();
    pthread_mutex_lock(&bc->lock);
    if (bc->queued != bc->count)
        fatal(EXIT_RUNTIME, "bucketed_wait_all: %d of %d buckets were marked ready", bc->queued, bc->count);
    drain(bc);
    pthread_mutex_unlock(&bc->lock);
    return wall_ms() - start;
}

double bucketed_comm_ms(BucketedCollective *bc) {
    pthread_mutex_lock(&bc->lock);
    double ms = bc->comm_ms;
    pthread_mutex_unlock(&bc->lock);
    return ms;
}

void bucketed_destroy(BucketedCollective *bc) {
    if (!bc) return;
    pthread_mutex_lock(&bc->lock);
    bc->stop = 1; /* the worker finishes what is queued: the other ranks expect it */
    pthread_cond_broadcast(&bc->changed);
    pthread_mutex_unlock(&bc->lock);
    pthread_join(bc->worker, NULL);
    comm_group_free(bc->group);
    for (int b = 0; b < bc->count; b++) device_event_destroy(bc->ready[b]);
    pthread_mutex_destroy(&bc->lock);
    pthread_cond_destroy(&bc->changed);
    free(bc->ready);
    free(bc->queue);
    free(bc->marked);
    free(bc->done);
    free(bc->ranges);
    free(bc);
}
