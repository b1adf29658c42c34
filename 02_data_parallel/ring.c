/* ring.c: the ring all-reduce (see ring.h), over comm_sendrecv_typed. */
#include "02_data_parallel/ring.h" /* 02: the ring all-reduce */

#include "common/device/device.h" /* mem_alloc, copies, streams, timers */
#include "common/kernels/kernels.h" /* ops(): the kernel table */
#include "common/core/util.h" /* fatal, log_info, exit codes, flag parsing */

#define RING_TAG 7001

/* One chunk arriving from the left, in the buffer's type, then (16-bit
 * types) room for it widened to fp32 (ring_scratch_bytes): device,
 * CAT_COMM, grown on demand. */
static char *incoming = NULL;
static size_t incoming_bytes = 0;

static char *incoming_buffer(size_t bytes) {
    if (bytes > incoming_bytes) {
        mem_free(incoming);
        incoming = mem_alloc(SPACE_DEVICE, CAT_COMM, bytes, "ring all-reduce chunk");
        incoming_bytes = bytes;
    }
    return incoming;
}

size_t ring_chunk_begin(size_t count, int n, int c) {
    /* balanced: chunk sizes differ by at most one element */
    return count / n * c + (count % n < (size_t)c ? count % n : (size_t)c);
}

size_t ring_scratch_bytes(size_t chunk, CommDtype type, size_t *widened_at) {
    size_t arriving = chunk * comm_dtype_bytes(type);
    *widened_at = (arriving + 15) / 16 * 16;
    return type == COMM_F32 ? arriving : *widened_at + chunk * sizeof(float);
}

static int mod(int a, int n) {
    return ((a % n) + n) % n;
}

/* Element i of a buffer of `type`. */
static char *element(void *buf, size_t i, CommDtype type) {
    return (char *)buf + i * comm_dtype_bytes(type);
}

static HalfFormat half_format(CommDtype type) {
    return type == COMM_BF16 ? HALF_BF16 : HALF_F16;
}

/* chunk(n) += arriving(n), in fp32: fp32 adds directly; a 16-bit chunk
 * widens the arriving values to fp32 (into `widened`, exact) and each sum is
 * rounded once to the storage type as it is written back. */
static void add_chunk(void *chunk, const void *arriving, float *widened, size_t n, CommDtype type) {
    if (type == COMM_F32) {
        ops()->residual_forward(chunk, chunk, arriving, n);
        return;
    }
    ops()->cast_from_half(widened, arriving, n, half_format(type));
    ops()->accumulate_half(chunk, widened, n, half_format(type));
}

void ring_allreduce_typed(CommGroup *g, void *buf, size_t count, CommDtype type, ReduceOp op) {
    int n = comm_size(g), r = comm_rank(g);
    if (n == 1 || count == 0) return;
    int right = mod(r + 1, n), left = mod(r - 1, n);
    size_t chunk = count / n + 1, widened_at;
    char *chunk_in = incoming_buffer(ring_scratch_bytes(chunk, type, &widened_at));
    float *widened = (float *)(chunk_in + widened_at); /* 16-bit: the arriving chunk in fp32 */
    /* EXERCISE 02.1 BEGIN: the ring all-reduce (course.md, exercise 02.1) */
    /* Reduce-scatter. At step s, rank r sends chunk r-s (holding s+1
     * contributions) and adds the arriving chunk r-s-1 into its own copy. */
    for (int s = 0; s < n - 1; s++) {
        int send_c = mod(r - s, n), recv_c = mod(r - s - 1, n);
        size_t send_lo = ring_chunk_begin(count, n, send_c), send_hi = ring_chunk_begin(count, n, send_c + 1);
        size_t recv_lo = ring_chunk_begin(count, n, recv_c), recv_hi = ring_chunk_begin(count, n, recv_c + 1);
        comm_sendrecv_typed(g, element(buf, send_lo, type), send_hi - send_lo, right, chunk_in,
                            recv_hi - recv_lo, left, type, RING_TAG);
        add_chunk(element(buf, recv_lo, type), chunk_in, widened, recv_hi - recv_lo, type);
        fault_point("ring"); /* tests/robustness/faults.bats can kill a rank here, mid-ring (util.h) */
    }
    /* Rank r now holds the complete sum of chunk r+1. All-gather: at step s,
     * send chunk r+1-s (complete) and receive chunk r-s in place. */
    for (int s = 0; s < n - 1; s++) {
        int send_c = mod(r + 1 - s, n), recv_c = mod(r - s, n);
        size_t send_lo = ring_chunk_begin(count, n, send_c), send_hi = ring_chunk_begin(count, n, send_c + 1);
        size_t recv_lo = ring_chunk_begin(count, n, recv_c), recv_hi = ring_chunk_begin(count, n, recv_c + 1);
        comm_sendrecv_typed(g, element(buf, send_lo, type), send_hi - send_lo, right,
                            element(buf, recv_lo, type), recv_hi - recv_lo, left, type, RING_TAG);
    }
    /* EXERCISE 02.1 END */
    if (op != COMM_AVG) return;
    if (type == COMM_F32) {
        ops()->scale(buf, count, 1.0f / n);
        return;
    }
    /* 16-bit: widen, scale and round back, a chunk at a time through `widened` */
    for (size_t lo = 0; lo < count; lo += chunk) {
        size_t len = count - lo < chunk ? count - lo : chunk;
        ops()->cast_from_half(widened, (const uint16_t *)element(buf, lo, type), len, half_format(type));
        ops()->scale(widened, len, 1.0f / n);
        ops()->cast_to_half((uint16_t *)element(buf, lo, type), widened, len, half_format(type));
    }
}

void ring_allreduce(CommGroup *g, float *buf, size_t count, ReduceOp op) {
    ring_allreduce_typed(g, buf, count, COMM_F32, op);
}
