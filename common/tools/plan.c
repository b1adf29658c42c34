/* common/plan: the planner. Memory and communication of a chapter's run,
 * predicted from its command line without running it; the papers' tables.
 *
 *   common/plan [the chapter's flags] [--chapter 01..06] [--dp D] [--tp T] [--pp P] [--csv FILE]
 *       what each rank of that run holds, by memory.csv's (space, category),
 *       and the bytes it sends per step by collective, then every rank's
 *       together on each grid axis ("axis dp N" ..., run.csv's
 *       bytes_AXIS_per_step); --csv writes the memory as memory.csv's rows
 *       (rank,space,category,peak_bytes)
 *   common/plan [the run's flags] --machine FILE [--time-csv FILE]
 *       the same, and the predicted step time with its parts (compute,
 *       device update, exposed communication, bubble, offload copies, CPU
 *       update) on the machine FILE describes (plan_time.h: the format and
 *       every formula); --time-csv writes one row per part
 *   common/plan --calibrate FILE [--quick] [--device cpu|cuda]
 *       measure this machine's constants with the course's tools (01's step,
 *       commbench, adambench, devicebench: common/scripts/calibrate.sh) on the
 *       device --device names (auto: the GPU if one is visible) and write them
 *       to FILE, which the planner then reads back and --machine takes
 *   common/plan [the model's and batch's flags] --search --gpus N [--gpu-mem BYTES] --machine FILE
 *       every layout of the planned chapters on N ranks (one replica a rank;
 *       dp x pp x tp splits; 03's dp x cp), those whose fullest rank's device
 *       memory fits ranked by predicted step time (those whose losses are not
 *       01's, 06 --dpu, ranked apart and marked "changes the losses"), each
 *       other with the reason it does not fit or is not a layout (--gpu-mem
 *       defaults to the machine's device_mem_bytes)
 *   common/plan --zero-table [--params P] [--gpus N] [--precision bf16|fp32]
 *       the ZeRO paper's model-state table (Rajbhandari et al., 2020, Figure 1):
 *       mixed-precision Adam unless --precision fp32 is given
 *   common/plan --offload-capacity [--gpu-mem BYTES] [--reserve BYTES]
 *       the largest model one device trains with and without offload
 *       (Ren et al., 2021, ZeRO-Offload); --reserve below --gpu-mem
 *
 * A run's command line pastes in: `mpirun -np 2 05_zero/train --zero 2
 * --precision bf16` is `common/plan --dp 2 --zero 2 --precision bf16`, and
 * `mpirun -np 8 04_pipeline/train --pp 2 --tp 2` is `common/plan --pp 2 --tp
 * 2 --dp 2`; chapter 03's layer split takes its stages from the rank count,
 * so its plan names them: `mpirun -np 3 03_model_parallel/train` is
 * `common/plan --chapter 03 --pp 3`, and `mpirun -np 4
 * 03_model_parallel/train --cp 2` is `common/plan --chapter 03 --pp 2 --cp
 * 2`. 06 without --offload is chapter 05's program, and planned as it. The chapter follows from the flags
 * (--offload: 06; --zero: 05; --mp: 03; --pp or --tp above 1, --schedule,
 * --virtual: 04; --dp above 1: 02; else 01) or --chapter. How the bytes are
 * computed, and which buffers the plan does not cover: plan_layout.h; the
 * stages, slots and slices: plan_stage.h. Exit status 2 on bad input, with
 * one line naming the flag. */
#include "config.h"
#include "csvlog.h"
#include "device.h"
#include "layer_split.h"
#include "layout_rules.h"
#include "model.h"
#include "param_table.h"
#include "plan_by_hand.h"
#include "plan_layout.h"
#include "plan_time.h"
#include "util.h"

#include <limits.h>
#include <stdarg.h>
#include <stdlib.h>
#include <libgen.h>
#include <omp.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define PROGRAM "common/plan"

/* ---- the planner's flags: the chapters' own, with their names and ranges ---- */
typedef struct {
    char chapter[8]; /* auto, 01 .. 06 */
    int dp, tp, pp;
    char mp[8]; /* 03: layer, tensor */
    int cp, sp; /* 03: --cp N, --sp */
    char cp_order[16], cp_send[16];
    int schedule;       /* 04-05: SCHED_GPIPE .. SCHED_ZB_H1 (plan_stage.h: the order of .choices) */
    int virtual_chunks; /* 04: --virtual */
    char split[1024];   /* 03-05: --split */
    int zero, prefetch;
    char dp_mode[8];
    double bucket_mb;
    char allreduce[8];
    int print_buckets; /* 02: accepted for pasting */
    int offload, dpu, dpu_warmup;
    int threads;
    char csv[PATH_BYTES];
    char machine[PATH_BYTES], time_csv[PATH_BYTES], calibrate[PATH_BYTES];
    int quick, search, by_hand;
    int zero_table, offload_capacity;
    double params;
    int gpus;
    size_t gpu_mem, reserve;
    int ranks;      /* unused: the planner runs as one process */
    int zero_given; /* --search: the candidate names its --zero */
} PlanFlags;

