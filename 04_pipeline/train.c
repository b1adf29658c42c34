/* 04_pipeline/train.c: pipeline parallelism, GPipe and 1F1B, in a 3D layout.
 *
 * Chapter 03's layer split, but the global batch no longer goes through the
 * stages in one piece: each replica's share is cut into M micro-batches that
 * flow through the P stages like an assembly line, so that stage s works on
 * micro-batch m while stage s+1 works on micro-batch m-1. What each stage
 * does, in which order, is an explicit list of actions (schedule.c):
 *
 *   --schedule gpipe   all forwards, then all backwards
 *   --schedule 1f1b    warm-up forwards, then one forward one backward, then
 *                      the remaining backwards (PipeDream-flush)
 *
 * and one interpreter (run_action, pipeline.c) executes any such list.
 * Gradients accumulate over the micro-batches; one optimizer step per global
 * batch, exactly as in chapter 01.
 *
 * Everything of chapter 03 stays: --tp T slices each stage's blocks over T
 * ranks (tensor_parallel.h), --cp N splits each sequence over N ranks of the
 * stage (context_parallel.h), and the ranks holding the same part of the
 * model are replicas whose gradients chapter 02's machinery sums
 * (data_parallel.h). The world is pp x cp x tp x dp (grid.h: tp fastest,
 * then cp, pp, dp), as in Megatron; dp follows from the rank count.
 *
 *   for each action of this stage's schedule:  forward m | backward m | messages
 *   all-reduce the gradients over the data-parallel group (--dp-mode naive | flat;
 *       overlap: each bucket as soon as its units' last backward of the step is done)
 *   gradient norm (summed over the stages and slices) -> clip -> AdamW -> log
 *
 * Every action is timed (timeline.csv, trace.json); the idle time of the
 * stages is the pipeline bubble, reported next to the formula (P-1)/(M+P-1).
 *
 * --precision bf16|fp16 (mixed.h): each stage keeps its units in 16 bits
 * with fp32 master weights, and the replicas all-reduce 16-bit gradients.
 * The messages between stages carry activations and their gradients, fp32
 * in every precision (the residual stream is fp32: mixed.h). An fp16
 * overflow on any rank skips the step on every rank. */
#include "comm.h"
#include "config.h"
#include "data_parallel.h"
#include "device.h"
#include "evaluate.h"
#include "grid.h"
#include "harness.h"
#include "layer_split.h"
#include "kernels.h"
#include "mixed.h"
#include "model.h"
#include "model_parallel.h"
#include "pipeline.h"
#include "pipeline_flags.h"
#include "schedule.h"
#include "optim.h"
#include "optimizer_step.h"
#include "util.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PROGRAM "04_pipeline/train"

/* ---- the flags: chapter 02's, chapter 03's (model_parallel.h), and this chapter's ---- */
typedef struct {
    DataParallelFlags data;   /* --dp-mode, --allreduce, --bucket-mb, --check-replicas, ... */
    ModelParallelFlags model; /* --mp, --split, --tp, --dp */
    PipelineFlags pipe;       /* --schedule, --pp, --print-schedule */
} Flags;

/* --help's section and one row per flag (config.h says how to add one) */
static const Flag pipeline_flags[] = {
    {.type = FLAG_ROWS, .offset = offsetof(Flags, data), .rows = data_parallel_flags},
    {.type = FLAG_ROWS, .offset = offsetof(Flags, model), .rows = model_parallel_flags},
    {.type = FLAG_SECTION,
     .help = "pipeline parallel (run with mpirun -np P*T*D; --micro M cuts each replica's batch into M "
             "micro-batches)"},
    {"--schedule", FLAG_CHOICE, FIELD(Flags, pipe.schedule), .choices = "gpipe|1f1b|interleaved|zb-h1",
     .noun = "schedule", .def = "1f1b", .usage = "--schedule gpipe|1f1b|interleaved|zb-h1",
     .help = "all forwards then all backwards, one-forward-one-backward (default {default}), or zero "
             "bubble (backward split into B and W), or interleaved (--virtual V chunks per stage)"},
    {"--virtual", FLAG_INT, FIELD(Flags, pipe.virtual_chunks), 1, 16, .def = "1", .usage = "--virtual V",
     .help = "chunks of layers per stage, for --schedule interleaved (default {default})"},
    {"--pp", FLAG_INT, FIELD(Flags, pipe.pp), 1, 256, .usage = "--pp P",
     .help = "pipeline stages, 1..layers (default: world size / (tp x dp)); with --pp,\n"
             "--dp defaults to world size / (pp x tp)"},
    {"--print-schedule", FLAG_SWITCH, FIELD(Flags, pipe.print_schedule), .usage = "--print-schedule",
     .help = "print every stage's list of actions and exit"},
    {0},
};

/* The layout is pp x cp x tp x dp. --mp tensor is chapter 03's tensor group:
 * one stage, tp = world / dp / cp. Else tp is --tp (default 1); with --pp
 * given, dp is the rest of the world unless --dp says it, and without it pp
 * is. The record holds the numbers, so that layouts written two ways agree. */
