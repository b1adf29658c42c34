/* pipeline.c: see pipeline.h. */
#include "04_pipeline/pipeline.h" /* 04: a pipeline stage and its interpreter */

#include "common/device/device.h" /* mem_alloc, copies, streams, timers */
#include "common/run/evaluate.h" /* validation loss and sampling */
#include "common/kernels/kernels.h" /* ops(): the kernel table */
#include "common/model/layer_split.h" /* which blocks each stage runs */
#include "common/comm/optimizer_agree.h" /* grad_norm_agree across ranks */
#include "03_model_parallel/sequence_parallel.h" /* 03: sequence parallelism (--sp) */
#include "03_model_parallel/ulysses.h" /* 03: Ulysses (--cp-mode ulysses) */
#include "common/core/util.h" /* fatal, log_info, exit codes, flag parsing */
#include "common/kernels/work_ledger.h" /* a dry run's counted work */

#include <stdlib.h>
#include <string.h>

static size_t boundary_floats(const Pipeline *p) {
    return (size_t)p->layout.B * p->layout.T * p->model.cfg.dmodel;
}

/* The chunks of layers this stage holds: 1 unless pipeline_layout_chunks gave it more. */
static int chunks_of(const StageLayout *l) {
    return l->chunks > 1 ? l->chunks : 1;
}
/* Blocks and units of chunk c (with one chunk, the stage's range). */
static void chunk_range(const StageLayout *l, int c, int *first_block, int *last_block, int *first_unit,
                        int *last_unit) {
    if (chunks_of(l) == 1) {
        *first_block = l->first_block, *last_block = l->last_block;
        *first_unit = l->first_unit, *last_unit = l->last_unit;
    } else {
        *first_block = l->chunk_first_block[c], *last_block = l->chunk_last_block[c];
        *first_unit = l->chunk_first_unit[c], *last_unit = l->chunk_last_unit[c];
    }
}

/* The slot of micro-batch `micro` on chunk `chunk`: chunk c has chunk_slots[c] of them. */
static Activations *slot_of(Pipeline *p, int micro, int chunk) {
    return &p->slot[p->chunk_slot0[chunk] + micro % p->chunk_slots[chunk]];
}
/* The chunk whose slots include slot i. */
static int chunk_of_slot(const Pipeline *p, int i) {
    int c = 0;
    while (c + 1 < chunks_of(&p->layout) && p->chunk_slot0[c + 1] <= i) c++;
    return c;
}
static float *stage_output(Pipeline *p, Activations *a, int chunk) {
    int first_block, last_block, first_unit, last_unit;
    chunk_range(&p->layout, chunk, &first_block, &last_block, &first_unit, &last_unit);
    return gpt_layer_output(&p->model, a, last_block);
}

/* The rank of the pp group that holds the piece of the model after chunk
 * `chunk` of this stage (activations go there), or the piece before it
 * (gradients go there); -1 past the ends of the model. */
static int next_rank(const StageLayout *l, int chunk) {
    return layer_split_next((StageChunk){l->stage, chunk}, l->stages, chunks_of(l)).stage;
}
static int prev_rank(const StageLayout *l, int chunk) {
    return layer_split_prev((StageChunk){l->stage, chunk}, l->stages, chunks_of(l)).stage;
}

void pipeline_layout_chunks(StageLayout *l, const int *blocks, int chunks, int layers) {
    if (chunks < 1 || chunks > MAX_STAGE_CHUNKS)
        fatal(EXIT_USAGE, "%d chunks of layers per stage (valid: 1..%d)", chunks, MAX_STAGE_CHUNKS);
    l->chunks = chunks;
    int pieces = l->stages * chunks;
    for (int c = 0; c < chunks; c++) {
        StageChunk at = {l->stage, c};
        layer_split_chunk_range(blocks, l->stages, at, &l->chunk_first_block[c], &l->chunk_last_block[c]);
        layer_split_units(l->chunk_first_block[c], l->chunk_last_block[c], layer_split_piece(at, l->stages),
                          pieces, layers, &l->chunk_first_unit[c], &l->chunk_last_unit[c]);
    }
    /* the stage's span, first chunk to last (not all of it is the stage's) */
    l->first_block = l->chunk_first_block[0], l->last_block = l->chunk_last_block[chunks - 1];
    l->first_unit = l->chunk_first_unit[0], l->last_unit = l->chunk_last_unit[chunks - 1];
}

/* Whether this stage holds a copy of the embedding unit for its tied head:
 * the head is here and the embedding on the first stage (pipeline.h). A
 * caller that owns the storage keeps what its head reads itself. */
static int holds_tied_copy(const StageLayout *l) {
    return l->cfg->model.tied && l->last_unit == l->cfg->model.layers && l->first_unit > LAYER_EMBEDDING &&
           !l->caller_storage;
}

/* A stage of several chunks: its units one chunk after another in one
 * buffer, each unit's views bound where it lies, with the whole model's
 * initial values of those elements (pipeline.h); in 16 bits the mixed
 * model holds them in the same order (mixed_create_chunks). A stage of one
 * chunk that holds the tied copy is built here too: its units, then the
 * embedding unit (a run of its own, with the first stage's initial values). */
