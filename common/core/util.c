/* util.c: see util.h. */
#include "common/core/util.h" /* fatal, log_info, exit codes, flag parsing */

#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <math.h>
#include <omp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static int error_rank = -1;
static int log_rank = 0, log_ranks = 1;
static void (*abort_hook)(int) = NULL;
static UsageTrap *usage_trap = NULL;
#define MAX_TEMP_FILES 8
#define ERROR_WAIT_FOR_RANK0_US 300000
static char temp_files[MAX_TEMP_FILES][JOINED_PATH_BYTES];

void usage_trap_arm(UsageTrap *trap) {
    trap->message[0] = '\0';
    usage_trap = trap;
}
void usage_trap_disarm(void) {
    usage_trap = NULL;
}

void directory_of(const char *path, char dir[PATH_BYTES]) {
    snprintf(dir, 4096, "%s", path);
    char *slash = strrchr(dir, '/');
    if (!slash)
        strcpy(dir, ".");
    else if (slash == dir)
        dir[1] = '\0';
    else
        *slash = '\0';
}

int same_file(const char *a, const char *b) {
    struct stat sa, sb;
    return stat(a, &sa) == 0 && stat(b, &sb) == 0 && sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}

int output_file_is_own(const char *path, const OutputKind *kind) {
    char *head = xmalloc(kind->signature_bytes);
    int fd = open(path, O_RDONLY | O_NONBLOCK), is = 0;
    if (fd >= 0) {
        is = pread(fd, head, kind->signature_bytes, (off_t)kind->signature_offset) ==
                 (ssize_t)kind->signature_bytes &&
             memcmp(head, kind->signature, kind->signature_bytes) == 0;
        close(fd);
    }
    free(head);
    return is;
}

void output_file_check(const char *flag, const char *path, const OutputKind *kind) {
    struct stat st;
    if (!path[0]) fatal(EXIT_USAGE, "%s: an empty name (valid: a file name)", flag);
    if (stat(path, &st) == 0) {
        if (S_ISDIR(st.st_mode)) fatal(EXIT_USAGE, "%s %s: is a directory (valid: a file name)", flag, path);
        if (!S_ISREG(st.st_mode))
            fatal(EXIT_USAGE, "%s %s: not a regular file (valid: a new name or an earlier %s)", flag, path,
                  kind->earlier);
        if (!output_file_is_own(path, kind))
            fatal(EXIT_USAGE, "%s %s: exists and is not %s (valid: a new name or an earlier %s)", flag, path,
                  kind->what, kind->earlier);
        return;
    }
    if (lstat(path, &st) == 0) /* a link to nothing: writing would create a file elsewhere */
        fatal(EXIT_USAGE, "%s %s: not a regular file (valid: a new name or an earlier %s)", flag, path,
              kind->earlier);
    char dir[PATH_BYTES];
    directory_of(path, dir);
    if (stat(dir, &st) != 0)
        fatal(EXIT_USAGE, "%s %s: the directory %s does not exist", flag, path, dir);
    if (!S_ISDIR(st.st_mode)) fatal(EXIT_USAGE, "%s %s: %s is not a directory", flag, path, dir);
}

uint64_t unique_id(void) {
    static uint64_t calls = 0;
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    return hash64(hash64((uint64_t)now.tv_sec * 1000000000u + (uint64_t)now.tv_nsec) ^
                  hash64((uint64_t)getpid() << 20 ^ (uint64_t)gethostid()) ^ calls++);
}

void temp_file_register(const char *path) {
    for (int i = 0; i < MAX_TEMP_FILES; i++)
        if (!temp_files[i][0]) {
            snprintf(temp_files[i], sizeof temp_files[i], "%s", path);
            return;
        }
}
void temp_file_forget(const char *path) {
    for (int i = 0; i < MAX_TEMP_FILES; i++)
        if (strcmp(temp_files[i], path) == 0) temp_files[i][0] = '\0';
}

/* ---- Ctrl-C and kill ----
 * The handler may only call async-signal-safe functions (write, unlink,
 * _exit): no printf, no malloc, no locks, because the signal can arrive
 * inside any of them. So the message it writes is composed beforehand, each
 * time the progress changes, into one of two buffers; the handler reads the
 * one `interrupt_ready` names, which is never the one being written. */
