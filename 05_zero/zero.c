/* zero.c: see zero.h. */
#include "05_zero/zero.h" /* 05: ZeRO's shards */

#include "common/device/device.h" /* mem_alloc, copies, streams, timers */
#include "common/run/evaluate.h" /* validation loss and sampling */
#include "common/kernels/kernels.h" /* ops(): the kernel table */
#include "common/comm/optimizer_agree.h" /* grad_norm_agree across ranks */
#include "common/core/util.h" /* fatal, log_info, exit codes, flag parsing */
#include "common/kernels/work_ledger.h" /* a dry run's counted work */

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- where a unit's pieces are ---- */

static const ParamTable *table_of(const Zero *z) {
    return &z->model->table;
}
static size_t slice_numel(const Zero *z, int unit) {
    return shard_slice_numel(table_of(z), unit, z->ranks);
}
/* Offsets within this rank's buffers: a shard starts at its first unit's slice,
 * a whole buffer at the first unit's first element (0 for the whole model). */
static size_t slice_offset(const Zero *z, int unit) {
    return shard_unit_offset(table_of(z), unit, z->ranks) -
           shard_unit_offset(table_of(z), z->first_unit, z->ranks);
}
static int last_unit(const Zero *z) {
    return z->last_unit;
}
static size_t unit_offset(const Zero *z, int unit) {
    return table_unit(table_of(z), unit)->offset - z->param_first;
}
/* This rank's slice of unit in the whole buffers (first: from the buffer's start) */
static void slice_elements(const Zero *z, int unit, size_t *first, size_t *count) {
    shard_slice_elements(table_of(z), unit, z->rank, z->ranks, first, count);
    *first -= z->param_first;
}

/* ---- the state in either precision: buffers of the collectives' type ---- */

static size_t elem_bytes(const Zero *z) {
    return comm_dtype_bytes(z->dtype);
}
/* element i of a buffer of z->dtype */
static void *at(const Zero *z, void *base, size_t i) {
    return (char *)base + i * elem_bytes(z);
}
static void *param_store(const Zero *z) {
    return z->half ? (void *)z->params16 : (void *)z->params;
}
static void *grad_store(const Zero *z) {
    return z->half ? (void *)z->grads16 : (void *)z->grads;
}
static void fill_zero_typed(const Zero *z, void *x, size_t n) {
    if (z->half)
        ops()->fill_zero_half(x, n);
    else
        ops()->fill_zero(x, n);
}
static void *alloc_typed(const Zero *z, Category cat, size_t n, const char *what) {
    return mem_alloc(SPACE_DEVICE, cat, n * elem_bytes(z), what);
}

/* ---- time: what ran when, and how long the caller waited on communication ---- */

static void record(Zero *z, const char *op, int micro, double start_ms, double end_ms) {
    timeline_add(&z->timeline, z->step + 1, micro, op, (start_ms - z->origin_ms) * 1e3,
                 (end_ms - z->origin_ms) * 1e3);
}
/* After a collective the caller ran itself, started at start_ms. */
static void waited(Zero *z, const char *op, double start_ms) {
    double end = wall_ms();
    z->comm_ms += end - start_ms;
    z->comm_busy_ms += end - start_ms;
    record(z, op, z->micro, start_ms, end);
}
/* Wait for one of the worker's collectives, queued for micro-batch `micro`;
 * its row shows when the worker ran it. */
static void wait_ticket(Zero *z, long ticket, const char *op, int micro) {
    double start, end;
    z->comm_ms += comm_worker_wait(z->worker, ticket, &start, &end);
    z->comm_busy_ms += end - start;
    record(z, op, micro, start, end);
}

/* Bind every unit's parameters to a whole parameter buffer, no gradients. */
static void bind_whole_params(const Zero *z, float *params) {
    gpt_bind_range(z->model, z->first_unit, z->last_unit, params, NULL);
}

/* ---- stage 3's schedule ---- */

/* Computation c of a micro-batch: the forward of units -1..L, then the backward of L..-1. */
static int unit_of_use(int layers, int c) {
    int units = layers + 2;
    return c < units ? c - 1 : layers - (c - units);
}

int zero_schedule(int layers, int prefetch, ZeroAction **actions) {
    int n = 2 * (layers + 2);
    ZeroUse *uses = xcalloc((size_t)n, sizeof(ZeroUse));
    for (int c = 0; c < n; c++)
        uses[c] = (ZeroUse){c < layers + 2 ? ZERO_FORWARD : ZERO_BACKWARD, unit_of_use(layers, c)};
    int count = zero_schedule_uses(uses, n, prefetch, actions);
    free(uses);
    return count;
}

int zero_schedule_uses(const ZeroUse *uses, int count, int prefetch, ZeroAction **actions) {
    int n = 0;
    ZeroAction *a = xcalloc((size_t)3 * count, sizeof(ZeroAction)); /* a gather, a computation, a free each */
    /* EXERCISE 05.3 BEGIN: the stage-3 gather/free schedule (course.md, exercise 05.3) */
    int next_gather = 0;
    for (int c = 0; c < count; c++) {
        /* gather this computation's unit and those of the next `prefetch`, each once */
        int last_needed = c + prefetch < count ? c + prefetch : count - 1;
        for (; next_gather <= last_needed; next_gather++)
            a[n++] = (ZeroAction){ZERO_GATHER, uses[next_gather].unit, next_gather};
        a[n++] = (ZeroAction){uses[c].op, uses[c].unit, c};
        a[n++] = (ZeroAction){ZERO_FREE, uses[c].unit, c};
    }
    /* EXERCISE 05.3 END */
    *actions = a;
    return n;
}

