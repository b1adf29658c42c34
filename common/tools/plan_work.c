/* plan_work.c: see plan_work.h. The reader of dry-work.csv, then the parts. */
#include "common/tools/plan_work.h" /* the step time from counted work */

#include "common/model/schedule_sim.h" /* a pipeline schedule replayed in time */
#include "common/core/util.h" /* fatal, log_info, exit codes, flag parsing */

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static const char *const HEADER = "order,action,micro,micro2,chunk,flops,matmul_flops,bytes,adam_params";

void plan_work_read(const char *path, PlanWork *w) {
    *w = (PlanWork){0};
    struct stat st;
    if (stat(path, &st) != 0) fatal(EXIT_USAGE, "%s: cannot read it (%s)", path, strerror(errno));
    if (!S_ISREG(st.st_mode)) fatal(EXIT_USAGE, "%s: not a regular file (valid: a dry run's dry-work.csv)", path);
    FILE *f = fopen(path, "r");
    if (!f) fatal(EXIT_USAGE, "%s: cannot read it (%s)", path, strerror(errno));
    char *line = NULL;
    size_t capacity = 0;
    int capacity_rows = 0;
    for (int number = 1; getline(&line, &capacity, f) >= 0; number++) {
        line[strcspn(line, "\r\n")] = 0;
        if (number == 1) {
            if (strcmp(line, HEADER) != 0)
                fatal(EXIT_USAGE, "%s:1: header '%.80s' (valid: %s, a dry run's dry-work.csv)", path, line, HEADER);
            continue;
        }
        if (w->count == capacity_rows) {
            capacity_rows = capacity_rows ? 2 * capacity_rows : 64;
            w->rows = realloc(w->rows, (size_t)capacity_rows * sizeof *w->rows);
            if (!w->rows) fatal(EXIT_RUNTIME, "%s: out of memory for %d rows", path, capacity_rows);
        }
        WorkPiece *p = &w->rows[w->count];
        *p = (WorkPiece){0};
        int order, used = 0;
        char action[WORK_ACTION_CHARS];
        if (sscanf(line, "%d,%23[a-z_],%d,%d,%d,%lf,%lf,%lf,%lf%n", &order, action, &p->micro, &p->micro2,
                   &p->chunk, &p->flops, &p->matmul_flops, &p->bytes, &p->adam_params, &used) != 9 ||
            line[used] || order != w->count || p->micro < 0 || p->micro2 < -1 || p->chunk < 0 || p->flops < 0 ||
            p->matmul_flops < 0 || p->bytes < 0 || p->adam_params < 0)
            fatal(EXIT_USAGE, "%s:%d: '%.80s' is not a row of %s (order %d next, counts >= 0)", path, number, line,
                  HEADER, w->count);
        snprintf(p->action, sizeof p->action, "%s", action);
        w->count++;
    }
    free(line);
    fclose(f);
    if (w->count == 0) fatal(EXIT_USAGE, "%s: no rows (valid: a dry run's dry-work.csv)", path);
}

void plan_work_free(PlanWork *w) {
    free(w->rows);
    *w = (PlanWork){0};
}

double plan_work_flops(const PlanWork *w) {
    double flops = 0;
    for (int i = 0; i < w->count; i++) flops += w->rows[i].flops;
    return flops;
}

/* The schedule's kind of a piece (schedule_sim.h's names), or -1 for the others (other, update, ...). */
static int piece_kind(const WorkPiece *p) {
    return schedule_op_parse(p->action);
}

static int is_compute_kind(int k) {
    return k == OP_FORWARD || k == OP_BACKWARD || k == OP_BACKWARD_INPUT || k == OP_BACKWARD_WEIGHT;
}

/* The seconds of a rank's computing pieces. */
static double computing_s(const PlanWork *w, const Machine *m) {
    double s = 0;
    for (int i = 0; i < w->count; i++)
        if (is_compute_kind(piece_kind(&w->rows[i]))) s += w->rows[i].flops / m->flops;
    return s;
}

/* The replayed span of the stages' lists of actions, as their dry runs ran them. */
static double replay_s(const PlanWork *stages, const PlanPipeline *p, const Machine *m) {
    int P = p->stages;
    StageSchedule *lists = xcalloc(P, sizeof *lists);
    double **action_s = xcalloc(P, sizeof *action_s);
    for (int s = 0; s < P; s++) {
        lists[s].actions = xcalloc(stages[s].count, sizeof(Action));
        action_s[s] = xcalloc(stages[s].count, sizeof(double));
        for (int i = 0; i < stages[s].count; i++) {
            const WorkPiece *w = &stages[s].rows[i];
            int kind = piece_kind(w);
            if (kind < 0) continue; /* work outside the schedule's actions */
            action_s[s][lists[s].count] = is_compute_kind(kind) ? w->flops / m->flops : 0.0;
            lists[s].actions[lists[s].count++] = (Action){(OpKind)kind, w->micro, w->micro2, w->chunk};
        }
        lists[s].capacity = stages[s].count;
    }
    ScheduleReport r;
    schedule_replay_lists(lists, P, p->chunks, p->micro, (const double *const *)action_s, &r);
    if (r.deadlock || r.invalid)
        fatal(EXIT_USAGE, "plan: the stages' dry-work.csv lists, replayed, %s: %s",
              r.deadlock ? "deadlock" : "are not a schedule", r.where);
    for (int s = 0; s < P; s++) {
        free(lists[s].actions);
        free(action_s[s]);
    }
    free(lists);
    free(action_s);
    return r.makespan;
}

void plan_work_time(const PlanWork *mine, const PlanWork *stages, const PlanPipeline *p, const Machine *m,
                    WorkTime *out) {
    *out = (WorkTime){0};
    for (int i = 0; i < mine->count; i++) {
        const WorkPiece *w = &mine->rows[i];
        int kind = piece_kind(w), host = strcmp(w->action, "host_update") == 0;
        out->flops += w->flops;
        if (host) {
            out->host_update_s += w->adam_params / m->cpu_adam_params_per_s;
            continue;
        }
        out->update_s += w->adam_params / m->device_adam_params_per_s;
        if (strcmp(w->action, "update") == 0)
            out->update_s += w->flops / m->flops;
        else
            out->compute_s += w->flops / m->flops;
        if (kind == OP_BACKWARD || kind == OP_BACKWARD_INPUT || kind == OP_BACKWARD_WEIGHT)
            out->backward_s += w->flops / m->flops;
    }
    double own = computing_s(mine, m);
    out->pipeline_s = own;
    if (stages && p->stages > 1) {
        if (!p->layer_split) {
            out->pipeline_s = replay_s(stages, p, m);
        } else { /* 03's layer split: one micro-batch at a time through every stage */
            out->pipeline_s = 0;
            for (int s = 0; s < p->stages; s++) out->pipeline_s += computing_s(&stages[s], m);
        }
    }
    out->bubble_s = out->pipeline_s > own ? out->pipeline_s - own : 0;
}