static char interrupt_texts[2][2][4400]; /* [buffer][SIGINT, SIGTERM] */
static volatile sig_atomic_t interrupt_ready = 0, failing = 0;
static int interrupt_step = 1, interrupt_ckpt_step = -1;
static char interrupt_ckpt_path[PATH_BYTES];

/* "interrupted at step N by SIGINT; last checkpoint: step K at PATH". mpirun
 * turns its own SIGINT or SIGTERM into SIGTERM for every rank, and sends the
 * same when it ends a job because another rank failed, hence the two words
 * of SIGTERM's reason. */
static void compose_interrupt_message(void) {
    int next = !interrupt_ready;
    for (int s = 0; s < 2; s++) {
        char *text = interrupt_texts[next][s];
        size_t size = sizeof interrupt_texts[next][s];
        int used = snprintf(text, size, "interrupted at step %d by %s; ", interrupt_step,
                            s == 0 ? "SIGINT" : "SIGTERM (a kill, or mpirun ending the job)");
        if (interrupt_ckpt_step >= 0)
            snprintf(text + used, size - used, "last checkpoint: step %d at %s\n", interrupt_ckpt_step,
                     interrupt_ckpt_path);
        else
            snprintf(text + used, size - used, "no checkpoint saved\n");
    }
    interrupt_ready = next;
}

static void on_interrupt(int signal) {
    for (int i = 0; i < MAX_TEMP_FILES; i++)
        if (temp_files[i][0]) unlink(temp_files[i]);
    if (log_rank == 0 && !failing) { /* a failing rank has said why already */
        const char *text = interrupt_texts[interrupt_ready][signal == SIGTERM];
        size_t length = 0;
        while (text[length]) length++;
        ssize_t ignored = write(STDERR_FILENO, text, length);
        (void)ignored;
    }
    _exit(128 + signal); /* the shell's convention: 130 for SIGINT, 143 for SIGTERM */
}

void interrupt_handlers_install(void) {
    compose_interrupt_message();
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_interrupt;
    sigfillset(&sa.sa_mask); /* one handler at a time */
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
}

void interrupt_note_step(int step) {
    interrupt_step = step;
    compose_interrupt_message();
}

void interrupt_note_checkpoint(int step, const char *path) {
    interrupt_ckpt_step = step;
    snprintf(interrupt_ckpt_path, sizeof interrupt_ckpt_path, "%s", path);
    compose_interrupt_message();
}

void set_error_rank(int rank) {
    error_rank = rank;
}
void set_abort_hook(void (*hook)(int)) {
    abort_hook = hook;
}
int process_rank(void) {
    return log_rank;
}

void set_log_rank(int rank, int ranks) {
    log_rank = rank;
    log_ranks = ranks;
}

/* The first thread to fail ends the process, once; any other that fails
 * meanwhile (an OpenMP loop's threads reach the same exercise stub, or meet
 * the same error, together) waits for it. Two threads in exit() at once
 * print the message twice and run the exit handlers twice: a double free,
 * or a segfault. */
static int ending = 0;
static __thread int ending_here = 0;

