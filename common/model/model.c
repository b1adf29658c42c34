/* model.c: the GPT model (see model.h): its parameter table, initialisation,
 * activation memory, and forward/backward composed from kernels.h operations. */
#include "common/model/model.h" /* GPT, its forward and backward */

#include "common/device/device.h" /* mem_alloc, copies, streams, timers */
#include "common/kernels/kernels.h" /* ops(): the kernel table */
#include "common/core/util.h" /* fatal, log_info, exit codes, flag parsing */
#include "common/kernels/work_ledger.h" /* a dry run's counted work */

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *model_config_problem(const ModelConfig *m) {
    static char message[256];
    if (m->layers < 1 || m->layers > MAX_LAYERS)
        snprintf(message, sizeof message, "--layers %d is out of range (valid: 1..%d)", m->layers,
                 MAX_LAYERS);
    else if (m->heads < 1 || m->heads > 1024)
        snprintf(message, sizeof message, "--heads %d is out of range (valid: 1..1024)", m->heads);
    else if (m->dmodel < 1 || m->dmodel > 16384)
        snprintf(message, sizeof message, "--dmodel %d is out of range (valid: 1..16384)", m->dmodel);
    else if (m->dmodel % m->heads != 0)
        snprintf(message, sizeof message,
                 "--dmodel %d is not divisible by --heads %d (valid: a multiple of heads)", m->dmodel,
                 m->heads);
    else if (m->seq < 1 || m->seq > 65536)
        snprintf(message, sizeof message, "--seq %d is out of range (valid: 1..65536)", m->seq);
    else if (m->vocab < 256 || m->vocab > MAX_VOCAB)
        snprintf(message, sizeof message, "--vocab %d is out of range (valid: 256..%d; the data are bytes)",
                 m->vocab, MAX_VOCAB);
    else if (m->loss_chunks < 0 || m->loss_chunks > m->seq || (m->loss_chunks > 0 && m->seq % m->loss_chunks))
        snprintf(message, sizeof message,
                 "--loss-chunks %d does not divide --seq %d: the head runs on equal pieces of every "
                 "micro-batch's tokens (valid: a divisor of %d, 1..%d)",
                 m->loss_chunks, m->seq, m->seq, m->seq);
    else if (m->moe.experts && m->moe.top_k > m->moe.experts)
        snprintf(message, sizeof message, "--top-k %d exceeds --experts %d (valid: 1..%d)", m->moe.top_k,
                 m->moe.experts, m->moe.experts);
    else if (m->moe.experts && (m->moe.every < 1 || m->moe.every > m->layers))
        snprintf(message, sizeof message,
                 "--moe-every %d exceeds --layers %d: no block would hold the experts (valid: 1..%d)",
                 m->moe.every, m->layers, m->layers);
    else
        return NULL;
    return message;
}

/* ---- the parameters: a table, and storage bound to it unit by unit ---- */

static void set_table(GPT *m, ParamTable table) {
    memset(m, 0, sizeof *m);
    m->table = table;
    m->cfg = table.cfg;
    m->tensors = table.tensors;
    m->num_tensors = table.num_tensors;
    m->num_params = table.num_params;
}

void gpt_init(GPT *m, ParamTable table) {
    set_table(m, table);
    m->w.block = xcalloc(table.cfg.layers, sizeof(BlockWeights));
    m->g.block = xcalloc(table.cfg.layers, sizeof(BlockWeights));
    m->first_unit = LAYER_EMBEDDING;
    m->last_unit = m->first_unit - 1; /* no unit bound */
}

/* The pointer of `view` that names tensor t. */
static float **view_slot(Weights *view, const ParamTensor *t, int L) {
    if (t->layer == LAYER_EMBEDDING) return t->kind == EMBEDDING_WTE ? &view->wte : &view->wpe;
    if (t->layer < L) return &view->block[t->layer][t->kind];
    switch (t->kind) {
    case HEAD_LNFW:
        return &view->lnfw;
    case HEAD_LNFB:
        return &view->lnfb;
    default:
        return &view->lm_head;
    }
}

float *weights_tensor(const GPT *m, const Weights *view, const ParamTensor *t) {
    return *view_slot((Weights *)view, t, m->cfg.layers);
}

size_t gpt_held_offset(const GPT *m, const ParamTensor *t) {
    if (m->unit_at) {
        size_t at = m->unit_at[t->layer + 1];
        return at == SIZE_MAX ? SIZE_MAX : at + (t->offset - table_unit(&m->table, t->layer)->offset);
    }
    return t->layer >= m->first_unit && t->layer <= m->last_unit ? t->offset - m->param_first : SIZE_MAX;
}

void gpt_bind_unit(GPT *m, int unit, float *params, float *grads) {
    const ParamUnit *u = table_unit(&m->table, unit);
    for (int k = 0; k < u->num_tensors; k++) {
        const ParamTensor *t = &m->table.tensors[u->first_tensor + k];
        size_t at = t->offset - u->offset;
        *view_slot(&m->w, t, m->cfg.layers) = params ? params + at : NULL;
        *view_slot(&m->g, t, m->cfg.layers) = grads ? grads + at : NULL;
        if (m->cfg.tied && t->layer == LAYER_EMBEDDING && t->kind == EMBEDDING_WTE) { /* the head reads wte */
            m->w.lm_head = m->w.wte;
            m->g.lm_head = m->g.wte;
        }
    }
}

void gpt_set_range(GPT *m, int first_unit, int last_unit) {
    size_t first = table_unit(&m->table, first_unit)->offset;
    const ParamUnit *last = table_unit(&m->table, last_unit);
    m->first_unit = first_unit;
    m->last_unit = last_unit;
    m->param_first = first;
    m->param_count = last->offset + last->numel - first;
}

void gpt_bind_range(GPT *m, int first_unit, int last_unit, float *params, float *grads) {
    if (first_unit > last_unit)
        fatal(EXIT_RUNTIME, "gpt_bind_range: units %d..%d are no range", first_unit, last_unit);
    gpt_set_range(m, first_unit, last_unit);
    size_t first = m->param_first;
    m->params = params;
    m->grads = grads;
    for (int u = LAYER_EMBEDDING; u <= m->cfg.layers; u++) {
        size_t at = table_unit(&m->table, u)->offset - first;
        int held = u >= first_unit && u <= last_unit;
        gpt_bind_unit(m, u, held ? params + at : NULL, held && grads ? grads + at : NULL);
    }
}

void gpt_alloc_range(GPT *m, int first_unit, int last_unit) {
    if (first_unit > last_unit)
        fatal(EXIT_RUNTIME, "gpt_alloc_range: units %d..%d are no range", first_unit, last_unit);
    size_t first = table_unit(&m->table, first_unit)->offset;
    const ParamUnit *last = table_unit(&m->table, last_unit);
    size_t bytes = (last->offset + last->numel - first) * sizeof(float);
    float *params = mem_alloc(SPACE_DEVICE, CAT_PARAMS, bytes, "parameters");
    float *grads = mem_alloc(SPACE_DEVICE, CAT_GRADS, bytes, "gradients");
    gpt_bind_range(m, first_unit, last_unit, params, grads);
    m->owns_storage = 1;
}

void gpt_create_range(GPT *m, const ModelConfig *cfg, uint64_t seed, int first_unit, int last_unit) {
    ParamTable table;
    param_table_build(&table, cfg);
    gpt_init(m, table);
    gpt_alloc_range(m, first_unit, last_unit);
    size_t bytes = m->param_count * sizeof(float);
    float *host = xmalloc(bytes);
    param_init_range(&m->table, seed, host, m->param_first, m->param_count);
    copy_to_device(m->params, host, bytes);
    free(host);
}

