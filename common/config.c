/* config.c: the shared command line (see config.h). */
#include "config.h"

#include "checkpoint.h"
#include "csvlog.h"
#include "data.h"
#include "device.h"
#include "model.h"
#include "util.h"

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int model_preset(ModelConfig *m, const char *name) {
    static const struct {
        const char *name;
        ModelConfig m;
    } presets[] = {
        {"tiny", {2, 64, 4, 64, 256}},
        {"small", {4, 128, 4, 128, 256}},
        {"medium", {6, 384, 6, 256, 256}},
        {"gpt2", {12, 768, 12, 1024, 256}},
    };
    for (size_t i = 0; i < sizeof presets / sizeof presets[0]; i++) {
        if (strcmp(name, presets[i].name) == 0) {
            *m = presets[i].m;
            return 0;
        }
    }
    return -1;
}

long parse_int_flag(const char *flag, const char *value, long lo, long hi) {
    errno = 0;
    char *end;
    long v = strtol(value, &end, 10);
    if (end == value || *end != '\0')
        fatal(EXIT_USAGE, "%s: '%s' is not a whole number (valid: %ld..%ld)", flag, value, lo, hi);
    if (errno == ERANGE || v < lo || v > hi)
        fatal(EXIT_USAGE, "%s: %s is out of range (valid: %ld..%ld)", flag, value, lo, hi);
    return v;
}

double parse_float_flag(const char *flag, const char *value, double lo, double hi) {
    errno = 0;
    char *end;
    double v = strtod(value, &end);
    if (end == value || *end != '\0' || !isfinite(v))
        fatal(EXIT_USAGE, "%s: '%s' is not a number (valid: %g..%g)", flag, value, lo, hi);
    if (errno == ERANGE || v < lo || v > hi)
        fatal(EXIT_USAGE, "%s: %s is out of range (valid: %g..%g)", flag, value, lo, hi);
    return v;
}

void parse_choice_flag(const char *flag, const char *noun, const char *value, const char *valid, char *dst,
                       size_t size) {
    char choices[256], listed[300] = "";
    snprintf(choices, sizeof choices, "%s", valid);
    int found = 0;
    for (char *item = strtok(choices, "|"); item; item = strtok(NULL, "|")) {
        found |= strcmp(item, value) == 0;
        if (listed[0]) strcat(listed, ", ");
        strncat(listed, item, sizeof listed - strlen(listed) - 1);
    }
    if (!found || strlen(value) >= size)
        fatal(EXIT_USAGE, "%s: unknown %s '%s' (valid: %s)", flag, noun, value, listed);
    snprintf(dst, size, "%s", value);
}

static void copy_string(const char *flag, char *dst, size_t size, const char *value) {
    if (strlen(value) >= size)
        fatal(EXIT_USAGE, "%s: value is too long (at most %zu characters)", flag, size - 1);
    if (value[0] == '\0') fatal(EXIT_USAGE, "%s: empty value (expected a path)", flag);
    strcpy(dst, value);
}

const char *default_data_path(void) {
    /* The executable is NN_name/train; the corpus is course.md one level up. */
    static char path[4096];
    char exe[4096];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n > 0) {
        exe[n] = '\0';
        char *slash = strrchr(exe, '/');
        if (slash) {
            *slash = '\0';
            char joined[4200];
            snprintf(joined, sizeof joined, "%s/../course.md", exe);
            if (realpath(joined, path) && access(path, R_OK) == 0) return path;
        }
    }
    snprintf(path, sizeof path, "course.md");
    return path;
}

enum {
    OPT_DEVICE = 256,
    OPT_MODEL,
    OPT_LAYERS,
    OPT_DMODEL,
    OPT_HEADS,
    OPT_SEQ,
    OPT_VOCAB,
    OPT_BATCH,
    OPT_MICRO,
    OPT_STEPS,
    OPT_LR,
    OPT_WARMUP,
    OPT_WD,
    OPT_CLIP,
    OPT_SEED,
    OPT_DATA,
    OPT_OUT,
    OPT_MEMLIMIT,
    OPT_EVAL_EVERY,
    OPT_EVAL_BATCHES,
    OPT_SAMPLE,
    OPT_SAVE,
    OPT_RESUME,
    OPT_SAVE_EVERY,
    OPT_STOP_AFTER,
    OPT_QUIET,
    OPT_RECOMPUTE,
    OPT_OVERWRITE,
    OPT_COMM,
    OPT_TIMEOUT,
    OPT_PRECISION,
    OPT_LOSS_SCALE,
    OPT_LOSS_SCALE_WINDOW,
    OPT_HELP
};