static const Flag plan_flags[] = {
    {.type = FLAG_SECTION, .help = "the layout (the chapters' own flags; world = dp x pp x tp ranks)"},
    {"--chapter", FLAG_CHOICE, FIELD(PlanFlags, chapter), .choices = "auto|01|02|03|04|05|06",
     .noun = "chapter", .def = "auto", .usage = "--chapter 01..06",
     .help = "the program to plan (default auto: --offload 06, --zero 05, --mp 03, --pp or --tp\n"
             "above 1 or --schedule 04, --dp above 1 02, else 01)"},
    {"--dp", FLAG_INT, FIELD(PlanFlags, dp), 1, 4096, .def = "1", .usage = "--dp D",
     .help = "data-parallel ranks: mpirun -np of 02 and of 05-06 with one stage, --dp of 03-06\n"
             "(replicas of a model split), 1..4096 (default {default})"},
    {"--tp", FLAG_INT, FIELD(PlanFlags, tp), 1, 4096, .def = "1", .usage = "--tp T",
     .help = "tensor-parallel ranks: 03's --mp tensor, 04-06's inside each stage (default {default})"},
    {"--pp", FLAG_INT, FIELD(PlanFlags, pp), 1, 256, .def = "1", .usage = "--pp P",
     .help = "pipeline stages of 04-06, and of 03's layer split (its world / --dp / --cp)\n"
             "(default {default})"},
    {"--mp", FLAG_CHOICE, FIELD(PlanFlags, mp), .choices = "layer|tensor", .noun = "split", .def = "layer",
     .usage = "--mp layer|tensor",
     .help = "03: the layer split over --pp stages, or tensor parallelism over --tp"},
    {"--cp", FLAG_INT, FIELD(PlanFlags, cp), 1, 1024, .def = "1", .usage = "--cp N",
     .help = "03: context-parallel ranks per sequence (ring attention; world = dp x pp x cp x tp)\n"
             "(default {default})"},
    {"--cp-order", FLAG_CHOICE, FIELD(PlanFlags, cp_order), .choices = "zigzag|contiguous", .noun = "order",
     .def = "zigzag", .usage = "--cp-order ORDER", .help = "03: accepted for pasting; changes no byte",
     .record = FLAG_NOT_RECORDED},
    {"--cp-send", FLAG_CHOICE, FIELD(PlanFlags, cp_send), .choices = "auto|posted|blocking", .noun = "way",
     .def = "auto", .usage = "--cp-send HOW", .help = "03: accepted for pasting; changes no byte",
     .record = FLAG_NOT_RECORDED},
    {"--sp", FLAG_SWITCH, FIELD(PlanFlags, sp), .usage = "--sp",
     .help = "03 --mp tensor: sequence parallelism (layernorm and residual regions in T/tp rows)"},
    {"--schedule", FLAG_ENUM, FIELD(PlanFlags, schedule), .choices = "gpipe|1f1b|interleaved|zb-h1",
     .noun = "schedule", .def = "1f1b", .usage = "--schedule gpipe|1f1b|interleaved|zb-h1",
     .help = "04-05: which activation slots each stage keeps (default {default})"},
    {"--virtual", FLAG_INT, FIELD(PlanFlags, virtual_chunks), 1, PLAN_MAX_CHUNKS, .def = "1",
     .usage = "--virtual V",
     .help = "04: chunks of layers per stage, for --schedule interleaved (default {default})"},
    {"--split", FLAG_TEXT, FIELD(PlanFlags, split), .usage = "--split A,B,...",
     .help = "03-05: blocks per stage (per chunk with --virtual), summing to --layers\n"
             "(default: balanced)"},
    {"--zero", FLAG_INT, FIELD(PlanFlags, zero), 0, 3, .usage = "--zero 0|1|2|3",
     .help = "05, and 06 without --offload: the ZeRO stage (default 1, as 05's); 06 --offload: 2"},
    {"--prefetch", FLAG_INT, FIELD(PlanFlags, prefetch), 0, 64, .def = "1", .usage = "--prefetch K",
     .help = "05, stage 3: units gathered ahead, 0..64 (default {default})"},
    {"--dp-mode", FLAG_CHOICE, FIELD(PlanFlags, dp_mode), .choices = "naive|flat|overlap", .noun = "mode",
     .def = "flat", .usage = "--dp-mode naive|flat|overlap",
     .help = "02: how the gradients are all-reduced (the same memory and bytes; default {default})"},
    {"--bucket-mb", FLAG_DOUBLE, FIELD(PlanFlags, bucket_mb), 1e-6, 4096, .def = "1",
     .usage = "--bucket-mb X",
     .help = "02, overlap: bucket size in MiB (views of the gradients: no memory of its own)"},
    {"--allreduce", FLAG_CHOICE, FIELD(PlanFlags, allreduce), .choices = "ring|library", .noun = "all-reduce",
     .def = "library", .usage = "--allreduce ring|library",
     .help = "02-05: the library's or the course's ring (its chunk buffer in the comm row, the\n"
             "chunks each rank passes on; 05 with --zero 0 and a split) (default {default})"},
    {"--print-buckets", FLAG_SWITCH, FIELD(PlanFlags, print_buckets), .usage = "--print-buckets",
     .help = "02: accepted for pasting; changes no byte", .record = FLAG_NOT_RECORDED},
    {"--offload", FLAG_SWITCH, FIELD(PlanFlags, offload), .usage = "--offload",
     .help = "06: the optimizer state and gradients in host memory"},
    {"--dpu", FLAG_SWITCH, FIELD(PlanFlags, dpu), .usage = "--dpu",
     .help = "06: the delayed parameter update (a second host gradient shard)"},
    {"--dpu-warmup", FLAG_INT, FIELD(PlanFlags, dpu_warmup), 0, 1000000, .def = "1",
     .usage = "--dpu-warmup N", .help = "06: accepted for pasting; changes no byte",
     .record = FLAG_NOT_RECORDED},
    {"--threads", FLAG_INT, FIELD(PlanFlags, threads), 1, 4096, .usage = "--threads N",
     .help = "OpenMP threads per rank: the CPU attention workspace grows with them\n"
             "(default: OMP_NUM_THREADS, as the programs read it)"},
    {.type = FLAG_SECTION, .help = "output"},
    {"--csv", FLAG_PATH, FIELD(PlanFlags, csv), .usage = "--csv FILE",
     .help = "write the memory as memory.csv's rows: rank,space,category,peak_bytes\n"
             "(FILE: a new name or an earlier --csv file)"},
    {.type = FLAG_SECTION, .help = "step time"},
    {"--machine", FLAG_PATH, FIELD(PlanFlags, machine), .usage = "--machine FILE",
     .help = "predict the step time on the machine FILE describes (key = value lines;\n"
             "common/machines/ has the shipped ones, plan_time.h the format)"},
    {"--time-csv", FLAG_PATH, FIELD(PlanFlags, time_csv), .usage = "--time-csv FILE",
     .help = "write the step time's parts: part,busy_ms,exposed_ms (needs --machine;\n"
             "FILE: a new name or an earlier --time-csv file)"},
    {"--calibrate", FLAG_PATH, FIELD(PlanFlags, calibrate), .usage = "--calibrate FILE",
     .help = "measure this machine (01's step, commbench, adambench, devicebench:\n"
             "common/scripts/calibrate.sh) on --device, and write its machine file to FILE\n"
             "(a new name or a machine file --calibrate wrote)",
     .record = FLAG_NOT_RECORDED},
    {"--quick", FLAG_SWITCH, FIELD(PlanFlags, quick), .usage = "--quick",
     .help = "--calibrate with tiny sizes and few repeats (seconds; noisier constants)",
     .record = FLAG_NOT_RECORDED},
    {"--search", FLAG_SWITCH, FIELD(PlanFlags, search), .usage = "--search",
     .help = "every layout on --gpus ranks: one replica a rank (01, 02, 05, 06), dp x pp x tp\n"
             "(04's schedules, 05's ZeRO-1/2, 06 --offload) and 03's dp x cp; those that fit\n"
             "--gpu-mem (default: the machine's device_mem_bytes) on their fullest rank ranked by\n"
             "step time (06 --dpu, whose losses are not 01's, ranked apart and marked), the others\n"
             "with the reason"},
    {"--by-hand", FLAG_SWITCH, FIELD(PlanFlags, by_hand), .usage = "--by-hand",
     .help = "exercise 06.3: your plan of 05 --zero 1 --precision bf16 on --dp ranks (default 2;\n"
             "plan_by_hand.c), of the model flags' shape, next to the planner's, on the --machine\n"
             "FILE; exit 1 where they differ",
     .record = FLAG_NOT_RECORDED},
    {.type = FLAG_SECTION, .help = "the papers' numbers, from the same formulas (no model built)"},
    {"--zero-table", FLAG_SWITCH, FIELD(PlanFlags, zero_table), .usage = "--zero-table",
     .help = "model state per device at ZeRO stages 0-3 for --params on --gpus, GB (1e9)",
     .record = FLAG_NOT_RECORDED},
    {"--params", FLAG_DOUBLE, FIELD(PlanFlags, params), 1, 1e15, .def = "7.5e9", .usage = "--params P",
     .help = "parameters of --zero-table (default {default}, the ZeRO paper's)"},
    {"--gpus", FLAG_INT, FIELD(PlanFlags, gpus), 1, 1000000, .def = "64", .usage = "--gpus N",
     .help = "data-parallel devices of --zero-table (default {default})"},
    {"--offload-capacity", FLAG_SWITCH, FIELD(PlanFlags, offload_capacity), .usage = "--offload-capacity",
     .help = "the largest model --gpu-mem trains in 16 bits with and without offload",
     .record = FLAG_NOT_RECORDED},
    {"--gpu-mem", FLAG_BYTES, FIELD(PlanFlags, gpu_mem), .def = "32G", .usage = "--gpu-mem BYTES",
     .help = "device memory of --offload-capacity (default {default}: a 32 GB V100), and of\n"
             "--search (default: the machine file's device_mem_bytes)"},
    {"--reserve", FLAG_BYTES, FIELD(PlanFlags, reserve), .def = "8G", .usage = "--reserve BYTES",
     .help = "device memory that is not model state: activations, working buffers,\n"
             "fragmentation (default {default}, the assumption course.md states)"},
    {0},
};

