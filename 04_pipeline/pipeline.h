/* pipeline.h: one stage of a pipeline, and the interpreter that runs its
 * schedule (chapter 04; the later chapters link it).
 *
 * A rank of a pipeline holds a contiguous run of the model's units (stage 0
 * the embedding too, the last stage the head), one set of saved activations
 * per micro-batch in flight, and the two boundary buffers through which
 * gradients arrive from the next stage and leave for the previous one. Each
 * step the caller walks the stage's list of actions (schedule.h): forward or
 * backward of micro-batch m, or a message to a neighbour. The stage is a
 * held model (held_model.h, pipeline_held): the caller's loop runs each
 * forward and backward with held_forward and held_backward, as chapter 03's
 * loop does, and pipeline_action_begin has set which micro-batch's slot they
 * work on. The gradients of every micro-batch accumulate in model.grads;
 * what to do with them (all-reduce over replicas, clip, AdamW) is the
 * caller's.
 *
 * Past 1F1B (schedule.h). A stage may hold V chunks of layers
 * (pipeline_layout_chunks: interleaved), each with its own activation
 * slots, their units kept one after another in the one parameter buffer. A
 * zero-bubble schedule splits the backward into B and W (model.h's
 * gpt_backward_input_range and _weight_range; each slot then also keeps the
 * output gradients W reads), and both post their sends (comm_post_send):
 * each slot keeps its own gradient buffer for the previous stage, and a
 * slot is reused only once what it posted has left.
 *
 * Extension points let the caller act around each unit (UnitHooks, model.h:
 * fetch a unit's parameters before it runs, move its gradients after it),
 * last_backward runs right after the stage's last backward of the step (the
 * moment its gradients are complete), found from the action list, and the
 * unit_final hook given to held_backward as each unit's gradients become
 * final (chunk by chunk: after the chunk's last backward of the step). */
#ifndef PIPELINE_H
#define PIPELINE_H

#include "common/comm/comm.h" /* collectives and messages between ranks */
#include "common/run/config.h" /* Config and the flag tables */
#include "03_model_parallel/context_parallel.h" /* 03: ring attention (--cp) */
#include "02_data_parallel/data_parallel.h" /* 02: data parallelism */
#include "03_model_parallel/expert_parallel.h" /* 03: experts split over ranks (--ep) */
#include "common/run/held_model.h" /* the model this process trains, as the step sees it */
#include "04_pipeline/pipeline_flags.h" /* 04: the pipeline's flags and checks */
#include "common/model/data.h" /* the training data and its batches */
#include "common/comm/grid.h" /* the process grid: dp x pp x cp x tp */
#include "common/run/harness.h" /* the run around the training loop */
#include "common/model/mixed.h" /* mixed precision: 16-bit weights, loss scaling */
#include "common/model/model.h" /* GPT, its forward and backward */
#include "common/model/optimizer_step.h" /* the optimizer step: norm, clip, skip, AdamW */
#include "04_pipeline/schedule.h" /* 04: schedules as lists of actions */
#include "03_model_parallel/tensor_parallel.h" /* 03: tensor parallelism */
#include "common/run/timeline.h" /* timeline.csv for the Gantt charts */

/* Chunks of layers one stage may hold (interleaved schedules, layer_split.h). */
enum { MAX_STAGE_CHUNKS = 16 };

