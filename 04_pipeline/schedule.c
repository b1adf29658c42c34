/* schedule.c: building, printing and simulating pipeline schedules (see schedule.h). */
#include "schedule.h"

#include "layer_split.h"
#include "util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void add_action(StageSchedule *s, Action a) {
    if (s->count == s->capacity) {
        s->capacity = s->capacity ? 2 * s->capacity : 32;
        Action *grown = realloc(s->actions, s->capacity * sizeof(Action));
        if (!grown) fatal(EXIT_RUNTIME, "out of host memory building a schedule");
        s->actions = grown;
    }
    s->actions[s->count++] = a;
}

/* An action of chunk 0: every schedule here holds one chunk per stage. */
static void add(StageSchedule *s, OpKind kind, int micro, int micro2) {
    add_action(s, (Action){.kind = kind, .micro = micro, .micro2 = micro2, .chunk = 0});
}

/* Forward of m with the messages around it, each a separate blocking call. */
static void forward_step(StageSchedule *s, int P, int stage, int m) {
    if (stage > 0) add(s, OP_RECV_ACT, m, -1);
    add(s, OP_FORWARD, m, -1);
    if (stage < P - 1) add(s, OP_SEND_ACT, m, -1);
}

static void backward_step(StageSchedule *s, int P, int stage, int m) {
    if (stage < P - 1) add(s, OP_RECV_GRAD, m, -1);
    add(s, OP_BACKWARD, m, -1);
    if (stage > 0) add(s, OP_SEND_GRAD, m, -1);
}

static void build_gpipe(StageSchedule *s, int P, int M, int stage) {
    for (int m = 0; m < M; m++) forward_step(s, P, stage, m);
    for (int m = 0; m < M; m++) backward_step(s, P, stage, m);
}

static void build_1f1b(StageSchedule *s, int P, int M, int stage) {
    /* EXERCISE 04.2 BEGIN: the 1F1B schedule (course.md, exercise 04.2) */
    int warmup = P - 1 - stage < M ? P - 1 - stage : M; /* forwards before the first backward */
    int steady = M - warmup;                            /* one forward + one backward each */
    int first = stage == 0, last = stage == P - 1;
    /* warm-up: fill the pipeline */
    for (int m = 0; m < warmup; m++) forward_step(s, P, stage, m);
    /* steady state: forward warmup+i, backward i. The messages to the next
     * stage (activations out, gradient in) form one exchange, and so do those
     * to the previous stage (gradient out, next activations in). */
    for (int i = 0; i < steady; i++) {
        int f = warmup + i;
        if (i == 0 && !first) add(s, OP_RECV_ACT, f, -1); /* later ones arrive in the exchange below */
        add(s, OP_FORWARD, f, -1);
        if (!last) add(s, OP_SEND_ACT_RECV_GRAD, f, i);
        add(s, OP_BACKWARD, i, -1);
        if (!first) {
            if (i < steady - 1)
                add(s, OP_SEND_GRAD_RECV_ACT, i, f + 1);
            else
                add(s, OP_SEND_GRAD, i, -1);
        }
    }
    /* cool-down: drain the backwards */
    for (int i = steady; i < M; i++) backward_step(s, P, stage, i);
    /* EXERCISE 04.2 END */
}

/* 1F1B with every message separate: the order is right, the messages are
 * not, and it deadlocks as soon as a steady state exists (see schedule.h).
 * It is build_1f1b's schedule with each paired exchange split into its two
 * blocking halves, send first, so the two differ only in the pairing. */
static void build_1f1b_naive(StageSchedule *s, int P, int M, int stage) {
    StageSchedule paired = {0};
    build_1f1b(&paired, P, M, stage);
    for (int k = 0; k < paired.count; k++) {
        const Action *a = &paired.actions[k];
        if (a->kind == OP_SEND_ACT_RECV_GRAD) {
            add_action(s, (Action){OP_SEND_ACT, a->micro, -1, a->chunk});
            add_action(s, (Action){OP_RECV_GRAD, a->micro2, -1, a->chunk});
        } else if (a->kind == OP_SEND_GRAD_RECV_ACT) {
            add_action(s, (Action){OP_SEND_GRAD, a->micro, -1, a->chunk});
            add_action(s, (Action){OP_RECV_ACT, a->micro2, -1, a->chunk});
        } else {
            add_action(s, *a);
        }
    }
    free(paired.actions);
}

