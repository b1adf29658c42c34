/* pipeline_flags.c: see pipeline_flags.h. */
#include "04_pipeline/pipeline_flags.h" /* 04: the pipeline's flags and checks */

#include "03_model_parallel/context_parallel.h" /* 03: ring attention (--cp) */
#include "common/model/layer_split.h" /* which blocks each stage runs */
#include "common/run/layout_rules.h" /* shared refusals of a layout */
#include "04_pipeline/schedule.h" /* 04: schedules as lists of actions */
#include "03_model_parallel/sequence_parallel.h" /* 03: sequence parallelism (--sp) */
#include "03_model_parallel/tensor_parallel.h" /* 03: tensor parallelism */
#include "03_model_parallel/ulysses.h" /* 03: Ulysses (--cp-mode ulysses) */
#include "common/core/util.h" /* fatal, log_info, exit codes, flag parsing */

#include <stdio.h>
#include <string.h>

/* --sp inside the stages: chapter 03's rows, in each stage's tensor group.
 * Its blocks take their rows of the stage's whole input and gather their
 * output whole for the next stage (tensor_parallel.h), which needs the
 * stage's blocks to be one run; the split backward, recomputation and the
 * ring have no rows version yet. */
static const char *sequence_parallel_stage_problem(const Config *cfg, const PipelineFlags *pipe,
                                                   const ModelParallelFlags *model) {
    int T = model->tp, D = model->dp, M = cfg->micro;
    if (T < 2)
        return "--sp splits the layernorm and residual rows over tensor-parallel ranks (valid: with --tp > 1 "
               "or --mp tensor)";
    if (pipe->virtual_chunks > 1 || strcmp(pipe->schedule, "zb-h1") == 0 || cfg->recompute || model->cp > 1)
        return "--sp with --virtual, --schedule zb-h1, --recompute or --cp is not written yet: sequence "
               "parallelism's blocks have no rows version of those (valid: --sp with gpipe or 1f1b)";
    return cfg->batch % (D * M) ? NULL : sequence_parallel_problem(cfg->batch / (D * M), cfg->model.seq, T);
}

/* --help's section and one row per flag (config.h says how to add one) */
const Flag pipeline_flags[] = {
    {.type = FLAG_SECTION,
     .help = "pipeline parallel (run with mpirun -np P*T*D; --micro M cuts each replica's batch into M "
             "micro-batches)"},
    {"--schedule", FLAG_CHOICE, FIELD(PipelineFlags, schedule), .choices = "gpipe|1f1b|interleaved|zb-h1",
     .noun = "schedule", .def = "1f1b", .usage = "--schedule gpipe|1f1b|interleaved|zb-h1",
     .help = "all forwards then all backwards, one-forward-one-backward (default {default}), or zero "
             "bubble (backward split into B and W), or interleaved (--virtual V chunks per stage)"},
    {"--virtual", FLAG_INT, FIELD(PipelineFlags, virtual_chunks), 1, 16, .def = "1", .usage = "--virtual V",
     .help = "chunks of layers per stage, for --schedule interleaved (default {default})"},
    {"--pp", FLAG_INT, FIELD(PipelineFlags, pp), 1, 256, .usage = "--pp P",
     .help = "pipeline stages, 1..layers (default: world size / (tp x dp)); with --pp,\n"
             "--dp defaults to world size / (pp x tp)"},
    {"--print-schedule", FLAG_SWITCH, FIELD(PipelineFlags, print_schedule), .usage = "--print-schedule",
     .help = "print every stage's list of actions and exit"},
    {0},
};

void pipeline_effective_flags(const Config *cfg, PipelineFlags *pipe, ModelParallelFlags *m) {
    if (strcmp(m->mp, "tensor") == 0) {
        model_parallel_effective_flags(cfg, m);
        if (!pipe->pp) pipe->pp = 1;
        return;
    }
    if (!m->tp) m->tp = 1;
    int cp_tp = m->cp * m->tp; /* the ranks of one stage */
    if (pipe->pp && !flag_given(cfg, "--dp") && m->ranks >= pipe->pp * cp_tp)
        m->dp = m->ranks / (pipe->pp * cp_tp);
    if (!pipe->pp) pipe->pp = m->ranks / (m->dp * cp_tp);
}