static int chapter_of(const Config *cfg, const PlanFlags *f) {
    if (strcmp(f->chapter, "auto") != 0) return f->chapter[1] - '0';
    if (f->offload) return 6;
    if (flag_given(cfg, "--zero")) return 5;
    if (flag_given(cfg, "--mp")) return 3;
    if (f->pp > 1 || f->tp > 1 || flag_given(cfg, "--schedule") || flag_given(cfg, "--virtual")) return 4;
    return f->dp > 1 ? 2 : 1;
}

/* A layout's problem, in one line: the checks the chapters make (the same
 * messages), and what the plan does not cover yet; NULL when there is none. */
static const char *problem(const char *format, ...) {
    static char message[512];
    va_list args;
    va_start(args, format);
    vsnprintf(message, sizeof message, format, args);
    va_end(args);
    return message;
}

static const char *layout_problem(const Config *cfg, const PlanFlags *f) {
    int chapter = chapter_of(cfg, f);
    int split = chapter == 3 || chapter == 4 || (chapter >= 5 && (f->pp > 1 || f->tp > 1));
    if ((f->tp > 1 || f->pp > 1) && !split)
        return problem("--%s %d: chapter %02d has no %s (valid: --chapter 03, 04 or 05)",
                       f->tp > 1 ? "tp" : "pp", f->tp > 1 ? f->tp : f->pp, chapter,
                       f->tp > 1 ? "tensor parallelism" : "pipeline stages");
    if (chapter == 3 && strcmp(f->mp, "tensor") == 0 && f->pp > 1)
        return problem("--mp tensor has one stage (valid: --pp 1; stages with tp inside: --chapter 04)");
    if ((f->cp > 1 || f->sp) && chapter != 3)
        return problem("--%s is a flag of chapter 03, not %02d (valid: --chapter 03)", f->sp ? "sp" : "cp",
                       chapter);
    if (f->cp > 1 && cfg->model.seq % (2 * f->cp))
        return problem("--seq %d cannot be cut into 2 x --cp %d = %d equal chunks (valid: --seq a multiple "
                       "of 2 x cp = %d)",
                       cfg->model.seq, f->cp, 2 * f->cp, 2 * f->cp);
    if (f->sp && (strcmp(f->mp, "tensor") != 0 || f->cp > 1 || cfg->recompute))
        return problem("--sp is for --mp tensor, without --cp or --recompute (valid: as chapter 03 runs it)");
    if (f->sp && cfg->model.seq % f->tp)
        return problem("--sp: --seq %d is not a multiple of --tp %d (valid: --seq a multiple of --tp)",
                       cfg->model.seq, f->tp);
    if (chapter == 3 && strcmp(f->mp, "layer") == 0 && f->tp > 1)
        return problem("--tp is for --mp tensor (the layer split has --pp stages)");
    int zero = flag_given(cfg, "--zero") || f->zero_given ? f->zero : f->offload ? 2 : 1; /* 05's, 06's */
    if (chapter == 6 && f->offload && f->schedule == SCHED_INTERLEAVED)  /* 06's own check comes first */
        return problem(
            "--schedule interleaved with --offload is refused by chapter 06: the offloaded state is "
            "one range of units per stage, and interleaved's chunks are not one range (valid: gpipe, "
            "1f1b, zb-h1)");
    if (chapter == 6 && f->offload && flag_given(cfg, "--zero") && f->zero != 2)
        return problem(
            "--zero %d with --offload is unsupported: chapter 06 offloads the stage-2 partitioning "
            "only (valid: --zero 2)",
            f->zero);
    /* the programs' own rules, asked of the code 05 and 06 run (layout_rules.h, layer_split.h) */
    const char *refused = chapter >= 5 ? zero_flags_problem(cfg, zero, f->pp, f->tp, 0) : NULL;
    if (refused) return refused;
    int stages = chapter == 3 && f->tp > 1 ? 1 : f->pp;      /* 03's tensor split is one stage */
    int stage_copy = chapter >= 4 && f->virtual_chunks <= 1; /* 04's pipeline.h */
    if ((refused = tied_embeddings_problem(cfg, stages, stage_copy, chapter >= 5 ? zero : 0,
                                           chapter == 6 && f->offload)))
        return refused;
    if (f->virtual_chunks > 1 && f->schedule != SCHED_INTERLEAVED)
        return problem("--virtual %d is for --schedule interleaved", f->virtual_chunks);
    if ((refused = layer_split_pieces_problem(f->pp, f->virtual_chunks, cfg->model.layers))) return refused;
    if (f->tp > 1 && (refused = tensor_parallel_problem(&cfg->model, f->tp))) return refused;
    if (f->split[0] && chapter >= 3 && !(chapter == 3 && f->tp > 1)) { /* one number a piece, or refused */
        int blocks[MAX_LAYERS];
        layer_split_parse_chunks(f->split, f->pp, f->virtual_chunks, cfg->model.layers, blocks);
    }
    if (f->schedule == SCHED_INTERLEAVED && cfg->micro % f->pp)
        return problem("--schedule interleaved needs --micro %d to be a multiple of --pp %d", cfg->micro,
                       f->pp);
    if (split && strcmp(f->dp_mode, "overlap") == 0)
        return problem("--dp-mode overlap with a model split is refused by chapters 03-05 "
                       "(valid: --dp-mode naive or flat)");
    if (chapter == 1 && f->dp > 1)
        return problem("--chapter 01 runs on one device, not --dp %d (valid: --dp 1)", f->dp);
    if (flag_given(cfg, "--zero") && chapter != 5 && chapter != 6)
        return problem("--zero is a flag of chapters 05 and 06, not %02d", chapter);
    if (f->offload && chapter != 6) return problem("--offload is a flag of chapter 06, not %02d", chapter);
    if (f->dpu && !f->offload)
        return problem(
            "--dpu needs --offload (the delayed update overlaps the host's AdamW with the device)");
    if (flag_given(cfg, "--prefetch") && chapter < 5) /* 05's and 06's: zero_flags_problem */
        return problem("--prefetch needs --zero 3 (only stage 3 gathers parameters)");
    if (f->time_csv[0] && !f->machine[0])
        return problem("--time-csv needs --machine FILE (the constants the time is computed from)");
    int pieces = f->dp * cfg->micro;
    if (cfg->batch < pieces || cfg->batch % pieces)
        return problem("--batch %d does not split into %d ranks x --micro %d (valid: a multiple of %d)",
                       cfg->batch, f->dp, cfg->micro, pieces);
    return NULL;
}

