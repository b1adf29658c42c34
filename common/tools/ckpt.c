/* common/ckpt: inspect, verify and export the course's checkpoints.
 *
 *   common/ckpt PATH                       what the checkpoint holds, checksum verified
 *   common/ckpt verify PATH...             the checksums only: "ok <checksum> step <n> PATH" for
 *                                          each sound file, an "error:" line for each other; exit 2
 *                                          when any was not sound
 *   common/ckpt export PATH OUT [--optimizer]
 *                                          the weights as safetensors (OUT: a new name or an earlier
 *                                          export), for PyTorch et al.
 *
 * A checkpoint (common/run/checkpoint.h) is layout-independent: whoever wrote it,
 * its arrays are the whole model's, in table order. Exporting is therefore
 * only a new header in front of the same bytes. safetensors is:
 *
 *   u64 (little-endian)  N, the length of the JSON header
 *   N bytes              {"NAME": {"dtype": "F32", "shape": [rows, cols],
 *                                  "data_offsets": [begin, end]}, ...,
 *                         "__metadata__": {string: string}}, padded with spaces
 *   the tensors' bytes   data_offsets count from here
 *
 * Vectors (rows 1) get shape [cols]. The names are the table's (wte, wpe,
 * h0.ln1w .. h0.fcprojb, .., lnf.w, lnf.b, lm_head); common/python/pytorch_gpt.py
 * documents how they map onto a PyTorch GPT. With --optimizer, Adam's
 * moments follow as adam_m.NAME and adam_v.NAME. */
#include "checkpoint.h"
#include "util.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static const char usage[] =
    "usage: common/ckpt PATH                        print the checkpoint's header, tensors and step; verify\n"
    "                                               its checksum\n"
    "       common/ckpt verify PATH...              verify checksums only (prints ok CHECKSUM step N PATH);\n"
    "                                               checks every PATH, exit 2 if any is not sound\n"
    "       common/ckpt export PATH OUT [--optimizer]\n"
    "                                               write the weights (and with --optimizer Adam's m and v)\n"
    "                                               to OUT in the safetensors format; OUT is a new name\n"
    "                                               or an earlier export (never a checkpoint, a device or\n"
    "                                               any other file)\n"
    "       common/ckpt --help\n"
    "Checkpoints come from any chapter's --save PATH; exit status 2 when a file is not a sound checkpoint.\n";

/* Open path and verify the checksum; ends the program when it does not match. */
static uint64_t open_verified(CkptFile *f, const char *path) {
    ckpt_file_open(f, path, path);
    uint64_t sum = ckpt_file_checksum(f, path, path);
    if (sum != f->header.checksum)
        fatal(EXIT_USAGE, "%s: corrupt checkpoint: checksum %016llx, its contents give %016llx", path,
              (unsigned long long)f->header.checksum, (unsigned long long)sum);
    return sum;
}

/* verify one of the files named: prints its "ok" line and returns 1, or
 * prints its "error:" line and returns 0, so that the next one is checked
 * too (fatal's usage trap, util.h, catches the refusal). */
static int verify_one(const char *path) {
    static CkptFile f; /* static: what a longjmp leaves behind is still there to close */
    UsageTrap trap;
    usage_trap_arm(&trap);
    if (setjmp(trap.where) == 0) {
        uint64_t sum = open_verified(&f, path);
        usage_trap_disarm();
        printf("ok %016llx step %d %s\n", (unsigned long long)sum, f.header.step, path);
        ckpt_file_close(&f);
        return 1;
    }
    usage_trap_disarm();
    fflush(stdout);
    fprintf(stderr, "error: %s\n", trap.message);
    ckpt_file_close(&f);
    return 0;
}

