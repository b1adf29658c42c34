/* config.c: the shared command line (see config.h). */
#include "common/run/config.h" /* Config and the flag tables */

#include "common/model/data.h" /* the training data and its batches */
#include "common/device/device.h" /* mem_alloc, copies, streams, timers */
#include "common/model/model.h" /* GPT, its forward and backward */
#include "common/core/util.h" /* fatal, log_info, exit codes, flag parsing */

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
        {"tiny", {2, 64, 4, 64, 256, 0, 0, 0, {0}}},
        {"small", {4, 128, 4, 128, 256, 0, 0, 0, {0}}},
        {"medium", {6, 384, 6, 256, 256, 0, 0, 0, {0}}},
        {"gpt2", {12, 768, 12, 1024, 256, 0, 0, 0, {0}}},
    };
    for (size_t i = 0; i < sizeof presets / sizeof presets[0]; i++) {
        if (strcmp(name, presets[i].name) == 0) {
            *m = presets[i].m;
            return 0;
        }
    }
    return -1;
}

const char *default_data_path(void) {
    /* The executable is NN_name/train; the corpus is course.md one level up. */
    static char path[PATH_BYTES];
    char exe[PATH_BYTES];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n > 0) {
        exe[n] = '\0';
        char *slash = strrchr(exe, '/');
        if (slash) {
            *slash = '\0';
            char joined[JOINED_PATH_BYTES];
            snprintf(joined, sizeof joined, "%s/../course.md", exe);
            if (realpath(joined, path) && access(path, R_OK) == 0) return path;
        }
    }
    snprintf(path, sizeof path, "course.md");
    return path;
}

/* A fixed loss scale is at most 2^24: the loss times it stays far from fp32's range. */
#define MAX_LOSS_SCALE 16777216.0

/* The flags every program takes, in the order --help lists them and the
 * record holds them (config.h says how to add one). A range written in a
 * row's .help is its .lo..hi: change both. */
