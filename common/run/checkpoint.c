/* checkpoint.c: see checkpoint.h. */
#include "common/run/checkpoint.h" /* save and resume */

#include "common/run/run_dir.h" /* the --out directory and its files */
#include "common/device/device.h" /* mem_alloc, copies, streams, timers */
#include "common/core/util.h" /* fatal, log_info, exit codes, flag parsing */

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define CKPT_MAGIC "GPTCKPT"
#define CKPT_ALIGN 4096u

_Static_assert(sizeof(CheckpointHeader) == 240, "the header is 240 bytes (tests and common/ckpt parse it)");
_Static_assert(offsetof(CheckpointHeader, num_params) == 48 &&
                   offsetof(CheckpointHeader, data_offset) == 56 && offsetof(CheckpointHeader, step) == 112 &&
                   offsetof(CheckpointHeader, writer) == 136 &&
                   offsetof(CheckpointHeader, tied_embeddings) == 224,
               "header offsets as documented");
_Static_assert(sizeof(CkptTensorEntry) == 64 && sizeof(CkptArrayEntry) == 40, "directory entries");

const char *const ckpt_array_names[CKPT_ARRAYS] = {"params", "adam_m", "adam_v"};

/* ---- layouts ---- */

void ckpt_layout_init(CkptLayout *l, const char *writer_fmt, ...) {
    memset(l, 0, sizeof *l);
    va_list args;
    va_start(args, writer_fmt);
    vsnprintf(l->writer, sizeof l->writer, writer_fmt, args);
    va_end(args);
}

void ckpt_layout_free(CkptLayout *l) {
    for (int a = 0; a < CKPT_ARRAYS; a++) free(l->array[a].segments);
    memset(l, 0, sizeof *l);
}

void ckpt_set_buffer(CkptLayout *l, CkptArray a, float *buffer, size_t local_n, int on_host) {
    CkptHolding *h = &l->array[a];
    h->buffer = buffer;
    h->local_n = local_n;
    h->on_host = on_host;
}

void ckpt_hold(CkptLayout *l, CkptArray a, size_t first, size_t count, size_t local, int writes) {
    CkptHolding *h = &l->array[a];
    if (count == 0) return;
    if (local + count > h->local_n)
        fatal(EXIT_RUNTIME, "checkpoint layout: %s elements [%zu, %zu) are beyond this rank's buffer of %zu",
              ckpt_array_names[a], local, local + count, h->local_n);
    if (h->count > 0) {
        CkptSegment *last = &h->segments[h->count - 1];
        if (last->first + last->count == first && last->local + last->count == local &&
            last->writes == writes) {
            last->count += count;
            return;
        }
    }
    if (h->count == h->capacity) {
        h->capacity = h->capacity ? 2 * h->capacity : 16;
        CkptSegment *grown = realloc(h->segments, h->capacity * sizeof *grown);
        if (!grown) fatal(EXIT_RUNTIME, "out of host memory for a checkpoint layout");
        h->segments = grown;
    }
    h->segments[h->count++] = (CkptSegment){.first = first, .count = count, .local = local, .writes = writes};
}

/* Replica r of `replicas` writes share r of [first, first + count). */
static void hold_replicated(CkptLayout *l, CkptArray a, size_t first, size_t count, int replica,
                            int replicas) {
    size_t begin = count * replica / replicas, end = count * (replica + 1) / replicas;
    ckpt_hold(l, a, first, begin, 0, 0);
    ckpt_hold(l, a, first + begin, end - begin, begin, 1);
    ckpt_hold(l, a, first + end, count - end, end, 0);
}

void ckpt_layout_range(CkptLayout *l, const GPT *model, const AdamW *opt, int replica, int replicas) {
    size_t first = model->param_first, n = model->param_count;
    if (opt->n != n)
        fatal(EXIT_RUNTIME, "checkpoint layout: the optimizer covers %zu elements, the model %zu", opt->n, n);
    float *buffers[CKPT_ARRAYS] = {model->params, opt->m, opt->v};
    for (int a = 0; a < CKPT_ARRAYS; a++) {
        ckpt_set_buffer(l, a, buffers[a], n, 0);
        if (!model->unit_at) {
            hold_replicated(l, a, first, n, replica, replicas);
            continue;
        }
        for (int u = LAYER_EMBEDDING; u <= model->cfg.layers; u++) { /* several runs: unit by unit */
            if (model->unit_at[u + 1] == SIZE_MAX) continue;         /* another stage's */
            const ParamUnit *unit = table_unit(&model->table, u);
            size_t at = model->unit_at[u + 1], count = unit->numel;
            if (u < model->first_unit ||
                u > model->last_unit) { /* a copy (the tied wte): read, not written */
                ckpt_hold(l, a, unit->offset, count, at, 0);
                continue;
            }
            size_t begin = count * replica / replicas, end = count * (replica + 1) / replicas;
            ckpt_hold(l, a, unit->offset, begin, at, 0);
            ckpt_hold(l, a, unit->offset + begin, end - begin, at + begin, 1);
            ckpt_hold(l, a, unit->offset + end, count - end, at + end, 0);
        }
    }
}

