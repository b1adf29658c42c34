/* zero.h: the Zero Redundancy Optimizer's bookkeeping for chapter 05: which
 * model state a rank keeps, and the collectives that move the rest.
 *
 * N data-parallel ranks each train on 1/N of the global batch, as in chapter
 * 02. Chapter 02 keeps everything on every rank: parameters, gradients and
 * Adam's two moments, 4 + 4 + 8 = 16 bytes per parameter in fp32, N times
 * over. ZeRO cuts the state along the shard layout of param_table.h (every
 * unit padded to a multiple of N, rank r owning slice r of each) and keeps
 * on each rank only what it must:
 *
 *   stage  params  grads   optimizer  per rank (fp32)   gradient sync, then parameters
 *   0      whole   whole   whole      16 P              all-reduce
 *   1      whole   whole   shard      8 P + 8 P / N     reduce-scatter after backward; update own
 *                                                       slices; all-gather
 *   2      whole   shard   shard      4 P + 12 P / N    reduce-scatter per unit as backward
 *                                                       produces it; update; all-gather
 *   3      shard   shard   shard      16 P / N          each unit all-gathered before its forward
 *                                                       and its backward, freed after;
 *                                                       reduce-scatter per unit; update
 *
 * Every stage computes the same numbers as chapter 01: the update of an
 * element depends only on that element's gradient, moments and the global
 * gradient norm, so it does not matter which rank updates it, and the norm
 * is summed from the ranks' slices (sum of squares, all-reduced).
 *
 * Stage 3's gather/free schedule is data (ZeroAction), built once from the
 * number of units and --prefetch K: before unit u's forward (or backward)
 * the units of the next K computations are gathered too, each into its own
 * buffer from a pool of K + 1, and every buffer goes back to the pool right
 * after its computation. The gathers, and at stages 2-3 the reduce-scatters
 * of each unit's gradients, are queued on a communication thread
 * (comm_worker.h; on a GPU its collectives run on the communication stream,
 * ordered by events): a computation waits only for its own unit's gather, so
 * with K >= 1 the gathers of the next units run while this one computes, and
 * a unit's reduce-scatter runs while the units before it back-propagate.
 *
 * Queue order: gathers before reduce-scatters. The worker runs its
 * collectives one at a time in the order they were queued, and it must: the
 * ranks' collectives pair up in that order, so a worker that picked the next
 * job by itself (a gather that came in while a reduce-scatter waited) could
 * pick differently on two ranks and deadlock them. The priority is therefore
 * in the order of queuing. After a unit's backward the hook first runs the
 * schedule up to the next computation, queuing its gather (and with K >= 1
 * the one K computations ahead), and only then queues the unit's
 * reduce-scatter. A reduce-scatter queued first would hold up the gather the
 * next backward waits for, and then run in the gap while the rank waits
 * (without prefetch nothing overlapped at all); queued second it runs under
 * the next unit's backward:
 *
 *   compute : bwd u |wait| bwd u-1          |wait| bwd u-2 ...
 *   worker  :       |gather u-1| reduce-scatter u |gather u-2| ...
 *
 * Mixed precision (--precision bf16|fp16, mixed.h). The parameters and
 * gradients above are 16 bits (2 bytes each) and so are their collectives;
 * the optimizer state is Adam's m and v plus the fp32 master weights of the
 * elements this rank updates (12 bytes each): stage 0 16 P, 1 4 P + 12 P / N,
 * 2 2 P + 14 P / N, 3 16 P / N, the ZeRO paper's formulas. A unit is
 * converted to fp32 into mixed.h's workspaces just before it computes, and
 * its fp32 gradients rounded into 16 bits right after. fp16's overflow check
 * is agreed by the ranks (each sees only its slices): a skipped step is
 * skipped by every rank.
 *
 * zb-h1 (chapter 04's backward split into B, the input gradients, and W,
 * the linear layers' weight gradients, later). The hooks are the units'
 * storage calls (GPT.storage, model.h), which run around a unit's B and
 * again around its W; each call's gradient holds what its half added, the
 * other half's elements zeros. Stage 2 reduce-scatters after each call and
 * adds the slice into the shard: the zeros add nothing, so the shard gets
 * 1F1B's sums in 1F1B's order, bit for bit, for twice the reduce-scatters
 * (B's carry the layernorms' and the embedding's gradients and zeros).
 *
 * Units smaller than N elements, or not divisible by N, are padded (zeros
 * that every rank keeps and nobody updates): any N works. */
#ifndef ZERO_H
#define ZERO_H

