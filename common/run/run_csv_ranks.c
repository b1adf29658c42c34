/* run_csv_ranks.c: the CSVs of a job of many ranks (run_csv.h): the slowest
 * rank's times of a step, and memory.csv with every rank's peaks. */
#include "common/comm/comm.h" /* collectives and messages between ranks */
#include "common/run/run_csv.h" /* steps.csv, memory.csv, run.csv */
#include "common/device/device.h" /* mem_alloc, copies, streams, timers */
#include "common/core/util.h" /* fatal, log_info, exit codes, flag parsing */
#include "common/comm/watchdog.h" /* the flight recorder and --timeout */

#include <stdlib.h>

size_t memory_csv_write_ranks(CommGroup *world, const char *dir) {
    size_t peaks[SPACE_COUNT * CAT_COUNT];
    memory_peaks_local(peaks);
    if (comm_dry()) { /* a dry run's one rank: its own rows (harness.h) */
        memory_csv_write_from(dir, comm_rank(world), 1, peaks);
        return mem_peak_total(SPACE_DEVICE);
    }
    size_t *all_peaks = xcalloc((size_t)comm_size(world) * SPACE_COUNT * CAT_COUNT, sizeof(size_t));
    comm_gather_bytes(world, peaks, sizeof peaks, all_peaks, 0);
    if (comm_rank(world) == 0) memory_csv_write(dir, comm_size(world), all_peaks);
    free(all_peaks);
    return (size_t)comm_allreduce_double(world, (double)mem_peak_total(SPACE_DEVICE), 1);
}

void step_times_slowest(CommGroup *g, StepRecord *rec) {
    double times[5] = {rec->step_ms, rec->fwd_ms, rec->bwd_ms, rec->comm_ms, rec->opt_ms};
    comm_max_doubles(g, times, 5);
    watchdog_set_step(rec->step + 1); /* the flight recorder's step: the next one */
    rec->step_ms = times[0];
    rec->fwd_ms = times[1];
    rec->bwd_ms = times[2];
    rec->comm_ms = times[3];
    rec->opt_ms = times[4];
}
