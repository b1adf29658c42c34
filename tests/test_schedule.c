/* test_schedule.c: the pipeline schedules of 04_pipeline/schedule.c, checked.
 *
 *   test_schedule                     check every schedule for P = 1..6, M = 1..10
 *   test_schedule --print NAME P M    print a schedule, stage by stage
 *   test_schedule --simulate NAME P M print the simulation (deadlock, bubble, in-flight)
 *   test_schedule --arithmetic        check bubble_formula and bubble_measured (exercise 04.1)
 *   test_schedule --chunks P V M      print and simulate the sequential schedule over V chunks per stage
 *   test_schedule --print-chunks NAME P V M             print any schedule with V chunks per stage
 *   test_schedule --simulate-times NAME P V M TF TB TW  simulate with forward TF, B TB, W TW
 *   test_schedule --broken P M        show the broken interleaved and zb-h1 lists rejected
 *   test_schedule --live NAME P V M   per stage: the simulator's most micro-batches in flight, and the
 *                                     activation slots each chunk needs (its own list's peak, as
 *                                     04_pipeline/pipeline.c gives them: tests/chapters/pipeline.bats)
 *   test_schedule --only zb-h1        check zb-h1 alone (exercise 04.3's grader)
 *   test_schedule --except zb-h1      check all the others (exercise 04.2's grader: its copy may not
 *                                     have written zb-h1 yet, which 04.3 builds on 1F1B's order)
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
 * Chunks (stages holding V chunks of layers, the field Action.chunk): besides
 * schedule.c's interleaved (below), this file builds two orders by hand. "sequential" runs one micro-batch at
 * a time through all P x V pieces (round the stages V times) and back: it must not deadlock, must take
 * exactly M P V (tf + tb) and hold V micro-batch chunks on each stage. The
 * same list with one receive labelled with the wrong chunk must deadlock
 * (the simulator matches chunks, not only micro-batches), and so must
 * "breadth-first", every micro-batch through chunk 0 before chunk 1 with
 * blocking messages, once V >= 2 and M >= P >= 2: micro-batch 0 comes round
 * the ring to stage 0's next chunk while stage 0 still sends chunk 0's later
 * micro-batches, and every stage waits in a send.
 *
 * Past 1F1B: interleaved (V = 2, 3; M a multiple of P, else refused) and
 * zb-h1 (B and W) must not deadlock, must pass the simulator's check (every
 * F, B and W once per chunk, in dependency order), hold the expected
 * micro-batches in flight (interleaved: its warm-up + 1 chunk-micro-batches,
 * 2(P-1-s) + (V-1)P + 1; zb-h1: P on every stage) and meet their bubble
 * formulas exactly (schedule_bubble_formula; zb-h1 for M >= P and tw <= tb,
 * and below 1F1B's for M < P). Four deliberately broken lists (--broken)
 * must be rejected: zb-h1 missing a W, zb-h1 with a W before its B,
 * interleaved with blocking sends (deadlock round the ring), interleaved
 * with the backwards on the wrong chunks.
 *
 * Graded (--only zb-h1, exercise 04.3), zb-h1 need not hold exactly P on
 * every stage, only no more than 1F1B's peak, min(P, M): the paper's promise. */
#include "04_pipeline/schedule.h" /* 04: schedules as lists of actions */

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int failures = 0;
static int grading_zb = 0; /* --only zb-h1: in flight at most min(P, M), not exactly */

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
    schedule_simulate_lists(st, P, V, M, 1.0, 2.0, 0.0, &r);
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
        schedule_simulate_lists(st, P, V, M, 1.0, 2.0, 0.0, &r);
        if (!r.deadlock && !r.invalid) {
            snprintf(what, sizeof what, "%d chunks, a receive on the wrong chunk: expected a deadlock", V);
            fail("chunks", P, M, what);
        }
    }
    free_stages(st, P);
    build_breadth_first_chunks(st, P, V, M);
    schedule_simulate_lists(st, P, V, M, 1.0, 2.0, 0.0, &r);
    int ring_fills =
        V >= 2 && P >= 2 && M >= P; /* the last stage sends micro 0 round before stage 0 is done */
    if (r.deadlock != ring_fills) {
        snprintf(what, sizeof what, "breadth-first over %d chunks: %s, expected %s", V,
                 r.deadlock ? "a deadlock" : "no deadlock", ring_fills ? "one" : "none");
        fail("chunks", P, M, what);
    }
    free_stages(st, P);
}

