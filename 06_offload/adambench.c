/* adambench.c: how fast is the host AdamW of ZeRO-Offload? (chapter 06)
 *
 *   06_offload/adambench [--n 16M] [--threads T] [--reps 10] [--path all] [--half all] [--clock wall]
 *                        [--out DIR]
 *
 * An AdamW update reads and writes memory much more than it computes, so its
 * yardstick is the memory bandwidth of the same machine: this program times
 * a copy (memcpy of the optimizer state's size, split over the same
 * threads) alternately with the update of n parameters on each path
 * (cpu_adam.h), and with the kernel table's adamw_update, the reference.
 * Each time is the median of --reps runs after one warm-up run.
 *
 * Columns of DIR/adambench.csv (one row per kernel, path and write-back; the
 * settings are in every row, so files from several machines concatenate):
 *   kernel            copy, reference (kernels_cpu.c's adamw_update, fp32 only) or cpu_adamw
 *   path              memcpy; scalar, avx2 or avx512 (cpu_adam.h)
 *   half              the 16-bit write-back: none, bf16 or fp16
 *   threads, n, reps  OpenMP threads, parameters per update, timed updates
 *   clock             wall, or cpu (--clock cpu: the process's CPU time / threads)
 *   bytes_per_param   memory traffic per parameter: read master, grad, m, v
 *                     (16) and write master, m, v (12) = 28, +2 with the
 *                     16-bit write-back; for copy, 32 (the 16 bytes of a
 *                     parameter's state read and written)
 *   median_ms         the median time of one update (of one copy)
 *   params_per_s      n / median_ms
 *   GBps              params_per_s x bytes_per_param / 1e9: achieved bandwidth
 *   copy_GBps         the copy's bandwidth, 32 bytes per parameter (16 read, 16
 *                     written) / its median time, timed alternately with
 *                     this row's updates (on a shared machine, load then
 *                     slows both alike)
 *   pct_of_copy       GBps / copy_GBps x 100
 *   x_scalar          params_per_s / that of the scalar path with the same
 *                     write-back (empty for copy and reference)
 *   cpu               the CPU's model name
 *
 * 06_offload/adambench_torch.py times torch.optim.AdamW on the same sizes and
 * threads, when PyTorch is importable, and compares. */
#include "06_offload/cpu_adam.h" /* 06: the host AdamW */
#include "common/run/config.h" /* Config and the flag tables */
#include "common/run/run_dir.h" /* the --out directory and its files */
#include "common/device/device.h" /* mem_alloc, copies, streams, timers */
#include "common/kernels/kernels.h" /* ops(): the kernel table */
#include "common/core/util.h" /* fatal, log_info, exit codes, flag parsing */

#include <errno.h>
#include <getopt.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

typedef struct {
    size_t n;
    char n_text[32]; /* --n as given, for messages */
    int threads, reps;
    int cpu_clock;             /* --clock cpu: process CPU time / threads instead of wall time */
    int paths[CPU_ADAM_PATHS]; /* 1: time this path */
    int halves[3];             /* none, bf16, fp16 */
    char out[PATH_BYTES];
} Settings;

static const char *const half_names[3] = {"none", "bf16", "fp16"};

static void print_help(void) {
    printf("usage: 06_offload/adambench [flags]\n"
           "Times the host AdamW of ZeRO-Offload (06_offload/cpu_adam.c) on each SIMD path against a\n"
           "memcpy of the same machine: parameters/s, GB/s and the fraction of the copy bandwidth.\n"
           "  --n N          parameters per update, 1K..1G, suffixes K M G (default 16M: 256 MiB of state);\n"
           "                 the benchmark holds 50 bytes of host memory per parameter, checked first\n"
           "  --threads T    OpenMP threads, 1..1024 (default: OMP_NUM_THREADS or all cores)\n"
           "  --reps R       timed updates per row, 1..1000; the median is reported (default 10)\n"
           "  --path P       all, or one of scalar, avx2, avx512 (default all those this CPU runs)\n"
           "  --half H       all, or one of none, bf16, fp16: the 16-bit write-back (default all)\n"
           "  --clock C      wall (default), or cpu: the process's CPU time / threads, which on a machine\n"
           "                 shared with other jobs leaves out the time they hold the cores (use\n"
           "                 with OMP_WAIT_POLICY=passive, so that waiting threads do not spin)\n"
           "  --out DIR      also write DIR/adambench.csv (columns: see the top of adambench.c): a new\n"
           "                 name or an earlier adambench.csv, never another file\n"
           "  --help         this text\n");
}

