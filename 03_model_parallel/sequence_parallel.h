/* sequence_parallel.h: sequence parallelism (Megatron-LM, Korthikanti et al.
 * 2022) inside chapter 03's tensor parallelism (tensor_parallel.h), --sp.
 *
 * Between the parallel layers, every tp rank above holds the same (B,T,C)
 * values: both layernorms' inputs and outputs and the residual stream. With
 * tm->sp each rank holds only its B x T / tp rows of them (the rows of the
 * (B,T) tokens in order, rank r the r-th part): the layernorms and
 * residual adds work on those rows. Before a column-parallel layer an
 * all-gather makes its input whole; after a row-parallel layer a
 * reduce-scatter gives each rank its rows of the sum instead of an
 * all-reduce giving everyone all of it (the same bytes: an all-reduce is a
 * reduce-scatter and an all-gather). Backward mirrors it, and gathers each
 * layernorm output again for the weight gradient of the layer it feeds
 * (kept in rows, not whole). The layernorms' weight gradients, partial sums
 * over each rank's rows, are summed over the group. The embedding's output
 * and the head stay whole (the first block takes its rows, the last gathers
 * its output). An MoE block (--experts) runs its router and experts whole
 * on every tp rank, as without --sp: on the all-gathered ln2 output, every
 * rank then keeps its rows of the experts' output (no reduce-scatter: each
 * computed the same sum); the backward gathers the output gradient and
 * ln2's output, runs the experts' backward on every token and keeps its
 * rows of the input gradient. Needs B x T divisible by tp; not with
 * recompute yet. */
#ifndef SEQUENCE_PARALLEL_H
#define SEQUENCE_PARALLEL_H

#include "03_model_parallel/tensor_parallel.h" /* 03: tensor parallelism */

/* NULL when micro-batches of B x T tokens can be split over tp ranks. */
const char *sequence_parallel_problem(int B, int T, int tp);

/* With sp, sequence parallelism in tm's blocks: tm->sp set (before
 * tp_activations_create, which carves the rows) and this file's blocks,
 * tp_block_forward and tp_block_backward in rows, installed as the blocks
 * tp_block_hooks gives (tm->sp_blocks); without, tm's blocks stay whole. */
void sequence_parallel_enable(TensorParallelModel *tm, int sp);

#endif
