/* mixed.c: see mixed.h. */
#include "common/model/mixed.h" /* mixed precision: 16-bit weights, loss scaling */

#include "common/device/device.h" /* mem_alloc, copies, streams, timers */
#include "common/kernels/kernels.h" /* ops(): the kernel table */
#include "common/core/util.h" /* fatal, log_info, exit codes, flag parsing */

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define INITIAL_LOSS_SCALE 65536.0f

HalfFormat precision_format(Precision p) {
    if (p == PRECISION_FP32) fatal(EXIT_RUNTIME, "precision_format: fp32 has no 16-bit format");
    return p == PRECISION_BF16 ? HALF_BF16 : HALF_F16;
}

/* ---- tied embeddings (MixedModel.tied_wte) ---- */

/* wte: the tensor, and where it starts in its unit (the embedding). */
static const ParamTensor *wte_of(const GPT *m, size_t *in_unit) {
    const ParamTensor *t = table_tensor(&m->table, LAYER_EMBEDDING, EMBEDDING_WTE);
    *in_unit = t->offset - table_unit(&m->table, LAYER_EMBEDDING)->offset;
    return t;
}

static int is_head(const MixedModel *mm, int unit) {
    return mm->tied_wte && unit == mm->model->cfg.layers;
}

/* A pipeline's last stage, which holds a copy of the embedding unit for its
 * head (mixed_create_chunks' run of it after the stage's own units). */
static int holds_embedding_copy(const MixedModel *mm) {
    return mm->model->first_unit > LAYER_EMBEDDING && mm->unit_at && mm->unit_at[0] != SIZE_MAX;
}

/* The head's unit is in: bind wte, converted from the embedding's 16-bit
 * weights, as the head's matrix (and its gradient, from zero, for a backward). */
static void tied_head_in(MixedModel *mm, int with_grads) {
    size_t at;
    const ParamTensor *t = wte_of(mm->model, &at);
    if (!mm->tied_source) fatal(EXIT_RUNTIME, "mixed: tied weights without the embedding's 16-bit weights");
    ops()->cast_from_half(mm->tied_wte, mm->tied_source + at, t->numel, mm->format);
    if (with_grads) ops()->fill_zero(mm->tied_dwte, t->numel);
    mm->model->w.lm_head = mm->tied_wte;
    mm->model->g.lm_head = with_grads ? mm->tied_dwte : NULL;
}

static void tied_head_out(MixedModel *mm) {
    mm->model->w.lm_head = NULL;
    mm->model->g.lm_head = NULL;
}

void mixed_tied_source(MixedModel *mm, const uint16_t *embedding_unit_params) {
    mm->tied_source = embedding_unit_params;
}

/* ---- one unit at a time in fp32 ---- */

void mixed_unit_in(MixedModel *mm, int unit, const uint16_t *params, int with_grads) {
    const ParamUnit *u = table_unit(&mm->model->table, unit);
    ops()->cast_from_half(mm->unit_params, params, u->numel, mm->format);
    if (with_grads) ops()->fill_zero(mm->unit_grads, u->numel);
    gpt_bind_unit(mm->model, unit, mm->unit_params, mm->unit_grads);
    if (is_head(mm, unit)) tied_head_in(mm, with_grads);
    if (mm->tied_wte && unit == LAYER_EMBEDDING && with_grads) { /* the head's gradient of wte, before the lookups' */
        size_t at;
        const ParamTensor *t = wte_of(mm->model, &at);
        ops()->residual_forward(mm->unit_grads + at, mm->unit_grads + at, mm->tied_dwte, t->numel);
    }
}

void mixed_unit_out(MixedModel *mm, int unit, uint16_t *grads) {
    if (grads)
        ops()->accumulate_half(grads, mm->unit_grads, table_unit(&mm->model->table, unit)->numel, mm->format);
    gpt_bind_unit(mm->model, unit, NULL, NULL);
    if (is_head(mm, unit)) tied_head_out(mm);
    /* a last stage's copy of the embedding unit has no backward to wait for:
     * the head's gradient of wte goes into the copy's now */
    if (is_head(mm, unit) && grads && holds_embedding_copy(mm)) {
        size_t at;
        const ParamTensor *t = wte_of(mm->model, &at);
        ops()->accumulate_half(mm->grads + mm->unit_at[0] + at, mm->tied_dwte, t->numel, mm->format);
    }
}

/* ---- the storage hooks of a 16-bit model (its whole table or a range of units) ---- */

/* Where unit u's elements start in the held buffers (a stage holds a run of units). */
static size_t held_offset(const MixedModel *mm, int unit) {
    if (mm->unit_at) return mm->unit_at[unit + 1];
    return table_unit(&mm->model->table, unit)->offset - mm->model->param_first;
}

