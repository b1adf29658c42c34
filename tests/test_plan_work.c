/* test_plan_work.c: common/plan's time from dry runs (common/tools/plan_work.h), on files.
 *
 *   test_plan_work MACHINE STAGES CHUNKS MICRO LAYER_SPLIT DIR...
 *
 * DIR... are dry runs' --out directories, one per stage of a pipeline
 * (STAGES of them; 1 without one), each holding dry-work.csv; LAYER_SPLIT 1
 * for 03's layer split, 0 for a schedule. Prints, for each DIR as "the rank",
 * its parts in seconds on MACHINE, one line each:
 *   rank R compute_s X backward_s X update_s X host_update_s X pipeline_s X bubble_s X flops X
 * tests/tools/plan_work.bats checks them against the files and the measured steps. */
#include "common/tools/plan_machine.h" /* machine files */
#include "common/tools/plan_work.h" /* the step time from counted work */
#include "common/core/util.h" /* fatal, log_info, exit codes, flag parsing */

#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv) {
    if (argc < 7) {
        fprintf(stderr, "usage: test_plan_work MACHINE STAGES CHUNKS MICRO LAYER_SPLIT DIR...\n");
        return EXIT_USAGE;
    }
    Machine m;
    machine_read(argv[1], &m);
    PlanPipeline p = {atoi(argv[2]), atoi(argv[3]), atoi(argv[4]), atoi(argv[5])};
    int dirs = argc - 6;
    if (p.stages < 1 || p.chunks < 1 || p.micro < 1 || (p.stages > 1 && dirs != p.stages)) {
        fprintf(stderr, "test_plan_work: %d stages, %d chunks, %d micro-batches, %d directories\n", p.stages,
                p.chunks, p.micro, dirs);
        return EXIT_USAGE;
    }
    PlanWork *work = xcalloc(dirs, sizeof *work);
    for (int d = 0; d < dirs; d++) {
        char path[4096];
        snprintf(path, sizeof path, "%s/dry-work.csv", argv[6 + d]);
        plan_work_read(path, &work[d]);
    }
    for (int d = 0; d < dirs; d++) {
        WorkTime t;
        plan_work_time(&work[d], p.stages > 1 ? work : NULL, &p, &m, &t);
        printf("rank %d compute_s %.9g backward_s %.9g update_s %.9g host_update_s %.9g pipeline_s %.9g "
               "bubble_s %.9g flops %.9g\n",
               d, t.compute_s, t.backward_s, t.update_s, t.host_update_s, t.pipeline_s, t.bubble_s, t.flops);
    }
    for (int d = 0; d < dirs; d++) plan_work_free(&work[d]);
    free(work);
    return 0;
}
