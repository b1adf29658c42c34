/* plan_layout.c: see plan_layout.h. */
#include "common/tools/plan_layout.h" /* a layout for the time model */


void plan_model_state(double P, double shard_n, int stage, int half, double *params, double *grads,
                      double *optimizer) {
    double eb = half ? 2 : 4;                        /* bytes of a parameter and a gradient */
    double opt_n = stage == 0 ? P : shard_n;         /* elements this rank updates */
    *params = (stage < 3 ? P : shard_n) * eb;        /* whole, or this rank's shard (stage 3) */
    *grads = (stage < 2 ? P : shard_n) * eb;         /* whole, or this rank's shard (stages 2-3) */
    *optimizer = opt_n * 8 + (half ? opt_n * 4 : 0); /* Adam's m and v; 16 bits: fp32 master weights */
}

int plan_replica_ranks(const PlanLayout *l) {
    return l->pp * (l->cp > 1 ? l->cp : 1) * l->tp;
}

int plan_forward_runs(const Config *cfg, const PlanLayout *l) {
    int pipeline = l->chapter == 4 || (l->chapter >= 5 && (l->pp > 1 || l->tp > 1));
    return cfg->recompute ? (pipeline && l->schedule == SCHED_ZB_H1 ? 3 : 2) : 1;
}

int plan_ranks(const PlanLayout *l) {
    return l->dp * plan_replica_ranks(l);
}