void ckpt_hold_shard(CkptLayout *l, CkptArray a, const ParamTable *t, int first_unit, int last_unit, int rank,
                     int ranks) {
    size_t base = shard_unit_offset(t, first_unit, ranks);
    for (int u = first_unit; u <= last_unit; u++) {
        size_t first, count;
        shard_slice_elements(t, u, rank, ranks, &first, &count);
        ckpt_hold(l, a, first, count, shard_unit_offset(t, u, ranks) - base, 1);
    }
}

void ckpt_layout_shards(CkptLayout *l, const ParamTable *t, int first_unit, int last_unit, float *params,
                        float *m, float *v, int rank, int ranks, int on_host) {
    size_t n = 0;
    for (int u = first_unit; u <= last_unit; u++) n += shard_slice_numel(t, u, ranks);
    float *buffers[CKPT_ARRAYS] = {params, m, v};
    for (int a = 0; a < CKPT_ARRAYS; a++) {
        ckpt_set_buffer(l, a, buffers[a], n, on_host);
        ckpt_hold_shard(l, a, t, first_unit, last_unit, rank, ranks);
    }
}

void ckpt_layout_zero(CkptLayout *l, const ParamTable *t, int stage, float *params, float *m, float *v,
                      int rank, int ranks, int on_host) {
    int last = t->cfg.layers;
    if (stage >= 3) { /* everything sharded */
        ckpt_layout_shards(l, t, LAYER_EMBEDDING, last, params, m, v, rank, ranks, on_host);
        return;
    }
    ckpt_set_buffer(l, CKPT_PARAMS, params, t->num_params, on_host); /* whole, on every rank */
    hold_replicated(l, CKPT_PARAMS, 0, t->num_params, rank, ranks);
    float *moments[2] = {m, v};
    for (int k = 0; k < 2; k++) {
        CkptArray a = k ? CKPT_ADAM_V : CKPT_ADAM_M;
        if (stage >= 1) {
            ckpt_set_buffer(l, a, moments[k], shard_numel(t, ranks), on_host);
            ckpt_hold_shard(l, a, t, LAYER_EMBEDDING, last, rank, ranks);
        } else {
            ckpt_set_buffer(l, a, moments[k], t->num_params, on_host);
            hold_replicated(l, a, 0, t->num_params, rank, ranks);
        }
    }
}

CkptState ckpt_state(int step, int adam_t, uint64_t rng, const LossScaler *ls) {
    CkptState s = {.step = step, .adam_t = adam_t, .rng = rng, .loss_scale = 1.0f};
    if (ls) {
        s.loss_scale = ls->scale;
        s.clean_steps = ls->clean_steps;
    }
    return s;
}

/* ---- the checksum ---- */

/* The header's share: everything but the writer text and the checksum itself. */
static uint64_t header_hash(CheckpointHeader h) {
    memset(h.writer, 0, sizeof h.writer);
    h.checksum = 0;
    return hash_bytes(&h, sizeof h);
}

static uint64_t chunk_key(uint64_t chunk_hash, size_t index) {
    return hash64(chunk_hash ^ (0x9E3779B97F4A7C15ULL * (uint64_t)(index + 1)));
}

static uint64_t combine(const CheckpointHeader *h, uint64_t directory_hash, uint64_t chunks) {
    return hash64(header_hash(*h) ^ hash64(directory_hash ^ hash64(chunks)));
}

static size_t data_bytes(const CheckpointHeader *h) {
    return (size_t)h->num_arrays * h->num_params * sizeof(float);
}

static size_t num_chunks(const CheckpointHeader *h) {
    return (data_bytes(h) + CKPT_CHUNK_BYTES - 1) / CKPT_CHUNK_BYTES;
}

/* XOR of the keyed hashes of chunks first, first + stride, ... of the arrays in fd.
 * Returns 0 and sets *failed_errno when a read fails or comes up short. */