void gpt_create(GPT *m, const ModelConfig *cfg, uint64_t seed) {
    gpt_create_range(m, cfg, seed, LAYER_EMBEDDING, cfg->layers);
}

void gpt_destroy(GPT *m) {
    if (m->owns_storage) {
        mem_free(m->params);
        mem_free(m->grads);
    }
    free(m->w.block);
    free(m->g.block);
    param_table_free(&m->table);
    memset(m, 0, sizeof *m);
}

/* ---- activation memory: one block per kind, carved into named tensors ---- */

size_t activation_bytes(const ModelConfig *c, int B, int T) {
    /* EXERCISE 01.3 BEGIN: count the bytes the forward pass saves (course.md, exercise 01.3) */
    size_t BT = (size_t)B * T, C = c->dmodel, V = vocab_rows_held(c), L = c->layers;
    size_t lse = (size_t)B * c->heads * T;
    /* the head's logits and probabilities: for P tokens at a time (all of them, or a
     * K-th with --loss-chunks K), V columns (vocab_padded, or a tp rank's share) */
    size_t P = head_piece_tokens(c, B * T);
    /* per block: ln1, atty, res2, ln2, res3 (C each), qkv (3C), fch (4C) =
     * 12C per token, 4 layernorm statistics, and the attention's lse (one per
     * head per token); GELU's output is recomputed in backward, not kept */
    size_t per_block = BT * (12 * C + 4) + lse;
    size_t floats = 2 * BT             /* tokens, targets (ints, same size as floats) */
                    + BT * C           /* encoded */
                    + L * per_block    /* blocks */
                    + BT * C + 2 * BT  /* lnf, mean, rstd */
                    + 2 * P * V + BT;  /* logits, probs (of one piece), losses */
    return floats * sizeof(float);
    /* EXERCISE 01.3 END */
}

/* The bytes activation_bytes counts for one block: the difference one more
 * block makes (activation_bytes is exercise 01.3; the counts below are
 * derived from it, so the learner's arithmetic is the only one). */
static size_t block_bytes(const ModelConfig *c, int B, int T) {
    ModelConfig one = *c, none = *c;
    one.layers = 1;
    none.layers = 0;
    return activation_bytes(&one, B, T) - activation_bytes(&none, B, T);
}

/* With recompute a micro-batch keeps, of each block, only its output res3 (the
 * next block's input); everything else of a block is recomputed into one set:
 * a block's bytes less res3's. */
size_t recompute_block_bytes(const ModelConfig *c, int B, int T) {
    return block_bytes(c, B, T) - (size_t)B * T * c->dmodel * sizeof(float);
}

/* Without the blocks' own tensors, but res3 of each block kept. */
size_t activation_bytes_recompute(const ModelConfig *c, int B, int T) {
    ModelConfig none = *c;
    none.layers = 0;
    return activation_bytes(&none, B, T) + (size_t)c->layers * B * T * c->dmodel * sizeof(float);
}

size_t scratch_bytes(const ModelConfig *c, int B, int T) {
    size_t BT = (size_t)B * T, C = c->dmodel, V = vocab_rows_held(c);
    size_t floats = BT * C * 7    /* branch, dresid x2, dmid, dbranch, dln, datty */
                    + BT * 3 * C  /* dqkv */
                    + BT * 12 * C /* dfch, dfch_gelu, gelu */
                    + (size_t)head_piece_tokens(c, B * T) * V; /* dlogits of one piece of the head */
    return floats * sizeof(float);
}

/* Carving a block into tensors. With base NULL it only counts: the size of a
 * partial set of activations is whatever carving it takes. */
typedef struct {
    float *base;
    size_t used; /* floats handed out so far */
} Carver;

static float *carve(Carver *k, size_t count) {
    float *p = k->base ? k->base + k->used : NULL;
    k->used += count;
    return p;
}

/* The carved tensors must fill the block exactly: this is what keeps
 * activation_bytes() and scratch_bytes() honest. */
static void check_carved(const Carver *k, size_t bytes, const char *what) {
    size_t used = k->used * sizeof(float);
    if (used != bytes)
        fatal(EXIT_RUNTIME,
              "%s: the tensors take %zu bytes but the block has %zu (the size function is wrong)", what, used,
              bytes);
}

/* Carve what a block's backward reads from its forward, all but the output res3;
 * an MoE block's (dense_mlp 0) without fch: its hidden layers are the experts'
 * (moe.h, MoeLayerActs). */
static void carve_block_values(BlockActs *b, const ModelConfig *c, int B, int T, int dense_mlp, Carver *k) {
    size_t BT = (size_t)B * T, C = c->dmodel;
    b->ln1 = carve(k, BT * C);
    b->ln1_mean = carve(k, BT);
    b->ln1_rstd = carve(k, BT);
    b->qkv = carve(k, BT * 3 * C);
    b->atty = carve(k, BT * C);
    b->lse = carve(k, (size_t)B * c->heads * T);
    b->res2 = carve(k, BT * C);
    b->ln2 = carve(k, BT * C);
    b->ln2_mean = carve(k, BT);
    b->ln2_rstd = carve(k, BT);
    b->fch = dense_mlp ? carve(k, BT * 4 * C) : NULL;
}

/* Carve the activations of layers first..last (see activations_create_range). */
static void carve_activations(Activations *a, const ModelConfig *c, int B, int T, int first, int last,
                              int recompute, int keep_outputs, Carver *k) {
    size_t BT = (size_t)B * T, C = c->dmodel, V = vocab_rows_held(c), P = head_piece_tokens(c, B * T);
    a->tokens = (int *)carve(k, BT);
    a->targets = (int *)carve(k, BT);
    a->encoded = carve(k, BT * C);
    for (int l = 0; l < c->layers; l++) {
        BlockActs *b = &a->block[l];
        if (l < first || l > last) continue;
        if (!recompute) carve_block_values(b, c, B, T, !moe_layer(c, l), k);
        if (keep_outputs) b->res3 = carve(k, BT * C); /* else a CheckpointStore keeps it */
    }
    if (last < c->layers) return;
    a->lnf = carve(k, BT * C);
    a->lnf_mean = carve(k, BT);
    a->lnf_rstd = carve(k, BT);
    a->head_rows = (int)P;
    a->logits = carve(k, P * V);
    a->probs = carve(k, P * V);
    a->losses = carve(k, BT);
}

/* What activation_bytes counts (a dense model's) that an MoE model does not
 * carve: the dense fch of each MoE block, whose experts keep their own. */
static size_t moe_dense_hidden_bytes(const ModelConfig *c, int B, int T) {
    size_t blocks = 0;
    for (int l = 0; l < c->layers; l++) blocks += moe_layer(c, l);
    return blocks * B * T * 4 * c->dmodel * sizeof(float);
}

void activations_create(Activations *a, const ModelConfig *c, int B, int T) {
    memset(a, 0, sizeof *a);
    a->B = B;
    a->T = T;
    a->block = xcalloc(c->layers, sizeof(BlockActs));
    size_t bytes = activation_bytes(c, B, T) - moe_dense_hidden_bytes(c, B, T);
    Carver k = {mem_alloc(SPACE_DEVICE, CAT_ACTIVATIONS, bytes, "activations"), 0};
    carve_activations(a, c, B, T, LAYER_EMBEDDING, c->layers, 0, 1, &k);
    check_carved(&k, bytes, "activations");
    moe_acts_create(&a->moe, c, B, T, LAYER_EMBEDDING, c->layers);
}

