/* expert_parallel.h: expert parallelism (chapter 03, --ep N with --experts E).
 *
 * An MoE block holds E expert MLPs (common/model/moe.h). With --ep N the
 * ranks of an expert-parallel group share them out: rank r computes experts
 * r E/N .. (r+1) E/N - 1, so a rank's expert FLOPs are E/N of the model's.
 * The group lies inside the data-parallel replicas, as in DeepSpeed-MoE
 * and Megatron: the world is --dp D replicas, each with its own sequences,
 * and replicas d = g N .. g N + N - 1 form expert-parallel group g (rank
 * d mod N in it). Each rank routes its own tokens on the host exactly as
 * moe.c does (the routing is per sequence, so it is the same in every
 * layout), gathers them into rows grouped by expert, and then, per MoE
 * block and micro-batch:
 *
 *   dispatch  an all-to-all over the group: block j of what a rank sends is
 *             its rows for rank j's experts (they are consecutive, experts
 *             being grouped by rank); with them, a smaller all-to-all of
 *             the row counts per expert
 *   compute   each rank runs its experts on the rows from every rank
 *             (gpt_experts_forward, model.h), one source's rows at a time
 *   combine   a second all-to-all brings each row's output back to the rank
 *             of its token, where model.c weights and sums them (moe_combine)
 *
 * The backward mirrors it: the outputs' gradients go to the experts' ranks,
 * the experts' backward runs there (keeping the rows and hidden layers the
 * forward received), and the inputs' gradients come back.
 *
 * Blocks of fixed size. An all-to-all sends equal blocks (comm.h), so each
 * block has room for the most rows one rank can send another: its B T
 * tokens each choose at most min(K, E/N) of the receiver's experts, and
 * each expert takes at most moe_expert_rows_max rows (its capacity), so
 *     rows_per_block = min(B T min(K, E/N), E/N x moe_expert_rows_max)
 * and only the routed rows are computed (GShard and Switch pad their
 * dispatch to the capacity the same way). Bytes: every all-to-all sends
 * (N-1)/N of its N blocks of rows_per_block x C floats; per MoE block and
 * micro-batch four of them (dispatch, combine, and the two of the
 * backward), each 4 (N-1) rows_per_block C bytes a rank, plus the counts
 * (E/N floats a block).
 *
 * timeline.csv. Each rank records, per MoE block and micro-batch of a
 * training step, its dispatch (ep_dispatch: the counts' and the rows'
 * all-to-alls), its experts' computation (ep_experts) and the combine
 * (ep_combine); the backward's are ep_dispatch_bwd (the outputs' gradients
 * out), ep_experts_bwd and ep_combine_bwd (the inputs' gradients back). A
 * micro-batch's k-th ep_dispatch is its k-th MoE block (the backward's:
 * counted from the last block). An all-to-all ends only when every rank of
 * the group has sent its blocks, so a rank whose experts got fewer rows
 * finishes its ep_experts first and waits in ep_combine for the busiest:
 * the load imbalance, seen in time (steps.csv's ep_rows_max and
 * ep_rows_mean count it in rows).
 *
 * Weights. A rank holds the dense tensors whole, as a data-parallel replica
 * does, and of each MoE block only its own experts: the model it builds is
 * the whole model's but for the expert tensors, which hold the E/N experts'
 * rows (ModelParallel's expert_parts: model_config.h's moe.parts and
 * moe.part; the router still scores all E), initialised as the same elements
 * of the whole model's tensors, so every layout starts from 01's weights.
 * Their gradients, AdamW's moments and, in 16 bits, the fp32 master weights
 * shrink with them: per MoE block (E - E/N)(8C^2 + 5C) elements fewer of
 * each than a replica of chapter 02 holds (memory.csv's params, grads and
 * optimizer). The replicas then sum two things apart (data_parallel.h's
 * ranges held apart): the dense gradients over all D replicas, and each
 * expert's over the D/N ranks holding it, the holders (replicas d mod N +
 * kN: the same place in every group). The gradient norm counts the dense
 * tensors on replica 0 and each expert on its holder in group 0, summed
 * over the world (so that on the layer split each stage's count too); --check-replicas compares the dense weights over all
 * replicas and the experts over their holders; a checkpoint is the whole
 * model's (checkpoint.h), the dense tensors written by replica 0 and each
 * expert's rows by its holder in group 0, so 01 resumes it and --ep resumes
 * 01's.
 *
 * With tensor parallelism (--mp tensor --tp T, and --tp inside chapter
 * 04's stages) every tp rank holds an MoE block's router and experts whole
 * and runs them on the same tokens (tensor_parallel.h), so --ep splits them
 * the same way per tp rank: tp rank t of replica d holds the experts of
 * place d mod N, and its expert-parallel group is tp rank t of the N
 * replicas of its group (grid.h's dp_group is per tp rank). The tp ranks of
 * a replica route the same tokens, so each makes the same all-to-alls in
 * its own group and gets the same outputs back: every tp rank sends what a
 * replica without tp sends (run.csv's ep bytes are T times as many). The
 * norm counts a sliced tensor on every tp rank of replica 0, a replicated
 * one on tp rank 0 of replica 0, and each expert on tp rank 0 of its
 * holder in group 0 (expert_parallel_slices_once); the checkpoint is
 * tensor_parallel.h's, each share of the experts written by tp rank 0 of
 * its holder in group 0.
 *
 * On the layer split (--mp layer, chapter 03) each stage builds its
 * blocks with their experts only, and the replicas of a stage (grid.h's
 * dp_group) split them the same way; one micro-batch is in flight at a
 * time, so one set of kept rows serves.
 *
 * On pipeline stages (chapter 04). A stage's replicas are data-parallel
 * replicas of its units, so --ep N splits the experts of the stage's MoE
 * blocks over N of them, the same way (grid.h's dp_group of the stage:
 * consecutive replicas), with the stage's model built with its experts
 * only (pipeline.h's StageLayout.expert_parts). Several micro-batches are
 * then in flight on a stage (GPipe, 1F1B), so what a forward keeps for its
 * backward (the rows received, their hidden layers, the counts) is kept per
 * activation slot: expert_parallel_split's `slots`, the slot found from the
 * MoeLayerActs the model passes (which is the slot's). The members of a
 * group run the same schedule, so they issue their all-to-alls in the same
 * order. The ep_* rows go into the stage's timeline (ExpertParallel.
 * timeline), beside its forwards and backwards. */