static uint64_t hash_chunks(int fd, const CheckpointHeader *h, size_t first, size_t stride,
                            int *failed_errno) {
    size_t n = num_chunks(h), total = data_bytes(h);
    uint64_t fold = 0;
    int failed = 0;
#pragma omp parallel reduction(^ : fold) reduction(| : failed)
    {
        unsigned char *buf = xmalloc(CKPT_CHUNK_BYTES);
#pragma omp for schedule(dynamic)
        for (size_t i = first; i < n; i += stride) {
            size_t at = i * (size_t)CKPT_CHUNK_BYTES;
            size_t bytes = total - at < CKPT_CHUNK_BYTES ? total - at : CKPT_CHUNK_BYTES;
            ssize_t got = pread(fd, buf, bytes, (off_t)(h->data_offset + at));
            if (got != (ssize_t)bytes) {
                failed |= got < 0 ? errno : EIO;
                continue;
            }
            fold ^= chunk_key(hash_bytes(buf, bytes), i);
        }
        free(buf);
    }
    *failed_errno = failed;
    return fold;
}

/* ---- writing ---- */

static size_t round_up(size_t x, size_t to) {
    return (x + to - 1) / to * to;
}

void ckpt_writer_init(CkptWriter *w, const Config *cfg, const CkptLayout *l, const CkptState *s) {
    memset(w, 0, sizeof *w);
    w->cfg = cfg;
    w->layout = l;
    snprintf(w->path, sizeof w->path, "%s", cfg->save);
    snprintf(w->tmp, sizeof w->tmp, "%s.tmp", cfg->save);
    ParamTable table;
    param_table_build(&table, &cfg->model);

    CheckpointHeader *h = &w->header;
    memcpy(h->magic, CKPT_MAGIC, sizeof CKPT_MAGIC);
    h->version = CKPT_VERSION;
    h->header_bytes = sizeof *h;
    h->layers = cfg->model.layers;
    h->dmodel = cfg->model.dmodel;
    h->heads = cfg->model.heads;
    h->seq = cfg->model.seq;
    h->vocab = cfg->model.vocab;
    h->num_tensors = table.num_tensors;
    h->num_arrays = CKPT_ARRAYS;
    h->precision = cfg->precision;
    h->tied_embeddings = cfg->model.tied;
    h->experts = (int16_t)cfg->model.moe.experts;
    h->moe_every = (int16_t)(cfg->model.moe.experts ? cfg->model.moe.every : 0);
    h->num_params = table.num_params;
    h->seed = cfg->seed;
    h->batch = cfg->batch;
    h->micro = cfg->micro;
    h->steps = cfg->steps;
    h->warmup = cfg->warmup;
    h->lr = cfg->lr;
    h->wd = cfg->wd;
    h->clip = cfg->clip;
    h->beta1 = cfg->beta1;
    h->beta2 = cfg->beta2;
    h->eps = cfg->eps;
    h->step = s->step;
    h->adam_t = s->adam_t;
    h->rng_state = s->rng;
    h->loss_scale = s->loss_scale;
    h->loss_scale_clean_steps = s->clean_steps;
    snprintf(h->writer, sizeof h->writer, "%s", l->writer);

    /* the directory: the table, then the arrays */
    w->directory_bytes = table.num_tensors * sizeof(CkptTensorEntry) + CKPT_ARRAYS * sizeof(CkptArrayEntry);
    w->directory = xcalloc(1, w->directory_bytes);
    CkptTensorEntry *te = w->directory;
    for (int i = 0; i < table.num_tensors; i++) {
        const ParamTensor *t = &table.tensors[i];
        snprintf(te[i].name, sizeof te[i].name, "%s", t->name);
        te[i].layer = t->layer;
        te[i].rows = t->rows;
        te[i].cols = t->cols;
        te[i].offset = t->offset;
        te[i].numel = t->numel;
    }
    h->data_offset = round_up(sizeof *h + w->directory_bytes, CKPT_ALIGN);
    CkptArrayEntry *ae = (CkptArrayEntry *)(te + table.num_tensors);
    for (int a = 0; a < CKPT_ARRAYS; a++) {
        snprintf(ae[a].name, sizeof ae[a].name, "%s", ckpt_array_names[a]);
        ae[a].numel = table.num_params;
        ae[a].offset = h->data_offset + (uint64_t)a * table.num_params * sizeof(float);
    }
    param_table_free(&table);
}

void ckpt_writer_free(CkptWriter *w) {
    free(w->directory);
    w->directory = NULL;
}

static void write_at(const CkptWriter *w, int fd, const void *data, size_t bytes, uint64_t offset) {
    const char *p = data;
    while (bytes > 0) {
        errno = 0;
        if (fault_disk_full(w->path, bytes)) break;
        ssize_t n = pwrite(fd, p, bytes, (off_t)offset);
        if (n <= 0) break;
        p += n;
        bytes -= (size_t)n;
        offset += (uint64_t)n;
    }
    if (bytes > 0)
        fatal(EXIT_RUNTIME, "--save %s: write failed (%s)", w->path, strerror(errno ? errno : EIO));
}

static void sync_or_die(const CkptWriter *w, int fd) {
    if (fsync(fd) != 0) fatal(EXIT_RUNTIME, "--save %s: write failed (%s)", w->path, strerror(errno));
}

