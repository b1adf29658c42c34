/* ckpt_hf.c: a course checkpoint as a Hugging Face transformers GPT-2, and
 * back (see ckpt_hf.h).
 *
 * The course's GPT (common/model/model.c) is GPT-2: learned positions,
 * pre-LN blocks, layernorm eps 1e-5, q|k|v side by side in one matrix with
 * head h in columns h*hs.., GELU's tanh form (transformers calls it
 * "gelu_new"), an untied lm_head without bias. transformers' GPT2LMHeadModel
 * with that configuration computes the same function; only the files differ:
 *
 *   names    the table's h3.qkvw is transformer.h.3.attn.c_attn.weight, ...
 *            (hf_names below, the one list both directions read);
 *   layout   the course stores a matrix as (out, in), a row per output, as
 *            torch.nn.Linear does. GPT-2's blocks use Conv1D, whose weight is
 *            (in, out): the blocks' four matrices are transposed on the way
 *            out and back in. wte, wpe and lm_head (an nn.Linear) are not.
 *
 * config.json says the shape (n_layer, n_embd, n_head, n_positions,
 * vocab_size) and the function's choices; an import refuses, in one line,
 * any choice the course's GPT does not make (another activation or epsilon,
 * a hidden width other than 4C, attention scaled otherwise).
 *
 * Tied weights: GPT-2 itself reads its head from wte (tie_word_embeddings,
 * true unless the config says false), and its model.safetensors then has no
 * lm_head.weight. hf_tied() answers from the checkpoint's header (a tied one
 * exports no lm_head.weight); a tied import is a tied checkpoint (trained
 * with --tie-embeddings), reading no lm_head.weight even where a file has one. */
#include "common/tools/ckpt_hf.h" /* Hugging Face import and export */

#include "common/run/checkpoint.h" /* save and resume */
#include "common/tools/ckpt_tool.h" /* common/ckpt's shared helpers */
#include "common/run/config.h" /* Config and the flag tables */
#include "common/core/half.h" /* bf16 and fp16 conversions */
#include "common/model/model.h" /* GPT, its forward and backward */
#include "common/model/param_table.h" /* the parameter table and its units */
#include "common/core/util.h" /* fatal, log_info, exit codes, flag parsing */

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- the names ---- */

typedef struct {
    const char *course; /* the table's name, or for a block its part after "hL." */
    const char *hf;     /* transformers', or for a block its part after "transformer.h.L." */
    int transposed;     /* a Conv1D weight: (in, out) in the file */
} HfName;

static const HfName hf_model_names[] = {
    {"wte", "transformer.wte.weight", 0},    {"wpe", "transformer.wpe.weight", 0},
    {"lnf.w", "transformer.ln_f.weight", 0}, {"lnf.b", "transformer.ln_f.bias", 0},
    {"lm_head", "lm_head.weight", 0},
};
static const HfName hf_block_names[] = {
    {"ln1w", "ln_1.weight", 0},
    {"ln1b", "ln_1.bias", 0},
    {"qkvw", "attn.c_attn.weight", 1},
    {"qkvb", "attn.c_attn.bias", 0},
    {"attprojw", "attn.c_proj.weight", 1},
    {"attprojb", "attn.c_proj.bias", 0},
    {"ln2w", "ln_2.weight", 0},
    {"ln2b", "ln_2.bias", 0},
    {"fcw", "mlp.c_fc.weight", 1},
    {"fcb", "mlp.c_fc.bias", 0},
    {"fcprojw", "mlp.c_proj.weight", 1},
    {"fcprojb", "mlp.c_proj.bias", 0},
};
#define COUNT(a) (int)(sizeof(a) / sizeof(a)[0])

/* transformers' name of the table's tensor `course` (layer: its unit) into
 * hf; returns whether its matrix is transposed in the file. */
static int hf_name(const char *course, int layer, char hf[96]) {
    if (layer >= 0 && strchr(course, '.')) {
        const char *part = strchr(course, '.') + 1;
        for (int i = 0; i < COUNT(hf_block_names); i++)
            if (strcmp(part, hf_block_names[i].course) == 0) {
                snprintf(hf, 96, "transformer.h.%d.%s", layer, hf_block_names[i].hf);
                return hf_block_names[i].transposed;
            }
    }
    for (int i = 0; i < COUNT(hf_model_names); i++)
        if (strcmp(course, hf_model_names[i].course) == 0) {
            snprintf(hf, 96, "%s", hf_model_names[i].hf);
            return hf_model_names[i].transposed;
        }
    fatal(EXIT_RUNTIME, "common/ckpt: the table's tensor %s has no Hugging Face name", course);
}

/* Does the checkpoint's head read wte (--tie-embeddings)? Not a field of the
 * header yet: never. */