static void effective_pipeline_flags(const Config *cfg, void *values) {
    Flags *f = values;
    ModelParallelFlags *m = &f->model;
    if (strcmp(m->mp, "tensor") == 0) {
        model_parallel_effective_flags(m);
        if (!f->pipe.pp) f->pipe.pp = 1;
        return;
    }
    if (!m->tp) m->tp = 1;
    int cp_tp = m->cp * m->tp; /* the ranks of one stage */
    if (f->pipe.pp && !flag_given(cfg, "--dp") && m->ranks >= f->pipe.pp * cp_tp)
        m->dp = m->ranks / (f->pipe.pp * cp_tp);
    if (!f->pipe.pp) f->pipe.pp = m->ranks / (m->dp * cp_tp);
}

/* The layout: world = stages x tp x replicas, every stage a block, tp
 * slicing whole heads, every replica's share of the batch cut into whole
 * micro-batches. */
static void check_pipeline_layout(const Config *cfg, const void *values) {
    const Flags *f = values;
    pipeline_check_world(cfg, &f->pipe, &f->model);
    pipeline_check_batch(cfg, &f->pipe, &f->model);
}

/* What the run harness (harness.h) needs to know of this program: its
 * flags, steps.csv columns of its own, the fraction of the ranks' time spent
 * idle, the measured bubble and comm_busy_ms, and that every rank starts
 * each step together, the timeline's one time origin. */
static const RunColumn pipeline_columns[] = {{"idle_fraction", "%.4f"}, {"bubble", "%.4f"}, {0}};
static const RunSpec spec = {
    .program = PROGRAM,
    .summary =
        "Train a GPT with pipeline parallelism: micro-batches flow through a layer split (GPipe, 1F1B), "
        "with tensor and data parallelism (pp x tp x dp).",
    .flags = {.flags = pipeline_flags,
              .effective = effective_pipeline_flags,
              .check = check_pipeline_layout,
              .multi_rank = 1},
    .columns = pipeline_columns,
    .comm_busy = 1,
    .axis_bytes = 1, /* run.csv: every rank's bytes per step on each grid axis */
    .barrier_each_step = 1,
    .busy_csv = 1}; /* every rank's busy time (idle_fraction) */

