/* activation_offload.h: the activation checkpoints in host memory
 * (--offload-activations, with --recompute).
 *
 * With --recompute a micro-batch keeps, of each of the L blocks, only its
 * output (the next unit's input, model.h): L x B x T x C floats on the
 * device, per micro-batch in flight. Here they wait in pinned host memory
 * instead, and the device holds two of them (double buffering), through
 * model.h's CheckpointStore, given to the pipeline (StageLayout.checkpoints):
 *
 *   forward of block l     compute   its output into device[l % 2], after the
 *                                    copy out of block l-2's output, which was
 *                                    there, has left
 *   copy it D2H            copy      device[l % 2] -> host (slot, l), after an
 *                                    event on compute; block l+1 runs meanwhile
 *   backward of unit l+1   compute   reads block l's output from device[l % 2]:
 *                                    there still (the last two of a forward), or
 *                                    copied back H2D while unit l+2's backward ran
 *   copy block l-1's H2D   copy      host (slot, l-1) -> device[(l-1) % 2], queued
 *                                    as unit l+1's backward starts, after an event
 *                                    on compute (unit l+2 no longer reads it)
 *
 * The bytes are the same bytes: the recomputation reads exactly what the
 * forward wrote, so the losses are those of --recompute bit for bit. PCIe
 * carries L x B x T x C x 4 bytes down per micro-batch and, under 1f1b, up
 * (L - 2) of them (the last two are still on the device); the device saves
 * (L - 2) x B x T x C x 4 bytes per micro-batch in flight.
 *
 * Rows in the stage's timeline: "act_d2h" and "act_h2d", micro = the block.
 * On the CPU backend the same calls move the same bytes (memcpy). */
#ifndef ACTIVATION_OFFLOAD_H
#define ACTIVATION_OFFLOAD_H

#include "common/device/device.h" /* mem_alloc, copies, streams, timers */
#include "common/model/model.h" /* GPT, its forward and backward */
#include "common/run/timeline.h" /* timeline.csv for the Gantt charts */

typedef struct {
    CheckpointStore store; /* what the pipeline's slots call (model.h) */
    int slots, layers;
    size_t floats;         /* a checkpoint's capacity, B*T*C */
    float *device[2];      /* (B,T,C) each, CAT_ACTIVATIONS: block l's output in device[l % 2] */
    int held_slot[2], held_layer[2]; /* whose output each holds (-1: none) */
    DeviceEvent *done[2];  /* the last copy out of or into device[i] */
    DeviceEvent *computed; /* a point on the compute stream, for the copy stream to wait for */
    float *host;           /* pinned (slots, L, B, T, C), CAT_ACTIVATIONS */
    double bytes_d2h, bytes_h2d; /* this step's */
    int in_step;           /* between begin and end of a step; outside (evaluation, sampling) a
                              forward's outputs are not copied out: no backward reads them */
    /* the timeline (optional): each buffer's copy in flight, until the host learns it is done */
    Timeline *timeline;
    const double *origin_ms;
    int step;                    /* 1-based */
    const char *pending_op[2];   /* NULL: none */
    int pending_layer[2];
    double pending_ms[2][2];     /* queued, returned */
} ActivationOffload;

/* The store, before the pipeline is built: its calls refer to *a, which
 * activation_offload_create fills once the pipeline's slots are known. */
const CheckpointStore *activation_offload_store(ActivationOffload *a);
/* Buffers for `slots` sets of `layers` outputs of B x T x C floats. */
void activation_offload_create(ActivationOffload *a, int slots, int layers, int B, int T, int C);
void activation_offload_attach_timeline(ActivationOffload *a, Timeline *timeline, const double *origin_ms);
/* Before a step (1-based): the byte counts start again. */
void activation_offload_begin_step(ActivationOffload *a, int step);
/* After the step's schedule: the copies in flight are done and on the timeline;
 * until the next step, forwards copy nothing out. */
void activation_offload_end_step(ActivationOffload *a);
void activation_offload_destroy(ActivationOffload *a);

#endif
