/* bpe.h: GPT-2's byte-level BPE tokenizer, encode and decode.
 *
 * GPT-2 turns text into tokens in three steps:
 *   1. Pre-tokenisation: the text is cut into pieces by one regular expression,
 *        's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
 *      tried at each position in that order: an English contraction, a word (letters,
 *      with the space before it), a number, a run of other symbols, white space that
 *      leaves its last character to start the next piece, white space. bpe_piece_end
 *      writes it out by hand (no regex library); no merge ever crosses two pieces.
 *   2. Bytes: each piece is its UTF-8 bytes, each byte one of 256 first tokens. The
 *      files spell every token as text in which byte b is one printable character
 *      (byte_to_unicode: printable Latin-1 bytes stand for themselves, the other 68 for
 *      U+0100 onward; a space is "Ġ", U+0120), so any byte string, invalid UTF-8
 *      included, has tokens, and decoding is only concatenation.
 *   3. Merges by rank: vocab.bpe lists 50,000 pairs, most useful first. Of all adjacent
 *      pairs in the piece, the one listed earliest (the lowest rank; the leftmost of
 *      equal pairs) becomes one token, again and again until no adjacent pair is listed.
 *      encoder.json names each token's id (50,257: 256 bytes, 50,000 merges and
 *      <|endoftext|>, 50256, which text never encodes to here).
 *
 * Speed: text repeats its words, so the tokens of each piece up to BPE_CACHE_PIECE_BYTES
 * are kept in a cache; merging uses a heap, so even a megabyte of spaces in one piece
 * takes n log n, not n^2. Not thread-safe (the cache): one Bpe per thread. On one core of the
 * development machine (AMD EPYC): 53 MB of Python sources in 0.9 s (about 60 MB/s), random
 * Chinese characters at 19 MB/s, random bytes at 13 MB/s: 100 MB in 2 to 8 s. */
#ifndef BPE_H
#define BPE_H

#include <stddef.h>
#include <stdint.h>

#include "common/core/util.h" /* fatal, log_info, exit codes, flag parsing */

enum { BPE_CACHE_PIECE_BYTES = 64 };

typedef struct {
    int vocab_size;             /* encoder.json's entries: 50257 for GPT-2 */
    unsigned char *token_bytes; /* every token's bytes, one after another */
    uint32_t *token_offset;     /* (vocab_size + 1): token i is [token_offset[i], token_offset[i+1]) */
    int byte_token[256];        /* the token of each single byte */
    int merges;                 /* vocab.bpe's pairs */
    uint64_t *pair_key;         /* open-addressing table (pair_slots): (left << 32 | right) + 1, 0 empty */
    int32_t *pair_rank, *pair_merged; /* the pair's rank in vocab.bpe and the token it makes */
    size_t pair_slots;
    void *cache; /* pieces already encoded (bpe.c) */
} Bpe;

/* Read DIR/encoder.json and DIR/vocab.bpe (GPT-2's, as common/scripts/get-gpt2-vocab.sh
 * stores them verified). A missing or malformed file ends the program (EXIT_USAGE) in one
 * line naming it; flag names the option that gave dir in messages ("--vocab-dir"). */
void bpe_load(Bpe *b, const char *dir, const char *flag);
void bpe_free(Bpe *b);

/* A growing array of token ids. */
typedef struct {
    int *ids;
    size_t count, capacity;
} BpeTokens;

/* The tokens of text[0, bytes), appended to out. Text is bytes: invalid UTF-8 is
 * encoded byte by byte. */
void bpe_encode(Bpe *b, const unsigned char *text, size_t bytes, BpeTokens *out);
void bpe_tokens_free(BpeTokens *t);

/* The bytes of token id (0 <= id < vocab_size): *bytes points into b, length returned. */
size_t bpe_token(const Bpe *b, int id, const unsigned char **bytes);

/* vocab/gpt2 in the course's folder, found from the running program's path
 * (common/tokenize, NN_name/train: one folder below it), where
 * common/scripts/get-gpt2-vocab.sh stores the vocabulary; and whether dir
 * holds both files. */
void bpe_default_dir(char dir[PATH_BYTES]);
int bpe_files_present(const char *dir);

/* Pre-tokenisation: where the piece that starts at text[i] ends (i < bytes). */
size_t bpe_piece_end(const unsigned char *text, size_t bytes, size_t i);

#endif