static int hf_tied(const CheckpointHeader *h) {
    return h->tied_embeddings;
}

/* The rows of a tensor in transformers' model: the vocabulary's (wte,
 * lm_head) are vocab_size, however many the course's table holds. */
static int hf_rows(const char *course, int rows, int vocab) {
    return strcmp(course, "wte") == 0 || strcmp(course, "lm_head") == 0 ? vocab : rows;
}

/* ---- export ---- */

#define HF_MODEL "model.safetensors"
#define HF_CONFIG "config.json"
/* config.json opens with these bytes: what tells an earlier export's. */
#define HF_CONFIG_HEAD "{\n  \"course_export\": \"common/ckpt export --format hf\",\n"
static const OutputKind hf_config_output = {.what = "a config.json of common/ckpt export --format hf",
                                            .earlier = "export",
                                            .signature = HF_CONFIG_HEAD,
                                            .signature_bytes = sizeof HF_CONFIG_HEAD - 1};

/* DIR is a new directory in an existing one, or a directory that holds
 * nothing but an earlier export's two files (an empty one too). Returns
 * whether it must be created. */
static int check_hf_dir(const char *dir) {
    struct stat st;
    if (!dir[0]) fatal(EXIT_USAGE, "export --format hf: an empty name (valid: a directory name)");
    if (stat(dir, &st) != 0) {
        if (lstat(dir, &st) == 0)
            fatal(EXIT_USAGE,
                  "export --format hf %s: a link to nothing (valid: a new directory or an earlier export's)",
                  dir);
        char trimmed[PATH_BYTES], parent[PATH_BYTES];
        snprintf(trimmed, sizeof trimmed, "%s", dir);
        for (size_t n = strlen(trimmed); n > 1 && trimmed[n - 1] == '/'; n--) trimmed[n - 1] = 0;
        directory_of(trimmed, parent);
        if (stat(parent, &st) != 0 || !S_ISDIR(st.st_mode))
            fatal(EXIT_USAGE, "export --format hf %s: the directory %s does not exist", dir, parent);
        return 1;
    }
    if (!S_ISDIR(st.st_mode))
        fatal(EXIT_USAGE,
              "export --format hf %s: exists and is not a directory (valid: a new directory or an earlier "
              "export's)",
              dir);
    DIR *d = opendir(dir);
    if (!d) fatal(EXIT_USAGE, "export --format hf %s: cannot read the directory (%s)", dir, strerror(errno));
    struct dirent *e;
    while ((e = readdir(d))) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
        char path[JOINED_PATH_BYTES];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        const OutputKind *own = strcmp(e->d_name, HF_MODEL) == 0    ? &export_output
                                : strcmp(e->d_name, HF_CONFIG) == 0 ? &hf_config_output
                                                                    : NULL;
        if (!own || lstat(path, &st) != 0 || !S_ISREG(st.st_mode) || !output_file_is_own(path, own)) {
            closedir(d);
            fatal(EXIT_USAGE,
                  "export --format hf %s: holds %s, which is not an earlier export's (valid: a new directory "
                  "or an earlier export's)",
                  dir, e->d_name);
        }
    }
    closedir(d);
    return 0;
}

/* model.safetensors: the weights under transformers' names, the blocks'
 * matrices transposed, in table order. */