void activations_create_model(Activations *a, const ModelConfig *c, int B, int T, int recompute) {
    if (!recompute) {
        activations_create(a, c, B, T);
        return;
    }
    activations_create_range(a, c, B, T, LAYER_EMBEDDING, c->layers, 1);
}

size_t activation_bytes_range(const ModelConfig *c, int B, int T, int first_unit, int last_unit,
                              int recompute) {
    Activations none = {0};
    none.block = xcalloc(c->layers > 0 ? c->layers : 1, sizeof(BlockActs));
    Carver count = {NULL, 0};
    carve_activations(&none, c, B, T, first_unit, last_unit, recompute, 1, &count);
    free(none.block);
    return count.used * sizeof(float);
}

/* activations_create_range, or with a store activations_create_stored. */
static void create_range(Activations *a, const ModelConfig *c, int B, int T, int first_unit, int last_unit,
                         int recompute, const CheckpointStore *store, int slot) {
    memset(a, 0, sizeof *a);
    a->B = B;
    a->T = T;
    a->recompute = recompute;
    a->store = store;
    a->store_slot = slot;
    a->block = xcalloc(c->layers, sizeof(BlockActs));
    Carver count = {NULL, 0};
    carve_activations(a, c, B, T, first_unit, last_unit, recompute, !store, &count);
    size_t bytes = count.used * sizeof(float);
    Carver k = {mem_alloc(SPACE_DEVICE, CAT_ACTIVATIONS, bytes, "activations"), 0};
    carve_activations(a, c, B, T, first_unit, last_unit, recompute, !store, &k);
    if (!store && bytes != activation_bytes_range(c, B, T, first_unit, last_unit, recompute))
        fatal(EXIT_RUNTIME, "activations: carving and activation_bytes_range disagree");
    if (!store && recompute && first_unit == LAYER_EMBEDDING && last_unit == c->layers)
        check_carved(&k, activation_bytes_recompute(c, B, T), "activations (recompute)");
    if (c->moe.experts && recompute)
        fatal(EXIT_USAGE, "--recompute with --experts is not written yet: the experts' values are not "
                          "recomputed (valid: one of them)");
    moe_acts_create(&a->moe, c, B, T, first_unit, last_unit);
}

void activations_create_range(Activations *a, const ModelConfig *c, int B, int T, int first_unit,
                              int last_unit, int recompute) {
    create_range(a, c, B, T, first_unit, last_unit, recompute, NULL, 0);
}

void activations_create_stored(Activations *a, const ModelConfig *c, int B, int T, int first_unit,
                               int last_unit, const CheckpointStore *store, int slot) {
    create_range(a, c, B, T, first_unit, last_unit, 1, store, slot);
}

void activations_destroy(Activations *a, const ModelConfig *c) {
    (void)c;
    mem_free(a->tokens); /* the block starts at tokens */
    moe_acts_destroy(&a->moe);
    free(a->block);
    memset(a, 0, sizeof *a);
}

void scratch_create(Scratch *s, const ModelConfig *c, int B, int T, int recompute) {
    memset(s, 0, sizeof *s);
    s->B = B;
    s->T = T;
    size_t BT = (size_t)B * T, C = c->dmodel, V = vocab_rows_held(c);
    size_t bytes = scratch_bytes(c, B, T);
    Carver k = {mem_alloc(SPACE_DEVICE, CAT_WORKSPACE, bytes, "activation gradients"), 0};
    s->branch = carve(&k, BT * C);
    s->dresid[0] = carve(&k, BT * C);
    s->dresid[1] = carve(&k, BT * C);
    s->dmid = carve(&k, BT * C);
    s->dbranch = carve(&k, BT * C);
    s->dln = carve(&k, BT * C);
    s->datty = carve(&k, BT * C);
    s->dqkv = carve(&k, BT * 3 * C);
    s->dfch = carve(&k, BT * 4 * C);
    s->dfch_gelu = carve(&k, BT * 4 * C);
    s->gelu = carve(&k, BT * 4 * C);
    s->dlogits = carve(&k, (size_t)head_piece_tokens(c, B * T) * V);
    check_carved(&k, bytes, "activation gradients");
    moe_scratch_create(&s->moe, c, B, T);
    s->recompute = recompute;
    if (!recompute) return;
    /* Forward values, so tagged as activations: the one set of them that remains. */
    bytes = recompute_block_bytes(c, B, T);
    Carver r = {mem_alloc(SPACE_DEVICE, CAT_ACTIVATIONS, bytes, "recomputed block"), 0};
    carve_block_values(&s->recomputed, c, B, T, 1, &r); /* --recompute: dense blocks only */
    check_carved(&r, bytes, "recomputed block");
}

void scratch_destroy(Scratch *s) {
    mem_free(s->branch);
    moe_scratch_destroy(&s->moe);
    if (s->recompute) mem_free(s->recomputed.ln1); /* the set starts at ln1 */
    memset(s, 0, sizeof *s);
}

/* ---- forward ---- */

int gpt_linear_shapes(const ModelConfig *cfg, LinearShape shapes[GPT_LINEAR_SHAPES]) {
    int C = cfg->dmodel;
    shapes[0] = (LinearShape){C, 3 * C};      /* qkv */
    shapes[1] = (LinearShape){C, C};          /* attproj */
    shapes[2] = (LinearShape){C, 4 * C};      /* fc */
    shapes[3] = (LinearShape){4 * C, C};      /* fcproj */
    shapes[4] = (LinearShape){C, vocab_rows_held(cfg)}; /* lm_head (this model's rows of it) */
    return GPT_LINEAR_SHAPES;
}

void gpt_linear_forward(const GPT *m, float *out, const float *inp, const float *weight, const float *bias,
                        int N, int C, int OC) {
    if (m && m->half_matmuls)
        ops()->linear_forward_half(out, inp, weight, bias, N, C, OC, m->matmul_format);
    else
        ops()->linear_forward(out, inp, weight, bias, N, C, OC);
}

void gpt_linear_backward(const GPT *m, float *dinp, float *dweight, float *dbias, const float *dout,
                         const float *inp, const float *weight, int N, int C, int OC) {
    if (m && m->half_matmuls)
        ops()->linear_backward_half(dinp, dweight, dbias, dout, inp, weight, N, C, OC, m->matmul_format);
    else
        ops()->linear_backward(dinp, dweight, dbias, dout, inp, weight, N, C, OC);
}

void gpt_linear_backward_input(const GPT *m, float *dinp, const float *dout, const float *weight, int N,
                               int C, int OC) {
    if (m && m->half_matmuls)
        ops()->linear_backward_input_half(dinp, dout, weight, N, C, OC, m->matmul_format);
    else
        ops()->linear_backward_input(dinp, dout, weight, N, C, OC);
}

void gpt_linear_backward_weight(const GPT *m, float *dweight, float *dbias, const float *dout,
                                const float *inp, int N, int C, int OC) {
    if (m && m->half_matmuls)
        ops()->linear_backward_weight_half(dweight, dbias, dout, inp, N, C, OC, m->matmul_format);
    else
        ops()->linear_backward_weight(dweight, dbias, dout, inp, N, C, OC);
}

/* A linear layer's whole backward, or with input_only only its input
 * gradient (B of a split backward: the weight gradient waits for W). */