static const struct option common_options[] = {
    {"device", required_argument, 0, OPT_DEVICE},
    {"model", required_argument, 0, OPT_MODEL},
    {"layers", required_argument, 0, OPT_LAYERS},
    {"dmodel", required_argument, 0, OPT_DMODEL},
    {"heads", required_argument, 0, OPT_HEADS},
    {"seq", required_argument, 0, OPT_SEQ},
    {"vocab", required_argument, 0, OPT_VOCAB},
    {"batch", required_argument, 0, OPT_BATCH},
    {"micro", required_argument, 0, OPT_MICRO},
    {"steps", required_argument, 0, OPT_STEPS},
    {"lr", required_argument, 0, OPT_LR},
    {"warmup", required_argument, 0, OPT_WARMUP},
    {"wd", required_argument, 0, OPT_WD},
    {"clip", required_argument, 0, OPT_CLIP},
    {"seed", required_argument, 0, OPT_SEED},
    {"data", required_argument, 0, OPT_DATA},
    {"out", required_argument, 0, OPT_OUT},
    {"device-mem-limit", required_argument, 0, OPT_MEMLIMIT},
    {"eval-every", required_argument, 0, OPT_EVAL_EVERY},
    {"eval-batches", required_argument, 0, OPT_EVAL_BATCHES},
    {"sample", required_argument, 0, OPT_SAMPLE},
    {"save", required_argument, 0, OPT_SAVE},
    {"resume", required_argument, 0, OPT_RESUME},
    {"save-every", required_argument, 0, OPT_SAVE_EVERY},
    {"stop-after", required_argument, 0, OPT_STOP_AFTER},
    {"quiet", no_argument, 0, OPT_QUIET},
    {"recompute", optional_argument, 0, OPT_RECOMPUTE},
    {"overwrite", no_argument, 0, OPT_OVERWRITE},
    {"precision", required_argument, 0, OPT_PRECISION},
    {"loss-scale", required_argument, 0, OPT_LOSS_SCALE},
    {"loss-scale-window", required_argument, 0, OPT_LOSS_SCALE_WINDOW},
    {"help", no_argument, 0, OPT_HELP},
    /* last: only multi-rank programs take these two */
    {"comm", required_argument, 0, OPT_COMM},
    {"timeout", required_argument, 0, OPT_TIMEOUT},
};
#define NUM_COMMON_OPTIONS (int)(sizeof common_options / sizeof common_options[0])

const char *precision_name(Precision p) {
    static const char *names[] = {"fp32", "bf16", "fp16"};
    return p >= PRECISION_FP32 && p <= PRECISION_FP16 ? names[p] : "?";
}

/* PyTorch's GradScaler doubles its scale after 2000 clean steps too. */
#define DEFAULT_LOSS_SCALE_WINDOW 2000
/* A fixed loss scale is at most 2^24: the loss times it stays far from fp32's range. */
#define MAX_LOSS_SCALE 16777216.0

static void set_defaults(Config *c, const char *program) {
    memset(c, 0, sizeof *c);
    strcpy(c->model_preset, "tiny");
    model_preset(&c->model, "tiny");
    strcpy(c->device, "auto");
    strcpy(c->comm, "auto");
    c->timeout = 300; /* minutes, not hours: a hung job is named soon (watchdog.h) */
    c->batch = 8;
    c->micro = 1;
    c->steps = 50;
    c->lr = 1e-3f;
    c->warmup = 10;
    c->wd = 0.1f;
    c->clip = 1.0f;
    c->beta1 = 0.9f;
    c->beta2 = 0.95f;
    c->eps = 1e-8f;
    c->seed = 1337;
    c->eval_every = 0;
    c->eval_batches = 4;
    c->sample = 128;
    c->precision = PRECISION_FP32;
    c->loss_scale = 0.0f; /* dynamic */
    c->loss_scale_window = DEFAULT_LOSS_SCALE_WINDOW;
    /* runs/<chapter folder> */
    char chapter[64];
    snprintf(chapter, sizeof chapter, "%s", program);
    char *slash = strchr(chapter, '/');
    if (slash) *slash = '\0';
    snprintf(c->out, sizeof c->out, "runs/%s", chapter);
}