/* Until the commit, PATH.tmp's header is zero (no magic: a .tmp is never
 * mistaken for a checkpoint) but for this save's nonce, where the checksum
 * will go: the mark by which the other ranks know the file is the one rank 0
 * created for this save, not a stale one of an earlier save. */
#define CKPT_NONCE_OFFSET offsetof(CheckpointHeader, checksum)

void ckpt_writer_create(CkptWriter *w) {
    int fd = open(w->tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) fatal(EXIT_RUNTIME, "--save %s: cannot write %s (%s)", w->path, w->tmp, strerror(errno));
    temp_file_register(w->tmp);
    w->nonce = unique_id();
    write_at(w, fd, &w->nonce, sizeof w->nonce, CKPT_NONCE_OFFSET);
    write_at(w, fd, w->directory, w->directory_bytes, sizeof w->header);
    if (ftruncate(fd, (off_t)(w->header.data_offset + data_bytes(&w->header))) != 0)
        fatal(EXIT_RUNTIME, "--save %s: cannot size %s (%s)", w->path, w->tmp, strerror(errno));
    close(fd);
}

/* Open PATH.tmp for writing, after checking it carries w->nonce. */
static int open_own_tmp(const CkptWriter *w) {
    int fd = open(w->tmp, O_RDWR);
    if (fd < 0)
        fatal(EXIT_RUNTIME, "--save %s: cannot write %s (%s) (valid: a --save directory every rank shares)",
              w->path, w->tmp, strerror(errno));
    uint64_t nonce = 0;
    if (pread(fd, &nonce, sizeof nonce, CKPT_NONCE_OFFSET) != (ssize_t)sizeof nonce || nonce != w->nonce) {
        close(fd);
        fatal(EXIT_RUNTIME,
              "--save %s: %s is not the file rank 0 created for this save (a stale one, in a directory "
              "the ranks do not share) (valid: a --save directory every rank shares)",
              w->path, w->tmp);
    }
    return fd;
}

void ckpt_writer_write(CkptWriter *w) {
    int fd = open_own_tmp(w);
    temp_file_register(w->tmp);
    const CkptLayout *l = w->layout;
    for (int a = 0; a < CKPT_ARRAYS; a++) {
        const CkptHolding *h = &l->array[a];
        const float *host = h->buffer; /* element `from` of the buffer, on the host */
        size_t from = 0;
        float *staged = NULL;
        if (!h->on_host) { /* one copy of the span this rank writes, then the segments from it */
            size_t lo = h->local_n, hi = 0;
            for (int i = 0; i < h->count; i++)
                if (h->segments[i].writes) {
                    if (h->segments[i].local < lo) lo = h->segments[i].local;
                    if (h->segments[i].local + h->segments[i].count > hi)
                        hi = h->segments[i].local + h->segments[i].count;
                }
            if (hi > lo) {
                staged = xmalloc((hi - lo) * sizeof(float));
                copy_to_host(staged, h->buffer + lo, (hi - lo) * sizeof(float));
                host = staged;
                from = lo;
            }
        }
        uint64_t array_at = w->header.data_offset + (uint64_t)a * w->header.num_params * sizeof(float);
        for (int i = 0; i < h->count; i++) {
            const CkptSegment *s = &h->segments[i];
            if (!s->writes) continue;
            write_at(w, fd, host + (s->local - from), s->count * sizeof(float),
                     array_at + s->first * sizeof(float));
            w->written[a] += s->count;
        }
        free(staged);
        if (a == CKPT_PARAMS)
            fault_point(
                "save"); /* tests/robustness/faults.bats: a crash here leaves PATH.tmp half written, PATH intact */
    }
    sync_or_die(w, fd);
    close(fd);
}

uint64_t ckpt_writer_hash_chunks(CkptWriter *w, int rank, int ranks) {
    int fd = open(w->tmp, O_RDONLY);
    if (fd < 0) fatal(EXIT_RUNTIME, "--save %s: cannot read back %s (%s)", w->path, w->tmp, strerror(errno));
    int failed;
    uint64_t fold = hash_chunks(fd, &w->header, rank, ranks, &failed);
    close(fd);
    if (failed) fatal(EXIT_RUNTIME, "--save %s: cannot read back %s (%s)", w->path, w->tmp, strerror(failed));
    return fold;
}

/* After a rename, the directory entry must reach the disk too. */
static void sync_directory(const CkptWriter *w) {
    char dir[PATH_BYTES];
    directory_of(w->path, dir);
    int fd = open(dir, O_RDONLY);
    if (fd >= 0) {
        fsync(fd); /* best effort: some file systems refuse fsync on a directory */
        close(fd);
    }
}