static void write_hf_model(const CkptFile *f, const char *path, const char *out) {
    const CheckpointHeader *h = &f->header;
    Text json = {0};
    text_add(&json, EXPORT_HEAD "%d\",\"writer\":", h->step);
    text_add_json_string(&json, h->writer, sizeof h->writer);
    text_add(&json, ",\"model\":\"layers %d, dmodel %d, heads %d, seq %d, vocab %d\"}", h->layers, h->dmodel,
             h->heads, h->seq, h->vocab);
    size_t at = 0;
    for (int i = 0; i < h->num_tensors; i++) {
        const CkptTensorEntry *t = &f->tensors[i];
        char name[96];
        int transposed = hf_name(t->name, t->layer, name);
        int rows = hf_rows(t->name, t->rows, h->vocab);
        size_t bytes = (size_t)rows * t->cols * sizeof(float);
        text_add(&json, ",\"%s\":{\"dtype\":\"F32\",\"shape\":", name);
        if (t->rows == 1)
            text_add(&json, "[%d]", t->cols);
        else if (transposed)
            text_add(&json, "[%d,%d]", t->cols, rows);
        else
            text_add(&json, "[%d,%d]", rows, t->cols);
        text_add(&json, ",\"data_offsets\":[%zu,%zu]}", at, at + bytes);
        at += bytes;
    }
    text_add(&json, "}");
    while (json.len % 8) text_add(&json, " "); /* the data starts 8-byte aligned */

    char tmp[JOINED_PATH_BYTES], what[JOINED_PATH_BYTES + 32];
    snprintf(what, sizeof what, "export --format hf %s", out);
    int fd = create_beside(out, tmp);
    uint64_t header_len = json.len;
    write_all(fd, &header_len, sizeof header_len, out);
    write_all(fd, json.s, json.len, out);
    for (int i = 0; i < h->num_tensors; i++) {
        const CkptTensorEntry *t = &f->tensors[i];
        char name[96];
        int transposed = hf_name(t->name, t->layer, name);
        size_t rows = hf_rows(t->name, t->rows, h->vocab), cols = t->cols, n = rows * cols;
        float *in = xmalloc(n * sizeof(float));
        if (pread(f->fd, in, n * sizeof(float),
                  (off_t)(f->arrays[CKPT_PARAMS].offset + t->offset * sizeof(float))) !=
            (ssize_t)(n * sizeof(float)))
            fatal(EXIT_USAGE, "%s: the file is truncated", path);
        if (transposed) { /* (rows, cols) -> (cols, rows) */
            float *turned = xmalloc(n * sizeof(float));
            for (size_t r = 0; r < rows; r++)
                for (size_t c = 0; c < cols; c++) turned[c * rows + r] = in[r * cols + c];
            free(in);
            in = turned;
        }
        write_all(fd, in, n * sizeof(float), out);
        free(in);
    }
    free(json.s);
    finish_beside(fd, tmp, out, what);
}

/* config.json: GPT2Config's fields for the course's GPT. No dropout (the
 * course has none), so that training in transformers is the course's too. */
static void write_hf_config(const CheckpointHeader *h, const char *out) {
    Text json = {0};
    text_add(&json,
             HF_CONFIG_HEAD
             "  \"architectures\": [\"GPT2LMHeadModel\"],\n  \"model_type\": \"gpt2\",\n"
             "  \"vocab_size\": %d,\n  \"n_positions\": %d,\n  \"n_ctx\": %d,\n  \"n_embd\": %d,\n"
             "  \"n_layer\": %d,\n  \"n_head\": %d,\n  \"n_inner\": null,\n"
             "  \"activation_function\": \"gelu_new\",\n  \"layer_norm_epsilon\": 1e-05,\n"
             "  \"resid_pdrop\": 0.0,\n  \"embd_pdrop\": 0.0,\n  \"attn_pdrop\": 0.0,\n"
             "  \"scale_attn_weights\": true,\n  \"scale_attn_by_inverse_layer_idx\": false,\n"
             "  \"reorder_and_upcast_attn\": false,\n  \"tie_word_embeddings\": %s,\n"
             "  \"bos_token_id\": %d,\n  \"eos_token_id\": %d,\n  \"torch_dtype\": \"float32\",\n  "
             "\"course_step\": %d\n}\n",
             h->vocab, h->seq, h->seq, h->dmodel, h->layers, h->heads, hf_tied(h) ? "true" : "false",
             h->vocab - 1, h->vocab - 1, h->step);
    char tmp[JOINED_PATH_BYTES], what[JOINED_PATH_BYTES + 32];
    snprintf(what, sizeof what, "export --format hf %s", out);
    int fd = create_beside(out, tmp);
    write_all(fd, json.s, json.len, out);
    free(json.s);
    finish_beside(fd, tmp, out, what);
}

void hf_export(const char *path, const char *dir) {
    int create = check_hf_dir(dir);
    CkptFile f;
    ckpt_open_verified(&f, path);
    if (f.header.experts)
        fatal(EXIT_USAGE,
              "export --format hf %s: a mixture of experts (%d experts) has no GPT2LMHeadModel form (valid: a "
              "dense checkpoint)",
              path, f.header.experts);
    if (create && mkdir(dir, 0755) != 0)
        fatal(EXIT_USAGE, "export --format hf %s: cannot create the directory (%s)", dir, strerror(errno));
    char model[JOINED_PATH_BYTES], config[JOINED_PATH_BYTES];
    snprintf(model, sizeof model, "%s/%s", dir, HF_MODEL);
    snprintf(config, sizeof config, "%s/%s", dir, HF_CONFIG);
    write_hf_model(&f, path, model);
    write_hf_config(&f.header, config);
    const CheckpointHeader *h = &f.header;
    printf("exported %d tensors (%llu parameters) of %s, step %d, as a transformers GPT2LMHeadModel to %s "
           "(%s, %s)\n",
           h->num_tensors, (unsigned long long)h->num_params, path, h->step, dir, HF_MODEL, HF_CONFIG);
    ckpt_file_close(&f);
}