void pipeline_check_flags(const Config *cfg, const PipelineFlags *pipe, const ModelParallelFlags *model) {
    pipeline_check_world(cfg, pipe, model);
    pipeline_check_batch(cfg, pipe, model);
}

void pipeline_check_world(const Config *cfg, const PipelineFlags *pipe, const ModelParallelFlags *model) {
    int P = pipe->pp, T = model->tp, D = model->dp, L = cfg->model.layers, C = model->cp;
    const char *rows = model->sp ? sequence_parallel_stage_problem(cfg, pipe, model) : NULL;
    if (rows) fatal(EXIT_USAGE, "%s", rows);
    if (strcmp(model->mp, "tensor") == 0 && P > 1)
        fatal(EXIT_USAGE, "--mp tensor slices every layer over all of a replica's ranks, so it has one stage "
                          "(valid: --pp 1; for stages with tensor parallelism inside, --pp P --tp T)");
    char cp[32] = ""; /* --cp C, where the layout has it */
    if (C > 1) snprintf(cp, sizeof cp, " x --cp %d", C);
    if (P < 1 || P * C * T * D != model->ranks)
        fatal(
            EXIT_USAGE,
            "%d rank%s cannot hold %d pipeline stage%s%s x --tp %d x --dp %d (valid: mpirun -np %d, world = "
            "pp x %stp x dp)",
            model->ranks, model->ranks == 1 ? "" : "s", P, P == 1 ? "" : "s", cp, T, D,
            (P < 1 ? 1 : P) * C * T * D, C > 1 ? "cp x " : "");
    context_parallel_check_given(cfg, C);
    const char *split = C > 1 ? context_parallel_problem(cfg->model.seq, C) : NULL;
    if (split) fatal(EXIT_USAGE, "%s", split);
    ulysses_check_flags(&cfg->model, C, T, model->cp_mode,
                        flag_given(cfg, "--alltoall") && !flag_given(cfg, "--ep"), /* --ep's too (03) */
                        flag_given(cfg, "--cp-send"));
    const char *pieces = layer_split_pieces_problem(P, 1, L); /* every stage needs a block */
    if (pieces) fatal(EXIT_USAGE, "%s", pieces);
    const char *problem = T > 1 ? tensor_parallel_problem(&cfg->model, T) : NULL;
    if (problem) fatal(EXIT_USAGE, "%s", problem);
}

void pipeline_check_batch(const Config *cfg, const PipelineFlags *pipe, const ModelParallelFlags *model) {
    int P = pipe->pp, D = model->dp, M = cfg->micro, L = cfg->model.layers;
    if (cfg->batch % D != 0)
        fatal(EXIT_USAGE, "--batch %d does not divide over --dp %d replicas (valid: a multiple of %d)",
              cfg->batch, D, D);
    if (cfg->batch % (D * M) != 0)
        fatal(EXIT_USAGE,
              "--micro %d does not divide the %d sequences of each of the %d replicas (valid: --batch a "
              "multiple of dp x micro = %d)",
              M, cfg->batch / D, D, D * M);
    int V = pipe->virtual_chunks;
    const char *refused = schedule_refusal(pipe->schedule, P, V, M);
    if (refused) fatal(EXIT_USAGE, "%s", refused);
    const char *pieces = layer_split_pieces_problem(P, V, L); /* every chunk needs a block */
    if (pieces) fatal(EXIT_USAGE, "%s", pieces);
    if (model->split[0] && !layer_split_by_flops(model->split)) { /* a number a piece (a stage, or a chunk) */
        int blocks[MAX_LAYERS];
        layer_split_parse_chunks(model->split, P, V, L, blocks);
    }
}