void config_print_help(const char *program, const char *summary, const CliExtra *extra) {
    Config defaults, *d = &defaults;
    set_defaults(d, program);
    printf("usage: %s [flags]\n%s\n\n", program, summary);
    printf(
        "device and model\n"
        "  --device auto|cpu|cuda     where to compute; auto = cuda if a GPU is visible (default %s)\n"
        "  --model NAME               preset: tiny (2 layers, d 64, 4 heads, seq 64), small (4, 128, 4, "
        "128),\n"
        "                             medium (6, 384, 6, 256), gpt2 (12, 768, 12, 1024) (default %s)\n"
        "  --layers N                 transformer blocks, 1..256 (default: from the preset)\n"
        "  --dmodel N                 model width, a multiple of --heads, 1..16384 (default: preset)\n"
        "  --heads N                  attention heads, 1..1024 (default: preset)\n"
        "  --seq N                    sequence length in tokens, 1..65536 (default: preset)\n"
        "  --vocab N                  vocabulary size, 256..1048576 (default 256: bytes)\n"
        "  --device-mem-limit BYTES   refuse device allocations past this budget; K/M/G suffixes (default: "
        "none)\n"
        "  --recompute[=0|1]          activation recomputation: keep only each block's input, run the\n"
        "                             block's forward again just before its backward (default 0: keep all)\n"
        "\ntraining\n"
        "  --batch B                  global batch: sequences per optimizer step, 1..1000000 (default %d)\n"
        "  --micro M                  micro-batches per step (gradient accumulation); divides B (default "
        "%d)\n"
        "  --steps N                  optimizer steps, 1..10000000 (default %d)\n"
        "  --lr X                     peak learning rate, (0, 10] (default %g)\n"
        "  --warmup N                 linear warm-up steps, then cosine decay to lr/10 (default %d)\n"
        "  --wd X                     AdamW weight decay, 0..10 (default %g)\n"
        "  --clip X                   clip the global gradient norm to X, 0 = off (default %g)\n"
        "  --seed N                   seed for weights and data order (default %llu)\n"
        "  --stop-after K             end after step K as if interrupted; the schedule still spans --steps\n"
        "  --precision P              fp32, or bf16/fp16 mixed precision: 16-bit parameters and gradients,\n"
        "                             fp32 master weights and moments (default fp32)\n"
        "  --loss-scale S|dynamic     fp16 only: multiply the loss by S, or let it adapt (default dynamic)\n"
        "  --loss-scale-window N      fp16, dynamic: clean steps before the scale doubles (default %d)\n"
        "\ndata and output\n"
        "  --data FILE                training text, read as bytes (default: course.md, shipped)\n"
        "  --out DIR                  where steps.csv, memory.csv and run.csv go (default %s); a directory\n"
        "                             holding another run's files is refused unless --overwrite\n"
        "  --overwrite                replace the files of another run in --out\n"
        "  --eval-every N             validation loss every N steps; 0 = only at the end (default %d)\n"
        "  --eval-batches N           global batches per validation, 1..10000 (default %d)\n"
        "  --sample N                 bytes of text to generate at the end, 0 = none (default %d)\n"
        "  --save PATH                write a checkpoint at the end of the run (or at --stop-after); any\n"
        "                             chapter and layout resumes it (common/ckpt inspects and exports it);\n"
        "                             PATH: a new name or an earlier checkpoint (not --data, not a file\n"
        "                             of --out); on several ranks, in a directory they all see\n"
        "  --save-every K             with --save: also every K steps, 1..10000000 (each save replaces\n"
        "                             the last, atomically)\n"
        "  --resume PATH              continue from a checkpoint written by --save, in any chapter or\n"
        "                             layout, at any precision\n"
        "  --quiet                    no per-step progress lines\n"
        "  --help                     this text\n",
        d->device, d->model_preset, d->batch, d->micro, d->steps, d->lr, d->warmup, d->wd, d->clip,
        (unsigned long long)d->seed, d->loss_scale_window, d->out, d->eval_every, d->eval_batches, d->sample);
    if (extra && extra->multi_rank)
        printf("\ncommunication (run with mpirun -np N)\n"
               "  --comm auto|nccl|mpi       transport for device buffers; auto = nccl with one GPU per rank "
               "(default %s)\n"
               "  --timeout SECONDS          a rank waiting longer than this in one communication call\n"
               "                             ends the job naming the ranks that never arrived, its last\n"
               "                             calls written to OUT/flight-RANK.txt (kill -USR1 a rank to\n"
               "                             see them live); 0..604800, 0 = wait forever (default %d)\n"
               "\nenvironment (comm.h, \"Cores\")\n"
               "  OMP_NUM_THREADS            OpenMP threads per rank (default: cores / ranks on this machine,\n"
               "                             at least 1, at most the cores mpirun bound the rank to)\n"
               "  OMPI_MCA_mpi_yield_when_idle  Open MPI yields the core while it waits for messages (default\n"
               "                             1 here; 0 polls without pause and starves the compute thread)\n",
               d->comm, d->timeout);
    if (extra && extra->help) printf("\n%s", extra->help);
    printf("\nexit status: 0 done, 1 runtime failure, 2 bad input, 3 loss became NaN/Inf\n");
}

