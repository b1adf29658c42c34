/* test_memory.c: the memory arithmetic of chapter 01, checked.
 *
 * activation_bytes() (common/model.c, exercise 01.3) predicts how many bytes
 * the forward pass keeps for the backward pass. This program counts the same
 * thing independently, tensor by tensor as listed in model.h's Activations
 * and BlockActs, for several shapes (odd ones included), and also checks
 * that the prediction equals what activations_create() really allocates.
 * Exit 0 when every shape agrees. */
#include "device.h"
#include "kernels.h"
#include "model.h"

#include <stdio.h>

/* Saved forward values for a micro-batch of B sequences of T tokens, in floats
 * (token ids are 4-byte ints, counted the same). */
static size_t expected_floats(const ModelConfig *m, size_t B, size_t T) {
    size_t C = m->dmodel, NH = m->heads, V = m->vocab, L = m->layers;
    size_t tokens = B * T;
    size_t per_block = tokens * C         /* ln1 */
                       + 2 * tokens       /* ln1 mean, rstd */
                       + tokens * 3 * C   /* qkv */
                       + tokens * C       /* atty */
                       + B * NH * T       /* lse: one per head and query */
                       + tokens * C       /* res2 */
                       + tokens * C       /* ln2 */
                       + 2 * tokens       /* ln2 mean, rstd */
                       + tokens * 4 * C   /* fch (GELU's output is recomputed, not kept) */
                       + tokens * C;      /* res3 */
    size_t embedding = 2 * tokens         /* token ids, targets */
                       + tokens * C;      /* encoded */
    size_t head = tokens * C + 2 * tokens /* lnf, mean, rstd */
                  + tokens * V            /* logits */
                  + tokens * V            /* probs */
                  + tokens;               /* losses */
    return embedding + L * per_block + head;
}

int main(void) {
    device_init("cpu", 0);
    struct {
        ModelConfig m;
        int B, T;
    } cases[] = {
        {{2, 64, 4, 64, 256}, 8, 64},                                  /* tiny */
        {{4, 128, 4, 128, 256}, 8, 128},                               /* small */
        {{3, 48, 3, 17, 300}, 3, 17},                                  /* odd sizes */
        {{1, 30, 5, 9, 256}, 1, 9},      {{2, 64, 4, 64, 256}, 2, 40}, /* shorter than the model's seq */
    };
    int failures = 0;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const ModelConfig *m = &cases[i].m;
        int B = cases[i].B, T = cases[i].T;
        size_t want = expected_floats(m, B, T) * sizeof(float);
        size_t got = activation_bytes(m, B, T);
        size_t before = mem_current_bytes(SPACE_DEVICE, CAT_ACTIVATIONS);
        Activations acts;
        activations_create(&acts, m, B, T);
        size_t allocated = mem_current_bytes(SPACE_DEVICE, CAT_ACTIVATIONS) - before;
        activations_destroy(&acts, m);
        int ok = got == want && allocated == want;
        printf(
            "%s L=%d C=%d NH=%d V=%d B=%d T=%d: expected %zu bytes, activation_bytes() %zu, allocated %zu\n",
            ok ? "PASS" : "FAIL", m->layers, m->dmodel, m->heads, m->vocab, B, T, want, got, allocated);
        failures += !ok;
    }

    /* The attention's workspace grows on first use and device_shutdown()
     * gives it back: nothing is left in the workspace category after it. */
    {
        int B = 2, T = 70, C = 12, NH = 3;
        float *qkv = mem_alloc(SPACE_DEVICE, CAT_ACTIVATIONS, (size_t)B * T * 3 * C * sizeof(float), "qkv");
        float *out = mem_alloc(SPACE_DEVICE, CAT_ACTIVATIONS, (size_t)B * T * C * sizeof(float), "out");
        float *lse = mem_alloc(SPACE_DEVICE, CAT_ACTIVATIONS, (size_t)B * NH * T * sizeof(float), "lse");
        ops()->attention_forward(out, lse, qkv, B, T, C, NH);
        size_t grown = mem_current_bytes(SPACE_DEVICE, CAT_WORKSPACE);
        device_shutdown();
        size_t left = mem_current_bytes(SPACE_DEVICE, CAT_WORKSPACE);
        int ok = grown > 0 && left == 0;
        printf("%s attention workspace: %zu bytes after a forward, %zu after device_shutdown()\n",
               ok ? "PASS" : "FAIL", grown, left);
        failures += !ok;
        mem_free(qkv);
        mem_free(out);
        mem_free(lse);
    }
    return failures ? 1 : 0;
}
