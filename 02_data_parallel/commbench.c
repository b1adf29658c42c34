/* commbench.c: how fast are the collectives? (chapter 02)
 *
 *   mpirun -np N 02_data_parallel/commbench [--min-bytes 1K] [--max-bytes 256M] [--out FILE]
 *
 * For each operation and message size: the median time over several
 * iterations, and the two bandwidths nccl-tests reports.
 *   size_bytes  the whole buffer (for reduce-scatter: the input of every rank,
 *               for all-gather: the output, for all-to-all: each rank's send; as in nccl-tests)
 *   count       floats in that buffer
 *   time_us     median over iterations, each started together (barrier)
 *   algbw_GBps  size_bytes / time
 *   busbw_GBps  algbw * factor, the bytes each rank's link really carries:
 *                 all-reduce (library and ring)   2(n-1)/n
 *                 reduce-scatter, all-gather       (n-1)/n
 *                 all-to-all                       (n-1)/n (every block but its own leaves a rank)
 *               busbw is comparable across ranks counts and with the
 *               hardware's link speed; algbw is not. */
#include "common/run/agreement.h" /* ranks_agree on the command line */
#include "common/comm/comm.h" /* collectives and messages between ranks */
#include "common/run/config.h" /* Config and the flag tables */
#include "common/run/run_dir.h" /* the --out directory and its files */
#include "common/device/device.h" /* mem_alloc, copies, streams, timers */
#include "common/kernels/kernels.h" /* ops(): the kernel table */
#include "02_data_parallel/ring.h" /* 02: the ring all-reduce */
#include "common/core/util.h" /* fatal, log_info, exit codes, flag parsing */

#include <getopt.h>
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef enum { OP_ALLREDUCE, OP_RING, OP_REDUCE_SCATTER, OP_ALLGATHER, OP_ALLTOALL, OP_COUNT } Op;
static const char *op_names[OP_COUNT] = {"allreduce", "ring_allreduce", "reduce_scatter", "allgather", "alltoall"};

static double bus_factor(Op op, int n) {
    return op == OP_ALLREDUCE || op == OP_RING ? 2.0 * (n - 1) / n : (double)(n - 1) / n;
}

static void run_op(Op op, CommGroup *g, float *a, float *b, size_t count) {
    int n = comm_size(g);
    switch (op) {
    case OP_ALLREDUCE:
        comm_allreduce(g, a, count, COMM_SUM);
        break;
    case OP_RING:
        ring_allreduce(g, a, count, COMM_SUM);
        break;
    case OP_REDUCE_SCATTER:
        comm_reduce_scatter(g, a, b, count / n, COMM_SUM);
        break;
    case OP_ALLGATHER:
        comm_allgather(g, b, a, count / n);
        break;
    case OP_ALLTOALL: /* a's n blocks to the n ranks, into b (as large as a) */
        comm_alltoall_typed(g, a, b, count / n, COMM_F32, NULL);
        break;
    default:
        break;
    }
}

static int compare(const void *x, const void *y) {
    double a = *(const double *)x, b = *(const double *)y;
    return (a > b) - (a < b);
}

/* --out FILE: a new name or an earlier table of commbench's, known by its header (util.h's
 * output-file rule). */
#define COMMBENCH_HEADER "op,ranks,transport,size_bytes,count,time_us,algbw_GBps,busbw_GBps"
static const OutputKind commbench_output = {.what = "a table of commbench (header " COMMBENCH_HEADER ")",
                                            .earlier = "table of commbench",
                                            .signature = COMMBENCH_HEADER "\n",
                                            .signature_bytes = sizeof COMMBENCH_HEADER};

