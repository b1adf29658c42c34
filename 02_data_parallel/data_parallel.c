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
                       group, use_ring(dp));
    if ((dp->planted_count = (size_t)fault_plant_bytes() / sizeof(float)))
        dp->planted = mem_alloc(SPACE_DEVICE, CAT_COMM, dp->planted_count * sizeof(float), "planted by a test");
}

void data_parallel_destroy(DataParallel *dp) {
    if (dp->overlap) buckets_destroy(&dp->buckets);
    mem_free(dp->planted);
}

void data_parallel_begin_step(DataParallel *dp) {
    if (dp->overlap) buckets_begin_step(&dp->buckets);
}

/* The backward pass finished `layer`: launch the buckets now complete. */
static void layer_done(int layer, void *data_parallel) {
    DataParallel *dp = data_parallel;
    buckets_layer_done(layer, &dp->buckets);
}

UnitHook data_parallel_backward_hook(const DataParallel *dp, int last_micro) {
    return dp->overlap && last_micro ? layer_done : NULL;
}

/* Elements [first, first + count) of the part's gradients, summed over the replicas. */
static void allreduce_sum(const DataParallel *dp, size_t first, size_t count) {
    char *buf = dp->grads + first * comm_dtype_bytes(dp->type);
    if (use_ring(dp))
        ring_allreduce_typed(dp->group, buf, count, dp->type, COMM_SUM);
    else
        comm_allreduce_typed(dp->group, buf, count, dp->type, COMM_SUM, NULL);
}

/* naive: one all-reduce per named tensor of the part, after the whole backward pass (a
 * pipeline stage's chunks are several runs of units: unit_at says where each starts) */
static void sync_naive(const DataParallel *dp) {
    const GPT *m = dp->part;
    for (int k = 0; k < m->num_tensors; k++) {
        const ParamTensor *t = &m->tensors[k];
        if (!m->unit_at && (t->layer < m->first_unit || t->layer > m->last_unit)) continue;
        if (!m->unit_at) {
            allreduce_sum(dp, t->offset - m->param_first, t->numel);
        } else if (m->unit_at[t->layer + 1] != SIZE_MAX) { /* a unit of this stage's chunks */
            allreduce_sum(dp, m->unit_at[t->layer + 1] + t->offset - table_unit(&m->table, t->layer)->offset,
                          t->numel);
        }
    }
}

/* flat: the part's gradients are one contiguous buffer, so one all-reduce does it all */
static void sync_flat(const DataParallel *dp) {
    allreduce_sum(dp, 0, dp->part->param_count);
}

double data_parallel_sum_gradients(DataParallel *dp, double *busy_ms) {
    if (dp->planted) comm_allreduce(dp->group, dp->planted, dp->planted_count, COMM_SUM);
    if (dp->overlap) { /* waited: what the worker had left after the backward pass */
        double waited_ms = buckets_wait(&dp->buckets);
        *busy_ms = dp->buckets.busy_ms;
        return waited_ms;
    }
    Timer timer = {0};
    timer_start(&timer);
    if (strcmp(dp->flags->dp_mode, "naive") == 0)
        sync_naive(dp);
    else
        sync_flat(dp);
    return *busy_ms = timer_stop_ms(&timer);
}

void data_parallel_check_replicas(const DataParallel *dp, const float *params, int step) {
    size_t n = dp->part->param_count;
    float *host = xmalloc(n * sizeof(float));
    copy_to_host(host, params, n * sizeof(float));
    if (fault_replica_rank() == comm_rank(comm_world())) host[0] += 1.0f;
    uint64_t mine[2] = {0, (uint64_t)comm_rank(comm_world())}; /* the hash, and who holds it */
    const uint32_t *words = (const uint32_t *)host;
    for (size_t i = 0; i < n; i++) mine[0] = hash64(mine[0] ^ words[i]);
    free(host);
    int replicas = comm_size(dp->group);
    uint64_t *all = xcalloc(2 * (size_t)replicas, sizeof(uint64_t));
    comm_gather_bytes(dp->group, mine, sizeof mine, all, 0);
    int first_bad = -1;
    for (int r = 1; r < replicas && comm_rank(dp->group) == 0; r++)
        if (all[2 * r] != all[0] && first_bad < 0) first_bad = r;
    if (first_bad >= 0)
        fatal(EXIT_RUNTIME, "replica check at step %d: rank %d's parameters differ from rank %d's", step,
              (int)all[2 * first_bad + 1], (int)all[1]);
    free(all);
    comm_barrier(dp->group);
}

void data_parallel_broadcast_weights(const DataParallel *dp, const MixedModel *mixed) {
    if (mixed->params) {
        comm_broadcast(dp->group, mixed->master, mixed->n, 0);
        comm_broadcast_typed(dp->group, mixed->params, mixed->n, dp->type, 0, NULL);
    } else {
        comm_broadcast(dp->group, dp->part->params, dp->part->param_count, 0);
    }
}

void data_parallel_print(const DataParallel *dp) {
    if (dp->overlap && dp->flags->print_buckets) buckets_print(&dp->buckets);
}