/* ---- past 1F1B: interleaved (V chunks per stage) and zb-h1 (B and W) ---- */

/* Build all P stages of a schedule; 0, or -1 where it is refused. */
static int build_all(StageSchedule *st, const char *name, int P, int V, int M) {
    for (int s = 0; s < P; s++)
        if (schedule_build_chunks(name, P, V, M, s, &st[s]) != 0) return -1;
    return 0;
}

/* The most (micro-batch, chunk) pairs each stage should hold: interleaved's
 * warm-up forwards and the one after them (all V M when M = P); zb-h1 min(P, M). */
static int expected_in_flight(const char *name, int P, int V, int M, int s) {
    if (strcmp(name, "zb-h1") == 0) return P < M ? P : M;
    int warm = M == P ? V * M : 2 * (P - 1 - s) + (V - 1) * P + 1;
    return warm < V * M ? warm : V * M;
}

static void check_past_1f1b(const char *name, int P, int V, int M, double tf, double tb, double tw) {
    char what[320];
    ScheduleReport r;
    if (schedule_simulate_chunks(name, P, V, M, tf, tb, tw, &r) != 0) {
        snprintf(what, sizeof what, "refused: %s", schedule_refusal(name, P, V, M));
        fail(name, P, M, what);
        return;
    }
    if (r.deadlock || r.invalid) {
        snprintf(what, sizeof what, "V=%d: %s: %s", V, r.deadlock ? "deadlock" : "invalid", r.where);
        fail(name, P, M, what);
        return;
    }
    for (int s = 0; s < P; s++)
        if (grading_zb ? r.max_in_flight[s] > expected_in_flight(name, P, V, M, s)
                       : r.max_in_flight[s] != expected_in_flight(name, P, V, M, s)) {
            snprintf(what, sizeof what, "V=%d: stage %d holds %d in flight, expected %d", V, s,
                     r.max_in_flight[s], expected_in_flight(name, P, V, M, s));
            fail(name, P, M, what);
        }
    double theory = schedule_bubble_formula(name, P, V, M, tf, tb, tw);
    if (strcmp(name, "zb-h1") == 0 && M < P) { /* too few W's to fill the bubble: no worse than 1F1B */
        if (r.bubble > bubble_formula(P, M) + 1e-9) {
            snprintf(what, sizeof what, "M < P: bubble %.6f, above 1F1B's %.6f", r.bubble,
                     bubble_formula(P, M));
            fail(name, P, M, what);
        }
    } else if (fabs(r.bubble - theory) > 1e-9) {
        snprintf(what, sizeof what, "V=%d tf %g tb %g tw %g: bubble %.6f, formula %.6f", V, tf, tb, tw,
                 r.bubble, theory);
        fail(name, P, M, what);
    }
}

/* zb-h1 for P = 1..6, M = 1..12 and four (tf, tb, tw) with tw <= tb. */
static void check_zb_h1(void) {
    double times[][3] = {{1, 1, 1}, {1, 2, 1}, {2, 1, 1}, {1, 1, 0.5}};
    for (int P = 1; P <= 6; P++)
        for (int M = 1; M <= 12; M++)
            for (int t = 0; t < 4; t++)
                check_past_1f1b("zb-h1", P, 1, M, times[t][0], times[t][1], times[t][2]);
}

/* Deliberately broken lists, each of which the simulator must reject. */
static int expect_rejected(const char *what, StageSchedule *st, int P, int V, int M, int verbose) {
    ScheduleReport r;
    schedule_simulate_lists(st, P, V, M, 1.0, 1.0, 1.0, &r);
    if (verbose)
        printf("%s: %s%s\n", what, r.deadlock ? "DEADLOCK: " : r.invalid ? "INVALID: " : "accepted", r.where);
    free_stages(st, P);
    if (!r.deadlock && !r.invalid) {
        fail("broken", P, M, what);
        return 0;
    }
    return 1;
}