static const Flag common_flags[] = {
    {.type = FLAG_SECTION, .help = "device and model"},
    {"--device", FLAG_CHOICE, FIELD(Config, device), .choices = "auto|cpu|cuda", .noun = "device",
     .def = "auto", .usage = "--device auto|cpu|cuda",
     .help = "where to compute; auto = cuda if a GPU is visible (default {default})"},
    {"--model", FLAG_CHOICE, FIELD(Config, model_preset), .choices = "tiny|small|medium|gpt2",
     .noun = "preset", .def = "tiny", .usage = "--model NAME",
     .help = "preset: tiny (2 layers, d 64, 4 heads, seq 64), small (4, 128, 4, 128),\n"
             "medium (6, 384, 6, 256), gpt2 (12, 768, 12, 1024) (default {default})"},
    {"--layers", FLAG_INT, FIELD(Config, model.layers), 1, MAX_LAYERS, .usage = "--layers N",
     .help = "transformer blocks, {range} (default: from the preset)"},
    {"--dmodel", FLAG_INT, FIELD(Config, model.dmodel), 1, 16384, .usage = "--dmodel N",
     .help = "model width, a multiple of --heads, {range} (default: preset)"},
    {"--heads", FLAG_INT, FIELD(Config, model.heads), 1, 1024, .usage = "--heads N",
     .help = "attention heads, {range} (default: preset)"},
    {"--seq", FLAG_INT, FIELD(Config, model.seq), 1, 65536, .usage = "--seq N",
     .help = "sequence length in tokens, {range} (default: preset)"},
    {"--vocab", FLAG_INT, FIELD(Config, model.vocab), 256, MAX_VOCAB, .usage = "--vocab N",
     .help = "vocabulary size, {range} (default 256: bytes; GPT-2's tokens: 50257);\n"
             "the kernels see it padded to a multiple of 128 rows (50257: 50304)"},
    {"--tie-embeddings", FLAG_SWITCH, FIELD(Config, model.tied), .usage = "--tie-embeddings",
     .help = "the head reads wte, as GPT-2's does: no separate lm_head matrix"},
    {"--device-mem-limit", FLAG_BYTES, FIELD(Config, device_mem_limit), .usage = "--device-mem-limit BYTES",
     .help = "refuse device allocations past this budget; K/M/G suffixes (default: none)"},
    {"--recompute", FLAG_TOGGLE, FIELD(Config, recompute), .usage = "--recompute[=0|1]",
     .help = "activation recomputation: keep only each block's input, run the\n"
             "block's forward again just before its backward (default 0: keep all)"},
    {"--loss-chunks", FLAG_INT, FIELD(Config, model.loss_chunks), 1, 65536, .usage = "--loss-chunks K",
     .help = "compute the head and the loss on K pieces of each micro-batch's tokens,\n"
             "one at a time: the logits held are a K-th; a divisor of --seq (default 1)"},
    {"--experts", FLAG_INT, FIELD(Config, model.moe.experts), 1, MAX_EXPERTS, .usage = "--experts E",
     .help = "mixture of experts: each MoE block's MLP becomes a router and E\n"
             "expert MLPs, {range} (default: none, the dense model)",
     .record = FLAG_RECORDED_WITH_EXPERTS},
    {"--top-k", FLAG_INT, FIELD(Config, model.moe.top_k), 1, MAX_EXPERTS, .def = "1", .usage = "--top-k K",
     .help = "with --experts: experts per token, 1..E, their router weights\n"
             "renormalised to sum to 1 (default {default})",
     .record = FLAG_RECORDED_WITH_EXPERTS},
    {"--moe-every", FLAG_INT, FIELD(Config, model.moe.every), 1, MAX_LAYERS, .def = "1",
     .usage = "--moe-every N",
     .help = "with --experts: blocks N-1, 2N-1, ... are MoE blocks, 1..layers\n"
             "(default {default}: every block)",
     .record = FLAG_RECORDED_WITH_EXPERTS},
    {"--aux-loss-coef", FLAG_FLOAT, FIELD(Config, model.moe.aux_coef), 0.0, 10.0, .def = "0.01",
     .usage = "--aux-loss-coef X",
     .help = "with --experts: weight of the load-balancing loss E sum_e f_e P_e,\n"
             "{range} (default {default})",
     .record = FLAG_RECORDED_WITH_EXPERTS},
    {"--capacity-factor", FLAG_FLOAT, FIELD(Config, model.moe.capacity_factor), 0.0, 64.0, .def = "0",
     .usage = "--capacity-factor F",
     .help = "with --experts: an expert takes at most ceil(F T K / E) tokens of a\n"
             "sequence, the rest are dropped; {range}, 0 = dropless (default {default})",
     .record = FLAG_RECORDED_WITH_EXPERTS},
    {.type = FLAG_SECTION, .help = "training"},
    {"--batch", FLAG_INT, FIELD(Config, batch), 1, 1000000, .def = "8", .usage = "--batch B",
     .help = "global batch: sequences per optimizer step, {range} (default {default})"},
    {"--micro", FLAG_INT, FIELD(Config, micro), 1, 1000000, .def = "1", .usage = "--micro M",
     .help = "micro-batches per step (gradient accumulation); divides B (default {default})"},
    {"--steps", FLAG_INT, FIELD(Config, steps), 1, 10000000, .def = "50", .usage = "--steps N",
     .help = "optimizer steps, {range} (default {default})"},
    {"--lr", FLAG_FLOAT, FIELD(Config, lr), 1e-12, 10.0, .def = "1e-3", .usage = "--lr X",
     .help = "peak learning rate, (0, 10] (default {default})"},
    {"--warmup", FLAG_INT, FIELD(Config, warmup), 0, 10000000, .def = "10", .usage = "--warmup N",
     .help = "linear warm-up steps, then cosine decay to lr/10 (default {default})"},
    {"--wd", FLAG_FLOAT, FIELD(Config, wd), 0.0, 10.0, .def = "0.1", .usage = "--wd X",
     .help = "AdamW weight decay, {range} (default {default})"},
    {"--clip", FLAG_FLOAT, FIELD(Config, clip), 0.0, 1e6, .def = "1", .usage = "--clip X",
     .help = "clip the global gradient norm to X, 0 = off (default {default})"},
    {"--seed", FLAG_SEED, FIELD(Config, seed), .def = "1337", .usage = "--seed N",
     .help = "seed for weights and data order (default {default})"},
    {"--stop-after", FLAG_INT, FIELD(Config, stop_after), 1, 10000000, .usage = "--stop-after K",
     .help = "end after step K as if interrupted; the schedule still spans --steps"},
    {"--precision", FLAG_ENUM, FIELD(Config, precision), .choices = "fp32|bf16|fp16", .noun = "precision",
     .def = "fp32", .usage = "--precision P",
     .help = "fp32, or bf16/fp16 mixed precision: 16-bit parameters and gradients,\n"
             "fp32 master weights and moments (default {default})"},
    {"--loss-scale", FLAG_SCALE, FIELD(Config, loss_scale), .hi = MAX_LOSS_SCALE, .def = "dynamic",
     .usage = "--loss-scale S|dynamic",
     .help = "fp16 only: multiply the loss by S, or let it adapt (default {default})",
     .record = FLAG_RECORDED_IN_FP16},
    /* PyTorch's GradScaler doubles its scale after 2000 clean steps too. */
    {"--loss-scale-window", FLAG_INT, FIELD(Config, loss_scale_window), 1, 10000000, .def = "2000",
     .usage = "--loss-scale-window N",
     .help = "fp16, dynamic: clean steps before the scale doubles (default {default})",
     .record = FLAG_RECORDED_IN_FP16},
    {.type = FLAG_SECTION, .help = "data and output"},
    {"--data", FLAG_PATH, FIELD(Config, data), .usage = "--data FILE",
     .help = "training text, read as bytes, or an llm.c token shard (common/tokenize) (default: course.md, "
             "shipped)"},
    {"--out", FLAG_PATH, FIELD(Config, out), .usage = "--out DIR", /* default: runs/<chapter folder> */
     .help = "where steps.csv, memory.csv and run.csv go (default {default}); a directory\n"
             "holding another run's files is refused unless --overwrite"},
    {"--overwrite", FLAG_SWITCH, FIELD(Config, overwrite), .usage = "--overwrite",
     .help = "replace the files of another run in --out"},
    {"--eval-every", FLAG_INT, FIELD(Config, eval_every), 0, 10000000, .usage = "--eval-every N",
     .help = "validation loss every N steps; 0 = only at the end (default {default})"},
    {"--eval-batches", FLAG_INT, FIELD(Config, eval_batches), 1, 10000, .def = "4",
     .usage = "--eval-batches N", .help = "global batches per validation, {range} (default {default})"},
    {"--sample", FLAG_INT, FIELD(Config, sample), 0, 1000000, .def = "128", .usage = "--sample N",
     .help = "bytes of text to generate at the end, 0 = none (default {default})"},
    {"--save", FLAG_PATH, FIELD(Config, save), .usage = "--save PATH",
     .help = "write a checkpoint at the end of the run (or at --stop-after); any\n"
             "chapter and layout resumes it (common/ckpt inspects and exports it);\n"
             "PATH: a new name or an earlier checkpoint (not --data, not a file\n"
             "of --out); on several ranks, in a directory they all see"},
    {"--save-every", FLAG_INT, FIELD(Config, save_every), 1, 10000000, .usage = "--save-every K",
     .help = "with --save: also every K steps, {range} (each save replaces\n"
             "the last, atomically)"},
    {"--resume", FLAG_PATH, FIELD(Config, resume), .usage = "--resume PATH",
     .help = "continue from a checkpoint written by --save, in any chapter or\n"
             "layout, at any precision"},
    {"--quiet", FLAG_SWITCH, FIELD(Config, quiet), .usage = "--quiet", .help = "no per-step progress lines"},
    {"--help", FLAG_HELP, .usage = "--help", .help = "this text", .record = FLAG_NOT_RECORDED},
    {.type = FLAG_SECTION,
     .help = "dry run: what one rank of a job allocates and sends, without running it",
     .only = FLAG_HARNESS},
    {"--dry-run", FLAG_SWITCH, FIELD(Config, dry_run), .usage = "--dry-run",
     .help = "be rank R of a job of N ranks, alone (no mpirun): the start-up and\n"
             "steps (--steps 1 for one) with this program's own code, on a device\n"
             "that records every allocation and computes nothing, and a transport\n"
             "that counts every byte and sends none; writes that rank's memory.csv\n"
             "rows, run.csv (its share of the bytes per axis; times 0) and\n"
             "dry-comm.csv (its bytes per collective and axis) to --out. The sample\n"
             "runs on zeros; no evaluation or checkpoint",
     .only = FLAG_HARNESS, .record = FLAG_NOT_RECORDED},
    {"--world", FLAG_INT, FIELD(Config, dry_world), 1, 1048576, .def = "1", .usage = "--world N",
     .help = "with --dry-run: the job's ranks, {range} (default {default})", .only = FLAG_HARNESS,
     .record = FLAG_NOT_RECORDED},
    {"--rank", FLAG_INT, FIELD(Config, dry_rank), 0, 1048575, .def = "0", .usage = "--rank R",
     .help = "with --dry-run: the rank to run, 0..N-1 (default {default})", .only = FLAG_HARNESS,
     .record = FLAG_NOT_RECORDED},
    {.type = FLAG_SECTION, .help = "communication (run with mpirun -np N)", .only = FLAG_MULTI_RANK},
    {"--comm", FLAG_CHOICE, FIELD(Config, comm), .choices = "auto|nccl|mpi", .noun = "transport",
     .def = "auto", .usage = "--comm auto|nccl|mpi",
     .help = "transport for device buffers; auto = nccl with one GPU per rank (default {default})",
     .only = FLAG_MULTI_RANK},
    /* minutes, not hours: a hung job is named soon (watchdog.h) */
    {"--timeout", FLAG_INT, FIELD(Config, timeout), 0, 604800, .def = "300", .usage = "--timeout SECONDS",
     .help = "a rank waiting longer than this in one communication call\n"
             "ends the job naming the ranks that never arrived, its last\n"
             "calls written to OUT/flight-RANK.txt (kill -USR1 a rank to\n"
             "see them live); 0..604800, 0 = wait forever (default {default})",
     .only = FLAG_MULTI_RANK},
    /* not flags: what the environment changes (a heading whose text lists them) */
    {.type = FLAG_SECTION,
     .help = "environment (comm.h, \"Cores\")\n"
             "  OMP_NUM_THREADS            OpenMP threads per rank (default: cores / ranks on this machine,\n"
             "                             at least 1, at most the cores mpirun bound the rank to)\n"
             "  OMPI_MCA_mpi_yield_when_idle  Open MPI yields the core while it waits for messages (default\n"
             "                             1 here; 0 polls without pause and starves the compute thread)",
     .only = FLAG_MULTI_RANK},
    {0},
};