void fatal(int exit_code, const char *fmt, ...) {
    char message[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(message, sizeof message, fmt, ap);
    va_end(ap);
    if (exit_code == EXIT_USAGE && usage_trap) {
        UsageTrap *trap = usage_trap;
        usage_trap = NULL;
        snprintf(trap->message, sizeof trap->message, "%s", message);
        longjmp(trap->where, 1);
    }
    if (__atomic_exchange_n(&ending, 1, __ATOMIC_ACQ_REL)) {
        if (ending_here) _exit(exit_code); /* fatal again, from an exit handler of this thread */
        for (;;) pause();
    }
    ending_here = 1;
    for (int i = 0; i < MAX_TEMP_FILES; i++)
        if (temp_files[i][0]) unlink(temp_files[i]);
    failing = 1;
    fflush(stdout);
    /* Ranks often fail together, on the same error: rank 0 speaks first and
     * its MPI_Abort ends the others before they repeat it; a rank failing
     * alone is heard a moment later. */
    if (abort_hook && error_rank > 0) usleep(ERROR_WAIT_FOR_RANK0_US);
    if (error_rank >= 0)
        fprintf(stderr, "error: [rank %d] %s\n", error_rank, message);
    else
        fprintf(stderr, "error: %s\n", message);
    fflush(stderr);
    if (abort_hook) abort_hook(exit_code);
    /* Inside an OpenMP loop the team's other threads still run: exit's
     * handlers (OpenBLAS's, the CUDA runtime's) would free what they use. */
    if (omp_in_parallel()) _exit(exit_code);
    exit(exit_code);
}

void exercise_not_implemented(const char *id, const char *where) {
    fatal(EXIT_RUNTIME, "exercise %s not implemented: see %s", id, where);
}

void exercise_reached(const char *id) {
    /* one flag per id "NN.M": the regions run in OpenMP loops, so the flag
     * is read before any lock is taken */
    static volatile int seen[1000];
    int k = ((id[0] - '0') * 10 + (id[1] - '0')) * 10 + (id[3] - '0');
    if (k < 0 || k >= 1000 || seen[k]) return;
#pragma omp critical(exercise_reached)
    if (!seen[k]) {
        const char *path = getenv("COURSE_EXERCISE_TRACE");
        FILE *f = path && *path ? fopen(path, "a") : NULL;
        if (f) {
            fprintf(f, "%s\n", id);
            fclose(f);
        }
        seen[k] = 1;
    }
}

void log_info(const char *fmt, ...) {
    if (log_rank != 0) return;
    va_list ap;
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    fflush(stdout);
}

void *xmalloc(size_t bytes) {
    void *p = malloc(bytes ? bytes : 1);
    if (!p) fatal(EXIT_RUNTIME, "out of host memory allocating %zu bytes", bytes);
    return p;
}

void *xcalloc(size_t count, size_t bytes) {
    void *p = calloc(count ? count : 1, bytes ? bytes : 1);
    if (!p) fatal(EXIT_RUNTIME, "out of host memory allocating %zu x %zu bytes", count, bytes);
    return p;
}

uint64_t hash64(uint64_t x) {
    x += 0x9e3779b97f4a7c15ULL;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}

uint64_t hash_string(const char *s) {
    uint64_t h = 0xcbf29ce484222325ULL;
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 0x100000001b3ULL;
    return h;
}

/* FNV-1a's mixing, eight bytes at a time (then the tail byte by byte): fast
 * enough for a checkpoint of a billion bytes, and any flipped bit changes it. */
uint64_t hash_bytes(const void *data, size_t bytes) {
    const unsigned char *p = data;
    uint64_t h = 0xcbf29ce484222325ULL ^ bytes;
    size_t words = bytes / 8;
    for (size_t i = 0; i < words; i++) {
        uint64_t w;
        memcpy(&w, p + 8 * i, 8);
        h = (h ^ w) * 0x100000001b3ULL;
        h ^= h >> 29;
    }
    for (size_t i = 8 * words; i < bytes; i++) h = (h ^ p[i]) * 0x100000001b3ULL;
    return hash64(h);
}

double hash_uniform(uint64_t a, uint64_t b, uint64_t c) {
    uint64_t h = hash64(a ^ hash64(b ^ hash64(c)));
    return (double)(h >> 11) * (1.0 / 9007199254740992.0); /* 53 random bits */
}

double hash_normal(uint64_t a, uint64_t b, uint64_t c) {
    /* Box-Muller on two uniforms drawn from disjoint counters (2c and 2c+1). */
    double u1 = hash_uniform(a, b, 2 * c);
    double u2 = hash_uniform(a, b, 2 * c + 1);
    if (u1 < 1e-300) u1 = 1e-300;
    return sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2);
}

uint32_t rng_next_u32(uint64_t *state) {
    /* splitmix64: a counter run through the finaliser. */
    return (uint32_t)(hash64((*state)++) >> 32);
}

float rng_next_float(uint64_t *state) {
    return (rng_next_u32(state) >> 8) / 16777216.0f;
}

double wall_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
}

/* ---- fault injection: every COURSE_FAULT_* variable, read here once ---- */

/* The fault points: the one list of them, each with the call that reaches
 * it. fault_check_environment refuses a name not here, listing these;
 * util.h and README.md name this table, and tests/robustness/faults.bats checks that
 * README's list is this one. `skippable`: a call COURSE_FAULT_SKIP can skip
 * (comm.c's, through op_begin); the others can only be killed. */
