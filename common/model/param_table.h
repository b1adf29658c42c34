/* param_table.h: the GPT's parameter table, its layer units, and how ZeRO
 * shards them.
 *
 * The table names every parameter tensor of the model: its name, shape,
 * offset in one flat parameter buffer, and how it is initialised. It holds no
 * memory: storage is bound to it afterwards, a unit at a time (model.h: the
 * whole model in chapter 01, a run of units on a pipeline stage, a gathered
 * unit under ZeRO-3).
 *
 * Units. The tensors are laid out unit by unit, and a unit is a layer:
 *
 *     unit -1 (LAYER_EMBEDDING)   wte, wpe
 *     unit l, 0 <= l < L          block l: h{l}.ln1w ... h{l}.fcprojb (12 tensors; an MoE
 *                                 block's MLP tensors hold E experts, then h{l}.routerw)
 *     unit L                      the head: lnf.w, lnf.b, lm_head (none when tied: the
 *                                 head reads wte, model_config.h)
 * wte and lm_head have vocab_padded(V) rows (model_config.h).
 *
 *     elements  | wte wpe | h0.ln1w .. h0.fcprojb | h1.* | .. | h{L-1}.* | lnf.w lnf.b lm_head |
 *     unit      |   -1    |           0           |  1   | .. |   L-1    |          L          |
 *
 * so a unit, and any run of consecutive units (a pipeline stage), is one
 * contiguous range of elements. Units are numbered like ParamTensor.layer.
 * Within its unit a tensor has a kind (its index there: an EmbeddingTensor,
 * BlockTensor or HeadTensor), and code asks the table for "tensor KIND of unit
 * u" (table_tensor), never for an index computed from the layout.
 *
 * Initial values depend only on (seed, tensor name, element index): any split
 * or shard of the model starts from exactly the same weights. A table may hold
 * a part of the model's experts (ModelConfig.moe.parts, expert parallelism):
 * its MoE tensors are then the held experts' rows, one run of the whole
 * tensor's elements from whole_first, and initialised as those elements.
 *
 * Shards (ZeRO, chapter 05). N ranks share the model's state unit by unit.
 * Unit u, of n elements, is padded to N*S elements, S = ceil(n / N), and rank
 * r owns slice r of it, elements [r*S, (r+1)*S) of the unit; the padding
 * (fewer than N zeros) sits at the unit's end. A rank's shard is its slice of
 * every unit, one after the other:
 *
 *     unit u (N = 3)     [ slice 0 | slice 1 | slice 2 |pad]     S = shard_slice_numel(t, u, 3)
 *
 *     shard of rank r    [ emb slice r | h0 slice r | h1 slice r | .. | head slice r ]
 *                                      ^ shard_unit_offset(t, 0, N): the slices of the units before
 *                        |<------------------ shard_numel(t, N) -------------------->|
 *
 * So each rank's optimizer state and gradient norm are one contiguous buffer,
 * and a unit travels whole with one collective: an all-gather of its slices
 * (S elements from shard_unit_offset of every rank, in rank order) gives the
 * unit in table order followed by its padding; a reduce-scatter of a unit's
 * gradient (N*S elements) leaves each rank the sum of its slice. Element e of
 * unit u lives on rank e / S, at shard_unit_offset(t, u, N) + e % S of its
 * shard. */
#ifndef PARAM_TABLE_H
#define PARAM_TABLE_H

#include "common/model/model_config.h" /* ModelConfig */

#include <stddef.h>
#include <stdint.h>

/* The unit (and ParamTensor.layer) of the embedding; the head is unit L. */
#define LAYER_EMBEDDING (-1)

/* The tensors of each kind of unit, in table order. */
typedef enum { EMBEDDING_WTE, EMBEDDING_WPE, EMBEDDING_TENSORS } EmbeddingTensor; /* (V, C), (T, C) */
typedef enum {
    BLOCK_LN1W,
    BLOCK_LN1B, /* (C), (C) */
    BLOCK_QKVW,
    BLOCK_QKVB, /* (3C, C), (3C) */
    BLOCK_ATTPROJW,
    BLOCK_ATTPROJB, /* (C, C), (C) */
    BLOCK_LN2W,
    BLOCK_LN2B, /* (C), (C) */
    BLOCK_FCW,
    BLOCK_FCB, /* (4C, C), (4C) */
    BLOCK_FCPROJW,
    BLOCK_FCPROJB, /* (C, 4C), (C) */
    BLOCK_ROUTERW, /* (E, C): MoE blocks only (moe.h), where fcw .. fcprojb hold E experts:
                      (E*4C, C), (E*4C), (E*C, 4C), (E*C), expert e's rows at e times a dense one's;
                      under expert parallelism (cfg.moe.parts) only the experts held, E/parts */
    BLOCK_TENSORS
} BlockTensor;
/* (C), (C), (Vp, C); lm_head absent when tied */
typedef enum { HEAD_LNFW, HEAD_LNFB, HEAD_LM_HEAD, HEAD_TENSORS } HeadTensor;

