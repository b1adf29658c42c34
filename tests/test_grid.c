/* test_grid.c: the process grid (common/comm/grid.c) against its formula.
 *
 * Run under mpirun; for every way of writing the world size as
 * dp x pp x tp, build the grid and check on every rank: the coordinates give
 * back the world rank, each group has its axis's size, and member i of each
 * group is the world rank the formula names (gathered through the group).
 * Exit 0 when every check passes on every rank. */
#include "comm.h"
#include "grid.h"
#include "util.h"

#include <stdio.h>
#include <stdlib.h>

static int failures = 0;

static void expect(int ok, const char *what, int dp, int pp, int tp, int got, int want) {
    if (ok) return;
    failures++;
    fprintf(stderr, "FAIL [rank %d] dp %d pp %d tp %d: %s is %d, expected %d\n", comm_rank(comm_world()), dp,
            pp, tp, what, got, want);
}

/* Member i of group is world rank members(i): check them all. */
static void check_group(const ProcessGrid *g, CommGroup *group, int size, const char *axis) {
    int me = comm_rank(g->world);
    int *all = xcalloc(size, sizeof(int));
    comm_gather_bytes(group, &me, sizeof me, all, 0);
    if (comm_rank(group) == 0) {
        for (int i = 0; i < size; i++) {
            int d = g->d, p = g->p, t = g->t;
            if (axis[0] == 'd') d = i;
            if (axis[0] == 'p') p = i;
            if (axis[0] == 't') t = i;
            expect(all[i] == grid_rank_of(g, d, p, t), axis, g->dp, g->pp, g->tp, all[i],
                   grid_rank_of(g, d, p, t));
        }
    }
    free(all);
}

int main(int argc, char **argv) {
    comm_init(&argc, &argv);
    CommGroup *world = comm_world();
    int n = comm_size(world), w = comm_rank(world);
    int layouts = 0;
    for (int dp = 1; dp <= n; dp++)
        for (int pp = 1; pp <= n; pp++)
            for (int tp = 1; tp <= n; tp++) {
                if (grid_problem(n, dp, pp, tp)) continue;
                ProcessGrid g;
                grid_create(&g, world, dp, pp, tp);
                expect(grid_rank_of(&g, g.d, g.p, g.t) == w, "rank of own coordinates", dp, pp, tp,
                       grid_rank_of(&g, g.d, g.p, g.t), w);
                expect(comm_size(g.dp_group) == dp, "dp group size", dp, pp, tp, comm_size(g.dp_group), dp);
                expect(comm_size(g.pp_group) == pp, "pp group size", dp, pp, tp, comm_size(g.pp_group), pp);
                expect(comm_size(g.tp_group) == tp, "tp group size", dp, pp, tp, comm_size(g.tp_group), tp);
                expect(comm_rank(g.pp_group) == g.p, "rank in pp group", dp, pp, tp, comm_rank(g.pp_group),
                       g.p);
                check_group(&g, g.dp_group, dp, "dp");
                check_group(&g, g.pp_group, pp, "pp");
                check_group(&g, g.tp_group, tp, "tp");
                grid_destroy(&g);
                layouts++;
            }
    expect(grid_problem(n, 1, 1, n + 1) != NULL, "a grid larger than the world refused", 1, 1, n + 1, 0, 1);
    int bad = (int)comm_allreduce_double(world, failures, 0);
    if (w == 0) printf("grid: %d layouts of %d ranks, %d failures\n", layouts, n, bad);
    comm_finalize();
    return bad ? 1 : 0;
}
