/* model_parallel.h: one copy of the model held by a group of ranks (chapter 03).
 *
 * A model-parallel group of ranks holds one copy of the model between them,
 * in one of two ways (--mp):
 *
 *   layer   the layer split: stage s holds a contiguous run of blocks
 *           (stage 0 also the embedding, the last stage the head). The
 *           activations travel forward from stage to stage with
 *           point-to-point messages, their gradients travel back, one batch
 *           at a time: while one stage works, the others wait.
 *   tensor  tensor parallelism (Megatron-LM): every block's matrices are
 *           sliced over the tp ranks (tensor_parallel.h); all ranks work on
 *           every layer, and two all-reduces per block, forward and
 *           backward, put the slices' results together.
 *
 * This file holds what a rank of such a group does: build its part, run a
 * micro-batch forward and backward through the group, say what it holds of
 * the gradient (for the norm) and of a checkpoint, evaluate and sample with
 * the split model, and time its communication (the harness's busy.csv). The training
 * loop around it is 03_model_parallel/train.c's. */
#ifndef MODEL_PARALLEL_H
#define MODEL_PARALLEL_H

#include "common/run/checkpoint.h" /* save and resume */
#include "03_model_parallel/context_parallel.h" /* 03: ring attention (--cp) */
#include "common/comm/comm.h" /* collectives and messages between ranks */
#include "common/run/config.h" /* Config and the flag tables */
#include "common/run/run_dir.h" /* the --out directory and its files */
#include "common/model/data.h" /* the training data and its batches */
#include "common/run/harness.h" /* the run around the training loop */
#include "common/comm/grid.h" /* the process grid: dp x pp x cp x tp */
#include "common/run/held_model.h" /* the model this process trains, as the step sees it */
#include "common/model/mixed.h" /* mixed precision: 16-bit weights, loss scaling */
#include "common/model/model.h" /* GPT, its forward and backward */
#include "common/model/optim.h" /* AdamW and the learning-rate schedule */
#include "common/model/optimizer_step.h" /* the optimizer step: norm, clip, skip, AdamW */
#include "common/model/param_table.h" /* the parameter table and its units */
#include "03_model_parallel/tensor_parallel.h" /* 03: tensor parallelism */

/* ---- the flags (a later chapter's table takes these rows: FLAG_ROWS, config.h) ---- */
typedef struct {
    char mp[8];        /* layer, tensor */
    char split[1024];  /* --split: blocks per stage, "" = balance the parameters */
    int tp;            /* --tp: tensor-parallel ranks, 0 = world / dp */
    int dp;            /* --dp: data-parallel replicas of the model-parallel group */
    int sp;            /* --sp: sequence parallelism inside --mp tensor (sequence_parallel.h) */
    int cp;            /* --cp: ranks sharing each sequence (context_parallel.h) */
    char cp_order[12]; /* --cp-order zigzag|contiguous: which chunks a cp rank holds */
    char cp_send[12];  /* --cp-send auto|posted|blocking: how the ring's blocks travel */
    char cp_mode[12];  /* --cp-mode ring|ulysses: attention round a ring, or on a head split (ulysses.h) */
    char alltoall[12]; /* --alltoall library|pairwise: Ulysses' all-to-all (comm.h's, or alltoall.h's) */
    int ranks;         /* the world size, for the checks */
} ModelParallelFlags;

extern const Flag model_parallel_flags[];

/* With --mp tensor, --tp left to its default is the world size / --dp: the
 * record holds that number, so that layouts written two ways agree. */
void model_parallel_effective_flags(const Config *cfg, ModelParallelFlags *f);
/* The layout: world = dp x cp x model-parallel ranks, and a split that fits
 * the model; errors end the program naming the rule. */
void model_parallel_check_flags(const Config *cfg, const ModelParallelFlags *f);

