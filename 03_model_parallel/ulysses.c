/* ulysses.c: see ulysses.h. */
#include "03_model_parallel/ulysses.h" /* 03: Ulysses (--cp-mode ulysses) */

#include "03_model_parallel/alltoall.h" /* 03: the pairwise all-to-all */
#include "common/device/device.h" /* mem_alloc, copies, streams, timers */
#include "common/core/util.h" /* fatal, log_info, exit codes, flag parsing */

#include <stdio.h>
#include <string.h>

const char *ulysses_problem(int heads, int N) {
    static char message[200];
    if (heads % N == 0) return NULL;
    snprintf(message, sizeof message,
             "--cp-mode ulysses: --heads %d cannot be split over --cp %d ranks (valid: --cp dividing the "
             "heads)",
             heads, N);
    return message;
}

void ulysses_check_flags(const ModelConfig *m, int cp, int tp, const char *mode, int alltoall_given,
                         int send_given) {
    int ulysses = cp > 1 && strcmp(mode, "ulysses") == 0;
    if (alltoall_given && !ulysses)
        fatal(EXIT_USAGE, "--alltoall is Ulysses' all-to-all (valid: with --cp N --cp-mode ulysses)");
    if (!ulysses) return;
    const char *heads = ulysses_problem(m->heads, cp);
    if (heads) fatal(EXIT_USAGE, "%s", heads);
    if (tp > 1)
        fatal(EXIT_USAGE,
              "--cp-mode ulysses with tensor parallelism is not written yet (valid: --cp-mode ring)");
    if (send_given)
        fatal(EXIT_USAGE, "--cp-send is how the ring's blocks travel; Ulysses sends all-to-alls (valid: "
                          "--cp-send with --cp-mode ring, --alltoall with ulysses)");
}

/* The all-to-all of `count` floats per rank, timed as the cp's communication. */
static void exchange(ContextParallel *cp, size_t count) {
    device_sync(); /* the packed blocks are complete before they leave */
    double start = wall_ms();
    if (cp->pairwise)
        pairwise_alltoall_typed(cp->group, cp->a2a_send, cp->a2a_recv, count, COMM_F32);
    else
        comm_alltoall_typed(cp->group, cp->a2a_send, cp->a2a_recv, count, COMM_F32, NULL);
    cp->comm_ms += wall_ms() - start;
    cp->bytes_sent += (double)(cp->size - 1) * count * sizeof(float);
}

/* tokens (B,Tn,P*C) -> heads (B,T,P*C/N): each token row holds P parts (q, k, v)
 * of C channels; this rank gets its C/N columns of each part for every position. */
static void to_heads(ContextParallel *cp, float *heads, const float *tokens, int B, int Tn, int C, int P) {
    int N = cp->size, Cn = C / N, rows = Tn / 2, T = Tn * N;
    size_t block = (size_t)B * Tn * P * Cn, width = (size_t)P * Cn; /* one destination's, one token's */
    for (int d = 0; d < N; d++)
        copy_on_device_2d(cp->a2a_send + d * block, Cn * sizeof(float), tokens + (size_t)d * Cn,
                          C * sizeof(float), Cn * sizeof(float), (size_t)B * Tn * P);
    exchange(cp, block);
    for (int s = 0; s < N; s++) /* rank s's positions: its two chunks of each sequence */
        for (int b = 0; b < B; b++)
            for (int half = 0; half < 2; half++) {
                int chunk = context_parallel_chunk(s, N, half, cp->zigzag);
                copy_on_device(heads + ((size_t)b * T + (size_t)chunk * rows) * width,
                               cp->a2a_recv + s * block + ((size_t)b * Tn + (size_t)half * rows) * width,
                               rows * width * sizeof(float));
            }
}

