/* param_table.c: see param_table.h. */
#include "common/model/param_table.h" /* the parameter table and its units */

#include "common/device/device.h" /* mem_alloc, copies, streams, timers */

#include "common/core/util.h" /* fatal, log_info, exit codes, flag parsing */

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- building the table ---- */

/* Tensors enter unit by unit, each with its kind, which must be its index in
 * the unit: that is what lets table_tensor() find it without a search. */
static ParamTensor *add_tensor(ParamTable *t, const char *name, int layer, int kind, int rows, int cols,
                               InitKind init, float std) {
    ParamTensor *p = &t->tensors[t->num_tensors];
    int in_unit = 0;
    for (int k = t->num_tensors - 1; k >= 0 && t->tensors[k].layer == layer; k--) in_unit++;
    if (kind != in_unit)
        fatal(EXIT_RUNTIME, "parameter table: %s is tensor %d of its unit, not %d", name, in_unit, kind);
    t->num_tensors++;
    snprintf(p->name, sizeof p->name, "%s", name);
    p->layer = layer;
    p->kind = kind;
    p->rows = rows;
    p->cols = cols;
    p->init = init;
    p->init_std = std;
    return p;
}

void param_table_build(ParamTable *t, const ModelConfig *cfg) {
    memset(t, 0, sizeof *t);
    t->cfg = *cfg;
    int L = cfg->layers, C = cfg->dmodel, V = vocab_padded(cfg->vocab), T = cfg->seq;
    t->tensors = xcalloc(EMBEDDING_TENSORS + (size_t)L * BLOCK_TENSORS + HEAD_TENSORS, sizeof(ParamTensor));
    /* GPT-2's initialisation: N(0, 0.02) weights, residual projections scaled
     * by 1/sqrt(2L) so the residual stream's variance does not grow with depth. */
    float std = 0.02f, resid_std = 0.02f / sqrtf(2.0f * L);
    add_tensor(t, "wte", LAYER_EMBEDDING, EMBEDDING_WTE, V, C, INIT_NORMAL, std);
    add_tensor(t, "wpe", LAYER_EMBEDDING, EMBEDDING_WPE, T, C, INIT_NORMAL, 0.01f);
    for (int l = 0; l < L; l++) {
        char name[32];
#define BLOCK(kind, suffix, rows, cols, init, s)                                                             \
    snprintf(name, sizeof name, "h%d." suffix, l);                                                           \
    add_tensor(t, name, l, kind, rows, cols, init, s)
        BLOCK(BLOCK_LN1W, "ln1w", 1, C, INIT_ONES, 0);
        BLOCK(BLOCK_LN1B, "ln1b", 1, C, INIT_ZEROS, 0);
        BLOCK(BLOCK_QKVW, "qkvw", 3 * C, C, INIT_NORMAL, std);
        BLOCK(BLOCK_QKVB, "qkvb", 1, 3 * C, INIT_ZEROS, 0);
        BLOCK(BLOCK_ATTPROJW, "attprojw", C, C, INIT_NORMAL, resid_std);
        BLOCK(BLOCK_ATTPROJB, "attprojb", 1, C, INIT_ZEROS, 0);
        BLOCK(BLOCK_LN2W, "ln2w", 1, C, INIT_ONES, 0);
        BLOCK(BLOCK_LN2B, "ln2b", 1, C, INIT_ZEROS, 0);
        if (moe_layer(cfg, l)) { /* E experts of the dense MLP's shapes, one after the other, and the router */
            /* the experts held (all E, or expert parallelism's E/parts): a run of each whole tensor */
            int E = cfg->moe.experts, held = moe_experts_held(cfg);
            size_t first = (size_t)moe_first_held(cfg) * 4 * C; /* per expert: 4C x C or C x 4C; 4C or C */
            BLOCK(BLOCK_FCW, "moe_fcw", held * 4 * C, C, INIT_NORMAL, std)->whole_first = first * C;
            BLOCK(BLOCK_FCB, "moe_fcb", 1, held * 4 * C, INIT_ZEROS, 0)->whole_first = first;
            BLOCK(BLOCK_FCPROJW, "moe_fcprojw", held * C, 4 * C, INIT_NORMAL, resid_std)->whole_first =
                first * C;
            BLOCK(BLOCK_FCPROJB, "moe_fcprojb", 1, held * C, INIT_ZEROS, 0)->whole_first = first / 4;
            BLOCK(BLOCK_ROUTERW, "routerw", E, C, INIT_NORMAL, std);
            continue;
        }
        BLOCK(BLOCK_FCW, "fcw", 4 * C, C, INIT_NORMAL, std);
        BLOCK(BLOCK_FCB, "fcb", 1, 4 * C, INIT_ZEROS, 0);
        BLOCK(BLOCK_FCPROJW, "fcprojw", C, 4 * C, INIT_NORMAL, resid_std);
        BLOCK(BLOCK_FCPROJB, "fcprojb", 1, C, INIT_ZEROS, 0);
#undef BLOCK
    }
    add_tensor(t, "lnf.w", L, HEAD_LNFW, 1, C, INIT_ONES, 0);
    add_tensor(t, "lnf.b", L, HEAD_LNFB, 1, C, INIT_ZEROS, 0);
    /* tied (--tie-embeddings): the head reads wte, and there is no lm_head */
    if (!cfg->tied) add_tensor(t, "lm_head", L, HEAD_LM_HEAD, V, C, INIT_NORMAL, std);
    param_table_layout(t);
}

