/* offload.c: see offload.h. */
#include "06_offload/offload.h" /* 06: ZeRO-Offload */

#include "06_offload/cpu_adam.h" /* 06: the host AdamW */
#include "common/kernels/kernels.h" /* ops(): the kernel table */
#include "common/comm/optimizer_agree.h" /* grad_norm_agree across ranks */
#include "common/core/util.h" /* fatal, log_info, exit codes, flag parsing */
#include "common/kernels/work_ledger.h" /* a dry run's counted work */
#include "05_zero/zero.h" /* 05: ZeRO's shards */

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define NO_UNIT (-1000)

/* ---- where a unit's pieces are ---- */

static const ParamTable *table_of(const Offload *o) {
    return &o->model->table;
}
static size_t slice_numel(const Offload *o, int unit) {
    return shard_slice_numel(table_of(o), unit, o->ranks);
}
/* Where unit's slice starts in this rank's shard of the range. */
static size_t slice_at(const Offload *o, int unit) {
    return shard_unit_offset(table_of(o), unit, o->ranks) -
           shard_unit_offset(table_of(o), o->first_unit, o->ranks);
}
/* Where unit's elements start in the range's device parameters. */
static size_t unit_at(const Offload *o, int unit) {
    return table_unit(table_of(o), unit)->offset - o->model->param_first;
}
static char *bytes_at(void *base, size_t element, size_t elem_bytes) {
    return (char *)base + element * elem_bytes;
}
static double since_origin_us(const Offload *o, double ms) {
    return (ms - (o->origin_ms ? *o->origin_ms : 0.0)) * 1e3;
}
static void add_row(Offload *o, int unit, const char *op, double start_ms, double end_ms) {
    if (o->timeline)
        timeline_add(o->timeline, o->step, unit, op, since_origin_us(o, start_ms),
                     since_origin_us(o, end_ms));
}
/* A copy's row: from when it was queued to when it was done, as the host
 * sees it. On the CPU a copy is done when its call returns; on a GPU when
 * its event is reached, which the host learns where it waits for it anyway
 * (a wait at the moment of queuing would undo the overlap). */
static void add_copy_row(Offload *o, int unit, const char *op, const double when_ms[2], DeviceEvent *done) {
    double end = when_ms[1];
    if (device_backend() != BACKEND_CPU) {
        device_event_sync(done);
        end = wall_ms();
    }
    add_row(o, unit, op, when_ms[0], end);
}

/* ---- --offload-params: a unit's weights copied in from the host (offload.h) ---- */

/* Where this rank's slice of unit's weights of record is on the host: in
 * the precision computed with (one rank: the slice is the unit). */
static const void *host_slice(const Offload *o, int unit) {
    return bytes_at(o->host_weights, slice_at(o, unit), o->elem_bytes);
}

/* Unit's weights into slot s: this rank's slice host -> device on the copy
 * stream, once the computation that read the slot before is done; with N
 * ranks the slices then all-gathered into the slot (ZeRO-3's gather, the
 * padding kept at the end), after the compute stream waited for the copy. */
static void copy_unit_in(Offload *o, int unit, UnitSlot *s) {
    size_t S = o->ranks > 1 ? slice_numel(o, unit) : table_unit(table_of(o), unit)->numel;
    DeviceStream *copy = device_stream(STREAM_COPY);
    device_stream_wait(copy, s->released);
    s->copy_ms[0] = wall_ms();
    copy_to_device_async(o->ranks > 1 ? s->slice : s->data, host_slice(o, unit), S * o->elem_bytes, copy);
    device_event_record(s->copied, copy);
    s->copy_ms[1] = wall_ms();
    o->bytes_h2d += (double)S * o->elem_bytes;
    if (o->ranks == 1) return;
    device_stream_wait(device_stream(STREAM_COMPUTE), s->copied);
    comm_allgather_typed(o->group, s->slice, s->data, S, o->dtype, NULL);
}

static UnitSlot *slot_of_use(Offload *o, int use) {
    for (int i = 0; i < o->num_slots; i++)
        if (o->slots[i].use == use) return &o->slots[i];
    return NULL;
}

/* One action of the step's schedule other than a computation: a copy into
 * a free slot, or a slot released. A schedule that breaks zero.h's rules
 * ends the job naming the rule. */
