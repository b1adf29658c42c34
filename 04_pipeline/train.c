/* 04_pipeline/train.c: pipeline parallelism, in a pp x cp x tp x dp layout.
 *
 * Chapter 03's layer split, but each replica's share of the batch is cut
 * into --micro M micro-batches that flow through the P stages like an
 * assembly line: stage s works on micro-batch m while stage s+1 works on
 * m-1. What each stage does, in which order, is a list of actions
 * (schedule.h: gpipe, 1f1b, interleaved, zb-h1), and the step's loop runs
 * it (pipeline.h). Chapter 03's tensor and context parallelism run inside
 * each stage, chapter 02's replicas around it (grid.h: tp fastest, then
 * cp, pp, dp). Every action is timed (timeline.csv, trace.json); the
 * stages' idle time is the bubble, reported beside (P-1)/(M+P-1). */
#include "common/comm/comm.h" /* collectives and messages between ranks */
#include "common/run/config.h" /* Config and the flag tables */
#include "02_data_parallel/data_parallel.h" /* 02: data parallelism */
#include "common/device/device.h" /* mem_alloc, copies, streams, timers */
#include "common/run/evaluate.h" /* validation loss and sampling */
#include "common/comm/grid.h" /* the process grid: dp x pp x cp x tp */
#include "common/run/harness.h" /* the run around the training loop */
#include "common/model/layer_split.h" /* which blocks each stage runs */
#include "common/kernels/kernels.h" /* ops(): the kernel table */
#include "common/model/mixed.h" /* mixed precision: 16-bit weights, loss scaling */
#include "common/model/model.h" /* GPT, its forward and backward */
#include "03_model_parallel/model_parallel.h" /* 03: one model held by a group of ranks */
#include "03_model_parallel/expert_parallel.h" /* 03: experts split over ranks (--ep) */
#include "04_pipeline/pipeline.h" /* 04: a pipeline stage and its interpreter */
#include "04_pipeline/pipeline_flags.h" /* 04: the pipeline's flags and checks */
#include "04_pipeline/schedule.h" /* 04: schedules as lists of actions */
#include "04_pipeline/stage_replicas.h" /* 04: a stage's replicas */
#include "common/model/optim.h" /* AdamW and the learning-rate schedule */
#include "common/model/optimizer_step.h" /* the optimizer step: norm, clip, skip, AdamW */
#include "common/core/util.h" /* fatal, log_info, exit codes, flag parsing */

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PROGRAM "04_pipeline/train"

/* ---- the flags: the row sets this program takes, each with its technique's checks (config.h) ---- */
typedef struct {
    DataParallelFlags data;   /* --dp-mode, --allreduce, --bucket-mb, ... (data_parallel.h) */
    ModelParallelFlags model; /* --mp, --split, --tp, --dp, --sp, --cp, ... (model_parallel.h) */
    ExpertParallelFlags experts; /* --ep (expert_parallel.h) */
    PipelineFlags pipe;       /* --schedule, --virtual, --pp, --print-schedule (pipeline_flags.h) */
} Flags;
static const Flag flag_rows[] = {
    FLAG_ROWS_AT(Flags, data, data_parallel_flags),
    FLAG_ROWS_AT(Flags, model, model_parallel_flags),
    FLAG_ROWS_AT(Flags, experts, expert_parallel_flags),
    FLAG_ROWS_AT(Flags, pipe, pipeline_flags),
    {0},
};
static void effective_flags(const Config *cfg, void *values) {
    Flags *f = values;
    pipeline_effective_flags(cfg, &f->pipe, &f->model);
}
static void check_flags(const Config *cfg, const void *values) {
    const Flags *f = values;
    pipeline_check_flags(cfg, &f->pipe, &f->model);
    expert_parallel_check_flags(cfg, &f->experts, &f->model, f->pipe.pp);
}

/* What the run harness (harness.h) needs to know of this program: its
 * flags, its steps.csv columns (a chapter keeps the columns of the one
 * before it and adds its own), and what else it reports. */
