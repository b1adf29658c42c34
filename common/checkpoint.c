/* checkpoint.c: see checkpoint.h.
 *
 * Layout (little-endian, as written by this machine):
 *   char[8]  magic "GPTCKPT\0"
 *   u32      version (1)
 *   i32[5]   layers, dmodel, heads, seq, vocab
 *   u64      seed
 *   i32[4]   batch, micro, steps, warmup
 *   f32[7]   lr, wd, clip, beta1, beta2, eps, (reserved 0)
 *   i32      step reached;  i32 adam t
 *   u64      rng state
 *   u64      num_params
 *   f32[num_params] x 3   parameters, m, v */
#include "checkpoint.h"

#include "device.h"
#include "util.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define CHECKPOINT_MAGIC "GPTCKPT"
#define CHECKPOINT_VERSION 1u

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
} CheckpointHeader;

static void write_or_die(const void *data, size_t bytes, FILE *f, const char *path) {
    if (fwrite(data, 1, bytes, f) != bytes)
        fatal(EXIT_RUNTIME, "--save %s: write failed (%s)", path, strerror(errno));
}

static void write_device_buffer(const float *dev, size_t n, FILE *f, const char *path) {
    float *host = xmalloc(n * sizeof(float));
    copy_to_host(host, dev, n * sizeof(float));
    write_or_die(host, n * sizeof(float), f, path);
    free(host);
}

void checkpoint_save(const char *path, const Config *cfg, int step, uint64_t rng_state, const GPT *model,
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

    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "wb");
    if (!f) fatal(EXIT_USAGE, "--save %s: cannot write (%s)", path, strerror(errno));
    write_or_die(&h, sizeof h, f, path);
    write_device_buffer(model->params, model->num_params, f, path);
    fault_point("save"); /* tests/faults.bats: a crash here leaves PATH.tmp half written, PATH intact */
    write_device_buffer(opt->m, opt->n, f, path);
    write_device_buffer(opt->v, opt->n, f, path);
    if (fclose(f) != 0) fatal(EXIT_RUNTIME, "--save %s: write failed (%s)", path, strerror(errno));
    if (rename(tmp, path) != 0)
        fatal(EXIT_RUNTIME, "--save %s: rename from %s failed (%s)", path, tmp, strerror(errno));
}

static void read_device_buffer(float *dev, size_t n, FILE *f, const char *path) {
    float *host = xmalloc(n * sizeof(float));
    if (fread(host, sizeof(float), n, f) != n) fatal(EXIT_USAGE, "--resume %s: the file is truncated", path);
    copy_to_device(dev, host, n * sizeof(float));
    free(host);
}

int checkpoint_load(const char *path, const Config *cfg, GPT *model, AdamW *opt, uint64_t *rng_state) {
    FILE *f = fopen(path, "rb");
    if (!f) fatal(EXIT_USAGE, "--resume %s: cannot open (%s)", path, strerror(errno));
    struct stat st;
    if (fstat(fileno(f), &st) != 0 || !S_ISREG(st.st_mode))
        fatal(EXIT_USAGE, "--resume %s: not a regular file", path);
    CheckpointHeader h;
    size_t got = fread(&h, 1, sizeof h, f);
    if (got < sizeof h.magic || memcmp(h.magic, CHECKPOINT_MAGIC, sizeof CHECKPOINT_MAGIC) != 0)
        fatal(EXIT_USAGE, "--resume %s: not a checkpoint of this course (wrong magic bytes)", path);
    if (got < sizeof h) fatal(EXIT_USAGE, "--resume %s: the file is truncated (no complete header)", path);
    if (h.version != CHECKPOINT_VERSION)
        fatal(EXIT_USAGE, "--resume %s: checkpoint format version %u, this program reads version %u", path,
              h.version, CHECKPOINT_VERSION);
    const ModelConfig *m = &cfg->model;
    if (h.layers != m->layers || h.dmodel != m->dmodel || h.heads != m->heads || h.seq != m->seq ||
        h.vocab != m->vocab)
        fatal(
            EXIT_USAGE,
            "--resume %s: written for a different model (layers %d, dmodel %d, heads %d, seq %d, vocab %d); "
            "this run has layers %d, dmodel %d, heads %d, seq %d, vocab %d",
            path, h.layers, h.dmodel, h.heads, h.seq, h.vocab, m->layers, m->dmodel, m->heads, m->seq,
            m->vocab);
    if (h.num_params != model->num_params)
        fatal(EXIT_USAGE, "--resume %s: holds %llu parameters, the model has %zu", path,
              (unsigned long long)h.num_params, model->num_params);
    uint64_t expected = sizeof h + 3 * h.num_params * sizeof(float);
    if ((uint64_t)st.st_size < expected)
        fatal(EXIT_USAGE, "--resume %s: the file is truncated (%lld of %llu bytes)", path,
              (long long)st.st_size, (unsigned long long)expected);
    if ((uint64_t)st.st_size > expected)
        fatal(EXIT_USAGE, "--resume %s: %lld bytes where a checkpoint of this model has %llu (corrupt?)",
              path, (long long)st.st_size, (unsigned long long)expected);
    if (h.step < 0 || h.step > cfg->steps)
        fatal(EXIT_USAGE,
              "--resume %s: checkpoint is at step %d, beyond this run's --steps %d (valid: --steps >= %d)",
              path, h.step, cfg->steps, h.step);
    if (h.seed != cfg->seed || h.batch != cfg->batch || h.steps != cfg->steps || h.lr != cfg->lr)
        log_info("note: resuming with different training flags than the checkpoint's (seed %llu, batch %d, "
                 "steps %d, "
                 "lr %g); the loss curve will differ from an uninterrupted run\n",
                 (unsigned long long)h.seed, h.batch, h.steps, h.lr);
    read_device_buffer(model->params, model->num_params, f, path);
    read_device_buffer(opt->m, opt->n, f, path);
    read_device_buffer(opt->v, opt->n, f, path);
    fclose(f);
    opt->t = h.adam_t;
    *rng_state = h.rng_state;
    return h.step;
}