/* --out DIR writes DIR/adambench.csv: DIR is new or a directory, and the file in it a new name or
 * an earlier adambench.csv, known by its header (util.h's output-file rule). */
#define ADAMBENCH_HEADER                                                                                   \
    "kernel,path,half,threads,n,reps,clock,bytes_per_param,median_ms,params_per_s,GBps,copy_GBps,pct_of_" \
    "copy,x_scalar,cpu"
static const OutputKind adambench_output = {.what = "a table of adambench (its header kernel,path,half,...)",
                                            .earlier = "adambench.csv",
                                            .signature = ADAMBENCH_HEADER "\n",
                                            .signature_bytes = sizeof ADAMBENCH_HEADER};

static void check_out(const char *dir) {
    struct stat st;
    if (stat(dir, &st) != 0) return; /* a new directory: created when the table is written */
    if (!S_ISDIR(st.st_mode))
        fatal(EXIT_USAGE, "--out %s: exists and is not a directory (valid: a new or existing directory)", dir);
    char path[JOINED_PATH_BYTES];
    snprintf(path, sizeof path, "%s/adambench.csv", dir);
    output_file_check("--out", path, &adambench_output);
}

static Settings parse(int argc, char **argv) {
    Settings s = {.n = (size_t)1 << 24, .n_text = "16M", .threads = omp_get_max_threads(), .reps = 10};
    for (int k = 0; k < CPU_ADAM_PATHS; k++) s.paths[k] = cpu_adam_path_supported((CpuAdamPath)k);
    for (int h = 0; h < 3; h++) s.halves[h] = 1;
    static const struct option options[] = {
        {"n", required_argument, 0, 'n'},
        {"threads", required_argument, 0, 't'},
        {"reps", required_argument, 0, 'r'},
        {"path", required_argument, 0, 'p'},
        {"half", required_argument, 0, 'f'},
        {"out", required_argument, 0, 'o'},
        {"clock", required_argument, 0, 'c'},
        {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0},
    };
    opterr = 0;
    int opt;
    char choice[16];
    while ((opt = getopt_long(argc, argv, ":", options, NULL)) != -1) {
        switch (opt) {
        case 'n':
            if (parse_bytes(optarg, &s.n) != 0 || s.n < 1024 || s.n > ((size_t)1 << 30))
                fatal(EXIT_USAGE, "--n: '%s' is not a parameter count from 1K to 1G (e.g. 4M)", optarg);
            snprintf(s.n_text, sizeof s.n_text, "%s", optarg);
            break;
        case 't':
            s.threads = (int)parse_int_flag("--threads", optarg, 1, 1024);
            break;
        case 'r':
            s.reps = (int)parse_int_flag("--reps", optarg, 1, 1000);
            break;
        case 'p':
            parse_choice_flag("--path", "path", optarg, "all|scalar|avx2|avx512", choice, sizeof choice);
            if (strcmp(choice, "all") != 0) {
                CpuAdamPath path;
                cpu_adam_path_parse(choice, &path);
                if (!cpu_adam_path_supported(path))
                    fatal(EXIT_USAGE, "--path %s: this CPU cannot run it (see 06_offload/cpu_adam.h)",
                          choice);
                for (int k = 0; k < CPU_ADAM_PATHS; k++) s.paths[k] = k == (int)path;
            }
            break;
        case 'f':
            parse_choice_flag("--half", "write-back", optarg, "all|none|bf16|fp16", choice, sizeof choice);
            for (int h = 0; h < 3; h++)
                s.halves[h] = strcmp(choice, "all") == 0 || strcmp(choice, half_names[h]) == 0;
            break;
        case 'c':
            parse_choice_flag("--clock", "clock", optarg, "wall|cpu", choice, sizeof choice);
            s.cpu_clock = strcmp(choice, "cpu") == 0;
            break;
        case 'o':
            if (!optarg[0]) fatal(EXIT_USAGE, "--out needs a directory");
            snprintf(s.out, sizeof s.out, "%s", optarg);
            break;
        case 'h':
            print_help();
            exit(0);
        default: /* ':' or '?' */
            getopt_refuse(opt, argv);
        }
    }
    getopt_no_operands(argc, argv);
    if (s.out[0]) check_out(s.out);
    return s;
}