#ifndef EXPERT_PARALLEL_H
#define EXPERT_PARALLEL_H

#include "common/comm/comm.h"                 /* collectives and messages between ranks */
#include "common/run/config.h"                /* Config and the flag tables */
#include "common/run/timeline.h"              /* timeline.csv for the Gantt charts */
#include "common/model/model.h"               /* GPT, its forward and backward, ExpertSplit */
#include "03_model_parallel/model_parallel.h" /* 03: one model held by a group of ranks */
#include "02_data_parallel/data_parallel.h"   /* 02: data parallelism */
#include "common/run/held_model.h"            /* the model this process trains, as the step sees it */

/* ---- the flags (expert_parallel_flags: --ep) ---- */
typedef struct {
    int ep; /* --ep: ranks sharing each MoE block's experts, 1 = none */
} ExpertParallelFlags;

extern const Flag expert_parallel_flags[];

/* The refusals, one line each: --ep without --experts, N not dividing E or
 * --dp, --experts with --cp above 1. They are the same whatever
 * holds a copy of the model (03's layer split or tp ranks, 04's stages):
 * --ep splits the experts over the replicas of each of its ranks. */
void expert_parallel_check_flags(const Config *cfg, const ExpertParallelFlags *f, const ModelParallelFlags *mp);

/* Per MoE block and activation slot: what the forward received, kept for the backward. */
typedef struct {
    float *xin; /* (N x rows_per_block, C) the rows from each rank, block by block */
    float *fch; /* (N x rows_per_block, 4C) their hidden layer, before GELU */
    int *rows;  /* (N, E/N) host: rows from rank s for local expert i, at s E/N + i */
} ExpertParallelLayer;

typedef struct {
    ExpertSplit split; /* model.h's hook, set on the model by expert_parallel_create */
    const GPT *model;  /* the model whose experts these are */
    CommGroup *group;  /* the N ranks sharing the experts */
    CommGroup *holders; /* the dp/N ranks holding the same experts as this one */
    BucketRange *apart; /* per MoE block, its experts' elements in the held buffer */
    int apart_count;
    GradSpan *spans; /* the norm's parts: the dense runs (replicated) and the experts' */
    int num_spans;
    GradSpan *once; /* 03: spans as expert_parallel_spans_once (--mp tensor: _slices_once) gives them */
    int num_once;
    int sliced;       /* 03's --mp tensor: the model is a tp rank's (its checkpoint tensor_parallel.h's) */
    const HeldModelOps *inner; /* the held model's own answers, and their owner (held_model.h) */
    void *inner_owner;
    int size, rank;    /* N, and this rank's place in the group */
    int first, count;  /* the experts held: first .. first + count - 1, count = E/N */
    int pairwise;      /* 1: the course's all-to-all (alltoall.h), else the library's */
    int C;
    size_t block_rows;                /* rows_per_block (above), for the capacity B x T */
    ExpertParallelLayer *layer;       /* slots x L of them, slot s's block l at s L + l; NULL buffers for
                                         dense blocks and blocks the slot does not hold */
    const Activations *slot_acts;     /* the slots' activations (NULL: one slot, every micro-batch's) */
    int slots;
    int *forwards, *backwards;        /* (L) the step's so far, per block: the timeline's micro-batch */
    float *send, *recv;               /* (N x block_rows, C) comm: what leaves and what comes back */
    float *y;                         /* (N x block_rows, C) the experts' outputs (or dy received) */
    float *dxin;                      /* (N x block_rows, C) the received rows' input gradients */
    float *gelu, *dgelu, *dfch;       /* (N x block_rows, 4C) scratch */
    float *counts_send, *counts_recv; /* (E) device: row counts per expert, as floats */
    float *counts_h;                  /* (E) host */
    double *comm_ms;                  /* where the all-to-alls' time is added */
    double rows_computed; /* rows this rank's experts computed in backwards since the last report */
    Timeline own_timeline; /* the ep_* rows of timeline.csv (above), training steps only */
    Timeline *timeline;    /* where they go: own_timeline, or the stage's (chapter 04) */
    int recording, step;  /* from expert_parallel_begin_step to expert_parallel_load */
    double origin_ms;     /* the step's start (every rank starts a step together) */
} ExpertParallel;

