/* optimizer_step.c: see optimizer_step.h. */
#include "common/model/optimizer_step.h" /* the optimizer step: norm, clip, skip, AdamW */

#include "common/core/util.h" /* fatal, log_info, exit codes, flag parsing */
#include "common/kernels/work_ledger.h" /* a dry run's counted work */

#include <math.h>

GradShards precision_grad_shards(const GPT *model, const MixedModel *mm) {
    return (GradShards){.grads = mm->params ? NULL : model->grads,
                        .grads16 = mm->params ? mm->grads : NULL,
                        .format = mm->format,
                        .held = model->param_count};
}

static double span_squares(const GradShards *g, size_t first, size_t count) {
    if (first + count > g->held)
        fatal(EXIT_RUNTIME, "the gradient norm: elements %zu..%zu are beyond the %zu held", first,
              first + count, g->held);
    const KernelOps *k = g->kernels ? g->kernels : ops();
    return g->grads16 ? k->sum_squares_half(g->grads16 + first, count, g->format)
                      : k->sum_squares(g->grads + first, count);
}

void grad_shards_local_squares(const GradShards *g, double *sharded, double *replicated) {
    *replicated = 0.0;
    if (!g->spans) { /* one buffer, one sum */
        *sharded = span_squares(g, 0, g->held);
        return;
    }
    *sharded = 0.0;
    for (int i = 0; i < g->num_spans; i++) {
        const GradSpan *s = &g->spans[i];
        if (!s->count) continue;
        double squares = span_squares(g, s->first, s->count);
        if (s->replicated)
            *replicated += squares;
        else
            *sharded += squares;
    }
}

double grad_shards_sum_squares(const GradShards *g, int overflowed) {
    double sharded, replicated;
    grad_shards_local_squares(g, &sharded, &replicated);
    if (overflowed) sharded = INFINITY;
    if (g->agree) return g->agree(g, sharded, replicated);
    return g->spans ? sharded + replicated : sharded;
}

StepDecision optimizer_decide(const GradShards *g, LossScaler *ls, float clip, int step) {
    /* the tests' fp16 overflow (COURSE_FAULT_OVERFLOW_*, util.h) enters where every layout checks; a
     * rank that decides alone holds the whole summed gradient, which an overflow on any rank reaches */
    double squares = grad_shards_sum_squares(g, ls->skips && fault_overflow_at(step, !g->agree));
    float loss_scale = ls->scale; /* the gradients are this many times too large */
    StepDecision d;
    d.grad_norm = sqrt(squares) / loss_scale;
    d.skipped = loss_scaler_update(ls, isfinite(squares));
    if (d.skipped)
        log_info("step %d skipped: the fp16 gradients overflowed at loss scale %g\n", step, loss_scale);
    d.grad_scale = clip_scale(clip, d.grad_norm) / loss_scale; /* clip, and divide the scale out */
    return d;
}

int optimizer_step(GPT *model, MixedModel *mm, AdamW *opt, LossScaler *ls, const GradShards *g,
                   const OptimHyper *h, int step, double *grad_norm) {
    work_begin("update", 0, 0); /* a dry run counts the work (work_ledger.h) */
    StepDecision d = optimizer_decide(g, ls, h->clip, step);
    *grad_norm = d.grad_norm;
    if (!d.skipped) {
        if (mm->params)
            mixed_adamw_step(mm, opt, d.grad_scale, h);
        else
            adamw_step(opt, model->params, model->grads, d.grad_scale, h);
    }
    work_end();
    return d.skipped;
}
