/* data.c: see data.h. */
#include "common/model/data.h" /* the training data and its batches */

#include "common/device/device.h" /* mem_alloc, copies, streams, timers */
#include "common/model/token_shard.h" /* llm.c's token shards */
#include "common/core/util.h" /* fatal, log_info, exit codes, flag parsing */

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <linux/magic.h>
#include <sys/stat.h>
#include <sys/vfs.h>

/* Open path for reading, refusing what is not a regular file with bytes in
 * it: directories, device nodes (/dev/zero never ends), FIFOs, and the files
 * of /proc and /sys, which say they are empty and then are not. */
static FILE *open_data_file(const char *path, int T, size_t *bytes) {
    struct stat st;
    if (stat(path, &st) != 0) fatal(EXIT_USAGE, "--data %s: cannot open (%s)", path, strerror(errno));
    if (S_ISDIR(st.st_mode)) fatal(EXIT_USAGE, "--data %s: is a directory, not a text file", path);
    struct statfs fs;
    int pseudo = statfs(path, &fs) == 0 && (fs.f_type == PROC_SUPER_MAGIC || fs.f_type == SYSFS_MAGIC);
    if (!S_ISREG(st.st_mode) || pseudo)
        fatal(EXIT_USAGE, "--data %s: not a regular file (valid: a text file of at least %d bytes)", path,
              2 * (T + 1));
    FILE *f = fopen(path, "rb");
    if (!f) fatal(EXIT_USAGE, "--data %s: cannot open (%s)", path, strerror(errno));
    /* Each split must hold at least one sequence plus its next-byte target. */
    size_t need = 2 * ((size_t)T + 1);
    *bytes = (size_t)st.st_size;
    if (*bytes == 0) fatal(EXIT_USAGE, "--data %s: the file is empty (need at least %zu bytes)", path, need);
    if (*bytes < 4)
        fatal(EXIT_USAGE,
              "--data %s: %zu bytes is too little to train on (valid: a file of at least 4 bytes)", path,
              *bytes);
    if (*bytes < need)
        fatal(EXIT_USAGE,
              "--seq %d is longer than the data allows: %s has %zu bytes, training and validation need %zu "
              "(valid: --seq up to %zu for this file)",
              T, path, *bytes, need, *bytes / 2 - 1);
    return f;
}

static void read_data_file(FILE *f, const char *path, unsigned char *dst, size_t bytes) {
    if (fread(dst, 1, bytes, f) != bytes)
        fatal(EXIT_USAGE, "--data %s: read failed (%s)", path, ferror(f) ? strerror(errno) : "file shrank");
    fclose(f);
}

/* A shard's tokens, with the same refusals as a text file's: at least one
 * sequence and its next token in each split. */
static uint16_t *read_shard(const char *path, int T, size_t *count) {
    uint16_t *tokens = shard_read("--data", path, count);
    size_t need = 2 * ((size_t)T + 1);
    if (*count < need)
        fatal(EXIT_USAGE,
              "--seq %d is longer than the data allows: %s has %zu tokens, training and validation need %zu "
              "(valid: --seq up to %zu for this shard)",
              T, path, *count, need, *count >= 4 ? *count / 2 - 1 : 0);
    return tokens;
}

/* Is path a token shard? A file laid out as one under another magic is
 * refused, not read as text. */
static int is_shard(const char *path) {
    int32_t magic;
    if (shard_other_magic(path, &magic))
        fatal(EXIT_USAGE, "--data %s: laid out as a token shard but its magic is %d (valid: %d)", path, magic,
              SHARD_MAGIC);
    return shard_has_magic(path);
}

void data_load(Dataset *d, const char *path, int T) {
    memset(d, 0, sizeof *d);
    if (is_shard(path)) {
        d->tokens = read_shard(path, T, &d->size);
        d->is_shard = 1;
    } else {
        FILE *f = open_data_file(path, T, &d->size);
        unsigned char *bytes = xmalloc(d->size);
        read_data_file(f, path, bytes, d->size);
        d->tokens = xmalloc(d->size * sizeof *d->tokens);
        for (size_t i = 0; i < d->size; i++) d->tokens[i] = bytes[i];
        free(bytes);
    }
    size_t need = (size_t)T + 1;
    size_t val = d->size / 10 > need ? d->size / 10 : need;
    d->split_at = d->size - val;
}

void data_identify(const char *path, int T, int V, size_t *bytes, uint64_t *checksum) {
    if (is_shard(path)) {
        size_t count;
        uint16_t *tokens = read_shard(path, T, &count);
        int largest = 0;
        for (size_t i = 0; i < count; i++) largest = tokens[i] > largest ? tokens[i] : largest;
        if (largest >= V)
            fatal(EXIT_USAGE, "--data %s: holds token id %d, past --vocab %d (valid: --vocab %d or more)",
                  path, largest, V, largest + 1);
        *bytes = count * sizeof *tokens;
        *checksum = hash_bytes(tokens, *bytes);
        free(tokens);
        return;
    }
    FILE *f = open_data_file(path, T, bytes);
    unsigned char *all = xmalloc(*bytes);
    read_data_file(f, path, all, *bytes);
    *checksum = hash_bytes(all, *bytes);
    free(all);
}

void data_upload_batch(const Dataset *d, Split split, uint64_t seed, int index, int first, int count, int T,
                       int *device_tokens, int *device_targets) {
    if (!device_tokens && !device_targets) return; /* nothing wanted here (a pipeline's middle stage) */
    size_t bytes = (size_t)count * T * sizeof(int);
    int *tokens = xmalloc(bytes), *targets = xmalloc(bytes);
    data_batch(d, split, seed, index, first, count, T, tokens, targets);
    copy_to_device(device_tokens, tokens, bytes);
    copy_to_device(device_targets, targets, bytes);
    free(tokens);
    free(targets);
}

void data_free(Dataset *d) {
    free(d->tokens);
    memset(d, 0, sizeof *d);
}

void data_batch(const Dataset *d, Split split, uint64_t seed, int index, int first, int count, int T,
                int *tokens, int *targets) {
    size_t begin = split == SPLIT_TRAIN ? 0 : d->split_at;
    size_t end = split == SPLIT_TRAIN ? d->split_at : d->size;
    size_t positions = end - begin - T; /* valid starts: a sequence and one more token fit */
    for (int j = 0; j < count; j++) {
        int seq = first + j;
        /* the split is part of the hash so training and validation draws differ */
        uint64_t h = hash64(seed ^ hash64(((uint64_t)split << 62) ^ ((uint64_t)index << 24) ^ (uint64_t)seq));
        size_t start = begin + h % positions;
        for (int t = 0; t < T; t++) {
            tokens[j * T + t] = d->tokens[start + t];
            targets[j * T + t] = d->tokens[start + t + 1];
        }
    }
}