static void create_chunked_model(Pipeline *p, const ModelConfig *m, uint64_t seed) {
    const StageLayout *l = &p->layout;
    ParamTable table;
    param_table_build(&table, m);
    gpt_init(&p->model, table);
    GPT *model = &p->model;
    int runs = chunks_of(l), tied_copy = holds_tied_copy(l);
    int first_units[MAX_STAGE_CHUNKS + 1], last_units[MAX_STAGE_CHUNKS + 1];
    for (int c = 0; c < runs; c++) {
        int first_block, last_block;
        chunk_range(l, c, &first_block, &last_block, &first_units[c], &last_units[c]);
    }
    if (tied_copy) first_units[runs] = last_units[runs] = LAYER_EMBEDDING, runs++;
    size_t total = 0;
    for (int c = 0; c < runs; c++)
        for (int u = first_units[c]; u <= last_units[c]; u++) total += table_unit(&model->table, u)->numel;
    float *host = xmalloc(total * sizeof(float));
    p->unit_at = xmalloc((m->layers + 2) * sizeof(size_t)); /* for the checkpoint's layout */
    for (int u = LAYER_EMBEDDING; u <= m->layers; u++) p->unit_at[u + 1] = SIZE_MAX;
    size_t at = 0;
    for (int c = 0; c < runs; c++)
        for (int u = first_units[c]; u <= last_units[c]; u++) {
            const ParamUnit *unit = table_unit(&model->table, u);
            param_init_range(&model->table, seed, host + at, unit->offset, unit->numel);
            p->unit_at[u + 1] = at;
            at += unit->numel;
        }
    if (tied_copy) {
        p->tied_copy_count = table_unit(&model->table, LAYER_EMBEDDING)->numel;
        p->tied_copy_at = total - p->tied_copy_count;
        p->own_span = (GradSpan){0, p->tied_copy_at, 0};
    }
    if (l->cfg->precision != PRECISION_FP32) {
        mixed_create_chunks(&p->mixed, model, first_units, last_units, runs, host, /* the copy's run too */
                            precision_format(l->cfg->precision));
        model->unit_at = p->unit_at; /* the master weights are held in the same order */
        free(host);
        return;
    }
    model->params = mem_alloc(SPACE_DEVICE, CAT_PARAMS, total * sizeof(float), "parameters");
    model->grads = mem_alloc(SPACE_DEVICE, CAT_GRADS, total * sizeof(float), "gradients");
    model->owns_storage = 1;
    at = 0;
    for (int c = 0; c < runs; c++)
        for (int u = first_units[c]; u <= last_units[c]; u++) {
            gpt_bind_unit(model, u, model->params + at, model->grads + at);
            at += table_unit(&model->table, u)->numel;
        }
    copy_to_device(model->params, host, total * sizeof(float));
    free(host);
    model->first_unit = l->first_unit;
    model->last_unit = l->last_unit;
    model->param_first = table_unit(&model->table, l->first_unit)->offset;
    model->param_count = total;
    model->unit_at = p->unit_at;
}

/* The most micro-batches chunk c holds at once, from the schedule's actions on it. */
static int chunk_live_activations(const StageSchedule *s, int chunk) {
    StageSchedule mine = {0};
    mine.actions = xcalloc(s->count ? s->count : 1, sizeof(Action));
    for (int i = 0; i < s->count; i++)
        if (s->actions[i].chunk == chunk) mine.actions[mine.count++] = s->actions[i];
    int live = schedule_live_activations(&mine);
    free(mine.actions);
    return live;
}