/* ---- reading JSON (config.json, a safetensors header) ---- */

typedef struct {
    const char *start, *p, *end;
    const char *what; /* the file, for messages */
} Json;

static void json_fail(const Json *j, const char *expected) {
    fatal(EXIT_USAGE, "%s: not valid JSON (expected %s at byte %ld)", j->what, expected,
          (long)(j->p - j->start));
}

static int json_peek(Json *j) {
    while (j->p < j->end && (*j->p == ' ' || *j->p == '\n' || *j->p == '\r' || *j->p == '\t')) j->p++;
    return j->p < j->end ? (unsigned char)*j->p : -1;
}

static void json_expect(Json *j, char c) {
    char expected[4] = {'\'', c, '\'', 0};
    if (json_peek(j) != c) json_fail(j, expected);
    j->p++;
}

/* A string into out (cap bytes, NUL-terminated; longer ones are cut), \u
 * escapes as UTF-8. */
static void json_string(Json *j, char *out, size_t cap) {
    json_expect(j, '"');
    size_t n = 0;
    while (j->p < j->end && *j->p != '"') {
        unsigned code = (unsigned char)*j->p++;
        if (code == '\\') {
            if (j->p >= j->end) break;
            char e = *j->p++;
            const char *plain = strchr("\"\\/bfnrt", e);
            if (plain && e != 'u') {
                code = (unsigned char)"\"\\/\b\f\n\r\t"[plain - "\"\\/bfnrt"];
            } else if (e == 'u' && j->end - j->p >= 4) {
                char hex[5] = {j->p[0], j->p[1], j->p[2], j->p[3], 0};
                char *stop;
                code = (unsigned)strtoul(hex, &stop, 16);
                if (*stop) json_fail(j, "four hex digits");
                j->p += 4;
            } else {
                json_fail(j, "an escape");
            }
        }
        /* code as UTF-8 (surrogates stay as they are: no name here has them) */
        unsigned char bytes[3];
        size_t k = 0;
        if (code < 0x80) {
            bytes[k++] = (unsigned char)code;
        } else if (code < 0x800) {
            bytes[k++] = (unsigned char)(0xc0 | code >> 6),
            bytes[k++] = (unsigned char)(0x80 | (code & 0x3f));
        } else {
            bytes[k++] = (unsigned char)(0xe0 | code >> 12);
            bytes[k++] = (unsigned char)(0x80 | (code >> 6 & 0x3f));
            bytes[k++] = (unsigned char)(0x80 | (code & 0x3f));
        }
        for (size_t i = 0; i < k; i++)
            if (n + 1 < cap) out[n++] = (char)bytes[i];
    }
    if (j->p >= j->end) json_fail(j, "the end of a string");
    j->p++;
    out[n] = 0;
}

static double json_number(Json *j) {
    json_peek(j);
    char text[64];
    size_t n = 0;
    while (j->p + n < j->end && n + 1 < sizeof text && strchr("+-0123456789.eE", j->p[n])) {
        text[n] = j->p[n];
        n++;
    }
    text[n] = 0;
    char *stop;
    double x = strtod(text, &stop);
    if (n == 0 || *stop) json_fail(j, "a number");
    j->p += n;
    return x;
}

/* true, false or null: 1, 0 or -1. */
static int json_literal(Json *j) {
    json_peek(j);
    static const char *const words[3] = {"null", "false", "true"};
    for (int i = 0; i < 3; i++) {
        size_t n = strlen(words[i]);
        if ((size_t)(j->end - j->p) >= n && memcmp(j->p, words[i], n) == 0) {
            j->p += n;
            return i - 1;
        }
    }
    json_fail(j, "true, false or null");
    return -1;
}

static void json_skip(Json *j, int depth) {
    int c = json_peek(j);
    if (depth > 64) json_fail(j, "less nesting");
    if (c == '"') {
        char ignored[2];
        json_string(j, ignored, sizeof ignored);
    } else if (c == '{' || c == '[') {
        char close = c == '{' ? '}' : ']';
        j->p++;
        if (json_peek(j) == close) {
            j->p++;
            return;
        }
        for (;;) {
            if (c == '{') {
                char ignored[2];
                json_string(j, ignored, sizeof ignored);
                json_expect(j, ':');
            }
            json_skip(j, depth + 1);
            if (json_peek(j) == ',') {
                j->p++;
                continue;
            }
            json_expect(j, close);
            return;
        }
    } else if (c == 't' || c == 'f' || c == 'n') {
        json_literal(j);
    } else {
        json_number(j);
    }
}

/* The next member of an object into key (the first call reads its '{');
 * returns 0 at its end. */
