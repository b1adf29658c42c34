/* test_schedule.c: the pipeline schedules of 04_pipeline/schedule.c, checked.
 *
 *   test_schedule                     check every schedule for P = 1..6, M = 1..10
 *   test_schedule --print NAME P M    print a schedule, stage by stage
 *   test_schedule --simulate NAME P M print the simulation (deadlock, bubble, in-flight)
 *   test_schedule --arithmetic        check bubble_formula and bubble_measured (exercise 04.1)
 *
 * The checks, for gpipe and 1f1b: (1) simulated with BLOCKING messages the
 * stages never deadlock; (2) every stage runs the forward and the backward of
 * every micro-batch exactly once, the backward after the forward; (3) at most
 * M micro-batches are in flight for gpipe, at most min(P - s, M) on stage s
 * for 1f1b; (4) with a forward of 1 and a backward of 2 time units, the
 * simulated bubble equals the formula (P - 1) / (M + P - 1). And the
 * 1f1b-naive order, with separate blocking messages, must deadlock whenever
 * a steady state exists (P >= 2 and M >= P): the simulator can fail. */
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
        fprintf(stderr, "usage: test_schedule [--arithmetic | --print NAME P M | --simulate NAME P M]\n");
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
        }
    }
    printf("%s: %d failures (gpipe, 1f1b for P = 1..6, M = 1..10)\n", failures ? "FAIL" : "PASS", failures);
    return failures ? 1 : 0;
}