void pipeline_create(Pipeline *p, const StageLayout *layout, StageSchedule *schedule, uint64_t seed) {
    *p = (Pipeline){.layout = *layout, .schedule = *schedule, .last_backward_action = -1};
    *schedule = (StageSchedule){0};
    for (int c = 0; c < MAX_STAGE_CHUNKS; c++) p->chunk_last_backward[c] = -1;
    int extras = 0;
    for (int i = 0; i < p->schedule.count; i++) {
        const Action *a = &p->schedule.actions[i];
        if (a->chunk < 0 || a->chunk >= chunks_of(layout))
            fatal(EXIT_USAGE,
                  "stage %d's schedule has an action on chunk %d, but the stage holds %d chunk(s) of layers",
                  layout->stage, a->chunk, chunks_of(layout));
        if (a->kind == OP_BACKWARD || a->kind == OP_BACKWARD_WEIGHT)
            p->last_backward_action = p->chunk_last_backward[a->chunk] = i;
        if (a->kind == OP_BACKWARD_INPUT) p->split_backward = 1;
        if (a->kind == OP_POST_ACT || a->kind == OP_POST_GRAD || a->kind == OP_BACKWARD_INPUT) extras = 1;
    }
    StageLayout *l = &p->layout;
    /* --ep: of each MoE block its experts only (model_config.h) */
    ModelConfig held = moe_part_config(&l->cfg->model, l->expert_parts, l->expert_part);
    const ModelConfig *m = &held;
    int V = chunks_of(l);
    if (l->cp) { /* the ring or Ulysses over whole sequences; from here on the stage computes T/N positions */
        context_parallel_create(&p->context, l->cp, m, l->B, l->T, strcmp(l->cp_order, "zigzag") == 0,
                                l->tensor ? l->tensor->size : 1, l->cp_send, strcmp(l->cp_mode, "ring") == 0);
        if (strcmp(l->cp_mode, "ulysses") == 0) /* attention on a head split instead (ulysses.h) */
            ulysses_create(&p->context, m, l->B, l->T, strcmp(l->alltoall, "pairwise") == 0);
        l->T /= p->context.size;
    }
    if (V > 1 && l->caller_storage)
        fatal(EXIT_USAGE, "a stage of %d chunks runs with its own storage only, yet", V);
    if (l->tensor) { /* the stage's slices (of each chunk); model, mixed and scratch are the tp model's */
        int first_units[MAX_STAGE_CHUNKS + 1], last_units[MAX_STAGE_CHUNKS + 1], runs = V;
        for (int c = 0; c < V; c++) {
            int first_block, last_block;
            chunk_range(l, c, &first_block, &last_block, &first_units[c], &last_units[c]);
        }
        if (holds_tied_copy(l))
            first_units[runs] = last_units[runs] = LAYER_EMBEDDING, runs++; /* pipeline.h */
        tp_model_create_chunks(&p->tpm, m, seed, l->tensor, first_units, last_units, runs, l->B, l->T,
                               l->cfg->recompute, l->cfg->precision);
        sequence_parallel_enable(&p->tpm, l->sp); /* before the activations: the blocks' rows */
        if (holds_tied_copy(l)) { /* the norm leaves it out already (tp_grad_shards_once) */
            p->tied_copy_count = table_unit(&p->tpm.model.table, LAYER_EMBEDDING)->numel;
            p->tied_copy_at = p->tpm.held_at[0];
        }
        tp_model_move(&p->tpm, &p->model, &p->mixed);
        p->scratch = p->tpm.scratch;
        p->tensor_hooks = p->split_backward ? tp_split_hooks(&p->tpm) : tp_block_hooks(&p->tpm);
        p->hooks = &p->tensor_hooks;
    } else if (V > 1 || holds_tied_copy(l)) {
        create_chunked_model(p, m, seed);
    } else if (l->caller_storage) {
        ParamTable table;
        param_table_build(&table, m);
        gpt_init(&p->model, table);
        gpt_set_range(&p->model, l->first_unit, l->last_unit);
    } else {
        precision_create_range(&p->model, &p->mixed, m, seed, l->cfg->precision, l->first_unit,
                               l->last_unit); /* fp32 or 16-bit */
    }
    if (l->cp) p->model.sequence = &p->context.split; /* the embedding's positions, ring attention */
    int live_total = 0;
    for (int c = 0; c < V; c++) {
        int live = V == 1 ? schedule_live_activations(&p->schedule) : chunk_live_activations(&p->schedule, c);
        p->chunk_slots[c] = live > 0 ? live : 1;
        p->chunk_slot0[c] = live_total;
        live_total += p->chunk_slots[c];
    }
    p->slots = live_total;
    p->slot = xcalloc(p->slots, sizeof(Activations));
    for (int i = 0; i < p->slots; i++) {
        int first_block, last_block, first_unit, last_unit;
        chunk_range(l, chunk_of_slot(p, i), &first_block, &last_block, &first_unit, &last_unit);
        if (l->tensor && l->sp && i == 0) /* and, once, sequence parallelism's workspace */
            tp_activations_create(&p->tpm, &p->slot[i], l->B, l->T);
        else if (l->tensor) /* the blocks' values in local widths */
            tp_activations_create_range(&p->tpm, &p->slot[i], l->B, l->T, first_unit, last_unit);
        else if (l->checkpoints) /* the blocks' outputs where the caller keeps them */
            activations_create_stored(&p->slot[i], m, l->B, l->T, first_block, last_unit, l->checkpoints, i);
        else
            activations_create_range(&p->slot[i], m, l->B, l->T, first_block, last_unit, l->cfg->recompute);
    }
    /* with --recompute the slots keep block inputs, and one block set here serves them all */
    if (!l->tensor) scratch_create(&p->scratch, m, l->B, l->T, l->cfg->recompute);
    if (extras) {
        p->extras = xcalloc(p->slots, sizeof(SlotExtras));
        for (int i = 0; i < p->slots; i++) {
            int c = chunk_of_slot(p, i), first_block, last_block, first_unit, last_unit;
            chunk_range(l, c, &first_block, &last_block, &first_unit, &last_unit);
            if (p->split_backward && l->tensor) /* the sliced layers' in local widths */
                tp_kept_grads_create(&p->tpm, &p->extras[i].kept, l->B, l->T);
            else if (p->split_backward)
                kept_grads_create_range(&p->extras[i].kept, m, l->B, l->T, first_unit, last_unit);
            if (prev_rank(l, c) >= 0)
                p->extras[i].grad_out =
                    mem_alloc(SPACE_DEVICE, CAT_WORKSPACE, boundary_floats(p) * sizeof(float),
                              "gradient posted to prev stage");
        }
    }
    /* the gradient messages, where there is a neighbour to exchange them with
     * (the last stage's backward starts from the loss, the first's input is tokens) */
    size_t bytes = boundary_floats(p) * sizeof(float);
    if (next_rank(l, 0) >= 0 || next_rank(l, V - 1) >= 0)
        p->grad_in = mem_alloc(SPACE_DEVICE, CAT_WORKSPACE, bytes, "gradient from next stage");
    if (prev_rank(l, 0) >= 0 || prev_rank(l, V - 1) >= 0)
        p->grad_out = mem_alloc(SPACE_DEVICE, CAT_WORKSPACE, bytes, "gradient to prev stage");
    if (m->tied && l->stages > 1 && !l->caller_storage && (l->stage == 0 || l->stage == l->stages - 1)) {
        /* the embedding group (a caller that owns the storage sums the ends' gradients itself) */
        if (!p->tied_copy_count) p->tied_copy_count = table_unit(&p->model.table, LAYER_EMBEDDING)->numel;
        p->tied_grad_in = mem_alloc(SPACE_DEVICE, CAT_WORKSPACE, p->tied_copy_count * sizeof(float),
                                    "tied embedding gradient from the other end");
        if (p->mixed.params) /* 16 bits: it arrives so, and is widened into tied_grad_in */
            p->tied_grad_in16 = mem_alloc(SPACE_DEVICE, CAT_WORKSPACE, p->tied_copy_count * sizeof(uint16_t),
                                          "tied embedding gradient from the other end (16-bit)");
    }
}

/* --tie-embeddings on several stages: the first stage's embedding unit and
 * the last stage's copy exchange their gradients and each adds the other's
 * (an all-reduce over the two ranks, on the pp axis), so both hold the sum
 * of the embedding's and the head's gradient and make the same update. */