/* getopt_long's value for row i of table t (0 common, 1 the chapter's):
 * above 255, so that no letter is mistaken for a flag. */
#define MAX_ROWS 64
#define OPTION_BASE 256

static int is_row(const Flag *f) {
    return f->name || f->help || f->rows; /* the zero row ends a table */
}

/* A chapter's rows with its earlier chapters' tables (FLAG_ROWS) written out
 * in their place, their fields moved to where that chapter's struct sits in
 * this one's. One program has one table, so it is built once, here. */
static Flag flat_rows[MAX_ROWS + 1];
static int flatten(const Flag *rows, size_t base, int n) {
    for (const Flag *f = rows; is_row(f); f++) {
        if (f->type == FLAG_ROWS) {
            n = flatten(f->rows, base + f->offset, n);
            continue;
        }
        if (f->type == FLAG_RETELL) { /* the earlier row, as this program tells it */
            int i = 0;
            while (i < n && !(flat_rows[i].name && strcmp(flat_rows[i].name, f->name) == 0)) i++;
            if (i == n) fatal(EXIT_RUNTIME, "a table retells %s, which no earlier row has", f->name);
            if (f->usage) flat_rows[i].usage = f->usage;
            flat_rows[i].help = f->help;
            continue;
        }
        if (n == MAX_ROWS) fatal(EXIT_RUNTIME, "a table of flags has more than %d rows", MAX_ROWS);
        flat_rows[n] = *f;
        flat_rows[n++].offset += base;
    }
    flat_rows[n] = (Flag){0};
    return n;
}
static const Flag *chapter_rows(const ChapterFlags *chapter) {
    flatten(chapter->flags, 0, 0);
    return flat_rows;
}

