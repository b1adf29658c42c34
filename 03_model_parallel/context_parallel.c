/* context_parallel.c: see context_parallel.h. */
#include "03_model_parallel/context_parallel.h" /* 03: ring attention (--cp) */

#include "common/device/device.h" /* mem_alloc, copies, streams, timers */
#include "common/core/util.h" /* fatal, log_info, exit codes, flag parsing */

#include <stdio.h>
#include <string.h>

enum { TAG_KV = 11, TAG_DKV = 12 };

int context_parallel_chunk(int rank, int N, int half, int zigzag) {
    if (!zigzag) return 2 * rank + half;
    return half == 0 ? rank : 2 * N - 1 - rank;
}

void context_parallel_describe(char *text, size_t size, int N, int zigzag) {
    int owner[2 * MAX_CP], n = snprintf(text, size, "chunk owners");
    for (int r = 0; r < N; r++)
        for (int half = 0; half < 2; half++) owner[context_parallel_chunk(r, N, half, zigzag)] = r;
    for (int c = 0; c < 2 * N && n < (int)size; c++) n += snprintf(text + n, size - n, " %d", owner[c]);
    if (n < (int)size) n += snprintf(text + n, size - n, " | blocks per rank");
    for (int r = 0; r < N && n < (int)size; r++) {
        /* query chunk q sees q whole chunks before it and half of its own */
        double blocks =
            context_parallel_chunk(r, N, 0, zigzag) + context_parallel_chunk(r, N, 1, zigzag) + 1.0;
        n += snprintf(text + n, size - n, " %g", blocks);
    }
}

void context_parallel_check_given(const Config *cfg, int cp) {
    static const char *const shaping[] = {"--cp-order", "--cp-send", "--cp-mode", "--alltoall"};
    for (int i = 0; cp == 1 && i < (int)(sizeof shaping / sizeof shaping[0]); i++)
        if (flag_given(cfg, shaping[i]) && !(strcmp(shaping[i], "--alltoall") == 0 && flag_given(cfg, "--ep")))
            fatal(EXIT_USAGE, "%s shapes context parallelism, which --cp 1 does not use (valid: with --cp 2 or more)",
                  shaping[i]);
}

const char *context_parallel_problem(int T, int N) {
    static char message[200];
    if (N > MAX_CP) {
        snprintf(message, sizeof message, "--cp %d is more than this program's %d (valid: 1..%d)", N, MAX_CP,
                 MAX_CP);
        return message;
    }
    if (T % (2 * N) == 0) return NULL;
    snprintf(
        message, sizeof message,
        "--seq %d cannot be cut into 2 x --cp %d = %d equal chunks (valid: --seq a multiple of 2 x cp = %d)",
        T, N, 2 * N, 2 * N);
    return message;
}

/* Where the block of rank `from` meets this rank's queries: for each of this
 * rank's two query chunks and the block's two key chunks, all (1), the
 * causal triangle (2) or nothing (0). */
static int relation(const ContextParallel *cp, int q_half, int from, int k_half) {
    int q = context_parallel_chunk(cp->rank, cp->size, q_half, cp->zigzag);
    int k = context_parallel_chunk(from, cp->size, k_half, cp->zigzag);
    return k < q ? 1 : k == q ? 2 : 0;
}

/* k | v of this rank's T tokens of each sequence, out of qkv (B,T,3C), into kv (B,T,2C) */
static void pack_kv(float *kv, const float *qkv, int B, int T, int C) {
    for (size_t row = 0; row < (size_t)B * T; row++)
        copy_on_device(kv + row * 2 * C, qkv + row * 3 * C + C, 2 * (size_t)C * sizeof(float));
}

/* Milliseconds since the step began, the device's work done; 0 without a
 * sync when nothing is recorded (evaluation, sampling), which never reads it. */
static double since_step_ms(const ContextParallel *cp) {
    if (!cp->recording) return 0.0;
    device_sync();
    return wall_ms() - cp->origin_ms;
}
static void record(ContextParallel *cp, int hop, const char *op, double start_ms, double end_ms) {
    if (cp->recording) timeline_add(&cp->timeline, cp->step + 1, hop, op, start_ms * 1e3, end_ms * 1e3);
}