void zero_print_schedule(const ZeroAction *actions, int n) {
    static const char *names[] = {"gather", "forward", "backward", "free"};
    log_info("stage-3 schedule of one micro-batch (unit -1 is the embedding):\n");
    for (int i = 0; i < n; i++) log_info("  %-8s unit %d\n", names[actions[i].op], actions[i].unit);
}

/* ---- the collectives of a unit ---- */

/* Stages 2 and 3 (exercise 05.2): the unit's padded gradient (N*S, in the
 * current gradient buffer), summed over the ranks; this rank's slice of the
 * sum belongs in its shard of the gradients, summed over the step's
 * micro-batches. The worker reduce-scatters while backward goes on;
 * finish_reduce_scatter runs once it is done. */
static void reduce_scatter_unit(Zero *z, int unit) {
    ZeroGradBuffer *gb = &z->grad_buffers[z->current];
    gb->unit = unit;
    gb->micro = z->micro;
    gb->accumulate = z->accumulate;
    /* EXERCISE 05.2 BEGIN: the stage-2 reduce-scatter (course.md, exercise 05.2) */
    size_t S = slice_numel(z, unit);
    void *mine = at(z, grad_store(z), slice_offset(z, unit));
    gb->ticket = comm_worker_reduce_scatter(z->worker, gb->data, gb->accumulate ? gb->slice : mine, S,
                                            z->dtype, COMM_SUM);
    /* EXERCISE 05.2 END */
}

static void finish_reduce_scatter(Zero *z, ZeroGradBuffer *gb) {
    if (gb->ticket < 0) return;
    wait_ticket(z, gb->ticket, "reduce_scatter", gb->micro);
    gb->ticket = -1;
    if (!gb->accumulate) return;
    /* EXERCISE 05.2 BEGIN: the stage-2 reduce-scatter (course.md, exercise 05.2) */
    size_t S = slice_numel(z, gb->unit);
    void *mine = at(z, grad_store(z), slice_offset(z, gb->unit));
    if (z->half) { /* mine += slice, in fp32, rounded */
        ops()->cast_from_half(z->slice_f32, gb->slice, S, z->mixed.format);
        ops()->accumulate_half(mine, z->slice_f32, S, z->mixed.format);
    } else {
        ops()->residual_forward(mine, mine, gb->slice, S); /* mine += slice */
    }
    /* EXERCISE 05.2 END */
}

/* Stages 2-3, before a unit's backward: the next gradient buffer, once its
 * last reduce-scatter is done, zeroed (the padding too). */
static void take_grad_buffer(Zero *z, int unit) {
    z->current = 1 - z->current;
    ZeroGradBuffer *gb = &z->grad_buffers[z->current];
    finish_reduce_scatter(z, gb);
    fill_zero_typed(z, gb->data, z->ranks * slice_numel(z, unit));
    z->unit_grads = z->half ? NULL : gb->data;
}

/* Stage 1: the unit's gradient in the whole buffer, summed over the ranks;
 * only this rank's slice of it is written back (the other slices keep this
 * rank's own sums, which nobody reads). */
static void reduce_scatter_whole_unit(Zero *z, int unit) {
    const ParamUnit *u = table_unit(table_of(z), unit);
    size_t S = slice_numel(z, unit), first, count;
    slice_elements(z, unit, &first, &count);
    fill_zero_typed(z, z->gather_recv, z->ranks * S);
    copy_on_device(z->gather_recv, at(z, grad_store(z), unit_offset(z, unit)), u->numel * elem_bytes(z));
    double start = wall_ms();
    comm_reduce_scatter_typed(z->group, z->gather_recv, z->gather_send, S, z->dtype, COMM_SUM, NULL);
    waited(z, "reduce_scatter", start);
    if (count) copy_on_device(at(z, grad_store(z), first), z->gather_send, count * elem_bytes(z));
}

/* Stages 1 and 2: every rank's updated slice of the unit into every rank's
 * whole parameter buffer. */
static void allgather_whole_unit(Zero *z, int unit) {
    const ParamUnit *u = table_unit(table_of(z), unit);
    size_t S = slice_numel(z, unit), first, count;
    slice_elements(z, unit, &first, &count);
    fill_zero_typed(z, z->gather_send, S);
    if (count) copy_on_device(z->gather_send, at(z, param_store(z), first), count * elem_bytes(z));
    double start = wall_ms();
    comm_allgather_typed(z->group, z->gather_send, z->gather_recv, S, z->dtype, NULL);
    waited(z, "allgather", start);
    copy_on_device(at(z, param_store(z), unit_offset(z, unit)), z->gather_recv, u->numel * elem_bytes(z));
}

/* ---- stage 3: running the schedule from the hooks ---- */

/* A schedule that breaks the rules (zero.h) ends the job naming the rule. A
 * gather is queued on the worker; the computation waits for it. */
