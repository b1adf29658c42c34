/* offload_stage.h: ZeRO-Offload (offload.h) for one stage of chapter 05's
 * pipeline trainer, and what chapter 06's main does around its step.
 *
 * With --offload, a stage's units get their storage from the offload (the
 * Pipeline is built with caller_storage, as for 05's ZeRO): 16-bit weights
 * on the device, this rank's shard of the fp32 master weights, Adam's
 * moments and gradients on the host, over the stage's data-parallel group
 * (with --tp, the shard of its tensor slices of the stage's units).
 * These functions are the offloaded counterparts of zero_stage.h's: build
 * and resume, the run's header line, the step's decision, the summary. */
#ifndef OFFLOAD_STAGE_H
#define OFFLOAD_STAGE_H

#include "common/run/config.h" /* Config and the flag tables */
#include "common/comm/grid.h" /* the process grid: dp x pp x cp x tp */
#include "common/run/harness.h" /* the run around the training loop */
#include "06_offload/activation_offload.h" /* 06: --offload-activations */
#include "06_offload/offload.h" /* 06: ZeRO-Offload */
#include "04_pipeline/pipeline.h" /* 04: a pipeline stage and its interpreter */
#include "05_zero/zero_stage.h" /* 05: a stage's gradients under ZeRO */

/* ---- the flags (a train.c takes these rows: FLAG_ROWS, config.h), after chapter 05's ---- */
typedef struct {
    int offload;       /* --offload */
    int dpu;           /* --dpu: delayed parameter update */
    int dpu_warmup;    /* exact steps before the delayed update starts */
    int dpu_reference; /* the delayed update without a thread, for the tests */
    int activations;   /* --offload-activations: --recompute's checkpoints in host memory */
    int params;        /* --offload-params: the 16-bit weights in host memory, a unit at a time on the device */
} OffloadFlags;
extern const Flag offload_flags[];
/* --offload makes --zero 2 the default (the partitioning it offloads); then
 * chapter 05's defaults (zero_effective_flags). */
void offload_effective_flags(const Config *cfg, OffloadFlags *f, ZeroFlags *z, PipelineFlags *pipe,
                             ModelParallelFlags *model);
/* --dpu and its options without what they need, and with --offload what its
 * layout cannot give (--zero other than 2, the interleaved schedule's
 * chunks), --offload-activations without --offload and --recompute or with
 * --pp, --tp or --cp above 1, --offload-params without --offload, each
 * refused in one line
 * that says why (EXIT_USAGE), first;
 * then chapter 05's checks (zero_check_flags; with --offload one stage runs
 * the pipeline's step, not ZeRO's own). */
void offload_check_flags(const Config *cfg, const OffloadFlags *f, const ZeroFlags *z, const PipelineFlags *pipe,
                         const ModelParallelFlags *model, const char *program);

/* The delayed update's state between steps: the update waiting for its turn
 * (--dpu-reference), which gradient shard holds its gradients. */
typedef struct {
    int waiting;
    int grads;
    OffloadUpdate update;
} DelayedUpdate;
typedef struct OffloadStage OffloadStage; /* 06's main's stage (below) */
/* Before a checkpoint (--dpu): the update still pending is done now, so that
 * the checkpoint holds every step's update through its own, and the step
 * after it computes with fresh weights, as a run resumed from it does
 * (then offload_stage_weights_changed). */
void offload_finish_delayed(OffloadStage *s);

/* After the device's weights changed (an update installed, or a delayed one
 * finished): with tied embeddings on several stages, the last stage's copy
 * of wte refreshed from the first stage's (tied_ends.h); else nothing. */
void offload_stage_weights_changed(OffloadStage *s);
/* The decision of step `step` (1-based): the gradient norm from every
 * rank's host shard (world: every stage's), fp16's loss scale, clipping;
 * *update gets the step's learning rate and gradient factor. Returns 1 when
 * the step is skipped (an fp16 overflow on any rank). */
