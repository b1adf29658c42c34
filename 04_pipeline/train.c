/* 04_pipeline/train.c: pipeline parallelism, GPipe and 1F1B.
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
 * and one interpreter (run_action) executes any such list. Gradients
 * accumulate over the micro-batches; one optimizer step per global batch,
 * exactly as in chapter 01.
 *
 *   for each action of this stage's schedule:  forward m | backward m | messages
 *   all-reduce the gradients over the data-parallel group (--dp D)
 *   gradient norm (summed over the stages) -> clip -> AdamW -> log
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
#include "data.h"
#include "device.h"
#include "grid.h"
#include "harness.h"
#include "layer_split.h"
#include "mixed.h"
#include "model.h"
#include "optim.h"
#include "optimizer_step.h"
#include "pipeline.h"
#include "schedule.h"
#include "util.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PROGRAM "04_pipeline/train"

/* ---- this chapter's flags ---- */
typedef struct {
    char schedule[16];  /* gpipe, 1f1b, interleaved, zb-h1 */
    int virtual_chunks; /* --virtual: chunks of layers per stage (interleaved) */
    int pp;             /* --pp: pipeline stages, 0 = world / dp */
    int dp;             /* --dp: data-parallel replicas of the pipeline */
    char split[1024];   /* --split: blocks per stage, "" = balance the parameters */
    int print_schedule;
    int ranks; /* the world size, for the checks */
} PipelineFlags;

/* --help's section and one row per flag (config.h says how to add one) */
static const Flag pipeline_flags[] = {
    {.type = FLAG_SECTION,
     .help = "pipeline parallel (run with mpirun -np P*D; --micro M cuts each replica's batch into M "
             "micro-batches)"},
    {"--schedule", FLAG_CHOICE, FIELD(PipelineFlags, schedule), .choices = "gpipe|1f1b|interleaved|zb-h1",
     .noun = "schedule", .def = "1f1b", .usage = "--schedule gpipe|1f1b|interleaved|zb-h1",
     .help = "all forwards then all backwards, one-forward-one-backward (default {default}), or zero "
             "bubble (backward split into B and W), or interleaved (--virtual V chunks per stage)"},
    {"--virtual", FLAG_INT, FIELD(PipelineFlags, virtual_chunks), 1, 16, .def = "1", .usage = "--virtual V",
     .help = "chunks of layers per stage, for --schedule interleaved (default {default})"},
    {"--pp", FLAG_INT, FIELD(PipelineFlags, pp), 1, 256, .usage = "--pp P",
     .help = "pipeline stages, 1..layers (default: world size / dp)"},
    {"--dp", FLAG_INT, FIELD(PipelineFlags, dp), 1, 4096, .def = "1", .usage = "--dp D",
     .help = "data-parallel replicas of the pipeline (default {default})"},
    {"--split", FLAG_TEXT, FIELD(PipelineFlags, split), .usage = "--split a,b,...",
     .help = "blocks per stage (default: balance the parameters)"},
    {"--print-schedule", FLAG_SWITCH, FIELD(PipelineFlags, print_schedule), .usage = "--print-schedule",
     .help = "print every stage's list of actions and exit"},
    {0},
};

/* --pp left to its default is the world size / --dp: the record holds that
 * number, so that layouts written two ways agree. */
static void effective_pipeline_flags(void *values) {
    PipelineFlags *f = values;
    if (!f->pp) f->pp = f->ranks / f->dp;
}

/* The layout: world = stages x replicas, every stage a block, every
 * replica's share of the batch cut into whole micro-batches. */
