/* evaluate.h: validation loss and text sampling for a model held whole by
 * this process (forward passes only; no gradients). */
#ifndef EVALUATE_H
#define EVALUATE_H

#include "common/run/config.h" /* Config and the flag tables */
#include "common/model/data.h" /* the training data and its batches */
#include "common/model/model.h" /* GPT, its forward and backward */

#include <stdint.h>

/* Mean loss over cfg->eval_batches global batches of the validation split,
 * run in micro-batches of the activations' capacity. The same batches every
 * time, so the numbers of different runs compare. */
double evaluate_loss(const GPT *model, Activations *acts, Scratch *scratch, const Dataset *data,
                     const Config *cfg);

/* Generate n tokens (bytes, or a shard's token ids) after a prompt taken from
 * the start of the validation split, sampling from the softmax with the
 * sequential RNG *rng; prints "sample: prompt|generated", bytes with the
 * unprintable ones escaped, a shard's tokens decoded by GPT-2's tokenizer
 * (vocab/gpt2, common/scripts/get-gpt2-vocab.sh) or, without it, as ids. */
void sample_text(const GPT *model, Activations *acts, Scratch *scratch, const Dataset *data, int n,
                 uint64_t *rng);

/* The pieces of sample_text, for programs that hold the model their own way:
 * the prompt (the first tokens of the validation split, at most 32 and T/2;
 * returns its length), the rows to draw from (256 for bytes, V for a
 * shard), the token drawn from softmax(logits[0..rows)) with the sequential
 * RNG, and the "sample: prompt|generated" line. */
int sample_prompt(const Dataset *data, int T, int *text);
int sample_rows(const Dataset *data, int V);
int sample_token(const float *logits, int rows, uint64_t *rng);
void sample_print(const Dataset *data, const int *text, int prompt_len, int n);

#endif
