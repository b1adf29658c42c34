/* 02_data_parallel/train.c: data parallelism.
 *
 * Chapter 01's loop, on N ranks (mpirun -np N). Every rank holds the whole
 * model; the global batch is split so that rank r trains on sequences
 * [r*B/N, (r+1)*B/N) of it. Because the loss is the mean over every token of
 * the global batch, the ranks' gradients only need to be SUMMED to give
 * exactly the single-device gradient: one all-reduce, after which every rank
 * takes the same AdamW step and the replicas stay identical.
 *
 *   for each micro-batch of this rank's share:  data -> forward -> backward
 *   all-reduce the gradients (--dp-mode naive | flat | overlap)
 *   gradient norm -> clip -> AdamW update -> log (slowest rank's times)
 *
 * The all-reduce is the library's (MPI, NCCL) or the course's own ring
 * (--allreduce ring, common/ring.c). With --precision bf16|fp16 (mixed.h)
 * the gradients are 16 bits and so is their all-reduce, either one: half
 * the bytes. */
#include "buckets.h"
#include "comm.h"
#include "config.h"
#include "device.h"
#include "evaluate.h"
#include "grid.h"
#include "harness.h"
#include "kernels.h"
#include "mixed.h"
#include "model.h"
#include "optim.h"
#include "optimizer_step.h"
#include "ring.h"
#include "util.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PROGRAM "02_data_parallel/train"

/* ---- this chapter's flags ---- */
typedef struct {
    char dp_mode[8];    /* naive, flat, overlap */
    double bucket_mb;   /* overlap: bucket size */
    char allreduce[8];  /* ring, library */
    int check_replicas; /* every N steps, 0 = never */
    int print_buckets;  /* overlap: print the buckets after the run */
    int ranks;          /* the world size, for the checks */
} DataParallelFlags;