static void sum_tied_embedding(Pipeline *p) {
    const StageLayout *l = &p->layout;
    if (!p->tied_grad_in) return;
    int other = l->stage == 0 ? l->stages - 1 : 0;
    size_t first = l->stage == 0 ? 0 : p->tied_copy_at, n = p->tied_copy_count; /* the embedding unit's */
    if (p->mixed.params) { /* 16 bits: the sum rounded, the same on both ends */
        HalfFormat f = p->mixed.format;
        comm_sendrecv_typed(l->pp, p->mixed.grads + first, n, other, p->tied_grad_in16, n, other,
                            f == HALF_BF16 ? COMM_BF16 : COMM_F16, TAG_EXCHANGE);
        ops()->cast_from_half(p->tied_grad_in, p->tied_grad_in16, n, f);
        ops()->accumulate_half(p->mixed.grads + first, p->tied_grad_in, n, f);
        return;
    }
    float *grads = p->model.grads + first;
    comm_sendrecv(l->pp, grads, p->tied_copy_count, other, p->tied_grad_in, p->tied_copy_count, other,
                  TAG_EXCHANGE);
    ops()->residual_forward(grads, grads, p->tied_grad_in, p->tied_copy_count);
}

void pipeline_destroy(Pipeline *p) {
    if (p->model_group) comm_group_free(p->model_group);
    free(p->tensor_group);
    timeline_free(&p->times.timeline);
    mem_free(p->grad_in);
    mem_free(p->grad_out);
    mem_free(p->tied_grad_in);
    mem_free(p->tied_grad_in16);
    for (int i = 0; p->extras && i < p->slots; i++) {
        comm_wait_posted(p->layout.pp, p->extras[i].act_sent);
        comm_wait_posted(p->layout.pp, p->extras[i].grad_sent);
        if (p->split_backward) kept_grads_destroy(&p->extras[i].kept);
        mem_free(p->extras[i].grad_out);
    }
    free(p->extras);
    for (int i = 0; i < p->slots; i++)
        if (p->layout.tensor)
            tp_activations_destroy(&p->tpm, &p->slot[i]);
        else
            activations_destroy(&p->slot[i], &p->layout.cfg->model);
    free(p->slot);
    free(p->unit_at);
    schedule_free(&p->schedule);
    if (p->layout.cp) context_parallel_destroy(&p->context);
    if (p->layout.tensor) {
        tp_model_destroy(&p->tpm); /* model, mixed and scratch with it */
        return;
    }
    scratch_destroy(&p->scratch);
    precision_destroy(&p->model, &p->mixed);
}

/* Where the micro-batch in slot a of chunk `chunk` takes its tokens and
 * targets: the model's first piece reads the tokens, its last the targets,
 * both from (seed, batch, sequence) as every chapter does, so no token ever
 * needs to travel; with --cp the whole sequences, of which stage_forward
 * keeps this rank's positions. NULL, NULL on the pieces between. */
static void stage_tokens(Pipeline *p, Activations *a, int chunk, int **tokens, int **targets) {
    const StageLayout *l = &p->layout;
    *tokens = *targets = NULL;
    if (prev_rank(l, chunk) >= 0 && next_rank(l, chunk) >= 0) return; /* neither end of the model */
    *tokens = l->cp ? p->context.tokens : a->tokens;
    *targets = l->cp ? p->context.targets : a->targets;
}

/* Forward of the micro-batch in slot a (its tokens where stage_tokens said)
 * through chunk `chunk` of this stage's units; returns this rank's share
 * of its token-loss sum. */
static double stage_forward(Pipeline *p, Activations *a, int chunk) {
    const StageLayout *l = &p->layout;
    int first = prev_rank(l, chunk) < 0,
        last = next_rank(l, chunk) < 0; /* the model's first and last pieces */
    int first_block, last_block, first_unit, last_unit;
    chunk_range(l, chunk, &first_block, &last_block, &first_unit, &last_unit);
    if ((first || last) && l->cp) /* this rank's positions of the whole sequences */
        context_parallel_select(&p->context, a->tokens, a->targets, l->B);
    p->tpm.now = a; /* tensor parallel: the blocks' values of this micro-batch */
    gpt_forward_range(&p->model, a, &p->scratch, first_unit, last_unit, 1, p->hooks, l->B, l->T);
    /* every tp rank of the last stage computed the (replicated) loss; tp rank 0 reports it */
    return last && (!l->tensor || l->tensor->rank == 0) ? gpt_loss_sum(a, l->B, l->T) : 0.0;
}

/* Forward of sequences [sequence, sequence + B) of batch `batch` of a split
 * (evaluation's), its loss added into now.loss_sum. */
static void stage_forward_batch(Pipeline *p, Activations *a, int chunk, Split split, int batch,
                                int sequence) {
    int *tokens, *targets;
    stage_tokens(p, a, chunk, &tokens, &targets);
    data_upload_batch(p->layout.data, split, p->layout.cfg->seed, batch, sequence, p->layout.B,
                      p->layout.cfg->model.seq, tokens, targets);
    p->now.loss_sum += stage_forward(p, a, chunk);
}

static SlotExtras *extras_of(Pipeline *p, int micro, int chunk) {
    return &p->extras[p->chunk_slot0[chunk] + micro % p->chunk_slots[chunk]];
}

/* Where micro-batch m's input gradient goes on chunk c: the one boundary
 * buffer, or with posted sends its slot's own, which must first be free of
 * the send it posted for micro-batch m - slots. NULL on the model's first
 * piece. */
static float *grad_out_of(Pipeline *p, int m, int c) {
    if (prev_rank(&p->layout, c) < 0) return NULL;
    if (!p->extras) return p->grad_out;
    SlotExtras *x = extras_of(p, m, c);
    comm_wait_posted(p->layout.pp, x->grad_sent);
    x->grad_sent = NULL;
    return x->grad_out;
}

/* Backward of micro-batch m through chunk c's units, in the reverse order:
 * from grad_in, the gradient from the next piece (the last piece starts
 * from the loss), to grad_out_of(m, c), the gradient of the chunk's input
 * for the previous piece (the first piece ends with the embedding's
 * backward instead). */
static void stage_backward(Pipeline *p, int m, int c) {
    const StageLayout *l = &p->layout;
    int first_block, last_block, first_unit, last_unit;
    chunk_range(l, c, &first_block, &last_block, &first_unit, &last_unit);
    p->tpm.now = slot_of(p, m, c); /* tensor parallel: the blocks' values of micro-batch m */
    gpt_backward_range(&p->model, slot_of(p, m, c), &p->scratch, first_unit, last_unit, p->now.dloss,
                       p->grad_in, grad_out_of(p, m, c), p->hooks, l->B, l->T);
}