/* Where this stage sits; fixed for the run. */
typedef struct {
    CommGroup *pp;     /* this replica's stages, in order */
    int stage, stages; /* this rank's stage (its rank in pp) and their number */
    int first_block, last_block;
    int first_unit, last_unit; /* blocks, with the embedding on stage 0 and the head on the last */
    /* With V > 1 chunks per stage (pipeline_layout_chunks; 0 or 1: the one range above): chunk c
     * is piece c x stages + stage, and these are its blocks and units */
    int chunks;
    int chunk_first_block[MAX_STAGE_CHUNKS], chunk_last_block[MAX_STAGE_CHUNKS];
    int chunk_first_unit[MAX_STAGE_CHUNKS], chunk_last_unit[MAX_STAGE_CHUNKS];
    int B, T;            /* a micro-batch: B sequences of T tokens */
    int caller_storage;  /* who owns the units' storage. 0: the stage allocates parameters and
                            gradients; 1: it gets none here, and its caller gives the units
                            storage of its own (model.h's storage hooks, model.storage) */
    const CheckpointStore *checkpoints; /* with --recompute, one stage, tp 1: NULL, the slots keep
                            their blocks' outputs; else the caller keeps them (model.h's
                            CheckpointStore), slot i as the store's set i */
    TensorGroup *tensor; /* tp > 1: the stage's blocks sliced over this tensor group, chapter 03's
                            tensor parallelism inside the stage; NULL: the stage holds them whole */
    CommGroup *cp;       /* cp > 1: each sequence split over these ranks, attention a ring, chapter
                            03's context parallelism inside the stage (B, T: the whole sequences; the
                            stage holds T/cp positions of each); NULL: whole sequences */
    const Dataset *data;
    const Config *cfg;
    /* with cp: --cp-order and --cp-send (context_parallel.h) */
    const char *cp_order, *cp_send;
    const char *cp_mode, *alltoall; /* --cp-mode ring|ulysses, --alltoall library|pairwise (03) */
    int sp; /* with tensor: --sp, sequence parallelism in the stage's blocks (tensor_parallel.h) */
    int expert_parts, expert_part; /* --ep N: the stage's model holds part expert_part of N of each MoE
                                      block's experts (model_config.h's moe.parts; 03's expert_parallel.h) */
} StageLayout;

/* What one step is about; set by pipeline_begin_step. */
typedef struct {
    int step;        /* 0-based optimizer step */
    int action;      /* the action pipeline_action_begin began */
    float dloss;     /* d(mean loss)/d(each token's loss), as held_backward was given it */
    double loss_sum; /* token losses summed (last stage; evaluation's) */
    double start_ms; /* when the action began */
} StepState;

/* Who keeps the stage's storage (pipeline_build): StageLayout's caller_storage and checkpoints. */
typedef struct {
    int caller_storage;
    const CheckpointStore *checkpoints;
} StageStorage;

/* When each action ran, in ms since the step's start (a barrier before it). */
typedef struct {
    Timeline timeline;
    double origin_ms, fwd_ms, bwd_ms, comm_ms, end_ms;
} StageTimes;

/* What a zero-bubble schedule (zb-h1: B and W, posted sends) adds to a
 * slot of activations: the output gradients B keeps for W, and the
 * gradient for the previous stage, which stays put until its posted send
 * has left; NULL where the schedule has no W or posts nothing. */
typedef struct {
    KeptGrads kept;        /* model.h: what W reads besides the activations */
    float *grad_out;       /* (B,T,C) this micro-batch's input gradient, posted to stage-1 */
    CommPosted *act_sent;  /* the posted send of the slot's output, until waited for */
    CommPosted *grad_sent; /* the posted send of grad_out */
} SlotExtras;

