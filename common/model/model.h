/* model.h: the GPT model every chapter trains.
 *
 * A GPT-2-style decoder: token + position embedding, L pre-LN blocks
 * (layernorm -> causal self-attention -> residual, layernorm -> MLP with a 4C
 * hidden layer and GELU -> residual), a final layernorm and an LM head over
 * a vocabulary of V tokens (256 bytes by default, 50257 for GPT-2's), padded
 * to vocab_padded(V) rows (model_config.h). The head is its own lm_head
 * matrix, or with --tie-embeddings (cfg.tied) wte itself, as in GPT-2: the
 * logits are lnf(x) @ wte^T and the head's gradient adds into wte's, which
 * the embedding's backward adds to as well.
 *
 * The parameters are described by a table of named tensors (param_table.h),
 * laid out unit by unit: the embedding, each block, the head. A GPT is that
 * table plus the storage bound to it, a unit at a time: the whole model in
 * one buffer (gpt_create), a run of units for a pipeline stage
 * (gpt_create_range), or whatever a caller binds (gpt_bind_range,
 * gpt_bind_unit: a ZeRO-3 rank binds each unit while it is gathered).
 *
 * Forward and backward run over a range of units (gpt_forward_range,
 * gpt_backward_range), with optional calls before and after each unit; the
 * per-unit functions (embedding, block l, head) are exposed too. */
#ifndef MODEL_H
#define MODEL_H

#include "common/core/half.h" /* bf16 and fp16 conversions */
#include "common/kernels/kernels.h" /* ops(): the kernel table */
#include "common/model/model_config.h" /* ModelConfig */
#include "common/model/moe.h" /* MoE buffers and routing */
#include "common/model/param_table.h" /* the parameter table and its units */

#include <stddef.h>
#include <stdint.h>

/* Pointers to one block's tensors, indexed by BlockTensor. */
typedef float *BlockWeights[BLOCK_TENSORS];

/* Pointers into a parameter-shaped buffer (the parameters or their
 * gradients); NULL for the tensors of a unit with no storage bound. */
typedef struct {
    float *wte;          /* (Vp, C): Vp = vocab_padded(V) (model_config.h) */
    float *wpe;          /* (T, C) */
    BlockWeights *block; /* block[l][BlockTensor], L of them */
    float *lnfw;         /* (C) */
    float *lnfb;         /* (C) */
    float *lm_head;      /* (Vp, C); tied: the same pointer as wte, NULL where wte is not bound */
} Weights;

/* Optional: each sequence split over ranks (context parallelism,
 * 03_model_parallel/context_parallel.h). The T tokens a rank computes are
 * then some of the positions of longer sequences: the embedding must add
 * those positions' rows of wpe, and attention must see the keys the other
 * ranks hold. These calls, kernels.h's signatures plus a context, replace
 * the kernels at those four places; everything else in a block works on one
 * token at a time and needs no change. */
typedef struct SequenceSplit {
    /* kernels.h's embedding_forward_rows and _backward_rows: wte's rows
     * first .. first + rows - 1 (all of them without a VocabSplit) */
    void (*embedding_forward)(float *out, const int *tokens, const float *wte, const float *wpe, int B, int T,
                              int C, int first, int rows, void *context);
    void (*embedding_backward)(float *dwte, float *dwpe, const float *dout, const int *tokens, int B, int T,
                               int C, int first, int rows, void *context);
    void (*attention_forward)(float *out, float *lse, const float *qkv, int B, int T, int C, int NH,
                              void *context);
    void (*attention_backward)(float *dqkv, const float *dout, const float *qkv, const float *out,
                               const float *lse, int B, int T, int C, int NH, void *context);
    void *context;
} SequenceSplit;

/* Optional: wte and the head split by vocabulary rows over `parts` ranks
 * (tensor parallelism, 03_model_parallel/tensor_parallel.h: Megatron's
 * vocab-parallel embedding and cross-entropy; cfg.vocab_parts is parts).
 * This model holds rows first_row .. first_row + vocab_rows_held(cfg) - 1
 * of wte and the head, and so that many columns of the logits. The
 * embedding looks up the rows it holds (0 for the others' tokens) and the
 * ranks sum the outputs; the loss comes from the logit slices with an
 * all-gather of each row's maximum and an all-reduce of the sums of
 * exponentials and the target's logit (head_loss in model.c); the head's
 * input gradient, a partial sum over the slices, is all-reduced. The
 * B x T x V logits are never gathered. */
