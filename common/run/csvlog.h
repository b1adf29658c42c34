/* csvlog.h: what every program writes into --out, and its progress lines.
 *
 *   steps.csv  (rank 0) one row per optimizer step:
 *              step,loss,lr,grad_norm,step_ms,fwd_ms,bwd_ms,comm_ms,opt_ms,tokens_per_s,val_loss
 *              (loss is measured before the step's update, val_loss after it, on the
 *              validation split; times are the slowest rank's; val_loss is empty
 *              when not evaluated;
 *              chapters may append columns, never rename these)
 *   memory.csv rank,space,category,peak_bytes: one row per rank, space and category
 *   run.csv    one row describing the whole run (see RunSummary)
 *   run-info.txt  which program and configuration wrote the directory, whether
 *              the run completed, and the checkpoints it saved
 * Columns and their meaning are documented in course.md.
 *
 * Nothing is lost silently: every write, flush and close is checked, and a
 * failure (a full disk: ENOSPC, EIO) ends the run with EXIT_RUNTIME naming
 * the file and the reason. What a run writes appears only complete:
 * steps.csv is flushed line by line (on an error it is cut back to its last
 * complete line); every other file is written to NAME.tmp and renamed when
 * complete. A directory holding another run's files is refused unless
 * --overwrite; the same program with the same configuration replaces its own
 * earlier run; a resume from a checkpoint this directory's run saved appends
 * to its steps.csv. */
#ifndef CSVLOG_H
#define CSVLOG_H

#include "config.h"

#include <stddef.h>
#include <stdio.h>

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

/* ---- files in --out ---- */
typedef struct OutFile OutFile;
typedef enum {
    OUT_LINES,        /* NAME itself, each line flushed and checked (steps.csv) */
    OUT_LINES_APPEND, /* the same, appending to NAME */
    OUT_WHOLE,        /* NAME.tmp, renamed to NAME by out_close */
    OUT_WHOLE_PART,   /* NAME.tmp, begun (0) or continued (1) by several ranks in turn; out_publish renames */
} OutKind;
OutFile *out_open(const char *dir, const char *name, OutKind kind, int continued);
void out_printf(OutFile *f, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void out_close(OutFile *f);
/* Rename an OUT_WHOLE_PART file's NAME.tmp to NAME; out_part_path gives NAME.tmp. */
void out_publish(const char *dir, const char *name);
const char *out_part_path(const char *dir, const char *name);

/* ---- the run directory ---- */
/* Before training (any rank): is cfg->out usable, and what to do with the
 * files it holds (OUT_NEW, OUT_REPLACE, OUT_APPEND)? Refuses (EXIT_USAGE) a
 * non-directory and another run's files without --overwrite. Creates
 * nothing: a missing directory is made by out_dir_prepare. */
OutMode out_dir_check(const Config *cfg, const char *program);
/* Is `name` (in --out) one of the files a run writes there, or its NAME.tmp?
 * (steps.csv, run.csv, memory.csv, run-info.txt, ...: what --save must not replace) */
int out_is_run_file(const char *name);
/* mkdir -p dir for --out; fails (exit 2, one line naming what could not be
 * created) like out_dir_check. */
void out_make_directories(const char *dir);
/* The writing rank, once the job agreed to run: create the directory, remove
 * the replaced run's files, write run-info.txt (status running). */
void out_dir_prepare(const Config *cfg, const char *program);
/* run-info.txt: a checkpoint this run saved (a later --resume from it appends
 * here), and the end of the run (status complete). */
void run_info_checkpoint(const Config *cfg, const char *path, int step, uint64_t checksum);
void run_info_complete(const Config *cfg);

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

/* The logs of a job of many ranks (csvlog_ranks.c, linked by the programs
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

/* The progress line: step, loss, lr, grad norm, ms, tokens/s. */
void log_step(const StepRecord *r, int total_steps);
/* After the header, for a run that continues a checkpoint (first_step > 0):
 * "resumed from PATH at step N". */
void log_resumed(const Config *cfg, int first_step);
/* The closing line, the same first fields in every chapter: "done: final
 * loss | median step | tok/s | peak device memory (the peak over ranks) | "
 * then the chapter's own details (printf-style, e.g. "CSVs in %s"). */
void log_run_done(const RunSummary *r, const char *details_fmt, ...) __attribute__((format(printf, 2, 3)));

/* Median of n values (n > 0); the array is reordered. */
double median(double *values, int n);
/* The timing rule of every chapter: the median of a run's per-step values
 * leaving out its first (warm-up) step when it has more than one; 0 for none. */
double median_after_warmup(double *values, int n);

#endif
