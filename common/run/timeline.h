/* timeline.h: what each rank did when, for the Gantt charts of chapters 03-06.
 *
 * Every action of the schedule is recorded with its start and end, in
 * microseconds since the start of its step (all ranks start a step together,
 * after a barrier; on one machine their monotonic clocks agree). At the end
 * the ranks write, in turn, timeline.csv (rank,step,micro,op,start_us,end_us)
 * and rank 0 turns it into trace.json, a Chrome trace (one track per rank)
 * that Perfetto (ui.perfetto.dev) or chrome://tracing opens. A dry run
 * (--dry-run --rank R) is one rank of its world: its timeline.csv and
 * trace.json hold that rank's records alone. */
#ifndef TIMELINE_H
#define TIMELINE_H

#include "common/comm/comm.h" /* collectives and messages between ranks */

typedef struct {
    int step, micro;
    const char *op;
    double start_us, end_us;
} TimelineRecord;

typedef struct {
    TimelineRecord *records;
    int count, capacity;
} Timeline;

void timeline_add(Timeline *t, int step, int micro, const char *op, double start_us, double end_us);
/* All ranks of `world` call this; the file gets every rank's records. */
void timeline_write(const Timeline *t, CommGroup *world, const char *dir);
void timeline_free(Timeline *t);

#endif