typedef struct VocabSplit {
    int parts, first_row;
    float *stats; /* (parts + 3, tokens of a piece of the head): the rows' maxima, every part's
                     maxima, the sums of exponentials and the target logits (the owner's workspace) */
    void (*allreduce_sum)(float *buf, size_t count, void *context); /* in place, over the parts */
    void (*allgather)(const float *mine, float *all, size_t count, void *context); /* (parts, count) */
    void *context;
} VocabSplit;

/* Optional: an MoE block's experts computed elsewhere (expert parallelism,
 * 03_model_parallel/expert_parallel.h). model.c routes the tokens and
 * gathers them into rows grouped by expert (la->xin, la->count_h); forward
 * fills la->y with the experts' outputs for those rows, which model.c then
 * combines. backward takes dL/d(la->y) (dy) and leaves dL/d(la->xin) in dxin,
 * adding the gradients of the experts this rank holds. Both compute the
 * experts with gpt_experts_forward and gpt_experts_backward (below). */
typedef struct ExpertSplit {
    void (*forward)(int layer, MoeLayerActs *la, int B, int T, void *context);
    void (*backward)(int layer, const MoeLayerActs *la, const float *dy, float *dxin, int B, int T,
                     void *context);
    void *context;
} ExpertSplit;

typedef struct {
    ParamTable table; /* names, shapes, offsets and units of the whole model */
    /* The table's, repeated here because every chapter reads them. */
    ModelConfig cfg;            /* table.cfg */
    const ParamTensor *tensors; /* table.tensors */
    int num_tensors;            /* table.num_tensors */
    size_t num_params;          /* table.num_params */
    /* The storage bound by gpt_create, gpt_create_range, gpt_alloc_range or
     * gpt_bind_range: units first_unit..last_unit, elements [param_first,
     * param_first + param_count) of the table (the whole table except on a
     * stage of a layer split). */
    int first_unit, last_unit;
    size_t param_first, param_count;
    float *params;    /* device (param_count), CAT_PARAMS; under mixed precision the fp32
                         master weights (mixed.h, CAT_OPTIMIZER), which units never read */
    float *grads;     /* device (param_count), CAT_GRADS */
    int owns_storage; /* params and grads were allocated here, and gpt_destroy frees them */
    const size_t *unit_at; /* NULL: the held units are one run of the table from param_first; else
                              several runs (a pipeline stage's chunks): per unit u (at u + 1),
                              where its elements start in params, SIZE_MAX where not held */
    Weights w;        /* views into params; NULL for tensors not held */
    Weights g;        /* views into grads */
    /* Optional: calls that give a unit its storage just before it is computed
     * and take it back after, made by every forward and backward over a range
     * around the caller's own hooks. Mixed precision (mixed.h) converts the
     * unit's 16-bit weights to fp32 there; NULL when the storage is bound. */
    const struct UnitHooks *storage;
    /* Mixed precision: the matmuls take 16-bit inputs (rounded to
     * matmul_format) and accumulate in fp32; 0 for fp32 matmuls. */
    int half_matmuls;
    HalfFormat matmul_format;
    /* NULL: the tokens at hand are whole sequences (positions 0..T-1). */
    const SequenceSplit *sequence;
    /* NULL: this model holds every vocabulary row of wte and the head. */
    const VocabSplit *vocab;
    /* NULL: every MoE block computes all its experts here. */
    const ExpertSplit *experts;
} GPT;

/* Forward values kept for the backward pass: one set per micro-batch in flight.
 * Shapes are for the capacity (B, T) given at allocation. */
typedef struct {
    float *ln1, *ln1_mean, *ln1_rstd; /* (B,T,C), (B,T), (B,T) */
    float *qkv;                       /* (B,T,3C) */
    float *atty;                      /* (B,T,C) attention output before its projection */
    float *lse;                       /* (B,NH,T) attention log-sum-exp per query row */
    float *res2;                      /* (B,T,C) residual stream after attention */
    float *ln2, *ln2_mean, *ln2_rstd; /* (B,T,C), (B,T), (B,T) */
    float *fch;                       /* (B,T,4C) MLP hidden, before GELU (its output is
                                         recomputed from this when needed: Scratch.gelu) */
    float *res3;                      /* (B,T,C) block output */
} BlockActs;

