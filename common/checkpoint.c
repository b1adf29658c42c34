/* checkpoint.c: see checkpoint.h.
 *
 * Layout (little-endian, as written by this machine):
 *   char[8]  magic "GPTCKPT\0"
 *   u32      version (2)
 *   i32[5]   layers, dmodel, heads, seq, vocab
 *   u64      seed
 *   i32[4]   batch, micro, steps, warmup
 *   f32[7]   lr, wd, clip, beta1, beta2, eps, (reserved 0)
 *   i32      step reached;  i32 adam t
 *   u64      rng state
 *   u64      num_params
 *   u64      checksum: of the header (with this field 0) and each of the three arrays
 *   f32[num_params] x 3   parameters, m, v */
#include "checkpoint.h"

#include "device.h"
#include "util.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define CHECKPOINT_MAGIC "GPTCKPT"
#define CHECKPOINT_VERSION 2u

typedef struct {
    char magic[8];
    uint32_t version;
    int32_t layers, dmodel, heads, seq, vocab;
    uint64_t seed;
    int32_t batch, micro, steps, warmup;
    float lr, wd, clip, beta1, beta2, eps, reserved;
    int32_t step, adam_t;
    uint64_t rng_state;
    uint64_t num_params;
    uint64_t checksum;
} CheckpointHeader;

/* The checksum chains the header's hash (checksum field 0) with each array's. */
static uint64_t header_hash(CheckpointHeader h) {
    h.checksum = 0;
    return hash_bytes(&h, sizeof h);
}
static uint64_t chain(uint64_t sum, const float *host, size_t n) {
    return hash64(sum ^ hash_bytes(host, n * sizeof(float)));
}

/* ---- saving ---- */

static void write_or_die(const void *data, size_t bytes, FILE *f, const char *path) {
    errno = 0;
    if (fault_disk_full(path, bytes) || fwrite(data, 1, bytes, f) != bytes)
        fatal(EXIT_RUNTIME, "--save %s: write failed (%s)", path, strerror(errno ? errno : EIO));
}

static uint64_t write_device_buffer(uint64_t sum, const float *dev, size_t n, FILE *f, const char *path) {
    float *host = xmalloc(n * sizeof(float));
    copy_to_host(host, dev, n * sizeof(float));
    write_or_die(host, n * sizeof(float), f, path);
    sum = chain(sum, host, n);
    free(host);
    return sum;
}

void checkpoint_check_save_path(const char *path) {
    struct stat st;
    if (stat(path, &st) == 0) {
        if (S_ISDIR(st.st_mode)) fatal(EXIT_USAGE, "--save %s: is a directory (valid: a file name)", path);
        if (!S_ISREG(st.st_mode))
            fatal(EXIT_USAGE, "--save %s: not a regular file (valid: a new name or an earlier checkpoint)",
                  path);
    }
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (!slash)
        strcpy(dir, ".");
    else if (slash == dir)
        dir[1] = '\0';
    else
        *slash = '\0';
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode))
        fatal(EXIT_USAGE, "--save %s: the directory %s does not exist", path, dir);
    if (access(dir, W_OK) != 0)
        fatal(EXIT_USAGE, "--save %s: the directory %s is not writable (%s)", path, dir, strerror(errno));
}