static int json_member(Json *j, int *started, char *key, size_t cap) {
    if (!*started) {
        json_expect(j, '{');
        *started = 1;
        if (json_peek(j) == '}') {
            j->p++;
            return 0;
        }
    } else {
        if (json_peek(j) == '}') {
            j->p++;
            return 0;
        }
        json_expect(j, ',');
    }
    json_string(j, key, cap);
    json_expect(j, ':');
    return 1;
}

/* A whole file (at most max_bytes) into memory. */
static char *read_small_file(const char *path, size_t max_bytes, size_t *size) {
    struct stat st;
    if (stat(path, &st) != 0) fatal(EXIT_USAGE, "import-hf: %s: cannot open (%s)", path, strerror(errno));
    if (!S_ISREG(st.st_mode)) fatal(EXIT_USAGE, "import-hf: %s: not a regular file", path);
    if ((size_t)st.st_size > max_bytes)
        fatal(EXIT_USAGE, "import-hf: %s: %lld bytes (valid: at most %zu)", path, (long long)st.st_size,
              max_bytes);
    int fd = open(path, O_RDONLY);
    if (fd < 0) fatal(EXIT_USAGE, "import-hf: %s: cannot open (%s)", path, strerror(errno));
    char *text = xmalloc((size_t)st.st_size + 1);
    if (read(fd, text, (size_t)st.st_size) != st.st_size)
        fatal(EXIT_USAGE, "import-hf: %s: cannot read", path);
    close(fd);
    text[st.st_size] = 0;
    *size = (size_t)st.st_size;
    return text;
}

/* ---- import ---- */

/* What config.json says, with GPT2Config's defaults for what it leaves out. */
typedef struct {
    int layers, dmodel, heads, positions, vocab;
    int inner; /* n_inner: 0 for null (4 * n_embd) */
    char activation[32], model_type[32];
    double eps;
    int tied, scale_attn, scale_by_layer, cross_attention;
} HfConfig;

/* A whole number of config.json in 1..max. */
static int config_int(Json *j, const char *path, const char *key, int max) {
    double x = json_number(j);
    if (!(x >= 1 && x <= max) || x != floor(x))
        fatal(EXIT_USAGE, "import-hf: %s: %s %g (valid: a whole number 1..%d)", path, key, x, max);
    return (int)x;
}

static int config_bool(Json *j, const char *path, const char *key) {
    int b = json_literal(j);
    if (b < 0) fatal(EXIT_USAGE, "import-hf: %s: %s is null (valid: true or false)", path, key);
    return b;
}

static HfConfig read_hf_config(const char *path) {
    HfConfig c = {.layers = 12,
                  .dmodel = 768,
                  .heads = 12,
                  .positions = 1024,
                  .vocab = 50257,
                  .activation = "gelu_new",
                  .model_type = "",
                  .eps = 1e-5,
                  .tied = 1,
                  .scale_attn = 1};
    size_t size;
    char *text = read_small_file(path, 1 << 20, &size);
    Json j = {.start = text, .p = text, .end = text + size, .what = path};
    char key[64];
    int started = 0;
    while (json_member(&j, &started, key, sizeof key)) {
        if (strcmp(key, "n_layer") == 0)
            c.layers = config_int(&j, path, key, MAX_LAYERS);
        else if (strcmp(key, "n_embd") == 0)
            c.dmodel = config_int(&j, path, key, 1 << 20);
        else if (strcmp(key, "n_head") == 0)
            c.heads = config_int(&j, path, key, 1 << 20);
        else if (strcmp(key, "n_positions") == 0)
            c.positions = config_int(&j, path, key, 1 << 24);
        else if (strcmp(key, "vocab_size") == 0)
            c.vocab = config_int(&j, path, key, MAX_VOCAB);
        else if (strcmp(key, "n_inner") == 0)
            c.inner = json_peek(&j) == 'n' ? (json_literal(&j), 0) : config_int(&j, path, key, 1 << 24);
        else if (strcmp(key, "layer_norm_epsilon") == 0)
            c.eps = json_number(&j);
        else if (strcmp(key, "activation_function") == 0)
            json_string(&j, c.activation, sizeof c.activation);
        else if (strcmp(key, "model_type") == 0)
            json_string(&j, c.model_type, sizeof c.model_type);
        else if (strcmp(key, "tie_word_embeddings") == 0)
            c.tied = config_bool(&j, path, key);
        else if (strcmp(key, "scale_attn_weights") == 0)
            c.scale_attn = config_bool(&j, path, key);
        else if (strcmp(key, "scale_attn_by_inverse_layer_idx") == 0)
            c.scale_by_layer = config_bool(&j, path, key);
        else if (strcmp(key, "add_cross_attention") == 0)
            c.cross_attention = config_bool(&j, path, key);
        else
            json_skip(&j, 0);
    }
    if (json_peek(&j) != -1) json_fail(&j, "the end of the file");
    free(text);
    return c;
}