static void run_action(Zero *z, const ZeroAction *a) {
    if (a->use < 0 || a->use >= 2 * (last_unit(z) + 2))
        fatal(EXIT_RUNTIME, "ZeRO-3 schedule: an action for computation %d (valid: 0..%d)", a->use,
              2 * (last_unit(z) + 2) - 1);
    if (a->op == ZERO_GATHER) {
        int b = 0;
        while (b < z->pool_size && z->pool_busy[b]) b++;
        if (b == z->pool_size)
            fatal(EXIT_RUNTIME,
                  "ZeRO-3 schedule: gathers unit %d while all %d buffers (--prefetch + 1) are in use",
                  a->unit, z->pool_size);
        z->pool_busy[b] = 1;
        z->buffer_of_use[a->use] = b;
        z->ticket_of_use[a->use] =
            comm_worker_allgather(z->worker, at(z, param_store(z), slice_offset(z, a->unit)), z->pool[b],
                                  slice_numel(z, a->unit), z->dtype);
    } else if (a->op == ZERO_FREE) {
        if (z->buffer_of_use[a->use] < 0)
            fatal(EXIT_RUNTIME, "ZeRO-3 schedule: frees unit %d, which is not gathered for that computation",
                  a->unit);
        gpt_bind_unit(z->model, a->unit, NULL, NULL);
        z->pool_busy[z->buffer_of_use[a->use]] = 0;
        z->buffer_of_use[a->use] = -1;
    }
}

/* Run the schedule up to the computation (op, unit), which must come next,
 * wait for its gather, and return the buffer holding the unit. */
static void *run_until_compute(Zero *z, ZeroOp op, int unit) {
    while (z->cursor < z->num_actions && z->actions[z->cursor].op == ZERO_GATHER)
        run_action(z, &z->actions[z->cursor++]);
    const ZeroAction *a = &z->actions[z->cursor];
    if (z->cursor >= z->num_actions || a->op != op || a->unit != unit)
        fatal(EXIT_RUNTIME, "ZeRO-3 schedule: unit %d's %s is not the next computation", unit,
              op == ZERO_FORWARD ? "forward" : "backward");
    if (z->buffer_of_use[a->use] < 0)
        fatal(EXIT_RUNTIME, "ZeRO-3 schedule: unit %d's %s comes before its gather (or after its free)", unit,
              op == ZERO_FORWARD ? "forward" : "backward");
    z->cursor++;
    wait_ticket(z, z->ticket_of_use[a->use], "gather", z->micro);
    return z->pool[z->buffer_of_use[a->use]];
}

/* After a computation: its frees, then the gathers the schedule has before
 * the next computation (queued now, not in the next hook, so that they go
 * ahead of the reduce-scatter the caller queues next: zero.h, "Queue order"). */
static void run_frees_and_gathers(Zero *z) {
    while (z->cursor < z->num_actions &&
           (z->actions[z->cursor].op == ZERO_FREE || z->actions[z->cursor].op == ZERO_GATHER))
        run_action(z, &z->actions[z->cursor++]);
}

/* ---- tied embeddings at stages 2-3 (zero.h: tied_gathered, tied_dwte) ---- */

/* wte: where it starts in the embedding unit, and its elements. */
static size_t wte_in_unit(const Zero *z, size_t *numel) {
    const ParamTensor *wte = table_tensor(table_of(z), LAYER_EMBEDDING, EMBEDDING_WTE);
    *numel = wte->numel;
    return wte->offset - table_unit(table_of(z), LAYER_EMBEDDING)->offset;
}

/* The head's unit, tied, where the embedding unit is held too (one stage;
 * a pipeline's last stage: tied_ends.h). */
static int is_tied_head(const Zero *z, int unit) {
    return z->model->cfg.tied && z->stage >= 2 && unit == z->model->cfg.layers &&
           z->first_unit == LAYER_EMBEDDING;
}

/* Stage 3, before the head's forward: the embedding unit gathered for it and
 * for the head's backward, which follows (zero_schedule), queued on the worker
 * after the gathers queued so far (every rank queues it there). */
static void gather_tied_embedding(Zero *z) {
    long ticket = comm_worker_allgather(z->worker, at(z, param_store(z), slice_offset(z, LAYER_EMBEDDING)),
                                        z->tied_gathered, slice_numel(z, LAYER_EMBEDDING), z->dtype);
    wait_ticket(z, ticket, "gather", z->micro);
}

/* fp32, the head's unit is bound: its matrix is wte (stage 2: bound whole
 * already; stage 3: the gathered embedding's), its gradient tied_dwte from zero. */
static void tied_head_in(Zero *z, int with_grads) {
    size_t numel, wte_at = wte_in_unit(z, &numel);
    if (z->stage == 3) z->model->w.lm_head = (float *)z->tied_gathered + wte_at;
    if (with_grads) ops()->fill_zero(z->tied_dwte, numel);
    z->model->g.lm_head = with_grads ? z->tied_dwte : NULL;
}

static void tied_head_out(Zero *z) {
    if (z->stage == 3) z->model->w.lm_head = NULL;
    z->model->g.lm_head = NULL;
}

/* fp32, the embedding unit's backward begins: the head's gradient of wte
 * first, then the lookups' (01's order: the head back-propagates first). */
static void tied_embedding_grads_in(Zero *z) {
    size_t numel;
    float *dwte = z->unit_grads + wte_in_unit(z, &numel);
    ops()->residual_forward(dwte, dwte, z->tied_dwte, numel);
}

/* ---- the hooks: a unit's weights (and gradients) for each computation ---- */

/* Where unit's weights are for a computation: gathered (stage 3) or in the whole buffer. */
static void *unit_weights(Zero *z, ZeroOp op, int unit) {
    return z->stage == 3 ? run_until_compute(z, op, unit) : at(z, param_store(z), unit_offset(z, unit));
}