/* The CPU's model name, commas removed (it goes into a CSV field). */
static void cpu_model(char *out, size_t size) {
    snprintf(out, size, "unknown");
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f) return;
    char line[512];
    while (fgets(line, sizeof line, f)) {
        char *colon = strchr(line, ':');
        if (strncmp(line, "model name", 10) != 0 || !colon) continue;
        snprintf(out, size, "%s", colon + 2);
        out[strcspn(out, "\n")] = '\0';
        for (char *c = out; *c; c++)
            if (*c == ',') *c = ' ';
        break;
    }
    fclose(f);
}

static int compare_doubles(const void *x, const void *y) {
    double a = *(const double *)x, b = *(const double *)y;
    return (a > b) - (a < b);
}

/* The state of n parameters, each array touched first by the thread that
 * will update it (the same static split of chunks as cpu_adamw), so that on
 * a machine with several memory nodes its pages sit near that thread. */
typedef struct {
    float *master, *grads, *m, *v;
    uint16_t *out16;
    size_t n;
} State;

/* The host memory chapter 06 keeps its optimizer state in (pinned on a GPU
 * machine; on the CPU backend page-aligned and, from 2 MiB up, on huge pages:
 * device.h), so that the update is timed on the pages it runs on in 06. */
static void *alloc_or_die(size_t bytes, const char *what) {
    return mem_alloc_pinned(CAT_WORKSPACE, bytes, what);
}

/* Bytes per parameter of everything the benchmark allocates: the state
 * (master, gradient, m, v in fp32 and the 16-bit write-back: 18) and the
 * copy's source and target (the 16 bytes of fp32 state each: 32). */
enum { STATE_BYTES_PER_PARAM = 4 * 4 + 2, COPY_BYTES_PER_PARAM = 16, BENCH_BYTES_PER_PARAM = 50 };
_Static_assert(BENCH_BYTES_PER_PARAM == STATE_BYTES_PER_PARAM + 2 * COPY_BYTES_PER_PARAM,
               "the help text's 50 bytes per parameter");

/* Host memory the kernel can give without swapping (MemAvailable), or the
 * free pages where /proc/meminfo lacks it. */