/* --loss-scale: "dynamic" (0) or a number in (0, 2^24]. */
static float parse_loss_scale(const char *value) {
    if (strcmp(value, "dynamic") == 0) return 0.0f;
    errno = 0;
    char *end;
    double v = strtod(value, &end);
    if (end == value || *end != '\0' || !isfinite(v) || errno == ERANGE || v <= 0.0 || v > MAX_LOSS_SCALE)
        fatal(EXIT_USAGE,
              "--loss-scale: '%s' is not a valid scale (valid: dynamic, or a number > 0 up to %.0f)", value,
              MAX_LOSS_SCALE);
    return (float)v;
}

/* The loss scale is fp16's: bf16 has fp32's 8 exponent bits, so its gradients
 * neither overflow nor underflow where fp32's would not; giving a scale to
 * another precision is a mistake worth saying, not something to ignore. */
static void check_precision_flags(const Config *c, const char *loss_scale_flag, const char *window_flag,
                                  const CliExtra *extra) {
    if (loss_scale_flag && c->precision != PRECISION_FP16)
        fatal(EXIT_USAGE,
              "--loss-scale applies to --precision fp16 only (this run is %s, whose exponent range needs no "
              "loss scaling)",
              precision_name(c->precision));
    if (window_flag && c->precision != PRECISION_FP16)
        fatal(EXIT_USAGE, "--loss-scale-window applies to --precision fp16 only (this run is %s)",
              precision_name(c->precision));
    if (window_flag && c->loss_scale > 0.0f)
        fatal(EXIT_USAGE,
              "--loss-scale-window applies to --loss-scale dynamic only (this run's scale is fixed "
              "at %g)",
              c->loss_scale);
    if (c->precision != PRECISION_FP32 && extra && extra->multi_rank && !extra->mixed_precision)
        fatal(EXIT_USAGE,
              "--precision %s: this program trains in fp32 only so far (16-bit runs are chapters 01 to 05's; "
              "valid: fp32)",
              precision_name(c->precision));
}