static void before_forward(int unit, void *context) {
    Zero *z = context;
    void *weights = unit_weights(z, ZERO_FORWARD, unit);
    if (is_tied_head(z, unit) && z->stage == 3) gather_tied_embedding(z);
    if (z->half)
        mixed_unit_in(&z->mixed, unit, weights, 0);
    else if (z->stage == 3)
        gpt_bind_unit(z->model, unit, weights, NULL);
    if (is_tied_head(z, unit) && !z->half) tied_head_in(z, 0);
    z->compute_start_ms = wall_ms();
}

static void after_forward(int unit, void *context) {
    Zero *z = context;
    record(z, "fwd", z->micro, z->compute_start_ms, wall_ms());
    if (z->half) mixed_unit_out(&z->mixed, unit, NULL);
    if (is_tied_head(z, unit) && !z->half) tied_head_out(z);
    if (z->stage == 3) run_frees_and_gathers(z);
}

static void before_backward(int unit, void *context) {
    Zero *z = context;
    if (unit == z->last_unit) { /* a micro-batch's backward begins (a pipeline runs them in order;
                                   a split backward's B and W count as two: zero.h, "zb-h1") */
        z->micro = z->backwards++;
        z->accumulate = z->micro > 0;
    }
    if (z->stage >= 2) take_grad_buffer(z, unit);
    void *weights = unit_weights(z, ZERO_BACKWARD, unit);
    if (z->half)
        mixed_unit_in(&z->mixed, unit, weights, 1);
    else
        gpt_bind_unit(z->model, unit, weights, z->unit_grads); /* stages 2-3 (0-1 in fp32 have no hooks) */
    if (is_tied_head(z, unit) && !z->half) tied_head_in(z, 1);
    if (z->tied_dwte && unit == LAYER_EMBEDDING) tied_embedding_grads_in(z);
    z->compute_start_ms = wall_ms();
}

static void after_backward(int unit, void *context) {
    Zero *z = context;
    record(z, "bwd", z->micro, z->compute_start_ms, wall_ms());
    if (z->stage < 2) { /* 16-bit stages 0-1: into the whole 16-bit gradients */
        mixed_unit_out(&z->mixed, unit, at(z, z->grads16, unit_offset(z, unit)));
        return;
    }
    if (is_tied_head(z, unit) && !z->half) tied_head_out(z);
    if (z->half)
        mixed_unit_out(&z->mixed, unit, z->grad_buffers[z->current].data); /* zeroed: rounds into it */
    else if (z->stage == 2)
        gpt_bind_unit(z->model, unit, z->params + unit_offset(z, unit), NULL);
    /* stage 3: the next computation's gather first, this unit's gradient behind it */
    if (z->stage == 3) run_frees_and_gathers(z);
    reduce_scatter_unit(z, unit);
}

static const UnitHooks zero_unit_hooks = {.before_forward = before_forward,
                                          .after_forward = after_forward,
                                          .before_backward = before_backward,
                                          .after_backward = after_backward};

/* ---- building ---- */

/* Device state of n elements from fp32 host values: fp32, or rounded to 16 bits. */
static void *upload_state(Zero *z, Category cat, const float *host, size_t n, const char *what) {
    void *dev = alloc_typed(z, cat, n, what);
    if (!z->half) {
        copy_to_device(dev, host, n * sizeof(float));
        return dev;
    }
    if (device_dry()) return dev; /* nothing to round: a dry run's values are never written */
    uint16_t *rounded = xmalloc(n * sizeof(uint16_t));
    for (size_t i = 0; i < n; i++) rounded[i] = half_from_float(host[i], z->mixed.format);
    copy_to_device(dev, rounded, n * sizeof(uint16_t));
    free(rounded);
    return dev;
}

int shard_norm_spans(const ParamTable *t, int first_unit, int last_unit, size_t param_first, int rank,
                     int ranks, const GradSpan *counted, int num_counted, int in_shard, GradSpan **spans) {
    GradSpan all = {0, 0, 0};
    if (!counted) { /* every held element: the range's */
        const ParamUnit *last = table_unit(t, last_unit);
        all.count = last->offset + last->numel - param_first;
        counted = &all, num_counted = 1;
    }
    int n = 0;
    *spans = xcalloc((size_t)(last_unit - first_unit + 1) * num_counted, sizeof(GradSpan));
    for (int u = first_unit; u <= last_unit; u++) {
        size_t first, count; /* this rank's slice of unit u, in the held elements */
        shard_slice_elements(t, u, rank, ranks, &first, &count);
        first -= param_first;
        size_t at_shard = shard_unit_offset(t, u, ranks) - shard_unit_offset(t, first_unit, ranks);
        for (int c = 0; c < num_counted; c++) { /* the slice and a counted span overlap in [lo, hi) */
            size_t lo = first > counted[c].first ? first : counted[c].first;
            size_t end = counted[c].first + counted[c].count, hi = first + count < end ? first + count : end;
            if (lo >= hi && counted != &all) continue;
            size_t at = in_shard ? at_shard + (lo - first) : lo;
            (*spans)[n++] = (GradSpan){at, hi > lo ? hi - lo : 0, 0};
        }
    }
    return n;
}

/* The state of units first_unit..last_unit of model (the whole model, or a
 * pipeline stage's units, whose table and range the caller has set; init:
 * their initial values, held elements in table order, or NULL: from seed),
 * the norm counting what `counted` says (shard_norm_spans). */
