/* tensor_parallel.h: Megatron-style tensor parallelism of the GPT's blocks.
 *
 * A group of tp ranks holds ONE copy of the model between them. Inside each
 * block the four matrices are sliced so that every rank computes a share of
 * every layer, and two all-reduces per block (one per direction) make the
 * shares whole again:
 *
 *   attention half: qkv   column-parallel: rank r holds the q, k and v rows of
 *                         heads [r*NH/tp, (r+1)*NH/tp): (3C/tp, C), bias (3C/tp)
 *                   attention on those heads only: no communication
 *                   attproj row-parallel: columns [r*C/tp, (r+1)*C/tp): (C, C/tp)
 *                         -> partial sums, ALL-REDUCE (Megatron's g), + bias
 *   MLP half:       fc     column-parallel: hidden units [r*4C/tp, ...): (4C/tp, C)
 *                   GELU   element-wise: no communication
 *                   fcproj row-parallel: (C, 4C/tp) -> ALL-REDUCE (g), + bias
 *
 * In the backward pass the conjugate operator f all-reduces the gradient of
 * each column-parallel layer's input (every rank holds only its share of it)
 * before the replicated layernorm's backward: again two per block.
 *
 * The vocabulary is split too (Megatron's vocab-parallel embedding and
 * cross-entropy): rank r holds rows [r*Vp/tp, (r+1)*Vp/tp) of wte and of the
 * LM head (Vp = vocab_padded(V); tp must divide it). The embedding looks up
 * the tokens whose rows it holds, 0 for the others, and an ALL-REDUCE sums
 * the ranks' outputs; the head makes this rank's Vp/tp columns of the
 * logits, and the loss needs only per-token numbers from the others: each
 * row's maximum (all-gathered: tp x B x T floats), the sum of exponentials
 * and the target's logit (ALL-REDUCE: 2 x B x T floats). The B x T x Vp
 * logits are never gathered: each rank holds 1/tp of them (model.h,
 * VocabSplit). Backward: the head's input gradient is a partial sum over
 * the slices (ALL-REDUCE), the embedding's rows need nothing.
 *
 * Layernorms, wpe, the final layernorm and the biases of the row-parallel
 * layers are replicated: every rank holds them whole, computes the same
 * values from the same (all-reduced) inputs, and so gets the same gradients
 * for them. So is an MoE block's MLP half (--experts, moe.h): its router and
 * experts are held whole and run on the same ln2 rows on every rank, with
 * no all-reduce (gpt_moe_forward, gpt_moe_backward), the routing reported
 * by tp rank 0 only; their gradients count once in the norm and tp rank 0
 * writes them, as the layernorms'. With --ep N the local table holds a
 * share of the experts (model_config.h's moe.parts), the same on every tp
 * rank of a replica, and the checkpoint writes each share from the first
 * N replicas (expert_parallel.h). With --sp the experts run on the gathered
 * tokens and each rank keeps its rows (sequence_parallel.h).
 *
 * The local parameter table has the names and order of the whole model's
 * (model.h) with local shapes. Element e of a local tensor is element
 * tensor_parallel_global_index(...) of the whole tensor, and starts from that
 * element's initial value: the slices of the tp ranks together are exactly
 * chapter 01's weights. */
#ifndef TENSOR_PARALLEL_H
#define TENSOR_PARALLEL_H

#include "common/run/checkpoint.h" /* save and resume */
#include "common/comm/comm.h" /* collectives and messages between ranks */
#include "common/model/mixed.h" /* mixed precision: 16-bit weights, loss scaling */
#include "common/model/model.h" /* GPT, its forward and backward */
#include "common/model/optimizer_step.h" /* the optimizer step: norm, clip, skip, AdamW */

#include <stddef.h>
#include <stdint.h>

/* The ranks that share one copy of the model. */
typedef struct {
    CommGroup *group;
    int rank, size;     /* this rank's index in the group, and tp */
    double comm_ms;     /* time spent in the group's all-reduces, accumulated (the caller resets it) */
    const GPT *matmuls; /* whose matmul precision the parallel layers follow (gpt_linear_forward:
                           16-bit inputs under mixed precision); NULL: fp32 */
    int caller_storage; /* who owns the slices' storage. 0: tp_model_create_range allocates and
                           initialises it; 1: it builds the local table and range only, and the
                           caller binds storage of its own (model.h's storage hooks) */
} TensorGroup;

/* How a tensor of the table is divided over the group. */
typedef enum {
    SLICE_NONE,     /* replicated */
    SLICE_QKV_ROWS, /* qkvw, qkvb: this rank's heads' rows in each of the q, k and v thirds */
    SLICE_ROWS,     /* fcw, fcb, wte, lm_head: a contiguous block of rows (output units, tokens) */
    SLICE_COLS,     /* attprojw, fcprojw: a contiguous block of columns (input units) */
} SliceKind;

