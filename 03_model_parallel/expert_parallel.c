/* expert_parallel.c: expert parallelism (see expert_parallel.h): the flags,
 * the buffers, and the hook that sends an MoE block's rows to their
 * experts' ranks and back. */
#include "03_model_parallel/expert_parallel.h" /* 03: expert parallelism */

#include "03_model_parallel/alltoall.h" /* 03: the pairwise all-to-all */
#include "common/comm/grid.h"           /* the process grid and its byte counters */
#include "common/device/device.h"       /* mem_alloc, copies, streams, timers */
#include "common/core/util.h"           /* fatal, xcalloc, exit codes */

#include <stdlib.h>
#include <string.h>

const Flag expert_parallel_flags[] = {
    {.type = FLAG_SECTION,
     .help = "expert parallel (with --experts E; --ep N divides E and --dp; per stage and tp rank)"},
    {"--ep", FLAG_INT, FIELD(ExpertParallelFlags, ep), 1, MAX_EXPERTS, .def = "1", .usage = "--ep N",
     .help = "expert parallel: each MoE block's E experts split over N data-parallel ranks\n"
             "(E/N each, only their weights, gradients and optimizer state held), tokens\n"
             "sent to their experts and back by two all-to-alls\n"
             "(--alltoall library|pairwise) (default {default})"},
    {0},
};

void expert_parallel_check_flags(const Config *cfg, const ExpertParallelFlags *f, const ModelParallelFlags *mp) {
    int E = cfg->model.moe.experts, N = f->ep, dp = mp->dp, cp = mp->cp;
    if (N > 1 && !E) fatal(EXIT_USAGE, "--ep %d splits the experts over ranks (valid: with --experts E)", N);
    if (E && cp > 1)
        fatal(EXIT_USAGE,
              "--experts with --cp %d is not written yet: an expert's capacity is per whole sequence, and a "
              "cp rank holds part of each (valid: --cp 1)",
              cp);
    if (N > 1 && E % N != 0)
        fatal(EXIT_USAGE, "--ep %d does not divide --experts %d (valid: N dividing E, each rank E/N experts)",
              N, E);
    if (N > 1 && dp % N != 0)
        fatal(EXIT_USAGE,
              "--ep %d does not divide --dp %d: the expert-parallel ranks are data-parallel replicas (valid: "
              "N dividing D)",
              N, dp);
}

size_t expert_parallel_block_rows(const MoeConfig *moe, int ranks, int B, int T) {
    int held = moe->experts / ranks, K = moe->top_k;
    size_t by_choice = (size_t)B * T * (K < held ? K : held);
    size_t by_capacity = (size_t)held * moe_expert_rows_max(moe, B, T);
    return by_choice < by_capacity ? by_choice : by_capacity;
}

/* Microseconds since the step began, the device's work done; 0 without a
 * sync when nothing is recorded (evaluation, sampling). */
static double since_step_us(const ExpertParallel *x) {
    if (!x->recording) return 0.0;
    device_sync();
    return (wall_ms() - x->origin_ms) * 1e3;
}
static void record(ExpertParallel *x, int micro, const char *op, double start_us, double end_us) {
    if (x->recording) timeline_add(x->timeline, x->step + 1, micro, op, start_us, end_us);
}

/* What the forward of MoE block l kept for the micro-batch whose routing is
 * la: its slot's (the slot whose activations hold la), or the one set. */
static ExpertParallelLayer *kept(ExpertParallel *x, int l, const MoeLayerActs *la) {
    int L = x->model->cfg.layers;
    for (int s = 0; x->slot_acts && s < x->slots; s++)
        if (la == &x->slot_acts[s].moe.layer[l]) return &x->layer[(size_t)s * L + l];
    if (x->slot_acts) fatal(EXIT_RUNTIME, "expert parallel: block %d's routing is in no activation slot", l);
    return &x->layer[l];
}

