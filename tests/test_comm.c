/* test_comm.c: the collectives of common/comm/comm.c and the ring all-reduce of
 * 02_data_parallel/ring.c, checked against values computed by formula; the bucketed
 * collective of 02_data_parallel/bucketed.c, checked against the plain collectives.
 *
 * Run under mpirun with any number of ranks. Each rank fills element i with
 * a small integer depending on (rank, i), so every sum is exact in float and
 * the expected result is known without any communication (and does not
 * depend on the order of the additions).
 * Usage: test_comm [ring|allreduce|reduce_scatter|allgather|broadcast|sendrecv|split|bucketed|alltoall]
 *        test_comm 16bit    (bf16 and fp16 all-reduce, average, all-gather, reduce-scatter)
 * Exit 0 when every check passes on every rank. */
#include "03_model_parallel/alltoall.h" /* 03: the pairwise all-to-all */
#include "02_data_parallel/bucketed.h" /* 02: a collective run bucket by bucket */
#include "common/comm/comm.h" /* collectives and messages between ranks */
#include "common/core/half.h" /* bf16 and fp16 conversions */
#include "common/device/device.h" /* mem_alloc, copies, streams, timers */
#include "02_data_parallel/ring.h" /* 02: the ring all-reduce */
#include "common/core/util.h" /* fatal, log_info, exit codes, flag parsing */

#include <math.h>
#include <omp.h>
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
    comm_group_free(half);
}

/* ---- the bucketed collective against the plain ones ----
 * Lengths that are multiples of neither the bucket size nor the rank count,
 * so that the last bucket is short and padded; buckets marked last first,
 * as a backward pass marks them; two rounds on one BucketedCollective. */

static const size_t data_counts[] = {1, 7, 1000, 4099};
static const size_t bucket_sizes[] = {1, 5, 96, 100, 5000};
#define NUM_DATA (sizeof data_counts / sizeof data_counts[0])
#define NUM_BUCKET_SIZES (sizeof bucket_sizes / sizeof bucket_sizes[0])

/* Every element of got equals want's (exact: the values are small integers). */
static void expect_equal(const float *got, const float *want, size_t n, const char *what, size_t count) {
    for (size_t i = 0; i < n; i++)
        if (got[i] != want[i]) {
            expect(0, what, count, i, got[i], want[i]);
            return;
        }
}

/* value(rank, i) + round for the data, zeros for the padding. */
static void fill(float *buf, size_t count, size_t padded, int rank, int round) {
    for (size_t i = 0; i < padded; i++) buf[i] = i < count ? value(rank, i) + (float)round : 0.0f;
}

/* One bucketed collective over buffers laid out by bucketed_cut, and the
 * reference the plain collectives give (want: as long as its output). */
typedef struct {
    BucketRange *ranges;
    int buckets;
    size_t padded, shard_count;
    float *full, *shard, *want;
    BucketedCollective *bc;
} BucketedCase;

static BucketedCase case_create(const BucketedSpec *spec, size_t count, size_t bucket) {
    CommGroup *w = comm_world();
    int n = comm_size(w);
    BucketedCase c;
    c.buckets = bucketed_cut(count, bucket, spec->op == BUCKETED_ALLREDUCE ? 1 : n, &c.ranges, &c.padded);
    c.shard_count = c.padded / n;
    c.full = xcalloc(c.padded, sizeof(float));
    c.shard = xcalloc(c.shard_count + 1, sizeof(float));
    c.want = xcalloc(spec->op == BUCKETED_REDUCE_SCATTER ? c.shard_count + 1 : c.padded, sizeof(float));
    c.bc = bucketed_create(w, spec, c.ranges, c.buckets, c.full,
                           spec->op == BUCKETED_ALLREDUCE ? NULL : c.shard);
    return c;
}

static void case_destroy(BucketedCase *c) {
    bucketed_destroy(c->bc);
    free(c->ranges);
    free(c->full);
    free(c->shard);
    free(c->want);
}

/* Rounds 0 and 1 of each operation, checked against the plain collectives
 * (bucket by bucket for reduce-scatter and all-gather, whose slices are per
 * bucket; once over the whole buffer for the all-reduce). */
