/* evaluate.h: validation loss and text sampling for a model held whole by
 * this process (forward passes only; no gradients). */
#ifndef EVALUATE_H
#define EVALUATE_H

#include "config.h"
#include "data.h"
#include "model.h"

#include <stdint.h>

/* Mean loss over cfg->eval_batches global batches of the validation split,
 * run in micro-batches of the activations' capacity. The same batches every
 * time, so the numbers of different runs compare. */
double evaluate_loss(const GPT *model, Activations *acts, Scratch *scratch, const Dataset *data,
                     const Config *cfg);

/* Generate n bytes after a prompt taken from the start of the validation
 * split, sampling from the softmax with the sequential RNG *rng; prints
 * "sample: prompt|generated" with unprintable bytes escaped. */
void sample_text(const GPT *model, Activations *acts, Scratch *scratch, const Dataset *data, int n,
                 uint64_t *rng);

/* The pieces of sample_text, for programs that hold the model their own way:
 * the prompt (the first bytes of the validation split, at most 32 and T/2;
 * returns its length), the byte drawn from softmax(logits[0..255]) with the
 * sequential RNG, and the "sample: prompt|generated" line. */
int sample_prompt(const Dataset *data, int T, unsigned char *text);
int sample_byte(const float *logits, uint64_t *rng);
void sample_print(const unsigned char *text, int prompt_len, int n);

#endif
