/* optim.h: AdamW with a warm-up + cosine learning-rate schedule, and global
 * gradient-norm clipping.
 *
 * The optimizer state (Adam's m and v, 8 bytes per parameter in fp32) lives
 * in one device buffer. The update works on any contiguous range of the
 * parameter buffer, which is what lets ZeRO give each rank a shard of it. */
#ifndef OPTIM_H
#define OPTIM_H

#include <stddef.h>

typedef struct {
    size_t n; /* elements covered */
    float *m; /* (n) first moment, device, CAT_OPTIMIZER */
    float *v; /* (n) second moment, same buffer */
    int t;    /* updates applied so far; the next update is number t+1 */
} AdamW;

void adamw_create(AdamW *opt, size_t n);
void adamw_destroy(AdamW *opt);
/* What one optimizer step reads of the run's configuration, and nothing
 * else: the optimizer does not take the command line. */
typedef struct {
    float lr;                /* this step's learning rate (lr_at_step) */
    float beta1, beta2, eps; /* Adam's moment decays, and the guard of its denominator */
    float weight_decay;      /* decoupled: each step takes lr * weight_decay * param off */
    float clip;              /* the global gradient norm is clipped to this; 0: not clipped */
} OptimHyper;

/* One update of params[0..n) from grads[0..n) (scaled by grad_scale). */
void adamw_step(AdamW *opt, float *params, const float *grads, float grad_scale, const OptimHyper *h);

/* The learning-rate schedule of a run: --lr, --warmup, --steps. */
typedef struct {
    float lr;   /* the peak rate */
    int warmup; /* linear warm-up steps */
    int steps;  /* the whole run: the cosine ends at the last one */
} LrSchedule;

/* Learning rate for step s (0-based): linear warm-up from lr/warmup to lr over
 * `warmup` steps, then cosine decay to lr/10 at the last step. */
float lr_at_step(const LrSchedule *schedule, int step);

/* End the run with EXIT_DIVERGED and a clear message if the loss of `step`
 * (1-based) is not finite. For testing that path, the environment variable
 * COURSE_FAULT_NAN_STEP=k makes the loss of step k NaN. */
void check_loss_finite(double loss, int step);

/* The factor that clips a gradient of norm `norm` to `clip` (1 when not
 * clipping: clip 0, or a norm within it). optimizer_step.h takes it. */
float clip_scale(float clip, double norm);

#endif
