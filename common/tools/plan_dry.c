/* plan_dry.c: see plan_dry.h. */
#define _GNU_SOURCE
#include "common/tools/plan_dry.h" /* the planner's dry runs */

#include "common/core/util.h" /* fatal, log_info, exit codes, flag parsing */

#include <errno.h>
#include <ftw.h>
#include <libgen.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

/* ---- the flags handed to the program ---- */

const char *plan_arg_value(char **args, int nargs, const char *name) {
    const char *value = NULL; /* the last one given, as getopt_long reads them */
    size_t n = strlen(name);
    for (int i = 0; i < nargs; i++) {
        if (strncmp(args[i], name, n) != 0) continue;
        if (args[i][n] == '=') value = args[i] + n + 1;
        if (args[i][n] == '\0') value = i + 1 < nargs ? args[i + 1] : "";
    }
    return value;
}

int plan_arg_given(char **args, int nargs, const char *name) {
    size_t n = strlen(name);
    for (int i = 0; i < nargs; i++)
        if (strncmp(args[i], name, n) == 0 && (args[i][n] == '\0' || args[i][n] == '=')) return 1;
    return 0;
}

int plan_program_takes(const char *program, const char *name) {
    /* each program's --help, read once (--search asks the six programs in turn, many times) */
    static struct {
        char program[PATH_BYTES], help[65536];
    } cache[8];
    int slot = 0;
    while (slot < 7 && cache[slot].program[0] && strcmp(cache[slot].program, program) != 0) slot++;
    char *help = cache[slot].help;
    if (strcmp(cache[slot].program, program) != 0) {
        char command[JOINED_PATH_BYTES];
        snprintf(command, sizeof command, "'%s' --help 2>&1", program);
        /* Three tries: on a machine under heavy load a program's MPI start-up without mpirun
         * (a singleton) has been seen to fail once and then run. */
        int ok = 0;
        for (int attempt = 0; attempt < 3 && !ok; attempt++) {
            if (attempt) sleep(1);
            FILE *p = popen(command, "r");
            size_t n = p ? fread(help, 1, sizeof cache[slot].help - 1, p) : 0;
            help[n] = '\0';
            ok = p && pclose(p) == 0 && n > 0;
        }
        if (!ok) {
            help[strcspn(help, "\n")] = '\0'; /* its first line says why, if it said anything */
            fatal(EXIT_RUNTIME, "cannot run %s --help (is it built? make)%s%s", program, help[0] ? ": " : "",
                  help);
        }
        snprintf(cache[slot].program, sizeof cache[slot].program, "%s", program);
    }
    char row[64]; /* a row of --help: two spaces, the flag, a space or its end */
    for (const char *at = help; (at = strstr(at, name)); at++) {
        snprintf(row, sizeof row, "%c%c", at[strlen(name)], at > help ? at[-1] : '\n');
        if (at > help + 1 && at[-1] == ' ' && at[-2] == ' ' && (row[0] == ' ' || row[0] == '\n')) return 1;
    }
    return 0;
}

/* ---- running the ranks ---- */

static int remove_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
    (void)st, (void)flag, (void)ftw;
    return remove(path);
}

/* The ranks to run: every rank of replica 0, or of the world (the ring), or each stage's first. */
static int ranks_to_run(const PlanDryLayout *l, PlanDry *d, int *ranks) {
    int ring = l->dp > 1 && plan_arg_value(l->args, l->nargs, "--allreduce") &&
               strcmp(plan_arg_value(l->args, l->nargs, "--allreduce"), "ring") == 0;
    int replica = l->world / l->dp, n = 0;
    int all = ring ? l->world : replica;
    if (all <= PLAN_DRY_MAX_RUN && !l->stage_firsts) {
        for (int r = 0; r < all; r++) ranks[n++] = r;
        d->replica_only = !ring && l->dp > 1;
        return n;
    }
    d->per_stage = 1, d->replica_only = 1; /* grid.h's order: tp fastest, then cp, then pp, then dp */
    for (int s = 0; s < l->pp; s++) ranks[n++] = s * (replica / l->pp);
    return n;
}

