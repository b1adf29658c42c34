/* 06_offload/train.c: ZeRO-Offload, and every technique of the course in one trainer.
 *
 * Chapter 05's stage 2 (gradients reduce-scattered over the data-parallel
 * ranks unit by unit as backward produces them, each rank updating only its
 * shard), with the optimizer moved off the device: the device keeps the
 * 16-bit weights and unit-sized working buffers, and each rank's shard of the
 * master weights, Adam's moments and the fp32 gradients sits in pinned host
 * memory, updated by the CPU (offload.h has the table and the streams). The
 * step runs through chapter 04's pipeline interpreter, so --pp P cuts the
 * model into P stages with the 1F1B schedule (or --schedule gpipe; chapter
 * 04's interleaved and zb-h1 are refused, saying why); --pp 1 (the default)
 * is one stage and the schedule is forward, backward per micro-batch.
 *
 *   for each action of this stage's 1F1B schedule:  forward m | backward m | messages
 *       after each unit's backward: reduce-scatter over dp, copy the slice to the host
 *   gradient norm (the ranks' shards summed) -> loss scale -> clip
 *   AdamW on the host, unit by unit; copy up, all-gather over dp -> log
 *   --dpu: the host update runs during the next step's forward and backward
 *   --save: every rank writes its host shard into one checkpoint (checkpoint.h)
 *
 * Without the delayed update the losses are chapter 01's in the same
 * precision: the host computes the same AdamW on the same sums. */
#include "comm.h"
#include "config.h"
#include "data.h"
#include "device.h"
#include "grid.h"
#include "harness.h"
#include "layer_split.h"
#include "mixed.h"
#include "model.h"
#include "offload.h"
#include "optim.h"
#include "optimizer_step.h"
#include "pipeline.h"
#include "schedule.h"
#include "util.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PROGRAM "06_offload/train"

/* ---- this chapter's flags ---- */
typedef struct {
    int offload;       /* --offload */
    int zero;          /* --zero: 2 is the stage offloaded */
    int dpu;           /* --dpu: delayed parameter update */
    int dpu_warmup;    /* exact steps before the delayed update starts */
    int dpu_reference; /* the delayed update without a thread, for the tests */
    int pp, dp;        /* pipeline stages, data-parallel replicas (0: world / pp) */
    char schedule[16]; /* --schedule: chapter 04's, those this trainer's pipeline can run */
    int ranks;         /* the world size, for the checks */
} OffloadFlags;

/* --help's section and one row per flag (config.h says how to add one) */
static const Flag offload_flags[] = {
    {.type = FLAG_SECTION,
     .help = "ZeRO-Offload (run with mpirun -np P*D; the optimizer runs on the host, sharded over the D "
             "replicas)"},
    {"--offload", FLAG_SWITCH, FIELD(OffloadFlags, offload), .usage = "--offload",
     .help = "16-bit (or fp32) weights on the device; fp32 master weights, Adam's\n"
             "moments and gradients in pinned host memory, AdamW on the CPU (required)"},
    {"--zero", FLAG_INT, FIELD(OffloadFlags, zero), 0, 3, .def = "2", .usage = "--zero 2",
     .help = "the ZeRO stage whose partitioning is offloaded: gradients\n"
             "reduce-scattered over the data-parallel ranks, each rank's host updating\n"
             "its shard (only 2 is supported; default {default})"},
    {"--dpu", FLAG_SWITCH, FIELD(OffloadFlags, dpu), .usage = "--dpu",
     .help = "delayed parameter update: the host update of step t runs during the\n"
             "forward and backward of step t+1, which use weights one step stale;\n"
             "a checkpoint (--save) waits for the update in flight, so that it\n"
             "holds every update through its step and the step after it computes\n"
             "with fresh weights, as a run resumed from it does"},
    {"--dpu-warmup", FLAG_INT, FIELD(OffloadFlags, dpu_warmup), 0, 1000000, .def = "1",
     .usage = "--dpu-warmup N",
     .help = "exact steps before the delayed update starts, 0..1000000 (default {default}:\n"
             "the course's runs are tens of steps; the paper, on runs of many\n"
             "thousands, delayed after 40; needs --dpu)"},
    {"--dpu-reference", FLAG_SWITCH, FIELD(OffloadFlags, dpu_reference), .usage = "--dpu-reference",
     .help = "--dpu computed without a thread, one step late in sequence (for tests)"},
    {"--schedule", FLAG_CHOICE, FIELD(OffloadFlags, schedule), .choices = "gpipe|1f1b|interleaved|zb-h1",
     .noun = "schedule", .def = "1f1b", .usage = "--schedule gpipe|1f1b",
     .help = "chapter 04's pipeline schedule (default {default}; interleaved and zb-h1 are refused)"},
    {"--pp", FLAG_INT, FIELD(OffloadFlags, pp), 1, 256, .def = "1", .usage = "--pp P",
     .help = "pipeline stages (chapter 04's pipeline), 1..layers (default {default})"},
    {"--dp", FLAG_INT, FIELD(OffloadFlags, dp), 1, 4096, .usage = "--dp D",
     .help = "data-parallel replicas (default: world size / pp)"},
    {0},
};

