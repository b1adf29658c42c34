/* test_units.c: the layer units of the parameter table (common/model/param_table.h)
 * and the range functions of common/model/model.h, checked on the CPU.
 *
 *   table    every unit is one contiguous run of the table, and each tensor
 *            is found by unit and kind
 *   views    storage bound to a range of units (gpt_create_range,
 *            gpt_bind_range) or to one unit (gpt_bind_unit): every view
 *            addresses the whole model's value of its tensor, the views of
 *            the other units are NULL
 *   padding  a unit of n elements pads to N*S, S = ceil(n/N), fewer than N
 *            elements of padding; the slices of a shard follow each other;
 *            the slices of ranks 0..N-1 hold a unit's elements in order,
 *            also for units smaller than N (the last ranks hold none)
 *   shards   for N = 1..4 ranks, every rank's shard (shard_init) is its part
 *            of the whole model's initial values (param_init_range), padding
 *            zero; the N shards reassemble to exactly those values, and the
 *            slices of a unit in rank order are the unit (an all-gather)
 *   ranges   forward and backward over two ranges of units (two pipeline
 *            stages) give the whole model's losses and gradients bit for
 *            bit, and call the hooks in order
 *   norm     the optimizer step's gradient norm (common/model/optimizer_step.h)
 *            from what N = 1..4 ranks hold, their sums added as the
 *            agreement adds them: ZeRO-2/3 shards with their padding, ZeRO-1
 *            slices of every unit, tensor-parallel slices with replicated
 *            tensors counted once; each equals a plain double sum over the
 *            whole gradient; and the decision: clipping, fp16's skip
 *   split    the layer split (common/model/layer_split.h): with one chunk per
 *            stage, the balanced splits recorded before chunks existed; with
 *            V chunks per stage (S x V pieces, layers 1..12), every block in
 *            exactly one piece, the pieces in model order round the stages V
 *            times, the embedding with chunk 0 of stage 0 and the head with
 *            chunk V-1 of the last stage, and layer_split_next/prev walking
 *            the pieces in order, to {-1, -1} past the ends
 *
 *   bw       the backward split into B and W (gpt_backward_input_range,
 *            gpt_backward_weight_range), as a zero-bubble stage runs it:
 *            three micro-batches' forwards, then B0 B1 W0 B2 W1 W2, over the
 *            whole model and over a stage of blocks fed a gradient, give
 *            every parameter's gradient and the input gradients of the
 *            ordinary backward (F0 B0 F1 B1 F2 B2) bit for bit; with a W
 *            left out they do not; kept_grads_bytes is what is allocated
 *
 * Usage: test_units table|views|padding|shards|ranges|norm|split|bw. Prints a line per
 * check and "PASS" or "FAIL: N failures"; exit 0 when every check passes. */
#include "common/run/config.h" /* Config and the flag tables */
#include "common/model/data.h" /* the training data and its batches */
#include "common/device/device.h" /* mem_alloc, copies, streams, timers */
#include "common/kernels/kernels.h" /* ops(): the kernel table */
#include "common/model/layer_split.h" /* which blocks each stage runs */
#include "common/model/mixed.h" /* mixed precision: 16-bit weights, loss scaling */
#include "common/model/model.h" /* GPT, its forward and backward */
#include "common/model/optimizer_step.h" /* the optimizer step: norm, clip, skip, AdamW */
#include "common/model/token_shard.h" /* llm.c's token shards */
#include "common/core/util.h" /* fatal, log_info, exit codes, flag parsing */

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int failures = 0;