/* --help's section and one row per flag (config.h says how to add one) */
static const Flag dp_flags[] = {
    {.type = FLAG_SECTION, .help = "data parallel (run with mpirun -np N; every rank holds the whole model)"},
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

/* The batch must split evenly over the ranks and their micro-batches. */
static void check_dp_layout(const Config *cfg, const void *values) {
    const DataParallelFlags *f = values;
    if (f->ranks > cfg->batch)
        fatal(EXIT_USAGE,
              "%d ranks but a global batch of %d sequences: every rank needs at least one "
              "(valid: --batch >= ranks)",
              f->ranks, cfg->batch);
    if (cfg->batch % (f->ranks * cfg->micro) != 0)
        fatal(EXIT_USAGE, "--batch %d is not divisible by %d ranks x --micro %d (valid: a multiple of %d)",
              cfg->batch, f->ranks, cfg->micro, f->ranks * cfg->micro);
}

/* What the run harness (harness.h) needs to know of this program: its
 * flags, and one steps.csv column of its own, comm_busy_ms. */
static const RunSpec spec = {.program = PROGRAM,
                             .summary =
                                 "Train a GPT with data parallelism: N replicas, gradients all-reduced.",
                             .flags = {.flags = dp_flags, .check = check_dp_layout, .multi_rank = 1},
                             .comm_busy = 1};

/* ---- gradient synchronisation ---- */

/* The gradients, of `type`: the model's (fp32), or the 16-bit ones of mixed precision. */
typedef struct {
    char *grads;
    CommDtype type;
} GradBuffer;

static void allreduce_sum(CommGroup *g, const GradBuffer *b, size_t first, size_t count, int use_ring) {
    char *buf = b->grads + first * comm_dtype_bytes(b->type);
    if (use_ring)
        ring_allreduce_typed(g, buf, count, b->type, COMM_SUM);
    else
        comm_allreduce_typed(g, buf, count, b->type, COMM_SUM, NULL);
}

/* naive: one all-reduce per named tensor, after the whole backward pass */
static void sync_naive(const GPT *model, const GradBuffer *b, CommGroup *g, int use_ring) {
    for (int k = 0; k < model->num_tensors; k++)
        allreduce_sum(g, b, model->tensors[k].offset, model->tensors[k].numel, use_ring);
}

/* flat: the gradients are one contiguous buffer, so one all-reduce does it all */
static void sync_flat(const GPT *model, const GradBuffer *b, CommGroup *g, int use_ring) {
    allreduce_sum(g, b, 0, model->num_params, use_ring);
}

/* The gradients summed over the replicas: all-reduced now (naive, flat), or
 * waited for (overlap: the buckets all-reduced during the backward pass).
 * Returns how long this rank waited; *busy_ms: how long the all-reduces ran. */
static double sum_gradients(const DataParallelFlags *dp, const GPT *model, const GradBuffer *grads,
                            BucketSync *buckets, CommGroup *world, double *busy_ms) {
    if (buckets) { /* waited: what the worker had left after the backward pass */
        double waited_ms = buckets_wait(buckets);
        *busy_ms = buckets->busy_ms;
        return waited_ms;
    }
    Timer timer = {0};
    timer_start(&timer);
    int use_ring = strcmp(dp->allreduce, "ring") == 0;
    if (strcmp(dp->dp_mode, "naive") == 0)
        sync_naive(model, grads, world, use_ring);
    else
        sync_flat(model, grads, world, use_ring);
    return *busy_ms = timer_stop_ms(&timer);
}

/* Every replica must hold the same parameters (in mixed precision: the same
 * master weights): compare a hash of their bytes. (For testing this check:
 * COURSE_FAULT_REPLICA_RANK=r changes one weight on rank r first.) */
static void check_replicas(const GPT *model, const float *params, CommGroup *world, int step) {
    float *host = xmalloc(model->num_params * sizeof(float));
    copy_to_host(host, params, model->num_params * sizeof(float));
    if (fault_replica_rank() == comm_rank(world)) host[0] += 1.0f;
    uint64_t hash = 0;
    const uint32_t *words = (const uint32_t *)host;
    for (size_t i = 0; i < model->num_params; i++) hash = hash64(hash ^ words[i]);
    free(host);
    int n = comm_size(world);
    uint64_t *all = xcalloc(n, sizeof(uint64_t));
    comm_gather_bytes(world, &hash, sizeof hash, all, 0);
    int first_bad = -1;
    for (int r = 1; r < n && comm_rank(world) == 0; r++)
        if (all[r] != all[0] && first_bad < 0) first_bad = r;
    free(all);
    if (first_bad >= 0)
        fatal(EXIT_RUNTIME, "replica check at step %d: rank %d's parameters differ from rank 0's", step,
              first_bad);
    comm_barrier(world);
}

/* Identical initialisation already follows from (seed, name, index); the
 * broadcast makes "rank 0's weights" the rule, as real frameworks do. */
static void broadcast_weights(const GPT *model, const MixedModel *mixed, CommGroup *world, CommDtype type) {
    if (mixed->params) {
        comm_broadcast(world, mixed->master, mixed->n, 0);
        comm_broadcast_typed(world, mixed->params, mixed->n, type, 0, NULL);
    } else {
        comm_broadcast(world, model->params, model->num_params, 0);
    }
}

int main(int argc, char **argv) {
    Config cfg;
    DataParallelFlags dp = {0};
    Run run; /* start-up, logs, evaluation, saves and the summary: harness.h */
    run_start_ranks(&run, &cfg, &argc, &argv, &spec, &dp, &dp.ranks);
    int overlap = strcmp(dp.dp_mode, "overlap") == 0; /* else naive or flat (sum_gradients) */
    int rank = run.rank, ranks = run.ranks;
    ProcessGrid grid; /* every rank a replica: dp = world (grid.h) */
    grid_create(&grid, run.world, (GridShape){.dp = ranks, .pp = 1, .cp = 1, .tp = 1});
    int half = cfg.precision != PRECISION_FP32; /* 16-bit storage and communication (mixed.h) */

    /* ---- build: device, data, output files (the harness); model, optimizer, activations ---- */
    run_prepare(&run);
    GPT model;
    MixedModel mixed; /* bf16, fp16: the model in 16 bits (mixed.h) */
    precision_create_range(&model, &mixed, &cfg.model, cfg.seed, cfg.precision, LAYER_EMBEDDING,
                           cfg.model.layers);
    GradBuffer grads = {precision_grads(&model, &mixed), comm_dtype_of(cfg.precision)};
    AdamW opt;
    adamw_create(&opt, model.num_params);
    int per_rank = cfg.batch / ranks; /* this rank's share of the global batch */
    int B = per_rank / cfg.micro, T = cfg.model.seq;
    Activations acts;
    activations_create_model(&acts, &cfg.model, B, T, cfg.recompute);
    Scratch scratch;
    scratch_create(&scratch, &cfg.model, B, T, cfg.recompute);
    BucketSync buckets;
    if (overlap)
        buckets_create(&buckets, &model, grads.grads, grads.type, (size_t)(dp.bucket_mb * BYTES_PER_MIB),
                       grid.dp_group, strcmp(dp.allreduce, "ring") == 0);

    ckpt_layout_init(&run.ckpt, "%s: %d ranks, dp %d", PROGRAM, ranks, ranks); /* rank r writes share r */
    ckpt_layout_range(&run.ckpt, &model, &opt, rank, ranks);
    if (run_resume(&run, &opt.t) && half) mixed_weights_from_master(&mixed); /* the checkpoint: fp32 */
    broadcast_weights(&model, &mixed, grid.dp_group, grads.type);

    log_info(
        "%s | %d ranks | device %s | comm %s | dp-mode %s | all-reduce %s | %zu parameters | batch %d = %d "
        "ranks x %d micro-batches x %d sequences | %s\n",
        PROGRAM, ranks, device_name(), comm_transport_name(), dp.dp_mode, dp.allreduce, model.num_params,
        cfg.batch, ranks, cfg.micro, B, precision_name(cfg.precision));
    if (overlap) log_info("overlap: %d gradient buckets of about %.2f MiB\n", buckets.count, dp.bucket_mb);
    log_resumed(&cfg, run.first_step);

    for (int step = run.first_step; step < run.last_step; step++) {
        RunStep s = run_step_begin(&run, step);
        Timer timer = {0};

        /* ---- forward and backward over this rank's micro-batches ---- */
        precision_zero_grads(&model, &mixed);
        if (overlap) buckets_begin_step(&buckets);
        double loss_sum = 0.0;
        for (int mb = 0; mb < cfg.micro; mb++) {
            int first_sequence = rank * per_rank + mb * B; /* where this piece sits in the global batch */
            data_upload_batch(&run.data, SPLIT_TRAIN, cfg.seed, step, first_sequence, B, T, acts.tokens,
                              acts.targets);

            timer_start(&timer);
            gpt_forward(&model, &acts, &scratch, B, T);
            loss_sum += gpt_loss_sum(&acts, B, T);
            s.rec.fwd_ms += timer_stop_ms(&timer);

            timer_start(&timer);
            /* overlap: buckets start all-reducing during the LAST micro-batch's backward */
            int last_micro = mb == cfg.micro - 1;
            gpt_backward_hooked(&model, &acts, &scratch, run.dloss * s.loss_scale, B, T,
                                overlap && last_micro ? buckets_layer_done : NULL, &buckets);
            s.rec.bwd_ms += timer_stop_ms(&timer);
        }

        /* ---- communicate: sum the gradients (and the loss) over the replicas ---- */
        s.rec.comm_ms =
            sum_gradients(&dp, &model, &grads, overlap ? &buckets : NULL, grid.dp_group, &s.comm_busy_ms);
        s.rec.loss = comm_allreduce_double(grid.dp_group, loss_sum, 0) / run.tokens_per_step;
        check_loss_finite(s.rec.loss, step + 1);

        /* ---- update: the same on every replica (an fp16 overflow anywhere is in every sum) ---- */
        timer_start(&timer);
        OptimHyper hyper = optim_hyper(&cfg, step); /* lr_at_step's rate, betas, eps, wd, clip */
        s.rec.lr = hyper.lr;
        mixed_fault_overflow(&mixed, step + 1); /* tests: an overflow where COURSE_FAULT_OVERFLOW_* say */
        GradShards held = precision_grad_shards(&model, &mixed); /* every replica: the whole sum */
        s.skipped =
            optimizer_step(&model, &mixed, &opt, &run.scaler, &held, &hyper, step + 1, &s.rec.grad_norm);
        s.rec.opt_ms = timer_stop_ms(&timer);

        /* ---- log: the slowest rank's times; rank 0 evaluates ---- */
        int evaluate = run_step_done(&run, &s);
        if (dp.check_replicas && (step + 1) % dp.check_replicas == 0)
            check_replicas(&model, half ? mixed.master : model.params, grid.dp_group, step + 1);
        if (evaluate && rank == 0) s.rec.val_loss = evaluate_loss(&model, &acts, &scratch, &run.data, &cfg);
        run_step_log(&run, &s);
    }
    if (rank == 0 && cfg.sample > 0) sample_text(&model, &acts, &scratch, &run.data, cfg.sample, &run.rng);

    /* ---- run summary and memory: every rank's peaks, gathered on rank 0 ---- */
    run_layout(&run, ranks, 1, 1, 0);
    run_finish(&run, model.num_params, NULL, NULL, "%.1f MiB sent per rank | CSVs in %s",
               comm_bytes_sent() / BYTES_PER_MIB, cfg.out);

    if (overlap && dp.print_buckets) buckets_print(&buckets);
    if (overlap) buckets_destroy(&buckets);
    scratch_destroy(&scratch);
    activations_destroy(&acts, &cfg.model);
    adamw_destroy(&opt);
    precision_destroy(&model, &mixed);
    grid_destroy(&grid);
    run_end(&run);
    return 0;
}