static void print_info(const char *path) {
    CkptFile f;
    uint64_t sum = open_verified(&f, path);
    const CheckpointHeader *h = &f.header;
    printf("checkpoint  %s (%lld bytes)\n", path, f.file_bytes);
    printf("format      version %u, checksum %016llx (verified)\n", h->version, (unsigned long long)sum);
    printf("writer      %.88s\n", h->writer);
    printf("model       layers %d, dmodel %d, heads %d, seq %d, vocab %d%s: %llu parameters in %d tensors\n",
           h->layers, h->dmodel, h->heads, h->seq, h->vocab, h->tied_embeddings ? ", tied embeddings" : "",
           (unsigned long long)h->num_params, h->num_tensors);
    printf("step        %d of %d (Adam updates %d); the next batch is step %d's, from (seed, step)\n",
           h->step, h->steps, h->adam_t, h->step + 1);
    printf("config      seed %llu, batch %d, micro %d, lr %g, warmup %d, wd %g, clip %g, beta1 %g, beta2 %g, "
           "eps %g\n",
           (unsigned long long)h->seed, h->batch, h->micro, h->lr, h->warmup, h->wd, h->clip, h->beta1,
           h->beta2, h->eps);
    printf("precision   %s run (the arrays are fp32: master weights in 16-bit runs); loss scale %g, %d clean "
           "steps\n",
           precision_name(h->precision), h->loss_scale, h->loss_scale_clean_steps);
    printf("rng         %016llx (the text sampler)\n", (unsigned long long)h->rng_state);
    for (int a = 0; a < h->num_arrays; a++)
        printf("array       %-8.15s f32 x %llu at byte %llu\n", f.arrays[a].name,
               (unsigned long long)f.arrays[a].numel, (unsigned long long)f.arrays[a].offset);
    printf("%-16s %5s %12s %10s\n", "tensor", "unit", "shape", "offset");
    for (int i = 0; i < h->num_tensors; i++) {
        const CkptTensorEntry *t = &f.tensors[i];
        char shape[32];
        snprintf(shape, sizeof shape, "%d x %d", t->rows, t->cols);
        printf("%-16.31s %5d %12s %10llu\n", t->name, t->layer, shape, (unsigned long long)t->offset);
    }
    ckpt_file_close(&f);
}

/* ---- export ---- */

/* Append to a growing string. */
typedef struct {
    char *s;
    size_t len, cap;
} Text;

