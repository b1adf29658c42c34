/* common/plan: the planner. Memory, communication and step time of a
 * chapter's run, predicted without running it, by the chapter's own program
 * (plan_dry.h: one dry run per distinct rank); the papers' tables.
 *
 *   common/plan [the chapter's flags] [--chapter 01..06] [--dp D] [--pp P] [--csv FILE]
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
 *       commbench, adambench, devicebench, 02 flat against 02 overlap for the
 *       fraction of overlapped communication that hides: common/scripts/calibrate.sh) on the
 *       device --device names (auto: the GPU if one is visible) and write them
 *       to FILE, which the planner then reads back and --machine takes
 *   common/plan [the model's and batch's flags] --search --gpus N [--gpu-mem BYTES] --machine FILE
 *       every layout of the chapters on N ranks (one replica a rank; dp x pp x
 *       tp splits; 03's dp x cp), those whose fullest rank's device memory
 *       fits ranked by predicted step time (those whose losses are not 01's,
 *       06 --dpu, ranked apart and marked "changes the losses"), each other
 *       with the reason it does not fit or the chapter's refusal (--gpu-mem
 *       defaults to the machine's device_mem_bytes); the first three steps part
 *       by part (communication priced by the machine's overlap), and how many
 *       the host decides (06: the CPU's AdamW and the copies)
 *   common/plan --zero-table [--params P | the model's flags] [--gpus N] [--precision bf16|fp32]
 *       the ZeRO paper's model-state table (Rajbhandari et al., 2020, Figure 1):
 *       mixed-precision Adam unless --precision fp32 is given; with a model's
 *       flags, from chapter 05's dry runs at each stage beside the formula
 *   common/plan --offload-capacity [--gpu-mem BYTES] [--reserve BYTES]
 *       the largest model one device trains with and without offload
 *       (Ren et al., 2021, ZeRO-Offload); --reserve below --gpu-mem
 *
 * The planner declares only its own flags (the table below). Every other
 * flag is the chapter's: it is handed to the chapter's program, which reads
 * and checks it with its own table, so a plan takes exactly the flags the
 * program takes, with the program's ranges and refusals in its own words.
 * A run's command line pastes in: `mpirun -np 2 05_zero/train --zero 2
 * --precision bf16` is `common/plan --dp 2 --zero 2 --precision bf16`, and
 * `mpirun -np 8 04_pipeline/train --pp 2 --tp 2` is `common/plan --pp 2 --tp
 * 2 --dp 2`: the world is dp x pp x cp x tp, --dp and --pp handed on where
 * the program takes them (02 and 05's one stage take their replicas, 03's
 * layer split its stages, from the world). The chapter follows from the flags
 * (--offload: 06; --zero: 05; --mp: 03; --pp or --tp above 1, --schedule,
 * --virtual: 04; --dp above 1: 02; else 01) or --chapter. Exit status 2 on
 * bad input, with one line naming the flag. */
#include "common/run/config.h" /* Config and the flag tables */
#include "common/run/run_csv.h" /* steps.csv, memory.csv, run.csv */
#include "common/device/device.h" /* mem_alloc, copies, streams, timers */
#include "common/model/model.h" /* GPT, its forward and backward */
#include "common/model/param_table.h" /* the parameter table and its units */
#include "common/tools/plan_by_hand.h" /* exercise 06.3's plan by hand */
#include "common/tools/plan_dry.h" /* the planner's dry runs */
#include "common/tools/plan_layout.h" /* a layout for the time model */
#include "common/tools/plan_time.h" /* the step time from a machine's constants */
#include "common/comm/grid.h" /* the process grid: dp x pp x cp x tp */
#include "common/core/util.h" /* fatal, log_info, exit codes, flag parsing */

#include <libgen.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define PROGRAM "common/plan"

/* ---- the planner's own flags (the chapter's pass through to its program) ---- */
typedef struct {
    char chapter[8]; /* auto, 01 .. 06 */
    int threads;
    char csv[PATH_BYTES];
    char machine[PATH_BYTES], time_csv[PATH_BYTES], calibrate[PATH_BYTES];
    int quick, search, by_hand;
    int zero_table, offload_capacity;
    double params;
    int gpus;
    size_t gpu_mem, reserve;
} PlanFlags;

static const Flag plan_flags[] = {
    {.type = FLAG_SECTION, .help = "the layout (with the chapter's own flags, handed to its program: NN/train --help)"},
    {"--chapter", FLAG_CHOICE, FIELD(PlanFlags, chapter), .choices = "auto|01|02|03|04|05|06",
     .noun = "chapter", .def = "auto", .usage = "--chapter 01..06",
     .help = "the program to plan (default auto: --offload 06, --zero 05, --mp 03, --pp or --tp\n"
             "above 1 or --schedule 04, --dp above 1 02, else 01); the world is --dp x --pp x\n"
             "--cp x --tp ranks (--dp: mpirun -np of 02 and of 05-06 with one stage; --pp: 03's\n"
             "layer split's stages)"},
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
     .help = "measure this machine (01's step, commbench, adambench, devicebench, 02 flat\n"
             "against overlap: common/scripts/calibrate.sh) on --device, and write its machine\n"
             "file to FILE (a new name or a machine file --calibrate wrote)",
     .record = FLAG_NOT_RECORDED},
    {"--quick", FLAG_SWITCH, FIELD(PlanFlags, quick), .usage = "--quick",
     .help = "--calibrate with tiny sizes and few repeats (seconds; noisier constants)",
     .record = FLAG_NOT_RECORDED},
    {"--search", FLAG_SWITCH, FIELD(PlanFlags, search), .usage = "--search",
     .help = "every layout on --gpus ranks: one replica a rank (01, 02, 05, 06), dp x pp x tp\n"
             "(04's schedules, 05's ZeRO-1/2, 06 --offload) and 03's dp x cp; those that fit\n"
             "--gpu-mem (default: the machine's device_mem_bytes) on their fullest rank ranked by\n"
             "step time (06 --dpu, whose losses are not 01's, ranked apart and marked), the others\n"
             "with the reason; the first three steps part by part (overlap priced by the machine\n"
             "file's fraction), and how many the host's AdamW and copies decide (06)"},
    {"--by-hand", FLAG_SWITCH, FIELD(PlanFlags, by_hand), .usage = "--by-hand",
     .help = "exercise 06.3: your plan of 05 --zero 1 --precision bf16 on --dp ranks (default 2;\n"
             "plan_by_hand.c), of the model flags' shape, next to the planner's, on the --machine\n"
             "FILE; exit 1 where they differ",
     .record = FLAG_NOT_RECORDED},
    {.type = FLAG_SECTION, .help = "the papers' numbers, from the same formulas (no model built)"},
    {"--zero-table", FLAG_SWITCH, FIELD(PlanFlags, zero_table), .usage = "--zero-table",
     .help = "model state per device at ZeRO stages 0-3 on --gpus, GB (1e9): with a model's flags,\n"
             "chapter 05's dry runs at each stage (memory.csv's params, grads, optimizer) beside the\n"
             "formula; without, the formula for --params",
     .record = FLAG_NOT_RECORDED},
    {"--params", FLAG_DOUBLE, FIELD(PlanFlags, params), 1, 1e15, .def = "7.5e9", .usage = "--params P",
     .help = "parameters of --zero-table (default {default}, the ZeRO paper's)"},
    {"--gpus", FLAG_INT, FIELD(PlanFlags, gpus), 1, 1000000, .def = "64", .usage = "--gpus N",
     .help = "data-parallel devices of --zero-table, ranks of --search (default {default})"},
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

