/* offload_stage.c: see offload_stage.h. */
#include "06_offload/offload_stage.h" /* 06: offload for one pipeline stage */

#include "common/comm/comm.h" /* collectives and messages between ranks */
#include "common/model/optimizer_step.h" /* the optimizer step: norm, clip, skip, AdamW */
#include "common/core/util.h" /* fatal, log_info, exit codes, flag parsing */
#include "common/kernels/work_ledger.h" /* a dry run's counted work */

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const Flag offload_flags[] = {
    {.type = FLAG_SECTION,
     .help = "ZeRO-Offload (run with mpirun -np P*D; the optimizer runs on the host, sharded over the D "
             "replicas)"},
    {"--offload", FLAG_SWITCH, FIELD(OffloadFlags, offload), .usage = "--offload",
     .help = "16-bit (or fp32) weights on the device; fp32 master weights, Adam's\n"
             "moments and gradients in pinned host memory, AdamW on the CPU, over\n"
             "stage 2's partitioning (--zero 2, the default with --offload; without\n"
             "--offload this is chapter 05)"},
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
    {"--offload-activations", FLAG_SWITCH, FIELD(OffloadFlags, activations), .usage = "--offload-activations",
     .help = "with --offload --recompute, one stage, tp 1: the block inputs that\n"
             "--recompute keeps wait in pinned host memory, copied out during the\n"
             "forward and back before each block's recomputation on the copy\n"
             "stream; the device holds two of them (activation_offload.h)"},
    {"--offload-params", FLAG_SWITCH, FIELD(OffloadFlags, params), .usage = "--offload-params",
     .help = "with --offload: the 16-bit (or fp32) weights stay in pinned\n"
             "host memory (with --dp, each rank's shard: ZeRO-3 on the host); each\n"
             "unit is copied to the device (and all-gathered) just before its\n"
             "forward and again before its backward, the next one copied while this\n"
             "one computes (05's gather/free schedule over PCIe): the device holds\n"
             "two units' weights instead of all (offload.h)"},
    {0},
};

/* --offload offloads stage 2's partitioning of whole units, one range of
 * them per stage, each unit's gradient leaving for the host as its backward
 * ends (under zb-h1 after its B and again after its W, each with what its
 * half added): what the layout cannot give is refused, saying why. */
void offload_effective_flags(const Config *cfg, OffloadFlags *f, ZeroFlags *z, PipelineFlags *pipe,
                             ModelParallelFlags *model) {
    if (f->offload && !flag_given(cfg, "--zero")) z->zero = 2; /* the partitioning offloaded */
    zero_effective_flags(cfg, z, pipe, model);
}

/* What --offload's layout cannot give; its --dpu options without it. */
static void offload_check_own_flags(const Config *cfg, const OffloadFlags *f, int zero, const char *schedule,
                                    const char *program) {
    if (f->dpu && !f->offload)
        fatal(EXIT_USAGE,
              "--dpu needs --offload (the delayed update overlaps the host's AdamW with the device)");
    if (f->dpu_reference && !f->dpu) fatal(EXIT_USAGE, "--dpu-reference needs --dpu");
    if (flag_given(cfg, "--dpu-warmup") && !f->dpu) fatal(EXIT_USAGE, "--dpu-warmup needs --dpu");
    if (f->activations && !f->offload)
        fatal(EXIT_USAGE, "--offload-activations needs --offload (it offloads a stage of 06's trainer)");
    if (f->activations && !cfg->recompute)
        fatal(EXIT_USAGE, "--offload-activations needs --recompute (it offloads the block inputs that "
                          "--recompute keeps)");
    if (!f->offload) return;
    if (zero == 3)
        fatal(EXIT_USAGE, "--zero 3 with --offload is unsupported: chapter 06 offloads stage 2's optimizer "
                          "and gradients, not the parameters (valid: --zero 2)");
    if (zero != 2)
        fatal(EXIT_USAGE,
              "--zero %d with --offload is unsupported: chapter 06 offloads the stage-2 partitioning "
              "only (valid: --zero 2)",
              zero);
    if (strcmp(schedule, "interleaved") == 0)
        fatal(EXIT_USAGE,
              "--schedule interleaved is refused by %s: the offloaded state is one range of "
              "units per stage, and interleaved's chunks are not one range (valid: gpipe, 1f1b, zb-h1)",
              program);
}

