/* run_dir.c: see run_dir.h. */
#include "common/run/run_dir.h" /* the --out directory and its files */

#include "common/device/device.h" /* mem_alloc, copies, streams, timers */
#include "common/core/util.h" /* fatal, log_info, exit codes, flag parsing */

#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- files in --out ---- */

struct OutFile {
    FILE *f;
    OutKind kind;
    char dir[PATH_BYTES], name[64],
        path[JOINED_PATH_BYTES]; /* path: what is being written (NAME or NAME.tmp) */
    long complete_bytes;         /* OUT_LINES: the size up to the last complete line */
};

const char *out_part_path(const char *dir, const char *name) {
    static char path[JOINED_PATH_BYTES];
    snprintf(path, sizeof path, "%s/%s.tmp", dir, name);
    return path;
}

/* A write error ends the run, naming the file and the system's reason; a
 * line file is cut back to its last complete line first. */
static void out_failed(OutFile *o, const char *what) {
    int error = errno ? errno : EIO;
    if (o->kind == OUT_LINES || o->kind == OUT_LINES_APPEND) {
        if (truncate(o->path, o->complete_bytes) != 0) { /* best effort: the error below matters more */
        }
    }
    fatal(EXIT_RUNTIME, "--out %s: %s %s failed (%s)", o->dir, what, o->name, strerror(error));
}

OutFile *out_open(const char *dir, const char *name, OutKind kind, int continued) {
    OutFile *o = xcalloc(1, sizeof *o);
    o->kind = kind;
    snprintf(o->dir, sizeof o->dir, "%s", dir);
    snprintf(o->name, sizeof o->name, "%s", name);
    int whole = kind == OUT_WHOLE || kind == OUT_WHOLE_PART;
    if (whole)
        snprintf(o->path, sizeof o->path, "%s", out_part_path(dir, name));
    else
        snprintf(o->path, sizeof o->path, "%s/%s", dir, name);
    int append = kind == OUT_LINES_APPEND || (kind == OUT_WHOLE_PART && continued);
    o->f = fopen(o->path, append ? "a" : "w");
    if (!o->f) fatal(EXIT_RUNTIME, "--out %s: cannot write %s (%s)", dir, name, strerror(errno));
    if (whole) temp_file_register(o->path);
    o->complete_bytes = append ? ftell(o->f) : 0;
    return o;
}

void out_printf(OutFile *o, const char *fmt, ...) {
    char small[512], *text = small;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(small, sizeof small, fmt, ap);
    va_end(ap);
    if (n < 0) out_failed(o, "formatting");
    if ((size_t)n >= sizeof small) {
        text = xmalloc((size_t)n + 1);
        va_start(ap, fmt);
        vsnprintf(text, (size_t)n + 1, fmt, ap);
        va_end(ap);
    }
    errno = 0;
    if (fault_disk_full(o->name, (size_t)n) || fwrite(text, 1, (size_t)n, o->f) != (size_t)n)
        out_failed(o, "writing");
    if (text != small) free(text);
    /* a line file is flushed at each complete line, so what is on disk is whole lines */
    if ((o->kind == OUT_LINES || o->kind == OUT_LINES_APPEND) && n > 0 && text[n - 1] == '\n') {
        if (fflush(o->f) != 0) out_failed(o, "writing");
        o->complete_bytes = ftell(o->f);
    }
}

void out_close(OutFile *o) {
    errno = 0;
    if (fflush(o->f) != 0) out_failed(o, "writing");
    if (fclose(o->f) != 0) {
        o->f = NULL;
        out_failed(o, "closing");
    }
    if (o->kind == OUT_WHOLE) out_publish(o->dir, o->name);
    free(o);
}

void out_publish(const char *dir, const char *name) {
    char final[JOINED_PATH_BYTES];
    snprintf(final, sizeof final, "%s/%s", dir, name);
    const char *part = out_part_path(dir, name);
    if (rename(part, final) != 0)
        fatal(EXIT_RUNTIME, "--out %s: renaming %s.tmp to %s failed (%s)", dir, name, name, strerror(errno));
    temp_file_forget(part);
}

/* ---- the run directory ---- */

/* The files a run of the course writes into --out: replacing a run removes
 * exactly these (and their .tmp), never anything else in the directory. */
static const char *const run_files[] = {"run-info.txt", "steps.csv",    "run.csv",      "memory.csv",  "busy.csv",
                                        "timeline.csv", "trace.json",   "dry-comm.csv", "dry-work.csv"};
#define NUM_RUN_FILES (int)(sizeof run_files / sizeof run_files[0])

/* The watchdog's flight recorders, OUT/flight-RANK.txt (watchdog.h), are the
 * run's files too: one per rank, so matched by their shape. */
