/* zero_stage.c: see zero_stage.h. */
#include "05_zero/zero_stage.h" /* 05: a stage's gradients under ZeRO */

#include "common/run/layout_rules.h" /* shared refusals of a layout */
#include "common/model/mixed.h" /* mixed precision: 16-bit weights, loss scaling */
#include "common/model/optimizer_step.h" /* the optimizer step: norm, clip, skip, AdamW */
#include "03_model_parallel/tensor_parallel.h" /* 03: tensor parallelism */

#include <string.h>

/* --zero 1-2: the replicas' calls of the step (data_parallel_take_over). */
static void zero_replicas_begin_step(void *owner) {
    ZeroStage *s = owner;
    zero_start_clock(&s->z, s->p->now.step); /* pipeline_begin_step's, earlier in the step */
    zero_begin_step(&s->z);
    tied_ends_begin_step(&s->tied);
}
static double zero_replicas_sum_gradients(void *owner, double *busy_ms) {
    ZeroStage *s = owner;
    (void)busy_ms; /* the update reports ZeRO's collectives, wherever in the step they ran */
    zero_sync_grads(&s->z); /* stage 1: reduce-scatter; 2: the last units' reduce-scatters */
    /* tied on several stages: the head's gradient of wte, summed over the last stage's replicas,
     * into the first stage's slice of the embedding unit's (tied_ends.h) */
    double start = wall_ms();
    const float *head_slice = tied_ends_sum_gradient(&s->tied);
    if (head_slice) zero_add_slice(&s->z, LAYER_EMBEDDING, head_slice);
    return s->tied.end != TIED_NONE ? wall_ms() - start : 0.0; /* ZeRO's own waits count in the update */
}
static const DataParallelOps zero_replicas = {.begin_step = zero_replicas_begin_step,
                                              .sum_gradients = zero_replicas_sum_gradients};

void zero_stage_create(ZeroStage *s, DataParallel *replicas, Pipeline *p, HeldModel *held, int zero,
                       const DataParallelFlags *dp, const ProcessGrid *grid) {
    *s = (ZeroStage){.zero = zero, .p = p, .held = held, .replicas = replicas, .grid = grid};
    const Config *cfg = p->layout.cfg;
    if (!zero) { /* chapter 04's: the replicas' all-reduce, AdamW on what this rank holds */
        data_parallel_create(replicas, dp, grid->weight_group, held->model, held->mixed, cfg->precision);
        adamw_create(&s->opt, held->model->param_count);
        return;
    }
    if (p->layout.tensor) /* each unit's tp slices sharded; the norm counts each parameter once */
        zero_create_slices(&s->z, &p->tpm, cfg->seed, zero, grid->weight_group, grid->world, cfg->precision);
    else /* the norm's sums over the world: every stage's slices */
        zero_create_stage(&s->z, &p->model, &cfg->model, cfg->seed, zero, grid->weight_group, grid->world,
                          cfg->precision);
    /* ZeRO's calls around each unit are the units' storage (model.h), not the
     * pipeline's hooks (the tp blocks, if any): a split backward (zb-h1) runs
     * them around B and again around W, and each reduce-scatters what its
     * half added, the other half's elements zeros (zero_stage.h) */
    p->model.storage = zero_hooks(&s->z);
    if (p->layout.cp) p->model.sequence = &p->context.split; /* a whole model is built afresh above */
    /* tied: the first stage's shards own wte; the last stage's head reads a copy */
    tied_ends_create(&s->tied, &p->model, p->layout.stage, p->layout.stages, p->layout.pp, grid->weight_group,
                     cfg->precision, 0);
    data_parallel_take_over(replicas, dp, &zero_replicas, s);
}

/* --help's section and one row per flag (config.h says how to add one) */
const Flag zero_flags[] = {
    {.type = FLAG_SECTION,
     .help = "ZeRO (the model state sharded over the dp replicas; one stage, tp 1: dp = the world)"},
    {"--zero", FLAG_INT, FIELD(ZeroFlags, zero), 0, 3, .def = "1", .usage = "--zero 0|1|2|3",
     .help = "0: every rank holds everything, gradients all-reduced (chapter 02's\n"
             "flat mode); 1: optimizer state sharded; 2: gradients too; 3: parameters\n"
             "too (default {default}). Any number of ranks: every unit is padded to a\n"
             "multiple of N (zeros nobody updates), so N may exceed a unit's size.\n"
             "With --pp or --tp, stages 1-2 under gpipe, 1f1b and zb-h1; interleaved\n"
             "(--virtual) only with --zero 0. --tie-embeddings on stages: the first\n"
             "stage's shards own wte, the last stage's head reads a copy of it"},
    {"--prefetch", FLAG_INT, FIELD(ZeroFlags, prefetch), 0, 64, .def = "1", .usage = "--prefetch K",
     .help = "stage 3: gather the next K units (on a communication thread) while\n"
             "the current one computes, 0..64 (default {default}; needs --zero 3)"},
    {"--pp", FLAG_RETELL,
     .help = "pipeline stages, 1..layers (default: 1, or world size / (tp x dp) with --dp); with --pp,\n"
             "--dp defaults to world size / (pp x tp)"},
    {"--print-schedule", FLAG_RETELL,
     .help = "print every stage's list of actions and exit (with --zero 3: the gather/free\n"
             "schedule of one micro-batch, then train)"},
    {0},
};

