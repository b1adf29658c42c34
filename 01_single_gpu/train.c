/* 01_single_gpu/train.c: the whole training loop of a GPT on one device.
 *
 * The reference every later chapter is measured against: for the same flags,
 * their loss curves must equal this one's. Its lesson is memory (memory.csv):
 * parameters, their gradients and Adam's two moments (4 bytes each; with
 * --precision bf16|fp16 16-bit parameters and gradients, fp32 master weights:
 * mixed.h), and activations that grow with batch and sequence length. */
#include "common/run/config.h" /* Config and the flag tables */
#include "common/device/device.h" /* mem_alloc, copies, streams, timers */
#include "common/run/evaluate.h" /* validation loss and sampling */
#include "common/run/harness.h" /* the run around the training loop */
#include "common/run/held_model.h" /* the model this process trains, as the step sees it */
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
static const RunSpec spec = {
    .program = PROGRAM,
    .summary = "Train a GPT on one device (CPU or one GPU): the reference loop.",
};

int main(int argc, char **argv) {
    Config cfg;
    Run run; /* start-up, logs, evaluation, saves and the summary: harness.h */
    run_start(&run, &cfg, argc, argv, &spec);
    int half = cfg.precision != PRECISION_FP32; /* 16-bit storage (mixed.h) */

    /* ---- build: device, data, output files (the harness); model, optimizer, activations ---- */
    run_prepare(&run);
    int B = cfg.batch / cfg.micro, T = cfg.model.seq; /* a micro-batch is B sequences of T tokens */
    HeldModel held; /* the whole model, its activations and scratch (held_model.h) */
    held_model_whole(&held, &cfg, B, T);
    AdamW opt;
    adamw_create(&opt, held.model->param_count); /* the parameters this process holds */

    ckpt_layout_init(&run.ckpt, "%s: one device", PROGRAM); /* the whole model, as this device holds it */
    held_checkpoint_layout(&held, &opt, 0, 1, &run.ckpt);
    if (run_resume(&run, &opt.t) && half) mixed_weights_from_master(held.mixed); /* the checkpoint: fp32 */
    log_info("%s | device %s | %zu parameters | %d layers, d %d, %d heads, seq %d | batch %d = %d "
             "micro-batches x %d "
             "sequences | %s | data %s (%zu bytes)\n",
             PROGRAM, device_name(), held.model->num_params, cfg.model.layers, cfg.model.dmodel,
             cfg.model.heads, T, cfg.batch, cfg.micro, B, precision_name(cfg.precision), cfg.data,
             run.data.size);
    log_resumed(&cfg, run.first_step);

    for (int step = run.first_step; step < run.last_step; step++) {
        RunStep s = run_step_begin(&run, step);
        Timer timer = {0};

        /* ---- forward and backward over the micro-batches; gradients accumulate ---- */
        precision_zero_grads(held.model, held.mixed);
        *held.moe = (MoeStats){0}; /* --experts: what this step's forwards route (moe.h) */
        double loss_sum = 0.0;
        for (int mb = 0; mb < cfg.micro; mb++) {
            data_upload_batch(&run.data, SPLIT_TRAIN, cfg.seed, step, mb * B, B, T, held.tokens,
                              held.targets);

            timer_start(&timer);
            loss_sum += held_forward(&held, B, T);
            s.rec.fwd_ms += timer_stop_ms(&timer);

            timer_start(&timer);
            /* fp16: the loss scaled by s.loss_scale, so the gradients come out that many times too large */
            held_backward(&held, run.dloss * s.loss_scale, B, T, NULL, NULL);
            s.rec.bwd_ms += timer_stop_ms(&timer);
        }
        s.rec.loss = loss_sum / run.tokens_per_step;
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
        if (run_step_done(&run, &s)) s.rec.val_loss = held_evaluate(&held, &run.data, &cfg, 0, B);
        run_step_log(&run, &s);
    }
    if (cfg.sample > 0) held_sample(&held, &run.data, &cfg, &run.rng);

    /* ---- run summary and memory ---- */
    run_finish(&run, held.model->num_params, NULL, NULL, "CSVs in %s", cfg.out);

    adamw_destroy(&opt);
    held_model_destroy(&held, &cfg);
    run_end(&run);
    return 0;
}