/* ---- the command line: the planner's flags, and the chapter's ---- */

typedef struct {
    char **args; /* the chapter's flags, in order */
    int n;
} Args;

static void args_add(Args *a, const char *text) {
    a->args = realloc(a->args, (size_t)(a->n + 2) * sizeof *a->args);
    if (!a->args) fatal(EXIT_RUNTIME, "out of memory");
    a->args[a->n++] = strdup(text);
    if (!a->args[a->n - 1]) fatal(EXIT_RUNTIME, "out of memory");
    a->args[a->n] = NULL;
}

static void args_free(Args *a) {
    for (int i = 0; i < a->n; i++) free(a->args[i]);
    free(a->args);
    *a = (Args){0};
}

/* The row of the planner's table named by `arg` ("--csv" or "--csv=..."), or NULL. */
static const Flag *own_row(const char *arg) {
    for (const Flag *f = plan_flags; f->name || f->help; f++) { /* a section has help, the end neither */
        if (!f->name) continue;
        size_t n = strlen(f->name);
        if (strncmp(arg, f->name, n) == 0 && (arg[n] == '\0' || arg[n] == '=')) return f;
    }
    if (strcmp(arg, "--help") == 0 || strcmp(arg, "-h") == 0) return &plan_flags[0];
    return NULL;
}

/* argv into the planner's own flags (*own, argv[0] first) and the chapter's (*chapter). */
static void split_argv(int argc, char **argv, Args *own, Args *chapter) {
    args_add(own, argv[0]);
    for (int i = 1; i < argc; i++) {
        const Flag *f = own_row(argv[i]);
        Args *to = f ? own : chapter;
        args_add(to, argv[i]);
        int takes_value = f && f->type != FLAG_SWITCH && f->type != FLAG_SECTION && !strchr(argv[i], '=');
        if (takes_value && i + 1 < argc) args_add(to, argv[++i]);
    }
}

/* An axis's ranks as the chapter's flags give them (--dp 2): a whole number of at least 1. */
static int axis_of(const Args *a, const char *name) {
    const char *v = plan_arg_value(a->args, a->n, name);
    if (!v) return 1;
    char *end;
    long n = strtol(v, &end, 10);
    if (end == v || *end || n < 1 || n > 1048576)
        fatal(EXIT_USAGE, "%s %s: not a number of ranks (valid: 1..1048576)", name, v);
    return (int)n;
}

static int chapter_of(const PlanFlags *f, const Args *a) {
    if (strcmp(f->chapter, "auto") != 0) return f->chapter[1] - '0';
    if (plan_arg_given(a->args, a->n, "--offload")) return 6;
    if (plan_arg_given(a->args, a->n, "--zero")) return 5;
    if (plan_arg_given(a->args, a->n, "--mp")) return 3;
    if (axis_of(a, "--pp") > 1 || axis_of(a, "--tp") > 1 || plan_arg_given(a->args, a->n, "--schedule") ||
        plan_arg_given(a->args, a->n, "--virtual"))
        return 4;
    return axis_of(a, "--dp") > 1 ? 2 : 1;
}

static const char *chapter_name(int chapter) {
    static const char *names[] = {"",
                                  "01_single_gpu/train",
                                  "02_data_parallel/train",
                                  "03_model_parallel/train",
                                  "04_pipeline/train",
                                  "05_zero/train",
                                  "06_offload/train"};
    return names[chapter];
}

/* The chapter's program, beside this one: common/plan's folder's parent holds NN_name/train. */
static const char *program_path(int chapter) {
    static char paths[7][PATH_BYTES];
    if (!paths[chapter][0]) {
        char self[PATH_BYTES];
        ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
        if (n < 0) fatal(EXIT_RUNTIME, "cannot find this program's path (/proc/self/exe)");
        self[n] = 0;
        char *common = dirname(self);
        char *repo = dirname(common);
        if ((size_t)snprintf(paths[chapter], PATH_BYTES, "%s/%s", repo, chapter_name(chapter)) >= PATH_BYTES)
            fatal(EXIT_RUNTIME, "the path of %s is too long", chapter_name(chapter));
        if (access(paths[chapter], X_OK) != 0)
            fatal(EXIT_RUNTIME, "%s is not built (make)", paths[chapter]);
    }
    return paths[chapter];
}

/* The flags a chapter's program is handed: the user's, less the planner's --dp and --pp where the
 * program takes its replicas or stages from the world, and less what a dry run cannot do
 * (--save, --resume: no checkpoint is written or read; --device cuda: the CPU backend's buffers). */
static void chapter_args(int chapter, const Args *user, Args *out, int *cuda) {
    const char *program = program_path(chapter);
    int takes_dp = plan_program_takes(program, "--dp"), takes_pp = plan_program_takes(program, "--pp");
    static const char *dropped[] = {"--save",  "--resume",     "--save-every", "--out",
                                    "--steps", "--stop-after", "--overwrite",  NULL};
    for (int i = 0; i < user->n; i++) {
        const char *arg = user->args[i];
        int with_value = !strchr(arg, '=') && i + 1 < user->n;
        int drop = (!takes_dp && !strncmp(arg, "--dp", 4) && (arg[4] == '\0' || arg[4] == '=')) ||
                   (!takes_pp && !strncmp(arg, "--pp", 4) && (arg[4] == '\0' || arg[4] == '='));
        for (int k = 0; dropped[k] && !drop; k++) {
            size_t n = strlen(dropped[k]);
            drop = !strncmp(arg, dropped[k], n) && (arg[n] == '\0' || arg[n] == '=');
            if (drop && !strcmp(dropped[k], "--overwrite")) with_value = 0; /* a switch */
        }
        if (!strncmp(arg, "--device", 8) && (arg[8] == '\0' || arg[8] == '=')) {
            const char *v = arg[8] == '=' ? arg + 9 : i + 1 < user->n ? user->args[i + 1] : "";
            if (!strcmp(v, "cuda")) {
                *cuda = 1;
                args_add(out, "--device=cpu");
                i += arg[8] == '\0';
                continue;
            }
        }
        if (drop) {
            i += with_value;
            continue;
        }
        args_add(out, arg);
    }
}

