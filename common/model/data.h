/* data.h: the training data: a text file as bytes, or a token shard.
 *
 * --data names either a text file, whose bytes are the tokens (0..255), or
 * one of llm.c's token shards (token_shard.h: a 1,024-byte header with the
 * magic 20240520, then uint16 token ids, e.g. GPT-2's from common/tokenize),
 * told apart by that magic. Either is read whole; its last tenth (at least
 * one sequence) is the validation split, the rest is for training. Which sequences make up the
 * global batch of step s depends only on (seed, s): sequence j of that batch
 * starts at a position drawn from hash(seed, s, j). A rank that trains on
 * sequences [first, first+count) of the batch therefore sees exactly the
 * bytes the single-device program sees for them. */
#ifndef DATA_H
#define DATA_H

#include <stddef.h>
#include <stdint.h>

typedef enum { SPLIT_TRAIN = 0, SPLIT_VAL = 1 } Split;

typedef struct {
    uint16_t *tokens; /* (size) a text file's bytes, or a shard's token ids */
    size_t size;
    size_t split_at; /* [0, split_at) train, [split_at, size) validation */
    int is_shard;    /* tokens from a token shard, not bytes */
} Dataset;

/* Load path for sequences of T tokens; bad files end the program (EXIT_USAGE). */
void data_load(Dataset *d, const char *path, int T);
void data_free(Dataset *d);
/* The same checks as data_load, a shard's ids against the model's
 * vocabulary V (an id >= V is refused, naming the --vocab it needs), and the
 * file's size and checksum: the data's identity, which every rank of a job
 * must share. */
void data_identify(const char *path, int T, int V, size_t *bytes, uint64_t *checksum);

/* Sequences [first, first+count) of global batch `index` (the step for
 * training, the evaluation batch for validation): tokens and next-token
 * targets, (count, T) each, host memory. */
void data_batch(const Dataset *d, Split split, uint64_t seed, int index, int first, int count, int T,
                int *tokens, int *targets);

/* data_batch, then both arrays copied into the device buffers (count, T) each:
 * what every chapter does for a micro-batch (both NULL: nothing, where the
 * rank reads no tokens). */
void data_upload_batch(const Dataset *d, Split split, uint64_t seed, int index, int first, int count, int T,
                       int *device_tokens, int *device_targets);

#endif
