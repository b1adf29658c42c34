/* data_parallel.c: see data_parallel.h. */
#include "02_data_parallel/data_parallel.h" /* 02: data parallelism */

#include "common/device/device.h" /* mem_alloc, copies, streams, timers */
#include "02_data_parallel/ring.h" /* 02: the ring all-reduce */
#include "common/core/util.h" /* fatal, log_info, exit codes, flag parsing */

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

void data_parallel_check_flags(const Config *cfg, const DataParallelFlags *f) {
    if (f->ranks > cfg->batch)
        fatal(EXIT_USAGE,
              "%d ranks but a global batch of %d sequences: every rank needs at least one "
              "(valid: --batch >= ranks)",
              f->ranks, cfg->batch);
    if (cfg->batch % (f->ranks * cfg->micro) != 0)
        fatal(EXIT_USAGE, "--batch %d is not divisible by %d ranks x --micro %d (valid: a multiple of %d)",
              cfg->batch, f->ranks, cfg->micro, f->ranks * cfg->micro);
}

/* --help's section and one row per flag (config.h says how to add one) */
const Flag data_parallel_flags[] = {
    {.type = FLAG_SECTION,
     .help = "data parallel (run with mpirun -np N; replicas of the model, or from chapter 03 on of each\n"
             "rank's part of it, their gradients summed)"},
    {"--dp-mode", FLAG_CHOICE, FIELD(DataParallelFlags, dp_mode), .choices = "naive|flat|overlap",
     .noun = "mode", .def = "flat", .usage = "--dp-mode naive|flat|overlap",
     .help = "naive: one all-reduce per parameter tensor after backward; flat: one\n"
             "all-reduce of the whole gradient buffer; overlap: buckets all-reduced\n"
             "during backward (default {default})"},
    {"--bucket-mb", FLAG_DOUBLE, FIELD(DataParallelFlags, bucket_mb), 1e-6, 4096, .def = "1",
     .usage = "--bucket-mb X", .help = "overlap: gradient bucket size in MiB, (0, 4096] (default {default})"},
    {"--allreduce", FLAG_CHOICE, FIELD(DataParallelFlags, allreduce), .choices = "ring|library",
     .noun = "all-reduce", .def = "library", .usage = "--allreduce ring|library",
     .help = "the course's ring all-reduce or the library's (default {default})"},
    {"--check-replicas", FLAG_INT, FIELD(DataParallelFlags, check_replicas), 0, 10000000,
     .usage = "--check-replicas N",
     .help = "every N steps verify all replicas hold identical parameters, 0 = never\n(default {default})"},
    {"--print-buckets", FLAG_SWITCH, FIELD(DataParallelFlags, print_buckets), .usage = "--print-buckets",
     .help = "overlap: print the buckets and after which layer each was launched"},
    {0},
};

static int use_ring(const DataParallel *dp) {
    return strcmp(dp->flags->allreduce, "ring") == 0;
}

void data_parallel_create(DataParallel *dp, const DataParallelFlags *flags, CommGroup *group, GPT *part,
                          MixedModel *mixed, Precision precision) {
    *dp = (DataParallel){.flags = flags,
                         .group = group,
                         .part = part,
                         .grads = precision_grads(part, mixed),
                         .type = comm_dtype_of(precision),
                         .overlap = strcmp(flags->dp_mode, "overlap") == 0};
    if (dp->overlap)
        buckets_create(&dp->buckets, part, dp->grads, dp->type, (size_t)(flags->bucket_mb * BYTES_PER_MIB),
                       group, use_ring(dp), NULL, 0);
    if ((dp->planted_count = (size_t)fault_plant_bytes() / sizeof(float)))
        dp->planted = mem_alloc(SPACE_DEVICE, CAT_COMM, dp->planted_count * sizeof(float), "planted by a test");
}