/* --dp left to its default is the world size / --pp: the record holds that
 * number, so that layouts written two ways agree. */
static void effective_offload_flags(const Config *cfg, void *values) {
    (void)cfg;
    OffloadFlags *f = values;
    if (!f->dp) f->dp = f->ranks / f->pp;
}

static void check_offload_layout(const Config *cfg, const void *values) {
    const OffloadFlags *f = values;
    if (f->dpu && !f->offload)
        fatal(EXIT_USAGE,
              "--dpu needs --offload (the delayed update overlaps the host's AdamW with the device)");
    if (f->dpu_reference && !f->dpu) fatal(EXIT_USAGE, "--dpu-reference needs --dpu");
    if (flag_given(cfg, "--dpu-warmup") && !f->dpu) fatal(EXIT_USAGE, "--dpu-warmup needs --dpu");
    if (!f->offload)
        fatal(EXIT_USAGE,
              "%s trains with --offload (valid: --offload; without it use 05_zero/train --zero 2)", PROGRAM);
    if (f->zero == 3)
        fatal(EXIT_USAGE, "--zero 3 with --offload is unsupported: chapter 06 offloads stage 2's optimizer "
                          "and gradients, not the parameters (valid: --zero 2)");
    if (f->zero != 2)
        fatal(EXIT_USAGE,
              "--zero %d with --offload is unsupported: chapter 06 offloads the stage-2 partitioning "
              "only (valid: --zero 2)",
              f->zero);
    int dp = f->dp, L = cfg->model.layers;
    if (dp < 1 || f->pp * dp != f->ranks)
        fatal(EXIT_USAGE, "%d ranks cannot hold --pp %d stages x --dp %d replicas (valid: mpirun -np %d)",
              f->ranks, f->pp, dp, f->pp * (dp < 1 ? 1 : dp));
    if (f->pp > L)
        fatal(EXIT_USAGE, "--pp %d stages for a model of %d layers (valid: 1..%d, every stage needs a block)",
              f->pp, L, L);
    if (cfg->batch % (dp * cfg->micro) != 0)
        fatal(EXIT_USAGE, "--batch %d does not split into %d replicas x --micro %d (valid: a multiple of %d)",
              cfg->batch, dp, cfg->micro, dp * cfg->micro);
    /* the schedules whose stage is one range of units with a whole backward per micro-batch */
    if (strcmp(f->schedule, "interleaved") == 0)
        fatal(EXIT_USAGE,
              "--schedule interleaved is refused by %s: the offloaded state is one range of "
              "units per stage, and interleaved's chunks are not one range (valid: gpipe, 1f1b)",
              PROGRAM);
    if (strcmp(f->schedule, "zb-h1") == 0)
        fatal(EXIT_USAGE,
              "--schedule zb-h1 is refused by %s: its backward split into B and W does not run "
              "under 06's per-unit weight hooks yet (a unit's weights would have to stay "
              "converted until its W) (valid: gpipe, 1f1b)",
              PROGRAM);
}

/* What the run harness (harness.h) needs to know of this program: its
 * flags; two steps.csv columns of its own, the bytes copied to and from the
 * host, then bytes_sent; every rank starts each step together, the
 * timeline's one time origin. */
static const RunColumn offload_columns[] = {{"d2h_bytes", "%.0f"}, {"h2d_bytes", "%.0f"}, {0}};
static const RunSpec spec = {
    .program = PROGRAM,
    .summary = "Train a GPT with ZeRO-Offload: the optimizer on the host, pipeline and data parallel.",
    .flags = {.flags = offload_flags,
              .effective = effective_offload_flags,
              .check = check_offload_layout,
              .multi_rank = 1},
    .columns = offload_columns,
    .bytes_sent = 1,
    .barrier_each_step = 1};