/* Which rows a program takes: FLAG_MULTI_RANK and FLAG_HARNESS bits (config.h). */
static int program_kind(const ChapterFlags *chapter) {
    if (!chapter) return FLAG_HARNESS; /* chapter 01: the harness's one process */
    return (chapter->multi_rank ? FLAG_MULTI_RANK : 0) | (chapter->harness ? FLAG_HARNESS : 0);
}

static int takes(const Flag *f, int kind) {
    return f->only == FLAG_ALL || (f->only & kind);
}

/* The item of "a|b|c" at index i, or "?". */
static void choice_at(const char *choices, int i, char *out, size_t size) {
    for (; i > 0 && choices; i--) {
        choices = strchr(choices, '|');
        if (choices) choices++;
    }
    if (!choices) choices = "?";
    snprintf(out, size, "%.*s", (int)strcspn(choices, "|"), choices);
}

/* Parse `value` as row f says, into its field in `base`; errors end the program. */
static void parse_value(const Flag *f, const char *value, void *base) {
    void *field = (char *)base + f->offset;
    switch (f->type) {
    case FLAG_INT:
        *(int *)field = (int)parse_int_flag(f->name, value, (long)f->lo, (long)f->hi);
        break;
    case FLAG_FLOAT:
        *(float *)field = (float)parse_float_flag(f->name, value, f->lo, f->hi);
        break;
    case FLAG_DOUBLE:
        *(double *)field = parse_float_flag(f->name, value, f->lo, f->hi);
        break;
    case FLAG_CHOICE:
        parse_choice_flag(f->name, f->noun, value, f->choices, field, f->size);
        break;
    case FLAG_ENUM: {
        char name[64], item[64];
        parse_choice_flag(f->name, f->noun, value, f->choices, name, sizeof name);
        for (int i = 0;; i++) {
            choice_at(f->choices, i, item, sizeof item);
            if (strcmp(item, name) == 0) {
                *(int *)field = i;
                break;
            }
        }
        break;
    }
    case FLAG_PATH:
        if (value[0] == '\0') fatal(EXIT_USAGE, "%s: empty value (expected a path)", f->name);
        /* fall through */
    case FLAG_TEXT:
        if (strlen(value) >= f->size)
            fatal(EXIT_USAGE, "%s: value is too long (at most %zu characters)", f->name, f->size - 1);
        strcpy(field, value);
        break;
    case FLAG_SWITCH:
        *(int *)field = 1;
        break;
    case FLAG_TOGGLE: /* --recompute alone means 1 */
        *(int *)field = value ? (int)parse_int_flag(f->name, value, 0, 1) : 1;
        break;
    case FLAG_BYTES:
        if (parse_bytes(value, field) != 0 || *(size_t *)field == 0)
            fatal(EXIT_USAGE,
                  "%s: '%s' is not a size (valid: a positive number of bytes, optionally with K, M or G, "
                  "e.g. 512M)",
                  f->name, value);
        break;
    case FLAG_SEED: {
        errno = 0;
        char *end;
        if (value[0] == '-') fatal(EXIT_USAGE, "%s: %s is out of range (valid: 0..2^64-1)", f->name, value);
        if (!isdigit((unsigned char)value[0])) /* strtoull would skip spaces and wrap ' -5' */
            fatal(EXIT_USAGE, "%s: '%s' is not a whole number (valid: 0..2^64-1)", f->name, value);
        *(uint64_t *)field = strtoull(value, &end, 10);
        if (end == value || *end)
            fatal(EXIT_USAGE, "%s: '%s' is not a whole number (valid: 0..2^64-1)", f->name, value);
        if (errno == ERANGE) /* digits only, past 18446744073709551615 */
            fatal(EXIT_USAGE, "%s: %s is out of range (valid: 0..2^64-1)", f->name, value);
        break;
    }
    case FLAG_SCALE: { /* "dynamic" is 0 */
        if (strcmp(value, "dynamic") == 0) {
            *(float *)field = 0.0f;
            break;
        }
        errno = 0;
        char *end;
        double v = strtod(value, &end);
        if (end == value || *end != '\0' || !isfinite(v) || errno == ERANGE || v <= 0.0 || v > f->hi)
            fatal(EXIT_USAGE, "%s: '%s' is not a valid scale (valid: dynamic, or a number > 0 up to %.0f)",
                  f->name, value, f->hi);
        *(float *)field = (float)v;
        break;
    }
    case FLAG_SECTION:
    case FLAG_HELP:
    case FLAG_ROWS:
    case FLAG_RETELL:
        break;
    }
}