/* B of micro-batch m (zb-h1, one chunk): the input gradient into
 * grad_out_of(m), the linear layers' output gradients kept in the slot for
 * W (with tensor parallelism, the sliced blocks' B: tp_split_hooks). The
 * model's storage calls (mixed precision's, or those of a caller that owns
 * the storage: StageLayout.caller_storage) run around each unit's B and
 * again around its W (model.h). */
static void stage_backward_input(Pipeline *p, int m) {
    const StageLayout *l = &p->layout;
    p->tpm.now = slot_of(p, m, 0); /* tensor parallel: the blocks' values and kept gradients of m */
    p->tpm.kept = &extras_of(p, m, 0)->kept;
    gpt_backward_input_range(&p->model, slot_of(p, m, 0), &p->scratch, &extras_of(p, m, 0)->kept,
                             l->first_unit, l->last_unit, p->now.dloss, p->grad_in, grad_out_of(p, m, 0),
                             p->hooks, l->B, l->T);
}

/* W of micro-batch m: its weight gradients, from the slot and what B kept. */
static void stage_backward_weight(Pipeline *p, int m) {
    const StageLayout *l = &p->layout;
    p->tpm.now = slot_of(p, m, 0);
    p->tpm.kept = &extras_of(p, m, 0)->kept;
    gpt_backward_weight_range(&p->model, slot_of(p, m, 0), &p->scratch, &extras_of(p, m, 0)->kept,
                              l->first_unit, l->last_unit, p->hooks, l->B, l->T);
}

/* Before micro-batch m's forward writes its slot on chunk c: the send posted
 * from it for micro-batch m - slots has left (it had arrived long before:
 * that micro-batch's backward needed the gradient that answered it). */
static void settle_slot(Pipeline *p, int m, int c) {
    if (!p->extras) return;
    SlotExtras *x = extras_of(p, m, c);
    comm_wait_posted(p->layout.pp, x->act_sent);
    x->act_sent = NULL;
}

/* Milliseconds since this step started, after the device finished its work. */
static double now_ms(Pipeline *p) {
    device_sync();
    return wall_ms() - p->times.origin_ms;
}

/* A message of a schedule: the actions that move activations or gradients. */
static void run_message(Pipeline *p, const Action *a) {
    size_t n = boundary_floats(p);
    CommGroup *pp = p->layout.pp;
    int prev = prev_rank(&p->layout, a->chunk), next = next_rank(&p->layout, a->chunk);
    switch (a->kind) {
    case OP_FORWARD:
    case OP_BACKWARD:
    case OP_BACKWARD_INPUT:
    case OP_BACKWARD_WEIGHT:
        break; /* the caller's: held_forward, held_backward */
    case OP_RECV_ACT:
        settle_slot(p, a->micro, a->chunk);
        comm_recv(pp, slot_of(p, a->micro, a->chunk)->encoded, n, prev, TAG_ACTIVATIONS);
        break;
    case OP_SEND_ACT:
        comm_send(pp, stage_output(p, slot_of(p, a->micro, a->chunk), a->chunk), n, next, TAG_ACTIVATIONS);
        break;
    case OP_RECV_GRAD:
        comm_recv(pp, p->grad_in, n, next, TAG_GRADIENTS);
        break;
    case OP_SEND_GRAD:
        comm_send(pp, p->grad_out, n, prev, TAG_GRADIENTS);
        break;
    case OP_SEND_ACT_RECV_GRAD:
        comm_sendrecv(pp, stage_output(p, slot_of(p, a->micro, a->chunk), a->chunk), n, next, p->grad_in, n,
                      next, TAG_EXCHANGE);
        break;
    case OP_SEND_GRAD_RECV_ACT:
        comm_sendrecv(pp, p->grad_out, n, prev, slot_of(p, a->micro2, a->chunk)->encoded, n, prev,
                      TAG_EXCHANGE);
        break;
    case OP_POST_ACT:
        extras_of(p, a->micro, a->chunk)->act_sent = comm_post_send(
            pp, stage_output(p, slot_of(p, a->micro, a->chunk), a->chunk), n, next, TAG_ACTIVATIONS);
        break;
    case OP_POST_GRAD:
        extras_of(p, a->micro, a->chunk)->grad_sent =
            comm_post_send(pp, extras_of(p, a->micro, a->chunk)->grad_out, n, prev, TAG_GRADIENTS);
        break;
    }
}

/* Chunk c's last backward of the step has run: its units' gradients are
 * final, the highest first (a tied embedding's only once the two ends have
 * summed it, after the schedule). */
static void chunk_final(Pipeline *p, int c) {
    int first_block, last_block, first_unit, last_unit;
    chunk_range(&p->layout, c, &first_block, &last_block, &first_unit, &last_unit);
    for (int u = last_unit; u >= first_unit; u--)
        if (u != LAYER_EMBEDDING || !p->tied_grad_in) p->unit_final(u, p->unit_final_context);
}

void pipeline_begin_step(Pipeline *p, int step) {
    p->now = (StepState){.step = step};
    StageTimes *t = &p->times;
    t->fwd_ms = t->bwd_ms = t->comm_ms = t->end_ms = 0.0;
    t->origin_ms = wall_ms();
    for (int i = 0; i < p->slots; i++) p->slot[i].moe.stats = (MoeStats){0}; /* --experts: the routing */
}