/* The delayed update's state between steps: the update waiting for its turn
 * (--dpu-reference), which gradient shard holds its gradients. */
typedef struct {
    int waiting;
    int grads;
    OffloadUpdate update;
} DelayedUpdate;

/* Step `step`'s update (0-based; skipped: fp16 overflowed). Exact AdamW
 * without --dpu and during its warm-up; after it, the update of step t runs
 * while the device computes step t+1 (exercise 06.2). When the last step
 * returns, the weights of record, which the final evaluation reads, hold
 * every step's update. */
static void update_weights(Offload *off, const OffloadFlags *of, DelayedUpdate *delayed, int step, int last,
                           const OffloadUpdate *update, int skipped) {
    if (!of->dpu || step < of->dpu_warmup) {
        if (!skipped) offload_update(off, update);
    } else if (of->dpu_reference) { /* the previous step's update now, this one's next step */
        if (delayed->waiting) offload_update_shard(off, delayed->grads, &delayed->update);
        *delayed = (DelayedUpdate){.waiting = !skipped, .grads = off->cur, .update = *update};
        if (last && delayed->waiting) offload_update_shard(off, delayed->grads, &delayed->update);
    } else {
        /* EXERCISE 06.2 BEGIN: the DPU schedule (course.md, exercise 06.2) */
        offload_update_wait(off); /* the previous step's update ran during this step: install it */
        if (!skipped) offload_update_start(off, update); /* this one's runs during the next step */
        if (last) offload_update_wait(off);              /* there is no next step */
        /* EXERCISE 06.2 END */
    }
}

/* Before a checkpoint (--dpu): the update still pending is done now, so that
 * the checkpoint holds every step's update through its own, and the step
 * after it computes with fresh weights, as a run resumed from it does. */
static void finish_delayed_update(Offload *off, DelayedUpdate *delayed) {
    offload_update_wait(off);
    if (delayed->waiting) offload_update_shard(off, delayed->grads, &delayed->update);
    delayed->waiting = 0;
}