static void check_plan(const Config *cfg, const PlanFlags *f) {
    const char *why = layout_problem(cfg, f);
    if (why) fatal(EXIT_USAGE, "%s", why);
}

/* The layout the flags name (06 without --offload is 05's program). */
static PlanLayout layout_of(const Config *cfg, const PlanFlags *f) {
    int program = chapter_of(cfg, f);
    PlanLayout l = {.chapter = program == 6 && !f->offload ? 5 : program,
                    .dp = f->dp,
                    .tp = f->tp,
                    .pp = f->pp,
                    .schedule = f->schedule,
                    .chunks = f->virtual_chunks,
                    .split = f->split,
                    .cp = f->cp,
                    .sp = f->sp,
                    .zero = f->zero,
                    .prefetch = f->prefetch,
                    .dpu = f->dpu,
                    .threads = f->threads ? f->threads : omp_get_max_threads(),
                    .dp_mode = strcmp(f->dp_mode, "naive") == 0  ? DP_NAIVE
                               : strcmp(f->dp_mode, "flat") == 0 ? DP_FLAT
                                                                 : DP_OVERLAP,
                    .bucket_bytes = f->bucket_mb * 1048576.0,
                    .ring = strcmp(f->allreduce, "ring") == 0};
    if (l.chapter == 5 && !flag_given(cfg, "--zero") && !f->zero_given) l.zero = 1; /* 05's default */
    if (l.chapter == 6) l.zero = 2;
    return l;
}

static const char *chapter_program(int chapter) {
    static const char *names[] = {"",
                                  "01_single_gpu/train",
                                  "02_data_parallel/train",
                                  "03_model_parallel/train",
                                  "04_pipeline/train",
                                  "05_zero/train",
                                  "06_offload/train"};
    return names[chapter];
}

/* ---- the papers' numbers ---- */

/* ZeRO, Figure 1: Psi parameters, N devices, mixed-precision Adam (K = 12). */
static void zero_table(const PlanFlags *f, int half) {
    printf("model state per device, %.4g parameters on %d devices, %s Adam (GB = 1e9 bytes)\n", f->params,
           f->gpus, half ? "mixed-precision" : "fp32");
    static const char *names[] = {"baseline", "P_os", "P_os+g", "P_os+g+p"};
    printf("  %-9s %5s %12s %12s %12s %10s\n", "stage", "zero", "params", "grads", "optimizer", "total GB");
    for (int stage = 0; stage <= 3; stage++) {
        double p, g, o;
        plan_model_state(f->params, f->params / f->gpus, stage, half, &p, &g, &o);
        printf("  %-9s %5d %12.4g %12.4g %12.4g %10.1f\n", names[stage], stage, p, g, o, (p + g + o) / 1e9);
    }
}

/* ZeRO-Offload's capacity claim, from the model state per parameter on the
 * device: 16 bytes (16 bits: 2 + 2 + 12) without offload, chapter 06's 2
 * with it; the device's memory less a reserve for what is not model state. */
static void offload_capacity(const PlanFlags *f) {
    if (f->reserve >= f->gpu_mem)
        fatal(EXIT_USAGE,
              "--reserve %zu bytes is not below --gpu-mem %zu: it leaves no memory for the model state "
              "(valid: --reserve 1..%zu bytes with this --gpu-mem)",
              f->reserve, f->gpu_mem, f->gpu_mem - 1); /* both at least 1: FLAG_BYTES */
    double p, g, o;
    plan_model_state(1, 1, 0, 1, &p, &g, &o);
    double usable = (double)f->gpu_mem - (double)f->reserve, on_device = p + g + o, offloaded = p;
    printf("largest model on one device of %.2f GiB, %.2f GiB reserved for activations and buffers\n",
           f->gpu_mem / 1073741824.0, f->reserve / 1073741824.0);
    printf("  %-44s %6s %10s\n", "", "B/param", "params");
    printf("  %-44s %6.0f %9.2fB\n", "without offload (params, grads, Adam state)", on_device,
           usable / on_device / 1e9);
    printf("  %-44s %6.0f %9.2fB\n", "without offload, DDP's gradient buckets too", on_device + g,
           usable / (on_device + g) / 1e9);
    printf("  %-44s %6.0f %9.2fB\n", "with offload (16-bit params on the device)", offloaded,
           usable / offloaded / 1e9);
}

/* ---- the plan of a run ---- */

static void print_memory(const PlanMemory *m) {
    for (int s = 0; s < SPACE_COUNT; s++) {
        size_t total = 0;
        for (int c = 0; c < CAT_COUNT; c++) {
            if (!m->bytes[s][c]) continue;
            printf("  %-6s %-12s %14zu %10.2f MiB\n", space_name(s), category_name(c), m->bytes[s][c],
                   m->bytes[s][c] / 1048576.0);
            total += m->bytes[s][c];
        }
        if (total)
            printf("  %-6s %-12s %14zu %10.2f MiB\n", space_name(s), "(sum)", total, total / 1048576.0);
    }
}

static void print_traffic(const PlanLayout *l, const PlanTraffic *t) {
    printf("  %-16s %14.0f\n  %-16s %14.0f\n  %-16s %14.0f\n", "all-reduce", t->allreduce, "reduce-scatter",
           t->reduce_scatter, "all-gather", t->allgather);
    if (t->send) printf("  %-16s %14.0f\n", "send", t->send);
    printf("  %-16s %14.0f\n", "(sum)", t->allreduce + t->reduce_scatter + t->allgather + t->send);
    if (t->tp_allreduce && !l->sp)
        printf("  of the all-reduce, %.0f in the tensor group's %.0f calls (activations, B x T x C fp32)\n",
               t->tp_allreduce, t->tp_allreduce_calls);
    if (t->tp_allreduce && l->sp)
        printf("  of the all-reduce, %.0f in the tensor group's %.0f calls (the layernorms' gradients)\n",
               t->tp_allreduce, t->tp_allreduce_calls);
    if (t->cp_send)
        printf("  of the send, %.0f round the context-parallel ring in %.0f calls\n", t->cp_send,
               t->cp_send_calls);
    double ring_calls = t->allreduce_calls - t->tp_allreduce_calls;
    if (l->ring && ring_calls > 0) /* the ring's chunks differ by rank: this is replica 0's place */
        printf("  of the all-reduce, %.0f in %.0f ring call%s, as replica 0 sends them (another: +-1 element "
               "a chunk)\n",
               t->allreduce - t->tp_allreduce, ring_calls, ring_calls > 1 ? "s" : "");
    if (l->chapter == 6)
        printf("  %-16s %14.0f\n  %-16s %14.0f\n", "device to host", t->to_host, "host to device",
               t->to_device);
}

/* The ranks of one replica (pp x tp of them; the replicas hold and send alike): same_as[r] is
 * the first of them whose plan equals rank r's. */