/* Optional, with recompute: where the blocks' kept outputs (each the next
 * unit's input, the activation checkpoints) wait between a micro-batch's
 * forward and its backward, given by the caller as UnitHooks give a unit's
 * weights. Without one they sit in the Activations, one per block. With
 * one, the Activations hold none: before block l's forward the store names
 * the device buffer its output goes to (place), and is told when it is
 * written (written: the store may move it away); before the backward of a
 * unit that reads block l's output the store brings it back (fetch: a
 * device buffer holding it). `slot` is Activations.store_slot (which
 * micro-batch's set), `floats` the output's size. Chapter 06 keeps them in
 * host memory (--offload-activations). */
typedef struct CheckpointStore {
    float *(*place)(int slot, int layer, void *context);
    void (*written)(int slot, int layer, size_t floats, void *context);
    float *(*fetch)(int slot, int layer, size_t floats, void *context);
    void *context;
} CheckpointStore;

typedef struct {
    int B, T;                         /* capacity */
    int recompute;                    /* 1: only block inputs are kept (see below) */
    const CheckpointStore *store;     /* recompute: NULL, or where the block outputs wait (above) */
    int store_slot;                   /* the store's name for this set */
    int *tokens;                      /* (B,T) device */
    int *targets;                     /* (B,T) device */
    float *encoded;                   /* (B,T,C) embedding output = input of block 0 */
    BlockActs *block;                 /* L of them */
    float *lnf, *lnf_mean, *lnf_rstd; /* (B,T,C), (B,T), (B,T) */
    /* The head's values, for one piece of head_rows tokens (below): Vh =
     * vocab_rows_held(cfg), Vp = vocab_padded(V) or a vocabulary split's share */
    int head_rows;                    /* B*T, or with --loss-chunks K: B*T / K */
    int logits_row0;                  /* the first token whose logits `logits` holds */
    float *logits;                    /* (head_rows,Vh) columns past V: padding, never read */
    float *probs;                     /* (head_rows,Vh) 0 in the padded columns */
    float *losses;                    /* (B,T) */
    MoeActs moe;                      /* the MoE blocks' routing and values (moe.h); empty when dense */
} Activations;

/* The head in pieces (--loss-chunks K, cfg.loss_chunks). The logits, their
 * probabilities and their gradient are B x T x Vp floats each, the largest
 * buffers of a step at GPT-2's vocabulary. With K pieces the head computes
 * the logits and loss of B*T/K tokens at a time into buffers of that size.
 * Nothing of the head but lnf and the losses is kept: the backward computes
 * each piece's logits again (one more head matmul per step), its gradient,
 * and adds the piece's share of the head's weight gradient. Each token's
 * logits and loss come from the same operations as without pieces (the loss
 * of a step is the same, bit for bit, where the matmul's arithmetic per row
 * does not depend on the rows beside it); the weight gradient is a sum of K
 * matmuls instead of one, so later steps agree to rounding. With K > 1 the
 * split backward (B and W) computes the head's weight gradient in B. */

/* Activation recomputation (--recompute). By default the forward pass keeps
 * every block's BlockActs for the backward pass: L sets of about 12C floats per
 * token. With recompute it keeps only the residual stream between blocks, the
 * block outputs res3 (block l's input is block l-1's res3, block 0's is
 * `encoded`); the other fields of a->block[l] are NULL. The forward pass still
 * computes them, into ONE block-sized set shared by all blocks and all
 * micro-batches (Scratch.recomputed), and gpt_block_backward first runs block
 * l's forward again from its kept input, up to the last value the backward
 * reads (fch), into that set. Memory: L sets become one; compute: one more
 * forward of the blocks per step, less fcproj (a forward is about a third of a
 * step); the numbers are bit-for-bit the same: the same kernels see the same
 * inputs. */

/* Scratch shared by all micro-batches: activation gradients and transient
 * values (CAT_WORKSPACE). Only one backward pass runs at a time. */