static void create_range(Zero *z, GPT *model, const ModelConfig *cfg, uint64_t seed, int stage, int prefetch,
                         CommGroup *g, Precision precision, int first_unit, int last_unit, const float *init,
                         const GradSpan *counted, int num_counted) {
    *z = (Zero){
        .stage = stage, .prefetch = prefetch, .group = g, .sum_group = g, .model = model, .current = 1};
    z->rank = comm_rank(g);
    z->ranks = comm_size(g);
    z->half = precision != PRECISION_FP32;
    int whole_model = !init && first_unit == LAYER_EMBEDDING && last_unit == cfg->layers;
    if (z->half) {
        if (whole_model)
            mixed_units_create(&z->mixed, model, cfg, precision_format(precision));
        else /* the caller's table: a stage's units, or a tp rank's slices of them */
            mixed_units_create_range(&z->mixed, model, first_unit, last_unit, precision_format(precision));
        z->dtype = precision == PRECISION_BF16 ? COMM_BF16 : COMM_F16;
    } else {
        if (whole_model) {
            ParamTable table;
            param_table_build(&table, cfg);
            gpt_init(model, table);
        }
        z->dtype = COMM_F32;
    }
    z->first_unit = first_unit;
    z->last_unit = last_unit;
    z->param_first = whole_model ? 0 : model->param_first;
    z->numel = whole_model ? model->num_params : model->param_count;
    size_t P = z->numel;
    size_t max_slice = shard_largest_slice(table_of(z), first_unit, last_unit, z->ranks);
    z->shard_n = 0;
    for (int u = first_unit; u <= last_unit; u++) z->shard_n += slice_numel(z, u);
    if (whole_model) z->shard_n = shard_numel(table_of(z), z->ranks);
    z->max_unit = max_slice * z->ranks;
    if (stage == 1 || (stage == 2 && counted)) /* stage 1: in the whole gradient buffer; 2: the shard */
        z->num_norm_spans = shard_norm_spans(table_of(z), first_unit, last_unit, z->param_first, z->rank,
                                             z->ranks, counted, num_counted, stage == 2, &z->norm_spans);

    /* initial values: the whole model (stages 0-2) and this rank's shard (stages 1-3) */
    float *whole = NULL, *shard = NULL;
    if (stage < 3) {
        whole = host_scratch(P * sizeof(float)); /* a dry run: address space only */
        if (init)
            memcpy(whole, init, P * sizeof(float));
        else
            param_init_range(table_of(z), seed, whole, z->param_first, P);
    }
    if (stage > 0 && whole_model) {
        shard = xmalloc(z->shard_n * sizeof(float));
        shard_init(table_of(z), seed, z->rank, z->ranks, shard);
    } else if (stage > 0) { /* a stage's units (stages 1-2): the slices of the values above */
        shard = xcalloc(z->shard_n, sizeof(float));
        for (int u = first_unit; u <= last_unit; u++) {
            size_t first, count;
            slice_elements(z, u, &first, &count);
            memcpy(shard + slice_offset(z, u), whole + first, count * sizeof(float));
        }
    }
    void *params = stage < 3 ? upload_state(z, CAT_PARAMS, whole, P, "parameters")
                             : upload_state(z, CAT_PARAMS, shard, z->shard_n, "parameter shard");
    void *grads = stage < 2 ? alloc_typed(z, CAT_GRADS, P, "gradients")
                            : alloc_typed(z, CAT_GRADS, z->shard_n, "gradient shard");
    size_t optimizer_n = stage == 0 ? P : z->shard_n;
    if (z->half) {
        z->params16 = params;
        z->grads16 = grads;
        if (z->mixed.tied_wte && stage < 3) /* tied: the head reads wte from the whole 16-bit weights */
            mixed_tied_source(&z->mixed, at(z, z->params16, unit_offset(z, LAYER_EMBEDDING)));
        z->master = mem_alloc(SPACE_DEVICE, CAT_OPTIMIZER, optimizer_n * sizeof(float), "master weights");
        copy_to_device(z->master, stage == 0 ? whole : shard, optimizer_n * sizeof(float));
    } else {
        z->params = params;
        z->grads = grads;
        if (stage < 2) gpt_bind_range(model, first_unit, last_unit, z->params, z->grads);
        if (stage == 2) bind_whole_params(z, z->params);
    }
    host_scratch_free(whole, stage < 3 ? P * sizeof(float) : 0);
    free(shard);
    adamw_create(&z->opt, optimizer_n);

    for (int b = 0; b < 2 && stage >= 2; b++) {
        ZeroGradBuffer *gb = &z->grad_buffers[b];
        gb->data = alloc_typed(z, CAT_BUCKETS, z->max_unit, "unit gradient");
        gb->slice = alloc_typed(z, CAT_BUCKETS, max_slice, "gradient slice");
        gb->ticket = -1;
    }
    if (stage >= 2 && z->half)
        z->slice_f32 =
            mem_alloc(SPACE_DEVICE, CAT_BUCKETS, max_slice * sizeof(float), "gradient slice (fp32)");
    if (stage == 1 || stage == 2) {
        z->gather_send = alloc_typed(z, CAT_COMM, max_slice, "unit slice");
        z->gather_recv = alloc_typed(z, CAT_COMM, z->max_unit, "padded unit");
    }

    int both_ends = first_unit == LAYER_EMBEDDING && last_unit == cfg->layers; /* else tied_ends.h */
    if (stage == 3 && cfg->tied) {
        z->tied_gathered = alloc_typed(z, CAT_GATHERED, z->ranks * slice_numel(z, LAYER_EMBEDDING),
                                       "embedding unit gathered for the tied head");
        if (z->half) mixed_tied_source(&z->mixed, z->tied_gathered);
    }
    if (stage >= 2 && cfg->tied && both_ends && !z->half) {
        size_t numel;
        wte_in_unit(z, &numel);
        z->tied_dwte = mem_alloc(SPACE_DEVICE, CAT_WORKSPACE, numel * sizeof(float), "tied head's dwte");
    }
    if (stage == 3) {
        z->num_actions = zero_schedule(model->cfg.layers, prefetch, &z->actions);
        int uses = 2 * (model->cfg.layers + 2);
        z->pool_size = prefetch + 1 < uses ? prefetch + 1 : uses;
        z->pool = xcalloc(z->pool_size, sizeof(void *));
        z->pool_busy = xcalloc(z->pool_size, sizeof(int));
        z->buffer_of_use = xmalloc(uses * sizeof(int));
        z->ticket_of_use = xmalloc(uses * sizeof(long));
        for (int c = 0; c < uses; c++) z->buffer_of_use[c] = -1;
        for (int b = 0; b < z->pool_size; b++)
            z->pool[b] = alloc_typed(z, CAT_GATHERED, z->max_unit, "gathered unit");
    }
    /* Room for every collective of a micro-batch (its gathers and reduce-scatters):
     * a ticket's times must outlive it until it is waited for, and the last
     * reduce-scatters of a micro-batch are waited for in the next one, after
     * its forward's gathers. What is in flight is bounded anyway, by the pool
     * (gathers) and the two gradient buffers (reduce-scatters). */
    if (stage >= 2) z->worker = comm_worker_create(g, 3 * (model->cfg.layers + 2) + 2);
}

