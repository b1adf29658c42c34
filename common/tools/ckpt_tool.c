/* ckpt_tool.c: see ckpt_tool.h. */
#include "common/tools/ckpt_tool.h" /* common/ckpt's shared helpers */

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Open path and verify the checksum; ends the program when it does not match. */
uint64_t ckpt_open_verified(CkptFile *f, const char *path) {
    ckpt_file_open(f, path, path);
    uint64_t sum = ckpt_file_checksum(f, path, path);
    if (sum != f->header.checksum)
        fatal(EXIT_USAGE, "%s: corrupt checkpoint: checksum %016llx, its contents give %016llx", path,
              (unsigned long long)f->header.checksum, (unsigned long long)sum);
    return sum;
}

void text_add(Text *t, const char *fmt, ...) {
    for (;;) {
        va_list args;
        va_start(args, fmt);
        int n = vsnprintf(t->s ? t->s + t->len : NULL, t->s ? t->cap - t->len : 0, fmt, args);
        va_end(args);
        if (t->s && t->len + n < t->cap) {
            t->len += n;
            return;
        }
        t->cap = 2 * (t->cap + n + 64);
        char *grown = realloc(t->s, t->cap);
        if (!grown) fatal(EXIT_RUNTIME, "out of memory");
        t->s = grown;
    }
}

/* The length of the valid UTF-8 sequence that starts at s (1 to 4 bytes, at
 * most max), or 0 when none does: a stray continuation byte, a cut
 * sequence, an overlong form, a surrogate or a code point past U+10FFFF. */
static size_t utf8_length(const unsigned char *s, size_t max) {
    static const uint32_t least[5] = {0, 0, 0x80, 0x800, 0x10000}; /* below: an overlong form */
    size_t n = 0; /* the first byte's leading 1 bits: 0 for ASCII, else the sequence's length */
    while (n < 5 && (s[0] << n & 0x80)) n++;
    if (n == 0) return 1;
    if (n < 2 || n > 4 || n > max) return 0;
    uint32_t code = s[0] & (0x7f >> n);
    for (size_t i = 1; i < n; i++) {
        if ((s[i] & 0xc0) != 0x80) return 0;
        code = code << 6 | (s[i] & 0x3f);
    }
    return code < least[n] || code > 0x10ffff || (code >= 0xd800 && code <= 0xdfff) ? 0 : n;
}

/* A JSON string value of s (at most max bytes), valid UTF-8 whatever the
 * bytes: the writer text is ours, but a damaged or edited header may hold
 * anything, so a byte that is not part of valid UTF-8 is written as the
 * character of its Latin-1 meaning (\u00XX), as are control characters. */
void text_add_json_string(Text *t, const char *s, size_t max) {
    const unsigned char *u = (const unsigned char *)s;
    text_add(t, "\"");
    for (size_t i = 0; i < max && u[i];) {
        size_t n = utf8_length(u + i, max - i);
        if (u[i] == '"' || u[i] == '\\')
            text_add(t, "\\%c", u[i]);
        else if (n == 0 || u[i] < 0x20)
            text_add(t, "\\u%04x", u[i]);
        else
            text_add(t, "%.*s", (int)n, (const char *)u + i);
        i += n ? n : 1;
    }
    text_add(t, "\"");
}

void write_all(int fd, const void *data, size_t bytes, const char *out) {
    const char *p = data;
    while (bytes > 0) {
        ssize_t n = write(fd, p, bytes);
        if (n <= 0) fatal(EXIT_RUNTIME, "%s: write failed (%s)", out, strerror(n < 0 ? errno : EIO));
        p += n;
        bytes -= (size_t)n;
    }
}

const OutputKind export_output = {.what = "a safetensors export of common/ckpt",
                                  .earlier = "export",
                                  .signature = EXPORT_HEAD,
                                  .signature_bytes = sizeof EXPORT_HEAD - 1,
                                  .signature_offset = sizeof(uint64_t)};

/* A new temporary file beside OUT (the same directory, so the final rename
 * never crosses file systems), of a name no other file has. */
int create_beside(const char *out, char tmp[JOINED_PATH_BYTES]) {
    snprintf(tmp, 4200, "%s.tmp-XXXXXX", out);
    int fd = mkstemp(tmp);
    if (fd < 0) fatal(EXIT_USAGE, "%s: cannot write (%s)", out, strerror(errno));
    temp_file_register(tmp);
    if (fchmod(fd, 0644) != 0) fatal(EXIT_RUNTIME, "%s: cannot write (%s)", out, strerror(errno));
    return fd;
}

void finish_beside(int fd, const char *tmp, const char *out, const char *what) {
    if (fsync(fd) != 0 || close(fd) != 0) fatal(EXIT_RUNTIME, "%s: write failed (%s)", out, strerror(errno));
    if (rename(tmp, out) != 0)
        fatal(EXIT_RUNTIME, "%s: cannot put the finished export in its place (%s)%s", what, strerror(errno),
              errno == EXDEV || errno == EBUSY ? " (valid: a name that is not a mount point)" : "");
    temp_file_forget(tmp);
}
