/* stage_replicas.c: see stage_replicas.h. */
#include "04_pipeline/stage_replicas.h" /* 04: a stage's replicas */

#include "common/run/checkpoint.h" /* save and resume */
#include "common/model/mixed.h" /* mixed precision: 16-bit weights, loss scaling */
#include "common/model/optimizer_step.h" /* the optimizer step: norm, clip, skip, AdamW */
#include "03_model_parallel/tensor_parallel.h" /* 03: tensor parallelism */

#include <stdlib.h>

void stage_replicas_create(StageReplicas *r, Pipeline *p, const DataParallelFlags *dp,
                           const ProcessGrid *grid, CommGroup *model_group, CommGroup *world) {
    *r = (StageReplicas){.p = p, .model_group = model_group, .world = world};
    adamw_create(&r->opt, p->model.param_count); /* only the parameters this rank holds */
    data_parallel_create(&r->replicas, dp, grid->weight_group, &p->model, &p->mixed,
                         p->layout.cfg->precision);
    p->unit_final =
        data_parallel_backward_hook(&r->replicas, 1); /* overlap: a bucket goes once its units are final */
    p->unit_final_context = &r->replicas;
}

void stage_replicas_split_experts(StageReplicas *r, ExpertParallel *x, const ExpertParallelFlags *f,
                                  const ModelParallelFlags *mp, const ProcessGrid *grid) {
    Pipeline *p = r->p;
    expert_parallel_split(x, &p->model, grid->dp_group, &r->replicas, f, mp->alltoall, p->layout.B, p->slot,
                          p->slots, &p->times.comm_ms);
    if (!x->layer) return;
    x->timeline = &p->times.timeline; /* the ep_* rows beside the stage's actions */
    r->experts = x;
    r->replica = grid->d;
    /* the norm's parts: x's spans (dense, experts), less the tied copy, each counted on one rank */
    size_t own = p->own_span.count ? p->own_span.count : p->model.param_count;
    if (p->layout.tensor) /* --tp: of each tensor the tp rank's slice, a replicated one on tp rank 0 */
        r->spans =
            expert_parallel_slices_once(x, p->tpm.once_spans, p->tpm.num_once_spans, grid->d, &r->num_spans);
    else
        r->spans = expert_parallel_spans_once(x, own, grid->d, &r->num_spans);
}

void stage_replicas_print(const StageReplicas *r) {
    data_parallel_print(&r->replicas);
}

void stage_replicas_destroy(StageReplicas *r) {
    data_parallel_destroy(&r->replicas);
    adamw_destroy(&r->opt);
    free(r->spans);
}

void stage_replicas_resume(StageReplicas *r, Run *run, const char *program, const ProcessGrid *grid,
                           const char *schedule) {
    Pipeline *p = r->p;
    pipeline_ckpt_layout_init(&run->ckpt, program, grid, schedule, NULL); /* replica d: share d */
    int replica = comm_rank(grid->weight_group); /* d x cp + c: the ranks holding the same weights */
    if (p->layout.tensor)
        tp_checkpoint_layout(&p->tpm, &r->opt, replica, &run->ckpt); /* this stage's slices */
    else if (r->experts) /* its units, of each MoE block its experts' rows */
        expert_parallel_checkpoint_layout(r->experts, &r->opt, replica, &run->ckpt);
    else
        ckpt_layout_range(&run->ckpt, &p->model, &r->opt, replica,
                          comm_size(grid->weight_group)); /* its units */
    if (run_resume(run, &r->opt.t) && p->layout.cfg->precision != PRECISION_FP32)
        mixed_weights_from_master(&p->mixed); /* the checkpoint: fp32 */
    data_parallel_broadcast_weights(&r->replicas, &p->mixed);
}

void stage_replicas_begin_step(StageReplicas *r) {
    data_parallel_begin_step(&r->replicas);
}

double stage_replicas_sum_gradients(StageReplicas *r, double *busy_ms) {
    return data_parallel_sum_gradients(&r->replicas, busy_ms);
}

int stage_replicas_update(StageReplicas *r, LossScaler *ls, const OptimHyper *h, int step,
                          double *grad_norm) {
    GradShards held = pipeline_grad_shards(r->p, r->model_group, r->world); /* units, or their slices */
    if (r->experts) /* --ep: each stage's dense tensors and each expert once, over the world */
        held.spans = r->spans, held.num_spans = r->num_spans, held.sum_group = r->world;
    return optimizer_step(&r->p->model, &r->p->mixed, &r->opt, ls, &held, h, step, grad_norm);
}

void stage_replicas_check(const StageReplicas *r, int every, int step) {
    int half = r->p->layout.cfg->precision != PRECISION_FP32; /* the master weights are the weights */
    if (every && step % every == 0)
        data_parallel_check_replicas(&r->replicas, half ? r->p->mixed.master : r->p->model.params, step);
}