static void check_bucketed_op(const BucketedSpec *spec, const char *name, size_t count, size_t bucket) {
    CommGroup *w = comm_world();
    int n = comm_size(w), r = comm_rank(w);
    BucketedCase c = case_create(spec, count, bucket);
    for (int round = 0; round < 2; round++) {
        if (spec->op == BUCKETED_ALLGATHER) {
            fill(c.shard, c.shard_count, c.shard_count, r, round);
            for (size_t i = 0; i < c.padded; i++) c.full[i] = -1.0f; /* every element must be written */
        } else {
            fill(c.full, count, c.padded, r, round);
        }
        if (spec->op == BUCKETED_ALLREDUCE) {
            fill(c.want, count, c.padded, r, round);
            comm_allreduce(w, c.want, c.padded, spec->reduce);
        }
        bucketed_begin(c.bc);
        for (int b = c.buckets - 1; b >= 0; b--) bucketed_ready(c.bc, b); /* last first, as backward */
        for (int b = 0; b < c.buckets; b += 2) bucketed_wait(c.bc, b);    /* some one by one */
        bucketed_wait_all(c.bc);
        for (int b = 0; b < c.buckets && spec->op != BUCKETED_ALLREDUCE; b++) {
            size_t lo = c.ranges[b].lo, slice = (c.ranges[b].hi - lo) / n;
            if (spec->op == BUCKETED_REDUCE_SCATTER)
                comm_reduce_scatter(w, c.full + lo, c.want + lo / n, slice, COMM_SUM);
            else
                comm_allgather(w, c.shard + lo / n, c.want + lo, slice);
        }
        char what[96];
        snprintf(what, sizeof what, "bucketed %s (buckets of %zu, round %d)", name, bucket, round);
        float *got = spec->op == BUCKETED_REDUCE_SCATTER ? c.shard : c.full;
        expect_equal(got, c.want, spec->op == BUCKETED_REDUCE_SCATTER ? c.shard_count : c.padded, what,
                     count);
    }
    case_destroy(&c);
}

static void check_bucketed(void) {
    for (size_t c = 0; c < NUM_DATA; c++)
        for (size_t s = 0; s < NUM_BUCKET_SIZES; s++) {
            size_t count = data_counts[c], bucket = bucket_sizes[s];
            const BucketedSpec sum = {BUCKETED_ALLREDUCE, COMM_F32, COMM_SUM, NULL},
                               avg = {BUCKETED_ALLREDUCE, COMM_F32, COMM_AVG, NULL},
                               ring = {BUCKETED_ALLREDUCE, COMM_F32, COMM_SUM, ring_allreduce_typed},
                               scatter = {BUCKETED_REDUCE_SCATTER, COMM_F32, COMM_SUM, NULL},
                               gather = {BUCKETED_ALLGATHER, COMM_F32, COMM_SUM, NULL};
            check_bucketed_op(&sum, "all-reduce", count, bucket);
            check_bucketed_op(&avg, "all-reduce (avg)", count, bucket);
            check_bucketed_op(&ring, "ring all-reduce", count, bucket);
            check_bucketed_op(&scatter, "reduce-scatter", count, bucket);
            check_bucketed_op(&gather, "all-gather", count, bucket);
        }
}

/* 16-bit collectives (mixed precision): rank r contributes r + 1 + i/4 at
 * element i, values whose sums bf16 and fp16 hold exactly, so every
 * reduction order gives the same bits; an average rounds (sum / n) once; the
 * bytes counted are 2 per element. */
/* The all-to-all, the library's and the course's pairwise one, in every type:
 * element i of the block rank r sends to rank j is a small integer of (r, j, i),
 * exact in 16 bits, so rank j's block q must hold (q, j, i); each rank counts
 * (size - 1) blocks sent, under all-to-all for the library and send for the pairs. */
static float block_value(int from, int to, size_t i) {
    return (float)(from * 7 + to * 3 + (int)(i % 5));
}

