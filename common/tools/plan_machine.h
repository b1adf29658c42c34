/* plan_machine.h: a machine file, the constants of common/plan's time model
 * (plan_time.h has the format, each key's range and the formulas that use it). */
#ifndef PLAN_MACHINE_H
#define PLAN_MACHINE_H

typedef struct {
    char name[64];
    double flops, alpha_s, beta_bytes_per_s, h2d_bytes_per_s, d2h_bytes_per_s;
    double cpu_adam_params_per_s, device_adam_params_per_s, device_mem_bytes;
    double overlap; /* the fraction of an overlappable collective's time that hides under computation */
} Machine;

/* Reads a machine file; a bad one ends the program with one line naming the
 * file, the line and what is wrong (exit 2). */
void machine_read(const char *path, Machine *m);

#endif
