/* schedule.h: pipeline schedules as explicit lists of actions (chapter 04).
 *
 * P stages (ranks holding consecutive layers) and M micro-batches per step.
 * A schedule gives each stage the ordered list of what it does: compute the
 * forward or backward of micro-batch m, and exchange messages with its
 * neighbours. One interpreter executes any schedule; a simulator
 * (schedule_simulate) runs all stages' lists against each other with
 * BLOCKING messages, to show that a schedule cannot deadlock and to measure
 * its bubble and its peak number of micro-batches in flight.
 *
 *   gpipe     all forwards, then all backwards. Every stage holds the
 *             activations of all M micro-batches at once.
 *   1f1b      PipeDream-flush: stage s runs min(P-1-s, M) warm-up forwards,
 *             then alternates one forward and one backward, then finishes the
 *             backwards. At most P-s micro-batches are in flight on stage s.
 *   1f1b-naive  the same order with every message a separate blocking send or
 *             receive: it DEADLOCKS (two neighbours each wait in a send to the
 *             other). Kept to show why 1f1b pairs its steady-state messages.
 *   interleaved  Megatron's interleaved 1F1B: stage s holds V chunks (pieces
 *             s, s+P, ..., layer_split.h) and each micro-batch goes round the
 *             ring V times. Forwards go through the chunks in groups of P
 *             micro-batches (P on chunk 0, the same P on chunk 1, ...), the
 *             backwards likewise from the last chunk; stage s warms up with
 *             2(P-1-s) + (V-1)P chunk forwards, then alternates. Needs M a
 *             multiple of P, as Megatron's does (schedule_refusal says so).
 *             Bubble (P-1)/(V M) of the ideal time, against 1F1B's (P-1)/M;
 *             V times the messages.
 *   zb-h1     zero bubble, ZB-H1 of Qi et al. (2024): 1F1B's order and messages
 *             with the backward split in two, B (the gradient of the input,
 *             which the previous stage waits for) and W (the gradient of the
 *             weights, which nobody waits for). 1F1B's order of forwards and
 *             B's; stage s runs W(k) only after B(k + s), so the first
 *             backwards cross the stages without waiting for weights, and the
 *             W's left over fill the bubble at the end. Bubble (P-1)(tf+tb-tw)
 *             per stage instead of 1F1B's (P-1)(tf+tb+tw): a third of it when
 *             tf = tb = tw. Every stage holds up to P micro-batches (until
 *             their W), which is 1F1B's peak (its stage 0), as the paper's
 *             H1 promises; 1F1B's later stages hold fewer (P-s). Its
 *             messages are posted (below), like interleaved's.
 *
 * In 1f1b's steady state, stage s sends micro-batch k's activations to s+1
 * at the moment s+1 sends micro-batch j's gradient back. As two separate
 * blocking sends these wait for each other forever; as one exchange
 * (OP_SEND_ACT_RECV_GRAD on s, matched by OP_SEND_GRAD_RECV_ACT on s+1, an
 * MPI_Sendrecv each) they complete together.
 *
 * Chunks. A stage may hold several chunks of layers (layer_split.h: chunk c
 * of stage s is piece c x P + s of the model), and each action says which
 * chunk it is about. "The next stage" is then the next piece: the same chunk
 * on the next rank of the pp ring, or the next chunk on stage 0 from the last
 * stage (layer_split_next and _prev, the only place that arithmetic lives).
 * interleaved holds V chunks per stage; the others one, chunk 0.
 *
 * Posted sends. Round a ring of chunks, blocking sends deadlock (the last
 * stage sends micro-batch 0 to stage 0's next chunk while stage 0 is still
 * sending chunk 0's later micro-batches: tests/test_schedule.c shows it).
 * Megatron posts its sends (batch_isend_irecv) and waits only in receives;
 * interleaved does the same with OP_POST_ACT / OP_POST_GRAD: the send leaves
 * at once, its buffer stays untouched until the partner receives it, and
 * only receives can wait. zb-h1 posts too: with 1F1B's paired exchanges its
 * stages would wait for each other in lockstep and the W's could not fill
 * the bubble (the simulator gives 30 instead of 27 for P = 4, M = 8 with
 * tf = tb = tw = 1, where 1F1B takes 33). Each computation receives what it
 * needs just before it and posts what it made just after. */
