/* harness.h: the run around every chapter's training loop.
 *
 * As nccl-tests' src/common.cu holds main, the arguments, the timing and the
 * checking of every collective, so that all_reduce.cu is a small file that
 * fills one struct, this harness holds what every chapter's program does
 * around its step, and a chapter's `main` keeps only the step itself:
 *
 *   run_start       the command line (run_start_ranks: MPI first, then the
 *                   ranks' agreement on it, the shared --save directory)
 *   ...the chapter's grid and split (which need the flags, not the device)...
 *   run_prepare     the device and its --device-mem-limit, the transport,
 *                   the data, the output directory and steps.csv's header
 *   ...the chapter builds its model, optimizer and checkpoint layout...
 *   run_resume      --resume into that layout (the chapter's header line and
 *                   log_resumed's follow: the resume's notes come first)
 *   for each step:
 *     run_step_begin    the step's clock and profiling
 *     ...batch, forward, backward, communicate, update: the chapter's story...
 *     run_step_done     the slowest rank's times; says whether to evaluate
 *     run_step_log      the progress line, the steps.csv row, a due --save
 *   run_finish      run.csv, memory.csv (every rank's peaks), run-info.txt
 *                   "complete", the closing line
 *   run_end         teardown: the data, the device, MPI
 *
 * steps.csv's columns: the shared ones (run_csv.h), then the chapter's own
 * (RunSpec.columns, values in RunStep.columns), then bytes_sent and
 * comm_busy_ms for the chapters that report them, then loss_scale,skipped in
 * 16-bit runs, then with --experts E aux_loss (the balancing loss's term of
 * the objective, not in `loss`), dropped and tokens_e0..tokens_e{E-1} (the
 * step's choices, summed over the MoE blocks: tokens_e* sum to tokens x K x
 * MoE blocks less dropped). Every chapter writes the same rows the same way.
 *
 * Profiling: with COURSE_PROFILE_STEP=N (device.h) every chapter switches
 * the CUDA profiler on for step N only, between run_step_begin and
 * run_step_done (common/scripts/profile_kernels.sh).
 *
 * Each chapter describes itself once, in a RunSpec at the top of its
 * train.c: its program name, --help's summary, its flag rows, its columns.
 * The order of a step's logging is the same in every chapter: the
 * evaluation, the progress line, the steps.csv row, then a due checkpoint.
 *
 * Two backends, as KernelOps has two: one process (chapter 01, which builds
 * without MPI: harness.c) and many ranks (chapters 02-06: harness_ranks.c,
 * which reaches them through comm.h). They differ only in RunRanks. */
#ifndef HARNESS_H
#define HARNESS_H

#include "common/run/checkpoint.h" /* save and resume */
#include "common/comm/comm.h" /* collectives and messages between ranks */
#include "common/run/config.h" /* Config and the flag tables */
#include "common/run/progress.h" /* the progress and done lines */
#include "common/run/run_csv.h" /* steps.csv, memory.csv, run.csv */
#include "common/model/data.h" /* the training data and its batches */
#include "common/device/device.h" /* mem_alloc, copies, streams, timers */
#include "common/model/mixed.h" /* mixed precision: 16-bit weights, loss scaling */

#include <stddef.h>
#include <stdint.h>

enum { RUN_MAX_COLUMNS = 8 };
/* The axes of the process grid (grid.h: dp, pp, cp, tp), whose bytes the harness counts apart. */
enum { RUN_AXES = 5 };

/* One of a chapter's own steps.csv columns: its header and the printf
 * format of its value (e.g. {"bubble", "%.4f"}). */
typedef struct {
    const char *name;
    const char *format;
} RunColumn;

/* What a chapter tells the harness about itself. */
typedef struct {
    const char *program;      /* "02_data_parallel/train" */
    const char *summary;      /* --help's line: what the program teaches */
    ChapterFlags flags;       /* the chapter's rows (config.h; run_start_ranks gets .values); {0}: none */
    const RunColumn *columns; /* the chapter's steps.csv columns, ended by {0}; NULL for none */
    int bytes_sent;           /* steps.csv bytes_sent: this rank's bytes sent during the step */
    int comm_busy;            /* steps.csv comm_busy_ms: RunStep.comm_busy_ms, the max over ranks */
    int axis_bytes;           /* run.csv bytes_{dp,pp,cp,tp,ep}_per_step after its columns (run_axis_columns) */
    int barrier_each_step;    /* every rank starts a step together: one time origin for the timelines */
    int busy_csv;             /* busy.csv (rank 0): every rank's time computing, each step (run_log_busy) */
    int experts;              /* 02-06: trains --experts (moe.h), which the others refuse (chapter 01
                                 always trains it); steps.csv then reports the routing (above) */
} RunSpec;