/* One all-to-all of `count` floats a block, timed and counted. */
static void exchange(ExpertParallel *x, const float *send, float *recv, size_t count) {
    device_sync(); /* the packed blocks are complete before they leave */
    double start = wall_ms();
    if (x->pairwise)
        pairwise_alltoall_typed(x->group, send, recv, count, COMM_F32);
    else
        comm_alltoall_typed(x->group, send, recv, count, COMM_F32, NULL);
    *x->comm_ms += wall_ms() - start;
}

/* The first row of rank j's experts in rows grouped by expert, and their number. */
static size_t rows_before(const int *count_h, int upto) {
    size_t rows = 0;
    for (int e = 0; e < upto; e++) rows += count_h[e];
    return rows;
}

/* rows grouped by expert (R, C) -> send: block j the rows of rank j's experts */
static void pack(ExpertParallel *x, const int *count_h, const float *rows) {
    size_t C = x->C;
    for (int j = 0; j < x->size; j++) {
        size_t at = rows_before(count_h, j * x->count), n = rows_before(count_h, (j + 1) * x->count) - at;
        copy_on_device(x->send + j * x->block_rows * C, rows + at * C, n * C * sizeof(float));
    }
}

/* back: block j the rows rank j computed -> rows grouped by expert */
static void unpack(ExpertParallel *x, const int *count_h, const float *back, float *rows) {
    size_t C = x->C;
    for (int j = 0; j < x->size; j++) {
        size_t at = rows_before(count_h, j * x->count), n = rows_before(count_h, (j + 1) * x->count) - at;
        copy_on_device(rows + at * C, back + j * x->block_rows * C, n * C * sizeof(float));
    }
}

static void ep_forward(int l, MoeLayerActs *la, int B, int T, void *context) {
    ExpertParallel *x = context;
    const GPT *m = x->model;
    ExpertParallelLayer *xl = kept(x, l, la);
    size_t C = x->C, blk = expert_parallel_block_rows(&m->cfg.moe, x->size, B, T);
    int E = m->cfg.moe.experts, micro = x->forwards[l]++;
    double dispatch_us = since_step_us(x);
    /* the counts: block j of E holds rank j's experts' counts */
    for (int e = 0; e < E; e++) x->counts_h[e] = (float)la->count_h[e];
    copy_to_device(x->counts_send, x->counts_h, E * sizeof(float));
    exchange(x, x->counts_send, x->counts_recv, x->count);
    copy_to_host(x->counts_h, x->counts_recv, E * sizeof(float));
    for (int i = 0; i < E; i++) xl->rows[i] = (int)x->counts_h[i];
    /* dispatch: the rows to their experts' ranks */
    x->block_rows = blk;
    pack(x, la->count_h, la->xin);
    exchange(x, x->send, xl->xin, blk * C);
    double experts_us = since_step_us(x);
    record(x, micro, "ep_dispatch", dispatch_us, experts_us);
    /* this rank's experts, on the rows of each source in turn */
    for (int s = 0; s < x->size; s++)
        gpt_experts_forward(m, l, 0, x->count, xl->rows + s * x->count, xl->xin + s * blk * C,
                            xl->fch + s * blk * 4 * C, x->gelu + s * blk * 4 * C, x->y + s * blk * C);
    double combine_us = since_step_us(x);
    record(x, micro, "ep_experts", experts_us, combine_us);
    /* combine: the outputs back to their tokens' ranks */
    exchange(x, x->y, x->recv, blk * C);
    unpack(x, la->count_h, x->recv, la->y);
    record(x, micro, "ep_combine", combine_us, since_step_us(x));
}

