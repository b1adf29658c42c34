/* hf_logits.c: the course's logits for given tokens, from a checkpoint, for
 * tests/hf_torch_check.py to compare with transformers' GPT2LMHeadModel.
 *
 * Usage: hf_logits CKPT TOKENS B T OUT
 *   TOKENS  B x (T + 1) little-endian int32: each row's T inputs, then the
 *           row's last target (the targets are the inputs shifted by one)
 *   OUT     written: B x T x V float32 logits (chapter 01's forward, fp32, CPU)
 * Prints "loss X", the mean cross-entropy over the B x T targets. */
#include "common/run/checkpoint.h" /* save and resume */
#include "common/run/config.h" /* Config and the flag tables */
#include "common/device/device.h" /* mem_alloc, copies, streams, timers */
#include "common/model/model.h" /* GPT, its forward and backward */
#include "common/core/util.h" /* fatal, log_info, exit codes, flag parsing */

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int main(int argc, char **argv) {
    if (argc != 6) fatal(EXIT_USAGE, "usage: hf_logits CKPT TOKENS B T OUT");
    device_init("cpu", 0);
    CkptFile f;
    ckpt_file_open(&f, argv[1], argv[1]);
    const CheckpointHeader *h = &f.header;
    ModelConfig cfg = {
        .layers = h->layers, .dmodel = h->dmodel, .heads = h->heads, .seq = h->seq, .vocab = h->vocab};
    int B = atoi(argv[3]), T = atoi(argv[4]), V = cfg.vocab;
    if (B < 1 || T < 1 || T > cfg.seq)
        fatal(EXIT_USAGE, "hf_logits: B %d, T %d (valid: B >= 1, T 1..%d)", B, T, cfg.seq);
    GPT m;
    gpt_create(&m, &cfg, 0);
    size_t bytes = m.num_params * sizeof(float);
    if (pread(f.fd, m.params, bytes, (off_t)f.arrays[CKPT_PARAMS].offset) != (ssize_t)bytes)
        fatal(EXIT_USAGE, "%s: truncated", argv[1]);
    int *rows = xmalloc((size_t)B * (T + 1) * sizeof(int));
    FILE *in = fopen(argv[2], "rb");
    if (!in || fread(rows, sizeof(int), (size_t)B * (T + 1), in) != (size_t)B * (T + 1))
        fatal(EXIT_USAGE, "%s: not %d x %d int32 tokens", argv[2], B, T + 1);
    fclose(in);
    Activations a;
    activations_create(&a, &cfg, B, T);
    Scratch s;
    scratch_create(&s, &cfg, B, T, 0);
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            a.tokens[b * T + t] = rows[b * (T + 1) + t];
            a.targets[b * T + t] = rows[b * (T + 1) + t + 1];
        }
    gpt_forward(&m, &a, &s, B, T);
    printf("loss %.9g\n", gpt_loss_sum(&a, B, T) / ((double)B * T));
    FILE *out = fopen(argv[5], "wb");
    if (!out || fwrite(a.logits, sizeof(float), (size_t)B * T * V, out) != (size_t)B * T * V ||
        fclose(out) != 0)
        fatal(EXIT_RUNTIME, "%s: cannot write", argv[5]);
    free(rows);
    scratch_destroy(&s);
    activations_destroy(&a, &cfg);
    gpt_destroy(&m);
    ckpt_file_close(&f);
    device_shutdown();
    return 0;
}
