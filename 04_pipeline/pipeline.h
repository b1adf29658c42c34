/* pipeline.h: one stage of a pipeline, and the interpreter that runs its
 * schedule (chapter 04; chapter 06 links it too).
 *
 * A rank of a pipeline holds a contiguous run of the model's units (stage 0
 * the embedding too, the last stage the head), one set of saved activations
 * per micro-batch in flight, and the two boundary buffers through which
 * gradients arrive from the next stage and leave for the previous one. Each
 * step, pipeline_run_step executes the stage's list of actions (schedule.h):
 * forward or backward of micro-batch m, or a message to a neighbour. The
 * gradients of every micro-batch accumulate in model.grads; what to do with
 * them (all-reduce over replicas, clip, AdamW) is the caller's.
 *
 * Hooks let another chapter act around each unit (UnitHooks, model.h: a
 * ZeRO-3 gather before a unit, an offload of its gradients after it), and
 * last_backward runs right after the stage's last backward of the step (the
 * moment its gradients are complete), found from the action list. */
#ifndef PIPELINE_H
#define PIPELINE_H

#include "comm.h"
#include "config.h"
#include "data.h"
#include "mixed.h"
#include "model.h"
#include "schedule.h"
#include "tensor_parallel.h"
#include "timeline.h"

/* Where this stage sits; fixed for the run. */
typedef struct {
    CommGroup *pp;     /* this replica's stages, in order */
    int stage, stages; /* this rank's stage (its rank in pp) and their number */
    int first_block, last_block;
    int first_unit, last_unit; /* blocks, with the embedding on stage 0 and the head on the last */
    int B, T;                  /* a micro-batch: B sequences of T tokens */
    int caller_storage;        /* 1: the stage's units get no parameters or gradients here; the
                                  caller gives them storage (model.storage: chapter 06's offload) */
    TensorGroup *tensor;       /* tp > 1: the stage's blocks sliced over this tensor group, chapter 03's
                                  tensor parallelism inside the stage; NULL: the stage holds them whole */
    const Dataset *data;
    const Config *cfg;
} StageLayout;

/* What one step is about; set by pipeline_run_step. */
typedef struct {
    int step;           /* 0-based optimizer step */
    int first_sequence; /* this replica's first sequence of the global batch */
    float dloss;        /* d(mean loss)/d(each token's loss): 1 / tokens of the GLOBAL batch */
    double loss_sum;    /* token losses summed (last stage) */
} StepState;

/* When each action ran, in ms since the step's start (a barrier before it). */
typedef struct {
    Timeline timeline;
    double origin_ms, fwd_ms, bwd_ms, comm_ms, end_ms;
} StageTimes;

typedef struct {
    StageLayout layout;
    StageSchedule schedule;
    int last_backward_action; /* index of the stage's last OP_BACKWARD */
    /* buffers */
    GPT model;        /* this stage's units only */
    MixedModel mixed; /* --precision bf16|fp16: model's units in 16 bits (mixed.h); zeroed in fp32 */
    Scratch scratch;
    Activations *slot; /* one set of saved activations per micro-batch in flight */
    int slots;
    float *grad_in, *grad_out; /* (B,T,C): from stage+1, to stage-1 (NULL where there is none) */
    TensorParallelModel tpm;   /* layout.tensor: the stage's slices (its model and mixed moved to these) */
    UnitHooks tensor_hooks;    /* layout.tensor: the sliced blocks (tensor_parallel.h), in hooks */
    /* extension points (optional) */
    const UnitHooks *hooks;
    void (*last_backward)(void *context);
    void *last_backward_context;
    StepState now;
    StageTimes times;
} Pipeline;

/* Build stage `layout->stage`: its units, optimizer-free (the caller makes
 * its AdamW over model.params; with layout->caller_storage the model is only
 * the table and the stage's range, without storage), activation slots for `schedule`'s micro-batches
 * in flight, and the boundary buffers. Takes ownership of *schedule. The
 * units are stored in layout->cfg->precision (precision_create_range); the
 * activations and their gradients, and so the messages between stages, are
 * fp32 in every precision (mixed.h says which activations are what). */
void pipeline_create(Pipeline *p, const StageLayout *layout, StageSchedule *schedule, uint64_t seed);
void pipeline_destroy(Pipeline *p);

/* Run one step's schedule: every micro-batch's forward and backward on this
 * stage, and the messages. Gradients are zeroed first, then accumulate (in
 * 16 bits under mixed precision). dloss carries fp16's loss scale. */
void pipeline_run_step(Pipeline *p, int step, int first_sequence, float dloss);

/* Mean validation loss over eval_batches global batches: forward only, the
 * micro-batches one after another through the stages. Collective over world
 * (every rank of every replica); replica `first_sequence` as in run_step. */
double pipeline_evaluate(Pipeline *p, CommGroup *world, int first_sequence);

/* A text sample of n bytes, as sample_text (evaluate.h) writes it, from the
 * stages: forward passes of one sequence through them (messages as in
 * training); the last stage's ranks sample each byte from its logits and
 * every stage learns it, for the next context. Printed by world rank 0.
 * Collective over the pipeline's ranks. */
void pipeline_sample(Pipeline *p, int n, uint64_t *rng);

#endif
