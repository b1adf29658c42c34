/* plan_layout.c: see plan_layout.h. Each chapter's function lists the
 * buffers that chapter allocates, in its order, with the size functions it
 * allocates with; the names in the comments are the buffers' `what` in
 * mem_alloc, so a learner can find each in the chapter's code. */
#include "plan_layout.h"

#include "attention.h"
#include "kernels.h"
#include "model.h"
#include "param_table.h"

#include <math.h>

void plan_model_state(double P, double shard_n, int stage, int half, double *params, double *grads,
                      double *optimizer) {
    double eb = half ? 2 : 4;                        /* bytes of a parameter and a gradient */
    double opt_n = stage == 0 ? P : shard_n;         /* elements this rank updates */
    *params = (stage < 3 ? P : shard_n) * eb;        /* whole, or this rank's shard (stage 3) */
    *grads = (stage < 2 ? P : shard_n) * eb;         /* whole, or this rank's shard (stages 2-3) */
    *optimizer = opt_n * 8 + (half ? opt_n * 4 : 0); /* Adam's m and v; 16 bits: fp32 master weights */
}

static void add(PlanMemory *m, Space space, Category cat, size_t bytes) {
    m->bytes[space][cat] += bytes;
}

static int half_of(const Config *cfg) {
    return cfg->precision != PRECISION_FP32;
}

/* A rank's micro-batch: B sequences of T tokens. */
static int micro_sequences(const Config *cfg, const PlanLayout *l) {
    return cfg->batch / l->dp / cfg->micro;
}

/* What every chapter's step holds besides the model state: the activations
 * of one micro-batch (activations_create_model or a whole-model range),
 * the scratch (scratch_create), and the kernels' workspaces grown during
 * step 1 (the CPU attention's; the 16-bit matmuls' operands). */
static void add_step_buffers(PlanMemory *m, const Config *cfg, const PlanLayout *l, int first_block) {
    const ModelConfig *mc = &cfg->model;
    int B = micro_sequences(cfg, l), T = mc->seq;
    size_t acts = cfg->recompute || first_block != LAYER_EMBEDDING
                      ? activation_bytes_range(mc, B, T, first_block, mc->layers, cfg->recompute)
                      : activation_bytes(mc, B, T);
    add(m, SPACE_DEVICE, CAT_ACTIVATIONS, acts);                  /* "activations" */
    add(m, SPACE_DEVICE, CAT_WORKSPACE, scratch_bytes(mc, B, T)); /* "activation gradients" */
    if (cfg->recompute) add(m, SPACE_DEVICE, CAT_ACTIVATIONS, recompute_block_bytes(mc, B, T));
    add(m, SPACE_DEVICE, CAT_WORKSPACE, attention_workspace_bytes_cpu(T, l->threads));
    if (half_of(cfg)) {
        LinearShape shapes[GPT_LINEAR_SHAPES];
        int n = gpt_linear_shapes(mc, shapes);
        add(m, SPACE_DEVICE, CAT_WORKSPACE, half_matmul_workspace_bytes_cpu(B * T, shapes, n));
    }
}

/* 01 and 02: the whole model on every rank (gpt_create, or mixed_create's
 * 16-bit parameters, gradients, fp32 master weights and two unit-sized fp32
 * workspaces), AdamW over every element. */
static void whole_model(const Config *cfg, const PlanLayout *l, const ParamTable *t, PlanMemory *m) {
    double params, grads, optimizer;
    plan_model_state(t->num_params, t->num_params, 0, half_of(cfg), &params, &grads, &optimizer);
    add(m, SPACE_DEVICE, CAT_PARAMS, params);
    add(m, SPACE_DEVICE, CAT_GRADS, grads);
    add(m, SPACE_DEVICE, CAT_OPTIMIZER, optimizer);
    if (half_of(cfg)) /* "unit weights (fp32)", "unit gradients (fp32)" */
        add(m, SPACE_DEVICE, CAT_WORKSPACE,
            2 * table_largest_unit(t, LAYER_EMBEDDING, cfg->model.layers) * 4);
    add_step_buffers(m, cfg, l, LAYER_EMBEDDING);
}

/* 05 (zero_create_precision, then the step's buffers, then the whole model
 * for evaluation). */
static void zero_model(const Config *cfg, const PlanLayout *l, const ParamTable *t, PlanMemory *m) {
    int stage = l->zero, half = half_of(cfg), L = cfg->model.layers;
    size_t N = l->dp, eb = half ? 2 : 4, P = t->num_params;
    size_t S = shard_largest_slice(t, LAYER_EMBEDDING, L, l->dp), max_unit = N * S;
    double params, grads, optimizer;
    plan_model_state(P, shard_numel(t, l->dp), stage, half, &params, &grads, &optimizer);
    add(m, SPACE_DEVICE, CAT_PARAMS, params);
    add(m, SPACE_DEVICE, CAT_GRADS, grads);
    add(m, SPACE_DEVICE, CAT_OPTIMIZER, optimizer);
    if (half) /* mixed_units_create: "unit weights (fp32)", "unit gradients (fp32)" */
        add(m, SPACE_DEVICE, CAT_WORKSPACE, 2 * table_largest_unit(t, LAYER_EMBEDDING, L) * 4);
    if (stage >= 2) { /* two ZeroGradBuffers: "unit gradient", "gradient slice"; 16 bits: "(fp32)" */
        add(m, SPACE_DEVICE, CAT_BUCKETS, 2 * (max_unit + S) * eb);
        if (half) add(m, SPACE_DEVICE, CAT_BUCKETS, S * 4);
    }
    if (stage == 1 || stage == 2)
        add(m, SPACE_DEVICE, CAT_COMM, (S + max_unit) * eb); /* "unit slice", "padded unit" */
    if (stage == 3) { /* the pool of "gathered unit"s: prefetch + 1, at most the computations */
        int uses = 2 * (L + 2), pool = l->prefetch + 1 < uses ? l->prefetch + 1 : uses;
        add(m, SPACE_DEVICE, CAT_GATHERED, (size_t)pool * max_unit * eb);
    }
    add_step_buffers(m, cfg, l, LAYER_EMBEDDING);
    if (stage == 3 || half)
        add(m, SPACE_DEVICE, CAT_WORKSPACE, P * 4); /* "the whole model in fp32 for evaluation" */
}

