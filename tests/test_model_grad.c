/* test_model_grad.c: whole-model gradient check on the tiny preset.
 *
 * The kernel tests check each operation against double-precision finite
 * differences; this one checks how model.c wires them together. For every
 * named parameter tensor it perturbs the elements with the largest analytic
 * gradients (plus the first and last) and compares
 *     (L(w + h) - L(w - h)) / 2h    with    dL/dw from gpt_backward,
 * where L is the mean token loss, summed in double. A wiring mistake (a
 * missing accumulation, a wrong buffer) gives errors of order 1, far above
 * the float noise this tolerates.
 *
 * --vocab V (not a multiple of 128) pads the vocabulary (model_config.h:
 * vocab_padded): the loss must then equal the cross-entropy over the first V
 * logits computed here in double, to 1e-6, and the padded rows of wte (and
 * lm_head) must get no gradient. --tie-embeddings checks the tied head: wte's
 * gradient, from the head and the embedding, against finite differences.
 * Usage: test_model_grad [--seed S] [--vocab V] [--tie-embeddings]
 * exit 0 when every check passes. */
#include "common/run/config.h" /* Config and the flag tables */
#include "common/device/device.h" /* mem_alloc, copies, streams, timers */
#include "common/kernels/kernels.h" /* ops(): the kernel table */
#include "common/model/model.h" /* GPT, its forward and backward */
#include "common/core/util.h" /* fatal, log_info, exit codes, flag parsing */

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define PICKS 4

static double mean_loss(const GPT *m, Activations *a, Scratch *s, int B, int T) {
    gpt_forward(m, a, s, B, T);
    return gpt_loss_sum(a, B, T) / ((double)B * T);
}