static void run_fetch(Offload *o, const ZeroAction *a) {
    if (a->op == ZERO_GATHER) {
        UnitSlot *s = slot_of_use(o, -1);
        if (!s)
            fatal(EXIT_RUNTIME, "offload: copies unit %d in while all %d device slots are in use", a->unit,
                  o->num_slots);
        s->use = a->use;
        copy_unit_in(o, a->unit, s);
    } else if (a->op == ZERO_FREE) {
        UnitSlot *s = slot_of_use(o, a->use);
        if (!s) fatal(EXIT_RUNTIME, "offload: releases unit %d, which is not copied in for that computation", a->unit);
        device_event_record(s->released, device_stream(STREAM_COMPUTE));
        s->use = -1;
    }
}

/* Before unit's forward or backward: the schedule run up to that
 * computation, which must come next; the compute stream waits for the unit's
 * copy. Outside a step, the unit is copied into the first slot now. Returns
 * the unit's weights on the device. */
static const void *fetch_unit(Offload *o, ZeroOp op, int unit) {
    UnitSlot *s = &o->slots[0];
    const char *what = op == ZERO_FORWARD ? "forward" : "backward";
    if (!o->fetching) {
        if (s->use != -1) fatal(EXIT_RUNTIME, "offload: unit %d's %s while a unit is held", unit, what);
        s->use = o->uses; /* no computation of the schedule */
        copy_unit_in(o, unit, s);
    } else {
        while (o->cursor < o->num_fetches && o->fetches[o->cursor].op == ZERO_GATHER)
            run_fetch(o, &o->fetches[o->cursor++]);
        const ZeroAction *a = o->cursor < o->num_fetches ? &o->fetches[o->cursor] : NULL;
        if (!a || a->op != op || a->unit != unit)
            fatal(EXIT_RUNTIME, "offload: unit %d's %s is not the next computation of the step's schedule",
                  unit, what);
        s = slot_of_use(o, a->use);
        if (!s) fatal(EXIT_RUNTIME, "offload: unit %d's %s comes before its copy in", unit, what);
        o->cursor++;
    }
    if (o->fetching) add_copy_row(o, unit, "param_h2d", s->copy_ms, s->copied); /* the step's rows only */
    device_stream_wait(device_stream(STREAM_COMPUTE), s->copied);
    return s->data;
}

/* After the computation: its slot released, and the copies the schedule has
 * before the next computation queued now, ahead of this unit's gradient. */
static void release_unit(Offload *o) {
    if (!o->fetching) {
        run_fetch(o, &(ZeroAction){ZERO_FREE, 0, o->uses});
        return;
    }
    while (o->cursor < o->num_fetches &&
           (o->fetches[o->cursor].op == ZERO_FREE || o->fetches[o->cursor].op == ZERO_GATHER))
        run_fetch(o, &o->fetches[o->cursor++]);
}

/* ---- the storage hooks: a unit gets its weights before it is computed ---- */

static void bind_unit(Offload *o, int unit, ZeroOp op, float *grads) {
    const ParamUnit *u = table_unit(table_of(o), unit);
    const void *stored = o->host_params ? fetch_unit(o, op, unit) : bytes_at(o->params, unit_at(o, unit), o->elem_bytes);
    float *weights = (float *)stored;
    if (o->half) {
        ops()->cast_from_half(o->unit_params, stored, u->numel, o->format);
        weights = o->unit_params;
    }
    gpt_bind_unit(o->model, unit, weights, grads);
}

static int is_tied_head(const Offload *o, int unit) {
    return o->tied_dwte && unit == o->model->cfg.layers;
}

/* --offload-params: the embedding unit copied in (and all-gathered) into a
 * slot of its own for the tied head, which reads its wte; released after the
 * head's computation (unbind_unit). */
static const void *tied_embedding_in(Offload *o) {
    UnitSlot *s = &o->tied_slot;
    copy_unit_in(o, LAYER_EMBEDDING, s);
    if (o->fetching) add_copy_row(o, LAYER_EMBEDDING, "param_h2d", s->copy_ms, s->copied);
    device_stream_wait(device_stream(STREAM_COMPUTE), s->copied);
    return s->data;
}

/* The head's unit is bound: its matrix is wte (16 bits: widened into
 * tied_wte), its gradient tied_dwte from zero (offload.h). */