/* Read argv into c; returns 1 at --help (then nothing else is read). */
static int read_flags(Config *c, int argc, char **argv, const char *program, const CliExtra *extra) {
    set_defaults(c, program);

    /* The option table: the common flags, then the chapter's. */
    int num_extra = 0;
    if (extra && extra->options)
        while (extra->options[num_extra].name) num_extra++;
    int num_common = NUM_COMMON_OPTIONS - (extra && extra->multi_rank ? 0 : 2); /* --comm, --timeout last */
    /* on the stack: a usage error longjmps out of here (UsageTrap), and must leak nothing */
    struct option options[num_common + num_extra + 1];
    memset(options, 0, sizeof options);
    memcpy(options, common_options, num_common * sizeof(struct option));
    if (num_extra) memcpy(options + num_common, extra->options, num_extra * sizeof(struct option));

    /* The preset is applied first, whatever the flag order, so that --layers
     * etc. override it. */
    for (int i = 1; i < argc; i++) {
        const char *value = NULL;
        if (strcmp(argv[i], "--model") == 0 && i + 1 < argc)
            value = argv[i + 1];
        else if (strncmp(argv[i], "--model=", 8) == 0)
            value = argv[i] + 8;
        if (value) {
            if (model_preset(&c->model, value) != 0)
                fatal(EXIT_USAGE, "--model: unknown preset '%s' (valid: tiny, small, medium, gpt2)", value);
            snprintf(c->model_preset, sizeof c->model_preset, "%s", value);
        }
    }

    const char *loss_scale_flag = NULL, *window_flag = NULL; /* given on the command line */
    opterr = 0;
    optind = 1;
    int opt, index;
    while ((opt = getopt_long(argc, argv, ":", options, &index)) != -1) {
        const char *flag = argv[optind - 1];
        switch (opt) {
        case OPT_DEVICE:
            if (strcmp(optarg, "auto") && strcmp(optarg, "cpu") && strcmp(optarg, "cuda"))
                fatal(EXIT_USAGE, "--device: unknown device '%s' (valid: auto, cpu, cuda)", optarg);
            snprintf(c->device, sizeof c->device, "%s", optarg);
            break;
        case OPT_MODEL:
            break; /* applied above */
        case OPT_LAYERS:
            c->model.layers = parse_int_flag("--layers", optarg, 1, 256);
            break;
        case OPT_DMODEL:
            c->model.dmodel = parse_int_flag("--dmodel", optarg, 1, 16384);
            break;
        case OPT_HEADS:
            c->model.heads = parse_int_flag("--heads", optarg, 1, 1024);
            break;
        case OPT_SEQ:
            c->model.seq = parse_int_flag("--seq", optarg, 1, 65536);
            break;
        case OPT_VOCAB:
            c->model.vocab = parse_int_flag("--vocab", optarg, 256, 1048576);
            break;
        case OPT_BATCH:
            c->batch = parse_int_flag("--batch", optarg, 1, 1000000);
            break;
        case OPT_MICRO:
            c->micro = parse_int_flag("--micro", optarg, 1, 1000000);
            break;
        case OPT_STEPS:
            c->steps = parse_int_flag("--steps", optarg, 1, 10000000);
            break;
        case OPT_LR:
            c->lr = parse_float_flag("--lr", optarg, 1e-12, 10.0);
            break;
        case OPT_WARMUP:
            c->warmup = parse_int_flag("--warmup", optarg, 0, 10000000);
            break;
        case OPT_WD:
            c->wd = parse_float_flag("--wd", optarg, 0.0, 10.0);
            break;
        case OPT_CLIP:
            c->clip = parse_float_flag("--clip", optarg, 0.0, 1e6);
            break;
        case OPT_SEED: {
            errno = 0;
            char *end;
            if (optarg[0] == '-') fatal(EXIT_USAGE, "--seed: %s is out of range (valid: 0..2^64-1)", optarg);
            if (!isdigit((unsigned char)optarg[0])) /* strtoull would skip spaces and wrap ' -5' */
                fatal(EXIT_USAGE, "--seed: '%s' is not a whole number (valid: 0..2^64-1)", optarg);
            c->seed = strtoull(optarg, &end, 10);
            if (end == optarg || *end)
                fatal(EXIT_USAGE, "--seed: '%s' is not a whole number (valid: 0..2^64-1)", optarg);
            if (errno == ERANGE) /* digits only, past 18446744073709551615 */
                fatal(EXIT_USAGE, "--seed: %s is out of range (valid: 0..2^64-1)", optarg);
            break;
        }
        case OPT_DATA:
            copy_string("--data", c->data, sizeof c->data, optarg);
            break;
        case OPT_OUT:
            copy_string("--out", c->out, sizeof c->out, optarg);
            break;
        case OPT_MEMLIMIT:
            if (parse_bytes(optarg, &c->device_mem_limit) != 0 || c->device_mem_limit == 0)
                fatal(EXIT_USAGE,
                      "--device-mem-limit: '%s' is not a size (valid: a positive number of bytes, "
                      "optionally with K, M or G, e.g. 512M)",
                      optarg);
            break;
        case OPT_EVAL_EVERY:
            c->eval_every = parse_int_flag("--eval-every", optarg, 0, 10000000);
            break;
        case OPT_EVAL_BATCHES:
            c->eval_batches = parse_int_flag("--eval-batches", optarg, 1, 10000);
            break;
        case OPT_SAMPLE:
            c->sample = parse_int_flag("--sample", optarg, 0, 1000000);
            break;
        case OPT_SAVE:
            copy_string("--save", c->save, sizeof c->save, optarg);
            break;
        case OPT_RESUME:
            copy_string("--resume", c->resume, sizeof c->resume, optarg);
            break;
        case OPT_SAVE_EVERY:
            c->save_every = parse_int_flag("--save-every", optarg, 1, 10000000);
            break;
        case OPT_STOP_AFTER:
            c->stop_after = parse_int_flag("--stop-after", optarg, 1, 10000000);
            break;
        case OPT_RECOMPUTE: /* --recompute alone means 1 */
            c->recompute = optarg ? (int)parse_int_flag("--recompute", optarg, 0, 1) : 1;
            break;
        case OPT_QUIET:
            c->quiet = 1;
            break;
        case OPT_OVERWRITE:
            c->overwrite = 1;
            break;
        case OPT_PRECISION: {
            char name[8];
            parse_choice_flag("--precision", "precision", optarg, "fp32|bf16|fp16", name, sizeof name);
            c->precision = strcmp(name, "bf16") == 0   ? PRECISION_BF16
                           : strcmp(name, "fp16") == 0 ? PRECISION_FP16
                                                       : PRECISION_FP32;
            break;
        }
        case OPT_LOSS_SCALE:
            loss_scale_flag = flag;
            c->loss_scale = parse_loss_scale(optarg);
            break;
        case OPT_LOSS_SCALE_WINDOW:
            window_flag = flag;
            c->loss_scale_window = parse_int_flag("--loss-scale-window", optarg, 1, 10000000);
            break;
        case OPT_COMM:
            parse_choice_flag("--comm", "transport", optarg, "auto|nccl|mpi", c->comm, sizeof c->comm);
            break;
        case OPT_TIMEOUT:
            c->timeout = parse_int_flag("--timeout", optarg, 0, 604800);
            break;
        case OPT_HELP:
            return 1;
        case ':':
            fatal(EXIT_USAGE, "%s needs a value (see --help)", flag);
        case '?':
            /* getopt sets optopt to the option's value when a flag that takes
             * none was given one (--quiet=1), to the letter of an unknown
             * short flag (-x), and to 0 for an unknown long flag. */
            if (optopt >= OPT_DEVICE) {
                int name_length = (int)strcspn(flag, "=");
                fatal(EXIT_USAGE, "%.*s takes no value (got '%s'; see --help)", name_length, flag, flag);
            }
            if (optopt > ' ' && optopt < 127) fatal(EXIT_USAGE, "unknown flag '-%c' (see --help)", optopt);
            fatal(EXIT_USAGE, "unknown flag '%s' (see --help)", flag);
        default:
            if (!extra || !extra->handle || extra->handle(opt, optarg, extra->context) != 0)
                fatal(EXIT_USAGE, "%s: invalid value '%s' (see --help)", flag, optarg ? optarg : "");
        }
    }
    if (optind < argc)
        fatal(EXIT_USAGE, "unexpected argument '%s' (flags start with --; see --help)", argv[optind]);

    /* Checks across flags. */
    const char *problem = model_config_problem(&c->model);
    if (problem) fatal(EXIT_USAGE, "%s", problem);
    if (c->batch % c->micro != 0)
        fatal(EXIT_USAGE, "--micro %d does not divide --batch %d (valid: a divisor of the batch)", c->micro,
              c->batch);
    check_precision_flags(c, loss_scale_flag, window_flag, extra);
    if (c->save_every && !c->save[0])
        fatal(EXIT_USAGE, "--save-every %d needs --save PATH (where to write the checkpoints)",
              c->save_every);
    if (c->stop_after > c->steps)
        fatal(EXIT_USAGE, "--stop-after %d is beyond --steps %d (valid: 1..%d)", c->stop_after, c->steps,
              c->steps);
    /* Keep every single tensor below 2^31 elements: kernels index with int
     * in places, and anything larger would not fit a machine here anyway. */
    double BT = (double)(c->batch / c->micro) * c->model.seq, C = c->model.dmodel;
    double largest = fmax(fmax(BT * 4 * C, BT * c->model.vocab),
                          fmax((double)(c->batch / c->micro) * c->model.heads * c->model.seq * c->model.seq,
                               fmax(4 * C * C, (double)c->model.vocab * C)));
    if (largest >= 2147483647.0)
        fatal(EXIT_USAGE,
              "the model or micro-batch is too large: one tensor would hold %.3g elements "
              "(valid: below 2^31; lower --batch/--micro ratio, --seq, --dmodel or --vocab)",
              largest);
    if (!c->data[0]) snprintf(c->data, sizeof c->data, "%s", default_data_path());
    return 0;
}