typedef struct {
    StageLayout layout;
    StageSchedule schedule;
    int last_backward_action; /* index of the stage's last OP_BACKWARD (or W: its gradients are then complete)
                               */
    int split_backward;       /* the schedule runs B and W (OP_BACKWARD_INPUT, _WEIGHT) */
    SlotExtras *extras;       /* one per slot, with split_backward or posted sends; else NULL */
    /* buffers */
    GPT model;        /* this stage's units only */
    MixedModel mixed; /* --precision bf16|fp16: model's units in 16 bits (mixed.h); zeroed in fp32 */
    Scratch scratch;
    Activations *slot; /* one set of saved activations per micro-batch in flight, chunk by chunk */
    size_t *unit_at;   /* several chunks or the tied copy, no tp: model.unit_at, where units are held */
    /* --tie-embeddings on several stages (Megatron's embedding group): the
     * last stage also holds the embedding unit, after its own units, for its
     * head to read wte; the first and last stage sum the unit's gradient at
     * the end of every step (pipeline_end_step) and both apply the same
     * update. Its elements are left out of this stage's part of the gradient
     * norm (the first stage counts them) and out of what it writes to a
     * checkpoint (it reads them). tied_copy_count 0: no copy here. With
     * caller_storage there is none: the caller keeps what the head reads
     * (chapter 05's tied_ends.h: the first stage's shards own wte). */
    size_t tied_copy_at, tied_copy_count;
    float *tied_grad_in; /* (tied_copy_count) the other end's gradient, on the first and last stage */
    /* (tied_copy_count) 16 bits: the other end's gradient as it arrives */
    uint16_t *tied_grad_in16;
    GradSpan own_span;   /* the norm's part on the stage with the copy: its own units */
    int slots;         /* all of them */
    int chunk_slots[MAX_STAGE_CHUNKS]; /* chunk c's: the most micro-batches it holds at once */
    int chunk_slot0[MAX_STAGE_CHUNKS]; /* the index of chunk c's first slot */
    float *grad_in, *grad_out;         /* (B,T,C): from stage+1, to stage-1 (NULL where there is none) */
    TensorParallelModel tpm; /* layout.tensor: the stage's slices (its model and mixed moved to these) */
    UnitHooks tensor_hooks;  /* layout.tensor: the sliced blocks (tensor_parallel.h), in hooks */
    ContextParallel context; /* layout.cp: the ring (its size 0 without; layout.T is then T/cp) */
    /* extension points (optional) */
    const UnitHooks *hooks;
    void (*last_backward)(void *context);
    void *last_backward_context;
    /* unit_final(u, context), the hook held_backward was last given: unit u's gradients are final
     * for the step; called for each unit of a chunk, the highest first, right after the chunk's last
     * backward (zb-h1: its last W), and for a tied embedding after the two ends summed it (chapter
     * 02's overlapped buckets) */
    UnitHook unit_final;
    void *unit_final_context;
    int chunk_last_backward[MAX_STAGE_CHUNKS]; /* the action after which chunk c's gradients are final */
    StepState now;
    StageTimes times;
    MoeStats moe; /* --experts: what the step's forwards routed, its slots' summed (held.moe) */
    /* pipeline_build's: where the stage sits in the grid, and what its reports name */
    const ProcessGrid *grid;
    TensorGroup *tensor_group; /* tp > 1: layout.tensor, this stage's tp ranks */
    CommGroup *model_group;   /* one replica's stages and slices (of one cp rank's positions) */
    char schedule_name[16];
    int blocks[MAX_LAYERS]; /* blocks per piece: the stages' (x V chunks) */
} Pipeline;

/* Give layout->stage V chunks: blocks[] holds one entry per piece (stages x
 * V of them, layer_split.h), and chunk c is piece c x stages + stage. The
 * stage's units are then stored one chunk after another in one buffer
 * (model.params, param_count their sum), so that the optimizer, the
 * all-reduce and the norm treat them as one range. */
void pipeline_layout_chunks(StageLayout *layout, const int *blocks, int chunks, int layers);

/* Build stage `layout->stage`: its units, optimizer-free (the caller makes
 * its AdamW over model.params; with layout->caller_storage the model is only
 * the table and the stage's range, without storage), activation slots for `schedule`'s micro-batches
 * in flight, and the boundary buffers. Takes ownership of *schedule. The
 * units are stored in layout->cfg->precision (precision_create_range); the
 * activations and their gradients, and so the messages between stages, are
 * fp32 in every precision (mixed.h says which activations are what). */
void pipeline_create(Pipeline *p, const StageLayout *layout, StageSchedule *schedule, uint64_t seed);
void pipeline_destroy(Pipeline *p);

/* The grid of --dp replicas of --pp stages of --cp x --tp ranks (grid.h). */
GridShape pipeline_shape(const PipelineFlags *pipe, const ModelParallelFlags *mp);
/* --print-schedule: world rank 0 prints every stage's list of actions for
 * micro micro-batches; then the grid is freed and the job ends. Returns 0,
 * main's exit status. */
int pipeline_print_schedules(const PipelineFlags *pipe, int micro, ProcessGrid *grid);
/* This rank's stage in grid (pipeline_shape's): the layer split (--split,
 * else balanced; --virtual chunks), its schedule (--schedule), chapter 03's
 * tensor, sequence and context parallelism inside it (mp's flags), of each
 * MoE block the experts of part grid->d mod expert_parts (--ep), for
 * micro-batches of B sequences; storage NULL: the stage keeps its own.
 * layout says which, for the header. */
void pipeline_build(Pipeline *p, const Config *cfg, const ModelParallelFlags *mp, const PipelineFlags *pipe,
                    int expert_parts, const ProcessGrid *grid, const Dataset *data, int B,
                    const StageStorage *storage, char *layout, size_t layout_size);
/* The step's view of the stage (held_model.h): held_forward and
 * held_backward run the action pipeline_action_begin began; the gradient
 * norm's share (pipeline_grad_shards), the checkpoint (the stage's units or
 * slices, rank d x cp + c of the weight group writing its share), the
 * validation loss (pipeline_evaluate) and the sample (pipeline_sample). */
