/* grid.c: see grid.h. */
#include "common/comm/grid.h" /* the process grid: dp x pp x cp x tp */

#include "common/core/util.h" /* fatal, log_info, exit codes, flag parsing */

#include <stdio.h>

static const char *const axis_names[GRID_AXES] = {"dp", "pp", "cp", "tp"};

static void shape_sizes(GridShape shape, int size[GRID_AXES]) {
    size[GRID_DP] = shape.dp;
    size[GRID_PP] = shape.pp;
    size[GRID_CP] = shape.cp;
    size[GRID_TP] = shape.tp;
}

const char *grid_problem(int world_size, GridShape shape) {
    static char message[200];
    int size[GRID_AXES];
    shape_sizes(shape, size);
    long ranks = 1;
    for (int a = 0; a < GRID_AXES; a++) {
        if (size[a] < 1) {
            snprintf(
                message, sizeof message,
                "the grid's %s axis has %d ranks (valid: every axis at least 1; dp %d, pp %d, cp %d, tp %d)",
                axis_names[a], size[a], shape.dp, shape.pp, shape.cp, shape.tp);
            return message;
        }
        ranks *= size[a];
    }
    if (ranks != world_size) {
        snprintf(message, sizeof message,
                 "dp %d x pp %d x cp %d x tp %d = %ld ranks, but the job has %d (valid: mpirun -np %ld)",
                 shape.dp, shape.pp, shape.cp, shape.tp, ranks, world_size, ranks);
        return message;
    }
    return NULL;
}

int grid_rank_of(const ProcessGrid *g, const int coord[GRID_AXES]) {
    int w = 0;
    for (int a = 0; a < GRID_AXES; a++) w += coord[a] * g->axis[a].stride;
    return w;
}

void grid_coords_of(const ProcessGrid *g, int world_rank, int coord[GRID_AXES]) {
    for (int a = 0; a < GRID_AXES; a++) coord[a] = world_rank / g->axis[a].stride % g->axis[a].size;
}

int grid_axis_peer(const GridAxis *axis, int offset) {
    int n = axis->size;
    return ((axis->coord + offset) % n + n) % n;
}

/* The splits below as functions of any world rank (comm_split_by): the
 * color is the world rank with the axis's coordinate (or, for the weight
 * group, the dp and cp coordinates) set to 0, the key that coordinate. */
typedef struct {
    const ProcessGrid *grid;
    int axis; /* GRID_AXES: the weight group */
} GridSplit;

static int coord_at(const ProcessGrid *g, int a, int world_rank) {
    return world_rank / g->axis[a].stride % g->axis[a].size;
}

static int grid_color(const void *ctx, int w, int *key) {
    const GridSplit *split = ctx;
    const ProcessGrid *g = split->grid;
    if (split->axis < GRID_AXES) {
        int coord = coord_at(g, split->axis, w);
        *key = coord;
        return w - coord * g->axis[split->axis].stride;
    }
    int d = coord_at(g, GRID_DP, w), c = coord_at(g, GRID_CP, w);
    *key = d * g->axis[GRID_CP].size + c;
    return w - d * g->axis[GRID_DP].stride - c * g->axis[GRID_CP].stride;
}

void grid_create(ProcessGrid *g, CommGroup *world, GridShape shape) {
    const char *problem = grid_problem(comm_size(world), shape);
    if (problem) fatal(EXIT_USAGE, "%s", problem);
    *g = (ProcessGrid){.world = world};
    int size[GRID_AXES];
    shape_sizes(shape, size);
    int w = comm_rank(world), stride = 1;
    for (int a = GRID_AXES - 1; a >= 0; a--) { /* tp first: the fastest axis has stride 1 */
        g->axis[a] = (GridAxis){.name = axis_names[a], .size = size[a], .stride = stride};
        g->axis[a].coord = w / stride % size[a];
        stride *= size[a];
    }
    /* comm_split_by: one group per color, ordered by key (grid_color). The
     * color is the world rank with this axis's coordinate set to 0, which
     * the members of one group share and no other group has. */
    for (int a = 0; a < GRID_AXES; a++) {
        GridAxis *x = &g->axis[a];
        x->group = comm_split_by(world, grid_color, &(GridSplit){g, a});
        comm_group_count_into(x->group, a); /* its bytes counted per axis too (comm.h's ledger) */
    }
    g->dp = size[GRID_DP], g->pp = size[GRID_PP], g->cp = size[GRID_CP], g->tp = size[GRID_TP];
    g->d = g->axis[GRID_DP].coord, g->p = g->axis[GRID_PP].coord;
    g->c = g->axis[GRID_CP].coord, g->t = g->axis[GRID_TP].coord;
    g->dp_group = g->axis[GRID_DP].group, g->pp_group = g->axis[GRID_PP].group;
    g->cp_group = g->axis[GRID_CP].group, g->tp_group = g->axis[GRID_TP].group;
    /* the same weights: every (d, c) of this (p, t); color as above, with both coordinates 0 */
    g->weight_group = comm_split_by(world, grid_color, &(GridSplit){g, GRID_AXES});
    comm_group_count_into(g->weight_group, GRID_DP); /* the gradient sum over the replicas (and cp) */
}

_Static_assert((int)GRID_COUNTERS <= (int)COMM_COUNTERS, "a counter of bytes per axis, and ep's (comm.h)");

void grid_destroy(ProcessGrid *g) {
    comm_group_free(g->weight_group);
    for (int a = GRID_AXES - 1; a >= 0; a--) comm_group_free(g->axis[a].group);
    *g = (ProcessGrid){0};
}
