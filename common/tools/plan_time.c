/* plan_time.c: see plan_time.h. The step's parts, each one formula of the
 * header: from the dry runs' counted work (plan_work.h) where given, else
 * from 6P + 12LTC. */
#include "common/tools/plan_time.h" /* the step time from a machine's constants */

#include "common/model/param_table.h" /* the parameter table and its units */
#include "common/core/util.h" /* fatal, log_info, exit codes, flag parsing */

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *part_name(int part) {
    static const char *names[PART_COUNT] = {"compute", "device_update",  "communication",
                                            "bubble",  "offload_copies", "cpu_update"};
    return names[part];
}

double plan_active_params(const ModelConfig *mc) {
    ParamTable table;
    param_table_build(&table, mc);
    double P = table.num_params, E = mc->moe.experts, K = mc->moe.top_k;
    static const int expert_kinds[] = {BLOCK_FCW, BLOCK_FCB, BLOCK_FCPROJW, BLOCK_FCPROJB};
    for (int l = 0; l < mc->layers; l++) {
        if (!moe_layer(mc, l)) continue;
        double experts = 0; /* the block's E experts' weights, the router apart */
        for (int k = 0; k < 4; k++) experts += table_tensor(&table, l, expert_kinds[k])->numel;
        P -= experts * (E - K) / E;
    }
    param_table_free(&table);
    return P;
}

double plan_flops_per_token(const ModelConfig *mc) {
    return 6 * plan_active_params(mc) + 12.0 * mc->layers * mc->seq * mc->dmodel;
}

void plan_time(const Config *cfg, const PlanLayout *l, const PlanTraffic *t, const Machine *m,
               PlanTime *out) {
    plan_time_work(cfg, l, t, m, NULL, NULL, out);
}

/* The pipeline around a rank of layout l: 04-06's stages and schedule, 03's layer split. */
static PlanPipeline pipeline_of(const Config *cfg, const PlanLayout *l) {
    return (PlanPipeline){.stages = l->pp > 1 ? l->pp : 1,
                          .chunks = l->chunks > 1 ? l->chunks : 1,
                          .micro = cfg->micro,
                          .layer_split = l->chapter == 3};
}

