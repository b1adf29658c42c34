/* zero.c: see zero.h. */
#include "zero.h"

#include "device.h"
#include "kernels.h"
#include "util.h"

#include <math.h>
#include <stdlib.h>

/* ---- where a unit's pieces are ---- */

static const ParamTable *table_of(const Zero *z) {
    return &z->model->table;
}
static size_t slice_numel(const Zero *z, int unit) {
    return shard_slice_numel(table_of(z), unit, z->ranks);
}
static size_t slice_offset(const Zero *z, int unit) {
    return shard_unit_offset(table_of(z), unit, z->ranks);
}
static int last_unit(const Zero *z) {
    return z->model->cfg.layers;
}

/* Bind every unit's parameters to a whole parameter buffer, no gradients. */
static void bind_whole_params(GPT *model, float *params) {
    model->first_unit = LAYER_EMBEDDING;
    model->last_unit = model->cfg.layers;
    model->param_first = 0;
    model->param_count = model->num_params;
    model->params = params;
    model->grads = NULL;
    for (int u = LAYER_EMBEDDING; u <= model->cfg.layers; u++)
        gpt_bind_unit(model, u, params + table_unit(&model->table, u)->offset, NULL);
}

/* ---- stage 3's schedule ---- */

/* Computation c of a micro-batch: the forward of units -1..L, then the backward of L..-1. */
static int unit_of_use(int layers, int c) {
    int units = layers + 2;
    return c < units ? c - 1 : layers - (c - units);
}

