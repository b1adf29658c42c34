/* config.h: the run configuration and the command line shared by every chapter.
 *
 * Every NN_name/train accepts the flags of ROADMAP.md (parsed here with
 * getopt_long, from a table of rows); a chapter adds its own rows. Values are checked
 * here once, so the rest of the program can trust them: any bad value ends the
 * program with EXIT_USAGE and one line naming the flag and its valid range. */
#ifndef CONFIG_H
#define CONFIG_H

#include "common/model/mixed.h" /* mixed precision: 16-bit weights, loss scaling */
#include "common/model/model_config.h" /* ModelConfig */
#include "common/model/optim.h" /* AdamW and the learning-rate schedule */
#include "common/core/record.h" /* the configuration record */
#include "common/core/util.h" /* fatal, log_info, exit codes, flag parsing */

#include <getopt.h>
#include <stddef.h>
#include <stdint.h>

/* What a run does with --out when it already holds files (see run_dir.h). */
typedef enum { OUT_NEW, OUT_REPLACE, OUT_APPEND } OutMode;

typedef struct {
    ModelConfig model;
    char model_preset[16]; /* tiny, small, medium, gpt2 */
    char device[8];        /* auto, cpu, cuda */
    int batch;             /* global batch: sequences per optimizer step */
    int micro;             /* micro-batches per step (gradient accumulation) */
    int steps;             /* optimizer steps; the LR schedule spans these */
    int stop_after;        /* end the run after this step (0: run all), schedule unchanged */
    float lr;              /* peak learning rate */
    int warmup;            /* linear warm-up steps */
    float wd;              /* AdamW weight decay */
    float clip;            /* global gradient-norm clip (0: off) */
    float beta1, beta2, eps;
    uint64_t seed;
    char data[PATH_BYTES];   /* training text; "" means the shipped corpus */
    char out[PATH_BYTES];    /* output directory for the CSVs */
    size_t device_mem_limit; /* bytes, 0 = unlimited */
    int eval_every;          /* validation every N steps (0: only at the end) */
    int eval_batches;        /* global batches per validation */
    int sample;              /* bytes of text to generate at the end */
    char save[PATH_BYTES];   /* checkpoint path written at the end ("" = none) */
    char resume[PATH_BYTES]; /* checkpoint path to resume from ("" = none) */
    int save_every;          /* --save-every K: also save every K steps (0: only at the end) */
    int quiet;               /* no per-step progress lines */
    int recompute;           /* keep only block inputs; recompute each block's forward in backward */
    int overwrite;           /* --overwrite: replace another run's files in --out */
    char comm[8];            /* multi-rank programs: --comm auto, nccl, mpi */
    int timeout;             /* multi-rank programs: --timeout seconds a wait may last (0: no limit) */
    Precision precision;     /* --precision fp32|bf16|fp16 */
    float loss_scale;        /* fp16: --loss-scale S, a fixed scale; 0 = dynamic (the default) */
    int dry_run;             /* --dry-run: one rank's start-up and step, on a device that computes nothing */
    int dry_world, dry_rank; /* --world N --rank R: the job and the rank a dry run stands for */
    int loss_scale_window;   /* fp16, dynamic: clean steps after which the scale doubles */
    /* found by the checks, not set by a flag */
    OutMode out_mode; /* what to do with --out's existing files */
    int resume_step;  /* the checkpoint's step (with --resume) */
    uint64_t resume_checksum;
    ConfigRecord record;
    const struct Flag *chapter_flags; /* the chapter's rows, for flag_given */
    uint64_t given[2];                /* which rows were on the command line: common, chapter's */
} Config;

/* ---- flags as rows of a table ----
 *
 * Every flag is declared once, as one row: its name, type, where its value
 * goes, its range, its default and its --help text. From the rows come the
 * getopt_long options, --help, the parsing (with the range checks and the
 * error messages) and the configuration record. The shared flags are
 * config.c's common_flags; a chapter passes its own rows in ChapterFlags.
 *
 * To add a flag: add a field for its value (to Config, or to the chapter's
 * flags struct), then a row next to its neighbours in --help, e.g.
 *     {"--bucket-mb", FLAG_DOUBLE, FIELD(DataParallelFlags, bucket_mb), .lo = 1e-6, .hi = 4096,
 *      .def = "1", .usage = "--bucket-mb X", .help = "overlap: bucket size in MiB (default {default})"},
 * and, if its value must fit other flags, a line in the chapter's check. In
 * .help, "\n" starts a continuation line and {default} stands for the default. */
typedef enum {
    FLAG_SECTION, /* not a flag: a heading of --help (.help is its title) */
    FLAG_INT,     /* int, a whole number in [lo, hi] */
    FLAG_FLOAT,   /* float, a number in [lo, hi] */
    FLAG_DOUBLE,  /* double, a number in [lo, hi] */
    FLAG_CHOICE,  /* char[], one of .choices ("naive|flat|overlap"); errors say "unknown .noun" */
    FLAG_ENUM,    /* int, the index of the value in .choices */
    FLAG_PATH,    /* char[], any non-empty text */
    FLAG_TEXT,    /* char[], any text, empty too */
    FLAG_SWITCH,  /* int, 1 when given; takes no value */
    FLAG_TOGGLE,  /* int, 1 when given alone, else its value 0 or 1 (--recompute[=0|1]) */
    FLAG_BYTES,   /* size_t, a positive number of bytes with an optional K, M or G */
    FLAG_SEED,    /* uint64_t, 0..2^64-1 */
    FLAG_SCALE,   /* float, "dynamic" (0) or a number in (0, hi] */
    FLAG_HELP,    /* --help: print the rows and exit */
    FLAG_ROWS,    /* not a flag: an earlier chapter's rows (.rows), their values at .offset in this
                     chapter's struct (a chapter keeps every flag of the one before it) */
    FLAG_RETELL,  /* not a flag: what the earlier row .name means in this program (.usage where
                     given, .help), where a later technique changes it (a default); the row keeps
                     its place, its field and its range */
} FlagType;

