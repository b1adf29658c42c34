/* common/tokenize: GPT-2's BPE tokenizer (common/model/bpe.h) on the command line.
 *
 *   common/tokenize encode FILE                 FILE's tokens on stdout, one id a line
 *   common/tokenize encode FILE --shard OUT     ... as an llm.c token shard (token_shard.h)
 *   common/tokenize encode FILE --shard OUT --val-shard VAL
 *                                               llm.c's documents and train/val split, as its
 *                                               dev/data/tinyshakespeare.py makes them
 *   common/tokenize decode FILE                 the text of FILE's tokens (ids as encode prints
 *                                               them, or a token shard) on stdout, byte for byte
 *
 * The vocabulary is GPT-2's encoder.json and vocab.bpe, which
 * common/scripts/get-gpt2-vocab.sh fetches and verifies into vocab/gpt2. */
#define _GNU_SOURCE /* memmem */
#include "common/model/bpe.h" /* GPT-2's BPE tokenizer */
#include "common/model/token_shard.h" /* llm.c's token shards */
#include "common/core/util.h" /* fatal, log_info, exit codes, flag parsing */

#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static const char usage[] =
    "usage: common/tokenize encode FILE [--shard OUT [--val-shard VAL [--val-tokens N]]] [--vocab-dir DIR]\n"
    "                                   GPT-2's tokens of the bytes of FILE: one id a line on stdout, or\n"
    "                                   with --shard an llm.c token shard OUT (magic 20240520, version 1,\n"
    "                                   uint16 tokens; OUT is a new name or an earlier shard); with\n"
    "                                   --val-shard, llm.c's train/val split (dev/data/tinyshakespeare.py):\n"
    "                                   <|endoftext|> (50256) before the text and after every blank line\n"
    "                                   (\"\\n\\n\"), the first N tokens (default 32768) into VAL, the rest\n"
    "                                   into OUT\n"
    "       common/tokenize decode FILE [--vocab-dir DIR]\n"
    "                                   the bytes of FILE's tokens on stdout; FILE holds ids as encode\n"
    "                                   prints them (any white space between) or is a token shard\n"
    "       common/tokenize --help\n"
    "--vocab-dir DIR: GPT-2's encoder.json and vocab.bpe (default: vocab/gpt2 in the course's folder,\n"
    "where common/scripts/get-gpt2-vocab.sh stores them after checking their SHA-256 sums).\n"
    "Text is encoded as bytes: any file, invalid UTF-8 included, decodes back to itself. <|endoftext|>\n"
    "in the text is ordinary text (tiktoken's encode_ordinary); its id, 50256, decodes to it.\n";

static unsigned char *read_input(const char *path, size_t *size) {
    struct stat st;
    if (stat(path, &st) != 0) fatal(EXIT_USAGE, "%s: cannot open (%s)", path, strerror(errno));
    if (!S_ISREG(st.st_mode)) fatal(EXIT_USAGE, "%s: not a regular file (valid: a text file)", path);
    FILE *f = fopen(path, "rb");
    if (!f) fatal(EXIT_USAGE, "%s: cannot open (%s)", path, strerror(errno));
    unsigned char *buf = xmalloc((size_t)st.st_size + 1);
    if (fread(buf, 1, (size_t)st.st_size, f) != (size_t)st.st_size)
        fatal(EXIT_USAGE, "%s: read failed (%s)", path, ferror(f) ? strerror(errno) : "file shrank");
    fclose(f);
    buf[st.st_size] = 0;
    *size = (size_t)st.st_size;
    return buf;
}

static void stdout_check(void) {
    if (fflush(stdout) != 0 || ferror(stdout))
        fatal(EXIT_RUNTIME, "stdout: write failed (%s)", strerror(errno));
}

enum { EOT = 50256, LLMC_VAL_TOKENS = 32768 };

/* llm.c's documents: <|endoftext|> first and after every blank line, each piece
 * between encoded on its own (as tiktoken encodes around a special token). */
