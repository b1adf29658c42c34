/* plan_stage.c: see plan_stage.h. */
#include "plan_stage.h"

#include "param_table.h"

/* ---- the activation slots of a stage ---- */

/* The computations of one stage in the schedule's order, as schedule.c
 * orders them, one callback each: a forward takes a slot of its chunk, the
 * computation that ends the micro-batch there (a backward; ZB-H1's W) gives
 * it back. */
typedef struct {
    int live[PLAN_MAX_CHUNKS], *peak;
} SlotCount;

static void take(SlotCount *s, int chunk) {
    if (++s->live[chunk] > s->peak[chunk]) s->peak[chunk] = s->live[chunk];
}
static void give(SlotCount *s, int chunk) {
    s->live[chunk]--;
}

/* 1F1B's order of forwards and backwards on `stage` (schedule.h): the first
 * backward comes after min(P - s, M) forwards, and each backward is followed
 * by the next forward. ZB-H1 keeps that order, each backward its B, and a
 * micro-batch's slot is free only after its W, which follows B(k + s). */
static void one_f_one_b(SlotCount *s, int P, int M, int stage, int zero_bubble) {
    int ahead = P - stage < M ? P - stage : M, weights_done = 0;
    for (int m = 0; m < ahead; m++) take(s, 0);
    for (int b = 0; b < M; b++) {
        if (!zero_bubble) give(s, 0);
        while (zero_bubble && weights_done + stage <= b) { /* W(weights_done) may run now */
            give(s, 0);
            weights_done++;
        }
        if (ahead + b < M) take(s, 0); /* forward ahead + b */
    }
    while (zero_bubble && weights_done++ < M) give(s, 0); /* the W's left for the end */
}

/* Megatron's interleaved order (schedule.c's build_interleaved): the k-th
 * forward is on chunk (k / P) mod V, the k-th backward on chunk V - 1 - that. */
static void interleaved(SlotCount *s, int P, int V, int M, int stage) {
    int total = V * M, warmup = M == P ? total : 2 * (P - 1 - stage) + (V - 1) * P;
    if (warmup > total) warmup = total;
    for (int k = 0; k < warmup; k++) take(s, (k / P) % V);
    for (int i = 0; i < total - warmup; i++) {
        take(s, ((warmup + i) / P) % V);
        give(s, V - 1 - (i / P) % V);
    }
}

void plan_stage_slots(int schedule, int P, int V, int M, int stage, int *slots) {
    SlotCount s = {.peak = slots};
    for (int c = 0; c < V; c++) slots[c] = 0;
    if (schedule == SCHED_GPIPE)
        for (int m = 0; m < M; m++) take(&s, 0);
    else if (schedule == SCHED_INTERLEAVED)
        interleaved(&s, P, V, M, stage);
    else
        one_f_one_b(&s, P, M, stage, schedule == SCHED_ZB_H1);
    for (int c = 0; c < V; c++)
        if (slots[c] < 1) slots[c] = 1;
}

/* ---- a tensor-parallel rank's sizes ---- */

size_t plan_tp_unit_numel(const ModelConfig *m, int unit, int tp) {
    size_t C = m->dmodel, V = vocab_padded(m->vocab), T = m->seq;
    if (unit == LAYER_EMBEDDING) return (V + T) * C;             /* wte, wpe: whole */
    if (unit == m->layers) return 2 * C + (m->tied ? 0 : V * C); /* ln_f, the head (tied: wte's): whole */
    /* sliced: qkvw, qkvb, attprojw, fcw, fcb, fcprojw; whole: ln1, ln2, attprojb, fcprojb */
    return (3 * C * C + 3 * C + C * C + 4 * C * C + 4 * C + 4 * C * C) / tp + 6 * C;
}

size_t plan_tp_tensor_numel(const ParamTensor *x, int layers, int tp) {
    int sliced = tp > 1 && x->layer >= 0 && x->layer < layers &&
                 (x->kind == BLOCK_QKVW || x->kind == BLOCK_QKVB || x->kind == BLOCK_ATTPROJW ||
                  x->kind == BLOCK_FCW || x->kind == BLOCK_FCB || x->kind == BLOCK_FCPROJW);
    return sliced ? x->numel / tp : x->numel;
}

size_t plan_tp_block_activation_bytes(const ModelConfig *m, int tp, int B, int T, int first_block,
                                      int last_block, int recompute, int sp) {
    size_t BT = (size_t)B * T, C = m->dmodel, Cl = C / tp, Hl = 4 * C / tp, NHl = m->heads / tp;
    size_t R = sp ? BT / tp : BT; /* rows of the layernorm and residual regions */
    /* ln1, its mean and rstd, qkv, atty, lse, res2, ln2, its mean and rstd, fch; res3 */
    size_t full = R * C + 2 * R + BT * 3 * Cl + BT * Cl + B * NHl * T + R * C + R * C + 2 * R + BT * Hl;
    size_t floats = 0;
    for (int l = first_block; l <= last_block; l++)
        floats += recompute && l > first_block ? BT * C /* recompute: one set, then outputs */
                                               : full + (l == last_block ? BT : R) * C;
    return floats * sizeof(float);
}

size_t plan_tp_scratch_bytes(const ModelConfig *m, int tp, int B, int T) {
    size_t BT = (size_t)B * T, C = m->dmodel, Cl = C / tp, Hl = 4 * C / tp;
    /* branch, dresid x2, dmid, dbranch, dln; datty, dqkv; dfch, dfch_gelu, gelu; dlogits */
    return (6 * BT * C + BT * Cl + 3 * BT * Cl + 3 * BT * Hl + BT * vocab_padded(m->vocab)) * sizeof(float);
}

size_t plan_tp_kept_grads_bytes(const ModelConfig *m, int tp, int B, int T, int first_block, int last_block,
                                int head) {
    size_t BT = (size_t)B * T, C = m->dmodel, Cl = C / tp, Hl = 4 * C / tp;
    /* dout, dfch, dmid, dqkv of each block; the head's dlogits */
    size_t floats = (size_t)(last_block - first_block + 1) * BT * (C + Hl + C + 3 * Cl);
    return (floats + (head ? BT * vocab_padded(m->vocab) : 0)) * sizeof(float);
}
