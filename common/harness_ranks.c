/* harness_ranks.c: the harness (harness.h) for programs of many ranks,
 * chapters 02-06: what differs from one process goes through comm.h. Apart
 * from harness.c because it needs MPI, which chapter 01 builds without. */
#include "checkpoint_sharded.h"
#include "comm.h"
#include "harness.h"

static void ranks_device_ready(Run *run) {
    comm_select(run->cfg->comm);
}

static void ranks_barrier(Run *run) {
    comm_barrier(run->world);
}

static void ranks_slowest_times(Run *run, RunStep *s) {
    comm_slowest_times(run->world, &s->rec);
    if (run->spec->comm_busy) s->comm_busy_ms = comm_allreduce_double(run->world, s->comm_busy_ms, 1);
}

static void ranks_save(Run *run, const CkptState *state) {
    checkpoint_save_sharded(run->world, run->cfg, &run->ckpt, state);
}

static size_t ranks_write_memory_csv(Run *run) {
    return comm_write_memory_csv(run->world, run->cfg->out);
}

static const RunRanks many_ranks = {ranks_device_ready,  ranks_barrier, comm_bytes_sent,
                                    ranks_slowest_times, ranks_save,    ranks_write_memory_csv,
                                    comm_finalize};

void run_start_ranks(Run *run, Config *cfg, int *argc, char ***argv, const RunSpec *spec,
                     const ChapterFlags *flags, int *world_size) {
    comm_init(argc, argv);
    run_init_fields(run, cfg, spec);
    run->across = &many_ranks;
    run->world = comm_world();
    run->rank = comm_rank(run->world);
    run->ranks = comm_size(run->world);
    *world_size = run->ranks;
    comm_parse_config(cfg, *argc, *argv, spec->program, spec->summary, flags);
    checkpoint_check_shared_directory(run->world, cfg);
    run->local_rank = comm_local_rank();
}
