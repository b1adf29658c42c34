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
#include "checkpoint_sharded.h"
#include "comm.h"
#include "config.h"
#include "csvlog.h"
#include "data.h"
#include "device.h"
#include "grid.h"
#include "layer_split.h"
#include "mixed.h"
#include "model.h"
#include "optim.h"
#include "optimizer_step.h"
#include "pipeline.h"
#include "preflight.h"
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

int main(int argc, char **argv) {
    comm_init(&argc, &argv);
    CommGroup *world = comm_world();
    int rank = comm_rank(world), ranks = comm_size(world);

    Config cfg;
    PipelineFlags pf = {.ranks = ranks};
    ChapterFlags flags = {.flags = pipeline_flags,
                          .values = &pf,
                          .effective = effective_pipeline_flags,
                          .check = check_pipeline_layout,
                          .multi_rank = 1};
    comm_parse_config(
        &cfg, argc, argv, PROGRAM,
        "Train a GPT with pipeline parallelism: micro-batches flow through a layer split (GPipe, 1F1B).",
        &flags);
    checkpoint_check_shared_directory(world, &cfg);
    int P = pf.pp, M = cfg.micro, L = cfg.model.layers;
    int half = cfg.precision != PRECISION_FP32; /* 16-bit storage (mixed.h) */

    /* ---- the grid: --dp replicas of a pipeline of P stages (grid.h: stage = rank % P) ---- */
    ProcessGrid grid;
    grid_create(&grid, world, (GridShape){.dp = pf.dp, .pp = P, .cp = 1, .tp = 1});
    int dp_index = grid.d, stage = grid.p;

    /* ---- the split and the schedule ---- */
    ParamTable table;
    param_table_build(&table, &cfg.model);
    int blocks[MAX_LAYERS], V = pf.virtual_chunks; /* V > 1: blocks[] per piece, P x V of them */
    if (pf.split[0])
        layer_split_parse(pf.split, P * V, L, blocks);
    else
        layer_split_balanced(&table, P * V, blocks);
    param_table_free(&table);
    StageLayout layout = {.pp = grid.pp_group, .stage = stage, .stages = P, .cfg = &cfg};
    layer_split_range(blocks, stage, &layout.first_block, &layout.last_block);
    layer_split_units(layout.first_block, layout.last_block, stage, P, L, &layout.first_unit,
                      &layout.last_unit);
    if (V > 1) pipeline_layout_chunks(&layout, blocks, V, L); /* interleaved: chunk c is piece c P + stage */
    if (pf.print_schedule) {
        if (rank == 0) {
            if (pf.virtual_chunks > 1)
                printf("%s schedule, %d stages of %d chunks, %d micro-batches (F/B forward/backward of a "
                       "micro-batch; ra/rg receive activations/gradients, pa/pg post them; c1 on chunk 1)\n",
                       pf.schedule, P, pf.virtual_chunks, M);
            else if (strcmp(pf.schedule, "zb-h1") == 0)
                printf(
                    "%s schedule, %d stages, %d micro-batches (F forward; B/W input/weight gradients; ra/rg "
                    "receive activations/gradients, pa/pg post them)\n",
                    pf.schedule, P, M);
            else
                printf(
                    "%s schedule, %d stages, %d micro-batches (F/B forward/backward of a micro-batch; ra/sa "
                    "receive/"
                    "send activations, rg/sg gradients; x|y one exchange)\n",
                    pf.schedule, P, M);
            for (int s = 0; s < P; s++) {
                StageSchedule sched;
                schedule_build_chunks(pf.schedule, P, pf.virtual_chunks, M, s, &sched);
                schedule_print(&sched, s);
                schedule_free(&sched);
            }
        }
        grid_destroy(&grid);
        comm_finalize();
        return 0;
    }
    StageSchedule schedule;
    schedule_build_chunks(pf.schedule, P, V, M, stage, &schedule);

    /* ---- build: device, data, output files, this stage's model, optimizer ---- */
    device_init(cfg.device, comm_local_rank());
    device_set_limit(cfg.device_mem_limit);
    comm_select(cfg.comm);
    Dataset data;
    data_load(&data, cfg.data, cfg.model.seq);
    layout.data = &data;
    OutFile *steps_csv = NULL;
    if (rank == 0) {
        out_dir_prepare(&cfg, PROGRAM);
        steps_csv = steps_csv_open(&cfg, half ? ",bubble,loss_scale,skipped" : ",bubble");
    }
    comm_barrier(world); /* the output directory exists before any rank writes into it */

    int per_replica = cfg.batch / pf.dp; /* this replica's share of the global batch */
    layout.B = per_replica / M;          /* sequences per micro-batch */
    layout.T = cfg.model.seq;
    Pipeline p; /* this stage: its units, activation slots, boundary buffers and schedule (pipeline.h) */
    pipeline_create(&p, &layout, &schedule, cfg.seed);
    AdamW opt;
    adamw_create(&opt, p.model.param_count);
    LossScaler scaler;
    loss_scaler_init(&scaler, &cfg);
    uint64_t rng = cfg.seed; /* the text sampler's (chapter 04 samples none, but the checkpoint keeps it) */
    CkptLayout ckpt;         /* this stage's units, held alike by the --dp replicas (checkpoint.h) */
    ckpt_layout_init(&ckpt, "%s: pp %d x dp %d, %s", PROGRAM, P, pf.dp, pf.schedule);
    ckpt_layout_range(&ckpt, &p.model, &opt, dp_index, pf.dp);
    int first_step = 0;
    if (cfg.resume[0]) first_step = checkpoint_resume(&cfg, &ckpt, &opt.t, &rng, &scaler);
    if (cfg.resume[0] && half)
        mixed_weights_from_master(&p.mixed); /* the checkpoint holds the fp32 weights */
    int last_step = cfg.stop_after ? cfg.stop_after : cfg.steps;

    double bubble_theory =
        schedule_bubble_formula(pf.schedule, P, V, M, 1.0, 1.0, 1.0); /* zb-h1: F = B = W */
    const char *bubble_rule = strcmp(pf.schedule, "interleaved") == 0 ? "(P-1)/(VM+P-1)"
                              : strcmp(pf.schedule, "zb-h1") == 0     ? "(P-1)/(3M+P-1), F = B = W,"
                                                                      : "(P-1)/(M+P-1)";
    log_info("%s | %d ranks = %d stages x %d replicas | device %s | comm %s | schedule %s | %d micro-batches "
             "of %d "
             "sequences | %zu parameters | %s | bubble formula %s = %.3f\n",
             PROGRAM, ranks, P, pf.dp, device_name(), comm_transport_name(), pf.schedule, M, layout.B,
             p.model.num_params, precision_name(cfg.precision), bubble_rule, bubble_theory);
    for (int s = 0, first = 0; s < P * V; s++) { /* s: a stage, or with V chunks a piece */
        if (V > 1)
            log_info("stage %d chunk %d: blocks %d..%d%s%s\n", s % P, s / P, first, first + blocks[s] - 1,
                     s == 0 ? " + embedding" : "", s == P * V - 1 ? " + head" : "");
        else
            log_info("stage %d: blocks %d..%d%s%s\n", s, first, first + blocks[s] - 1,
                     s == 0 ? " + embedding" : "", s == P - 1 ? " + head" : "");
        first += blocks[s];
    }
    if (cfg.sample > 0)
        log_info("note: no text sample (--sample): chapter 04 never holds the whole model on one rank\n");

    double tokens_per_step = (double)cfg.batch * layout.T;
    float dloss = (float)(1.0 / tokens_per_step); /* the mean over every token of the GLOBAL batch */
    double *step_ms = xcalloc(last_step, sizeof(double)), *bubbles = xcalloc(last_step, sizeof(double));
    double loss = NAN;

    log_resumed(&cfg, first_step);
    for (int step = first_step; step < last_step; step++) {
        Timer step_timer = {0}, timer = {0};
        StepRecord rec = {.step = step + 1, .val_loss = NAN};
        comm_barrier(world); /* every rank starts the step together: one time origin for the timeline */
        timer_start(&step_timer);

        /* ---- the schedule: every micro-batch's forward and backward, and the messages ---- */
        float loss_scale = scaler.scale; /* fp16: the gradients come out this many times too large */
        pipeline_run_step(&p, step, dp_index * per_replica, dloss * loss_scale);

        /* ---- the bubble: idle time of the stages while the pipeline ran ---- */
        const StageTimes *times = &p.times;
        double span_ms = comm_allreduce_double(grid.pp_group, times->end_ms, 1);
        double busy_ms = times->fwd_ms + times->bwd_ms;
        double *stage_busy_ms = xcalloc(P, sizeof(double));
        comm_gather_bytes(grid.pp_group, &busy_ms, sizeof busy_ms, stage_busy_ms, 0);
        double bubble = stage == 0 ? bubble_measured(stage_busy_ms, P, span_ms) : 0.0;
        free(stage_busy_ms);
        bubbles[step] = comm_allreduce_double(world, bubble, 0) / pf.dp; /* mean over the replicas' stage 0 */

        /* ---- communicate: sum each stage's gradients over the replicas ---- */
        timer_start(&timer);
        comm_allreduce_typed(grid.dp_group, precision_grads(&p.model, &p.mixed), p.model.param_count,
                             comm_dtype_of(cfg.precision), COMM_SUM, NULL); /* fp32 or 16 bits */
        double dp_ms = timer_stop_ms(&timer);
        loss = comm_allreduce_double(world, p.now.loss_sum, 0) / tokens_per_step;
        check_loss_finite(loss, step + 1);

        /* ---- update: each stage its own parameters, with the global norm (fp16: unless the
         * gradients overflowed on any rank; then every rank skips the step) ---- */
        timer_start(&timer);
        OptimHyper hyper = optim_hyper(&cfg, step); /* lr_at_step's rate, betas, eps, wd, clip */
        rec.lr = hyper.lr;
        mixed_fault_overflow(&p.mixed, step + 1); /* tests: an overflow where COURSE_FAULT_OVERFLOW_* say */
        GradShards held = precision_grad_shards(&p.model, &p.mixed); /* this stage's units */
        held.agree = grad_norm_agree;
        held.sum_group = grid.pp_group; /* the stages together hold the model */
        held.agree_group = world;
        int skipped =
            optimizer_step(&p.model, &p.mixed, &opt, &scaler, &held, &hyper, step + 1, &rec.grad_norm);
        rec.opt_ms = timer_stop_ms(&timer);
        rec.step_ms = timer_stop_ms(&step_timer);

        /* ---- log: the slowest rank's times ---- */
        rec.fwd_ms = times->fwd_ms;
        rec.bwd_ms = times->bwd_ms;
        rec.comm_ms = times->comm_ms + dp_ms;
        comm_slowest_times(world, &rec);
        rec.loss = loss;
        rec.tokens_per_s = tokens_per_step / (rec.step_ms / 1e3);
        step_ms[step] = rec.step_ms;
        int last = step + 1 == last_step;
        if (last || (cfg.eval_every && (step + 1) % cfg.eval_every == 0))
            rec.val_loss = pipeline_evaluate(&p, world, dp_index * per_replica);
        if (rank == 0) {
            if (!cfg.quiet || last) log_step(&rec, cfg.steps);
            char extra_values[64];
            int n = snprintf(extra_values, sizeof extra_values, ",%.4f", bubbles[step]);
            if (half) snprintf(extra_values + n, sizeof extra_values - n, ",%g,%d", loss_scale, skipped);
            steps_csv_write(steps_csv, &rec, extra_values);
        }
        if (checkpoint_due(&cfg, step + 1, last_step)) {
            CkptState state = ckpt_state(step + 1, opt.t, rng, &scaler);
            checkpoint_save_sharded(world, &cfg, &ckpt, &state);
        }
    }
    if (rank == 0) out_close(steps_csv);

    /* ---- timeline, run summary and memory ---- */
    timeline_write(&p.times.timeline, world, cfg.out);
    size_t peak_device = comm_write_memory_csv(world, cfg.out);
    if (rank == 0) {
        RunSummary run;
        run_summary_init(&run, PROGRAM, &cfg, p.model.num_params, step_ms + first_step,
                         last_step - first_step);
        run.world_size = ranks;
        run.dp = pf.dp;
        run.pp = P;
        run.final_loss = loss;
        run.peak_device_bytes = peak_device;
        double bubble_measured =
            median_after_warmup(bubbles + first_step, last_step - first_step); /* as step times */
        char extra_header[64], extra_values[96];
        snprintf(extra_header, sizeof extra_header, ",schedule,bubble_measured,bubble_theory");
        snprintf(extra_values, sizeof extra_values, ",%s,%.4f,%.4f", pf.schedule, bubble_measured,
                 bubble_theory);
        run_csv_write_extra(cfg.out, &run, extra_header, extra_values);
        run_info_complete(&cfg);
        log_run_done(&run, "bubble %.3f measured, %.3f formula | CSVs, timeline.csv and trace.json in %s",
                     bubble_measured, bubble_theory, cfg.out);
    }

    free(step_ms);
    free(bubbles);
    ckpt_layout_free(&ckpt);
    adamw_destroy(&opt);
    pipeline_destroy(&p);
    data_free(&data);
    device_shutdown();
    grid_destroy(&grid);
    comm_finalize();
    return 0;
}
