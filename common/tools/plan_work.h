/* plan_work.h: a step's time from what its dry runs counted.
 *
 * Each rank's dry run writes dry-work.csv (common/run/dry_work.h): the
 * pieces of its step in order, each with its counted FLOPs (every kernel's
 * but AdamW's), matmul FLOPs, bytes and AdamW elements (work_ledger.h says
 * how each kernel counts). plan_work_read reads one; plan_work_time turns a
 * rank's pieces, and its pipeline's stages' pieces, into seconds on a
 * machine (plan_machine.h):
 *
 *   compute       the rank's fwd, bwd, bwd_input, bwd_weight and other pieces:
 *                 their FLOPs / flops
 *   backward      the part of compute in bwd, bwd_input and bwd_weight pieces
 *                 (the window that 02's buckets and 05's reduce-scatters hide under)
 *   update        the update pieces: FLOPs (the gradient norm, clipping) / flops
 *                 + AdamW elements (any piece's but host_update's) / device_adam_params_per_s
 *   host update   the host_update piece (06): AdamW elements / cpu_adam_params_per_s
 *   pipeline      a pipeline's schedule (04-06 with stages): every stage's list
 *                 of actions as its dry run ran it (its pieces named as
 *                 schedule_sim.h's actions, messages included, in order)
 *                 replayed against each other by schedule_replay_lists, each
 *                 computing action taking its own piece's FLOPs / flops;
 *                 messages take no time here (the communication part prices
 *                 them). The span of the replay is the pipeline's time. 03's
 *                 layer split (one micro-batch at a time through every stage):
 *                 the sum of every stage's computing pieces. Without stages:
 *                 the rank's own.
 *   bubble        pipeline - the rank's own computing pieces (fwd .. bwd_weight):
 *                 what it waits for the other stages
 *
 * The machine's flops is calibrated by calibrate.sh as these same counted
 * FLOPs of 01's step (its dry run) over that step's measured time. */
#ifndef PLAN_WORK_H
#define PLAN_WORK_H

#include "common/tools/plan_machine.h" /* machine files */
#include "common/kernels/work_ledger.h" /* a dry run's counted work */

typedef struct {
    WorkPiece *rows;
    int count;
} PlanWork;

/* Read DIR/dry-work.csv or a file of that form (path as given); a file that
 * is not one ends the program with one line naming it, the line and what is
 * wrong (exit 2). */
void plan_work_read(const char *path, PlanWork *w);
void plan_work_free(PlanWork *w);
/* Every piece's counted FLOPs, summed. */
double plan_work_flops(const PlanWork *w);

/* The pipeline around a rank: stages (1: none), chunks per stage (interleaved's V, else 1),
 * micro-batches per step, and whether it is 03's layer split (one micro-batch at a time) rather
 * than a schedule. */
typedef struct {
    int stages, chunks, micro, layer_split;
} PlanPipeline;

typedef struct {
    double compute_s, backward_s, update_s, host_update_s, pipeline_s, bubble_s;
    double flops; /* the rank's counted FLOPs (all its pieces) */
} WorkTime;

/* mine: the rank's pieces; stages: the pieces of one rank of each stage of its pipeline (p->stages
 * of them, mine among them; NULL without one). */
void plan_work_time(const PlanWork *mine, const PlanWork *stages, const PlanPipeline *p, const Machine *m,
                    WorkTime *out);

#endif
