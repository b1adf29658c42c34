/* layer_split.h: which blocks each stage of a layer split runs (chapters 03, 04).
 *
 * Stage s of S runs a contiguous run of blocks; stage 0 also holds the
 * embedding, the last stage the final layernorm and LM head.
 *
 * Chunks. A stage may hold V chunks of layers instead of one (the
 * interleaved schedules of Megatron: each stage runs a micro-batch V times,
 * on a different part of the model each time). The model is then cut into
 * S x V pieces, in order, and piece v is chunk v / S of stage v % S: the
 * pieces go round the stages V times.
 *
 *     S = 2, V = 2, 8 blocks:  piece 0 = stage 0 chunk 0   blocks 0-1 (+ embedding)
 *                              piece 1 = stage 1 chunk 0   blocks 2-3
 *                              piece 2 = stage 0 chunk 1   blocks 4-5
 *                              piece 3 = stage 1 chunk 1   blocks 6-7 (+ head)
 *
 * The functions below that take a stage and a number of stages take a piece
 * and the number of pieces just as well (layer_split_balanced(table, S * V,
 * blocks) cuts the pieces; blocks[] has one entry per piece). With V = 1 a
 * piece is a stage, and everything is the split of one range per stage.
 *
 * A stage is its coordinate on the grid's pp axis, which is its rank in the
 * pp group (grid.h): the neighbours below are the ranks to send to. */
#ifndef LAYER_SPLIT_H
#define LAYER_SPLIT_H

#include "common/model/param_table.h" /* the parameter table and its units */

/* Tags of the messages between neighbouring stages: activations go forward,
 * their gradients back; an exchange is a forward and a backward message in one
 * sendrecv (04's fused steps). */
enum { TAG_ACTIVATIONS = 1, TAG_GRADIENTS = 2, TAG_EXCHANGE = 3 };

/* The default split: contiguous runs of blocks such that the largest stage's
 * parameter count (the embedding counted with stage 0, the head with the
 * last) is as small as possible. blocks[s] = blocks of stage s. Needs
 * 1 <= stages <= layers <= MAX_LAYERS. */
void layer_split_balanced(const ParamTable *table, int stages, int *blocks);
/* --split flops: the same partition of the forward FLOPs a token instead, the cost a stage's
 * time follows (layer_split_unit_flops: a block's matmuls 24C^2 and attention 4TC, the head's
 * matmul 2CV over the padded vocabulary, the embedding's lookup none; the backward is twice the
 * forward everywhere, so it splits alike). The parameters weigh the embedding as much as the
 * head and the attention not at all: with GPT-2's vocabulary the last stage, holding the head,
 * is the slow one (Megatron's option to count the embedding and head as layers answers the same). */
double layer_split_unit_flops(const ModelConfig *m, int unit);
void layer_split_balanced_flops(const ModelConfig *m, int stages, int *blocks);
int layer_split_by_flops(const char *split); /* --split flops */

/* --split "3,3": one positive number per stage, summing to `layers`; a bad
 * text ends the program with EXIT_USAGE naming the problem. */
void layer_split_parse(const char *text, int stages, int layers, int *blocks);
/* The same for `chunks` chunks per stage (--virtual): one number per piece,
 * stages x chunks of them in the model's order (above), the refusal saying so. */
void layer_split_parse_chunks(const char *text, int stages, int chunks, int layers, int *blocks);
/* NULL when `stages` stages of `chunks` chunks each can each hold a block of
 * `layers`, else the refusal (--pp, --virtual) with the valid range; the
 * programs of 04-06 and common/plan both ask it. Static text, valid until
 * the next call. */
const char *layer_split_pieces_problem(int stages, int chunks, int layers);

/* First and last block of `stage` given blocks[]. */
void layer_split_range(const int *blocks, int stage, int *first_block, int *last_block);

/* First and last unit (param_table.h) of `stage` of `stages` over `layers`
 * blocks: its blocks, with the embedding (LAYER_EMBEDDING) on stage 0 and the
 * head (unit `layers`) on the last stage. */
void layer_split_units(int first_block, int last_block, int stage, int stages, int layers, int *first_unit,
                       int *last_unit);

/* Where a piece of the model sits: chunk `chunk` of stage `stage`. */
typedef struct {
    int stage; /* the rank in the pp group; -1: no such piece (past either end of the model) */
    int chunk;
} StageChunk;

/* Piece index of `at` when there are `stages` stages: chunk x stages + stage. */
int layer_split_piece(StageChunk at, int stages);
/* First and last block of chunk at.chunk of stage at.stage, blocks[] holding
 * one entry per piece; with one chunk per stage, layer_split_range. */
void layer_split_chunk_range(const int *blocks, int stages, StageChunk at, int *first_block, int *last_block);
/* The piece after `at` (its activations go there): the same chunk on the
 * next rank of the pp ring, or, from the last stage, the next chunk on stage
 * 0. layer_split_prev: the piece before (its gradients go there), the
 * previous rank, or from stage 0 the previous chunk on the last stage.
 * {-1, -1} past either end of the model (V = 1: after the last stage,
 * before the first). */
StageChunk layer_split_next(StageChunk at, int stages, int chunks);
StageChunk layer_split_prev(StageChunk at, int stages, int chunks);

/* All of the above for one stage: the split of model m over `stages` (split:
 * --split's text, or "" to balance the parameters) into blocks[stages], and
 * `stage`'s blocks and units. */
void layer_split_stage(const ModelConfig *m, const char *split, int stages, int stage, int *blocks,
                       int *first_block, int *last_block, int *first_unit, int *last_unit);

#endif
