/* schedule.c: building, printing and simulating pipeline schedules (see schedule.h). */
#include "04_pipeline/schedule.h" /* 04: schedules as lists of actions */

#include "common/model/layer_split.h" /* which blocks each stage runs */
#include "common/core/util.h" /* fatal, log_info, exit codes, flag parsing */

#include <math.h>
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

/* A computation with its messages, for the schedules that post their sends:
 * receive what it needs just before it, post what it made just after. */
static void compute_posted(StageSchedule *s, int P, int V, int stage, OpKind kind, int m, int c) {
    StageChunk at = {stage, c};
    int has_prev = layer_split_prev(at, P, V).stage >= 0, has_next = layer_split_next(at, P, V).stage >= 0;
    if (kind == OP_FORWARD) {
        if (has_prev) add_action(s, (Action){OP_RECV_ACT, m, -1, c});
        add_action(s, (Action){OP_FORWARD, m, -1, c});
        if (has_next) add_action(s, (Action){OP_POST_ACT, m, -1, c});
    } else if (kind == OP_BACKWARD || kind == OP_BACKWARD_INPUT) {
        if (has_next) add_action(s, (Action){OP_RECV_GRAD, m, -1, c});
        add_action(s, (Action){kind, m, -1, c});
        if (has_prev) add_action(s, (Action){OP_POST_GRAD, m, -1, c});
    } else {
        add_action(s, (Action){kind, m, -1, c}); /* W: no message */
    }
}

/* ZB-H1: 1F1B's order of forwards and backwards, with each backward split
 * into B and W. B takes the backward's place; W(k) waits until after
 * B(k + lag), lag = the stage's index: the stages that the first backwards cross on
 * their way to stage 0 pass the gradient on without doing the weights, and
 * do those W's later, where 1F1B would idle. Micro-batch k stays in flight
 * until W(k). */
static void build_zb_h1(StageSchedule *s, int P, int M, int stage) {
    /* EXERCISE 04.3 BEGIN: the ZB-H1 action list (course.md, exercise 04.3) */
    StageSchedule order = {0}; /* 1F1B's order of forwards and backwards */
    build_1f1b(&order, P, M, stage);
    int lag = stage, next_w = 0; /* W(next_w) is the first weight gradient not yet done */
    for (int k = 0; k < order.count; k++) {
        int kind = order.actions[k].kind, micro = order.actions[k].micro;
        if (kind == OP_FORWARD) compute_posted(s, P, 1, stage, OP_FORWARD, micro, 0);
        if (kind != OP_BACKWARD) continue;
        compute_posted(s, P, 1, stage, OP_BACKWARD_INPUT, micro, 0);
        while (next_w <= micro - lag) compute_posted(s, P, 1, stage, OP_BACKWARD_WEIGHT, next_w++, 0);
    }
    while (next_w < M) compute_posted(s, P, 1, stage, OP_BACKWARD_WEIGHT, next_w++, 0); /* the bubble's W's */
    schedule_free(&order);
    /* EXERCISE 04.3 END */
}

/* Megatron's interleaved 1F1B (megatron/core/pipeline_parallel/schedules.py,
 * forward_backward_pipelining_with_interleaving), with M a multiple of P.
 * The stage's k-th forward (of V x M) is on chunk (k / P) mod V, micro-batch
 * (k / PV) P + k mod P: groups of P micro-batches go through chunk 0, then
 * the same P through chunk 1, ...; the k-th backward likewise from the last
 * chunk down. Stage s runs 2(P-1-s) + (V-1)P forwards before its first
 * backward (all of them when M = P), then one forward and one backward, then
 * the remaining backwards. Every computation receives what it needs just
 * before it and posts what it made just after (see schedule.h). */
static void interleaved_nth(int P, int V, int k, int backward, int *micro, int *chunk) {
    int group = k / P;
    *chunk = backward ? V - 1 - group % V : group % V;
    *micro = (k / (P * V)) * P + k % P;
}

static void interleaved_compute(StageSchedule *s, int P, int V, int stage, int k, int backward) {
    int m, c;
    interleaved_nth(P, V, k, backward, &m, &c);
    compute_posted(s, P, V, stage, backward ? OP_BACKWARD : OP_FORWARD, m, c);
}

static void build_interleaved(StageSchedule *s, int P, int V, int M, int stage) {
    int total = V * M;
    int warmup = M == P ? total : 2 * (P - 1 - stage) + (V - 1) * P;
    if (warmup > total) warmup = total;
    for (int k = 0; k < warmup; k++) interleaved_compute(s, P, V, stage, k, 0);
    for (int i = 0; i < total - warmup; i++) {
        interleaved_compute(s, P, V, stage, warmup + i, 0);
        interleaved_compute(s, P, V, stage, i, 1);
    }
    for (int i = total - warmup; i < total; i++) interleaved_compute(s, P, V, stage, i, 1);
}

const char *schedule_refusal(const char *name, int P, int V, int M) {
    static char why[200];
    int known = strcmp(name, "gpipe") == 0 || strcmp(name, "1f1b") == 0 || strcmp(name, "1f1b-naive") == 0 ||
                strcmp(name, "zb-h1") == 0;
    if (strcmp(name, "interleaved") == 0) {
        if (V < 2 || P < 2)
            snprintf(why, sizeof why,
                     "interleaved needs at least 2 stages of at least 2 chunks each (here %d stages of %d)",
                     P, V);
        else if (M % P != 0)
            snprintf(why, sizeof why,
                     "interleaved needs the micro-batches M = %d to be a multiple of the stages P = %d, as "
                     "Megatron's interleaved schedule does",
                     M, P);
        else
            return NULL;
    } else if (!known) {
        snprintf(why, sizeof why,
                 "unknown schedule '%s' (valid: gpipe, 1f1b, 1f1b-naive, interleaved, zb-h1)", name);
    } else if (V != 1) {
        snprintf(why, sizeof why,
                 "%s holds one chunk of layers per stage (here %d); only interleaved holds more", name, V);
    } else {
        return NULL;
    }
    return why;
}

