/* ring.c: the ring all-reduce (see ring.h), over comm_sendrecv. */
#include "ring.h"

#include "device.h"
#include "kernels.h"
#include "util.h"

#define RING_TAG 7001

static float *incoming = NULL; /* one chunk arriving from the left (device, CAT_COMM) */
static size_t incoming_floats = 0;

static float *incoming_buffer(size_t floats) {
    if (floats > incoming_floats) {
        mem_free(incoming);
        incoming = mem_alloc(SPACE_DEVICE, CAT_COMM, floats * sizeof(float), "ring all-reduce chunk");
        incoming_floats = floats;
    }
    return incoming;
}

size_t ring_chunk_begin(size_t count, int n, int c) {
    /* balanced: chunk sizes differ by at most one element */
    return count / n * c + (count % n < (size_t)c ? count % n : (size_t)c);
}

static int mod(int a, int n) {
    return ((a % n) + n) % n;
}

void ring_allreduce(CommGroup *g, float *buf, size_t count, ReduceOp op) {
    int n = comm_size(g), r = comm_rank(g);
    if (n == 1 || count == 0) return;
    int right = mod(r + 1, n), left = mod(r - 1, n);
    float *chunk_in = incoming_buffer(count / n + 1);
    /* EXERCISE 02.1 BEGIN: the ring all-reduce (course.md, exercise 02.1) */
    /* Reduce-scatter. At step s, rank r sends chunk r-s (holding s+1
     * contributions) and adds the arriving chunk r-s-1 into its own copy. */
    for (int s = 0; s < n - 1; s++) {
        int send_c = mod(r - s, n), recv_c = mod(r - s - 1, n);
        size_t send_lo = ring_chunk_begin(count, n, send_c), send_hi = ring_chunk_begin(count, n, send_c + 1);
        size_t recv_lo = ring_chunk_begin(count, n, recv_c), recv_hi = ring_chunk_begin(count, n, recv_c + 1);
        comm_sendrecv(g, buf + send_lo, send_hi - send_lo, right, chunk_in, recv_hi - recv_lo, left,
                      RING_TAG);
        ops()->residual_forward(buf + recv_lo, buf + recv_lo, chunk_in, recv_hi - recv_lo);
        fault_point("ring"); /* tests/faults.bats can kill a rank here, mid-ring (util.h) */
    }
    /* Rank r now holds the complete sum of chunk r+1. All-gather: at step s,
     * send chunk r+1-s (complete) and receive chunk r-s in place. */
    for (int s = 0; s < n - 1; s++) {
        int send_c = mod(r + 1 - s, n), recv_c = mod(r - s, n);
        size_t send_lo = ring_chunk_begin(count, n, send_c), send_hi = ring_chunk_begin(count, n, send_c + 1);
        size_t recv_lo = ring_chunk_begin(count, n, recv_c), recv_hi = ring_chunk_begin(count, n, recv_c + 1);
        comm_sendrecv(g, buf + send_lo, send_hi - send_lo, right, buf + recv_lo, recv_hi - recv_lo, left,
                      RING_TAG);
    }
    /* EXERCISE 02.1 END */
    if (op == COMM_AVG) ops()->scale(buf, count, 1.0f / n);
}
