/* offload.h: ZeRO-Offload (chapter 06): the device keeps only what it computes
 * with; the optimizer lives in host memory and runs on the CPU.
 *
 * What sits where, per parameter of this rank's units (N data-parallel ranks,
 * the shard layout of param_table.h: rank r owns slice r of every unit):
 *
 *   device                      bytes           host (pinned)                    bytes
 *   params, 16 bits (or fp32)   2 (4)           master weights, fp32             4 / N
 *   a unit's gradient, fp32     working buffer  Adam m and v, fp32               8 / N
 *   a reduced slice (outbox)    working buffer  gradient shard, fp32             4 / N (8 / N, --dpu)
 *   two updated slices (inbox)  working buffer  staging: gradient slices         2 / N (4 / N in fp32)
 *                                               staging: updated 16-bit weights  2 / N (16 bits only)
 *
 * So a device needs 2 bytes per parameter and a few unit-sized buffers where
 * chapter 05's stage 2 needs 2 + 14 / N, and chapter 01 16.
 *
 * One step, and which stream each move runs on (device.h, "Streams and events"):
 *
 *   backward of unit u           compute   u's gradient, fp32, into the unit buffer
 *   (16 bits) round it           compute   the unit's gradient to 16 bits
 *   reduce-scatter over dp       comm      this rank's slice of the unit's sum into the outbox
 *   copy the slice D2H           copy      outbox -> the host's staging, after an event on
 *                                          compute (or the collective's return); the backward
 *                                          of unit u-1 runs meanwhile
 *   add it into the fp32 shard   host      when the copy of u is done, found before the outbox
 *                                          is reused by unit u-1 or at the end of backward;
 *                                          (16 bits) the sum rounded to 16 bits, as 01's is
 *   gradient norm, loss scale    host      from the fp32 shard; summed over the ranks
 *   AdamW on unit u's slice      host      cpu_adamw: master, m, v, and the 16-bit rounding
 *   copy the slice H2D           copy      host staging -> inbox[u % 2]; AdamW of unit u+1
 *                                          runs on the CPU meanwhile
 *   all-gather over dp           comm      every rank's updated slice into the 16-bit params,
 *                                          after the compute stream waited for the copy
 *
 * Under zb-h1 (the backward split into B and W, chapter 04) the storage
 * calls run around a unit's B and again around its W: each reduce-scatters
 * and copies what its half added (the other half's elements zeros), so a
 * unit's gradient crosses twice per micro-batch (the embedding, which has
 * no W, once) and lands in the host's shard as 1F1B's would, bit for bit.
 *
 * PCIe carries 2 bytes per parameter each way per step divided by N (the
 * reduce-scatter runs on the device first: ZeRO-2), and the CPU touches
 * 4 + 4 + 8 + 2 bytes per parameter of its shard per update.
 *
 * Delayed parameter update (--dpu): the host update of step t runs on a host
 * thread while the device computes forward and backward of step t+1, with
 * the weights of step t-1: one step stale. Its result is copied to the
 * device after step t+1's backward, and the update of step t+1 starts. It is
 * not the same optimizer as AdamW: every gradient is taken at weights one
 * update older than AdamW's. The fp32 gradient shard is double: the step
 * computing fills one while the thread reads the other.
 *
 * Parameter offload (--offload-params): the weights leave the device too.
 * Their copy of record in the precision computed with is the host's
 * (params16, 16 bits; in fp32 the master weights themselves; with N ranks
 * each rank's shard of them, ZeRO-3's partitioning on the host), and a unit
 * (N ranks: this rank's slice of it, then all-gathered over the group on
 * the device) crosses PCIe into one of K + 1 device slots (K = 1: double buffering)
 * just before each forward and each backward that reads it, by chapter
 * 05's gather/free schedule (zero.h: zero_schedule_uses) over the step's
 * computations, a copy where ZeRO-3 gathers: the copy of the next unit runs
 * on the copy stream while this one computes, and a slot is free again once
 * its computation is done. With --tie-embeddings the head reads the
 * embedding unit's wte: the embedding is copied in for it too, into a slot
 * of its own (tied_slot). With --dpu the steps copy in a copy of the
 * weights of their own (host_weights), which the update's thread does not
 * write, installed when it is joined. Per parameter:
 *
 *   device                         host (pinned)
 *   a slot: 2 (4) per parameter    params, 16 bits       2 (fp32: the master's)
 *   of the largest unit, K + 1     master, m, v, grads   16
 *
 * and PCIe carries 2 (4) bytes per parameter up per forward and per
 * backward of each micro-batch (zb-h1's W reads the weights a third time),
 * divided by N, the gradients' 2 (4) / N down as before; the update's
 * weights no longer cross. The network carries each unit's all-gather per
 * use, ZeRO-3's 3 x 2 bytes a parameter instead of stage 2's 2 x 2.
 *
 * On the CPU backend the device buffers are host memory too: the same calls
 * move the same bytes (memcpy), the same accounting says where they sit. */