static void tied_head_in(Offload *o, int with_grads) {
    const void *embedding = o->host_params ? tied_embedding_in(o)
                                           : bytes_at(o->params, unit_at(o, LAYER_EMBEDDING), o->elem_bytes);
    const void *wte = bytes_at((void *)embedding, o->wte_at, o->elem_bytes);
    float *weights = (float *)wte;
    if (o->half) {
        ops()->cast_from_half(o->tied_wte, wte, o->wte_numel, o->format);
        weights = o->tied_wte;
    }
    if (with_grads) ops()->fill_zero(o->tied_dwte, o->wte_numel);
    o->model->w.lm_head = weights;
    o->model->g.lm_head = with_grads ? o->tied_dwte : NULL;
}

static void unbind_unit(Offload *o, int unit) {
    gpt_bind_unit(o->model, unit, NULL, NULL);
    if (!is_tied_head(o, unit)) return;
    o->model->w.lm_head = o->model->g.lm_head = NULL;
    if (o->host_params) device_event_record(o->tied_slot.released, device_stream(STREAM_COMPUTE));
}

static void before_forward(int unit, void *context) {
    Offload *o = context;
    bind_unit(o, unit, ZERO_FORWARD, NULL);
    if (is_tied_head(o, unit)) tied_head_in(o, 0);
}

static void before_backward(int unit, void *context) {
    Offload *o = context;
    ops()->fill_zero(o->unit_grads, o->ranks * slice_numel(o, unit)); /* the padding too */
    bind_unit(o, unit, ZERO_BACKWARD, o->unit_grads);
    if (is_tied_head(o, unit)) tied_head_in(o, 1);
    if (o->tied_dwte && unit == LAYER_EMBEDDING) { /* the head's gradient of wte, before the lookups' */
        float *dwte = o->unit_grads + o->wte_at;
        ops()->residual_forward(dwte, dwte, o->tied_dwte, o->wte_numel);
    }
}

static void after_forward(int unit, void *context) {
    Offload *o = context;
    unbind_unit(o, unit);
    if (o->host_params) release_unit(o);
}

/* ---- gradients: device -> host, a unit at a time ---- */

/* The slice of `unit` has landed in the host's staging: add it into the
 * fp32 shard (the step's first micro-batch writes it). In 16 bits the sum is
 * rounded to the 16-bit format after every add, as chapter 01's 16-bit
 * gradients and 05's 16-bit shard hold it (accumulate_half): the same sums,
 * so an fp16 sum past 65504 is Inf here too and the step is skipped where
 * theirs is. An fp32 sum would stay finite and update where they skip. */
/* The CPU backend's kernels, on host memory whichever backend computes; a
 * dry run's no-ops (device.h, "The dry run"), host compute being compute. */
static const KernelOps *host_kernels(void) {
    return device_dry() ? &kernels_dry : &kernels_cpu;
}

static void land_slice(Offload *o, int unit) {
    size_t at = slice_at(o, unit), S = slice_numel(o, unit);
    if (device_dry()) { /* nothing to add: the sums are zeros */
        o->arrived[unit - o->first_unit] = 1;
        return;
    }
    float *sum = o->grads[o->cur] + at;
    int first = !o->arrived[unit - o->first_unit];
    if (o->half) {
        const uint16_t *h = (const uint16_t *)o->grads_landing + at;
        HalfFormat f = o->format;
        for (size_t i = 0; i < S; i++)
            sum[i] = first ? half_to_float(h[i], f)
                           : half_to_float(half_from_float(sum[i] + half_to_float(h[i], f), f), f);
    } else {
        const float *f = (const float *)o->grads_landing + at;
        if (first)
            memcpy(sum, f, S * sizeof(float));
        else
            for (size_t i = 0; i < S; i++) sum[i] += f[i];
    }
    o->arrived[unit - o->first_unit] = 1;
}

/* Wait for the copy out of the outbox, if one is in flight, and land it. */
static void drain_outbox(Offload *o) {
    int unit = o->pending;
    if (unit == NO_UNIT) return;
    device_event_sync(o->copied_out);
    add_copy_row(o, unit, "grad_d2h", o->out_ms, o->copied_out);
    land_slice(o, unit);
    o->pending = NO_UNIT;
}

/* After unit's backward: its gradient (fp32, N*S in unit_grads) reduced over
 * the ranks to this rank's slice in the outbox, then copied to the host on
 * the copy stream while the backward of the next unit runs. The outbox is
 * free again once the previous unit's copy is done: it has had this unit's
 * whole backward to finish in. */
