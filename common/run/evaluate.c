/* evaluate.c: see evaluate.h. */
#include "common/run/evaluate.h" /* validation loss and sampling */

#include "common/model/bpe.h" /* GPT-2's BPE tokenizer */
#include "common/device/device.h" /* mem_alloc, copies, streams, timers */
#include "common/core/util.h" /* fatal, log_info, exit codes, flag parsing */

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

double evaluate_loss(const GPT *model, Activations *acts, Scratch *scratch, const Dataset *data,
                     const Config *cfg) {
    int B = acts->B, T = cfg->model.seq, micro_per_batch = cfg->batch / B;
    double loss_sum = 0.0;
    for (int e = 0; e < cfg->eval_batches; e++) {
        for (int mb = 0; mb < micro_per_batch; mb++) {
            data_upload_batch(data, SPLIT_VAL, cfg->seed, e, mb * B, B, T, acts->tokens, acts->targets);
            gpt_forward(model, acts, scratch, B, T);
            loss_sum += gpt_loss_sum(acts, B, T);
        }
    }
    return loss_sum / ((double)cfg->eval_batches * cfg->batch * T);
}

/* bytes as text: newlines as \n, bytes outside printable ASCII as \xNN (with
 * utf8, bytes from 0x80 on pass as they are: decoded tokens are UTF-8 text) */
static void print_escaped(const unsigned char *bytes, size_t n, int utf8) {
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = bytes[i];
        if (ch == '\n')
            fputs("\\n", stdout);
        else if ((ch >= 32 && ch < 127) || (utf8 && ch >= 0x80))
            putchar(ch);
        else
            printf("\\x%02x", ch);
    }
}

int sample_prompt(const Dataset *data, int T, int *text) {
    int prompt_len = T / 2 < 32 ? T / 2 : 32;
    if (prompt_len < 1) prompt_len = 1;
    for (int i = 0; i < prompt_len; i++) text[i] = data->tokens[data->split_at + i];
    return prompt_len;
}

int sample_rows(const Dataset *data, int V) {
    return data->is_shard ? V : 256;
}

int sample_token(const float *logits, int rows, uint64_t *rng) {
    /* softmax sampling over the first rows logits (for bytes, rows past 256 are never data) */
    float maxval = -INFINITY;
    for (int v = 0; v < rows; v++) maxval = fmaxf(maxval, logits[v]);
    double sum = 0.0;
    for (int v = 0; v < rows; v++) sum += exp(logits[v] - maxval);
    double r = rng_next_float(rng) * sum, acc = 0.0;
    for (int v = 0; v < rows; v++) {
        acc += exp(logits[v] - maxval);
        if (acc > r) return v;
    }
    return rows - 1;
}

/* tokens[0, n) as text: bytes as they are, a shard's GPT-2 tokens decoded
 * with the vocabulary in vocab/gpt2 when it is there, else their ids. */
static void print_tokens(const Dataset *data, const int *tokens, int n, const Bpe *bpe) {
    for (int i = 0; i < n; i++) {
        if (!data->is_shard) {
            unsigned char byte = (unsigned char)tokens[i];
            print_escaped(&byte, 1, 0);
        } else if (bpe && tokens[i] < bpe->vocab_size) {
            const unsigned char *bytes;
            size_t len = bpe_token(bpe, tokens[i], &bytes);
            print_escaped(bytes, len, 1);
        } else {
            printf("%s%d", i ? " " : "", tokens[i]);
        }
    }
}

void sample_print(const Dataset *data, const int *text, int prompt_len, int n) {
    Bpe bpe, *decoder = NULL;
    char dir[PATH_BYTES];
    if (data->is_shard) {
        bpe_default_dir(dir);
        if (bpe_files_present(dir)) {
            bpe_load(&bpe, dir, "vocabulary");
            decoder = &bpe;
        }
    }
    log_info("sample: ");
    print_tokens(data, text, prompt_len, decoder);
    printf("|");
    print_tokens(data, text + prompt_len, n, decoder);
    if (data->is_shard && !decoder) printf(" (token ids: no GPT-2 vocabulary in %s)", dir);
    printf("\n");
    fflush(stdout);
    if (decoder) bpe_free(decoder);
}

void sample_text(const GPT *model, Activations *acts, Scratch *scratch, const Dataset *data, int n,
                 uint64_t *rng) {
    int T = acts->T, V = vocab_padded(model->cfg.vocab); /* a row of logits; sampled: the real tokens */
    int *text = xmalloc(((size_t)32 + n) * sizeof(int)); /* the prompt is at most 32 tokens */
    int prompt_len = sample_prompt(data, T, text);
    int *context = xmalloc(T * sizeof(int));
    float *logits = xmalloc(V * sizeof(float));
    for (int i = 0; i < n; i++) {
        /* the model sees the last (at most T) tokens */
        int len = prompt_len + i, ctx = len < T ? len : T;
        for (int t = 0; t < ctx; t++) context[t] = text[len - ctx + t];
        copy_to_device(acts->tokens, context, ctx * sizeof(int));
        /* every unit, with_loss 0: the logits, no targets */
        gpt_forward_range(model, acts, scratch, LAYER_EMBEDDING, model->cfg.layers, 0, NULL, 1, ctx);
        gpt_logits_row(model, acts, ctx - 1, logits);
        text[len] = sample_token(logits, sample_rows(data, model->cfg.vocab), rng);
    }
    sample_print(data, text, prompt_len, n);
    free(text);
    free(context);
    free(logits);
}
