/* dry_work.h: a dry run's dry-work.csv, the work of its step piece by piece.
 *
 * The dry run (harness.h) writes into --out, beside memory.csv and run.csv,
 *
 *   dry-work.csv   order,action,micro,micro2,chunk,flops,matmul_flops,bytes,adam_params
 *
 * one row per piece of work of this rank's last step, in the order the step
 * issued them (work_ledger.h: what a piece is, how each kernel is counted):
 * a pipeline stage's actions (fwd, bwd, or zb-h1's bwd_input and bwd_weight,
 * with their micro-batch and chunk; its messages, recv_act, send_act_recv_grad
 * (micro2 the micro-batch received, else -1), post_grad, ..., with no work),
 * else each micro-batch's fwd
 * and bwd; the update (the gradient norm, clipping and the device's AdamW);
 * work between them as other; chapter 06's CPU AdamW as host_update. flops
 * leaves out AdamW, which adam_params counts (elements updated); bytes are
 * read and written. common/plan's time model reads it (plan_time.h). */
#ifndef DRY_WORK_H
#define DRY_WORK_H

void dry_work_csv_write(const char *dir);

#endif
