/* 05_zero/train.c: ZeRO, the model state sharded over the data-parallel ranks.
 *
 * Chapter 04's loop, with --zero (zero.h): 1 shards the optimizer state over
 * the replicas, 2 the gradients too (reduce-scattered as each unit's
 * backward ends), 3 the parameters too (gathered before each unit runs;
 * --prefetch K). One stage of one rank runs ZeRO's own step (train_sharded);
 * other layouts run 04's schedule, each rank sharding what it holds over its
 * replicas (zero_stage.h). Refused, saying why: stage 3 across stages. */
#include "common/comm/comm.h" /* collectives and messages between ranks */
#include "common/run/config.h" /* Config and the flag tables */
#include "02_data_parallel/data_parallel.h" /* 02: data parallelism */
#include "common/device/device.h" /* mem_alloc, copies, streams, timers */
#include "common/run/evaluate.h" /* validation loss and sampling */
#include "common/comm/grid.h" /* the process grid: dp x pp x cp x tp */
#include "common/run/harness.h" /* the run around the training loop */
#include "common/run/held_model.h" /* the model this process trains, as the step sees it */
#include "common/kernels/kernels.h" /* ops(): the kernel table */
#include "common/model/mixed.h" /* mixed precision: 16-bit weights, loss scaling */
#include "common/model/model.h" /* GPT, its forward and backward */
#include "03_model_parallel/model_parallel.h" /* 03: one model held by a group of ranks */
#include "03_model_parallel/expert_parallel.h" /* 03: experts split over ranks (--ep) */
#include "04_pipeline/pipeline.h" /* 04: a pipeline stage and its actions */
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
    model_parallel_effective_flags(cfg, &f->model);
    zero_effective_flags(cfg, &f->zero, &f->pipe, &f->model);
}
static void check_flags(const Config *cfg, const void *values) {
    const Flags *f = values;
    zero_check_flags(cfg, &f->zero, &f->pipe, &f->model, 1); /* 1: ZeRO's own step on one stage */
    expert_parallel_check_flags(cfg, &f->experts, &f->model);
    zero_refuse_expert_parallel(f->experts.ep, f->zero.zero, f->pipe.pp);
}

/* What the run harness (harness.h) needs to know of this program: its
 * flags, its steps.csv columns (a chapter keeps the columns of the one
 * before it and adds its own), and what else it reports. */