static int group_ranks(const PlanLayout *l, const PlanMemory *m, const PlanTraffic *t, int *same_as) {
    int n = plan_replica_ranks(l), groups = 0;
    for (int r = 0; r < n; r++) {
        same_as[r] = r;
        for (int q = 0; q < r; q++)
            if (!memcmp(&m[q], &m[r], sizeof *m) && !memcmp(&t[q], &t[r], sizeof *t)) {
                same_as[r] = q;
                break;
            }
        groups += same_as[r] == r;
    }
    return groups;
}

/* Every rank's bytes per step on each axis of the grid, summed over the world: run.csv's
 * bytes_{dp,pp,cp,tp}_per_step (02-04, and 05-06 with stages or slices), one axis a line. */
static void print_axis_bytes(const Config *cfg, const PlanLayout *l) {
    static const char *names[] = {"dp", "pp", "cp", "tp"};
    double axis[4] = {0};
    for (int r = 0; r < plan_ranks(l); r++) { /* every rank: the ring's chunks differ by rank */
        PlanTraffic t;
        plan_traffic(cfg, l, r, &t);
        plan_axis_bytes(l, &t, axis);
    }
    printf("\nbytes sent per step on each grid axis, all %d rank%s together (run.csv bytes_AXIS_per_step)\n",
           plan_ranks(l), plan_ranks(l) > 1 ? "s" : "");
    for (int a = 0; a < 4; a++) printf("  axis %s %16.0f\n", names[a], axis[a]);
}

static void print_plan(const Config *cfg, const PlanLayout *l, int program, const PlanMemory *m,
                       const PlanTraffic *t) {
    const ModelConfig *mc = &cfg->model;
    ParamTable table;
    param_table_build(&table, mc);
    double P = table.num_params, tied = mc->tied ? P : P - (double)vocab_padded(mc->vocab) * mc->dmodel;
    param_table_free(&table);
    int world = plan_ranks(l), per_replica = plan_replica_ranks(l);
    printf("%s | %s | %d rank%s, dp %d | %s | %d layers, d %d, %d heads, seq %d, vocab %d | batch %d = %d "
           "ranks x %d micro-batches x %d sequences | %d thread%s per rank\n",
           PROGRAM, chapter_program(program), world, world > 1 ? "s" : "", l->dp,
           precision_name(cfg->precision), mc->layers, mc->dmodel, mc->heads, mc->seq, mc->vocab, cfg->batch,
           l->dp, cfg->micro, cfg->batch / l->dp / cfg->micro, l->threads, l->threads > 1 ? "s" : "");
    static const char *schedules[] = {"gpipe", "1f1b", "interleaved", "zb-h1"};
    if (l->chapter == 3)
        printf("%s over %d ranks (x dp %d)\n", l->tp > 1 ? "tensor parallel" : "layer split",
               l->tp > 1 ? l->tp : l->pp, l->dp);
    if (program != l->chapter) printf("without --offload, chapter %02d's program\n", l->chapter);
    if (l->chapter == 4 || (l->chapter >= 5 && per_replica > 1))
        printf("pp %d x tp %d x dp %d | schedule %s, %d chunk%s per stage\n", l->pp, l->tp, l->dp,
               schedules[l->schedule], l->chunks, l->chunks > 1 ? "s" : "");
    if (l->chapter == 5 && l->zero == 3) printf("zero 3 | prefetch %d\n", l->prefetch);
    if (l->chapter == 5 && l->zero < 3) printf("zero %d\n", l->zero);
    if (mc->tied)
        printf("parameters %.0f (the LM head tied to the embedding, as GPT-2 and llm.c)\n", P);
    else
        printf("parameters %.0f (%.0f with the LM head tied to the embedding, as GPT-2 and llm.c)\n", P,
               tied);
    double L = mc->layers, T = mc->seq, C = mc->dmodel;
    printf("FLOPs per token 6P + 12LTC = %.0f (llm.c's count, tied, 6P + 6LTC: %.0f); per step %.4g\n",
           6 * P + 12 * L * T * C, 6 * tied + 6 * L * T * C, (6 * P + 12 * L * T * C) * cfg->batch * T);
    int *same_as = xcalloc(per_replica, sizeof(int)), groups = group_ranks(l, m, t, same_as);
    if (groups == 1) {
        printf("\nmemory of each rank (peak bytes, as memory.csv; the same on every rank)\n");
        print_memory(&m[0]);
        printf("\nbytes each rank sends per step (as comm.h counts them)\n");
        print_traffic(l, &t[0]);
    }
    for (int r = 0; r < per_replica && groups > 1; r++) {
        if (same_as[r] != r) continue;
        int count = 0;
        for (int q = r; q < per_replica; q++) count += same_as[q] == r;
        printf("\nrank%s", count > 1 ? "s" : "");
        for (int q = r; q < per_replica; q++)
            if (same_as[q] == r) printf(" %d", q);
        printf(" (stage %d%s): memory (peak bytes, as memory.csv)\n", r / l->tp / (l->cp > 1 ? l->cp : 1),
               l->dp > 1 ? ", and the same of every replica" : "");
        print_memory(&m[r]);
        printf("  bytes sent per step (as comm.h counts them)\n");
        print_traffic(l, &t[r]);
    }
    free(same_as);
    if (l->chapter > 1) print_axis_bytes(cfg, l);
    if (strcmp(cfg->device, "cpu") != 0) /* the one row that is not exact off the CPU */
        printf("\nnote: --device %s: the workspace rows are the CPU backend's kernel workspaces; on CUDA,\n"
               "cuBLAS and the CUDA kernels keep their own, and comm.c's host staging (no NCCL) is not "
               "counted\n",
               cfg->device);
}

/* What --csv, --time-csv and --calibrate write, known by their first bytes (util.h's output-file
 * rule): each may replace only a new name or its own earlier output, checked before anything runs. */
#define MEMORY_CSV_HEADER "rank,space,category,peak_bytes"
#define TIME_CSV_HEADER "part,busy_ms,exposed_ms"
#define MACHINE_FILE_HEAD "# written by common/scripts/calibrate.sh"
static const OutputKind memory_csv_output = {.what = "a CSV of common/plan --csv (header " MEMORY_CSV_HEADER ")",
                                             .earlier = "--csv file",
                                             .signature = MEMORY_CSV_HEADER "\n",
                                             .signature_bytes = sizeof MEMORY_CSV_HEADER};
static const OutputKind time_csv_output = {.what = "a CSV of common/plan --time-csv (header " TIME_CSV_HEADER ")",
                                           .earlier = "--time-csv file",
                                           .signature = TIME_CSV_HEADER "\n",
                                           .signature_bytes = sizeof TIME_CSV_HEADER};

/* A run's memory.csv has the planner's header, but it is the run's: a file named as one of a run's
 * files, beside the run-info.txt that marks its --out directory, is never replaced. */