/* The value of row f in `base` as text: exactly (for the record), or as
 * --help shows a default (%g: 0.001, not 0.00100000005). */
static void value_text(const Flag *f, const void *base, int exact, char *out, size_t size) {
    const void *field = (const char *)base + f->offset;
    switch (f->type) {
    case FLAG_INT:
    case FLAG_SWITCH:
    case FLAG_TOGGLE:
        snprintf(out, size, "%d", *(const int *)field);
        break;
    case FLAG_FLOAT:
    case FLAG_SCALE:
        if (f->type == FLAG_SCALE && *(const float *)field == 0.0f)
            snprintf(out, size, "dynamic");
        else
            snprintf(out, size, exact ? "%.9g" : "%g", *(const float *)field);
        break;
    case FLAG_DOUBLE:
        snprintf(out, size, exact ? "%.9g" : "%g", *(const double *)field);
        break;
    case FLAG_CHOICE:
    case FLAG_PATH:
    case FLAG_TEXT:
        snprintf(out, size, "%s", (const char *)field);
        break;
    case FLAG_ENUM:
        choice_at(f->choices, *(const int *)field, out, size);
        break;
    case FLAG_BYTES:
        snprintf(out, size, "%zu", *(const size_t *)field);
        break;
    case FLAG_SEED:
        snprintf(out, size, "%llu", (unsigned long long)*(const uint64_t *)field);
        break;
    case FLAG_SECTION:
    case FLAG_HELP:
    case FLAG_ROWS:
    case FLAG_RETELL:
        out[0] = '\0';
        break;
    }
}

/* Every row's default (.def, read as if typed), then what is set in code. */
static void set_defaults(Config *c, const char *program, const ChapterFlags *chapter) {
    memset(c, 0, sizeof *c);
    for (const Flag *f = common_flags; is_row(f); f++)
        if (f->def) parse_value(f, f->def, c);
    if (chapter) {
        c->chapter_flags = chapter_rows(chapter);
        for (const Flag *f = c->chapter_flags; is_row(f); f++)
            if (f->def) parse_value(f, f->def, chapter->values);
    }
    MoeConfig moe = c->model.moe; /* the experts' defaults: flags of their own, not the preset's */
    model_preset(&c->model, c->model_preset);
    c->model.moe = moe;
    c->beta1 = 0.9f;
    c->beta2 = 0.95f;
    c->eps = 1e-8f;
    /* runs/<chapter folder> */
    char chapter_folder[64];
    snprintf(chapter_folder, sizeof chapter_folder, "%s", program);
    char *slash = strchr(chapter_folder, '/');
    if (slash) *slash = '\0';
    snprintf(c->out, sizeof c->out, "runs/%s", chapter_folder);
}

/* One table's part of --help: headings, and each flag's usage in a column
 * of 27, its text beside it (continuation lines under the text). */
/* experts 0: the program does not train --experts (ChapterFlags.experts), which it
 * refuses in one line (check_expert_flags); its help does not list their rows. */