uint64_t checkpoint_save(const char *path, const Config *cfg, int step, uint64_t rng_state, const GPT *model,
                         const AdamW *opt) {
    CheckpointHeader h;
    memset(&h, 0, sizeof h);
    memcpy(h.magic, CHECKPOINT_MAGIC, sizeof CHECKPOINT_MAGIC);
    h.version = CHECKPOINT_VERSION;
    h.layers = cfg->model.layers;
    h.dmodel = cfg->model.dmodel;
    h.heads = cfg->model.heads;
    h.seq = cfg->model.seq;
    h.vocab = cfg->model.vocab;
    h.seed = cfg->seed;
    h.batch = cfg->batch;
    h.micro = cfg->micro;
    h.steps = cfg->steps;
    h.warmup = cfg->warmup;
    h.lr = cfg->lr;
    h.wd = cfg->wd;
    h.clip = cfg->clip;
    h.beta1 = cfg->beta1;
    h.beta2 = cfg->beta2;
    h.eps = cfg->eps;
    h.step = step;
    h.adam_t = opt->t;
    h.rng_state = rng_state;
    h.num_params = model->num_params;

    /* The header goes first with checksum 0, and again at the end with it. */
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "wb");
    if (!f) fatal(EXIT_RUNTIME, "--save %s: cannot write %s (%s)", path, tmp, strerror(errno));
    temp_file_register(tmp);
    write_or_die(&h, sizeof h, f, path);
    uint64_t sum = header_hash(h);
    sum = write_device_buffer(sum, model->params, model->num_params, f, path);
    fault_point("save"); /* tests/faults.bats: a crash here leaves PATH.tmp half written, PATH intact */
    sum = write_device_buffer(sum, opt->m, opt->n, f, path);
    sum = write_device_buffer(sum, opt->v, opt->n, f, path);
    h.checksum = sum;
    if (fseek(f, 0, SEEK_SET) != 0) fatal(EXIT_RUNTIME, "--save %s: seek failed (%s)", path, strerror(errno));
    write_or_die(&h, sizeof h, f, path);
    if (fflush(f) != 0 || fsync(fileno(f)) != 0)
        fatal(EXIT_RUNTIME, "--save %s: write failed (%s)", path, strerror(errno));
    if (fclose(f) != 0) fatal(EXIT_RUNTIME, "--save %s: write failed (%s)", path, strerror(errno));
    if (rename(tmp, path) != 0)
        fatal(EXIT_RUNTIME, "--save %s: rename from %s failed (%s)", path, tmp, strerror(errno));
    temp_file_forget(tmp);
    return sum;
}

/* ---- reading ---- */

/* A header field out of its range means the file is damaged (or not ours). */
static void check_field(const char *path, const char *name, double value, double lo, double hi) {
    if (!(value >= lo && value <= hi))
        fatal(EXIT_USAGE, "--resume %s: corrupt checkpoint: %s %.10g (valid: %.10g..%.10g)", path, name,
              value, lo, hi);
}

static void check_header(const char *path, const CheckpointHeader *h) {
    check_field(path, "layers", h->layers, 1, 256);
    check_field(path, "dmodel", h->dmodel, 1, 16384);
    check_field(path, "heads", h->heads, 1, 1024);
    check_field(path, "seq", h->seq, 1, 65536);
    check_field(path, "vocab", h->vocab, 256, 1048576);
    check_field(path, "batch", h->batch, 1, 1000000);
    check_field(path, "micro", h->micro, 1, h->batch);
    check_field(path, "steps", h->steps, 1, 10000000);
    check_field(path, "warmup", h->warmup, 0, 10000000);
    check_field(path, "lr", h->lr, 1e-12, 10);
    check_field(path, "wd", h->wd, 0, 10);
    check_field(path, "clip", h->clip, 0, 1e6);
    check_field(path, "beta1", h->beta1, 0, 0.999999);
    check_field(path, "beta2", h->beta2, 0, 0.999999);
    check_field(path, "eps", h->eps, 1e-30, 1);
    check_field(path, "step", h->step, 0, h->steps);
    check_field(path, "adam_t", h->adam_t, h->step, h->step); /* one Adam update per step */
}