#include "common/run/checkpoint.h" /* save and resume */
#include "common/comm/comm.h" /* collectives and messages between ranks */
#include "common/comm/comm_worker.h" /* collectives run while the caller computes */
#include "common/run/config.h" /* Config and the flag tables */
#include "common/model/data.h" /* the training data and its batches */
#include "common/model/mixed.h" /* mixed precision: 16-bit weights, loss scaling */
#include "common/model/model.h" /* GPT, its forward and backward */
#include "common/model/optim.h" /* AdamW and the learning-rate schedule */
#include "common/model/optimizer_step.h" /* the optimizer step: norm, clip, skip, AdamW */
#include "03_model_parallel/tensor_parallel.h" /* 03: tensor parallelism */
#include "common/run/timeline.h" /* timeline.csv for the Gantt charts */

#include <stddef.h>

/* One step of stage 3's schedule for a micro-batch: the computations in
 * order (forward of every unit, then backward of every unit), each preceded
 * by the gathers it needs and followed by the frees it allows. */
typedef enum { ZERO_GATHER, ZERO_FORWARD, ZERO_BACKWARD, ZERO_FREE } ZeroOp;
typedef struct {
    ZeroOp op;
    int unit;
    int use; /* which computation the gathered buffer is for (index into the list of computations) */
} ZeroAction;

/* At stages 2-3, a unit's padded gradient on its way to the shard: filled by
 * the unit's backward, reduce-scattered by the worker while the next units
 * back-propagate (two of them alternate). */
typedef struct {
    void *data;      /* (N * S of the largest unit) CAT_BUCKETS, in the collectives' type */
    void *slice;     /* (S) CAT_BUCKETS: the reduced slice, when it must be added to the shard */
    long ticket;     /* its reduce-scatter, -1 when none is pending */
    int unit, micro; /* whose gradient it holds, of which micro-batch */
    int accumulate;  /* a later micro-batch: slice is added to the shard once done */
} ZeroGradBuffer;

typedef struct {
    int stage, prefetch;
    CommGroup *group;     /* the data-parallel ranks the state is sharded over */
    CommGroup *sum_group; /* where the norm's sums are added: group, or with pipeline stages the world */
    int rank, ranks;
    GPT *model;                /* table and views; the storage below is bound to it */
    int first_unit, last_unit; /* the units held: the whole model, or a pipeline stage's */
    size_t param_first, numel; /* their elements in the table: [param_first, param_first + numel) */

    /* fp32: */
    float *params;  /* stages 0-2: whole (num_params); stage 3: this rank's shard (shard_numel), CAT_PARAMS */
    float *grads;   /* stages 0-1: whole; stages 2-3: shard, CAT_GRADS */
    AdamW opt;      /* stage 0: every element; stages 1-3: the shard's */
    size_t shard_n; /* shard_numel of the table for N ranks */
    size_t max_unit;      /* the largest padded unit, N * S */
    GradSpan *norm_spans; /* stage 1: this rank's slice of each unit in the whole gradient buffer;
                             with tensor slices, stage 2 too: in the shard (shard_norm_spans) */
    int num_norm_spans;

    /* bf16/fp16 (half): params16 and grads16 laid out as params and grads
     * (which stay NULL), master the fp32 weights of opt's elements */
    int half;
    CommDtype dtype; /* what params, grads and their collectives hold: COMM_F32 or the 16-bit format */
    uint16_t *params16, *grads16;
    float *master;    /* CAT_OPTIMIZER */
    float *slice_f32; /* (S) CAT_BUCKETS: a 16-bit slice widened, to be added to the shard */
    MixedModel mixed; /* the fp32 workspaces of the unit at hand */

    /* stages 2-3: the unit's gradient being back-propagated is grad_buffers[current]
     * (fp32: unit_grads points at its data) */
    ZeroGradBuffer grad_buffers[2];
    int current;
    float *unit_grads;
    int accumulate; /* 0 for the step's first micro-batch: reduce-scatter into the shard */
    /* stages 1-2: the all-gather of the updated parameters, a unit at a time (CAT_COMM) */
    void *gather_send, *gather_recv;
    CommWorker *worker; /* stages 2-3: the gathers and reduce-scatters that overlap computing */

    /* --tie-embeddings at stages 2-3: the head reads wte, the embedding unit's,
     * which these stages do not keep bound. Stage 3 gathers the embedding unit
     * for the head's forward into tied_gathered (the unit padded, z->dtype,
     * CAT_GATHERED), kept for the head's backward, which follows it. The
     * head's gradient of wte waits in tied_dwte (fp32, wte's elements; 16 bits:
     * mixed.h's own) for the embedding unit's backward, which starts from it, so
     * that it is reduce-scattered once, with the embedding's. NULL: untied, or
     * a pipeline stage's units, which hold one end at most (tied_ends.h). */
    void *tied_gathered;
    float *tied_dwte;

    /* stage 3: the schedule, its cursor, and the pool of gathered units */
    ZeroAction *actions;
    int num_actions, cursor;
    void **pool;   /* pool_size buffers of max_unit elements, CAT_GATHERED */
    int pool_size; /* prefetch + 1, or the number of computations if fewer */
    int *pool_busy;
    int *buffer_of_use;  /* the pool buffer holding computation i's unit, -1 */
    long *ticket_of_use; /* the gather of computation i's unit */

    /* this step: where it is, when it began (wall_ms), the milliseconds the
     * caller waited on communication (comm_ms) and the collectives ran, on
     * the worker or in the caller (comm_busy_ms), and what ran when
     * (timeline.csv) */
    int step, micro;
    int backwards; /* the step's backward passes begun (a pipeline's micro-batches have no begin_micro) */
    double origin_ms, comm_ms, comm_busy_ms, compute_start_ms;
    Timeline timeline;
} Zero;