static void ep_backward(int l, const MoeLayerActs *la, const float *dy, float *dxin, int B, int T,
                        void *context) {
    ExpertParallel *x = context;
    const GPT *m = x->model;
    ExpertParallelLayer *xl = kept(x, l, la);
    size_t C = x->C, blk = expert_parallel_block_rows(&m->cfg.moe, x->size, B, T);
    x->block_rows = blk;
    for (int i = 0; i < x->size * x->count; i++) x->rows_computed += xl->rows[i]; /* the step's load */
    int micro = x->backwards[l]++;
    double dispatch_us = since_step_us(x);
    /* the outputs' gradients to the experts' ranks */
    pack(x, la->count_h, dy);
    exchange(x, x->send, x->y, blk * C);
    double experts_us = since_step_us(x);
    record(x, micro, "ep_dispatch_bwd", dispatch_us, experts_us);
    for (int s = 0; s < x->size; s++)
        gpt_experts_backward(m, l, 0, x->count, xl->rows + s * x->count, xl->xin + s * blk * C,
                             xl->fch + s * blk * 4 * C, x->y + s * blk * C, x->gelu + s * blk * 4 * C,
                             x->dgelu + s * blk * 4 * C, x->dfch + s * blk * 4 * C, x->dxin + s * blk * C);
    double combine_us = since_step_us(x);
    record(x, micro, "ep_experts_bwd", experts_us, combine_us);
    /* the inputs' gradients back to their tokens' ranks */
    exchange(x, x->dxin, x->recv, blk * C);
    unpack(x, la->count_h, x->recv, dxin);
    record(x, micro, "ep_combine_bwd", combine_us, since_step_us(x));
}

/* comm_split_by's color: replica d is rank d mod N of group d / N. */
static int ep_color(const void *ctx, int d, int *key) {
    int N = *(const int *)ctx;
    *key = d % N;
    return d / N;
}
/* And rank d / N of the holders of its experts, the replicas d mod N + k N. */
static int holders_color(const void *ctx, int d, int *key) {
    int N = *(const int *)ctx;
    *key = d / N;
    return d % N;
}

/* The held buffer's runs: per MoE block held its experts' four tensors (one
 * range, held by the holders), and the dense runs between them (held by
 * every replica): the ranges apart for the replicas' sum, and the norm's spans. */
static void held_runs(ExpertParallel *x, const GPT *m) {
    x->apart = xcalloc(m->cfg.layers + 1, sizeof(BucketRange));
    x->spans = xcalloc(2 * (size_t)m->cfg.layers + 1, sizeof(GradSpan));
    size_t at = 0;
    for (int l = 0; l < m->cfg.layers; l++) {
        if (!moe_layer(&m->cfg, l)) continue;
        const ParamTensor *fcw = table_tensor(&m->table, l, BLOCK_FCW),
                          *fcprojb = table_tensor(&m->table, l, BLOCK_FCPROJB);
        size_t first = gpt_held_offset(m, fcw);
        if (first == SIZE_MAX) continue; /* another stage's block */
        BucketRange r = {first, first + (fcprojb->offset + fcprojb->numel - fcw->offset)};
        x->apart[x->apart_count++] = r;
        x->spans[x->num_spans++] = (GradSpan){at, r.lo - at, 1};     /* the same on every replica: once */
        x->spans[x->num_spans++] = (GradSpan){r.lo, r.hi - r.lo, 0}; /* summed over the expert group */
        at = r.hi;
    }
    x->spans[x->num_spans++] = (GradSpan){at, m->param_count - at, 1};
}

/* ---- the held model's answers (held_model.h), the norm's and the checkpoint's our own ---- */
static double held_experts_forward(void *owner, int B, int T) {
    ExpertParallel *x = owner;
    return x->inner->forward(x->inner_owner, B, T);
}
static void held_experts_backward(void *owner, float dloss, int B, int T, UnitHook unit_final,
                                  void *context) {
    ExpertParallel *x = owner;
    x->inner->backward(x->inner_owner, dloss, B, T, unit_final, context);
}
GradSpan *expert_parallel_spans_once(const ExpertParallel *x, size_t own, int replica, int *num_spans) {
    GradSpan *spans = xcalloc(x->num_spans, sizeof(GradSpan));
    *num_spans = 0;
    for (int i = 0; i < x->num_spans; i++) {
        GradSpan s = x->spans[i];
        if (s.first >= own) continue;
        if (s.first + s.count > own) s.count = own - s.first;
        if (s.replicated ? replica != 0 : replica >= x->size) continue; /* counted by another replica */
        s.replicated = 0;
        spans[(*num_spans)++] = s;
    }
    return spans;
}