/* One line for the first thing the course's GPT cannot be. */
static void check_hf_config(const HfConfig *c, const char *path) {
    if (strcmp(c->model_type, "gpt2") != 0)
        fatal(EXIT_USAGE, "import-hf: %s: model_type '%s' (valid: gpt2)", path, c->model_type);
    if (strcmp(c->activation, "gelu_new") != 0 && strcmp(c->activation, "gelu_pytorch_tanh") != 0)
        fatal(EXIT_USAGE,
              "import-hf: %s: activation_function '%s': the course's GPT computes GELU's tanh form only "
              "(valid: gelu_new or gelu_pytorch_tanh)",
              path, c->activation);
    if (fabs(c->eps - 1e-5) > 1e-12)
        fatal(EXIT_USAGE,
              "import-hf: %s: layer_norm_epsilon %g: the course's layernorm uses 1e-05 (valid: 1e-05)", path,
              c->eps);
    if (c->inner && c->inner != 4 * c->dmodel)
        fatal(EXIT_USAGE,
              "import-hf: %s: n_inner %d: the course's MLP is 4 x n_embd wide (valid: null or %d)", path,
              c->inner, 4 * c->dmodel);
    if (!c->scale_attn || c->scale_by_layer)
        fatal(EXIT_USAGE,
              "import-hf: %s: attention scores scaled otherwise than by 1/sqrt(head size) (valid: "
              "scale_attn_weights true, scale_attn_by_inverse_layer_idx false)",
              path);
    if (c->cross_attention)
        fatal(EXIT_USAGE, "import-hf: %s: add_cross_attention true: the course's GPT has none (valid: false)",
              path);
    ModelConfig m = {.layers = c->layers,
                     .dmodel = c->dmodel,
                     .heads = c->heads,
                     .seq = c->positions,
                     .vocab = c->vocab,
                     .tied = c->tied};
    const char *problem = model_config_problem(&m);
    if (problem) fatal(EXIT_USAGE, "import-hf: %s: a model the course cannot build: %s", path, problem);
}

/* One tensor of the safetensors header. */
typedef struct {
    char name[96];
    char dtype[16];
    int64_t shape[4];
    int dims;
    uint64_t begin, end;
    int used; /* matched to a tensor of the table */
} StEntry;

/* The header of path: its entries (without __metadata__); *data_at: where the data starts. */
static StEntry *read_safetensors_header(const char *path, int fd, long long file_bytes, int *count,
                                        uint64_t *data_at) {
    uint64_t n = 0;
    if (file_bytes < 8 || pread(fd, &n, sizeof n, 0) != (ssize_t)sizeof n || n > (uint64_t)file_bytes - 8 ||
        n > (100u << 20))
        fatal(EXIT_USAGE, "import-hf: %s: not a safetensors file (its header length is out of range)", path);
    char *text = xmalloc(n + 1);
    if (pread(fd, text, n, 8) != (ssize_t)n) fatal(EXIT_USAGE, "import-hf: %s: cannot read", path);
    text[n] = 0;
    *data_at = 8 + n;
    Json j = {.start = text, .p = text, .end = text + n, .what = path};
    int cap = 64, used = 0;
    StEntry *entries = xcalloc(cap, sizeof *entries);
    char key[96];
    int started = 0;
    while (json_member(&j, &started, key, sizeof key)) {
        if (strcmp(key, "__metadata__") == 0) {
            json_skip(&j, 0);
            continue;
        }
        if (used == cap) {
            entries = realloc(entries, 2 * cap * sizeof *entries);
            if (!entries) fatal(EXIT_RUNTIME, "out of memory");
            memset(entries + cap, 0, cap * sizeof *entries);
            cap *= 2;
        }
        StEntry *e = &entries[used++];
        snprintf(e->name, sizeof e->name, "%s", key);
        e->dims = -1;
        int has_offsets = 0, inner = 0;
        char field[32];
        while (json_member(&j, &inner, field, sizeof field)) {
            if (strcmp(field, "dtype") == 0) {
                json_string(&j, e->dtype, sizeof e->dtype);
            } else if (strcmp(field, "shape") == 0 || strcmp(field, "data_offsets") == 0) {
                int is_shape = field[0] == 's', k = 0;
                json_expect(&j, '[');
                while (json_peek(&j) != ']') {
                    if (k > 0) json_expect(&j, ',');
                    double x = json_number(&j);
                    if (x < 0 || x != floor(x) || x > 1e15 || k >= (is_shape ? 4 : 2))
                        fatal(EXIT_USAGE, "import-hf: %s: tensor %s: a bad %s", path, e->name, field);
                    if (is_shape)
                        e->shape[k] = (int64_t)x;
                    else
                        (k ? &e->end : &e->begin)[0] = (uint64_t)x;
                    k++;
                }
                j.p++;
                if (is_shape)
                    e->dims = k;
                else if (k == 2)
                    has_offsets = 1;
            } else {
                json_skip(&j, 0);
            }
        }
        if (!e->dtype[0] || e->dims < 0 || !has_offsets || e->end < e->begin ||
            e->end > (uint64_t)file_bytes - *data_at)
            fatal(EXIT_USAGE, "import-hf: %s: tensor %s: no dtype, shape or data_offsets within the file",
                  path, e->name);
    }
    free(text);
    *count = used;
    return entries;
}

