/* test_memory.c: the memory arithmetic of chapter 01, and the device
 * layer's host memory, checked on the CPU backend.
 *
 *   build/tests/test_memory [activations|workspace|pinned|async_copy]   (all when none is named)
 *   build/tests/test_memory piece L C NH V T B FIRST_BLOCK LAST_BLOCK PIECE PIECES
 *     prints the bytes one micro-batch's slot of a pipeline piece holds
 *     (blocks FIRST..LAST, piece PIECE of PIECES: a stage, or a chunk of an
 *     interleaved stage), as 04_pipeline/pipeline.c allocates them:
 *     "activations A kept K", A = activation_bytes_range from the piece's
 *     first block to its last unit, K = kept_grads_bytes over its units (the
 *     output gradients zb-h1's W reads). tests/chapters/pipeline.bats multiplies them
 *     by each schedule's micro-batches in flight.
 *
 *   activations: activation_bytes() (common/model/model.c, exercise 01.3) predicts
 *     how many bytes the forward pass keeps for the backward pass. This
 *     program counts the same thing independently, tensor by tensor as listed
 *     in model.h's Activations and BlockActs, for several shapes (odd ones
 *     included), and also checks that the prediction equals what
 *     activations_create() really allocates.
 *   workspace: the attention's workspace is given back by device_shutdown().
 *   pinned: mem_alloc_pinned is counted under host (what memory.csv
 *     reports), zero-filled and page-aligned, and mem_free gives it back.
 *   async_copy: host -> device on the copy stream, a kernel on the compute
 *     stream after an event, device -> host after another: the right bytes.
 * One line per check, PASS or FAIL; exit 0 when every check passes. */
#include "common/run/run_csv.h" /* steps.csv, memory.csv, run.csv */
#include "common/device/device.h" /* mem_alloc, copies, streams, timers */
#include "common/kernels/kernels.h" /* ops(): the kernel table */
#include "common/model/layer_split.h" /* which blocks each stage runs */
#include "common/model/model.h" /* GPT, its forward and backward */
#include "common/core/util.h" /* fatal, log_info, exit codes, flag parsing */

#include <stdint.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>

/* Saved forward values for a micro-batch of B sequences of T tokens, in floats
 * (token ids are 4-byte ints, counted the same). */
static size_t expected_floats(const ModelConfig *m, size_t B, size_t T) {
    size_t C = m->dmodel, NH = m->heads, V = vocab_padded(m->vocab), L = m->layers; /* padded logits */
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
    /* --loss-chunks K: the head's logits and probabilities for tokens / K at a
     * time; a vocabulary split over P ranks: V / P columns of them */
    size_t piece = tokens / (m->loss_chunks > 1 ? m->loss_chunks : 1);
    size_t parts = m->vocab_parts > 1 ? m->vocab_parts : 1;
    V /= parts;
    size_t head = tokens * C + 2 * tokens /* lnf, mean, rstd */
                  + piece * V             /* logits */
                  + piece * V             /* probs */
                  + tokens;               /* losses */
    return embedding + L * per_block + head;
}

