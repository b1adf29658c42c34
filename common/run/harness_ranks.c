/* harness_ranks.c: the harness (harness.h) for programs of many ranks,
 * chapters 02-06: what differs from one process goes through comm.h. Apart
 * from harness.c because it needs MPI, which chapter 01 builds without. */
#include "common/run/checkpoint_sharded.h" /* each rank's part of one checkpoint */
#include "common/comm/comm.h" /* collectives and messages between ranks */
#include "common/comm/grid.h" /* the process grid: dp x pp x cp x tp */
#include "common/run/harness.h" /* the run around the training loop */
#include "common/run/preflight.h" /* checks before anything is built */
#include "common/core/util.h" /* fatal, log_info, exit codes, flag parsing */

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void ranks_device_ready(Run *run) {
    comm_select(run->cfg->comm);
}

static void ranks_barrier(Run *run) {
    comm_barrier(run->world);
}

static void ranks_slowest_times(Run *run, RunStep *s) {
    step_times_slowest(run->world, &s->rec);
    if (run->spec->comm_busy) s->comm_busy_ms = comm_allreduce_double(run->world, s->comm_busy_ms, 1);
    if (run->cfg->model.moe.experts) { /* the routing of every rank's share of the batch */
        for (int e = 0; e < run->cfg->model.moe.experts; e++)
            s->moe.tokens[e] = comm_allreduce_double(run->world, s->moe.tokens[e], 0);
        s->moe.dropped = comm_allreduce_double(run->world, s->moe.dropped, 0);
        s->moe.aux_sum = comm_allreduce_double(run->world, s->moe.aux_sum, 0);
    }
}

static void ranks_save(Run *run, const CkptState *state) {
    checkpoint_save_sharded(run->world, run->cfg, &run->ckpt, state);
}

static size_t ranks_peak_device(Run *run) {
    return (size_t)comm_allreduce_double(run->world, (double)mem_peak_total(SPACE_DEVICE), 1);
}

/* A dry run's dry-comm.csv (harness.h): this rank's bytes and calls per step by kind of call
 * and grid axis, for common/plan. */
static void write_dry_comm_csv(const Run *run) {
    int steps = run->last_step - run->first_step;
    OutFile *f = out_open(run->cfg->out, "dry-comm.csv", OUT_WHOLE, 0);
    out_printf(f, "collective,axis,calls_per_step,bytes_per_step\n");
    for (int k = 0; k < COMM_KINDS; k++)
        for (int c = 0; c <= COMM_COUNTERS; c++)
            if (run->ledger.calls[k][c] > 0)
                out_printf(f, "%s,%s,%.9g,%.0f\n", comm_kind_name((CommKind)k),
                           c < RUN_AXES ? grid_counter_name(c) : "none",
                           run->ledger.calls[k][c] / (steps > 0 ? steps : 1),
                           run->ledger.bytes[k][c] / (steps > 0 ? steps : 1));
    out_close(f);
}

static void ranks_write_memory_csv(Run *run) {
    memory_csv_write_ranks(run->world, run->cfg->out);
    if (run->cfg->dry_run) write_dry_comm_csv(run);
}

static const RunRanks many_ranks = {.device_ready = ranks_device_ready,
                                    .barrier = ranks_barrier,
                                    .bytes_sent = comm_bytes_sent,
                                    .ledger = comm_ledger,
                                    .axis_columns = run_axis_columns,
                                    .slowest_times = ranks_slowest_times,
                                    .save = ranks_save,
                                    .peak_device = ranks_peak_device,
                                    .write_memory_csv = ranks_write_memory_csv,
                                    .end = comm_finalize};

_Static_assert((int)RUN_AXES == (int)GRID_COUNTERS,
               "the harness counts the bytes of each axis of the process grid, and of expert parallelism's");

double run_log_busy(Run *run, const RunStep *s, double comm_ms) {
    int ranks = run->ranks;
    double busy[2] = {s->own_step_ms - comm_ms, s->own_step_ms};
    double *busy_all = xcalloc(2 * (size_t)ranks, sizeof(double));
    comm_gather_bytes(run->world, busy, sizeof busy, busy_all, 0);
    double busy_sum = 0.0;
    for (int r = 0; r < ranks && run->rank == 0; r++) {
        out_printf(run->busy_csv, "%d,%d,%.4f,%.4f\n", r, s->step + 1, busy_all[2 * r], busy_all[2 * r + 1]);
        busy_sum += busy_all[2 * r];
    }
    free(busy_all);
    return 1.0 - busy_sum / (ranks * s->rec.step_ms);
}

void run_axis_bytes_per_step(Run *run, double per_step[RUN_AXES]) {
    int steps = run->last_step - run->first_step;
    for (int a = 0; a < RUN_AXES; a++) {
        double sent = 0.0; /* the axis's column of the ledger, every kind of call */
        for (int k = 0; k < COMM_KINDS; k++) sent += run->ledger.bytes[k][a];
        per_step[a] = comm_allreduce_double(run->world, sent, 0) / (steps > 0 ? steps : 1);
    }
}

void run_axis_columns(Run *run, char *header, char *values, size_t size) {
    double per_step[RUN_AXES];
    run_axis_bytes_per_step(run, per_step);
    size_t h = strlen(header), v = strlen(values);
    for (int a = 0; a < RUN_AXES; a++) {
        h += snprintf(header + h, h < size ? size - h : 0, ",bytes_%s_per_step", grid_counter_name(a));
        v += snprintf(values + v, v < size ? size - v : 0, ",%.0f", per_step[a]);
    }
    if (h >= size || v >= size)
        fatal(EXIT_RUNTIME, "run_axis_columns: %zu bytes are too few for the columns", size);
}

void run_start_ranks(Run *run, Config *cfg, int *argc, char ***argv, const RunSpec *spec, void *flag_values,
                     int *world_size) {
    int dry_world, dry_rank;
    if (dry_run_requested(*argc, *argv, &dry_world, &dry_rank)) {
        dry_run_refuse_mpirun();
        comm_init_dry(dry_world, dry_rank); /* comm.h: no MPI, every byte counted */
    } else {
        comm_init(argc, argv);
    }
    run_init_fields(run, cfg, spec);
    run->across = &many_ranks;
    run->world = comm_world();
    run->rank = comm_rank(run->world);
    run->ranks = comm_size(run->world);
    *world_size = run->ranks;
    ChapterFlags flags = spec->flags;
    flags.values = flag_values;
    flags.harness = 1; /* --dry-run and its --world and --rank */
    flags.experts = spec->experts; /* --experts, or its refusal */
    config_parse_ranks(cfg, *argc, *argv, spec->program, spec->summary, &flags);
    checkpoint_check_shared_directory(run->world, cfg);
    run->local_rank = comm_local_rank();
}