static int is_flight_file(const char *name) {
    size_t digits = 0;
    if (strncmp(name, "flight-", 7) != 0) return 0;
    while (name[7 + digits] >= '0' && name[7 + digits] <= '9') digits++;
    return digits > 0 && strcmp(name + 7 + digits, ".txt") == 0;
}

int out_is_run_file(const char *name) {
    if (is_flight_file(name)) return 1;
    for (int i = 0; i < NUM_RUN_FILES; i++) {
        size_t n = strlen(run_files[i]);
        if (strncmp(name, run_files[i], n) == 0 && (name[n] == '\0' || strcmp(name + n, ".tmp") == 0))
            return 1;
    }
    return 0;
}

/* What run-info.txt says: who wrote the directory, and the checkpoints saved. */
typedef struct {
    char program[128];
    uint64_t digest;
    int checkpoints;
    char checkpoint[32][300]; /* "checkpoint <checksum> step <n> <path>" lines */
} RunInfo;

static int read_run_info(const char *dir, RunInfo *info) {
    memset(info, 0, sizeof *info);
    char path[JOINED_PATH_BYTES], line[4400];
    snprintf(path, sizeof path, "%s/run-info.txt", dir);
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    unsigned long long digest;
    while (fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = '\0';
        if (strncmp(line, "program ", 8) == 0)
            snprintf(info->program, sizeof info->program, "%.120s", line + 8);
        if (sscanf(line, "config %llx", &digest) == 1) info->digest = digest;
        if (strncmp(line, "checkpoint ", 11) == 0 && info->checkpoints < 32)
            snprintf(info->checkpoint[info->checkpoints++], sizeof info->checkpoint[0], "%.290s", line);
    }
    fclose(f);
    return 1;
}

static int holds_checkpoint(const RunInfo *info, uint64_t checksum) {
    char wanted[64];
    snprintf(wanted, sizeof wanted, "checkpoint %016llx ", (unsigned long long)checksum);
    for (int i = 0; i < info->checkpoints; i++)
        if (strncmp(info->checkpoint[i], wanted, strlen(wanted)) == 0) return 1;
    return 0;
}

void out_make_directories(const char *dir) {
    char path[PATH_BYTES];
    snprintf(path, sizeof path, "%s", dir);
    for (char *p = path + 1; *p; p++) { /* mkdir -p */
        if (*p != '/') continue;
        *p = '\0';
        if (mkdir(path, 0755) != 0 && errno != EEXIST)
            fatal(EXIT_USAGE, "--out %s: cannot create %s (%s)", dir, path, strerror(errno));
        *p = '/';
    }
    if (mkdir(path, 0755) != 0 && errno != EEXIST)
        fatal(EXIT_USAGE, "--out %s: cannot create the directory (%s)", dir, strerror(errno));
}

/* A missing --out is created only once the job has agreed to run
 * (out_dir_prepare), so that a refused run leaves nothing behind. Before
 * that, prove it could be: create and remove a directory of a name of this
 * rank's own in the deepest ancestor that exists. */
static void probe_out_directory(const char *dir) {
    char ancestor[PATH_BYTES], up[PATH_BYTES];
    struct stat st;
    snprintf(ancestor, sizeof ancestor, "%s", dir);
    do {
        directory_of(ancestor, up);
        if (strcmp(up, ancestor) == 0) break; /* "." or "/" */
        snprintf(ancestor, sizeof ancestor, "%s", up);
    } while (stat(ancestor, &st) != 0 && errno == ENOENT);
    char probe[JOINED_PATH_BYTES];
    snprintf(probe, sizeof probe, "%s/.out-probe-%d-%d", ancestor, process_rank(), (int)getpid());
    if (mkdir(probe, 0700) != 0)
        fatal(EXIT_USAGE, "--out %s: cannot create the directory in %s (%s)", dir, ancestor, strerror(errno));
    rmdir(probe);
}

