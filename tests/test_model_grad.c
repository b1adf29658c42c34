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
 *
 * --experts E [--top-k K] [--capacity-factor F] [--aux-loss-coef X]
 * [--moe-every N] checks a mixture of experts (moe.h): the objective is then
 * the mean token loss plus the balancing loss's term (X times its mean over
 * sequences, summed over the MoE blocks), and the router's, the experts' and
 * the balancing loss's gradients are checked with the rest. Routing is a
 * step function of the weights: a perturbation that changes any token's
 * experts or drops (a kink, not a slope) is retried with a step ten times
 * smaller, and the element is skipped (counted) if it still changes them.
 * Usage: test_model_grad [--seed S] [--vocab V] [--tie-embeddings] [MoE flags]
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
#define CANDIDATES (4 * PICKS) /* tried, with experts, to find PICKS off a kink */

/* The objective: the mean token loss, plus with experts the balancing loss's term. */
static double mean_loss(const GPT *m, Activations *a, Scratch *s, int B, int T) {
    a->moe.stats = (MoeStats){0};
    gpt_forward(m, a, s, B, T);
    return gpt_loss_sum(a, B, T) / ((double)B * T) + a->moe.stats.aux_sum / B;
}

/* Every MoE block's choices (experts, and rows or drops) of the last forward,
 * into `to` (save) or compared with it; 1 when the same. */
static int routing(const ModelConfig *c, const Activations *a, int N, int *to, int save) {
    size_t NK = (size_t)N * c->moe.top_k, at = 0;
    int same = 1;
    for (int l = 0; l < c->layers; l++) {
        if (!moe_layer(c, l)) continue;
        const MoeLayerActs *la = &a->moe.layer[l];
        const int *now[2] = {la->expert_h, la->pos_h};
        for (int k = 0; k < 2; k++, at += NK) {
            if (save)
                memcpy(to + at, now[k], NK * sizeof(int));
            else
                same &= memcmp(to + at, now[k], NK * sizeof(int)) == 0;
        }
    }
    return same;
}