/* --offload-params offloads what --offload keeps on the device. */
static void offload_params_check(const OffloadFlags *f) {
    if (f->params && !f->offload)
        fatal(EXIT_USAGE,
              "--offload-params needs --offload (it moves the weights that --offload keeps on the "
              "device)");
}

/* --offload-activations keeps one stage's checkpoints of whole blocks. */
static void offload_activations_check(const OffloadFlags *f, const PipelineFlags *pipe,
                                      const ModelParallelFlags *model) {
    if (!f->activations) return;
    const char *not_written = pipe->pp > 1 ? "--pp" : model->tp > 1 ? "--tp" : model->cp > 1 ? "--cp" : NULL;
    int value = pipe->pp > 1 ? pipe->pp : model->tp > 1 ? model->tp : model->cp;
    if (not_written)
        fatal(EXIT_USAGE,
              "--offload-activations with %s %d is not written: it offloads one stage's checkpoints of whole "
              "blocks (valid: %s 1)",
              not_written, value, not_written);
}

void offload_check_flags(const Config *cfg, const OffloadFlags *f, const ZeroFlags *z, const PipelineFlags *pipe,
                         const ModelParallelFlags *model, const char *program) {
    offload_check_own_flags(cfg, f, z->zero, pipe->schedule, program); /* first: why, if at all */
    offload_activations_check(f, pipe, model);
    offload_params_check(f);
    zero_check_flags(cfg, z, pipe, model, !f->offload);
}

/* The whole model's parameters (with --tp the stage's model is a rank's slices). */
static size_t offload_whole_params(const Pipeline *p) {
    return p->layout.tensor ? p->tpm.global_params : p->model.num_params;
}

void offload_finish_delayed(OffloadStage *s) {
    offload_update_wait(&s->off);
    if (s->delayed.waiting) offload_update_shard(&s->off, s->delayed.grads, &s->delayed.update);
    s->delayed.waiting = 0;
    offload_stage_weights_changed(s);
}

void offload_stage_weights_changed(OffloadStage *s) {
    const Offload *o = &s->off;
    if (s->tied.end != TIED_OWNER) { /* the last stage receives, the others take no part */
        tied_ends_refresh(&s->tied, NULL);
        return;
    }
    size_t at = table_unit(&o->model->table, LAYER_EMBEDDING)->offset - o->model->param_first;
    tied_ends_refresh(&s->tied, (const char *)o->params + at * o->elem_bytes); /* the device's weights */
}

/* Tied on several stages, the first stage: the head's gradient of wte,
 * summed over the last stage's replicas (its slice, on the host), added into
 * this rank's slice of the embedding unit in the host's fp32 shard, rounded
 * to 16 bits in 16-bit runs as every sum of it is (land_slice, offload.c). */
static void add_tied_slice(OffloadStage *s, const float *slice) {
    Offload *o = &s->off;
    o->bytes_d2h += (double)s->tied.slice_count * sizeof(float); /* it crossed PCIe */
    if (device_dry()) return;                                     /* nothing to add: zeros */
    const ParamTable *t = &o->model->table;
    float *sum = o->grads[o->cur] + shard_unit_offset(t, LAYER_EMBEDDING, o->ranks) -
                 shard_unit_offset(t, o->first_unit, o->ranks);
    for (size_t i = 0; i < s->tied.slice_count; i++)
        sum[i] = o->half ? half_to_float(half_from_float(sum[i] + slice[i], o->format), o->format)
                         : sum[i] + slice[i];
}

/* --offload-params: the computations of the stage's step, from its
 * schedule (schedule.h): each forward runs the stage's units in order, each
 * backward (or zb-h1's B) in reverse, each W the units but the embedding
 * (model.h), in the order of the stage's actions. */
