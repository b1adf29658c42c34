/* 02_data_parallel/train.c: data parallelism.
 *
 * Chapter 01's loop, on N ranks (mpirun -np N). Every rank holds the whole
 * model; the global batch is split so that rank r trains on sequences
 * [r*B/N, (r+1)*B/N) of it. Because the loss is the mean over every token of
 * the global batch, the ranks' gradients only need to be SUMMED to give
 * exactly the single-device gradient: one all-reduce, after which every rank
 * takes the same AdamW step and the replicas stay identical. The times logged
 * are the slowest rank's.
 *
 *   for each micro-batch:  data -> forward -> backward (gradients accumulate)
 *   all-reduce the gradients (--dp-mode naive | flat | overlap)
 *   gradient norm -> clip -> AdamW update -> log
 *
 * The all-reduce is the library's (MPI, NCCL) or the course's own ring
 * (--allreduce ring, ring.c); data_parallel.c holds the three modes, the
 * replica check and the broadcast, which every later chapter keeps. With
 * --precision bf16|fp16 (mixed.h) the gradients are 16 bits and so is their
 * all-reduce, either one: half the bytes; an fp16 overflow on any rank is in
 * every replica's sum, so all of them skip that step together. */
#include "common/comm/comm.h" /* collectives and messages between ranks */
#include "common/run/config.h" /* Config and the flag tables */
#include "02_data_parallel/data_parallel.h" /* 02: data parallelism */
#include "common/device/device.h" /* mem_alloc, copies, streams, timers */
#include "common/run/evaluate.h" /* validation loss and sampling */
#include "common/comm/grid.h" /* the process grid: dp x pp x cp x tp */
#include "common/run/harness.h" /* the run around the training loop */
#include "common/kernels/kernels.h" /* ops(): the kernel table */
#include "common/model/mixed.h" /* mixed precision: 16-bit weights, loss scaling */
#include "common/model/model.h" /* GPT, its forward and backward */
#include "common/model/optim.h" /* AdamW and the learning-rate schedule */
#include "common/model/optimizer_step.h" /* the optimizer step: norm, clip, skip, AdamW */
#include "common/core/util.h" /* fatal, log_info, exit codes, flag parsing */

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PROGRAM "02_data_parallel/train"

/* ---- the flags: the row sets this program takes, each with its technique's checks (config.h) ---- */
typedef struct {
    DataParallelFlags data;   /* --dp-mode, --allreduce, --bucket-mb, ... (data_parallel.h) */
} Flags;
static const Flag flag_rows[] = {
    FLAG_ROWS_AT(Flags, data, data_parallel_flags),
    {0},
};
static void check_flags(const Config *cfg, const void *values) {
    const Flags *f = values;
    data_parallel_check_flags(cfg, &f->data);
}

/* What the run harness (harness.h) needs to know of this program: its
 * flags, its steps.csv columns (a chapter keeps the columns of the one
 * before it and adds its own), and what else it reports. */
static const RunSpec spec = {
    .program = PROGRAM,
    .summary = "Train a GPT with data parallelism: N replicas, gradients all-reduced.",
    .flags = {.flags = flag_rows, .check = check_flags, .multi_rank = 1},
    .comm_busy = 1,
    .axis_bytes = 1,
    .experts = 1,
};