/* Strip "transformer." where a file names the base model's tensors without it (GPT-2's own upload). */
static const char *canonical(const StEntry *e, char out[96]) {
    if (strncmp(e->name, "transformer.", 12) == 0 || strcmp(e->name, "lm_head.weight") == 0)
        snprintf(out, 96, "%s", e->name);
    else
        snprintf(out, 96, "transformer.%.80s", e->name);
    return out;
}

/* GPT-2's attention mask buffers, which older files hold: not weights. */
static int is_mask_buffer(const char *name) {
    size_t n = strlen(name);
    return (n > 10 && strcmp(name + n - 10, ".attn.bias") == 0) ||
           (n > 17 && strcmp(name + n - 17, ".attn.masked_bias") == 0);
}

/* Element i of a tensor in dtype, as fp32. */
static float element(const unsigned char *data, size_t i, int dtype) {
    if (dtype == 4) {
        float x;
        memcpy(&x, data + 4 * i, 4);
        return x;
    }
    uint16_t h;
    memcpy(&h, data + 2 * i, 2);
    return dtype == 1 ? f16_to_float(h) : bf16_to_float(h);
}

/* Tensor t of the table from entry e into params (table order), as fp32. */
static void import_tensor(const ParamTensor *t, const StEntry *e, int fd, uint64_t data_at, int vocab,
                          float *params, const char *path) {
    char name[96];
    int transposed = hf_name(t->name, t->layer, name);
    size_t rows = hf_rows(t->name, t->rows, vocab), cols = t->cols, n = rows * cols;
    int64_t want[2] = {t->rows == 1 ? (int64_t)cols
                       : transposed ? (int64_t)cols
                                    : (int64_t)rows,
                       transposed ? (int64_t)rows : (int64_t)cols};
    int dims = t->rows == 1 ? 1 : 2;
    if (e->dims != dims || e->shape[0] != want[0] || (dims == 2 && e->shape[1] != want[1])) {
        char got[64] = "", *g = got;
        for (int k = 0; k < e->dims; k++) g += sprintf(g, "%s%lld", k ? ", " : "", (long long)e->shape[k]);
        fatal(EXIT_USAGE, "import-hf: %s: %s has shape [%s], config.json's model has [%lld%s%lld] there",
              path, e->name, got, (long long)want[0], dims == 2 ? ", " : "",
              dims == 2 ? (long long)want[1] : 0LL);
    }
    int size = strcmp(e->dtype, "F32") == 0    ? 4
               : strcmp(e->dtype, "F16") == 0  ? 1
               : strcmp(e->dtype, "BF16") == 0 ? 2
                                               : 0;
    if (!size)
        fatal(EXIT_USAGE, "import-hf: %s: %s is %s (valid: F32, F16 or BF16)", path, e->name, e->dtype);
    size_t bytes = n * (size == 4 ? 4 : 2);
    if (e->end - e->begin != bytes)
        fatal(EXIT_USAGE, "import-hf: %s: %s: data_offsets span %llu bytes, its shape and dtype %zu", path,
              e->name, (unsigned long long)(e->end - e->begin), bytes);
    unsigned char *data = xmalloc(bytes ? bytes : 1);
    if (pread(fd, data, bytes, (off_t)(data_at + e->begin)) != (ssize_t)bytes)
        fatal(EXIT_USAGE, "import-hf: %s: cannot read %s", path, e->name);
    float *dst = params + t->offset; /* rows beyond vocab_size (padding) stay zero */
    for (size_t r = 0; r < rows; r++)
        for (size_t c = 0; c < cols; c++)
            dst[r * cols + c] = element(data, transposed ? c * rows + r : r * cols + c, size);
    free(data);
}