#ifndef OFFLOAD_H
#define OFFLOAD_H

#include "common/run/checkpoint.h" /* save and resume */
#include "common/comm/comm.h" /* collectives and messages between ranks */
#include "common/run/config.h" /* Config and the flag tables */
#include "common/device/device.h" /* mem_alloc, copies, streams, timers */
#include "common/core/half.h" /* bf16 and fp16 conversions */
#include "common/model/model.h" /* GPT, its forward and backward */
#include "common/model/optimizer_step.h" /* the optimizer step: norm, clip, skip, AdamW */
#include "03_model_parallel/tensor_parallel.h" /* 03: tensor parallelism */
#include "05_zero/zero.h" /* 05: ZeRO's shards and its gather/free schedule */
#include "common/run/timeline.h" /* timeline.csv for the Gantt charts */

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

/* What one update needs besides the state: the step's learning rate and the
 * factor on the gradients (clipping, divided by the loss scale). */
typedef struct {
    float lr, grad_scale;
} OffloadUpdate;

/* --offload-params: a device buffer a unit's weights are copied into. */
typedef struct {
    void *data;            /* (the largest unit; N ranks: N * S, padded) its weights, elem_bytes each,
                              device, CAT_PARAMS */
    void *slice;           /* N ranks: (S) this rank's slice as it arrives from the host, CAT_COMM */
    int use;               /* the computation it is held for, or -1: free */
    DeviceEvent *copied;   /* its copy from the host done (copy stream) */
    DeviceEvent *released; /* the last computation that read it done (compute stream) */
    double copy_ms[2];     /* its copy: when queued, when the call returned */
} UnitSlot;

