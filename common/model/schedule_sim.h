/* schedule_sim.h: a pipeline schedule as data, and the simulator that runs
 * every stage's list against the others (chapter 04's schedule.h builds the
 * lists, and says what each schedule is; the course's pipeline interpreter
 * runs them).
 *
 * The simulator runs the P stages' lists with BLOCKING messages (an exchange
 * completes when both sides are at it; a posted send leaves at once and
 * only its receive waits), to show that a schedule cannot deadlock and to
 * measure its bubble and its peak number of micro-batches in flight, with
 * times given per kind of computation (tf, tb, tw: the tests' and the
 * formulas' equal stages) or per action (schedule_replay_lists: what a dry
 * run counted for each action of each stage, common/plan's time model).
 * It sits below the chapters so that the planner (common/tools) replays the
 * chapters' own lists with it; it is the only copy of these rules. */
#ifndef SCHEDULE_SIM_H
#define SCHEDULE_SIM_H

#include <stddef.h>

typedef enum {
    OP_FORWARD,            /* forward of micro-batch `micro` */
    OP_BACKWARD,           /* backward of micro-batch `micro` */
    OP_RECV_ACT,           /* receive micro's activations from the previous piece (stage s-1) */
    OP_SEND_ACT,           /* send micro's activations to the next piece (stage s+1) */
    OP_RECV_GRAD,          /* receive the gradient of micro's output from the next piece */
    OP_SEND_GRAD,          /* send the gradient of micro's input to the previous piece */
    OP_SEND_ACT_RECV_GRAD, /* one exchange with the next piece: send act(micro), receive grad(micro2) */
    OP_SEND_GRAD_RECV_ACT, /* one exchange with the previous piece: send grad(micro), receive act(micro2) */
    OP_BACKWARD_INPUT,     /* zero bubble's B: the gradient of micro's input only, keeping what W needs */
    OP_BACKWARD_WEIGHT,    /* zero bubble's W: the weight gradients of micro, after its B */
    OP_POST_ACT,           /* post micro's activations to the next piece; does not wait (see above) */
    OP_POST_GRAD,          /* post the gradient of micro's input to the previous piece; does not wait */
} OpKind;

typedef struct {
    OpKind kind;
    int micro;  /* the micro-batch (for exchanges: the one sent) */
    int micro2; /* exchanges: the micro-batch received; else -1 */
    int chunk;  /* the stage's chunk of layers that computes, sends or receives
                   (an exchange: both halves); 0 with one chunk per stage */
} Action;

typedef struct {
    Action *actions;
    int count, capacity;
} StageSchedule;

typedef struct {
    int deadlock;          /* 1 if the stages got stuck */
    int invalid;           /* 1 if a list breaks the once-each or dependency rule (see below) */
    char where[160];       /* what each stuck stage was waiting on, or what is invalid */
    int max_in_flight[64]; /* per stage (first 64): most (micro-batch, chunk) pairs forwarded whose
                              backward (its W, where split) has not run */
    double makespan;       /* simulated time of the whole step */
    double bubble;         /* idle fraction of the stages: 1 - busy / (P * makespan) */
} ScheduleReport;

/* The same for any P lists of actions (stages[p] is stage p's), whose stages
 * hold V chunks each and run M micro-batches: a message goes to the piece after or before the
 * sender's (stage, chunk) and completes when that piece's stage is at the
 * matching action for that chunk (a posted message: when the receiver gets
 * to its receive). Times as in schedule_simulate_chunks.
 *
 * It also checks each list (report->invalid, with the first problem in
 * `where`): on every chunk, every micro-batch's forward runs exactly once,
 * then its backward once, either whole or as B then W; a piece that is not
 * the model's first receives a micro-batch's activations before its forward,
 * one that is not the last receives its gradient before its B; and a send
 * follows the computation that makes what it sends. With deadlock and
 * invalid both 0, the lists are a correct schedule. */
void schedule_simulate_lists(const StageSchedule *stages, int P, int V, int M, double tf, double tb,
                             double tw, ScheduleReport *report);

/* The same with each computing action's own time: action_s[p][i] is the
 * seconds of stage p's i-th action (read for F, B, W only; messages take no
 * time). The dry run's pieces of each stage, in its list's order, give
 * them (common/tools/plan_time.h). */
void schedule_replay_lists(const StageSchedule *stages, int P, int V, int M, const double *const *action_s,
                           ScheduleReport *report);

/* A short name for an action kind, as in timeline.csv and dry-work.csv: fwd, bwd, recv_act, ...;
 * and the kind of such a name, or -1. */
const char *schedule_op_name(OpKind kind);
int schedule_op_parse(const char *name);
/* Whether an action computes a backward: whole (OP_BACKWARD), or zero bubble's B or W. */
int schedule_op_backward(OpKind kind);
/* The action as schedule_print prints it: F3, sa3|rg1, B2c1 (c<chunk> past chunk 0). */
void schedule_format_action(const Action *a, char *buf, size_t len);

#endif