static void after_backward(int unit, void *context) {
    Offload *o = context;
    drain_outbox(o);
    size_t S = slice_numel(o, unit);
    void *out = o->outbox;
    if (o->half && o->ranks > 1) {
        ops()->cast_to_half(o->unit_grads16, o->unit_grads, o->ranks * S, o->format);
        comm_reduce_scatter_typed(o->group, o->unit_grads16, out, S, o->dtype, COMM_SUM, NULL);
    } else if (o->half) {
        ops()->cast_to_half(out, o->unit_grads, S, o->format);
    } else if (o->ranks > 1) {
        comm_reduce_scatter(o->group, o->unit_grads, out, S, COMM_SUM);
    } else {
        copy_on_device(out, o->unit_grads, S * sizeof(float));
    }
    unbind_unit(o, unit);
    if (o->host_params) release_unit(o); /* the next unit's copy in, ahead of this gradient's out */

    /* the copy waits for what produced the slice (a collective returns with it in place) */
    DeviceStream *copy = device_stream(STREAM_COPY);
    device_event_record(o->compute_done, device_stream(STREAM_COMPUTE));
    device_stream_wait(copy, o->compute_done);
    o->out_ms[0] = wall_ms();
    copy_to_host_async(bytes_at(o->grads_landing, slice_at(o, unit), o->elem_bytes), out, S * o->elem_bytes,
                       copy);
    device_event_record(o->copied_out, copy);
    o->out_ms[1] = wall_ms();
    o->pending = unit;
    o->bytes_d2h += (double)S * o->elem_bytes;
}

void offload_begin_step(Offload *o, int step) {
    o->step = step;
    if (o->grads[1]) o->cur = 1 - o->cur; /* --dpu: the other shard may still be read by the update */
    memset(o->arrived, 0, (size_t)(o->last_unit - o->first_unit + 1));
    o->bytes_d2h = o->bytes_h2d = 0.0;
    o->cursor = 0;
    o->fetching = o->host_params; /* the step's schedule runs */
}

void offload_finish_grads(Offload *o) {
    drain_outbox(o); /* the last unit's copy */
    if (o->fetching && o->cursor != o->num_fetches)
        fatal(EXIT_RUNTIME, "offload: the step ran %d of the %d actions of its schedule of copies", o->cursor,
              o->num_fetches);
    o->fetching = 0;
    for (int u = o->first_unit; u <= o->last_unit; u++)
        if (!o->arrived[u - o->first_unit])
            fatal(EXIT_RUNTIME, "offload: no gradient of unit %d arrived this step", u);
}

GradShards offload_grad_shards(const Offload *o, CommGroup *world) {
    /* the CPU backend's kernel on host memory, whichever backend computes: the
     * same chunked double sum as chapter 01's norm */
    return (GradShards){.grads = o->grads[o->cur],
                        .held = o->shard_n,
                        .kernels = host_kernels(),
                        .spans = o->norm_spans, /* --tp: the replicated tensors on tp rank 0 only */
                        .num_spans = o->num_norm_spans,
                        .agree = grad_norm_agree,
                        .sum_group = world};
}

/* ---- the update: host AdamW, weights back to the device ---- */

static CpuAdamArgs adam_args(const Offload *o, const OffloadUpdate *u, int t) {
    const Config *c = o->cfg;
    return (CpuAdamArgs){.lr = u->lr,
                         .beta1 = c->beta1,
                         .beta2 = c->beta2,
                         .eps = c->eps,
                         .weight_decay = c->wd,
                         .grad_scale = u->grad_scale,
                         .t = t};
}

/* AdamW on elements [at, at + n) of the shard, from gradient shard `grads`;
 * in 16 bits the new weights are rounded into params16 in the same pass. */
static void adam_on_host(Offload *o, int grads, size_t at, size_t n, const CpuAdamArgs *a) {
    if (device_dry()) { /* a dry run skips the host's compute too, and counts it (work_ledger.h) */
        work_add_host_adam((double)n, 7.0 * n * sizeof(float) + (o->half ? 2.0 * n : 0.0));
        return;
    }
    cpu_adamw(o->master + at, o->grads[grads] + at, o->m + at, o->v + at, n, a,
              o->half ? o->params16 + at : NULL, o->half ? o->format : HALF_BF16);
}

/* Unit's updated slice, host -> device on the copy stream: straight into the
 * parameters with one rank (the slice is the unit), else into inbox[slot]. */