/* Open path and check everything but the arrays; leaves f after the header. */
static FILE *open_checkpoint(const char *path, const Config *cfg, CheckpointHeader *h) {
    struct stat st;
    if (stat(path, &st) != 0) fatal(EXIT_USAGE, "--resume %s: cannot open (%s)", path, strerror(errno));
    if (!S_ISREG(st.st_mode)) fatal(EXIT_USAGE, "--resume %s: not a regular file", path);
    FILE *f = fopen(path, "rb");
    if (!f) fatal(EXIT_USAGE, "--resume %s: cannot open (%s)", path, strerror(errno));
    size_t got = fread(h, 1, sizeof *h, f);
    if (got < sizeof h->magic || memcmp(h->magic, CHECKPOINT_MAGIC, sizeof CHECKPOINT_MAGIC) != 0)
        fatal(EXIT_USAGE, "--resume %s: not a checkpoint of this course (wrong magic bytes)", path);
    if (got < sizeof h->magic + sizeof h->version)
        fatal(EXIT_USAGE, "--resume %s: the file is truncated (no complete header)", path);
    if (h->version != CHECKPOINT_VERSION)
        fatal(EXIT_USAGE, "--resume %s: checkpoint format version %u, this program reads version %u", path,
              h->version, CHECKPOINT_VERSION);
    if (got < sizeof *h) fatal(EXIT_USAGE, "--resume %s: the file is truncated (no complete header)", path);
    check_header(path, h);
    const ModelConfig *m = &cfg->model;
    if (h->layers != m->layers || h->dmodel != m->dmodel || h->heads != m->heads || h->seq != m->seq ||
        h->vocab != m->vocab)
        fatal(
            EXIT_USAGE,
            "--resume %s: written for a different model (layers %d, dmodel %d, heads %d, seq %d, vocab %d); "
            "this run has layers %d, dmodel %d, heads %d, seq %d, vocab %d",
            path, h->layers, h->dmodel, h->heads, h->seq, h->vocab, m->layers, m->dmodel, m->heads, m->seq,
            m->vocab);
    ParamTable table;
    param_table_build(&table, m);
    size_t params = table.num_params;
    param_table_free(&table);
    if (h->num_params != params)
        fatal(EXIT_USAGE, "--resume %s: corrupt checkpoint: num_params %llu, the model has %zu", path,
              (unsigned long long)h->num_params, params);
    uint64_t expected = sizeof *h + 3 * h->num_params * sizeof(float);
    if ((uint64_t)st.st_size < expected)
        fatal(EXIT_USAGE, "--resume %s: the file is truncated (%lld of %llu bytes)", path,
              (long long)st.st_size, (unsigned long long)expected);
    if ((uint64_t)st.st_size > expected)
        fatal(EXIT_USAGE, "--resume %s: %lld bytes where a checkpoint of this model has %llu (corrupt?)",
              path, (long long)st.st_size, (unsigned long long)expected);
    /* What is left to do after the checkpoint's step. */
    int last_step = cfg->stop_after ? cfg->stop_after : cfg->steps;
    if (h->step >= cfg->steps)
        fatal(EXIT_USAGE,
              "--resume %s: the checkpoint is at step %d and --steps is %d: nothing to do (valid: --steps "
              "above %d)",
              path, h->step, cfg->steps, h->step);
    if (h->step >= last_step)
        fatal(EXIT_USAGE,
              "--stop-after %d is not after the checkpoint's step %d (valid: --stop-after %d..%d)",
              cfg->stop_after, h->step, h->step + 1, cfg->steps);
    return f;
}

/* Read the three arrays (into dev when given) and return the checksum they make. */
static uint64_t read_arrays(FILE *f, const char *path, const CheckpointHeader *h, float *dev[3]) {
    size_t n = h->num_params;
    float *host = xmalloc(n * sizeof(float));
    uint64_t sum = header_hash(*h);
    for (int a = 0; a < 3; a++) {
        if (fread(host, sizeof(float), n, f) != n)
            fatal(EXIT_USAGE, "--resume %s: the file is truncated", path);
        sum = chain(sum, host, n);
        if (dev) copy_to_device(dev[a], host, n * sizeof(float));
    }
    free(host);
    if (sum != h->checksum)
        fatal(EXIT_USAGE,
              "--resume %s: corrupt checkpoint: checksum %016llx, its contents give %016llx (the file was "
              "damaged after it was saved)",
              path, (unsigned long long)h->checksum, (unsigned long long)sum);
    return sum;
}

void checkpoint_check(const char *path, const Config *cfg, int *step, uint64_t *checksum) {
    CheckpointHeader h;
    FILE *f = open_checkpoint(path, cfg, &h);
    *checksum = read_arrays(f, path, &h, NULL);
    *step = h.step;
    fclose(f);
}

int checkpoint_load(const char *path, const Config *cfg, GPT *model, AdamW *opt, uint64_t *rng_state) {
    CheckpointHeader h;
    FILE *f = open_checkpoint(path, cfg, &h);
    if (h.seed != cfg->seed || h.batch != cfg->batch || h.steps != cfg->steps || h.lr != cfg->lr)
        log_info("note: resuming with different training flags than the checkpoint's (seed %llu, batch %d, "
                 "steps %d, lr %g); the loss curve will differ from an uninterrupted run\n",
                 (unsigned long long)h.seed, h.batch, h.steps, h.lr);
    float *dev[3] = {model->params, opt->m, opt->v};
    read_arrays(f, path, &h, dev);
    fclose(f);
    opt->t = h.adam_t;
    *rng_state = h.rng_state;
    return h.step;
}
