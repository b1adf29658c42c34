/* checkpoint.h: save and resume training.
 *
 * A checkpoint is self-describing: magic, format version, the full model
 * shape and training configuration, the step reached, the sampler's RNG
 * state, then the parameters and Adam's m and v. It is written to
 * PATH.tmp and renamed, so a crash never leaves a half-written PATH.
 * Reading refuses, with one clear line (EXIT_USAGE), a file that is not a
 * checkpoint, has another version, is truncated or longer than it says, or
 * was written for a different model shape. */
#ifndef CHECKPOINT_H
#define CHECKPOINT_H

#include "config.h"
#include "model.h"
#include "optim.h"

#include <stdint.h>

/* params, m and v are DEVICE buffers of the full model (num_params each). */
void checkpoint_save(const char *path, const Config *cfg, int step, uint64_t rng_state, const GPT *model,
                     const AdamW *opt);
/* Returns the step reached (optimizer steps done); fills params, opt, rng. */
int checkpoint_load(const char *path, const Config *cfg, GPT *model, AdamW *opt, uint64_t *rng_state);

#endif
