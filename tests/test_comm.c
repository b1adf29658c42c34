/* test_comm.c: the collectives of common/comm.c and the ring all-reduce of
 * common/ring.c, checked against values computed by formula.
 *
 * Run under mpirun with any number of ranks. Each rank fills element i with
 * a small integer depending on (rank, i), so every sum is exact in float and
 * the expected result is known without any communication.
 * Usage: test_comm [ring|allreduce|reduce_scatter|allgather|broadcast|sendrecv|split]
 * Exit 0 when every check passes on every rank. */
#include "comm.h"
#include "device.h"
#include "ring.h"
#include "util.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static float value(int rank, size_t i) {
    return (float)((rank + 1) * 3 + (int)(i % 17));
}
/* sum over ranks 0..n-1 of value(r, i) */
static float sum_of(int n, size_t i) {
    return (float)(3 * n * (n + 1) / 2 + n * (int)(i % 17));
}

static int failures = 0;

static void expect(int ok, const char *what, size_t count, size_t at, double got, double want) {
    if (ok) return;
    failures++;
    fprintf(stderr, "FAIL [rank %d] %s (count %zu): element %zu is %g, expected %g\n",
            comm_rank(comm_world()), what, count, at, got, want);
}

static const size_t counts[] = {0, 1, 2, 3, 5, 7, 100, 1001, 65537};
#define NUM_COUNTS (sizeof counts / sizeof counts[0])

static void check_allreduce(int ring, ReduceOp op) {
    CommGroup *w = comm_world();
    int n = comm_size(w), r = comm_rank(w);
    for (size_t c = 0; c < NUM_COUNTS; c++) {
        size_t count = counts[c];
        float *buf = xmalloc((count + 1) * sizeof(float));
        for (size_t i = 0; i < count; i++) buf[i] = value(r, i);
        if (ring)
            ring_allreduce(w, buf, count, op);
        else
            comm_allreduce(w, buf, count, op);
        for (size_t i = 0; i < count; i++) {
            float want = op == COMM_AVG ? sum_of(n, i) / n : sum_of(n, i);
            if (fabsf(buf[i] - want) > 1e-6f * fabsf(want)) {
                expect(0, ring ? "ring all-reduce" : "all-reduce", count, i, buf[i], want);
                break;
            }
        }
        free(buf);
    }
}

static void check_reduce_scatter_allgather(void) {
    CommGroup *w = comm_world();
    int n = comm_size(w), r = comm_rank(w);
    size_t count = 7; /* per rank */
    float *send = xmalloc(n * count * sizeof(float)), *block = xmalloc(count * sizeof(float));
    float *all = xmalloc(n * count * sizeof(float));
    for (size_t i = 0; i < n * count; i++) send[i] = value(r, i);
    comm_reduce_scatter(w, send, block, count, COMM_SUM);
    for (size_t i = 0; i < count; i++)
        expect(block[i] == sum_of(n, r * count + i), "reduce-scatter", count, i, block[i],
               sum_of(n, r * count + i));
    comm_allgather(w, block, all, count);
    for (size_t i = 0; i < n * count; i++)
        expect(all[i] == sum_of(n, i), "all-gather", count, i, all[i], sum_of(n, i));
    free(send);
    free(block);
    free(all);
}

static void check_broadcast_sendrecv(void) {
    CommGroup *w = comm_world();
    int n = comm_size(w), r = comm_rank(w);
    float buf[5];
    for (int i = 0; i < 5; i++) buf[i] = r == n - 1 ? (float)(100 + i) : -1.0f;
    comm_broadcast(w, buf, 5, n - 1);
    for (int i = 0; i < 5; i++)
        expect(buf[i] == 100 + i, "broadcast from the last rank", 5, i, buf[i], 100 + i);
    /* pass a message around the ring: receive the left neighbour's rank */
    float mine = (float)r, got = -1.0f;
    comm_sendrecv(w, &mine, 1, (r + 1) % n, &got, 1, (r + n - 1) % n, 5);
    expect(got == (float)((r + n - 1) % n), "sendrecv", 1, 0, got, (r + n - 1) % n);
    if (n > 1) {
        if (r == 0) comm_send(w, buf, 5, 1, 9);
        if (r == 1) {
            float in[5] = {0};
            comm_recv(w, in, 5, 0, 9);
            for (int i = 0; i < 5; i++) expect(in[i] == 100 + i, "send/recv", 5, i, in[i], 100 + i);
        }
    }
}

static void check_split(void) {
    CommGroup *w = comm_world();
    int r = comm_rank(w);
    CommGroup *half = comm_split(w, r % 2, r); /* even and odd ranks */
    float x = 1.0f;
    comm_allreduce(half, &x, 1, COMM_SUM);
    int n = comm_size(w), expected = r % 2 == 0 ? (n + 1) / 2 : n / 2;
    expect(comm_size(half) == expected && x == (float)expected, "split into even and odd ranks", 1, 0, x,
           expected);
    comm_free(half);
}

int main(int argc, char **argv) {
    comm_init(&argc, &argv);
    device_init("cpu", 0);
    comm_select("mpi");
    const char *only = argc > 1 ? argv[1] : NULL;
    if (!only || !strcmp(only, "ring")) {
        check_allreduce(1, COMM_SUM);
        check_allreduce(1, COMM_AVG);
    }
    if (!only || !strcmp(only, "allreduce")) {
        check_allreduce(0, COMM_SUM);
        check_allreduce(0, COMM_AVG);
    }
    if (!only || !strcmp(only, "reduce_scatter") || !strcmp(only, "allgather"))
        check_reduce_scatter_allgather();
    if (!only || !strcmp(only, "broadcast") || !strcmp(only, "sendrecv")) check_broadcast_sendrecv();
    if (!only || !strcmp(only, "split")) check_split();
    double total = comm_allreduce_double(comm_world(), failures, 0);
    if (comm_rank(comm_world()) == 0)
        printf("%s: %d ranks, %.0f failures\n", total == 0 ? "PASS" : "FAIL", comm_size(comm_world()), total);
    comm_finalize();
    return total == 0 ? 0 : 1;
}