/* The layout the flags name: the program, its flags, the world's axes. */
typedef struct {
    PlanDryLayout dry;
    Args args;
    int cuda; /* --device cuda was asked for: the CPU backend's buffers are planned */
} Layout;

static void layout_make(Layout *l, int chapter, const Args *user, int threads) {
    memset(l, 0, sizeof *l);
    chapter_args(chapter, user, &l->args, &l->cuda);
    int dp = axis_of(user, "--dp"), pp = axis_of(user, "--pp"), tp = axis_of(user, "--tp"),
        cp = axis_of(user, "--cp");
    double world = (double)dp * pp * tp * cp;
    if (world > 1048576) fatal(EXIT_USAGE, "--dp x --pp x --tp x --cp = %.0f ranks (valid: 1..1048576)", world);
    l->dry = (PlanDryLayout){.chapter = chapter,
                             .program = program_path(chapter),
                             .args = l->args.args,
                             .nargs = l->args.n,
                             .world = (int)world,
                             .dp = dp,
                             .pp = pp,
                             .cp = cp,
                             .tp = tp,
                             .threads = threads};
}

static void layout_free(Layout *l) {
    args_free(&l->args);
}

/* plan_time.h's description of the layout, from what the program read (run-info.txt). */
static PlanLayout time_layout(const Layout *l, const PlanDry *d) {
    const char *item;
    PlanLayout t = {.chapter = l->dry.chapter, .dp = l->dry.dp, .tp = l->dry.tp, .pp = l->dry.pp,
                    .cp = l->dry.cp, .chunks = 1, .schedule = SCHED_1F1B, .dp_mode = DP_FLAT};
    static const char *schedules[] = {"gpipe", "1f1b", "interleaved", "zb-h1"};
    if ((item = plan_dry_item(d, "--schedule")))
        for (int s = 0; s < 4; s++)
            if (!strcmp(item, schedules[s])) t.schedule = s;
    if ((item = plan_dry_item(d, "--virtual"))) t.chunks = atoi(item) > 0 ? atoi(item) : 1;
    if ((item = plan_dry_item(d, "--zero"))) t.zero = atoi(item);
    if ((item = plan_dry_item(d, "--prefetch"))) t.prefetch = atoi(item);
    if ((item = plan_dry_item(d, "--dpu"))) t.dpu = atoi(item);
    if ((item = plan_dry_item(d, "--sp"))) t.sp = atoi(item);
    t.ep = (item = plan_dry_item(d, "--ep")) && atoi(item) > 1 ? atoi(item) : 1;
    if ((item = plan_dry_item(d, "--bucket-mb"))) t.bucket_bytes = atof(item) * 1048576.0;
    if ((item = plan_dry_item(d, "--allreduce"))) t.ring = !strcmp(item, "ring");
    if ((item = plan_dry_item(d, "--dp-mode")))
        t.dp_mode = !strcmp(item, "naive") ? DP_NAIVE : !strcmp(item, "overlap") ? DP_OVERLAP : DP_FLAT;
    int offload = (item = plan_dry_item(d, "--offload")) && atoi(item);
    if (t.chapter == 6 && !offload) t.chapter = 5; /* 06 without --offload runs 05's step */
    if (t.chapter == 6) t.zero = 2;
    if (t.chapter == 3 && t.tp > 1) t.pp = 1;
    return t;
}

