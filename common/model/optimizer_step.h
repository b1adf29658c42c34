/* optimizer_step.h: the optimizer step every chapter takes, written once.
 *
 * After the gradients of a step are summed (over micro-batches, and over the
 * replicas by data parallelism), one step has five stages:
 *
 *   1. norm      each rank sums the squares of the gradient elements it holds
 *                (double, sum_squares' fixed order);
 *   2. agree     the ranks that together hold the whole model add their sums,
 *                so every rank has the squared norm of the WHOLE gradient,
 *                and every rank learns whether any rank's is not finite;
 *   3. scale     fp16: the gradients came out loss-scale times too large; a
 *                non-finite norm means they overflowed: the step is skipped
 *                on every rank and the scale halves (mixed.h: LossScaler);
 *   4. clip      the factor clip / norm when the norm exceeds --clip;
 *   5. apply     AdamW on the elements this rank updates, each gradient
 *                multiplied by clip factor / loss scale as it is read.
 *
 * Why the norm must be agreed before clipping: clipping scales the WHOLE
 * gradient by one factor. A rank that clipped by the norm of its own part
 * would scale its part by a different factor than its neighbours; the
 * update would no longer be the single-device update, and the replicas or
 * stages would drift apart. For the same reason the skip is agreed: one rank
 * skipping while another updates splits the model in two.
 *
 * What a rank holds (GradShards) is the only thing that differs between
 * chapters; the decision (optimizer_decide) is the same code for all of them:
 *
 *   01, 02       the whole gradient, one buffer: no sum over ranks
 *   03 layers    its stages' units: the sums added over the model-parallel group
 *   03 tensor    its slices of the sliced tensors (summed over the tp group)
 *                and whole copies of the replicated ones (layernorms, biases
 *                of row-parallel layers, embedding, head): counted ONCE, so
 *                they are kept out of the sum over ranks and added after it
 *   04           its stage's units: added over the pipeline group
 *   05 ZeRO      stage 0 the whole gradient; stage 1 its slice of every unit;
 *                stages 2-3 its shard, whose padding holds zeros: added over
 *                the data-parallel group
 *   06 offload   its host shard (fp32, host memory: the CPU kernels), added
 *                over the world
 *
 * The order of the additions is part of the contract: for the same layout
 * the sum is the same bits it always was (tests/chapters/losses.bats). Spans are
 * added in the order given, starting from 0; the replicated sum is added to
 * the agreed sharded sum; a single whole buffer is one sum_squares call.
 *
 * The sum over ranks needs MPI, which chapter 01 does not link: it lives in
 * the comm layer (optimizer_agree.h, an MPI source), reached through
 * GradShards.agree, which is NULL where one process holds everything: the
 * model layer calls no communication itself. */
#ifndef OPTIMIZER_STEP_H
#define OPTIMIZER_STEP_H

#include "common/core/half.h" /* bf16 and fp16 conversions */
#include "common/kernels/kernels.h" /* ops(): the kernel table */
#include "common/model/mixed.h" /* mixed precision: 16-bit weights, loss scaling */
#include "common/model/model.h" /* GPT, its forward and backward */
#include "common/model/optim.h" /* AdamW and the learning-rate schedule */

#include <stddef.h>
#include <stdint.h>

typedef struct CommGroup CommGroup;

/* Elements [first, first + count) of the held gradient buffer. */
typedef struct {
    size_t first, count;
    int replicated; /* 1: every rank of sum_group holds the same values: counted once */
} GradSpan;

typedef struct GradShards GradShards;
/* How the ranks agree on the squared norm: the comm layer's grad_norm_agree
 * (optimizer_agree.h), or NULL on one process (the sum is sharded + replicated). */
typedef double (*GradNormAgree)(const GradShards *g, double sharded, double replicated);

struct GradShards {
    const float *grads;      /* the held gradients in fp32, or NULL */
    const uint16_t *grads16; /* or in 16 bits, in `format` */
    HalfFormat format;
    size_t held;              /* elements in the buffer */
    const KernelOps *kernels; /* whose sum_squares reads the buffer (NULL: ops(), device memory) */
    const GradSpan *spans;    /* the parts in the norm, in order (NULL: all `held` elements, one part) */
    int num_spans;
    GradNormAgree agree;    /* NULL: this rank holds the whole model and decides alone */
    CommGroup *sum_group;   /* the ranks whose parts make the whole model (NULL: no sum) */
    CommGroup *agree_group; /* the ranks that must take the same decision (NULL: those of the sum) */
};

/* What a step does, the same on every rank that agreed. */
typedef struct {
    double grad_norm; /* the whole gradient's norm before clipping, loss scale divided out (steps.csv) */
    int skipped;      /* fp16 overflow on some rank: no rank updates */
    float grad_scale; /* what AdamW multiplies each gradient by: the clip factor / the loss scale */
} StepDecision;

/* The held buffer of a model stored as mixed.h's precision_* functions say
 * (model->grads, or mm->grads in 16 bits), whole, on one process. */
GradShards precision_grad_shards(const GPT *model, const MixedModel *mm);

/* Stage 1: this rank's sums of squares, the sharded and the replicated apart. */
void grad_shards_local_squares(const GradShards *g, double *sharded, double *replicated);
/* Stages 1 and 2: the squared norm of the whole gradient, the same on every
 * rank of the sum; not finite on every rank of the sum and of agree_group
 * when any rank's part is not (an fp16 overflow), or `overflowed` says this
 * rank's part overflowed (the tests' COURSE_FAULT_OVERFLOW_STEP, util.h: an
 * overflow seen by the check itself, whatever part of the gradient, slice or
 * shard this rank holds). */
double grad_shards_sum_squares(const GradShards *g, int overflowed);
/* Stages 1 to 4: the norm, the loss scale's update (ls, every rank alike) and
 * the factor for AdamW. `step` is 1-based, for the message of a skipped step. */
StepDecision optimizer_decide(const GradShards *g, LossScaler *ls, float clip, int step);

/* The whole step, stages 1 to 5, for a model stored as mixed.h's precision_*
 * functions say, which updates what it holds (the whole model, a stage, a
 * tensor-parallel rank's slices): AdamW with h's hyperparameters, clipped
 * to h->clip, unless the step is skipped. The norm into *grad_norm;
 * returns 1 when the step was skipped. ZeRO (05_zero/zero.c) and the host
 * update (06_offload) take optimizer_decide's decision to their own apply. */
int optimizer_step(GPT *model, MixedModel *mm, AdamW *opt, LossScaler *ls, const GradShards *g,
                   const OptimHyper *h, int step, double *grad_norm);

#endif