typedef struct {
    int B, T;
    float *branch;    /* (B,T,C) output of attproj / fcproj before the residual add */
    float *dresid[2]; /* (B,T,C) gradient of the residual stream between blocks, ping-pong */
    float *dmid;      /* (B,T,C) gradient of the residual stream inside a block (res2) */
    float *dbranch;   /* (B,T,C) */
    float *dln;       /* (B,T,C) */
    float *dqkv;      /* (B,T,3C) */
    float *datty;     /* (B,T,C) */
    float *dfch;      /* (B,T,4C) */
    float *dfch_gelu; /* (B,T,4C) */
    float *gelu;      /* (B,T,4C) GELU(fch) of the block at hand: fcproj's input in forward,
                         recomputed in backward for fcproj's weight gradient instead of being
                         kept per block (a GELU costs less than 4C floats per token per block) */
    float *dlogits;   /* (head_rows,Vh) as Activations.logits */

    int recompute;        /* 1: `recomputed` below is allocated */
    BlockActs recomputed; /* with recompute: the values of the block at hand (res3 NULL: the
                             output goes to the kept a->block[l].res3), CAT_ACTIVATIONS */
    MoeScratch moe;       /* the MoE block at hand's gradients (moe.h); empty when dense */
} Scratch;

/* Check a model shape; returns NULL if valid, else a message for the user. */
const char *model_config_problem(const ModelConfig *m);

/* A model of this table with no storage bound (every view NULL); the model
 * owns the table from now on. */
void gpt_init(GPT *model, ParamTable table);
/* Make units first_unit..last_unit the model's range (first_unit, last_unit,
 * param_first, param_count), binding no storage. */
void gpt_set_range(GPT *model, int first_unit, int last_unit);
/* Bind storage to units first_unit..last_unit (LAYER_EMBEDDING .. L): params
 * and grads hold their elements contiguously as in the table (params[0] is the
 * first unit's first element; grads may be NULL: no gradients); the other
 * units are unbound. The caller keeps ownership of the buffers. */
void gpt_bind_range(GPT *model, int first_unit, int last_unit, float *params, float *grads);
/* Bind one unit's views to params and grads (the unit's elements in table
 * order), or unbind it with NULL; param_first and param_count do not change. */
void gpt_bind_unit(GPT *model, int unit, float *params, float *grads);
/* Allocate device storage (uninitialised) for units first_unit..last_unit and
 * bind it; gpt_destroy frees it. */
void gpt_alloc_range(GPT *model, int first_unit, int last_unit);
/* Table + device storage for params and grads + initial values from seed. */
void gpt_create(GPT *model, const ModelConfig *cfg, uint64_t seed);
/* The same for a stage of a layer split: only units first_unit..last_unit,
 * one contiguous slice of the table, get memory and initial values (the whole
 * model's values for those elements); the views of the other units are NULL. */
void gpt_create_range(GPT *model, const ModelConfig *cfg, uint64_t seed, int first_unit, int last_unit);
void gpt_destroy(GPT *model);

/* Where tensor t of m's table is in view, m->w or m->g (NULL when its unit is
 * not bound). */
float *weights_tensor(const GPT *m, const Weights *view, const ParamTensor *t);
/* Where tensor t's elements start in m's params and grads (the table's run
 * from param_first, or a stage's runs of units: unit_at), or SIZE_MAX where
 * m does not hold t. */
size_t gpt_held_offset(const GPT *m, const ParamTensor *t);

/* Bytes of saved activations / scratch for a micro-batch of B sequences of T. */
size_t activation_bytes(const ModelConfig *cfg, int B, int T);
size_t scratch_bytes(const ModelConfig *cfg, int B, int T);
/* With recompute: the bytes one micro-batch keeps (activation_bytes less all
 * of every block but its output), and the one recomputed block set that the
 * Scratch adds (one BlockActs less res3). */
size_t activation_bytes_recompute(const ModelConfig *cfg, int B, int T);
size_t recompute_block_bytes(const ModelConfig *cfg, int B, int T);
/* What activations_create_range allocates for units first_unit..last_unit. */
size_t activation_bytes_range(const ModelConfig *cfg, int B, int T, int first_unit, int last_unit,
                              int recompute);
/* The model's linear layers, as gpt_linear_forward computes them: qkv, attproj,
 * fc, fcproj of every block, and the LM head; returns their count (at most
 * GPT_LINEAR_SHAPES). The CPU backend's 16-bit matmul workspaces grow to the
 * largest operands of these (kernels.h, half_matmul_workspace_bytes_cpu). */
enum { GPT_LINEAR_SHAPES = 5 };
int gpt_linear_shapes(const ModelConfig *cfg, LinearShape shapes[GPT_LINEAR_SHAPES]);

/* Everything kept, the whole model (the default; exercise 01.3). */
void activations_create(Activations *acts, const ModelConfig *cfg, int B, int T);
/* The whole model, keeping everything (recompute 0) or only the block inputs
 * (recompute 1, with a Scratch created with recompute 1). */