/* comm.h's ledger of one rank, as the time model's traffic. */
static PlanTraffic traffic_of(const PlanDryRank *r) {
    PlanTraffic t = {0};
    const CommLedger *g = &r->ledger;
    for (int a = 0; a <= COMM_COUNTERS; a++) {
        t.allreduce += g->bytes[COMM_KIND_ALLREDUCE][a], t.allreduce_calls += g->calls[COMM_KIND_ALLREDUCE][a];
        t.reduce_scatter += g->bytes[COMM_KIND_REDUCE_SCATTER][a];
        t.reduce_scatter_calls += g->calls[COMM_KIND_REDUCE_SCATTER][a];
        t.allgather += g->bytes[COMM_KIND_ALLGATHER][a], t.allgather_calls += g->calls[COMM_KIND_ALLGATHER][a];
        t.send += g->bytes[COMM_KIND_SEND][a] + g->bytes[COMM_KIND_BROADCAST][a];
        t.send_calls += g->calls[COMM_KIND_SEND][a] + g->calls[COMM_KIND_BROADCAST][a];
    }
    t.tp_allreduce = g->bytes[COMM_KIND_ALLREDUCE][GRID_TP], t.tp_allreduce_calls = g->calls[COMM_KIND_ALLREDUCE][GRID_TP];
    t.cp_send = g->bytes[COMM_KIND_SEND][GRID_CP], t.cp_send_calls = g->calls[COMM_KIND_SEND][GRID_CP];
    for (int a = 0; a <= COMM_COUNTERS; a++) t.alltoall += g->bytes[COMM_KIND_ALLTOALL][a];
    t.cp_alltoall_calls = g->calls[COMM_KIND_ALLTOALL][GRID_CP];
    t.ep_alltoall_calls = g->calls[COMM_KIND_ALLTOALL][GRID_COUNTER_EP];
    t.to_host = r->to_host, t.to_device = r->to_device;
    return t;
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


/* ---- the plan of a run ---- */

static void print_memory(const size_t bytes[SPACE_COUNT][CAT_COUNT]) {
    for (int s = 0; s < SPACE_COUNT; s++) {
        size_t total = 0;
        for (int c = 0; c < CAT_COUNT; c++) {
            if (!bytes[s][c]) continue;
            printf("  %-6s %-12s %14zu %10.2f MiB\n", space_name(s), category_name(c), bytes[s][c],
                   bytes[s][c] / 1048576.0);
            total += bytes[s][c];
        }
        if (total) printf("  %-6s %-12s %14zu %10.2f MiB\n", space_name(s), "(sum)", total, total / 1048576.0);
    }
}

/* One rank's bytes per step by collective (comm.h's ledger: every kind on every axis), and what
 * of them runs where; 06's host-device copies. */
static void print_traffic(const PlanDryRank *r, int offload) {
    const CommLedger *g = &r->ledger;
    double kind[COMM_KINDS] = {0}, sum = 0;
    for (int k = 0; k < COMM_KINDS; k++)
        for (int a = 0; a <= COMM_COUNTERS; a++) kind[k] += g->bytes[k][a];
    for (int k = 0; k < COMM_KINDS; k++) {
        if (k <= COMM_KIND_ALLGATHER || kind[k] > 0) printf("  %-16s %14.0f\n", comm_kind_name((CommKind)k), kind[k]);
        sum += kind[k];
    }
    printf("  %-16s %14.0f\n", "(sum)", sum);
    for (int k = 0; k < COMM_KINDS; k++)
        for (int a = 0; a < COMM_COUNTERS; a++) {
            double calls = g->calls[k][a], bytes = g->bytes[k][a];
            if (bytes <= 0 || bytes == kind[k]) continue; /* all of it on one axis: said below the axes */
            printf("  of the %s, %.0f on the %s axis in %.0f call%s\n", comm_kind_name((CommKind)k), bytes,
                   grid_counter_name(a), calls, calls == 1 ? "" : "s");
        }
    if (offload)
        printf("  %-16s %14.0f\n  %-16s %14.0f\n", "device to host", r->to_host, "host to device", r->to_device);
}

static int same_rank(const PlanDryRank *a, const PlanDryRank *b) {
    return !memcmp(a->bytes, b->bytes, sizeof a->bytes) && !memcmp(&a->ledger, &b->ledger, sizeof a->ledger) &&
           a->to_host == b->to_host && a->to_device == b->to_device;
}

/* Every rank's bytes per step on each axis of the grid, summed over the world: run.csv's
 * bytes_{dp,pp,cp,tp,ep}_per_step, one axis a line. */
static void print_axis_bytes(const Layout *l, const PlanDry *d) {
    double axis[COMM_COUNTERS] = {0}, times = plan_dry_multiplicity(&l->dry, d);
    for (int i = 0; i < d->nranks; i++)
        for (int k = 0; k < COMM_KINDS; k++)
            for (int a = 0; a < COMM_COUNTERS; a++) axis[a] += d->ranks[i].ledger.bytes[k][a] * times;
    printf("\nbytes sent per step on each grid axis, all %d rank%s together (run.csv bytes_AXIS_per_step)\n",
           l->dry.world, l->dry.world > 1 ? "s" : "");
    for (int a = 0; a < COMM_COUNTERS; a++) printf("  axis %s %16.0f\n", grid_counter_name(a), axis[a]);
}

static void print_plan(const Layout *l, const PlanDry *d) {
    const Config *cfg = &d->cfg;
    const ModelConfig *mc = &cfg->model;
    ParamTable table;
    param_table_build(&table, mc);
    double P = d->params > 0 ? d->params : table.num_params; /* the program's count (run.csv) */
    double head = mc->tied ? 0 : (double)vocab_padded(mc->vocab) * mc->dmodel, tied = P - head;
    param_table_free(&table);
    int world = l->dry.world;
    printf("%s | %s | %d rank%s = dp %d x pp %d x cp %d x tp %d | %s | %d layers, d %d, %d heads, seq %d, "
           "vocab %d | batch %d, %d micro-batches\n",
           PROGRAM, chapter_name(l->dry.chapter), world, world > 1 ? "s" : "", l->dry.dp, l->dry.pp, l->dry.cp,
           l->dry.tp, precision_name(cfg->precision), mc->layers, mc->dmodel, mc->heads, mc->seq, mc->vocab,
           cfg->batch, cfg->micro);
    printf("the program's own start-up (a dry run of rank %d):\n", d->ranks[0].rank);
    for (const char *line = d->startup; *line;) {
        size_t n = strcspn(line, "\n");
        printf("  %.*s\n", (int)n, line);
        line += n + (line[n] == '\n');
    }
    if (mc->tied)
        printf("parameters %.0f (the LM head tied to the embedding, as GPT-2 and llm.c)\n", P);
    else
        printf("parameters %.0f (%.0f with the LM head tied to the embedding, as GPT-2 and llm.c)\n", P, tied);
    double L = mc->layers, T = mc->seq, C = mc->dmodel, flops = plan_flops_per_token(mc);
    double active = plan_active_params(mc), active_tied = active - head;
    if (mc->moe.experts > 0)
        printf("FLOPs per token 6A + 12LTC = %.0f, A = %.0f parameters a token's step reads: each MoE block's "
               "top-%d of its %d experts (llm.c's count, tied, 6A + 6LTC: %.0f); per step %.4g\n",
               flops, active, mc->moe.top_k, mc->moe.experts, 6 * active_tied + 6 * L * T * C,
               flops * cfg->batch * T);
    else
        printf("FLOPs per token 6P + 12LTC = %.0f (llm.c's count, tied, 6P + 6LTC: %.0f); per step %.4g\n", flops,
               6 * active_tied + 6 * L * T * C, flops * cfg->batch * T);
    int offload = l->dry.chapter == 6 && plan_arg_given(l->dry.args, l->dry.nargs, "--offload");
    int *same_as = xcalloc(d->nranks, sizeof(int)), groups = 0;
    for (int i = 0; i < d->nranks; i++) {
        same_as[i] = i;
        for (int j = 0; j < i; j++)
            if (same_rank(&d->ranks[i], &d->ranks[j])) {
                same_as[i] = j;
                break;
            }
        groups += same_as[i] == i;
    }
    const char *of_all = d->per_stage ? " (each stage's first rank ran; the stage's other ranks hold and send alike)" : "";
    if (groups == 1) {
        printf("\nmemory of each rank (peak bytes, as memory.csv; the same on every rank)%s\n", of_all);
        print_memory(d->ranks[0].bytes);
        printf("\nbytes each rank sends per step (as comm.h counts them)\n");
        print_traffic(&d->ranks[0], offload);
    }
    int per_stage = world / l->dry.dp / (l->dry.chapter == 3 && l->dry.tp > 1 ? 1 : l->dry.pp);
    for (int i = 0; i < d->nranks && groups > 1; i++) {
        if (same_as[i] != i) continue;
        int count = 0;
        for (int j = i; j < d->nranks; j++) count += same_as[j] == i;
        printf("\nrank%s", count > 1 ? "s" : "");
        for (int j = i; j < d->nranks; j++)
            if (same_as[j] == i) printf(" %d", d->ranks[j].rank);
        printf(" (stage %d%s): memory (peak bytes, as memory.csv)%s\n", (d->ranks[i].rank % (world / l->dry.dp)) / per_stage,
               d->replica_only && l->dry.dp > 1 ? ", and the same of every replica" : "", of_all);
        print_memory(d->ranks[i].bytes);
        printf("  bytes sent per step (as comm.h counts them)\n");
        print_traffic(&d->ranks[i], offload);
    }
    free(same_as);
    if (l->dry.chapter > 1) print_axis_bytes(l, d);
    if (l->cuda) /* the one row that is not exact off the CPU */
        printf("\nnote: --device cuda: the workspace rows are the CPU backend's kernel workspaces; on CUDA,\n"
               "cuBLAS and the CUDA kernels keep their own, and comm.c's host staging (no NCCL) is not "
               "counted\n");
}

static void write_csv(const char *path, const Layout *l, const PlanDry *d) {
    FILE *f = fopen(path, "w");
    if (!f) fatal(EXIT_USAGE, "--csv %s: cannot write it", path);
    fprintf(f, MEMORY_CSV_HEADER "\n");
    for (int r = 0; r < l->dry.world; r++) {
        const PlanDryRank *x = plan_dry_rank_of(&l->dry, d, r);
        for (int s = 0; s < SPACE_COUNT; s++)
            for (int c = 0; c < CAT_COUNT; c++)
                fprintf(f, "%d,%s,%s,%zu\n", r, space_name(s), category_name(c), x->bytes[s][c]);
    }
    if (fclose(f) != 0) fatal(EXIT_USAGE, "--csv %s: cannot write it", path);
}

/* The step every rank waits for: the slowest rank's (plan_time.h), each rank's from its dry run's
 * counted work and the work of the rank at each stage of its pipeline with its tp and cp place. */
static void time_of(const Layout *l, const PlanDry *d, const Machine *mach, PlanTime *out) {
    PlanLayout t = time_layout(l, d);
    int stages = t.pp, per_stage = l->dry.world / l->dry.dp / stages;
    PlanWork *line = xcalloc(stages, sizeof *line);
    for (int i = 0; i < d->nranks; i++) {
        int r = d->ranks[i].rank % (l->dry.world / l->dry.dp), place = r % per_stage;
        for (int s = 0; s < stages; s++) line[s] = plan_dry_rank_of(&l->dry, d, s * per_stage + place)->work;
        PlanTraffic traffic = traffic_of(&d->ranks[i]);
        PlanTime mine;
        plan_time_work(&d->cfg, &t, &traffic, mach, &d->ranks[i].work, stages > 1 ? line : NULL, &mine);
        if (i == 0 || mine.step_s > out->step_s) *out = mine;
    }
    free(line);
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
           "cpu_adam %.4g, device_adam %.4g params/s, device_mem %.4g bytes, overlap %.4g\n",
           PROGRAM, f->calibrate, m.name, m.flops, m.alpha_s, m.beta_bytes_per_s, m.h2d_bytes_per_s,
           m.d2h_bytes_per_s, m.cpu_adam_params_per_s, m.device_adam_params_per_s, m.device_mem_bytes, m.overlap);
}