static const struct {
    const char *name;
    int skippable;
} fault_points[] = {
    /* comm.c: comm_allreduce and comm_allreduce_typed */
    {"allreduce", 1},
    /* comm.c: comm_reduce_scatter and its _typed form */
    {"reduce_scatter", 1},
    /* comm.c: comm_allgather and its _typed form */
    {"allgather", 1},
    /* comm.c: comm_broadcast and its _typed form */
    {"broadcast", 1},
    /* comm.c: comm_alltoall_typed (the library's all-to-all) */
    {"alltoall", 1},
    /* comm.c: comm_send, and comm_post_send (a posted send: context parallelism's ring, ZB-H1) */
    {"send", 1},
    /* comm.c: comm_recv */
    {"recv", 1},
    /* comm.c: comm_sendrecv and its _typed form (02's ring, 03's blocking context-parallel ring) */
    {"sendrecv", 1},
    /* comm.c: comm_wait_posted, waiting for a posted send to leave */
    {"wait_posted", 1},
    /* comm.c: comm_allreduce_double, comm_all, comm_max_doubles (step_times_slowest) */
    {"host_allreduce", 1},
    /* comm.c: comm_gather_bytes */
    {"host_gather", 1},
    /* comm.c: comm_barrier */
    {"barrier", 1},
    /* comm_worker.c: the communication thread starting a queued collective, before its own point */
    {"worker", 0},
    /* 02's ring.c: after each step of the ring's reduce-scatter */
    {"ring", 0},
    /* checkpoint.c: once per save on every rank, after its parameters, before its m and v */
    {"save", 0},
};
enum { FAULT_POINTS = sizeof fault_points / sizeof fault_points[0] };

/* "allreduce, reduce_scatter, ...": the names of the points (skippable ones
 * only, if asked). */
static void fault_point_names(int skippable_only, char *out, size_t size) {
    out[0] = '\0';
    for (int i = 0; i < FAULT_POINTS; i++) {
        if (skippable_only && !fault_points[i].skippable) continue;
        size_t used = strlen(out);
        snprintf(out + used, size - used, "%s%s", used ? ", " : "", fault_points[i].name);
    }
}

/* NAME:RANK[:N]: a named point, the rank it fires on, at its N-th hit. */
typedef struct {
    char name[64];
    int rank, at, hits;
} FaultAt;

typedef struct {
    FaultAt kill, skip;       /* COURSE_FAULT_KILL, COURSE_FAULT_SKIP (rank -1: unset) */
    char disk_full_name[256]; /* COURSE_FAULT_DISK_FULL=NAME[:BYTES] ("": unset) */
    double disk_full_bytes, disk_written;
    int nan_step, overflow_step, overflow_rank, replica_rank; /* -1: unset */
    int plant_bytes;                                          /* COURSE_FAULT_PLANT (-1: unset) */
    int save_dir_rank; /* COURSE_FAULT_SAVE_DIR=RANK:DIR (rank -1: unset) */
    char save_dir[PATH_BYTES];
} Faults;

static Faults faults_read;
static int faults_parsed = 0;

/* The variable's value, NULL when unset or empty. */
static const char *fault_env(const char *variable) {
    const char *value = getenv(variable);
    return value && value[0] ? value : NULL;
}

/* A rank named by a variable must be one of the job's (set_log_rank). */
static void check_fault_rank(const char *variable, const char *spec, int rank) {
    if (rank >= log_ranks)
        fatal(EXIT_USAGE, "%s=%s: rank %d is not in this job (valid: 0..%d, a job of %d rank%s)", variable,
              spec, rank, log_ranks - 1, log_ranks, log_ranks == 1 ? "" : "s");
}

static void parse_fault_at(const char *variable, FaultAt *f, int skip) {
    f->rank = -1;
    f->at = 1;
    const char *spec = fault_env(variable);
    if (!spec) return;
    int used = 0;
    int fields = sscanf(spec, "%63[^:]:%d%n:%d%n", f->name, &f->rank, &used, &f->at, &used);
    if (fields < 2 || spec[used] != '\0' || f->rank < 0 || f->at < 1)
        fatal(EXIT_USAGE, "%s=%s: expected NAME:RANK or NAME:RANK:N", variable, spec);
    int known = -1;
    for (int i = 0; i < FAULT_POINTS; i++)
        if (strcmp(f->name, fault_points[i].name) == 0) known = i;
    if (known < 0 || (skip && !fault_points[known].skippable)) {
        char names[400];
        fault_point_names(skip, names, sizeof names);
        fatal(EXIT_USAGE, "%s=%s: %s '%s' (valid: %s)", variable, spec,
              known < 0 ? "unknown point" : "no call to skip at point", f->name, names);
    }
    check_fault_rank(variable, spec, f->rank);
}