typedef struct {
    /* ---- layout: units first_unit..last_unit of model, sharded over group ---- */
    GPT *model;
    int first_unit, last_unit;
    CommGroup *group; /* the data-parallel ranks sharing these units */
    int rank, ranks;
    int half;          /* 16-bit parameters (--precision bf16|fp16) */
    HalfFormat format; /* when half */
    CommDtype dtype;   /* of the parameters and the gradients that travel */
    size_t elem_bytes; /* 2 or 4 */
    size_t shard_n;    /* elements of this rank's shard of the range (padding included) */
    size_t max_slice;  /* the largest slice S of a unit of the range */
    const Config *cfg;
    const TensorParallelModel *slices; /* --tp: the units are this rank's tensor slices of them; else NULL */
    GradSpan *norm_spans; /* --tp: what the norm counts of the shard (zero.h's shard_norm_spans) */
    int num_norm_spans;

    /* ---- device ---- */
    void *params;       /* (param_count) the range's weights in 16 bits (or fp32), CAT_PARAMS;
                           NULL with host_params */
    float *unit_params; /* 16 bits: (largest unit) the unit at hand in fp32, CAT_WORKSPACE */
    float *unit_grads;  /* (N * max_slice) the unit's gradient in backward, fp32, CAT_BUCKETS */
    void *unit_grads16; /* 16 bits and N > 1: (N * max_slice) it, rounded for the reduce-scatter */
    void *outbox;       /* (max_slice) this rank's reduced slice, until its D2H copy is done */
    void *inbox[2];     /* N > 1: (max_slice) an updated slice arrived from the host, CAT_COMM */
    void *gathered;     /* N > 1: (N * max_slice) a unit all-gathered, CAT_COMM */
    DeviceEvent *compute_done, *copied_out, *copied_in[2];
    /* --tie-embeddings, the range from the embedding to the head: the head
     * reads wte, the embedding unit's, which is not bound while the head's
     * unit is. 16 bits: tied_wte is wte widened for the head (fp32: the head
     * reads params' wte). The head's gradient of wte waits in tied_dwte for
     * the embedding unit's backward, which starts from it, so that it crosses
     * PCIe once, with the embedding's. CAT_WORKSPACE, wte's elements (wte_numel,
     * from wte_at in the embedding unit) each; tied_dwte NULL: untied. */
    float *tied_wte, *tied_dwte;
    size_t wte_at, wte_numel;

    /* ---- host, pinned ---- */
    void *grads_landing; /* (shard_n) the slices as they cross PCIe (16 bits or fp32), CAT_COMM */
    float *grads[2];     /* (shard_n) fp32 sums over the step's micro-batches, CAT_GRADS; [1]: --dpu */
    int cur;             /* the one this step's backward fills */
    float *master;       /* (shard_n) fp32 weights of record, CAT_OPTIMIZER */
    float *m, *v;        /* (shard_n) Adam's moments, CAT_OPTIMIZER */
    uint16_t *params16;  /* 16 bits: (shard_n) updated weights rounded, to cross back, CAT_COMM;
                            with host_params the weights of record, CAT_PARAMS */
    int t;               /* updates applied so far */

    /* ---- the step ---- */
    int pending;                   /* the unit whose slice the outbox holds in flight, or NO_UNIT */
    double out_ms[2], in_ms[2][2]; /* each copy: when queued, when its call returned */
    unsigned char *arrived;        /* per unit of the range: a micro-batch's slice added this step */
    double bytes_d2h, bytes_h2d;   /* this step's PCIe traffic, this rank */

    /* ---- the timeline (optional): rows for the copies and the CPU update ---- */
    Timeline *timeline;
    const double *origin_ms; /* the step's time origin */
    int step;                /* 1-based, for the timeline */

    /* ---- --dpu: the host update running on its own thread ---- */
    pthread_t worker;
    int worker_running;
    int worker_grads; /* which gradient shard it reads */
    OffloadUpdate worker_update;
    double worker_start_ms, worker_end_ms;

    /* ---- --offload-params: the weights on the host, each unit copied in for its computation ---- */
    int host_params;
    void *host_weights;    /* (shard_n) what the steps copy in: params16 (16 bits) or master (fp32), or
                              with --dpu a copy of them, installed after each update, CAT_PARAMS */
    UnitSlot *slots;       /* num_slots = prefetch + 1 (fewer if the step computes fewer) */
    UnitSlot tied_slot;    /* --tie-embeddings: the embedding unit for the head, which reads its wte */
    int num_slots;
    ZeroAction *fetches;   /* the step's copies, computations and releases (zero.h's schedule) */
    int num_fetches, uses; /* actions, computations */
    int cursor;            /* the next action; fetching: the step's schedule runs */
    int fetching;

    UnitHooks storage; /* model->storage: bind a unit before it is computed, offload its gradient after */
} Offload;