int schedule_build(const char *name, int P, int M, int stage, StageSchedule *out) {
    memset(out, 0, sizeof *out);
    if (strcmp(name, "gpipe") == 0)
        build_gpipe(out, P, M, stage);
    else if (strcmp(name, "1f1b") == 0)
        build_1f1b(out, P, M, stage);
    else if (strcmp(name, "1f1b-naive") == 0)
        build_1f1b_naive(out, P, M, stage);
    else
        return -1;
    return 0;
}

void schedule_free(StageSchedule *s) {
    free(s->actions);
    memset(s, 0, sizeof *s);
}

/* The kind and micro-batches of an action: F3, sa3|rg1, ... */
static void format_kind_micro(const Action *a, char *buf, size_t len) {
    switch (a->kind) {
    case OP_FORWARD:
        snprintf(buf, len, "F%d", a->micro);
        break;
    case OP_BACKWARD:
        snprintf(buf, len, "B%d", a->micro);
        break;
    case OP_RECV_ACT:
        snprintf(buf, len, "ra%d", a->micro);
        break;
    case OP_SEND_ACT:
        snprintf(buf, len, "sa%d", a->micro);
        break;
    case OP_RECV_GRAD:
        snprintf(buf, len, "rg%d", a->micro);
        break;
    case OP_SEND_GRAD:
        snprintf(buf, len, "sg%d", a->micro);
        break;
    case OP_SEND_ACT_RECV_GRAD:
        snprintf(buf, len, "sa%d|rg%d", a->micro, a->micro2);
        break;
    case OP_SEND_GRAD_RECV_ACT:
        snprintf(buf, len, "sg%d|ra%d", a->micro, a->micro2);
        break;
    }
}

/* The action as printed: its kind and micro-batches, then c<chunk> unless chunk 0. */
static void format_action(const Action *a, char *buf, size_t len) {
    format_kind_micro(a, buf, len);
    if (a->chunk != 0) {
        size_t used = strlen(buf);
        snprintf(buf + used, len - used, "c%d", a->chunk);
    }
}

void schedule_print(const StageSchedule *s, int stage) {
    printf("stage %d:", stage);
    for (int i = 0; i < s->count; i++) {
        char buf[32];
        format_action(&s->actions[i], buf, sizeof buf);
        printf(" %s", buf);
    }
    printf("\n");
}

int schedule_live_activations(const StageSchedule *s) {
    int live = 0, peak = 0, seen = -1; /* micro-batches arrive in order: seen = the last one */
    for (int i = 0; i < s->count; i++) {
        const Action *a = &s->actions[i];
        int arrives = a->kind == OP_RECV_ACT || a->kind == OP_FORWARD ? a->micro
                      : a->kind == OP_SEND_GRAD_RECV_ACT              ? a->micro2
                                                                      : -1;
        if (arrives > seen) {
            seen = arrives;
            live++;
        }
        if (a->kind == OP_BACKWARD) live--;
        if (live > peak) peak = live;
    }
    return peak;
}

const char *schedule_op_name(OpKind kind) {
    static const char *names[] = {"fwd",       "bwd",       "recv_act",           "send_act",
                                  "recv_grad", "send_grad", "send_act_recv_grad", "send_grad_recv_act"};
    return names[kind];
}

double bubble_formula(int P, int M) {
    /* EXERCISE 04.1 BEGIN: the bubble arithmetic (course.md, exercise 04.1) */
    /* A micro-batch's forward and backward take (M + P - 1) slots end to end:
     * M of them busy on each stage, P - 1 spent filling and draining. */
    return (double)(P - 1) / (M + P - 1);
    /* EXERCISE 04.1 END */
}

double bubble_measured(const double *busy_ms, int stages, double span_ms) {
    /* EXERCISE 04.1 BEGIN: the bubble arithmetic (course.md, exercise 04.1) */
    double busy = 0.0;
    for (int s = 0; s < stages; s++) busy += busy_ms[s];
    return span_ms > 0.0 ? 1.0 - busy / (stages * span_ms) : 0.0;
    /* EXERCISE 04.1 END */
}