static void output_file_check_not_run(const char *flag, const char *path, const OutputKind *kind) {
    output_file_check(flag, path, kind);
    char dir[PATH_BYTES], info[JOINED_PATH_BYTES];
    directory_of(path, dir);
    snprintf(info, sizeof info, "%s/run-info.txt", dir);
    const char *name = strrchr(path, '/') ? strrchr(path, '/') + 1 : path;
    if (out_is_run_file(name) && access(info, F_OK) == 0)
        fatal(EXIT_USAGE, "%s %s: is a run's %s in its --out directory %s (valid: a name that is not one of the "
              "run's files)", flag, path, name, dir);
}

static const OutputKind machine_file_output = {.what = "a machine file of common/plan --calibrate",
                                               .earlier = "--calibrate file",
                                               .signature = MACHINE_FILE_HEAD,
                                               .signature_bytes = sizeof MACHINE_FILE_HEAD - 1};

static void write_csv(const char *path, const PlanLayout *l, const PlanMemory *m) {
    FILE *f = fopen(path, "w");
    if (!f) fatal(EXIT_USAGE, "--csv %s: cannot write it", path);
    fprintf(f, MEMORY_CSV_HEADER "\n");
    for (int r = 0; r < plan_ranks(l); r++)
        for (int s = 0; s < SPACE_COUNT; s++)
            for (int c = 0; c < CAT_COUNT; c++)
                fprintf(f, "%d,%s,%s,%zu\n", r, space_name(s), category_name(c),
                        m[r % plan_replica_ranks(l)].bytes[s][c]);
    if (fclose(f) != 0) fatal(EXIT_USAGE, "--csv %s: cannot write it", path);
}

/* The step time's parts: what each activity takes, and what of it the step waits for. */
static void print_time(const Config *cfg, const PlanLayout *l, const Machine *mach, const PlanTime *pt) {
    printf("\nstep time on %s (flops %.4g, alpha %.3g s, beta %.4g B/s; plan_time.h has the formulas)\n",
           mach->name, mach->flops, mach->alpha_s, mach->beta_bytes_per_s);
    printf("  %-16s %12s %12s\n", "part", "busy ms", "exposed ms");
    for (int p = 0; p < PART_COUNT; p++)
        printf("  %-16s %12.4f %12.4f\n", part_name(p), pt->busy_s[p] * 1e3, pt->exposed_s[p] * 1e3);
    printf("  %-16s %12s %12.4f\n", "step", "", pt->step_s * 1e3);
    printf("  FLOPs per step %.4g over %d rank%s: %.4g tokens/s\n", pt->flops_per_step, plan_ranks(l),
           plan_ranks(l) > 1 ? "s" : "", (double)cfg->batch * cfg->model.seq / pt->step_s);
}

static void write_time_csv(const char *path, const PlanTime *pt) {
    FILE *f = fopen(path, "w");
    if (!f) fatal(EXIT_USAGE, "--time-csv %s: cannot write it", path);
    fprintf(f, TIME_CSV_HEADER "\n");
    for (int p = 0; p < PART_COUNT; p++)
        fprintf(f, "%s,%.9g,%.9g\n", part_name(p), pt->busy_s[p] * 1e3, pt->exposed_s[p] * 1e3);
    fprintf(f, "step,%.9g,%.9g\n", pt->step_s * 1e3, pt->step_s * 1e3);
    if (fclose(f) != 0) fatal(EXIT_USAGE, "--time-csv %s: cannot write it", path);
}

/* --calibrate: common/scripts/calibrate.sh, found next to this program (common/plan), writes
 * FILE; the planner reads it back, so a file it cannot read is an error here. */
static void calibrate(const PlanFlags *f, const char *device) {
    output_file_check("--calibrate", f->calibrate, &machine_file_output);
    char self[PATH_BYTES], script[JOINED_PATH_BYTES];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n < 0) fatal(EXIT_RUNTIME, "--calibrate: cannot find this program's path (/proc/self/exe)");
    self[n] = 0;
    snprintf(script, sizeof script, "%s/scripts/calibrate.sh", dirname(self));
    char *args[] = {script, (char *)f->calibrate, "--device", (char *)device, f->quick ? "--quick" : NULL, NULL};
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        execv(script, args);
        _exit(127);
    }
    int status;
    if (pid < 0 || waitpid(pid, &status, 0) < 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
        fatal(EXIT_RUNTIME, "--calibrate: %s failed (exit status %d)", script,
              pid > 0 && WIFEXITED(status) ? WEXITSTATUS(status) : -1);
    Machine m;
    machine_read(f->calibrate, &m);
    printf("%s: wrote %s (name %s): flops %.4g, alpha_s %.3g, beta_bytes_per_s %.4g, h2d %.4g, d2h %.4g, "
           "cpu_adam %.4g, device_adam %.4g params/s, device_mem %.4g bytes\n",
           PROGRAM, f->calibrate, m.name, m.flops, m.alpha_s, m.beta_bytes_per_s, m.h2d_bytes_per_s,
           m.d2h_bytes_per_s, m.cpu_adam_params_per_s, m.device_adam_params_per_s, m.device_mem_bytes);
}

/* --by-hand: exercise 06.3's numbers (plan_by_hand.c) against the planner's for its layout
 * (the model flags' shape on --dp ranks, 2 by default), bytes to the byte and the step to 1e-6 of it. */
static void by_hand(const Config *cfg, const PlanFlags *f) {
    if (!f->machine[0]) fatal(EXIT_USAGE, "--by-hand needs --machine FILE (the constants of the step time)");
    const ModelConfig *mc = &cfg->model;
    int ranks = flag_given(cfg, "--dp") ? f->dp : 2;
    if (cfg->micro != 1 || cfg->recompute)
        fatal(EXIT_USAGE,
              "--by-hand plans one micro-batch without recomputation (valid: --micro 1, no --recompute)");
    if (cfg->batch % ranks)
        fatal(EXIT_USAGE,
              "--by-hand: --batch %d does not divide among --dp %d ranks (valid: a multiple of %d)",
              cfg->batch, ranks, ranks);
    ParamTable table;
    param_table_build(&table, mc);
    for (int u = LAYER_EMBEDDING; u <= mc->layers; u++) {
        char unit[32] = "the embedding";
        if (u == mc->layers)
            snprintf(unit, sizeof unit, "the head");
        else if (u != LAYER_EMBEDDING)
            snprintf(unit, sizeof unit, "block %d", u);
        if (table_unit(&table, u)->numel % ranks)
            fatal(EXIT_USAGE,
                  "--by-hand plans shards without padding, and %s of this model has %zu parameters, not a "
                  "multiple of --dp %d (valid: a --dmodel that is a multiple of %d)",
                  unit, table_unit(&table, u)->numel, ranks, ranks);
    }
    param_table_free(&table);
    Config mine = *cfg;
    mine.precision = PRECISION_BF16;
    PlanLayout l = {.chapter = 5,
                    .dp = ranks,
                    .tp = 1,
                    .pp = 1,
                    .chunks = 1,
                    .zero = 1,
                    .dp_mode = DP_FLAT,
                    .threads = f->threads ? f->threads : omp_get_max_threads()};
    Machine mach;
    machine_read(f->machine, &mach);
    PlanMemory m;
    PlanTraffic t;
    PlanTime pt;
    plan_memory(&mine, &l, 0, &m);
    plan_traffic(&mine, &l, 0, &t);
    plan_time(&mine, &l, &t, &mach, &pt);
    ByHand h = {0};
    ByHandLayout layout = {mc->vocab, mc->seq, mc->dmodel, mc->layers, ranks, cfg->batch};
    plan_by_hand(&layout, &mach, &h);
    struct {
        const char *what;
        double yours, planner, tolerance;
    } rows[] = {{"device params bytes", h.params_bytes, m.bytes[SPACE_DEVICE][CAT_PARAMS], 0.5},
                {"device grads bytes", h.grads_bytes, m.bytes[SPACE_DEVICE][CAT_GRADS], 0.5},
                {"device optimizer bytes", h.optimizer_bytes, m.bytes[SPACE_DEVICE][CAT_OPTIMIZER], 0.5},
                {"bytes sent per step", h.sent_bytes, t.allreduce + t.reduce_scatter + t.allgather, 0.5},
                {"step ms", h.step_ms, pt.step_s * 1e3, 1e-6 * pt.step_s * 1e3}};
    printf("exercise 06.3: mpirun -np %d 05_zero/train --vocab %d --seq %d --dmodel %d --layers %d "
           "--batch %d --zero 1 --precision bf16, on %s\n",
           ranks, mc->vocab, mc->seq, mc->dmodel, mc->layers, cfg->batch, mach.name);
    printf("  %-24s %16s %16s  %s\n", "", "yours", "the planner's", "");
    int wrong = 0;
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        double d = rows[i].yours - rows[i].planner;
        int ok = d <= rows[i].tolerance && -d <= rows[i].tolerance;
        wrong += !ok;
        int digits = i < 4 ? 0 : 4; /* bytes whole, the step in ms */
        printf("  %-24s %16.*f %16.*f  %s\n", rows[i].what, digits, rows[i].yours, digits, rows[i].planner,
               ok ? "ok" : "WRONG");
    }
    printf("%s\n", wrong ? "some differ: see course.md, exercise 06.3" : "all agree");
    exit(wrong ? 1 : 0);
}

