/* pipeline.c: see pipeline.h. */
#include "pipeline.h"

#include "device.h"
#include "evaluate.h"
#include "kernels.h"
#include "layer_split.h"
#include "util.h"

#include <stdlib.h>

static Activations *slot_of(Pipeline *p, int micro) {
    return &p->slot[micro % p->slots];
}
static size_t boundary_floats(const Pipeline *p) {
    return (size_t)p->layout.B * p->layout.T * p->model.cfg.dmodel;
}
static float *stage_output(Pipeline *p, Activations *a) {
    return gpt_layer_output(&p->model, a, p->layout.last_block);
}

/* This pipeline's stages hold one chunk of layers each (layer_split.h); the
 * interleaved schedules will give a stage several, each with its model range
 * and activation slots. */
enum { CHUNKS_PER_STAGE = 1 };

/* The rank of the pp group that holds the piece of the model after chunk
 * `chunk` of this stage (activations go there), or the piece before it
 * (gradients go there); -1 past the ends of the model. */
static int next_rank(const StageLayout *l, int chunk) {
    return layer_split_next((StageChunk){l->stage, chunk}, l->stages, CHUNKS_PER_STAGE).stage;
}
static int prev_rank(const StageLayout *l, int chunk) {
    return layer_split_prev((StageChunk){l->stage, chunk}, l->stages, CHUNKS_PER_STAGE).stage;
}

void pipeline_create(Pipeline *p, const StageLayout *layout, StageSchedule *schedule, uint64_t seed) {
    *p = (Pipeline){.layout = *layout, .schedule = *schedule, .last_backward_action = -1};
    *schedule = (StageSchedule){0};
    for (int i = 0; i < p->schedule.count; i++) {
        const Action *a = &p->schedule.actions[i];
        if (a->chunk < 0 || a->chunk >= CHUNKS_PER_STAGE)
            fatal(EXIT_USAGE,
                  "stage %d's schedule has an action on chunk %d, but a stage holds %d chunk of layers",
                  layout->stage, a->chunk, CHUNKS_PER_STAGE);
        if (a->kind == OP_BACKWARD) p->last_backward_action = i;
    }
    const StageLayout *l = &p->layout;
    const ModelConfig *m = &l->cfg->model;
    if (l->tensor) { /* the stage's slices; model, mixed and scratch are the tp model's */
        tp_model_create_range(&p->tpm, m, seed, l->tensor, l->first_unit, l->last_unit, l->B, l->T,
                              l->cfg->recompute, l->cfg->precision);
        tp_model_move(&p->tpm, &p->model, &p->mixed);
        p->scratch = p->tpm.scratch;
        p->tensor_hooks = tp_block_hooks(&p->tpm);
        p->hooks = &p->tensor_hooks;
    } else if (l->caller_storage) {
        ParamTable table;
        param_table_build(&table, m);
        gpt_init(&p->model, table);
        gpt_set_range(&p->model, l->first_unit, l->last_unit);
    } else {
        precision_create_range(&p->model, &p->mixed, m, seed, l->cfg->precision, l->first_unit,
                               l->last_unit); /* fp32 or 16-bit */
    }
    p->slots = schedule_live_activations(&p->schedule);
    p->slot = xcalloc(p->slots, sizeof(Activations));
    for (int i = 0; i < p->slots; i++)
        if (l->tensor)
            tp_activations_create(&p->tpm, &p->slot[i], l->B, l->T); /* the blocks' values in local widths */
        else
            activations_create_range(&p->slot[i], m, l->B, l->T, l->first_block, l->last_unit,
                                     l->cfg->recompute);
    /* with --recompute the slots keep block inputs, and one block set here serves them all */
    if (!l->tensor) scratch_create(&p->scratch, m, l->B, l->T, l->cfg->recompute);
    /* the gradient messages, where there is a neighbour to exchange them with
     * (the last stage's backward starts from the loss, the first's input is tokens) */
    size_t bytes = boundary_floats(p) * sizeof(float);
    if (next_rank(l, 0) >= 0)
        p->grad_in = mem_alloc(SPACE_DEVICE, CAT_WORKSPACE, bytes, "gradient from next stage");
    if (prev_rank(l, 0) >= 0)
        p->grad_out = mem_alloc(SPACE_DEVICE, CAT_WORKSPACE, bytes, "gradient to prev stage");
}

