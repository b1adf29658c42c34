/* util.c: see util.h. */
#include "util.h"

#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static int error_rank = -1;
static int log_rank = 0;
static void (*abort_hook)(int) = NULL;
static UsageTrap *usage_trap = NULL;
#define MAX_TEMP_FILES 8
static char temp_files[MAX_TEMP_FILES][4200];

void usage_trap_arm(UsageTrap *trap) {
    trap->message[0] = '\0';
    usage_trap = trap;
}
void usage_trap_disarm(void) {
    usage_trap = NULL;
}

int fault_disk_full(const char *name, size_t bytes) {
    static double written = 0.0;
    const char *fault = getenv("COURSE_FAULT_DISK_FULL");
    if (!fault) return 0;
    const char *colon = strchr(fault, ':');
    size_t length = colon ? (size_t)(colon - fault) : strlen(fault);
    const char *base = strrchr(name, '/') ? strrchr(name, '/') + 1 : name;
    if (strlen(base) != length || strncmp(base, fault, length) != 0) return 0;
    written += (double)bytes;
    if (written <= (colon ? atof(colon + 1) : 0.0)) return 0;
    errno = ENOSPC;
    return 1;
}

void directory_of(const char *path, char dir[4096]) {
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

uint64_t unique_id(void) {
    static uint64_t calls = 0;
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    return hash64(hash64((uint64_t)now.tv_sec * 1000000000u + (uint64_t)now.tv_nsec) ^
                  hash64((uint64_t)getpid() << 20 ^ (uint64_t)gethostid()) ^ calls++);
}

const char *fault_save_directory(const char *dir) {
    static char elsewhere[4096];
    const char *fault = getenv("COURSE_FAULT_SAVE_DIR");
    if (!fault || !fault[0]) return dir;
    int rank = -1, used = 0;
    if (sscanf(fault, "%d:%n", &rank, &used) != 1 || used == 0 || rank < 0 || !fault[used])
        fatal(EXIT_USAGE, "COURSE_FAULT_SAVE_DIR=%s: expected RANK:DIR", fault);
    if (rank != log_rank) return dir;
    snprintf(elsewhere, sizeof elsewhere, "%s", fault + used);
    return elsewhere;
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

void set_error_rank(int rank) {
    error_rank = rank;
}
void set_abort_hook(void (*hook)(int)) {
    abort_hook = hook;
}
int process_rank(void) {
    return log_rank;
}

void set_log_rank(int rank) {
    log_rank = rank;
}

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
    for (int i = 0; i < MAX_TEMP_FILES; i++)
        if (temp_files[i][0]) unlink(temp_files[i]);
    fflush(stdout);
    if (error_rank >= 0)
        fprintf(stderr, "error: [rank %d] %s\n", error_rank, message);
    else
        fprintf(stderr, "error: %s\n", message);
    fflush(stderr);
    if (abort_hook) abort_hook(exit_code);
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

void fault_point(const char *name) {
    static int parsed = 0, kill_rank = -1, kill_at = 1, hits = 0;
    static char kill_name[64];
    if (!parsed) {
        parsed = 1;
        const char *spec = getenv("COURSE_FAULT_KILL");
        if (spec && spec[0]) {
            int used = 0;
            int fields = sscanf(spec, "%63[^:]:%d%n:%d%n", kill_name, &kill_rank, &used, &kill_at, &used);
            if (fields < 2 || spec[used] != '\0' || kill_rank < 0 || kill_at < 1)
                fatal(EXIT_USAGE, "COURSE_FAULT_KILL=%s: expected NAME:RANK or NAME:RANK:N", spec);
        }
    }
    if (kill_rank != log_rank || strcmp(name, kill_name) != 0) return;
    if (++hits == kill_at) raise(SIGKILL);
}