/* The ring: post the block in hand to the next rank, compute (the caller),
 * then take the previous rank's. Time waiting counts as communication; the
 * timeline has the send in flight from its posting to its wait, and the wait. */
static CommPosted *ring_post(ContextParallel *cp, const float *buf, size_t count, int tag,
                             double *posted_ms) {
    device_sync(); /* the block must be complete before it leaves */
    cp->bytes_sent += (double)count * sizeof(float);
    *posted_ms = since_step_ms(cp);
    if (!cp->posted) { /* blocking: it leaves with ring_take's exchange */
        cp->unsent = buf;
        return NULL;
    }
    return comm_post_send(cp->group, buf, count, (cp->rank + 1) % cp->size, tag);
}
static void ring_take(ContextParallel *cp, CommPosted *posted, float *buf, size_t count, int tag, int hop,
                      double posted_ms) {
    device_sync();
    double start = wall_ms();
    int next = (cp->rank + 1) % cp->size, previous = (cp->rank + cp->size - 1) % cp->size;
    if (cp->posted) {
        comm_recv(cp->group, buf, count, previous, tag);
        comm_wait_posted(cp->group, posted);
    } else { /* the block leaves only now, after the computation: nothing overlaps */
        comm_sendrecv(cp->group, cp->unsent, count, next, buf, count, previous, tag);
        posted_ms = start - cp->origin_ms;
    }
    double end = wall_ms();
    cp->comm_ms += end - start;
    int kv = tag == TAG_KV;
    record(cp, hop, kv ? "kv_send" : "dkv_send", posted_ms, end - cp->origin_ms);
    record(cp, hop, kv ? "kv_wait" : "dkv_wait", start - cp->origin_ms, end - cp->origin_ms);
}

void context_parallel_begin_step(ContextParallel *cp, int step) {
    cp->recording = 1;
    cp->step = step;
    cp->origin_ms = wall_ms();
}
void context_parallel_pause(ContextParallel *cp) {
    cp->recording = 0;
}

static void ring_attention_forward(float *out, float *lse, const float *qkv, int B, int T, int C, int NH,
                                   void *context) {
    ContextParallel *cp = context;
    const KernelOps *k = ops();
    int N = cp->size, rows = T / 2, started[2] = {0, 0};
    size_t count = (size_t)B * T * 2 * C;
    pack_kv(cp->kv[0], qkv, B, T, C);
    for (int hop = 0; hop < N; hop++) {
        int from = (cp->rank - hop + N) % N; /* whose keys and values are in hand */
        float *kv = cp->kv[hop % 2];
        double posted_ms = 0.0;
        CommPosted *posted = hop < N - 1 ? ring_post(cp, kv, count, TAG_KV, &posted_ms) : NULL;
        double start_ms = since_step_ms(cp);
        for (int qh = 0; qh < 2; qh++) {
            for (int kh = 0; kh < 2; kh++) {
                int rel = relation(cp, qh, from, kh);
                if (!rel) continue;
                size_t q0 = (size_t)qh * rows, k0 = (size_t)kh * rows;
                /* the first block of a query chunk is written in place; the others merged into it */
                float *o = started[qh] ? cp->block_out : out, *l = started[qh] ? cp->block_lse : lse;
                k->attention_block_forward(o + q0 * C, l + q0, qkv + q0 * 3 * C, kv + k0 * 2 * C, B, T, rows,
                                           C, NH, rel == 2);
                if (started[qh])
                    k->attention_merge(out + q0 * C, lse + q0, o + q0 * C, l + q0, B, T, rows, C, NH);
                started[qh] = 1;
            }
        }
        record(cp, hop, "attn_fwd", start_ms, since_step_ms(cp));
        if (hop < N - 1) ring_take(cp, posted, cp->kv[(hop + 1) % 2], count, TAG_KV, hop, posted_ms);
    }
}

