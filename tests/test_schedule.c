/* test_schedule.c: the pipeline schedules of 04_pipeline/schedule.c, checked.
 *
 *   test_schedule                     check every schedule for P = 1..6, M = 1..10
 *   test_schedule --print NAME P M    print a schedule, stage by stage
 *   test_schedule --simulate NAME P M print the simulation (deadlock, bubble, in-flight)
 *   test_schedule --arithmetic        check bubble_formula and bubble_measured (exercise 04.1)
 *   test_schedule --chunks P V M      print and simulate the sequential schedule over V chunks per stage
 *
 * The checks, for gpipe and 1f1b: (1) simulated with BLOCKING messages the
 * stages never deadlock; (2) every stage runs the forward and the backward of
 * every micro-batch exactly once, the backward after the forward; (3) at most
 * M micro-batches are in flight for gpipe, at most min(P - s, M) on stage s
 * for 1f1b; (4) with a forward of 1 and a backward of 2 time units, the
 * simulated bubble equals the formula (P - 1) / (M + P - 1). And the
 * 1f1b-naive order, with separate blocking messages, must deadlock whenever
 * a steady state exists (P >= 2 and M >= P): the simulator can fail.
 *
 * Chunks (stages holding V chunks of layers, the field Action.chunk): no
 * schedule of schedule.c has them yet, so this file builds two orders by
 * hand. "sequential" runs one micro-batch at a time through all P x V pieces
 * (round the stages V times) and back: it must not deadlock, must take
 * exactly M P V (tf + tb) and hold V micro-batch chunks on each stage. The
 * same list with one receive labelled with the wrong chunk must deadlock
 * (the simulator matches chunks, not only micro-batches), and so must
 * "breadth-first", every micro-batch through chunk 0 before chunk 1 with
 * blocking messages, once V >= 2 and M >= P >= 2: micro-batch 0 comes round
 * the ring to stage 0's next chunk while stage 0 still sends chunk 0's later
 * micro-batches, and every stage waits in a send. */
#include "../04_pipeline/schedule.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int failures = 0;

static void fail(const char *name, int P, int M, const char *what) {
    printf("FAIL %s P=%d M=%d: %s\n", name, P, M, what);
    failures++;
}

static void check_each_micro_once(const char *name, int P, int M) {
    for (int stage = 0; stage < P; stage++) {
        StageSchedule s;
        schedule_build(name, P, M, stage, &s);
        int *forward_at = calloc(M, sizeof(int)), *backward_at = calloc(M, sizeof(int));
        for (int i = 0; i < s.count; i++) {
            const Action *a = &s.actions[i];
            if (a->micro < 0 || a->micro >= M)
                fail(name, P, M, "micro-batch index out of range");
            else if (a->kind == OP_FORWARD)
                forward_at[a->micro] = forward_at[a->micro] ? -1 : i + 1;
            else if (a->kind == OP_BACKWARD)
                backward_at[a->micro] = backward_at[a->micro] ? -1 : i + 1;
        }
        for (int m = 0; m < M; m++) {
            if (forward_at[m] <= 0 || backward_at[m] <= 0)
                fail(name, P, M, "a micro-batch not run exactly once");
            else if (backward_at[m] < forward_at[m])
                fail(name, P, M, "a backward before its forward");
        }
        free(forward_at);
        free(backward_at);
        schedule_free(&s);
    }
}

static void check(const char *name, int P, int M) {
    ScheduleReport r;
    schedule_simulate(name, P, M, 1.0, 2.0, &r);
    char what[256];
    if (r.deadlock) {
        snprintf(what, sizeof what, "deadlock: %s", r.where);
        fail(name, P, M, what);
        return;
    }
    check_each_micro_once(name, P, M);
    for (int s = 0; s < P; s++) {
        int bound = strcmp(name, "gpipe") == 0 ? M : (P - s < M ? P - s : M);
        if (r.max_in_flight[s] != bound) {
            snprintf(what, sizeof what, "stage %d holds %d micro-batches in flight, expected %d", s,
                     r.max_in_flight[s], bound);
            fail(name, P, M, what);
        }
    }
    double theory = (double)(P - 1) / (M + P - 1);
    if (fabs(r.bubble - theory) > 1e-9) {
        snprintf(what, sizeof what, "bubble %.6f, formula (P-1)/(M+P-1) = %.6f", r.bubble, theory);
        fail(name, P, M, what);
    }
}

/* ---- chunks ---- */

static void push(StageSchedule *s, OpKind kind, int micro, int chunk) {
    if (s->count == s->capacity) {
        s->capacity = s->capacity ? 2 * s->capacity : 32;
        s->actions = realloc(s->actions, s->capacity * sizeof(Action));
        if (!s->actions) abort();
    }
    s->actions[s->count++] = (Action){.kind = kind, .micro = micro, .micro2 = -1, .chunk = chunk};
}