/* ---- the configuration record ---- */

void config_record_add(ConfigRecord *r, const char *name, const char *fmt, ...) {
    if (r->count == CONFIG_MAX_ITEMS) fatal(EXIT_RUNTIME, "configuration record full at %s", name);
    ConfigItem *item = &r->items[r->count++];
    snprintf(item->name, sizeof item->name, "%s", name);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(item->value, sizeof item->value, fmt, ap);
    va_end(ap);
}

uint64_t config_record_digest(const ConfigRecord *r) {
    uint64_t h = hash64((uint64_t)r->count);
    for (int i = 0; i < r->count; i++)
        h = hash64(h ^ hash_string(r->items[i].name) ^ hash64(hash_string(r->items[i].value)));
    return h;
}

static void record_flags(Config *c, const CliExtra *extra) {
    ConfigRecord *r = &c->record;
    memset(r, 0, sizeof *r);
#ifdef USE_CUDA
    config_record_add(r, "build", "cpu+cuda, gcc %s", __VERSION__);
#else
    config_record_add(r, "build", "cpu, gcc %s", __VERSION__);
#endif
    const ModelConfig *m = &c->model;
    config_record_add(r, "--device", "%s", c->device);
    config_record_add(r, "--model", "%s", c->model_preset);
    config_record_add(r, "--layers", "%d", m->layers);
    config_record_add(r, "--dmodel", "%d", m->dmodel);
    config_record_add(r, "--heads", "%d", m->heads);
    config_record_add(r, "--seq", "%d", m->seq);
    config_record_add(r, "--vocab", "%d", m->vocab);
    config_record_add(r, "--device-mem-limit", "%zu", c->device_mem_limit);
    config_record_add(r, "--recompute", "%d", c->recompute);
    config_record_add(r, "--batch", "%d", c->batch);
    config_record_add(r, "--micro", "%d", c->micro);
    config_record_add(r, "--steps", "%d", c->steps);
    config_record_add(r, "--stop-after", "%d", c->stop_after);
    config_record_add(r, "--lr", "%.9g", c->lr);
    config_record_add(r, "--warmup", "%d", c->warmup);
    config_record_add(r, "--wd", "%.9g", c->wd);
    config_record_add(r, "--clip", "%.9g", c->clip);
    config_record_add(r, "--precision", "%s", precision_name(c->precision));
    if (c->precision == PRECISION_FP16) {
        if (c->loss_scale > 0.0f)
            config_record_add(r, "--loss-scale", "%.9g", c->loss_scale);
        else
            config_record_add(r, "--loss-scale", "dynamic");
        config_record_add(r, "--loss-scale-window", "%d", c->loss_scale_window);
    }
    config_record_add(r, "--seed", "%llu", (unsigned long long)c->seed);
    config_record_add(r, "--data", "%s", c->data);
    config_record_add(r, "--out", "%s", c->out);
    config_record_add(r, "--overwrite", "%d", c->overwrite);
    config_record_add(r, "--eval-every", "%d", c->eval_every);
    config_record_add(r, "--eval-batches", "%d", c->eval_batches);
    config_record_add(r, "--sample", "%d", c->sample);
    config_record_add(r, "--save", "%s", c->save);
    config_record_add(r, "--resume", "%s", c->resume);
    config_record_add(r, "--save-every", "%d", c->save_every);
    config_record_add(r, "--quiet", "%d", c->quiet);
    if (extra && extra->multi_rank) {
        config_record_add(r, "--comm", "%s", c->comm);
        config_record_add(r, "--timeout", "%d", c->timeout);
    }
    if (extra && extra->record) extra->record(extra->context, r);
    r->flag_items = r->count;
}

