/* grid.h: the process grid. Which part of the work each rank does, and the
 * groups it talks to.
 *
 * A job of world = dp x pp x cp x tp ranks is a grid with four axes:
 *   tp  tensor parallel: ranks that hold slices of the same layers (chapter 03)
 *   cp  context parallel: ranks that hold parts of the same sequences
 *       (ring attention: 03_model_parallel/context_parallel.h, --cp;
 *       chapters 03-06)
 *   pp  pipeline (or layer split): ranks that hold consecutive stages (03, 04)
 *   dp  data parallel: replicas of all of the above (02 on)
 * The axes are data: each is a GridAxis (name, size, this rank's coordinate,
 * its group), so code that walks "every axis" needs no case per axis, and a
 * fifth axis (experts, say) is one more entry in GridAxisId.
 *
 * Rank order: tp varies fastest, then cp, then pp, then dp. The ranks that
 * talk most are neighbours, which on a real cluster means the same machine:
 * tp all-reduces inside every layer; cp passes keys and values round a ring
 * inside every attention; pp sends one activation per micro-batch and stage;
 * dp all-reduces once per step, and can cross the slowest links. (Picotron's
 * process-group manager and Megatron's parallel_state use the same order.)
 *
 *     world rank w = ((d * pp + p) * cp + c) * tp + t
 *
 *     dp=2, pp=2, tp=2 (cp=1):  d=0: p=0 [w0 w1]  p=1 [w2 w3]
 *                               d=1: p=0 [w4 w5]  p=1 [w6 w7]
 *     tp group of w0: {w0, w1}  pp group of w0: {w0, w2}  dp group of w0: {w0, w4}
 *
 * In general w = sum over the axes of coordinate x stride, where tp's stride
 * is 1 and each slower axis's stride is the faster one's stride x size.
 * An axis's group is the ranks that differ from this one in that coordinate
 * only, ordered by it: rank t of the tp group, stage p of the pp group,
 * replica d of the dp group. So "the next stage" is rank p + 1 of the pp
 * group, and a ring over an axis (grid_axis_peer) wraps at its size. */
#ifndef GRID_H
#define GRID_H

#include "common/comm/comm.h" /* collectives and messages between ranks */

/* The axes, slowest-varying first (see the rank order above). */
typedef enum { GRID_DP, GRID_PP, GRID_CP, GRID_TP, GRID_AXES } GridAxisId;
/* The axes' names ("dp", ...), as run.csv's columns and dry-comm.csv say them; inline, so that
 * the planner, which links no MPI, reads them from here too. */
static inline const char *grid_axis_name(GridAxisId a) {
    static const char *const names[GRID_AXES] = {"dp", "pp", "cp", "tp"};
    return a >= 0 && a < GRID_AXES ? names[a] : "?";
}
/* The byte counters a run reports (run.csv's bytes_AXIS_per_step): the four
 * axes, then "ep", expert parallelism's all-to-alls. Its group is not an axis
 * of the grid but a part of the dp axis (03_model_parallel/expert_parallel.h:
 * replicas gN .. gN+N-1), counted apart because its bytes are not the
 * gradients' sum. */
enum { GRID_COUNTER_EP = GRID_AXES, GRID_COUNTERS };
static inline const char *grid_counter_name(int c) {
    return c == GRID_COUNTER_EP ? "ep" : grid_axis_name((GridAxisId)c);
}

typedef struct {
    const char *name; /* "dp", "pp", "cp", "tp" */
    int size;         /* ranks along the axis */
    int coord;        /* this rank's coordinate: 0 .. size-1, its rank in group */
    int stride;       /* world-rank distance between neighbours on the axis */
    CommGroup *group; /* the ranks that differ from this one on this axis only */
} GridAxis;

/* How many ranks each axis has; world = dp x pp x cp x tp. */
typedef struct {
    int dp, pp, cp, tp;
} GridShape;

typedef struct {
    GridAxis axis[GRID_AXES];
    CommGroup *world;
    /* Shortcuts, copies of axis[]: sizes, this rank's coordinates, groups */
    int dp, pp, cp, tp;
    int d, p, c, t;
    CommGroup *dp_group; /* same (p, c, t), every d: the replicas of this rank's part */
    CommGroup *pp_group; /* same (d, c, t), every p: this replica's stages */
    CommGroup *cp_group; /* same (d, p, t), every c: the ranks sharing these sequences */
    CommGroup *tp_group; /* same (d, p, c), every t: this stage's slices */
    /* same (p, t), every (d, c): the ranks holding the same weights, whose
     * gradients are summed (cp ranks see other tokens of the same sequences,
     * as dp replicas see other sequences); rank d x cp + c. With cp 1, the dp group's ranks.
     * Its bytes count as the dp axis's (comm.h's ledger): the replicas' gradient sum. */
    CommGroup *weight_group;
} ProcessGrid;

/* Why `shape` cannot be laid over a world of world_size ranks, as one
 * message with the valid range; NULL when it can. */
const char *grid_problem(int world_size, GridShape shape);
/* Build the grid over world (collective over world; call grid_problem first:
 * a shape it refuses ends the program). */
void grid_create(ProcessGrid *g, CommGroup *world, GridShape shape);
/* An axis's name: "dp", "pp", "cp", "tp". */
/* Free the groups (collective over world, before comm_finalize). */
void grid_destroy(ProcessGrid *g);
/* World rank of coordinates coord[GRID_AXES], and back. */
int grid_rank_of(const ProcessGrid *g, const int coord[GRID_AXES]);
void grid_coords_of(const ProcessGrid *g, int world_rank, int coord[GRID_AXES]);
/* The rank in axis->group `offset` steps from this one round the axis's
 * ring: offset +1 the next, -1 the previous, wrapping at the ends. */
int grid_axis_peer(const GridAxis *axis, int offset);

#endif