void activations_create_model(Activations *acts, const ModelConfig *cfg, int B, int T, int recompute);
/* Only what a stage holding units first_unit..last_unit saves: tokens,
 * targets and `encoded` always (on a later stage, `encoded` is where the
 * previous stage's activations arrive), the blocks in the range (a->block[l]
 * is all NULL for the others; with recompute all but res3), the head's values
 * when last_unit is L. */
void activations_create_range(Activations *acts, const ModelConfig *cfg, int B, int T, int first_unit,
                              int last_unit, int recompute);
/* The same with recompute, the blocks' outputs kept by `store` (CheckpointStore
 * above) as set `slot`: the device holds none of them here. */
void activations_create_stored(Activations *acts, const ModelConfig *cfg, int B, int T, int first_unit,
                               int last_unit, const CheckpointStore *store, int slot);
void activations_destroy(Activations *acts, const ModelConfig *cfg);
/* recompute 1 adds the one block set that every block's forward writes and
 * every block's backward recomputes into (shared by all micro-batches). */
void scratch_create(Scratch *s, const ModelConfig *cfg, int B, int T, int recompute);
void scratch_destroy(Scratch *s);

/* ---- forward and backward over a range of units ----
 * B sequences of T tokens (B, T at most the capacity). Units are numbered as
 * in the table: LAYER_EMBEDDING, the blocks 0..L-1, the head L. */

/* A call around unit `unit`. */
typedef void (*UnitHook)(int unit, void *context);
/* A block computed by the caller instead of by model.c (see UnitHooks). */
typedef void (*BlockForwardFn)(int layer, const float *input, int B, int T, void *context);
typedef void (*BlockBackwardFn)(int layer, const float *input, const float *doutput, float *dinput, int B,
                                int T, void *context);
/* W of a block computed by the caller (the backward split in two, below);
 * input: the block's input, from which recomputation runs its forward again. */
typedef void (*BlockWeightFn)(int layer, const float *input, int B, int T, void *context);

/* What a caller adds to the loop over the units; any field may be NULL.
 *   before_forward(u), after_forward(u)    around unit u's forward
 *   before_backward(u), after_backward(u)  around unit u's backward; after it
 *                                          the unit's gradients are final
 * ZeRO-3 gathers a unit's parameters before its forward and its backward and
 * frees them after; data parallelism sends a unit's gradients after its
 * backward. block_forward and block_backward replace gpt_block_forward and
 * gpt_block_backward: tensor parallelism computes every block with sliced
 * matrices and all-reduces, on the same buffers (a->block[l], the scratch).
 * In the split backward (below) block_backward is the caller's B of a block
 * and block_backward_weight its W. */
typedef struct UnitHooks {
    UnitHook before_forward, after_forward;
    UnitHook before_backward, after_backward;
    BlockForwardFn block_forward;
    BlockBackwardFn block_backward;
    BlockWeightFn block_backward_weight;
    void *context; /* passed to each of them */
} UnitHooks;

/* Forward of units first..last for one micro-batch. The range reads
 * a->tokens when it starts at the embedding, else a->encoded (where a stage
 * receives the previous stage's output); it ends in a->block[last].res3
 * (gpt_layer_output) or, with the head, in the logits and, with_loss, the
 * per-token losses (from a->targets). hooks may be NULL. */
void gpt_forward_range(const GPT *m, Activations *a, Scratch *s, int first, int last, int with_loss,
                       const UnitHooks *hooks, int B, int T);
/* Backward of units last..first, adding into m->grads. With the head in the
 * range it starts from dloss, d(total loss)/d(each token's loss); else from
 * doutput, dL/d(output of block last). Returns dL/d(a->encoded), the gradient
 * of the range's input when it starts at a block: written into dinput if
 * given, else left in the scratch (valid until the next backward). */
const float *gpt_backward_range(const GPT *m, Activations *a, Scratch *s, int first, int last, float dloss,
                                const float *doutput, float *dinput, const UnitHooks *hooks, int B, int T);

/* The whole model: tokens and targets already in a->tokens, a->targets. */
void gpt_forward(const GPT *m, Activations *a, Scratch *s, int B, int T);
void gpt_backward(const GPT *m, Activations *a, Scratch *s, float dloss, int B, int T);
/* The same backward, calling unit_done(unit, context) as soon as a unit's
 * gradients are final: L after the head, l after block l, LAYER_EMBEDDING
 * after the embedding. Data parallelism starts communicating there. */
