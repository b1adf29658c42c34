/* 01_single_gpu/train.c: the whole training loop of a GPT on one device.
 *
 * This is the reference every later chapter is measured against: for the
 * same flags, their loss curves must equal this program's. One step:
 *
 *   for each micro-batch:  data -> forward -> backward (gradients accumulate)
 *   gradient norm -> clip -> AdamW update -> log
 *
 * Memory (memory.csv) is the lesson of this chapter: parameters (4 bytes
 * each), their gradients (4), Adam's two moments (8), plus activations that
 * grow with batch and sequence length. With --precision bf16 or fp16 the
 * parameters and gradients are 2 bytes each and fp32 master weights join the
 * optimizer state (mixed.h; course.md teaches it with chapter 05). */
#include "checkpoint.h"
#include "config.h"
#include "csvlog.h"
#include "data.h"
#include "device.h"
#include "evaluate.h"
#include "mixed.h"
#include "model.h"
#include "optim.h"
#include "optimizer_step.h"
#include "preflight.h"
#include "util.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#define PROGRAM "01_single_gpu/train"

int main(int argc, char **argv) {
    Config cfg;
    config_parse(&cfg, argc, argv, PROGRAM, "Train a GPT on one device (CPU or one GPU): the reference loop.",
                 NULL);

    /* ---- build: device, data, output files, model, optimizer, activations ---- */
    device_init(cfg.device, 0);
    device_set_limit(cfg.device_mem_limit);
    Dataset data;
    data_load(&data, cfg.data, cfg.model.seq);
    out_dir_prepare(&cfg, PROGRAM);
    int half = cfg.precision != PRECISION_FP32; /* 16-bit storage (mixed.h) */
    OutFile *steps_csv = steps_csv_open(&cfg, half ? ",loss_scale,skipped" : NULL);

    GPT model;
    MixedModel mixed = {0};
    if (half)
        mixed_create(&mixed, &model, &cfg.model, cfg.seed, precision_format(cfg.precision));
    else
        gpt_create(&model, &cfg.model, cfg.seed);
    AdamW opt;
    adamw_create(&opt, model.num_params);
    LossScaler scaler;
    loss_scaler_init(&scaler, &cfg);
    int B = cfg.batch / cfg.micro, T = cfg.model.seq; /* a micro-batch is B sequences of T tokens */
    Activations acts;
    activations_create_model(&acts, &cfg.model, B, T, cfg.recompute);
    Scratch scratch;
    scratch_create(&scratch, &cfg.model, B, T, cfg.recompute);

    uint64_t rng = cfg.seed; /* for the text sampler */
    CkptLayout ckpt;         /* a checkpoint holds the whole model; so does this device */
    ckpt_layout_init(&ckpt, "%s: one device", PROGRAM);
    ckpt_layout_range(&ckpt, &model, &opt, 0, 1);
    int first_step = 0;
    if (cfg.resume[0]) first_step = checkpoint_resume(&cfg, &ckpt, &opt.t, &rng, &scaler);
    if (cfg.resume[0] && half) mixed_weights_from_master(&mixed); /* the checkpoint holds the fp32 weights */
    int last_step = cfg.stop_after ? cfg.stop_after : cfg.steps;

    log_info("%s | device %s | %zu parameters | %d layers, d %d, %d heads, seq %d | batch %d = %d "
             "micro-batches x %d sequences | %s | data %s "
             "(%zu bytes)\n",
             PROGRAM, device_name(), model.num_params, cfg.model.layers, cfg.model.dmodel, cfg.model.heads, T,
             cfg.batch, cfg.micro, B, precision_name(cfg.precision), cfg.data, data.size);
    log_resumed(&cfg, first_step);

    double tokens_per_step = (double)cfg.batch * T;
    float dloss =
        (float)(1.0 / tokens_per_step); /* the loss is the mean over every token of the global batch */
    double *step_ms = xcalloc(last_step, sizeof(double));
    double loss = NAN;

    for (int step = first_step; step < last_step; step++) {
        Timer step_timer = {0}, timer = {0};
        StepRecord rec = {.step = step + 1, .val_loss = NAN};
        profile_step_begin(step + 1);
        timer_start(&step_timer);

        /* ---- forward and backward over the micro-batches; gradients accumulate ---- */
        precision_zero_grads(&model, &mixed);
        float loss_scale = scaler.scale; /* fp16: the gradients come out this many times too large */
        double loss_sum = 0.0;
        for (int mb = 0; mb < cfg.micro; mb++) {
            data_upload_batch(&data, SPLIT_TRAIN, cfg.seed, step, mb * B, B, T, acts.tokens, acts.targets);

            timer_start(&timer);
            gpt_forward(&model, &acts, &scratch, B, T);
            loss_sum += gpt_loss_sum(&acts, B, T);
            rec.fwd_ms += timer_stop_ms(&timer);

            timer_start(&timer);
            gpt_backward(&model, &acts, &scratch, dloss * loss_scale, B, T);
            rec.bwd_ms += timer_stop_ms(&timer);
        }
        loss = loss_sum / tokens_per_step;
        check_loss_finite(loss, step + 1);

        /* ---- update: clip the global gradient norm, then AdamW (fp16: unless it overflowed) ---- */
        timer_start(&timer);
        OptimHyper hyper = optim_hyper(&cfg, step); /* lr_at_step's rate, betas, eps, wd, clip */
        rec.lr = hyper.lr;
        mixed_fault_overflow(&mixed, step + 1); /* tests: an overflow where COURSE_FAULT_OVERFLOW_* say */
        GradShards held = precision_grad_shards(&model, &mixed); /* the whole gradient, on one process */
        int skipped = optimizer_step(&model, &mixed, &opt, &scaler, &held, &hyper, step + 1, &rec.grad_norm);
        rec.opt_ms = timer_stop_ms(&timer);
        rec.step_ms = timer_stop_ms(&step_timer);
        profile_step_end(step + 1);

        /* ---- log ---- */
        rec.loss = loss;
        rec.tokens_per_s = tokens_per_step / (rec.step_ms / 1e3);
        step_ms[step] = rec.step_ms;
        int last = step + 1 == last_step;
        if (last || (cfg.eval_every && (step + 1) % cfg.eval_every == 0))
            rec.val_loss = evaluate_loss(&model, &acts, &scratch, &data, &cfg);
        if (!cfg.quiet || last) log_step(&rec, cfg.steps);
        char scaling[64];
        snprintf(scaling, sizeof scaling, ",%g,%d", loss_scale, skipped);
        steps_csv_write(steps_csv, &rec, half ? scaling : NULL);
        if (checkpoint_due(&cfg, step + 1, last_step)) {
            CkptState state = ckpt_state(step + 1, opt.t, rng, &scaler);
            checkpoint_save(&cfg, &ckpt, &state);
        }
    }
    out_close(steps_csv);
    if (cfg.sample > 0) sample_text(&model, &acts, &scratch, &data, cfg.sample, &rng);

    /* ---- run summary and memory ---- */
    int ran = last_step - first_step;
    RunSummary run;
    run_summary_init(&run, PROGRAM, &cfg, model.num_params, step_ms + first_step, ran);
    run.final_loss = loss;
    run.peak_device_bytes = mem_peak_total(SPACE_DEVICE);
    run_csv_write(cfg.out, &run);
    size_t peaks[SPACE_COUNT * CAT_COUNT];
    memory_peaks_local(peaks);
    memory_csv_write(cfg.out, 1, peaks);
    run_info_complete(&cfg);
    log_run_done(&run, "CSVs in %s", cfg.out);

    free(step_ms);
    ckpt_layout_free(&ckpt);
    scratch_destroy(&scratch);
    activations_destroy(&acts, &cfg.model);
    adamw_destroy(&opt);
    if (half) mixed_destroy(&mixed);
    gpt_destroy(&model);
    data_free(&data);
    device_shutdown();
    return 0;
}
