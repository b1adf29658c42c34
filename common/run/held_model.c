/* held_model.c: the step's questions, asked of the holder (held_model.h). */
#include "common/run/held_model.h" /* the model this process trains */
#include "common/run/evaluate.h" /* validation loss and sampling */

#include <math.h>

/* ---- the whole model on this process ---- */

static double whole_forward(void *owner, int B, int T) {
    HeldModel *h = owner;
    gpt_forward(&h->whole, &h->acts, &h->scratch, B, T);
    return gpt_loss_sum(&h->acts, B, T);
}

static void whole_backward(void *owner, float dloss, int B, int T, UnitHook unit_final, void *context) {
    HeldModel *h = owner;
    if (unit_final)
        gpt_backward_hooked(&h->whole, &h->acts, &h->scratch, dloss, B, T, unit_final, context);
    else
        gpt_backward(&h->whole, &h->acts, &h->scratch, dloss, B, T);
}

static GradShards whole_grad_shards(void *owner, CommGroup *world) {
    HeldModel *h = owner;
    (void)world; /* this process holds the whole gradient */
    return precision_grad_shards(&h->whole, &h->whole_mixed);
}

static void whole_checkpoint_layout(void *owner, AdamW *opt, int dp_index, int dp, CkptLayout *ckpt) {
    HeldModel *h = owner;
    ckpt_layout_range(ckpt, &h->whole, opt, dp_index, dp); /* replica d writes share d */
}

/* Every replica holds the same weights: the first one evaluates. */
static double whole_evaluate(void *owner, const Dataset *data, const Config *cfg, int dp_index, int B) {
    HeldModel *h = owner;
    (void)B; /* the activations' capacity */
    return dp_index == 0 ? evaluate_loss(&h->whole, &h->acts, &h->scratch, data, cfg) : NAN;
}

static void whole_sample(void *owner, const Dataset *data, const Config *cfg, uint64_t *rng) {
    HeldModel *h = owner;
    sample_text(&h->whole, &h->acts, &h->scratch, data, cfg->sample, rng);
}

static const HeldModelOps whole_ops = {
    .forward = whole_forward,
    .backward = whole_backward,
    .grad_shards = whole_grad_shards,
    .checkpoint_layout = whole_checkpoint_layout,
    .evaluate = whole_evaluate,
    .sample = whole_sample,
};

void held_model_whole(HeldModel *h, const Config *cfg, int B, int T) {
    *h = (HeldModel){.ops = &whole_ops, .owner = h};
    precision_create_range(&h->whole, &h->whole_mixed, &cfg->model, cfg->seed, cfg->precision,
                           LAYER_EMBEDDING, cfg->model.layers);
    activations_create_model(&h->acts, &cfg->model, B, T, cfg->recompute);
    scratch_create(&h->scratch, &cfg->model, B, T, cfg->recompute);
    h->model = &h->whole;
    h->mixed = &h->whole_mixed;
    h->tokens = h->acts.tokens;
    h->targets = h->acts.targets;
    h->moe = &h->acts.moe.stats;
}

void held_model_destroy(HeldModel *h, const Config *cfg) {
    scratch_destroy(&h->scratch);
    activations_destroy(&h->acts, &cfg->model);
    precision_destroy(&h->whole, &h->whole_mixed);
}

/* ---- the step's questions, to whichever holder ---- */

double held_forward(HeldModel *h, int B, int T) {
    return h->ops->forward(h->owner, B, T);
}
void held_backward(HeldModel *h, float dloss, int B, int T, UnitHook unit_final, void *context) {
    h->ops->backward(h->owner, dloss, B, T, unit_final, context);
}
GradShards held_grad_shards(HeldModel *h, CommGroup *world) {
    return h->ops->grad_shards(h->owner, world);
}
void held_checkpoint_layout(HeldModel *h, AdamW *opt, int dp_index, int dp, CkptLayout *ckpt) {
    h->ops->checkpoint_layout(h->owner, opt, dp_index, dp, ckpt);
}
double held_evaluate(HeldModel *h, const Dataset *data, const Config *cfg, int dp_index, int B) {
    return h->ops->evaluate(h->owner, data, cfg, dp_index, B);
}
void held_sample(HeldModel *h, const Dataset *data, const Config *cfg, uint64_t *rng) {
    h->ops->sample(h->owner, data, cfg, rng);
}