void data_parallel_hold_apart(DataParallel *dp, const BucketRange *ranges, int count, CommGroup *group) {
    free(dp->apart);
    dp->apart = xcalloc(count ? count : 1, sizeof(BucketRange));
    for (int i = 0; i < count; i++) {
        if (ranges[i].hi <= ranges[i].lo || ranges[i].hi > dp->part->param_count ||
            (i && ranges[i].lo < ranges[i - 1].hi))
            fatal(EXIT_RUNTIME,
                  "data parallel: the range [%zu, %zu) held apart is empty, out of order or "
                  "beyond the part's %zu elements",
                  ranges[i].lo, ranges[i].hi, dp->part->param_count);
        dp->apart[i] = ranges[i];
    }
    dp->apart_count = count;
    dp->apart_group = group;
    if (!dp->overlap) return;
    buckets_destroy(&dp->buckets); /* again, around the ranges apart */
    buckets_create(&dp->buckets, dp->part, dp->grads, dp->type,
                   (size_t)(dp->flags->bucket_mb * BYTES_PER_MIB), dp->group, use_ring(dp), dp->apart, count);
}

void data_parallel_take_over(DataParallel *dp, const DataParallelFlags *flags, const DataParallelOps *ops,
                             void *owner) {
    *dp = (DataParallel){.flags = flags, .ops = ops, .owner = owner};
}

void data_parallel_destroy(DataParallel *dp) {
    if (dp->ops) return; /* the technique's own */
    if (dp->overlap) buckets_destroy(&dp->buckets);
    mem_free(dp->planted);
    free(dp->apart);
}

/* A call per run of the part's elements, in order: the runs between the
 * ranges held apart with the replicas' group, each range apart with its own
 * (one run, the whole part, when there are none). */
typedef void (*RunFn)(const DataParallel *dp, CommGroup *group, size_t first, size_t count, void *context);
static void for_each_run(const DataParallel *dp, RunFn fn, void *context) {
    size_t at = 0;
    for (int i = 0; i < dp->apart_count; i++) {
        if (dp->apart[i].lo > at) fn(dp, dp->group, at, dp->apart[i].lo - at, context);
        fn(dp, dp->apart_group, dp->apart[i].lo, dp->apart[i].hi - dp->apart[i].lo, context);
        at = dp->apart[i].hi;
    }
    if (dp->part->param_count > at) fn(dp, dp->group, at, dp->part->param_count - at, context);
}
/* The group that holds element e of the part. */
static CommGroup *holders_of(const DataParallel *dp, size_t e) {
    for (int i = 0; i < dp->apart_count; i++)
        if (e >= dp->apart[i].lo && e < dp->apart[i].hi) return dp->apart_group;
    return dp->group;
}

void data_parallel_begin_step(DataParallel *dp) {
    if (dp->ops) dp->ops->begin_step(dp->owner);
    if (dp->overlap) buckets_begin_step(&dp->buckets);
}

/* The backward pass finished `layer`: launch the buckets now complete. */
static void layer_done(int layer, void *data_parallel) {
    DataParallel *dp = data_parallel;
    buckets_layer_done(layer, &dp->buckets);
}

UnitHook data_parallel_backward_hook(const DataParallel *dp, int last_micro) {
    return dp->overlap && last_micro ? layer_done : NULL; /* (taken over: overlap 0) */
}

/* Elements [first, first + count) of the part's gradients, summed over the
 * ranks of group that hold them (the replicas', or data_parallel_hold_apart's). */
static void allreduce_sum(const DataParallel *dp, CommGroup *group, size_t first, size_t count,
                          void *context) {
    (void)context;
    char *buf = dp->grads + first * comm_dtype_bytes(dp->type);
    if (comm_size(group) == 1) return; /* held by this rank alone */
    if (use_ring(dp))
        ring_allreduce_typed(group, buf, count, dp->type, COMM_SUM);
    else
        comm_allreduce_typed(group, buf, count, dp->type, COMM_SUM, NULL);
}

/* naive: one all-reduce per named tensor of the part, after the whole backward pass (a
 * pipeline stage's chunks are several runs of units: gpt_held_offset says where each is) */
static void sync_naive(const DataParallel *dp) {
    const GPT *m = dp->part;
    for (int k = 0; k < m->num_tensors; k++) {
        const ParamTensor *t = &m->tensors[k];
        size_t at = gpt_held_offset(m, t);
        if (at != SIZE_MAX) allreduce_sum(dp, holders_of(dp, at), at, t->numel, NULL);
    }
}

/* flat: the part's gradients are one contiguous buffer, so one all-reduce does it all (one per
 * run where ranges are held apart) */