void pipeline_destroy(Pipeline *p) {
    timeline_free(&p->times.timeline);
    mem_free(p->grad_in);
    mem_free(p->grad_out);
    for (int i = 0; i < p->slots; i++)
        if (p->layout.tensor)
            tp_activations_destroy(&p->tpm, &p->slot[i]);
        else
            activations_destroy(&p->slot[i], &p->layout.cfg->model);
    free(p->slot);
    schedule_free(&p->schedule);
    if (p->layout.tensor) {
        tp_model_destroy(&p->tpm); /* model, mixed and scratch with it */
        return;
    }
    scratch_destroy(&p->scratch);
    precision_destroy(&p->model, &p->mixed);
}

/* Forward of one micro-batch, sequences [sequence, sequence + B) of batch
 * `batch` of a split, through this stage's units. The first stage reads the
 * tokens, the last the targets: both from (seed, batch, sequence), as every
 * chapter does, so no token ever needs to travel. */
static void stage_forward_batch(Pipeline *p, Activations *a, Split split, int batch, int sequence) {
    const StageLayout *l = &p->layout;
    int first = prev_rank(l, 0) < 0, last = next_rank(l, 0) < 0; /* the model's first and last pieces */
    if (first || last)
        data_upload_batch(l->data, split, l->cfg->seed, batch, sequence, l->B, l->T, a->tokens, a->targets);
    p->tpm.now = a; /* tensor parallel: the blocks' values of this micro-batch */
    gpt_forward_range(&p->model, a, &p->scratch, l->first_unit, l->last_unit, 1, p->hooks, l->B, l->T);
    /* every tp rank of the last stage computed the (replicated) loss; tp rank 0 reports it */
    if (last && (!l->tensor || l->tensor->rank == 0)) p->now.loss_sum += gpt_loss_sum(a, l->B, l->T);
}

/* Backward of micro-batch m through this stage's units, in the reverse order:
 * from grad_in, the gradient from stage+1 (the last stage starts from the
 * loss), to grad_out, the gradient of the stage's input for stage-1 (stage 0
 * ends with the embedding's backward instead). */
static void stage_backward(Pipeline *p, int m) {
    const StageLayout *l = &p->layout;
    p->tpm.now = slot_of(p, m); /* tensor parallel: the blocks' values of micro-batch m */
    gpt_backward_range(&p->model, slot_of(p, m), &p->scratch, l->first_unit, l->last_unit, p->now.dloss,
                       p->grad_in, prev_rank(l, 0) >= 0 ? p->grad_out : NULL, p->hooks, l->B, l->T);
}

/* Milliseconds since this step started, after the device finished its work. */
static double now_ms(Pipeline *p) {
    device_sync();
    return wall_ms() - p->times.origin_ms;
}

/* The interpreter: one action of a schedule. */
static void run_action(Pipeline *p, const Action *a) {
    size_t n = boundary_floats(p);
    CommGroup *pp = p->layout.pp;
    int prev = prev_rank(&p->layout, a->chunk), next = next_rank(&p->layout, a->chunk);
    double start = now_ms(p);
    switch (a->kind) {
    case OP_FORWARD:
        stage_forward_batch(p, slot_of(p, a->micro), SPLIT_TRAIN, p->now.step,
                            p->now.first_sequence + a->micro * p->layout.B);
        break;
    case OP_BACKWARD:
        stage_backward(p, a->micro);
        break;
    case OP_RECV_ACT:
        comm_recv(pp, slot_of(p, a->micro)->encoded, n, prev, TAG_ACTIVATIONS);
        break;
    case OP_SEND_ACT:
        comm_send(pp, stage_output(p, slot_of(p, a->micro)), n, next, TAG_ACTIVATIONS);
        break;
    case OP_RECV_GRAD:
        comm_recv(pp, p->grad_in, n, next, TAG_GRADIENTS);
        break;
    case OP_SEND_GRAD:
        comm_send(pp, p->grad_out, n, prev, TAG_GRADIENTS);
        break;
    case OP_SEND_ACT_RECV_GRAD:
        comm_sendrecv(pp, stage_output(p, slot_of(p, a->micro)), n, next, p->grad_in, n, next, TAG_EXCHANGE);
        break;
    case OP_SEND_GRAD_RECV_ACT:
        comm_sendrecv(pp, p->grad_out, n, prev, slot_of(p, a->micro2)->encoded, n, prev, TAG_EXCHANGE);
        break;
    }
    double end = now_ms(p);
    StageTimes *t = &p->times;
    if (a->kind == OP_FORWARD)
        t->fwd_ms += end - start;
    else if (a->kind == OP_BACKWARD)
        t->bwd_ms += end - start;
    else
        t->comm_ms += end - start;
    t->end_ms = end;
    timeline_add(&t->timeline, p->now.step + 1, a->micro, schedule_op_name(a->kind), start * 1e3, end * 1e3);
}