static void before_forward(int unit, void *context) {
    MixedModel *mm = context;
    mixed_unit_in(mm, unit, mm->params + held_offset(mm, unit), 0);
}

static void before_backward(int unit, void *context) {
    MixedModel *mm = context;
    mixed_unit_in(mm, unit, mm->params + held_offset(mm, unit), 1);
}

/* Unbound between its calls: a unit read without its conversion fails loudly. */
static void after_forward(int unit, void *context) {
    mixed_unit_out(context, unit, NULL);
}

static void after_backward(int unit, void *context) {
    MixedModel *mm = context;
    mixed_unit_out(mm, unit, mm->grads + held_offset(mm, unit));
}

/* model (its table built, no storage bound) as units first_unit..last_unit,
 * to be bound a unit at a time, with 16-bit matmuls. */
static void units_range(MixedModel *mm, GPT *model, int first_unit, int last_unit, HalfFormat format) {
    memset(mm, 0, sizeof *mm);
    if (first_unit > last_unit)
        fatal(EXIT_RUNTIME, "mixed: units %d..%d are no range", first_unit, last_unit);
    mm->format = format;
    mm->model = model;
    gpt_set_range(model, first_unit, last_unit);
    model->half_matmuls = 1;
    model->matmul_format = format;
}

/* The table of cfg, its whole range to be bound a unit at a time, 16-bit matmuls. */
static void units_model(MixedModel *mm, GPT *model, const ModelConfig *cfg, HalfFormat format) {
    ParamTable table;
    param_table_build(&table, cfg);
    gpt_init(model, table);
    units_range(mm, model, LAYER_EMBEDDING, cfg->layers, format);
}

/* The two fp32 workspaces, each the size of the largest unit of the range. */
static void units_workspaces(MixedModel *mm) {
    const GPT *model = mm->model;
    size_t largest = table_largest_unit(&model->table, model->first_unit, model->last_unit);
    mm->unit_params = mem_alloc(SPACE_DEVICE, CAT_WORKSPACE, largest * sizeof(float), "unit weights (fp32)");
    mm->unit_grads = mem_alloc(SPACE_DEVICE, CAT_WORKSPACE, largest * sizeof(float), "unit gradients (fp32)");
    if (model->cfg.tied && model->last_unit == model->cfg.layers &&
        (model->first_unit == LAYER_EMBEDDING || holds_embedding_copy(mm))) {
        size_t at, numel = wte_of(model, &at)->numel;
        mm->tied_wte = mem_alloc(SPACE_DEVICE, CAT_WORKSPACE, numel * sizeof(float), "tied head's wte (fp32)");
        mm->tied_dwte = mem_alloc(SPACE_DEVICE, CAT_WORKSPACE, numel * sizeof(float), "tied head's dwte (fp32)");
    }
}

void mixed_units_create(MixedModel *mm, GPT *model, const ModelConfig *cfg, HalfFormat format) {
    units_model(mm, model, cfg, format);
    units_workspaces(mm);
}

void mixed_units_create_range(MixedModel *mm, GPT *model, int first_unit, int last_unit, HalfFormat format) {
    units_range(mm, model, first_unit, last_unit, format);
    units_workspaces(mm);
}

void mixed_create_units(MixedModel *mm, GPT *model, int first_unit, int last_unit, const float *initial,
                        HalfFormat format) {
    mixed_create_chunks(mm, model, &first_unit, &last_unit, 1, initial, format);
}

void mixed_create_chunks(MixedModel *mm, GPT *model, const int *first_units, const int *last_units, int chunks,
                         const float *initial, HalfFormat format) {
    int last_unit = last_units[0]; /* the last of the runs, or one before a last stage's embedding copy */
    for (int c = 1; c < chunks; c++) last_unit = last_units[c] > last_unit ? last_units[c] : last_unit;
    units_range(mm, model, first_units[0], last_unit, format);
    if (chunks > 1) { /* the runs one after another */
        mm->unit_at = xmalloc((model->cfg.layers + 2) * sizeof(size_t));
        for (int u = LAYER_EMBEDDING; u <= model->cfg.layers; u++) mm->unit_at[u + 1] = SIZE_MAX;
        size_t held = 0;
        for (int c = 0; c < chunks; c++)
            for (int u = first_units[c]; u <= last_units[c]; u++) {
                mm->unit_at[u + 1] = held;
                held += table_unit(&model->table, u)->numel;
            }
        model->param_count = held;
    }
    size_t n = model->param_count;
    mm->n = n;
    mm->params = mem_alloc(SPACE_DEVICE, CAT_PARAMS, n * sizeof(uint16_t), "16-bit parameters");
    mm->grads = mem_alloc(SPACE_DEVICE, CAT_GRADS, n * sizeof(uint16_t), "16-bit gradients");
    mm->master = mem_alloc(SPACE_DEVICE, CAT_OPTIMIZER, n * sizeof(float), "master weights");
    units_workspaces(mm);
    copy_to_device(mm->master, initial, n * sizeof(float));
    ops()->cast_to_half(mm->params, mm->master, n, format);
    if (mm->tied_wte) mixed_tied_source(mm, mm->params + held_offset(mm, LAYER_EMBEDDING));
    mm->storage = (UnitHooks){.before_forward = before_forward,
                              .after_forward = after_forward,
                              .before_backward = before_backward,
                              .after_backward = after_backward,
                              .context = mm};
    model->params = mm->master; /* the fp32 weights of record: what checkpoints save and load */
    model->storage = &mm->storage;
}