void zero_create_precision(Zero *z, GPT *model, const ModelConfig *cfg, uint64_t seed, int stage,
                           int prefetch, CommGroup *g, Precision precision) {
    create_range(z, model, cfg, seed, stage, prefetch, g, precision, LAYER_EMBEDDING, cfg->layers, NULL, NULL,
                 0);
}

void zero_create_stage(Zero *z, GPT *model, const ModelConfig *cfg, uint64_t seed, int stage, CommGroup *g,
                       CommGroup *sum_group, Precision precision) {
    if (stage < 1 || stage > 2 || model->first_unit > model->last_unit)
        fatal(EXIT_RUNTIME, "zero_create_stage: stage %d of units %d..%d (valid: stages 1-2, a set range)",
              stage, model->first_unit, model->last_unit);
    create_range(z, model, cfg, seed, stage, 0, g, precision, model->first_unit, model->last_unit, NULL, NULL,
                 0);
    z->sum_group = sum_group;
}

void zero_create_slices(Zero *z, TensorParallelModel *tm, uint64_t seed, int stage, CommGroup *g,
                        CommGroup *sum_group, Precision precision) {
    GPT *model = tm->m;
    if (stage < 1 || stage > 2 || model->params)
        fatal(EXIT_RUNTIME, "zero_create_slices: stage %d (valid: 1-2, slices without storage)", stage);
    float *init = xmalloc(model->param_count * sizeof(float));
    tp_initial_values(tm, seed, init); /* this rank's slices of the whole model's values */
    create_range(z, model, &model->cfg, seed, stage, 0, g, precision, model->first_unit, model->last_unit,
                 init, tm->once_spans, tm->num_once_spans);
    z->sum_group = sum_group;
    free(init);
}

void zero_create(Zero *z, GPT *model, const ModelConfig *cfg, uint64_t seed, int stage, int prefetch,
                 CommGroup *g) {
    zero_create_precision(z, model, cfg, seed, stage, prefetch, g, PRECISION_FP32);
}

void zero_destroy(Zero *z) {
    comm_worker_destroy(z->worker);
    if (z->pool) {
        for (int b = 0; b < z->pool_size; b++) mem_free(z->pool[b]);
    }
    free(z->pool);
    free(z->pool_busy);
    free(z->buffer_of_use);
    free(z->ticket_of_use);
    free(z->actions);
    free(z->norm_spans);
    adamw_destroy(&z->opt);
    mem_free(z->gather_send);
    mem_free(z->gather_recv);
    for (int b = 0; b < 2; b++) {
        mem_free(z->grad_buffers[b].data);
        mem_free(z->grad_buffers[b].slice);
    }
    mem_free(z->slice_f32);
    mem_free(z->tied_gathered);
    mem_free(z->tied_dwte);
    mem_free(z->grads);
    mem_free(z->params);
    mem_free(z->grads16);
    mem_free(z->params16);
    mem_free(z->master);
    if (z->half) mixed_destroy(&z->mixed);
    timeline_free(&z->timeline);
}

const UnitHooks *zero_hooks(Zero *z) {
    static UnitHooks hooks;
    if (z->stage < 2 && !z->half) return NULL; /* the gradients are bound whole */
    hooks = zero_unit_hooks;
    hooks.context = z;
    return &hooks;
}

/* ---- the step ---- */

void zero_start_clock(Zero *z, int step) {
    z->step = step;
    z->origin_ms = wall_ms();
    z->comm_ms = z->comm_busy_ms = 0.0;
}

void zero_begin_step(Zero *z) {
    if (z->stage < 2) fill_zero_typed(z, grad_store(z), z->numel);
    z->micro = z->accumulate = z->backwards = 0;
}

void zero_begin_micro(Zero *z, int micro) {
    z->accumulate = micro > 0;
    z->micro = micro;
    z->cursor = 0;
}