static void check_alltoall(CommDtype dtype) {
    CommGroup *w = comm_world();
    int n = comm_size(w), r = comm_rank(w);
    const size_t count = 37; /* odd: 16-bit blocks end at 2-byte boundaries */
    size_t size = comm_dtype_bytes(dtype), total = (size_t)n * count;
    HalfFormat format = dtype == COMM_BF16 ? HALF_BF16 : HALF_F16;
    char *host = xcalloc(total, size), *got = xcalloc(total, size);
    for (int j = 0; j < n; j++)
        for (size_t i = 0; i < count; i++) {
            float v = block_value(r, j, i);
            size_t at = (size_t)j * count + i;
            if (dtype == COMM_F32)
                ((float *)host)[at] = v;
            else
                ((uint16_t *)host)[at] = half_from_float(v, format);
        }
    void *send = mem_alloc(SPACE_DEVICE, CAT_COMM, total * size, "test send"),
         *recv = mem_alloc(SPACE_DEVICE, CAT_COMM, total * size, "test recv");
    copy_to_device(send, host, total * size);
    for (int pairwise = 0; pairwise <= 1; pairwise++) {
        CommLedger before, after;
        comm_ledger(&before);
        if (pairwise)
            pairwise_alltoall_typed(w, send, recv, count, dtype);
        else
            comm_alltoall_typed(w, send, recv, count, dtype, NULL);
        comm_ledger(&after);
        copy_to_host(got, recv, total * size);
        for (int q = 0; q < n; q++)
            for (size_t i = 0; i < count; i++) {
                size_t at = (size_t)q * count + i;
                float v = dtype == COMM_F32 ? ((float *)got)[at] : half_to_float(((uint16_t *)got)[at], format);
                if (v != block_value(q, r, i)) {
                    printf("FAIL %s %s all-to-all [rank %d]: block %d element %zu is %g, expected %g\n",
                           comm_dtype_name(dtype), pairwise ? "pairwise" : "library", r, q, i, v,
                           block_value(q, r, i));
                    failures++;
                    q = n;
                    break;
                }
            }
        CommKind kind = pairwise ? COMM_KIND_SEND : COMM_KIND_ALLTOALL;
        double sent = after.bytes[kind][COMM_COUNTERS] - before.bytes[kind][COMM_COUNTERS];
        if (sent != (double)(n - 1) * count * size) {
            printf("FAIL %s %s all-to-all counted %g bytes, expected %g\n", comm_dtype_name(dtype),
                   pairwise ? "pairwise" : "library", sent, (double)(n - 1) * count * size);
            failures++;
        }
    }
    mem_free(send);
    mem_free(recv);
    free(host);
    free(got);
}