static pid_t start_rank(const PlanDryLayout *l, const char *dir, int rank) {
    char world[16], which[16], out[JOINED_PATH_BYTES], log[JOINED_PATH_BYTES + 16];
    snprintf(world, sizeof world, "%d", l->world);
    snprintf(which, sizeof which, "%d", rank);
    snprintf(out, sizeof out, "%s/r%d", dir, rank);
    snprintf(log, sizeof log, "%s/r%d.log", dir, rank);
    char **argv = xcalloc((size_t)l->nargs + 24, sizeof *argv);
    int n = 0;
    argv[n++] = (char *)l->program;
    for (int i = 0; i < l->nargs; i++) argv[n++] = l->args[i];
    const char *more[] = {"--dry-run", "--world", world, "--rank", which, "--out", out, "--steps", "1",
                          "--quiet", NULL};
    for (int i = 0; more[i]; i++) argv[n++] = (char *)more[i];
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        if (!freopen(log, "w", stdout) || dup2(fileno(stdout), 2) < 0) _exit(127);
        if (l->threads > 0) {
            char threads[16];
            snprintf(threads, sizeof threads, "%d", l->threads);
            setenv("OMP_NUM_THREADS", threads, 1);
        }
        execv(l->program, argv);
        _exit(127);
    }
    free(argv);
    if (pid < 0) fatal(EXIT_RUNTIME, "cannot start %s (fork: %s)", l->program, strerror(errno));
    return pid;
}

static int wait_status(pid_t pid) {
    int status;
    if (waitpid(pid, &status, 0) < 0) fatal(EXIT_RUNTIME, "waitpid: %s", strerror(errno));
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
}

/* A rank that did not finish: its "error:" line (the program's own), or its log's last line. */
static void failure(const char *dir, const char *program, int rank, int status, char *line, size_t size) {
    char path[PATH_BYTES], *program_name = path; /* NN_name/train, as the course names it */
    snprintf(path, sizeof path, "%s", program);
    for (int slashes = 0, i = (int)strlen(path) - 1; i >= 0; i--)
        if (path[i] == '/' && ++slashes == 2) {
            program_name = path + i + 1;
            break;
        }
    char log[JOINED_PATH_BYTES + 16], text[1024], last[1024] = "";
    snprintf(log, sizeof log, "%s/r%d.log", dir, rank);
    FILE *f = fopen(log, "r");
    line[0] = '\0';
    while (f && fgets(text, sizeof text, f)) {
        text[strcspn(text, "\n")] = '\0';
        if (text[0]) snprintf(last, sizeof last, "%s", text);
        char flag[128];
        if (sscanf(text, "error: unknown flag '%127[^']'", flag) == 1 && !line[0]) /* the chapter's table */
            snprintf(line, size, "%s is not a flag of %.256s (valid: the flags of its --help, or another --chapter)",
                     flag, program_name);
        else if (strncmp(text, "error: ", 7) == 0 && !line[0])
            snprintf(line, size, "%s", text + 7);
    }
    if (f) fclose(f);
    if (!line[0]) snprintf(line, size, "dry run of rank %d ended with status %d: %.512s", rank, status, last);
}

/* ---- reading what a rank wrote ---- */

static FILE *open_in(const char *dir, int rank, const char *name) {
    char path[JOINED_PATH_BYTES + 64];
    snprintf(path, sizeof path, "%s/r%d/%s", dir, rank, name);
    FILE *f = fopen(path, "r");
    if (!f) fatal(EXIT_RUNTIME, "dry run of rank %d wrote no %s", rank, name);
    return f;
}

static void read_memory(const char *dir, PlanDryRank *r) {
    FILE *f = open_in(dir, r->rank, "memory.csv");
    char line[256], space[32], category[32];
    size_t bytes;
    int rank;
    while (fgets(line, sizeof line, f)) {
        if (sscanf(line, "%d,%31[^,],%31[^,],%zu", &rank, space, category, &bytes) != 4) continue;
        for (int s = 0; s < SPACE_COUNT; s++)
            for (int c = 0; c < CAT_COUNT; c++)
                if (!strcmp(space, space_name(s)) && !strcmp(category, category_name(c))) r->bytes[s][c] = bytes;
    }
    fclose(f);
}