const Action *pipeline_action_begin(Pipeline *p, int i, HeldModel *held) {
    const Action *a = &p->schedule.actions[i];
    p->now.action = i;
    p->now.start_ms = now_ms(p);
    /* a dry run counts each action's work as one piece: the list as it ran (work_ledger.h) */
    work_begin_action(schedule_op_name(a->kind), a->micro, a->micro2, a->chunk);
    held->tokens = held->targets = NULL;
    if (a->kind == OP_FORWARD) { /* its slot free of what it posted before; the ends read tokens */
        settle_slot(p, a->micro, a->chunk);
        stage_tokens(p, slot_of(p, a->micro, a->chunk), a->chunk, &held->tokens, &held->targets);
    }
    run_message(p, a);
    return a;
}

void pipeline_action_end(Pipeline *p, int i) {
    const Action *a = &p->schedule.actions[i];
    work_end();
    double start = p->now.start_ms, end = now_ms(p);
    StageTimes *t = &p->times;
    if (a->kind == OP_FORWARD)
        t->fwd_ms += end - start;
    else if (schedule_op_backward(a->kind))
        t->bwd_ms += end - start;
    else
        t->comm_ms += end - start;
    t->end_ms = end;
    timeline_add(&t->timeline, p->now.step + 1, a->micro, schedule_op_name(a->kind), start * 1e3, end * 1e3);
    if (i == p->last_backward_action && p->last_backward) p->last_backward(p->last_backward_context);
}

void pipeline_end_step(Pipeline *p) {
    for (int i = 0; p->extras && i < p->slots; i++) { /* every posted send has left before the step ends */
        comm_wait_posted(p->layout.pp, p->extras[i].act_sent);
        comm_wait_posted(p->layout.pp, p->extras[i].grad_sent);
        p->extras[i].act_sent = p->extras[i].grad_sent = NULL;
    }
    sum_tied_embedding(p);
    if (p->unit_final && p->tied_grad_in) p->unit_final(LAYER_EMBEDDING, p->unit_final_context);
    p->moe = (MoeStats){0}; /* --experts: the slots' routing, summed (the run sums the ranks') */
    for (int i = 0; i < p->slots; i++) {
        const MoeStats *s = &p->slot[i].moe.stats;
        for (int e = 0; e < p->model.cfg.moe.experts; e++) p->moe.tokens[e] += s->tokens[e];
        p->moe.dropped += s->dropped;
        p->moe.aux_sum += s->aux_sum;
    }
}

double pipeline_evaluate(Pipeline *p, CommGroup *world, int first_sequence) {
    const StageLayout *l = &p->layout;
    const Config *cfg = l->cfg;
    size_t n = boundary_floats(p);
    int micro_batches = cfg->micro; /* a replica's share, cut as in training */
    double saved_loss = p->now.loss_sum;
    p->now.loss_sum = 0.0;
    for (int e = 0; e < cfg->eval_batches; e++) {
        /* one micro-batch at a time round the pieces: blocking messages cannot deadlock */
        for (int m = 0; m < micro_batches; m++)
            for (int c = 0; c < chunks_of(l); c++) {
                Activations *a = slot_of(p, 0, c);
                int prev = prev_rank(l, c), next = next_rank(l, c);
                if (prev >= 0) comm_recv(l->pp, a->encoded, n, prev, TAG_ACTIVATIONS);
                stage_forward_batch(p, a, c, SPLIT_VAL, e, first_sequence + m * l->B);
                if (next >= 0) comm_send(l->pp, stage_output(p, a, c), n, next, TAG_ACTIVATIONS);
            }
    }
    double total = comm_allreduce_double(world, p->now.loss_sum, 0);
    p->now.loss_sum = saved_loss;
    return total / ((double)cfg->eval_batches * cfg->batch * cfg->model.seq);
}

void pipeline_sample(Pipeline *p, int n, uint64_t *rng) {
    const StageLayout *l = &p->layout;
    int T = l->T, V = vocab_padded(l->cfg->model.vocab), C = l->cfg->model.dmodel; /* V: a row of logits */
    if (chunks_of(l) > 1 || l->cp) { /* every rank alike: the layout is the same everywhere */
        log_info("note: no text sample (--sample) from stages of several chunks or of --cp yet\n");
        return;
    }
    int prev = prev_rank(l, 0), next = next_rank(l, 0);
    Activations *a = slot_of(p, 0, 0);
    int *text = xmalloc(((size_t)32 + n) * sizeof(int)); /* the prompt is at most 32 tokens */
    int prompt_len = sample_prompt(l->data, T, text), rows = sample_rows(l->data, l->cfg->model.vocab);
    int *context = xmalloc(T * sizeof(int));
    float *logits = xmalloc(V * sizeof(float));
    for (int i = 0; i < n; i++) {
        int len = prompt_len + i, ctx = len < T ? len : T; /* the model sees the last (at most T) tokens */
        for (int t = 0; t < ctx; t++) context[t] = text[len - ctx + t];
        if (prev < 0) copy_to_device(a->tokens, context, ctx * sizeof(int));
        if (prev >= 0) comm_recv(l->pp, a->encoded, (size_t)ctx * C, prev, TAG_ACTIVATIONS);
        p->tpm.now = a; /* tensor parallel: the blocks' values */
        gpt_forward_range(&p->model, a, &p->scratch, l->first_unit, l->last_unit, 0, p->hooks, 1, ctx);
        int byte = 0;
        if (next >= 0) {
            comm_send(l->pp, stage_output(p, a, 0), (size_t)ctx * C, next, TAG_ACTIVATIONS);
        } else {
            gpt_logits_row(&p->model, a, ctx - 1, logits); /* --tp: gathered from the tp ranks */
            byte = sample_token(logits, rows, rng);
        }
        text[len] = (int)comm_allreduce_double(l->pp, byte, 0); /* from the last stage */
    }
    if (comm_rank(comm_world()) == 0) sample_print(l->data, text, prompt_len, n);
    free(text);
    free(context);
    free(logits);
}

