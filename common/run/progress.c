/* progress.c: see progress.h. */
#include "common/run/progress.h" /* the progress and done lines */

#include "common/core/util.h" /* fatal, log_info, exit codes, flag parsing */

#include <math.h>
#include <stdarg.h>
#include <stdio.h>

void log_step(const StepRecord *r, int total_steps) {
    log_info("step %5d/%d | loss %.4f | lr %.2e | norm %6.3f | %8.1f ms | %9.0f tok/s", r->step, total_steps,
             r->loss, r->lr, r->grad_norm, r->step_ms, r->tokens_per_s);
    if (!isnan(r->val_loss)) log_info(" | val %.4f", r->val_loss);
    log_info("\n");
}

void log_resumed(const Config *cfg, int first_step) {
    if (first_step) log_info("resumed from %s at step %d\n", cfg->resume, first_step);
}

void log_run_done(const RunSummary *r, const char *details_fmt, ...) {
    char details[1024];
    va_list args;
    va_start(args, details_fmt);
    vsnprintf(details, sizeof details, details_fmt, args);
    va_end(args);
    log_info("done: final loss %.4f | median step %.1f ms | %.0f tok/s | peak device memory %.1f MiB | %s\n",
             r->final_loss, r->median_step_ms, r->tokens_per_s, r->peak_device_bytes / BYTES_PER_MIB,
             details);
}