int zero_schedule(int layers, int prefetch, ZeroAction **actions) {
    int uses = 2 * (layers + 2), n = 0;
    ZeroAction *a = xcalloc((size_t)3 * uses, sizeof(ZeroAction)); /* a gather, a computation, a free each */
    /* EXERCISE 05.3 BEGIN: the stage-3 gather/free schedule (course.md, exercise 05.3) */
    int next_gather = 0;
    for (int c = 0; c < uses; c++) {
        /* gather this computation's unit and those of the next `prefetch`, each once */
        int last_needed = c + prefetch < uses ? c + prefetch : uses - 1;
        for (; next_gather <= last_needed; next_gather++)
            a[n++] = (ZeroAction){ZERO_GATHER, unit_of_use(layers, next_gather), next_gather};
        a[n++] = (ZeroAction){c < layers + 2 ? ZERO_FORWARD : ZERO_BACKWARD, unit_of_use(layers, c), c};
        a[n++] = (ZeroAction){ZERO_FREE, unit_of_use(layers, c), c};
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

/* Stages 2 and 3: the unit's padded gradient (z->unit_grads, N*S), summed
 * over the ranks, this rank's slice into its shard of the gradients; the
 * step's later micro-batches add to what the first left there. */
static void reduce_scatter_unit(Zero *z, int unit) {
    /* EXERCISE 05.2 BEGIN: the stage-2 reduce-scatter (course.md, exercise 05.2) */
    size_t S = slice_numel(z, unit);
    float *mine = z->grads + slice_offset(z, unit);
    if (!z->accumulate) {
        comm_reduce_scatter(z->group, z->unit_grads, mine, S, COMM_SUM);
    } else {
        comm_reduce_scatter(z->group, z->unit_grads, z->slice_grads, S, COMM_SUM);
        ops()->residual_forward(mine, mine, z->slice_grads, S); /* mine += slice */
    }
    /* EXERCISE 05.2 END */
}

/* Stage 1: the unit's gradient in the whole buffer, summed over the ranks;
 * only this rank's slice of it is written back (the other slices keep this
 * rank's own sums, which nobody reads). */
static void reduce_scatter_whole_unit(Zero *z, int unit) {
    const ParamUnit *u = table_unit(table_of(z), unit);
    size_t S = slice_numel(z, unit), first, count;
    shard_slice_elements(table_of(z), unit, z->rank, z->ranks, &first, &count);
    ops()->fill_zero(z->gather_recv, z->ranks * S);
    copy_on_device(z->gather_recv, z->grads + u->offset, u->numel * sizeof(float));
    comm_reduce_scatter(z->group, z->gather_recv, z->gather_send, S, COMM_SUM);
    if (count) copy_on_device(z->grads + first, z->gather_send, count * sizeof(float));
}

/* Stages 1 and 2: every rank's updated slice of the unit into every rank's
 * whole parameter buffer. */
static void allgather_whole_unit(Zero *z, int unit) {
    const ParamUnit *u = table_unit(table_of(z), unit);
    size_t S = slice_numel(z, unit), first, count;
    shard_slice_elements(table_of(z), unit, z->rank, z->ranks, &first, &count);
    ops()->fill_zero(z->gather_send, S);
    if (count) copy_on_device(z->gather_send, z->params + first, count * sizeof(float));
    comm_allgather(z->group, z->gather_send, z->gather_recv, S);
    copy_on_device(z->params + u->offset, z->gather_recv, u->numel * sizeof(float));
}

/* Stage 3: the unit's parameters from every rank's shard into buffer (N*S:
 * the unit in table order, then its padding). */
static void gather_unit(Zero *z, int unit, float *buffer) {
    comm_allgather(z->group, z->params + slice_offset(z, unit), buffer, slice_numel(z, unit));
}

/* ---- stage 3: running the schedule from the hooks ---- */

/* A schedule that breaks the rules (zero.h) ends the job naming the rule. */
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
        gather_unit(z, a->unit, z->pool[b]);
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
 * and bind that unit. */
static void run_until_compute(Zero *z, ZeroOp op, int unit) {
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
    gpt_bind_unit(z->model, unit, z->pool[z->buffer_of_use[a->use]],
                  op == ZERO_BACKWARD ? z->unit_grads : NULL);
}

/* Run the frees that follow a computation. */
static void run_frees(Zero *z) {
    while (z->cursor < z->num_actions && z->actions[z->cursor].op == ZERO_FREE)
        run_action(z, &z->actions[z->cursor++]);
}

static void zero_unit_grads(Zero *z, int unit) {
    ops()->fill_zero(z->unit_grads, z->ranks * slice_numel(z, unit)); /* the padding too */
}

static void stage3_before_forward(int unit, void *context) {
    run_until_compute(context, ZERO_FORWARD, unit);
}
static void stage3_after_forward(int unit, void *context) {
    (void)unit;
    run_frees(context);
}
static void stage3_before_backward(int unit, void *context) {
    zero_unit_grads(context, unit);
    run_until_compute(context, ZERO_BACKWARD, unit);
}
static void stage3_after_backward(int unit, void *context) {
    reduce_scatter_unit(context, unit);
    run_frees(context);
}

/* ---- stage 2: parameters whole, a unit's gradient at a time ---- */

static void stage2_before_backward(int unit, void *context) {
    Zero *z = context;
    zero_unit_grads(z, unit);
    gpt_bind_unit(z->model, unit, z->params + table_unit(table_of(z), unit)->offset, z->unit_grads);
}
static void stage2_after_backward(int unit, void *context) {
    Zero *z = context;
    reduce_scatter_unit(z, unit);
    gpt_bind_unit(z->model, unit, z->params + table_unit(table_of(z), unit)->offset, NULL);
}

static const UnitHooks stage2_hooks = {.before_backward = stage2_before_backward,
                                       .after_backward = stage2_after_backward};
static const UnitHooks stage3_hooks = {.before_forward = stage3_before_forward,
                                       .after_forward = stage3_after_forward,
                                       .before_backward = stage3_before_backward,
                                       .after_backward = stage3_after_backward};

/* ---- building ---- */

void zero_create(Zero *z, GPT *model, const ModelConfig *cfg, uint64_t seed, int stage, int prefetch,
                 CommGroup *g) {
    *z = (Zero){.stage = stage, .prefetch = prefetch, .group = g, .model = model};
    z->rank = comm_rank(g);
    z->ranks = comm_size(g);
    ParamTable table;
    param_table_build(&table, cfg);
    gpt_init(model, table);
    size_t P = model->num_params, max_slice = 0;
    z->shard_n = shard_numel(table_of(z), z->ranks);
    for (int u = LAYER_EMBEDDING; u <= last_unit(z); u++)
        if (slice_numel(z, u) > max_slice) max_slice = slice_numel(z, u);
    z->max_unit = max_slice * z->ranks;

    size_t whole_bytes = P * sizeof(float), shard_bytes = z->shard_n * sizeof(float);
    if (stage < 3) {
        z->params = mem_alloc(SPACE_DEVICE, CAT_PARAMS, whole_bytes, "parameters");
        float *host = xmalloc(whole_bytes);
        param_init_range(table_of(z), seed, host, 0, P);
        copy_to_device(z->params, host, whole_bytes);
        free(host);
    } else {
        z->params = mem_alloc(SPACE_DEVICE, CAT_PARAMS, shard_bytes, "parameter shard");
        float *host = xmalloc(shard_bytes);
        shard_init(table_of(z), seed, z->rank, z->ranks, host);
        copy_to_device(z->params, host, shard_bytes);
        free(host);
    }
    if (stage < 2) {
        z->grads = mem_alloc(SPACE_DEVICE, CAT_GRADS, whole_bytes, "gradients");
        gpt_bind_range(model, LAYER_EMBEDDING, last_unit(z), z->params, z->grads);
    } else {
        z->grads = mem_alloc(SPACE_DEVICE, CAT_GRADS, shard_bytes, "gradient shard");
        z->unit_grads = mem_alloc(SPACE_DEVICE, CAT_BUCKETS, z->max_unit * sizeof(float), "unit gradient");
        z->slice_grads = mem_alloc(SPACE_DEVICE, CAT_BUCKETS, max_slice * sizeof(float), "gradient slice");
        if (stage == 2) bind_whole_params(model, z->params);
    }
    if (stage == 1 || stage == 2) {
        z->gather_send = mem_alloc(SPACE_DEVICE, CAT_COMM, max_slice * sizeof(float), "unit slice");
        z->gather_recv = mem_alloc(SPACE_DEVICE, CAT_COMM, z->max_unit * sizeof(float), "padded unit");
    }
    adamw_create(&z->opt, stage == 0 ? P : z->shard_n);

    if (stage == 3) {
        z->num_actions = zero_schedule(model->cfg.layers, prefetch, &z->actions);
        int uses = 2 * (model->cfg.layers + 2);
        z->pool_size = prefetch + 1 < uses ? prefetch + 1 : uses;
        z->pool = xcalloc(z->pool_size, sizeof(float *));
        z->pool_busy = xcalloc(z->pool_size, sizeof(int));
        z->buffer_of_use = xmalloc(uses * sizeof(int));
        for (int c = 0; c < uses; c++) z->buffer_of_use[c] = -1;
        for (int b = 0; b < z->pool_size; b++)
            z->pool[b] = mem_alloc(SPACE_DEVICE, CAT_GATHERED, z->max_unit * sizeof(float), "gathered unit");
    }
}

void zero_destroy(Zero *z) {
    if (z->pool) {
        for (int b = 0; b < z->pool_size; b++) mem_free(z->pool[b]);
    }
    free(z->pool);
    free(z->pool_busy);
    free(z->buffer_of_use);
    free(z->actions);
    adamw_destroy(&z->opt);
    mem_free(z->gather_send);
    mem_free(z->gather_recv);
    mem_free(z->unit_grads);
    mem_free(z->slice_grads);
    mem_free(z->grads);
    mem_free(z->params);
}

const UnitHooks *zero_hooks(Zero *z) {
    static UnitHooks hooks;
    if (z->stage < 2) return NULL;
    hooks = z->stage == 2 ? stage2_hooks : stage3_hooks;
    hooks.context = z;
    return &hooks;
}

/* ---- the step ---- */

void zero_begin_step(Zero *z) {
    if (z->stage < 2) ops()->fill_zero(z->grads, z->model->num_params);
}

void zero_begin_micro(Zero *z, int micro) {
    z->accumulate = micro > 0;
    z->cursor = 0;
}

void zero_sync_grads(Zero *z) {
    if (z->stage == 0) comm_allreduce(z->group, z->grads, z->model->num_params, COMM_SUM);
    if (z->stage == 1)
        for (int u = LAYER_EMBEDDING; u <= last_unit(z); u++) reduce_scatter_whole_unit(z, u);
}

double zero_grad_norm(Zero *z) {
    const KernelOps *k = ops();
    if (z->stage == 0) return sqrt(k->sum_squares(z->grads, z->model->num_params));
    double sum = 0.0;
    if (z->stage == 1) {
        for (int u = LAYER_EMBEDDING; u <= last_unit(z); u++) {
            size_t first, count;
            shard_slice_elements(table_of(z), u, z->rank, z->ranks, &first, &count);
            if (count) sum += k->sum_squares(z->grads + first, count);
        }
    } else {
        sum = k->sum_squares(z->grads, z->shard_n); /* the padding holds zeros */
    }
    return sqrt(comm_allreduce_double(z->group, sum, 0));
}

void zero_update(Zero *z, float lr, float grad_scale, const Config *cfg) {
    if (z->stage == 0 || z->stage == 3) { /* the optimizer's elements are the parameters' */
        adamw_step(&z->opt, z->params, z->grads, lr, grad_scale, cfg);
        return;
    }
    /* Stages 1 and 2: this rank's slice of each unit, in place in the whole
     * parameter buffer, with the moments (and, stage 2, the gradients) of its shard. */
    z->opt.t++;
    for (int u = LAYER_EMBEDDING; u <= last_unit(z); u++) {
        size_t first, count, at = slice_offset(z, u);
        shard_slice_elements(table_of(z), u, z->rank, z->ranks, &first, &count);
        const float *grads = z->stage == 1 ? z->grads + first : z->grads + at;
        if (count)
            ops()->adamw_update(z->params + first, grads, z->opt.m + at, z->opt.v + at, count, lr, cfg->beta1,
                                cfg->beta2, cfg->eps, cfg->wd, grad_scale, z->opt.t);
    }
    for (int u = LAYER_EMBEDDING; u <= last_unit(z); u++) allgather_whole_unit(z, u);
}

void zero_bind_whole(Zero *z, float *whole) {
    /* between steps every buffer of the pool is free: gather through the first */
    for (int u = LAYER_EMBEDDING; u <= last_unit(z); u++) {
        gather_unit(z, u, z->pool[0]);
        const ParamUnit *unit = table_unit(table_of(z), u);
        copy_on_device(whole + unit->offset, z->pool[0], unit->numel * sizeof(float));
    }
    bind_whole_params(z->model, whole);
}

void zero_unbind_whole(Zero *z) {
    for (int u = LAYER_EMBEDDING; u <= last_unit(z); u++) gpt_bind_unit(z->model, u, NULL, NULL);
    z->model->params = NULL;
}