uint64_t ckpt_writer_commit(CkptWriter *w, uint64_t chunks, const double written[CKPT_ARRAYS]) {
    for (int a = 0; a < CKPT_ARRAYS; a++)
        if (written[a] != (double)w->header.num_params)
            fatal(
                EXIT_RUNTIME,
                "--save %s: the ranks wrote %.0f elements of %s, the model has %llu (a layout that misses or "
                "repeats elements)",
                w->path, written[a], ckpt_array_names[a], (unsigned long long)w->header.num_params);
    w->header.checksum = combine(&w->header, hash_bytes(w->directory, w->directory_bytes), chunks);
    int fd = open(w->tmp, O_WRONLY);
    if (fd < 0) fatal(EXIT_RUNTIME, "--save %s: cannot write %s (%s)", w->path, w->tmp, strerror(errno));
    write_at(w, fd, &w->header, sizeof w->header, 0);
    sync_or_die(w, fd);
    close(fd);
    if (rename(w->tmp, w->path) != 0)
        fatal(EXIT_RUNTIME, "--save %s: rename from %s failed (%s)", w->path, w->tmp, strerror(errno));
    temp_file_forget(w->tmp);
    sync_directory(w);
    return w->header.checksum;
}

int checkpoint_due(const Config *cfg, int step, int last_step) {
    if (!cfg->save[0]) return 0;
    return step == last_step || (cfg->save_every && step % cfg->save_every == 0);
}

uint64_t checkpoint_write(const Config *cfg, const CkptLayout *l, const CkptState *s) {
    CkptWriter w;
    ckpt_writer_init(&w, cfg, l, s);
    ckpt_writer_create(&w);
    ckpt_writer_write(&w);
    uint64_t chunks = ckpt_writer_hash_chunks(&w, 0, 1);
    double written[CKPT_ARRAYS];
    for (int a = 0; a < CKPT_ARRAYS; a++) written[a] = (double)w.written[a];
    uint64_t checksum = ckpt_writer_commit(&w, chunks, written);
    ckpt_writer_free(&w);
    return checksum;
}

uint64_t checkpoint_save(const Config *cfg, const CkptLayout *l, const CkptState *s) {
    uint64_t checksum = checkpoint_write(cfg, l, s);
    run_info_checkpoint(cfg, cfg->save, s->step, checksum);
    log_info("saved checkpoint %s at step %d\n", cfg->save, s->step);
    return checksum;
}

const OutputKind checkpoint_output = {.what = "a checkpoint of this course",
                                      .earlier = "checkpoint",
                                      .signature = CKPT_MAGIC,
                                      .signature_bytes = sizeof CKPT_MAGIC};

/* A save replaces PATH (and PATH.tmp), so neither may be the training text,
 * nor one of the files the run itself writes into --out (compared as files,
 * not names). */
static void check_save_is_no_run_file(const Config *c) {
    const char *path = c->save;
    char tmp[JOINED_PATH_BYTES];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    if (same_file(path, c->data))
        fatal(EXIT_USAGE, "--save %s: is the --data file %s (valid: a new name or an earlier checkpoint)",
              path, c->data);
    if (same_file(tmp, c->data))
        fatal(EXIT_USAGE,
              "--save %s: its temporary file %s is the --data file %s (valid: a name whose .tmp is not the "
              "data)",
              path, tmp, c->data);
    char dir[PATH_BYTES];
    directory_of(path, dir);
    const char *name = strrchr(path, '/') ? strrchr(path, '/') + 1 : path;
    if (out_is_run_file(name) && same_file(dir, c->out))
        fatal(EXIT_USAGE,
              "--save %s: is %s, a file this run writes into --out %s (valid: a name that is not one of the "
              "run's files)",
              path, name, c->out);
}

void checkpoint_check_save_path(const Config *c) {
    const char *path = c->save;
    check_save_is_no_run_file(c);
    output_file_check("--save", path, &checkpoint_output);
    char dir[PATH_BYTES];
    directory_of(path, dir);
    /* access() says yes to root on a read-only file system: create a file there to be sure */
    char probe[JOINED_PATH_BYTES];
    snprintf(probe, sizeof probe, "%s.probe%d", path, (int)getpid());
    int fd = open(probe, O_WRONLY | O_CREAT | O_EXCL, 0600);
    if (fd < 0)
        fatal(EXIT_USAGE, "--save %s: cannot create a file in the directory %s (%s)", path, dir,
              strerror(errno));
    close(fd);
    unlink(probe);
}

/* ---- reading ---- */

/* A header field out of its range means the file is damaged (or not ours). */
static void check_field(const char *what, const char *name, double value, double lo, double hi) {
    if (!(value >= lo && value <= hi))
        fatal(EXIT_USAGE, "%s: corrupt checkpoint: %s %.10g (valid: %.10g..%.10g)", what, name, value, lo,
              hi);
}

