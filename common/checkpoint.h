/* checkpoint.h: save and resume training.
 *
 * A checkpoint is self-describing: magic, format version, the full model
 * shape and training configuration, the step reached, the sampler's RNG
 * state, then the parameters and Adam's m and v, and a checksum over all of
 * it. It is written to PATH.tmp and renamed, so a crash never leaves a
 * half-written PATH, and a failed save removes PATH.tmp.
 * Reading refuses, with one clear line (EXIT_USAGE), a file that is not a
 * checkpoint, has another version, is truncated or longer than it says, has
 * a header field out of its range, does not match its checksum, was written
 * for a different model shape, or leaves nothing to do. */
#ifndef CHECKPOINT_H
#define CHECKPOINT_H

#include "config.h"
#include "model.h"
#include "optim.h"

#include <stdint.h>

/* Before training: check the checkpoint at path completely (header, size,
 * checksum, and that cfg has steps left after it); returns its step and
 * checksum, the checkpoint's identity. */
void checkpoint_check(const char *path, const Config *cfg, int *step, uint64_t *checksum);
/* Before training: can a checkpoint be saved at path? (a regular file or a
 * new name, in a writable directory) */
void checkpoint_check_save_path(const char *path);

/* params, m and v are DEVICE buffers of the full model (num_params each).
 * Returns the checksum written. */
uint64_t checkpoint_save(const char *path, const Config *cfg, int step, uint64_t rng_state, const GPT *model,
                         const AdamW *opt);
/* Returns the step reached (optimizer steps done); fills params, opt, rng. */
int checkpoint_load(const char *path, const Config *cfg, GPT *model, AdamW *opt, uint64_t *rng_state);

#endif
