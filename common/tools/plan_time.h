/* plan_time.h: a run's step time, predicted from a machine's constants and
 * the plan's FLOPs and bytes (common/plan --machine FILE): the work each
 * rank's dry run counted (plan_work.h: dry-work.csv) where the planner has
 * it, else the formulas marked "formula" below.
 *
 * The machine: one rank's device and its links, read from a text file of
 * `key = value` lines (# starts a comment; every key once, all required):
 *
 *   name                      a word naming the machine
 *   flops                     FLOP/s one rank sustains in the course's training step  1e6..1e18
 *                             (calibrate.sh: 01's counted FLOPs over its measured step)
 *   alpha_s                   latency of one message of a collective, s               1e-9..1
 *   beta_bytes_per_s          bytes a rank sends per second in a collective           1e3..1e14
 *   h2d_bytes_per_s           host to device copies (06's updated slices)             1e3..1e14
 *   d2h_bytes_per_s           device to host copies (06's gradient slices)            1e3..1e14
 *   cpu_adam_params_per_s     06's host AdamW (06_offload/adambench's cpu_adamw)      1e3..1e14
 *   device_adam_params_per_s  the device's AdamW (the kernel table's adamw_update)    1e3..1e14
 *   device_mem_bytes          memory of one device                                    1e6..1e15
 *   overlap                   the fraction of an overlappable collective's time       0..1
 *                             that hides under the computation beside it (calibrate.sh:
 *                             02 flat against 02 overlap on 2 ranks, the planner's own
 *                             prediction of both at 0 and at 1); 0 where communication
 *                             and computation share the same cores, below 1 on a GPU,
 *                             whose collectives' kernels take SMs and memory bandwidth
 *                             from the kernels beside them
 *
 * A number outside its range (the last column: any machine from a loaded CPU
 * core to an accelerator) is refused as it is read, naming the range.
 *
 * The step, per rank, in parts (each printed and written by --time-csv):
 *
 *   compute         counted: the rank's pieces' FLOPs (fwd, bwd, bwd_input, bwd_weight, other:
 *                   every kernel its dry run called, a recomputed forward, a ring's additions
 *                   included) / flops.
 *                   formula: FLOPs per step / (dp x pp x cp x tp) / flops, FLOPs per token
 *                   6P + 12LTC, P the parameters a token's step reads (an MoE block's top-K
 *                   of its E experts: plan_active_params) (x 4/3 with --recompute: the forward, a third, runs twice; x 5/3
 *                   under zb-h1, whose W runs it once more)
 *   device update   counted: the update pieces' FLOPs (norm, clipping) / flops + the AdamW
 *                   elements the device updated / device_adam_params_per_s.
 *                   formula: the parameters this rank updates / device_adam_params_per_s
 *                   (a model split's rank: P / (pp x tp), / dp with 05's ZeRO; 03's --cp ranks
 *                   each hold all of it)
 *   communication   per collective: calls x ring steps x alpha_s + bytes sent / beta
 *                   (ring steps: 2(N-1) for an all-reduce, N-1 for a
 *                   reduce-scatter, an all-gather or an all-to-all, N the group's ranks: dp
 *                   (dp x cp for the weights' all-reduce), or tp for a tensor
 *                   group's all-reduces of activations and, with --sp, its
 *                   all-gathers and reduce-scatters, cp for 03's Ulysses
 *                   all-to-alls, ep for --ep's dispatch and combine; one for a message to a
 *                   neighbouring stage or round 03's ring; bytes sent as comm.h
 *                   counts them: the dry run's dry-comm.csv). A model split's messages and
 *                   the all-to-alls all count as waited for. The overlap rule: what a worker
 *                   thread runs under computation (comm_worker.h: queued, the caller computes,
 *                   and waits for it later; on a GPU on the communication stream beside the
 *                   compute stream) can hide: 02 --dp-mode overlap's buckets and 05 stage 2's
 *                   reduce-scatters under the backward (counted, the bwd pieces' time;
 *                   formula, two thirds of compute); stage 3's gathers, with --prefetch 1 or
 *                   more, half under the forward, the other half and its reduce-scatters
 *                   under the backward. Everything else is waited for whole (02 flat, 05
 *                   stage 1, stage 2's all-gather after the update, stage 3's gathers
 *                   without prefetch, which the caller waits for as soon as they are queued).
 *                   What runs past its window cannot hide, nor the call that has no
 *                   computation beside it (a call's average: 02's last bucket, stage 2's
 *                   last unit's reduce-scatter, stage 3's first gather and last
 *                   reduce-scatter); of the rest, the machine's overlap fraction hides:
 *                   exposed = blocking + overlapped - overlap x (overlapped - max(tail, past))
 *                   Which calls can hide is written here per chapter, not read from the dry
 *                   run: its ledger (dry-comm.csv) counts a worker's calls into its group's
 *                   columns, and a dry run takes no time, so it cannot tell a call queued
 *                   and waited for at once (stage 3 without prefetch) from one that runs
 *                   beside a unit's computation
 *   bubble          counted: the stages' own lists of actions, as their dry runs
 *                   ran them, replayed with each action's counted time
 *                   (schedule_replay_lists), less this rank's computing pieces;
 *                   03's layer split, the other stages' computing pieces
 *                   (plan_work.h). formula: (pp - 1) / M x compute (GPipe and
 *                   1F1B), / V interleaved, / 3 ZB-H1 (tf = tb = tw); 03's layer
 *                   split, one micro-batch at a time: (pp - 1) x compute
 *   offload copies  06: d2h bytes / d2h_bytes_per_s + h2d bytes / h2d_bytes_per_s
 *   cpu update      06: counted, the host_update piece's AdamW elements; formula, shard
 *                   parameters (a split's: / (pp x tp)); / cpu_adam_params_per_s; with --dpu
 *                   it runs under the next step's compute: max(0, cpu - compute)
 *
 *   step = compute + device update + exposed communication + bubble
 *          + offload copies + exposed cpu update */
