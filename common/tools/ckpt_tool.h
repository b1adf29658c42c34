/* ckpt_tool.h: what common/ckpt's modules share (ckpt.c: inspect, verify,
 * export as safetensors; ckpt_hf.c: Hugging Face's GPT-2, both ways): a
 * checkpoint opened with its checksum verified, a growing JSON text, and an
 * output file written beside its final name and renamed into place. */
#ifndef CKPT_TOOL_H
#define CKPT_TOOL_H

#include "common/run/checkpoint.h" /* save and resume */
#include "common/core/util.h" /* fatal, log_info, exit codes, flag parsing */

#include <stddef.h>

/* Open path and verify the checksum; ends the program (EXIT_USAGE) when the
 * file is not a sound checkpoint. Returns the checksum. */
uint64_t ckpt_open_verified(CkptFile *f, const char *path);

/* A string that grows as text is appended. */
typedef struct {
    char *s;
    size_t len, cap;
} Text;
void text_add(Text *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* A JSON string value of s (at most max bytes), valid UTF-8 whatever the
 * bytes: a byte that is not part of valid UTF-8 is written as the character
 * of its Latin-1 meaning (\u00XX), as are control characters. */
void text_add_json_string(Text *t, const char *s, size_t max);

/* Every byte to fd, or the program ends naming out. */
void write_all(int fd, const void *data, size_t bytes, const char *out);
/* A new temporary file beside out (the same directory, so the final rename
 * never crosses file systems), of a name no other file has: its descriptor,
 * its name in tmp. */
int create_beside(const char *out, char tmp[JOINED_PATH_BYTES]);
/* fsync and close fd, then rename tmp over out. `what` names out in messages
 * ("export PATH"). */
void finish_beside(int fd, const char *tmp, const char *out, const char *what);

/* A safetensors export (either format) opens with the header's length (8
 * bytes) and then these bytes, whatever the checkpoint: what tells an
 * earlier export from any other file. */
#define EXPORT_HEAD "{\"__metadata__\":{\"format\":\"pt\",\"step\":\""
extern const OutputKind export_output;

#endif