/* One step, from run_step_begin to run_step_log. The chapter fills rec's
 * loss, lr, grad_norm and its fwd/bwd/comm/opt times, skipped, columns and
 * comm_busy_ms; the harness the rest. */
typedef struct {
    int step;                        /* 0-based: the batch of this step */
    StepRecord rec;                  /* this rank's times; after run_step_done the slowest rank's */
    double own_step_ms;              /* this rank's step time (rec.step_ms is the slowest's) */
    double columns[RUN_MAX_COLUMNS]; /* the chapter's columns, in RunSpec.columns' order */
    double comm_busy_ms;             /* RunSpec.comm_busy: the collectives running, hidden or not */
    MoeStats moe;                    /* --experts: the step's routing (the micro-batches' forwards);
                                        after run_step_done summed over the ranks */
    double bytes_sent;               /* RunSpec.bytes_sent: set by run_step_done */
    float loss_scale;                /* fp16: the scale of this step's backward (1 otherwise) */
    int skipped;                     /* fp16: the step overflowed and was skipped */
    Timer clock;
    double bytes_at_start;
    CommLedger ledger_at_start; /* many ranks: comm.h's ledger when the step began */
} RunStep;

typedef struct Run Run;

/* What differs between one process and many ranks (harness.c, harness_ranks.c). */
typedef struct {
    void (*device_ready)(Run *run);              /* the transport, once the device is chosen */
    void (*barrier)(Run *run);                   /* every rank here before any goes on */
    double (*bytes_sent)(void);                  /* this rank's bytes sent so far */
    void (*ledger)(CommLedger *out);             /* the same per kind of call and axis (comm_ledger); NULL: one */
    void (*axis_columns)(Run *run, char *header, char *values, size_t size); /* run_axis_columns; NULL: one */
    void (*slowest_times)(Run *run, RunStep *s); /* max over the ranks (comm_busy_ms too) */
    void (*save)(Run *run, const CkptState *state);
    size_t (*peak_device)(Run *run);    /* the largest device peak of any rank (run.csv) */
    void (*write_memory_csv)(Run *run); /* every rank's peaks */
    void (*end)(void);
} RunRanks;

struct Run {
    const RunSpec *spec;
    Config *cfg;
    const RunRanks *across;
    CommGroup *world; /* multi-rank programs; NULL for one process */
    int rank, ranks, local_rank;
    Dataset data;
    OutFile *steps_csv;        /* rank 0 */
    OutFile *busy_csv;         /* rank 0, with RunSpec.busy_csv */
    LossScaler scaler;         /* fp16's loss scale (mixed.h), kept in checkpoints */
    uint64_t rng;              /* the text sampler's generator, kept in checkpoints */
    CkptLayout ckpt;           /* what this rank holds of a checkpoint: the chapter fills it (checkpoint.h) */
    int *adam_t;               /* the optimizer's update count, for the checkpoints (run_resume) */
    int first_step, last_step; /* 0-based: the steps this run trains, [first_step, last_step) */
    double tokens_per_step;    /* of the global batch */
    float dloss;               /* d(loss)/d(each token's loss): the loss is the mean over the global batch */
    double *step_ms;           /* every step's time (the slowest rank's), for the median */
    double final_loss;
    double bytes_sent;    /* RunSpec.bytes_sent: this rank's bytes over the steps run */
    CommLedger ledger; /* many ranks: this rank's bytes over the steps run, by kind of call and grid axis */
    int dp, tp, pp, zero; /* the layout, for run.csv (run_layout) */
};

/* Start-up, before anything is built. One process: the command line into
 * cfg (config_parse; chapter 01 has no flags of its own). Many ranks (programs run under mpirun): MPI, the
 * world size into *world_size (where the chapter's flag checks want it), the command line into cfg and the
 * chapter's flags into flag_values, the ranks' agreement (config_parse_ranks), the --save directory every
 * rank must see (checkpoint_sharded.h). Ends the program after --help or on an error. */
void run_start(Run *run, Config *cfg, int argc, char **argv, const RunSpec *spec);
void run_start_ranks(Run *run, Config *cfg, int *argc, char ***argv, const RunSpec *spec, void *flag_values,
                     int *world_size);