GradSpan *expert_parallel_slices_once(const ExpertParallel *x, const GradSpan *once, int num_once,
                                      int replica, int *num_spans) {
    GradSpan *spans = xcalloc(num_once ? num_once : 1, sizeof(GradSpan));
    *num_spans = 0;
    for (int i = 0; i < num_once; i++) {
        int expert = 0; /* whether the tensor lies in its block's experts' range */
        for (int r = 0; r < x->apart_count && !expert; r++)
            expert = once[i].first >= x->apart[r].lo && once[i].first < x->apart[r].hi;
        if (expert ? replica < x->size : replica == 0) spans[(*num_spans)++] = once[i];
    }
    return spans;
}

/* The norm's parts (optimizer_step.h): this rank's stage's dense tensors on
 * replica 0, its experts on their holder in group 0, summed over the world. */
static GradShards held_experts_grad_shards(void *owner, CommGroup *world) {
    ExpertParallel *x = owner;
    GradShards g = x->inner->grad_shards(x->inner_owner, world);
    g.spans = x->once;
    g.num_spans = x->num_once;
    g.sum_group = world;
    return g;
}
/* The whole model's checkpoint (checkpoint.h): the dense tensors whole,
 * written by replica 0, and this rank's rows of each expert tensor, written
 * by their holder in group 0 (replicas 0 .. N-1). */
void expert_parallel_checkpoint_layout(const ExpertParallel *x, const AdamW *opt, int replica,
                                       CkptLayout *l) {
    const GPT *m = x->model;
    float *buffers[CKPT_ARRAYS] = {m->params, opt->m, opt->v};
    ParamTable whole; /* the checkpoint's: every expert */
    ModelConfig cfg = m->cfg;
    cfg.moe.parts = cfg.moe.part = 0;
    param_table_build(&whole, &cfg);
    for (int a = 0; a < CKPT_ARRAYS; a++) {
        ckpt_set_buffer(l, a, buffers[a], m->param_count, 0);
        for (int i = 0; i < m->num_tensors; i++) { /* the held and whole tables list the same tensors */
            const ParamTensor *t = &m->tensors[i];
            size_t at = gpt_held_offset(m, t);
            if (at == SIZE_MAX) continue; /* another stage's */
            int copy = t->layer < m->first_unit || t->layer > m->last_unit; /* the tied wte: read only */
            int writes = !copy && (param_expert_tensor(&m->cfg, t) ? replica < x->size : replica == 0);
            ckpt_hold(l, a, whole.tensors[i].offset + t->whole_first, t->numel, at, writes);
        }
    }
    param_table_free(&whole);
}
static void held_experts_checkpoint_layout(void *owner, AdamW *opt, int replica, int replicas,
                                           CkptLayout *l) {
    ExpertParallel *x = owner;
    if (x->sliced) /* tensor_parallel.h's: the slices, and each share of the experts from its replica */
        x->inner->checkpoint_layout(x->inner_owner, opt, replica, replicas, l);
    else
        expert_parallel_checkpoint_layout(owner, opt, replica, l);
}
static double held_experts_evaluate(void *owner, const Dataset *data, const Config *cfg, int dp_index,
                                    int B) {
    ExpertParallel *x = owner;
    return x->inner->evaluate(x->inner_owner, data, cfg, dp_index, B);
}
static void held_experts_sample(void *owner, const Dataset *data, const Config *cfg, uint64_t *rng) {
    ExpertParallel *x = owner;
    x->inner->sample(x->inner_owner, data, cfg, rng);
}
static const HeldModelOps held_experts_ops = {
    .forward = held_experts_forward,
    .backward = held_experts_backward,
    .grad_shards = held_experts_grad_shards,
    .checkpoint_layout = held_experts_checkpoint_layout,
    .evaluate = held_experts_evaluate,
    .sample = held_experts_sample,
};

