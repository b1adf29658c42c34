/* common/ckpt: inspect, verify, export and import the course's checkpoints.
 *
 *   common/ckpt PATH                       what the checkpoint holds, checksum verified
 *   common/ckpt verify PATH...             the checksums only: "ok <checksum> step <n> PATH" for
 *                                          each sound file, an "error:" line for each other; exit 2
 *                                          when any was not sound
 *   common/ckpt export PATH OUT [--optimizer]
 *                                          the weights as safetensors (OUT: a new name or an earlier
 *                                          export), for PyTorch et al.
 *   common/ckpt export PATH DIR --format hf
 *                                          the weights as a Hugging Face transformers GPT-2
 *                                          (DIR/model.safetensors, DIR/config.json; ckpt_hf.c)
 *   common/ckpt import-hf DIR OUT          a GPT-2 in Hugging Face's layout as a checkpoint at
 *                                          step 0 that every chapter resumes (ckpt_hf.c)
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
#include "common/run/checkpoint.h" /* save and resume */
#include "common/tools/ckpt_hf.h" /* Hugging Face import and export */
#include "common/tools/ckpt_tool.h" /* common/ckpt's shared helpers */
#include "common/core/util.h" /* fatal, log_info, exit codes, flag parsing */

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
    "       common/ckpt export PATH DIR --format hf\n"
    "                                               write the weights as a Hugging Face transformers\n"
    "                                               GPT2LMHeadModel: DIR/model.safetensors (GPT-2's names,\n"
    "                                               Conv1D matrices transposed) and DIR/config.json, for\n"
    "                                               GPT2LMHeadModel.from_pretrained(DIR); DIR is a new\n"
    "                                               directory or an earlier such export\n"
    "       common/ckpt import-hf DIR OUT           a GPT-2 in Hugging Face's layout (DIR/config.json,\n"
    "                                               DIR/model.safetensors: F32, F16 or BF16; untied, "
    "gelu_new,\n"
    "                                               layer_norm_epsilon 1e-05) as checkpoint OUT at step 0\n"
    "                                               with fresh Adam state: resume it in any chapter with\n"
    "                                               the shape it prints; OUT is a new name or an earlier\n"
    "                                               checkpoint\n"
    "       common/ckpt --help\n"
    "Checkpoints come from any chapter's --save PATH; exit status 2 when a file is not a sound checkpoint.\n";

/* verify one of the files named: prints its "ok" line and returns 1, or
 * prints its "error:" line and returns 0, so that the next one is checked
 * too (fatal's usage trap, util.h, catches the refusal). */
static int verify_one(const char *path) {
    static CkptFile f; /* static: what a longjmp leaves behind is still there to close */
    UsageTrap trap;
    usage_trap_arm(&trap);
    if (setjmp(trap.where) == 0) {
        uint64_t sum = ckpt_open_verified(&f, path);
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
    uint64_t sum = ckpt_open_verified(&f, path);
    const CheckpointHeader *h = &f.header;
    printf("checkpoint  %s (%lld bytes)\n", path, f.file_bytes);
    printf("format      version %u, checksum %016llx (verified)\n", h->version, (unsigned long long)sum);
    printf("writer      %.88s\n", h->writer);
    char experts[64] = "";
    if (h->experts) snprintf(experts, sizeof experts, ", %d experts every %d blocks", h->experts, h->moe_every);
    printf("model       layers %d, dmodel %d, heads %d, seq %d, vocab %d%s%s: %llu parameters in %d tensors\n",
           h->layers, h->dmodel, h->heads, h->seq, h->vocab, h->tied_embeddings ? ", tied embeddings" : "",
           experts, (unsigned long long)h->num_params, h->num_tensors);
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

/* OUT is a new name or an earlier export (util.h's output-file rule, as
 * --save's): never the checkpoint read (under any name), a checkpoint, a
 * directory, a device (/dev/null stays one: the export is renamed over OUT,
 * which would replace it by a file) or any other file. */
static void check_export_target(const char *path, const char *out) {
    if (same_file(path, out))
        fatal(EXIT_USAGE, "export %s: is the checkpoint being exported (valid: a new file name)", out);
    output_file_check("export", out, &export_output);
}

static void export_safetensors(const char *path, const char *out, int with_optimizer) {
    check_export_target(path, out);
    CkptFile f;
    ckpt_open_verified(&f, path);
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
    char what[JOINED_PATH_BYTES];
    snprintf(what, sizeof what, "export %s", out);
    finish_beside(fd, tmp, out, what);
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
    /* a checkpoint called "verify", "export" or "import-hf" is ./verify, ... */
    if (argc == 2 && argv[1][0] != '-' && strcmp(argv[1], "export") != 0 &&
        strcmp(argv[1], "import-hf") != 0) {
        print_info(argv[1]);
        return 0;
    }
    if (argc >= 2 && strcmp(argv[1], "export") == 0) {
        const char *operand[2] = {NULL, NULL}, *format = "safetensors";
        int with_optimizer = 0, operands = 0;
        for (int i = 2; i < argc; i++) {
            if (strcmp(argv[i], "--optimizer") == 0)
                with_optimizer = 1;
            else if (strcmp(argv[i], "--format") == 0 && i + 1 < argc)
                format = argv[++i];
            else if (strncmp(argv[i], "--format=", 9) == 0)
                format = argv[i] + 9;
            else if (argv[i][0] == '-')
                fatal(EXIT_USAGE, "export: unknown option '%s' (valid: --optimizer, --format safetensors|hf)",
                      argv[i]);
            else if (operands < 2)
                operand[operands++] = argv[i];
            else
                fatal(EXIT_USAGE, "export: one PATH and one OUT (got '%s' too)", argv[i]);
        }
        int hf = strcmp(format, "hf") == 0;
        if (!hf && strcmp(format, "safetensors") != 0)
            fatal(EXIT_USAGE, "export: --format '%s' (valid: safetensors or hf)", format);
        if (hf && with_optimizer)
            fatal(EXIT_USAGE,
                  "export: --optimizer with --format hf (valid: --format safetensors: a Hugging Face "
                  "model holds the weights only)");
        if (operands == 2) {
            if (hf)
                hf_export(operand[0], operand[1]);
            else
                export_safetensors(operand[0], operand[1], with_optimizer);
            return 0;
        }
    }
    if (argc == 4 && strcmp(argv[1], "import-hf") == 0) {
        hf_import(argv[2], argv[3]);
        return 0;
    }
    fatal(EXIT_USAGE,
          "expected PATH, verify PATH, export PATH OUT [--optimizer | --format hf] or import-hf DIR OUT "
          "(see common/ckpt --help)");
}