void param_table_layout(ParamTable *t) {
    int L = t->cfg.layers;
    free(t->units);
    t->num_units = L + 2;
    t->units = xcalloc(t->num_units, sizeof(ParamUnit));
    for (int u = 0; u < t->num_units; u++) t->units[u].layer = u + LAYER_EMBEDDING;
    t->num_params = 0;
    for (int k = 0; k < t->num_tensors; k++) {
        ParamTensor *p = &t->tensors[k];
        p->numel = (size_t)p->rows * p->cols;
        p->offset = t->num_params;
        t->num_params += p->numel;
        if (p->layer < LAYER_EMBEDDING || p->layer > L || (k > 0 && p->layer < t->tensors[k - 1].layer))
            fatal(EXIT_RUNTIME, "parameter table: %s (layer %d) is out of unit order", p->name, p->layer);
        ParamUnit *unit = &t->units[p->layer - LAYER_EMBEDDING];
        if (unit->num_tensors++ == 0) {
            unit->first_tensor = k;
            unit->offset = p->offset;
        }
        unit->numel += p->numel;
    }
}

void param_table_free(ParamTable *t) {
    free(t->tensors);
    free(t->units);
    memset(t, 0, sizeof *t);
}

const ParamUnit *table_unit(const ParamTable *t, int unit) {
    if (unit < LAYER_EMBEDDING || unit > t->cfg.layers)
        fatal(EXIT_RUNTIME, "parameter table: no unit %d (valid: %d for the embedding .. %d for the head)",
              unit, LAYER_EMBEDDING, t->cfg.layers);
    return &t->units[unit - LAYER_EMBEDDING];
}

const ParamTensor *table_tensor(const ParamTable *t, int unit, int kind) {
    const ParamUnit *u = table_unit(t, unit);
    if (kind < 0 || kind >= u->num_tensors)
        fatal(EXIT_RUNTIME, "parameter table: unit %d has no tensor of kind %d (it has %d)", unit, kind,
              u->num_tensors);
    return &t->tensors[u->first_tensor + kind];
}

int param_expert_tensor(const ModelConfig *cfg, const ParamTensor *t) {
    return t->layer >= 0 && t->layer < cfg->layers && moe_layer(cfg, t->layer) && t->kind >= BLOCK_FCW &&
           t->kind <= BLOCK_FCPROJB;
}

/* ---- initial values ---- */

float param_init_value(const ParamTensor *t, uint64_t seed, size_t i) {
    switch (t->init) {
    case INIT_ZEROS:
        return 0.0f;
    case INIT_ONES:
        return 1.0f;
    default:
        return (float)(t->init_std * hash_normal(seed, hash_string(t->name), t->whole_first + i));
    }
}

void param_init_range(const ParamTable *t, uint64_t seed, float *dst, size_t first, size_t count) {
    if (device_dry()) return; /* a dry run writes no initial values (device.h) */
    for (int k = 0; k < t->num_tensors; k++) {
        const ParamTensor *p = &t->tensors[k];
        size_t lo = p->offset > first ? p->offset : first;
        size_t hi = p->offset + p->numel < first + count ? p->offset + p->numel : first + count;
        if (lo >= hi) continue;
#pragma omp parallel for schedule(static)
        for (size_t e = lo; e < hi; e++) dst[e - first] = param_init_value(p, seed, e - p->offset);
    }
}

