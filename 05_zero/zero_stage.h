/* zero_stage.h: what the ranks of one pipeline stage do with their gradients
 * in chapter 05's pp x tp x dp trainer, with or without ZeRO.
 *
 * Chapter 04's pipeline leaves each stage's gradients in the stage's model
 * (pipeline.h: "what to do with them is the caller's"). The caller here is
 * one of two things, chosen by --zero and fixed for the run:
 *
 *   --zero 0    chapter 04 itself: the replicas all-reduce the gradients of
 *               what their rank holds (data_parallel.h: --dp-mode naive or
 *               flat), every rank runs AdamW on all of it (optimizer_step.h)
 *   --zero 1-2  zero.c over the stage's data-parallel group: the stage's
 *               units (with --tp, this rank's tensor slices of them: Megatron's
 *               distributed optimizer) sharded, stage 2's reduce-scatter in
 *               the storage calls (model.h) around every micro-batch's backward
 *               of a unit (zb-h1: after its B and after its W), the norm summed over
 *               the world's ranks (tensors every tp rank holds whole counted
 *               on tp rank 0), AdamW on this rank's slices, the units
 *               all-gathered again; fp32 or 16 bits, with checkpoints
 *
 * The step reads as chapter 04's either way (05's train.c): the replicas'
 * data_parallel_begin_step -> the schedule (pipeline.h) ->
 * data_parallel_sum_gradients -> zero_stage_update, where 04 ran
 * optimizer_step; what differs sits here, so that the story of the step
 * stays in main. */
#ifndef ZERO_STAGE_H
#define ZERO_STAGE_H

#include "02_data_parallel/data_parallel.h" /* 02: data parallelism */
#include "common/comm/grid.h" /* the process grid: dp x pp x cp x tp */
#include "common/run/harness.h" /* the run around the training loop */
#include "common/model/optim.h" /* AdamW and the learning-rate schedule */
#include "04_pipeline/pipeline.h" /* 04: a pipeline stage and its interpreter */
#include "04_pipeline/pipeline_flags.h" /* 04: the pipeline's flags and checks */
#include "05_zero/tied_ends.h" /* 05: a tied wte on two stages, owned by the first */
#include "05_zero/zero.h" /* 05: ZeRO's shards */

/* ---- the flags (a train.c takes these rows: FLAG_ROWS, config.h), after chapter 04's ---- */
typedef struct {
    int zero;     /* --zero 0..3 */
    int prefetch; /* --prefetch K: stage 3 gathers K units ahead */
} ZeroFlags;
/* --zero and --prefetch, and chapter 04's --pp and --print-schedule retold
 * (FLAG_RETELL): one stage is the default here, ZeRO over the world */
extern const Flag zero_flags[];
/* --pp defaults to 1 (dp: the rest of the world) unless --dp is given;
 * then chapter 04's defaults (pipeline_effective_flags). */
void zero_effective_flags(const Config *cfg, ZeroFlags *z, PipelineFlags *pipe, ModelParallelFlags *model);
/* What ZeRO does not combine with (zero_stage_check_flags), chapter 04's
 * layout (pipeline_check_world, _batch), and with own_step (the program
 * runs ZeRO's own step over the world on one stage with tp 1: zero.h) that
 * the batch splits into the world's ranks x --micro. */
void zero_check_flags(const Config *cfg, const ZeroFlags *z, const PipelineFlags *pipe,
                      const ModelParallelFlags *model, int own_step);

typedef struct {
    int zero;               /* 0, 1 or 2 */
    Pipeline *p;            /* the stage whose gradients these are */
    HeldModel *held;        /* the stage as the step sees it (pipeline_held) */
    DataParallel *replicas; /* --zero 0: chapter 02's sum over the stage's replicas; 1-2: taken over here */
    const ProcessGrid *grid;
    AdamW opt;     /* --zero 0: chapter 04's AdamW on what this rank holds */
    Zero z;        /* --zero 1-2: the stage's units sharded over its dp group */
    TiedEnds tied; /* --zero 1-2, --tie-embeddings on several stages: the first stage's
                      shards own wte, the last stage's head reads a copy (tied_ends.h) */
} ZeroStage;

/* The optimizer of stage p (pipeline_build'ed with caller storage when zero
 * > 0), held its view: --zero 0 chapter 04's, replicas made by
 * data_parallel_create over grid's weight group (dp's flags) and AdamW on
 * what this rank holds; 1-2 zero.c's shards over that group, whose storage
 * calls it gives the stage's units, and replicas taken over
 * (data_parallel_take_over: their begin_step, after pipeline_begin_step,
 * starts ZeRO's step of the pipeline's step number, their
 * sum_gradients is ZeRO's reduce-scatter, with a tied head's gradient of wte
 * then added into the first stage's shards). */
void zero_stage_create(ZeroStage *s, DataParallel *replicas, Pipeline *p, HeldModel *held, int zero,
                       const DataParallelFlags *dp, const ProcessGrid *grid);
void zero_stage_destroy(ZeroStage *s);
/* The flags ZeRO does not combine with, refused in one line each (fatal),
 * for --zero `zero` on P stages of T tensor ranks: chapter 04's replica flags
 * under ZeRO or on one stage (ZeRO keeps the replicas), --virtual with ZeRO,
 * --schedule on one stage, --prefetch below stage 3, --print-schedule below
 * it on one stage, and stage 3 with stages, tensor slices or --cp (a stage
 * of cp ranks shards over the dp x cp ranks holding its weights). 05 and 06 both;
 * the rules are zero_flags_problem's (layout_rules.h), which common/plan applies too. */
void zero_stage_check_flags(const Config *cfg, int zero, int P, int T, int cp, int print_schedule);
/* --ep N above 1 (chapter 04's expert parallelism) runs where the stage's
 * replicas are chapter 04's (--zero 0 on P > 1 stages); elsewhere it is
 * refused in one line: not written with ZeRO's shards (and so 06's
 * --offload, which shards too) or its own step on one stage yet. */
void zero_refuse_expert_parallel(int ep, int zero, int P);
/* What this rank holds of a checkpoint (--zero 0: held's, replica d
 * writing share d; 1-2: zero_stage_checkpoint_layout, the layout named
 * "zero N"), --resume read into it, the 16-bit weights rounded from it. */
void zero_stage_resume(ZeroStage *s, Run *run, const char *program, const char *schedule);
/* The update of step `step` (1-based): the WHOLE model's gradient norm from
 * what each rank holds, clipping, AdamW on this rank's part (--zero 0:
 * optimizer_step on held's; 1-2: on this rank's shards, the stage's units
 * all-gathered again, with tied embeddings the last stage's copy of wte
 * refreshed); returns 1 when fp16 overflowed on any rank (skipped
 * everywhere). With ZeRO, *comm_ms and *busy_ms gain its collectives'
 * times, wherever in the step they ran. */
int zero_stage_update(ZeroStage *s, LossScaler *ls, const OptimHyper *h, int step, double *grad_norm,
                      double *comm_ms, double *busy_ms);

#endif