/* 06 with one stage (offload_create over every unit; the pipeline's one
 * activation slot from block 0, its scratch, no neighbours' gradients). */
static void offload_model(const Config *cfg, const PlanLayout *l, const ParamTable *t, PlanMemory *m) {
    int half = half_of(cfg), L = cfg->model.layers;
    size_t N = l->dp, eb = half ? 2 : 4, n = t->num_params;
    size_t S = shard_largest_slice(t, LAYER_EMBEDDING, L, l->dp), shard_n = shard_numel(t, l->dp);
    add_step_buffers(m, cfg, l, 0);
    add(m, SPACE_DEVICE, CAT_PARAMS, n * eb);
    if (half) add(m, SPACE_DEVICE, CAT_WORKSPACE, table_largest_unit(t, LAYER_EMBEDDING, L) * 4);
    add(m, SPACE_DEVICE, CAT_BUCKETS, N * S * 4);                     /* "unit gradient" */
    if (half && N > 1) add(m, SPACE_DEVICE, CAT_BUCKETS, N * S * eb); /* "unit gradient (16-bit)" */
    add(m, SPACE_DEVICE, CAT_BUCKETS, S * eb);                        /* "gradient slice to copy out" */
    if (N > 1)
        add(m, SPACE_DEVICE, CAT_COMM,
            2 * S * eb + N * S * eb);                   /* "updated slice copied in" x2, "gathered unit" */
    add(m, SPACE_HOST, CAT_OPTIMIZER, shard_n * 4 * 3); /* "master weights (host)", "Adam moments (host)" */
    add(m, SPACE_HOST, CAT_GRADS,
        shard_n * 4 * (l->dpu ? 2 : 1)); /* "gradient shard (host)", --dpu: a second */
    add(m, SPACE_HOST, CAT_COMM,
        shard_n * eb * (half ? 2 : 1)); /* "gradient slices from the device", "16-bit weights" */
}

void plan_memory(const Config *cfg, const PlanLayout *l, PlanMemory *m) {
    *m = (PlanMemory){0};
    ParamTable t;
    param_table_build(&t, &cfg->model);
    if (l->chapter == 5)
        zero_model(cfg, l, &t, m);
    else if (l->chapter == 6)
        offload_model(cfg, l, &t, m);
    else
        whole_model(cfg, l, &t, m);
    param_table_free(&t);
}

void plan_traffic(const Config *cfg, const PlanLayout *l, PlanTraffic *tr) {
    *tr = (PlanTraffic){0};
    ParamTable t;
    param_table_build(&t, &cfg->model);
    double N = l->dp, eb = half_of(cfg) ? 2 : 4, P = t.num_params, M = cfg->micro;
    double shard = shard_numel(&t, l->dp) * eb; /* one rank's slices of every unit */
    double units = t.num_units, tensors = t.num_tensors;
    param_table_free(&t);
    if (l->chapter == 6) {
        tr->to_host = M * shard; /* this rank's gradient slices */
        tr->to_device = shard;   /* its updated slices */
    }
    if (l->dp == 1) return;
    if (l->chapter == 2 || (l->chapter == 5 && l->zero == 0)) {
        tr->allreduce = 2 * (N - 1) / N * P * eb; /* the gradients, once per step */
        /* naive: one call per tensor; overlap: one per bucket of about --bucket-mb */
        tr->allreduce_calls = l->chapter == 5 || l->dp_mode == DP_FLAT ? 1
                              : l->dp_mode == DP_NAIVE                 ? tensors
                                                                       : ceil(P * eb / l->bucket_bytes);
    } else if (l->chapter == 5 && l->zero <= 2) {
        /* stage 1 reduce-scatters after the last backward, stage 2 each unit of every micro-batch */
        tr->reduce_scatter = (N - 1) * shard * (l->zero == 2 ? M : 1);
        tr->reduce_scatter_calls = units * (l->zero == 2 ? M : 1);
        tr->allgather = (N - 1) * shard; /* the updated parameters, once per step */
        tr->allgather_calls = units;
    } else if (l->chapter == 5) {
        tr->allgather = 2 * M * (N - 1) * shard; /* every unit before its forward and its backward */
        tr->allgather_calls = 2 * M * units;
        tr->reduce_scatter = M * (N - 1) * shard;
        tr->reduce_scatter_calls = M * units;
    } else if (l->chapter == 6) {
        tr->reduce_scatter = M * (N - 1) * shard; /* each unit's gradient as backward finishes it */
        tr->reduce_scatter_calls = M * units;
        tr->allgather = (N - 1) * shard; /* the updated slices */
        tr->allgather_calls = units;
    }
}
