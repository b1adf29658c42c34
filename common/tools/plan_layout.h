/* plan_layout.h: what a chapter's run of a layout holds in memory and sends,
 * computed without running it (common/plan).
 *
 * The memory is memory.csv's: peak bytes per (space, category) of one rank.
 * It is summed from the same size functions the programs allocate with
 * (param_table.h's units and shards, model.h's activation_bytes,
 * activation_bytes_range, scratch_bytes, recompute_block_bytes and the
 * model's linear shapes, kernels.h's and attention.h's CPU workspaces), in
 * the order each chapter allocates: plan_layout.c mirrors, chapter by
 * chapter, which buffers a rank allocates and under which tag, and
 * tests/plan.bats checks every row against the programs' memory.csv.
 * The ranks of a data-parallel layout hold the same bytes (units are
 * padded to a multiple of N); those of a model split (chapters 03-05's
 * stages and tensor slices, plan_stage.h) differ by stage, so the plan is
 * made per rank.
 *
 * Known limits, each named in --help and course.md: the CPU backend's
 * kernel workspaces (on CUDA, cuBLAS and the CUDA kernels keep others, and
 * comm.c's host staging appears without NCCL). The ring all-reduce
 * (--allreduce ring) is planned where the chapters run it: 02's replicas,
 * and 03-05's over the ranks holding the same weights (dp x cp). */
#ifndef PLAN_LAYOUT_H
#define PLAN_LAYOUT_H

#include "config.h"
#include "device.h"
#include "plan_stage.h"

#include <stddef.h>

/* The layout, as the chapter's own flags give it. */
typedef struct {
    int chapter;         /* 1..6 */
    int dp;              /* data-parallel ranks (mpirun -np for 02 and 05) */
    int tp, pp;          /* 03-05: tensor-parallel ranks, pipeline stages (03's layer split: its stages);
                            world = dp x pp x tp, tp fastest, then pp, then dp (grid.h) */
    int schedule;        /* 04-05: SCHED_GPIPE .. SCHED_ZB_H1 (plan_stage.h); 03: one micro-batch at a time */
    int chunks;          /* --virtual: chunks of layers per stage (interleaved), else 1 */
    const char *split;   /* --split: blocks per stage (per piece with chunks), "" = balanced */
    int zero;            /* 05: 0..3; 06: 2 */
    int prefetch;        /* 05, stage 3 */
    int dpu;             /* 06: the delayed update's second gradient shard */
    int cp;              /* 03: context-parallel ranks per sequence (--cp; 0 or 1: none); world = dp x pp x cp x tp */
    int sp;              /* 03 --mp tensor: sequence parallelism (--sp) */
    int threads;         /* OpenMP threads of a rank: the CPU attention workspace */
    int dp_mode;         /* 02: DP_NAIVE, DP_FLAT or DP_OVERLAP (the same memory and bytes) */
    double bucket_bytes; /* 02, overlap: --bucket-mb */
    int ring;            /* 02-05: --allreduce ring (02_data_parallel/ring.c) */
} PlanLayout;

enum { DP_NAIVE, DP_FLAT, DP_OVERLAP };

typedef struct {
    size_t bytes[SPACE_COUNT][CAT_COUNT]; /* peak bytes per (space, category), as memory.csv */
} PlanMemory;

/* The collectives of one optimizer step, bytes this rank sends as
 * common/comm counts them (comm.h): an all-reduce of b bytes 2(N-1)/N b, a
 * reduce-scatter of N*b bytes (N-1) b, an all-gather of b bytes per rank
 * (N-1) b; and the host-device copies of chapter 06. */
typedef struct {
    double allreduce, reduce_scatter, allgather;
    double send; /* 03-05: activations to the next stage, their gradients to the previous (point to point) */
    double to_host, to_device; /* 06: gradient slices out, updated weights in */
    /* the calls behind those bytes, each of which pays the latency (plan_time.h) */
    double allreduce_calls, reduce_scatter_calls, allgather_calls, send_calls;
    /* the all-reduces among them that sum activations within a tensor-parallel group of tp ranks */
    double tp_allreduce, tp_allreduce_calls;
    /* the sends among them round 03's context-parallel ring (keys and values, their gradients) */
    double cp_send, cp_send_calls;
} PlanTraffic;

/* The bytes of model state per rank for P parameters, shard_n of them in a
 * rank's shard (P / N when units divide), at ZeRO `stage` (0 for chapters
 * 01-02), 16-bit or not: params, grads and optimizer state, the ZeRO
 * paper's 16P, 4P + 12P/N, 2P + 14P/N, 16P/N (fp32: 16P, 8P + 8P/N, ...).
 * The exact plan and the formula mode (the paper's table) both use it. */
void plan_model_state(double P, double shard_n, int stage, int half, double *params, double *grads,
                      double *optimizer);

/* The world's ranks; the ranks of one replica (pp x cp x tp; the replicas
 * hold and send alike); what `rank` of them holds and sends. */
int plan_ranks(const PlanLayout *l);
/* The ring all-reduce (02's ring.c) of `count` elements of eb bytes over n ranks: its
 * chunk buffer (ring.c's "ring all-reduce chunk": count / n + 1 elements,
 * and in 16 bits as many floats more for the arriving chunk widened), and
 * what ring position r sends (the chunks it passes on in the reduce-scatter
 * and the all-gather, balanced: they differ by at most one element). */
size_t plan_ring_chunk_bytes(size_t count, int n, int eb);
double plan_ring_sent_bytes(size_t count, int n, int r, int eb);
int plan_replica_ranks(const PlanLayout *l);
/* How often a block's forward runs in a step: once; with --recompute again
 * in the backward (B), and under a pipeline's zb-h1 once more in W, which
 * recomputes it too (model.h). */
int plan_forward_runs(const Config *cfg, const PlanLayout *l);
void plan_memory(const Config *cfg, const PlanLayout *l, int rank, PlanMemory *m);
void plan_traffic(const Config *cfg, const PlanLayout *l, int rank, PlanTraffic *t);
/* Add what t sends to the grid axis each collective runs on, grid.h's order
 * (dp, pp, cp, tp), as the programs count them (harness.h's
 * run_axis_bytes_per_step): the replicas' gradient sum (over dp x cp in 03)
 * and ZeRO's collectives on dp, the stages' sends on pp, the ring's on cp,
 * the tensor group's all-reduces (and --sp's gathers and scatters) on tp. */
void plan_axis_bytes(const PlanLayout *l, const PlanTraffic *t, double axis[4]);

#endif