static const RunColumn columns[] = {
    {"idle_fraction", "%.4f"}, /* 1 - the ranks' busy time over ranks x the step (busy.csv) */
    {"bubble", "%.4f"},        /* the stages' idle time while the pipeline ran */
    {"ep_rows_max", "%.0f"},   /* --ep: the most rows one rank's experts computed in the step */
    {"ep_rows_mean", "%.1f"},  /* and the ranks' mean: max / mean is the load imbalance */
    {0},
};
static const RunSpec spec = {
    .program = PROGRAM,
    .summary =
        "Train a GPT with pipeline parallelism: micro-batches flow through a layer split (GPipe, 1F1B), "
        "with tensor and data parallelism (pp x tp x dp).",
    .flags = {.flags = flag_rows, .effective = effective_flags, .check = check_flags, .multi_rank = 1},
    .columns = columns,
    .comm_busy = 1,
    .experts = 1,
    .axis_bytes = 1,
    .barrier_each_step = 1,
    .busy_csv = 1,
};

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
    layout.cp_mode = flags.model.cp_mode, layout.alltoall = flags.model.alltoall; /* ring or Ulysses */
    layout.expert_parts = flags.experts.ep, layout.expert_part = grid.d % flags.experts.ep; /* --ep */
    Pipeline p; /* this stage: its units, activation slots, boundary buffers and schedule (pipeline.h) */
    pipeline_create(&p, &layout, &schedule, cfg.seed);
    size_t whole_params = layout.tensor ? p.tpm.global_params : p.model.num_params; /* the whole model's */
    StageReplicas replicas; /* the stage's replicas: chapter 02's all-reduce, and AdamW (stage_replicas.h) */
    stage_replicas_create(&replicas, &p, dp, &grid, model_group, run.world);
    ExpertParallel experts = {0}; /* --ep: each MoE block's experts over N replicas (expert_parallel.h) */
    stage_replicas_split_experts(&replicas, &experts, &flags.experts, &flags.model, &grid);
    stage_replicas_resume(&replicas, &run, PROGRAM, &grid, flags.pipe.schedule); /* and rank 0's weights */

    double bubble_theory = pipeline_log_layout(&p, PROGRAM, &grid, dp->dp_mode, dp->allreduce, whole_params,
                                               flags.pipe.schedule, blocks); /* and the formula's bubble */
    log_resumed(&cfg, run.first_step);

    double *bubbles = xcalloc(run.last_step, sizeof(double));
    for (int step = run.first_step; step < run.last_step; step++) {
        RunStep s = run_step_begin(&run, step); /* all ranks together: one time origin for the timeline */

        /* ---- the schedule: this stage's actions in order, forward m | backward m | a message ---- */
        stage_replicas_begin_step(&replicas);
        pipeline_begin_step(&p, step, grid.d * per_rank, run.dloss * s.loss_scale);
        expert_parallel_begin_step(&experts, step); /* --ep: the all-to-alls' timeline */
        for (int i = 0; i < p.schedule.count; i++) pipeline_run_action(&p, i);
        pipeline_end_step(&p);
        bubbles[step] = s.columns[1] =
            pipeline_measure_bubble(&p.times, &grid, run.world); /* steps.csv's bubble */

        /* ---- communicate: sum the gradients over the replicas of this part, and the loss ---- */
        double comm_ms = p.times.comm_ms + stage_replicas_sum_gradients(&replicas, &s.comm_busy_ms);
        s.rec.loss = comm_allreduce_double(run.world, p.now.loss_sum, 0) / run.tokens_per_step;
        s.moe = pipeline_moe_stats(&p); /* --experts: what this stage's forwards routed (moe.h) */
        check_loss_finite(s.rec.loss, step + 1);

        /* ---- update: each rank its own parameters, clipped by the WHOLE model's norm
         * (fp16: unless the gradients overflowed on any rank) ---- */
        Timer timer = {0};
        timer_start(&timer);
        OptimHyper hyper = optim_hyper(&cfg, step); /* lr_at_step's rate, betas, eps, wd, clip */
        s.rec.lr = hyper.lr;
        s.skipped = stage_replicas_update(&replicas, &run.scaler, &hyper, step + 1, &s.rec.grad_norm);
        s.rec.opt_ms = timer_stop_ms(&timer);
        s.rec.comm_ms = comm_ms;

        /* ---- log: the slowest rank's times; every rank's busy time; the idle fraction ---- */
        s.rec.fwd_ms = p.times.fwd_ms;
        s.rec.bwd_ms = p.times.bwd_ms;
        int evaluate = run_step_done(&run, &s);
        s.columns[0] = run_log_busy(&run, &s, comm_ms); /* idle_fraction */
        expert_parallel_load(&experts, run.world, &s.columns[2]); /* ep_rows_max, ep_rows_mean */
        stage_replicas_check(&replicas, dp->check_replicas, step + 1);
        if (evaluate) s.rec.val_loss = pipeline_evaluate(&p, run.world, grid.d * per_rank);
        run_step_log(&run, &s);
    }
    stage_replicas_print(&replicas);
    if (cfg.sample > 0) pipeline_sample(&p, cfg.sample, &run.rng);

    /* ---- timeline, run summary and memory: every rank's peaks, gathered on rank 0 ---- */
    pipeline_finish(&p, &run, &grid, whole_params, flags.pipe.schedule, bubbles, bubble_theory, 0);

    free(bubbles);
    expert_parallel_destroy(&experts, &p.model, run.world, cfg.out);
    stage_replicas_destroy(&replicas);
    pipeline_destroy(&p);
    comm_group_free(model_group);
    grid_destroy(&grid);
    run_end(&run);
    return 0;
}
