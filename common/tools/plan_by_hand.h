/* plan_by_hand.h: exercise 06.3, one layout planned by hand (course.md,
 * "Plan before you run", exercise 06.3).
 *
 * The layout: chapter 05 on N ranks, ZeRO-1, bf16, one micro-batch; the
 * course's is the tiny preset and its defaults on 2 ranks (a global batch of
 * 8 sequences):
 *
 *     mpirun -np 2 05_zero/train --model tiny --zero 1 --precision bf16
 *
 * The learner writes plan_by_hand from the formulas of the course (ZeRO's
 * model state, comm.h's bytes, plan_time.h's step), not by calling the
 * planner; `common/plan --by-hand --machine FILE` prints their numbers next
 * to the planner's and fails on any difference. tests/grade/06.3.bats runs
 * it on the course's layout and on layouts and machine files drawn at
 * grading time, so the numbers must come from the formulas. */
#ifndef PLAN_BY_HAND_H
#define PLAN_BY_HAND_H

#include "common/tools/plan_time.h" /* the step time from a machine's constants */

typedef struct {
    double params_bytes, grads_bytes,
        optimizer_bytes; /* device memory of one rank, by memory.csv's category */
    double sent_bytes;   /* what one rank sends in one step, as comm.h counts */
    double step_ms;      /* the predicted step on machine m (plan_time.h) */
} ByHand;

/* The layout's shape: a GPT of V, T, C and L (untied head, any heads), on
 * N data-parallel ranks whose every unit divides by N (no shard padded),
 * with a global batch of B sequences, B/N a rank. */
typedef struct {
    int vocab, seq, dmodel, layers; /* V, T, C, L */
    int ranks, batch;               /* N, B */
} ByHandLayout;

void plan_by_hand(const ByHandLayout *layout, const Machine *m, ByHand *h);

#endif
