/* csvlog.c: see csvlog.h. */
#include "csvlog.h"

#include "device.h"
#include "util.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

void out_dir_prepare(const char *dir) {
    char path[4096];
    snprintf(path, sizeof path, "%s", dir);
    /* mkdir -p */
    for (char *p = path + 1; *p; p++) {
        if (*p != '/') continue;
        *p = '\0';
        if (mkdir(path, 0755) != 0 && errno != EEXIST)
            fatal(EXIT_USAGE, "--out %s: cannot create %s (%s)", dir, path, strerror(errno));
        *p = '/';
    }
    if (mkdir(path, 0755) != 0 && errno != EEXIST)
        fatal(EXIT_USAGE, "--out %s: cannot create the directory (%s)", dir, strerror(errno));
    struct stat st;
    if (stat(path, &st) != 0 || !S_ISDIR(st.st_mode))
        fatal(EXIT_USAGE, "--out %s: exists and is not a directory", dir);
    if (access(path, W_OK) != 0)
        fatal(EXIT_USAGE, "--out %s: the directory is not writable (%s)", dir, strerror(errno));
}

FILE *out_file_open(const char *dir, const char *name, const char *mode) {
    char path[4200];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, mode);
    if (!f) fatal(EXIT_USAGE, "--out %s: cannot write %s (%s)", dir, name, strerror(errno));
    return f;
}

FILE *steps_csv_open(const char *dir, const char *extra_header) {
    FILE *f = out_file_open(dir, "steps.csv", "w");
    fprintf(f, "step,loss,lr,grad_norm,step_ms,fwd_ms,bwd_ms,comm_ms,opt_ms,tokens_per_s,val_loss%s\n",
            extra_header ? extra_header : "");
    fflush(f);
    return f;
}

void steps_csv_write(FILE *f, const StepRecord *r, const char *extra_values) {
    fprintf(f, "%d,%.9g,%.9g,%.9g,%.4f,%.4f,%.4f,%.4f,%.4f,%.2f,", r->step, r->loss, r->lr, r->grad_norm,
            r->step_ms, r->fwd_ms, r->bwd_ms, r->comm_ms, r->opt_ms, r->tokens_per_s);
    if (!isnan(r->val_loss)) fprintf(f, "%.9g", r->val_loss);
    fprintf(f, "%s\n", extra_values ? extra_values : "");
    fflush(f);
}

void memory_peaks_local(size_t *peaks) {
    for (int s = 0; s < SPACE_COUNT; s++)
        for (int c = 0; c < CAT_COUNT; c++) peaks[s * CAT_COUNT + c] = mem_peak_bytes((Space)s, (Category)c);
}

void memory_csv_write(const char *dir, int nranks, const size_t *peaks) {
    FILE *f = out_file_open(dir, "memory.csv", "w");
    fprintf(f, "rank,space,category,peak_bytes\n");
    for (int r = 0; r < nranks; r++)
        for (int s = 0; s < SPACE_COUNT; s++)
            for (int c = 0; c < CAT_COUNT; c++)
                fprintf(f, "%d,%s,%s,%zu\n", r, space_name((Space)s), category_name((Category)c),
                        peaks[((size_t)r * SPACE_COUNT + s) * CAT_COUNT + c]);
    fclose(f);
}

void run_csv_write_extra(const char *dir, const RunSummary *r, const char *extra_header,
                         const char *extra_values) {
    FILE *f = out_file_open(dir, "run.csv", "w");
    fprintf(f,
            "program,device,world_size,dp,tp,pp,zero,params,layers,dmodel,heads,seq,batch,micro,steps,"
            "final_loss,median_step_ms,tokens_per_s,peak_device_bytes%s\n",
            extra_header ? extra_header : "");
    fprintf(f, "%s,%s,%d,%d,%d,%d,%d,%zu,%d,%d,%d,%d,%d,%d,%d,%.9g,%.4f,%.2f,%zu%s\n", r->program, r->device,
            r->world_size, r->dp, r->tp, r->pp, r->zero, r->params, r->layers, r->dmodel, r->heads, r->seq,
            r->batch, r->micro, r->steps, r->final_loss, r->median_step_ms, r->tokens_per_s,
            r->peak_device_bytes, extra_values ? extra_values : "");
    fclose(f);
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
        .median_step_ms = steps > 0 ? median(step_ms, steps) : 0.0,
    };
    double tokens_per_step = (double)cfg->batch * cfg->model.seq;
    r->tokens_per_s = r->median_step_ms > 0 ? tokens_per_step / (r->median_step_ms / 1e3) : 0.0;
}

void run_csv_write(const char *dir, const RunSummary *r) {
    run_csv_write_extra(dir, r, NULL, NULL);
}

void log_step(const StepRecord *r, int total_steps) {
    log_info("step %5d/%d | loss %.4f | lr %.2e | norm %6.3f | %8.1f ms | %9.0f tok/s", r->step, total_steps,
             r->loss, r->lr, r->grad_norm, r->step_ms, r->tokens_per_s);
    if (!isnan(r->val_loss)) log_info(" | val %.4f", r->val_loss);
    log_info("\n");
}

static int compare_doubles(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double median(double *values, int n) {
    qsort(values, n, sizeof(double), compare_doubles);
    return n % 2 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}