static void linear_backward_or_input(const GPT *m, int input_only, float *dinp, float *dweight, float *dbias,
                                     const float *dout, const float *inp, const float *weight, int N, int C,
                                     int OC) {
    if (input_only)
        gpt_linear_backward_input(m, dinp, dout, weight, N, C, OC);
    else
        gpt_linear_backward(m, dinp, dweight, dbias, dout, inp, weight, N, C, OC);
}

static void check_shape(const Activations *a, int B, int T) {
    if (B < 1 || T < 1 || B > a->B || T > a->T)
        fatal(EXIT_RUNTIME, "forward of %d x %d tokens exceeds the activation capacity %d x %d", B, T, a->B,
              a->T);
}

void gpt_embedding_forward(const GPT *m, Activations *a, int B, int T) {
    check_shape(a, B, T);
    const SequenceSplit *seq = m->sequence;
    const VocabSplit *vs = m->vocab;
    int C = m->cfg.dmodel, first = vs ? vs->first_row : 0, rows = vocab_rows_held(&m->cfg);
    if (seq)
        seq->embedding_forward(a->encoded, a->tokens, m->w.wte, m->w.wpe, B, T, C, first, rows, seq->context);
    else if (vs)
        ops()->embedding_forward_rows(a->encoded, a->tokens, m->w.wte, m->w.wpe, B, T, C, first, rows);
    else
        ops()->embedding_forward(a->encoded, a->tokens, m->w.wte, m->w.wpe, B, T, C);
    /* each token's row is on one rank, the others gave 0: the sum is the lookup */
    if (vs) vs->allreduce_sum(a->encoded, (size_t)B * T * C, vs->context);
}

/* Where block l's forward values are: its own set, or with recompute the one
 * set in the scratch (then a->block[l] holds only res3). */
static BlockActs *block_values(Activations *a, Scratch *s, int l) {
    if (!a->recompute) return &a->block[l];
    if (!s->recompute)
        fatal(EXIT_RUNTIME, "activations keep only block inputs but the scratch has no recompute set "
                            "(create both with the same recompute)");
    return &s->recomputed;
}

/* Block l's forward up to fch, the last value its backward reads: what
 * gpt_block_forward computes first and what recompute runs again. */
static void block_forward_values(const GPT *m, BlockActs *b, Scratch *s, int l, const float *input, int B,
                                 int T) {
    const KernelOps *k = ops();
    int C = m->cfg.dmodel, NH = m->cfg.heads, N = B * T;
    float **w = m->w.block[l];
    /* attention half: res2 = input + attproj(attention(qkv(ln1(input)))) */
    k->layernorm_forward(b->ln1, b->ln1_mean, b->ln1_rstd, input, w[BLOCK_LN1W], w[BLOCK_LN1B], N, C);
    gpt_linear_forward(m, b->qkv, b->ln1, w[BLOCK_QKVW], w[BLOCK_QKVB], N, C, 3 * C);
    if (m->sequence)
        m->sequence->attention_forward(b->atty, b->lse, b->qkv, B, T, C, NH, m->sequence->context);
    else
        k->attention_forward(b->atty, b->lse, b->qkv, B, T, C, NH);
    gpt_linear_forward(m, s->branch, b->atty, w[BLOCK_ATTPROJW], w[BLOCK_ATTPROJB], N, C, C);
    k->residual_forward(b->res2, input, s->branch, (size_t)N * C);
    /* MLP half, up to its hidden layer: fch = fc(ln2(res2)); an MoE block's experts follow ln2 */
    k->layernorm_forward(b->ln2, b->ln2_mean, b->ln2_rstd, b->res2, w[BLOCK_LN2W], w[BLOCK_LN2B], N, C);
    if (!moe_layer(&m->cfg, l)) gpt_linear_forward(m, b->fch, b->ln2, w[BLOCK_FCW], w[BLOCK_FCB], N, C, 4 * C);
}

/* ---- an MoE block's MLP half (moe.h) ----
 * In place of fc, GELU and fcproj: out(B,T,C) from ln2 = ln2(res2), the
 * routing added to a->moe.stats; the backward adds dL/d(ln2) into dln and the
 * router's and experts' gradients into m->grads, the balancing loss's scaled
 * by a->moe.dloss. An MoE block's values have no fch: the experts keep theirs. */

/* Expert e's slices of the block's four MLP tensors (param_table.h, BLOCK_ROUTERW). */
typedef struct {
    float *fcw, *fcb, *fcprojw, *fcprojb;
} Expert;
static Expert expert_of(float *const *w, int e, int C) {
    size_t C4 = 4 * (size_t)C;
    return (Expert){w[BLOCK_FCW] + e * C4 * C, w[BLOCK_FCB] + e * C4, w[BLOCK_FCPROJW] + e * (size_t)C * C4,
                    w[BLOCK_FCPROJB] + e * (size_t)C};
}

void gpt_experts_forward(const GPT *m, int l, int first, int count, const int *rows, const float *xin,
                         float *fch, float *gelu, float *y) {
    int C = m->cfg.dmodel;
    float **w = m->w.block[l];
    size_t R = 0;
    for (int i = 0; i < count; R += rows[i++]) {
        if (!rows[i]) continue;
        Expert x = expert_of(w, first + i, C);
        gpt_linear_forward(m, fch + R * 4 * C, xin + R * C, x.fcw, x.fcb, rows[i], C, 4 * C);
    }
    ops()->gelu_forward(gelu, fch, R * 4 * C);
    R = 0;
    for (int i = 0; i < count; R += rows[i++]) {
        if (!rows[i]) continue;
        Expert x = expert_of(w, first + i, C);
        gpt_linear_forward(m, y + R * C, gelu + R * 4 * C, x.fcprojw, x.fcprojb, rows[i], 4 * C, C);
    }
}

void gpt_experts_backward(const GPT *m, int l, int first, int count, const int *rows, const float *xin,
                          const float *fch, const float *dy, float *gelu, float *dgelu, float *dfch,
                          float *dxin) {
    const KernelOps *k = ops();
    int C = m->cfg.dmodel;
    float **w = m->w.block[l], **g = m->g.block[l];
    size_t R = 0;
    for (int i = 0; i < count; i++) R += rows[i];
    /* GELU recomputed, as the dense backward does */
    k->gelu_forward(gelu, fch, R * 4 * C);
    k->fill_zero(dgelu, R * 4 * C);
    k->fill_zero(dfch, R * 4 * C);
    k->fill_zero(dxin, R * C);
    R = 0;
    for (int i = 0; i < count; R += rows[i++]) {
        if (!rows[i]) continue;
        Expert x = expert_of(w, first + i, C), dx = expert_of(g, first + i, C);
        gpt_linear_backward(m, dgelu + R * 4 * C, dx.fcprojw, dx.fcprojb, dy + R * C, gelu + R * 4 * C,
                            x.fcprojw, rows[i], 4 * C, C);
    }
    k->gelu_backward(dfch, fch, dgelu, R * 4 * C);
    R = 0;
    for (int i = 0; i < count; R += rows[i++]) {
        if (!rows[i]) continue;
        Expert x = expert_of(w, first + i, C), dx = expert_of(g, first + i, C);
        gpt_linear_backward(m, dxin + R * C, dx.fcw, dx.fcb, dfch + R * 4 * C, xin + R * C, x.fcw, rows[i],
                            C, 4 * C);
    }
}