static void check_broken_zb_h1(int P, int M, int verbose) {
    StageSchedule st[8] = {{0}};
    /* zb-h1 without the last stage's W of micro-batch 0 */
    build_all(st, "zb-h1", P, 1, M);
    for (int i = 0; i < st[P - 1].count; i++)
        if (st[P - 1].actions[i].kind == OP_BACKWARD_WEIGHT && st[P - 1].actions[i].micro == 0) {
            memmove(&st[P - 1].actions[i], &st[P - 1].actions[i + 1],
                    (st[P - 1].count - i - 1) * sizeof(Action));
            st[P - 1].count--;
            break;
        }
    expect_rejected("zb-h1 with a W missing", st, P, 1, M, verbose);
    /* zb-h1 with stage 0's first W before its B */
    build_all(st, "zb-h1", P, 1, M);
    for (int i = 0; i < st[0].count; i++)
        if (st[0].actions[i].kind == OP_BACKWARD_INPUT) {
            int j = i + 1;
            while (st[0].actions[j].kind != OP_BACKWARD_WEIGHT) j++;
            Action w = st[0].actions[j];
            memmove(&st[0].actions[i + 1], &st[0].actions[i], (j - i) * sizeof(Action));
            st[0].actions[i] = w;
            break;
        }
    expect_rejected("zb-h1 with a W before its B", st, P, 1, M, verbose);
}

static void check_broken_interleaved(int P, int M, int verbose) {
    StageSchedule st[8] = {{0}};
    /* interleaved with blocking sends instead of posted ones: round the ring, every stage waits in a send */
    build_all(st, "interleaved", P, 2, M);
    for (int s = 0; s < P; s++)
        for (int i = 0; i < st[s].count; i++) {
            Action *a = &st[s].actions[i];
            if (a->kind == OP_POST_ACT) a->kind = OP_SEND_ACT;
            if (a->kind == OP_POST_GRAD) a->kind = OP_SEND_GRAD;
        }
    expect_rejected("interleaved with blocking sends", st, P, 2, M, verbose);
    /* interleaved with every stage's backwards in the forward's chunk order (chunk 0 first) */
    build_all(st, "interleaved", P, 2, M);
    for (int s = 0; s < P; s++)
        for (int i = 0; i < st[s].count; i++) {
            Action *a = &st[s].actions[i];
            if (a->kind == OP_BACKWARD || a->kind == OP_RECV_GRAD || a->kind == OP_POST_GRAD)
                a->chunk = 1 - a->chunk;
        }
    expect_rejected("interleaved with the backwards' chunks swapped", st, P, 2, M, verbose);
}