static void upload_unit(Offload *o, int unit, int slot) {
    size_t at = slice_at(o, unit), S = slice_numel(o, unit);
    const void *updated = o->half ? (const void *)(o->params16 + at) : (const void *)(o->master + at);
    void *dst = o->ranks > 1 ? o->inbox[slot] : bytes_at(o->params, unit_at(o, unit), o->elem_bytes);
    DeviceStream *copy = device_stream(STREAM_COPY);
    device_event_record(o->compute_done, device_stream(STREAM_COMPUTE)); /* nothing still reads dst */
    device_stream_wait(copy, o->compute_done);
    o->in_ms[slot][0] = wall_ms();
    copy_to_device_async(dst, updated, S * o->elem_bytes, copy);
    device_event_record(o->copied_in[slot], copy);
    o->in_ms[slot][1] = wall_ms();
    o->bytes_h2d += (double)S * o->elem_bytes;
}

/* The compute stream waits for unit's upload; with N ranks the slices are
 * all-gathered into the parameters (the padding left out). */
static void install_unit(Offload *o, int unit, int slot) {
    add_copy_row(o, unit, "param_h2d", o->in_ms[slot], o->copied_in[slot]);
    device_stream_wait(device_stream(STREAM_COMPUTE), o->copied_in[slot]);
    if (o->ranks == 1) return;
    size_t S = slice_numel(o, unit);
    comm_allgather_typed(o->group, o->inbox[slot], o->gathered, S, o->dtype, NULL);
    copy_on_device(bytes_at(o->params, unit_at(o, unit), o->elem_bytes), o->gathered,
                   table_unit(table_of(o), unit)->numel * o->elem_bytes);
}

/* --offload-params with --dpu: the update's new weights (params16, or the
 * master weights in fp32) become the ones the steps copy in, which the
 * delayed update's thread does not write (host_weights); without --dpu they
 * are the same buffer. */
static void install_host_weights(Offload *o) {
    const void *updated = o->half ? (const void *)o->params16 : (const void *)o->master;
    if (o->host_weights != updated && !device_dry())
        memcpy(o->host_weights, updated, o->shard_n * o->elem_bytes);
}

void offload_update(Offload *o, const OffloadUpdate *u) {
    CpuAdamArgs a = adam_args(o, u, ++o->t);
    /* unit u's copy up overlaps the CPU's update of unit u+1 */
    for (int unit = o->first_unit; unit <= o->last_unit; unit++) {
        int slot = (unit - o->first_unit) % 2;
        double start = wall_ms();
        adam_on_host(o, o->cur, slice_at(o, unit), slice_numel(o, unit), &a);
        add_row(o, unit, "cpu_adam", start, wall_ms());
        if (o->host_params) continue; /* the weights of record are the host's: nothing crosses */
        upload_unit(o, unit, slot);
        if (unit > o->first_unit) install_unit(o, unit - 1, 1 - slot);
    }
    if (o->host_params)
        install_host_weights(o);
    else
        install_unit(o, o->last_unit, (o->last_unit - o->first_unit) % 2);
}

/* Every unit's new weights to the device, after a whole-shard host update
 * (--offload-params: the host's are the weights of record already). */
static void upload_all(Offload *o) {
    if (o->host_params) {
        install_host_weights(o);
        return;
    }
    for (int unit = o->first_unit; unit <= o->last_unit; unit++) {
        int slot = (unit - o->first_unit) % 2;
        upload_unit(o, unit, slot);
        install_unit(o, unit, slot);
    }
}

static void *host_update_thread(void *context) {
    Offload *o = context;
    CpuAdamArgs a = adam_args(o, &o->worker_update, o->t);
    o->worker_start_ms = wall_ms();
    adam_on_host(o, o->worker_grads, 0, o->shard_n, &a);
    o->worker_end_ms = wall_ms();
    return NULL;
}

void offload_update_start(Offload *o, const OffloadUpdate *u) {
    /* EXERCISE 06.2 BEGIN: the DPU schedule (course.md, exercise 06.2) */
    if (o->worker_running)
        fatal(EXIT_RUNTIME, "offload: a delayed update started before the last was joined");
    o->t++; /* Adam's step count, for the bias correction: the thread reads it */
    o->worker_update = *u;
    o->worker_grads = o->cur; /* the next step fills the other shard */
    if (pthread_create(&o->worker, NULL, host_update_thread, o) != 0)
        fatal(EXIT_RUNTIME, "offload: starting the host update thread failed");
    o->worker_running = 1;
    /* EXERCISE 06.2 END */
}

