/* plan_stage.h: what one rank of a model split holds, for the planner
 * (common/plan, plan_layout.c): chapters 03-05's layer split, pipeline
 * stages and tensor slices, counted without building them.
 *
 * The planner sits below the chapters (common/README.md), so it cannot call
 * 03's tensor_parallel.c or 04's schedule.c. What it needs of them is
 * written again here, as arithmetic, and tests/plan.bats holds that
 * arithmetic to the programs' memory.csv:
 *
 *   slots        the activation sets a stage keeps: the most micro-batches
 *                each of its chunks holds at once under the schedule (04's
 *                schedule_live_activations over the action list schedule.c
 *                builds): GPipe M; 1F1B min(M, P - s) on stage s; ZB-H1 the
 *                same order, a micro-batch kept until its W; interleaved
 *                per chunk, from Megatron's order of chunk computations.
 *   tensor sizes a tensor-parallel rank's local widths (03's
 *                tensor_parallel.c): qkv, attproj, fc and fcproj sliced over
 *                tp ranks (12C^2 + 7C of a block's 12C^2 + 13C), layernorms,
 *                the two output biases, the embedding and the head whole;
 *                its block activations and its scratch in local widths. */
#ifndef PLAN_STAGE_H
#define PLAN_STAGE_H

#include "model_config.h"
#include "param_table.h"

#include <stddef.h>

/* The schedules of chapter 04 (--schedule). */
enum { SCHED_GPIPE, SCHED_1F1B, SCHED_INTERLEAVED, SCHED_ZB_H1 };
enum { PLAN_MAX_CHUNKS = 16 };

/* slots[c]: the activation sets chunk c of `stage` keeps (at least 1), for
 * P stages, V chunks per stage (1 but interleaved) and M micro-batches. */
void plan_stage_slots(int schedule, int P, int V, int M, int stage, int *slots);

/* A tensor-parallel rank's share of tp ranks: elements of unit `unit`
 * (LAYER_EMBEDDING, a block, or the head L), the block activations one
 * micro-batch keeps (recompute: one full set, then each block's output;
 * sp: the layernorm and residual regions in B x T / tp rows, but the last
 * block's output) and its scratch ("activation gradients"), for blocks
 * first..last. */
size_t plan_tp_unit_numel(const ModelConfig *m, int unit, int tp);
/* The same for one tensor of the table (a model of `layers` blocks): its
 * elements, or a 1/tp slice of them for qkv's, attproj's weight, fc's and
 * fcproj's weight. */
size_t plan_tp_tensor_numel(const ParamTensor *x, int layers, int tp);
size_t plan_tp_block_activation_bytes(const ModelConfig *m, int tp, int B, int T, int first_block,
                                      int last_block, int recompute, int sp);
size_t plan_tp_scratch_bytes(const ModelConfig *m, int tp, int B, int T);
/* ZB-H1's output gradients kept for W by a tensor-parallel rank, per slot
 * (tp_kept_grads_create): every block of its stage, whichever chunk the
 * slot is of, in local widths, and the logits' gradient where it holds the
 * head. */
size_t plan_tp_kept_grads_bytes(const ModelConfig *m, int tp, int B, int T, int first_block, int last_block,
                                int head);

#endif
