/* harness.c: see harness.h. What one process and many ranks share, and the
 * one-process backend (chapter 01, built without MPI). */
#include "common/run/harness.h" /* the run around the training loop */

#include "common/run/dry_work.h" /* dry-work.csv */
#include "common/run/preflight.h" /* checks before anything is built */
#include "common/core/util.h" /* fatal, log_info, exit codes, flag parsing */
#include "common/kernels/work_ledger.h" /* a dry run's counted work */

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- the one-process backend ---- */

static void one_device_ready(Run *run) {
    (void)run;
}

static void one_barrier(Run *run) {
    (void)run;
}

static double one_bytes_sent(void) {
    return 0.0;
}

static void one_slowest_times(Run *run, RunStep *s) {
    (void)run;
    (void)s;
}

static void one_save(Run *run, const CkptState *state) {
    checkpoint_save(run->cfg, &run->ckpt, state);
}

static size_t one_peak_device(Run *run) {
    (void)run;
    return mem_peak_total(SPACE_DEVICE);
}

static void one_write_memory_csv(Run *run) {
    size_t peaks[SPACE_COUNT * CAT_COUNT];
    memory_peaks_local(peaks);
    memory_csv_write(run->cfg->out, 1, peaks);
}

static void one_end(void) {}

static const RunRanks one_process = {.device_ready = one_device_ready,
                                     .barrier = one_barrier,
                                     .bytes_sent = one_bytes_sent,
                                     .slowest_times = one_slowest_times,
                                     .save = one_save,
                                     .peak_device = one_peak_device,
                                     .write_memory_csv = one_write_memory_csv,
                                     .end = one_end};

/* ---- start-up ---- */

void run_init_fields(Run *run, Config *cfg, const RunSpec *spec) {
    *run = (Run){.spec = spec, .cfg = cfg, .across = &one_process, .ranks = 1, .dp = 1, .tp = 1, .pp = 1};
}

void run_start(Run *run, Config *cfg, int argc, char **argv, const RunSpec *spec) {
    run_init_fields(run, cfg, spec);
    int world, rank;
    if (dry_run_requested(argc, argv, &world, &rank)) dry_run_refuse_mpirun();
    config_parse(cfg, argc, argv, spec->program, spec->summary, NULL);
}