static void check_pipeline_layout(const Config *cfg, const void *values) {
    const PipelineFlags *f = values;
    int P = f->pp, M = cfg->micro, L = cfg->model.layers;
    if (P < 1 || P * f->dp != f->ranks)
        fatal(EXIT_USAGE, "%d ranks cannot hold %d pipeline stages x --dp %d (valid: mpirun -np %d)",
              f->ranks, P, f->dp, (P < 1 ? 1 : P) * f->dp);
    if (P > L)
        fatal(EXIT_USAGE, "--pp %d stages for a model of %d layers (valid: 1..%d, every stage needs a block)",
              P, L, L);
    if (cfg->batch % f->dp != 0)
        fatal(EXIT_USAGE, "--batch %d does not divide over --dp %d replicas (valid: a multiple of %d)",
              cfg->batch, f->dp, f->dp);
    if (cfg->batch % (f->dp * M) != 0)
        fatal(EXIT_USAGE,
              "--micro %d does not divide the %d sequences of each of the %d replicas (valid: --batch a "
              "multiple of dp x micro = %d)",
              M, cfg->batch / f->dp, f->dp, f->dp * M);
    const char *refused = schedule_refusal(f->schedule, P, f->virtual_chunks, M);
    if (refused) fatal(EXIT_USAGE, "%s", refused);
    if (P * f->virtual_chunks > L)
        fatal(EXIT_USAGE,
              "--pp %d x --virtual %d pieces for a model of %d layers (every piece needs a block)", P,
              f->virtual_chunks, L);
    if (f->split[0]) { /* one number per piece: per stage, or with --virtual V per chunk of a stage */
        int blocks[MAX_LAYERS];
        layer_split_parse(f->split, P * f->virtual_chunks, L, blocks);
    }
    if (strcmp(f->schedule, "interleaved") == 0 && !f->print_schedule &&
        (cfg->precision != PRECISION_FP32 || cfg->recompute || cfg->save[0] || cfg->resume[0]))
        fatal(EXIT_USAGE,
              "--schedule interleaved trains in fp32, without --recompute, --save or --resume only, "
              "yet (a stage's chunks are not one range of the table)");
    if (strcmp(f->schedule, "zb-h1") == 0 && (cfg->precision != PRECISION_FP32 || cfg->recompute))
        fatal(EXIT_USAGE, "--schedule zb-h1 trains in fp32 without --recompute only, yet (its backward split "
                          "into B and W keeps no 16-bit weights and recomputes nothing)");
}

/* What the run harness (harness.h) needs to know of this program: its
 * flags, one steps.csv column of its own, the measured bubble, and that
 * every rank starts each step together, the timeline's one time origin. */
static const RunColumn pipeline_columns[] = {{"bubble", "%.4f"}, {0}};
static const RunSpec spec = {
    .program = PROGRAM,
    .summary =
        "Train a GPT with pipeline parallelism: micro-batches flow through a layer split (GPipe, 1F1B).",
    .flags = {.flags = pipeline_flags,
              .effective = effective_pipeline_flags,
              .check = check_pipeline_layout,
              .multi_rank = 1},
    .columns = pipeline_columns,
    .barrier_each_step = 1};

/* --print-schedule: every stage's list of actions (rank 0). */
static void print_schedules(const char *name, int P, int V, int M) {
    if (V > 1)
        printf("%s schedule, %d stages of %d chunks, %d micro-batches (F/B forward/backward of a "
               "micro-batch; ra/rg receive activations/gradients, pa/pg post them; c1 on chunk 1)\n",
               name, P, V, M);
    else if (strcmp(name, "zb-h1") == 0)
        printf("%s schedule, %d stages, %d micro-batches (F forward; B/W input/weight gradients; ra/rg "
               "receive activations/gradients, pa/pg post them)\n",
               name, P, M);
    else
        printf("%s schedule, %d stages, %d micro-batches (F/B forward/backward of a micro-batch; ra/sa "
               "receive/"
               "send activations, rg/sg gradients; x|y one exchange)\n",
               name, P, M);
    for (int s = 0; s < P; s++) {
        StageSchedule sched;
        schedule_build_chunks(name, P, V, M, s, &sched);
        schedule_print(&sched, s);
        schedule_free(&sched);
    }
}

/* "stage s: blocks a..b + embedding", one line per stage (with V chunks
 * per stage, one per piece: "stage s chunk c: ..."). */
static void log_stages(const int *blocks, int P, int V) {
    for (int s = 0, first = 0; s < P * V; s++) {
        if (V > 1)
            log_info("stage %d chunk %d: blocks %d..%d%s%s\n", s % P, s / P, first, first + blocks[s] - 1,
                     s == 0 ? " + embedding" : "", s == P * V - 1 ? " + head" : "");
        else
            log_info("stage %d: blocks %d..%d%s%s\n", s, first, first + blocks[s] - 1,
                     s == 0 ? " + embedding" : "", s == P - 1 ? " + head" : "");
        first += blocks[s];
    }
}