int main(int argc, char **argv) {
    uint64_t seed = (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 16);
    ModelConfig cfg = {0};
    model_preset(&cfg, "tiny");
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--seed") == 0 && i + 1 < argc)
            seed = strtoull(argv[++i], NULL, 10);
        else if (strcmp(argv[i], "--vocab") == 0 && i + 1 < argc)
            cfg.vocab = atoi(argv[++i]);
        else if (strcmp(argv[i], "--tie-embeddings") == 0)
            cfg.tied = 1;
        else if (strcmp(argv[i], "--experts") == 0 && i + 1 < argc)
            cfg.moe.experts = atoi(argv[++i]);
        else if (strcmp(argv[i], "--top-k") == 0 && i + 1 < argc)
            cfg.moe.top_k = atoi(argv[++i]);
        else if (strcmp(argv[i], "--moe-every") == 0 && i + 1 < argc)
            cfg.moe.every = atoi(argv[++i]);
        else if (strcmp(argv[i], "--capacity-factor") == 0 && i + 1 < argc)
            cfg.moe.capacity_factor = (float)atof(argv[++i]);
        else if (strcmp(argv[i], "--aux-loss-coef") == 0 && i + 1 < argc)
            cfg.moe.aux_coef = (float)atof(argv[++i]);
        else
            fatal(EXIT_USAGE,
                  "test_model_grad: unknown argument %s (valid: --seed S, --vocab V, --tie-embeddings, "
                  "--experts E, --top-k K, --moe-every N, --capacity-factor F, --aux-loss-coef X)",
                  argv[i]);
    }
    int experts = cfg.moe.experts > 0;
    if (experts && !cfg.moe.top_k) cfg.moe.top_k = 1;
    if (experts && !cfg.moe.every) cfg.moe.every = 1;
    const char *problem = model_config_problem(&cfg);
    if (problem) fatal(EXIT_USAGE, "test_model_grad: %s", problem);
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
    double ce = gpt_loss_sum(&a, B, T) / N; /* the token losses alone */
    MoeStats routed = a.moe.stats;
    int *base_routing = xcalloc((size_t)2 * N * MAX_EXPERTS * cfg.layers + 1, sizeof(int));
    routing(&cfg, &a, N, base_routing, 1);
    gpt_backward(&m, &a, &s, 1.0f / N, B, T);
    if (experts) {
        double tokens = 0.0;
        for (int e = 0; e < cfg.moe.experts; e++) tokens += routed.tokens[e];
        printf("experts %d, top-k %d, capacity factor %g, aux coef %g: %.0f choices computed, %.0f dropped, "
               "balancing term %.6g\n",
               cfg.moe.experts, cfg.moe.top_k, cfg.moe.capacity_factor, cfg.moe.aux_coef, tokens,
               routed.dropped, routed.aux_sum / B);
    }

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
    loss = ce; /* the padding check is the token losses' */
    double padded_grad = 0.0;
    for (size_t i = (size_t)V * cfg.dmodel; i < (size_t)Vp * cfg.dmodel; i++)
        padded_grad += fabs(m.g.wte[i]) + fabs(m.g.lm_head[i]);
    int padding_ok = fabs(loss - reference) <= 1e-6 * fabs(reference) && padded_grad == 0.0;
    printf("%s vocab %d padded to %d: loss %.9f, unpadded cross-entropy %.9f; padded rows' gradient %g\n",
           padding_ok ? "PASS" : "FAIL", V, Vp, loss, reference, padded_grad);
    padding_ok &= !cfg.tied || (m.w.lm_head == m.w.wte && m.g.lm_head == m.g.wte);
    printf("%s the head %s\n", padding_ok ? "PASS" : "FAIL", cfg.tied ? "reads wte (tied)" : "is lm_head");

    int failures = 0, skipped = 0;
    for (int k = 0; k < m.num_tensors; k++) {
        const ParamTensor *t = &m.tensors[k];
        float *w = m.params + t->offset, *g = m.grads + t->offset;
        /* the first and last element, then the largest |gradients|: PICKS of them checked; with
         * experts, an element whose perturbation changes the routing (a kink) gives way to the next */
        size_t pick[CANDIDATES];
        int npick = 0;
        pick[npick++] = 0;
        if (t->numel > 1) pick[npick++] = t->numel - 1;
        while (npick < CANDIDATES && (size_t)npick < t->numel) {
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
        int ok = 1, checked = 0;
        for (int p = 0; p < npick && checked < PICKS; p++) {
            size_t i = pick[p];
            float saved = w[i], h = 0.0f;
            double plus = 0.0, minus = 0.0, shrink = 1.0;
            int kink = 1;
            for (int tries = 0; tries < 2 && kink; tries++) { /* a step of 1e-2, or 1e-3 across a kink */
                shrink = tries ? 10.0 : 1.0;
                h = (float)(1e-2 / shrink) * fmaxf(1.0f, fabsf(saved));
                w[i] = saved + h;
                plus = mean_loss(&m, &a, &s, B, T);
                kink = !routing(&cfg, &a, N, base_routing, 0);
                w[i] = saved - h;
                minus = mean_loss(&m, &a, &s, B, T);
                kink |= !routing(&cfg, &a, N, base_routing, 0);
            }
            w[i] = saved;
            if (kink) {
                skipped++;
                continue;
            }
            checked++;
            double numeric = (plus - minus) / (2.0 * ((double)(saved + h) - saved));
            double analytic = g[i];
            double err = fabs(numeric - analytic);
            double tol = 2e-2 * fabs(numeric) + 2e-5 * shrink; /* the loss's float noise over 2h */
            if (err > tol) ok = 0;
            if (err > worst) {
                worst = err;
                worst_num = numeric;
                worst_ana = analytic;
            }
        }
        if (!checked) { /* every candidate on a kink: nothing said about this tensor */
            printf("FAIL %-12s no element could be checked off a kink\n", t->name);
            ok = 0;
        }
        printf("%s %-12s worst |numeric - analytic| = %.3g (numeric %.6g, analytic %.6g)\n",
               ok ? "PASS" : "FAIL", t->name, worst, worst_num, worst_ana);
        failures += !ok;
    }
    printf("%d of %d tensors failed\n", failures, m.num_tensors);
    printf("%d elements passed over: their perturbation changed the routing\n", skipped);
    free(base_routing);
    if (experts) { /* --recompute is refused with experts */
        scratch_destroy(&s);
        activations_destroy(&a, &cfg);
        gpt_destroy(&m);
        device_shutdown();
        return failures || !padding_ok ? 1 : 0;
    }

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