static void ring_attention_backward(float *dqkv, const float *dout, const float *qkv, const float *out,
                                    const float *lse, int B, int T, int C, int NH, void *context) {
    ContextParallel *cp = context;
    const KernelOps *k = ops();
    int N = cp->size, rows = T / 2;
    size_t count = (size_t)B * T * 2 * C;
    pack_kv(cp->kv[0], qkv, B, T, C);
    k->fill_zero(cp->dkv[0], count);
    for (int hop = 0; hop < N; hop++) {
        int from = (cp->rank - hop + N) % N, now = hop % 2, next = (hop + 1) % 2;
        double posted_ms = 0.0, dkv_posted_ms = 0.0;
        CommPosted *posted = hop < N - 1 ? ring_post(cp, cp->kv[now], count, TAG_KV, &posted_ms) : NULL;
        double start_ms = since_step_ms(cp);
        for (int qh = 0; qh < 2; qh++) {
            for (int kh = 0; kh < 2; kh++) {
                int rel = relation(cp, qh, from, kh);
                if (!rel) continue;
                size_t q0 = (size_t)qh * rows, k0 = (size_t)kh * rows;
                k->attention_block_backward(dqkv + q0 * 3 * C, cp->dkv[now] + k0 * 2 * C, dout + q0 * C,
                                            out + q0 * C, lse + q0, qkv + q0 * 3 * C,
                                            cp->kv[now] + k0 * 2 * C, B, T, rows, C, NH, rel == 2);
            }
        }
        record(cp, hop, "attn_bwd", start_ms, since_step_ms(cp));
        if (hop < N - 1) ring_take(cp, posted, cp->kv[next], count, TAG_KV, hop, posted_ms);
        /* the gradient of the block's keys and values follows it; after N hops it is home */
        CommPosted *dkv_posted = ring_post(cp, cp->dkv[now], count, TAG_DKV, &dkv_posted_ms);
        ring_take(cp, dkv_posted, cp->dkv[next], count, TAG_DKV, hop, dkv_posted_ms);
    }
    const float *home = cp->dkv[N % 2];
    for (size_t row = 0; row < (size_t)B * T; row++) {
        float *d = dqkv + row * 3 * C + C;
        k->residual_forward(d, d, home + row * 2 * C, 2 * (size_t)C);
    }
}

/* The embedding with this rank's positions: wpe's rows of its two chunks */
static void chunk_rows(ContextParallel *cp, int half, int T, size_t *held, size_t *whole) {
    int rows = T / 2, chunk = context_parallel_chunk(cp->rank, cp->size, half, cp->zigzag);
    *held = (size_t)half * rows * cp->C;
    *whole = (size_t)chunk * rows * cp->C;
}

static void split_embedding_forward(float *out, const int *tokens, const float *wte, const float *wpe, int B,
                                    int T, int C, int first, int rows, void *context) {
    ContextParallel *cp = context;
    for (int half = 0; half < 2; half++) {
        size_t held, whole;
        chunk_rows(cp, half, T, &held, &whole);
        copy_on_device(cp->wpe_rows + held, wpe + whole, (size_t)T / 2 * C * sizeof(float));
    }
    ops()->embedding_forward_rows(out, tokens, wte, cp->wpe_rows, B, T, C, first, rows);
}

static void split_embedding_backward(float *dwte, float *dwpe, const float *dout, const int *tokens, int B,
                                     int T, int C, int first, int rows, void *context) {
    ContextParallel *cp = context;
    ops()->fill_zero(cp->dwpe_rows, (size_t)T * C);
    ops()->embedding_backward_rows(dwte, cp->dwpe_rows, dout, tokens, B, T, C, first, rows);
    for (int half = 0; half < 2; half++) {
        size_t held, whole;
        chunk_rows(cp, half, T, &held, &whole);
        ops()->residual_forward(dwpe + whole, dwpe + whole, cp->dwpe_rows + held, (size_t)T / 2 * C);
    }
}

void context_parallel_select(ContextParallel *cp, int *tokens, int *targets, int B) {
    int T = cp->T, held = T / cp->size, rows = held / 2;
    for (int b = 0; b < B; b++) {
        for (int half = 0; half < 2; half++) {
            size_t to = (size_t)b * held + (size_t)half * rows;
            size_t from =
                (size_t)b * T + (size_t)context_parallel_chunk(cp->rank, cp->size, half, cp->zigzag) * rows;
            copy_on_device(tokens + to, cp->tokens + from, rows * sizeof(int));
            copy_on_device(targets + to, cp->targets + from, rows * sizeof(int));
        }
    }
}