void hf_import(const char *dir, const char *out) {
    char config_path[JOINED_PATH_BYTES], model_path[JOINED_PATH_BYTES];
    snprintf(config_path, sizeof config_path, "%s/%s", dir, HF_CONFIG);
    snprintf(model_path, sizeof model_path, "%s/%s", dir, HF_MODEL);
    struct stat st;
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode))
        fatal(EXIT_USAGE,
              "import-hf %s: not a directory (valid: a directory with config.json and model.safetensors)",
              dir);
    output_file_check("import-hf", out, &checkpoint_output);
    HfConfig c = read_hf_config(config_path);
    check_hf_config(&c, config_path);

    /* the course's configuration for this shape: the defaults of every other flag */
    char num[5][16];
    snprintf(num[0], 16, "%d", c.layers), snprintf(num[1], 16, "%d", c.dmodel),
        snprintf(num[2], 16, "%d", c.heads);
    snprintf(num[3], 16, "%d", c.positions), snprintf(num[4], 16, "%d", c.vocab);
    char *argv[] = {"common/ckpt", "--layers", num[0], "--dmodel", num[1],      "--heads",
                    num[2],        "--seq",    num[3], "--vocab",  num[4],      "--save",
                    (char *)out,   c.tied ? "--tie-embeddings" : NULL, NULL}; /* untied: ends at --save's */
    int argc = 0;
    while (argv[argc]) argc++;
    static Config cfg; /* large */
    config_read(&cfg, argc, argv, "common/ckpt", NULL);
    checkpoint_check_save_path(&cfg);

    int fd = open(model_path, O_RDONLY);
    if (fd < 0 || fstat(fd, &st) != 0 || !S_ISREG(st.st_mode))
        fatal(EXIT_USAGE, "import-hf: %s: cannot open (%s)", model_path,
              fd < 0 ? strerror(errno) : "not a regular file");
    int count;
    uint64_t data_at;
    StEntry *entries = read_safetensors_header(model_path, fd, st.st_size, &count, &data_at);

    ParamTable table;
    param_table_build(&table, &cfg.model);
    float *arrays[CKPT_ARRAYS];
    for (int a = 0; a < CKPT_ARRAYS; a++)
        arrays[a] = xcalloc(table.num_params ? table.num_params : 1, sizeof(float));
    for (int i = 0; i < table.num_tensors; i++) {
        const ParamTensor *t = &table.tensors[i];
        char want[96], name[96];
        hf_name(t->name, t->layer, want);
        StEntry *found = NULL;
        for (int k = 0; k < count; k++)
            if (strcmp(canonical(&entries[k], name), want) == 0) {
                if (found)
                    fatal(EXIT_USAGE, "import-hf: %s: %s and %s are the same tensor", model_path, found->name,
                          entries[k].name);
                found = &entries[k];
            }
        if (!found)
            fatal(EXIT_USAGE, "import-hf: %s: no tensor %s (the model of config.json has one)", model_path,
                  want);
        found->used = 1;
        import_tensor(t, found, fd, data_at, c.vocab, arrays[CKPT_PARAMS], model_path);
    }
    /* Tied: the head is wte. A file may still hold lm_head.weight (transformers ties it to wte
     * after loading, whatever it holds), so it is not read, as transformers does not read it. */
    for (int k = 0; k < count; k++)
        if (c.tied && strcmp(entries[k].name, "lm_head.weight") == 0) entries[k].used = 1;
    for (int k = 0; k < count; k++)
        if (!entries[k].used && !is_mask_buffer(entries[k].name))
            fatal(EXIT_USAGE,
                  "import-hf: %s: holds %s, which a GPT-2 of config.json's shape has no place for",
                  model_path, entries[k].name);
    close(fd);

    /* step 0, Adam's moments zero: a fresh run from these weights */
    CkptLayout layout;
    ckpt_layout_init(&layout, "common/ckpt import-hf %.70s", dir);
    for (int a = 0; a < CKPT_ARRAYS; a++) {
        ckpt_set_buffer(&layout, a, arrays[a], table.num_params, 1);
        ckpt_hold(&layout, a, 0, table.num_params, 0, 1);
    }
    CkptState state = ckpt_state(0, 0, cfg.seed, NULL);
    uint64_t checksum = checkpoint_write(&cfg, &layout, &state);
    printf("imported %d tensors (%zu parameters) of %s into %s (step 0, checksum %016llx); train it with "
           "--layers %d --dmodel %d --heads %d --seq %d --vocab %d%s --resume %s\n",
           table.num_tensors, table.num_params, dir, out, (unsigned long long)checksum, c.layers, c.dmodel,
           c.heads, c.positions, c.vocab, c.tied ? " --tie-embeddings" : "", out);
    ckpt_layout_free(&layout);
    param_table_free(&table);
    for (int a = 0; a < CKPT_ARRAYS; a++) free(arrays[a]);
    free(entries);
}