void pipeline_run_step(Pipeline *p, int step, int first_sequence, float dloss) {
    p->now = (StepState){.step = step, .first_sequence = first_sequence, .dloss = dloss};
    StageTimes *t = &p->times;
    t->fwd_ms = t->bwd_ms = t->comm_ms = t->end_ms = 0.0;
    t->origin_ms = wall_ms();
    if (!p->layout.caller_storage) precision_zero_grads(&p->model, &p->mixed);
    for (int i = 0; i < p->schedule.count; i++) {
        run_action(p, &p->schedule.actions[i]);
        if (i == p->last_backward_action && p->last_backward) p->last_backward(p->last_backward_context);
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
        for (int m = 0; m < micro_batches; m++) {
            Activations *a = slot_of(p, 0);
            int prev = prev_rank(l, 0), next = next_rank(l, 0);
            if (prev >= 0) comm_recv(l->pp, a->encoded, n, prev, TAG_ACTIVATIONS);
            stage_forward_batch(p, a, SPLIT_VAL, e, first_sequence + m * l->B);
            if (next >= 0) comm_send(l->pp, stage_output(p, a), n, next, TAG_ACTIVATIONS);
        }
    }
    double total = comm_allreduce_double(world, p->now.loss_sum, 0);
    p->now.loss_sum = saved_loss;
    return total / ((double)cfg->eval_batches * cfg->batch * cfg->model.seq);
}

void pipeline_sample(Pipeline *p, int n, uint64_t *rng) {
    const StageLayout *l = &p->layout;
    int T = l->T, V = l->cfg->model.vocab, C = l->cfg->model.dmodel;
    int prev = prev_rank(l, 0), next = next_rank(l, 0);
    Activations *a = slot_of(p, 0);
    unsigned char *text = xmalloc((size_t)32 + n); /* the prompt is at most 32 bytes */
    int prompt_len = sample_prompt(l->data, T, text);
    int *context = xmalloc(T * sizeof(int));
    float *logits = xmalloc(V * sizeof(float));
    for (int i = 0; i < n; i++) {
        int len = prompt_len + i, ctx = len < T ? len : T; /* the model sees the last (at most T) bytes */
        for (int t = 0; t < ctx; t++) context[t] = text[len - ctx + t];
        if (prev < 0) copy_to_device(a->tokens, context, ctx * sizeof(int));
        if (prev >= 0) comm_recv(l->pp, a->encoded, (size_t)ctx * C, prev, TAG_ACTIVATIONS);
        p->tpm.now = a; /* tensor parallel: the blocks' values */
        gpt_forward_range(&p->model, a, &p->scratch, l->first_unit, l->last_unit, 0, p->hooks, 1, ctx);
        int byte = 0;
        if (next >= 0) {
            comm_send(l->pp, stage_output(p, a), (size_t)ctx * C, next, TAG_ACTIVATIONS);
        } else {
            copy_to_host(logits, a->logits + (size_t)(ctx - 1) * V, V * sizeof(float));
            byte = sample_byte(logits, rng);
        }
        text[len] = (unsigned char)comm_allreduce_double(l->pp, byte, 0); /* from the last stage */
    }
    if (comm_rank(comm_world()) == 0) sample_print(text, prompt_len, n);
    free(text);
    free(context);
    free(logits);
}
