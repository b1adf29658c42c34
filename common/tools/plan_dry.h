/* plan_dry.h: the planner's one way of knowing a layout: it runs the
 * chapter's own program as a dry run (harness.h: `NN/train --dry-run --world
 * N --rank R`), one process per distinct rank, and reads what each wrote.
 *
 * A dry rank performs the chapter's whole start-up and one training step with
 * the code a real run uses, on a device that allocates address space only
 * and a transport that sends nothing and counts every byte. What it writes is
 * therefore the run's own accounting, not a second copy of it:
 *
 *   memory.csv    the rank's peak bytes by (space, category), as a real run's row of that rank
 *   dry-comm.csv  the rank's calls and bytes per step by kind of call and grid axis (comm.h's ledger)
 *   dry-work.csv  the rank's step piece by piece, each with its counted FLOPs (plan_work.h)
 *   steps.csv     06: the host-device copies (d2h_bytes, h2d_bytes)
 *   run.csv       the parameters
 *   run-info.txt  the configuration the program read from its flags (every flag, defaults included)
 *   stdout        the program's start-up lines (its layout, stages, ...)
 *
 * The chapter checks its flags itself: a layout it refuses comes back as its
 * own one line and exit status. Which ranks run: every rank of one replica
 * (the replicas hold and send alike), or with --allreduce ring every rank of
 * the world (each has its own place in the ring), and where that is more
 * than PLAN_DRY_MAX_RUN ranks, the first rank of each stage only (the
 * tensor- and context-parallel ranks of a stage hold and send alike; the
 * plan then says so). */
#ifndef PLAN_DRY_H
#define PLAN_DRY_H

#include "common/comm/comm.h" /* collectives and messages between ranks */
#include "common/run/config.h" /* Config and the flag tables */
#include "common/device/device.h" /* mem_alloc, copies, streams, timers */
#include "common/tools/plan_work.h" /* the step time from counted work */

#include <stddef.h>

enum { PLAN_DRY_MAX_RUN = 64 };

/* The layout: the chapter's program, its command line (the user's flags, less
 * the planner's own), and the world's ranks on the grid's axes. */
typedef struct {
    int chapter;      /* 1..6 */
    const char *program;
    char **args;      /* the flags handed to the program */
    int nargs;
    int world, dp, pp, cp, tp;
    int threads;      /* OMP_NUM_THREADS of every dry rank; 0: the environment's */
    int quiet_errors; /* --search: a refusal is a candidate's reason, not the planner's error */
    int stage_firsts; /* --search: each stage's first rank only, whatever the world */
} PlanDryLayout;

/* What one dry rank wrote. */
typedef struct {
    int rank;
    size_t bytes[SPACE_COUNT][CAT_COUNT]; /* memory.csv: peak bytes */
    CommLedger ledger;                    /* dry-comm.csv: per step */
    double to_host, to_device;            /* 06's steps.csv: d2h_bytes, h2d_bytes a step */
    PlanWork work;                        /* dry-work.csv: the step's pieces of work, in order */
} PlanDryRank;

typedef struct {
    int nranks;         /* the ranks run */
    PlanDryRank *ranks; /* in rank order */
    int per_stage;      /* 1: only each stage's first rank ran (the world is larger than PLAN_DRY_MAX_RUN) */
    int replica_only;   /* 1: only replica 0's ranks ran */
    double params;      /* run.csv */
    char startup[4096]; /* rank 0's start-up lines on stdout */
    char error[1024];   /* a refused layout: the program's line (quiet_errors), else "" */
    int status;         /* its exit status (0: ran) */
    /* the configuration the program read (run-info.txt's items), for the time model and the header */
    Config cfg;
    char items[160][2][96]; /* name, value (values cut at 95 bytes) */
    int nitems;
} PlanDry;

/* Runs the layout's dry ranks. A refusal ends the planner with the program's own line and status,
 * unless quiet_errors (then d->status and d->error say it). */
void plan_dry_run(const PlanDryLayout *l, PlanDry *d);
void plan_dry_free(PlanDry *d);
/* run-info.txt's value of a flag ("--zero"), or NULL. */
const char *plan_dry_item(const PlanDry *d, const char *flag);
/* The dry rank that stands for world rank r, and how many world ranks each ran rank stands for. */
const PlanDryRank *plan_dry_rank_of(const PlanDryLayout *l, const PlanDry *d, int r);
double plan_dry_multiplicity(const PlanDryLayout *l, const PlanDry *d);

/* The flag `name`'s value in args ("--tp 2" or "--tp=2"), or NULL; whether it is there. */
const char *plan_arg_value(char **args, int nargs, const char *name);
int plan_arg_given(char **args, int nargs, const char *name);
/* Whether `program --help` lists the flag `name` (asked once per program and flag). */
int plan_program_takes(const char *program, const char *name);

#endif