/* ---- shards ---- */

size_t shard_slice_numel(const ParamTable *t, int unit, int ranks) {
    if (ranks < 1) fatal(EXIT_RUNTIME, "shard layout: %d ranks (valid: at least 1)", ranks);
    size_t n = table_unit(t, unit)->numel;
    /* EXERCISE 05.1 BEGIN: the shard bookkeeping (course.md, exercise 05.1) */
    return (n + ranks - 1) / ranks;
    /* EXERCISE 05.1 END */
}

size_t shard_unit_offset(const ParamTable *t, int unit, int ranks) {
    table_unit(t, unit); /* checks the unit */
    /* EXERCISE 05.1 BEGIN: the shard bookkeeping (course.md, exercise 05.1) */
    size_t offset = 0;
    for (int u = LAYER_EMBEDDING; u < unit; u++) offset += shard_slice_numel(t, u, ranks);
    return offset;
    /* EXERCISE 05.1 END */
}

size_t shard_numel(const ParamTable *t, int ranks) {
    return shard_unit_offset(t, t->cfg.layers, ranks) + shard_slice_numel(t, t->cfg.layers, ranks);
}

size_t table_largest_unit(const ParamTable *t, int first_unit, int last_unit) {
    size_t largest = 0;
    for (int u = first_unit; u <= last_unit; u++)
        if (table_unit(t, u)->numel > largest) largest = table_unit(t, u)->numel;
    return largest;
}

size_t shard_largest_slice(const ParamTable *t, int first_unit, int last_unit, int ranks) {
    size_t largest = 0;
    for (int u = first_unit; u <= last_unit; u++)
        if (shard_slice_numel(t, u, ranks) > largest) largest = shard_slice_numel(t, u, ranks);
    return largest;
}

/* The part of rank's slice of unit u that holds elements (the rest is
 * padding): elements [*first, *first + *count) of the table. */
static void slice_elements(const ParamTable *t, int u, int rank, int ranks, size_t *first, size_t *count) {
    const ParamUnit *unit = table_unit(t, u);
    /* EXERCISE 05.1 BEGIN: the shard bookkeeping (course.md, exercise 05.1) */
    size_t S = shard_slice_numel(t, u, ranks), lo = (size_t)rank * S, hi = lo + S;
    if (lo > unit->numel) lo = unit->numel;
    if (hi > unit->numel) hi = unit->numel;
    *first = unit->offset + lo;
    *count = hi - lo;
    /* EXERCISE 05.1 END */
}

void shard_slice_elements(const ParamTable *t, int unit, int rank, int ranks, size_t *first, size_t *count) {
    slice_elements(t, unit, rank, ranks, first, count);
}

void shard_from_whole(const ParamTable *t, int rank, int ranks, const float *whole, float *shard) {
    if (device_dry()) return; /* zeros from zeros */
    for (int u = LAYER_EMBEDDING; u <= t->cfg.layers; u++) {
        float *slice = shard + shard_unit_offset(t, u, ranks);
        size_t first, count;
        slice_elements(t, u, rank, ranks, &first, &count);
        memcpy(slice, whole + first, count * sizeof(float));
        memset(slice + count, 0, (shard_slice_numel(t, u, ranks) - count) * sizeof(float));
    }
}

void shard_to_whole(const ParamTable *t, int rank, int ranks, const float *shard, float *whole) {
    if (device_dry()) return;
    for (int u = LAYER_EMBEDDING; u <= t->cfg.layers; u++) {
        size_t first, count;
        slice_elements(t, u, rank, ranks, &first, &count);
        memcpy(whole + first, shard + shard_unit_offset(t, u, ranks), count * sizeof(float));
    }
}

void shard_init(const ParamTable *t, uint64_t seed, int rank, int ranks, float *shard) {
    if (device_dry()) return; /* initial values and padding: a dry buffer's zeros stand for both */
    for (int u = LAYER_EMBEDDING; u <= t->cfg.layers; u++) {
        float *slice = shard + shard_unit_offset(t, u, ranks);
        size_t first, count;
        slice_elements(t, u, rank, ranks, &first, &count);
        param_init_range(t, seed, slice, first, count);
        memset(slice + count, 0, (shard_slice_numel(t, u, ranks) - count) * sizeof(float));
    }
}
