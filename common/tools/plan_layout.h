/* plan_layout.h: a layout as the time model (plan_time.h) sees it, and the
 * ZeRO paper's model-state formula (common/plan --zero-table and
 * --offload-capacity).
 *
 * What a layout holds and sends is not computed here: the planner runs the
 * chapter's own program as a dry run per rank (plan_dry.h) and reads its
 * memory.csv and dry-comm.csv. PlanLayout is filled from what the program
 * read of its flags (run-info.txt); PlanTraffic from one rank's ledger. */
#ifndef PLAN_LAYOUT_H
#define PLAN_LAYOUT_H

#include "common/run/config.h" /* Config and the flag tables */

#include <stddef.h>

/* The schedules of chapter 04 (--schedule), in the order of its choices. */
enum { SCHED_GPIPE, SCHED_1F1B, SCHED_INTERLEAVED, SCHED_ZB_H1 };

/* The layout, as the program's flags give it. */
typedef struct {
    int chapter;         /* 1..6 (06 without --offload: 5, the step it runs) */
    int dp;              /* data-parallel ranks */
    int tp, pp;          /* tensor-parallel ranks, pipeline stages (03's layer split: its stages);
                            world = dp x pp x cp x tp, tp fastest, then cp, then pp, then dp (grid.h) */
    int schedule;        /* 04-06: SCHED_GPIPE .. SCHED_ZB_H1 */
    int chunks;          /* --virtual: chunks of layers per stage (interleaved), else 1 */
    int zero;            /* 05: 0..3; 06: 2 */
    int prefetch;        /* 05, stage 3 */
    int dpu;             /* 06: the delayed parameter update */
    int cp;              /* context-parallel ranks per sequence (1: none) */
    int ep;              /* 03's --ep: ranks sharing each MoE block's experts (1: none) */
    int sp;              /* sequence parallelism (--sp) */
    int dp_mode;         /* DP_NAIVE, DP_FLAT or DP_OVERLAP */
    double bucket_bytes; /* --bucket-mb */
    int ring;            /* --allreduce ring */
} PlanLayout;

enum { DP_NAIVE, DP_FLAT, DP_OVERLAP };

/* The collectives of one optimizer step of one rank, bytes this rank sends
 * as common/comm counts them (comm.h's ledger, summed over the axes), and
 * chapter 06's host-device copies. */
typedef struct {
    double allreduce, reduce_scatter, allgather;
    double send; /* point to point: the stages' activations and gradients, 03's ring, 02's ring all-reduce */
    double to_host, to_device; /* 06: gradient slices out, updated weights in */
    /* the calls behind those bytes, each of which pays the latency (plan_time.h) */
    double allreduce_calls, reduce_scatter_calls, allgather_calls, send_calls;
    /* the all-reduces among them on the tensor-parallel axis */
    double tp_allreduce, tp_allreduce_calls;
    /* the sends among them on the context-parallel axis (03's ring) */
    double cp_send, cp_send_calls;
    /* 03's all-to-alls: Ulysses' on the context-parallel axis, --ep's dispatch and combine on
     * the expert group (bytes sent, calls) */
    double alltoall, cp_alltoall_calls, ep_alltoall_calls;
} PlanTraffic;

/* The ZeRO paper's bytes of model state per rank for P parameters, shard_n
 * of them in a rank's shard, at ZeRO `stage`, 16-bit or not: params, grads
 * and optimizer state, 16P, 4P + 12P/N, 2P + 14P/N, 16P/N (fp32: 16P, 8P +
 * 8P/N, ...). The papers' tables only (--zero-table, --offload-capacity). */
void plan_model_state(double P, double shard_n, int stage, int half, double *params, double *grads,
                      double *optimizer);

/* The world's ranks; the ranks of one replica (pp x cp x tp). */
int plan_ranks(const PlanLayout *l);
int plan_replica_ranks(const PlanLayout *l);
/* How often a block's forward runs in a step: once; with --recompute again
 * in the backward (B), and under a pipeline's zb-h1 once more in W, which
 * recomputes it too (model.h). */
int plan_forward_runs(const Config *cfg, const PlanLayout *l);

#endif
