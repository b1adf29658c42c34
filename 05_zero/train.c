/* 05_zero/train.c: ZeRO, the model state sharded over the data-parallel ranks.
 *
 * Chapter 04's trainer, with --zero (zero.h): 1 shards the optimizer state
 * over the data-parallel group, 2 the gradients too (reduce-scattered as
 * each unit's backward ends), 3 the parameters too (each unit gathered
 * before its forward and its backward, freed after; --prefetch K). One
 * stage of one rank runs ZeRO's own step; other layouts run 04's schedule,
 * each rank sharding what it holds over its dp group (zero_stage.h).
 * Refused, each saying why: stage 3 across stages (every stage would
 * re-gather its parameters for every micro-batch), and what is not written. */
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
#include "common/model/optim.h" /* AdamW and the learning-rate schedule */
#include "common/model/optimizer_step.h" /* the optimizer step: norm, clip, skip, AdamW */
#include "common/core/util.h" /* fatal, log_info, exit codes, flag parsing */
#include "05_zero/zero.h" /* 05: ZeRO's shards */
#include "05_zero/zero_stage.h" /* 05: a stage's gradients under ZeRO */

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PROGRAM "05_zero/train"

/* ---- the flags: the row sets this program takes, each with its technique's checks (config.h) ---- */
typedef struct {
    DataParallelFlags data;   /* --dp-mode, --allreduce, --bucket-mb, ... (data_parallel.h) */
    ModelParallelFlags model; /* --mp, --split, --tp, --dp, --sp, --cp, ... (model_parallel.h) */
    ExpertParallelFlags experts; /* --ep (expert_parallel.h) */
    PipelineFlags pipe;       /* --schedule, --virtual, --pp, --print-schedule (pipeline_flags.h) */
    ZeroFlags zero;           /* --zero, --prefetch (zero_stage.h) */
} Flags;
static const Flag flag_rows[] = {
    FLAG_ROWS_AT(Flags, data, data_parallel_flags),
    FLAG_ROWS_AT(Flags, model, model_parallel_flags),
    FLAG_ROWS_AT(Flags, experts, expert_parallel_flags),
    FLAG_ROWS_AT(Flags, pipe, pipeline_flags),
    FLAG_ROWS_AT(Flags, zero, zero_flags),
    {0},
};
static void effective_flags(const Config *cfg, void *values) {
    Flags *f = values;
    zero_effective_flags(cfg, &f->zero, &f->pipe, &f->model);
}
static void check_flags(const Config *cfg, const void *values) {
    const Flags *f = values;
    zero_check_flags(cfg, &f->zero, &f->pipe, &f->model, 1); /* 1: ZeRO's own step on one stage */
    expert_parallel_check_flags(cfg, &f->experts, &f->model, f->pipe.pp);
    zero_refuse_expert_parallel(f->experts.ep, f->zero.zero, f->pipe.pp);
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
    .summary = "Train a GPT with ZeRO: the model state sharded over the data-parallel ranks, in chapter 04's "
               "pp x tp x dp trainer.",
    .flags = {.flags = flag_rows, .effective = effective_flags, .check = check_flags, .multi_rank = 1},
    .columns = columns,
    .bytes_sent = 1,
    .comm_busy = 1,
    .experts = 1,
    .axis_bytes = 1,
    .barrier_each_step = 1,
    .busy_csv = 1,
};

/* One stage, tp 1: ZeRO stage 0-3 over all the ranks, dp = the world (zero.h).
 * Each micro-batch runs forward and backward through the whole model, the
 * hooks gathering (stage 3) and reduce-scattering (stages 2-3) unit by unit. */
