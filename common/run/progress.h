/* progress.h: the lines a run prints as it goes (log_info, util.h). */
#ifndef PROGRESS_H
#define PROGRESS_H

#include "common/run/config.h" /* Config and the flag tables */
#include "common/run/run_csv.h" /* steps.csv, memory.csv, run.csv */

/* The progress line: step, loss, lr, grad norm, ms, tokens/s. */
void log_step(const StepRecord *r, int total_steps);
/* After the header, for a run that continues a checkpoint (first_step > 0):
 * "resumed from PATH at step N". */
void log_resumed(const Config *cfg, int first_step);
/* The closing line, the same first fields in every chapter: "done: final
 * loss | median step | tok/s | peak device memory (the peak over ranks) | "
 * then the chapter's own details (printf-style, e.g. "CSVs in %s"). */
void log_run_done(const RunSummary *r, const char *details_fmt, ...) __attribute__((format(printf, 2, 3)));

#endif
