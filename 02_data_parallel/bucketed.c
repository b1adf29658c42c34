/* bucketed.c: see bucketed.h.
 *
 * The worker is a CommWorker (comm_worker.h): bucketed_ready queues the
 * bucket's collective on it and keeps the ticket; the waits wait for
 * tickets. What is left here is the layout: the ranges, their checks, and
 * which slice of the shard each bucket's collective reads or writes. */
#include "02_data_parallel/bucketed.h" /* 02: a collective run bucket by bucket */

#include "common/comm/comm_worker.h" /* collectives run while the caller computes */
#include "common/core/util.h" /* fatal, log_info, exit codes, flag parsing */

#include <stdlib.h>

struct BucketedCollective {
    CommWorker *worker; /* its own duplicate of the caller's group */
    int ranks;
    BucketedSpec spec;
    BucketRange *ranges;
    int count;
    char *full, *shard; /* as bytes: element e of bucket b is at (lo + e) * elem_bytes */
    size_t elem_bytes;
    long *ticket; /* per bucket: its collective this round, -1 until marked */
    int queued;   /* buckets marked this round */
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

/* The ranges must tile [0, total) without gaps or overlaps (an all-reduce's
 * may leave gaps), and split into equal slices where the operation slices them. */
static void check_ranges(const BucketRange *ranges, int count, int ranks, BucketedOp op) {
    BucketRange *sorted = xcalloc(count ? count : 1, sizeof(BucketRange));
    for (int b = 0; b < count; b++) sorted[b] = ranges[b];
    qsort(sorted, count, sizeof(BucketRange), by_start);
    size_t end = 0;
    for (int i = 0; i < count; i++) {
        size_t lo = sorted[i].lo, hi = sorted[i].hi;
        if ((op == BUCKETED_ALLREDUCE ? lo < end : lo != end) || hi <= lo)
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

/* Queue bucket b's collective on the worker. */
static long queue_collective(BucketedCollective *bc, int b) {
    const BucketedSpec *spec = &bc->spec;
    size_t lo = bc->ranges[b].lo, len = bc->ranges[b].hi - lo, e = bc->elem_bytes;
    void *bucket = bc->full + lo * e;
    /* reduce-scatter, all-gather: this rank's slice of len / ranks elements */
    size_t slice = len / bc->ranks;
    void *my_slice = spec->op == BUCKETED_ALLREDUCE ? NULL : bc->shard + lo / bc->ranks * e;
    switch (spec->op) {
    case BUCKETED_ALLREDUCE:
        if (spec->allreduce)
            return comm_worker_allreduce_with(bc->worker, spec->allreduce, bucket, len, spec->dtype,
                                              spec->reduce);
        return comm_worker_allreduce(bc->worker, bucket, len, spec->dtype, spec->reduce);
    case BUCKETED_REDUCE_SCATTER:
        return comm_worker_reduce_scatter(bc->worker, bucket, my_slice, slice, spec->dtype, spec->reduce);
    case BUCKETED_ALLGATHER:
        return comm_worker_allgather(bc->worker, my_slice, bucket, slice, spec->dtype);
    }
    return -1;
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
    bc->ticket = xcalloc(buckets ? buckets : 1, sizeof(long));
    for (int b = 0; b < buckets; b++) bc->ticket[b] = -1;
    /* room for every bucket: marking one never waits for another */
    bc->worker = comm_worker_create(g, buckets ? buckets : 1);
    return bc;
}

void bucketed_begin(BucketedCollective *bc) {
    comm_worker_wait_all(bc->worker); /* a round left unwaited finishes first */
    for (int b = 0; b < bc->count; b++) bc->ticket[b] = -1;
    bc->queued = 0;
}

void bucketed_ready(BucketedCollective *bc, int b) {
    if (b < 0 || b >= bc->count)
        fatal(EXIT_RUNTIME, "bucketed_ready: no bucket %d (valid: 0 to %d)", b, bc->count - 1);
    if (bc->ticket[b] >= 0) fatal(EXIT_RUNTIME, "bucketed_ready: bucket %d was marked twice in one round", b);
    /* the worker records the bucket's event now: after the kernels that wrote it */
    bc->ticket[b] = queue_collective(bc, b);
    bc->queued++;
}

void bucketed_wait(BucketedCollective *bc, int b) {
    if (b < 0 || b >= bc->count || bc->ticket[b] < 0)
        fatal(EXIT_RUNTIME, "bucketed_wait: bucket %d was not marked ready this round", b);
    comm_worker_wait(bc->worker, bc->ticket[b], NULL, NULL);
}

double bucketed_wait_all(BucketedCollective *bc) {
    if (bc->queued != bc->count)
        fatal(EXIT_RUNTIME, "bucketed_wait_all: %d of %d buckets were marked ready", bc->queued, bc->count);
    return comm_worker_wait_all(bc->worker);
}

double bucketed_busy_ms(BucketedCollective *bc) {
    double ms = 0.0;
    for (int b = 0; b < bc->count; b++) {
        if (bc->ticket[b] < 0) continue;
        double start, end;
        comm_worker_wait(bc->worker, bc->ticket[b], &start, &end);
        ms += end - start;
    }
    return ms;
}

void bucketed_destroy(BucketedCollective *bc) {
    if (!bc) return;
    comm_worker_destroy(bc->worker); /* it finishes what is queued: the other ranks expect it */
    free(bc->ticket);
    free(bc->ranges);
    free(bc);
}