void context_parallel_create(ContextParallel *cp, CommGroup *group, const ModelConfig *m, int B, int T,
                             int zigzag, int tp, const char *send, int ring) {
    const char *problem = context_parallel_problem(T, comm_size(group));
    if (problem) fatal(EXIT_USAGE, "%s", problem);
    /* Posted sends (comm_post_send) are the plain mpi transport's only (CPU
     * ranks); CUDA's staged and nccl transports exchange each block after its
     * computation instead (comm_sendrecv), which auto chooses for them. */
    int can_post = strcmp(comm_transport_name(), "mpi") == 0;
    if (strcmp(send, "posted") == 0 && !can_post)
        fatal(EXIT_USAGE,
              "--cp-send posted: the %s transport cannot post sends yet (comm.h, comm_post_send; valid: "
              "--cp-send blocking or auto, or --device cpu)",
              comm_transport_name());
    *cp = (ContextParallel){.group = group,
                            .rank = comm_rank(group),
                            .size = comm_size(group),
                            .zigzag = zigzag,
                            .B = B,
                            .T = T,
                            .C = m->dmodel,
                            .NH = m->heads,
                            .posted = strcmp(send, "blocking") != 0 && can_post};
    int held = T / cp->size;
    cp->tokens = mem_alloc(SPACE_DEVICE, CAT_ACTIVATIONS, (size_t)B * T * sizeof(int), "cp tokens");
    cp->targets = mem_alloc(SPACE_DEVICE, CAT_ACTIVATIONS, (size_t)B * T * sizeof(int), "cp targets");
    cp->wpe_rows = mem_alloc(SPACE_DEVICE, CAT_WORKSPACE, (size_t)held * m->dmodel * sizeof(float), "cp wpe");
    cp->dwpe_rows =
        mem_alloc(SPACE_DEVICE, CAT_WORKSPACE, (size_t)held * m->dmodel * sizeof(float), "cp dwpe");
    cp->split = (SequenceSplit){.embedding_forward = split_embedding_forward,
                                .embedding_backward = split_embedding_backward,
                                .attention_forward = ring_attention_forward,
                                .attention_backward = ring_attention_backward,
                                .context = cp};
    if (!ring) return; /* Ulysses: ulysses_create adds its buffers and attention (ulysses.h) */
    size_t kv_bytes = (size_t)B * held * 2 * (m->dmodel / tp) * sizeof(float); /* this rank's heads */
    for (int i = 0; i < 2; i++) {
        cp->kv[i] = mem_alloc(SPACE_DEVICE, CAT_COMM, kv_bytes, "ring k|v");
        cp->dkv[i] = mem_alloc(SPACE_DEVICE, CAT_COMM, kv_bytes, "ring d(k|v)");
    }
    cp->block_out = mem_alloc(SPACE_DEVICE, CAT_WORKSPACE, kv_bytes / 2, "ring block out");
    cp->block_lse = mem_alloc(SPACE_DEVICE, CAT_WORKSPACE, (size_t)B * (m->heads / tp) * held * sizeof(float),
                              "ring block lse");
}

void context_parallel_destroy(ContextParallel *cp) {
    mem_free(cp->tokens);
    mem_free(cp->targets);
    for (int i = 0; i < 2; i++) {
        mem_free(cp->kv[i]);
        mem_free(cp->dkv[i]);
    }
    mem_free(cp->block_out);
    mem_free(cp->block_lse);
    mem_free(cp->wpe_rows);
    mem_free(cp->dwpe_rows);
    mem_free(cp->a2a_send); /* Ulysses' (ulysses.h), NULL with the ring */
    mem_free(cp->a2a_recv);
    mem_free(cp->heads_qkv);
    mem_free(cp->heads_dqkv);
    mem_free(cp->heads_out);
    mem_free(cp->heads_dout);
    timeline_free(&cp->timeline);
}
