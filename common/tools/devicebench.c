/* devicebench: the device's own rates that common/plan's machine file needs
 * and no other tool of the course measures on a GPU: copies from pinned host
 * memory to the device and back (h2d, d2h), and the kernel table's AdamW on
 * device memory (device_adam). common/scripts/calibrate.sh reads its lines,
 * which are written in the machine file's own words:
 *
 *   h2d_bytes_per_s = 5.2e+10
 *   d2h_bytes_per_s = 5.3e+10
 *   device_adam_params_per_s = 1.1e+11
 *
 * Each is the median of --reps timed runs after one untimed one, the timer
 * waiting for the device (timer_stop_ms). On the CPU backend a copy is a
 * memcpy and the AdamW the CPU kernel's, so the same program checks itself on
 * any machine (tests/tools/plan_time.bats); on a GPU the copies go through the copy
 * engines, as chapter 06's offload copies do. */
#include "common/core/stats.h" /* median */
#include "common/device/device.h" /* mem_alloc, copies, streams, timers */
#include "common/kernels/kernels.h" /* ops(): the kernel table */
#include "common/core/util.h" /* fatal, log_info, exit codes, flag parsing */

#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    char device[8];
    size_t bytes, n;
    int reps;
} Settings;

static void print_help(void) {
    printf("usage: common/devicebench [flags]\n"
           "Times copies from pinned host memory to the device and back, and the kernel table's AdamW\n"
           "on device memory; prints them as common/plan's machine file writes them (calibrate.sh).\n"
           "  --device D     cpu, cuda or auto (default auto: cuda if a GPU is visible)\n"
           "  --bytes N      bytes per copy, 1K..16G, suffixes K M G (default 256M)\n"
           "  --n N          parameters per AdamW update, 1K..1G, suffixes K M G (default 16M: 256 MiB\n"
           "                 of device memory)\n"
           "  --reps R       timed runs of each, 1..1000; the median is printed (default 10)\n"
           "  --help         this text\n");
}

static Settings parse(int argc, char **argv) {
    Settings s = {.device = "auto", .bytes = (size_t)256 << 20, .n = (size_t)16 << 20, .reps = 10};
    static const struct option options[] = {
        {"device", required_argument, 0, 'd'}, {"bytes", required_argument, 0, 'b'},
        {"n", required_argument, 0, 'n'},      {"reps", required_argument, 0, 'r'},
        {"help", no_argument, 0, 'h'},         {0, 0, 0, 0},
    };
    opterr = 0;
    int opt;
    while ((opt = getopt_long(argc, argv, ":", options, NULL)) != -1) {
        switch (opt) {
        case 'h':
            print_help();
            exit(0);
        case 'd':
            parse_choice_flag("--device", "device", optarg, "cpu|cuda|auto", s.device, sizeof s.device);
            break;
        case 'b':
            if (parse_bytes(optarg, &s.bytes) != 0 || s.bytes < 1024 || s.bytes > ((size_t)16 << 30))
                fatal(EXIT_USAGE, "--bytes: '%s' is not a size from 1K to 16G (e.g. 256M)", optarg);
            break;
        case 'n':
            if (parse_bytes(optarg, &s.n) != 0 || s.n < 1024 || s.n > ((size_t)1 << 30))
                fatal(EXIT_USAGE, "--n: '%s' is not a parameter count from 1K to 1G (e.g. 16M)", optarg);
            break;
        case 'r':
            s.reps = (int)parse_int_flag("--reps", optarg, 1, 1000);
            break;
        default: /* ':' or '?' */
            getopt_refuse(opt, argv);
        }
    }
    getopt_no_operands(argc, argv);
    return s;
}

/* What one run of a measurement does; which says which. */
typedef enum { RUN_H2D, RUN_D2H, RUN_ADAMW } Which;

typedef struct {
    void *host, *device;      /* the copies' pinned host buffer and device buffer */
    float *params, *grads, *m, *v; /* the AdamW's state, on the device */
    size_t bytes, n;
} Buffers;

static void run_once(const Buffers *b, Which which, int t) {
    if (which == RUN_H2D)
        copy_to_device(b->device, b->host, b->bytes);
    else if (which == RUN_D2H)
        copy_to_host(b->host, b->device, b->bytes);
    else
        ops()->adamw_update(b->params, b->grads, b->m, b->v, b->n, 1e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 1.0f, t);
}

/* The median seconds of `reps` timed runs, after one untimed. */
static double median_seconds(const Buffers *b, Which which, int reps) {
    double *s = xcalloc((size_t)reps, sizeof(double));
    run_once(b, which, 1);
    for (int r = 0; r < reps; r++) {
        Timer t = {0}; /* device.h: a timer starts zeroed (on CUDA, its events are created on first use) */
        timer_start(&t);
        run_once(b, which, r + 2);
        s[r] = timer_stop_ms(&t) * 1e-3;
    }
    double m = median(s, reps);
    free(s);
    return m;
}

int main(int argc, char **argv) {
    Settings s = parse(argc, argv);
    device_init(s.device, 0);
    Buffers b = {.bytes = s.bytes, .n = s.n};
    b.host = mem_alloc_pinned(CAT_WORKSPACE, s.bytes, "devicebench host copy");
    b.device = mem_alloc(SPACE_DEVICE, CAT_WORKSPACE, s.bytes, "devicebench device copy");
    memset(b.host, 1, s.bytes);
    float **state[] = {&b.params, &b.grads, &b.m, &b.v};
    for (int k = 0; k < 4; k++) {
        *state[k] = mem_alloc(SPACE_DEVICE, CAT_OPTIMIZER, s.n * sizeof(float), "devicebench AdamW state");
        ops()->fill_zero(*state[k], s.n);
    }
    printf("# common/devicebench on %s: copies of %zu bytes from pinned host memory, AdamW of %zu "
           "parameters; medians of %d\n",
           device_name(), s.bytes, s.n, s.reps);
    printf("h2d_bytes_per_s = %.6g\n", s.bytes / median_seconds(&b, RUN_H2D, s.reps));
    printf("d2h_bytes_per_s = %.6g\n", s.bytes / median_seconds(&b, RUN_D2H, s.reps));
    printf("device_adam_params_per_s = %.6g\n", s.n / median_seconds(&b, RUN_ADAMW, s.reps));
    for (int k = 0; k < 4; k++) mem_free(*state[k]);
    mem_free(b.device);
    mem_free(b.host);
    device_shutdown();
    return 0;
}