void gpt_backward_hooked(const GPT *m, Activations *a, Scratch *s, float dloss, int B, int T,
                         UnitHook unit_done, void *context);

/* Output of layer l (the input of layer l+1); -1 gives the embedding. */
float *gpt_layer_output(const GPT *m, Activations *a, int layer);

/* ---- one unit ---- */
void gpt_embedding_forward(const GPT *m, Activations *a, int B, int T); /* a->tokens -> a->encoded */
void gpt_block_forward(const GPT *m, Activations *a, Scratch *s, int layer, const float *input, int B, int T);
/* final layernorm, logits; with targets also probabilities and per-token losses */
void gpt_head_forward(const GPT *m, Activations *a, const float *input, int with_loss, int B, int T);
/* Backward of one unit: adds into m->grads. dloss: d(total loss)/d(each
 * token's loss). Leaves dL/d(head input) in dinput. */
void gpt_head_backward(const GPT *m, Activations *a, Scratch *s, const float *input, float *dinput,
                       float dloss, int B, int T);
/* doutput: dL/d(block output); leaves dL/d(block input) in dinput (overwritten).
 * With recompute, it first runs the block's forward again from input. */
void gpt_block_backward(const GPT *m, Activations *a, Scratch *s, int layer, const float *input,
                        const float *doutput, float *dinput, int B, int T);
void gpt_embedding_backward(const GPT *m, Activations *a, const float *dencoded, int B, int T);

/* ---- the backward in two halves: B, then W (zero-bubble pipelines) ----
 * A zero-bubble schedule (04_pipeline/schedule.h, zb-h1) runs a range's
 * backward as B, the gradient of the range's input, which the previous
 * stage waits for, and later W, the weight gradients of the linear layers,
 * which nobody waits for. B computes everything but those weight gradients
 * and keeps what W needs besides the forward's activations: the gradient of
 * each linear layer's output (KeptGrads, one set per micro-batch whose W has
 * not run). The layernorms' weight gradients come out of the kernel that
 * makes their input gradient, and the embedding's is a scatter of the
 * gradient B ends with: both are computed in B, and so are an MoE block's
 * router and experts (moe.h: their gradients come with the routing's). Each parameter's gradient
 * gets the same one addition per micro-batch as in gpt_backward_range, from
 * the same kernels on the same values, so when the W's of a stage run in the
 * order of its micro-batches the gradients equal the ordinary backward's bit
 * for bit (tests/test_units.c, `split`).
 * Hooks: a caller's blocks (tensor parallelism) come as block_backward
 * (their B, keeping what their W reads where the caller says) and
 * block_backward_weight (their W); the calls before and after a unit are
 * refused, since a unit's gradients are final only after its W. The storage
 * calls of mixed precision run around each unit's B and again around its W:
 * each adds the fp32 gradients of its half into the 16-bit ones, the other
 * half's elements adding zero, so each element is still rounded once per
 * micro-batch, as in the whole backward.
 * With activation recomputation (model.h, --recompute) B runs each block's
 * forward again from its kept input, as the whole backward does, and W runs
 * it once more: W reads the linear layers' inputs, which the one recomputed
 * set no longer holds by then. The same kernels on the same inputs give the
 * same values, so the gradients stay bit for bit; the price is a third
 * forward of the blocks per step. */

/* The output gradients of one block's linear layers, kept by B for W. */
typedef struct {
    float *dout; /* (B,T,C) dL/d(block output): fcproj's output gradient */
    float *dfch; /* (B,T,4C) fc's output gradient */
    float *dmid; /* (B,T,C) attproj's output gradient (dL/d res2) */
    float *dqkv; /* (B,T,3C) qkv's output gradient */
} BlockKeptGrads;

typedef struct {
    int B, T;              /* capacity */
    BlockKeptGrads *block; /* L of them; NULL pointers outside the range */
    float *dlogits;        /* (B,T,Vh) the LM head's output gradient, with the head in the range
                              (NULL with --loss-chunks: B computes the head's weight gradient) */
    float *storage;        /* the one device allocation the tensors above are carved from */
} KeptGrads;

/* For units first_unit..last_unit (CAT_ACTIVATIONS: they live from B to W,
 * like the activations); kept_grads_bytes: their size. */