static size_t available_memory_bytes(void) {
    FILE *f = fopen("/proc/meminfo", "r");
    char line[256];
    unsigned long long kib = 0;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %llu kB", &kib) == 1) break;
    if (f) fclose(f);
    if (kib) return (size_t)kib * 1024;
    long pages = sysconf(_SC_AVPHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    return pages > 0 && page > 0 ? (size_t)pages * (size_t)page : (size_t)-1;
}

/* Refuse an --n whose buffers the machine cannot hold, before touching any:
 * otherwise the allocations succeed one by one and the program fills (and
 * zeroes) memory for half a minute before the last one fails. */
static void check_memory(size_t n, const char *n_text) {
    double need = (double)n * BENCH_BYTES_PER_PARAM, available = (double)available_memory_bytes();
    if (need <= available) return;
    fatal(
        EXIT_USAGE,
        "--n %s needs %.1f GiB of host memory (%d bytes per parameter: %d of state, %d for the copy's source "
        "and target) but %.1f GiB is available (MemAvailable); valid here: --n up to %.0fM",
        n_text, need / 1073741824.0, BENCH_BYTES_PER_PARAM, STATE_BYTES_PER_PARAM, 2 * COPY_BYTES_PER_PARAM,
        available / 1073741824.0, available / BENCH_BYTES_PER_PARAM / BYTES_PER_MIB);
}

static State state_new(size_t n) {
    State s = {.n = n};
    s.master = alloc_or_die(n * 4, "master weights");
    s.grads = alloc_or_die(n * 4, "gradients");
    s.m = alloc_or_die(n * 4, "m");
    s.v = alloc_or_die(n * 4, "v");
    s.out16 = alloc_or_die(n * 2, "16-bit weights");
    size_t chunks = (n + CPU_ADAM_CHUNK - 1) / CPU_ADAM_CHUNK;
#pragma omp parallel for schedule(static)
    for (size_t k = 0; k < chunks; k++) {
        size_t end = (k + 1) * CPU_ADAM_CHUNK < n ? (k + 1) * CPU_ADAM_CHUNK : n;
        for (size_t i = k * CPU_ADAM_CHUNK; i < end; i++) {
            uint64_t h = hash64(i);
            s.master[i] = (float)(h & 0xffff) / 65536.0f - 0.5f;
            s.grads[i] = ((float)((h >> 16) & 0xffff) / 65536.0f - 0.5f) * 1e-2f;
            s.m[i] = s.v[i] = 0.0f;
            s.out16[i] = 0;
        }
    }
    return s;
}

static void state_free(State *s) {
    mem_free(s->master), mem_free(s->grads), mem_free(s->m), mem_free(s->v), mem_free(s->out16);
}

/* One row's work: -1 the copy, -2 the kernel table's AdamW, else a path. */
enum { ROW_COPY = -1, ROW_REFERENCE = -2 };

static void run_once(int row, State *s, char *copy_src, char *copy_dst, size_t copy_bytes, int half, int t) {
    CpuAdamArgs a = {.lr = 1e-3f,
                     .beta1 = 0.9f,
                     .beta2 = 0.95f,
                     .eps = 1e-8f,
                     .weight_decay = 0.1f,
                     .grad_scale = 1.0f,
                     .t = t};
    if (row == ROW_COPY) {
        /* each thread copies one contiguous part, as cpu_adamw's static schedule does */
#pragma omp parallel
        {
            size_t threads = (size_t)omp_get_num_threads(), me = (size_t)omp_get_thread_num();
            size_t part = (copy_bytes / threads + 63) / 64 * 64, start = me * part;
            if (start < copy_bytes)
                memcpy(copy_dst + start, copy_src + start,
                       start + part < copy_bytes ? part : copy_bytes - start);
        }
    } else if (row == ROW_REFERENCE) {
        kernels_cpu.adamw_update(s->master, s->grads, s->m, s->v, s->n, a.lr, a.beta1, a.beta2, a.eps,
                                 a.weight_decay, a.grad_scale, a.t);
    } else {
        cpu_adamw_on((CpuAdamPath)row, s->master, s->grads, s->m, s->v, s->n, &a, half ? s->out16 : NULL,
                     half == 2 ? HALF_F16 : HALF_BF16);
    }
}

/* Milliseconds: wall time, or the process's CPU time shared by its threads. */
static double clock_ms(const Settings *set) {
    if (!set->cpu_clock) return wall_ms();
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6) / set->threads;
}

/* The median times of one run of `row` and of one copy, after one warm-up
 * run of each. The two alternate, so that on a shared machine a burst of
 * load slows both and the ratio (pct_of_copy) stays meaningful. */
static void median_ms(const Settings *set, int row, State *s, char *src, char *dst, size_t copy_bytes,
                      int half, double *row_ms, double *copy_ms) {
    int reps = set->reps;
    double *times = xmalloc(2 * (size_t)reps * sizeof *times), *copies = times + reps;
    run_once(row, s, src, dst, copy_bytes, half, 1);
    run_once(ROW_COPY, s, src, dst, copy_bytes, half, 1);
    for (int r = 0; r < reps; r++) {
        double start = clock_ms(set);
        run_once(row, s, src, dst, copy_bytes, half, r + 2);
        double middle = clock_ms(set);
        run_once(ROW_COPY, s, src, dst, copy_bytes, half, 1);
        times[r] = middle - start;
        copies[r] = clock_ms(set) - middle;
    }
    qsort(times, reps, sizeof *times, compare_doubles);
    qsort(copies, reps, sizeof *copies, compare_doubles);
    *row_ms = times[reps / 2];
    *copy_ms = copies[reps / 2];
    free(times);
}