/* heads (B,T,P*C/N) -> tokens (B,Tn,P*C): the inverse of to_heads. */
static void to_tokens(ContextParallel *cp, float *tokens, const float *heads, int B, int Tn, int C, int P) {
    int N = cp->size, Cn = C / N, rows = Tn / 2, T = Tn * N;
    size_t block = (size_t)B * Tn * P * Cn, width = (size_t)P * Cn;
    for (int s = 0; s < N; s++) /* to rank s: its positions of this rank's heads */
        for (int b = 0; b < B; b++)
            for (int half = 0; half < 2; half++) {
                int chunk = context_parallel_chunk(s, N, half, cp->zigzag);
                copy_on_device(cp->a2a_send + s * block + ((size_t)b * Tn + (size_t)half * rows) * width,
                               heads + ((size_t)b * T + (size_t)chunk * rows) * width,
                               rows * width * sizeof(float));
            }
    exchange(cp, block);
    for (int d = 0; d < N; d++) /* rank d's heads: columns d C/N .. of each part */
        copy_on_device_2d(tokens + (size_t)d * Cn, C * sizeof(float), cp->a2a_recv + d * block,
                          Cn * sizeof(float), Cn * sizeof(float), (size_t)B * Tn * P);
}

/* SequenceSplit's attention (model.h), T the T/N positions held: lse is kept
 * in the head split, (B,NH/N,T x N), the same B x NH x T floats. */
static void ulysses_attention_forward(float *out, float *lse, const float *qkv, int B, int T, int C, int NH,
                                      void *context) {
    ContextParallel *cp = context;
    int N = cp->size;
    to_heads(cp, cp->heads_qkv, qkv, B, T, C, 3);
    ops()->attention_forward(cp->heads_out, lse, cp->heads_qkv, B, T * N, C / N, NH / N);
    to_tokens(cp, out, cp->heads_out, B, T, C, 1);
}

static void ulysses_attention_backward(float *dqkv, const float *dout, const float *qkv, const float *out,
                                       const float *lse, int B, int T, int C, int NH, void *context) {
    ContextParallel *cp = context;
    const KernelOps *k = ops();
    int N = cp->size;
    size_t count = (size_t)B * T * 3 * C; /* a rank's qkv, either split */
    to_heads(cp, cp->heads_qkv, qkv, B, T, C, 3);
    to_heads(cp, cp->heads_out, out, B, T, C, 1);
    to_heads(cp, cp->heads_dout, dout, B, T, C, 1);
    float *heads_dqkv = cp->heads_dqkv;
    k->fill_zero(heads_dqkv, count);
    k->attention_backward(heads_dqkv, cp->heads_dout, cp->heads_qkv, cp->heads_out, lse, B, T * N, C / N,
                          NH / N);
    to_tokens(cp, cp->heads_qkv, heads_dqkv, B, T, C, 3);  /* heads_qkv is free: the token split's dqkv */
    k->residual_forward(dqkv, dqkv, cp->heads_qkv, count); /* every backward adds into its gradients */
}

void ulysses_create(ContextParallel *cp, const ModelConfig *m, int B, int T, int pairwise) {
    const char *problem = ulysses_problem(m->heads, cp->size);
    if (problem) fatal(EXIT_USAGE, "%s", problem);
    size_t qkv_bytes = (size_t)B * T * 3 * m->dmodel / cp->size * sizeof(float); /* either split */
    cp->ulysses = 1;
    cp->pairwise = pairwise;
    cp->a2a_send = mem_alloc(SPACE_DEVICE, CAT_COMM, qkv_bytes, "ulysses all-to-all out");
    cp->a2a_recv = mem_alloc(SPACE_DEVICE, CAT_COMM, qkv_bytes, "ulysses all-to-all in");
    cp->heads_qkv = mem_alloc(SPACE_DEVICE, CAT_WORKSPACE, qkv_bytes, "ulysses head-split qkv");
    cp->heads_dqkv = mem_alloc(SPACE_DEVICE, CAT_WORKSPACE, qkv_bytes, "ulysses head-split dqkv");
    cp->heads_out = mem_alloc(SPACE_DEVICE, CAT_WORKSPACE, qkv_bytes / 3, "ulysses head-split out");
    cp->heads_dout = mem_alloc(SPACE_DEVICE, CAT_WORKSPACE, qkv_bytes / 3, "ulysses head-split dout");
    cp->split.attention_forward = ulysses_attention_forward;
    cp->split.attention_backward = ulysses_attention_backward;
}