static void check(int ok, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void check(int ok, const char *fmt, ...) {
    va_list args;
    va_start(args, fmt);
    printf("%s ", ok ? "ok  " : "FAIL");
    vprintf(fmt, args);
    printf("\n");
    va_end(args);
    failures += !ok;
}

/* Shapes with odd sizes, so that units rarely divide evenly. */
static ModelConfig shape(int which) {
    ModelConfig cfg;
    model_preset(&cfg, "tiny");
    if (which == 1) {
        cfg.layers = 3;
        cfg.dmodel = 36;
        cfg.heads = 3;
        cfg.seq = 13;
        cfg.vocab = 259;
    }
    return cfg;
}

static const uint64_t seed = 20261124;

/* Run a check on the table of each shape. */
static void for_each_shape(void (*check_table)(const ParamTable *t)) {
    for (int which = 0; which < 2; which++) {
        ModelConfig cfg = shape(which);
        ParamTable t;
        param_table_build(&t, &cfg);
        check_table(&t);
        param_table_free(&t);
    }
}

/* ---- table ---- */

static void test_table(const ParamTable *t) {
    int L = t->cfg.layers, ok = t->num_units == L + 2;
    size_t end = 0;
    for (int u = LAYER_EMBEDDING; u <= L; u++) {
        const ParamUnit *unit = table_unit(t, u);
        ok &= unit->layer == u && unit->offset == end;
        size_t sum = 0;
        for (int k = 0; k < unit->num_tensors; k++) {
            const ParamTensor *p = table_tensor(t, u, k);
            ok &= p->layer == u && p->kind == k && p->offset == unit->offset + sum;
            sum += p->numel;
        }
        ok &= sum == unit->numel;
        end += unit->numel;
    }
    check(ok && end == t->num_params, "layers %d: units -1..%d are contiguous and cover the %zu elements", L,
          L, t->num_params);
    int named = strcmp(table_tensor(t, LAYER_EMBEDDING, EMBEDDING_WPE)->name, "wpe") == 0 &&
                strcmp(table_tensor(t, L - 1, BLOCK_QKVW)->name, L == 2 ? "h1.qkvw" : "h2.qkvw") == 0 &&
                strcmp(table_tensor(t, L, HEAD_LM_HEAD)->name, "lm_head") == 0 &&
                table_unit(t, 0)->num_tensors == BLOCK_ROUTERW; /* a dense block: no router */
    check(named, "layers %d: tensors are found by unit and kind (wpe, h%d.qkvw, lm_head)", L, L - 1);
}

/* ---- views ---- */

/* Every tensor of `part` shows the whole model's values (units first..last)
 * or NULL (the others), and its gradient view sits at the same place in grads. */
static int views_match(const GPT *part, const GPT *whole, int first, int last) {
    int ok = 1;
    for (int k = 0; k < part->num_tensors; k++) {
        const ParamTensor *t = &part->tensors[k];
        float *w = weights_tensor(part, &part->w, t), *g = weights_tensor(part, &part->g, t);
        if (t->layer < first || t->layer > last) {
            ok &= w == NULL && g == NULL;
            continue;
        }
        ok &= w != NULL && g != NULL && g - part->grads == w - part->params;
        if (w) ok &= memcmp(w, whole->params + t->offset, t->numel * sizeof(float)) == 0;
    }
    return ok;
}

static void test_views(void) {
    ModelConfig cfg = shape(1);
    int L = cfg.layers;
    GPT whole;
    gpt_create(&whole, &cfg, seed);
    check(views_match(&whole, &whole, LAYER_EMBEDDING, L), "gpt_create: every view is in the one buffer");
    int ranges[][2] = {{LAYER_EMBEDDING, 0}, {1, 1}, {1, L}, {L, L}, {LAYER_EMBEDDING, L}};
    for (size_t i = 0; i < sizeof ranges / sizeof ranges[0]; i++) {
        int first = ranges[i][0], last = ranges[i][1];
        GPT part;
        gpt_create_range(&part, &cfg, seed, first, last);
        int ok = views_match(&part, &whole, first, last) &&
                 part.param_first == table_unit(&whole.table, first)->offset;
        check(ok, "gpt_create_range units %d..%d: the whole model's values, other units NULL", first, last);
        gpt_destroy(&part);

        /* the caller's storage: a copy of the same elements */
        ParamTable table;
        param_table_build(&table, &cfg);
        gpt_init(&part, table);
        size_t lo = table_unit(&part.table, first)->offset,
               hi = table_unit(&part.table, last)->offset + table_unit(&part.table, last)->numel;
        float *params = xmalloc((hi - lo) * sizeof(float)), *grads = xcalloc(hi - lo, sizeof(float));
        memcpy(params, whole.params + lo, (hi - lo) * sizeof(float));
        gpt_bind_range(&part, first, last, params, grads);
        check(views_match(&part, &whole, first, last) && part.param_count == hi - lo,
              "gpt_bind_range units %d..%d: views into the caller's buffer", first, last);
        gpt_destroy(&part);
        free(params);
        free(grads);
    }
    /* one unit at a time, each in a buffer of its own (as ZeRO-3 gathers it) */
    ParamTable table;
    param_table_build(&table, &cfg);
    GPT part;
    gpt_init(&part, table);
    float *units[258] = {0}, *grads[258] = {0};
    for (int u = LAYER_EMBEDDING; u <= L; u++) {
        const ParamUnit *unit = table_unit(&part.table, u);
        units[u + 1] = xmalloc(unit->numel * sizeof(float));
        grads[u + 1] = xmalloc(unit->numel * sizeof(float));
        memcpy(units[u + 1], whole.params + unit->offset, unit->numel * sizeof(float));
        gpt_bind_unit(&part, u, units[u + 1], grads[u + 1]);
    }
    int ok = 1;
    for (int k = 0; k < part.num_tensors; k++) {
        const ParamTensor *t = &part.tensors[k];
        const float *w = weights_tensor(&part, &part.w, t);
        ok &= w && memcmp(w, whole.params + t->offset, t->numel * sizeof(float)) == 0;
    }
    gpt_bind_unit(&part, 1, NULL, NULL);
    ok &= part.w.block[1][BLOCK_QKVW] == NULL && part.g.block[1][BLOCK_FCPROJB] == NULL &&
          part.w.block[0][BLOCK_QKVW] != NULL;
    check(ok, "gpt_bind_unit: each unit in a buffer of its own; unbinding one leaves the others");
    for (int u = 0; u < L + 2; u++) {
        free(units[u]);
        free(grads[u]);
    }
    gpt_destroy(&part);
    gpt_destroy(&whole);
}

/* ---- padding ---- */

static void test_padding(const ParamTable *t) {
    for (int N = 1; N <= 4; N++) {
        int ok = 1;
        size_t at = 0;
        for (int u = LAYER_EMBEDDING; u <= t->cfg.layers; u++) {
            size_t n = table_unit(t, u)->numel, S = shard_slice_numel(t, u, N);
            ok &= N * S >= n && N * S - n < (size_t)N && shard_unit_offset(t, u, N) == at;
            at += S;
        }
        ok &= shard_numel(t, N) == at && N * at - t->num_params < (size_t)N * t->num_units;
        check(ok, "layers %d, N %d: every unit pads by fewer than N; a shard is %zu elements", t->cfg.layers,
              N, shard_numel(t, N));
    }
}

/* The tiny preset on 3 ranks, by hand: embedding 256*64 + 64*64 = 20480 =
 * 3*6827 - 1; a block 12*64*64 + 13*64 = 49984 = 3*16662 - 2; the head
 * 2*64 + 256*64 = 16512 = 3*5504. */
static void test_padding_by_hand(void) {
    ModelConfig cfg = shape(0);
    ParamTable t;
    param_table_build(&t, &cfg);
    check(shard_slice_numel(&t, LAYER_EMBEDDING, 3) == 6827 && shard_slice_numel(&t, 0, 3) == 16662 &&
              shard_slice_numel(&t, 2, 3) == 5504 && shard_unit_offset(&t, 1, 3) == 6827 + 16662 &&
              shard_numel(&t, 3) == 6827 + 2 * 16662 + 5504,
          "tiny, N 3: slices of 6827, 16662 and 5504 elements, as computed by hand");
    param_table_free(&t);
}

/* The elements each rank's slice holds (shard_slice_elements), on a table
 * whose tensors are shrunk to one element each, so that units are smaller
 * than the number of ranks: the embedding has 2 elements, a block 12, the
 * head 3. On 5 ranks the head's slices are 1 element (S = ceil(3/5)): ranks
 * 0-2 hold elements 0, 1 and 2, ranks 3 and 4 only padding (rank 4's slice
 * would start at 4, past the unit's end). In general the slices of ranks
 * 0..N-1 must hold the unit's elements in order, each at most S of them. */
static void test_slices_by_hand(void) {
    ModelConfig cfg = shape(0);
    ParamTable t;
    param_table_build(&t, &cfg);
    for (int k = 0; k < t.num_tensors; k++) t.tensors[k].rows = t.tensors[k].cols = 1;
    param_table_layout(&t);
    size_t head = table_unit(&t, cfg.layers)->offset, first, count;
    int ok = 1;
    static const size_t head_count_of_rank[5] = {1, 1, 1, 0, 0};
    for (int r = 0; r < 5; r++) {
        shard_slice_elements(&t, cfg.layers, r, 5, &first, &count);
        ok &= count == head_count_of_rank[r] && (count == 0 || first == head + (size_t)r);
    }
    check(ok, "a 3-element head on 5 ranks: ranks 0-2 hold one element each, ranks 3 and 4 none");
    ok = 1;
    for (int N = 1; N <= 13; N++) {
        for (int u = LAYER_EMBEDDING; u <= cfg.layers; u++) {
            const ParamUnit *unit = table_unit(&t, u);
            size_t S = shard_slice_numel(&t, u, N), next = unit->offset;
            for (int r = 0; r < N; r++) {
                shard_slice_elements(&t, u, r, N, &first, &count);
                ok &= count <= S && (count == 0 || first == next);
                next += count;
            }
            ok &= next == unit->offset + unit->numel;
        }
    }
    check(ok, "units of 2, 12 and 3 elements on 1..13 ranks: the slices hold each unit's elements in order");
    param_table_free(&t);
}

/* ---- shards ---- */

static void test_shards(const ParamTable *t) {
    int L = t->cfg.layers;
    float *whole = xmalloc(t->num_params * sizeof(float)), *back = xmalloc(t->num_params * sizeof(float));
    param_init_range(t, seed, whole, 0, t->num_params);
    for (int N = 1; N <= 4; N++) {
        size_t n = shard_numel(t, N);
        float **shard = xcalloc(N, sizeof(float *));
        float *cut = xmalloc(n * sizeof(float));
        int same_as_cut = 1;
        for (size_t i = 0; i < t->num_params; i++) back[i] = NAN;
        for (int r = 0; r < N; r++) {
            shard[r] = xmalloc(n * sizeof(float));
            shard_init(t, seed, r, N, shard[r]);
            shard_from_whole(t, r, N, whole, cut);
            same_as_cut &= memcmp(shard[r], cut, n * sizeof(float)) == 0;
            shard_to_whole(t, r, N, shard[r], back);
        }
        check(same_as_cut, "layers %d, N %d: each rank's shard_init is its cut of the whole model's values",
              L, N);
        check(memcmp(back, whole, t->num_params * sizeof(float)) == 0,
              "layers %d, N %d: the %d shards reassemble to the whole model's initial values bit for bit", L,
              N, N);
        /* an all-gather of unit u: the slices in rank order, then the padding */
        int gathered = 1;
        for (int u = LAYER_EMBEDDING; u <= L; u++) {
            const ParamUnit *unit = table_unit(t, u);
            size_t S = shard_slice_numel(t, u, N), at = shard_unit_offset(t, u, N);
            for (size_t e = 0; e < N * S; e++) {
                float value = shard[e / S][at + e % S];
                gathered &= e < unit->numel ? value == whole[unit->offset + e] : value == 0.0f;
            }
        }
        check(gathered, "layers %d, N %d: every unit's slices in rank order are the unit, then zeros", L, N);
        for (int r = 0; r < N; r++) free(shard[r]);
        free(shard);
        free(cut);
    }
    /* gpt_create holds the same values */
    GPT m;
    gpt_create(&m, &t->cfg, seed);
    check(memcmp(m.params, whole, t->num_params * sizeof(float)) == 0,
          "layers %d: gpt_create's parameters are param_init_range's", L);
    gpt_destroy(&m);
    free(whole);
    free(back);
}

/* ---- ranges ---- */

typedef struct {
    char text[512];
} Trace;

static void trace(Trace *tr, const char *what, int unit) {
    size_t len = strlen(tr->text);
    snprintf(tr->text + len, sizeof tr->text - len, "%s%s%d", len ? " " : "", what, unit);
}
static void before_forward(int u, void *c) {
    trace(c, "f", u);
}
static void after_forward(int u, void *c) {
    trace(c, "F", u);
}
static void before_backward(int u, void *c) {
    trace(c, "b", u);
}
static void after_backward(int u, void *c) {
    trace(c, "B", u);
}

static void test_ranges(void) {
    ModelConfig cfg = shape(0);
    cfg.layers = 4;
    int L = cfg.layers, B = 2, T = cfg.seq, N = B * T, cut = 1; /* stage 0: units -1..1, stage 1: 2..L */
    float dloss = 1.0f / N;
    GPT whole, first, second;
    gpt_create(&whole, &cfg, seed);
    gpt_create_range(&first, &cfg, seed, LAYER_EMBEDDING, cut);
    gpt_create_range(&second, &cfg, seed, cut + 1, L);
    Activations a, a0, a1;
    activations_create(&a, &cfg, B, T);
    activations_create_range(&a0, &cfg, B, T, LAYER_EMBEDDING, cut, 0);
    activations_create_range(&a1, &cfg, B, T, cut + 1, L, 0);
    Scratch s;
    scratch_create(&s, &cfg, B, T, 0);
    for (int i = 0; i < N; i++) {
        a.tokens[i] = a0.tokens[i] = a1.tokens[i] = (int)(hash64(seed + 2 * i) % 256);
        a.targets[i] = a0.targets[i] = a1.targets[i] = (int)(hash64(seed + 2 * i + 1) % 256);
    }
    const KernelOps *k = ops();
    k->fill_zero(whole.grads, whole.param_count);
    k->fill_zero(first.grads, first.param_count);
    k->fill_zero(second.grads, second.param_count);

    gpt_forward(&whole, &a, &s, B, T);
    gpt_backward(&whole, &a, &s, dloss, B, T);

    Trace tr = {""};
    UnitHooks hooks = {before_forward, after_forward, before_backward, after_backward, NULL, NULL, NULL, &tr};
    size_t boundary = (size_t)N * cfg.dmodel * sizeof(float);
    gpt_forward_range(&first, &a0, &s, LAYER_EMBEDDING, cut, 1, &hooks, B, T);
    memcpy(a1.encoded, gpt_layer_output(&first, &a0, cut), boundary); /* "send" to the next stage */
    gpt_forward_range(&second, &a1, &s, cut + 1, L, 1, &hooks, B, T);
    check(gpt_loss_sum(&a1, B, T) == gpt_loss_sum(&a, B, T),
          "two ranges' loss is the whole model's bit for bit");

    float *dboundary = xmalloc(boundary);
    memcpy(dboundary, gpt_backward_range(&second, &a1, &s, cut + 1, L, dloss, NULL, NULL, &hooks, B, T),
           boundary);
    gpt_backward_range(&first, &a0, &s, LAYER_EMBEDDING, cut, dloss, dboundary, NULL, &hooks, B, T);
    int same =
        memcmp(first.grads, whole.grads, first.param_count * sizeof(float)) == 0 &&
        memcmp(second.grads, whole.grads + second.param_first, second.param_count * sizeof(float)) == 0;
    check(same, "two ranges' gradients are the whole model's bit for bit");

    const char *expected = "f-1 F-1 f0 F0 f1 F1 f2 F2 f3 F3 f4 F4 b4 B4 b3 B3 b2 B2 b1 B1 b0 B0 b-1 B-1";
    check(strcmp(tr.text, expected) == 0, "hooks in order: %s", tr.text);

    /* gpt_backward_hooked calls its hook after each unit, head first */
    Trace done = {""};
    gpt_backward_hooked(&whole, &a, &s, dloss, B, T, after_backward, &done);
    check(strcmp(done.text, "B4 B3 B2 B1 B0 B-1") == 0, "gpt_backward_hooked: %s", done.text);

    free(dboundary);
    scratch_destroy(&s);
    activations_destroy(&a, &cfg);
    activations_destroy(&a0, &cfg);
    activations_destroy(&a1, &cfg);
    gpt_destroy(&whole);
    gpt_destroy(&first);
    gpt_destroy(&second);
}

/* ---- bw: the backward as B then W ---- */

/* One model range's gradients and input gradients, computed for three
 * micro-batches the ordinary way or split (B0 B1 W0 B2 W1 W2), W's optionally
 * skipping micro-batch `skip_w`. first..last: the model's units; a range
 * starting at a block is fed doutput and gives dinput. */
typedef struct {
    float *grads;  /* host copy of the range's gradients */
    float *dinput; /* host, (3, B, T, C): the input gradient per micro-batch (ranges from a block) */
} BwResult;

enum { BW_MICRO = 3 };

/* One range of the model with three micro-batches' activations and kept gradients. */
typedef struct {
    const ModelConfig *cfg;
    int first, last, B, T;
    size_t NC;
    float dloss;
    GPT m;
    Activations a[BW_MICRO];
    KeptGrads kept[BW_MICRO];
    Scratch s;
    float *doutput, *dinput;
    BwResult r;
} BwRun;

/* A made-up value in [-1, 1] from (seed, i). */
static float made_up(uint64_t i) {
    return (float)((int)(hash64(seed + i) % 2001) - 1000) / 1000.0f;
}

/* The gradient of the range's output when the head is not in it, for micro-batch k. */
static const float *bw_doutput(BwRun *w, int k) {
    if (w->last == w->cfg->layers) return NULL;
    for (size_t i = 0; i < w->NC; i++) w->doutput[i] = made_up(99 + k * w->NC + i) * 1e-3f;
    return w->doutput;
}

static float *bw_dinput(BwRun *w) {
    return w->first > LAYER_EMBEDDING ? w->dinput : NULL;
}

static void bw_keep_dinput(BwRun *w, int k) {
    if (w->first > LAYER_EMBEDDING) memcpy(w->r.dinput + k * w->NC, w->dinput, w->NC * sizeof(float));
}

static void bw_input(BwRun *w, int k) {
    gpt_backward_input_range(&w->m, &w->a[k], &w->s, &w->kept[k], w->first, w->last, w->dloss,
                             bw_doutput(w, k), bw_dinput(w), NULL, w->B, w->T);
    bw_keep_dinput(w, k);
}

static void bw_weight(BwRun *w, int k) {
    gpt_backward_weight_range(&w->m, &w->a[k], &w->s, &w->kept[k], w->first, w->last, NULL, w->B, w->T);
}

/* The range's gradients and input gradients for three micro-batches: the
 * ordinary way (F0 B0 F1 B1 F2 B2, whole backwards), or split (F0 F1 F2, then
 * B0 B1 W0 B2 W1 W2), leaving out the W of micro-batch skip_w (-1: none). */
static BwResult run_bw(const ModelConfig *cfg, int first, int last, int split, int skip_w) {
    BwRun w = {.cfg = cfg, .first = first, .last = last, .B = 2, .T = cfg->seq};
    int N = w.B * w.T;
    w.NC = (size_t)N * cfg->dmodel;
    w.dloss = 1.0f / (BW_MICRO * N);
    gpt_create_range(&w.m, cfg, seed, first, last);
    scratch_create(&w.s, cfg, w.B, w.T, 0);
    w.doutput = xmalloc(w.NC * sizeof(float));
    w.dinput = xmalloc(w.NC * sizeof(float));
    w.r = (BwResult){xmalloc(w.m.param_count * sizeof(float)), xcalloc(BW_MICRO * w.NC, sizeof(float))};
    for (int k = 0; k < BW_MICRO; k++) {
        activations_create_range(&w.a[k], cfg, w.B, w.T, first, last, 0);
        kept_grads_create_range(&w.kept[k], cfg, w.B, w.T, first, last);
        for (int i = 0; i < N; i++) {
            w.a[k].tokens[i] = (int)(hash64(seed + 7 * k + 2 * i) % 256);
            w.a[k].targets[i] = (int)(hash64(seed + 7 * k + 2 * i + 1) % 256);
        }
        if (first > LAYER_EMBEDDING) /* what the previous stage would have sent */
            for (size_t i = 0; i < w.NC; i++) w.a[k].encoded[i] = made_up(k * w.NC + i);
    }
    ops()->fill_zero(w.m.grads, w.m.param_count);
    if (!split) {
        for (int k = 0; k < BW_MICRO; k++) {
            gpt_forward_range(&w.m, &w.a[k], &w.s, first, last, 1, NULL, w.B, w.T);
            gpt_backward_range(&w.m, &w.a[k], &w.s, first, last, w.dloss, bw_doutput(&w, k), bw_dinput(&w),
                               NULL, w.B, w.T);
            bw_keep_dinput(&w, k);
        }
    } else {
        for (int k = 0; k < BW_MICRO; k++)
            gpt_forward_range(&w.m, &w.a[k], &w.s, first, last, 1, NULL, w.B, w.T);
        /* B0 B1 W0 B2 W1 W2, as a zb-h1 stage interleaves them: {1 for W, micro-batch} */
        int order[6][2] = {{0, 0}, {0, 1}, {1, 0}, {0, 2}, {1, 1}, {1, 2}};
        for (int i = 0; i < 6; i++) {
            if (!order[i][0])
                bw_input(&w, order[i][1]);
            else if (order[i][1] != skip_w)
                bw_weight(&w, order[i][1]);
        }
    }
    copy_to_host(w.r.grads, w.m.grads, w.m.param_count * sizeof(float));
    for (int k = 0; k < BW_MICRO; k++) {
        activations_destroy(&w.a[k], cfg);
        kept_grads_destroy(&w.kept[k]);
    }
    free(w.doutput);
    free(w.dinput);
    scratch_destroy(&w.s);
    gpt_destroy(&w.m);
    return w.r;
}

static void test_bw(void) {
    for (int which = 0; which < 2; which++) {
        ModelConfig cfg = shape(which);
        int L = cfg.layers;
        int ranges[][2] = {{LAYER_EMBEDDING, L}, {1, L - 1}, {LAYER_EMBEDDING, 0}, {1, L}};
        for (size_t i = 0; i < sizeof ranges / sizeof ranges[0]; i++) {
            int first = ranges[i][0], last = ranges[i][1];
            GPT probe;
            gpt_create_range(&probe, &cfg, seed, first, last);
            size_t count = probe.param_count, inputs = (size_t)BW_MICRO * 2 * cfg.seq * cfg.dmodel;
            gpt_destroy(&probe);
            BwResult plain = run_bw(&cfg, first, last, 0, -1), split = run_bw(&cfg, first, last, 1, -1);
            BwResult lost = run_bw(&cfg, first, last, 1, 1);
            check(memcmp(plain.grads, split.grads, count * sizeof(float)) == 0 &&
                      memcmp(plain.dinput, split.dinput, inputs * sizeof(float)) == 0,
                  "layers %d, units %d..%d: B0 B1 W0 B2 W1 W2 gives the ordinary backward's gradients%s bit "
                  "for "
                  "bit",
                  L, first, last, first > LAYER_EMBEDDING ? " and input gradients" : "");
            check(memcmp(plain.grads, lost.grads, count * sizeof(float)) != 0,
                  "layers %d, units %d..%d: without W1 the gradients differ", L, first, last);
            free(plain.grads);
            free(plain.dinput);
            free(split.grads);
            free(split.dinput);
            free(lost.grads);
            free(lost.dinput);
        }
        size_t C = cfg.dmodel, BT = 2 * (size_t)cfg.seq;
        check(kept_grads_bytes(&cfg, 2, cfg.seq, LAYER_EMBEDDING, L) ==
                  (L * 9 * C + vocab_padded(cfg.vocab)) * BT * sizeof(float),
              "layers %d: B keeps 9C floats per token per block and the padded V for the head", L);
    }
}

/* ---- norm ---- */

/* The squared norm of the whole gradient, computed independently: one plain
 * double sum in element order. */
static double reference_squares(const float *g, size_t n) {
    double sum = 0.0;
    for (size_t i = 0; i < n; i++) sum += (double)g[i] * g[i];
    return sum;
}

static int close_to(double a, double b) {
    return fabs(a - b) <= 1e-12 * fabs(b);
}

static void test_norm(const ParamTable *t) {
    int L = t->cfg.layers;
    size_t P = t->num_params;
    float *grads = xmalloc(P * sizeof(float)); /* a gradient: the initial values will do */
    param_init_range(t, seed, grads, 0, P);
    double reference = reference_squares(grads, P);
    for (int N = 1; N <= 4; N++) {
        /* ZeRO-2/3: rank r holds its shard, the units' slices and padding zeros */
        size_t n = shard_numel(t, N);
        float *shard = xmalloc(n * sizeof(float));
        double zero23 = 0.0;
        for (int r = 0; r < N; r++) {
            shard_from_whole(t, r, N, grads, shard);
            GradShards held = {.grads = shard, .held = n};
            double sharded, replicated;
            grad_shards_local_squares(&held, &sharded, &replicated);
            zero23 += sharded; /* the sum over the data-parallel group */
        }
        check(close_to(zero23, reference), "layers %d, N %d: ZeRO-2/3 shards with padding: %.17g vs %.17g", L,
              N, zero23, reference);
        free(shard);

        /* ZeRO-1: the whole buffer, rank r's slice of every unit */
        int units = L + 2;
        GradSpan *spans = xcalloc(units, sizeof(GradSpan));
        double zero1 = 0.0;
        for (int r = 0; r < N; r++) {
            for (int u = LAYER_EMBEDDING; u <= L; u++)
                shard_slice_elements(t, u, r, N, &spans[u - LAYER_EMBEDDING].first,
                                     &spans[u - LAYER_EMBEDDING].count);
            GradShards held = {.grads = grads, .held = P, .spans = spans, .num_spans = units};
            double sharded, replicated;
            grad_shards_local_squares(&held, &sharded, &replicated);
            zero1 += sharded;
        }
        check(close_to(zero1, reference), "layers %d, N %d: ZeRO-1 slices of every unit: %.17g vs %.17g", L,
              N, zero1, reference);
        free(spans);

        /* tensor parallel: the layernorms replicated (every rank holds them
         * whole), every other tensor cut in N row blocks, one per rank */
        spans = xcalloc(t->num_tensors, sizeof(GradSpan));
        double sliced = 0.0, replicated0 = 0.0;
        int same_replicated = 1;
        for (int r = 0; r < N; r++) {
            for (int i = 0; i < t->num_tensors; i++) {
                const ParamTensor *tensor = &t->tensors[i];
                int copy = strstr(tensor->name, "ln") != NULL;
                size_t from = copy ? 0 : tensor->numel * r / N,
                       to = copy ? tensor->numel : tensor->numel * (r + 1) / N;
                spans[i] = (GradSpan){tensor->offset + from, to - from, copy};
            }
            GradShards held = {.grads = grads, .held = P, .spans = spans, .num_spans = t->num_tensors};
            double sharded, replicated;
            grad_shards_local_squares(&held, &sharded, &replicated);
            sliced += sharded; /* the sum over the tp group */
            if (r == 0) replicated0 = replicated;
            same_replicated &= replicated == replicated0 && replicated > 0.0;
        }
        check(same_replicated && close_to(sliced + replicated0, reference),
              "layers %d, N %d: tensor slices, replicated tensors counted once: %.17g vs %.17g", L, N,
              sliced + replicated0, reference);
        free(spans);
    }

    /* one process: the whole buffer; the decision: clip to a tenth of the
     * norm, fp16 with loss scale 4 (the gradient 4 times too large) */
    float *scaled = xmalloc(P * sizeof(float));
    for (size_t i = 0; i < P; i++) scaled[i] = 4.0f * grads[i]; /* exact: a power of two */
    GradShards whole = {.grads = scaled, .held = P};
    double norm = sqrt(reference);
    LossScaler ls = {.scale = 4.0f, .dynamic = 1, .skips = 1, .window = 100};
    StepDecision d = optimizer_decide(&whole, &ls, (float)(norm / 10.0), 1);
    check(!d.skipped && close_to(d.grad_norm, norm) && fabs(d.grad_scale - 0.1f / 4.0f) < 1e-6f,
          "layers %d: the decision divides the loss scale out and clips: norm %.9g, factor %.9g", L,
          d.grad_norm, d.grad_scale);
    d = optimizer_decide(&whole, &ls, 0.0f, 2);
    check(d.grad_scale == 0.25f, "layers %d: --clip 0 does not clip: factor %.9g", L, d.grad_scale);
    scaled[P / 2] = INFINITY;
    d = optimizer_decide(&whole, &ls, 1.0f, 3);
    check(d.skipped && isinf(d.grad_norm) && ls.scale == 2.0f,
          "layers %d: an overflow skips the step and halves the scale: skipped %d, scale %g", L, d.skipped,
          ls.scale);
    free(scaled);
    free(grads);
}

/* ---- split ---- */

static int same_place(StageChunk a, StageChunk b) {
    return a.stage == b.stage && a.chunk == b.chunk;
}

/* One chunk per stage: the splits chapters 03, 04 and 06 used before chunks,
 * recorded from that code (tiny model, --layers 5 and 8). */
static void test_split_recorded(void) {
    struct {
        int layers, stages, blocks[4];
    } recorded[] = {{5, 2, {2, 3}},    {5, 3, {1, 2, 2}},    {5, 4, {1, 2, 1, 1}},
                    {8, 3, {2, 3, 3}}, {8, 4, {2, 2, 2, 2}}, {8, 1, {8}}};
    for (size_t i = 0; i < sizeof recorded / sizeof recorded[0]; i++) {
        ModelConfig cfg = shape(0);
        cfg.layers = recorded[i].layers;
        int S = recorded[i].stages, blocks[MAX_LAYERS], ok = 1, first_want = 0;
        ParamTable t;
        param_table_build(&t, &cfg);
        layer_split_balanced(&t, S, blocks);
        for (int s = 0; s < S; s++) {
            int first, last;
            layer_split_chunk_range(blocks, S, (StageChunk){s, 0}, &first, &last);
            ok &= blocks[s] == recorded[i].blocks[s] && first == first_want &&
                  last == first_want + recorded[i].blocks[s] - 1;
            first_want += recorded[i].blocks[s];
        }
        check(ok, "layers %d, %d stages, one chunk each: the split recorded before chunks existed",
              cfg.layers, S);
        param_table_free(&t);
    }
}

/* S stages of V chunks over L blocks: the pieces cover the model once, in order. */
static int split_covers_once(const ParamTable *t, int S, int V) {
    int L = t->cfg.layers, pieces = S * V, blocks[MAX_LAYERS], owner[MAX_LAYERS], ok = 1;
    layer_split_balanced(t, pieces, blocks);
    for (int b = 0; b < L; b++) owner[b] = -1;
    for (int c = 0; c < V; c++) {
        for (int s = 0; s < S; s++) {
            StageChunk at = {s, c};
            int piece = layer_split_piece(at, S), first, last, first_unit, last_unit;
            layer_split_chunk_range(blocks, S, at, &first, &last);
            ok &= 0 <= first && first <= last && last < L;
            for (int b = first; b <= last && b >= 0 && b < L; b++) {
                ok &= owner[b] == -1; /* no block in two pieces */
                owner[b] = piece;
            }
            layer_split_units(first, last, piece, pieces, L, &first_unit, &last_unit);
            ok &= (first_unit == LAYER_EMBEDDING) == (s == 0 && c == 0);
            ok &= (last_unit == L) == (s == S - 1 && c == V - 1);
        }
    }
    for (int b = 0; b < L; b++) ok &= owner[b] >= 0 && (b == 0 || owner[b] >= owner[b - 1]);
    /* the walk: from chunk 0 of stage 0 by layer_split_next, every piece in order */
    int visited = 0;
    ok &= same_place(layer_split_prev((StageChunk){0, 0}, S, V), (StageChunk){-1, -1});
    for (StageChunk at = {0, 0}; at.stage >= 0 && visited <= pieces; at = layer_split_next(at, S, V)) {
        ok &= layer_split_piece(at, S) == visited && at.chunk < V;
        StageChunk next = layer_split_next(at, S, V);
        if (next.stage >= 0) {
            ok &= same_place(layer_split_prev(next, S, V), at);
            ok &= next.stage == (at.stage + 1) % S; /* the next rank of the pp ring */
        }
        visited++;
    }
    return ok && visited == pieces;
}

static void test_split(void) {
    test_split_recorded();
    int splits = 0, bad = 0;
    for (int L = 1; L <= 12; L++) {
        ModelConfig cfg = shape(0);
        cfg.layers = L;
        ParamTable t;
        param_table_build(&t, &cfg);
        for (int S = 1; S <= L; S++)
            for (int V = 1; S * V <= L; V++) {
                int ok = split_covers_once(&t, S, V);
                if (!ok)
                    check(0, "layers %d, %d stages of %d chunks: pieces cover the model once, in order", L, S,
                          V);
                bad += !ok;
                splits++;
            }
        param_table_free(&t);
    }
    check(!bad,
          "%d splits of 1 to 12 layers into S stages of V chunks: each block in one piece, in order, "
          "the neighbours round the pp ring",
          splits);
}

/* A token shard written by shard_write is read back by data_load token for
 * token, ids past 255 and GPT-2's last (50256) among them, and split as text is. */
static void test_shard(void) {
    char path[] = "/tmp/test_units_shard_XXXXXX";
    int fd = mkstemp(path);
    close(fd);
    enum { N = 5000 };
    int tokens[N];
    for (int i = 0; i < N; i++) tokens[i] = (int)(hash64((uint64_t)i) % 50257);
    tokens[7] = 50256;
    shard_write("shard", path, tokens, N);
    Dataset d;
    data_load(&d, path, 64);
    int same = d.is_shard && d.size == N;
    for (int i = 0; same && i < N; i++) same = d.tokens[i] == tokens[i];
    check(same, "shard: %d tokens written by shard_write, read back by data_load %s", N,
          same ? "equal" : "DIFFERENT (or not taken for a shard)");
    check(d.split_at == N - N / 10, "shard: validation split at %zu (its last tenth)", d.split_at);
    data_free(&d);
    unlink(path);
}

int main(int argc, char **argv) {
    const char *what = argc == 2 ? argv[1] : "";
    device_init("cpu", 0);
    if (strcmp(what, "table") == 0) {
        for_each_shape(test_table);
    } else if (strcmp(what, "views") == 0) {
        test_views();
    } else if (strcmp(what, "padding") == 0) {
        for_each_shape(test_padding);
        test_padding_by_hand();
        test_slices_by_hand();
    } else if (strcmp(what, "shards") == 0) {
        for_each_shape(test_shards);
    } else if (strcmp(what, "ranges") == 0) {
        test_ranges();
    } else if (strcmp(what, "norm") == 0) {
        for_each_shape(test_norm);
    } else if (strcmp(what, "split") == 0) {
        test_split();
    } else if (strcmp(what, "bw") == 0) {
        test_bw();
    } else if (strcmp(what, "shard") == 0) {
        test_shard();
    } else {
        fatal(EXIT_USAGE, "usage: test_units table|views|padding|shards|ranges|norm|split|bw|shard");
    }
    if (failures)
        printf("FAIL: %d failures\n", failures);
    else
        printf("PASS\n");
    return failures ? 1 : 0;
}