void offload_update_wait(Offload *o) {
    /* EXERCISE 06.2 BEGIN: the DPU schedule (course.md, exercise 06.2) */
    if (!o->worker_running) return;
    pthread_join(o->worker, NULL);
    o->worker_running = 0;
    add_row(o, -1, "cpu_adam", o->worker_start_ms, o->worker_end_ms);
    upload_all(o); /* the new weights to the device */
    /* EXERCISE 06.2 END */
}

void offload_update_shard(Offload *o, int grads, const OffloadUpdate *u) {
    CpuAdamArgs a = adam_args(o, u, ++o->t);
    double start = wall_ms();
    adam_on_host(o, grads, 0, o->shard_n, &a);
    add_row(o, -1, "cpu_adam", start, wall_ms());
    upload_all(o);
}

/* ---- checkpoints ---- */

void offload_checkpoint_layout(const Offload *o, CkptLayout *l) {
    if (o->slices) /* the shard's elements mapped to the whole tensors */
        shard_checkpoint_layout(l, o->model, o->rank, o->ranks, o->slices, NULL, o->master, o->m, o->v,
                                o->shard_n, 1);
    else
        ckpt_layout_shards(l, table_of(o), o->first_unit, o->last_unit, o->master, o->m, o->v, o->rank,
                           o->ranks, 1);
}

void offload_weights_from_master(Offload *o) {
    if (o->worker_running) fatal(EXIT_RUNTIME, "offload: weights replaced while a delayed update runs");
    if (o->half) /* as cpu_adamw rounds them after an update; host memory, so the CPU kernel */
        host_kernels()->cast_to_half(o->params16, o->master, o->shard_n, o->format);
    upload_all(o);
}

/* ---- building ---- */

/* The range's n weights from (seed, name, index) or `initial`, this rank's
 * slices into the master weights, all of them (rounded) to the device. */
static void initial_values(Offload *o, GPT *model, const float *initial, size_t n) {
    int first_unit = o->first_unit, last_unit = o->last_unit;
    const Config *cfg = o->cfg;
    float *init = xmalloc(n * sizeof(float));
    if (initial)
        memcpy(init, initial, n * sizeof(float));
    else
        param_init_range(table_of(o), cfg->seed, init, model->param_first, n);
    for (int u = first_unit; u <= last_unit; u++) {
        size_t first, count;
        shard_slice_elements(table_of(o), u, o->rank, o->ranks, &first, &count);
        if (count)
            memcpy(o->master + slice_at(o, u), init + (first - model->param_first), count * sizeof(float));
    }
    if (o->host_params) { /* the weights of record: this rank's master slices (16 bits: rounded) */
        if (o->half) kernels_cpu.cast_to_half(o->params16, o->master, o->shard_n, o->format);
        install_host_weights(o);
    } else if (o->half) {
        uint16_t *init16 = xmalloc(n * sizeof(uint16_t));
        kernels_cpu.cast_to_half(init16, init, n, o->format);
        copy_to_device(o->params, init16, n * sizeof(uint16_t));
        free(init16);
    } else {
        copy_to_device(o->params, init, n * sizeof(float));
    }
    free(init);
}

/* offload_create, with the range's initial values (held elements in table
 * order) given, or NULL: from cfg->seed. */