/* --zero-table with a model's flags: the ZeRO paper's Figure 1 from chapter 05's own accounting,
 * a dry run of its rank 0 at each stage on --gpus ranks (memory.csv's params, grads and optimizer
 * rows: the master weights are the optimizer's), next to the formula for the model's P. */
static void zero_table_of_model(const PlanFlags *f, const Args *user) {
    static const char *names[] = {"baseline", "P_os", "P_os+g", "P_os+g+p"};
    const char *precision = plan_arg_value(user->args, user->n, "--precision");
    int half = !precision || strcmp(precision, "fp32") != 0;
    for (int stage = 0; stage <= 3; stage++) {
        Args args = {0};
        for (int i = 0; i < user->n; i++) args_add(&args, user->args[i]);
        char words[32];
        snprintf(words, sizeof words, "--zero=%d", stage), args_add(&args, words);
        snprintf(words, sizeof words, "--dp=%d", f->gpus), args_add(&args, words);
        if (!precision) args_add(&args, "--precision=bf16");
        Layout l;
        layout_make(&l, 5, &args, f->threads);
        args_free(&args);
        PlanDry d;
        plan_dry_run(&l.dry, &d);
        const size_t *dev = d.ranks[0].bytes[SPACE_DEVICE];
        double p = dev[CAT_PARAMS], g = dev[CAT_GRADS], o = dev[CAT_OPTIMIZER], fp, fg, fo;
        plan_model_state(d.params, d.params / f->gpus, stage, half, &fp, &fg, &fo);
        if (stage == 0) {
            printf("model state per device of 05_zero/train, %.0f parameters on %d devices, %s Adam\n"
                   "(its dry runs' memory.csv on rank 0: params, grads, optimizer; GB = 1e9 bytes), and the\n"
                   "paper's formula for the same parameters\n",
                   d.params, f->gpus, half ? "mixed-precision" : "fp32");
            printf("  %-9s %5s %12s %12s %12s %10s %10s\n", "stage", "zero", "params", "grads", "optimizer",
                   "total GB", "formula GB");
        }
        printf("  %-9s %5d %12.0f %12.0f %12.0f %10.2f %10.2f\n", names[stage], stage, p, g, o,
               (p + g + o) / 1e9, (fp + fg + fo) / 1e9);
        plan_dry_free(&d);
        layout_free(&l);
    }
}

/* --by-hand: exercise 06.3's numbers (plan_by_hand.c) against the planner's for its layout
 * (the model flags' shape on --dp ranks, 2 by default), bytes to the byte and the step to 1e-6 of it. */