typedef struct {
    TensorGroup *tp;
    int C_local, NH_local, H_local; /* C/tp, NH/tp, 4C/tp */
    GPT model;                      /* the LOCAL table, params and grads (views as in model.h) */
    MixedModel mixed;               /* --precision bf16|fp16: model's slices in 16 bits (mixed.h);
                                       zeroed in fp32 */
    GPT *m;                         /* where the model is: &model, or where tp_model_move put it */
    MixedModel *mx;                 /* and its 16-bit storage: &mixed, or moved with it */
    SliceKind *slice;               /* per tensor of the table */
    VocabSplit vocab;               /* wte and the head by vocabulary rows (model.h), with tp > 1 */
    int first_unit, last_unit;      /* the units held: every unit, or a pipeline stage's (chapter 04);
                                       with chunks, the span from the first held to the last */
    size_t *held_at;                /* per unit u (at u + 1): where its elements start in the held
                                       buffer, SIZE_MAX where it is not held */
    GradSpan *norm_spans;           /* per held tensor: its elements, replicated or not (tp_grad_shards) */
    GradSpan *once_spans;           /* per held tensor, the replicated ones on tp rank 0 only */
    int num_spans, num_once_spans;
    size_t global_params; /* parameters of the whole model */
    int recompute;        /* 1: the blocks keep only res3 and share one set of the rest */
    Activations acts;     /* tokens, targets, embedding output and the head's values as in
                             model.c; acts.block[l] with local widths: qkv (B,T,3C/tp),
                             atty (B,T,C/tp), lse (B,NH/tp,T), fch (B,T,4C/tp); the rest (B,T,C) */
    Activations *now;     /* the set the blocks read and write: &acts, or a pipeline's slot */
    KeptGrads *kept;      /* with tp_split_hooks: the output gradients B keeps for W (a pipeline's slot) */
    Scratch scratch;      /* the same local widths for dqkv, datty, dfch, dfch_gelu, gelu */
    /* --sp, sequence parallelism (set before tp_activations_create): the layernorm and residual
     * regions hold B x T / tp rows (sequence_parallel.h) */
    int sp;
    UnitHooks sp_blocks; /* with sp: the blocks in rows, which sequence_parallel_enable installs */
    float *sp_whole;    /* (B,T,C) an all-gathered input or output gradient, or a partial sum */
    float *sp_rows;     /* (B x T/tp, C) the first block's input gradient before its all-gather */
    float *sp_ln_grads; /* (2C) a layernorm's weight and bias gradients from this rank's rows */
} TensorParallelModel;

/* Local table, initial values and activations for micro-batches of B x T
 * (recompute: only the block inputs kept, as model.h describes), in
 * `precision`: fp32, or the slices stored in 16 bits with fp32 master
 * weights (mixed.h: mixed_create_units on the local table). The all-reduces
 * of the activations and of their gradients stay fp32 in every precision:
 * the activations are fp32 (mixed.h says which). */
void tp_model_create(TensorParallelModel *tm, const ModelConfig *cfg, uint64_t seed, TensorGroup *tp, int B,
                     int T, int recompute, Precision precision);
void tp_model_destroy(TensorParallelModel *tm);

/* ---- tensor parallelism inside a pipeline stage (chapter 04) ----
 * The same, for units first_unit..last_unit only (a stage's: model.param_first
 * is the range's first local element), and without activations: the stage
 * makes one set per micro-batch in flight with tp_activations_create, and
 * points tm->now at the set of the micro-batch it runs. */
void tp_model_create_range(TensorParallelModel *tm, const ModelConfig *cfg, uint64_t seed, TensorGroup *tp,
                           int first_unit, int last_unit, int B, int T, int recompute, Precision precision);
/* The same for a stage of several chunks (interleaved schedules): runs
 * first_units[c]..last_units[c] of units, stored one after another in one
 * buffer (in 16 bits too: mixed_create_chunks). */
void tp_model_create_chunks(TensorParallelModel *tm, const ModelConfig *cfg, uint64_t seed, TensorGroup *tp,
                            const int *first_units, const int *last_units, int chunks, int B, int T,
                            int recompute, Precision precision);
/* The initial values of the held slices (model.param_count of them, in the
 * local table's order) into host: what tp_model_create_range stores, for a
 * caller that gives the slices its own storage (tp->caller_storage). */
void tp_initial_values(const TensorParallelModel *tm, uint64_t seed, float *host);
/* The model and its 16-bit storage move to *model and *mixed (a stage's own
 * fields, which the pipeline passes to model.c): the blocks read the views
 * that the storage binds there. */
void tp_model_move(TensorParallelModel *tm, GPT *model, MixedModel *mixed);
void tp_activations_create(const TensorParallelModel *tm, Activations *a, int B, int T);
/* One set for units first_unit..last_unit only (a chunk's). */
void tp_activations_create_range(const TensorParallelModel *tm, Activations *a, int B, int T, int first_unit,
                                 int last_unit);
void tp_activations_destroy(const TensorParallelModel *tm, Activations *a);
/* The hooks that make gpt_forward_range and gpt_backward_range (model.h) run
 * this file's blocks on tm->now (with tm->sp, tm->sp_blocks: sequence_parallel.h). */
