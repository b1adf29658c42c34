/* 04_pipeline/train.c: pipeline parallelism, in a pp x cp x tp x dp layout.
 *
 * Chapter 03's loop, but the layer split's stages (pipeline.h) work on
 * different micro-batches at once: the loop over the micro-batches becomes
 * the loop over this stage's actions (schedule.h: gpipe, 1f1b, interleaved,
 * zb-h1). The stages' idle time is the bubble, beside its formula. */
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
    model_parallel_effective_flags(cfg, &f->model);
    pipeline_effective_flags(cfg, &f->pipe, &f->model);
}
static void check_flags(const Config *cfg, const void *values) {
    const Flags *f = values;
    pipeline_check_flags(cfg, &f->pipe, &f->model);
    expert_parallel_check_flags(cfg, &f->experts, &f->model);
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
    int ranks = run.ranks;
    int half = cfg.precision != PRECISION_FP32;              /* 16-bit storage and communication (mixed.h) */
    ProcessGrid grid; /* --dp replicas of --cp x a model-parallel group (grid.h: tp fastest, then cp, pp, dp) */
    GridShape shape = pipeline_shape(&flags.pipe, &flags.model); /* the group: --pp stages of --tp ranks */
    grid_create(&grid, run.world, shape);
    if (flags.pipe.print_schedule) return pipeline_print_schedules(&flags.pipe, cfg.micro, &grid); /* and exit */

    /* ---- build: device, data, output files (the harness); model, optimizer, activations ---- */
    run_prepare(&run);
    int per_rank = cfg.batch / grid.dp; /* this replica's share of the global batch */
    int B = per_rank / cfg.micro, T = cfg.model.seq;
    ParamTable table; /* the whole model's table: names, shapes, the stage split */
    param_table_build(&table, &cfg.model);
    char layout[64];
    Pipeline p; /* this stage: its units, activation slots, boundary buffers and schedule (pipeline.h) */
    pipeline_build(&p, &cfg, &flags.model, &flags.pipe, flags.experts.ep, &grid, &run.data, B, NULL, layout,
                   sizeof layout);
    HeldModel held; /* this rank's part, as the step sees it (held_model.h) */
    pipeline_held(&p, &held);
    AdamW opt;
    adamw_create(&opt, held.model->param_count); /* the parameters this process holds */
    DataParallel replicas; /* the sum over the replicas of what this rank holds (data_parallel.h) */
    data_parallel_create(&replicas, dp, grid.weight_group, held.model, held.mixed, cfg.precision);
    ExpertParallel experts = {0}; /* --ep: each MoE block's experts over N replicas (expert_parallel.h) */
    pipeline_split_experts(&p, &experts, &held, &replicas, &flags.experts, &flags.model);

    pipeline_ckpt_layout_init(&run.ckpt, PROGRAM, &grid, flags.pipe.schedule, NULL);
    held_checkpoint_layout(&held, &opt, grid.d, grid.dp, &run.ckpt); /* replica d writes share d */
    if (run_resume(&run, &opt.t) && half) mixed_weights_from_master(held.mixed); /* the checkpoint: fp32 */
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
        GradShards grads = held_grad_shards(&held, run.world); /* what this process holds of the gradient */
        s.skipped = optimizer_step(held.model, held.mixed, &opt, &run.scaler, &grads, &hyper, step + 1,
                                   &s.rec.grad_norm);
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
    run_layout(&run, grid.dp, grid.tp, grid.pp, 0);
    pipeline_finish(&p, &run, bubbles, bubble_theory, table.num_params); /* and timeline.csv, trace.json */
    free(bubbles);

    expert_parallel_destroy(&experts, held.model, run.world, cfg.out); /* --ep: timeline.csv */
    data_parallel_destroy(&replicas);
    adamw_destroy(&opt);
    pipeline_destroy(&p);
    param_table_free(&table);
    grid_destroy(&grid);
    run_end(&run);
    return 0;
}