void gpt_moe_forward(const GPT *m, Activations *a, Scratch *s, int l, const float *ln2, float *out, int B,
                     int T) {
    const KernelOps *k = ops();
    const MoeConfig *moe = &m->cfg.moe;
    int C = m->cfg.dmodel, E = moe->experts, K = moe->top_k, N = B * T;
    MoeLayerActs *la = &a->moe.layer[l];
    MoeScratch *ms = &s->moe;
    float **w = m->w.block[l];
    if (!la->xin)
        fatal(EXIT_RUNTIME, "block %d is an MoE block but its activations hold no expert buffers", l);
    /* the router, and the routing on the host */
    gpt_linear_forward(m, ms->logits, ln2, w[BLOCK_ROUTERW], NULL, N, C, E);
    copy_to_host(ms->logits_h, ms->logits, (size_t)N * E * sizeof(float));
    moe_route(moe, ms->logits_h, B, T, la, &a->moe.stats);
    size_t NK = (size_t)N * K;
    copy_to_device(la->src, la->src_h, (size_t)la->rows * sizeof(int));
    copy_to_device(la->pos, la->pos_h, NK * sizeof(int));
    copy_to_device(la->gate, la->gate_h, NK * sizeof(float));
    /* The CPU's 16-bit matmuls round their operands into workspaces grown on
     * demand (kernels_cpu.c): grown here for the most rows an expert can get,
     * their size (memory.csv) does not depend on the routing, which a dry run
     * (common/plan) cannot know. */
    if (m->half_matmuls && (device_dry() || strcmp(k->name, "cpu") == 0)) {
        int most = moe_expert_rows_max(moe, B, T);
        for (int which = HALF_MATMUL_FORWARD; which <= HALF_MATMUL_BACKWARD_WEIGHT; which++) {
            half_matmul_grow_cpu((HalfMatmul)which, most, C, 4 * C);
            half_matmul_grow_cpu((HalfMatmul)which, most, 4 * C, C);
        }
    }
    /* dispatch, each expert on its rows (here, or on the ranks holding them), combine */
    k->moe_gather(la->xin, ln2, la->src, la->rows, C);
    if (m->experts)
        m->experts->forward(l, la, B, T, m->experts->context);
    else if (moe_experts_held(&m->cfg) != E) /* a share of the experts computes only with its ranks */
        fatal(EXIT_RUNTIME, "block %d holds %d of the %d experts but has no expert split to reach the others",
              l, moe_experts_held(&m->cfg), E);
    else
        gpt_experts_forward(m, l, 0, E, la->count_h, la->xin, la->fch, ms->gelu, la->y);
    k->moe_combine(out, la->y, la->pos, la->gate, N, K, C);
}

void gpt_moe_backward(const GPT *m, Activations *a, Scratch *s, int l, const float *ln2, const float *dout,
                      float *dln, int B, int T) {
    const KernelOps *k = ops();
    const MoeConfig *moe = &m->cfg.moe;
    int C = m->cfg.dmodel, E = moe->experts, K = moe->top_k, N = B * T;
    const MoeLayerActs *la = &a->moe.layer[l];
    MoeScratch *ms = &s->moe;
    float **w = m->w.block[l], **g = m->g.block[l];
    size_t NK = (size_t)N * K, R = (size_t)la->rows;
    /* combine: the experts' outputs and the gates */
    k->fill_zero(ms->dy, R * C);
    k->fill_zero(ms->dgate, NK);
    k->moe_combine_backward(ms->dy, ms->dgate, dout, la->y, la->pos, la->gate, N, K, C);
    /* each expert's two layers (here, or on the ranks holding them) */
    if (m->experts)
        m->experts->backward(l, la, ms->dy, ms->dxin, B, T, m->experts->context);
    else
        gpt_experts_backward(m, l, 0, E, la->count_h, la->xin, la->fch, ms->dy, ms->gelu, ms->dgelu, ms->dfch,
                             ms->dxin);
    /* dispatch's backward: each token's rows summed back */
    k->moe_scatter_add(dln, ms->dxin, la->pos, N, K, C);
    /* the router, through the routing's gradient on the host */
    copy_to_host(ms->dgate_h, ms->dgate, NK * sizeof(float));
    moe_route_backward(moe, la, ms->dgate_h, a->moe.dloss, B, T, ms->dlogits_h);
    copy_to_device(ms->dlogits, ms->dlogits_h, (size_t)N * E * sizeof(float));
    gpt_linear_backward(m, dln, g[BLOCK_ROUTERW], NULL, ms->dlogits, ln2, w[BLOCK_ROUTERW], N, C, E);
}

void gpt_block_forward(const GPT *m, Activations *a, Scratch *s, int l, const float *input, int B, int T) {
    const KernelOps *k = ops();
    int C = m->cfg.dmodel, N = B * T;
    float **w = m->w.block[l];
    BlockActs *b = block_values(a, s, l);
    block_forward_values(m, b, s, l, input, B, T);
    /* the rest of the MLP half: res3 = res2 + fcproj(gelu(fch)), or the experts'; res3 is always kept */
    if (moe_layer(&m->cfg, l)) {
        gpt_moe_forward(m, a, s, l, b->ln2, s->branch, B, T);
    } else {
        k->gelu_forward(s->gelu, b->fch, (size_t)N * 4 * C);
        gpt_linear_forward(m, s->branch, s->gelu, w[BLOCK_FCPROJW], w[BLOCK_FCPROJB], N, 4 * C, C);
    }
    k->residual_forward(a->block[l].res3, b->res2, s->branch, (size_t)N * C);
}

/* The losses of tokens r0 .. r0 + rows - 1 from their logits (a->logits,
 * rows of Vh), leaving their probabilities in a->probs. Under a vocabulary
 * split each rank holds Vh columns of every row: the softmax needs the
 * row's maximum and sum of exponentials over all of them, and the loss the
 * target's logit, which one rank holds. So: the slices' maxima all-gathered
 * (parts x rows floats), then the sums and target logits, shifted by the
 * maximum, all-reduced (2 x rows floats). */
static void head_loss(const GPT *m, Activations *a, int r0, int rows) {
    const KernelOps *k = ops();
    const VocabSplit *vs = m->vocab;
    int V = m->cfg.vocab, Vh = vocab_rows_held(&m->cfg);
    if (!vs) {
        k->crossentropy_forward(a->losses + r0, a->probs, a->logits, a->targets + r0, rows, V, Vh);
        return;
    }
    int first = vs->first_row, cols = V - first < 0 ? 0 : V - first < Vh ? V - first : Vh;
    float *row_max = vs->stats, *maxes = row_max + rows, *sums = maxes + (size_t)vs->parts * rows;
    k->crossentropy_slice_max(row_max, a->logits, rows, cols, Vh);
    vs->allgather(row_max, maxes, rows, vs->context);
    k->crossentropy_slice_sums(sums, row_max, maxes, vs->parts, a->logits, a->targets + r0, rows, cols, Vh,
                               first);
    vs->allreduce_sum(sums, 2 * (size_t)rows, vs->context);
    k->crossentropy_slice_finish(a->losses + r0, a->probs, a->logits, row_max, sums, rows, cols, Vh);
}

/* The logits of tokens r0 .. r0 + rows - 1 (one piece of the head), and with_loss their losses. */
static void head_piece_forward(const GPT *m, Activations *a, int r0, int rows, int with_loss) {
    int C = m->cfg.dmodel, Vh = vocab_rows_held(&m->cfg);
    gpt_linear_forward(m, a->logits, a->lnf + (size_t)r0 * C, m->w.lm_head, NULL, rows, C, Vh);
    a->logits_row0 = r0;
    if (with_loss) head_loss(m, a, r0, rows);
}

