/* run_csv.c: see run_csv.h. */
#include "common/run/run_csv.h" /* steps.csv, memory.csv, run.csv */

#include "common/device/device.h" /* mem_alloc, copies, streams, timers */
#include "common/core/stats.h" /* median */
#include "common/core/util.h" /* fatal, log_info, exit codes, flag parsing */

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

/* ---- steps.csv ---- */

/* Appending after a resume: keep the header and the rows up to the checkpoint's step. */
static void keep_steps_through(const Config *cfg, int last_kept) {
    char path[JOINED_PATH_BYTES], line[4096];
    snprintf(path, sizeof path, "%s/steps.csv", cfg->out);
    FILE *in = fopen(path, "r");
    if (!in) return;
    OutFile *o = out_open(cfg->out, "steps.csv", OUT_WHOLE, 0);
    int header = 1;
    while (fgets(line, sizeof line, in)) {
        if (header || atoi(line) <= last_kept) out_printf(o, "%s", line);
        header = 0;
    }
    fclose(in);
    out_close(o);
}

OutFile *steps_csv_open(const Config *cfg, const char *extra_header) {
    if (cfg->out_mode == OUT_APPEND) {
        keep_steps_through(cfg, cfg->resume_step);
        return out_open(cfg->out, "steps.csv", OUT_LINES_APPEND, 0);
    }
    OutFile *f = out_open(cfg->out, "steps.csv", OUT_LINES, 0);
    out_printf(f, "step,loss,lr,grad_norm,step_ms,fwd_ms,bwd_ms,comm_ms,opt_ms,tokens_per_s,val_loss%s\n",
               extra_header ? extra_header : "");
    return f;
}

void steps_csv_write(OutFile *f, const StepRecord *r, const char *extra_values) {
    char val[32] = "";
    if (!isnan(r->val_loss)) snprintf(val, sizeof val, "%.9g", r->val_loss);
    out_printf(f, "%d,%.9g,%.9g,%.9g,%.4f,%.4f,%.4f,%.4f,%.4f,%.2f,%s%s\n", r->step, r->loss, r->lr,
               r->grad_norm, r->step_ms, r->fwd_ms, r->bwd_ms, r->comm_ms, r->opt_ms, r->tokens_per_s, val,
               extra_values ? extra_values : "");
    interrupt_note_step(r->step + 1); /* for Ctrl-C's message (util.h) */
}

void memory_peaks_local(size_t *peaks) {
    for (int s = 0; s < SPACE_COUNT; s++)
        for (int c = 0; c < CAT_COUNT; c++) peaks[s * CAT_COUNT + c] = mem_peak_bytes((Space)s, (Category)c);
}

void memory_csv_write(const char *dir, int nranks, const size_t *peaks) {
    memory_csv_write_from(dir, 0, nranks, peaks);
}

void memory_csv_write_from(const char *dir, int first_rank, int nranks, const size_t *peaks) {
    OutFile *f = out_open(dir, "memory.csv", OUT_WHOLE, 0);
    out_printf(f, "rank,space,category,peak_bytes\n");
    for (int r = 0; r < nranks; r++)
        for (int s = 0; s < SPACE_COUNT; s++)
            for (int c = 0; c < CAT_COUNT; c++)
                out_printf(f, "%d,%s,%s,%zu\n", first_rank + r, space_name((Space)s),
                           category_name((Category)c), peaks[((size_t)r * SPACE_COUNT + s) * CAT_COUNT + c]);
    out_close(f);
}

void run_csv_write_extra(const char *dir, const RunSummary *r, const char *extra_header,
                         const char *extra_values) {
    OutFile *f = out_open(dir, "run.csv", OUT_WHOLE, 0);
    out_printf(f,
               "program,device,world_size,dp,tp,pp,zero,params,layers,dmodel,heads,seq,batch,micro,steps,"
               "final_loss,median_step_ms,tokens_per_s,peak_device_bytes%s\n",
               extra_header ? extra_header : "");
    out_printf(f, "%s,%s,%d,%d,%d,%d,%d,%zu,%d,%d,%d,%d,%d,%d,%d,%.9g,%.4f,%.2f,%zu%s\n", r->program,
               r->device, r->world_size, r->dp, r->tp, r->pp, r->zero, r->params, r->layers, r->dmodel,
               r->heads, r->seq, r->batch, r->micro, r->steps, r->final_loss, r->median_step_ms,
               r->tokens_per_s, r->peak_device_bytes, extra_values ? extra_values : "");
    out_close(f);
}

void run_summary_init(RunSummary *r, const char *program, const Config *cfg, size_t params, double *step_ms,
                      int steps) {
    *r = (RunSummary){
        .program = program,
        .device = device_name(),
        .world_size = 1,
        .dp = 1,
        .tp = 1,
        .pp = 1,
        .params = params,
        .layers = cfg->model.layers,
        .dmodel = cfg->model.dmodel,
        .heads = cfg->model.heads,
        .seq = cfg->model.seq,
        .batch = cfg->batch,
        .micro = cfg->micro,
        .steps = steps,
        .median_step_ms = median_after_warmup(step_ms, steps),
    };
    double tokens_per_step = (double)cfg->batch * cfg->model.seq;
    r->tokens_per_s = r->median_step_ms > 0 ? tokens_per_step / (r->median_step_ms / 1e3) : 0.0;
}

void run_csv_write(const char *dir, const RunSummary *r) {
    run_csv_write_extra(dir, r, NULL, NULL);
}

double median_after_warmup(double *values, int n) {
    if (n < 1) return 0.0;
    return n > 1 ? median(values + 1, n - 1) : values[0];
}
