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
 *   1      whole   whole   shard      8 P + 8 P / N     all-reduce; update own slices; all-gather
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
 * after its computation. On the CPU a gather returns when it is done, so
 * prefetching only changes the order and the memory (K + 1 gathered units);
 * on a GPU the gathers of later units would run on the communication stream
 * while this unit computes, which is what K buys there. */
#ifndef ZERO_H
#define ZERO_H

#include "comm.h"
#include "config.h"
#include "model.h"
#include "optim.h"

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

typedef struct {
    int stage, prefetch;
    CommGroup *group;
    int rank, ranks;
    GPT *model; /* table and views; the storage below is bound to it */

    float *params;  /* stages 0-2: whole (num_params); stage 3: this rank's shard (shard_numel), CAT_PARAMS */
    float *grads;   /* stages 0-1: whole; stages 2-3: shard, CAT_GRADS */
    AdamW opt;      /* stage 0: every element; stages 1-3: the shard's */
    size_t shard_n; /* shard_numel of the table for N ranks */
    size_t max_unit; /* the largest padded unit, N * S */

    /* stages 2-3: the gradient of the unit being back-propagated (padded to N * S,
     * CAT_BUCKETS) and, with micro-batches, the reduce-scattered slice to add */
    float *unit_grads, *slice_grads;
    int accumulate; /* 0 for the step's first micro-batch: reduce-scatter into the shard */
    /* stages 1-2: the all-gather of the updated parameters, a unit at a time (CAT_COMM) */
    float *gather_send, *gather_recv;

    /* stage 3: the schedule, its cursor, and the pool of gathered units */
    ZeroAction *actions;
    int num_actions, cursor;
    float **pool;  /* pool_size buffers of max_unit, CAT_GATHERED */
    int pool_size; /* prefetch + 1, or the number of computations if fewer */
    int *pool_busy;
    int *buffer_of_use; /* the pool buffer holding computation i's unit, -1 */
} Zero;

/* Storage for `stage` over group g, initial values from seed, bound to model
 * (built from cfg with no storage). */
void zero_create(Zero *z, GPT *model, const ModelConfig *cfg, uint64_t seed, int stage, int prefetch,
                 CommGroup *g);
void zero_destroy(Zero *z);

/* The hooks of this stage's forward and backward (NULL for stages 0 and 1). */
const UnitHooks *zero_hooks(Zero *z);
/* Before the step's first micro-batch, and before each micro-batch. */
void zero_begin_step(Zero *z);
void zero_begin_micro(Zero *z, int micro);
/* After the last backward: stages 0-1 all-reduce the gradients; 2-3 have
 * reduce-scattered them already. */
void zero_sync_grads(Zero *z);
/* The global gradient norm, from this rank's slices. */
double zero_grad_norm(Zero *z);
/* AdamW on this rank's part, then (stages 1-2) all-gather the parameters. */
void zero_update(Zero *z, float lr, float grad_scale, const Config *cfg);
/* Stage 3: every rank gathers the whole model into `whole` (num_params) and
 * binds it, for evaluation and sampling; zero_unbind_whole undoes it. */
void zero_bind_whole(Zero *z, float *whole);
void zero_unbind_whole(Zero *z);

/* Stage 3's schedule for units -1..L and prefetch K (xcalloc'ed). */
int zero_schedule(int layers, int prefetch, ZeroAction **actions);
void zero_print_schedule(const ZeroAction *actions, int n);

#endif