void gpt_head_forward(const GPT *m, Activations *a, const float *input, int with_loss, int B, int T) {
    int C = m->cfg.dmodel, N = B * T;
    if (!m->w.lm_head)
        fatal(EXIT_RUNTIME, "model: the head's weights (wte, tied) are not bound on this rank");
    ops()->layernorm_forward(a->lnf, a->lnf_mean, a->lnf_rstd, input, m->w.lnfw, m->w.lnfb, N, C);
    for (int r0 = 0; r0 < N; r0 += a->head_rows) /* one piece: every token, unless --loss-chunks */
        head_piece_forward(m, a, r0, N - r0 < a->head_rows ? N - r0 : a->head_rows, with_loss);
}

void gpt_logits_row(const GPT *m, Activations *a, int row, float *host) {
    int Vh = vocab_rows_held(&m->cfg), local = row - a->logits_row0;
    if (local < 0 || local >= a->head_rows) { /* --loss-chunks: its piece again, from lnf, up to it */
        int r0 = row / a->head_rows * a->head_rows;
        head_piece_forward(m, a, r0, row - r0 + 1, 0);
        local = row - r0;
    }
    const float *mine = a->logits + (size_t)local * Vh;
    if (!m->vocab) {
        copy_to_host(host, mine, (size_t)Vh * sizeof(float));
        return;
    }
    /* the slices, in rank order, are the row: gathered into the probabilities'
     * buffer, which a forward without the loss leaves free */
    size_t whole = (size_t)Vh * m->vocab->parts;
    if (whole > (size_t)a->head_rows * Vh)
        fatal(EXIT_RUNTIME, "a row of %zu logits does not fit the head's buffer of %d x %d", whole, a->head_rows,
              Vh);
    m->vocab->allgather(mine, a->probs, Vh, m->vocab->context);
    copy_to_host(host, a->probs, whole * sizeof(float));
}

float *gpt_layer_output(const GPT *m, Activations *a, int layer) {
    (void)m;
    return layer < 0 ? a->encoded : a->block[layer].res3;
}

/* ---- backward ---- */

/* dlogits(rows, Vh) = the gradient of the losses of tokens r0 .. r0 + rows - 1
 * from their probabilities in a->probs. */
static void head_dlogits(const GPT *m, Activations *a, float *dlogits, float dloss, int r0, int rows) {
    int Vh = vocab_rows_held(&m->cfg);
    ops()->fill_zero(dlogits, (size_t)rows * Vh);
    if (m->vocab)
        ops()->crossentropy_backward_rows(dlogits, a->probs, a->targets + r0, dloss, rows, Vh,
                                          m->vocab->first_row);
    else
        ops()->crossentropy_backward(dlogits, a->probs, a->targets + r0, dloss, rows, Vh);
}

/* The head's backward; with kept_dlogits (B of a split backward) the LM
 * head's weight gradient is left for W and its output gradient kept there. */
static void head_backward(const GPT *m, Activations *a, Scratch *s, const float *input, float *dinput,
                          float dloss, float *kept_dlogits, int B, int T) {
    const KernelOps *k = ops();
    int C = m->cfg.dmodel, Vh = vocab_rows_held(&m->cfg), N = B * T;
    k->fill_zero(s->dln, (size_t)N * C);
    if (N <= a->head_rows) { /* one piece: the forward's probabilities are at hand */
        float *dlogits = kept_dlogits ? kept_dlogits : s->dlogits;
        head_dlogits(m, a, dlogits, dloss, 0, N);
        linear_backward_or_input(m, kept_dlogits != NULL, s->dln, m->g.lm_head, NULL, dlogits, a->lnf,
                                 m->w.lm_head, N, C, Vh);
    } else { /* --loss-chunks: each piece's logits again, its gradient, its share of the weight's */
        for (int r0 = 0; r0 < N; r0 += a->head_rows) {
            int rows = N - r0 < a->head_rows ? N - r0 : a->head_rows;
            head_piece_forward(m, a, r0, rows, 1);
            head_dlogits(m, a, s->dlogits, dloss, r0, rows);
            gpt_linear_backward(m, s->dln + (size_t)r0 * C, m->g.lm_head, NULL, s->dlogits,
                                a->lnf + (size_t)r0 * C, m->w.lm_head, rows, C, Vh);
        }
    }
    /* a vocabulary split: each rank's slice gave a share of the input's gradient */
    if (m->vocab) m->vocab->allreduce_sum(s->dln, (size_t)N * C, m->vocab->context);
    k->fill_zero(dinput, (size_t)N * C);
    k->layernorm_backward(dinput, m->g.lnfw, m->g.lnfb, s->dln, input, m->w.lnfw, a->lnf_mean, a->lnf_rstd, N,
                          C);
}

void gpt_head_backward(const GPT *m, Activations *a, Scratch *s, const float *input, float *dinput,
                       float dloss, int B, int T) {
    head_backward(m, a, s, input, dinput, dloss, NULL, B, T);
}

/* Block l's backward; with kept (B of a split backward) the linear layers'
 * weight gradients are left for W, and their output gradients are computed
 * straight into kept (doutput copied there) instead of the scratch. */
static void block_backward(const GPT *m, Activations *a, Scratch *s, int l, const float *input,
                           const float *doutput, float *dinput, BlockKeptGrads *kept, int B, int T) {
    const KernelOps *k = ops();
    int C = m->cfg.dmodel, NH = m->cfg.heads, N = B * T, split = kept != NULL;
    size_t NC = (size_t)N * C;
    float **w = m->w.block[l], **g = m->g.block[l];
    float *dmid = split ? kept->dmid : s->dmid, *dfch = split ? kept->dfch : s->dfch;
    float *dqkv = split ? kept->dqkv : s->dqkv;
    BlockActs *b = block_values(a, s, l);
    /* Recompute: the forward values of this block, again, from its kept input. */
    if (a->recompute) block_forward_values(m, b, s, l, input, B, T);
    if (split) copy_on_device(kept->dout, doutput, NC * sizeof(float)); /* fcproj's, for W */
    /* MLP half. res3 = res2 + branch: the residual passes doutput to both,
     * so the branch reads doutput itself and dmid starts as a copy of it (the
     * copies residual_backward would make into zeroed buffers, without the
     * zeroing and the second copy). */
    copy_on_device(dmid, doutput, NC * sizeof(float));
    if (moe_layer(&m->cfg, l)) { /* split: the experts' and the router's weights too, here in B */
        k->fill_zero(s->dln, NC);
        gpt_moe_backward(m, a, s, l, b->ln2, doutput, s->dln, B, T);
    } else {
        if (!split) /* recomputed: cheaper than keeping it per block */
            k->gelu_forward(s->gelu, b->fch, 4 * NC);
        k->fill_zero(s->dfch_gelu, 4 * NC);
        linear_backward_or_input(m, split, s->dfch_gelu, g[BLOCK_FCPROJW], g[BLOCK_FCPROJB], doutput,
                                 s->gelu, w[BLOCK_FCPROJW], N, 4 * C, C);
        k->fill_zero(dfch, 4 * NC);
        k->gelu_backward(dfch, b->fch, s->dfch_gelu, 4 * NC);
        k->fill_zero(s->dln, NC);
        linear_backward_or_input(m, split, s->dln, g[BLOCK_FCW], g[BLOCK_FCB], dfch, b->ln2, w[BLOCK_FCW], N,
                                 C, 4 * C);
    }
    k->layernorm_backward(dmid, g[BLOCK_LN2W], g[BLOCK_LN2B], s->dln, b->res2, w[BLOCK_LN2W], b->ln2_mean,
                          b->ln2_rstd, N, C);
    /* Attention half. res2 = input + branch: the same again with dmid. */
    copy_on_device(dinput, dmid, NC * sizeof(float));
    k->fill_zero(s->datty, NC);
    linear_backward_or_input(m, split, s->datty, g[BLOCK_ATTPROJW], g[BLOCK_ATTPROJB], dmid, b->atty,
                             w[BLOCK_ATTPROJW], N, C, C);
    k->fill_zero(dqkv, 3 * NC);
    if (m->sequence)
        m->sequence->attention_backward(dqkv, s->datty, b->qkv, b->atty, b->lse, B, T, C, NH,
                                        m->sequence->context);
    else
        k->attention_backward(dqkv, s->datty, b->qkv, b->atty, b->lse, B, T, C, NH);
    k->fill_zero(s->dln, NC);
    linear_backward_or_input(m, split, s->dln, g[BLOCK_QKVW], g[BLOCK_QKVB], dqkv, b->ln1, w[BLOCK_QKVW], N,
                             C, 3 * C);
    k->layernorm_backward(dinput, g[BLOCK_LN1W], g[BLOCK_LN1B], s->dln, input, w[BLOCK_LN1W], b->ln1_mean,
                          b->ln1_rstd, N, C);
}

