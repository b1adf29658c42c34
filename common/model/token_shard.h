/* token_shard.h: llm.c's token shards, the files its data scripts write.
 *
 *   int32 header[256]   header[0] = 20240520 (the magic), header[1] = 1 (the version),
 *                       header[2] = the number of tokens; the rest zero
 *   uint16 tokens[n]    the token ids, little-endian, right after the 1,024-byte header
 *
 * So a shard holds ids below 65,536: GPT-2's 50,257 fit. */
#ifndef TOKEN_SHARD_H
#define TOKEN_SHARD_H

#include <stddef.h>
#include <stdint.h>

#include "common/core/util.h" /* fatal, log_info, exit codes, flag parsing */

enum { SHARD_MAGIC = 20240520, SHARD_VERSION = 1, SHARD_HEADER_INTS = 256 };

/* Does the file at path open with the shard magic? (0 when it cannot be read.) */
int shard_has_magic(const char *path);
/* Is it laid out as a shard (version 1, a token count that matches its size)
 * under another magic? Its magic then, in *magic: a damaged shard, which
 * --data refuses instead of reading it as text. */
int shard_other_magic(const char *path, int32_t *magic);

/* The tokens of the shard at path, malloc'ed, their number in *count. A file that is not
 * a sound shard (too short for the header, another magic or version, a token count that
 * does not match the file's size) ends the program (EXIT_USAGE) in one line that starts
 * with "flag path:". */
uint16_t *shard_read(const char *flag, const char *path, size_t *count);

/* Write tokens (each below 65,536) to path as a shard, through a temporary file renamed
 * over it; flag names path in messages. The caller checks path first (util.h's
 * output-file rule: shard_output is what a shard looks like). */
void shard_write(const char *flag, const char *path, const int *tokens, size_t count);

/* util.h's output-file rule for a shard: the magic's four bytes at offset 0. */
extern const OutputKind shard_output;

#endif