int schedule_build_chunks(const char *name, int P, int V, int M, int stage, StageSchedule *out) {
    memset(out, 0, sizeof *out);
    if (schedule_refusal(name, P, V, M)) return -1;
    if (strcmp(name, "gpipe") == 0)
        build_gpipe(out, P, M, stage);
    else if (strcmp(name, "1f1b") == 0)
        build_1f1b(out, P, M, stage);
    else if (strcmp(name, "1f1b-naive") == 0)
        build_1f1b_naive(out, P, M, stage);
    else if (strcmp(name, "zb-h1") == 0)
        build_zb_h1(out, P, M, stage);
    else
        build_interleaved(out, P, V, M, stage);
    return 0;
}

int schedule_build(const char *name, int P, int M, int stage, StageSchedule *out) {
    return schedule_build_chunks(name, P, 1, M, stage, out);
}

void schedule_free(StageSchedule *s) {
    free(s->actions);
    memset(s, 0, sizeof *s);
}

void schedule_print(const StageSchedule *s, int stage) {
    printf("stage %d:", stage);
    for (int i = 0; i < s->count; i++) {
        char buf[32];
        schedule_format_action(&s->actions[i], buf, sizeof buf);
        printf(" %s", buf);
    }
    printf("\n");
}

int schedule_live_activations(const StageSchedule *s) {
    enum { MAX_CHUNKS = 64 };
    int live = 0, peak = 0, seen[MAX_CHUNKS]; /* each chunk's micro-batches arrive in order: the last one */
    for (int c = 0; c < MAX_CHUNKS; c++) seen[c] = -1;
    for (int i = 0; i < s->count; i++) {
        const Action *a = &s->actions[i];
        int arrives = a->kind == OP_RECV_ACT || a->kind == OP_FORWARD ? a->micro
                      : a->kind == OP_SEND_GRAD_RECV_ACT              ? a->micro2
                                                                      : -1;
        if (a->chunk < 0 || a->chunk >= MAX_CHUNKS) fatal(EXIT_USAGE, "an action on chunk %d", a->chunk);
        if (arrives > seen[a->chunk]) {
            seen[a->chunk] = arrives;
            live++;
        }
        if (a->kind == OP_BACKWARD || a->kind == OP_BACKWARD_WEIGHT) live--;
        if (live > peak) peak = live;
    }
    return peak;
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

double schedule_bubble_formula(const char *name, int P, int V, int M, double tf, double tb, double tw) {
    if (strcmp(name, "interleaved") == 0) return (double)(P - 1) / (V * M + P - 1);
    if (strcmp(name, "zb-h1") == 0) {
        /* per stage: W fills the cooldown's idle, F + B - W a piece, but never the last stage's wait
         * for its first forward, (P - 1) F, which comes before any W exists */
        double idle = (P - 1) * fmax(tf, tf + tb - tw);
        return idle / (M * (tf + tb + tw) + idle);
    }
    return bubble_formula(P, M);
}

/* ---- simulation with blocking messages (schedule_sim.h) ---- */

void schedule_simulate(const char *name, int P, int M, double tf, double tb, ScheduleReport *r) {
    if (schedule_simulate_chunks(name, P, 1, M, tf, tb, 0.0, r) != 0)
        fatal(EXIT_USAGE, "%s", schedule_refusal(name, P, 1, M));
}

int schedule_simulate_chunks(const char *name, int P, int V, int M, double tf, double tb, double tw,
                             ScheduleReport *r) {
    if (schedule_refusal(name, P, V, M)) return -1;
    StageSchedule *s = xcalloc(P, sizeof(StageSchedule));
    for (int p = 0; p < P; p++) schedule_build_chunks(name, P, V, M, p, &s[p]);
    schedule_simulate_lists(s, P, V, M, tf, tb, tw, r);
    for (int p = 0; p < P; p++) schedule_free(&s[p]);
    free(s);
    return 0;
}

void schedule_print_all(const char *name, int P, int V, int M) {
    if (V > 1)
        printf("%s schedule, %d stages of %d chunks, %d micro-batches (F/B forward/backward of a "
               "micro-batch; ra/rg receive activations/gradients, pa/pg post them; c1 on chunk 1)\n",
               name, P, V, M);
    else if (strcmp(name, "zb-h1") == 0)
        printf("%s schedule, %d stages, %d micro-batches (F forward; B/W input/weight gradients; ra/rg "
               "receive activations/gradients, pa/pg post them)\n",
               name, P, M);
    else
        printf("%s schedule, %d stages, %d micro-batches (F/B forward/backward of a micro-batch; ra/sa "
               "receive/"
               "send activations, rg/sg gradients; x|y one exchange)\n",
               name, P, M);
    for (int s = 0; s < P; s++) {
        StageSchedule sched;
        schedule_build_chunks(name, P, V, M, s, &sched);
        schedule_print(&sched, s);
        schedule_free(&sched);
    }
}
