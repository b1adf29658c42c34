/* mixed.h: mixed precision (--precision bf16|fp16): a GPT stored in 16 bits,
 * trained through fp32 master weights, and fp16's loss scaling.
 *
 * Per parameter, in bytes:
 *
 *                   fp32   bf16/fp16   category
 *   params           4        2        CAT_PARAMS    what forward and backward read
 *   grads            4        2        CAT_GRADS     summed over the micro-batches
 *   master weights   -        4        CAT_OPTIMIZER the fp32 copy AdamW updates
 *   Adam m, v        8        8        CAT_OPTIMIZER (optim.h)
 *   total           16       16        of which optimizer state: 8 vs 12
 *
 * The total does not move; what moves is where it sits. The 2 + 2 bytes are
 * all a device needs to compute, and the 12 of optimizer state are what ZeRO
 * (chapter 05) shards and ZeRO-Offload (chapter 06) moves to the host.
 *
 * Why master weights: an update lr * m/sqrt(v) is often below half a unit in
 * the last place of a 16-bit weight (bf16 has 8 significant bits: 1 + 2^-8
 * rounds back to 1), so applied to the 16-bit weight it would be lost. AdamW
 * adds it to the fp32 copy, where it accumulates, and the 16-bit weights are
 * that copy rounded after every step.
 *
 * How a step computes. Before a unit's forward or backward (model.h:
 * GPT.storage), its 16-bit weights are converted into an fp32 workspace the
 * size of the largest unit (exactly: every 16-bit value is a float); its
 * gradients go into a second such workspace, then are added into the 16-bit
 * gradients, rounded, after its backward. The matmuls take 16-bit inputs
 * (GPT.half_matmuls: kernels.h's linear_*_half round both operands of each
 * GEMM, weights and activations or their gradients, and accumulate in fp32:
 * cublasGemmEx on tensor cores; on the CPU, sgemm on the rounded values,
 * since the installed OpenBLAS has no 16-bit GEMM: kernels_cpu.c);
 * layernorm and its statistics, attention's softmax, GELU, the loss and the
 * gradient norm are fp32 (double for the norm).
 *
 * Activations: all fp32 (4 bytes a value, CAT_ACTIVATIONS as in fp32: the
 * same memory.csv line in every precision), and so are the activation
 * gradients (CAT_WORKSPACE) and what crosses between ranks: 03's and 04's
 * stage boundaries and tensor parallelism's all-reduces (only the
 * data-parallel gradient all-reduce is 16-bit). Per token (model.h:
 * Activations, BlockActs):
 *   could be 16-bit with the same results, since the matmuls round them
 *   anyway and nothing else reads them:
 *     ln1, ln2 (C each, per block), lnf (C)              -> 2C(2L+1) bytes saved
 *   would change results if rounded (fp32 arithmetic reads them):
 *     qkv (3C: attention), atty (C: attention's backward too), fch (4C:
 *     GELU's backward), res2, res3, encoded (C each: the residual stream),
 *     logits, probs (V each: the loss), losses (1)
 *   must stay fp32: the layernorm means and rstds (4 per block + 2), the
 *     attention log-sum-exp (NH per block)
 * For the small preset at B x T = 1024 the first group is 2,359,296 of the
 * 28,463,104 activation bytes (course.md, chapter 05). Storing it needs a
 * layernorm that writes 16 bits and matmuls that read them, in both backends.
 *
 * fp16 and loss scaling. fp16 has 5 exponent bits: gradients below 2^-24
 * become zero and above 65504 become Inf. Scaling the loss by S scales every
 * gradient by S, lifting the small ones into range; AdamW divides S out
 * (grad_scale). Too large an S overflows: the step's gradients hold an Inf or
 * a NaN, the step is skipped (the weights and Adam's state stay as they were)
 * and S halves; after `window` clean steps in a row S doubles, so it stays
 * near the largest scale that does not overflow. bf16 has fp32's 8 exponent
 * bits, so its gradients fit wherever fp32's do: no scaling. */
#ifndef MIXED_H
#define MIXED_H