static void by_hand(const PlanFlags *f, const Args *user) {
    if (!f->machine[0]) fatal(EXIT_USAGE, "--by-hand needs --machine FILE (the constants of the step time)");
    Args mine = {0};
    for (int i = 0; i < user->n; i++) args_add(&mine, user->args[i]);
    if (!plan_arg_given(user->args, user->n, "--dp")) args_add(&mine, "--dp=2");
    args_add(&mine, "--zero=1");
    args_add(&mine, "--precision=bf16");
    int ranks = axis_of(&mine, "--dp");
    Layout l;
    layout_make(&l, 5, &mine, f->threads);
    l.dry.quiet_errors = 1;
    PlanDry d;
    plan_dry_run(&l.dry, &d);
    if (d.status) { /* the rules of the exercise first, in its words; then the program's */
        const char *batch = plan_arg_value(user->args, user->n, "--batch");
        if (batch && atoi(batch) % ranks)
            fatal(EXIT_USAGE, "--by-hand: --batch %d does not divide among --dp %d ranks (valid: a multiple of %d)",
                  atoi(batch), ranks, ranks);
        if (!batch && 8 % ranks)
            fatal(EXIT_USAGE, "--by-hand: --batch 8 does not divide among --dp %d ranks (valid: a multiple of %d)",
                  ranks, ranks);
        fatal(d.status == EXIT_USAGE ? EXIT_USAGE : EXIT_RUNTIME, "%s", d.error);
    }
    const Config *cfg = &d.cfg;
    const ModelConfig *mc = &cfg->model;
    if (cfg->micro != 1 || cfg->recompute)
        fatal(EXIT_USAGE,
              "--by-hand plans one micro-batch without recomputation (valid: --micro 1, no --recompute)");
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
    Machine mach;
    machine_read(f->machine, &mach);
    /* the step by plan_time.h's formulas (6P + 12LTC a token, ...), the arithmetic the exercise
     * teaches, over the bytes the dry run counted; a plan prices the counted work instead */
    const PlanDryRank *r = &d.ranks[0];
    PlanTraffic t = traffic_of(r);
    PlanLayout timed = time_layout(&l, &d);
    PlanTime pt;
    plan_time(&d.cfg, &timed, &t, &mach, &pt);
    ByHand h = {0};
    ByHandLayout layout = {mc->vocab, mc->seq, mc->dmodel, mc->layers, ranks, cfg->batch};
    plan_by_hand(&layout, &mach, &h);
    struct {
        const char *what;
        double yours, planner, tolerance;
    } rows[] = {{"device params bytes", h.params_bytes, r->bytes[SPACE_DEVICE][CAT_PARAMS], 0.5},
                {"device grads bytes", h.grads_bytes, r->bytes[SPACE_DEVICE][CAT_GRADS], 0.5},
                {"device optimizer bytes", h.optimizer_bytes, r->bytes[SPACE_DEVICE][CAT_OPTIMIZER], 0.5},
                {"bytes sent per step", h.sent_bytes, t.allreduce + t.reduce_scatter + t.allgather + t.send, 0.5},
                {"step ms", h.step_ms, pt.step_s * 1e3, 1e-6 * pt.step_s * 1e3}};
    printf("exercise 06.3: mpirun -np %d 05_zero/train --vocab %d --seq %d --dmodel %d --layers %d "
           "--batch %d --zero 1 --precision bf16, on %s\n",
           ranks, mc->vocab, mc->seq, mc->dmodel, mc->layers, cfg->batch, mach.name);
    printf("  %-24s %16s %16s  %s\n", "", "yours", "the planner's", "");
    int wrong = 0;
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        double diff = rows[i].yours - rows[i].planner;
        int ok = diff <= rows[i].tolerance && -diff <= rows[i].tolerance;
        wrong += !ok;
        int digits = i < 4 ? 0 : 6; /* bytes whole, the step in ms to the grader's tolerance */
        printf("  %-24s %16.*f %16.*f  %s\n", rows[i].what, digits, rows[i].yours, digits, rows[i].planner,
               ok ? "ok" : "WRONG");
    }
    printf("%s\n", wrong ? "some differ: see course.md, exercise 06.3" : "all agree");
    exit(wrong ? 1 : 0);
}

/* ---- --search: the layouts of N ranks, each planned by its program's dry runs ---- */
typedef struct {
    char name[128]; /* as the chapter's command line adds them */
    int chapter, dp, pp, cp, tp;
    char words[96]; /* the chapter's flags of this candidate */
    int dpu;        /* 06 --dpu: the losses are not 01's */
    double device, host;
    PlanTime time; /* the step and its parts */
    char why[1024]; /* empty: it fits */
} Candidate;

static Candidate *candidate(Candidate *list, int *n, int chapter, int dp, int pp, int cp, int tp, const char *words) {
    Candidate *c = &list[(*n)++];
    memset(c, 0, sizeof *c);
    c->chapter = chapter, c->dp = dp, c->pp = pp, c->cp = cp, c->tp = tp;
    snprintf(c->words, sizeof c->words, "%s", words);
    int len = snprintf(c->name, sizeof c->name, "%02d", chapter);
    if (chapter != 1 && (pp > 1 || tp > 1 || cp > 1)) len += snprintf(c->name + len, sizeof c->name - len, " --dp %d", dp);
    if (pp > 1) len += snprintf(c->name + len, sizeof c->name - len, " --pp %d", pp);
    if (tp > 1) len += snprintf(c->name + len, sizeof c->name - len, " --tp %d", tp);
    if (cp > 1) len += snprintf(c->name + len, sizeof c->name - len, " --cp %d", cp);
    if (words[0]) snprintf(c->name + len, sizeof c->name - len, " %s", words);
    c->dpu = strstr(words, "--dpu") != NULL;
    return c;
}

/* Every layout of N ranks: one replica per rank (01; 02's modes, overlap at several bucket sizes;
 * 05's stages; 06 with and without the delayed update), every split of N = dp x pp x tp with pp or
 * tp above 1 (04's schedules; 05's ZeRO-1 and -2 inside it; 06 --offload), each pipeline at several
 * micro-batch counts (pp, 2pp, 4pp where the replica's batch divides), and 03's dp x cp.
 * `batch` is the global batch the runs keep. */
static const double search_buckets_mb[] = {1, 4, 25, 100}; /* 25: PyTorch DDP's default */