int main(int argc, char **argv) {
    comm_init(&argc, &argv);
    CommGroup *world = comm_world();
    int n = comm_size(world), rank = comm_rank(world);
    size_t min_bytes = 1024, max_bytes = 256u << 20;
    int factor = 4;
    char device[8] = "auto", transport[8] = "auto", out[PATH_BYTES] = "";
    static const struct option options[] = {
        {"min-bytes", required_argument, 0, 'a'},
        {"max-bytes", required_argument, 0, 'b'},
        {"step-factor", required_argument, 0, 'f'},
        {"device", required_argument, 0, 'd'},
        {"comm", required_argument, 0, 'c'},
        {"out", required_argument, 0, 'o'},
        {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0},
    };
    /* Every rank reads its flags; the ranks then agree (ranks_agree, agreement.h): a bad
     * flag is printed once, and ranks given different flags never start. */
    opterr = 0;
    int opt, help = 0;
    UsageTrap trap;
    usage_trap_arm(&trap);
    if (setjmp(trap.where) == 0) {
        while ((opt = getopt_long(argc, argv, ":", options, NULL)) != -1) {
            switch (opt) {
            case 'a':
            case 'b':
                if (parse_bytes(optarg, opt == 'a' ? &min_bytes : &max_bytes) != 0)
                    fatal(EXIT_USAGE, "%s: '%s' is not a size (valid: 4 bytes to 8G, e.g. 1K, 64M)",
                          opt == 'a' ? "--min-bytes" : "--max-bytes", optarg);
                break;
            case 'f':
                factor = parse_int_flag("--step-factor", optarg, 2, 16);
                break;
            case 'd':
                parse_choice_flag("--device", "device", optarg, "auto|cpu|cuda", device, sizeof device);
                break;
            case 'c':
                parse_choice_flag("--comm", "transport", optarg, "auto|nccl|mpi", transport,
                                  sizeof transport);
                break;
            case 'o':
                snprintf(out, sizeof out, "%s", optarg);
                break;
            case 'h':
                help = 1;
                break;
            default: /* ':' or '?' */
                getopt_refuse(opt, argv);
            }
        }
        getopt_no_operands(argc, argv);
        if (rank == 0 && out[0]) output_file_check("--out", out, &commbench_output); /* the writer */
        if (min_bytes < 4 || min_bytes > max_bytes || max_bytes > ((size_t)1 << 33))
            fatal(EXIT_USAGE, "--min-bytes %zu / --max-bytes %zu: need 4 <= min <= max <= 8G", min_bytes,
                  max_bytes);
    }
    usage_trap_disarm();
    ConfigRecord record = {0};
    config_record_add(&record, "--min-bytes", "%zu", min_bytes);
    config_record_add(&record, "--max-bytes", "%zu", max_bytes);
    config_record_add(&record, "--step-factor", "%d", factor);
    config_record_add(&record, "--device", "%s", device);
    config_record_add(&record, "--comm", "%s", transport);
    config_record_add(&record, "--out", "%s", out);
    record.flag_items = record.count;
    if (ranks_agree(trap.message[0] ? 2 : help, trap.message, &record)) {
        log_info("usage: mpirun -np N 02_data_parallel/commbench [flags]\n"
                 "  --min-bytes SIZE    smallest message (default 1K)\n"
                 "  --max-bytes SIZE    largest message (default 256M)\n"
                 "  --step-factor F     multiply the size by F each time, 2..16 (default 4)\n"
                 "  --device auto|cpu|cuda, --comm auto|nccl|mpi   as for train\n"
                 "  --out FILE          also write the table as CSV (a new name or an earlier table of\n"
                 "                      commbench, never another file)\n");
        comm_finalize();
        return 0;
    }
    device_init(device, comm_local_rank());
    comm_select(transport);

    /* buffers for the largest message, a multiple of n floats */
    size_t max_count = (max_bytes / sizeof(float) + n - 1) / n * n;
    float *a = mem_alloc(SPACE_DEVICE, CAT_COMM, max_count * sizeof(float), "benchmark buffer");
    float *b = mem_alloc(SPACE_DEVICE, CAT_COMM, max_count * sizeof(float), "benchmark buffer");
    OutFile *csv = NULL;
    if (rank == 0 && out[0]) {
        char dir[PATH_BYTES];
        snprintf(dir, sizeof dir, "%s", out);
        char *slash = strrchr(dir, '/');
        const char *name = slash ? slash + 1 : out;
        if (slash) *slash = '\0';
        csv = out_open(slash ? (dir[0] ? dir : "/") : ".", name, OUT_WHOLE,
                       0); /* written whole, or not at all */
        out_printf(csv, COMMBENCH_HEADER "\n");
    }
    log_info("commbench | %d ranks | device %s | comm %s\n", n, device_name(), comm_transport_name());
    log_info("%-15s %12s %11s %11s %11s %11s\n", "op", "size_bytes", "count", "time_us", "algbw_GBps",
             "busbw_GBps");
    for (int op = 0; op < OP_COUNT; op++) {
        for (size_t bytes = min_bytes; bytes <= max_bytes; bytes *= factor) {
            size_t count = (bytes / sizeof(float) + n - 1) / n * n; /* divisible by n for the block ops */
            /* enough iterations for a stable median, fewer for the big ones */
            int iters = bytes <= (1u << 20) ? 20 : bytes <= (16u << 20) ? 8 : 3;
            double times[20];
            run_op((Op)op, world, a, b, count); /* warm-up */
            for (int it = 0; it < iters; it++) {
                comm_barrier(world);
                double start = wall_ms();
                run_op((Op)op, world, a, b, count);
                device_sync();
                times[it] = comm_allreduce_double(world, wall_ms() - start, 1); /* the slowest rank */
            }
            qsort(times, iters, sizeof(double), compare);
            double t_us = times[iters / 2] * 1e3, size = (double)count * sizeof(float);
            double algbw = size / (t_us * 1e-6) / 1e9, busbw = algbw * bus_factor((Op)op, n);
            log_info("%-15s %12.0f %11zu %11.1f %11.3f %11.3f\n", op_names[op], size, count, t_us, algbw,
                     busbw);
            if (csv)
                out_printf(csv, "%s,%d,%s,%.0f,%zu,%.2f,%.6g,%.6g\n", op_names[op], n, comm_transport_name(),
                           size, count, t_us, algbw, busbw);
            /* keep the values bounded: repeated sums of the same buffer would overflow */
            ops()->fill_zero(a, max_count);
        }
    }
    if (csv) out_close(csv);
    mem_free(a);
    mem_free(b);
    device_shutdown();
    comm_finalize();
    return 0;
}
