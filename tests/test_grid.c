/* test_grid.c: the process grid (common/comm/grid.c) against its formula.
 *
 *   test_grid                        every layout of the world, checked (under mpirun)
 *   test_grid --problem DP PP CP TP  print grid_problem's answer for this world
 *
 * For every way of writing the world size as dp x pp x cp x tp (cp > 1
 * included, though no chapter uses it yet, and odd sizes such as 3), build
 * the grid and check on every rank: its coordinates are the ones the formula
 * w = ((d pp + p) cp + c) tp + t gives (written out here, not taken from
 * grid.c); grid_rank_of and grid_coords_of go there and back for every rank
 * of the world; each group has its axis's size and this rank at its
 * coordinate; member i of each group is the world rank with that axis's
 * coordinate set to i (gathered through the group); and grid_axis_peer's
 * next and previous ranks wrap round the axis. Exit 0 when every check
 * passes on every rank. */
#include "common/comm/comm.h" /* collectives and messages between ranks */
#include "common/comm/grid.h" /* the process grid: dp x pp x cp x tp */
#include "common/core/util.h" /* fatal, log_info, exit codes, flag parsing */

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int failures = 0;

static void expect(int ok, const ProcessGrid *g, const char *what, int got, int want) {
    if (ok) return;
    failures++;
    fprintf(stderr, "FAIL [rank %d] dp %d pp %d cp %d tp %d: %s is %d, expected %d\n",
            comm_rank(comm_world()), g->dp, g->pp, g->cp, g->tp, what, got, want);
}

/* The rank order written out, independently of grid.c's strides. */
static int formula_rank(const ProcessGrid *g, int d, int p, int c, int t) {
    return ((d * g->pp + p) * g->cp + c) * g->tp + t;
}

/* Member i of axis a's group is the world rank with coordinate a set to i. */
static void check_group(const ProcessGrid *g, int a) {
    const GridAxis *x = &g->axis[a];
    int me = comm_rank(g->world);
    expect(comm_size(x->group) == x->size, g, "group size", comm_size(x->group), x->size);
    expect(comm_rank(x->group) == x->coord, g, "rank in its group", comm_rank(x->group), x->coord);
    int *all = xcalloc(x->size, sizeof(int));
    comm_gather_bytes(x->group, &me, sizeof me, all, 0);
    if (comm_rank(x->group) == 0) {
        for (int i = 0; i < x->size; i++) {
            int coord[GRID_AXES] = {g->d, g->p, g->c, g->t};
            coord[a] = i;
            int want = formula_rank(g, coord[GRID_DP], coord[GRID_PP], coord[GRID_CP], coord[GRID_TP]);
            expect(all[i] == want, g, x->name, all[i], want);
        }
    }
    free(all);
    /* the ring: next and previous wrap at the ends, and undo each other */
    int next = grid_axis_peer(x, +1), prev = grid_axis_peer(x, -1);
    expect(next == (x->coord + 1) % x->size, g, "next on the ring", next, (x->coord + 1) % x->size);
    expect(prev == (x->coord + x->size - 1) % x->size, g, "previous on the ring", prev,
           (x->coord + x->size - 1) % x->size);
    expect(grid_axis_peer(x, x->size) == x->coord, g, "a whole turn of the ring", grid_axis_peer(x, x->size),
           x->coord);
}

static void check_layout(CommGroup *world, GridShape shape) {
    int n = comm_size(world), w = comm_rank(world);
    ProcessGrid g;
    grid_create(&g, world, shape);
    static const char *names[GRID_AXES] = {"dp", "pp", "cp", "tp"};
    int sizes[GRID_AXES] = {shape.dp, shape.pp, shape.cp, shape.tp};
    int coords[GRID_AXES] = {g.d, g.p, g.c, g.t};
    for (int a = 0; a < GRID_AXES; a++) {
        expect(strcmp(g.axis[a].name, names[a]) == 0, &g, names[a], 0, 1);
        expect(g.axis[a].size == sizes[a], &g, "axis size", g.axis[a].size, sizes[a]);
        expect(g.axis[a].coord == coords[a], &g, "shortcut coordinate", coords[a], g.axis[a].coord);
        expect(g.axis[a].coord >= 0 && g.axis[a].coord < sizes[a], &g, "coordinate in range", g.axis[a].coord,
               0);
    }
    expect(formula_rank(&g, g.d, g.p, g.c, g.t) == w, &g, "formula rank of own coordinates",
           formula_rank(&g, g.d, g.p, g.c, g.t), w);
    expect(grid_rank_of(&g, coords) == w, &g, "grid_rank_of own coordinates", grid_rank_of(&g, coords), w);
    for (int r = 0; r < n; r++) { /* every rank of the world, there and back */
        int c[GRID_AXES];
        grid_coords_of(&g, r, c);
        expect(grid_rank_of(&g, c) == r, &g, "grid_rank_of(grid_coords_of(r))", grid_rank_of(&g, c), r);
        expect(formula_rank(&g, c[GRID_DP], c[GRID_PP], c[GRID_CP], c[GRID_TP]) == r, &g,
               "formula rank of grid_coords_of(r)", formula_rank(&g, c[0], c[1], c[2], c[3]), r);
    }
    for (int a = 0; a < GRID_AXES; a++) check_group(&g, a);
    expect(g.dp_group == g.axis[GRID_DP].group && g.pp_group == g.axis[GRID_PP].group &&
               g.cp_group == g.axis[GRID_CP].group && g.tp_group == g.axis[GRID_TP].group,
           &g, "shortcut groups are the axes' groups", 0, 1);
    grid_destroy(&g);
}

int main(int argc, char **argv) {
    comm_init(&argc, &argv);
    CommGroup *world = comm_world();
    int n = comm_size(world), w = comm_rank(world);
    if (argc == 6 && strcmp(argv[1], "--problem") == 0) {
        GridShape shape = {atoi(argv[2]), atoi(argv[3]), atoi(argv[4]), atoi(argv[5])};
        const char *problem = grid_problem(n, shape);
        if (w == 0) printf("%s\n", problem ? problem : "fits");
        comm_finalize();
        return 0;
    }
    int layouts = 0;
    for (int dp = 1; dp <= n; dp++)
        for (int pp = 1; pp <= n; pp++)
            for (int cp = 1; cp <= n; cp++)
                for (int tp = 1; tp <= n; tp++) {
                    GridShape shape = {.dp = dp, .pp = pp, .cp = cp, .tp = tp};
                    if (grid_problem(n, shape)) continue;
                    check_layout(world, shape);
                    layouts++;
                }
    ProcessGrid none = {.dp = 1, .pp = 1, .cp = 1, .tp = n + 1};
    expect(grid_problem(n, (GridShape){1, 1, 1, n + 1}) != NULL, &none,
           "a grid larger than the world refused", 0, 1);
    expect(grid_problem(n, (GridShape){n, 1, 0, 1}) != NULL, &none, "an axis of 0 ranks refused", 0, 1);
    int bad = (int)comm_allreduce_double(world, failures, 0);
    if (w == 0) printf("grid: %d layouts of %d ranks, %d failures\n", layouts, n, bad);
    comm_finalize();
    return bad ? 1 : 0;
}