int main(int argc, char **argv) {
    Settings set = parse(argc, argv);
    check_memory(set.n, set.n_text);
    omp_set_num_threads(set.threads);
    OutFile *csv = NULL;
    if (set.out[0]) {
        out_make_directories(set.out);
        csv = out_open(set.out, "adambench.csv", OUT_WHOLE, 0);
        out_printf(csv, ADAMBENCH_HEADER "\n");
    }
    char cpu[256], supported[64] = "";
    cpu_model(cpu, sizeof cpu);
    for (int k = 0; k < CPU_ADAM_PATHS; k++)
        if (cpu_adam_path_supported((CpuAdamPath)k))
            snprintf(supported + strlen(supported), sizeof supported - strlen(supported), " %s",
                     cpu_adam_path_name((CpuAdamPath)k));

    State s = state_new(set.n);
    size_t copy_bytes = set.n * COPY_BYTES_PER_PARAM; /* the fp32 state of n parameters */
    char *src = alloc_or_die(copy_bytes, "the copy's source"),
         *dst = alloc_or_die(copy_bytes, "the copy's target");
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < copy_bytes; i += 4096) src[i] = dst[i] = (char)i; /* first touch, as above */

    printf("adambench: %zu parameters (%.0f MiB of fp32 state), %d threads, median of %d updates, %s time\n",
           set.n, copy_bytes / BYTES_PER_MIB, set.threads, set.reps, set.cpu_clock ? "CPU" : "wall");
    printf("cpu: %s; paths it runs:%s\n\n", cpu, supported);
    printf("%-9s %-7s %-5s %10s %10s %8s %10s %10s %9s\n", "kernel", "path", "half", "ms", "Gparam/s", "GB/s",
           "copy GB/s", "% of copy", "x scalar");

    /* the rows: the copy, the reference, then the paths from scalar up (x_scalar needs the scalar row first)
     */
    const int rows[] = {ROW_COPY, ROW_REFERENCE, CPU_ADAM_SCALAR, CPU_ADAM_AVX2, CPU_ADAM_AVX512};
    double scalar_rate[3] = {0, 0, 0};
    for (size_t r = 0; r < sizeof rows / sizeof *rows; r++) {
        int row = rows[r];
        if (row >= 0 && !set.paths[row]) continue;
        for (int half = 0; half < 3; half++) {
            /* the copy once; the reference (fp32 only) unless --half excludes none */
            int wanted = row == ROW_COPY        ? half == 0
                         : row == ROW_REFERENCE ? half == 0 && set.halves[0]
                                                : set.halves[half];
            if (!wanted) continue;
            double ms, copy_ms;
            median_ms(&set, row, &s, src, dst, copy_bytes, half, &ms, &copy_ms);
            double bytes_per_param = row == ROW_COPY ? 32.0 : half ? 30.0 : 28.0;
            double rate = set.n / (ms * 1e-3), gbps = rate * bytes_per_param / 1e9;
            double copy_gbps = 32.0 * set.n / (copy_ms * 1e-3) / 1e9, pct = 100.0 * gbps / copy_gbps;
            if (row == CPU_ADAM_SCALAR) scalar_rate[half] = rate;
            const char *kernel = row == ROW_COPY ? "copy" : row == ROW_REFERENCE ? "reference" : "cpu_adamw";
            const char *path = row == ROW_COPY        ? "memcpy"
                               : row == ROW_REFERENCE ? "scalar"
                                                      : cpu_adam_path_name((CpuAdamPath)row);
            char x_scalar[32] = "";
            if (row >= 0 && scalar_rate[half] > 0)
                snprintf(x_scalar, sizeof x_scalar, "%.2f", rate / scalar_rate[half]);
            printf("%-9s %-7s %-5s %10.3f %10.3f %8.2f %10.2f %9.0f%% %9s\n", kernel, path, half_names[half],
                   ms, rate / 1e9, gbps, copy_gbps, pct, x_scalar);
            if (csv)
                out_printf(csv, "%s,%s,%s,%d,%zu,%d,%s,%.0f,%.4f,%.6g,%.4f,%.4f,%.1f,%s,%s\n", kernel, path,
                           half_names[half], set.threads, set.n, set.reps, set.cpu_clock ? "cpu" : "wall",
                           bytes_per_param, ms, rate, gbps, copy_gbps, pct, x_scalar, cpu);
        }
    }
    if (csv) {
        out_close(csv);
        printf("\nwrote %s/adambench.csv\n", set.out);
    }
    state_free(&s);
    mem_free(src), mem_free(dst);
    return 0;
}
