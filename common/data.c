/* data.c: see data.h. */
#include "data.h"

#include "util.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

void data_load(Dataset *d, const char *path, int T) {
    memset(d, 0, sizeof *d);
    struct stat st;
    if (stat(path, &st) != 0) fatal(EXIT_USAGE, "--data %s: cannot open (%s)", path, strerror(errno));
    if (S_ISDIR(st.st_mode)) fatal(EXIT_USAGE, "--data %s: is a directory, not a text file", path);
    FILE *f = fopen(path, "rb");
    if (!f) fatal(EXIT_USAGE, "--data %s: cannot open (%s)", path, strerror(errno));
    if (st.st_size == 0)
        fatal(EXIT_USAGE, "--data %s: the file is empty (need at least %d bytes)", path, 2 * (T + 1));
    d->size = (size_t)st.st_size;
    d->bytes = xmalloc(d->size);
    if (fread(d->bytes, 1, d->size, f) != d->size)
        fatal(EXIT_USAGE, "--data %s: read failed (%s)", path, ferror(f) ? strerror(errno) : "file shrank");
    fclose(f);
    /* Each split must hold at least one sequence plus its next-byte target. */
    size_t need = (size_t)T + 1;
    if (d->size < 2 * need)
        fatal(EXIT_USAGE,
              "--seq %d is longer than the data allows: %s has %zu bytes, training and validation need %zu "
              "(valid: --seq up to %zu for this file)",
              T, path, d->size, 2 * need, d->size / 2 - 1);
    size_t val = d->size / 10 > need ? d->size / 10 : need;
    d->split_at = d->size - val;
}

void data_free(Dataset *d) {
    free(d->bytes);
    memset(d, 0, sizeof *d);
}

void data_batch(const Dataset *d, Split split, uint64_t seed, int index, int first, int count, int T,
                int *tokens, int *targets) {
    size_t begin = split == SPLIT_TRAIN ? 0 : d->split_at;
    size_t end = split == SPLIT_TRAIN ? d->split_at : d->size;
    size_t positions = end - begin - T; /* valid starts: a sequence and one more byte fit */
    for (int j = 0; j < count; j++) {
        int seq = first + j;
        /* the split is part of the hash so training and validation draws differ */
        uint64_t h = hash64(seed ^ hash64(((uint64_t)split << 62) ^ ((uint64_t)index << 24) ^ (uint64_t)seq));
        size_t start = begin + h % positions;
        for (int t = 0; t < T; t++) {
            tokens[j * T + t] = d->bytes[start + t];
            targets[j * T + t] = d->bytes[start + t + 1];
        }
    }
}