void zero_sync_grads(Zero *z) {
    if (z->stage == 0) {
        double start = wall_ms();
        comm_allreduce_typed(z->group, grad_store(z), z->numel, z->dtype, COMM_SUM, NULL);
        waited(z, "allreduce", start);
    }
    if (z->stage == 1)
        for (int u = z->first_unit; u <= last_unit(z); u++) reduce_scatter_whole_unit(z, u);
    if (z->stage >= 2) { /* the last two units' reduce-scatters, older first */
        finish_reduce_scatter(z, &z->grad_buffers[1 - z->current]);
        finish_reduce_scatter(z, &z->grad_buffers[z->current]);
        z->comm_ms += comm_worker_wait_all(z->worker);
    }
}

GradShards zero_grad_shards(const Zero *z) {
    GradShards g = {.grads = z->grads, .grads16 = z->grads16, .format = z->mixed.format};
    g.held = z->stage >= 2 ? z->shard_n : z->numel; /* stages 2-3: the padding holds zeros */
    if (z->norm_spans) {                            /* stage 1, or with tensor slices 2 */
        g.spans = z->norm_spans;
        g.num_spans = z->num_norm_spans;
    }
    g.agree = grad_norm_agree;
    if (z->stage >= 1) g.sum_group = z->sum_group; /* the dp group, or with pipeline stages the world */
    if (z->half) g.agree_group = z->group;         /* fp16's overflow: stage 0 has no sum to carry it */
    return g;
}

/* AdamW on n elements: params, grads of z->dtype; m, v (and master) fp32 */
static void adamw_elements(Zero *z, size_t at_params, size_t at_grads, size_t at_opt, size_t n,
                           float grad_scale, const OptimHyper *h) {
    AdamW *o = &z->opt;
    if (z->half)
        ops()->adamw_update_half(z->master + at_opt, z->params16 + at_params, z->grads16 + at_grads,
                                 o->m + at_opt, o->v + at_opt, n, h->lr, h->beta1, h->beta2, h->eps,
                                 h->weight_decay, grad_scale, o->t, z->mixed.format);
    else
        ops()->adamw_update(z->params + at_params, z->grads + at_grads, o->m + at_opt, o->v + at_opt, n,
                            h->lr, h->beta1, h->beta2, h->eps, h->weight_decay, grad_scale, o->t);
}

void zero_update(Zero *z, float grad_scale, const OptimHyper *h) {
    if (z->stage == 0 || z->stage == 3) { /* the optimizer's elements are the parameters' */
        if (!z->half) {
            adamw_step(&z->opt, z->params, z->grads, grad_scale, h);
            return;
        }
        z->opt.t++;
        adamw_elements(z, 0, 0, 0, z->opt.n, grad_scale, h);
        return;
    }
    /* Stages 1 and 2: this rank's slice of each unit, in place in the whole
     * parameter buffer, with the moments (and, stage 2, the gradients) of its shard. */
    z->opt.t++;
    for (int u = z->first_unit; u <= last_unit(z); u++) {
        size_t first, count, at = slice_offset(z, u);
        slice_elements(z, u, &first, &count);
        if (count) adamw_elements(z, first, z->stage == 1 ? first : at, at, count, grad_scale, h);
    }
    for (int u = z->first_unit; u <= last_unit(z); u++) allgather_whole_unit(z, u);
}

void zero_add_slice(Zero *z, int unit, const float *slice) {
    size_t first, count;
    slice_elements(z, unit, &first, &count);
    if (!count) return;
    void *mine = at(z, grad_store(z), z->stage >= 2 ? slice_offset(z, unit) : first);
    if (z->half)
        ops()->accumulate_half(mine, slice, count, z->mixed.format);
    else
        ops()->residual_forward(mine, mine, slice, count); /* mine += slice */
}

const void *zero_unit_params(const Zero *z, int unit) {
    if (z->stage == 3) fatal(EXIT_RUNTIME, "zero_unit_params: stage 3 holds no unit whole");
    return at(z, param_store(z), unit_offset(z, unit));
}

int zero_step_update(Zero *z, LossScaler *ls, const OptimHyper *h, int step, double *grad_norm) {
    GradShards held = zero_grad_shards(z);
    work_begin("update", 0, 0); /* a dry run counts the work (work_ledger.h) */
    StepDecision d = optimizer_decide(&held, ls, h->clip, step);
    *grad_norm = d.grad_norm;
    if (!d.skipped) zero_update(z, d.grad_scale, h);
    work_end();
    return d.skipped;
}

void zero_checkpoint_layout(const Zero *z, CkptLayout *l) {
    const AdamW *o = &z->opt;
    if (!z->half)
        ckpt_layout_zero(l, table_of(z), z->stage, z->params, o->m, o->v, z->rank, z->ranks, 0);
    else if (z->stage == 0)
        ckpt_layout_zero(l, table_of(z), 0, z->master, o->m, o->v, z->rank, z->ranks, 0);
    else
        ckpt_layout_shards(l, table_of(z), z->first_unit, last_unit(z), z->master, o->m, o->v, z->rank,
                           z->ranks, 0);
}