void expert_parallel_create(ExpertParallel *x, HeldModel *held, ModelParallel *par, DataParallel *replicas,
                            const ExpertParallelFlags *f, const ModelParallelFlags *mp, int B) {
    expert_parallel_split(x, held->model, par->dp, replicas, f, mp->alltoall, B, NULL, 1, &par->comm_ms);
    expert_parallel_answer_held(x, held, held->model->param_count, comm_rank(par->dp),
                                par->tensor ? &par->tpm : NULL);
}

void expert_parallel_answer_held(ExpertParallel *x, HeldModel *held, size_t own, int replica,
                                 const TensorParallelModel *tpm) {
    if (!x->layer) return;
    x->sliced = tpm != NULL;
    if (tpm) /* --tp: of each tp rank's tensors, its slices and (on tp rank 0) the replicated ones */
        x->once = expert_parallel_slices_once(x, tpm->once_spans, tpm->num_once_spans, replica, &x->num_once);
    else
        x->once = expert_parallel_spans_once(x, own, replica, &x->num_once);
    x->inner = held->ops, x->inner_owner = held->owner; /* the norm and the checkpoint answered here */
    held->ops = &held_experts_ops, held->owner = x;
}

void expert_parallel_split(ExpertParallel *x, GPT *m, CommGroup *dp_group, DataParallel *replicas,
                           const ExpertParallelFlags *f, const char *alltoall, int B,
                           const Activations *slot_acts, int slots, double *comm_ms) {
    memset(x, 0, sizeof *x);
    const ModelConfig *c = &m->cfg;
    int N = f->ep, T = c->seq, pairwise = strcmp(alltoall, "pairwise") == 0;
    x->size = N;
    if (N <= 1 || !c->moe.experts) return;
    x->group = comm_split_by(dp_group, ep_color, &N); /* replicas gN .. gN + N - 1 */
    comm_group_count_into(x->group, GRID_COUNTER_EP); /* run.csv's bytes_ep_per_step (grid.h) */
    x->comm_ms = comm_ms;
    x->timeline = &x->own_timeline;
    x->rank = comm_rank(x->group);
    x->count = c->moe.experts / x->size;
    x->first = x->rank * x->count;
    if (moe_first_held(c) != x->first || moe_experts_held(c) != x->count)
        fatal(EXIT_RUNTIME,
              "expert parallel: rank %d of its group holds experts %d.. (%d of them), not %d.. (%d)", x->rank,
              moe_first_held(c), moe_experts_held(c), x->first, x->count);
    /* the ranks holding the same experts: their gradients' sum (data_parallel.h's ranges apart) */
    x->holders = comm_split_by(dp_group, holders_color, &N);
    comm_group_count_into(x->holders, GRID_DP); /* the gradients' sum: run.csv's bytes_dp_per_step */
    held_runs(x, m);
    data_parallel_hold_apart(replicas, x->apart, x->apart_count, x->holders);
    x->pairwise = pairwise;
    x->C = c->dmodel;
    x->model = m;
    size_t C = x->C, rows = (size_t)x->size * expert_parallel_block_rows(&c->moe, x->size, B, T),
           E = c->moe.experts;
    x->slot_acts = slot_acts, x->slots = slots;
    x->layer = xcalloc((size_t)slots * c->layers, sizeof *x->layer);
    x->forwards = xcalloc(c->layers, sizeof(int)), x->backwards = xcalloc(c->layers, sizeof(int));
    for (int s = 0; s < slots; s++)
        for (int l = 0; l < c->layers; l++) {
            if (!moe_layer(c, l) || (slot_acts && !slot_acts[s].moe.layer[l].xin)) continue; /* not its */
            ExpertParallelLayer *xl = &x->layer[(size_t)s * c->layers + l];
            xl->xin =
                mem_alloc(SPACE_DEVICE, CAT_ACTIVATIONS, rows * C * sizeof(float), "expert rows received");
            xl->fch = mem_alloc(SPACE_DEVICE, CAT_ACTIVATIONS, rows * 4 * C * sizeof(float),
                                "expert hidden layers");
            xl->rows = xcalloc(E, sizeof(int));
        }
    x->send = mem_alloc(SPACE_DEVICE, CAT_COMM, rows * C * sizeof(float), "expert dispatch");
    x->recv = mem_alloc(SPACE_DEVICE, CAT_COMM, rows * C * sizeof(float), "expert combine");
    x->y = mem_alloc(SPACE_DEVICE, CAT_WORKSPACE, rows * C * sizeof(float), "expert outputs");
    x->dxin = mem_alloc(SPACE_DEVICE, CAT_WORKSPACE, rows * C * sizeof(float), "expert input gradients");
    x->gelu = mem_alloc(SPACE_DEVICE, CAT_WORKSPACE, rows * 4 * C * sizeof(float), "expert gelu");
    x->dgelu = mem_alloc(SPACE_DEVICE, CAT_WORKSPACE, rows * 4 * C * sizeof(float), "expert gelu gradients");
    x->dfch = mem_alloc(SPACE_DEVICE, CAT_WORKSPACE, rows * 4 * C * sizeof(float), "expert hidden gradients");
    x->counts_send = mem_alloc(SPACE_DEVICE, CAT_COMM, 2 * E * sizeof(float), "expert row counts");
    x->counts_recv = x->counts_send + E;
    x->counts_h = xcalloc(E, sizeof(float));
    x->split = (ExpertSplit){.forward = ep_forward, .backward = ep_backward, .context = x};
    m->experts = &x->split;
    size_t held_elements = 0; /* the experts' elements held, of each of params, grads, AdamW's m and v */
    for (int i = 0; i < x->apart_count; i++) held_elements += x->apart[i].hi - x->apart[i].lo;
    log_info("expert parallel: %d ranks x %d of %d experts each (%zu expert parameters held, of %zu) | "
             "all-to-all %s | blocks of %zu rows\n",
             N, x->count, (int)E, held_elements, held_elements * N, pairwise ? "pairwise" : "library",
             rows / N);
}