void gpt_block_backward(const GPT *m, Activations *a, Scratch *s, int l, const float *input,
                        const float *doutput, float *dinput, int B, int T) {
    block_backward(m, a, s, l, input, doutput, dinput, NULL, B, T);
}

/* W of block l: the four weight gradients block_backward left, from the
 * forward's values (GELU(fch) recomputed, as the whole backward does; with
 * recompute all of them, from the block's input) and the output gradients
 * B kept. */
static void block_backward_weight(const GPT *m, Activations *a, Scratch *s, int l, const float *input,
                                  const BlockKeptGrads *kept, int B, int T) {
    int C = m->cfg.dmodel, N = B * T;
    float **g = m->g.block[l];
    BlockActs *b = block_values(a, s, l);
    if (a->recompute) block_forward_values(m, b, s, l, input, B, T);
    if (!moe_layer(&m->cfg, l)) { /* an MoE block's MLP weights had theirs in B (block_backward) */
        ops()->gelu_forward(s->gelu, b->fch, (size_t)N * 4 * C);
        gpt_linear_backward_weight(m, g[BLOCK_FCPROJW], g[BLOCK_FCPROJB], kept->dout, s->gelu, N, 4 * C, C);
        gpt_linear_backward_weight(m, g[BLOCK_FCW], g[BLOCK_FCB], kept->dfch, b->ln2, N, C, 4 * C);
    }
    gpt_linear_backward_weight(m, g[BLOCK_ATTPROJW], g[BLOCK_ATTPROJB], kept->dmid, b->atty, N, C, C);
    gpt_linear_backward_weight(m, g[BLOCK_QKVW], g[BLOCK_QKVB], kept->dqkv, b->ln1, N, C, 3 * C);
}

void gpt_embedding_backward(const GPT *m, Activations *a, const float *dencoded, int B, int T) {
    const SequenceSplit *seq = m->sequence;
    const VocabSplit *vs = m->vocab;
    int C = m->cfg.dmodel, first = vs ? vs->first_row : 0, rows = vocab_rows_held(&m->cfg);
    if (seq)
        seq->embedding_backward(m->g.wte, m->g.wpe, dencoded, a->tokens, B, T, C, first, rows, seq->context);
    else if (vs) /* the rows this rank holds; wpe's whole gradient, as every rank */
        ops()->embedding_backward_rows(m->g.wte, m->g.wpe, dencoded, a->tokens, B, T, C, first, rows);
    else
        ops()->embedding_backward(m->g.wte, m->g.wpe, dencoded, a->tokens, B, T, C, m->cfg.vocab);
}

/* ---- a range of units ---- */

static void check_range(const GPT *m, int first, int last) {
    if (first < LAYER_EMBEDDING || last > m->cfg.layers || first > last)
        fatal(EXIT_RUNTIME, "units %d..%d are not a range of this model's (valid: %d..%d)", first, last,
              LAYER_EMBEDDING, m->cfg.layers);
}

/* The input of unit l (a block or the head) in a range starting at `first`:
 * the range's first block reads `encoded` (the embedding's output, or what
 * arrived from the previous stage), the others the previous block's output. */
static const float *unit_input(const GPT *m, Activations *a, int first, int l) {
    return l == first ? a->encoded : gpt_layer_output(m, a, l - 1);
}

/* With a CheckpointStore: before block l's forward, the buffer its output
 * goes to; after it, the output is written. */
static void place_output(Activations *a, int l, int L) {
    if (a->store && l >= 0 && l < L) a->block[l].res3 = a->store->place(a->store_slot, l, a->store->context);
}
static void output_written(Activations *a, int l, int L, int B, int T, int C) {
    if (a->store && l >= 0 && l < L)
        a->store->written(a->store_slot, l, (size_t)B * T * C, a->store->context);
}
/* Before unit l's backward (or W): its input, block l-1's output, on the
 * device again (the range's first unit reads `encoded`, which stays). */
static void fetch_input(Activations *a, int first, int l, int B, int T, int C) {
    if (a->store && l != first && l - 1 >= 0)
        a->block[l - 1].res3 = a->store->fetch(a->store_slot, l - 1, (size_t)B * T * C, a->store->context);
}

void gpt_forward_range(const GPT *m, Activations *a, Scratch *s, int first, int last, int with_loss,
                       const UnitHooks *hooks, int B, int T) {
    const UnitHooks none = {0}, *h = hooks ? hooks : &none, *st = m->storage ? m->storage : &none;
    check_range(m, first, last);
    check_shape(a, B, T);
    work_begin("fwd", -1, 0); /* a dry run counts the work (work_ledger.h) */
    for (int l = first; l <= last; l++) {
        if (st->before_forward) st->before_forward(l, st->context);
        if (h->before_forward) h->before_forward(l, h->context);
        place_output(a, l, m->cfg.layers);
        if (l == LAYER_EMBEDDING)
            gpt_embedding_forward(m, a, B, T);
        else if (l == m->cfg.layers)
            gpt_head_forward(m, a, unit_input(m, a, first, l), with_loss, B, T);
        else if (h->block_forward)
            h->block_forward(l, unit_input(m, a, first, l), B, T, h->context);
        else
            gpt_block_forward(m, a, s, l, unit_input(m, a, first, l), B, T);
        output_written(a, l, m->cfg.layers, B, T, m->cfg.dmodel);
        if (h->after_forward) h->after_forward(l, h->context);
        if (st->after_forward) st->after_forward(l, st->context);
    }
    work_end();
}

