/* optimizer_agree.h: stage 2 of the optimizer step (optimizer_step.h) across
 * ranks, which needs MPI, which chapter 01 does not link: the chapters put
 * grad_norm_agree into GradShards.agree. */
#ifndef OPTIMIZER_AGREE_H
#define OPTIMIZER_AGREE_H

#include "common/model/optimizer_step.h" /* the optimizer step: norm, clip, skip, AdamW */

/* The sharded sums added over g->sum_group, plus the replicated sum; then,
 * if any rank of g->agree_group (or of the sum) has a sum that is not
 * finite, INFINITY on every one. */
double grad_norm_agree(const GradShards *g, double sharded, double replicated);

#endif