/* OpenMP reads OMP_NUM_THREADS itself; absurd values crash it (100000 threads
 * segfault in libgomp), so refuse them with a message first. */
#define MAX_THREADS 1024
static void check_thread_count(void) {
    const char *text = getenv("OMP_NUM_THREADS");
    if (!text || !text[0]) return;
    char *end;
    errno = 0;
    long threads = strtol(text, &end, 10); /* the first of a nested list "4,2" */
    if (end == text || (*end && *end != ',') || errno || threads < 1 || threads > MAX_THREADS)
        fatal(EXIT_USAGE, "OMP_NUM_THREADS=%s is not a thread count this program can use (valid: 1..%d)",
              text, MAX_THREADS);
}

/* Refuse up front a model that cannot fit this machine's memory, before
 * initialisation grows towards it: one whole replica's parameters, gradients
 * and Adam moments (16 bytes a parameter), one micro-batch's activations and
 * the host copy the weights are initialised in (4 bytes a parameter). With
 * --device cuda only that host copy lives here; the GPU checks its own. */
static void check_memory(const Config *c) {
    ParamTable table;
    param_table_build(&table, &c->model);
    size_t params = table.num_params;
    param_table_free(&table);
    int B = c->batch / c->micro, T = c->model.seq;
    double on_device = 16.0 * params + (double)scratch_bytes(&c->model, B, T) +
                       (double)(c->recompute ? activation_bytes_recompute(&c->model, B, T)
                                             : activation_bytes(&c->model, B, T));
    double host = 4.0 * params + (strcmp(c->device, "cuda") == 0 ? 0.0 : on_device);
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    double physical = pages > 0 && page > 0 ? (double)pages * page : 1e30;
    if (host > physical)
        fatal(EXIT_USAGE,
              "the model needs about %.1f GiB of host memory (%zu parameters x 20 bytes, plus activations), "
              "more than this machine's %.1f GiB (valid: a smaller --dmodel, --layers, --seq or batch)",
              host / 1073741824.0, params, physical / 1073741824.0);
}