void shard_checkpoint_layout(CkptLayout *l, const GPT *m, int rank, int ranks, const TensorParallelModel *tm,
                             float *params, float *shard_params, float *adam_m, float *adam_v, size_t shard_n,
                             int on_host) {
    const ParamTable *t = &m->table;
    ckpt_set_buffer(l, CKPT_PARAMS, params ? params : shard_params, params ? m->param_count : shard_n,
                    on_host);
    ckpt_set_buffer(l, CKPT_ADAM_M, adam_m, shard_n, on_host);
    ckpt_set_buffer(l, CKPT_ADAM_V, adam_v, shard_n, on_host);
    ParamTable whole;
    param_table_build(&whole, &m->cfg);
    int r = tm ? tm->tp->rank : 0, tp = tm ? tm->tp->size : 1;
    for (int i = 0; i < m->num_tensors; i++) { /* the local and whole tables list the same tensors */
        const ParamTensor *x = &m->tensors[i], *w = &whole.tensors[i];
        if (x->layer < m->first_unit || x->layer > m->last_unit) continue; /* another stage's */
        SliceKind kind = tm ? tm->slice[i] : SLICE_NONE;
        int counted = kind != SLICE_NONE || r == 0; /* a replicated tensor: its tp rank 0 writes */
        size_t first, count; /* this rank's dp slice of the tensor's unit, in the held elements */
        shard_slice_elements(t, x->layer, rank, ranks, &first, &count);
        first -= m->param_first;
        size_t slice_at = shard_unit_offset(t, x->layer, ranks) - shard_unit_offset(t, m->first_unit, ranks);
        for (size_t e = 0, n; e < x->numel; e += n) { /* runs contiguous in the slice and the whole tensor */
            size_t g = tensor_parallel_global_index(w, kind, r, tp, e), at = x->offset - m->param_first + e;
            for (n = 1; e + n < x->numel && tensor_parallel_global_index(w, kind, r, tp, e + n) == g + n;)
                n++;
            if (params) ckpt_hold(l, CKPT_PARAMS, w->offset + g, n, at, rank == 0 && counted); /* whole */
            size_t lo = at > first ? at : first, hi = at + n < first + count ? at + n : first + count;
            for (int a = params ? CKPT_ADAM_M : CKPT_PARAMS; a <= CKPT_ADAM_V && lo < hi;
                 a++) /* the shard's */
                ckpt_hold(l, a, w->offset + g + (lo - at), hi - lo, slice_at + (lo - first), counted);
        }
    }
    param_table_free(&whole);
}

void zero_stage_checkpoint_layout(const Zero *z, const TensorParallelModel *tm, CkptLayout *l) {
    /* in 16 bits the weights of record are the fp32 master weights, laid out as the moments */
    shard_checkpoint_layout(l, z->model, z->rank, z->ranks, tm, z->half ? NULL : z->params,
                            z->half ? z->master : NULL, z->opt.m, z->opt.v, z->shard_n, 0);
}

void zero_weights_from_master(Zero *z) {
    if (!z->half) return;
    if (z->stage == 0 || z->stage == 3) { /* the master weights are laid out as the parameters */
        ops()->cast_to_half(z->params16, z->master, z->opt.n, z->mixed.format);
        return;
    }
    for (int u = z->first_unit; u <= last_unit(z); u++) {
        size_t first, count;
        slice_elements(z, u, &first, &count);
        if (count)
            ops()->cast_to_half(z->params16 + first, z->master + slice_offset(z, u), count, z->mixed.format);
        allgather_whole_unit(z, u);
    }
    z->timeline.count = 0; /* before the first step: these gathers belong to no step's timeline */
    z->comm_ms = z->comm_busy_ms = 0.0;
}

int zero_needs_whole(const Zero *z) {
    return z->stage == 3 || z->half;
}

void zero_bind_whole(Zero *z, float *whole) {
    /* between steps every buffer of the pool is free: gather through the first */
    for (int u = z->first_unit; u <= last_unit(z); u++) {
        const ParamUnit *unit = table_unit(table_of(z), u);
        void *weights = at(z, param_store(z), unit_offset(z, u));
        if (z->stage == 3) {
            comm_allgather_typed(z->group, at(z, param_store(z), slice_offset(z, u)), z->pool[0],
                                 slice_numel(z, u), z->dtype, NULL);
            weights = z->pool[0];
        }
        if (z->half)
            ops()->cast_from_half(whole + unit->offset, weights, unit->numel, z->mixed.format);
        else
            copy_on_device(whole + unit->offset, weights, unit->numel * sizeof(float));
    }
    bind_whole_params(z, whole);
}

void zero_unbind_whole(Zero *z) {
    for (int u = z->first_unit; u <= last_unit(z); u++) gpt_bind_unit(z->model, u, NULL, NULL);
    z->model->params = NULL;
}

/* Validation loss and the sample need the whole model in fp32: stage 3
 * gathers it for them, 16-bit runs widen it (every rank takes part; rank 0
 * uses it). Its buffer is allocated before step 1 and kept, because every
 * run evaluates at its last step: a budget that cannot hold it is refused
 * at start-up, not after the whole run has trained. NULL when the model is
 * held whole in fp32 already (stages 0-2 in fp32). */
float *zero_alloc_whole(const Zero *z) {
    if (!zero_needs_whole(z)) return NULL;
    return mem_alloc(SPACE_DEVICE, CAT_WORKSPACE, z->model->num_params * sizeof(float),
                     "the whole model in fp32 for evaluation");
}

double zero_evaluate_and_sample(Zero *z, float *whole, Activations *acts, Scratch *scratch,
                                const Dataset *data, const Config *cfg, int sample, uint64_t *rng) {
    if (whole) zero_bind_whole(z, whole);
    double val_loss = NAN;
    if (comm_rank(z->group) == 0) {
        val_loss = evaluate_loss(z->model, acts, scratch, data, cfg);
        if (sample > 0) sample_text(z->model, acts, scratch, data, sample, rng);
    }
    if (whole) zero_unbind_whole(z);
    return val_loss;
}
