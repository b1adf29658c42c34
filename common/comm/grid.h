/* grid.h: the process grid. Which part of the work each rank does, and the
 * groups it talks to.
 *
 * A job of world = dp x pp x tp ranks is a grid with three axes:
 *   tp  tensor parallel: ranks that hold slices of the same layers (chapter 03)
 *   pp  pipeline (or layer split): ranks that hold consecutive stages (03, 04)
 *   dp  data parallel: replicas of all of the above (02 on)
 * Rank order: tp varies fastest, then pp, then dp, so the ranks that talk
 * most (tp, every layer) are neighbours, which on a real cluster means the
 * same machine:
 *
 *     world rank w = (d * pp + p) * tp + t
 *
 *     dp=2, pp=2, tp=2:   d=0: p=0 [w0 w1]  p=1 [w2 w3]
 *                         d=1: p=0 [w4 w5]  p=1 [w6 w7]
 *     tp group of w0: {w0, w1}  pp group of w0: {w0, w2}  dp group of w0: {w0, w4}
 *
 * Each group is ordered by the coordinate of its axis: rank t of the tp
 * group, stage p of the pp group, replica d of the dp group. (Picotron's
 * process-group manager and Megatron's parallel_state do the same.) */
#ifndef GRID_H
#define GRID_H

#include "comm.h"

typedef struct {
    int dp, pp, tp; /* the axes' sizes: world = dp x pp x tp */
    int d, p, t;    /* this rank's coordinates */
    CommGroup *world;
    CommGroup *dp_group; /* same (p, t), every d: the replicas of this rank's part */
    CommGroup *pp_group; /* same (d, t), every p: this replica's stages */
    CommGroup *tp_group; /* same (d, p), every t: this stage's slices */
} ProcessGrid;

/* Why dp x pp x tp cannot be laid over a world of world_size ranks, as a
 * message with the valid range; NULL when it can. */
const char *grid_problem(int world_size, int dp, int pp, int tp);
/* Build the grid over world (collective over world; call grid_problem first). */
void grid_create(ProcessGrid *g, CommGroup *world, int dp, int pp, int tp);
/* Free the groups (collective over world, before comm_finalize). */
void grid_destroy(ProcessGrid *g);
/* World rank of coordinates (d, p, t). */
int grid_rank_of(const ProcessGrid *g, int d, int p, int t);

#endif
