/* stage_replicas.h: the replicas of a pipeline stage (chapter 04): the ranks
 * that hold the same units (or slices) of the model, each in its own
 * replica of the pipeline, sum their gradients with chapter 02's machinery
 * (data_parallel.h: --dp-mode naive, flat or overlap, --allreduce,
 * --check-replicas) and each runs AdamW on what it holds, clipped by the
 * WHOLE model's norm (optimizer_step.h).
 *
 * The pipeline (pipeline.h) leaves each stage's gradients in its model;
 * this is what 04's step does with them:
 *   stage_replicas_begin_step -> the schedule -> stage_replicas_sum_gradients
 *   -> stage_replicas_update
 * A later chapter that replaces the update (sharding it, moving it off the
 * device) offers the same calls. */
#ifndef STAGE_REPLICAS_H
#define STAGE_REPLICAS_H

#include "02_data_parallel/data_parallel.h" /* 02: data parallelism */
#include "common/comm/grid.h" /* the process grid: dp x pp x cp x tp */
#include "common/run/harness.h" /* the run around the training loop */
#include "common/model/optim.h" /* AdamW and the learning-rate schedule */
#include "04_pipeline/pipeline.h" /* 04: a pipeline stage and its interpreter */
#include "03_model_parallel/expert_parallel.h" /* 03: experts split over ranks (--ep) */

typedef struct {
    Pipeline *p;            /* the stage whose gradients these are */
    CommGroup *model_group; /* one replica's ranks: its stages and slices (the norm counts a slice once) */
    CommGroup *world;
    AdamW opt;             /* the parameters this rank holds */
    DataParallel replicas; /* the sum over the replicas of what this rank holds (and over cp) */
    const ExpertParallel *experts; /* --ep: the stage's experts over its replicas (NULL: none) */
    GradSpan *spans;               /* --ep: the norm's parts of this rank (stage_replicas_split_experts) */
    int num_spans, replica;        /* and this rank's replica of the stage */
} StageReplicas;

/* The optimizer of stage p and its replicas over grid's weight group (dp x
 * cp: the ranks holding the same weights), dp's flags; overlap's buckets
 * launch as the stage's units become final (Pipeline.unit_final). */
void stage_replicas_create(StageReplicas *r, Pipeline *p, const DataParallelFlags *dp,
                           const ProcessGrid *grid, CommGroup *model_group, CommGroup *world);
/* --ep N (03's expert_parallel.h) inside the stage: the experts of its MoE
 * blocks split over groups of N consecutive replicas of the stage (grid's
 * dp_group; the stage's model built with its experts only, StageLayout.
 * expert_parts), kept per activation slot, their rows in the stage's
 * timeline, their gradients summed over their holders. The norm then
 * counts each stage's dense tensors on replica 0 and each expert on its
 * holder among replicas 0 .. N-1, summed over the world; the checkpoint is
 * the whole model's (expert_parallel_checkpoint_layout). Before
 * stage_replicas_resume; nothing when N is 1. */
void stage_replicas_split_experts(StageReplicas *r, ExpertParallel *x, const ExpertParallelFlags *f,
                                  const ModelParallelFlags *mp, const ProcessGrid *grid);
/* --print-buckets' table (data_parallel_print), then everything freed. */
void stage_replicas_print(const StageReplicas *r);
void stage_replicas_destroy(StageReplicas *r);
/* What this rank holds of a checkpoint (its stage's units or their slices,
 * replica d x cp + c writing its share; the layout named as the grid lays
 * out the ranks: pipeline_ckpt_layout_init), --resume read into it, and
 * every replica's weights made rank 0's. */
void stage_replicas_resume(StageReplicas *r, Run *run, const char *program, const ProcessGrid *grid,
                           const char *schedule);

/* Before the step's schedule. */
void stage_replicas_begin_step(StageReplicas *r);
/* After it: the gradients all-reduced over the replicas. Returns the
 * milliseconds this rank waited; *busy_ms: how long the all-reduces ran. */
double stage_replicas_sum_gradients(StageReplicas *r, double *busy_ms);
/* The update of step `step` (1-based): the whole model's gradient norm from
 * what each rank holds, clipping, AdamW on this rank's part; returns 1 when
 * fp16 overflowed on any rank (skipped everywhere). */
int stage_replicas_update(StageReplicas *r, LossScaler *ls, const OptimHyper *h, int step, double *grad_norm);
/* --check-replicas N: every N steps the replicas compare their weights. */
void stage_replicas_check(const StageReplicas *r, int every, int step);

#endif