/* --search: the layouts the planner covers on N ranks, with the model, batch and precision given. */
typedef struct {
    char name[96]; /* as the chapter's command line adds them */
    PlanFlags flags;
    double step_s, device, host;
    char why[512]; /* empty: it fits */
} Candidate;

static size_t space_sum(const PlanMemory *m, int space, int *largest) {
    size_t sum = 0;
    *largest = 0;
    for (int c = 0; c < CAT_COUNT; c++) {
        sum += m->bytes[space][c];
        if (m->bytes[space][c] > m->bytes[space][*largest]) *largest = c;
    }
    return sum;
}

/* One candidate: chapter ch on dp x pp x cp x tp ranks, with its own flags. */
static Candidate *candidate(Candidate *list, int *n, const PlanFlags *base, const char *ch, int dp, int pp,
                            int cp, int tp) {
    Candidate *c = &list[(*n)++];
    memset(c, 0, sizeof *c);
    c->flags = *base;
    PlanFlags *f = &c->flags;
    snprintf(f->chapter, sizeof f->chapter, "%s", ch);
    f->dp = dp, f->pp = pp, f->cp = cp, f->tp = tp;
    f->schedule = SCHED_1F1B, f->virtual_chunks = 1, f->zero = 0, f->zero_given = 0;
    f->offload = f->dpu = f->sp = 0;
    snprintf(f->dp_mode, sizeof f->dp_mode, "flat");
    snprintf(f->mp, sizeof f->mp, "%s", tp > 1 ? "tensor" : "layer");
    int len = snprintf(c->name, sizeof c->name, "%s", ch);
    if (strcmp(ch, "01") != 0 && (pp > 1 || tp > 1 || cp > 1))
        len += snprintf(c->name + len, sizeof c->name - len, " --dp %d", dp);
    if (pp > 1) len += snprintf(c->name + len, sizeof c->name - len, " --pp %d", pp);
    if (tp > 1) len += snprintf(c->name + len, sizeof c->name - len, " --tp %d", tp);
    if (cp > 1) snprintf(c->name + len, sizeof c->name - len, " --cp %d", cp);
    return c;
}

/* The candidate's name and flags, with more of both. */
static void also(Candidate *c, const char *words) {
    size_t len = strlen(c->name);
    snprintf(c->name + len, sizeof c->name - len, " %s", words);
}

/* Every layout of N ranks the planner covers: one replica per rank (01; 02's
 * modes; 05's stages; 06 with and without the delayed update), and every
 * split of N = dp x pp x tp with pp or tp above 1 (04's schedules; 05's
 * ZeRO-1 and -2 inside it; 06 --offload), and 03's context parallelism over
 * cp ranks of dp x cp. At most 64 x 9 + 8 candidates. */
static int candidates(const PlanFlags *base, int N, Candidate *list) {
    int n = 0;
    Candidate *c;
    if (N == 1) candidate(list, &n, base, "01", 1, 1, 1, 1);
    if (N > 1) {
        also(candidate(list, &n, base, "02", N, 1, 1, 1), "--dp-mode flat");
        c = candidate(list, &n, base, "02", N, 1, 1, 1);
        also(c, "--dp-mode overlap");
        snprintf(c->flags.dp_mode, sizeof c->flags.dp_mode, "overlap");
        for (int z = 0; z <= 3; z++) {
            char words[16];
            snprintf(words, sizeof words, "--zero %d", z);
            c = candidate(list, &n, base, "05", N, 1, 1, 1);
            also(c, words);
            c->flags.zero = z, c->flags.zero_given = 1;
        }
    }
    for (int dpu = 0; dpu <= 1; dpu++) {
        c = candidate(list, &n, base, "06", N, 1, 1, 1);
        also(c, dpu ? "--offload --dpu" : "--offload");
        c->flags.offload = 1, c->flags.dpu = dpu;
    }
    for (int tp = 1; tp <= N; tp++)
        for (int pp = 1; pp * tp <= N; pp++) {
            if (N % (pp * tp) || pp * tp == 1 || n > 64 * 9) continue;
            int dp = N / (pp * tp);
            static const char *schedules[] = {"gpipe", "1f1b", "interleaved", "zb-h1"};
            for (int s = 0; s < 4; s++) {
                if (pp == 1 && s != SCHED_1F1B) continue; /* one stage: no schedule */
                c = candidate(list, &n, base, "04", dp, pp, 1, tp);
                char words[48];
                snprintf(words, sizeof words, "--schedule %s%s", schedules[s],
                         s == SCHED_INTERLEAVED ? " --virtual 2" : "");
                if (pp > 1) also(c, words);
                c->flags.schedule = s, c->flags.virtual_chunks = s == SCHED_INTERLEAVED ? 2 : 1;
            }
            for (int z = 1; z <= 2; z++) {
                c = candidate(list, &n, base, "05", dp, pp, 1, tp);
                also(c, z == 1 ? "--zero 1" : "--zero 2");
                c->flags.zero = z, c->flags.zero_given = 1;
            }
            c = candidate(list, &n, base, "06", dp, pp, 1, tp);
            also(c, "--offload");
            c->flags.offload = 1;
        }
    for (int cp = 2; cp <= N && n < 64 * 9 + 8; cp++)
        if (N % cp == 0) candidate(list, &n, base, "03", N / cp, 1, cp, 1);
    return n;
}