UnitHooks tp_block_hooks(TensorParallelModel *tm);
/* The same with the backward split in B and W (model.h, zero-bubble
 * pipelines): B keeps the sliced layers' output gradients in tm->kept, the
 * set of the micro-batch at hand (as tm->now), and W makes their weight
 * gradients from them; B has the two all-reduces, W none. */
UnitHooks tp_split_hooks(TensorParallelModel *tm);
/* One micro-batch's kept gradients for the held blocks in local widths
 * (dfch 4C/tp, dqkv 3C/tp; the LM head's whole); kept_grads_destroy frees it. */
void tp_kept_grads_create(const TensorParallelModel *tm, KeptGrads *kept, int B, int T);
/* The norm's shards when the group is one of several that hold the model
 * (tp inside pipeline stages): every held tensor a sharded part, the
 * replicated ones counted by tp rank 0 only, summed over model_group (every
 * rank of one copy of the model: stages x tp). */
GradShards tp_grad_shards_once(const TensorParallelModel *tm, CommGroup *model_group);

/* Index in the whole tensor of element e of rank r's slice of it. */
size_t tensor_parallel_global_index(const ParamTensor *whole, SliceKind kind, int rank, int tp, size_t e);

/* The group's collectives, timed into tp->comm_ms (device work queued
 * before them counts as compute), and the blocks tm holds: what
 * sequence_parallel.c shares with this file. */
void tp_allreduce(TensorGroup *tp, float *buf, size_t count);
void tp_allgather(TensorGroup *tp, const float *send, float *recv, size_t count);
int tp_first_block(const TensorParallelModel *tm);
int tp_last_block(const TensorParallelModel *tm);

/* Forward of the whole model on tm->acts.tokens / targets (losses in tm->acts.losses),
 * and backward (adds into tm->model.grads). Every rank of the group takes part.
 * They are model.c's gpt_forward_range and gpt_backward_range over every unit,
 * with this file's blocks in place of model.c's (UnitHooks.block_forward and
 * block_backward); the embedding and the head are model.c's, on this rank's
 * vocabulary rows (tm->vocab, the VocabSplit of model.h). */
void tp_forward(TensorParallelModel *tm, int with_loss, int B, int T);
void tp_backward(TensorParallelModel *tm, float dloss, int B, int T);

/* What this rank holds of the WHOLE model's gradient, for the norm
 * (optimizer_step.h): every tensor of the local table in order, the sliced
 * tensors' partial sums all-reduced over the group, the replicated ones
 * counted once. */
GradShards tp_grad_shards(const TensorParallelModel *tm);

/* The checkpoint layout of this rank (checkpoint.h): its slices of the whole
 * tensors (a column slice is a run of elements in every row), for the
 * parameters and opt's moments alike. Replica 0 of the data-parallel group
 * writes, and of a replicated tensor only tp rank 0; of a share of the
 * experts (--ep N, moe.parts = N), replica `replica` < N, which holds share
 * `replica`. */
void tp_checkpoint_layout(const TensorParallelModel *tm, const AdamW *opt, int replica, CkptLayout *l);

/* ---- the two parallel linear layers (exercises 03.1 and 03.2) ----
 * A linear layer is out(N,OC) = inp(N,C) @ weight(OC,C)^T + bias(OC).
 * Backward functions follow kernels.h: gradients of weights and biases are
 * ADDED to. */

/* Column-parallel: this rank holds OC_local rows of the weight (output units)
 * and their biases; it computes its OC_local columns of the output from the
 * whole input. Forward: no communication (Megatron's f is the identity). */
void column_parallel_forward(TensorGroup *tp, float *out_local, const float *inp, const float *weight_local,
                             const float *bias_local, int N, int C, int OC_local);
/* dinp (N,C) is OVERWRITTEN with the whole gradient of the input: each rank's
 * outputs depend on all of the input, so each rank's contribution is partial
 * and they are summed over the group (f's conjugate: an all-reduce). */
void column_parallel_backward(TensorGroup *tp, float *dinp, float *dweight_local, float *dbias_local,
                              const float *dout_local, const float *inp, const float *weight_local, int N,
                              int C, int OC_local);

/* Row-parallel: this rank holds C_local columns of the weight (input units)
 * and gets the matching C_local columns of the input (the output of a
 * column-parallel layer). Its product is a partial sum of the whole output:
 * the group all-reduces it (Megatron's g) and the replicated bias is counted
 * once. out (N,OC) is whole and identical on every rank. */
void row_parallel_forward(TensorGroup *tp, float *out, const float *inp_local, const float *weight_local,
                          const float *bias, int N, int C_local, int OC);
/* dout (N,OC) is whole and identical on every rank: the input's and the
 * weight's gradients are local and need no communication (g's conjugate is
 * the identity); every rank holds the whole bias and adds its whole gradient. */
void row_parallel_backward(TensorGroup *tp, float *dinp_local, float *dweight_local, float *dbias,
                           const float *dout, const float *inp_local, const float *weight_local, int N,
                           int C_local, int OC);

#endif