/* Flag.only: which programs take it: all, those run under mpirun, those the
 * run harness starts (the chapters' trainers, not the tools: --dry-run) */
enum { FLAG_ALL = 0, FLAG_MULTI_RANK = 1, FLAG_HARNESS = 2 };
/* Flag.record; FLAG_RECORDED_WITH_EXPERTS: only when --experts is given (a dense run's record is as before) */
enum { FLAG_RECORDED = 0, FLAG_NOT_RECORDED, FLAG_RECORDED_IN_FP16, FLAG_RECORDED_WITH_EXPERTS };

typedef struct Flag {
    const char *name; /* "--steps": on the command line, in messages and in the record */
    FlagType type;
    size_t offset, size;     /* the value's field: FIELD(struct, member) */
    double lo, hi;           /* FLAG_INT, FLAG_FLOAT, FLAG_DOUBLE: the valid range (FLAG_SCALE: hi) */
    const char *choices;     /* FLAG_CHOICE, FLAG_ENUM: "a|b|c" */
    const char *noun;        /* FLAG_CHOICE, FLAG_ENUM: "unknown NOUN 'x'" */
    const char *def;         /* the default, as it would be typed (NULL: zero, or set in code) */
    const char *usage;       /* "--steps N", as --help shows it */
    const char *help;        /* the text beside it in --help */
    int only;                /* FLAG_ALL, or FLAG_MULTI_RANK: the programs run under mpirun */
    int record;              /* FLAG_RECORDED (the ranks compare it), ... */
    const struct Flag *rows; /* FLAG_ROWS: the earlier chapter's table (see below) */
} Flag;
#define FIELD(type, member) offsetof(type, member), sizeof(((type *)0)->member)
/* A row that stands for a technique's table (the module's rows), its values in member `data` of
 * the program's struct:  FLAG_ROWS_AT(Flags, data, data_parallel_flags), */
#define FLAG_ROWS_AT(values, member, table) {.type = FLAG_ROWS, .offset = offsetof(values, member), .rows = table}

/* A chapter's own flags: its rows (the first a FLAG_SECTION, their --help
 * heading; ended by a zero row), the struct they point into, and two
 * optional functions. effective turns a default that follows from the world
 * size into the number it stands for, before the record is made, so that
 * ranks writing one layout two ways agree. check runs after every flag is
 * read, for checks across flags (the layout against the world size, say). */
typedef struct {
    const Flag *flags;
    void *values;
    void (*effective)(const Config *cfg, void *values); /* flag_given(cfg, ...) says what was typed */
    void (*check)(const Config *cfg, const void *values);
    int multi_rank; /* the program runs under mpirun: it takes --comm and --timeout too */
    int harness;    /* set by the run harness (harness.h): a chapter's trainer, which takes --dry-run */
    int rows_only;  /* a tool whose command line is these rows alone, without the shared ones
                       (common/plan, which hands every other flag to the chapter it plans) */
    int experts;    /* set by the run harness: the program trains --experts (harness.h,
                       RunSpec.experts); other programs with a table refuse the flag */
} ChapterFlags;

/* Whether the flag `name` (common or the chapter's) was on the command line:
 * for a default that is fine but a value given that is refused. */
int flag_given(const Config *cfg, const char *name);
/* As if `name` had (given 1) or had not (0) been typed: common/plan's --search
 * asks the programs' rules (layout_rules.h) of layouts it writes itself. */
void flag_set_given(Config *cfg, const char *name, int given);

/* Fill cfg from argv and check every value and every combination of flags,
 * recording the flags in cfg->record; returns 1 when --help was asked for
 * (nothing else is read then). Errors go through fatal(EXIT_USAGE). The
 * files and the machine are checked after this, by preflight.h. */
int config_read(Config *cfg, int argc, char **argv, const char *program, const ChapterFlags *chapter);
/* Before MPI starts (harness.h): whether argv asks for a dry run, and its
 * --world and --rank (1 and 0 where absent or not a number: config_read's
 * rows then check them and say what is wrong). Flags must be written in full. */
int dry_run_requested(int argc, char **argv, int *world, int *rank);

/* --help, from the rows; resets the chapter's values to their defaults. */
void config_print_help(const char *program, const char *summary, const ChapterFlags *chapter);

/* What the layers below read of the configuration, as their own narrow
 * structs: the optimizer's hyperparameters of step `step` (0-based; its
 * learning rate from lr_at_step, optim.h), and the fp16 loss scaler's start
 * (mixed.h: off unless --precision fp16; --loss-scale, its window). */
OptimHyper optim_hyper(const Config *cfg, int step);
void loss_scaler_init(LossScaler *ls, const Config *cfg);

/* Apply a preset by name; returns -1 when unknown. */
int model_preset(ModelConfig *m, const char *name);

/* The shipped default corpus (course.md at the repository root, found from the
 * executable's location). */
const char *default_data_path(void);

#endif