/* The model shape a header describes. */
static ModelConfig header_model(const CheckpointHeader *h) {
    return (ModelConfig){.layers = h->layers,
                         .dmodel = h->dmodel,
                         .heads = h->heads,
                         .seq = h->seq,
                         .vocab = h->vocab,
                         .tied = h->tied_embeddings,
                         .moe = {.experts = h->experts, .every = h->moe_every, .top_k = 1}};
}

static void check_header(const char *what, const CheckpointHeader *h) {
    check_field(what, "header_bytes", h->header_bytes, sizeof *h, sizeof *h);
    /* the model shape as --layers, --dmodel, ... would be checked: whole heads included */
    ModelConfig m = header_model(h);
    const char *problem = model_config_problem(&m);
    if (problem)
        fatal(EXIT_USAGE, "%s: corrupt checkpoint: its model shape is not one this course builds: %s", what,
              problem);
    check_field(what, "tied_embeddings", h->tied_embeddings, 0, 1);
    check_field(what, "experts", h->experts, 0, MAX_EXPERTS);
    check_field(what, "moe_every", h->moe_every, h->experts ? 1 : 0, h->experts ? h->layers : 0);
    check_field(what, "num_arrays", h->num_arrays, CKPT_ARRAYS, CKPT_ARRAYS);
    check_field(what, "precision", h->precision, PRECISION_FP32, PRECISION_FP16);
    check_field(what, "batch", h->batch, 1, 1000000);
    check_field(what, "micro", h->micro, 1, h->batch);
    check_field(what, "steps", h->steps, 1, 10000000);
    check_field(what, "warmup", h->warmup, 0, 10000000);
    check_field(what, "lr", h->lr, 1e-12, 10);
    check_field(what, "wd", h->wd, 0, 10);
    check_field(what, "clip", h->clip, 0, 1e6);
    check_field(what, "beta1", h->beta1, 0, 0.999999);
    check_field(what, "beta2", h->beta2, 0, 0.999999);
    check_field(what, "eps", h->eps, 1e-30, 1);
    check_field(what, "step", h->step, 0, h->steps);
    check_field(what, "adam_t", h->adam_t, 0, h->step); /* fp16 may skip steps */
    check_field(what, "loss_scale", h->loss_scale, 1e-30, 1e30);
    check_field(what, "loss_scale_clean_steps", h->loss_scale_clean_steps, 0, 10000000);
}

/* The directory must describe exactly the table of the header's model shape. */
static void check_directory(const char *what, const CkptFile *f) {
    const CheckpointHeader *h = &f->header;
    ModelConfig m = header_model(h);
    ParamTable table;
    param_table_build(&table, &m);
    if ((uint64_t)table.num_params != h->num_params || table.num_tensors != h->num_tensors)
        fatal(EXIT_USAGE,
              "%s: corrupt checkpoint: %llu parameters in %d tensors, a model of this shape has %zu in %d",
              what, (unsigned long long)h->num_params, h->num_tensors, table.num_params, table.num_tensors);
    for (int i = 0; i < table.num_tensors; i++) {
        const ParamTensor *t = &table.tensors[i];
        const CkptTensorEntry *e = &f->tensors[i];
        if (strncmp(e->name, t->name, sizeof e->name) != 0 || e->layer != t->layer || e->rows != t->rows ||
            e->cols != t->cols || e->offset != t->offset || e->numel != t->numel)
            fatal(EXIT_USAGE,
                  "%s: corrupt checkpoint: tensor %d is '%.31s' (%d x %d at %llu), the model's is '%s' "
                  "(%d x %d at %zu)",
                  what, i, e->name, e->rows, e->cols, (unsigned long long)e->offset, t->name, t->rows,
                  t->cols, t->offset);
    }
    param_table_free(&table);
    for (int a = 0; a < CKPT_ARRAYS; a++) {
        const CkptArrayEntry *e = &f->arrays[a];
        uint64_t at = h->data_offset + (uint64_t)a * h->num_params * sizeof(float);
        if (strncmp(e->name, ckpt_array_names[a], sizeof e->name) != 0 || e->dtype != 0 ||
            e->numel != h->num_params || e->offset != at)
            fatal(EXIT_USAGE,
                  "%s: corrupt checkpoint: array %d is '%.15s' (dtype %u, %llu elements at %llu), expected "
                  "'%s' (f32, %llu at %llu)",
                  what, a, e->name, e->dtype, (unsigned long long)e->numel, (unsigned long long)e->offset,
                  ckpt_array_names[a], (unsigned long long)h->num_params, (unsigned long long)at);
    }
}