/* A whole number >= lo, or -1 when the variable is unset. */
static int parse_fault_number(const char *variable, int lo, const char *meaning) {
    const char *text = fault_env(variable);
    if (!text) return -1;
    char *end;
    errno = 0;
    long v = strtol(text, &end, 10);
    if (end == text || *end != '\0' || errno || v < lo || v > 2147483647L)
        fatal(EXIT_USAGE, "%s=%s: expected %s, a whole number >= %d", variable, text, meaning, lo);
    if (strcmp(meaning, "a rank") == 0) check_fault_rank(variable, text, (int)v);
    return (int)v;
}

static void parse_disk_full(Faults *f) {
    const char *spec = fault_env("COURSE_FAULT_DISK_FULL");
    if (!spec) return;
    const char *colon = strchr(spec, ':');
    size_t length = colon ? (size_t)(colon - spec) : strlen(spec);
    char *end = NULL;
    double bytes = colon ? strtod(colon + 1, &end) : 0.0;
    if (length == 0 || length >= sizeof f->disk_full_name || (colon && (end == colon + 1 || *end)) ||
        !(bytes >= 0.0))
        fatal(EXIT_USAGE, "COURSE_FAULT_DISK_FULL=%s: expected NAME or NAME:BYTES", spec);
    memcpy(f->disk_full_name, spec, length);
    f->disk_full_name[length] = '\0';
    f->disk_full_bytes = bytes;
}

static void parse_save_dir(Faults *f) {
    f->save_dir_rank = -1;
    const char *spec = fault_env("COURSE_FAULT_SAVE_DIR");
    if (!spec) return;
    int used = 0;
    if (sscanf(spec, "%d:%n", &f->save_dir_rank, &used) != 1 || used == 0 || f->save_dir_rank < 0 ||
        !spec[used] || strlen(spec + used) >= sizeof f->save_dir)
        fatal(EXIT_USAGE, "COURSE_FAULT_SAVE_DIR=%s: expected RANK:DIR", spec);
    check_fault_rank("COURSE_FAULT_SAVE_DIR", spec, f->save_dir_rank);
    snprintf(f->save_dir, sizeof f->save_dir, "%s", spec + used);
}

static const Faults *faults(void) {
    if (!faults_parsed) {
        faults_parsed = 1;
        Faults *f = &faults_read;
        parse_fault_at("COURSE_FAULT_KILL", &f->kill, 0);
        parse_fault_at("COURSE_FAULT_SKIP", &f->skip, 1);
        parse_disk_full(f);
        f->nan_step = parse_fault_number("COURSE_FAULT_NAN_STEP", 1, "a step");
        f->overflow_step = parse_fault_number("COURSE_FAULT_OVERFLOW_STEP", 1, "a step");
        f->overflow_rank = parse_fault_number("COURSE_FAULT_OVERFLOW_RANK", 0, "a rank");
        f->replica_rank = parse_fault_number("COURSE_FAULT_REPLICA_RANK", 0, "a rank");
        f->plant_bytes = parse_fault_number("COURSE_FAULT_PLANT", 4, "bytes");
        parse_save_dir(f);
    }
    return &faults_read;
}

int fault_plant_bytes(void) {
    int bytes = faults()->plant_bytes;
    return bytes > 0 ? bytes / 4 * 4 : 0;
}

void fault_check_environment(void) {
    faults_parsed = 0;
    faults();
}

/* Counts a hit of point `name` on this rank; 1 at the N-th. */
static int fault_fires(FaultAt *f, const char *name) {
    if (f->rank != log_rank || strcmp(name, f->name) != 0) return 0;
    return ++f->hits == f->at;
}

void fault_point(const char *name) {
    faults();
    if (fault_fires(&faults_read.kill, name)) raise(SIGKILL);
}

int fault_skip(const char *name) {
    faults();
    return fault_fires(&faults_read.skip, name);
}

