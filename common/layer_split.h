/* layer_split.h: which blocks each stage of a layer split runs (chapters 03, 04).
 *
 * Stage s of S runs a contiguous run of blocks; stage 0 also holds the
 * embedding, the last stage the final layernorm and LM head. */
#ifndef LAYER_SPLIT_H
#define LAYER_SPLIT_H

#include "param_table.h"

/* Tags of the messages between neighbouring stages: activations go forward,
 * their gradients back; an exchange is a forward and a backward message in one
 * sendrecv (04's fused steps). */
enum { TAG_ACTIVATIONS = 1, TAG_GRADIENTS = 2, TAG_EXCHANGE = 3 };

/* The default split: contiguous runs of blocks such that the largest stage's
 * parameter count (the embedding counted with stage 0, the head with the
 * last) is as small as possible. blocks[s] = blocks of stage s. Needs
 * 1 <= stages <= layers <= MAX_LAYERS. */
void layer_split_balanced(const ParamTable *table, int stages, int *blocks);

/* --split "3,3": one positive number per stage, summing to `layers`; a bad
 * text ends the program with EXIT_USAGE naming the problem. */
void layer_split_parse(const char *text, int stages, int layers, int *blocks);

/* First and last block of `stage` given blocks[]. */
void layer_split_range(const int *blocks, int stage, int *first_block, int *last_block);

/* First and last unit (param_table.h) of `stage` of `stages` over `layers`
 * blocks: its blocks, with the embedding (LAYER_EMBEDDING) on stage 0 and the
 * head (unit `layers`) on the last stage. */
void layer_split_units(int first_block, int last_block, int stage, int stages, int layers, int *first_unit,
                       int *last_unit);

/* All of the above for one stage: the split of model m over `stages` (split:
 * --split's text, or "" to balance the parameters) into blocks[stages], and
 * `stage`'s blocks and units. */
void layer_split_stage(const ModelConfig *m, const char *split, int stages, int stage, int *blocks,
                       int *first_block, int *last_block, int *first_unit, int *last_unit);

#endif