static void create(Offload *o, GPT *model, int first_unit, int last_unit, CommGroup *group, const Config *cfg,
                   int dpu, int host_params, const float *initial) {
    memset(o, 0, sizeof *o);
    o->model = model;
    o->first_unit = first_unit;
    o->last_unit = last_unit;
    o->group = group;
    o->rank = comm_rank(group);
    o->ranks = comm_size(group);
    o->cfg = cfg;
    o->host_params = host_params;
    o->half = cfg->precision != PRECISION_FP32;
    o->format = o->half ? (cfg->precision == PRECISION_BF16 ? HALF_BF16 : HALF_F16) : HALF_BF16;
    o->dtype = !o->half ? COMM_F32 : o->format == HALF_BF16 ? COMM_BF16 : COMM_F16;
    o->elem_bytes = comm_dtype_bytes(o->dtype);
    for (int u = first_unit; u <= last_unit; u++) o->shard_n += slice_numel(o, u);
    o->max_slice = shard_largest_slice(table_of(o), first_unit, last_unit, o->ranks);
    size_t largest = table_largest_unit(table_of(o), first_unit, last_unit);
    size_t N = o->ranks, n = model->param_count, eb = o->elem_bytes, S = o->max_slice;

    /* device: the weights forward and backward read, and unit-sized working buffers */
    if (!host_params) /* else: a unit at a time, offload_schedule_fetches's slots */
        o->params = mem_alloc(SPACE_DEVICE, CAT_PARAMS, n * eb, o->half ? "16-bit parameters" : "parameters");
    if (o->half)
        o->unit_params =
            mem_alloc(SPACE_DEVICE, CAT_WORKSPACE, largest * sizeof(float), "unit weights (fp32)");
    o->unit_grads = mem_alloc(SPACE_DEVICE, CAT_BUCKETS, N * S * sizeof(float), "unit gradient");
    if (o->half && N > 1)
        o->unit_grads16 = mem_alloc(SPACE_DEVICE, CAT_BUCKETS, N * S * eb, "unit gradient (16-bit)");
    o->outbox = mem_alloc(SPACE_DEVICE, CAT_BUCKETS, S * eb, "gradient slice to copy out");
    o->copied_out = device_event_create();
    o->pending = NO_UNIT;
    for (int i = 0; i < 2; i++) {
        if (N > 1) o->inbox[i] = mem_alloc(SPACE_DEVICE, CAT_COMM, S * eb, "updated slice copied in");
        o->copied_in[i] = device_event_create();
    }
    if (N > 1) o->gathered = mem_alloc(SPACE_DEVICE, CAT_COMM, N * S * eb, "gathered unit");
    o->compute_done = device_event_create();
    if (model->cfg.tied && first_unit == LAYER_EMBEDDING && last_unit == model->cfg.layers) {
        const ParamTensor *wte = table_tensor(table_of(o), LAYER_EMBEDDING, EMBEDDING_WTE);
        o->wte_at = wte->offset - table_unit(table_of(o), LAYER_EMBEDDING)->offset;
        o->wte_numel = wte->numel;
        if (o->half)
            o->tied_wte =
                mem_alloc(SPACE_DEVICE, CAT_WORKSPACE, wte->numel * sizeof(float), "tied head's wte (fp32)");
        o->tied_dwte = mem_alloc(SPACE_DEVICE, CAT_WORKSPACE, wte->numel * sizeof(float), "tied head's dwte");
    }

    /* host, pinned: the optimizer, the gradient shard, the staging of what crosses PCIe */
    o->master = mem_alloc_pinned(CAT_OPTIMIZER, o->shard_n * sizeof(float), "master weights (host)");
    o->m = mem_alloc_pinned(CAT_OPTIMIZER, 2 * o->shard_n * sizeof(float), "Adam moments (host)");
    o->v = o->m + o->shard_n;
    o->grads[0] = mem_alloc_pinned(CAT_GRADS, o->shard_n * sizeof(float), "gradient shard (host)");
    if (dpu)
        o->grads[1] = mem_alloc_pinned(CAT_GRADS, o->shard_n * sizeof(float), "second gradient shard (host)");
    o->grads_landing = mem_alloc_pinned(CAT_COMM, o->shard_n * eb, "gradient slices from the device");
    if (o->half && host_params && !dpu)
        o->params16 = mem_alloc_pinned(CAT_PARAMS, o->shard_n * eb, "16-bit parameters (host)");
    else if (o->half)
        o->params16 = mem_alloc_pinned(CAT_COMM, o->shard_n * eb, "16-bit weights to the device");
    if (host_params && dpu) /* the delayed update writes params16 and master during the step */
        o->host_weights = mem_alloc_pinned(CAT_PARAMS, o->shard_n * eb, "parameters the steps read (host)");
    else if (host_params)
        o->host_weights = o->half ? (void *)o->params16 : (void *)o->master;
    o->arrived = xcalloc((size_t)(last_unit - first_unit + 1), 1);

    /* initial values (a dry run writes none: its buffers' zeros stand for them, device.h) */
    if (!device_dry()) initial_values(o, model, initial, n);

    model->params = NULL; /* no whole fp32 copy anywhere: the master weights are the host's shards */
    model->grads = NULL;
    o->storage = (UnitHooks){.before_forward = before_forward,
                             .after_forward = after_forward,
                             .before_backward = before_backward,
                             .after_backward = after_backward,
                             .context = o};
    model->storage = &o->storage;
    model->half_matmuls = o->half;
    model->matmul_format = o->format;
}