/* The command line of a candidate, as the rules that ask which flags were typed see it: the
 * flags the candidate's name adds, instead of the same flags on the planner's command line. */
static Config candidate_typed(const Config *cfg, const PlanFlags *f) {
    Config typed = *cfg;
    flag_set_given(&typed, "--schedule", strcmp(f->chapter, "04") == 0 && f->pp > 1);
    flag_set_given(&typed, "--virtual", f->virtual_chunks > 1);
    flag_set_given(&typed, "--zero", f->zero_given);
    flag_set_given(&typed, "--dp-mode", strcmp(f->chapter, "02") == 0);
    return typed;
}

/* A layout whose losses are not 01's at the same step: 06's delayed parameter update. */
static int changes_losses(const PlanFlags *f) {
    return f->dpu;
}

static void search(const Config *cfg, const PlanFlags *f) {
    if (!flag_given(cfg, "--gpus") || !f->machine[0])
        fatal(EXIT_USAGE, "--search needs --gpus N (the ranks) and --machine FILE (the times to rank by)");
    Machine mach;
    machine_read(f->machine, &mach);
    double budget = flag_given(cfg, "--gpu-mem") ? (double)f->gpu_mem : mach.device_mem_bytes;
    printf("layouts of %d rank%s, %.4g bytes of device memory each, ranked by the step predicted on %s\n",
           f->gpus, f->gpus > 1 ? "s" : "", budget, mach.name);
    Candidate *list = xcalloc(64 * 9 + 16, sizeof *list);
    int n = candidates(f, f->gpus, list), *order = xcalloc(n, sizeof(int)), fits = 0;
    for (int i = 0; i < n; i++) {
        Candidate *c = &list[i];
        Config typed = candidate_typed(cfg, &c->flags);
        const char *why = layout_problem(&typed, &c->flags);
        if (why) {
            snprintf(c->why, sizeof c->why, "%s", why);
            continue;
        }
        PlanLayout l = layout_of(cfg, &c->flags);
        int ranks = plan_replica_ranks(&l), fullest = 0, largest = 0;
        PlanMemory *m = xcalloc(ranks, sizeof *m);
        PlanTraffic *t = xcalloc(ranks, sizeof *t);
        for (int r = 0; r < ranks; r++) { /* the rank with the most device memory decides */
            plan_memory(cfg, &l, r, &m[r]);
            plan_traffic(cfg, &l, r, &t[r]);
            int cat, host_cat;
            double device = space_sum(&m[r], SPACE_DEVICE, &cat),
                   host = space_sum(&m[r], SPACE_HOST, &host_cat);
            if (device > c->device) c->device = device, fullest = r, largest = cat;
            if (host > c->host) c->host = host;
        }
        PlanTime pt;
        plan_time_slowest(cfg, &l, t, &mach, &pt);
        c->step_s = pt.step_s;
        if (c->device > budget)
            snprintf(c->why, sizeof c->why,
                     "device memory %.4g bytes > %.4g (rank %d; the most: %s, %zu bytes)", c->device, budget,
                     fullest, category_name(largest), m[fullest].bytes[SPACE_DEVICE][largest]);
        else
            order[fits++] = i;
        free(m);
        free(t);
    }
    for (int a = 1; a < fits; a++) /* by predicted step, fastest first */
        for (int b = a; b > 0 && list[order[b]].step_s < list[order[b - 1]].step_s; b--) {
            int swap = order[b];
            order[b] = order[b - 1];
            order[b - 1] = swap;
        }
    int width = 22; /* the longest name */
    for (int i = 0; i < n; i++) width = (int)strlen(list[i].name) > width ? (int)strlen(list[i].name) : width;
    printf("  %4s  %-*s %14s %14s %12s\n", "rank", width, "layout", "device bytes", "host bytes", "step ms");
    for (int exact = 1, rank = 0; exact >= 0; exact--, rank = 0) /* the same losses as 01, then the others */
        for (int r = 0; r < fits; r++) {
            const Candidate *c = &list[order[r]];
            if (changes_losses(&c->flags) == exact) continue;
            if (!exact && !rank)
                printf("ranked apart, their losses not 01's (--dpu, the delayed parameter update: each "
                       "gradient is taken at weights one step stale)\n");
            printf("  %4d  %-*s %14.0f %14.0f %12.4f%s\n", ++rank, width, c->name, c->device, c->host,
                   c->step_s * 1e3, exact ? "" : "  changes the losses: delayed update");
        }
    if (fits < n) printf("does not fit, or not a layout of these flags\n");
    for (int i = 0; i < n; i++)
        if (list[i].why[0]) printf("  %-*s %s\n", width, list[i].name, list[i].why);
    free(order);
    free(list);
}

int main(int argc, char **argv) {
    Config cfg;
    PlanFlags f = {0};
    ChapterFlags chapter = {.flags = plan_flags, .values = &f, .multi_rank = 1};
    if (config_read(&cfg, argc, argv, PROGRAM, &chapter)) {
        config_print_help(
            PROGRAM,
            "Predict a run's memory (by memory.csv's space and category) and the bytes it sends (by\n"
            "collective, and on each grid axis as run.csv's bytes_AXIS_per_step), from the chapter's\n"
            "own flags, without running it; or the papers' tables.",
            &chapter);
        return 0;
    }
    if (f.csv[0]) output_file_check_not_run("--csv", f.csv, &memory_csv_output);
    if (f.time_csv[0]) output_file_check_not_run("--time-csv", f.time_csv, &time_csv_output);
    if (f.calibrate[0]) {
        calibrate(&f, cfg.device);
        return 0;
    }
    if (f.quick) fatal(EXIT_USAGE, "--quick is a flag of --calibrate FILE");
    if (f.zero_table) {
        zero_table(&f, !flag_given(&cfg, "--precision") || cfg.precision != PRECISION_FP32);
        return 0;
    }
    if (f.offload_capacity) {
        offload_capacity(&f);
        return 0;
    }
    if (f.search) {
        search(&cfg, &f);
        return 0;
    }
    if (f.by_hand) by_hand(&cfg, &f);
    check_plan(&cfg, &f);
    Machine mach;
    if (f.machine[0]) machine_read(f.machine, &mach); /* a bad file refused before anything is printed */
    PlanLayout l = layout_of(&cfg, &f);
    int per_replica = plan_replica_ranks(&l); /* the replicas' ranks hold and send alike */
    PlanMemory *m = xcalloc(per_replica, sizeof *m);
    PlanTraffic *t = xcalloc(per_replica, sizeof *t);
    for (int r = 0; r < per_replica; r++) {
        plan_memory(&cfg, &l, r, &m[r]);
        plan_traffic(&cfg, &l, r, &t[r]);
    }
    print_plan(&cfg, &l, chapter_of(&cfg, &f), m, t);
    if (f.csv[0]) write_csv(f.csv, &l, m);
    if (f.machine[0]) {
        PlanTime pt;
        plan_time_slowest(&cfg, &l, t, &mach, &pt);
        print_time(&cfg, &l, &mach, &pt);
        if (f.time_csv[0]) write_time_csv(f.time_csv, &pt);
    }
    free(m);
    free(t);
    return 0;
}