/* Units first_unit..last_unit of model (a table with no storage bound: a
 * GPT from gpt_init, or a Pipeline with caller_storage), sharded over group:
 * the device parameters and the host state, initial values from cfg->seed.
 * dpu: keep a second gradient shard for the delayed update. host_params
 * (--offload-params): no device parameters, the units
 * come from the host by the schedule offload_schedule_fetches sets. Takes
 * over model->storage and the model's matmul precision. */
void offload_create(Offload *o, GPT *model, int first_unit, int last_unit, CommGroup *group,
                    const Config *cfg, int dpu, int host_params);
/* The same over a tensor-parallel rank's slices of a stage (tm built with
 * tp->caller_storage, tensor_parallel.h): the host shard is this rank's dp
 * slice of each unit's slices, the initial values are tm's, and the norm
 * counts the tensors that every tp rank holds whole on tp rank 0 only. */
void offload_create_slices(Offload *o, TensorParallelModel *tm, CommGroup *group, const Config *cfg, int dpu,
                           int host_params);
/* host_params: the computations of one step in the order they run (every
 * forward and backward of every micro-batch, each of a unit), and how many
 * units ahead of the one computing are copied in (prefetch K: K + 1 device
 * slots). Each step's storage calls must follow it (a call out of order
 * ends the job, naming it); outside a step (evaluation, sampling) a unit is
 * copied in when it is needed. */
void offload_schedule_fetches(Offload *o, const ZeroUse *uses, int count, int prefetch);
void offload_destroy(Offload *o);
/* Add rows to timeline (op "grad_d2h", "cpu_adam", "param_h2d"), in
 * microseconds since *origin_ms. */
void offload_attach_timeline(Offload *o, Timeline *timeline, const double *origin_ms);

/* Before the step's first forward: step is 1-based. With --dpu the other
 * gradient shard is filled this step. */
void offload_begin_step(Offload *o, int step);
/* After the step's last backward: wait for the copies in flight and add
 * them into the host's fp32 shard. */
void offload_finish_grads(Offload *o);
/* What this rank holds of the gradient, for the norm (optimizer_step.h):
 * its fp32 shard in host memory (Inf or NaN where an fp16 gradient or
 * its sum over the micro-batches overflowed, as in chapter 01), read by
 * the CPU kernels whichever backend computes; the shards of every rank of
 * `world` make the model. */
GradShards offload_grad_shards(const Offload *o, CommGroup *world);

/* The update of this step's gradients, done before returning: AdamW on the
 * host unit by unit, each unit's new weights copied up while the CPU updates
 * the next, then all-gathered. */
void offload_update(Offload *o, const OffloadUpdate *u);
/* The delayed update (exercise 06.2): start the host update of this step's
 * gradients on a thread and return; offload_update_wait ends it, the new
 * weights on the device. 06's update_weights decides when each is called. */
void offload_update_start(Offload *o, const OffloadUpdate *u);
void offload_update_wait(Offload *o);
/* The whole shard's update from gradient shard `grads` (0 or 1: o->cur is
 * this step's), run now on this thread, then the weights copied up
 * (--dpu-reference: the one-step-stale sequence without a thread, to check
 * the threaded one against). */
void offload_update_shard(Offload *o, int grads, const OffloadUpdate *u);

/* ---- checkpoints (checkpoint.h) ----
 * What a checkpoint holds of this rank is its host shard: the fp32 master
 * weights, m and v of its units' slices, laid out as param_table.h lays out a
 * shard of units first_unit..last_unit (ckpt_layout_shards). The device's
 * weights are those rounded, so they are not saved; after a resume
 * offload_weights_from_master puts them back. Adam's update count is o->t. */
void offload_checkpoint_layout(const Offload *o, CkptLayout *l);
/* After a checkpoint was read into the host shard: each unit's slice (rounded
 * to 16 bits, or fp32) copied up and all-gathered over the data-parallel
 * ranks, as after an update. No update may be in flight. */
void offload_weights_from_master(Offload *o);

#endif
