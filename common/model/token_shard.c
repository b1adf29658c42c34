/* token_shard.c: see token_shard.h. */
#include "common/model/token_shard.h" /* llm.c's token shards */

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* 20240520 as a little-endian int32 */
static const char shard_magic_bytes[4] = {(char)0x88, (char)0xD8, (char)0x34, (char)0x01};

const OutputKind shard_output = {.what = "a token shard (magic 20240520)",
                                 .earlier = "token shard",
                                 .signature = shard_magic_bytes,
                                 .signature_bytes = 4,
                                 .signature_offset = 0};

int shard_has_magic(const char *path) {
    struct stat st; /* a FIFO or a device is not opened here: a read could block (data.c refuses it) */
    if (stat(path, &st) != 0 || !S_ISREG(st.st_mode)) return 0;
    FILE *f = fopen(path, "rb");
    if (!f) return 0;
    int32_t magic = 0;
    int ok = fread(&magic, sizeof magic, 1, f) == 1 && magic == SHARD_MAGIC;
    fclose(f);
    return ok;
}

int shard_other_magic(const char *path, int32_t *magic) {
    struct stat st;
    if (stat(path, &st) != 0 || !S_ISREG(st.st_mode)) return 0;
    FILE *f = fopen(path, "rb");
    if (!f) return 0;
    int32_t header[3] = {0};
    int read = fread(header, sizeof header, 1, f) == 1;
    fclose(f);
    *magic = header[0];
    return read && header[0] != SHARD_MAGIC && header[1] == SHARD_VERSION && header[2] >= 0 &&
           (size_t)st.st_size == SHARD_HEADER_INTS * sizeof(int32_t) + 2 * (size_t)header[2];
}

uint16_t *shard_read(const char *flag, const char *path, size_t *count) {
    struct stat st;
    if (stat(path, &st) != 0) fatal(EXIT_USAGE, "%s %s: cannot open (%s)", flag, path, strerror(errno));
    if (!S_ISREG(st.st_mode))
        fatal(EXIT_USAGE, "%s %s: not a regular file (valid: a token shard)", flag, path);
    FILE *f = fopen(path, "rb");
    if (!f) fatal(EXIT_USAGE, "%s %s: cannot open (%s)", flag, path, strerror(errno));
    int32_t header[SHARD_HEADER_INTS];
    size_t size = (size_t)st.st_size;
    if (size < sizeof header || fread(header, sizeof header, 1, f) != 1)
        fatal(EXIT_USAGE, "%s %s: %zu bytes is too short for a token shard (its header alone is %zu bytes)",
              flag, path, size, sizeof header);
    if (header[0] != SHARD_MAGIC)
        fatal(EXIT_USAGE, "%s %s: not a token shard (magic %d, valid: %d)", flag, path, header[0],
              SHARD_MAGIC);
    if (header[1] != SHARD_VERSION)
        fatal(EXIT_USAGE, "%s %s: token shard version %d (valid: %d)", flag, path, header[1], SHARD_VERSION);
    size_t held = (size - sizeof header) / sizeof(uint16_t);
    if (header[2] < 0 || (size - sizeof header) % sizeof(uint16_t) != 0 || (size_t)header[2] != held)
        fatal(EXIT_USAGE, "%s %s: the header says %d tokens, the file holds %zu bytes of tokens (%zu tokens)",
              flag, path, header[2], size - sizeof header, held);
    *count = held;
    uint16_t *tokens = xmalloc(held * sizeof *tokens + 1);
    if (fread(tokens, sizeof *tokens, held, f) != held)
        fatal(EXIT_USAGE, "%s %s: read failed (%s)", flag, path, ferror(f) ? strerror(errno) : "file shrank");
    fclose(f);
    return tokens;
}

void shard_write(const char *flag, const char *path, const int *tokens, size_t count) {
    if (count > INT32_MAX)
        fatal(EXIT_USAGE, "%s %s: %zu tokens is more than a shard holds (2^31 - 1)", flag, path, count);
    char tmp[JOINED_PATH_BYTES];
    snprintf(tmp, sizeof tmp, "%s.tmp-XXXXXX", path);
    int fd = mkstemp(tmp);
    if (fd < 0) fatal(EXIT_USAGE, "%s %s: cannot write (%s)", flag, path, strerror(errno));
    temp_file_register(tmp);
    FILE *f = fdopen(fd, "wb");
    if (!f) fatal(EXIT_RUNTIME, "%s %s: cannot write (%s)", flag, path, strerror(errno));
    int32_t header[SHARD_HEADER_INTS] = {SHARD_MAGIC, SHARD_VERSION, (int32_t)count};
    int ok = fwrite(header, sizeof header, 1, f) == 1;
    enum { CHUNK = 1 << 16 };
    uint16_t chunk[CHUNK];
    for (size_t done = 0; ok && done < count;) {
        size_t n = count - done < CHUNK ? count - done : CHUNK;
        for (size_t i = 0; i < n; i++) {
            int t = tokens[done + i];
            if (t < 0 || t > UINT16_MAX)
                fatal(EXIT_USAGE, "%s %s: token %d does not fit a shard's 16 bits", flag, path, t);
            chunk[i] = (uint16_t)t;
        }
        ok = fwrite(chunk, sizeof *chunk, n, f) == n;
        done += n;
    }
    if (fchmod(fd, 0644) != 0) ok = 0;
    if (fclose(f) != 0 || !ok) fatal(EXIT_RUNTIME, "%s %s: write failed (%s)", flag, path, strerror(errno));
    if (rename(tmp, path) != 0)
        fatal(EXIT_RUNTIME, "%s %s: cannot rename into place (%s)", flag, path, strerror(errno));
    temp_file_forget(tmp);
}
