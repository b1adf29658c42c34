/* data_parallel.h: the data-parallel machinery of chapter 02, which every
 * later chapter keeps (03 and 04 link it through the Makefile's NN_name_USES).
 *
 * The replicas of a part of the model (the whole model in chapter 02; a
 * stage's units or a tensor-parallel rank's slices later) train on their
 * shares of the global batch. Because the loss is the mean over every token
 * of the global batch, their gradients only need to be SUMMED: one
 * all-reduce over the data-parallel group, in one of three ways
 * (--dp-mode):
 *
 *   naive    one all-reduce per named tensor, after the backward pass
 *   flat     one all-reduce of the whole gradient buffer (it is contiguous)
 *   overlap  buckets all-reduced during the backward pass (buckets.h)
 *
 * by the library (MPI, NCCL) or the course's own ring (--allreduce ring,
 * ring.h). Under mixed precision the gradients, and so the all-reduce, are
 * 16 bits: half the bytes. */
#ifndef DATA_PARALLEL_H
#define DATA_PARALLEL_H

#include "02_data_parallel/buckets.h" /* 02: gradient buckets during the backward */
#include "common/comm/comm.h" /* collectives and messages between ranks */
#include "common/run/config.h" /* Config and the flag tables */
#include "common/model/mixed.h" /* mixed precision: 16-bit weights, loss scaling */
#include "common/model/model.h" /* GPT, its forward and backward */

/* ---- the flags (a later chapter's table takes these rows: FLAG_ROWS, config.h) ---- */
typedef struct {
    char dp_mode[8];    /* naive, flat, overlap */
    double bucket_mb;   /* overlap: bucket size */
    char allreduce[8];  /* ring, library */
    int check_replicas; /* every N steps, 0 = never */
    int print_buckets;  /* overlap: print the buckets after the run */
    int ranks;          /* the world size, for the checks */
} DataParallelFlags;

extern const Flag data_parallel_flags[];
/* The batch split evenly over the ranks and their micro-batches; else one
 * line naming the rule (EXIT_USAGE). */
void data_parallel_check_flags(const Config *cfg, const DataParallelFlags *f);


/* ---- the gradients of the part a rank holds, and their sum over its replicas ---- */
/* A later technique that sums the replicas' gradients its own way (into
 * shards, or on the host) answers the step's calls itself: begin_step and
 * sum_gradients call these (owner: its state), backward_hook gives NULL
 * (it moves the gradients from the units' storage calls, model.h), and
 * check_replicas, broadcast_weights, print and destroy leave the rest to
 * it. See data_parallel_take_over. */
typedef struct {
    void (*begin_step)(void *owner);
    double (*sum_gradients)(void *owner, double *busy_ms);
} DataParallelOps;

typedef struct {
    const DataParallelFlags *flags;
    CommGroup *group; /* the replicas of this rank's part */
    GPT *part;        /* what this rank holds: its table, its units (param_first, param_count) */
    char *grads;      /* part's gradients, of `type`: fp32, or mixed precision's 16 bits */
    CommDtype type;
    int overlap;        /* --dp-mode overlap: buckets launched from the backward pass */
    BucketSync buckets; /* overlap */
    float *planted;     /* tests only (util.h's COURSE_FAULT_PLANT): a buffer all-reduced once a step */
    size_t planted_count;
    BucketRange *apart; /* data_parallel_hold_apart's ranges, ascending (NULL: none) */
    int apart_count;
    CommGroup *apart_group; /* the ranks holding them */
    const DataParallelOps *ops; /* data_parallel_take_over's (NULL: the ways above) */
    void *owner;
} DataParallel;

/* The replicas of `part` (held by this rank as `mixed` says: fp32 or 16 bits)
 * in `group`; overlap's buckets are made here. */
void data_parallel_create(DataParallel *dp, const DataParallelFlags *flags, CommGroup *group, GPT *part,
                          MixedModel *mixed, Precision precision);
void data_parallel_destroy(DataParallel *dp);
/* The replicas of a part whose gradients a later technique sums its own
 * way: the calls below answered by ops, with owner (DataParallelOps). */
void data_parallel_take_over(DataParallel *dp, const DataParallelFlags *flags, const DataParallelOps *ops,
                             void *owner);

/* Parts held by fewer ranks than the replicas: elements [lo, hi) of the part
 * for each of `count` ranges (ascending, whole tensors), held alike only by
 * the ranks of `group` (a subgroup of the replicas, every rank in one; chapter
 * 03's experts under --ep). Their gradients are summed over `group` (after
 * the backward pass, in every mode: overlap's buckets are cut around them),
 * their weights broadcast and compared within it; the rest of the part as
 * before. Collective over the replicas; before the first step. */
void data_parallel_hold_apart(DataParallel *dp, const BucketRange *ranges, int count, CommGroup *group);

/* Start of a step (overlap: no bucket launched yet). */
void data_parallel_begin_step(DataParallel *dp);
/* The hook that launches overlap's buckets from the backward pass (a
 * UnitHook for gpt_backward_hooked, its context the DataParallel), or NULL
 * when buckets are not in use or this is not the step's last micro-batch. */
UnitHook data_parallel_backward_hook(const DataParallel *dp, int last_micro);

/* The gradients summed over the replicas: all-reduced now (naive, flat), or
 * waited for (overlap). Returns how long this rank waited; *busy_ms: how
 * long the all-reduces ran. */
double data_parallel_sum_gradients(DataParallel *dp, double *busy_ms);

/* Every replica must hold the same parameters (`params`, fp32: the model's
 * or, in mixed precision, the master weights): compare a hash of their
 * bytes, and end the job naming the first replica that differs. (For testing
 * this check: COURSE_FAULT_REPLICA_RANK=r changes one weight on rank r first.) */
void data_parallel_check_replicas(const DataParallel *dp, const float *params, int step);

/* Identical initialisation already follows from (seed, name, index); the
 * broadcast from the group's rank 0 makes "rank 0's weights" the rule, as
 * real frameworks do. */
void data_parallel_broadcast_weights(const DataParallel *dp, const MixedModel *mixed);

/* After the run: --print-buckets (rank 0), with overlap. */
void data_parallel_print(const DataParallel *dp);

#endif