int main(int argc, char **argv) {
    Config cfg;
    OffloadFlags of = {0};
    Run run; /* start-up, logs, evaluation, saves and the summary: harness.h */
    run_start_ranks(&run, &cfg, &argc, &argv, &spec, &of, &of.ranks);
    int P = of.pp, D = of.dp, M = cfg.micro;

    /* ---- the grid: D replicas of a pipeline of P stages; the split; the schedule ---- */
    ProcessGrid grid;
    grid_create(&grid, run.world, (GridShape){.dp = D, .pp = P, .cp = 1, .tp = 1});
    int blocks[MAX_LAYERS]; /* blocks per stage, balanced by parameters (layer_split.h) */
    StageLayout layout = {
        .pp = grid.pp_group, .stage = grid.p, .stages = P, .cfg = &cfg, .caller_storage = 1};
    layer_split_stage(&cfg.model, "", P, grid.p, blocks, &layout.first_block, &layout.last_block,
                      &layout.first_unit, &layout.last_unit);
    StageSchedule schedule;
    schedule_build(of.schedule, P, M, grid.p, &schedule);

    /* ---- build: device, data, output files (the harness); this stage's model, its offloaded state ---- */
    run_prepare(&run);
    int per_replica = cfg.batch / D;
    layout.data = &run.data;
    layout.B = per_replica / M;
    layout.T = cfg.model.seq;
    Pipeline p; /* this stage: units without storage, activation slots, the schedule (pipeline.h) */
    pipeline_create(&p, &layout, &schedule, cfg.seed);
    Offload off; /* the stage's 16-bit weights on the device, its shard of the rest on the host */
    offload_create(&off, &p.model, layout.first_unit, layout.last_unit, grid.dp_group, &cfg, of.dpu);
    /* each rank's host shard of its stage's units (offload.h) */
    ckpt_layout_init(&run.ckpt, "%s: pp %d x dp %d, offload%s", PROGRAM, P, D, of.dpu ? ", dpu" : "");
    offload_checkpoint_layout(&off, &run.ckpt);
    if (run_resume(&run, &off.t)) offload_weights_from_master(&off); /* the device's weights from the fp32 */
    offload_attach_timeline(&off, &p.times.timeline, &p.times.origin_ms);
    DelayedUpdate delayed = {0};

    log_info(
        "%s | %d ranks = %d stages x %d replicas | device %s | comm %s | %s | %zu parameters, %zu in this "
        "rank's host shard | batch %d = %d replicas x %d micro-batches x %d sequences%s\n",
        PROGRAM, run.ranks, P, D, device_name(), comm_transport_name(), precision_name(cfg.precision),
        p.model.num_params, off.shard_n, cfg.batch, D, M, layout.B,
        of.dpu ? (of.dpu_reference ? " | delayed update (reference)" : " | delayed update") : "");
    log_resumed(&cfg, run.first_step);

    double pcie_bytes = 0.0;
    for (int step = run.first_step; step < run.last_step; step++) {
        RunStep s = run_step_begin(&run, step); /* all ranks together: one time origin for the timeline */
        Timer timer = {0};

        /* ---- forward and backward; each unit's gradient leaves for the host as it is done ---- */
        offload_begin_step(&off, step + 1);
        pipeline_run_step(&p, step, grid.d * per_replica, run.dloss * s.loss_scale);
        offload_finish_grads(&off);
        s.rec.loss = comm_allreduce_double(run.world, p.now.loss_sum, 0) / run.tokens_per_step;
        check_loss_finite(s.rec.loss, step + 1);

        /* ---- update on the host: the norm from every rank's shard, then AdamW ---- */
        timer_start(&timer);
        offload_fault_overflow(&off, step + 1);
        GradShards held = offload_grad_shards(&off, run.world);
        OptimHyper hyper = optim_hyper(&cfg, step); /* lr_at_step's rate, betas, eps, wd, clip */
        StepDecision decision = optimizer_decide(&held, &run.scaler, hyper.clip, step + 1);
        s.rec.grad_norm = decision.grad_norm;
        s.rec.lr = hyper.lr;
        s.skipped = decision.skipped;
        OffloadUpdate update = {hyper.lr, decision.grad_scale}; /* the host AdamW: offload.c */
        update_weights(&off, &of, &delayed, step, step + 1 == run.last_step, &update, decision.skipped);
        s.rec.opt_ms = timer_stop_ms(&timer);
        pcie_bytes += off.bytes_d2h + off.bytes_h2d;

        /* ---- log: the slowest rank's times, the bytes over PCIe ---- */
        s.rec.fwd_ms = p.times.fwd_ms;
        s.rec.bwd_ms = p.times.bwd_ms;
        s.rec.comm_ms = p.times.comm_ms;
        s.columns[0] = off.bytes_d2h;
        s.columns[1] = off.bytes_h2d;
        if (run_step_done(&run, &s)) s.rec.val_loss = pipeline_evaluate(&p, run.world, grid.d * per_replica);
        if (of.dpu && run_save_due(&run, &s)) finish_delayed_update(&off, &delayed); /* saved with it */
        run_step_log(&run, &s);
    }

    /* ---- timeline, run summary and memory ---- */
    timeline_write(&p.times.timeline, run.world, cfg.out);
    double peak_host = comm_allreduce_double(run.world, (double)mem_peak_total(SPACE_HOST), 1);
    int ran = run.last_step - run.first_step;
    char extra_values[256];
    snprintf(extra_values, sizeof extra_values, ",%s,1,%d,%d,%.0f,%.0f,%.0f", precision_name(cfg.precision),
             of.dpu, of.dpu ? of.dpu_warmup : 0, peak_host, pcie_bytes / ran, run.bytes_sent / ran);
    run_layout(&run, D, 1, P, of.zero);
    run_finish(&run, p.model.num_params,
               ",precision,offload,dpu,dpu_warmup,peak_host_bytes,pcie_bytes_per_step,bytes_sent_per_step",
               extra_values,
               "peak host memory %.1f MiB | %.2f MiB over PCIe per rank per step | CSVs, timeline.csv and "
               "trace.json in %s",
               peak_host / BYTES_PER_MIB, pcie_bytes / ran / BYTES_PER_MIB, cfg.out);

    offload_destroy(&off);
    pipeline_destroy(&p);
    grid_destroy(&grid);
    run_end(&run);
    return 0;
}