void ckpt_file_open(CkptFile *f, const char *path, const char *what) {
    memset(f, 0, sizeof *f);
    struct stat st;
    if (stat(path, &st) != 0) fatal(EXIT_USAGE, "%s: cannot open (%s)", what, strerror(errno));
    if (!S_ISREG(st.st_mode)) fatal(EXIT_USAGE, "%s: not a regular file", what);
    f->fd = open(path, O_RDONLY);
    if (f->fd < 0) fatal(EXIT_USAGE, "%s: cannot open (%s)", what, strerror(errno));
    f->file_bytes = st.st_size;
    CheckpointHeader *h = &f->header;
    ssize_t got = pread(f->fd, h, sizeof *h, 0);
    if (got < (ssize_t)sizeof h->magic || memcmp(h->magic, CKPT_MAGIC, sizeof CKPT_MAGIC) != 0)
        fatal(EXIT_USAGE, "%s: not a checkpoint of this course (wrong magic bytes)", what);
    if (got < (ssize_t)(sizeof h->magic + sizeof h->version))
        fatal(EXIT_USAGE, "%s: the file is truncated (no complete header)", what);
    if (h->version != CKPT_VERSION)
        fatal(EXIT_USAGE, "%s: checkpoint format version %u, this program reads version %u", what, h->version,
              CKPT_VERSION);
    if (got < (ssize_t)sizeof *h) fatal(EXIT_USAGE, "%s: the file is truncated (no complete header)", what);
    check_header(what, h);
    check_field(what, "num_tensors", h->num_tensors, 1, 3 + BLOCK_TENSORS * MAX_LAYERS);
    size_t directory_bytes = h->num_tensors * sizeof(CkptTensorEntry) + CKPT_ARRAYS * sizeof(CkptArrayEntry);
    uint64_t data_offset = round_up(sizeof *h + directory_bytes, CKPT_ALIGN);
    if (h->data_offset != data_offset)
        fatal(EXIT_USAGE, "%s: corrupt checkpoint: data_offset %llu (valid: %llu)", what,
              (unsigned long long)h->data_offset, (unsigned long long)data_offset);
    uint64_t expected = data_offset + data_bytes(h);
    if (h->num_params > (1ULL << 40) || (uint64_t)st.st_size < expected)
        fatal(EXIT_USAGE, "%s: the file is truncated (%lld of %llu bytes)", what, (long long)st.st_size,
              (unsigned long long)expected);
    if ((uint64_t)st.st_size > expected)
        fatal(EXIT_USAGE, "%s: %lld bytes where a checkpoint of this model has %llu (corrupt?)", what,
              (long long)st.st_size, (unsigned long long)expected);
    f->tensors = xmalloc(directory_bytes);
    f->arrays = (CkptArrayEntry *)(f->tensors + h->num_tensors);
    if (pread(f->fd, f->tensors, directory_bytes, sizeof *h) != (ssize_t)directory_bytes)
        fatal(EXIT_USAGE, "%s: the file is truncated (no complete directory)", what);
    check_directory(what, f);
}

void ckpt_file_close(CkptFile *f) {
    if (f->fd > 0) close(f->fd);
    free(f->tensors);
    memset(f, 0, sizeof *f);
}

uint64_t ckpt_file_checksum(const CkptFile *f, const char *path, const char *what) {
    int failed;
    uint64_t chunks = hash_chunks(f->fd, &f->header, 0, 1, &failed);
    if (failed) fatal(EXIT_USAGE, "%s: cannot read %s (%s)", what, path, strerror(failed));
    size_t directory_bytes =
        f->header.num_tensors * sizeof(CkptTensorEntry) + CKPT_ARRAYS * sizeof(CkptArrayEntry);
    return combine(&f->header, hash_bytes(f->tensors, directory_bytes), chunks);
}

/* Open cfg->resume-style path and check it against the run: everything,
 * checksum included, and that there are steps left to do. */
