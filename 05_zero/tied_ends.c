/* tied_ends.c: see tied_ends.h. */
#include "05_zero/tied_ends.h" /* 05: a tied wte on two stages, owned by the first */

#include "common/device/device.h" /* mem_alloc, copies, streams, timers */
#include "common/kernels/kernels.h" /* ops(): the kernel table */
#include "common/model/layer_split.h" /* which blocks each stage runs */
#include "common/core/util.h" /* fatal, log_info, exit codes, flag parsing */

#include <string.h>

/* ---- the last stage: its head reads the copy and writes dwte ---- */

static int is_head(const TiedEnds *t, int unit) {
    return unit == t->model->cfg.layers;
}

/* The storage's call first (it binds the head's unit: ln_f), then wte. */
static void copy_before_forward(int unit, void *context) {
    TiedEnds *t = context;
    if (t->inner && t->inner->before_forward) t->inner->before_forward(unit, t->inner->context);
    if (is_head(t, unit)) t->model->w.lm_head = t->wte, t->model->g.lm_head = NULL;
}

static void copy_after_forward(int unit, void *context) {
    TiedEnds *t = context;
    if (is_head(t, unit)) t->model->w.lm_head = NULL;
    if (t->inner && t->inner->after_forward) t->inner->after_forward(unit, t->inner->context);
}

/* The head's backward (under zb-h1 its B and its W) adds into dwte. */
static void copy_before_backward(int unit, void *context) {
    TiedEnds *t = context;
    if (t->inner && t->inner->before_backward) t->inner->before_backward(unit, t->inner->context);
    if (is_head(t, unit)) t->model->w.lm_head = t->wte, t->model->g.lm_head = t->dwte;
}

static void copy_after_backward(int unit, void *context) {
    TiedEnds *t = context;
    if (is_head(t, unit)) t->model->w.lm_head = t->model->g.lm_head = NULL;
    if (t->inner && t->inner->after_backward) t->inner->after_backward(unit, t->inner->context);
}

/* ---- building ---- */

void tied_ends_create(TiedEnds *t, GPT *model, int stage, int stages, CommGroup *pp, CommGroup *dp,
                      Precision precision, int host_slice) {
    *t = (TiedEnds){.end = TIED_NONE, .model = model, .pp = pp, .dp = dp};
    if (!model->cfg.tied || stages < 2 || (stage != 0 && stage != stages - 1)) return;
    t->end = stage == 0 ? TIED_OWNER : TIED_COPY;
    t->other = stage == 0 ? stages - 1 : 0;
    t->half = precision != PRECISION_FP32;
    t->format = precision == PRECISION_FP16 ? HALF_F16 : HALF_BF16;
    const ParamTable *table = &model->table;
    const ParamTensor *wte = table_tensor(table, LAYER_EMBEDDING, EMBEDDING_WTE);
    const ParamUnit *unit = table_unit(table, LAYER_EMBEDDING);
    t->wte_at = wte->offset - unit->offset;
    t->wte_numel = wte->numel;
    int rank = comm_rank(dp), ranks = comm_size(dp);
    t->slice_n = shard_slice_numel(table, LAYER_EMBEDDING, ranks);
    size_t first;
    shard_slice_elements(table, LAYER_EMBEDDING, rank, ranks, &first, &t->slice_count);
    t->slice = mem_alloc(SPACE_DEVICE, CAT_COMM, t->slice_n * sizeof(float), "tied wte's gradient slice");
    if (t->end == TIED_OWNER) {
        if (host_slice)
            t->host_slice =
                mem_alloc_pinned(CAT_COMM, t->slice_n * sizeof(float), "tied wte's gradient slice (host)");
        if (t->half)
            t->wte_out = mem_alloc(SPACE_DEVICE, CAT_COMM, t->wte_numel * sizeof(float),
                                   "tied wte widened for the last stage");
        return;
    }
    t->wte = mem_alloc(SPACE_DEVICE, CAT_PARAMS, t->wte_numel * sizeof(float), "tied wte, the first stage's");
    t->dwte = mem_alloc(SPACE_DEVICE, CAT_GRADS, t->wte_numel * sizeof(float), "tied head's dwte");
    t->padded = mem_alloc(SPACE_DEVICE, CAT_BUCKETS, ranks * t->slice_n * sizeof(float),
                          "tied head's dwte in the padded embedding unit");
    t->inner = model->storage;
    t->hooks = (UnitHooks){.before_forward = copy_before_forward,
                           .after_forward = copy_after_forward,
                           .before_backward = copy_before_backward,
                           .after_backward = copy_after_backward,
                           .context = t};
    model->storage = &t->hooks;
}

void tied_ends_destroy(TiedEnds *t) {
    if (t->end == TIED_COPY && t->model->storage == &t->hooks) t->model->storage = t->inner;
    mem_free(t->slice);
    mem_free(t->host_slice);
    mem_free(t->wte_out);
    mem_free(t->wte);
    mem_free(t->dwte);
    mem_free(t->padded);
    *t = (TiedEnds){0};
}

/* ---- the step ---- */

void tied_ends_begin_step(TiedEnds *t) {
    if (t->end == TIED_COPY) ops()->fill_zero(t->dwte, t->wte_numel);
}

const float *tied_ends_sum_gradient(TiedEnds *t) {
    if (t->end == TIED_COPY) {
        size_t padded = (size_t)comm_size(t->dp) * t->slice_n;
        ops()->fill_zero(t->padded, padded); /* wpe's part and the padding stay zeros */
        copy_on_device(t->padded + t->wte_at, t->dwte, t->wte_numel * sizeof(float));
        comm_reduce_scatter(t->dp, t->padded, t->slice, t->slice_n, COMM_SUM);
        comm_send(t->pp, t->slice, t->slice_n, t->other, TAG_EXCHANGE);
        return NULL;
    }
    if (t->end != TIED_OWNER) return NULL;
    comm_recv(t->pp, t->slice, t->slice_n, t->other, TAG_EXCHANGE);
    if (!t->host_slice) return t->slice;
    copy_to_host(t->host_slice, t->slice, t->slice_count * sizeof(float));
    return t->host_slice;
}

void tied_ends_refresh(TiedEnds *t, const void *embedding_unit_params) {
    if (t->end == TIED_COPY) {
        comm_recv(t->pp, t->wte, t->wte_numel, t->other, TAG_EXCHANGE);
        return;
    }
    if (t->end != TIED_OWNER) return;
    const float *wte = (const float *)embedding_unit_params + t->wte_at;
    if (t->half) { /* what the embedding reads: the 16-bit weights, widened */
        ops()->cast_from_half(t->wte_out, (const uint16_t *)embedding_unit_params + t->wte_at, t->wte_numel,
                              t->format);
        wte = t->wte_out;
    }
    comm_send(t->pp, wte, t->wte_numel, t->other, TAG_EXCHANGE);
}