static void check_16bit(CommDtype dtype) {
    CommGroup *w = comm_world();
    int n = comm_size(w), r = comm_rank(w);
    HalfFormat format = dtype == COMM_BF16 ? HALF_BF16 : HALF_F16;
    enum { COUNT = 37 };
    uint16_t buf[COUNT], avg[COUNT], gathered[COUNT * 8], mine[COUNT], part[COUNT];
    for (int i = 0; i < COUNT; i++)
        buf[i] = avg[i] = mine[i] = half_from_float(r + 1 + (i % 8) / 4.0f, format);
    double before = comm_bytes_sent();
    comm_allreduce_typed(w, buf, COUNT, dtype, COMM_SUM, NULL);
    double sent = comm_bytes_sent() - before;
    comm_allreduce_typed(w, avg, COUNT, dtype, COMM_AVG, NULL);
    for (int i = 0; i < COUNT; i++) {
        float want = n * (n + 1) / 2.0f + n * ((i % 8) / 4.0f);
        if (half_to_float(buf[i], format) != want) {
            printf("FAIL %s all-reduce [%d]: %g, expected %g\n", comm_dtype_name(dtype), i,
                   half_to_float(buf[i], format), want);
            failures++;
        }
        if (avg[i] != half_from_float(want / n, format)) {
            printf("FAIL %s average [%d]\n", comm_dtype_name(dtype), i);
            failures++;
        }
    }
    if (n > 1 && fabs(sent - 2.0 * (n - 1) / n * COUNT * 2) > 1e-6) {
        printf("FAIL %s all-reduce counted %g bytes\n", comm_dtype_name(dtype), sent);
        failures++;
    }
    /* the course's ring in 16 bits: the same bits as the library's, and half
     * the bytes of the same ring on floats */
    uint16_t ring_sum[COUNT], ring_avg[COUNT];
    float floats[COUNT];
    for (int i = 0; i < COUNT; i++) {
        ring_sum[i] = ring_avg[i] = mine[i];
        floats[i] = half_to_float(mine[i], format);
    }
    before = comm_bytes_sent();
    ring_allreduce_typed(w, ring_sum, COUNT, dtype, COMM_SUM);
    double ring_sent = comm_bytes_sent() - before;
    before = comm_bytes_sent();
    ring_allreduce(w, floats, COUNT, COMM_SUM);
    double ring_sent_f32 = comm_bytes_sent() - before;
    ring_allreduce_typed(w, ring_avg, COUNT, dtype, COMM_AVG);
    for (int i = 0; i < COUNT; i++)
        if (ring_sum[i] != buf[i] || ring_avg[i] != avg[i]) {
            printf("FAIL %s ring all-reduce [%d]: sum %g, average %g, expected %g and %g\n",
                   comm_dtype_name(dtype), i, half_to_float(ring_sum[i], format),
                   half_to_float(ring_avg[i], format), half_to_float(buf[i], format),
                   half_to_float(avg[i], format));
            failures++;
            break;
        }
    if (n > 1 && ring_sent * 2 != ring_sent_f32) {
        printf("FAIL %s ring all-reduce counted %g bytes, fp32 %g\n", comm_dtype_name(dtype), ring_sent,
               ring_sent_f32);
        failures++;
    }
    /* the widened chunk of the ring's scratch is read as floats: on a GPU a
     * float at a 2-byte boundary faults (odd chunks of 16-bit elements) */
    for (size_t chunk = 1; chunk <= 9; chunk++) {
        size_t widened_at, bytes = ring_scratch_bytes(chunk, dtype, &widened_at);
        if (widened_at % 16 || widened_at < chunk * 2 || bytes < widened_at + chunk * sizeof(float)) {
            printf("FAIL %s ring scratch for %zu elements: widened at byte %zu of %zu\n", comm_dtype_name(dtype),
                   chunk, widened_at, bytes);
            failures++;
        }
    }
    if (n <= 8) {
        comm_allgather_typed(w, mine, gathered, COUNT, dtype, NULL);
        for (int q = 0; q < n; q++)
            if (half_to_float(gathered[q * COUNT], format) != q + 1) {
                printf("FAIL %s all-gather from rank %d\n", comm_dtype_name(dtype), q);
                failures++;
            }
        uint16_t *send = xcalloc((size_t)n * COUNT, sizeof(uint16_t));
        for (int i = 0; i < n * COUNT; i++) send[i] = half_from_float(1.0f + (i / COUNT), format);
        comm_reduce_scatter_typed(w, send, part, COUNT, dtype, COMM_SUM, NULL);
        if (half_to_float(part[0], format) != (float)n * (1 + r)) {
            printf("FAIL %s reduce-scatter on rank %d\n", comm_dtype_name(dtype), r);
            failures++;
        }
        free(send);
    }
}

int main(int argc, char **argv) {
    comm_init(&argc, &argv);
    device_init("cpu", 0);
    comm_select("mpi");
    const char *only = argc > 1 ? argv[1] : NULL;
    if (only && !strcmp(only, "threads")) { /* comm.h, "Cores": what comm_init chose */
        const char *yield = getenv("OMPI_MCA_mpi_yield_when_idle");
        printf("rank %d: %d OpenMP threads, mpi_yield_when_idle %s\n", comm_rank(comm_world()),
               omp_get_max_threads(), yield ? yield : "unset");
        comm_finalize();
        return 0;
    }
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
    if (!only || !strcmp(only, "bucketed")) check_bucketed();
    if (!only || !strcmp(only, "alltoall")) {
        check_alltoall(COMM_F32);
        check_alltoall(COMM_BF16);
        check_alltoall(COMM_F16);
    }
    if (!only || !strcmp(only, "16bit")) {
        check_16bit(COMM_BF16);
        check_16bit(COMM_F16);
    }
    double total = comm_allreduce_double(comm_world(), failures, 0);
    if (comm_rank(comm_world()) == 0)
        printf("%s: %d ranks, %.0f failures\n", total == 0 ? "PASS" : "FAIL", comm_size(comm_world()), total);
    comm_finalize();
    return total == 0 ? 0 : 1;
}
