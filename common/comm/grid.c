/* grid.c: see grid.h. */
#include "grid.h"

#include <stdio.h>

const char *grid_problem(int world_size, int dp, int pp, int tp) {
    static char message[200];
    if (dp < 1 || pp < 1 || tp < 1) {
        snprintf(message, sizeof message,
                 "every axis of the grid needs at least one rank (dp %d, pp %d, tp %d)", dp, pp, tp);
        return message;
    }
    if ((long)dp * pp * tp != world_size) {
        snprintf(message, sizeof message,
                 "dp %d x pp %d x tp %d = %ld ranks, but the job has %d (valid: mpirun -np %ld)", dp, pp, tp,
                 (long)dp * pp * tp, world_size, (long)dp * pp * tp);
        return message;
    }
    return NULL;
}

int grid_rank_of(const ProcessGrid *g, int d, int p, int t) {
    return (d * g->pp + p) * g->tp + t;
}

void grid_create(ProcessGrid *g, CommGroup *world, int dp, int pp, int tp) {
    int w = comm_rank(world);
    *g = (ProcessGrid){.dp = dp, .pp = pp, .tp = tp, .world = world};
    g->t = w % tp;
    g->p = w / tp % pp;
    g->d = w / (tp * pp);
    /* comm_split(parent, color, key): one group per color, ordered by key */
    g->tp_group = comm_split(world, g->d * pp + g->p, g->t);
    g->pp_group = comm_split(world, g->d * tp + g->t, g->p);
    g->dp_group = comm_split(world, g->p * tp + g->t, g->d);
}

void grid_destroy(ProcessGrid *g) {
    comm_group_free(g->tp_group);
    comm_group_free(g->pp_group);
    comm_group_free(g->dp_group);
    *g = (ProcessGrid){0};
}
