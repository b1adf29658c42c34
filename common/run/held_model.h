/* held_model.h: the model this process trains, as the step loop sees it.
 *
 * A step asks the same things of a model however it is held: where a
 * micro-batch's tokens go, its forward (the loss) and backward, what this
 * process holds of the gradient (for the norm) and of a checkpoint, the
 * validation loss and a sample. held_model_whole answers them for the whole
 * model on this process (chapters 01 and 02); a chapter that holds the model
 * another way (split over ranks) fills `ops` and `owner` with its own
 * answers, and its loop stays the loop of the chapter before. */
#ifndef HELD_MODEL_H
#define HELD_MODEL_H

#include "common/run/checkpoint.h" /* save and resume */
#include "common/comm/comm.h" /* collectives and messages between ranks */
#include "common/run/config.h" /* Config and the flag tables */
#include "common/model/data.h" /* the training data and its batches */
#include "common/model/mixed.h" /* mixed precision: 16-bit weights, loss scaling */
#include "common/model/model.h" /* GPT, its forward and backward */
#include "common/model/optim.h" /* AdamW and the learning-rate schedule */
#include "common/model/optimizer_step.h" /* the optimizer step: norm, clip, skip, AdamW */

#include <stdint.h>

typedef struct HeldModel HeldModel;

/* A holder's answers; owner is its own state. */
typedef struct {
    /* one micro-batch (tokens and targets already uploaded): this process's
     * share of the token-loss sum, so that summing over the ranks gives the
     * global batch's */
    double (*forward)(void *owner, int B, int T);
    /* its backward, adding into the gradients; unit_final(u, context), if
     * given, once unit u's gradients are final (chapter 02's overlap) */
    void (*backward)(void *owner, float dloss, int B, int T, UnitHook unit_final, void *context);
    GradShards (*grad_shards)(void *owner, CommGroup *world);
    void (*checkpoint_layout)(void *owner, AdamW *opt, int dp_index, int dp, CkptLayout *ckpt);
    /* mean validation loss, replica dp_index's share of each batch; NAN
     * where this process does not report it */
    double (*evaluate)(void *owner, const Dataset *data, const Config *cfg, int dp_index, int B);
    void (*sample)(void *owner, const Dataset *data, const Config *cfg, uint64_t *rng);
} HeldModelOps;

struct HeldModel {
    GPT *model;            /* the parameters and gradients this process holds */
    MixedModel *mixed;     /* their 16-bit storage (mixed.h) */
    int *tokens, *targets; /* where a micro-batch's tokens and targets go (B x T) */
    MoeStats *moe;         /* --experts: what this step's forwards routed (moe.h), zeroed by the step */
    const HeldModelOps *ops;
    void *owner;
    /* held_model_whole's: the model, its activations and the backward's scratch */
    GPT whole;
    MixedModel whole_mixed;
    Activations acts;
    Scratch scratch;
};

/* The whole model on this process, for micro-batches of B sequences of T tokens. */
void held_model_whole(HeldModel *h, const Config *cfg, int B, int T);
void held_model_destroy(HeldModel *h, const Config *cfg);

double held_forward(HeldModel *h, int B, int T);
void held_backward(HeldModel *h, float dloss, int B, int T, UnitHook unit_final, void *context);
GradShards held_grad_shards(HeldModel *h, CommGroup *world);
void held_checkpoint_layout(HeldModel *h, AdamW *opt, int dp_index, int dp, CkptLayout *ckpt);
double held_evaluate(HeldModel *h, const Dataset *data, const Config *cfg, int dp_index, int B);
void held_sample(HeldModel *h, const Dataset *data, const Config *cfg, uint64_t *rng);

#endif
