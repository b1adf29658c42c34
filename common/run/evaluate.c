/* evaluate.c: see evaluate.h. */
#include "evaluate.h"

#include "device.h"
#include "util.h"

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

static void print_escaped(const unsigned char *bytes, int n) {
    for (int i = 0; i < n; i++) {
        unsigned char ch = bytes[i];
        if (ch == '\n')
            fputs("\\n", stdout);
        else if (ch >= 32 && ch < 127)
            putchar(ch);
        else
            printf("\\x%02x", ch);
    }
}

int sample_prompt(const Dataset *data, int T, unsigned char *text) {
    int prompt_len = T / 2 < 32 ? T / 2 : 32;
    if (prompt_len < 1) prompt_len = 1;
    memcpy(text, data->bytes + data->split_at, prompt_len);
    return prompt_len;
}

int sample_byte(const float *logits, uint64_t *rng) {
    /* softmax sampling over the byte values (rows past 256 are never data) */
    float maxval = -INFINITY;
    for (int v = 0; v < 256; v++) maxval = fmaxf(maxval, logits[v]);
    double sum = 0.0;
    for (int v = 0; v < 256; v++) sum += exp(logits[v] - maxval);
    double r = rng_next_float(rng) * sum, acc = 0.0;
    for (int v = 0; v < 256; v++) {
        acc += exp(logits[v] - maxval);
        if (acc > r) return v;
    }
    return 255;
}

void sample_print(const unsigned char *text, int prompt_len, int n) {
    log_info("sample: ");
    print_escaped(text, prompt_len);
    printf("|");
    print_escaped(text + prompt_len, n);
    printf("\n");
    fflush(stdout);
}

void sample_text(const GPT *model, Activations *acts, Scratch *scratch, const Dataset *data, int n,
                 uint64_t *rng) {
    int T = acts->T, V = model->cfg.vocab;
    unsigned char *text = xmalloc((size_t)32 + n); /* the prompt is at most 32 bytes */
    int prompt_len = sample_prompt(data, T, text);
    int *context = xmalloc(T * sizeof(int));
    float *logits = xmalloc(V * sizeof(float));
    for (int i = 0; i < n; i++) {
        /* the model sees the last (at most T) bytes */
        int len = prompt_len + i, ctx = len < T ? len : T;
        for (int t = 0; t < ctx; t++) context[t] = text[len - ctx + t];
        copy_to_device(acts->tokens, context, ctx * sizeof(int));
        /* every unit, with_loss 0: the logits, no targets */
        gpt_forward_range(model, acts, scratch, LAYER_EMBEDDING, model->cfg.layers, 0, NULL, 1, ctx);
        copy_to_host(logits, acts->logits + (size_t)(ctx - 1) * V, V * sizeof(float));
        text[len] = (unsigned char)sample_byte(logits, rng);
    }
    sample_print(text, prompt_len, n);
    free(text);
    free(context);
    free(logits);
}