void dry_run_refuse_mpirun(void) {
    const char *names[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE"};
    for (int i = 0; i < 3; i++) {
        const char *size = getenv(names[i]);
        if (size && atoi(size) > 1)
            fatal(EXIT_USAGE,
                  "--dry-run runs one rank as one process, not under mpirun (this job has %s processes; "
                  "valid: run it alone, with --world N --rank R)",
                  size);
    }
}

/* Who writes the run's files: rank 0, or the one rank of a dry run. */
static int run_writes_files(const Run *run) {
    return run->rank == 0 || run->cfg->dry_run;
}

/* steps.csv's header after the shared columns: the chapter's, the shared
 * optional ones, fp16's scaling. */
static void chapter_header(const Run *run, char *header, size_t size) {
    const RunSpec *spec = run->spec;
    size_t n = 0;
    header[0] = '\0';
    for (int c = 0; spec->columns && spec->columns[c].name; c++) {
        if (c == RUN_MAX_COLUMNS)
            fatal(EXIT_RUNTIME, "%s: more than %d columns of its own", spec->program, c);
        n += snprintf(header + n, size - n, ",%s", spec->columns[c].name);
    }
    if (spec->bytes_sent) n += snprintf(header + n, size - n, ",bytes_sent");
    if (spec->comm_busy) n += snprintf(header + n, size - n, ",comm_busy_ms");
    if (run->cfg->precision != PRECISION_FP32) n += snprintf(header + n, size - n, ",loss_scale,skipped");
    if (run->cfg->model.moe.experts) {
        n += snprintf(header + n, size - n, ",aux_loss,dropped");
        for (int e = 0; e < run->cfg->model.moe.experts; e++)
            n += snprintf(header + n, size - n, ",tokens_e%d", e);
    }
}

void run_prepare(Run *run) {
    Config *cfg = run->cfg;
    device_set_dry(cfg->dry_run); /* device.h: "The dry run" */
    device_init(cfg->device, run->local_rank); /* a dry run: the CPU backend, whatever the choice */
    device_set_limit(cfg->device_mem_limit);
    device_set_mixed_precision(cfg->precision != PRECISION_FP32); /* CUDA: TF32 attention in 16 bits */
    run->across->device_ready(run);
    data_load(&run->data, cfg->data, cfg->model.seq);
    if (run_writes_files(run)) {
        out_dir_prepare(cfg, run->spec->program);
        char header[1536]; /* 64 experts' columns fit */
        chapter_header(run, header, sizeof header);
        run->steps_csv = steps_csv_open(cfg, header);
    }
    if (run->spec->busy_csv && run->rank == 0) {
        run->busy_csv = out_open(cfg->out, "busy.csv", OUT_LINES, 0);
        out_printf(run->busy_csv, "rank,step,busy_ms,step_ms\n");
    }
    run->across->barrier(run); /* the output directory exists before any rank writes into it */
    loss_scaler_init(&run->scaler, cfg);
    run->rng = cfg->seed; /* for the text sampler */
    run->last_step = cfg->stop_after ? cfg->stop_after : cfg->steps;
    run->tokens_per_step = (double)cfg->batch * cfg->model.seq;
    run->dloss = (float)(1.0 / run->tokens_per_step); /* the mean over every token of the GLOBAL batch */
    run->step_ms = xcalloc(run->last_step, sizeof(double));
    run->final_loss = NAN;
}

int run_resume(Run *run, int *adam_t) {
    run->adam_t = adam_t;
    if (!run->cfg->resume[0]) return 0;
    run->first_step = checkpoint_resume(run->cfg, &run->ckpt, adam_t, &run->rng, &run->scaler);
    return 1;
}

/* ---- a step ---- */

RunStep run_step_begin(Run *run, int step) {
    RunStep s = {.step = step, .rec = {.step = step + 1, .val_loss = NAN}, .loss_scale = run->scaler.scale};
    s.bytes_at_start = run->across->bytes_sent();
    if (run->across->ledger) run->across->ledger(&s.ledger_at_start);
    if (run->spec->barrier_each_step) run->across->barrier(run);
    work_reset(); /* a dry run's dry-work.csv holds the last step's work (work_ledger.h) */
    profile_step_begin(step + 1);
    timer_start(&s.clock);
    return s;
}

int run_step_done(Run *run, RunStep *s) {
    s->rec.step_ms = s->own_step_ms = timer_stop_ms(&s->clock);
    work_step_end(); /* dry-work.csv: what comes after (the sample) is not the step's */
    profile_step_end(s->step + 1);
    if (run->spec->bytes_sent) {
        s->bytes_sent = run->across->bytes_sent() - s->bytes_at_start;
        run->bytes_sent += s->bytes_sent;
    }
    if (run->across->ledger) {
        CommLedger now;
        run->across->ledger(&now);
        for (int k = 0; k < COMM_KINDS; k++)
            for (int c = 0; c <= COMM_COUNTERS; c++) {
                run->ledger.bytes[k][c] += now.bytes[k][c] - s->ledger_at_start.bytes[k][c];
                run->ledger.calls[k][c] += now.calls[k][c] - s->ledger_at_start.calls[k][c];
            }
    }
    run->across->slowest_times(run, s);
    s->rec.tokens_per_s =
        s->rec.step_ms > 0 ? run->tokens_per_step / (s->rec.step_ms / 1e3) : 0.0; /* dry: 0 */
    run->step_ms[s->step] = s->rec.step_ms;
    run->final_loss = s->rec.loss;
    int eval_every = run->cfg->eval_every;
    if (run->cfg->dry_run) return 0; /* no evaluation: the weights hold nothing to measure */
    return s->step + 1 == run->last_step || (eval_every && (s->step + 1) % eval_every == 0);
}

/* The values after the shared columns, in chapter_header's order. */
static void chapter_values(const Run *run, const RunStep *s, char *values, size_t size) {
    const RunSpec *spec = run->spec;
    size_t n = 0;
    values[0] = '\0';
    for (int c = 0; spec->columns && spec->columns[c].name; c++) {
        n += snprintf(values + n, size - n, ",");
        n += snprintf(values + n, size - n, spec->columns[c].format, s->columns[c]);
    }
    if (spec->bytes_sent) n += snprintf(values + n, size - n, ",%.0f", s->bytes_sent);
    if (spec->comm_busy) n += snprintf(values + n, size - n, ",%.4f", s->comm_busy_ms);
    if (run->cfg->precision != PRECISION_FP32)
        n += snprintf(values + n, size - n, ",%g,%d", s->loss_scale, s->skipped);
    if (run->cfg->model.moe.experts) { /* aux_sum is over sequences: their mean is the objective's term */
        n += snprintf(values + n, size - n, ",%.6f,%.0f", s->moe.aux_sum / run->cfg->batch, s->moe.dropped);
        for (int e = 0; e < run->cfg->model.moe.experts; e++)
            n += snprintf(values + n, size - n, ",%.0f", s->moe.tokens[e]);
    }
}

int run_save_due(const Run *run, const RunStep *s) {
    return checkpoint_due(run->cfg, s->step + 1, run->last_step);
}

void run_step_log(Run *run, RunStep *s) {
    const Config *cfg = run->cfg;
    if (run_writes_files(run)) {
        if (!cfg->quiet || s->step + 1 == run->last_step) log_step(&s->rec, cfg->steps);
        char values[1536];
        chapter_values(run, s, values, sizeof values);
        steps_csv_write(run->steps_csv, &s->rec, values);
    }
    if (run_save_due(run, s)) {
        CkptState state = ckpt_state(s->step + 1, *run->adam_t, run->rng, &run->scaler);
        run->across->save(run, &state);
    }
}

/* ---- the end ---- */

void run_layout(Run *run, int dp, int tp, int pp, int zero) {
    run->dp = dp;
    run->tp = tp;
    run->pp = pp;
    run->zero = zero;
}

/* run.csv's one row (rank 0). */
static void write_run_csv(const Run *run, size_t params, size_t peak_device, const char *extra_header,
                          const char *extra_values, RunSummary *r) {
    run_summary_init(r, run->spec->program, run->cfg, params, run->step_ms + run->first_step,
                     run->last_step - run->first_step);
    r->world_size = run->ranks;
    r->dp = run->dp;
    r->tp = run->tp;
    r->pp = run->pp;
    r->zero = run->zero;
    r->final_loss = run->final_loss;
    r->peak_device_bytes = peak_device;
    run_csv_write_extra(run->cfg->out, r, extra_header, extra_values);
}

void run_finish(Run *run, size_t params, const char *extra_header, const char *extra_values,
                const char *details_fmt, ...) {
    if (run_writes_files(run)) out_close(run->steps_csv);
    run->steps_csv = NULL;
    if (run->busy_csv) out_close(run->busy_csv);
    run->busy_csv = NULL;
    size_t peak_device = run->across->peak_device(run);
    char header[512], values[512]; /* the chapter's columns, then (RunSpec.axis_bytes) each axis's bytes */
    if ((size_t)snprintf(header, sizeof header, "%s", extra_header ? extra_header : "") >= sizeof header ||
        (size_t)snprintf(values, sizeof values, "%s", extra_values ? extra_values : "") >= sizeof values)
        fatal(EXIT_RUNTIME, "run_finish: run.csv's columns are longer than %zu bytes", sizeof header);
    if (run->spec->axis_bytes && run->across->axis_columns)
        run->across->axis_columns(run, header, values, sizeof header);
    RunSummary r;
    if (run_writes_files(run)) write_run_csv(run, params, peak_device, header, values, &r);
    run->across->write_memory_csv(run);
    if (run->cfg->dry_run) dry_work_csv_write(run->cfg->out); /* dry_work.h */
    if (!run_writes_files(run)) return;
    run_info_complete(run->cfg);
    char details[1024];
    va_list args;
    va_start(args, details_fmt);
    vsnprintf(details, sizeof details, details_fmt, args);
    va_end(args);
    log_run_done(&r, "%s", details);
}

void run_end(Run *run) {
    free(run->step_ms);
    ckpt_layout_free(&run->ckpt);
    data_free(&run->data);
    device_shutdown();
    run->across->end();
}