int main(int argc, char **argv) {
    uint64_t seed = (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 16);
    ModelConfig cfg;
    model_preset(&cfg, "tiny");
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--seed") == 0 && i + 1 < argc)
            seed = strtoull(argv[++i], NULL, 10);
        else if (strcmp(argv[i], "--vocab") == 0 && i + 1 < argc)
            cfg.vocab = atoi(argv[++i]);
        else if (strcmp(argv[i], "--tie-embeddings") == 0)
            cfg.tied = 1;
        else
            fatal(EXIT_USAGE,
                  "test_model_grad: unknown argument %s (valid: --seed S, --vocab V, --tie-embeddings)",
                  argv[i]);
    }
    printf("seed %llu\n", (unsigned long long)seed);
    device_init("cpu", 0);
    int V = cfg.vocab, Vp = vocab_padded(V);
    cfg.seq = 13; /* odd on purpose */
    int B = 3, T = cfg.seq, N = B * T;
    GPT m;
    gpt_create(&m, &cfg, seed);
    Activations a;
    activations_create(&a, &cfg, B, T);
    Scratch s;
    scratch_create(&s, &cfg, B, T, 0);
    for (int i = 0; i < N; i++) {
        a.tokens[i] = (int)(hash64(seed + 2 * i) % V);
        a.targets[i] = (int)(hash64(seed + 2 * i + 1) % V);
    }
    /* Larger-than-init weights in the LN gains/biases so their gradients are not trivial. */
    for (size_t i = 0; i < m.num_params; i++) m.params[i] += 0.05f * (float)hash_normal(seed, 7, i);

    ops()->fill_zero(m.grads, m.num_params);
    double loss = mean_loss(&m, &a, &s, B, T);
    gpt_backward(&m, &a, &s, 1.0f / N, B, T);

    /* The padded vocabulary: the loss is the unpadded cross-entropy of the
     * first V logits, and the padded rows learn nothing. */
    double reference = 0.0;
    for (int n = 0; n < N; n++) {
        const float *z = a.logits + (size_t)n * Vp;
        double max = -INFINITY, sum = 0.0;
        for (int v = 0; v < V; v++) max = fmax(max, z[v]);
        for (int v = 0; v < V; v++) sum += exp((double)z[v] - max);
        reference += log(sum) - ((double)z[a.targets[n]] - max);
    }
    reference /= N;
    double padded_grad = 0.0;
    for (size_t i = (size_t)V * cfg.dmodel; i < (size_t)Vp * cfg.dmodel; i++)
        padded_grad += fabs(m.g.wte[i]) + fabs(m.g.lm_head[i]);
    int padding_ok = fabs(loss - reference) <= 1e-6 * fabs(reference) && padded_grad == 0.0;
    printf("%s vocab %d padded to %d: loss %.9f, unpadded cross-entropy %.9f; padded rows' gradient %g\n",
           padding_ok ? "PASS" : "FAIL", V, Vp, loss, reference, padded_grad);
    padding_ok &= !cfg.tied || (m.w.lm_head == m.w.wte && m.g.lm_head == m.g.wte);
    printf("%s the head %s\n", padding_ok ? "PASS" : "FAIL", cfg.tied ? "reads wte (tied)" : "is lm_head");

    int failures = 0;
    for (int k = 0; k < m.num_tensors; k++) {
        const ParamTensor *t = &m.tensors[k];
        float *w = m.params + t->offset, *g = m.grads + t->offset;
        /* the PICKS-2 largest |gradients|, plus the first and last element */
        size_t pick[PICKS];
        int npick = 0;
        pick[npick++] = 0;
        if (t->numel > 1) pick[npick++] = t->numel - 1;
        while (npick < PICKS && (size_t)npick < t->numel) {
            size_t best = 0;
            float best_abs = -1.0f;
            for (size_t i = 0; i < t->numel; i++) {
                int taken = 0;
                for (int p = 0; p < npick; p++) taken |= pick[p] == i;
                if (!taken && fabsf(g[i]) > best_abs) {
                    best_abs = fabsf(g[i]);
                    best = i;
                }
            }
            pick[npick++] = best;
        }
        double worst = 0.0, worst_num = 0.0, worst_ana = 0.0;
        int ok = 1;
        for (int p = 0; p < npick; p++) {
            size_t i = pick[p];
            float saved = w[i];
            float h = 1e-2f * fmaxf(1.0f, fabsf(saved));
            w[i] = saved + h;
            double plus = mean_loss(&m, &a, &s, B, T);
            w[i] = saved - h;
            double minus = mean_loss(&m, &a, &s, B, T);
            w[i] = saved;
            double numeric = (plus - minus) / (2.0 * ((double)(saved + h) - saved));
            double analytic = g[i];
            double err = fabs(numeric - analytic);
            double tol = 2e-2 * fabs(numeric) + 2e-5;
            if (err > tol) ok = 0;
            if (err > worst) {
                worst = err;
                worst_num = numeric;
                worst_ana = analytic;
            }
        }
        printf("%s %-12s worst |numeric - analytic| = %.3g (numeric %.6g, analytic %.6g)\n",
               ok ? "PASS" : "FAIL", t->name, worst, worst_num, worst_ana);
        failures += !ok;
    }
    printf("%d of %d tensors failed\n", failures, m.num_tensors);

    /* Activation recomputation changes where forward values live, not what
     * they are: the same gradients, bit for bit. */
    size_t bytes = m.num_params * sizeof(float);
    float *kept = xmalloc(bytes);
    memcpy(kept, m.grads, bytes);
    Activations ra;
    activations_create_model(&ra, &cfg, B, T, 1);
    Scratch rs;
    scratch_create(&rs, &cfg, B, T, 1);
    memcpy(ra.tokens, a.tokens, N * sizeof(int));
    memcpy(ra.targets, a.targets, N * sizeof(int));
    ops()->fill_zero(m.grads, m.num_params);
    gpt_forward(&m, &ra, &rs, B, T);
    gpt_backward(&m, &ra, &rs, 1.0f / N, B, T);
    int same = memcmp(kept, m.grads, bytes) == 0;
    printf("recompute: gradients %s\n", same ? "bit-identical" : "DIFFER");
    /* everything freed, as the trainers do: make SANITIZE=1 test checks for leaks */
    free(kept);
    scratch_destroy(&rs);
    activations_destroy(&ra, &cfg);
    scratch_destroy(&s);
    activations_destroy(&a, &cfg);
    gpt_destroy(&m);
    device_shutdown();
    return failures || !same || !padding_ok ? 1 : 0;
}
