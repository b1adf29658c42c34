/* 05_zero/train.c: data parallelism without redundancy (ZeRO stages 0-3).
 *
 * Chapter 02's loop, with the model state cut across the N ranks instead of
 * copied onto each (zero.h has the table of what each stage keeps). Every
 * rank still trains on 1/N of the global batch and the gradients are still
 * summed over the ranks, so the losses are chapter 01's; what changes is
 * which collective moves which state, and how much memory each rank needs:
 *
 *   for each micro-batch of this rank's share:
 *       data -> forward (stage 3: gather each unit, free it after)
 *            -> backward (stages 2-3: reduce-scatter each unit's gradient as it is done)
 *   stages 0-1: sum the gradients (0: all-reduce; 1: reduce-scatter)
 *   gradient norm from the slices -> clip -> AdamW on this rank's slices
 *   stages 1-2: all-gather the updated parameters -> log
 *
 * With --precision bf16|fp16 the parameters, gradients and collectives are
 * 16 bits and the optimizer keeps fp32 master weights of its slices (zero.h);
 * fp16 scales the loss and skips a step that overflowed on any rank. */
#include "checkpoint_sharded.h"
#include "comm.h"
#include "config.h"
#include "csvlog.h"
#include "data.h"
#include "device.h"
#include "evaluate.h"
#include "grid.h"
#include "mixed.h"
#include "model.h"
#include "optim.h"
#include "preflight.h"
#include "util.h"
#include "zero.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#define PROGRAM "05_zero/train"

/* ---- this chapter's flags ---- */
typedef struct {
    int stage;          /* --zero 0..3 */
    int prefetch;       /* --prefetch K: stage 3 gathers K units ahead */
    int print_schedule; /* print stage 3's gather/free schedule */
    int ranks;          /* the world size, for the checks */
} ZeroFlags;

/* --help's section and one row per flag (config.h says how to add one) */
static const Flag zero_flags[] = {
    {.type = FLAG_SECTION,
     .help = "ZeRO data parallel (run with mpirun -np N; the model state is sharded over the N ranks)"},
    {"--zero", FLAG_INT, FIELD(ZeroFlags, stage), 0, 3, .def = "1", .usage = "--zero 0|1|2|3",
     .help = "0: every rank holds everything, gradients all-reduced (chapter 02's\n"
             "flat mode); 1: optimizer state sharded; 2: gradients too; 3: parameters\n"
             "too (default {default}). Any number of ranks: every unit is padded to a\n"
             "multiple of N (zeros nobody updates), so N may exceed a unit's size"},
    {"--prefetch", FLAG_INT, FIELD(ZeroFlags, prefetch), 0, 64, .def = "1", .usage = "--prefetch K",
     .help = "stage 3: gather the next K units (on a communication thread) while\n"
             "the current one computes, 0..64 (default {default}; needs --zero 3)"},
    {"--print-schedule", FLAG_SWITCH, FIELD(ZeroFlags, print_schedule), .usage = "--print-schedule",
     .help = "stage 3: print one micro-batch's gather/free schedule (needs --zero 3)"},
    {0},
};

/* Stage 3's flags mean nothing below it: refused, not ignored. Each rank
 * needs a whole number of micro-batches of at least one sequence. */
static void check_zero_layout(const Config *cfg, const void *values) {
    const ZeroFlags *f = values;
    if (flag_given(cfg, "--prefetch") && f->stage != 3)
        fatal(EXIT_USAGE, "--prefetch needs --zero 3 (only stage 3 gathers parameters)");
    if (f->print_schedule && f->stage != 3)
        fatal(EXIT_USAGE, "--print-schedule needs --zero 3 (only stage 3 has a gather/free schedule)");
    int sequences_per_micro = f->ranks * cfg->micro;
    if (cfg->batch < sequences_per_micro || cfg->batch % sequences_per_micro)
        fatal(EXIT_USAGE, "--batch %d does not split into %d ranks x --micro %d (valid: a multiple of %d)",
              cfg->batch, f->ranks, cfg->micro, sequences_per_micro);
}

/* Validation loss and the sample need the whole model in fp32: stage 3
 * gathers it for them, 16-bit runs widen it (every rank takes part; rank 0
 * uses it). Its buffer is allocated before step 1 and kept, because every
 * run evaluates at its last step: a budget that cannot hold it is refused
 * at start-up, not after the whole run has trained. NULL when the model is
 * held whole in fp32 already (stages 0-2 in fp32). */
static float *alloc_whole_model(const Zero *z) {
    if (!zero_needs_whole(z)) return NULL;
    return mem_alloc(SPACE_DEVICE, CAT_WORKSPACE, z->model->num_params * sizeof(float),
                     "the whole model in fp32 for evaluation");
}

static double evaluate_and_sample(Zero *z, float *whole, Activations *acts, Scratch *scratch,
                                  const Dataset *data, const Config *cfg, int sample, uint64_t *rng) {
    GPT *model = z->model;
    if (whole) zero_bind_whole(z, whole);
    double val_loss = NAN;
    if (comm_rank(z->group) == 0) {
        val_loss = evaluate_loss(model, acts, scratch, data, cfg);
        if (sample > 0) sample_text(model, acts, scratch, data, sample, rng);
    }
    if (whole) zero_unbind_whole(z);
    return val_loss;
}