static void open_for_run(CkptFile *f, const char *path, const Config *cfg, uint64_t *checksum) {
    char what[JOINED_PATH_BYTES];
    snprintf(what, sizeof what, "--resume %s", path);
    ckpt_file_open(f, path, what);
    const CheckpointHeader *h = &f->header;
    const ModelConfig *m = &cfg->model;
    if (h->layers != m->layers || h->dmodel != m->dmodel || h->heads != m->heads || h->seq != m->seq ||
        h->vocab != m->vocab)
        fatal(EXIT_USAGE,
              "%s: written for a different model (layers %d, dmodel %d, heads %d, seq %d, vocab %d); "
              "this run has layers %d, dmodel %d, heads %d, seq %d, vocab %d",
              what, h->layers, h->dmodel, h->heads, h->seq, h->vocab, m->layers, m->dmodel, m->heads, m->seq,
              m->vocab);
    if (h->tied_embeddings != m->tied)
        fatal(EXIT_USAGE,
              "%s: written %s tied embeddings; this run %s --tie-embeddings (valid: the same as the run that "
              "wrote it)",
              what, h->tied_embeddings ? "with" : "without", m->tied ? "has" : "lacks");
    int every = m->moe.experts ? m->moe.every : 0;
    if (h->experts != m->moe.experts || h->moe_every != every)
        fatal(EXIT_USAGE,
              "%s: written with --experts %d --moe-every %d; this run has --experts %d --moe-every %d (valid: "
              "the same as the run that wrote it; 0 experts: the dense model)",
              what, h->experts, h->moe_every, m->moe.experts, every);
    uint64_t sum = ckpt_file_checksum(f, path, what);
    if (sum != h->checksum)
        fatal(EXIT_USAGE,
              "%s: corrupt checkpoint: checksum %016llx, its contents give %016llx (the file was "
              "damaged after it was saved)",
              what, (unsigned long long)h->checksum, (unsigned long long)sum);
    *checksum = sum;
    int last_step = cfg->stop_after ? cfg->stop_after : cfg->steps;
    if (h->step >= cfg->steps)
        fatal(EXIT_USAGE,
              "%s: the checkpoint is at step %d and --steps is %d: nothing to do (valid: --steps above %d)",
              what, h->step, cfg->steps, h->step);
    if (h->step >= last_step)
        fatal(EXIT_USAGE,
              "--stop-after %d is not after the checkpoint's step %d (valid: --stop-after %d..%d)",
              cfg->stop_after, h->step, h->step + 1, cfg->steps);
}

void checkpoint_check(const char *path, const Config *cfg, int *step, uint64_t *checksum) {
    CkptFile f;
    open_for_run(&f, path, cfg, checksum);
    *step = f.header.step;
    ckpt_file_close(&f);
}

/* Read this rank's segments of every array into its buffers. */
static void read_segments(const CkptFile *f, const CkptLayout *l, const char *path) {
    for (int a = 0; a < CKPT_ARRAYS; a++) {
        const CkptHolding *h = &l->array[a];
        size_t bytes = h->local_n * sizeof(float);
        float *host = h->buffer, *staged = NULL;
        if (!h->on_host) { /* keep what no segment covers (a shard's padding) as it is */
            staged = xmalloc(bytes ? bytes : 1);
            copy_to_host(staged, h->buffer, bytes);
            host = staged;
        }
        for (int i = 0; i < h->count; i++) {
            const CkptSegment *s = &h->segments[i];
            size_t want = s->count * sizeof(float);
            if (pread(f->fd, host + s->local, want,
                      (off_t)(f->arrays[a].offset + s->first * sizeof(float))) != (ssize_t)want)
                fatal(EXIT_USAGE, "--resume %s: the file is truncated", path);
        }
        if (staged) copy_to_device(h->buffer, staged, bytes);
        free(staged);
    }
}

int checkpoint_resume(const Config *cfg, const CkptLayout *l, int *adam_t, uint64_t *rng, LossScaler *ls) {
    CkptFile f;
    char what[JOINED_PATH_BYTES];
    snprintf(what, sizeof what, "--resume %s", cfg->resume);
    ckpt_file_open(&f, cfg->resume, what);
    const CheckpointHeader *h = &f.header;
    /* the file checked before training (config.c) must still be the same one */
    if (h->checksum != cfg->resume_checksum)
        fatal(EXIT_USAGE,
              "--resume %s: the checkpoint changed after the run started (checksum %016llx, was %016llx)",
              cfg->resume, (unsigned long long)h->checksum, (unsigned long long)cfg->resume_checksum);
    /* at step 0 (common/ckpt import-hf's checkpoints) there is no curve yet to differ from */
    if (h->step > 0 &&
        (h->seed != cfg->seed || h->batch != cfg->batch || h->steps != cfg->steps || h->lr != cfg->lr))
        log_info("note: resuming with different training flags than the checkpoint's (seed %llu, batch %d, "
                 "steps %d, lr %g); the loss curve will differ from an uninterrupted run\n",
                 (unsigned long long)h->seed, h->batch, h->steps, h->lr);
    read_segments(&f, l, cfg->resume);
    *adam_t = h->adam_t;
    *rng = h->rng_state;
    if (ls && ls->dynamic) {
        if (h->precision == PRECISION_FP16) {
            ls->scale = h->loss_scale;
            ls->clean_steps = h->loss_scale_clean_steps;
        } else {
            log_info(
                "note: the checkpoint was written by a %s run: fp16's dynamic loss scale starts afresh at "
                "%g\n",
                precision_name(h->precision), ls->scale);
        }
    }
    int step = h->step;
    ckpt_file_close(&f);
    return step;
}