static void print_rows(const Flag *rows, const void *defaults, int kind, int experts) {
    for (const Flag *f = rows; is_row(f); f++) {
        if (!takes(f, kind) || (!experts && f->record == FLAG_RECORDED_WITH_EXPERTS)) continue;
        if (f->type == FLAG_SECTION) {
            printf("\n%s\n", f->help);
            continue;
        }
        if (strlen(f->usage) < 26)
            printf("  %-27s", f->usage);
        else
            printf("  %s  ", f->usage);
        for (const char *h = f->help; *h; h++) {
            if (strncmp(h, "{default}", 9) == 0) {
                char text[JOINED_PATH_BYTES];
                value_text(f, defaults, 0, text, sizeof text);
                fputs(text, stdout);
                h += 8;
            } else if (strncmp(h, "{range}", 7) == 0) { /* the row's own bounds, as it checks them */
                printf("%.15g..%.15g", f->lo, f->hi);
                h += 6;
            } else if (*h == '\n') {
                printf("\n%29s", "");
            } else {
                putchar(*h);
            }
        }
        putchar('\n');
    }
}

void config_print_help(const char *program, const char *summary, const ChapterFlags *chapter) {
    Config defaults;
    set_defaults(&defaults, program, chapter); /* the chapter's values too */
    int kind = program_kind(chapter);
    printf("usage: %s [flags]\n%s\n", program, summary);
    int experts = !chapter || chapter->experts; /* chapter 01 trains them without a table */
    if (!chapter || !chapter->rows_only) print_rows(common_flags, &defaults, kind, experts);
    if (chapter) print_rows(defaults.chapter_flags, chapter->values, kind, experts);
    printf("\nexit status: 0 done, 1 runtime failure, 2 bad input, 3 loss became NaN/Inf\n");
}

/* Where the flag `name` is recorded in c->given: table *t, row *i; 0 when no table has it. */
static int given_bit(const Config *c, const char *name, int *t, int *i) {
    const Flag *tables[2] = {common_flags, c->chapter_flags};
    for (*t = 0; *t < 2 && tables[*t]; (*t)++)
        for (*i = 0; is_row(&tables[*t][*i]); (*i)++)
            if (tables[*t][*i].name && strcmp(tables[*t][*i].name, name) == 0) return 1;
    return 0;
}

int flag_given(const Config *c, const char *name) {
    int t, i;
    return given_bit(c, name, &t, &i) ? (int)((c->given[t] >> i) & 1) : 0;
}

void flag_set_given(Config *c, const char *name, int given) {
    int t, i;
    if (!given_bit(c, name, &t, &i)) return;
    c->given[t] = given ? c->given[t] | (uint64_t)1 << i : c->given[t] & ~((uint64_t)1 << i);
}

/* The mixture of experts (moe.h): trained by the programs that say so (chapter
 * 01, without a table, and ChapterFlags.experts); its other flags need
 * --experts; --recompute does not recompute the experts' values yet. */
static void check_expert_flags(const Config *c, const char *program, const ChapterFlags *chapter) {
    if (c->model.moe.experts && chapter && !chapter->experts)
        fatal(EXIT_USAGE, "%s: --experts is not written for this program yet (valid: the chapters' trainers, "
                          "01_single_gpu .. 06_offload, train the mixture of experts)",
              program);
    static const char *const moe_flags[] = {"--top-k", "--moe-every", "--aux-loss-coef", "--capacity-factor"};
    for (size_t i = 0; i < sizeof moe_flags / sizeof moe_flags[0]; i++)
        if (!c->model.moe.experts && flag_given(c, moe_flags[i]))
            fatal(EXIT_USAGE, "%s needs --experts E (it shapes the mixture of experts; without it the model is "
                              "dense)", moe_flags[i]);
    if (c->model.moe.experts && c->recompute)
        fatal(EXIT_USAGE, "--recompute with --experts is not written yet: the experts' values are not "
                          "recomputed (valid: one of them)");
}

/* The loss scale is fp16's: bf16 has fp32's 8 exponent bits, so its gradients
 * neither overflow nor underflow where fp32's would not; giving a scale to
 * another precision is a mistake worth saying, not something to ignore. */
static void check_precision_flags(const Config *c) {
    if (flag_given(c, "--loss-scale") && c->precision != PRECISION_FP16)
        fatal(EXIT_USAGE,
              "--loss-scale applies to --precision fp16 only (this run is %s, whose exponent range needs no "
              "loss scaling)",
              precision_name(c->precision));
    int window_given = flag_given(c, "--loss-scale-window");
    if (window_given && c->precision != PRECISION_FP16)
        fatal(EXIT_USAGE, "--loss-scale-window applies to --precision fp16 only (this run is %s)",
              precision_name(c->precision));
    if (window_given && c->loss_scale > 0.0f)
        fatal(EXIT_USAGE,
              "--loss-scale-window applies to --loss-scale dynamic only (this run's scale is fixed "
              "at %g)",
              c->loss_scale);
}