static void encode_documents(Bpe *b, const unsigned char *text, size_t size, BpeTokens *t) {
    size_t at = 0;
    for (;;) {
        if (t->count == t->capacity) {
            t->capacity = 2 * t->capacity + 1024;
            t->ids = realloc(t->ids, t->capacity * sizeof *t->ids);
            if (!t->ids) fatal(EXIT_RUNTIME, "out of memory: %zu tokens", t->count);
        }
        t->ids[t->count++] = EOT;
        const unsigned char *blank = at < size ? memmem(text + at, size - at, "\n\n", 2) : NULL;
        size_t end = blank ? (size_t)(blank - text) + 2 : size;
        bpe_encode(b, text + at, end - at, t);
        if (!blank) break;
        at = end;
    }
}

static void encode(Bpe *b, const char *path, const char *shard, const char *val_shard, long val_tokens) {
    const char *outputs[2] = {shard, val_shard}, *flags[2] = {"--shard", "--val-shard"};
    for (int k = 0; k < 2; k++) {
        if (!outputs[k]) continue;
        if (same_file(path, outputs[k]))
            fatal(EXIT_USAGE, "%s %s: is the file being encoded (valid: a new name)", flags[k], outputs[k]);
        output_file_check(flags[k], outputs[k], &shard_output);
    }
    if (val_shard && (strcmp(shard, val_shard) == 0 || same_file(shard, val_shard)))
        fatal(EXIT_USAGE, "--val-shard %s: is --shard's file too (valid: another name)", val_shard);
    if (shard && b->vocab_size > UINT16_MAX + 1)
        fatal(EXIT_USAGE, "--shard %s: a vocabulary of %d tokens does not fit a shard's 16-bit ids", shard,
              b->vocab_size);
    if (val_shard && b->vocab_size <= EOT)
        fatal(EXIT_USAGE, "--val-shard: the vocabulary has no <|endoftext|> (id %d)", EOT);
    size_t size;
    unsigned char *text = read_input(path, &size);
    BpeTokens t = {0};
    if (val_shard)
        encode_documents(b, text, size, &t);
    else
        bpe_encode(b, text, size, &t);
    if (val_shard) {
        if (t.count <= (size_t)val_tokens)
            fatal(EXIT_USAGE, "--val-tokens %ld: %s has only %zu tokens (valid: --val-tokens below %zu)",
                  val_tokens, path, t.count, t.count);
        shard_write("--val-shard", val_shard, t.ids, (size_t)val_tokens);
        shard_write("--shard", shard, t.ids + val_tokens, t.count - (size_t)val_tokens);
    } else if (shard) {
        shard_write("--shard", shard, t.ids, t.count);
    } else {
        for (size_t i = 0; i < t.count; i++) printf("%d\n", t.ids[i]);
        stdout_check();
    }
    bpe_tokens_free(&t);
    free(text);
}

