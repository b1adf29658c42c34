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
#include "common/run/config.h" /* Config and the flag tables */
#include "common/device/device.h" /* mem_alloc, copies, streams, timers */
#include "common/run/evaluate.h" /* validation loss and sampling */
#include "common/run/harness.h" /* the run around the training loop */
#include "common/model/mixed.h" /* mixed precision: 16-bit weights, loss scaling */
#include "common/model/model.h" /* GPT, its forward and backward */
#include "common/model/optim.h" /* AdamW and the learning-rate schedule */
#include "common/model/optimizer_step.h" /* the optimizer step: norm, clip, skip, AdamW */
#include "common/core/util.h" /* fatal, log_info, exit codes, flag parsing */

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#define PROGRAM "01_single_gpu/train"

/* What the run harness (harness.h) needs to know of this program. */
static const RunSpec spec = {.program = PROGRAM,
                             .summary = "Train a GPT on one device (CPU or one GPU): the reference loop."};

int main(int argc, char **argv) {
    Config cfg;
    Run run; /* start-up, logs, evaluation, saves and the summary: harness.h */
    run_start(&run, &cfg, argc, argv, &spec);
    int half = cfg.precision != PRECISION_FP32; /* 16-bit storage (mixed.h) */

    /* ---- build: device, data, output files (the harness); model, optimizer, activations ---- */
    run_prepare(&run);
    GPT model;
    MixedModel mixed; /* bf16, fp16: the model in 16 bits (mixed.h) */
    precision_create_range(&model, &mixed, &cfg.model, cfg.seed, cfg.precision, LAYER_EMBEDDING,
                           cfg.model.layers);
    AdamW opt;
    adamw_create(&opt, model.num_params);
    int B = cfg.batch / cfg.micro, T = cfg.model.seq; /* a micro-batch is B sequences of T tokens */
    Activations acts;
    activations_create_model(&acts, &cfg.model, B, T, cfg.recompute);
    Scratch scratch;
    scratch_create(&scratch, &cfg.model, B, T, cfg.recompute);

    ckpt_layout_init(&run.ckpt, "%s: one device", PROGRAM); /* the whole model, as this device holds it */
    ckpt_layout_range(&run.ckpt, &model, &opt, 0, 1);
    if (run_resume(&run, &opt.t) && half) mixed_weights_from_master(&mixed); /* the checkpoint: fp32 */
    log_info("%s | device %s | %zu parameters | %d layers, d %d, %d heads, seq %d | batch %d = %d "
             "micro-batches x %d "
             "sequences | %s | data %s (%zu bytes)\n",
             PROGRAM, device_name(), model.num_params, cfg.model.layers, cfg.model.dmodel, cfg.model.heads, T,
             cfg.batch, cfg.micro, B, precision_name(cfg.precision), cfg.data, run.data.size);
    log_resumed(&cfg, run.first_step);

    for (int step = run.first_step; step < run.last_step; step++) {
        RunStep s = run_step_begin(&run, step);
        Timer timer = {0};

        /* ---- forward and backward over the micro-batches; gradients accumulate ---- */
        precision_zero_grads(&model, &mixed);
        acts.moe.stats = (MoeStats){0}; /* --experts: what this step's forwards route (moe.h) */
        double loss_sum = 0.0;
        for (int mb = 0; mb < cfg.micro; mb++) {
            data_upload_batch(&run.data, SPLIT_TRAIN, cfg.seed, step, mb * B, B, T, acts.tokens,
                              acts.targets);

            timer_start(&timer);
            gpt_forward(&model, &acts, &scratch, B, T);
            loss_sum += gpt_loss_sum(&acts, B, T);
            s.rec.fwd_ms += timer_stop_ms(&timer);

            timer_start(&timer);
            /* fp16: the loss scaled by s.loss_scale, so the gradients come out that many times too large */
            gpt_backward(&model, &acts, &scratch, run.dloss * s.loss_scale, B, T);
            s.rec.bwd_ms += timer_stop_ms(&timer);
        }
        s.rec.loss = loss_sum / run.tokens_per_step;
        s.moe = acts.moe.stats;
        check_loss_finite(s.rec.loss, step + 1);

        /* ---- update: clip the global gradient norm, then AdamW (fp16: unless it overflowed) ---- */
        timer_start(&timer);
        OptimHyper hyper = optim_hyper(&cfg, step); /* lr_at_step's rate, betas, eps, wd, clip */
        s.rec.lr = hyper.lr;
        GradShards held = precision_grad_shards(&model, &mixed); /* this process holds the whole gradient */
        s.skipped =
            optimizer_step(&model, &mixed, &opt, &run.scaler, &held, &hyper, step + 1, &s.rec.grad_norm);
        s.rec.opt_ms = timer_stop_ms(&timer);

        /* ---- log: evaluation when due, the progress line, steps.csv, a due checkpoint ---- */
        if (run_step_done(&run, &s)) s.rec.val_loss = evaluate_loss(&model, &acts, &scratch, &run.data, &cfg);
        run_step_log(&run, &s);
    }
    if (cfg.sample > 0) sample_text(&model, &acts, &scratch, &run.data, cfg.sample, &run.rng);

    /* ---- run summary and memory ---- */
    run_finish(&run, model.num_params, NULL, NULL, "CSVs in %s", cfg.out);

    scratch_destroy(&scratch);
    activations_destroy(&acts, &cfg.model);
    adamw_destroy(&opt);
    precision_destroy(&model, &mixed);
    run_end(&run);
    return 0;
}