#ifndef SCHEDULE_H
#define SCHEDULE_H

#include "common/model/schedule_sim.h" /* a pipeline schedule replayed in time */

/* Valid names: "gpipe", "1f1b", "1f1b-naive", "zb-h1" (one chunk per stage).
 * Returns -1 for an unknown name, or a schedule that needs V > 1 chunks. */
int schedule_build(const char *name, int P, int M, int stage, StageSchedule *out);
/* Any schedule with V chunks per stage ("interleaved"; the others need V = 1).
 * Returns -1 where schedule_refusal refuses. */
int schedule_build_chunks(const char *name, int P, int V, int M, int stage, StageSchedule *out);
/* NULL if `name` can be built for P stages of V chunks and M micro-batches;
 * else one line saying why not, and the rule ("interleaved needs the
 * micro-batches M = 6 to be a multiple of the stages P = 4, as Megatron's
 * interleaved schedule does"). */
const char *schedule_refusal(const char *name, int P, int V, int M);
void schedule_free(StageSchedule *s);
/* One line: "stage 1: ra0 F0 sa0 ..." (F/B compute; ra/sa/rg/sg receive or
 * send activations or gradients; sa3|rg1 one exchange; pa/pg post
 * activations or gradients). A chunk other than 0 follows as c<chunk>: F3c1
 * is the forward of micro-batch 3 on chunk 1. In a schedule with W actions
 * (zb-h1), B3 is the input gradient only and W3 the weight gradients, as in
 * the zero-bubble paper; elsewhere B3 is the whole backward. */
void schedule_print(const StageSchedule *s, int stage);

/* The most micro-batches whose activations this stage holds at once: from
 * their arrival (or, on stage 0, their forward) until their backward (the
 * weight gradient W, where the backward is split). This is how many
 * activation buffers the stage needs. With V chunks: chunk-micro-batches,
 * each 1/V of the stage's activations for a micro-batch. */
int schedule_live_activations(const StageSchedule *s);

/* The bubble: the fraction of the stages' time spent idle in a step.
 * bubble_formula: (P-1)/(M+P-1), for P equal stages and M micro-batches.
 * bubble_measured: 1 - sum(busy_ms) / (stages x span_ms), from what each
 * stage spent computing and the time from the step's start to its last action. */
double bubble_formula(int P, int M);
double bubble_measured(const double *busy_ms, int stages, double span_ms);
/* The idle fraction each schedule's formula predicts, in the simulator's
 * terms (1 - busy / (stages x makespan)), for a forward of tf, a B of tb and
 * a W of tw on each chunk (gpipe and 1f1b: a backward of tb + tw):
 *   gpipe, 1f1b   (P-1)/(M+P-1)                   bubble_formula
 *   interleaved   (P-1)/(V M + P-1)               the bubble is (P-1)/(V M) of the ideal time
 *   zb-h1         I / (M(tf+tb+tw) + I), I = (P-1) max(tf, tf+tb-tw)
 * zb-h1's holds for M >= P and tw <= tb (then there are enough W's, and
 * they fit in the bubble they fill), and for tb <= tf with any tw (a W
 * longer than tf + tb fills all but the last stage's wait for its first
 * forward, (P-1) tf, which no W can fill); with M < P the simulator gives
 * less than 1F1B's bubble but more than this. */
double schedule_bubble_formula(const char *name, int P, int V, int M, double tf, double tb, double tw);


/* Run the P stages' schedules against each other with blocking messages;
 * forward takes time tf, backward tb, messages take no time. */
void schedule_simulate(const char *name, int P, int M, double tf, double tb, ScheduleReport *report);
/* The same with V chunks per stage and the backward's two halves: a forward
 * takes tf, B (OP_BACKWARD_INPUT) tb, W (OP_BACKWARD_WEIGHT) tw, and a whole
 * backward (OP_BACKWARD) tb + tw. Returns -1 where schedule_refusal refuses. */
int schedule_simulate_chunks(const char *name, int P, int V, int M, double tf, double tb, double tw,
                             ScheduleReport *report);

/* --print-schedule: a legend line, then every stage's list of actions (schedule_print). */
void schedule_print_all(const char *name, int P, int V, int M);

#endif