/* gpt_backward_range, or with kept its B half (gpt_backward_input_range). */
static const float *backward_range(const GPT *m, Activations *a, Scratch *s, KeptGrads *kept, int first,
                                   int last, float dloss, const float *doutput, float *dinput,
                                   const UnitHooks *hooks, int B, int T) {
    const UnitHooks none = {0}, *h = hooks ? hooks : &none, *st = m->storage ? m->storage : &none;
    check_range(m, first, last);
    /* dout: the gradient of unit l's output; each unit leaves its input's in
     * din: the other of the scratch's two buffers, or dinput for the range's
     * first unit */
    const float *dout = doutput;
    a->moe.dloss = dloss; /* the MoE blocks' balancing loss is scaled as the token losses are */
    for (int l = last; l >= first; l--) {
        if (st->before_backward) st->before_backward(l, st->context);
        if (h->before_backward) h->before_backward(l, h->context);
        if (l == LAYER_EMBEDDING) {
            gpt_embedding_backward(m, a, dout, B, T);
        } else {
            float *din = l == first && dinput ? dinput : dout == s->dresid[0] ? s->dresid[1] : s->dresid[0];
            fetch_input(a, first, l, B, T, m->cfg.dmodel);
            const float *input = unit_input(m, a, first, l);
            if (l == m->cfg.layers)
                head_backward(m, a, s, input, din, dloss, kept ? kept->dlogits : NULL, B, T);
            else if (h->block_backward)
                h->block_backward(l, input, dout, din, B, T, h->context);
            else
                block_backward(m, a, s, l, input, dout, din, kept ? &kept->block[l] : NULL, B, T);
            dout = din;
        }
        /* the storage's call first, so that the caller's sees the unit's final
         * gradients (under mixed precision: added into the 16-bit storage) */
        if (st->after_backward) st->after_backward(l, st->context);
        if (h->after_backward) h->after_backward(l, h->context);
    }
    return dout;
}

const float *gpt_backward_range(const GPT *m, Activations *a, Scratch *s, int first, int last, float dloss,
                                const float *doutput, float *dinput, const UnitHooks *hooks, int B, int T) {
    work_begin("bwd", -1, 0);
    const float *dinput_made = backward_range(m, a, s, NULL, first, last, dloss, doutput, dinput, hooks, B, T);
    work_end();
    return dinput_made;
}

/* ---- the backward in two halves ---- */

/* Carve (or, with base NULL, count) the kept gradients of units first..last. */
static void carve_kept(KeptGrads *kg, const ModelConfig *c, int B, int T, int first, int last, Carver *k) {
    size_t BT = (size_t)B * T, C = c->dmodel;
    for (int l = first < 0 ? 0 : first; l <= last && l < c->layers; l++) {
        BlockKeptGrads *b = &kg->block[l];
        b->dout = carve(k, BT * C);
        b->dfch = carve(k, BT * 4 * C);
        b->dmid = carve(k, BT * C);
        b->dqkv = carve(k, BT * 3 * C);
    }
    if (last == c->layers && c->loss_chunks <= 1) kg->dlogits = carve(k, BT * vocab_rows_held(c));
}

size_t kept_grads_bytes(const ModelConfig *c, int B, int T, int first_unit, int last_unit) {
    KeptGrads kg = {.block = xcalloc(c->layers, sizeof(BlockKeptGrads))};
    Carver count = {NULL, 0};
    carve_kept(&kg, c, B, T, first_unit, last_unit, &count);
    free(kg.block);
    return count.used * sizeof(float);
}

void kept_grads_create_range(KeptGrads *kg, const ModelConfig *c, int B, int T, int first_unit,
                             int last_unit) {
    *kg = (KeptGrads){.B = B, .T = T, .block = xcalloc(c->layers, sizeof(BlockKeptGrads))};
    size_t bytes = kept_grads_bytes(c, B, T, first_unit, last_unit);
    kg->storage =
        bytes ? mem_alloc(SPACE_DEVICE, CAT_ACTIVATIONS, bytes, "output gradients kept for W") : NULL;
    Carver k = {kg->storage, 0};
    carve_kept(kg, c, B, T, first_unit, last_unit, &k);
    check_carved(&k, bytes, "output gradients kept for W");
}

void kept_grads_destroy(KeptGrads *kg) {
    mem_free(kg->storage);
    free(kg->block);
    memset(kg, 0, sizeof *kg);
}

/* What the split backward cannot do (yet): model.h says why. */
static void check_split(const KeptGrads *kept, const UnitHooks *hooks, int B, int T) {
    if (hooks && (hooks->before_backward || hooks->after_backward))
        fatal(EXIT_USAGE, "the backward split into B and W takes no calls around a unit's backward (its "
                          "gradients are final only after W)");
    if (B > kept->B || T > kept->T)
        fatal(EXIT_RUNTIME, "a backward of %d x %d tokens exceeds the kept gradients' capacity %d x %d", B, T,
              kept->B, kept->T);
}

const float *gpt_backward_input_range(const GPT *m, Activations *a, Scratch *s, KeptGrads *kept, int first,
                                      int last, float dloss, const float *doutput, float *dinput,
                                      const UnitHooks *hooks, int B, int T) {
    check_split(kept, hooks, B, T);
    work_begin("bwd_input", -1, 0);
    const float *dinput_made = backward_range(m, a, s, kept, first, last, dloss, doutput, dinput, hooks, B, T);
    work_end();
    return dinput_made;
}

void gpt_backward_weight_range(const GPT *m, Activations *a, Scratch *s, const KeptGrads *kept, int first,
                               int last, const UnitHooks *hooks, int B, int T) {
    const UnitHooks none = {0}, *h = hooks ? hooks : &none, *st = m->storage ? m->storage : &none;
    check_split(kept, hooks, B, T);
    check_range(m, first, last);
    int C = m->cfg.dmodel, V = vocab_rows_held(&m->cfg), N = B * T;
    work_begin("bwd_weight", -1, 0);
    for (int l = last; l >= first && l >= 0; l--) { /* the embedding's gradient came out of B */
        if (st->before_backward) st->before_backward(l, st->context);
        fetch_input(a, first, l, B, T, C);
        if (l == m->cfg.layers) {
            if (kept->dlogits) /* else (--loss-chunks) B made it, piece by piece */
                gpt_linear_backward_weight(m, m->g.lm_head, NULL, kept->dlogits, a->lnf, N, C, V);
        }
        else if (h->block_backward_weight)
            h->block_backward_weight(l, unit_input(m, a, first, l), B, T, h->context);
        else
            block_backward_weight(m, a, s, l, unit_input(m, a, first, l), &kept->block[l], B, T);
        if (st->after_backward) st->after_backward(l, st->context);
    }
    work_end();
}

/* ---- the whole model ---- */

void gpt_forward(const GPT *m, Activations *a, Scratch *s, int B, int T) {
    gpt_forward_range(m, a, s, LAYER_EMBEDDING, m->cfg.layers, 1, NULL, B, T);
}

void gpt_backward_hooked(const GPT *m, Activations *a, Scratch *s, float dloss, int B, int T,
                         UnitHook unit_done, void *context) {
    UnitHooks hooks = {.after_backward = unit_done, .context = context};
    gpt_backward_range(m, a, s, LAYER_EMBEDDING, m->cfg.layers, dloss, NULL, NULL, &hooks, B, T);
}

void gpt_backward(const GPT *m, Activations *a, Scratch *s, float dloss, int B, int T) {
    gpt_backward_range(m, a, s, LAYER_EMBEDDING, m->cfg.layers, dloss, NULL, NULL, NULL, B, T);
}

double gpt_loss_sum(const Activations *a, int B, int T) {
    size_t n = (size_t)B * T;
    float *host = xmalloc(n * sizeof(float));
    copy_to_host(host, a->losses, n * sizeof(float));
    double sum = 0.0;
    for (size_t i = 0; i < n; i++) sum += host[i];
    free(host);
    return sum;
}