static int candidates(int N, int batch, Candidate *list, int capacity) {
    int n = 0;
    char words[96];
    if (N == 1) candidate(list, &n, 1, 1, 1, 1, 1, "");
    if (N > 1) {
        candidate(list, &n, 2, N, 1, 1, 1, "--dp-mode flat");
        for (size_t b = 0; b < sizeof search_buckets_mb / sizeof search_buckets_mb[0]; b++) {
            snprintf(words, sizeof words, "--dp-mode overlap --bucket-mb %g", search_buckets_mb[b]);
            candidate(list, &n, 2, N, 1, 1, 1, words);
        }
        for (int z = 0; z <= 3; z++) {
            snprintf(words, sizeof words, "--zero %d", z);
            candidate(list, &n, 5, N, 1, 1, 1, words);
        }
    }
    candidate(list, &n, 6, N, 1, 1, 1, "--offload");
    candidate(list, &n, 6, N, 1, 1, 1, "--offload --dpu");
    for (int tp = 1; tp <= N; tp++)
        for (int pp = 1; pp * tp <= N; pp++) {
            if (N % (pp * tp) || pp * tp == 1) continue;
            int dp = N / (pp * tp);
            for (int times = 1; times <= (pp > 1 ? 4 : 1); times *= 2) {
                int M = pp > 1 ? pp * times : 1;
                if (pp > 1 && (batch % dp || (batch / dp) % M)) continue; /* the replica's batch in M */
                char micro[24] = "";
                if (pp > 1) snprintf(micro, sizeof micro, " --micro %d", M);
                static const char *schedules[] = {"--schedule gpipe", "--schedule 1f1b",
                                                  "--schedule interleaved --virtual 2", "--schedule zb-h1"};
                for (int s = 0; s < 4 && n + 8 < capacity; s++)
                    if (pp > 1 || s == 1) {
                        snprintf(words, sizeof words, "%s%s", pp > 1 ? schedules[s] : "", micro);
                        candidate(list, &n, 4, dp, pp, 1, tp, words);
                    }
                for (int z = 1; z <= 2 && n + 8 < capacity; z++) {
                    snprintf(words, sizeof words, "--zero %d%s", z, micro);
                    candidate(list, &n, 5, dp, pp, 1, tp, words);
                }
                snprintf(words, sizeof words, "--offload%s", micro);
                if (n + 8 < capacity) candidate(list, &n, 6, dp, pp, 1, tp, words);
            }
        }
    for (int cp = 2; cp <= N && n + 1 < capacity; cp++)
        if (N % cp == 0) candidate(list, &n, 3, N / cp, 1, cp, 1, "");
    return n;
}

/* A candidate's flags: the user's (the model, the batch, the precision), then its own. */
static void candidate_args(const Candidate *c, const Args *user, Args *out) {
    for (int i = 0; i < user->n; i++) args_add(out, user->args[i]);
    char axis[32]; /* --dp and --pp: the world's (handed on where the program takes them) */
    snprintf(axis, sizeof axis, "--dp=%d", c->dp), args_add(out, axis);
    snprintf(axis, sizeof axis, "--pp=%d", c->pp), args_add(out, axis);
    if (c->tp > 1) snprintf(axis, sizeof axis, "--tp=%d", c->tp), args_add(out, axis);
    if (c->cp > 1) snprintf(axis, sizeof axis, "--cp=%d", c->cp), args_add(out, axis);
    char words[96];
    snprintf(words, sizeof words, "%s", c->words);
    for (char *save, *w = strtok_r(words, " ", &save); w; w = strtok_r(NULL, " ", &save)) args_add(out, w);
}

/* One ranked layout's step, part by part (the exposed ms of each part that is not zero, named as
 * --time-csv names them; the communication's busy ms beside it), on one line after its rank ("#3"). */
static void print_step_parts(int rank, const Candidate *c) {
    const PlanTime *t = &c->time;
    printf("  #%d %s:", rank, c->name);
    for (int p = 0, first = 1; p < PART_COUNT; p++) {
        if (t->exposed_s[p] <= 0 && p != PART_COMPUTE) continue;
        printf("%s %s %.4f", first ? "" : " +", part_name(p), t->exposed_s[p] * 1e3);
        if (p == PART_COMMUNICATION && t->busy_s[p] > t->exposed_s[p]) printf(" of %.4f", t->busy_s[p] * 1e3);
        first = 0;
    }
    printf(" = %.4f ms\n", t->step_s * 1e3);
}

/* Is the host the step's largest part after the compute: 06's AdamW on the CPU and its copies? */
static int host_decides(const PlanTime *t) {
    double host = t->exposed_s[PART_CPU_UPDATE] + t->exposed_s[PART_OFFLOAD_COPIES];
    for (int p = 0; p < PART_COUNT; p++)
        if (p != PART_COMPUTE && p != PART_CPU_UPDATE && p != PART_OFFLOAD_COPIES && t->exposed_s[p] >= host)
            return 0;
    return host > 0;
}

/* What the first three layouts' steps are made of, and how many the host decides (the fastest of
 * those too, where it is not among the three). */
static void print_parts(const Candidate *list, const int *order, int fits, const Machine *mach) {
    int host = 0, host_rank = 0, rank = 0;
    const Candidate *fastest_host = NULL;
    for (int r = 0; r < fits; r++) {
        const Candidate *c = &list[order[r]];
        if (c->dpu) continue;
        if (++rank == 1)
            printf("the first three steps, part by part (ms; communication: what the step waits for, of its busy time; on\n"
                   "%s a communication thread's collectives beside the computation hide by overlap = %g; plan_time.h)\n",
                   mach->name, mach->overlap);
        if (rank <= 3) print_step_parts(rank, c);
        if (host_decides(&c->time) && !host++) host_rank = rank, fastest_host = c;
    }
    if (!host) return;
    printf("the host decides %d of the steps: 06's AdamW on the CPU and its copies are their largest part after the\n"
           "compute; the fastest of them%s\n", host, host_rank <= 3 ? " is above" : ":");
    if (host_rank > 3) print_step_parts(host_rank, fastest_host);
}