static void check_broken(int P, int M, int verbose) {
    check_broken_zb_h1(P, M, verbose);
    check_broken_interleaved(P, M, verbose);
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
            schedule_simulate_lists(st, P, V, M, 1.0, 2.0, 0.0, &r);
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
    if (argc == 6 && strcmp(argv[1], "--print-chunks") == 0) {
        const char *name = argv[2];
        int P = atoi(argv[3]), V = atoi(argv[4]), M = atoi(argv[5]);
        if (P < 1 || P > 8 || V < 1 || M < 1) {
            fprintf(stderr, "error: need 1 <= P <= 8, V >= 1 and M >= 1\n");
            return 2;
        }
        const char *why = schedule_refusal(name, P, V, M);
        if (why) {
            fprintf(stderr, "error: %s\n", why);
            return 2;
        }
        StageSchedule st[8];
        build_all(st, name, P, V, M);
        for (int s = 0; s < P; s++) schedule_print(&st[s], s);
        free_stages(st, P);
        return 0;
    }
    if (argc == 9 && strcmp(argv[1], "--simulate-times") == 0) {
        const char *name = argv[2];
        int P = atoi(argv[3]), V = atoi(argv[4]), M = atoi(argv[5]);
        double tf = atof(argv[6]), tb = atof(argv[7]), tw = atof(argv[8]);
        if (P < 1 || P > 64 || V < 1 || M < 1) {
            fprintf(stderr, "error: need 1 <= P <= 64, V >= 1 and M >= 1\n");
            return 2;
        }
        ScheduleReport r;
        if (schedule_simulate_chunks(name, P, V, M, tf, tb, tw, &r) != 0) {
            fprintf(stderr, "error: %s\n", schedule_refusal(name, P, V, M));
            return 2;
        }
        if (r.deadlock || r.invalid) {
            printf("%s P=%d V=%d M=%d: %s (%s)\n", name, P, V, M, r.deadlock ? "DEADLOCK" : "INVALID",
                   r.where);
            return 1;
        }
        printf("%s P=%d V=%d M=%d tf=%g tb=%g tw=%g: makespan %g, bubble %.4f (formula %.4f), in flight per "
               "stage:",
               name, P, V, M, tf, tb, tw, r.makespan, r.bubble,
               schedule_bubble_formula(name, P, V, M, tf, tb, tw));
        for (int s = 0; s < P && s < 64; s++) printf(" %d", r.max_in_flight[s]);
        printf("\n");
        return 0;
    }
    if (argc == 6 && strcmp(argv[1], "--live") == 0) {
        const char *name = argv[2];
        int P = atoi(argv[3]), V = atoi(argv[4]), M = atoi(argv[5]);
        if (P < 1 || P > 8 || V < 1 || M < 1) {
            fprintf(stderr, "error: need 1 <= P <= 8, V >= 1 and M >= 1\n");
            return 2;
        }
        ScheduleReport r;
        if (schedule_simulate_chunks(name, P, V, M, 1.0, 1.0, 1.0, &r) != 0) {
            fprintf(stderr, "error: %s\n", schedule_refusal(name, P, V, M));
            return 2;
        }
        StageSchedule st[8];
        build_all(st, name, P, V, M);
        for (int s = 0; s < P; s++) {
            printf("stage %d: in flight %d, slots per chunk", s, r.max_in_flight[s]);
            StageSchedule chunk = {.actions = calloc(st[s].count + 1, sizeof(Action))};
            for (int c = 0; c < V; c++) { /* the chunk's own actions, and their peak */
                chunk.count = 0;
                for (int i = 0; i < st[s].count; i++)
                    if (st[s].actions[i].chunk == c) chunk.actions[chunk.count++] = st[s].actions[i];
                printf(" %d", schedule_live_activations(&chunk));
            }
            printf("\n");
            free(chunk.actions);
        }
        free_stages(st, P);
        return 0;
    }
    if (argc == 4 && strcmp(argv[1], "--broken") == 0) {
        int P = atoi(argv[2]), M = atoi(argv[3]);
        if (P < 2 || P > 8 || M < P || M % P) {
            fprintf(stderr, "error: need 2 <= P <= 8 and M a multiple of P\n");
            return 2;
        }
        check_broken(P, M, 1);
        return failures ? 1 : 0;
    }
    /* which schedules the checks below cover: all; zb-h1 only; all but zb-h1 */
    int zb_h1 = 1, others = 1;
    if (argc == 3 && strcmp(argv[2], "zb-h1") == 0 && strcmp(argv[1], "--only") == 0) {
        others = 0;
        grading_zb = 1;
    } else if (argc == 3 && strcmp(argv[2], "zb-h1") == 0 && strcmp(argv[1], "--except") == 0) {
        zb_h1 = 0;
    } else if (argc != 1) {
        fprintf(stderr, "usage: test_schedule [--arithmetic | --print NAME P M | --simulate NAME P M | "
                        "--chunks P V M | --print-chunks NAME P V M | --simulate-times NAME P V M TF TB TW | "
                        "--broken P M | --live NAME P V M | --only zb-h1 | --except zb-h1]\n");
        return 2;
    }
    if (!others) {
        check_zb_h1();
        printf("%s: %d failures (zb-h1 for P = 1..6, M = 1..12, four (tf, tb, tw))\n",
               failures ? "FAIL" : "PASS", failures);
        return failures ? 1 : 0;
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
    if (zb_h1) check_zb_h1();
    for (int P = 2; P <= 6; P++)
        for (int V = 2; V <= 3; V++)
            for (int M = 1; M <= 12; M++) {
                if (M % P == 0) {
                    check_past_1f1b("interleaved", P, V, M, 1.0, 2.0, 0.0);
                    if (zb_h1) check_broken_zb_h1(P, M, 0);
                    check_broken_interleaved(P, M, 0);
                } else if (!schedule_refusal("interleaved", P, V, M)) {
                    fail("interleaved", P, M, "M not a multiple of P, yet not refused");
                }
            }
    printf("%s: %d failures (gpipe, 1f1b for P = 1..6, M = 1..10; chunks V = 1..3 for P >= 2, M = 1..7; "
           "%sinterleaved P = 2..6, V = 2..3, M = 1..12)\n",
           failures ? "FAIL" : "PASS", failures, zb_h1 ? "zb-h1 P = 1..6, M = 1..12; " : "");
    return failures ? 1 : 0;
}
