/* preflight.c: see preflight.h. */
#include "common/run/preflight.h" /* checks before anything is built */

#include "common/run/checkpoint.h" /* save and resume */
#include "common/run/run_dir.h" /* the --out directory and its files */
#include "common/model/data.h" /* the training data and its batches */
#include "common/model/model.h" /* GPT, its forward and backward */
#include "common/model/param_table.h" /* the parameter table and its units */
#include "common/core/util.h" /* fatal, log_info, exit codes, flag parsing */

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

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
    data_identify(c->data, c->model.seq, c->model.vocab, &data_bytes, &data_checksum);
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

int config_parse_and_check(Config *c, int argc, char **argv, const char *program,
                           const ChapterFlags *chapter) {
    if (config_read(c, argc, argv, program, chapter)) return 1;
    check_thread_count();
    fault_check_environment();    /* the tests' COURSE_FAULT_* variables (util.h) */
    interrupt_handlers_install(); /* Ctrl-C: a message, no temporary files left (util.h) */
    if (chapter && chapter->check) chapter->check(c, chapter->values);
    if (!c->dry_run) check_memory(c); /* a dry run touches no memory: plan any size */
    check_files(c, program);
    return 0;
}

void config_parse(Config *c, int argc, char **argv, const char *program, const char *summary,
                  const ChapterFlags *chapter) {
    if (config_parse_and_check(c, argc, argv, program, chapter)) {
        config_print_help(program, summary, chapter);
        exit(0);
    }
}
