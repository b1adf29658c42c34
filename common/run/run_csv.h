/* run_csv.h: the CSVs every program writes into --out (run_dir.h writes them).
 *
 *   steps.csv  (rank 0) one row per optimizer step:
 *              step,loss,lr,grad_norm,step_ms,fwd_ms,bwd_ms,comm_ms,opt_ms,tokens_per_s,val_loss
 *              (loss is measured before the step's update, val_loss after it, on the
 *              validation split; times are the slowest rank's; val_loss is empty
 *              when not evaluated;
 *              chapters may append columns, never rename these)
 *   memory.csv rank,space,category,peak_bytes: one row per rank, space and category
 *   run.csv    one row describing the whole run (see RunSummary)
 * Columns and their meaning are documented in course.md. */
#ifndef RUN_CSV_H
#define RUN_CSV_H

#include "common/run/config.h" /* Config and the flag tables */
#include "common/run/run_dir.h" /* the --out directory and its files */

#include <stddef.h>

typedef struct {
    int step; /* 1-based */
    double loss, lr, grad_norm;
    double step_ms, fwd_ms, bwd_ms, comm_ms, opt_ms;
    double tokens_per_s;
    double val_loss; /* NAN when not evaluated at this step */
} StepRecord;

typedef struct {
    const char *program, *device;
    int world_size, dp, tp, pp, zero;
    size_t params;
    int layers, dmodel, heads, seq, batch, micro, steps;
    double final_loss, median_step_ms, tokens_per_s;
    size_t peak_device_bytes;
} RunSummary;

/* steps.csv: extra_header is appended to the standard header (e.g.
 * ",exposed_comm_ms"), or NULL. A resumed run appending to its own directory
 * keeps the rows up to the checkpoint's step. */
OutFile *steps_csv_open(const Config *cfg, const char *extra_header);
void steps_csv_write(OutFile *f, const StepRecord *r, const char *extra_values);

/* memory.csv from peaks[rank][space][category] of nranks ranks. */
void memory_csv_write(const char *dir, int nranks, const size_t *peaks);
/* The same for ranks first_rank.. (a dry run's one rank, harness.h). */
void memory_csv_write_from(const char *dir, int first_rank, int nranks, const size_t *peaks);
/* This process's peaks in the layout memory_csv_write expects (SPACE_COUNT*CAT_COUNT). */
void memory_peaks_local(size_t *peaks);

/* The logs of a job of many ranks (run_csv_ranks.c, linked by the programs
 * that use MPI). memory.csv for the whole job: every rank's (space,
 * category) peaks, gathered and written by rank 0 into dir; returns the
 * largest device peak of any rank (run.csv's peak_device_bytes), on every
 * rank. And a step's times as the slowest rank saw them (max over g of
 * step, forward, backward, communication and optimizer milliseconds): what
 * steps.csv shows. */
typedef struct CommGroup CommGroup;
size_t memory_csv_write_ranks(CommGroup *world, const char *dir);
void step_times_slowest(CommGroup *g, StepRecord *rec);

/* A summary of a run of `steps` steps whose times are step_ms[0..steps)
 * (reordered): the model and batch from cfg, the device, the median step
 * time and tokens/s derived from it; one device, no parallelism. Chapters
 * then set their own fields (world_size, dp, tp, pp, final_loss, peak).
 * The timing rule of every chapter: the median leaves out the run's first
 * step (warm-up: first touches of memory, cuBLAS and NCCL set-up) when the
 * run has more than one. */
void run_summary_init(RunSummary *r, const char *program, const Config *cfg, size_t params, double *step_ms,
                      int steps);
void run_csv_write(const char *dir, const RunSummary *r);
/* The same with chapter columns appended: extra_header ",a,b", extra_values ",1,2". */
void run_csv_write_extra(const char *dir, const RunSummary *r, const char *extra_header,
                         const char *extra_values);

/* The timing rule of every chapter: the median of a run's per-step values
 * leaving out its first (warm-up) step when it has more than one; 0 for none. */
double median_after_warmup(double *values, int n);

#endif
