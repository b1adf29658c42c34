/* tied_ends.h: --tie-embeddings on several pipeline stages when the
 * optimizer is sharded: ZeRO 1-2 (chapter 05) and the offloaded optimizer
 * (chapter 06). The head reads wte, which the first stage holds.
 *
 * Chapter 04 gives the last stage a whole copy of the embedding unit with
 * gradients and AdamW state of its own, and the two ends sum their
 * gradients and make the same update (pipeline.h). A sharded optimizer
 * cannot take that copy in: its shard layout covers a stage's units as one
 * run, and the copy lies outside the last stage's run. So here the first
 * stage OWNS wte: its shards hold wte's master weights and Adam moments, its
 * part of the norm counts wte's gradient, its checkpoint writes wte, and
 * AdamW updates wte once. The last stage keeps only what its head reads
 * and writes (Megatron's embedding group, with the optimizer state on one
 * end):
 *
 *   wte   (Vp, C) fp32   the first stage's weights, as its embedding reads
 *                        them (16 bits: widened), bound as the head's matrix
 *   dwte  (Vp, C) fp32   the head's gradient of wte, summed over the step's
 *                        micro-batches in fp32 (as Megatron's main_grad)
 *
 * Each step, in the ends of each replica (d, c, t):
 *   last stage    dwte, placed in the padded embedding unit (wpe's part and
 *                 the padding zeros), reduce-scattered over its dp group:
 *                 slice r of the replicas' sum, sent to its first stage (pp)
 *   first stage   adds the slice into its own slice of the embedding unit's
 *                 gradient (ZeRO's after its own reduce over dp: zero.h's
 *                 zero_add_slice; the host's shard: offload_stage.c), so
 *                 the norm, clipping and AdamW see wte's whole gradient once
 *   after every change of the first stage's weights (an update, a resume):
 *                 wte sent to the last stage (fp32), its copy refreshed
 *
 * The dp groups of the two ends have the same size and the table is the
 * same, so slice r of the embedding unit is the same elements on both.
 * With --tp the stage's model is a tensor rank's slices (tensor_parallel.h):
 * wte is that rank's rows of it (the vocabulary split), and the same tensor
 * rank of the first stage owns them.
 * Memory: the last stage holds 2 x 4 bytes per element of wte (CAT_PARAMS
 * and CAT_GRADS: a copy, no optimizer state) and the padded unit for its
 * reduce-scatter (CAT_BUCKETS); in 16 bits the first stage widens wte
 * into a buffer of its own before sending (CAT_COMM). On the pp axis: one
 * slice (4 bytes x S) and one wte (4 bytes each) per replica per step. */
#ifndef TIED_ENDS_H
#define TIED_ENDS_H

#include "common/comm/comm.h" /* collectives and messages between ranks */
#include "common/core/half.h" /* bf16 and fp16 conversions */
#include "common/model/model.h" /* GPT, its forward and backward */

typedef enum { TIED_NONE, TIED_OWNER, TIED_COPY } TiedEnd;

typedef struct {
    TiedEnd end;                /* the first stage owns wte, the last keeps its copy; the others NONE */
    CommGroup *pp;              /* the replica's stages */
    int other;                  /* the other end's rank in pp */
    GPT *model;                 /* the stage's model: its table, and the head's views */
    size_t wte_at, wte_numel;   /* wte within the embedding unit */
    size_t slice_n;             /* S: a dp rank's slice of the padded embedding unit */
    size_t slice_count;         /* this rank's elements of it that are not padding */
    float *slice;               /* (S) the reduced slice of the head's gradient: sent, or received */
    float *host_slice;          /* (S) pinned: the slice on the host (the owner's shard is there: 06) */
    CommGroup *dp;              /* the ranks the embedding unit is sharded over */
    /* the last stage */
    float *wte, *dwte;          /* (Vp, C) each (above) */
    float *padded;              /* (N x S) the padded embedding unit's gradient, for the reduce-scatter */
    /* the first stage, 16 bits: wte widened for sending */
    float *wte_out;
    int half;
    HalfFormat format;
    UnitHooks hooks;            /* the last stage: the model's storage calls, then the head's binding */
    const UnitHooks *inner;     /* the storage calls it wraps (NULL: none) */
} TiedEnds;

/* The part of stage `stage` of `stages` (pp: their group) in a tied
 * model's embedding group; nothing unless the model is tied and the stages
 * several. dp: the group the stage's optimizer shards over; precision:
 * the stage's weights'; host_slice: the owner's shard is in host memory.
 * On the last stage the model's storage calls (model->storage, set by the
 * optimizer before this) are wrapped, so that the head reads wte and
 * writes dwte; call it after the optimizer is built. */
void tied_ends_create(TiedEnds *t, GPT *model, int stage, int stages, CommGroup *pp, CommGroup *dp,
                      Precision precision, int host_slice);
void tied_ends_destroy(TiedEnds *t);

/* Before the step's schedule: the last stage's dwte from zero. */
void tied_ends_begin_step(TiedEnds *t);
/* After the stage's own gradients are summed over dp: the last stage
 * reduce-scatters dwte and sends its slice; the first stage receives it and
 * returns it ((slice_count) fp32, on the device; host_slice: on the host),
 * for the caller to add into its slice of the embedding unit's gradient.
 * NULL on the other stages. */
const float *tied_ends_sum_gradient(TiedEnds *t);
/* After every change of the first stage's weights (and once they are
 * initialised or resumed): the first stage sends wte, read from its
 * embedding unit's weights (fp32, or 16 bits in t->format), the last
 * stage's copy receives it. Collective over the two ends; NULL elsewhere. */
void tied_ends_refresh(TiedEnds *t, const void *embedding_unit_params);

#endif