int main(int argc, char **argv) {
    Config cfg;
    Flags flags = {0};
    DataParallelFlags *dp = &flags.data;
    Run run; /* start-up, logs, evaluation, saves and the summary: harness.h */
    run_start_ranks(&run, &cfg, &argc, &argv, &spec, &flags, &flags.data.ranks);
    int rank = run.rank, ranks = run.ranks;
    ProcessGrid grid; /* every rank a replica: dp = world (grid.h); grid.d is this replica */
    grid_create(&grid, run.world, (GridShape){.dp = ranks, .pp = 1, .cp = 1, .tp = 1});
    int half = cfg.precision != PRECISION_FP32; /* 16-bit storage and communication (mixed.h) */

    /* ---- build: device, data, output files (the harness); model, optimizer, activations ---- */
    run_prepare(&run);
    GPT model;
    MixedModel mixed; /* bf16, fp16: the model in 16 bits (mixed.h) */
    precision_create_range(&model, &mixed, &cfg.model, cfg.seed, cfg.precision, LAYER_EMBEDDING,
                           cfg.model.layers);
    AdamW opt;
    adamw_create(&opt, model.num_params);
    int per_rank = cfg.batch / grid.dp; /* this replica's share of the global batch */
    int B = per_rank / cfg.micro, T = cfg.model.seq;
    Activations acts;
    activations_create_model(&acts, &cfg.model, B, T, cfg.recompute);
    Scratch scratch;
    scratch_create(&scratch, &cfg.model, B, T, cfg.recompute);
    DataParallel replicas; /* the sum over the replicas of what this rank holds (data_parallel.h) */
    data_parallel_create(&replicas, dp, grid.dp_group, &model, &mixed, cfg.precision);

    ckpt_layout_init(&run.ckpt, "%s: %d ranks, dp %d", PROGRAM, ranks,
                     grid.dp); /* replica d writes share d */
    ckpt_layout_range(&run.ckpt, &model, &opt, grid.d, grid.dp);
    if (run_resume(&run, &opt.t) && half) mixed_weights_from_master(&mixed); /* the checkpoint: fp32 */
    data_parallel_broadcast_weights(&replicas, &mixed);

    log_info(
        "%s | %d ranks | device %s | comm %s | dp-mode %s | all-reduce %s | %zu parameters | batch %d = %d "
        "replicas x %d micro-batches x %d sequences | %s\n",
        PROGRAM, ranks, device_name(), comm_transport_name(), dp->dp_mode, dp->allreduce, model.num_params,
        cfg.batch, grid.dp, cfg.micro, B, precision_name(cfg.precision));
    if (replicas.overlap)
        log_info("overlap: %d gradient buckets of about %.2f MiB\n", replicas.buckets.count, dp->bucket_mb);
    log_resumed(&cfg, run.first_step);

    for (int step = run.first_step; step < run.last_step; step++) {
        RunStep s = run_step_begin(&run, step);
        Timer timer = {0};

        /* ---- forward and backward over the micro-batches; gradients accumulate ---- */
        precision_zero_grads(&model, &mixed);
        data_parallel_begin_step(&replicas);
        acts.moe.stats = (MoeStats){0}; /* --experts: what this step's forwards route (moe.h) */
        double loss_sum = 0.0;
        for (int mb = 0; mb < cfg.micro; mb++) {
            int first_sequence = grid.d * per_rank + mb * B; /* where this piece sits in the global batch */
            data_upload_batch(&run.data, SPLIT_TRAIN, cfg.seed, step, first_sequence, B, T, acts.tokens,
                              acts.targets);

            timer_start(&timer);
            gpt_forward(&model, &acts, &scratch, B, T);
            loss_sum += gpt_loss_sum(&acts, B, T);
            s.rec.fwd_ms += timer_stop_ms(&timer);

            timer_start(&timer);
            /* overlap: buckets start all-reducing during the LAST micro-batch's backward */
            UnitHook launch = data_parallel_backward_hook(&replicas, mb == cfg.micro - 1);
            gpt_backward_hooked(&model, &acts, &scratch, run.dloss * s.loss_scale, B, T, launch, &replicas);
            s.rec.bwd_ms += timer_stop_ms(&timer);
        }

        /* ---- communicate: sum the gradients (and the loss) over the replicas ---- */
        s.rec.comm_ms = data_parallel_sum_gradients(&replicas, &s.comm_busy_ms);
        s.rec.loss = comm_allreduce_double(grid.dp_group, loss_sum, 0) / run.tokens_per_step;
        s.moe = acts.moe.stats;
        check_loss_finite(s.rec.loss, step + 1);

        /* ---- update: clip the global gradient norm, then AdamW (fp16: unless it overflowed) ---- */
        timer_start(&timer);
        OptimHyper hyper = optim_hyper(&cfg, step); /* lr_at_step's rate, betas, eps, wd, clip */
        s.rec.lr = hyper.lr;
        GradShards held = precision_grad_shards(&model, &mixed); /* this process holds the whole gradient */
        s.skipped =
            optimizer_step(&model, &mixed, &opt, &run.scaler, &held, &hyper, step + 1, &s.rec.grad_norm);
        s.rec.opt_ms = timer_stop_ms(&timer);

        /* ---- log: evaluation when due, the progress line, steps.csv, a due checkpoint ---- */
        int evaluate = run_step_done(&run, &s);
        if (dp->check_replicas && (step + 1) % dp->check_replicas == 0)
            data_parallel_check_replicas(&replicas, half ? mixed.master : model.params, step + 1);
        if (evaluate && rank == 0) s.rec.val_loss = evaluate_loss(&model, &acts, &scratch, &run.data, &cfg);
        run_step_log(&run, &s);
    }
    if (rank == 0 && cfg.sample > 0) sample_text(&model, &acts, &scratch, &run.data, cfg.sample, &run.rng);

    /* ---- run summary and memory: every rank's peaks, gathered on rank 0 ---- */
    run_layout(&run, grid.dp, 1, 1, 0);
    run_finish(&run, model.num_params, NULL, NULL, "%.1f MiB sent per rank | CSVs in %s",
               comm_bytes_sent() / BYTES_PER_MIB, cfg.out);

    data_parallel_print(&replicas);
    data_parallel_destroy(&replicas);
    scratch_destroy(&scratch);
    activations_destroy(&acts, &cfg.model);
    adamw_destroy(&opt);
    precision_destroy(&model, &mixed);
    grid_destroy(&grid);
    run_end(&run);
    return 0;
}