/* The dry run: `--dry-run --world N --rank R` (config.h's rows, shared by
 * every chapter) makes the program rank R of a job of N, alone and without
 * MPI (comm_init_dry), on the dry device (device_set_dry): its whole
 * start-up and its steps (--steps 1 for one) with the code a real run uses,
 * computing and sending nothing, but allocating (as address space) and
 * counting every byte. The files rank 0 writes, rank R writes: steps.csv and
 * run.csv with times and losses 0, run.csv's bytes_{dp,pp,cp,tp,ep}_per_step
 * this rank's share (a real run's are the sum over its ranks), and
 * memory.csv with this rank's rows only (labelled R), and dry-comm.csv:
 * this rank's calls and bytes per step by kind of call and grid axis
 * (comm.h's ledger), for the planner (common/plan). The sample at the end
 * runs too (on zeros: its text is noise), for the buffers it grows; no
 * evaluation or checkpoint. Under mpirun with more than one process it ends
 * the program with one line (dry_run_refuse_mpirun). */
void dry_run_refuse_mpirun(void);

/* The device (this rank's GPU) and its budget, the transport, the data, and
 * on rank 0 the output directory and steps.csv's header. */
void run_prepare(Run *run);

/* After the chapter built run->ckpt: with --resume, read this rank's part
 * of the checkpoint (adam_t: the optimizer's update count; run->first_step
 * its step). Returns 1 when it resumed (16-bit runs then round their
 * weights from the master weights read). */
int run_resume(Run *run, int *adam_t);

/* The step's clock (after a barrier with RunSpec.barrier_each_step) and,
 * on the profiled step, the profiler. */
RunStep run_step_begin(Run *run, int step);
/* After the update: stop the clock and the profiler, take the slowest
 * rank's times. Returns 1 when the validation loss is due (every
 * --eval-every steps and the last): the chapter evaluates into s->rec.val_loss. */
int run_step_done(Run *run, RunStep *s);
/* The progress line and the steps.csv row (rank 0), and a checkpoint when
 * one is due (every rank). */
void run_step_log(Run *run, RunStep *s);
/* Is a checkpoint due after this step? (For work that must precede it.) */
int run_save_due(const Run *run, const RunStep *s);

/* RunSpec.busy_csv (many ranks): busy.csv's rows rank,step,busy_ms,step_ms,
 * every rank's time computing in the step (its step less comm_ms, the time
 * it waited or communicated). Collective over the world; returns, on rank 0,
 * the step's idle fraction: 1 - the ranks' busy time over ranks x the
 * slowest rank's step (a chapter's steps.csv column idle_fraction). Call
 * after run_step_done. */
double run_log_busy(Run *run, const RunStep *s, double comm_ms);

/* Many ranks: the bytes sent per step on each axis of the process grid
 * (grid.h's order: dp, pp, cp, tp, then ep: grid_counter_name), summed over every rank, the mean over
 * the steps run: what run_step_begin..run_step_done saw (the evaluation's
 * messages are not counted). Collective over the world. */
void run_axis_bytes_per_step(Run *run, double per_step[RUN_AXES]);
/* Those bytes as run.csv's columns bytes_dp_per_step, bytes_pp_per_step,
 * bytes_cp_per_step, bytes_tp_per_step, bytes_ep_per_step: ",bytes_dp_per_step,..." appended
 * to header and ",N,..." to values (each a buffer of `size` bytes).
 * run_finish adds them after the chapter's columns where RunSpec.axis_bytes
 * asks (chapters 02-06). Collective over the world. */
void run_axis_columns(Run *run, char *header, char *values, size_t size);
/* The layout run.csv reports (default: dp 1, tp 1, pp 1, zero 0). */
void run_layout(Run *run, int dp, int tp, int pp, int zero);
/* After the last step, every rank calls it. Rank 0 writes run.csv (the
 * model of `params` parameters, the layout, the median step, the final
 * loss, the peak over the ranks, and the chapter's columns: extra_header
 * ",a,b" and extra_values ",1,2", or NULL; then RunSpec.axis_bytes's); then memory.csv with every
 * rank's peaks; only then run-info.txt's "complete", and the closing line
 * with the chapter's details (printf-style). */
void run_finish(Run *run, size_t params, const char *extra_header, const char *extra_values,
                const char *details_fmt, ...) __attribute__((format(printf, 5, 6)));
/* Teardown, after the chapter freed its own: the data, the device, MPI. */
void run_end(Run *run);

/* For harness_ranks.c: what both backends share of start-up. */
void run_init_fields(Run *run, Config *cfg, const RunSpec *spec);

#endif