void kept_grads_create_range(KeptGrads *k, const ModelConfig *cfg, int B, int T, int first_unit,
                             int last_unit);
void kept_grads_destroy(KeptGrads *k);
size_t kept_grads_bytes(const ModelConfig *cfg, int B, int T, int first_unit, int last_unit);

/* B: gpt_backward_range without the linear layers' weight gradients,
 * keeping their output gradients in *kept (or, for the caller's blocks,
 * where hooks->block_backward keeps them). hooks may be NULL. */
const float *gpt_backward_input_range(const GPT *m, Activations *a, Scratch *s, KeptGrads *kept, int first,
                                      int last, float dloss, const float *doutput, float *dinput,
                                      const UnitHooks *hooks, int B, int T);
/* W: the linear layers' weight gradients of units first..last, added into
 * m->grads, from a's activations and what B kept (the caller's blocks:
 * hooks->block_backward_weight). */
void gpt_backward_weight_range(const GPT *m, Activations *a, Scratch *s, const KeptGrads *kept, int first,
                               int last, const UnitHooks *hooks, int B, int T);

/* ---- the model's matmuls ----
 * A linear layer (kernels.h: linear_forward, linear_backward) as model m
 * computes it: fp32, or with 16-bit matmul inputs and fp32 accumulation
 * under mixed precision (m->half_matmuls: linear_forward_half). Every layer
 * of the model goes through these, and so do tensor parallelism's sliced
 * layers (03_model_parallel); m NULL computes in fp32. */
void gpt_linear_forward(const GPT *m, float *out, const float *inp, const float *weight, const float *bias,
                        int N, int C, int OC);
void gpt_linear_backward(const GPT *m, float *dinp, float *dweight, float *dbias, const float *dout,
                         const float *inp, const float *weight, int N, int C, int OC);
/* Its two halves (kernels.h: linear_backward_input, _weight) */
void gpt_linear_backward_input(const GPT *m, float *dinp, const float *dout, const float *weight, int N,
                               int C, int OC);
void gpt_linear_backward_weight(const GPT *m, float *dweight, float *dbias, const float *dout,
                                const float *inp, int N, int C, int OC);

/* ---- an MoE block's experts ----
 * Experts first .. first + count - 1 of those block l holds (all E, or under
 * expert parallelism its share: cfg.moe.parts, model_config.h) on rows
 * grouped by expert: rows[i] rows of expert first + i, one after the other,
 * from xin (R, C), R the sum of rows. Forward: fch (R, 4C) kept for the backward, y (R, C),
 * gelu (R, 4C) scratch. Backward: from dy (R, C), dxin (R, C) written (not
 * added to) and the experts' weight gradients added into m->grads; gelu,
 * dgelu, dfch (R, 4C) scratch. */
void gpt_experts_forward(const GPT *m, int l, int first, int count, const int *rows, const float *xin,
                         float *fch, float *gelu, float *y);
void gpt_experts_backward(const GPT *m, int l, int first, int count, const int *rows, const float *xin,
                          const float *fch, const float *dy, float *gelu, float *dgelu, float *dfch,
                          float *dxin);

/* An MoE block's MLP half, as gpt_block_forward and gpt_block_backward run
 * it (in place of fc, GELU and fcproj): out (B T, C) from ln2 = ln2(res2),
 * the routing added to a->moe.stats; the backward adds dL/d(ln2) into dln
 * and the router's and experts' gradients into m->grads. Tensor parallelism
 * runs it whole on every tp rank (tensor_parallel.h). */
void gpt_moe_forward(const GPT *m, Activations *a, Scratch *s, int l, const float *ln2, float *out, int B, int T);
void gpt_moe_backward(const GPT *m, Activations *a, Scratch *s, int l, const float *ln2, const float *dout,
                      float *dln, int B, int T);

/* Row `row` of the B x T tokens' logits from the last forward (with the head
 * in pieces, a row of another piece than the last is computed again from
 * a->lnf), whole (vocab_padded(V) floats) into host memory. Under a VocabSplit every rank
 * of the split calls it: the slices are gathered (into a->probs, unused
 * after a forward without the loss). */
void gpt_logits_row(const GPT *m, Activations *a, int row, float *host);

/* Sum of a->losses over B*T tokens (copied to the host, summed in double). */
double gpt_loss_sum(const Activations *a, int B, int T);

#endif
