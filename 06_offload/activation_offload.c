/* activation_offload.c: see activation_offload.h. */
#include "06_offload/activation_offload.h" /* 06: --offload-activations */

#include "common/core/util.h" /* fatal, log_info, exit codes, flag parsing */

#include <string.h>

static float *host_at(const ActivationOffload *a, int slot, int layer) {
    if (slot < 0 || slot >= a->slots || layer < 0 || layer >= a->layers)
        fatal(EXIT_RUNTIME, "activation offload: no checkpoint %d of set %d (valid: 0..%d of 0..%d)", layer,
              slot, a->layers - 1, a->slots - 1);
    return a->host + ((size_t)slot * a->layers + layer) * a->floats;
}

/* The copy in flight on device[i], if any, is done: its timeline row. On the
 * CPU a copy is done when its call returns; on a GPU the host learns it here,
 * where device[i] is about to be reused (offload.c's rows do the same). */
static void settle(ActivationOffload *a, int i) {
    if (!a->pending_op[i]) return;
    double end = a->pending_ms[i][1];
    if (device_backend() != BACKEND_CPU) {
        device_event_sync(a->done[i]);
        end = wall_ms();
    }
    double origin = a->origin_ms ? *a->origin_ms : 0.0;
    if (a->timeline)
        timeline_add(a->timeline, a->step, a->pending_layer[i], a->pending_op[i], (a->pending_ms[i][0] - origin) * 1e3,
                     (end - origin) * 1e3);
    a->pending_op[i] = NULL;
}

/* Queue a copy on the copy stream after the compute stream's work so far
 * (which wrote its source, or read its destination last). */
static void copy_after_compute(ActivationOffload *a, int i, int layer, const char *op, void *dst, const void *src,
                               size_t bytes, int to_host) {
    settle(a, i);
    DeviceStream *copy = device_stream(STREAM_COPY);
    device_event_record(a->computed, device_stream(STREAM_COMPUTE));
    device_stream_wait(copy, a->computed);
    a->pending_ms[i][0] = wall_ms();
    if (to_host)
        copy_to_host_async(dst, src, bytes, copy);
    else
        copy_to_device_async(dst, src, bytes, copy);
    device_event_record(a->done[i], copy);
    a->pending_ms[i][1] = wall_ms();
    a->pending_op[i] = op;
    a->pending_layer[i] = layer;
    *(to_host ? &a->bytes_d2h : &a->bytes_h2d) += (double)bytes;
}

/* Block `layer`'s output of set `slot` back into device[layer % 2]. */
static void load(ActivationOffload *a, int slot, int layer, size_t floats) {
    int i = layer % 2;
    copy_after_compute(a, i, layer, "act_h2d", a->device[i], host_at(a, slot, layer), floats * sizeof(float), 0);
    a->held_slot[i] = slot;
    a->held_layer[i] = layer;
}

static int holds(const ActivationOffload *a, int i, int slot, int layer) {
    return a->held_slot[i] == slot && a->held_layer[i] == layer;
}

/* forward: device[layer % 2], once the copy out of what it held has left */
static float *place(int slot, int layer, void *context) {
    ActivationOffload *a = context;
    int i = layer % 2;
    settle(a, i);
    device_stream_wait(device_stream(STREAM_COMPUTE), a->done[i]);
    a->held_slot[i] = slot;
    a->held_layer[i] = layer;
    return a->device[i];
}

static void written(int slot, int layer, size_t floats, void *context) {
    ActivationOffload *a = context;
    int i = layer % 2;
    if (!a->in_step) return; /* evaluation or sampling: no backward will read it */
    copy_after_compute(a, i, layer, "act_d2h", host_at(a, slot, layer), a->device[i], floats * sizeof(float), 1);
}

/* backward: block `layer`'s output on the device (copied back unless still
 * there), and the one the next unit reads queued behind it */
static float *fetch(int slot, int layer, size_t floats, void *context) {
    ActivationOffload *a = context;
    int i = layer % 2;
    if (!holds(a, i, slot, layer)) load(a, slot, layer, floats);
    device_stream_wait(device_stream(STREAM_COMPUTE), a->done[i]); /* it has arrived before it is read */
    if (layer >= 1 && !holds(a, 1 - i, slot, layer - 1)) load(a, slot, layer - 1, floats);
    return a->device[i];
}

const CheckpointStore *activation_offload_store(ActivationOffload *a) {
    memset(a, 0, sizeof *a);
    a->store = (CheckpointStore){.place = place, .written = written, .fetch = fetch, .context = a};
    return &a->store;
}

void activation_offload_create(ActivationOffload *a, int slots, int layers, int B, int T, int C) {
    a->slots = slots;
    a->layers = layers;
    a->floats = (size_t)B * T * C;
    for (int i = 0; i < 2; i++) {
        a->device[i] = mem_alloc(SPACE_DEVICE, CAT_ACTIVATIONS, a->floats * sizeof(float),
                                 "activation checkpoint (double buffer)");
        a->held_slot[i] = a->held_layer[i] = -1;
        a->done[i] = device_event_create();
    }
    a->computed = device_event_create();
    a->host = mem_alloc_pinned(CAT_ACTIVATIONS, (size_t)slots * layers * a->floats * sizeof(float),
                               "activation checkpoints (offloaded)");
}

void activation_offload_attach_timeline(ActivationOffload *a, Timeline *timeline, const double *origin_ms) {
    a->timeline = timeline;
    a->origin_ms = origin_ms;
}

void activation_offload_begin_step(ActivationOffload *a, int step) {
    a->step = step;
    a->in_step = 1;
    a->bytes_d2h = a->bytes_h2d = 0.0;
}

void activation_offload_end_step(ActivationOffload *a) {
    a->in_step = 0;
    for (int i = 0; i < 2; i++) settle(a, i);
}

void activation_offload_destroy(ActivationOffload *a) {
    if (!a->host) return;
    for (int i = 0; i < 2; i++) {
        settle(a, i);
        mem_free(a->device[i]);
        device_event_destroy(a->done[i]);
    }
    device_event_destroy(a->computed);
    mem_free(a->host);
    memset(a, 0, sizeof *a);
}