OutMode out_dir_check(const Config *cfg, const char *program) {
    const char *dir = cfg->out;
    struct stat st;
    if (stat(dir, &st) != 0) {
        if (errno != ENOENT)
            fatal(EXIT_USAGE, "--out %s: cannot create the directory (%s)", dir, strerror(errno));
        probe_out_directory(dir);
        return OUT_NEW;
    }
    if (!S_ISDIR(st.st_mode)) fatal(EXIT_USAGE, "--out %s: exists and is not a directory", dir);
    if (access(dir, W_OK) != 0)
        fatal(EXIT_USAGE, "--out %s: the directory is not writable (%s)", dir, strerror(errno));
    char found[256] = "";
    for (int i = 0; i < NUM_RUN_FILES; i++) {
        char path[JOINED_PATH_BYTES];
        snprintf(path, sizeof path, "%s/%s", dir, run_files[i]);
        if (access(path, F_OK) == 0)
            snprintf(found + strlen(found), sizeof found - strlen(found), "%s%s", found[0] ? ", " : "",
                     run_files[i]);
    }
    if (!found[0]) return OUT_NEW;
    RunInfo info;
    int has_info = read_run_info(dir, &info);
    int same_program = has_info && strcmp(info.program, program) == 0;
    if (cfg->resume[0] && same_program && holds_checkpoint(&info, cfg->resume_checksum)) return OUT_APPEND;
    if (cfg->overwrite) return OUT_REPLACE;
    if (same_program && info.digest == config_record_digest(&cfg->record)) return OUT_REPLACE;
    fatal(EXIT_USAGE,
          "--out %s holds another run's files (%s; written by %s) (valid: a new directory, or --overwrite to "
          "replace them)",
          dir, found,
          has_info ? (same_program ? "this program with other flags" : info.program) : "an unknown run");
}

/* An earlier run's flight files would be read as this run's: they go with it. */
static void remove_flight_files(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return;
    for (struct dirent *e; (e = readdir(d));) {
        if (!is_flight_file(e->d_name)) continue;
        char path[4096 + sizeof e->d_name + 2];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        unlink(path);
    }
    closedir(d);
}

static void write_run_info(const Config *cfg, const char *program, const char *status, const RunInfo *kept) {
    OutFile *o = out_open(cfg->out, "run-info.txt", OUT_WHOLE, 0);
    out_printf(o, "program %s\nconfig %016llx\nstatus %s\n", program,
               (unsigned long long)config_record_digest(&cfg->record), status);
    for (int i = 0; i < cfg->record.count; i++)
        out_printf(o, "item %s=%s\n", cfg->record.items[i].name, cfg->record.items[i].value);
    for (int i = 0; kept && i < kept->checkpoints; i++) out_printf(o, "%s\n", kept->checkpoint[i]);
    out_close(o);
}

void out_dir_prepare(const Config *cfg, const char *program) {
    const char *dir = cfg->out;
    interrupt_note_step(cfg->resume_step + 1); /* for Ctrl-C's message (util.h) */
    out_make_directories(dir);
    RunInfo kept = {0};
    if (cfg->out_mode == OUT_APPEND) read_run_info(dir, &kept);
    if (cfg->out_mode == OUT_REPLACE) {
        for (int i = 0; i < NUM_RUN_FILES; i++) {
            char path[JOINED_PATH_BYTES];
            snprintf(path, sizeof path, "%s/%s", dir, run_files[i]);
            if (unlink(path) != 0 && errno != ENOENT)
                fatal(EXIT_RUNTIME, "--out %s: cannot remove the earlier run's %s (%s)", dir, run_files[i],
                      strerror(errno));
            unlink(out_part_path(dir, run_files[i]));
        }
        remove_flight_files(dir);
        log_info("note: replacing the earlier run's files in %s\n", dir);
    }
    write_run_info(cfg, program, "running", &kept);
}

/* The path a "checkpoint <checksum> step <n> <path>" line names. */
static const char *checkpoint_line_path(const char *line) {
    const char *p = line;
    for (int field = 0; field < 4 && p; field++) {
        p = strchr(p, ' ');
        if (p) p++;
    }
    return p ? p : "";
}

/* Rewrite run-info.txt with one line changed or added (status, a checkpoint).
 * A new checkpoint replaces the line of the one it overwrote at the same path
 * (--save-every). */
static void update_run_info(const Config *cfg, const char *status, const char *checkpoint_line) {
    RunInfo info;
    read_run_info(cfg->out, &info);
    if (checkpoint_line) {
        int kept = 0;
        for (int i = 0; i < info.checkpoints; i++)
            if (strcmp(checkpoint_line_path(info.checkpoint[i]), checkpoint_line_path(checkpoint_line)) != 0)
                memmove(info.checkpoint[kept++], info.checkpoint[i], sizeof info.checkpoint[0]);
        info.checkpoints = kept;
    }
    if (checkpoint_line && info.checkpoints < 32)
        snprintf(info.checkpoint[info.checkpoints++], sizeof info.checkpoint[0], "%s", checkpoint_line);
    write_run_info(cfg, info.program, status, &info);
}

void run_info_checkpoint(const Config *cfg, const char *path, int step, uint64_t checksum) {
    char line[300];
    snprintf(line, sizeof line, "checkpoint %016llx step %d %.200s", (unsigned long long)checksum, step,
             path);
    update_run_info(cfg, "running", line);
    interrupt_note_checkpoint(step, path); /* for Ctrl-C's message (util.h) */
}

void run_info_complete(const Config *cfg) {
    update_run_info(cfg, "complete", NULL);
}