static const RunColumn columns[] = {
    {"idle_fraction", "%.4f"}, /* 1 - the ranks' busy time over ranks x the step (busy.csv) */
    {"ep_rows_max", "%.0f"},   /* --ep: the most rows one rank's experts computed in the step */
    {"ep_rows_mean", "%.1f"},  /* and the ranks' mean: max / mean is the load imbalance */
    {"bubble", "%.4f"},        /* the stages' idle time while the pipeline ran */
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
    int ranks = run.ranks;
    int half = cfg.precision != PRECISION_FP32;              /* 16-bit storage and communication (mixed.h) */
    ProcessGrid grid; /* --dp replicas of --cp x a model-parallel group (grid.h: tp fastest, then cp, pp, dp) */
    GridShape shape = pipeline_shape(&flags.pipe, &flags.model); /* the group: --pp stages of --tp ranks */
    grid_create(&grid, run.world, shape);
    if (grid.pp == 1 && grid.tp == 1 && grid.cp == 1)
        return train_sharded(&run, &cfg, &flags, &grid); /* ZeRO over the world */
    if (flags.pipe.print_schedule) return pipeline_print_schedules(&flags.pipe, cfg.micro, &grid); /* and exit */

    /* ---- build: device, data, output files (the harness); model, optimizer, activations ---- */
    run_prepare(&run);
    int per_rank = cfg.batch / grid.dp; /* this replica's share of the global batch */
    int B = per_rank / cfg.micro, T = cfg.model.seq;
    ParamTable table; /* the whole model's table: names, shapes, the stage split */
    param_table_build(&table, &cfg.model);
    char layout[64];
    Pipeline p; /* this stage: its units, activation slots, boundary buffers and schedule (pipeline.h) */
    StageStorage storage = {.caller_storage = flags.zero.zero > 0}; /* ZeRO: its shards, bound to the units */
    pipeline_build(&p, &cfg, &flags.model, &flags.pipe, flags.experts.ep, &grid, &run.data, B, &storage, layout,
                   sizeof layout);
    HeldModel held; /* this rank's part, as the step sees it (held_model.h) */
    pipeline_held(&p, &held);
    DataParallel replicas; /* the sum over the replicas of what this rank holds (data_parallel.h) */
    ZeroStage zero; /* --zero 1-2: that sum into shards, and AdamW on this rank's; 0: 04's (zero_stage.h) */
    zero_stage_create(&zero, &replicas, &p, &held, flags.zero.zero, dp, &grid);
    ExpertParallel experts = {0}; /* --ep: each MoE block's experts over N replicas (expert_parallel.h) */
    pipeline_split_experts(&p, &experts, &held, &replicas, &flags.experts, &flags.model);

    zero_stage_resume(&zero, &run, PROGRAM, flags.pipe.schedule); /* what this rank holds of a checkpoint */
    data_parallel_broadcast_weights(&replicas, held.mixed);

    log_info(
        "%s | %d ranks | device %s | comm %s | dp-mode %s | all-reduce %s | %zu parameters | batch %d = %d "
        "replicas x %d micro-batches x %d sequences | %s\n",
        PROGRAM, ranks, device_name(), comm_transport_name(), dp->dp_mode, dp->allreduce, table.num_params,
        cfg.batch, grid.dp, cfg.micro, B, precision_name(cfg.precision));
    if (replicas.overlap)
        log_info("overlap: %d gradient buckets of about %.2f MiB\n", replicas.buckets.count, dp->bucket_mb);
    log_info("model parallel: %d ranks = %d data-parallel x %d model-parallel | %s\n", ranks, grid.dp,
             grid.pp * grid.tp, layout);
    double bubble_theory = pipeline_log_layout(&p); /* the stages and the schedule's bubble formula */
    log_resumed(&cfg, run.first_step);

    double *bubbles = xcalloc(run.last_step, sizeof(double));
    for (int step = run.first_step; step < run.last_step; step++) {
        RunStep s = run_step_begin(&run, step);
        Timer timer = {0};
        pipeline_begin_step(&p, step); /* all ranks together: one time origin for the timeline */
        expert_parallel_begin_step(&experts, step); /* --ep: the all-to-alls' timeline */

        /* ---- forward and backward over the micro-batches; gradients accumulate ---- */
        precision_zero_grads(held.model, held.mixed);
        data_parallel_begin_step(&replicas);
        *held.moe = (MoeStats){0}; /* --experts: what this step's forwards route (moe.h) */
        double loss_sum = 0.0;
        for (int i = 0; i < p.schedule.count; i++) { /* the schedule: this stage's actions in order */
            /* a message runs here; a forward or a backward is micro-batch mb's, held at its slot (its
             * tokens and targets NULL where the action reads none) */
            const Action *a = pipeline_action_begin(&p, i, &held);
            int mb = a->micro;
            int first_sequence = grid.d * per_rank + mb * B; /* where this piece sits in the global batch */
            data_upload_batch(&run.data, SPLIT_TRAIN, cfg.seed, step, first_sequence, B, T, held.tokens,
                              held.targets);

            timer_start(&timer);
            /* fp16: the loss scaled by s.loss_scale, so the gradients come out that many times too large;
             * overlap: buckets start all-reducing during the LAST micro-batch's backward */
            if (a->kind == OP_FORWARD) {
                loss_sum += held_forward(&held, B, T);
                s.rec.fwd_ms += timer_stop_ms(&timer);
            } else if (schedule_op_backward(a->kind)) { /* whole, or zb-h1's B or W; a chunk's buckets */
                UnitHook launch = data_parallel_backward_hook(&replicas, mb == cfg.micro - 1); /* its last */
                held_backward(&held, run.dloss * s.loss_scale, B, T, launch, &replicas);
                s.rec.bwd_ms += timer_stop_ms(&timer);
            }
            pipeline_action_end(&p, i); /* its time in the stage's timeline */
        }
        pipeline_end_step(&p); /* posted sends done; a tied embedding's two ends summed */
        bubbles[step] = s.columns[3] = pipeline_measure_bubble(&p.times, &grid, run.world); /* bubble */

        /* ---- communicate: sum the gradients (and the loss) over the replicas ---- */
        s.rec.comm_ms = data_parallel_sum_gradients(&replicas, &s.comm_busy_ms);
        s.rec.comm_ms += p.times.comm_ms; /* and the time the stages' own messages took */
        double comm_ms = s.rec.comm_ms; /* this rank's (run_step_done keeps the slowest rank's) */
        s.rec.loss = comm_allreduce_double(run.world, loss_sum, 0) / run.tokens_per_step;
        s.moe = *held.moe;
        check_loss_finite(s.rec.loss, step + 1);

        /* ---- update: clip the global gradient norm, then AdamW (fp16: unless it overflowed) ---- */
        timer_start(&timer);
        OptimHyper hyper = optim_hyper(&cfg, step); /* lr_at_step's rate, betas, eps, wd, clip */
        s.rec.lr = hyper.lr;
        s.skipped = zero_stage_update(&zero, &run.scaler, &hyper, step + 1, &s.rec.grad_norm, &comm_ms,
                                      &s.comm_busy_ms); /* ZeRO: its collectives into comm_ms */
        s.rec.comm_ms = comm_ms;
        s.rec.opt_ms = timer_stop_ms(&timer);

        /* ---- log: evaluation when due, the progress line, steps.csv, a due checkpoint ---- */
        int evaluate = run_step_done(&run, &s);
        s.columns[0] = run_log_busy(&run, &s, comm_ms); /* idle_fraction */
        expert_parallel_load(&experts, run.world, &s.columns[1]); /* ep_rows_max, ep_rows_mean */
        if (dp->check_replicas && (step + 1) % dp->check_replicas == 0)
            data_parallel_check_replicas(&replicas, half ? held.mixed->master : held.model->params, step + 1);
        if (evaluate) s.rec.val_loss = held_evaluate(&held, &run.data, &cfg, grid.d, B);
        run_step_log(&run, &s);
    }
    data_parallel_print(&replicas);
    if (cfg.sample > 0) held_sample(&held, &run.data, &cfg, &run.rng);

    /* ---- run summary and memory: every rank's peaks, gathered on rank 0 ---- */
    run_layout(&run, grid.dp, grid.tp, grid.pp, flags.zero.zero);
    pipeline_finish(&p, &run, bubbles, bubble_theory, table.num_params); /* and timeline.csv, trace.json */
    free(bubbles);

    expert_parallel_destroy(&experts, held.model, run.world, cfg.out); /* --ep: timeline.csv */
    data_parallel_destroy(&replicas);
    zero_stage_destroy(&zero);
    pipeline_destroy(&p);
    param_table_free(&table);
    grid_destroy(&grid);
    run_end(&run);
    return 0;
}