static void offload_stage_schedule_fetches(Offload *o, const Pipeline *p) {
    int first = p->layout.first_unit, last = p->layout.last_unit, units = last - first + 1, n = 0;
    ZeroUse *uses = xcalloc((size_t)p->schedule.count * units, sizeof(ZeroUse));
    for (int i = 0; i < p->schedule.count; i++) {
        OpKind kind = p->schedule.actions[i].kind;
        if (kind == OP_FORWARD)
            for (int u = first; u <= last; u++) uses[n++] = (ZeroUse){ZERO_FORWARD, u};
        else if (schedule_op_backward(kind))
            for (int u = last; u >= first && (kind != OP_BACKWARD_WEIGHT || u >= 0); u--)
                uses[n++] = (ZeroUse){ZERO_BACKWARD, u};
    }
    offload_schedule_fetches(o, uses, n, 1); /* double buffering: the next unit copied while one computes */
    free(uses);
}

/* --offload: the replicas' calls of the step (data_parallel_take_over). */
static void offload_replicas_begin_step(void *owner) {
    OffloadStage *s = owner;
    int step = s->p->now.step + 1; /* pipeline_begin_step's, earlier in the step; 1-based for the timeline */
    if (s->offload_activations) activation_offload_begin_step(&s->acts, step);
    offload_begin_step(&s->off, step);
    tied_ends_begin_step(&s->tied);
}
static double offload_replicas_sum_gradients(void *owner, double *busy_ms) {
    OffloadStage *s = owner;
    (void)busy_ms;
    if (s->offload_activations) activation_offload_end_step(&s->acts);
    offload_finish_grads(&s->off);
    double start = wall_ms();
    const float *head_slice = tied_ends_sum_gradient(&s->tied); /* tied on several stages */
    if (head_slice) add_tied_slice(s, head_slice);
    return s->tied.end != TIED_NONE ? wall_ms() - start : 0.0;
}
static const DataParallelOps offload_replicas = {.begin_step = offload_replicas_begin_step,
                                                 .sum_gradients = offload_replicas_sum_gradients};

void offload_stage_create(OffloadStage *s, ZeroStage *zero, DataParallel *replicas, Pipeline *p, HeldModel *held,
                          int zero_stage, const DataParallelFlags *dp, const ProcessGrid *grid,
                          const OffloadFlags *f) {
    s->zero = zero, s->grid = grid, s->p = p;
    if (!s->offload) {
        zero_stage_create(zero, replicas, p, held, zero_stage, dp, grid); /* chapter 05's */
        return;
    }
    Offload *o = &s->off;
    const StageLayout *l = &p->layout;
    const Config *cfg = l->cfg;
    if (l->tensor) /* this rank's tensor slices of the stage's units, sharded over dp */
        offload_create_slices(o, &p->tpm, grid->weight_group, cfg, f->dpu, f->params);
    else
        offload_create(o, &p->model, l->first_unit, l->last_unit, grid->weight_group, cfg, f->dpu, f->params);
    if (f->params) offload_stage_schedule_fetches(o, p);
    offload_attach_timeline(o, &p->times.timeline, &p->times.origin_ms);
    /* tied: the first stage's host shard owns wte; the last stage's head reads a copy of it */
    tied_ends_create(&s->tied, o->model, l->stage, l->stages, l->pp, grid->weight_group, cfg->precision, 1);
    data_parallel_take_over(replicas, dp, &offload_replicas, s);
}

void offload_stage_resume(OffloadStage *s, Run *run, const char *program, const char *schedule,
                          const OffloadFlags *f) {
    if (!s->offload) {
        zero_stage_resume(s->zero, run, program, schedule); /* chapter 05's */
        return;
    }
    Offload *o = &s->off;
    int dpu = f->dpu;
    /* each rank's host shard of its stage's units (offload.h) */
    pipeline_ckpt_layout_init(&run->ckpt, program, s->grid, schedule, dpu ? "offload, dpu" : "offload");
    offload_checkpoint_layout(o, &run->ckpt);
    if (run_resume(run, &o->t)) offload_weights_from_master(o); /* the device's weights from the fp32 */
    offload_stage_weights_changed(s);
}