/* The bubble of this step: the idle time of the stages while the pipeline
 * ran, measured on each replica's stage 0, averaged over the replicas. */
static double measure_bubble(const StageTimes *times, const ProcessGrid *grid, CommGroup *world) {
    int P = grid->pp, stage = grid->p;
    double span_ms = comm_allreduce_double(grid->pp_group, times->end_ms, 1);
    double busy_ms = times->fwd_ms + times->bwd_ms;
    double *stage_busy_ms = xcalloc(P, sizeof(double));
    comm_gather_bytes(grid->pp_group, &busy_ms, sizeof busy_ms, stage_busy_ms, 0);
    double bubble = stage == 0 ? bubble_measured(stage_busy_ms, P, span_ms) : 0.0;
    free(stage_busy_ms);
    return comm_allreduce_double(world, bubble, 0) / grid->dp; /* mean over the replicas' stage 0 */
}

int main(int argc, char **argv) {
    Config cfg;
    PipelineFlags pf = {0};
    Run run; /* start-up, logs, evaluation, saves and the summary: harness.h */
    run_start_ranks(&run, &cfg, &argc, &argv, &spec, &pf, &pf.ranks);
    int P = pf.pp, M = cfg.micro;
    int half = cfg.precision != PRECISION_FP32; /* 16-bit storage (mixed.h) */

    /* ---- the grid: --dp replicas of a pipeline of P stages (grid.h: stage = rank % P) ---- */
    ProcessGrid grid;
    grid_create(&grid, run.world, (GridShape){.dp = pf.dp, .pp = P, .cp = 1, .tp = 1});
    int dp_index = grid.d, stage = grid.p;

    /* ---- the split and the schedule ---- */
    int V = pf.virtual_chunks; /* V > 1: blocks[] per piece, P x V of them */
    int blocks[MAX_LAYERS];    /* blocks per piece: --split, or balanced by parameters (layer_split.h) */
    StageLayout layout = {.pp = grid.pp_group, .stage = stage, .stages = P, .cfg = &cfg};
    layer_split_stage(&cfg.model, pf.split, P * V, stage, blocks, &layout.first_block, &layout.last_block,
                      &layout.first_unit, &layout.last_unit);
    if (V > 1) pipeline_layout_chunks(&layout, blocks, V, cfg.model.layers); /* chunk c: piece c P + stage */
    if (pf.print_schedule) {
        if (run.rank == 0) print_schedules(pf.schedule, P, V, M);
        grid_destroy(&grid);
        comm_finalize();
        return 0;
    }
    StageSchedule schedule;
    schedule_build_chunks(pf.schedule, P, V, M, stage, &schedule);

    /* ---- build: device, data, output files (the harness); this stage's model, optimizer ---- */
    run_prepare(&run);
    int per_replica = cfg.batch / pf.dp; /* this replica's share of the global batch */
    layout.data = &run.data;
    layout.B = per_replica / M; /* sequences per micro-batch */
    layout.T = cfg.model.seq;
    Pipeline p; /* this stage: its units, activation slots, boundary buffers and schedule (pipeline.h) */
    pipeline_create(&p, &layout, &schedule, cfg.seed);
    AdamW opt;
    adamw_create(&opt, p.model.param_count);
    /* this stage's units, held alike by the --dp replicas (checkpoint.h) */
    ckpt_layout_init(&run.ckpt, "%s: pp %d x dp %d, %s", PROGRAM, P, pf.dp, pf.schedule);
    ckpt_layout_range(&run.ckpt, &p.model, &opt, dp_index, pf.dp);
    if (run_resume(&run, &opt.t) && half) mixed_weights_from_master(&p.mixed); /* the checkpoint: fp32 */

    double bubble_theory =
        schedule_bubble_formula(pf.schedule, P, V, M, 1.0, 1.0, 1.0); /* zb-h1: F = B = W */
    const char *bubble_rule = strcmp(pf.schedule, "interleaved") == 0 ? "(P-1)/(VM+P-1)"
                              : strcmp(pf.schedule, "zb-h1") == 0     ? "(P-1)/(3M+P-1), F = B = W,"
                                                                      : "(P-1)/(M+P-1)";
    log_info("%s | %d ranks = %d stages x %d replicas | device %s | comm %s | schedule %s | %d micro-batches "
             "of %d "
             "sequences | %zu parameters | %s | bubble formula %s = %.3f\n",
             PROGRAM, run.ranks, P, pf.dp, device_name(), comm_transport_name(), pf.schedule, M, layout.B,
             p.model.num_params, precision_name(cfg.precision), bubble_rule, bubble_theory);
    log_stages(blocks, P, V);
    if (cfg.sample > 0)
        log_info("note: no text sample (--sample): chapter 04 never holds the whole model on one rank\n");
    log_resumed(&cfg, run.first_step);

    double *bubbles = xcalloc(run.last_step, sizeof(double));
    for (int step = run.first_step; step < run.last_step; step++) {
        RunStep s = run_step_begin(&run, step); /* all ranks together: one time origin for the timeline */
        Timer timer = {0};

        /* ---- the schedule: every micro-batch's forward and backward, and the messages ---- */
        pipeline_run_step(&p, step, dp_index * per_replica, run.dloss * s.loss_scale);
        bubbles[step] = s.columns[0] = measure_bubble(&p.times, &grid, run.world); /* steps.csv's bubble */

        /* ---- communicate: sum each stage's gradients over the replicas ---- */
        timer_start(&timer);
        comm_allreduce_typed(grid.dp_group, precision_grads(&p.model, &p.mixed), p.model.param_count,
                             comm_dtype_of(cfg.precision), COMM_SUM, NULL); /* fp32 or 16 bits */
        double dp_ms = timer_stop_ms(&timer);
        s.rec.loss = comm_allreduce_double(run.world, p.now.loss_sum, 0) / run.tokens_per_step;
        check_loss_finite(s.rec.loss, step + 1);

        /* ---- update: each stage its own parameters, with the global norm (fp16: unless the
         * gradients overflowed on any rank; then every rank skips the step) ---- */
        timer_start(&timer);
        OptimHyper hyper = optim_hyper(&cfg, step); /* lr_at_step's rate, betas, eps, wd, clip */
        s.rec.lr = hyper.lr;
        mixed_fault_overflow(&p.mixed, step + 1); /* tests: an overflow where COURSE_FAULT_OVERFLOW_* say */
        GradShards held = precision_grad_shards(&p.model, &p.mixed); /* this stage's units */
        held.agree = grad_norm_agree;
        held.sum_group = grid.pp_group; /* the stages together hold the model */
        held.agree_group = run.world;
        s.skipped =
            optimizer_step(&p.model, &p.mixed, &opt, &run.scaler, &held, &hyper, step + 1, &s.rec.grad_norm);
        s.rec.opt_ms = timer_stop_ms(&timer);

        /* ---- log: the slowest rank's times ---- */
        s.rec.fwd_ms = p.times.fwd_ms;
        s.rec.bwd_ms = p.times.bwd_ms;
        s.rec.comm_ms = p.times.comm_ms + dp_ms;
        if (run_step_done(&run, &s))
            s.rec.val_loss = pipeline_evaluate(&p, run.world, dp_index * per_replica);
        run_step_log(&run, &s);
    }

    /* ---- timeline, run summary and memory ---- */
    timeline_write(&p.times.timeline, run.world, cfg.out);
    double bubble =
        median_after_warmup(bubbles + run.first_step, run.last_step - run.first_step); /* as steps */
    char extra_values[96];
    snprintf(extra_values, sizeof extra_values, ",%s,%.4f,%.4f", pf.schedule, bubble, bubble_theory);
    run_layout(&run, pf.dp, 1, P, 0);
    run_finish(&run, p.model.num_params, ",schedule,bubble_measured,bubble_theory", extra_values,
               "bubble %.3f measured, %.3f formula | CSVs, timeline.csv and trace.json in %s", bubble,
               bubble_theory, cfg.out);

    free(bubbles);
    adamw_destroy(&opt);
    pipeline_destroy(&p);
    grid_destroy(&grid);
    run_end(&run);
    return 0;
}