int fault_disk_full(const char *name, size_t bytes) {
    Faults *f = (Faults *)faults();
    if (!f->disk_full_name[0]) return 0;
    const char *base = strrchr(name, '/') ? strrchr(name, '/') + 1 : name;
    if (strcmp(base, f->disk_full_name) != 0) return 0;
    f->disk_written += (double)bytes;
    if (f->disk_written <= f->disk_full_bytes) return 0;
    errno = ENOSPC;
    return 1;
}

int fault_nan_step(void) {
    return faults()->nan_step;
}

int fault_overflow_at(int step, int any_rank) {
    const Faults *f = faults();
    return f->overflow_step == step && (any_rank || f->overflow_rank < 0 || f->overflow_rank == log_rank);
}

const char *fault_save_directory(const char *dir) {
    const Faults *f = faults();
    return f->save_dir_rank == log_rank ? f->save_dir : dir;
}

int fault_replica_rank(void) {
    return faults()->replica_rank;
}

/* ---- parsing a flag's value ---- */

int parse_bytes(const char *text, size_t *out) {
    errno = 0;
    char *end;
    double value = strtod(text, &end);
    if (end == text || errno || value < 0) return -1;
    double mult = 1.0;
    switch (*end) {
    case 'k':
    case 'K':
        mult = 1024.0;
        end++;
        break;
    case 'm':
    case 'M':
        mult = 1024.0 * 1024.0;
        end++;
        break;
    case 'g':
    case 'G':
        mult = 1024.0 * 1024.0 * 1024.0;
        end++;
        break;
    case 't':
    case 'T':
        mult = 1024.0 * 1024.0 * 1024.0 * 1024.0;
        end++;
        break;
    default:
        break;
    }
    if (*end == 'i' || *end == 'I') end++; /* accept KiB-style too */
    if (*end == 'b' || *end == 'B') end++;
    if (*end != '\0') return -1;
    double bytes = value * mult;
    if (bytes > 9.0e18) return -1;
    *out = (size_t)bytes;
    return 0;
}

long parse_int_flag(const char *flag, const char *value, long lo, long hi) {
    errno = 0;
    char *end;
    long v = strtol(value, &end, 10);
    if (end == value || *end != '\0')
        fatal(EXIT_USAGE, "%s: '%s' is not a whole number (valid: %ld..%ld)", flag, value, lo, hi);
    if (errno == ERANGE || v < lo || v > hi)
        fatal(EXIT_USAGE, "%s: %s is out of range (valid: %ld..%ld)", flag, value, lo, hi);
    return v;
}

double parse_float_flag(const char *flag, const char *value, double lo, double hi) {
    errno = 0;
    char *end;
    double v = strtod(value, &end);
    if (end == value || *end != '\0' || !isfinite(v))
        fatal(EXIT_USAGE, "%s: '%s' is not a number (valid: %g..%g)", flag, value, lo, hi);
    if (errno == ERANGE || v < lo || v > hi)
        fatal(EXIT_USAGE, "%s: %s is out of range (valid: %g..%g)", flag, value, lo, hi);
    return v;
}

void parse_choice_flag(const char *flag, const char *noun, const char *value, const char *valid, char *dst,
                       size_t size) {
    char choices[256], listed[300] = "";
    snprintf(choices, sizeof choices, "%s", valid);
    int found = 0;
    for (char *item = strtok(choices, "|"); item; item = strtok(NULL, "|")) {
        found |= strcmp(item, value) == 0;
        if (listed[0]) strcat(listed, ", ");
        strncat(listed, item, sizeof listed - strlen(listed) - 1);
    }
    if (!found || strlen(value) >= size)
        fatal(EXIT_USAGE, "%s: unknown %s '%s' (valid: %s)", flag, noun, value, listed);
    snprintf(dst, size, "%s", value);
}

void getopt_refuse(int opt, char **argv) {
    if (opt == ':') fatal(EXIT_USAGE, "%s needs a value (see --help)", argv[optind - 1]);
    fatal(EXIT_USAGE, "unknown flag '%s' (see --help)", argv[optind - 1]);
}

void getopt_no_operands(int argc, char **argv) {
    if (optind < argc)
        fatal(EXIT_USAGE, "unexpected argument '%s' (flags start with --; see --help)", argv[optind]);
}
