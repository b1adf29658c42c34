/* work_ledger.h: the work a dry run's step would do, piece by piece.
 *
 * A dry run (device.h) computes nothing, but its kernel table
 * (kernels_dry.c) knows every operation's shapes, so it counts what each
 * would do: FLOPs (matmul_flops apart: 2 x M x N x K of each product) and
 * bytes read and written. AdamW is counted as the parameters it updates
 * (adam_params), not as FLOPs: a machine file times it by its own rate.
 *
 * The counts go to the piece of work open at the time. The code that runs a
 * step opens the pieces: the pipeline interpreter one per schedule action
 * (its op name, micro-batch and chunk), the model's ranges fwd, bwd (or a
 * split backward's bwd_input and bwd_weight), the optimizer's step update,
 * chapter 06's host AdamW host_update; the interpreter's messages too, as
 * pieces of no work (recv_act, post_grad, ...). Pieces nest: only the outermost opens
 * a row (a pipeline's fwd of micro-batch 2 holds the model's forward it
 * runs), so each row is one piece the step issues, in order. Work outside
 * every piece goes to a row `other` (a ring all-reduce's additions, a ZeRO
 * shard's update). A row opened with micro -1 is numbered by how many rows
 * of its action came before it in the step (forward of micro-batch k).
 *
 * Only a dry run records (device_dry()); a real run's calls return at once.
 * The ledger holds one step: the harness empties it as each step begins. */
#ifndef WORK_LEDGER_H
#define WORK_LEDGER_H

#include <stddef.h>

enum { WORK_ACTION_CHARS = 24 };

typedef struct {
    char action[WORK_ACTION_CHARS]; /* fwd, bwd, bwd_input, bwd_weight, update, host_update, other */
    int micro, chunk;               /* the micro-batch and the stage's chunk of layers (0 with one) */
    int micro2;                     /* a pipeline's exchange: the micro-batch received; else -1 */
    double flops;                   /* every counted operation but AdamW's */
    double matmul_flops;            /* of which the matrix products: 2 M N K each */
    double bytes;                   /* read and written by those operations */
    double adam_params;             /* elements AdamW updated in this piece */
} WorkPiece;

/* Open a piece (nested: counted into the one already open). */
void work_begin(const char *action, int micro, int chunk);
/* The same for a pipeline's action, its messages too (schedule_sim.h's names and fields): the
 * stage's list of actions as it ran, which common/plan replays. */
void work_begin_action(const char *action, int micro, int micro2, int chunk);
void work_end(void);
/* What one operation does, into the open piece (or `other`). */
void work_add(double flops, double matmul_flops, double bytes);
void work_add_adam(double params, double bytes);
/* Host work (06's CPU AdamW): into the step's one host_update row. */
void work_add_host_adam(double params, double bytes);
/* Forget the pieces recorded so far (the harness, as a step begins). */
void work_reset(void);
/* The step is over (the harness, as it ends): rows opened after it (the closing sample's
 * forwards) are not the step's; rows it opened still count what comes into them (06's delayed
 * host update, finished after the step). */
void work_step_end(void);
/* The step's pieces so far, in the order they were opened. */
const WorkPiece *work_pieces(int *count);

#endif
