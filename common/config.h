/* config.h: the run configuration and the command line shared by every chapter.
 *
 * Every NN_name/train accepts the flags of ROADMAP.md (parsed here with
 * getopt_long); a chapter adds its own through CliExtra. Values are checked
 * here once, so the rest of the program can trust them: any bad value ends the
 * program with EXIT_USAGE and one line naming the flag and its valid range. */
#ifndef CONFIG_H
#define CONFIG_H

#include <getopt.h>
#include <stddef.h>
#include <stdint.h>

/* Model shape: everything needed to build the same GPT anywhere. */
typedef struct {
    int layers; /* L */
    int dmodel; /* C */
    int heads;  /* NH */
    int seq;    /* T: maximum sequence length (wpe rows) and training length */
    int vocab;  /* V: 256 for bytes; more is allowed (unused rows) */
} ModelConfig;

/* The effective configuration, as (name, value) text: every flag with its
 * value (defaults included), the identity of every file the run reads (the
 * data's size and checksum, the checkpoint's step and checksum) and the build.
 * Ranks compare theirs before any collective of training (comm_parse_config),
 * and a run directory records the one that wrote it (run-info.txt). */
#define CONFIG_MAX_ITEMS 64
typedef struct {
    char name[32];
    char value[224];
} ConfigItem;
typedef struct {
    int count;
    int flag_items; /* items[0..flag_items) are the flags, the rest the files' identities */
    ConfigItem items[CONFIG_MAX_ITEMS];
} ConfigRecord;
void config_record_add(ConfigRecord *r, const char *name, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* One 64-bit digest of the whole record. */
uint64_t config_record_digest(const ConfigRecord *r);

/* --precision: what the parameters and gradients are stored in. fp32 is the
 * course's reference; bf16 and fp16 are mixed precision (mixed.h): 16-bit
 * parameters and gradients, fp32 master weights and AdamW moments. */
typedef enum { PRECISION_FP32 = 0, PRECISION_BF16, PRECISION_FP16 } Precision;
const char *precision_name(Precision p); /* "fp32", "bf16", "fp16" */

/* What a run does with --out when it already holds files (see csvlog.h). */
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
    char data[4096];         /* training text; "" means the shipped corpus */
    char out[4096];          /* output directory for the CSVs */
    size_t device_mem_limit; /* bytes, 0 = unlimited */
    int eval_every;          /* validation every N steps (0: only at the end) */
    int eval_batches;        /* global batches per validation */
    int sample;              /* bytes of text to generate at the end */
    char save[4096];         /* checkpoint path written at the end ("" = none) */
    char resume[4096];       /* checkpoint path to resume from ("" = none) */
    int save_every;          /* --save-every K: also save every K steps (0: only at the end) */
    int quiet;               /* no per-step progress lines */
    int recompute;           /* keep only block inputs; recompute each block's forward in backward */
    int overwrite;           /* --overwrite: replace another run's files in --out */
    char comm[8];            /* multi-rank programs: --comm auto, nccl, mpi */
    int timeout;             /* multi-rank programs: --timeout seconds a wait may last (0: no limit) */
    Precision precision;     /* --precision fp32|bf16|fp16 */
    float loss_scale;        /* fp16: --loss-scale S, a fixed scale; 0 = dynamic (the default) */
    int loss_scale_window;   /* fp16, dynamic: clean steps after which the scale doubles */
    /* found by the checks, not set by a flag */
    OutMode out_mode; /* what to do with --out's existing files */
    int resume_step;  /* the checkpoint's step (with --resume) */
    uint64_t resume_checksum;
    ConfigRecord record;
} Config;

/* A chapter's own flags: options appended to the common table, help text
 * appended to --help, and a handler called for each of them (return 0 if
 * handled, -1 if the value is invalid; the handler may call fatal itself).
 * check (optional) runs after every flag is read, for checks across flags
 * (the layout against the world size, say); record adds the chapter's flags
 * and their effective values to the configuration record (a default that
 * follows from the world size as the number it stands for, so that ranks
 * writing one layout two ways agree). */
typedef struct {
    const struct option *options; /* terminated by a zero entry; use values >= 1000 */
    const char *help;
    int (*handle)(int option, const char *value, void *context);
    void *context;
    void (*check)(const Config *cfg, void *context);
    void (*record)(const void *context, ConfigRecord *r);
    int multi_rank;      /* the program runs under mpirun: it takes --comm too */
    int mixed_precision; /* a multi-rank program that trains in bf16 and fp16 too (mixed.h);
                            the others refuse --precision bf16|fp16 */
} CliExtra;

/* Everything a run checks before it builds anything, in one call: fill cfg
 * from argv, check every value and every combination, and check the files
 * (the data, the checkpoint to resume, the save path, the output directory),
 * recording all of it in cfg->record. program: e.g. "01_single_gpu/train";
 * summary: one line saying what the program teaches. Exits 0 after --help,
 * EXIT_USAGE on errors. Multi-rank programs call comm_parse_config instead. */
void config_parse(Config *cfg, int argc, char **argv, const char *program, const char *summary,
                  const CliExtra *extra);
/* The same as two steps, for comm_parse_config: returns 1 when --help was
 * asked for (nothing else is done then), 0 after every check passed; errors
 * go through fatal(EXIT_USAGE). */
int config_parse_and_check(Config *cfg, int argc, char **argv, const char *program, const CliExtra *extra);
void config_print_help(const char *program, const char *summary, const CliExtra *extra);

/* Apply a preset by name; returns -1 when unknown. */
int model_preset(ModelConfig *m, const char *name);

/* Helpers for chapters' own flags: parse or end with a clear message. */
long parse_int_flag(const char *flag, const char *value, long lo, long hi);
/* value must be one of `valid` ("naive|flat|overlap"); copied into dst, else
 * "FLAG: unknown NOUN 'value' (valid: naive, flat, overlap)". */
void parse_choice_flag(const char *flag, const char *noun, const char *value, const char *valid, char *dst,
                       size_t size);
double parse_float_flag(const char *flag, const char *value, double lo, double hi);

/* The shipped default corpus (course.md at the repository root, found from the
 * executable's location). */
const char *default_data_path(void);

#endif