int main(int argc, char **argv) {
    Config cfg;
    Flags flags = {0};
    DataParallelFlags *dp = &flags.data;
    Run run; /* start-up, logs, evaluation, saves and the summary: harness.h */
    run_start_ranks(&run, &cfg, &argc, &argv, &spec, &flags, &flags.model.ranks);
    int rank = run.rank;
    int P = flags.pipe.pp, V = flags.pipe.virtual_chunks, M = cfg.micro;
    ProcessGrid grid; /* --dp replicas of P stages of --tp ranks (grid.h: tp fastest, then pp, then dp) */
    grid_create(&grid, run.world,
                (GridShape){.dp = flags.model.dp, .pp = P, .cp = flags.model.cp, .tp = flags.model.tp});
    /* one replica's stages and slices (of one cp rank's positions) */
    CommGroup *model_group = comm_split(run.world, grid.d * grid.cp + grid.c, rank);
    TensorGroup tensor = {.group = grid.tp_group, .rank = grid.t, .size = grid.tp};
    int half = cfg.precision != PRECISION_FP32; /* 16-bit storage and communication (mixed.h) */

    /* ---- the split and the schedule ---- */
    int blocks[MAX_LAYERS]; /* blocks per piece (V > 1: P x V pieces): --split, or balanced (layer_split.h) */
    StageLayout layout = {.pp = grid.pp_group, .stage = grid.p, .stages = P, .cfg = &cfg};
    layer_split_stage(&cfg.model, flags.model.split, P * V, grid.p, blocks, &layout.first_block,
                      &layout.last_block, &layout.first_unit, &layout.last_unit);
    if (V > 1) pipeline_layout_chunks(&layout, blocks, V, cfg.model.layers); /* chunk c: piece c P + stage */
    if (flags.pipe.print_schedule) {
        if (rank == 0) schedule_print_all(flags.pipe.schedule, P, V, M);
        comm_group_free(model_group);
        grid_destroy(&grid);
        comm_finalize();
        return 0;
    }
    StageSchedule schedule;
    schedule_build_chunks(flags.pipe.schedule, P, V, M, grid.p, &schedule);

    /* ---- build: device, data, output files (the harness); this stage's part of the model, optimizer ---- */
    run_prepare(&run);
    int per_rank = cfg.batch / grid.dp; /* this replica's share of the global batch */
    layout.data = &run.data;
    layout.B = per_rank / M; /* sequences per micro-batch */
    layout.T = cfg.model.seq;
    layout.tensor = grid.tp > 1 ? &tensor : NULL;   /* tensor parallelism inside the stage */
    layout.cp = grid.cp > 1 ? grid.cp_group : NULL; /* and context parallelism: each sequence over cp ranks */
    layout.cp_order = flags.model.cp_order, layout.cp_send = flags.model.cp_send, layout.sp = flags.model.sp;
    Pipeline p; /* this stage: its units, activation slots, boundary buffers and schedule (pipeline.h) */
    pipeline_create(&p, &layout, &schedule, cfg.seed);
    GPT *held = &p.model;
    MixedModel *mixed = &p.mixed;
    size_t whole_params = layout.tensor ? p.tpm.global_params : held->num_params; /* the whole model's */
    AdamW opt;
    adamw_create(&opt, held->param_count); /* only the parameters this rank holds */
    DataParallel replicas; /* the sum over the replicas of what this rank holds (data_parallel.h) */
    data_parallel_create(&replicas, dp, grid.weight_group, held, mixed, cfg.precision); /* and over cp */
    p.unit_final =
        data_parallel_backward_hook(&replicas, 1); /* overlap: a bucket goes once its units are final */
    p.unit_final_context = &replicas;

    pipeline_ckpt_layout_init(&run.ckpt, PROGRAM, &grid, flags.pipe.schedule, NULL); /* replica d: share d */
    int replica = comm_rank(grid.weight_group); /* d x cp + c: the ranks holding the same weights */
    if (layout.tensor)
        tp_checkpoint_layout(&p.tpm, &opt, replica, &run.ckpt); /* this stage's slices */
    else
        ckpt_layout_range(&run.ckpt, held, &opt, replica, comm_size(grid.weight_group)); /* its units */
    if (run_resume(&run, &opt.t) && half) mixed_weights_from_master(mixed); /* the checkpoint: fp32 */
    data_parallel_broadcast_weights(&replicas, mixed);

    double bubble_theory = pipeline_log_layout(&p, PROGRAM, &grid, dp->dp_mode, dp->allreduce, whole_params,
                                               flags.pipe.schedule, blocks); /* and the formula's bubble */
    log_resumed(&cfg, run.first_step);

    double *bubbles = xcalloc(run.last_step, sizeof(double));
    for (int step = run.first_step; step < run.last_step; step++) {
        RunStep s = run_step_begin(&run, step); /* all ranks together: one time origin for the timeline */

        /* ---- the schedule: every micro-batch's forward and backward, and the messages ---- */
        data_parallel_begin_step(&replicas);
        pipeline_run_step(&p, step, grid.d * per_rank, run.dloss * s.loss_scale);
        bubbles[step] = s.columns[1] =
            pipeline_measure_bubble(&p.times, &grid, run.world); /* steps.csv's bubble */

        /* ---- communicate: sum the gradients over the replicas of this part, and the loss ---- */
        double comm_ms = p.times.comm_ms + data_parallel_sum_gradients(&replicas, &s.comm_busy_ms);
        s.rec.comm_ms = comm_ms;
        s.rec.loss = comm_allreduce_double(run.world, p.now.loss_sum, 0) / run.tokens_per_step;
        check_loss_finite(s.rec.loss, step + 1);

        /* ---- update: each rank its own parameters, clipped by the WHOLE model's norm
         * (fp16: unless the gradients overflowed on any rank) ---- */
        Timer timer = {0};
        timer_start(&timer);
        OptimHyper hyper = optim_hyper(&cfg, step); /* lr_at_step's rate, betas, eps, wd, clip */
        s.rec.lr = hyper.lr;
        GradShards held_part = pipeline_grad_shards(&p, model_group, run.world); /* units, or their slices */
        s.skipped =
            optimizer_step(held, mixed, &opt, &run.scaler, &held_part, &hyper, step + 1, &s.rec.grad_norm);
        s.rec.opt_ms = timer_stop_ms(&timer);

        /* ---- log: the slowest rank's times; every rank's busy time; the idle fraction ---- */
        s.rec.fwd_ms = p.times.fwd_ms;
        s.rec.bwd_ms = p.times.bwd_ms;
        int evaluate = run_step_done(&run, &s);
        s.columns[0] = run_log_busy(&run, &s, comm_ms); /* idle_fraction */
        if (dp->check_replicas && (step + 1) % dp->check_replicas == 0)
            data_parallel_check_replicas(&replicas, half ? mixed->master : held->params, step + 1);
        if (evaluate) s.rec.val_loss = pipeline_evaluate(&p, run.world, grid.d * per_rank);
        run_step_log(&run, &s);
    }
    data_parallel_print(&replicas);
    if (cfg.sample > 0) pipeline_sample(&p, cfg.sample, &run.rng);

    /* ---- timeline, run summary and memory: every rank's peaks, gathered on rank 0 ---- */
    pipeline_finish(&p, &run, &grid, whole_params, flags.pipe.schedule, bubbles, bubble_theory, 0);

    free(bubbles);
    data_parallel_destroy(&replicas);
    adamw_destroy(&opt);
    pipeline_destroy(&p);
    comm_group_free(model_group);
    grid_destroy(&grid);
    run_end(&run);
    return 0;
}