static int train_sharded(Run *run, Config *cfg, const Flags *f, ProcessGrid *grid) {
    int ranks = run->ranks, stage = f->zero.zero;
    run_prepare(run);
    GPT model;
    Zero zero;
    zero_create_precision(&zero, &model, &cfg->model, cfg->seed, stage, f->zero.prefetch, grid->dp_group,
                          cfg->precision);
    const UnitHooks *hooks = zero_hooks(&zero);
    int per_rank = cfg->batch / ranks; /* this rank's share of the global batch */
    int B = per_rank / cfg->micro, T = cfg->model.seq, L = cfg->model.layers;
    Activations acts;
    activations_create_model(&acts, &cfg->model, B, T, cfg->recompute);
    Scratch scratch;
    scratch_create(&scratch, &cfg->model, B, T, cfg->recompute);
    float *whole = zero_alloc_whole(&zero);
    /* each rank writes and reads its own shards of the whole model's arrays */
    ckpt_layout_init(&run->ckpt, "%s: %d ranks, zero %d", PROGRAM, ranks, stage);
    zero_checkpoint_layout(&zero, &run->ckpt);
    if (run_resume(run, &zero.opt.t)) zero_weights_from_master(&zero); /* 16 bits: from the fp32 weights */

    char prefetch[32] = ""; /* stage 3 only: the other stages gather nothing */
    if (stage == 3) snprintf(prefetch, sizeof prefetch, " | prefetch %d", f->zero.prefetch);
    log_info("%s | %d ranks | device %s | comm %s | zero %d%s | %zu parameters, %zu per shard | "
             "batch %d = %d ranks x %d micro-batches x %d sequences | %s\n",
             PROGRAM, ranks, device_name(), comm_transport_name(), stage, prefetch, model.num_params,
             zero.shard_n, cfg->batch, ranks, cfg->micro, B, precision_name(cfg->precision));
    log_resumed(cfg, run->first_step);
    if (f->pipe.print_schedule) zero_print_schedule(zero.actions, zero.num_actions);

    for (int step = run->first_step; step < run->last_step; step++) {
        RunStep s = run_step_begin(run, step);
        Timer timer = {0};
        zero_start_clock(&zero, step);
        zero_begin_step(&zero);
        acts.moe.stats = (MoeStats){0}; /* --experts: what this step's forwards route (moe.h) */
        double loss_sum = 0.0;
        for (int mb = 0; mb < cfg->micro; mb++) {
            int first_sequence =
                run->rank * per_rank + mb * B; /* where this piece sits in the global batch */
            data_upload_batch(&run->data, SPLIT_TRAIN, cfg->seed, step, first_sequence, B, T, acts.tokens,
                              acts.targets);
            zero_begin_micro(&zero, mb);
            timer_start(&timer);
            gpt_forward_range(&model, &acts, &scratch, LAYER_EMBEDDING, L, 1, hooks, B, T);
            loss_sum += gpt_loss_sum(&acts, B, T);
            s.rec.fwd_ms += timer_stop_ms(&timer);
            timer_start(&timer);
            gpt_backward_range(&model, &acts, &scratch, LAYER_EMBEDDING, L, run->dloss * s.loss_scale, NULL,
                               NULL, hooks, B, T);
            s.rec.bwd_ms += timer_stop_ms(&timer);
        }
        /* sum the gradients (stages 2-3 did most of it during backward); update this rank's slices */
        zero_sync_grads(&zero);
        s.rec.loss = comm_allreduce_double(grid->dp_group, loss_sum, 0) / run->tokens_per_step;
        s.moe = acts.moe.stats;
        check_loss_finite(s.rec.loss, step + 1);
        timer_start(&timer);
        OptimHyper hyper = optim_hyper(cfg, step);
        s.rec.lr = hyper.lr;
        s.skipped = zero_step_update(&zero, &run->scaler, &hyper, step + 1, &s.rec.grad_norm);
        s.rec.opt_ms = timer_stop_ms(&timer);
        s.rec.comm_ms = zero.comm_ms;       /* waiting on communication, wherever in the step */
        s.comm_busy_ms = zero.comm_busy_ms; /* the collectives running, hidden or not */
        int evaluate = run_step_done(run, &s);
        s.columns[0] = run_log_busy(run, &s, zero.comm_ms); /* idle_fraction */
        if (evaluate)
            s.rec.val_loss =
                zero_evaluate_and_sample(&zero, whole, &acts, &scratch, &run->data, cfg, 0, &run->rng);
        run_step_log(run, &s);
    }
    if (cfg->sample > 0)
        zero_evaluate_and_sample(&zero, whole, &acts, &scratch, &run->data, cfg, cfg->sample, &run->rng);

    timeline_write(&zero.timeline, run->world, cfg->out);
    int ran = run->last_step - run->first_step;
    double bytes_per_step = ran ? run->bytes_sent / ran : 0.0; /* this rank's; the ranks send alike */
    char extra_values[64];
    snprintf(extra_values, sizeof extra_values, ",%d,%.0f,%s", f->zero.prefetch, bytes_per_step,
             precision_name(cfg->precision));
    run_layout(run, ranks, 1, 1, stage);
    run_finish(run, model.num_params, ",prefetch,bytes_sent_per_step,precision", extra_values,
               "%.2f MiB sent per rank per step | CSVs, timeline.csv and trace.json in %s",
               bytes_per_step / BYTES_PER_MIB, cfg->out);
    mem_free(whole);
    scratch_destroy(&scratch);
    activations_destroy(&acts, &cfg->model);
    zero_destroy(&zero);
    gpt_destroy(&model);
    grid_destroy(grid);
    run_end(run);
    return 0;
}

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
    if (P == 1 && grid.tp == 1 && grid.cp == 1)
        return train_sharded(&run, &cfg, &flags, &grid); /* ZeRO over the world */
    /* one replica's stages and slices (of one cp rank's positions) */
    CommGroup *model_group = comm_split(run.world, grid.d * grid.cp + grid.c, rank);
    TensorGroup tensor = {.group = grid.tp_group, .rank = grid.t, .size = grid.tp};

    /* ---- the split and the schedule ---- */
    int blocks[MAX_LAYERS]; /* blocks per piece (V > 1: P x V pieces): --split, or balanced (layer_split.h) */
    StageLayout layout = {
        .pp = grid.pp_group, .stage = grid.p, .stages = P, .cfg = &cfg, .caller_storage = flags.zero.zero > 0};
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
    tensor.caller_storage = layout.caller_storage; /* ZeRO binds the slices' storage too */
    Pipeline p; /* this stage: its units, activation slots, boundary buffers and schedule (pipeline.h) */
    pipeline_create(&p, &layout, &schedule, cfg.seed);
    size_t whole_params = layout.tensor ? p.tpm.global_params : p.model.num_params; /* the whole model's */
    ZeroStage replicas; /* the stage's replicas: 04's all-reduce and AdamW, or ZeRO 1-2 (zero_stage.h) */
    zero_stage_create(&replicas, &p, flags.zero.zero, dp, &grid, model_group, run.world);
    ExpertParallel experts = {0}; /* --ep: each MoE block's experts over N replicas (expert_parallel.h) */
    zero_stage_split_experts(&replicas, &experts, &flags.experts, &flags.model, &grid); /* --zero 0 */
    zero_stage_resume(&replicas, &run, PROGRAM, &grid, flags.pipe.schedule); /* and rank 0's weights */

    double bubble_theory = pipeline_log_layout(&p, PROGRAM, &grid, dp->dp_mode, dp->allreduce, whole_params,
                                               flags.pipe.schedule, blocks); /* and the formula's bubble */
    log_resumed(&cfg, run.first_step);

    double *bubbles = xcalloc(run.last_step, sizeof(double));
    for (int step = run.first_step; step < run.last_step; step++) {
        RunStep s = run_step_begin(&run, step); /* all ranks together: one time origin for the timeline */

        /* ---- the schedule: this stage's actions in order, forward m | backward m | a message ---- */
        zero_stage_begin_step(&replicas, step);
        pipeline_begin_step(&p, step, grid.d * per_rank, run.dloss * s.loss_scale);
        expert_parallel_begin_step(&experts, step); /* --ep: the all-to-alls' timeline */
        for (int i = 0; i < p.schedule.count; i++) pipeline_run_action(&p, i);
        pipeline_end_step(&p);
        bubbles[step] = s.columns[1] =
            pipeline_measure_bubble(&p.times, &grid, run.world); /* steps.csv's bubble */

        /* ---- communicate: sum the gradients over the replicas of this part, and the loss ---- */
        double comm_ms = p.times.comm_ms + zero_stage_sum_gradients(&replicas, &s.comm_busy_ms);
        s.rec.loss = comm_allreduce_double(run.world, p.now.loss_sum, 0) / run.tokens_per_step;
        s.moe = pipeline_moe_stats(&p); /* --experts: what this stage's forwards routed (moe.h) */
        check_loss_finite(s.rec.loss, step + 1);

        /* ---- update: each rank its own parameters (or slices), clipped by the WHOLE model's norm
         * (fp16: unless the gradients overflowed on any rank) ---- */
        Timer timer = {0};
        timer_start(&timer);
        OptimHyper hyper = optim_hyper(&cfg, step); /* lr_at_step's rate, betas, eps, wd, clip */
        s.rec.lr = hyper.lr;
        s.skipped = zero_stage_update(&replicas, &run.scaler, &hyper, step + 1, &s.rec.grad_norm, &comm_ms,
                                      &s.comm_busy_ms);
        s.rec.opt_ms = timer_stop_ms(&timer);
        s.rec.comm_ms = comm_ms;

        /* ---- log: the slowest rank's times; every rank's busy time; the idle fraction ---- */
        s.rec.fwd_ms = p.times.fwd_ms;
        s.rec.bwd_ms = p.times.bwd_ms;
        int evaluate = run_step_done(&run, &s);
        s.columns[0] = run_log_busy(&run, &s, comm_ms); /* idle_fraction */
        expert_parallel_load(&experts, run.world, &s.columns[2]); /* ep_rows_max, ep_rows_mean */
        zero_stage_check_replicas(&replicas, dp->check_replicas, step + 1);
        if (evaluate) s.rec.val_loss = pipeline_evaluate(&p, run.world, grid.d * per_rank);
        run_step_log(&run, &s);
    }
    if (cfg.sample > 0) pipeline_sample(&p, cfg.sample, &run.rng);

    /* ---- timeline, run summary and memory: every rank's peaks, gathered on rank 0 ---- */
    pipeline_finish(&p, &run, &grid, whole_params, flags.pipe.schedule, bubbles, bubble_theory,
                    flags.zero.zero);

    free(bubbles);
    expert_parallel_destroy(&experts, &p.model, run.world, cfg.out);
    zero_stage_destroy(&replicas);
    pipeline_destroy(&p);
    comm_group_free(model_group);
    grid_destroy(&grid);
    run_end(&run);
    return 0;
}