/* ---- everything this rank holds and does, in either mode ---- */
typedef struct {
    int tensor;         /* --mp tensor (else the layer split) */
    int expert_parts;   /* --ep N: each MoE block's experts split over N replicas, this rank holding
                           those of its place, replica mod N (expert_parallel.h); 0 or 1: all */
    CommGroup *mp, *dp; /* the model-parallel group this rank belongs to; the data-parallel one */
    double comm_ms;     /* this step's time in communication (this rank, waits included) */
    /* layer split */
    int stage, stages; /* this rank's stage (= its rank in mp) and their number */
    int first_block, last_block;
    GPT model;        /* this stage's parameters only */
    MixedModel mixed; /* bf16, fp16: model in 16 bits (mixed.h) */
    Activations acts; /* this stage's blocks (encoded: where the stage's input arrives) */
    Scratch scratch;
    /* context parallel (--cp N > 1): acts, scratch hold T/N tokens of each sequence */
    ContextParallel cp;
    /* tensor parallel */
    TensorGroup tp;
    TensorParallelModel tpm;
    /* what this rank holds: parameters and gradients, param_count of each */
    GPT *held;
    MixedModel *held_mixed; /* its 16-bit storage (mixed.h); params NULL in fp32 */
    /* --tie-embeddings on the layer split: the head, on the last stage, reads
     * wte, which the first stage holds. The first stage sends wte to the last
     * before the first forward after an update (tied_fresh 0: the step's first,
     * evaluation's, sampling's), and after each backward the last stage sends
     * the head's gradient of wte back, which the first adds into wte's before
     * its own backward (the head's part first, as in chapter 01; in 16 bits
     * into the 16-bit gradient, the 16-bit wte widened to be sent). On the
     * last stage the head is bound to them; tied_wte is the first stage's
     * buffer for what it sends and receives. (wte's elements, fp32) each;
     * NULL elsewhere. */
    float *tied_wte, *tied_dwte;
    size_t tied_numel;
    int tied_fresh;
    /* optional: unit_final(u, context) once unit u's gradients are final in a backward, the
     * highest unit first (a stage's units as its backward passes them; tensor parallel: all,
     * after it), where chapter 02's overlapped buckets are launched */
    UnitHook unit_final;
    void *unit_final_context;
} ModelParallel;

/* The process grid of --dp replicas of --cp x a model-parallel group of
 * world / (dp x cp) ranks: --mp layer's stages (pp) or tensor's slices (tp). */
GridShape model_parallel_shape(const ModelParallelFlags *f);
/* This rank's part in grid (model_parallel_shape's): --mp's way over the
 * grid's pp or tp group, its replicas the dp group (expert_parts: --ep),
 * built (model_parallel_build) and with --cp its sequences split over the
 * cp group (model_parallel_split_sequences). */
void model_parallel_create(ModelParallel *p, const Config *cfg, const ModelParallelFlags *f, int expert_parts,
                           const ParamTable *table, const ProcessGrid *grid, int B, char *layout,
                           size_t layout_size);

/* This rank's part of the model (mp_index: its place in the model-parallel
 * group p->mp of mp_size ranks): its tensor slices, or its stage's blocks
 * (--split, else balanced by parameters); layout says which, for the header
 * and the checkpoint. */
void model_parallel_build(ModelParallel *p, const Config *cfg, const ModelParallelFlags *f,
                          const ParamTable *table, int mp_index, int mp_size, int B, char *layout,
                          size_t layout_size);
/* With --cp N > 1: each sequence split over the ranks of cp_group
 * (context_parallel.h), and layout saying so; call after model_parallel_build. */
void model_parallel_split_sequences(ModelParallel *p, const Config *cfg, const ModelParallelFlags *f,
                                    CommGroup *cp_group, int B, char *layout, size_t layout_size);
/* With --cp, the ring's timeline.csv (all ranks call it). */
void model_parallel_destroy(ModelParallel *p, const Config *cfg);
/* A training step begins: comm_ms and the routing's counts (--experts) from 0, the ring's
 * timeline (--cp) from now, as step `step`. */
void model_parallel_begin_step(ModelParallel *p, int step);

/* Where a micro-batch's tokens and targets go on this rank. */
int *model_parallel_tokens(ModelParallel *p);
int *model_parallel_targets(ModelParallel *p);

/* Forward of one micro-batch; returns this rank's share of the token-loss
 * sum: the whole sum on the one rank of the model-parallel group that
 * reports it, 0 on the others, so that summing over the world gives the
 * global batch's loss sum. */
double model_parallel_forward(ModelParallel *p, int with_loss, int B, int T);
void model_parallel_backward(ModelParallel *p, float dloss, int B, int T);

/* What this rank holds of the whole model's gradient (optimizer_step.h):
 * its stage's units, the parts added over the model-parallel group, or its
 * tensor slices and the replicated tensors, counted once. Every rank agrees
 * on the norm, and on an fp16 overflow anywhere, so that all of them skip
 * such a step. */
GradShards model_parallel_grad_shards(ModelParallel *p, CommGroup *world);

/* What this rank holds of a checkpoint: its slices, or its stage's units,
 * written by replica dp_index's share (checkpoint.h). */
void model_parallel_checkpoint_layout(ModelParallel *p, AdamW *opt, int dp_index, int dp, CkptLayout *ckpt);

/* Mean validation loss over cfg->eval_batches global batches, each replica
 * taking its share of every batch (forward only). */
double model_parallel_evaluate(ModelParallel *p, const Dataset *data, const Config *cfg, int dp_index, int B);

/* A text sample, as sample_text (evaluate.h) writes it, from the split model. */
void model_parallel_sample(ModelParallel *p, const Dataset *data, const Config *cfg, uint64_t *rng);

/* The step's view of this rank's part (held_model.h): the functions above,
 * so that chapter 02's loop runs the split model unchanged. Call after
 * model_parallel_split_sequences. */
void model_parallel_held(ModelParallel *p, HeldModel *h);

#endif