void offload_stage_log(const OffloadStage *s, const OffloadFlags *f) {
    if (!s->offload) return;
    const ProcessGrid *grid = s->grid;
    const Offload *o = &s->off;
    char tp[96] = ""; /* --tp: each rank's host shard is of its tensor slices; --cp: over dp x cp */
    if (grid->cp > 1) snprintf(tp, sizeof tp, " x %d context-parallel", grid->cp);
    if (grid->tp > 1) snprintf(tp + strlen(tp), sizeof tp - strlen(tp), " x %d tensor-parallel", grid->tp);
    log_info("offload: %d ranks = %d stages%s x %d replicas | %zu parameters, %zu in this rank's host shard%s\n",
             grid->pp * grid->cp * grid->tp * grid->dp, grid->pp, tp, grid->dp, offload_whole_params(s->p),
             o->shard_n,
             f->dpu ? (f->dpu_reference ? " | delayed update (reference)" : " | delayed update")
                    : f->params ? " | weights on the host, two units on the device" : "");
}

int offload_decide(Offload *o, Run *run, const OptimHyper *h, int step, double *grad_norm,
                   OffloadUpdate *update) {
    GradShards held = offload_grad_shards(o, run->world);
    work_begin("update", 0, 0); /* the norm and clipping (a dry run counts the work: work_ledger.h) */
    StepDecision decision = optimizer_decide(&held, &run->scaler, h->clip, step);
    work_end();
    *grad_norm = decision.grad_norm;
    *update = (OffloadUpdate){h->lr, decision.grad_scale}; /* the host AdamW: offload.c */
    return decision.skipped;
}

void offload_finish(Pipeline *p, Run *run, int dpu_warmup, double pcie_bytes) {
    const Config *cfg = run->cfg;
    timeline_write(&p->times.timeline, run->world, cfg->out);
    double peak_host = comm_allreduce_double(run->world, (double)mem_peak_total(SPACE_HOST), 1);
    int ran = run->last_step - run->first_step;
    char extra_values[256];
    snprintf(extra_values, sizeof extra_values, ",%s,1,%d,%d,%.0f,%.0f,%.0f", precision_name(cfg->precision),
             dpu_warmup >= 0, dpu_warmup >= 0 ? dpu_warmup : 0, peak_host, pcie_bytes / ran,
             run->bytes_sent / ran);
    run_finish(run, offload_whole_params(p),
               ",precision,offload,dpu,dpu_warmup,peak_host_bytes,pcie_bytes_per_step,bytes_sent_per_step",
               extra_values,
               "peak host memory %.1f MiB | %.2f MiB over PCIe per rank per step | CSVs, timeline.csv and "
               "trace.json in %s",
               peak_host / BYTES_PER_MIB, pcie_bytes / ran / BYTES_PER_MIB, cfg->out);
}

const CheckpointStore *offload_stage_checkpoints(OffloadStage *s, const OffloadFlags *f) {
    s->offload_activations = f->activations;
    return f->activations ? activation_offload_store(&s->acts) : NULL;
}

void offload_stage_create_checkpoints(OffloadStage *s, Pipeline *p) {
    if (!s->offload_activations) return;
    const StageLayout *l = &p->layout;
    activation_offload_create(&s->acts, p->slots, l->cfg->model.layers, l->B, l->T, l->cfg->model.dmodel);
    activation_offload_attach_timeline(&s->acts, &p->times.timeline, &p->times.origin_ms);
}

void offload_stage_columns(OffloadStage *s, double *columns) {
    columns[0] = s->off.bytes_d2h + s->acts.bytes_d2h;
    columns[1] = s->off.bytes_h2d + s->acts.bytes_h2d;
    s->pcie_bytes += columns[0] + columns[1];
}

void offload_stage_finish(OffloadStage *s, Pipeline *p, Run *run, double *bubbles, double bubble_theory,
                          size_t whole_params, const OffloadFlags *f) {
    if (s->offload)
        offload_finish(p, run, f->dpu ? f->dpu_warmup : -1, s->pcie_bytes);
    else
        pipeline_finish(p, run, bubbles, bubble_theory, whole_params);
}

void offload_stage_destroy(OffloadStage *s) {
    activation_offload_destroy(&s->acts);
    tied_ends_destroy(&s->tied);
    if (s->offload)
        offload_destroy(&s->off);
    else
        zero_stage_destroy(s->zero);
}