typedef enum { INIT_NORMAL, INIT_ZEROS, INIT_ONES } InitKind;

typedef struct {
    char name[32];  /* e.g. "h3.qkvw" */
    int layer;      /* its unit: LAYER_EMBEDDING, 0..L-1 for blocks, L for the head */
    int kind;       /* its index in the unit: an EmbeddingTensor, BlockTensor or HeadTensor */
    int rows, cols; /* shape (rows, cols); vectors have rows == 1 */
    size_t offset;  /* first element in the parameter buffer */
    size_t numel;   /* rows * cols */
    size_t whole_first; /* element 0 here is this element of the whole model's tensor (a held run of
                           it: the experts of expert parallelism); its initial value's index */
    InitKind init;
    float init_std; /* for INIT_NORMAL */
} ParamTensor;

typedef struct {
    int layer;                     /* LAYER_EMBEDDING, 0..L-1, L */
    int first_tensor, num_tensors; /* its tensors: tensors[first_tensor ..] */
    size_t offset, numel;          /* its elements: [offset, offset + numel) */
} ParamUnit;

typedef struct {
    ModelConfig cfg;
    ParamTensor *tensors;
    int num_tensors;
    ParamUnit *units; /* L + 2 of them, unit u at units[u + 1]: use table_unit() */
    int num_units;
    size_t num_params; /* elements in the table */
} ParamTable;

/* The table of the model cfg describes. */
void param_table_build(ParamTable *t, const ModelConfig *cfg);
/* Numel, offsets and units again from the tensors' shapes, for a caller that
 * changed them (tensor parallelism keeps a rank's slices in a table of the
 * same names and order with smaller shapes). */
void param_table_layout(ParamTable *t);
void param_table_free(ParamTable *t);

/* Unit `unit` (LAYER_EMBEDDING..L) and tensor `kind` of it; both end the
 * program naming the problem when there is no such unit or tensor. */
const ParamUnit *table_unit(const ParamTable *t, int unit);
const ParamTensor *table_tensor(const ParamTable *t, int unit, int kind);
/* Whether t is one of an MoE block's four expert tensors (moe_fcw .. moe_fcprojb):
 * all E experts' rows, or under expert parallelism a share of them (whole_first). */
int param_expert_tensor(const ModelConfig *cfg, const ParamTensor *t);

/* Initial value of element i of tensor t: a function of (seed, name, i) only. */
float param_init_value(const ParamTensor *t, uint64_t seed, size_t i);
/* The initial values of elements [first, first + count) of the table, into
 * host memory dst (count elements). */
void param_init_range(const ParamTable *t, uint64_t seed, float *dst, size_t first, size_t count);

/* ---- the shard layout of N = ranks (see the top of this file) ---- */
/* S: elements of each slice of unit `unit` (the unit padded to ranks * S). */
size_t shard_slice_numel(const ParamTable *t, int unit, int ranks);
/* Where that unit's slice starts in every rank's shard. */
size_t shard_unit_offset(const ParamTable *t, int unit, int ranks);
/* Elements of one rank's shard: the sum of the slices. */
size_t shard_numel(const ParamTable *t, int ranks);
/* The largest unit of units first_unit..last_unit (its numel), and the
 * largest slice S of them for N = ranks: the unit-sized working buffers of
 * mixed precision, ZeRO and the offload are this big. */
size_t table_largest_unit(const ParamTable *t, int first_unit, int last_unit);
size_t shard_largest_slice(const ParamTable *t, int first_unit, int last_unit, int ranks);
/* The elements rank's slice of unit `unit` holds, the rest being padding:
 * elements [*first, *first + *count) of the table (*count may be 0). */
void shard_slice_elements(const ParamTable *t, int unit, int rank, int ranks, size_t *first, size_t *count);
/* Host buffers: rank's shard (shard_numel elements) from a whole parameter-
 * shaped buffer (num_params elements), padding zeroed; and back, writing the
 * elements the shard holds into the whole buffer (the padding nowhere). */
void shard_from_whole(const ParamTable *t, int rank, int ranks, const float *whole, float *shard);
void shard_to_whole(const ParamTable *t, int rank, int ranks, const float *shard, float *whole);
/* The initial values of rank's shard, padding zeroed, without the whole model. */
void shard_init(const ParamTable *t, uint64_t seed, int rank, int ranks, float *shard);

#endif