/* --dry-run and its --world and --rank (device.h, comm.h: "The dry run"). */
static void check_dry_run_flags(Config *c, int multi_rank) {
    if (!c->dry_run) {
        if (flag_given(c, "--world") || flag_given(c, "--rank"))
            fatal(EXIT_USAGE, "--%s applies to --dry-run only (a job's ranks are mpirun -np N)",
                  flag_given(c, "--world") ? "world" : "rank");
        return;
    }
    if (c->dry_rank >= c->dry_world)
        fatal(EXIT_USAGE, "--rank %d is not a rank of --world %d (valid: 0..%d)", c->dry_rank, c->dry_world,
              c->dry_world - 1);
    if (!multi_rank && c->dry_world != 1)
        fatal(EXIT_USAGE, "--world %d: this program runs on one process (valid: 1)", c->dry_world);
    if (strcmp(c->device, "cuda") == 0)
        fatal(EXIT_USAGE, "--dry-run plans the CPU backend's buffers (valid: --device auto or cpu)");
    if (strcmp(c->comm, "nccl") == 0)
        fatal(EXIT_USAGE, "--dry-run plans the mpi transport (valid: --comm auto or mpi)");
    if (c->save[0] || c->resume[0])
        fatal(EXIT_USAGE, "--dry-run writes and reads no checkpoint (valid: without --%s)",
              c->save[0] ? "save" : "resume");
}

int dry_run_requested(int argc, char **argv, int *world, int *rank) {
    int dry = 0;
    *world = 1, *rank = 0;
    for (int i = 1; i < argc; i++) {
        const char *names[2] = {"--world", "--rank"};
        int *values[2] = {world, rank};
        if (strcmp(argv[i], "--dry-run") == 0) dry = 1;
        for (int k = 0; k < 2; k++) {
            size_t n = strlen(names[k]);
            const char *text = strncmp(argv[i], names[k], n) != 0   ? NULL
                               : argv[i][n] == '='                  ? argv[i] + n + 1
                               : argv[i][n] == '\0' && i + 1 < argc ? argv[i + 1]
                                                                    : NULL;
            if (!text) continue;
            char *end;
            long v = strtol(text, &end, 10);
            if (end != text && !*end && v >= (k == 0 ? 1 : 0) && v <= 1048576) *values[k] = (int)v;
        }
    }
    if (*rank >= *world) *world = *rank + 1; /* config_read's check names the mistake */
    return dry;
}

/* The getopt_long options of one table's rows. */
static void add_options(struct option *options, int *n, const Flag *rows, int table, int kind, int help_only) {
    for (int i = 0; is_row(&rows[i]); i++) {
        const Flag *f = &rows[i];
        if (i == MAX_ROWS) fatal(EXIT_RUNTIME, "a table of flags has more than %d rows", MAX_ROWS);
        if (!f->name || !takes(f, kind) || (help_only && f->type != FLAG_HELP)) continue;
        int has_arg = f->type == FLAG_SWITCH || f->type == FLAG_HELP ? no_argument
                      : f->type == FLAG_TOGGLE                       ? optional_argument
                                                                     : required_argument;
        options[(*n)++] = (struct option){f->name + 2, has_arg, 0, OPTION_BASE + table * MAX_ROWS + i};
    }
}