#ifndef PLAN_TIME_H
#define PLAN_TIME_H

#include "common/run/config.h" /* Config and the flag tables */
#include "common/tools/plan_layout.h" /* a layout for the time model */
#include "common/tools/plan_machine.h" /* machine files */
#include "common/tools/plan_work.h" /* the step time from counted work */


enum {
    PART_COMPUTE,
    PART_DEVICE_UPDATE,
    PART_COMMUNICATION,
    PART_BUBBLE,
    PART_OFFLOAD_COPIES,
    PART_CPU_UPDATE,
    PART_COUNT
};

typedef struct {
    double busy_s[PART_COUNT];    /* the time of each activity */
    double exposed_s[PART_COUNT]; /* what of it the step waits for */
    double step_s;                /* the sum of exposed_s */
    double flops_per_step;        /* of the whole batch, every rank */
} PlanTime;

const char *part_name(int part);
/* The parameters one token's step reads: all of them, less in each MoE block the weights of
 * the E - K experts it is not sent to ((E - K) / E of the block's experts; the router always
 * runs). A dense model's: P. */
double plan_active_params(const ModelConfig *mc);
/* The formula's FLOPs per token: 6 x plan_active_params + 12LTC. */
double plan_flops_per_token(const ModelConfig *mc);
/* The formulas alone (no dry-work.csv): plan_time_work(cfg, l, t, m, NULL, NULL, out). */
void plan_time(const Config *cfg, const PlanLayout *l, const PlanTraffic *t, const Machine *m, PlanTime *out);
/* One rank's step: work its dry run's pieces (plan_work_read of its dry-work.csv) and stages
 * the pieces of the rank at each of its pipeline's l->pp stages with its own tp and cp place
 * (NULL without stages), or work NULL for the formulas. */
void plan_time_work(const Config *cfg, const PlanLayout *l, const PlanTraffic *t, const Machine *m,
                    const PlanWork *work, const PlanWork *stages, PlanTime *out);

#endif