static void sync_flat(const DataParallel *dp) {
    for_each_run(dp, allreduce_sum, NULL);
}
/* overlap: the ranges held apart, which no bucket holds, after the buckets */
static void sync_apart(const DataParallel *dp) {
    for (int i = 0; i < dp->apart_count; i++)
        allreduce_sum(dp, dp->apart_group, dp->apart[i].lo, dp->apart[i].hi - dp->apart[i].lo, NULL);
}

double data_parallel_sum_gradients(DataParallel *dp, double *busy_ms) {
    if (dp->ops) return dp->ops->sum_gradients(dp->owner, busy_ms);
    if (dp->planted) comm_allreduce(dp->group, dp->planted, dp->planted_count, COMM_SUM);
    Timer timer = {0};
    if (dp->overlap) { /* waited: what the worker had left after the backward pass */
        double waited_ms = buckets_wait(&dp->buckets);
        *busy_ms = dp->buckets.busy_ms;
        if (!dp->apart_count) return waited_ms;
        timer_start(&timer);
        sync_apart(dp);
        double apart_ms = timer_stop_ms(&timer);
        *busy_ms += apart_ms;
        return waited_ms + apart_ms;
    }
    timer_start(&timer);
    if (strcmp(dp->flags->dp_mode, "naive") == 0)
        sync_naive(dp);
    else
        sync_flat(dp);
    return *busy_ms = timer_stop_ms(&timer);
}

/* The hash of the elements a group holds alike (the replicas': all but the
 * ranges apart; a range apart's group: those ranges), compared over it. */
typedef struct {
    const uint32_t *words;
    CommGroup *group;
    uint64_t hash;
} ReplicaHash;
static void hash_run(const DataParallel *dp, CommGroup *group, size_t first, size_t count, void *context) {
    (void)dp;
    ReplicaHash *h = context;
    if (group != h->group) return;
    for (size_t i = first; i < first + count; i++) h->hash = hash64(h->hash ^ h->words[i]);
}
static void compare_replicas(const DataParallel *dp, const uint32_t *words, CommGroup *group, int step) {
    ReplicaHash h = {words, group, 0};
    for_each_run(dp, hash_run, &h);
    uint64_t mine[2] = {h.hash, (uint64_t)comm_rank(comm_world())}; /* the hash, and who holds it */
    int replicas = comm_size(group);
    uint64_t *all = xcalloc(2 * (size_t)replicas, sizeof(uint64_t));
    comm_gather_bytes(group, mine, sizeof mine, all, 0);
    int first_bad = -1;
    for (int r = 1; r < replicas && comm_rank(group) == 0; r++)
        if (all[2 * r] != all[0] && first_bad < 0) first_bad = r;
    if (first_bad >= 0)
        fatal(EXIT_RUNTIME, "replica check at step %d: rank %d's parameters differ from rank %d's", step,
              (int)all[2 * first_bad + 1], (int)all[1]);
    free(all);
    comm_barrier(group);
}

void data_parallel_check_replicas(const DataParallel *dp, const float *params, int step) {
    if (dp->ops) return;
    size_t n = dp->part->param_count;
    float *host = xmalloc(n * sizeof(float));
    copy_to_host(host, params, n * sizeof(float));
    if (fault_replica_rank() == comm_rank(comm_world())) host[0] += 1.0f;
    compare_replicas(dp, (const uint32_t *)host, dp->group, step); /* what every replica holds */
    if (dp->apart_count) compare_replicas(dp, (const uint32_t *)host, dp->apart_group, step); /* and apart */
    free(host);
}

/* A run of the weights from the group's rank 0 (the master and 16-bit ones, or fp32). */
static void broadcast_run(const DataParallel *dp, CommGroup *group, size_t first, size_t count,
                          void *context) {
    const MixedModel *mixed = context;
    if (mixed->params) {
        comm_broadcast(group, mixed->master + first, count, 0);
        comm_broadcast_typed(group, (char *)mixed->params + first * comm_dtype_bytes(dp->type), count,
                             dp->type, 0, NULL);
    } else {
        comm_broadcast(group, dp->part->params + first, count, 0);
    }
}

void data_parallel_broadcast_weights(const DataParallel *dp, const MixedModel *mixed) {
    if (dp->ops) return;
    for_each_run(dp, broadcast_run, (void *)mixed);
}

void data_parallel_print(const DataParallel *dp) {
    if (dp->ops) return;
    if (dp->overlap && dp->flags->print_buckets) buckets_print(&dp->buckets);
}