void pipeline_log_stages(const int *blocks, int P, int V) {
    for (int s = 0, first = 0; s < P * V; s++) {
        if (V > 1)
            log_info("stage %d chunk %d: blocks %d..%d%s%s\n", s % P, s / P, first, first + blocks[s] - 1,
                     s == 0 ? " + embedding" : "", s == P * V - 1 ? " + head" : "");
        else
            log_info("stage %d: blocks %d..%d%s%s\n", s, first, first + blocks[s] - 1,
                     s == 0 ? " + embedding" : "", s == P - 1 ? " + head" : "");
        first += blocks[s];
    }
}

/* The bubble of this step: the idle time of the stages while the pipeline
 * ran, measured on each replica's stage 0, averaged over the replicas. */
double pipeline_measure_bubble(const StageTimes *times, const ProcessGrid *grid, CommGroup *world) {
    int P = grid->pp, stage = grid->p;
    double span_ms = comm_allreduce_double(grid->pp_group, times->end_ms, 1);
    double busy_ms = times->fwd_ms + times->bwd_ms;
    double *stage_busy_ms = xcalloc(P, sizeof(double));
    comm_gather_bytes(grid->pp_group, &busy_ms, sizeof busy_ms, stage_busy_ms, 0);
    double bubble = stage == 0 ? bubble_measured(stage_busy_ms, P, span_ms) : 0.0;
    free(stage_busy_ms);
    /* the mean over every replica's stage 0 (each of its tp ranks measured it) */
    return comm_allreduce_double(world, bubble, 0) / (grid->dp * grid->tp);
}

double pipeline_log_layout(const Pipeline *p) {
    const StageLayout *l = &p->layout;
    const Config *cfg = l->cfg;
    const ProcessGrid *grid = p->grid;
    const char *schedule = p->schedule_name;
    int P = grid->pp, V = chunks_of(l), M = cfg->micro, ranks = comm_size(grid->world);
    double bubble_theory = schedule_bubble_formula(schedule, P, V, M, 1, 1, 1); /* zb-h1: F = B = W */
    const char *bubble_rule = strcmp(schedule, "interleaved") == 0 ? "(P-1)/(VM+P-1)"
                              : strcmp(schedule, "zb-h1") == 0     ? "(P-1)/(3M+P-1), F = B = W,"
                                                                   : "(P-1)/(M+P-1)";
    char cp[64] = ""; /* context parallelism inside the stages, where the grid has it */
    if (grid->cp > 1)
        snprintf(cp, sizeof cp, " x %d context-parallel (%s%s)", grid->cp, l->cp_order,
                 strcmp(l->cp_mode, "ulysses") == 0 ? ", ulysses" : "");
    log_info(
        "pipeline: %d ranks = %d stages%s x %d tensor-parallel x %d replicas | schedule %s | bubble formula "
        "%s = %.3f\n",
        ranks, P, cp, grid->tp, grid->dp, schedule, bubble_rule, bubble_theory);
    pipeline_log_stages(p->blocks, P, V);
    return bubble_theory;
}

void pipeline_ckpt_layout_init(CkptLayout *l, const char *program, const ProcessGrid *grid,
                               const char *schedule, const char *more) {
    char cp[32] = "";
    if (grid->cp > 1) snprintf(cp, sizeof cp, " x cp %d", grid->cp);
    ckpt_layout_init(l, "%s: pp %d%s x tp %d x dp %d, %s%s%s", program, grid->pp, cp, grid->tp, grid->dp,
                     schedule, more ? ", " : "", more ? more : "");
}

GradShards pipeline_grad_shards(Pipeline *p, CommGroup *model_group, CommGroup *world) {
    GradShards held = precision_grad_shards(&p->model, &p->mixed); /* this stage's units */
    if (p->own_span.count) held.spans = &p->own_span, held.num_spans = 1; /* not the tied copy */
    held.sum_group = p->layout.pp;                                 /* the stages together hold the model */
    if (p->layout.tensor) held = tp_grad_shards_once(&p->tpm, model_group); /* and their slices */
    held.agree = grad_norm_agree;
    held.agree_group = world;
    return held;
}

void pipeline_finish(Pipeline *p, Run *run, double *bubbles, double bubble_theory, size_t whole_params) {
    timeline_write(&p->times.timeline, run->world, run->cfg->out);
    double bubble = median_after_warmup(bubbles + run->first_step, run->last_step - run->first_step);
    char extra_header[256], extra_values[256];
    snprintf(extra_header, sizeof extra_header, ",schedule,bubble_measured,bubble_theory");
    snprintf(extra_values, sizeof extra_values, ",%s,%.4f,%.4f", p->schedule_name, bubble, bubble_theory);
    run_finish(run, whole_params, extra_header, extra_values,
               "bubble %.3f measured, %.3f formula | CSVs, timeline.csv and trace.json in %s", bubble,
               bubble_theory, run->cfg->out);
}

GridShape pipeline_shape(const PipelineFlags *pipe, const ModelParallelFlags *mp) {
    return (GridShape){.dp = mp->dp, .pp = pipe->pp, .cp = mp->cp, .tp = mp->tp};
}

int pipeline_print_schedules(const PipelineFlags *pipe, int micro, ProcessGrid *grid) {
    if (comm_rank(grid->world) == 0) schedule_print_all(pipe->schedule, pipe->pp, pipe->virtual_chunks, micro);
    grid_destroy(grid);
    comm_finalize();
    return 0;
}