static void text_add(Text *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void text_add(Text *t, const char *fmt, ...) {
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
static void text_add_json_string(Text *t, const char *s, size_t max) {
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

static void write_all(int fd, const void *data, size_t bytes, const char *out) {
    const char *p = data;
    while (bytes > 0) {
        ssize_t n = write(fd, p, bytes);
        if (n <= 0) fatal(EXIT_RUNTIME, "%s: write failed (%s)", out, strerror(n < 0 ? errno : EIO));
        p += n;
        bytes -= (size_t)n;
    }
}

/* An export opens with the header's length (8 bytes) and then these bytes,
 * whatever the checkpoint: what tells an earlier export from any other file. */
#define EXPORT_HEAD "{\"__metadata__\":{\"format\":\"pt\",\"step\":\""
static const OutputKind export_output = {.what = "a safetensors export of common/ckpt",
                                         .earlier = "export",
                                         .signature = EXPORT_HEAD,
                                         .signature_bytes = sizeof EXPORT_HEAD - 1,
                                         .signature_offset = sizeof(uint64_t)};

/* OUT is a new name or an earlier export (util.h's output-file rule, as
 * --save's): never the checkpoint read (under any name), a checkpoint, a
 * directory, a device (/dev/null stays one: the export is renamed over OUT,
 * which would replace it by a file) or any other file. */
static void check_export_target(const char *path, const char *out) {
    if (same_file(path, out))
        fatal(EXIT_USAGE, "export %s: is the checkpoint being exported (valid: a new file name)", out);
    output_file_check("export", out, &export_output);
}

/* A new temporary file beside OUT (the same directory, so the final rename
 * never crosses file systems), of a name no other file has. */
static int create_beside(const char *out, char tmp[JOINED_PATH_BYTES]) {
    snprintf(tmp, 4200, "%s.tmp-XXXXXX", out);
    int fd = mkstemp(tmp);
    if (fd < 0) fatal(EXIT_USAGE, "%s: cannot write (%s)", out, strerror(errno));
    temp_file_register(tmp);
    if (fchmod(fd, 0644) != 0) fatal(EXIT_RUNTIME, "%s: cannot write (%s)", out, strerror(errno));
    return fd;
}

static void export_safetensors(const char *path, const char *out, int with_optimizer) {
    check_export_target(path, out);
    CkptFile f;
    open_verified(&f, path);
    const CheckpointHeader *h = &f.header;
    int arrays = with_optimizer ? CKPT_ARRAYS : 1;
    static const char *const prefix[CKPT_ARRAYS] = {"", "adam_m.", "adam_v."};

    Text json = {0};
    text_add(&json, EXPORT_HEAD "%d\",\"writer\":", h->step);
    text_add_json_string(&json, h->writer, sizeof h->writer);
    text_add(&json, ",\"model\":\"layers %d, dmodel %d, heads %d, seq %d, vocab %d\"}", h->layers, h->dmodel,
             h->heads, h->seq, h->vocab);
    size_t array_bytes = h->num_params * sizeof(float);
    for (int a = 0; a < arrays; a++)
        for (int i = 0; i < h->num_tensors; i++) {
            const CkptTensorEntry *t = &f.tensors[i];
            size_t begin = a * array_bytes + t->offset * sizeof(float),
                   end = begin + t->numel * sizeof(float);
            text_add(&json, ",\"%s%.31s\":{\"dtype\":\"F32\",\"shape\":", prefix[a], t->name);
            if (t->rows == 1)
                text_add(&json, "[%d]", t->cols);
            else
                text_add(&json, "[%d,%d]", t->rows, t->cols);
            text_add(&json, ",\"data_offsets\":[%zu,%zu]}", begin, end);
        }
    text_add(&json, "}");
    while (json.len % 8) text_add(&json, " "); /* the data starts 8-byte aligned */

    char tmp[JOINED_PATH_BYTES];
    int fd = create_beside(out, tmp);
    uint64_t header_len = json.len; /* little-endian on every machine this course runs on */
    write_all(fd, &header_len, sizeof header_len, out);
    write_all(fd, json.s, json.len, out);
    /* the arrays are already in table order: copy them through */
    size_t chunk = 1 << 20;
    char *buf = xmalloc(chunk);
    for (int a = 0; a < arrays; a++)
        for (size_t done = 0; done < array_bytes;) {
            size_t n = array_bytes - done < chunk ? array_bytes - done : chunk;
            if (pread(f.fd, buf, n, (off_t)(f.arrays[a].offset + done)) != (ssize_t)n)
                fatal(EXIT_USAGE, "%s: the file is truncated", path);
            write_all(fd, buf, n, out);
            done += n;
        }
    free(buf);
    free(json.s);
    if (fsync(fd) != 0 || close(fd) != 0) fatal(EXIT_RUNTIME, "%s: write failed (%s)", out, strerror(errno));
    if (rename(tmp, out) != 0)
        fatal(EXIT_RUNTIME, "export %s: cannot put the finished export in its place (%s)%s", out,
              strerror(errno),
              errno == EXDEV || errno == EBUSY ? " (valid: a name that is not a mount point)" : "");
    temp_file_forget(tmp);
    printf("exported %d tensors (%llu parameters%s) of %s, step %d, to %s\n", h->num_tensors * arrays,
           (unsigned long long)h->num_params, with_optimizer ? ", with Adam's m and v" : "", path, h->step,
           out);
    ckpt_file_close(&f);
}

int main(int argc, char **argv) {
    if (argc == 2 && (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0)) {
        fputs(usage, stdout);
        return 0;
    }
    if (argc >= 2 && strcmp(argv[1], "verify") == 0) {
        if (argc == 3 && (strcmp(argv[2], "--help") == 0 || strcmp(argv[2], "-h") == 0)) {
            fputs(usage, stdout);
            return 0;
        }
        if (argc == 2) {
            fputs(usage, stderr);
            return EXIT_USAGE;
        }
        int bad = 0;
        for (int i = 2; i < argc; i++) bad += !verify_one(argv[i]);
        return bad ? EXIT_USAGE : 0;
    }
    /* a checkpoint called "verify" or "export" is ./verify, ./export */
    if (argc == 2 && argv[1][0] != '-' && strcmp(argv[1], "export") != 0) {
        print_info(argv[1]);
        return 0;
    }
    if ((argc == 4 || argc == 5) && strcmp(argv[1], "export") == 0) {
        int with_optimizer = argc == 5 && strcmp(argv[4], "--optimizer") == 0;
        if (argc == 5 && !with_optimizer)
            fatal(EXIT_USAGE, "export: unknown option '%s' (valid: --optimizer)", argv[4]);
        export_safetensors(argv[2], argv[3], with_optimizer);
        return 0;
    }
    fatal(EXIT_USAGE, "expected PATH, verify PATH or export PATH OUT [--optimizer] (see common/ckpt --help)");
}