static int check_activations(void) {
    struct {
        ModelConfig m;
        int B, T;
    } cases[] = {
        {{2, 64, 4, 64, 256, 0, 0, 0, {0}}, 8, 64},    /* tiny */
        {{4, 128, 4, 128, 256, 0, 0, 0, {0}}, 8, 128}, /* small */
        {{3, 48, 3, 17, 300, 0, 0, 0, {0}}, 3, 17},    /* odd sizes: V padded to 384 */
        {{1, 30, 5, 9, 50257, 1, 0, 0, {0}}, 1, 9},    /* GPT-2's V, tied */
        {{1, 30, 5, 9, 256, 0, 0, 0, {0}}, 1, 9},
        {{2, 64, 4, 64, 256, 0, 0, 0, {0}}, 2, 40},    /* shorter than the model's seq */
        {{2, 64, 4, 64, 50257, 1, 8, 0, {0}}, 8, 64},  /* --loss-chunks 8: an eighth of the logits */
        {{2, 64, 4, 64, 50257, 0, 0, 2, {0}}, 8, 64},  /* the vocabulary split over 2 ranks */
        {{2, 64, 4, 64, 50257, 0, 4, 4, {0}}, 8, 64},  /* both */
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
    return failures;
}

/* The attention's workspace grows on first use and device_shutdown() gives
 * it back: nothing is left in the workspace category after it. */
static int check_workspace(void) {
    int failures = 0;
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
    return failures;
}

/* Pinned host memory is host memory to the accounts: the host row of its
 * category grows by exactly its size, in the current bytes and in the peaks
 * memory.csv is written from, and nothing moves on the device side. */
static int check_pinned(void) {
    size_t bytes = 3 * 4096 + 17; /* not a whole number of pages */
    size_t host_before = mem_current_bytes(SPACE_HOST, CAT_OPTIMIZER);
    size_t device_before = mem_current_bytes(SPACE_DEVICE, CAT_OPTIMIZER);
    unsigned char *p = mem_alloc_pinned(CAT_OPTIMIZER, bytes, "pinned test buffer");
    size_t peaks[SPACE_COUNT * CAT_COUNT];
    memory_peaks_local(peaks);
    int zeros = 1;
    for (size_t i = 0; i < bytes; i++) zeros &= p[i] == 0;
    memset(p, 0xab, bytes); /* all of it is ours to write */
    int counted = mem_current_bytes(SPACE_HOST, CAT_OPTIMIZER) == host_before + bytes;
    int in_csv = peaks[SPACE_HOST * CAT_COUNT + CAT_OPTIMIZER] >= host_before + bytes;
    int device_untouched = mem_current_bytes(SPACE_DEVICE, CAT_OPTIMIZER) == device_before;
    int aligned = (uintptr_t)p % 4096 == 0;
    mem_free(p);
    int given_back = mem_current_bytes(SPACE_HOST, CAT_OPTIMIZER) == host_before;
    int ok = zeros && counted && in_csv && device_untouched && aligned && given_back;
    printf("%s pinned: %zu bytes counted under host/optimizer %s, in memory.csv's peaks %s, device %s, "
           "zero-filled %s, page-aligned %s, given back %s\n",
           ok ? "PASS" : "FAIL", bytes, counted ? "yes" : "NO", in_csv ? "yes" : "NO",
           device_untouched ? "untouched" : "CHANGED", zeros ? "yes" : "NO", aligned ? "yes" : "NO",
           given_back ? "yes" : "NO");
    return !ok;
}

/* A round trip through the device on the copy stream, with a kernel on the
 * compute stream in between, ordered by events both ways: up, x3, down. */
static int check_async_copy(void) {
    size_t n = 100003, bytes = n * sizeof(float);
    float *up = mem_alloc_pinned(CAT_WORKSPACE, bytes, "async copy source");
    float *down = mem_alloc_pinned(CAT_WORKSPACE, bytes, "async copy destination");
    float *dev = mem_alloc(SPACE_DEVICE, CAT_WORKSPACE, bytes, "async copy device buffer");
    for (size_t i = 0; i < n; i++) up[i] = (float)(i % 1000) - 500.0f;
    DeviceStream *copy = device_stream(STREAM_COPY), *compute = device_stream(STREAM_COMPUTE);
    DeviceEvent *arrived = device_event_create(), *scaled = device_event_create(),
                *back = device_event_create();
    copy_to_device_async(dev, up, bytes, copy);
    device_event_record(arrived, copy);
    device_stream_wait(compute, arrived);
    ops()->scale(dev, n, 3.0f);
    device_event_record(scaled, compute);
    device_stream_wait(copy, scaled);
    copy_to_host_async(down, dev, bytes, copy);
    device_event_record(back, copy);
    device_event_sync(back);
    size_t wrong = 0;
    for (size_t i = 0; i < n; i++) wrong += down[i] != 3.0f * up[i];
    /* and up again, waited for with device_stream_sync (dev is host memory on the CPU backend) */
    copy_to_device_async(dev, down, bytes, copy);
    device_stream_sync(copy);
    wrong += memcmp(dev, down, bytes) != 0;
    printf(
        "%s async copy: %zu floats up on the copy stream, x3 on the compute stream, down again: %zu wrong\n",
        wrong ? "FAIL" : "PASS", n, wrong);
    device_event_destroy(arrived);
    device_event_destroy(scaled);
    device_event_destroy(back);
    mem_free(up);
    mem_free(down);
    mem_free(dev);
    return wrong != 0;
}

/* `piece`: one micro-batch's activation slot of a pipeline piece (see the top). */
static int print_piece_bytes(char **arg) {
    ModelConfig m = {
        .layers = atoi(arg[0]), .dmodel = atoi(arg[1]), .heads = atoi(arg[2]), .vocab = atoi(arg[3])};
    m.seq = atoi(arg[4]);
    int B = atoi(arg[5]), first_block = atoi(arg[6]), last_block = atoi(arg[7]);
    int piece = atoi(arg[8]), pieces = atoi(arg[9]), first_unit, last_unit;
    if (m.layers < 1 || m.dmodel < 1 || m.heads < 1 || m.vocab < 1 || m.seq < 1 || B < 1 || first_block < 0 ||
        last_block < first_block || last_block >= m.layers || piece < 0 || piece >= pieces) {
        fprintf(stderr,
                "test_memory piece: need positive sizes, 0 <= FIRST <= LAST < L, 0 <= PIECE < PIECES\n");
        return EXIT_USAGE;
    }
    layer_split_units(first_block, last_block, piece, pieces, m.layers, &first_unit, &last_unit);
    printf("activations %zu kept %zu\n", activation_bytes_range(&m, B, m.seq, first_block, last_unit, 0),
           kept_grads_bytes(&m, B, m.seq, first_unit, last_unit));
    return 0;
}

int main(int argc, char **argv) {
    if (argc == 12 && strcmp(argv[1], "piece") == 0) return print_piece_bytes(argv + 2);
    static const struct {
        const char *name;
        int (*run)(void);
    } checks[] = {
        {"activations", check_activations},
        {"workspace", check_workspace},
        {"pinned", check_pinned},
        {"async_copy", check_async_copy},
    };
    int count = (int)(sizeof checks / sizeof checks[0]), known = argc < 2, failures = 0;
    device_init("cpu", 0);
    for (int i = 0; i < count; i++)
        if (argc < 2 || strcmp(argv[1], checks[i].name) == 0) {
            known = 1;
            failures += checks[i].run();
        }
    if (!known || argc > 2) {
        fprintf(stderr, "usage: test_memory [activations|workspace|pinned|async_copy] | "
                        "piece L C NH V T B FIRST_BLOCK LAST_BLOCK PIECE PIECES\n");
        return EXIT_USAGE;
    }
    return failures ? 1 : 0;
}