/* The files: the data, the checkpoint to resume from, the save path and the
 * output directory, each checked, their identities recorded. */
static void check_files(Config *c, const char *program) {
    ConfigRecord *r = &c->record;
    size_t data_bytes;
    uint64_t data_checksum;
    data_identify(c->data, c->model.seq, &data_bytes, &data_checksum);
    config_record_add(r, "data", "%zu bytes, checksum %016llx", data_bytes,
                      (unsigned long long)data_checksum);
    if (c->resume[0]) {
        checkpoint_check(c->resume, c, &c->resume_step, &c->resume_checksum);
        config_record_add(r, "checkpoint", "step %d, checksum %016llx", c->resume_step,
                          (unsigned long long)c->resume_checksum);
    }
    if (c->save[0]) checkpoint_check_save_path(c);
    c->out_mode = out_dir_check(c, program);
}

int config_parse_and_check(Config *c, int argc, char **argv, const char *program, const CliExtra *extra) {
    if (read_flags(c, argc, argv, program, extra)) return 1;
    record_flags(c, extra);
    check_thread_count();
    fault_check_environment();    /* the tests' COURSE_FAULT_* variables (util.h) */
    interrupt_handlers_install(); /* Ctrl-C: a message, no temporary files left (util.h) */
    if (extra && extra->check) extra->check(c, extra->context);
    check_memory(c);
    check_files(c, program);
    return 0;
}

void config_parse(Config *c, int argc, char **argv, const char *program, const char *summary,
                  const CliExtra *extra) {
    if (config_parse_and_check(c, argc, argv, program, extra)) {
        config_print_help(program, summary, extra);
        exit(0);
    }
}