/* ---- simulation with blocking messages ---- */

static int is_compute(OpKind k) {
    return k == OP_FORWARD || k == OP_BACKWARD;
}
/* Is the partner of this message the next piece of the model (activations
 * out, gradients in), rather than the previous one? */
static int towards_next(OpKind k) {
    return k == OP_SEND_ACT || k == OP_RECV_GRAD || k == OP_SEND_ACT_RECV_GRAD;
}

/* Do a (on a piece) and b (on the piece after it) complete each other? */
static int matches(const Action *a, const Action *b) {
    switch (a->kind) {
    case OP_SEND_ACT:
        return b->kind == OP_RECV_ACT && b->micro == a->micro;
    case OP_RECV_GRAD:
        return b->kind == OP_SEND_GRAD && b->micro == a->micro;
    case OP_SEND_ACT_RECV_GRAD:
        return b->kind == OP_SEND_GRAD_RECV_ACT && b->micro == a->micro2 && b->micro2 == a->micro;
    default:
        return 0;
    }
}

void schedule_simulate(const char *name, int P, int M, double tf, double tb, ScheduleReport *r) {
    StageSchedule *s = xcalloc(P, sizeof(StageSchedule));
    for (int p = 0; p < P; p++)
        if (schedule_build(name, P, M, p, &s[p]) != 0) fatal(EXIT_USAGE, "unknown schedule '%s'", name);
    schedule_simulate_lists(s, P, 1, tf, tb, r);
    for (int p = 0; p < P; p++) schedule_free(&s[p]);
    free(s);
}

void schedule_simulate_lists(const StageSchedule *s, int P, int V, double tf, double tb, ScheduleReport *r) {
    memset(r, 0, sizeof *r);
    int *pc = xcalloc(P, sizeof(int)), *in_flight = xcalloc(P, sizeof(int));
    double *clock = xcalloc(P, sizeof(double));
    double busy = 0.0;
    for (;;) {
        int progress = 0, done = 1;
        for (int p = 0; p < P; p++) {
            if (pc[p] == s[p].count) continue;
            done = 0;
            const Action *a = &s[p].actions[pc[p]];
            if (is_compute(a->kind)) {
                double t = a->kind == OP_FORWARD ? tf : tb;
                clock[p] += t;
                busy += t;
                in_flight[p] += a->kind == OP_FORWARD ? 1 : -1;
                if (p < 64 && in_flight[p] > r->max_in_flight[p]) r->max_in_flight[p] = in_flight[p];
                pc[p]++;
                progress = 1;
                continue;
            }
            /* the partner: the piece after (or before) this stage's chunk, on rank q of the ring */
            int next = towards_next(a->kind);
            StageChunk at = {p, a->chunk};
            StageChunk peer = next ? layer_split_next(at, P, V) : layer_split_prev(at, P, V);
            int q = peer.stage;
            if (q < 0 || pc[q] == s[q].count) continue; /* no partner: stuck */
            const Action *b = &s[q].actions[pc[q]];
            int ok = b->chunk == peer.chunk && (next ? matches(a, b) : matches(b, a));
            if (!ok) continue;
            double t = clock[p] > clock[q] ? clock[p] : clock[q]; /* both wait for the later one */
            clock[p] = clock[q] = t;
            pc[p]++;
            pc[q]++;
            progress = 1;
        }
        if (done) break;
        if (!progress) {
            r->deadlock = 1;
            size_t used = 0;
            for (int p = 0; p < P && used < sizeof r->where - 24; p++) {
                if (pc[p] == s[p].count) continue;
                char buf[32];
                format_action(&s[p].actions[pc[p]], buf, sizeof buf);
                used += snprintf(r->where + used, sizeof r->where - used, "%sstage %d in %s",
                                 used ? ", " : "", p, buf);
            }
            break;
        }
    }
    for (int p = 0; p < P; p++)
        if (clock[p] > r->makespan) r->makespan = clock[p];
    r->bubble = r->makespan > 0 ? 1.0 - busy / (P * r->makespan) : 0.0;
    free(pc);
    free(in_flight);
    free(clock);
}