#include "common/core/half.h" /* bf16 and fp16 conversions */
#include "common/model/model.h" /* GPT, its forward and backward */
#include "common/model/model_config.h" /* ModelConfig */
#include "common/model/optim.h" /* AdamW and the learning-rate schedule */

#include <stddef.h>
#include <stdint.h>

typedef struct {
    HalfFormat format;
    GPT *model;
    size_t n;           /* parameters held: model->param_count (the whole table, a stage's units,
                           or a tensor-parallel rank's slices) */
    uint16_t *params;   /* (n) device, CAT_PARAMS */
    uint16_t *grads;    /* (n) device, CAT_GRADS */
    float *master;      /* (n) device, CAT_OPTIMIZER */
    float *unit_params; /* (largest unit) device, CAT_WORKSPACE: the unit at hand in fp32 */
    float *unit_grads;  /* (largest unit) device, CAT_WORKSPACE: its gradients in fp32 */
    UnitHooks storage;  /* model->storage: convert and bind a unit, add its gradients back */
    size_t *unit_at;    /* mixed_create_chunks: per unit u (at u + 1), where its elements start in
                           the held buffers; NULL: one run of units from model->param_first */
    /* --tie-embeddings with the embedding and the head in one range: the head
     * reads wte, the embedding unit's, which is not bound while the head's unit
     * is. The head gets wte in fp32 of its own (tied_wte), and its gradient of
     * wte (tied_dwte) waits for the embedding's backward, which starts from it:
     * the head's contribution first, then the lookups', as in fp32. On a
     * pipeline's last stage, which holds a copy of the embedding unit after its
     * own units (mixed_create_chunks), the head reads the copy's wte and its
     * gradient is added into the copy's at once. NULL when the weights are not
     * tied. Device, CAT_WORKSPACE, wte's size each. */
    float *tied_wte, *tied_dwte;
    const uint16_t *tied_source; /* the embedding unit's 16-bit weights, where the head's wte is read
                                    from (mixed_tied_source; mixed_create_* set it themselves) */
} MixedModel;

/* The 16-bit format of a precision other than fp32. */
HalfFormat precision_format(Precision p);

/* The whole model of cfg in 16 bits: the table bound to no storage of its own
 * (units get theirs one at a time through model->storage; model->grads stays
 * NULL and model->params is the master copy, the fp32 weights a checkpoint
 * holds), master weights initialised from seed as gpt_create would, and the
 * 16-bit weights rounded from them. */
void mixed_create(MixedModel *mm, GPT *model, const ModelConfig *cfg, uint64_t seed, HalfFormat format);
/* The same for a stage of a layer split (gpt_create_range in 16 bits): only
 * units first_unit..last_unit, with the whole model's initial values for
 * their elements. The held buffers are indexed from the range's first
 * element, model->param_first, as gpt_create_range's are. */
void mixed_create_range(MixedModel *mm, GPT *model, const ModelConfig *cfg, uint64_t seed, int first_unit,
                        int last_unit, HalfFormat format);
/* The general case, for a table the caller built (gpt_init done, no storage
 * bound: tensor parallelism's local table of slices): units
 * first_unit..last_unit in 16 bits, the master weights copied from
 * `initial` (host, one float per element of the range, in table order from
 * the range's first element). mixed_create_range is this with the whole model's values. */
void mixed_create_units(MixedModel *mm, GPT *model, int first_unit, int last_unit, const float *initial,
                        HalfFormat format);
/* The same for several runs of units, first_units[c]..last_units[c] (a
 * stage of an interleaved pipeline's chunks), held one run after another:
 * initial and the held buffers in that order, model->param_count their sum. */
void mixed_create_chunks(MixedModel *mm, GPT *model, const int *first_units, const int *last_units, int chunks,
                         const float *initial, HalfFormat format);
void mixed_destroy(MixedModel *mm);

/* After the master weights changed outside AdamW (a checkpoint was loaded
 * into model->params, which is the master copy): round the 16-bit weights
 * from them again. */
void mixed_weights_from_master(MixedModel *mm);

/* AdamW on the master weights from the 16-bit gradients (times grad_scale),
 * then the 16-bit weights rounded from them. */