int main(int argc, char **argv) {
    comm_init(&argc, &argv);
    CommGroup *world = comm_world();
    int rank = comm_rank(world), ranks = comm_size(world);

    Config cfg;
    ZeroFlags zf = {.ranks = ranks};
    ChapterFlags flags = {.flags = zero_flags, .values = &zf, .check = check_zero_layout, .multi_rank = 1};
    comm_parse_config(&cfg, argc, argv, PROGRAM,
                      "Train a GPT with ZeRO: data parallelism with the model state sharded over the ranks.",
                      &flags);
    checkpoint_check_shared_directory(world, &cfg);

    /* ---- the grid: every rank a replica, dp = world, sharing the model state (grid.h) ---- */
    ProcessGrid grid;
    grid_create(&grid, world, (GridShape){.dp = ranks, .pp = 1, .cp = 1, .tp = 1});

    /* ---- build: device, data, output files, the sharded model and optimizer, activations ---- */
    int half = cfg.precision != PRECISION_FP32; /* 16-bit storage and communication (mixed.h) */
    device_init(cfg.device, comm_local_rank());
    device_set_limit(cfg.device_mem_limit);
    comm_select(cfg.comm);
    Dataset data;
    data_load(&data, cfg.data, cfg.model.seq);
    OutFile *steps_csv = NULL;
    if (rank == 0) {
        out_dir_prepare(&cfg, PROGRAM);
        steps_csv = steps_csv_open(&cfg, half ? ",bytes_sent,comm_busy_ms,loss_scale,skipped" : ",bytes_sent,comm_busy_ms");
    }

    GPT model;
    Zero zero;
    zero_create_precision(&zero, &model, &cfg.model, cfg.seed, zf.stage, zf.prefetch, grid.dp_group,
                          cfg.precision);
    LossScaler scaler;
    loss_scaler_init(&scaler, &cfg);
    const UnitHooks *hooks = zero_hooks(&zero);
    int per_rank = cfg.batch / ranks; /* this rank's share of the global batch */
    int B = per_rank / cfg.micro, T = cfg.model.seq, L = cfg.model.layers;
    Activations acts;
    activations_create_model(&acts, &cfg.model, B, T, cfg.recompute);
    Scratch scratch;
    scratch_create(&scratch, &cfg.model, B, T, cfg.recompute);
    float *whole = alloc_whole_model(&zero);

    uint64_t rng = cfg.seed;
    CkptLayout ckpt; /* each rank writes and reads its own shards of the whole model's arrays */
    ckpt_layout_init(&ckpt, "%s: %d ranks, zero %d", PROGRAM, ranks, zf.stage);
    zero_checkpoint_layout(&zero, &ckpt);
    int first_step = 0;
    if (cfg.resume[0]) {
        first_step = checkpoint_resume(&cfg, &ckpt, &zero.opt.t, &rng, &scaler);
        zero_weights_from_master(&zero); /* 16 bits: the checkpoint holds the fp32 weights */
    }
    int last_step = cfg.stop_after ? cfg.stop_after : cfg.steps;

    char prefetch[32] = ""; /* stage 3 only: the other stages gather nothing */
    if (zf.stage == 3) snprintf(prefetch, sizeof prefetch, " | prefetch %d", zf.prefetch);
    log_info("%s | %d ranks | device %s | comm %s | zero %d%s | %zu parameters, %zu per shard | "
             "batch %d = %d ranks x %d micro-batches x %d sequences | %s\n",
             PROGRAM, ranks, device_name(), comm_transport_name(), zf.stage, prefetch, model.num_params,
             zero.shard_n, cfg.batch, ranks, cfg.micro, B, precision_name(cfg.precision));
    log_resumed(&cfg, first_step);
    if (zf.print_schedule) zero_print_schedule(zero.actions, zero.num_actions);

    double tokens_per_step = (double)cfg.batch * T;
    float dloss = (float)(1.0 / tokens_per_step); /* the mean over every token of the GLOBAL batch */
    double *step_ms = xcalloc(last_step, sizeof(double));
    double loss = NAN, train_bytes = 0.0;

    for (int step = first_step; step < last_step; step++) {
        Timer step_timer = {0}, timer = {0};
        StepRecord rec = {.step = step + 1, .val_loss = NAN};
        double bytes_at_start = comm_bytes_sent();
        comm_barrier(world); /* every rank starts the step together: one time origin for the timeline */
        zero_start_clock(&zero, step);
        timer_start(&step_timer);

        /* ---- forward and backward over this rank's micro-batches ---- */
        zero_begin_step(&zero);
        float loss_scale = scaler.scale; /* fp16: the gradients come out this many times too large */
        double loss_sum = 0.0;
        for (int mb = 0; mb < cfg.micro; mb++) {
            int first_sequence = rank * per_rank + mb * B; /* where this piece sits in the global batch */
            data_upload_batch(&data, SPLIT_TRAIN, cfg.seed, step, first_sequence, B, T, acts.tokens,
                              acts.targets);
            zero_begin_micro(&zero, mb);

            timer_start(&timer);
            gpt_forward_range(&model, &acts, &scratch, LAYER_EMBEDDING, L, 1, hooks, B, T);
            loss_sum += gpt_loss_sum(&acts, B, T);
            rec.fwd_ms += timer_stop_ms(&timer);

            timer_start(&timer);
            gpt_backward_range(&model, &acts, &scratch, LAYER_EMBEDDING, L, dloss * loss_scale, NULL, NULL,
                               hooks, B, T);
            rec.bwd_ms += timer_stop_ms(&timer);
        }

        /* ---- communicate: sum the gradients (stages 2-3 did most of it during backward) ---- */
        zero_sync_grads(&zero);
        loss = comm_allreduce_double(grid.dp_group, loss_sum, 0) / tokens_per_step;
        check_loss_finite(loss, step + 1);

        /* ---- update: this rank's slices, then (stages 1-2) all-gather the parameters ---- */
        timer_start(&timer);
        OptimHyper hyper = optim_hyper(&cfg, step); /* lr_at_step's rate, betas, eps, wd, clip */
        rec.lr = hyper.lr;
        int skipped = zero_step_update(&zero, &scaler, &hyper, step + 1, &rec.grad_norm);
        rec.opt_ms = timer_stop_ms(&timer);
        rec.step_ms = timer_stop_ms(&step_timer);
        rec.comm_ms = zero.comm_ms; /* waiting on communication, wherever in the step */
        double busy_ms = zero.comm_busy_ms; /* the collectives running, hidden or not */
        double step_bytes = comm_bytes_sent() - bytes_at_start;
        train_bytes += step_bytes;

        /* ---- log: the slowest rank's times ---- */
        comm_slowest_times(world, &rec);
        busy_ms = comm_allreduce_double(world, busy_ms, 1);
        rec.loss = loss;
        rec.tokens_per_s = tokens_per_step / (rec.step_ms / 1e3);
        step_ms[step] = rec.step_ms;
        /* the save comes before the evaluation: a failure there loses no step */
        if (checkpoint_due(&cfg, step + 1, last_step)) {
            CkptState state = ckpt_state(step + 1, zero.opt.t, rng, &scaler);
            checkpoint_save_sharded(world, &cfg, &ckpt, &state);
        }
        int last = step + 1 == last_step;
        if (last || (cfg.eval_every && (step + 1) % cfg.eval_every == 0))
            rec.val_loss = evaluate_and_sample(&zero, whole, &acts, &scratch, &data, &cfg, 0, &rng);
        if (rank == 0) {
            if (!cfg.quiet || last) log_step(&rec, cfg.steps);
            char extra_values[64];
            if (half)
                snprintf(extra_values, sizeof extra_values, ",%.0f,%.4f,%g,%d", step_bytes, busy_ms, loss_scale,
                         skipped);
            else
                snprintf(extra_values, sizeof extra_values, ",%.0f,%.4f", step_bytes, busy_ms);
            steps_csv_write(steps_csv, &rec, extra_values);
        }
    }

    if (cfg.sample > 0) evaluate_and_sample(&zero, whole, &acts, &scratch, &data, &cfg, cfg.sample, &rng);
    if (rank == 0) out_close(steps_csv);

    /* ---- timeline, run summary and memory: every rank's, gathered on rank 0 ---- */
    timeline_write(&zero.timeline, world, cfg.out);
    size_t peak_device = comm_write_memory_csv(world, cfg.out);
    int ran = last_step - first_step;
    double bytes_per_step = ran ? train_bytes / ran : 0.0; /* this rank's; the ranks send alike */
    if (rank == 0) {
        RunSummary run;
        run_summary_init(&run, PROGRAM, &cfg, model.num_params, step_ms + first_step, ran);
        run.world_size = run.dp = ranks;
        run.zero = zf.stage;
        run.final_loss = loss;
        run.peak_device_bytes = peak_device;
        char extra_values[64];
        snprintf(extra_values, sizeof extra_values, ",%d,%.0f,%s", zf.prefetch, bytes_per_step,
                 precision_name(cfg.precision));
        run_csv_write_extra(cfg.out, &run, ",prefetch,bytes_sent_per_step,precision", extra_values);
        run_info_complete(&cfg);
        log_run_done(&run, "%.2f MiB sent per rank per step | CSVs, timeline.csv and trace.json in %s",
                     bytes_per_step / BYTES_PER_MIB, cfg.out);
    }

    free(step_ms);
    ckpt_layout_free(&ckpt);
    mem_free(whole);
    scratch_destroy(&scratch);
    activations_destroy(&acts, &cfg.model);
    zero_destroy(&zero);
    gpt_destroy(&model);
    data_free(&data);
    device_shutdown();
    grid_destroy(&grid);
    comm_finalize();
    return 0;
}