/* Every id is checked before the first byte is written: a refusal leaves no partial text. */
static void decode(const Bpe *b, const char *path) {
    BpeTokens t = {0};
    if (shard_has_magic(path)) {
        size_t count;
        uint16_t *tokens = shard_read("decode", path, &count);
        t.ids = xmalloc((count + 1) * sizeof *t.ids);
        for (size_t i = 0; i < count; i++) t.ids[i] = tokens[i];
        t.count = count;
        free(tokens);
    } else {
        size_t size;
        char *text = (char *)read_input(path, &size);
        t.capacity = size / 2 + 1; /* an id and a separator are at least two bytes */
        t.ids = xmalloc(t.capacity * sizeof *t.ids);
        for (size_t i = 0; i < size;) {
            if (text[i] == ' ' || (text[i] >= '\t' && text[i] <= '\r')) {
                i++;
                continue;
            }
            size_t j = i;
            long id = 0;
            while (j < size && text[j] >= '0' && text[j] <= '9' && id <= INT_MAX)
                id = id * 10 + (text[j++] - '0');
            int ends = j == size || text[j] == ' ' || (text[j] >= '\t' && text[j] <= '\r');
            if (j == i || !ends)
                fatal(EXIT_USAGE,
                      "%s: byte %zu starts no token id (valid: decimal ids 0..%d separated by white "
                      "space, or a token shard)",
                      path, i, b->vocab_size - 1);
            if (id >= b->vocab_size)
                fatal(EXIT_USAGE, "%s: token id %ld is out of range (valid: 0..%d)", path, id,
                      b->vocab_size - 1);
            t.ids[t.count++] = (int)id;
            i = j;
        }
        free(text);
    }
    for (size_t i = 0; i < t.count; i++)
        if (t.ids[i] >= b->vocab_size)
            fatal(EXIT_USAGE, "%s: token %zu is id %d, out of range (valid: 0..%d)", path, i, t.ids[i],
                  b->vocab_size - 1);
    for (size_t i = 0; i < t.count; i++) {
        const unsigned char *bytes;
        size_t n = bpe_token(b, t.ids[i], &bytes);
        fwrite(bytes, 1, n, stdout);
    }
    stdout_check();
    bpe_tokens_free(&t);
}

int main(int argc, char **argv) {
    if (argc < 2 || (strcmp(argv[1], "encode") != 0 && strcmp(argv[1], "decode") != 0)) {
        if (argc >= 2 && (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0)) {
            fputs(usage, stdout);
            return 0;
        }
        if (argc < 2) fatal(EXIT_USAGE, "no command (valid: encode, decode; see --help)");
        fatal(EXIT_USAGE, "unknown command '%s' (valid: encode, decode; see --help)", argv[1]);
    }
    const char *command = argv[1], *shard = NULL, *val_shard = NULL, *vocab_dir = NULL;
    long val_tokens = -1;
    static const struct option options[] = {{"shard", required_argument, 0, 's'},
                                            {"val-shard", required_argument, 0, 'V'},
                                            {"val-tokens", required_argument, 0, 'n'},
                                            {"vocab-dir", required_argument, 0, 'v'},
                                            {"help", no_argument, 0, 'h'},
                                            {0, 0, 0, 0}};
    optind = 2;
    int opt;
    while ((opt = getopt_long(argc, argv, ":", options, NULL)) != -1) {
        if (opt == 's')
            shard = optarg;
        else if (opt == 'V')
            val_shard = optarg;
        else if (opt == 'n')
            val_tokens = parse_int_flag("--val-tokens", optarg, 1, INT32_MAX);
        else if (opt == 'v')
            vocab_dir = optarg;
        else if (opt == 'h') {
            fputs(usage, stdout);
            return 0;
        } else
            getopt_refuse(opt, argv);
    }
    if (optind >= argc) fatal(EXIT_USAGE, "%s needs a FILE (see --help)", command);
    const char *path = argv[optind++];
    getopt_no_operands(argc, argv);
    if ((shard || val_shard || val_tokens >= 0) && strcmp(command, "encode") != 0)
        fatal(EXIT_USAGE, "--shard, --val-shard and --val-tokens are for encode (see --help)");
    if (val_shard && !shard)
        fatal(EXIT_USAGE, "--val-shard needs --shard for the training tokens (see --help)");
    if (val_tokens >= 0 && !val_shard) fatal(EXIT_USAGE, "--val-tokens needs --val-shard (see --help)");
    if (val_tokens < 0) val_tokens = LLMC_VAL_TOKENS;
    char dir[PATH_BYTES];
    if (vocab_dir)
        snprintf(dir, sizeof dir, "%s", vocab_dir);
    else
        bpe_default_dir(dir);
    Bpe b;
    bpe_load(&b, dir, "--vocab-dir");
    if (strcmp(command, "encode") == 0)
        encode(&b, path, shard, val_shard, val_tokens);
    else
        decode(&b, path);
    bpe_free(&b);
    return 0;
}