/* Storage for `stage` over group g, initial values from seed, bound to model
 * (built from cfg with no storage); in fp32. */
void zero_create(Zero *z, GPT *model, const ModelConfig *cfg, uint64_t seed, int stage, int prefetch,
                 CommGroup *g);
/* The same in `precision` (fp32: zero_create). */
void zero_create_precision(Zero *z, GPT *model, const ModelConfig *cfg, uint64_t seed, int stage,
                           int prefetch, CommGroup *g, Precision precision);
/* Stages 1-2 in `precision` for a pipeline stage's units (chapter 04's
 * Pipeline with caller_storage: model holds the table and the stage's
 * range), over its data-parallel group g; the norm's sums are added over
 * sum_group (the world, where every replica's stages hold the model once
 * per replica). */
void zero_create_stage(Zero *z, GPT *model, const ModelConfig *cfg, uint64_t seed, int stage, CommGroup *g,
                       CommGroup *sum_group, Precision precision);
/* The same over a tensor-parallel rank's slices of a stage (tensor_parallel.h:
 * tm built with tp->caller_storage): ZeRO shards what this rank holds, each
 * unit's slices, over g; the norm counts the replicated tensors on tp rank 0
 * only (tm's once_spans), so that the sum over sum_group counts every
 * parameter of the model once. The initial values are tm's. */
void zero_create_slices(Zero *z, TensorParallelModel *tm, uint64_t seed, int stage, CommGroup *g,
                        CommGroup *sum_group, Precision precision);
void zero_destroy(Zero *z);

/* The hooks of this stage's forward and backward (NULL for stages 0 and 1 in fp32). */
const UnitHooks *zero_hooks(Zero *z);
/* Before the step's first micro-batch, and before each micro-batch. */
void zero_begin_step(Zero *z);
void zero_begin_micro(Zero *z, int micro);
/* Step `step` (0-based) starts now: the origin of its timeline and of its
 * comm_ms (zero_begin_step does not move them). */
void zero_start_clock(Zero *z, int step);
/* After the last backward: stages 0-1 all-reduce the gradients; 2-3 have
 * reduce-scattered them already. */
void zero_sync_grads(Zero *z);
/* What this rank holds of the gradient, for the norm (optimizer_step.h):
 * stage 0 all of it; stage 1 its slice of every unit (norm_spans); stages 2-3
 * its shard, padding zeros included; from stage 1 on the ranks add their sums. */
GradShards zero_grad_shards(const Zero *z);
/* Stages 1-2, after zero_sync_grads: add `slice` (fp32, this rank's slice of
 * unit's elements, the padding left out) into this rank's slice of the
 * unit's summed gradient (stage 1: in the whole buffer; 2: in the shard;
 * 16 bits: rounded, as every sum is). Where a gradient of the unit was
 * summed elsewhere: a tied head's on the last stage (tied_ends.h). */
void zero_add_slice(Zero *z, int unit, const float *slice);
/* Stages 0-2: unit's weights as the computation reads them (z->dtype). */
const void *zero_unit_params(const Zero *z, int unit);
/* AdamW on this rank's part, then (stages 1-2) all-gather the parameters. */
void zero_update(Zero *z, float grad_scale, const OptimHyper *h);
/* The whole update of step `step` (1-based) in either precision:
 * optimizer_step.h's decision on zero_grad_shards (the gradient norm, loss
 * scale divided out, into *grad_norm; fp16's overflow agreed by every rank;
 * the loss scale's update; clipping), then zero_update unless the step is
 * skipped (returns 1 then, on every rank). */