/* Rows per all-to-all block for a micro-batch of B sequences of T tokens. */
size_t expert_parallel_block_rows(const MoeConfig *moe, int ranks, int B, int T);
/* Split the experts over groups of f->ep = N consecutive replicas (par->dp;
 * nothing when N is 1; collective over them); held is this rank's model
 * (par's), built with its experts only (ModelParallel's expert_parts):
 * buffers for micro-batches of up to B sequences of --seq tokens, the
 * model's experts set to the hook, the experts' gradients summed over their
 * holders instead of all the replicas (data_parallel_hold_apart on
 * `replicas`), held's gradient norm and checkpoint answered here (Weights, above),
 * the all-to-alls' time added to par->comm_ms; mp->alltoall says which
 * all-to-all. */
void expert_parallel_create(ExpertParallel *x, HeldModel *held, ModelParallel *par, DataParallel *replicas,
                            const ExpertParallelFlags *f, const ModelParallelFlags *mp, int B);
/* What expert_parallel_create does but the held model's answers, for a
 * model m holding its experts only (moe.parts = f->ep) of some units (a
 * pipeline stage's, several runs with m->unit_at), whose replicas are
 * dp_group: buffers for micro-batches of B sequences, kept per slot (one
 * per Activations of slot_acts[0 .. slots), or one with slot_acts NULL),
 * the experts' gradients summed over their holders in `replicas`, the
 * all-to-alls' time added to *comm_ms; alltoall is --alltoall. Nothing when
 * N is 1. */
void expert_parallel_split(ExpertParallel *x, GPT *m, CommGroup *dp_group, DataParallel *replicas,
                           const ExpertParallelFlags *f, const char *alltoall, int B,
                           const Activations *slot_acts, int slots, double *comm_ms);
/* After expert_parallel_split: held's gradient norm (the spans of its first
 * `own` elements, expert_parallel_spans_once, for this rank's `replica`;
 * with tpm, a tp rank's model, expert_parallel_slices_once of its once
 * spans) and its checkpoint (expert_parallel_checkpoint_layout; with tpm,
 * held's own, tensor_parallel.h's) answered by x, its other answers by
 * held's own; nothing when x split nothing. */
void expert_parallel_answer_held(ExpertParallel *x, HeldModel *held, size_t own, int replica,
                                 const TensorParallelModel *tpm);
/* The norm's parts of this rank for a sum over the world: x's spans of the
 * first `own` held elements (a tied copy after them left out), the dense
 * ones on replica 0 only, the experts' on their holder among replicas
 * 0 .. N-1 only, so that every stage's dense tensors and every expert count
 * once; num_spans of them, freed by the caller. */
GradSpan *expert_parallel_spans_once(const ExpertParallel *x, size_t own, int replica, int *num_spans);
/* The same under tensor parallelism, from `once`, the spans a tp rank counts
 * of its copy of the model (tensor_parallel.h's once_spans: its slices, and
 * the replicated tensors on tp rank 0 only): the dense ones on replica 0,
 * the experts' (held whole by every tp rank) on their holder among replicas
 * 0 .. N-1; num_spans of them, freed by the caller. */
GradSpan *expert_parallel_slices_once(const ExpertParallel *x, const GradSpan *once, int num_once,
                                      int replica, int *num_spans);
/* The whole model's checkpoint (checkpoint.h) from m, x's model (held as
 * expert_parallel_split says): the dense tensors it holds written by
 * `replica` 0 of its replicas, each of its experts' rows by its holder in
 * group 0 (replica < N), a copy outside m's units (the tied wte) read only. */
void expert_parallel_checkpoint_layout(const ExpertParallel *x, const AdamW *opt, int replica, CkptLayout *l);
/* With --ep, timeline.csv into directory out first (every rank of world calls it). */
void expert_parallel_destroy(ExpertParallel *x, GPT *m, CommGroup *world, const char *out);
/* Step `step` (0-based) starts now: the origin of its timeline rows. */
void expert_parallel_begin_step(ExpertParallel *x, int step);
/* The load: the rows each rank's experts computed since the last call (every
 * MoE block and micro-batch of the steps' backwards: evaluation's forwards are
 * not counted), their most over the ranks of world in load[0] and their mean
 * in load[1] (max / mean: the imbalance; 0 without --ep). Collective over
 * world. It ends the step's timeline: evaluation and sampling are not in it. */
void expert_parallel_load(ExpertParallel *x, CommGroup *world, double load[2]);

#endif