static void search(const PlanFlags *f, const Config *cfg, const Args *user) {
    if (!flag_given(cfg, "--gpus") || !f->machine[0])
        fatal(EXIT_USAGE, "--search needs --gpus N (the ranks) and --machine FILE (the times to rank by)");
    Machine mach;
    machine_read(f->machine, &mach);
    double budget = flag_given(cfg, "--gpu-mem") ? (double)f->gpu_mem : mach.device_mem_bytes;
    printf("layouts of %d rank%s, %.4g bytes of device memory each, ranked by the step predicted on %s\n",
           f->gpus, f->gpus > 1 ? "s" : "", budget, mach.name);
    /* what the search keeps as given: the model, the batch, the precision (one dry run of 01 reads them) */
    Layout base;
    layout_make(&base, 1, user, f->threads);
    base.dry.world = base.dry.dp = base.dry.pp = base.dry.tp = base.dry.cp = 1;
    PlanDry given;
    plan_dry_run(&base.dry, &given);
    const Config *g = &given.cfg;
    printf("held fixed: %d layers, d %d, %d heads, seq %d, vocab %d%s, batch %d, %s, recompute %s; micro-batches %d\n"
           "where there is no pipeline, ZeRO-3's --prefetch and 03's ring as the chapters default; searched: the\n"
           "axes, 04's schedules, a pipeline's micro-batches (pp, 2pp, 4pp), 02's buckets (1, 4, 25, 100 MiB)\n",
           g->model.layers, g->model.dmodel, g->model.heads, g->model.seq, g->model.vocab,
           g->model.tied ? " tied" : "", g->batch, precision_name(g->precision), g->recompute ? "on" : "off", g->micro);
    int capacity = 4096;
    Candidate *list = xcalloc(capacity, sizeof *list);
    int n = candidates(f->gpus, g->batch, list, capacity), *order = xcalloc(n, sizeof(int)), fits = 0;
    plan_dry_free(&given);
    layout_free(&base);
    for (int i = 0; i < n; i++) {
        Candidate *c = &list[i];
        Args args = {0};
        candidate_args(c, user, &args);
        Layout l;
        layout_make(&l, c->chapter, &args, f->threads);
        args_free(&args);
        l.dry.quiet_errors = 1, l.dry.stage_firsts = 1; /* a stage's tp and cp ranks hold and send alike */
        PlanDry d;
        plan_dry_run(&l.dry, &d);
        if (d.status) {
            snprintf(c->why, sizeof c->why, "%s", d.error);
            layout_free(&l);
            continue;
        }
        int fullest = 0, largest = 0;
        for (int r = 0; r < d.nranks; r++) { /* the rank with the most device memory decides */
            double device = 0, host = 0;
            int cat = 0;
            for (int k = 0; k < CAT_COUNT; k++) {
                device += d.ranks[r].bytes[SPACE_DEVICE][k], host += d.ranks[r].bytes[SPACE_HOST][k];
                if (d.ranks[r].bytes[SPACE_DEVICE][k] > d.ranks[r].bytes[SPACE_DEVICE][cat]) cat = k;
            }
            if (device > c->device) c->device = device, fullest = r, largest = cat;
            if (host > c->host) c->host = host;
        }
        PlanTime pt;
        time_of(&l, &d, &mach, &pt);
        c->time = pt;
        if (c->device > budget)
            snprintf(c->why, sizeof c->why, "device memory %.4g bytes > %.4g (rank %d; the most: %s, %zu bytes)",
                     c->device, budget, d.ranks[fullest].rank, category_name(largest),
                     d.ranks[fullest].bytes[SPACE_DEVICE][largest]);
        else
            order[fits++] = i;
        plan_dry_free(&d);
        layout_free(&l);
    }
    for (int a = 1; a < fits; a++) /* by predicted step, fastest first */
        for (int b = a; b > 0 && list[order[b]].time.step_s < list[order[b - 1]].time.step_s; b--) {
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
            if (c->dpu == exact) continue;
            if (!exact && !rank)
                printf("ranked apart, their losses not 01's (--dpu, the delayed parameter update: each "
                       "gradient is taken at weights one step stale)\n");
            printf("  %4d  %-*s %14.0f %14.0f %12.4f%s\n", ++rank, width, c->name, c->device, c->host,
                   c->time.step_s * 1e3, exact ? "" : "  changes the losses: delayed update");
        }
    print_parts(list, order, fits, &mach);
    if (fits < n) printf("does not fit, or not a layout of these flags\n");
    for (int i = 0; i < n; i++)
        if (list[i].why[0]) printf("  %-*s %s\n", width, list[i].name, list[i].why);
    free(order);
    free(list);
}

int main(int argc, char **argv) {
    Args own = {0}, user = {0};
    split_argv(argc, argv, &own, &user);
    Config cfg;
    PlanFlags f = {0};
    ChapterFlags chapter = {.flags = plan_flags, .values = &f, .multi_rank = 1, .rows_only = 1};
    if (config_read(&cfg, own.n, own.args, PROGRAM, &chapter)) {
        config_print_help(
            PROGRAM,
            "Predict a run's memory (by memory.csv's space and category), the bytes it sends (by\n"
            "collective, and on each grid axis as run.csv's bytes_AXIS_per_step) and its step time, by\n"
            "dry runs of the chapter's own program (NN/train --dry-run: one rank's start-up and step on a\n"
            "device that computes nothing); or the papers' tables. Every flag not listed here is the\n"
            "chapter's, handed to its program with the program's own ranges (NN/train --help).",
            &chapter);
        return 0;
    }
    if (f.csv[0]) output_file_check_not_run("--csv", f.csv, &memory_csv_output);
    if (f.time_csv[0]) output_file_check_not_run("--time-csv", f.time_csv, &time_csv_output);
    if (f.calibrate[0]) {
        const char *device = plan_arg_value(user.args, user.n, "--device");
        calibrate(&f, device ? device : "auto");
        return 0;
    }
    if (f.quick) fatal(EXIT_USAGE, "--quick is a flag of --calibrate FILE");
    if (f.zero_table) {
        const char *precision = plan_arg_value(user.args, user.n, "--precision");
        if (user.n > (precision ? 2 : 0)) /* a model given: the figure from chapter 05's own accounting */
            zero_table_of_model(&f, &user);
        else
            zero_table(&f, !precision || strcmp(precision, "fp32") != 0);
        return 0;
    }
    if (f.offload_capacity) {
        offload_capacity(&f);
        return 0;
    }
    for (const char *const *own_run = (const char *const[]){"--dry-run", "--world", "--rank", NULL}; *own_run; own_run++)
        if (plan_arg_given(user.args, user.n, *own_run))
            fatal(EXIT_USAGE, "%s: the planner runs the dry runs itself, one per distinct rank (valid: the "
                  "run's flags, with --dp and --pp for its ranks)", *own_run);
    if (f.time_csv[0] && !f.machine[0])
        fatal(EXIT_USAGE, "--time-csv needs --machine FILE (the constants the time is computed from)");
    Machine mach;
    if (f.machine[0]) machine_read(f.machine, &mach); /* a bad file refused before anything is planned */
    if (f.search) {
        search(&f, &cfg, &user);
        return 0;
    }
    if (f.by_hand) by_hand(&f, &user);
    Layout l;
    layout_make(&l, chapter_of(&f, &user), &user, f.threads);
    if (l.dry.chapter == 1 && l.dry.world > 1)
        fatal(EXIT_USAGE, "--chapter 01 runs on one device, not %d ranks (valid: --dp 1)", l.dry.world);
    PlanDry d;
    plan_dry_run(&l.dry, &d);
    print_plan(&l, &d);
    if (f.csv[0]) write_csv(f.csv, &l, &d);
    if (f.machine[0]) {
        PlanTime pt;
        time_of(&l, &d, &mach, &pt);
        PlanLayout t = time_layout(&l, &d);
        print_time(&d.cfg, &t, &mach, &pt);
        if (f.time_csv[0]) write_time_csv(f.time_csv, &pt);
    }
    plan_dry_free(&d);
    layout_free(&l);
    args_free(&own);
    args_free(&user);
    return 0;
}