/* Forward of micro-batch m through piece v (chunk v / P of stage v % P). */
static void piece_forward(StageSchedule *st, int P, int V, int v, int m) {
    StageSchedule *s = &st[v % P];
    if (v > 0) push(s, OP_RECV_ACT, m, v / P);
    push(s, OP_FORWARD, m, v / P);
    if (v < P * V - 1) push(s, OP_SEND_ACT, m, v / P);
}

static void piece_backward(StageSchedule *st, int P, int V, int v, int m) {
    StageSchedule *s = &st[v % P];
    if (v < P * V - 1) push(s, OP_RECV_GRAD, m, v / P);
    push(s, OP_BACKWARD, m, v / P);
    if (v > 0) push(s, OP_SEND_GRAD, m, v / P);
}

/* One micro-batch at a time, forward through every piece, then back. */
static void build_sequential_chunks(StageSchedule *st, int P, int V, int M) {
    memset(st, 0, P * sizeof *st);
    for (int m = 0; m < M; m++) {
        for (int v = 0; v < P * V; v++) piece_forward(st, P, V, v, m);
        for (int v = P * V - 1; v >= 0; v--) piece_backward(st, P, V, v, m);
    }
}

/* Every micro-batch through piece 0, then piece 1, ...; then back. */
static void build_breadth_first_chunks(StageSchedule *st, int P, int V, int M) {
    memset(st, 0, P * sizeof *st);
    for (int v = 0; v < P * V; v++)
        for (int m = 0; m < M; m++) piece_forward(st, P, V, v, m);
    for (int v = P * V - 1; v >= 0; v--)
        for (int m = 0; m < M; m++) piece_backward(st, P, V, v, m);
}

static void free_stages(StageSchedule *st, int P) {
    for (int p = 0; p < P; p++) schedule_free(&st[p]);
}

static void check_chunks(int P, int V, int M) {
    StageSchedule st[8];
    char what[256];
    ScheduleReport r;
    build_sequential_chunks(st, P, V, M);
    schedule_simulate_lists(st, P, V, 1.0, 2.0, &r);
    if (r.deadlock) {
        snprintf(what, sizeof what, "sequential over %d chunks deadlocks: %s", V, r.where);
        fail("chunks", P, M, what);
    } else if (fabs(r.makespan - M * P * V * 3.0) > 1e-9) {
        snprintf(what, sizeof what, "sequential over %d chunks takes %.0f, expected M P V (tf + tb) = %d", V,
                 r.makespan, M * P * V * 3);
        fail("chunks", P, M, what);
    }
    for (int s = 0; s < P && !r.deadlock; s++)
        if (r.max_in_flight[s] != V) {
            snprintf(what, sizeof what, "stage %d holds %d chunks of a micro-batch, expected %d", s,
                     r.max_in_flight[s], V);
            fail("chunks", P, M, what);
        }
    /* one receive labelled with the wrong chunk: the simulator must notice */
    if (P * V > 1) {
        StageSchedule *last_stage = &st[(P * V - 1) % P];
        for (int i = 0; i < last_stage->count; i++)
            if (last_stage->actions[i].kind == OP_RECV_ACT) {
                last_stage->actions[i].chunk = (last_stage->actions[i].chunk + 1) % (V + 1);
                break;
            }
        schedule_simulate_lists(st, P, V, 1.0, 2.0, &r);
        if (!r.deadlock) {
            snprintf(what, sizeof what, "%d chunks, a receive on the wrong chunk: expected a deadlock", V);
            fail("chunks", P, M, what);
        }
    }
    free_stages(st, P);
    build_breadth_first_chunks(st, P, V, M);
    schedule_simulate_lists(st, P, V, 1.0, 2.0, &r);
    int ring_fills =
        V >= 2 && P >= 2 && M >= P; /* the last stage sends micro 0 round before stage 0 is done */
    if (r.deadlock != ring_fills) {
        snprintf(what, sizeof what, "breadth-first over %d chunks: %s, expected %s", V,
                 r.deadlock ? "a deadlock" : "no deadlock", ring_fills ? "one" : "none");
        fail("chunks", P, M, what);
    }
    free_stages(st, P);
}

/* Exercise 04.1: the formula against the simulated GPipe bubble (computed by
 * the simulator on its own), and the measured bubble on numbers worked by hand. */
