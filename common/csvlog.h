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
 * Columns and their meaning are documented in course.md. */
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

/* Create dir (and parents); ends the program with EXIT_USAGE if it cannot be
 * created or written. */
void out_dir_prepare(const char *dir);
/* fopen(dir/name, mode), or end the program naming the file (EXIT_USAGE). */
FILE *out_file_open(const char *dir, const char *name, const char *mode);

/* steps.csv: extra_header is appended to the standard header (e.g.
 * ",exposed_comm_ms"), or NULL. A resumed run writes the steps it runs. */
FILE *steps_csv_open(const char *dir, const char *extra_header);
void steps_csv_write(FILE *f, const StepRecord *r, const char *extra_values);

/* memory.csv from peaks[rank][space][category] of nranks ranks. */
void memory_csv_write(const char *dir, int nranks, const size_t *peaks);
/* This process's peaks in the layout memory_csv_write expects (SPACE_COUNT*CAT_COUNT). */
void memory_peaks_local(size_t *peaks);

/* A summary of a run of `steps` steps whose times are step_ms[0..steps)
 * (reordered): the model and batch from cfg, the device, the median step
 * time and tokens/s derived from it; one device, no parallelism. Chapters
 * then set their own fields (world_size, dp, tp, pp, final_loss, peak). */
void run_summary_init(RunSummary *r, const char *program, const Config *cfg, size_t params, double *step_ms,
                      int steps);
void run_csv_write(const char *dir, const RunSummary *r);
/* The same with chapter columns appended: extra_header ",a,b", extra_values ",1,2". */
void run_csv_write_extra(const char *dir, const RunSummary *r, const char *extra_header,
                         const char *extra_values);

/* The progress line: step, loss, lr, grad norm, ms, tokens/s. */
void log_step(const StepRecord *r, int total_steps);

/* Median of n values (n > 0); the array is reordered. */
double median(double *values, int n);

#endif
