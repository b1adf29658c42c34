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
 * Every schedule here holds one chunk per stage, chunk 0; the simulator
 * already runs lists with more (schedule_simulate_lists). */
#ifndef SCHEDULE_H
#define SCHEDULE_H

typedef enum {
    OP_FORWARD,            /* forward of micro-batch `micro` */
    OP_BACKWARD,           /* backward of micro-batch `micro` */
    OP_RECV_ACT,           /* receive micro's activations from the previous piece (stage s-1) */
    OP_SEND_ACT,           /* send micro's activations to the next piece (stage s+1) */
    OP_RECV_GRAD,          /* receive the gradient of micro's output from the next piece */
    OP_SEND_GRAD,          /* send the gradient of micro's input to the previous piece */
    OP_SEND_ACT_RECV_GRAD, /* one exchange with the next piece: send act(micro), receive grad(micro2) */
    OP_SEND_GRAD_RECV_ACT, /* one exchange with the previous piece: send grad(micro), receive act(micro2) */
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

/* Valid names: "gpipe", "1f1b", "1f1b-naive". Returns -1 for an unknown name. */
int schedule_build(const char *name, int P, int M, int stage, StageSchedule *out);
void schedule_free(StageSchedule *s);
/* One line: "stage 1: ra0 F0 sa0 ..." (F/B compute; ra/sa/rg/sg receive or
 * send activations or gradients; sa3|rg1 one exchange). A chunk other than
 * 0 follows as c<chunk>: F3c1 is the forward of micro-batch 3 on chunk 1. */
void schedule_print(const StageSchedule *s, int stage);

/* The most micro-batches whose activations this stage holds at once: from
 * their arrival (or, on stage 0, their forward) until their backward. This
 * is how many activation buffers the stage needs. */
int schedule_live_activations(const StageSchedule *s);
/* A short name for an action kind, as in timeline.csv: fwd, bwd, recv_act, ... */
const char *schedule_op_name(OpKind kind);

/* The bubble: the fraction of the stages' time spent idle in a step.
 * bubble_formula: (P-1)/(M+P-1), for P equal stages and M micro-batches.
 * bubble_measured: 1 - sum(busy_ms) / (stages x span_ms), from what each
 * stage spent computing and the time from the step's start to its last action. */
double bubble_formula(int P, int M);
double bubble_measured(const double *busy_ms, int stages, double span_ms);

typedef struct {
    int deadlock;          /* 1 if the stages got stuck */
    char where[160];       /* what each stuck stage was waiting on */
    int max_in_flight[64]; /* per stage (first 64): most micro-batches forwarded, not yet backwarded */
    double makespan;       /* simulated time of the whole step */
    double bubble;         /* idle fraction of the stages: 1 - busy / (P * makespan) */
} ScheduleReport;

/* Run the P stages' schedules against each other with blocking messages;
 * forward takes time tf, backward tb, messages take no time. */
void schedule_simulate(const char *name, int P, int M, double tf, double tb, ScheduleReport *report);
/* The same for any P lists of actions (stages[p] is stage p's), whose stages
 * hold V chunks each: a message goes to the piece after or before the
 * sender's (stage, chunk) and completes when that piece's stage is at the
 * matching action for that chunk. */
void schedule_simulate_lists(const StageSchedule *stages, int P, int V, double tf, double tb,
                             ScheduleReport *report);

#endif