void plan_time_work(const Config *cfg, const PlanLayout *l, const PlanTraffic *t, const Machine *m,
                    const PlanWork *work, const PlanWork *stages, PlanTime *out) {
    *out = (PlanTime){0};
    WorkTime wt = {0};
    if (work) {
        PlanPipeline pipe = pipeline_of(cfg, l);
        plan_work_time(work, pipe.stages > 1 ? stages : NULL, &pipe, m, &wt);
    }
    const ModelConfig *mc = &cfg->model;
    ParamTable table;
    param_table_build(&table, mc);
    double P = table.num_params, shard_n = shard_numel(&table, l->dp);
    param_table_free(&table);
    double T = mc->seq, N = l->dp, M = cfg->micro;
    double split = plan_replica_ranks(l); /* the ranks one replica's batch is split over (and cp's) */
    double model_split = l->pp * l->tp;   /* the ranks its weights are split over: cp ranks hold them all */

    out->flops_per_step = plan_flops_per_token(mc) * cfg->batch * T;
    /* the forward, a third of it, runs once; with --recompute again in B, and under a pipeline's
     * zb-h1 once more in W (model.h) */
    double compute = out->flops_per_step / N / split / m->flops * (2 + plan_forward_runs(cfg, l)) / 3;
    double backward = compute * 2 / 3; /* the window the backward's collectives hide under */
    if (work) { /* what the dry runs counted: each stage's ranks alike (without stages, every rank) */
        PlanPipeline pipe = pipeline_of(cfg, l);
        double stage_flops = 0;
        for (int st = 0; st < pipe.stages; st++) stage_flops += pipe.stages > 1 ? plan_work_flops(&stages[st]) : 0;
        out->flops_per_step = (pipe.stages > 1 ? stage_flops : wt.flops) * plan_ranks(l) / pipe.stages;
        compute = wt.compute_s, backward = wt.backward_s;
    }
    out->busy_s[PART_COMPUTE] = out->exposed_s[PART_COMPUTE] = compute;

    /* the parameters the device's AdamW updates: all (01, 02, 05 stage 0), a shard, none (06); a
     * model split's ranks about 1 / (pp x tp) of them each (03's --cp ranks each the whole model's) */
    double updated = l->chapter == 6 ? 0 : l->chapter == 5 && l->zero > 0 ? shard_n : P;
    if (model_split > 1) updated = P / model_split / (l->chapter == 5 && l->zero > 0 ? N : 1);
    out->busy_s[PART_DEVICE_UPDATE] = out->exposed_s[PART_DEVICE_UPDATE] =
        work ? wt.update_s : updated / m->device_adam_params_per_s;

    double W = N * (l->cp > 1 ? l->cp : 1); /* the ranks holding the same weights: dp x cp */
    double G = l->sp ? l->tp : N;           /* --sp: the gathers and scatters are the tensor group's */
    double allreduce = (t->allreduce_calls - t->tp_allreduce_calls) * 2 * (W - 1) * m->alpha_s +
                       t->tp_allreduce_calls * 2 * (l->tp - 1) * m->alpha_s +
                       t->allreduce / m->beta_bytes_per_s;
    double send = t->send_calls * m->alpha_s + t->send / m->beta_bytes_per_s; /* 03-06: one step each */
    double reduce_scatter =
        t->reduce_scatter_calls * (G - 1) * m->alpha_s + t->reduce_scatter / m->beta_bytes_per_s;
    double allgather = t->allgather_calls * (G - 1) * m->alpha_s + t->allgather / m->beta_bytes_per_s;
    /* 03's all-to-alls, waited for: Ulysses' among the cp ranks, --ep's among the expert group */
    double alltoall = (t->cp_alltoall_calls * (l->cp - 1) + t->ep_alltoall_calls * (l->ep - 1)) * m->alpha_s +
                      t->alltoall / m->beta_bytes_per_s;
    double blocking = allreduce + reduce_scatter + allgather + send + alltoall, overlapped = 0, window = 0, tail = 0;
    double dp_calls = t->allreduce_calls - t->tp_allreduce_calls;
    if (l->chapter == 2 && l->dp_mode == DP_OVERLAP) {
        overlapped = allreduce, window = backward; /* the buckets, under the backward */
        tail = dp_calls > 0 ? allreduce / dp_calls : 0; /* the last bucket: ready as the backward ends */
    } else if (l->chapter == 5 && l->zero == 2) {
        overlapped = reduce_scatter, window = backward; /* each unit's, under the backward */
        tail = t->reduce_scatter_calls > 0 ? reduce_scatter / t->reduce_scatter_calls : 0; /* the last unit's */
    } else if (l->chapter == 5 && l->zero == 3) {
        /* the forward's gathers (half of them) under the forward, the backward's and the
         * reduce-scatters under the backward; the first gather comes before any computation and
         * the last reduce-scatter after it (a call's average each) */
        double forward = compute - backward, gathers = l->prefetch > 0 ? allgather : 0;
        double ahead = gathers / 2 > forward ? gathers / 2 - forward : 0;
        double behind = gathers / 2 + reduce_scatter > backward ? gathers / 2 + reduce_scatter - backward : 0;
        overlapped = reduce_scatter + gathers, window = overlapped - ahead - behind;
        tail = (t->allgather_calls > 0 ? allgather / t->allgather_calls : 0) +
               (t->reduce_scatter_calls > 0 ? reduce_scatter / t->reduce_scatter_calls : 0);
    }
    blocking -= overlapped;
    /* what could hide: the overlapped calls less what runs past their window and less the call that
     * cannot hide; of that, the machine's overlap fraction does (the rest competes with the
     * computation beside it for the same cores, SMs or memory, and the step waits for it) */
    double past = overlapped > window ? overlapped - window : 0;
    double hideable = overlapped - (past > tail ? past : tail);
    if (hideable < 0) hideable = 0;
    out->busy_s[PART_COMMUNICATION] = blocking + overlapped;
    out->exposed_s[PART_COMMUNICATION] = blocking + overlapped - m->overlap * hideable;

    /* (pp - 1) / M of the ideal time (GPipe, 1F1B); interleaved / V; ZB-H1 a third (tf = tb = tw);
     * 03's layer split runs one micro-batch at a time through every stage: (pp - 1) x compute */
    double pp = l->pp, bubble = (pp - 1) / M * compute;
    if (l->chapter == 3) bubble = (pp - 1) * compute;
    if (l->chapter >= 4 && l->schedule == SCHED_INTERLEAVED) bubble /= l->chunks;
    if (l->chapter >= 4 && l->schedule == SCHED_ZB_H1) bubble /= 3;
    if (work) bubble = wt.bubble_s; /* the stages' own lists replayed */
    out->busy_s[PART_BUBBLE] = out->exposed_s[PART_BUBBLE] = bubble;

    out->busy_s[PART_OFFLOAD_COPIES] = out->exposed_s[PART_OFFLOAD_COPIES] =
        t->to_host / m->d2h_bytes_per_s + t->to_device / m->h2d_bytes_per_s;

    double cpu = l->chapter == 6 ? shard_n / model_split / m->cpu_adam_params_per_s : 0;
    if (work) cpu = wt.host_update_s;
    out->busy_s[PART_CPU_UPDATE] = cpu;
    out->exposed_s[PART_CPU_UPDATE] = l->dpu ? (cpu > compute ? cpu - compute : 0) : cpu;

    for (int p = 0; p < PART_COUNT; p++) out->step_s += out->exposed_s[p];
}
