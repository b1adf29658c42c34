/* test_overlap.c: does a host<->device copy on the copy stream run while
 * kernels run on the compute stream? A probe for a GPU.
 *
 *   build/tests/test_overlap [--min-overlap R]      (R in [0, 1], default 0.5)
 *
 * Four timings of the same work, each the best of three:
 *   kernel_ms : matmuls (cuBLAS) on the compute stream, alone;
 *   copy_ms   : a pinned host buffer to the device and another back, on the
 *               copy stream, alone;
 *   both_ms   : both queued at once, each on its own stream;
 *   serial_ms : both on the compute stream, one after the other (everything
 *               on one stream, as the course ran before it had streams).
 * The matmuls are repeated until they take about as long as the copies, so
 * that either can hide the other. The overlap is the share of the shorter
 * one that disappears when both run at once:
 *   overlap = (kernel_ms + copy_ms - both_ms) / min(kernel_ms, copy_ms)
 * 1 when it hides entirely behind the longer one, 0 when they take turns.
 * Copies use the GPU's copy engines and kernels its SMs, so they should
 * overlap almost fully; both take memory bandwidth, so not always entirely.
 * Exit 0 when the overlap reaches R, 1 when not, 2 for bad arguments, 77
 * without a GPU (tests/library/parity.bats then skips). */
#include "common/device/device.h" /* mem_alloc, copies, streams, timers */
#include "common/kernels/kernels.h" /* ops(): the kernel table */
#include "common/core/util.h" /* fatal, log_info, exit codes, flag parsing */

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define EXIT_SKIP 77

#define MATMUL_N 4096                  /* (N,N) @ (N,N)^T: 137 GFLOP a matmul */
#define COPY_BYTES ((size_t)256 << 20) /* each way */

typedef struct {
    float *a, *b, *out;         /* the matmul's operands, device */
    int reps;                   /* matmuls per timing */
    float *host_up, *host_down; /* pinned */
    float *dev_up, *dev_down;   /* device, apart from the matmul's */
} Probe;

static void queue_matmuls(const Probe *p) {
    for (int i = 0; i < p->reps; i++)
        ops()->linear_forward(p->out, p->a, p->b, NULL, MATMUL_N, MATMUL_N, MATMUL_N);
}

static void queue_copies(const Probe *p, DeviceStream *stream) {
    copy_to_device_async(p->dev_up, p->host_up, COPY_BYTES, stream);
    copy_to_host_async(p->host_down, p->dev_down, COPY_BYTES, stream);
}

enum { KERNEL, COPY, BOTH, SERIAL };

/* Wall-clock ms from an idle device to the end of what `what` queues. */
static double time_once(const Probe *p, int what) {
    device_sync();
    double start = wall_ms();
    if (what != COPY) queue_matmuls(p);
    if (what == COPY || what == BOTH) queue_copies(p, device_stream(STREAM_COPY));
    if (what == SERIAL) queue_copies(p, device_stream(STREAM_COMPUTE));
    device_sync();
    return wall_ms() - start;
}

static double time_best(const Probe *p, int what) {
    double best = time_once(p, what);
    for (int i = 0; i < 2; i++) {
        double t = time_once(p, what);
        if (t < best) best = t;
    }
    return best;
}

int main(int argc, char **argv) {
    double min_overlap = 0.5;
    if (argc == 3 && strcmp(argv[1], "--min-overlap") == 0) {
        char *end;
        min_overlap = strtod(argv[2], &end);
        if (*end || min_overlap < 0.0 || min_overlap > 1.0) argc = 0;
    }
    if (argc != 1 && argc != 3) {
        fprintf(stderr, "usage: test_overlap [--min-overlap R]   (R in [0, 1])\n");
        return EXIT_USAGE;
    }
    if (!device_cuda_available()) {
        printf("SKIP: no usable GPU (none visible, or a build without CUDA)\n");
        return EXIT_SKIP;
    }
    device_init("cuda", 0);
    size_t matrix_bytes = (size_t)MATMUL_N * MATMUL_N * sizeof(float);
    Probe p = {
        .a = mem_alloc(SPACE_DEVICE, CAT_WORKSPACE, matrix_bytes, "probe: matmul input"),
        .b = mem_alloc(SPACE_DEVICE, CAT_WORKSPACE, matrix_bytes, "probe: matmul weight"),
        .out = mem_alloc(SPACE_DEVICE, CAT_WORKSPACE, matrix_bytes, "probe: matmul output"),
        .reps = 1,
        .host_up = mem_alloc_pinned(CAT_WORKSPACE, COPY_BYTES, "probe: pinned source"),
        .host_down = mem_alloc_pinned(CAT_WORKSPACE, COPY_BYTES, "probe: pinned destination"),
        .dev_up = mem_alloc(SPACE_DEVICE, CAT_WORKSPACE, COPY_BYTES, "probe: copy target"),
        .dev_down = mem_alloc(SPACE_DEVICE, CAT_WORKSPACE, COPY_BYTES, "probe: copy source"),
    };
    printf("device: %s\n", device_name());

    /* Warm up (cuBLAS picks its kernels, the copy engines wake), then make
     * the matmuls take about as long as the copies. */
    time_once(&p, BOTH);
    double copy_ms = time_best(&p, COPY), one_matmul_ms = time_best(&p, KERNEL);
    p.reps = (int)(copy_ms / (one_matmul_ms > 1e-3 ? one_matmul_ms : 1e-3) + 0.5);
    if (p.reps < 1) p.reps = 1;
    if (p.reps > 1000) p.reps = 1000;

    double kernel_ms = time_best(&p, KERNEL), both_ms = time_best(&p, BOTH),
           serial_ms = time_best(&p, SERIAL);
    double shorter = kernel_ms < copy_ms ? kernel_ms : copy_ms;
    double overlap = (kernel_ms + copy_ms - both_ms) / shorter;
    printf("matmuls  copy_MiB  kernel_ms  copy_ms  both_ms  serial_ms  overlap\n");
    printf("%7d  %8zu  %9.3f  %7.3f  %7.3f  %9.3f  %7.3f\n", p.reps, 2 * (COPY_BYTES >> 20), kernel_ms,
           copy_ms, both_ms, serial_ms, overlap);
    int ok = overlap >= min_overlap;
    printf("%s: a copy on the copy stream %s a matmul on the compute stream (overlap %.2f, needed %.2f)\n",
           ok ? "PASS" : "FAIL", ok ? "overlaps" : "does not overlap", overlap, min_overlap);

    mem_free(p.a);
    mem_free(p.b);
    mem_free(p.out);
    mem_free(p.host_up);
    mem_free(p.host_down);
    mem_free(p.dev_up);
    mem_free(p.dev_down);
    device_shutdown();
    return ok ? 0 : 1;
}
