/* bpe.c: see bpe.h. */
#include "common/model/bpe.h" /* GPT-2's BPE tokenizer */

#include "common/model/bpe_unicode.h" /* Unicode's letter and number ranges */
#include "common/core/util.h" /* fatal, log_info, exit codes, flag parsing */

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- the byte-to-unicode table ---- */

/* GPT-2's bytes_to_unicode(): bytes '!'..'~', 0xA1..0xAC and 0xAE..0xFF stand for
 * themselves; the other 68 bytes (controls, space, 0x7F..0xA0, 0xAD), in order,
 * for U+0100, U+0101, ... So every byte is one printable character in the files. */
enum { UNICODE_OF_BYTES = 0x100 + 68 };
static void byte_to_unicode_table(uint32_t unicode_of[256], int byte_of[UNICODE_OF_BYTES]) {
    int n = 0;
    for (int b = 0; b < 256; b++) {
        int stands_for_itself =
            (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
        unicode_of[b] = stands_for_itself ? (uint32_t)b : (uint32_t)(0x100 + n++);
    }
    for (int c = 0; c < UNICODE_OF_BYTES; c++) byte_of[c] = -1;
    for (int b = 0; b < 256; b++) byte_of[unicode_of[b]] = b;
}

/* ---- Unicode: one character of UTF-8 and its class ---- */

typedef enum { CHAR_OTHER, CHAR_LETTER, CHAR_NUMBER, CHAR_SPACE } CharClass;

/* The code point starting at s[i], its length in *len; an invalid sequence (a stray
 * continuation byte, an overlong form, a surrogate, past U+10FFFF, cut short) is one
 * byte long and returns UINT32_MAX, a character of no class: CHAR_OTHER. */
static uint32_t utf8_next(const unsigned char *s, size_t n, size_t i, size_t *len) {
    unsigned c = s[i];
    *len = 1;
    if (c < 0x80) return c;
    size_t need;
    uint32_t cp, min;
    if (c >= 0xC2 && c <= 0xDF)
        need = 1, cp = c & 0x1F, min = 0x80;
    else if (c >= 0xE0 && c <= 0xEF)
        need = 2, cp = c & 0x0F, min = 0x800;
    else if (c >= 0xF0 && c <= 0xF4)
        need = 3, cp = c & 0x07, min = 0x10000;
    else
        return UINT32_MAX;
    if (i + need >= n) return UINT32_MAX; /* cut short by the end of the text */
    for (size_t k = 1; k <= need; k++) {
        if ((s[i + k] & 0xC0) != 0x80) return UINT32_MAX;
        cp = cp << 6 | (s[i + k] & 0x3F);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return UINT32_MAX;
    *len = need + 1;
    return cp;
}

/* \s: Unicode's White_Space property, what the regular expressions of GPT-2 and
 * tiktoken mean by it. */
static int is_white_space(uint32_t cp) {
    if (cp < 0x80) return cp == ' ' || (cp >= '\t' && cp <= '\r');
    return cp == 0x85 || cp == 0xA0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 ||
           cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

static CharClass class_of(uint32_t cp) {
    if (cp < 0x80) {
        if ((cp | 0x20) >= 'a' && (cp | 0x20) <= 'z') return CHAR_LETTER;
        if (cp >= '0' && cp <= '9') return CHAR_NUMBER;
        return is_white_space(cp) ? CHAR_SPACE : CHAR_OTHER;
    }
    if (cp == UINT32_MAX) return CHAR_OTHER;
    if (is_white_space(cp)) return CHAR_SPACE;
    size_t lo = 0, hi = sizeof bpe_unicode_ranges / sizeof bpe_unicode_ranges[0];
    while (lo < hi) { /* the first range whose last >= cp */
        size_t mid = (lo + hi) / 2;
        if (bpe_unicode_ranges[mid].last < cp)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo < sizeof bpe_unicode_ranges / sizeof bpe_unicode_ranges[0] && bpe_unicode_ranges[lo].first <= cp)
        return bpe_unicode_ranges[lo].kind == 'L' ? CHAR_LETTER : CHAR_NUMBER;
    return CHAR_OTHER;
}

static CharClass class_at(const unsigned char *s, size_t n, size_t i, size_t *len) {
    if (s[i] < 0x80) { /* the fast path: ASCII */
        *len = 1;
        return class_of(s[i]);
    }
    return class_of(utf8_next(s, n, i, len));
}

/* Where the run of characters of class k that starts at s[i] ends. */
static size_t run_end(const unsigned char *s, size_t n, size_t i, CharClass k) {
    size_t len;
    while (i < n && class_at(s, n, i, &len) == k) i += len;
    return i;
}

/* ---- pre-tokenisation: GPT-2's pattern, alternative by alternative ---- */

size_t bpe_piece_end(const unsigned char *s, size_t n, size_t i) {
    /* 's|'t|'re|'ve|'m|'ll|'d (lower case only, as GPT-2's pattern) */
    if (s[i] == '\'' && i + 1 < n) {
        unsigned c = s[i + 1];
        if (c == 's' || c == 't' || c == 'm' || c == 'd') return i + 2;
        if (i + 2 < n) {
            unsigned d = s[i + 2];
            if ((c == 'r' && d == 'e') || (c == 'v' && d == 'e') || (c == 'l' && d == 'l')) return i + 3;
        }
    }
    /*  ?\p{L}+ |  ?\p{N}+ |  ?[^\s\p{L}\p{N}]+ : one space may lead a run of letters,
     * numbers or other symbols */
    size_t len;
    if (s[i] == ' ' && i + 1 < n) {
        CharClass next = class_at(s, n, i + 1, &len);
        if (next != CHAR_SPACE) return run_end(s, n, i + 1, next);
    }
    CharClass k = class_at(s, n, i, &len);
    if (k != CHAR_SPACE) return run_end(s, n, i, k);
    /* \s+(?!\S) | \s+ : white space to the end of the text is one piece; white space
     * before something else leaves its last character to lead that (" word" above),
     * unless it is one character only. */
    size_t last = i, j = i;
    while (j < n && class_at(s, n, j, &len) == CHAR_SPACE) last = j, j += len;
    if (j == n || last == i) return j;
    return last;
}

/* ---- files ---- */

void bpe_default_dir(char dir[PATH_BYTES]) {
    char exe[PATH_BYTES];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n <= 0) {
        snprintf(dir, PATH_BYTES, "vocab/gpt2");
        return;
    }
    exe[n] = 0;
    char folder[PATH_BYTES], repo[PATH_BYTES];
    directory_of(exe, folder);
    directory_of(folder, repo);
    snprintf(dir, PATH_BYTES, "%.4000s/vocab/gpt2", repo);
}

int bpe_files_present(const char *dir) {
    char path[JOINED_PATH_BYTES];
    struct stat st;
    snprintf(path, sizeof path, "%s/encoder.json", dir);
    if (stat(path, &st) != 0 || !S_ISREG(st.st_mode)) return 0;
    snprintf(path, sizeof path, "%s/vocab.bpe", dir);
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

static unsigned char *read_whole(const char *flag, const char *dir, const char *name, size_t *size) {
    char path[JOINED_PATH_BYTES];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    struct stat st;
    if (stat(path, &st) != 0 || !S_ISREG(st.st_mode))
        fatal(
            EXIT_USAGE,
            "%s %s: no %s there (run common/scripts/get-gpt2-vocab.sh to fetch GPT-2's vocabulary, verified)",
            flag, dir, name);
    FILE *f = fopen(path, "rb");
    if (!f) fatal(EXIT_USAGE, "%s: cannot open (%s)", path, strerror(errno));
    unsigned char *buf = xmalloc((size_t)st.st_size + 1);
    if (fread(buf, 1, (size_t)st.st_size, f) != (size_t)st.st_size)
        fatal(EXIT_USAGE, "%s: read failed", path);
    fclose(f);
    buf[st.st_size] = 0;
    *size = (size_t)st.st_size;
    return buf;
}

/* ---- a hash table from byte strings to token ids (loading only) ---- */

static uint64_t fnv1a(const unsigned char *p, size_t n) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 1099511628211ull;
    return h;
}

typedef struct {
    const Bpe *b;
    int *slot; /* token id, -1 empty */
    size_t slots;
} TokenIndex;

static int token_index_find(const TokenIndex *x, const unsigned char *p, size_t n, size_t *where) {
    size_t s = fnv1a(p, n) & (x->slots - 1);
    for (;; s = (s + 1) & (x->slots - 1)) {
        int id = x->slot[s];
        if (id < 0) break;
        const unsigned char *q;
        if (bpe_token(x->b, id, &q) == n && memcmp(p, q, n) == 0) break;
    }
    if (where) *where = s;
    return x->slot[s];
}

/* ---- loading encoder.json and vocab.bpe ---- */

/* One JSON string at *p (past its opening quote), decoded from GPT-2's byte-to-unicode
 * spelling into bytes appended at out; returns its length, or -1 when a character is not
 * one of the 256 (not a byte-level vocabulary). Escapes: \" \\ \/ \b \f \n \r \t \uXXXX. */
static long json_token(const unsigned char **p, const unsigned char *end, const int *byte_of,
                       unsigned char *out) {
    const unsigned char *s = *p;
    long n = 0;
    while (s < end && *s != '"') {
        uint32_t cp;
        if (*s == '\\') {
            if (s + 1 >= end) return -1;
            unsigned e = s[1];
            s += 2;
            if (e == 'u') {
                if (s + 4 > end) return -1;
                char hex[5] = {(char)s[0], (char)s[1], (char)s[2], (char)s[3], 0};
                char *stop;
                cp = (uint32_t)strtoul(hex, &stop, 16);
                if (stop != hex + 4) return -1;
                s += 4;
            } else {
                const char *from = "\"\\/bfnrt", *to = "\"\\/\b\f\n\r\t";
                const char *at = e ? strchr(from, (int)e) : NULL;
                if (!at) return -1;
                cp = (unsigned char)to[at - from];
            }
        } else {
            size_t len;
            cp = utf8_next(s, (size_t)(end - s), 0, &len);
            s += len;
        }
        if (cp >= UNICODE_OF_BYTES || byte_of[cp] < 0) return -1;
        out[n++] = (unsigned char)byte_of[cp];
    }
    if (s >= end) return -1;
    *p = s + 1;
    return n;
}

static void skip_space(const unsigned char **p, const unsigned char *end) {
    while (*p < end && (**p == ' ' || **p == '\n' || **p == '\r' || **p == '\t')) (*p)++;
}

static void load_encoder(Bpe *b, const char *dir, const char *flag, const int *byte_of) {
    size_t size;
    unsigned char *json = read_whole(flag, dir, "encoder.json", &size);
    const unsigned char *p = json, *end = json + size;
    /* token bytes are at most as long as their JSON spelling: one buffer of the file's size holds them */
    unsigned char *bytes = xmalloc(size + 1);
    size_t used = 0, entries = 0, cap = 1024;
    uint32_t *start = xmalloc(cap * sizeof *start), *length = xmalloc(cap * sizeof *length);
    long *id_of = xmalloc(cap * sizeof *id_of);
    skip_space(&p, end);
    if (p >= end || *p++ != '{') goto malformed;
    for (;;) {
        skip_space(&p, end);
        if (p < end && *p == '}' && entries == 0) break;
        if (p >= end || *p++ != '"') goto malformed;
        long n = json_token(&p, end, byte_of, bytes + used);
        if (n < 0) goto malformed;
        skip_space(&p, end);
        if (p >= end || *p++ != ':') goto malformed;
        skip_space(&p, end);
        char *stop;
        long id = strtol((const char *)p, &stop, 10);
        if (stop == (const char *)p || id < 0 || id >= 1 << 20) goto malformed;
        p = (const unsigned char *)stop;
        if (entries == cap) {
            cap *= 2;
            start = realloc(start, cap * sizeof *start);
            length = realloc(length, cap * sizeof *length);
            id_of = realloc(id_of, cap * sizeof *id_of);
            if (!start || !length || !id_of) fatal(EXIT_RUNTIME, "out of memory reading encoder.json");
        }
        start[entries] = (uint32_t)used, length[entries] = (uint32_t)n, id_of[entries] = id;
        entries++, used += (size_t)n;
        skip_space(&p, end);
        if (p < end && *p == ',') {
            p++;
            continue;
        }
        if (p < end && *p == '}') break;
        goto malformed;
    }
    /* ids must be 0 .. entries-1, each once */
    b->vocab_size = (int)entries;
    int *entry_of = xmalloc(entries * sizeof *entry_of);
    for (size_t i = 0; i < entries; i++) entry_of[i] = -1;
    for (size_t e = 0; e < entries; e++) {
        if (id_of[e] >= (long)entries || entry_of[id_of[e]] >= 0)
            fatal(EXIT_USAGE, "%s/encoder.json: token id %ld repeated or out of 0..%zu", dir, id_of[e],
                  entries - 1);
        entry_of[id_of[e]] = (int)e;
    }
    b->token_bytes = xmalloc(used + 1);
    b->token_offset = xmalloc((entries + 1) * sizeof *b->token_offset);
    size_t at = 0;
    for (size_t id = 0; id < entries; id++) {
        int e = entry_of[id];
        b->token_offset[id] = (uint32_t)at;
        memcpy(b->token_bytes + at, bytes + start[e], length[e]);
        at += length[e];
    }
    b->token_offset[entries] = (uint32_t)at;
    free(entry_of), free(start), free(length), free(id_of), free(bytes), free(json);
    return;
malformed:
    fatal(EXIT_USAGE, "%s/encoder.json: not a GPT-2 byte-level encoder.json (near byte %zu)", dir,
          (size_t)(p - json));
}

static size_t pair_slot(const Bpe *b, uint64_t key) {
    size_t s = (size_t)(hash64(key) & (b->pair_slots - 1));
    while (b->pair_key[s] != 0 && b->pair_key[s] != key) s = (s + 1) & (b->pair_slots - 1);
    return s;
}

static uint64_t pair_key_of(int left, int right) {
    return ((uint64_t)(uint32_t)left << 32 | (uint32_t)right) + 1;
}

static void load_merges(Bpe *b, const char *dir, const char *flag, const int *byte_of,
                        const TokenIndex *index) {
    size_t size;
    unsigned char *text = read_whole(flag, dir, "vocab.bpe", &size);
    const unsigned char *p = text, *end = text + size;
    if (size < 9 || memcmp(text, "#version:", 9) != 0)
        fatal(EXIT_USAGE, "%s/vocab.bpe: not GPT-2's merges (the first line is not #version: ...)", dir);
    while (p < end && *p != '\n') p++;
    b->pair_slots = 1;
    while (b->pair_slots < 2 * (size_t)b->vocab_size + 2) b->pair_slots *= 2;
    b->pair_key = xcalloc(b->pair_slots, sizeof *b->pair_key);
    b->pair_rank = xmalloc(b->pair_slots * sizeof *b->pair_rank);
    b->pair_merged = xmalloc(b->pair_slots * sizeof *b->pair_merged);
    unsigned char *joined = xmalloc(size + 1);
    int line = 1;
    while (p < end) {
        p++; /* the newline */
        line++;
        if (p >= end) break;
        const unsigned char *eol = memchr(p, '\n', (size_t)(end - p));
        if (!eol) eol = end;
        const unsigned char *sp = memchr(p, ' ', (size_t)(eol - p));
        if (!sp || sp == p || sp + 1 >= eol)
            fatal(EXIT_USAGE, "%s/vocab.bpe: line %d is not two tokens separated by one space", dir, line);
        int part[2];
        size_t joined_bytes = 0;
        const unsigned char *from[2] = {p, sp + 1}, *to[2] = {sp, eol};
        for (int k = 0; k < 2; k++) {
            size_t n = 0;
            for (const unsigned char *q = from[k]; q < to[k];) {
                size_t len;
                uint32_t cp = utf8_next(q, (size_t)(to[k] - q), 0, &len);
                if (cp >= UNICODE_OF_BYTES || byte_of[cp] < 0)
                    fatal(EXIT_USAGE,
                          "%s/vocab.bpe: line %d holds a character that is not one of the 256 bytes", dir,
                          line);
                joined[joined_bytes + n++] = (unsigned char)byte_of[cp];
                q += len;
            }
            part[k] = token_index_find(index, joined + joined_bytes, n, NULL);
            if (part[k] < 0)
                fatal(EXIT_USAGE, "%s/vocab.bpe: line %d names a token not in encoder.json", dir, line);
            joined_bytes += n;
        }
        int merged = token_index_find(index, joined, joined_bytes, NULL);
        if (merged < 0)
            fatal(EXIT_USAGE, "%s/vocab.bpe: line %d merges into a token not in encoder.json", dir, line);
        uint64_t key = pair_key_of(part[0], part[1]);
        size_t s = pair_slot(b, key);
        if (b->pair_key[s] == 0) { /* a pair listed twice keeps its first (lowest) rank */
            b->pair_key[s] = key;
            b->pair_rank[s] = b->merges;
            b->pair_merged[s] = merged;
        }
        b->merges++;
        p = eol;
    }
    free(joined);
    free(text);
}

/* ---- the cache of encoded pieces ---- */

typedef struct {
    uint64_t *hash;  /* slots; 0 empty */
    uint32_t *where; /* offset of the entry in data: bytes (1), piece, count (1), tokens (4 each) */
    size_t slots, used;
    unsigned char *data;
    size_t data_used, data_cap;
} PieceCache;

enum { CACHE_SLOTS = 1 << 20, CACHE_DATA_BYTES = 64 << 20 };

static PieceCache *cache_new(void) {
    PieceCache *c = xcalloc(1, sizeof *c);
    c->slots = CACHE_SLOTS;
    c->hash = xcalloc(c->slots, sizeof *c->hash);
    c->where = xmalloc(c->slots * sizeof *c->where);
    c->data_cap = CACHE_DATA_BYTES;
    c->data = xmalloc(c->data_cap);
    return c;
}

static void cache_free(PieceCache *c) {
    if (!c) return;
    free(c->hash), free(c->where), free(c->data), free(c);
}

/* The cached tokens of piece p[0, n) (count in *count), or NULL; *slot is where it goes. */
static const unsigned char *cache_find(const PieceCache *c, const unsigned char *p, size_t n, uint64_t h,
                                       size_t *slot, int *count) {
    size_t s = (size_t)h & (c->slots - 1);
    for (; c->hash[s] != 0; s = (s + 1) & (c->slots - 1)) {
        const unsigned char *e = c->data + c->where[s];
        if (c->hash[s] == h && e[0] == n && memcmp(e + 1, p, n) == 0) {
            *count = e[1 + n];
            return e + 2 + n;
        }
    }
    *slot = s;
    return NULL;
}

static void cache_put(PieceCache *c, size_t slot, uint64_t h, const unsigned char *p, size_t n,
                      const int *ids, int count) {
    size_t need = 2 + n + 4 * (size_t)count;
    if (c->used * 4 >= c->slots * 3 || c->data_used + need > c->data_cap) { /* full: start afresh */
        memset(c->hash, 0, c->slots * sizeof *c->hash);
        c->used = c->data_used = 0;
        int ignored;
        cache_find(c, p, n, h, &slot, &ignored);
    }
    unsigned char *e = c->data + c->data_used;
    e[0] = (unsigned char)n;
    memcpy(e + 1, p, n);
    e[1 + n] = (unsigned char)count;
    memcpy(e + 2 + n, ids, 4 * (size_t)count);
    c->hash[slot] = h;
    c->where[slot] = (uint32_t)c->data_used;
    c->data_used += need;
    c->used++;
}

/* ---- merging one piece ---- */

typedef struct {
    int32_t rank;
    uint32_t left, right; /* positions of the two symbols */
    int32_t left_id, right_id;
} Candidate;

static int candidate_before(const Candidate *a, const Candidate *b) {
    return a->rank < b->rank || (a->rank == b->rank && a->left < b->left);
}

typedef struct {
    Candidate *heap;
    size_t count, capacity;
    int *id;               /* (n) the token a symbol starting at this position is; -1 merged away */
    uint32_t *next, *prev; /* (n) the neighbouring symbols; n or UINT32_MAX at the ends */
    size_t n_capacity;
} MergeWork;

static void heap_push(MergeWork *w, Candidate c) {
    if (w->count == w->capacity) {
        w->capacity = w->capacity ? 2 * w->capacity : 64;
        w->heap = realloc(w->heap, w->capacity * sizeof *w->heap);
        if (!w->heap) fatal(EXIT_RUNTIME, "out of memory merging a piece");
    }
    size_t i = w->count++;
    while (i > 0 && candidate_before(&c, &w->heap[(i - 1) / 2])) {
        w->heap[i] = w->heap[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    w->heap[i] = c;
}

static Candidate heap_pop(MergeWork *w) {
    Candidate top = w->heap[0], last = w->heap[--w->count];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= w->count) break;
        if (c + 1 < w->count && candidate_before(&w->heap[c + 1], &w->heap[c])) c++;
        if (!candidate_before(&w->heap[c], &last)) break;
        w->heap[i] = w->heap[c];
        i = c;
    }
    if (w->count) w->heap[i] = last;
    return top;
}

static void consider_pair(const Bpe *b, MergeWork *w, uint32_t left, uint32_t right) {
    size_t s = pair_slot(b, pair_key_of(w->id[left], w->id[right]));
    if (b->pair_key[s] == 0) return;
    heap_push(w, (Candidate){b->pair_rank[s], left, right, w->id[left], w->id[right]});
}

/* The tokens of one piece, appended to out: its bytes, then the listed pair of lowest
 * rank (leftmost among equals) merged, again and again. A candidate whose symbols have
 * changed since it was pushed is stale and skipped. */
static void merge_piece(const Bpe *b, MergeWork *w, const unsigned char *p, size_t n, BpeTokens *out) {
    if (n > w->n_capacity) {
        w->n_capacity = n;
        w->id = realloc(w->id, n * sizeof *w->id);
        w->next = realloc(w->next, n * sizeof *w->next);
        w->prev = realloc(w->prev, n * sizeof *w->prev);
        if (!w->id || !w->next || !w->prev)
            fatal(EXIT_RUNTIME, "out of memory merging a piece of %zu bytes", n);
    }
    w->count = 0;
    for (size_t i = 0; i < n; i++) {
        w->id[i] = b->byte_token[p[i]];
        w->next[i] = (uint32_t)(i + 1);
        w->prev[i] = i ? (uint32_t)(i - 1) : UINT32_MAX;
    }
    for (size_t i = 0; i + 1 < n; i++) consider_pair(b, w, (uint32_t)i, (uint32_t)(i + 1));
    while (w->count) {
        Candidate c = heap_pop(w);
        if (w->id[c.left] != c.left_id || w->next[c.left] != c.right || w->id[c.right] != c.right_id)
            continue;
        w->id[c.left] = b->pair_merged[pair_slot(b, pair_key_of(c.left_id, c.right_id))];
        w->id[c.right] = -1;
        w->next[c.left] = w->next[c.right];
        if (w->next[c.right] < n) w->prev[w->next[c.right]] = c.left;
        if (w->prev[c.left] != UINT32_MAX) consider_pair(b, w, w->prev[c.left], c.left);
        if (w->next[c.left] < n) consider_pair(b, w, c.left, w->next[c.left]);
    }
    for (size_t i = 0; i < n; i = w->next[i]) {
        if (out->count == out->capacity) {
            out->capacity = out->capacity ? 2 * out->capacity : 1024;
            out->ids = realloc(out->ids, out->capacity * sizeof *out->ids);
            if (!out->ids) fatal(EXIT_RUNTIME, "out of memory: %zu tokens", out->count);
        }
        out->ids[out->count++] = w->id[i];
    }
}

/* ---- the interface ---- */

typedef struct {
    PieceCache *pieces;
    MergeWork work;
} EncodeState;

void bpe_load(Bpe *b, const char *dir, const char *flag) {
    memset(b, 0, sizeof *b);
    uint32_t unicode_of[256];
    int byte_of[UNICODE_OF_BYTES];
    byte_to_unicode_table(unicode_of, byte_of);
    load_encoder(b, dir, flag, byte_of);
    TokenIndex index = {.b = b, .slots = 1};
    while (index.slots < 2 * (size_t)b->vocab_size) index.slots *= 2;
    index.slot = xmalloc(index.slots * sizeof *index.slot);
    for (size_t s = 0; s < index.slots; s++) index.slot[s] = -1;
    for (int id = 0; id < b->vocab_size; id++) {
        const unsigned char *t;
        size_t n = bpe_token(b, id, &t), s;
        if (token_index_find(&index, t, n, &s) >= 0)
            fatal(EXIT_USAGE, "%s/encoder.json: two tokens (ids %d and %d) have the same bytes", dir,
                  index.slot[s], id);
        index.slot[s] = id;
    }
    for (int c = 0; c < 256; c++) {
        unsigned char byte = (unsigned char)c;
        b->byte_token[c] = token_index_find(&index, &byte, 1, NULL);
        if (b->byte_token[c] < 0) fatal(EXIT_USAGE, "%s/encoder.json: byte %d has no token", dir, c);
    }
    load_merges(b, dir, flag, byte_of, &index);
    free(index.slot);
    EncodeState *state = xcalloc(1, sizeof *state);
    state->pieces = cache_new();
    b->cache = state;
}

void bpe_free(Bpe *b) {
    EncodeState *state = b->cache;
    if (state) {
        cache_free(state->pieces);
        free(state->work.heap), free(state->work.id), free(state->work.next), free(state->work.prev);
        free(state);
    }
    free(b->token_bytes), free(b->token_offset), free(b->pair_key), free(b->pair_rank), free(b->pair_merged);
    memset(b, 0, sizeof *b);
}

size_t bpe_token(const Bpe *b, int id, const unsigned char **bytes) {
    *bytes = b->token_bytes + b->token_offset[id];
    return b->token_offset[id + 1] - b->token_offset[id];
}

void bpe_encode(Bpe *b, const unsigned char *text, size_t bytes, BpeTokens *out) {
    EncodeState *state = b->cache;
    for (size_t i = 0; i < bytes;) {
        size_t end = bpe_piece_end(text, bytes, i), n = end - i;
        const unsigned char *piece = text + i;
        i = end;
        if (n > BPE_CACHE_PIECE_BYTES) {
            merge_piece(b, &state->work, piece, n, out);
            continue;
        }
        uint64_t h = fnv1a(piece, n) | 1;
        size_t slot = 0;
        int count;
        const unsigned char *cached = cache_find(state->pieces, piece, n, h, &slot, &count);
        if (cached) {
            if (out->count + (size_t)count > out->capacity) {
                out->capacity = 2 * out->capacity + (size_t)count + 1024;
                out->ids = realloc(out->ids, out->capacity * sizeof *out->ids);
                if (!out->ids) fatal(EXIT_RUNTIME, "out of memory: %zu tokens", out->count);
            }
            memcpy(out->ids + out->count, cached, 4 * (size_t)count);
            out->count += (size_t)count;
            continue;
        }
        size_t first = out->count;
        merge_piece(b, &state->work, piece, n, out);
        cache_put(state->pieces, slot, h, piece, n, out->ids + first, (int)(out->count - first));
    }
}

void bpe_tokens_free(BpeTokens *t) {
    free(t->ids);
    memset(t, 0, sizeof *t);
}