int offload_decide(Offload *o, Run *run, const OptimHyper *h, int step, double *grad_norm,
                   OffloadUpdate *update);
/* After the last step and run_layout: timeline.csv and trace.json, run.csv
 * with the offload's columns (the peak host memory over the ranks, the
 * bytes over PCIe and the network per step), memory.csv. dpu_warmup: -1
 * without --dpu. */
void offload_finish(Pipeline *p, Run *run, int dpu_warmup, double pcie_bytes);

/* ---- 06's main: a stage's replicas are 05's or offloaded ----
 * Chosen by --offload for the run, as zero_stage.h chooses between 04's
 * all-reduce and ZeRO. The offload enters the step through the replicas'
 * calls (data_parallel_take_over: begin_step, sum_gradients) and where main
 * calls these (and its own offload_step, the update on the host). */
struct OffloadStage {
    int offload;           /* --offload */
    ZeroStage *zero;       /* without it: chapter 05's (zero_stage.h) */
    Pipeline *p;           /* the stage */
    const ProcessGrid *grid;
    Offload off;           /* with it (offload.h) */
    DelayedUpdate delayed; /* --dpu: the update waiting for its turn */
    double pcie_bytes;     /* this rank's bytes over PCIe, every step's */
    ActivationOffload acts; /* --offload-activations (activation_offload.h) */
    int offload_activations;
    TiedEnds tied; /* --offload, tied on several stages: the first stage's host shard owns wte, the
                      last stage's head reads a copy (tied_ends.h) */
};
/* --offload-activations: the store the pipeline's slots keep their
 * checkpoints in (StageLayout.checkpoints), before the pipeline is built;
 * NULL without the flag. */
const CheckpointStore *offload_stage_checkpoints(OffloadStage *s, const OffloadFlags *f);
/* Once the pipeline is built: host memory for its slots' checkpoints. */
void offload_stage_create_checkpoints(OffloadStage *s, Pipeline *p);
/* Without --offload chapter 05's zero_stage_create. With it, the offload
 * of stage p's units over grid's weight group (--dpu: a second gradient
 * shard for the delayed update; --offload-params: the weights on the host,
 * copied in by the schedule of the stage's step, offload.h), its rows in
 * the stage's timeline, and replicas taken over: their begin_step (after
 * pipeline_begin_step, whose step number it takes) starts the step (each unit's gradient leaves for the host as its backward ends;
 * offload_begin_step), their sum_gradients waits for the copies in flight,
 * added into the host's fp32 shard (offload_finish_grads), and the
 * checkpoints' copies. */
void offload_stage_create(OffloadStage *s, ZeroStage *zero, DataParallel *replicas, Pipeline *p, HeldModel *held,
                          int zero_stage, const DataParallelFlags *dp, const ProcessGrid *grid,
                          const OffloadFlags *f);
/* Without --offload zero_stage_resume. With it, what this rank holds of a
 * checkpoint (its host shard, the layout named with the schedule by
 * pipeline_ckpt_layout_init), --resume read into it and the device's
 * weights rounded from it. */
void offload_stage_resume(OffloadStage *s, Run *run, const char *program, const char *schedule,
                          const OffloadFlags *f);
/* With --offload, its line of the run's header: the layout, the parameters
 * in this rank's host shard, the delayed update or the weights on the host. */
void offload_stage_log(const OffloadStage *s, const OffloadFlags *f);
/* After the update: steps.csv's columns d2h_bytes and h2d_bytes, the step's
 * bytes over PCIe (0 without --offload; the checkpoints' included), counted
 * into the run's. */
void offload_stage_columns(OffloadStage *s, double *columns);
/* After the last step and run_layout: pipeline_finish's run.csv, or offload_finish's. */
void offload_stage_finish(OffloadStage *s, Pipeline *p, Run *run, double *bubbles, double bubble_theory,
                          size_t whole_params, const OffloadFlags *f);
/* Everything freed; without --offload, zero_stage_destroy. */
void offload_stage_destroy(OffloadStage *s);

#endif