/* Read argv into c; returns 1 at --help (then nothing else is read). */
static int read_flags(Config *c, int argc, char **argv, const char *program, const ChapterFlags *chapter) {
    set_defaults(c, program, chapter);
    int kind = program_kind(chapter);
    /* on the stack: a usage error longjmps out of here (UsageTrap), and must leak nothing */
    struct option options[2 * MAX_ROWS + 1];
    memset(options, 0, sizeof options);
    int num_options = 0;
    add_options(options, &num_options, common_flags, 0, kind, chapter && chapter->rows_only); /* --help at least */
    if (chapter) add_options(options, &num_options, c->chapter_flags, 1, kind, 0);

    /* The preset is applied first, whatever the flag order, so that --layers
     * etc. override it. */
    const Flag *model_row = &common_flags[2];
    for (int i = 1; i < argc; i++) {
        const char *value = NULL;
        if (strcmp(argv[i], "--model") == 0 && i + 1 < argc)
            value = argv[i + 1];
        else if (strncmp(argv[i], "--model=", 8) == 0)
            value = argv[i] + 8;
        if (value) {
            parse_value(model_row, value, c);
            MoeConfig moe = c->model.moe; /* the experts' defaults: flags of their own, not the preset's */
            model_preset(&c->model, c->model_preset);
            c->model.moe = moe;
        }
    }

    opterr = 0;
    optind = 1;
    int opt, index;
    while ((opt = getopt_long(argc, argv, ":", options, &index)) != -1) {
        const char *flag = argv[optind - 1];
        if (opt == ':') getopt_refuse(opt, argv);
        if (opt == '?') {
            /* getopt sets optopt to the option's value when a flag that takes
             * none was given one (--quiet=1), to the letter of an unknown
             * short flag (-x), and to 0 for an unknown long flag. */
            if (optopt >= OPTION_BASE) {
                int name_length = (int)strcspn(flag, "=");
                fatal(EXIT_USAGE, "%.*s takes no value (got '%s'; see --help)", name_length, flag, flag);
            }
            if (optopt > ' ' && optopt < 127) fatal(EXIT_USAGE, "unknown flag '-%c' (see --help)", optopt);
            fatal(EXIT_USAGE, "unknown flag '%s' (see --help)", flag);
        }
        int table = (opt - OPTION_BASE) / MAX_ROWS, row = (opt - OPTION_BASE) % MAX_ROWS;
        const Flag *f = table ? &c->chapter_flags[row] : &common_flags[row];
        if (f->type == FLAG_HELP) return 1;
        parse_value(f, optarg, table ? chapter->values : (void *)c);
        c->given[table] |= 1ull << row;
    }
    getopt_no_operands(argc, argv);

    /* Checks across flags. */
    const char *problem = model_config_problem(&c->model);
    if (problem) fatal(EXIT_USAGE, "%s", problem);
    check_expert_flags(c, program, chapter);
    if (c->batch % c->micro != 0)
        fatal(EXIT_USAGE, "--micro %d does not divide --batch %d (valid: a divisor of the batch)", c->micro,
              c->batch);
    check_precision_flags(c);
    check_dry_run_flags(c, kind & FLAG_MULTI_RANK);
    if (c->save_every && !c->save[0])
        fatal(EXIT_USAGE, "--save-every %d needs --save PATH (where to write the checkpoints)",
              c->save_every);
    if (c->stop_after > c->steps)
        fatal(EXIT_USAGE, "--stop-after %d is beyond --steps %d (valid: 1..%d)", c->stop_after, c->steps,
              c->steps);
    /* Keep every single tensor below 2^31 elements: kernels index with int
     * in places, and anything larger would not fit a machine here anyway. */
    double BT = (double)(c->batch / c->micro) * c->model.seq, C = c->model.dmodel;
    double largest = fmax(fmax(BT * 4 * C, BT * vocab_padded(c->model.vocab)),
                          fmax((double)(c->batch / c->micro) * c->model.heads * c->model.seq * c->model.seq,
                               fmax(4 * C * C, (double)vocab_padded(c->model.vocab) * C)));
    if (largest >= 2147483647.0)
        fatal(EXIT_USAGE,
              "the model or micro-batch is too large: one tensor would hold %.3g elements "
              "(valid: below 2^31; lower --batch/--micro ratio, --seq, --dmodel or --vocab)",
              largest);
    if (!c->data[0]) snprintf(c->data, sizeof c->data, "%s", default_data_path());
    return 0;
}

/* The record: the build, then every flag a program takes, in the rows' order. */
static void record_rows(ConfigRecord *r, const Flag *rows, const void *base, const Config *c, int kind) {
    for (const Flag *f = rows; is_row(f); f++) {
        if (!f->name || !takes(f, kind) || f->record == FLAG_NOT_RECORDED) continue;
        if (f->record == FLAG_RECORDED_IN_FP16 && c->precision != PRECISION_FP16) continue;
        if (f->record == FLAG_RECORDED_WITH_EXPERTS && !c->model.moe.experts) continue;
        char text[JOINED_PATH_BYTES];
        value_text(f, base, 1, text, sizeof text);
        config_record_add(r, f->name, "%s", text);
    }
}

static void record_flags(Config *c, const ChapterFlags *chapter) {
    ConfigRecord *r = &c->record;
    memset(r, 0, sizeof *r);
#ifdef USE_CUDA
    config_record_add(r, "build", "cpu+cuda, gcc %s", __VERSION__);
#else
    config_record_add(r, "build", "cpu, gcc %s", __VERSION__);
#endif
    int kind = program_kind(chapter);
    if (!chapter || !chapter->rows_only) record_rows(r, common_flags, c, c, kind);
    if (chapter) record_rows(r, c->chapter_flags, chapter->values, c, kind);
    r->flag_items = r->count;
}

int config_read(Config *c, int argc, char **argv, const char *program, const ChapterFlags *chapter) {
    if (read_flags(c, argc, argv, program, chapter)) return 1;
    if (chapter && chapter->effective) chapter->effective(c, chapter->values);
    record_flags(c, chapter);
    return 0;
}

/* ---- what the layers below read of the configuration ---- */

OptimHyper optim_hyper(const Config *cfg, int step) {
    return (OptimHyper){.lr = lr_at_step(&(LrSchedule){cfg->lr, cfg->warmup, cfg->steps}, step),
                        .beta1 = cfg->beta1,
                        .beta2 = cfg->beta2,
                        .eps = cfg->eps,
                        .weight_decay = cfg->wd,
                        .clip = cfg->clip};
}

void loss_scaler_init(LossScaler *ls, const Config *cfg) {
    loss_scaler_start(ls, cfg->precision, cfg->loss_scale, cfg->loss_scale_window);
}