void expert_parallel_destroy(ExpertParallel *x, GPT *m, CommGroup *world, const char *out) {
    if (!x->layer) return;
    if (x->timeline == &x->own_timeline) /* else the stage's, which writes it */
        timeline_write(&x->own_timeline, world, out); /* every rank has --ep N > 1 (check_flags) */
    timeline_free(&x->own_timeline);
    m->experts = NULL;
    for (size_t i = 0; i < (size_t)x->slots * m->cfg.layers; i++) {
        mem_free(x->layer[i].xin);
        mem_free(x->layer[i].fch);
        free(x->layer[i].rows);
    }
    free(x->layer);
    free(x->forwards);
    free(x->backwards);
    float *bufs[] = {x->send, x->recv, x->y, x->dxin, x->gelu, x->dgelu, x->dfch, x->counts_send};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) mem_free(bufs[i]);
    free(x->counts_h);
    free(x->apart);
    free(x->spans);
    free(x->once);
    comm_group_free(x->holders);
    comm_group_free(x->group);
    memset(x, 0, sizeof *x);
}

void expert_parallel_begin_step(ExpertParallel *x, int step) {
    if (!x->layer) return;
    x->recording = 1;
    x->step = step;
    x->origin_ms = wall_ms();
    for (int l = 0; l < x->model->cfg.layers; l++) x->forwards[l] = x->backwards[l] = 0;
}

void expert_parallel_load(ExpertParallel *x, CommGroup *world, double load[2]) {
    x->recording = 0; /* the step is over */
    double rows = x->rows_computed;
    x->rows_computed = 0.0;
    load[0] = comm_allreduce_double(world, rows, 1);
    load[1] = comm_allreduce_double(world, rows, 0) / comm_size(world);
}