void offload_create(Offload *o, GPT *model, int first_unit, int last_unit, CommGroup *group,
                    const Config *cfg, int dpu, int host_params) {
    create(o, model, first_unit, last_unit, group, cfg, dpu, host_params, NULL);
}

/* A device slot for a unit of slices of S elements (N ranks: N slices, and one
 * to land the copy in), free. */
static void create_slot(Offload *o, UnitSlot *s, size_t S, const char *what) {
    s->data = mem_alloc(SPACE_DEVICE, CAT_PARAMS, o->ranks * S * o->elem_bytes, what);
    if (o->ranks > 1) s->slice = mem_alloc(SPACE_DEVICE, CAT_COMM, S * o->elem_bytes, "slice copied in");
    s->use = -1;
    s->copied = device_event_create();
    s->released = device_event_create();
    device_event_record(s->released, device_stream(STREAM_COMPUTE)); /* free from the start */
}

static void destroy_slot(UnitSlot *s) {
    mem_free(s->data);
    mem_free(s->slice);
    device_event_destroy(s->copied);
    device_event_destroy(s->released);
}

void offload_schedule_fetches(Offload *o, const ZeroUse *uses, int count, int prefetch) {
    if (!o->host_params) fatal(EXIT_RUNTIME, "offload: a schedule of copies for weights held on the device");
    o->uses = count;
    o->num_fetches = zero_schedule_uses(uses, count, prefetch, &o->fetches);
    o->num_slots = prefetch + 1 < count ? prefetch + 1 : count;
    if (o->num_slots < 1) o->num_slots = 1; /* evaluation's copies use the first */
    o->slots = xcalloc((size_t)o->num_slots, sizeof(UnitSlot));
    for (int i = 0; i < o->num_slots; i++) /* the largest unit (N ranks: padded to N slices) */
        create_slot(o, &o->slots[i], o->max_slice, "unit's weights copied in");
    if (o->tied_dwte) /* the tied head's copy of the embedding unit */
        create_slot(o, &o->tied_slot, slice_numel(o, LAYER_EMBEDDING),
                    "embedding copied in for the tied head");
}

void offload_create_slices(Offload *o, TensorParallelModel *tm, CommGroup *group, const Config *cfg, int dpu,
                           int host_params) {
    GPT *model = tm->m;
    float *init = xmalloc(model->param_count * sizeof(float));
    tp_initial_values(tm, cfg->seed, init); /* this rank's slices of the whole model's values */
    create(o, model, model->first_unit, model->last_unit, group, cfg, dpu, host_params, init);
    free(init);
    o->slices = tm;
    o->num_norm_spans =
        shard_norm_spans(table_of(o), o->first_unit, o->last_unit, model->param_first, o->rank, o->ranks,
                         tm->once_spans, tm->num_once_spans, 1, &o->norm_spans);
}

void offload_attach_timeline(Offload *o, Timeline *timeline, const double *origin_ms) {
    o->timeline = timeline;
    o->origin_ms = origin_ms;
}

void offload_destroy(Offload *o) {
    if (o->worker_running) pthread_join(o->worker, NULL);
    mem_free(o->params);
    mem_free(o->unit_params);
    mem_free(o->unit_grads);
    mem_free(o->unit_grads16);
    mem_free(o->outbox);
    device_event_destroy(o->copied_out);
    for (int i = 0; i < 2; i++) {
        mem_free(o->inbox[i]);
        mem_free(o->grads[i]);
        device_event_destroy(o->copied_in[i]);
    }
    mem_free(o->gathered);
    mem_free(o->tied_wte);
    mem_free(o->tied_dwte);
    device_event_destroy(o->compute_done);
    mem_free(o->master);
    mem_free(o->m);
    mem_free(o->grads_landing);
    if (o->host_weights != o->params16 && o->host_weights != o->master) mem_free(o->host_weights);
    mem_free(o->params16);
    free(o->arrived);
    free(o->norm_spans);
    for (int i = 0; i < o->num_slots; i++) destroy_slot(&o->slots[i]);
    destroy_slot(&o->tied_slot);
    free(o->slots);
    free(o->fetches);
    if (o->model) o->model->storage = NULL;
    memset(o, 0, sizeof *o);
}