static int check_arithmetic(void) {
    for (int P = 1; P <= 6; P++) {
        for (int M = 1; M <= 10; M++) {
            ScheduleReport r;
            schedule_simulate("gpipe", P, M, 1.0, 2.0, &r);
            if (fabs(bubble_formula(P, M) - r.bubble) > 1e-9) {
                printf("FAIL bubble_formula(%d, %d) = %.6f, the simulated pipeline idles %.6f\n", P, M,
                       bubble_formula(P, M), r.bubble);
                failures++;
            }
        }
    }
    struct {
        double busy[3];
        int stages;
        double span, want;
    } cases[] = {
        {{3, 3}, 2, 5, 0.4},     /* 6 of 10 stage-ms busy */
        {{4, 2, 3}, 3, 4, 0.25}, /* 9 of 12 */
        {{5}, 1, 5, 0.0},        /* one stage, always busy */
        {{0, 0}, 2, 0, 0.0},     /* nothing ran */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        double got = bubble_measured(cases[i].busy, cases[i].stages, cases[i].span);
        if (fabs(got - cases[i].want) > 1e-12) {
            printf("FAIL bubble_measured case %zu: %.6f, expected %.6f\n", i, got, cases[i].want);
            failures++;
        }
    }
    printf("%s: %d failures (bubble arithmetic)\n", failures ? "FAIL" : "PASS", failures);
    return failures ? 1 : 0;
}

int main(int argc, char **argv) {
    if (argc == 2 && strcmp(argv[1], "--arithmetic") == 0) return check_arithmetic();
    if (argc == 5 && strcmp(argv[1], "--chunks") == 0) {
        int P = atoi(argv[2]), V = atoi(argv[3]), M = atoi(argv[4]);
        if (P < 1 || P > 8 || V < 1 || M < 1) {
            fprintf(stderr, "error: need 1 <= P <= 8, V >= 1 and M >= 1\n");
            return 2;
        }
        StageSchedule st[8];
        const char *orders[] = {"sequential", "breadth-first"};
        int deadlocks = 0;
        for (int o = 0; o < 2; o++) {
            if (o == 0)
                build_sequential_chunks(st, P, V, M);
            else
                build_breadth_first_chunks(st, P, V, M);
            printf("%s over %d chunks per stage:\n", orders[o], V);
            for (int s = 0; s < P; s++) schedule_print(&st[s], s);
            ScheduleReport r;
            schedule_simulate_lists(st, P, V, 1.0, 2.0, &r);
            if (r.deadlock)
                printf("%s P=%d V=%d M=%d: DEADLOCK (%s)\n", orders[o], P, V, M, r.where);
            else
                printf("%s P=%d V=%d M=%d: makespan %.0f, bubble %.4f\n", orders[o], P, V, M, r.makespan,
                       r.bubble);
            deadlocks += r.deadlock;
            free_stages(st, P);
        }
        return deadlocks ? 1 : 0;
    }
    if (argc == 5 && (strcmp(argv[1], "--print") == 0 || strcmp(argv[1], "--simulate") == 0)) {
        const char *name = argv[2];
        int P = atoi(argv[3]), M = atoi(argv[4]);
        if (P < 1 || P > 64 || M < 1) {
            fprintf(stderr, "error: need 1 <= P <= 64 and M >= 1\n");
            return 2;
        }
        if (strcmp(argv[1], "--print") == 0) {
            for (int s = 0; s < P; s++) {
                StageSchedule sched;
                if (schedule_build(name, P, M, s, &sched) != 0) {
                    fprintf(stderr, "error: unknown schedule '%s' (valid: gpipe, 1f1b, 1f1b-naive)\n", name);
                    return 2;
                }
                schedule_print(&sched, s);
                schedule_free(&sched);
            }
            return 0;
        }
        ScheduleReport r;
        schedule_simulate(name, P, M, 1.0, 2.0, &r);
        if (r.deadlock)
            printf("%s P=%d M=%d: DEADLOCK (%s)\n", name, P, M, r.where);
        else
            printf("%s P=%d M=%d: makespan %.0f, bubble %.4f (formula %.4f), in flight on stage 0: %d\n",
                   name, P, M, r.makespan, r.bubble, (double)(P - 1) / (M + P - 1), r.max_in_flight[0]);
        return r.deadlock;
    }
    if (argc != 1) {
        fprintf(stderr, "usage: test_schedule [--arithmetic | --print NAME P M | --simulate NAME P M | "
                        "--chunks P V M]\n");
        return 2;
    }
    for (int P = 1; P <= 6; P++) {
        for (int M = 1; M <= 10; M++) {
            check("gpipe", P, M);
            check("1f1b", P, M);
            ScheduleReport r;
            schedule_simulate("1f1b-naive", P, M, 1.0, 2.0, &r);
            int steady = P >= 2 && M >= P;
            if (steady && !r.deadlock)
                fail("1f1b-naive", P, M, "expected a deadlock, the simulator found none");
            for (int V = 1; V <= (P > 1 ? 3 : 1) && M <= 7; V++) /* one stage cannot message itself */
                check_chunks(P, V, M);
        }
    }
    printf("%s: %d failures (gpipe, 1f1b for P = 1..6, M = 1..10; chunks V = 1..3 for P >= 2, M = 1..7)\n",
           failures ? "FAIL" : "PASS", failures);
    return failures ? 1 : 0;
}