void mixed_adamw_step(MixedModel *mm, AdamW *opt, float grad_scale, const OptimHyper *h);

/* ---- a unit at a time, from 16-bit storage kept elsewhere ----
 * ZeRO (chapter 05) keeps the 16-bit weights and gradients in shards and
 * gathered units rather than in one whole buffer: it builds only the fp32
 * workspaces and converts each unit itself, with the calls the storage hooks
 * of mixed_create use. */

/* The table of cfg, the two fp32 workspaces and 16-bit matmuls; no 16-bit
 * buffers, no master weights, no storage hooks (model->params stays NULL). */
void mixed_units_create(MixedModel *mm, GPT *model, const ModelConfig *cfg, HalfFormat format);
/* The same for units first_unit..last_unit of model, whose table is built
 * (a pipeline stage's, or a tensor-parallel rank's local table). */
void mixed_units_create_range(MixedModel *mm, GPT *model, int first_unit, int last_unit, HalfFormat format);
/* Tied weights (tied_wte above), for a caller that keeps the 16-bit weights
 * itself (mixed_units_create): where the embedding unit's 16-bit weights stay
 * for the whole step, which the head's unit reads its wte from. */
void mixed_tied_source(MixedModel *mm, const uint16_t *embedding_unit_params);
/* Bind unit to the workspace holding `params` (the unit's 16-bit weights, in
 * table order) in fp32, and, with_grads, to the zeroed gradient workspace. */
void mixed_unit_in(MixedModel *mm, int unit, const uint16_t *params, int with_grads);
/* Unbind the unit; with grads (the unit's 16-bit gradients, in table order),
 * add its fp32 gradients into them first, rounded. */
void mixed_unit_out(MixedModel *mm, int unit, uint16_t *grads);

typedef struct {
    float scale;     /* the loss is multiplied by this before the backward pass */
    int dynamic;     /* fp16 with --loss-scale dynamic: the scale adapts */
    int skips;       /* fp16: a step whose gradients are not finite is skipped */
    int window;      /* clean steps after which a dynamic scale doubles */
    int clean_steps; /* clean steps since the last change */
} LossScaler;

/* fp32 and bf16: scale 1, never skips. fp16: fixed_scale (--loss-scale), or
 * 0 for dynamic from 2^16 (PyTorch's GradScaler starts there too, the
 * default), doubling after `window` clean steps. (loss_scaler_init, config.h,
 * starts it from the command line.) */
void loss_scaler_start(LossScaler *ls, Precision precision, float fixed_scale, int window);
/* After a step's gradients: finite says whether all of them are. Returns 1
 * when the step must be skipped; updates the scale for the next step. The
 * rule (fp16; fp32 and bf16 never skip): gradients that are not finite skip
 * the step, restart the count of clean steps and, with a dynamic scale,
 * halve it; a clean step counts, and the window-th clean step in a row
 * doubles a dynamic scale and restarts the count. A fixed scale never
 * changes. (Exercise 05.4.) */
int loss_scaler_update(LossScaler *ls, int finite);

/* ---- a training step in either precision ----
 * The two places where a step depends on how the model is stored, for an
 * fp32 model (mm->params NULL: a zeroed MixedModel) and a 16-bit one alike. */

/* Units first_unit..last_unit of the model of cfg (LAYER_EMBEDDING ..
 * cfg->layers: the whole model) in `precision`: gpt_create_range (fp32; mm
 * zeroed) or mixed_create_range (bf16, fp16). precision_destroy undoes either. */
void precision_create_range(GPT *model, MixedModel *mm, const ModelConfig *cfg, uint64_t seed,
                            Precision precision, int first_unit, int last_unit);
void precision_destroy(GPT *model, MixedModel *mm);

/* Zero the gradients: model->grads, or mm->grads. */
void precision_zero_grads(GPT *model, MixedModel *mm);
/* The gradients as they are stored (model->grads, fp32, or mm->grads, 16
 * bits): what data parallelism all-reduces, in that type. */
void *precision_grads(GPT *model, MixedModel *mm);
/* The step itself (the norm, its agreement, the loss scale, clipping and
 * AdamW) for a model stored this way: optimizer_step.h. */

#endif
