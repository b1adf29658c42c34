/* timeline.c: see timeline.h. */
#include "common/run/timeline.h" /* timeline.csv for the Gantt charts */

#include "common/run/run_dir.h" /* the --out directory and its files */
#include "common/core/util.h" /* fatal, log_info, exit codes, flag parsing */

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void timeline_add(Timeline *t, int step, int micro, const char *op, double start_us, double end_us) {
    if (t->count == t->capacity) {
        t->capacity = t->capacity ? 2 * t->capacity : 1024;
        TimelineRecord *grown = realloc(t->records, t->capacity * sizeof(TimelineRecord));
        if (!grown) fatal(EXIT_RUNTIME, "out of host memory for the timeline");
        t->records = grown;
    }
    t->records[t->count++] = (TimelineRecord){step, micro, op, start_us, end_us};
}

void timeline_write(const Timeline *t, CommGroup *world, const char *dir) {
    int rank = comm_rank(world), ranks = comm_size(world);
    int alone = comm_dry(); /* a dry run is one rank of its world: the file holds its records only */
    /* the ranks take turns appending to one file */
    for (int r = 0; r < ranks; r++) {
        if (r == rank) {
            OutFile *f = out_open(dir, "timeline.csv", OUT_WHOLE_PART, r > 0 && !alone);
            if (r == 0 || alone) out_printf(f, "rank,step,micro,op,start_us,end_us\n");
            for (int i = 0; i < t->count; i++) {
                const TimelineRecord *e = &t->records[i];
                out_printf(f, "%d,%d,%d,%s,%.1f,%.1f\n", rank, e->step, e->micro, e->op, e->start_us,
                           e->end_us);
            }
            out_close(f);
        }
        comm_barrier(world);
    }
    if (rank != 0 && !alone) return;
    /* trace.json from timeline.csv: one complete event ("ph": "X") per action.
     * Steps (1-based) are laid one after another, 10 ms apart. */
    enum { MAX_STEPS = 4096 };
    static double duration[MAX_STEPS], offset[MAX_STEPS];
    memset(duration, 0, sizeof duration);
    FILE *in = fopen(out_part_path(dir, "timeline.csv"), "r");
    char line[256];
    if (!in || !fgets(line, sizeof line, in))
        fatal(EXIT_RUNTIME, "--out %s: reading back timeline.csv.tmp failed (%s)", dir,
              in ? "it is empty" : strerror(errno));
    OutFile *out = out_open(dir, "trace.json", OUT_WHOLE, 0);
    long data_start = ftell(in);
    int r, step, micro;
    char op[32];
    double start, end;
    while (fgets(line, sizeof line, in))
        if (sscanf(line, "%d,%d,%d,%31[^,],%lf,%lf", &r, &step, &micro, op, &start, &end) == 6 && step > 0 &&
            step < MAX_STEPS && end > duration[step])
            duration[step] = end;
    offset[1] = 0.0;
    for (int k = 2; k < MAX_STEPS; k++) offset[k] = offset[k - 1] + duration[k - 1] + 10000.0;
    fseek(in, data_start, SEEK_SET);
    out_printf(out, "{\"traceEvents\": [\n");
    int first = 1;
    while (fgets(line, sizeof line, in)) {
        if (sscanf(line, "%d,%d,%d,%31[^,],%lf,%lf", &r, &step, &micro, op, &start, &end) != 6) continue;
        double shift = step > 0 && step < MAX_STEPS ? offset[step] : 0.0;
        out_printf(
            out,
            "%s{\"name\": \"%s %d\", \"cat\": \"%s\", \"ph\": \"X\", \"pid\": 0, \"tid\": %d, \"ts\": %.1f, "
            "\"dur\": %.1f, \"args\": {\"step\": %d, \"micro\": %d}}",
            first ? "" : ",\n", op, micro, op, r, shift + start, end - start, step, micro);
        first = 0;
    }
    for (int rr = 0; rr < ranks; rr++)
        out_printf(
            out,
            "%s{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": 0, \"tid\": %d, \"args\": {\"name\": "
            "\"rank %d\"}}",
            first && rr == 0 ? "" : ",\n", rr, rr);
    out_printf(out, "\n], \"displayTimeUnit\": \"ms\"}\n");
    fclose(in);
    out_close(out);
    out_publish(dir, "timeline.csv");
}

void timeline_free(Timeline *t) {
    free(t->records);
    memset(t, 0, sizeof *t);
}