void mixed_create_range(MixedModel *mm, GPT *model, const ModelConfig *cfg, uint64_t seed, int first_unit,
                        int last_unit, HalfFormat format) {
    ParamTable table;
    param_table_build(&table, cfg);
    gpt_init(model, table);
    size_t first = table_unit(&model->table, first_unit)->offset;
    const ParamUnit *last = table_unit(&model->table, last_unit);
    size_t n = last->offset + last->numel - first;
    float *host = host_scratch(n * sizeof(float)); /* a dry run: address space only */
    param_init_range(&model->table, seed, host, first, n); /* the whole model's values for these elements */
    mixed_create_units(mm, model, first_unit, last_unit, host, format);
    host_scratch_free(host, n * sizeof(float));
}

void mixed_create(MixedModel *mm, GPT *model, const ModelConfig *cfg, uint64_t seed, HalfFormat format) {
    mixed_create_range(mm, model, cfg, seed, LAYER_EMBEDDING, cfg->layers, format);
}

void mixed_destroy(MixedModel *mm) {
    mem_free(mm->params);
    mem_free(mm->grads);
    mem_free(mm->master);
    mem_free(mm->unit_params);
    mem_free(mm->unit_grads);
    mem_free(mm->tied_wte);
    mem_free(mm->tied_dwte);
    free(mm->unit_at);
    if (mm->model) mm->model->storage = NULL;
    memset(mm, 0, sizeof *mm);
}

void mixed_weights_from_master(MixedModel *mm) {
    ops()->cast_to_half(mm->params, mm->master, mm->n, mm->format);
}

void mixed_adamw_step(MixedModel *mm, AdamW *opt, float grad_scale, const OptimHyper *h) {
    opt->t++;
    ops()->adamw_update_half(mm->master, mm->params, mm->grads, opt->m, opt->v, mm->n, h->lr, h->beta1,
                             h->beta2, h->eps, h->weight_decay, grad_scale, opt->t, mm->format);
}

/* ---- loss scaling ---- */

void loss_scaler_start(LossScaler *ls, Precision precision, float fixed_scale, int window) {
    memset(ls, 0, sizeof *ls);
    ls->scale = 1.0f;
    if (precision != PRECISION_FP16) return;
    ls->skips = 1;
    ls->dynamic = fixed_scale == 0.0f;
    ls->scale = ls->dynamic ? INITIAL_LOSS_SCALE : fixed_scale;
    ls->window = window;
}

int loss_scaler_update(LossScaler *ls, int finite) {
    if (!ls->skips) return 0; /* fp32, bf16: no scale, nothing to skip */
    /* EXERCISE 05.4 BEGIN: the loss-scale update rule (course.md, exercise 05.4) */
    if (!finite) {
        ls->clean_steps = 0;
        if (ls->dynamic) ls->scale /= 2.0f;
        return 1;
    }
    if (ls->dynamic && ++ls->clean_steps == ls->window) {
        ls->clean_steps = 0;
        ls->scale *= 2.0f;
    }
    return 0;
    /* EXERCISE 05.4 END */
}

/* ---- a training step in either precision ---- */

void precision_zero_grads(GPT *model, MixedModel *mm) {
    if (mm->params)
        ops()->fill_zero_half(mm->grads, mm->n);
    else if (model->grads) /* (none: a model whose storage its caller keeps, model.h) */
        ops()->fill_zero(model->grads, model->param_count);
}

void precision_create_range(GPT *model, MixedModel *mm, const ModelConfig *cfg, uint64_t seed,
                            Precision precision, int first_unit, int last_unit) {
    memset(mm, 0, sizeof *mm);
    if (precision == PRECISION_FP32)
        gpt_create_range(model, cfg, seed, first_unit, last_unit);
    else
        mixed_create_range(mm, model, cfg, seed, first_unit, last_unit, precision_format(precision));
}

void precision_destroy(GPT *model, MixedModel *mm) {
    if (mm->params) mixed_destroy(mm);
    gpt_destroy(model);
}

void *precision_grads(GPT *model, MixedModel *mm) {
    return mm->params ? (void *)mm->grads : (void *)model->grads;
}
