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
    int quiet;               /* no per-step progress lines */
    int recompute;           /* keep only block inputs; recompute each block's forward in backward */
} Config;

/* A chapter's own flags: options appended to the common table, help text
 * appended to --help, and a handler called for each of them (return 0 if
 * handled, -1 if the value is invalid; the handler may call fatal itself). */
typedef struct {
    const struct option *options; /* terminated by a zero entry; use values >= 1000 */
    const char *help;
    int (*handle)(int option, const char *value, void *context);
    void *context;
} CliExtra;

/* Fill cfg from argv. program: e.g. "01_single_gpu/train"; summary: one line
 * saying what the program teaches. Exits 0 after --help, EXIT_USAGE on errors. */
void config_parse(Config *cfg, int argc, char **argv, const char *program, const char *summary,
                  const CliExtra *extra);

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