int zero_step_update(Zero *z, LossScaler *ls, const OptimHyper *h, int step, double *grad_norm);
/* Stage 3 and 16-bit runs: every rank gathers the whole model into `whole`
 * (num_params, fp32) and binds it, for evaluation and sampling;
 * zero_unbind_whole undoes it. zero_needs_whole says whether a run must. */
int zero_needs_whole(const Zero *z);
void zero_bind_whole(Zero *z, float *whole);
void zero_unbind_whole(Zero *z);
/* The buffer zero_bind_whole fills, allocated before step 1 and kept (every
 * run evaluates at its last step, so a budget that cannot hold it is refused
 * at start-up); NULL when the model is held whole in fp32 already. */
float *zero_alloc_whole(const Zero *z);
/* Validation loss (rank 0's; NAN elsewhere) and, with sample > 0, a sample,
 * from the whole model (bound through `whole` when it is not held whole).
 * Collective over z->group. */
double zero_evaluate_and_sample(Zero *z, float *whole, Activations *acts, Scratch *scratch,
                                const Dataset *data, const Config *cfg, int sample, uint64_t *rng);

/* This rank's part of a checkpoint (checkpoint.h): the fp32 weights of
 * record, Adam's m and v. In fp32 the weights are the parameters (whole at
 * stages 0-2, this rank's shard at 3); in 16 bits the master weights, which
 * sit where the moments do (whole at stage 0, this rank's shard above). */
void zero_checkpoint_layout(const Zero *z, CkptLayout *l);
/* The same for zero_create_stage's and zero_create_slices' state (fp32):
 * the held units (tm: this rank's tensor slices of them, as
 * tp_checkpoint_layout maps them; NULL: whole) are written by dp rank 0,
 * Adam's m and v by the rank whose shard holds them; a tensor that every
 * tp rank holds whole, by tp rank 0 only. Every rank reads what it holds. */
void zero_stage_checkpoint_layout(const Zero *z, const TensorParallelModel *tm, CkptLayout *l);
/* What it uses, for any rank of a dp group that shards the held units of m
 * (its range: a stage's; tm: this rank's tensor slices of them, or NULL):
 * the weights held whole (params, written by dp rank 0) or in the shard
 * (shard_params, written by their owner, as adam_m and adam_v are, each
 * shard_n elements); on_host: the buffers are host memory (chapter 06). */
void shard_checkpoint_layout(CkptLayout *l, const GPT *m, int rank, int ranks, const TensorParallelModel *tm,
                             float *params, float *shard_params, float *adam_m, float *adam_v, size_t shard_n,
                             int on_host);
/* 16 bits, after a checkpoint was read into the master weights: round the
 * 16-bit parameters from them (stages 1-2: this rank's slices, then every
 * unit all-gathered, as after an update). Nothing to do in fp32. */
void zero_weights_from_master(Zero *z);

/* The norm's spans of a rank's shard (optimizer_step.h's GradSpan) over
 * units first_unit..last_unit of table t, held from element param_first on:
 * its slice of each unit, within the held elements it counts (counted:
 * tensor parallelism's tensors, the replicated ones on tp rank 0 only,
 * tp_grad_shards_once; NULL: all of them), in the held buffer's coordinates,
 * or with in_shard in the shard's. Returns their number; *spans xcalloc'ed.
 * ZeRO's stages and chapter 06's host shard use it. */
int shard_norm_spans(const ParamTable *t, int first_unit, int last_unit, size_t param_first, int rank,
                     int ranks, const GradSpan *counted, int num_counted, int in_shard, GradSpan **spans);

/* Stage 3's schedule for units -1..L and prefetch K (xcalloc'ed): the
 * schedule of one micro-batch's computations (zero_schedule_uses). */
int zero_schedule(int layers, int prefetch, ZeroAction **actions);
/* The schedule of any list of computations (each a forward or a backward of
 * a unit, in the order they run): uses[c]'s unit gathered by the time
 * computation c starts together with those of the next K, each into its own
 * buffer, freed right after its computation. Chapter 06's --offload-params
 * runs it over a pipeline stage's step, its "gathers" copies over PCIe. */
typedef struct {
    ZeroOp op; /* ZERO_FORWARD or ZERO_BACKWARD */
    int unit;
} ZeroUse;
int zero_schedule_uses(const ZeroUse *uses, int count, int prefetch, ZeroAction **actions);
void zero_print_schedule(const ZeroAction *actions, int n);

#endif
