/* plan_time.h: a run's step time, predicted from a machine's constants and
 * the plan's FLOPs and bytes (common/plan --machine FILE).
 *
 * The machine: one rank's device and its links, read from a text file of
 * `key = value` lines (# starts a comment; every key once, all required):
 *
 *   name                      a word naming the machine
 *   flops                     FLOP/s one rank sustains in the course's training step  1e6..1e18
 *   alpha_s                   latency of one message of a collective, s               1e-9..1
 *   beta_bytes_per_s          bytes a rank sends per second in a collective           1e3..1e14
 *   h2d_bytes_per_s           host to device copies (06's updated slices)             1e3..1e14
 *   d2h_bytes_per_s           device to host copies (06's gradient slices)            1e3..1e14
 *   cpu_adam_params_per_s     06's host AdamW (06_offload/adambench's cpu_adamw)      1e3..1e14
 *   device_adam_params_per_s  the device's AdamW (the kernel table's adamw_update)    1e3..1e14
 *   device_mem_bytes          memory of one device                                    1e6..1e15
 *
 * A number outside its range (the last column: any machine from a loaded CPU
 * core to an accelerator) is refused as it is read, naming the range.
 *
 * The step, per rank, in parts (each printed and written by --time-csv):
 *
 *   compute         FLOPs per step / (dp x pp x cp x tp) / flops, FLOPs per token 6P + 12LTC
 *                   (x 4/3 with --recompute: the forward, a third, runs twice; x 5/3 under
 *                   zb-h1, whose W runs it once more)
 *   device update   the parameters this rank updates / device_adam_params_per_s
 *                   (a model split's rank: P / (pp x tp), / dp with 05's ZeRO; 03's --cp ranks
 *                   each hold all of it)
 *   communication   per collective: calls x ring steps x alpha_s + bytes sent / beta
 *                   (ring steps: 2(N-1) for an all-reduce, N-1 for a
 *                   reduce-scatter or an all-gather, N the group's ranks: dp
 *                   (dp x cp for the weights' all-reduce), or tp for a tensor
 *                   group's all-reduces of activations and, with --sp, its
 *                   all-gathers and reduce-scatters; one for a message to a
 *                   neighbouring stage or round 03's ring; bytes sent as comm.h
 *                   counts them, plan_traffic's). A model split's messages all
 *                   count as waited for. The overlap rule: what a worker
 *                   thread runs under computation (02 --dp-mode overlap's
 *                   buckets and 05 stage 2's reduce-scatters under the
 *                   backward, two thirds of compute; stage 3's gathers, with
 *                   --prefetch 1 or more, and its reduce-scatters under the
 *                   whole compute) is exposed only past that window:
 *                   exposed = blocking + max(0, overlapped - window)
 *   bubble          pipeline stages idle: (pp - 1) / M x compute (GPipe and
 *                   1F1B), / V interleaved, / 3 ZB-H1 (tf = tb = tw); 03's layer
 *                   split, one micro-batch at a time: (pp - 1) x compute
 *   offload copies  06: d2h bytes / d2h_bytes_per_s + h2d bytes / h2d_bytes_per_s
 *   cpu update      06: shard parameters (a split's: / (pp x tp)) / cpu_adam_params_per_s; with --dpu
 *                   it runs under the next step's compute: max(0, cpu - compute)
 *
 *   step = compute + device update + exposed communication + bubble
 *          + offload copies + exposed cpu update */
#ifndef PLAN_TIME_H
#define PLAN_TIME_H

#include "config.h"
#include "plan_layout.h"

typedef struct {
    char name[64];
    double flops, alpha_s, beta_bytes_per_s, h2d_bytes_per_s, d2h_bytes_per_s;
    double cpu_adam_params_per_s, device_adam_params_per_s, device_mem_bytes;
} Machine;

/* Reads a machine file; a bad one ends the program with one line naming the
 * file, the line and what is wrong (exit 2). */
void machine_read(const char *path, Machine *m);

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
void plan_time(const Config *cfg, const PlanLayout *l, const PlanTraffic *t, const Machine *m, PlanTime *out);
/* The slowest of a replica's pp x tp ranks, t[r] each rank's traffic: the step every rank waits for. */
void plan_time_slowest(const Config *cfg, const PlanLayout *l, const PlanTraffic *t, const Machine *m,
                       PlanTime *out);

#endif