static void read_ledger(const char *dir, PlanDryRank *r, int one_process) {
    if (one_process) return; /* chapter 01 has no transport */
    FILE *f = open_in(dir, r->rank, "dry-comm.csv");
    static const char *axes[COMM_COUNTERS + 1] = {"dp", "pp", "cp", "tp", "ep", "none"};
    char line[256], kind[32], axis[16];
    double calls, bytes;
    while (fgets(line, sizeof line, f)) {
        if (sscanf(line, "%31[^,],%15[^,],%lf,%lf", kind, axis, &calls, &bytes) != 4) continue;
        for (int k = 0; k < COMM_KINDS; k++)
            for (int a = 0; a <= COMM_COUNTERS; a++)
                if (!strcmp(kind, comm_kind_name((CommKind)k)) && !strcmp(axis, axes[a]))
                    r->ledger.calls[k][a] = calls, r->ledger.bytes[k][a] = bytes;
    }
    fclose(f);
}

/* Columns names[0..n) of a CSV's first data row into values[], NAN where absent (fields may be
 * empty: val_loss). */
static void csv_values(const char *dir, int rank, const char *file, const char *const *names, double *values,
                       int n) {
    FILE *f = open_in(dir, rank, file);
    char header[4096], row[4096];
    for (int i = 0; i < n; i++) values[i] = NAN;
    if (fgets(header, sizeof header, f) && fgets(row, sizeof row, f)) {
        header[strcspn(header, "\n")] = row[strcspn(row, "\n")] = '\0';
        char *h = header, *v = row;
        while (h && v) {
            char *h_end = strchr(h, ','), *v_end = strchr(v, ',');
            if (h_end) *h_end = '\0';
            if (v_end) *v_end = '\0';
            for (int i = 0; i < n; i++)
                if (!strcmp(h, names[i])) values[i] = strtod(v, NULL);
            h = h_end ? h_end + 1 : NULL, v = v_end ? v_end + 1 : NULL;
        }
    }
    fclose(f);
}

const char *plan_dry_item(const PlanDry *d, const char *flag) {
    for (int i = 0; i < d->nitems; i++)
        if (!strcmp(d->items[i][0], flag)) return d->items[i][1];
    return NULL;
}

static int item_int(const PlanDry *d, const char *flag, int otherwise) {
    const char *v = plan_dry_item(d, flag);
    return v ? atoi(v) : otherwise;
}

/* run-info.txt: "item --flag=value" lines, the flags as the program read them. */
static void read_info(const char *dir, PlanDry *d) {
    FILE *f = open_in(dir, d->ranks[0].rank, "run-info.txt");
    char line[PATH_BYTES + 128];
    while (fgets(line, sizeof line, f) && d->nitems < (int)(sizeof d->items / sizeof d->items[0])) {
        line[strcspn(line, "\n")] = '\0';
        if (strncmp(line, "item --", 7) != 0 || !strchr(line, '=')) continue;
        char *eq = strchr(line, '=');
        *eq = '\0';
        snprintf(d->items[d->nitems][0], sizeof d->items[0][0], "%.*s", (int)sizeof d->items[0][0] - 1, line + 5);
        snprintf(d->items[d->nitems][1], sizeof d->items[0][1], "%.*s", (int)sizeof d->items[0][1] - 1, eq + 1);
        d->nitems++;
    }
    fclose(f);
    Config *c = &d->cfg;
    memset(c, 0, sizeof *c);
    c->model.layers = item_int(d, "--layers", 0), c->model.dmodel = item_int(d, "--dmodel", 0);
    c->model.heads = item_int(d, "--heads", 0), c->model.seq = item_int(d, "--seq", 0);
    c->model.vocab = item_int(d, "--vocab", 0), c->model.tied = item_int(d, "--tie-embeddings", 0);
    c->model.moe.experts = item_int(d, "--experts", 0), c->model.moe.top_k = item_int(d, "--top-k", 1);
    c->model.moe.every = item_int(d, "--moe-every", 1);
    c->batch = item_int(d, "--batch", 1), c->micro = item_int(d, "--micro", 1);
    c->recompute = item_int(d, "--recompute", 0);
    const char *p = plan_dry_item(d, "--precision");
    c->precision = !p || !strcmp(p, "fp32") ? PRECISION_FP32 : !strcmp(p, "bf16") ? PRECISION_BF16 : PRECISION_FP16;
    snprintf(c->device, sizeof c->device, "cpu");
}

