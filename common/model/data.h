/* data.h: byte-level text data.
 *
 * A file is read whole; its last tenth (at least one sequence) is the
 * validation split, the rest is for training. Which sequences make up the
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
    unsigned char *bytes;
    size_t size;
    size_t split_at; /* [0, split_at) train, [split_at, size) validation */
} Dataset;

/* Load path for sequences of T tokens; bad files end the program (EXIT_USAGE). */
void data_load(Dataset *d, const char *path, int T);
void data_free(Dataset *d);
/* The same checks as data_load, and the file's size and checksum: the data's
 * identity, which every rank of a job must share. */
void data_identify(const char *path, int T, size_t *bytes, uint64_t *checksum);

/* Sequences [first, first+count) of global batch `index` (the step for
 * training, the evaluation batch for validation): tokens and next-byte
 * targets, (count, T) each, host memory. */
void data_batch(const Dataset *d, Split split, uint64_t seed, int index, int first, int count, int T,
                int *tokens, int *targets);

/* data_batch, then both arrays copied into the device buffers (count, T) each:
 * what every chapter does for a micro-batch. */
void data_upload_batch(const Dataset *d, Split split, uint64_t seed, int index, int first, int count, int T,
                       int *device_tokens, int *device_targets);

#endif
