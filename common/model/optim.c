/* optim.c: see optim.h. */
#include "common/model/optim.h" /* AdamW and the learning-rate schedule */

#include "common/device/device.h" /* mem_alloc, copies, streams, timers */
#include "common/kernels/kernels.h" /* ops(): the kernel table */

#include "common/core/util.h" /* fatal, log_info, exit codes, flag parsing */

#include <math.h>
#include <stdlib.h>

void adamw_create(AdamW *opt, size_t n) {
    opt->n = n;
    opt->m = mem_alloc(SPACE_DEVICE, CAT_OPTIMIZER, 2 * n * sizeof(float), "Adam moments");
    opt->v = opt->m + n;
    opt->t = 0;
}

void adamw_destroy(AdamW *opt) {
    mem_free(opt->m);
    opt->m = opt->v = NULL;
}

void adamw_step(AdamW *opt, float *params, const float *grads, float grad_scale, const OptimHyper *h) {
    opt->t++;
    ops()->adamw_update(params, grads, opt->m, opt->v, opt->n, h->lr, h->beta1, h->beta2, h->eps,
                        h->weight_decay, grad_scale, opt->t);
}

float lr_at_step(const LrSchedule *s, int step) {
    if (step < s->warmup) return s->lr * (float)(step + 1) / (float)s->warmup;
    float min_lr = s->lr / 10.0f;
    int decay_steps = s->steps - s->warmup;
    if (decay_steps <= 1) return min_lr; /* a single step after warm-up is the last one */
    float progress = (float)(step - s->warmup) / (float)(decay_steps - 1); /* 0 .. 1 */
    return min_lr + 0.5f * (s->lr - min_lr) * (1.0f + cosf((float)M_PI * progress));
}

float clip_scale(float clip, double norm) {
    if (clip > 0.0f && norm > clip) return (float)(clip / norm);
    return 1.0f;
}

void check_loss_finite(double loss, int step) {
    if (fault_nan_step() == step) loss = NAN; /* tests: COURSE_FAULT_NAN_STEP (util.h) */
    if (!isfinite(loss))
        fatal(EXIT_DIVERGED,
              "the loss became %f at step %d: training diverged (try a lower --lr, or --clip 1)", loss, step);
}