static void read_startup(const char *dir, PlanDry *d) {
    char log[JOINED_PATH_BYTES + 16], line[1024];
    snprintf(log, sizeof log, "%s/r%d.log", dir, d->ranks[0].rank);
    FILE *f = fopen(log, "r");
    size_t n = 0;
    while (f && fgets(line, sizeof line, f)) {
        if (!strncmp(line, "step ", 5) || !strncmp(line, "done:", 5) || !strncmp(line, "warning", 7)) continue;
        n += snprintf(d->startup + n, n < sizeof d->startup ? sizeof d->startup - n : 0, "%s", line);
    }
    if (f) fclose(f);
    if (n >= sizeof d->startup) d->startup[sizeof d->startup - 1] = '\0';
}

void plan_dry_run(const PlanDryLayout *l, PlanDry *d) {
    memset(d, 0, sizeof *d);
    char dir[PATH_BYTES];
    const char *tmp = getenv("TMPDIR");
    snprintf(dir, sizeof dir, "%s/plan.XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(dir)) fatal(EXIT_RUNTIME, "cannot make a scratch directory %s (%s)", dir, strerror(errno));
    int *ranks = xcalloc(PLAN_DRY_MAX_RUN > l->world ? PLAN_DRY_MAX_RUN : (size_t)l->world + 1, sizeof(int));
    int n = ranks_to_run(l, d, ranks);
    /* rank 0 alone first: a layout the program refuses is refused once, in its own words */
    int status = wait_status(start_rank(l, dir, ranks[0]));
    int failed = status ? ranks[0] : -1;
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    int parallel = cores > 1 ? (int)cores : 1;
    for (int next = 1; next < n && !status;) { /* the others, `parallel` at a time */
        pid_t pids[256];
        int started = 0;
        for (; started < parallel && started < 256 && next < n; started++) pids[started] = start_rank(l, dir, ranks[next++]);
        for (int i = 0; i < started; i++) {
            int s = wait_status(pids[i]);
            if (s && !status) status = s, failed = ranks[next - started + i];
        }
    }
    if (status) {
        failure(dir, l->program, failed, status, d->error, sizeof d->error);
        d->status = status;
        nftw(dir, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
        free(ranks);
        if (!l->quiet_errors) fatal(status == EXIT_USAGE ? EXIT_USAGE : EXIT_RUNTIME, "%s", d->error);
        return;
    }
    d->nranks = n;
    d->ranks = xcalloc(n, sizeof *d->ranks);
    for (int i = 0; i < n; i++) {
        PlanDryRank *r = &d->ranks[i];
        r->rank = ranks[i];
        read_memory(dir, r);
        read_ledger(dir, r, l->chapter == 1);
        char work[JOINED_PATH_BYTES + 64];
        snprintf(work, sizeof work, "%s/r%d/dry-work.csv", dir, r->rank);
        plan_work_read(work, &r->work);
        if (l->chapter == 6 && plan_arg_given(l->args, l->nargs, "--offload")) {
            static const char *const copies[] = {"d2h_bytes", "h2d_bytes"};
            double bytes[2];
            csv_values(dir, r->rank, "steps.csv", copies, bytes, 2);
            r->to_host = bytes[0], r->to_device = bytes[1];
        }
    }
    csv_values(dir, ranks[0], "run.csv", (const char *const[]){"params"}, &d->params, 1);
    read_info(dir, d);
    read_startup(dir, d);
    nftw(dir, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
    free(ranks);
}

void plan_dry_free(PlanDry *d) {
    for (int i = 0; i < d->nranks; i++) plan_work_free(&d->ranks[i].work);
    free(d->ranks);
    d->ranks = NULL;
}

const PlanDryRank *plan_dry_rank_of(const PlanDryLayout *l, const PlanDry *d, int r) {
    if (d->per_stage) {
        int per_stage = l->world / l->dp / l->pp;
        return &d->ranks[(r % (l->world / l->dp)) / per_stage];
    }
    return &d->ranks[r % d->nranks];
}

double plan_dry_multiplicity(const PlanDryLayout *l, const PlanDry *d) {
    return (double)l->world / d->nranks;
}