void zero_effective_flags(const Config *cfg, ZeroFlags *z, PipelineFlags *pipe, ModelParallelFlags *model) {
    (void)z;
    if (strcmp(model->mp, "tensor") != 0 && !pipe->pp && !flag_given(cfg, "--dp"))
        pipe->pp = 1; /* ZeRO's dp is the rest of the world */
    pipeline_effective_flags(cfg, pipe, model);
}

void zero_check_flags(const Config *cfg, const ZeroFlags *z, const PipelineFlags *pipe,
                      const ModelParallelFlags *model, int own_step) {
    int P = pipe->pp, T = model->tp, D = model->dp, M = cfg->micro;
    zero_stage_check_flags(cfg, z->zero, P, T, model->cp, pipe->print_schedule);
    pipeline_check_world(cfg, pipe, model);
    if (own_step && P == 1 && T == 1 && (cfg->batch < D * M || cfg->batch % (D * M))) /* over the world */
        fatal(EXIT_USAGE, "--batch %d does not split into %d ranks x --micro %d (valid: a multiple of %d)",
              cfg->batch, D, M, D * M);
    pipeline_check_batch(cfg, pipe, model);
}

void zero_stage_check_flags(const Config *cfg, int zero, int P, int T, int cp, int print_schedule) {
    if (cp > 1 && zero == 3)
        fatal(EXIT_USAGE,
              "--zero 3 with --cp %d is not written: stage 3's gather/free schedule runs in ZeRO's one-stage "
              "trainer over whole sequences (valid: --zero 0-2 with --cp)",
              cp);
    /* a stage of cp x tp ranks runs 04's schedule; one of one rank, ZeRO's own step */
    const char *problem =
        zero_flags_problem(cfg, zero, P, T * cp, print_schedule);        /* common/plan's rule too */
    if (problem) fatal(EXIT_USAGE, "%s", problem);
}

void zero_refuse_expert_parallel(int ep, int zero, int P) {
    if (ep > 1 && (zero > 0 || P == 1))
        fatal(EXIT_USAGE,
              "--ep %d with ZeRO's shards (--zero 1-3, --offload) or its own step on one stage is not "
              "written yet: they cut every unit evenly over the replicas, not by the experts' holders "
              "(valid: --ep with --zero 0 on stages, --pp 2 or more)",
              ep);
}

void zero_stage_destroy(ZeroStage *s) {
    if (!s->zero) {
        adamw_destroy(&s->opt);
        return;
    }
    tied_ends_destroy(&s->tied);
    zero_destroy(&s->z);
}

/* Tied on several stages: the last stage's copy of wte from the first stage's weights. */
static void refresh_tied_copy(ZeroStage *s) {
    tied_ends_refresh(&s->tied, s->tied.end == TIED_OWNER ? zero_unit_params(&s->z, LAYER_EMBEDDING) : NULL);
}

void zero_stage_resume(ZeroStage *s, Run *run, const char *program, const char *schedule) {
    Pipeline *p = s->p;
    int half = p->layout.cfg->precision != PRECISION_FP32;
    if (!s->zero) { /* chapter 04's: replica d writes share d */
        pipeline_ckpt_layout_init(&run->ckpt, program, s->grid, schedule, NULL);
        held_checkpoint_layout(s->held, &s->opt, s->grid->d, s->grid->dp, &run->ckpt);
        if (run_resume(run, &s->opt.t) && half) mixed_weights_from_master(s->held->mixed); /* fp32 there */
        return;
    }
    char zero[16];
    snprintf(zero, sizeof zero, "zero %d", s->zero);
    pipeline_ckpt_layout_init(&run->ckpt, program, s->grid, schedule, zero);
    /* the held units or slices; the moments of this rank's dp shard */
    zero_stage_checkpoint_layout(&s->z, p->layout.tensor ? &p->tpm : NULL, &run->ckpt);
    if (run_resume(run, &s->z.opt.t) && half)
        zero_weights_from_master(&s->z); /* the checkpoint: fp32; the 16-bit weights rounded from it */
    refresh_tied_copy(s);                /* initial or resumed: the last stage's copy of wte from them */
}

int zero_stage_update(ZeroStage *s, LossScaler *ls, const OptimHyper *h, int step, double *grad_norm,
                      double *comm_ms, double *busy_ms) {
    if (!s->zero) { /* chapter 04's: the norm from what each rank holds, AdamW on its part */
        GradShards grads = held_grad_shards(s->held, s->grid->world);
        return optimizer_step(s->held->model, s->held->mixed, &s->opt, ls, &grads, h, step, grad_norm);
    }
    /* the norm from the slices; AdamW on this rank's; all-gather the stage's units */
    int skipped = zero_step_update(&s->z, ls, h, step, grad_norm);
    double start = wall_ms();
    refresh_tied_copy(s); /* tied: the updated wte to the last stage's copy */
    *comm_ms += s->z.comm_ms + (s->tied.end != TIED_NONE ? wall_ms() - start : 0.0); /* its collectives, wherever in the step */
    *busy_ms = s->z.comm_busy_ms;
    return skipped;
}