void pipeline_build(Pipeline *p, const Config *cfg, const ModelParallelFlags *mp, const PipelineFlags *pipe,
                    int expert_parts, const ProcessGrid *grid, const Dataset *data, int B,
                    const StageStorage *storage, char *layout, size_t layout_size) {
    int P = pipe->pp, V = pipe->virtual_chunks, blocks[MAX_LAYERS];
    StageLayout l = {.pp = grid->pp_group, .stage = grid->p, .stages = P, .cfg = cfg, .data = data, .B = B};
    if (storage) l.caller_storage = storage->caller_storage, l.checkpoints = storage->checkpoints;
    /* the split: blocks per piece (V > 1: P x V pieces), --split or balanced (layer_split.h) */
    layer_split_stage(&cfg->model, mp->split, P * V, grid->p, blocks, &l.first_block, &l.last_block,
                      &l.first_unit, &l.last_unit);
    if (V > 1) pipeline_layout_chunks(&l, blocks, V, cfg->model.layers); /* chunk c: piece c P + stage */
    StageSchedule schedule;
    schedule_build_chunks(pipe->schedule, P, V, cfg->micro, grid->p, &schedule);
    l.T = cfg->model.seq;
    TensorGroup *tensor = NULL; /* tensor parallelism inside the stage (caller storage: its slices' too) */
    if (grid->tp > 1) {
        tensor = xmalloc(sizeof *tensor);
        *tensor = (TensorGroup){.group = grid->tp_group, .rank = grid->t, .size = grid->tp,
                                .caller_storage = l.caller_storage};
    }
    l.tensor = tensor;
    l.cp = grid->cp > 1 ? grid->cp_group : NULL; /* and context parallelism: each sequence over cp ranks */
    l.cp_order = mp->cp_order, l.cp_send = mp->cp_send, l.sp = mp->sp;
    l.cp_mode = mp->cp_mode, l.alltoall = mp->alltoall; /* ring or Ulysses */
    l.expert_parts = expert_parts, l.expert_part = expert_parts > 1 ? grid->d % expert_parts : 0; /* --ep */
    pipeline_create(p, &l, &schedule, cfg->seed);
    p->tensor_group = tensor;
    p->grid = grid;
    p->model_group = comm_split(grid->world, grid->d * grid->cp + grid->c, comm_rank(grid->world));
    snprintf(p->schedule_name, sizeof p->schedule_name, "%s", pipe->schedule);
    memcpy(p->blocks, blocks, (size_t)P * V * sizeof(int));
    char cp[32] = "";
    if (grid->cp > 1) snprintf(cp, sizeof cp, " x cp %d", grid->cp);
    snprintf(layout, layout_size, "pp %d%s x tp %d, %s", P, cp, grid->tp, pipe->schedule);
}

/* ---- the step's view of the stage (held_model.h) ---- */
static const Action *action_now(const Pipeline *p) {
    return &p->schedule.actions[p->now.action];
}
static double held_stage_forward(void *owner, int B, int T) {
    Pipeline *p = owner;
    (void)B, (void)T; /* the stage's own: layout.B, and layout.T (T/cp with --cp) */
    const Action *a = action_now(p);
    return stage_forward(p, slot_of(p, a->micro, a->chunk), a->chunk);
}
static void held_stage_backward(void *owner, float dloss, int B, int T, UnitHook unit_final, void *context) {
    Pipeline *p = owner;
    (void)B, (void)T;
    const Action *a = action_now(p);
    p->now.dloss = dloss;
    if (unit_final) p->unit_final = unit_final, p->unit_final_context = context; /* the tied one's too */
    if (a->kind == OP_BACKWARD_INPUT)
        stage_backward_input(p, a->micro);
    else if (a->kind == OP_BACKWARD_WEIGHT)
        stage_backward_weight(p, a->micro);
    else
        stage_backward(p, a->micro, a->chunk);
    if (unit_final && p->now.action == p->chunk_last_backward[a->chunk]) chunk_final(p, a->chunk);
}
static GradShards held_stage_grad_shards(void *owner, CommGroup *world) {
    Pipeline *p = owner;
    return pipeline_grad_shards(p, p->model_group, world);
}
static void held_stage_checkpoint_layout(void *owner, AdamW *opt, int dp_index, int dp, CkptLayout *ckpt) {
    Pipeline *p = owner;
    (void)dp_index, (void)dp;
    CommGroup *weights = p->grid->weight_group;
    int replica = comm_rank(weights); /* d x cp + c: the ranks holding the same weights, a share each */
    if (p->layout.tensor)
        tp_checkpoint_layout(&p->tpm, opt, replica, ckpt); /* this stage's slices */
    else
        ckpt_layout_range(ckpt, &p->model, opt, replica, comm_size(weights)); /* its units */
}
static double held_stage_evaluate(void *owner, const Dataset *data, const Config *cfg, int dp_index, int B) {
    Pipeline *p = owner;
    (void)data;
    return pipeline_evaluate(p, p->grid->world, dp_index * B * cfg->micro);
}
static void held_stage_sample(void *owner, const Dataset *data, const Config *cfg, uint64_t *rng) {
    (void)data;
    pipeline_sample(owner, cfg->sample, rng);
}
static const HeldModelOps held_stage_ops = {
    .forward = held_stage_forward,
    .backward = held_stage_backward,
    .grad_shards = held_stage_grad_shards,
    .checkpoint_layout = held_stage_checkpoint_layout,
    .evaluate = held_stage_evaluate,
    .sample = held_stage_sample,
};

void pipeline_held(Pipeline *p, HeldModel *h) {
    *h = (HeldModel){.model = &p->model, .mixed = &p->mixed, .moe = &p->moe, .ops = &held_stage_ops, .owner = p};
}

void pipeline_split_experts(Pipeline *p, ExpertParallel *x, HeldModel *held, DataParallel *replicas,
                            const ExpertParallelFlags *f, const ModelParallelFlags *mp) {
    expert_parallel_split(x, &p->model, p->grid->dp_group, replicas, f, mp->alltoall, p->layout.B, p->slot,
                          p->slots, &p->times.comm_ms);
    if (!x->layer) return;
    x->timeline = &p->times.timeline; /* the ep_* rows beside the stage's actions */
    /* the norm's parts: x's spans (dense, experts), less the tied copy, each counted on one rank */
    size_t own = p->own_span.count ? p->own_span.count : p->model.param_count;
    expert_parallel_answer_held(x, held, own, p->grid->d, p->layout.tensor ? &p->tpm : NULL);
}