void pipeline_held(Pipeline *p, HeldModel *h);
/* --ep N inside the stage: chapter 03's expert parallelism over groups of N
 * consecutive replicas of the stage (the grid's dp group), what a forward
 * keeps for its backward kept per activation slot, the ep_* rows in the
 * stage's timeline, their gradients summed over their holders in replicas;
 * the norm counts each stage's dense tensors on replica 0 and each expert
 * on its holder, and the checkpoint is the whole model's (held's answers:
 * expert_parallel_answer_held). Nothing when N is 1. */
void pipeline_split_experts(Pipeline *p, ExpertParallel *x, HeldModel *held, DataParallel *replicas,
                            const ExpertParallelFlags *f, const ModelParallelFlags *mp);

/* One step's schedule, a loop the chapter writes out:
 *     pipeline_begin_step(p, step);
 *     for (int i = 0; i < p->schedule.count; i++) {
 *         const Action *a = pipeline_action_begin(p, i, &held);
 *         ... a forward: held_forward; a backward (schedule_op_backward): held_backward ...
 *         pipeline_action_end(p, i);
 *     }
 *     pipeline_end_step(p);
 * begin starts the step's clock; action_begin runs a message, or for a
 * forward or backward points held at its micro-batch's slot: held.tokens
 * and held.targets are where its tokens and targets go (with --cp the whole
 * sequences, of which the forward keeps this rank's positions), both NULL
 * where the action reads none (a middle stage, a backward); a backward
 * given a unit_final hook calls it for each unit of a chunk after the
 * chunk's last backward of the step. action_end times the action into the
 * timeline and runs last_backward after the stage's last backward. end
 * waits for every posted send, sums a tied embedding's two copies (then
 * unit_final for the embedding) and sums the slots' routing into p->moe. */
void pipeline_begin_step(Pipeline *p, int step);
const Action *pipeline_action_begin(Pipeline *p, int i, HeldModel *held);
void pipeline_action_end(Pipeline *p, int i);
void pipeline_end_step(Pipeline *p);

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

/* "stage s: blocks a..b + embedding", one line per stage (with V chunks per
 * stage, one per piece: "stage s chunk c: ..."). */
void pipeline_log_stages(const int *blocks, int P, int V);

/* What chapters 04 and 05 do around the pipeline's step, written once. */
/* The bubble of this step: the idle time of the stages while the pipeline
 * ran, measured on each replica's stage 0, averaged over the replicas. */
double pipeline_measure_bubble(const StageTimes *times, const ProcessGrid *grid, CommGroup *world);
/* The run's pipeline lines (the layout pp x cp x tp x dp, the schedule and
 * its bubble formula) and every stage's blocks; returns the formula's
 * bubble. */
double pipeline_log_layout(const Pipeline *p);
/* An empty checkpoint layout (checkpoint.h: ckpt_layout_init) whose writer
 * text names the layout as the grid lays out the ranks: "<program>: pp P x
 * tp T x dp D, <schedule>" (cp C after pp where the grid has it), then
 * `more` where the program adds to the layout (its sharding, say: "zero
 * 2"), or NULL. The programs with stages name their layouts here only, so
 * that common/ckpt and a safetensors export repeat every axis. */
void pipeline_ckpt_layout_init(CkptLayout *l, const char *program, const ProcessGrid *grid,
                               const char *schedule, const char *more);
/* What this rank holds of the gradients, for the global norm: its stage's
 * units (or with tensor parallelism their slices, counted once over
 * model_group), summed over the stages and agreed over the world. */
GradShards pipeline_grad_shards(Pipeline *p, CommGroup *model_group, CommGroup *world);
/* After the last step and run_layout (bubbles[] of every step, reordered
 * here for the median): timeline.csv and trace.json, then run.csv with the
 * schedule, the median measured bubble and the formula's, the bytes every
 * rank together sent per step on each axis of the grid (bytes_dp_per_step,
 * _pp_, _cp_, _tp_: run_axis_bytes_per_step), and memory.csv (run_finish,
 * harness.h), for a model of whole_params parameters. */
void pipeline_finish(Pipeline *p, Run *run, double *bubbles, double bubble_theory, size_t whole_params);

#endif
