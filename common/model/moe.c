/* moe.c: the mixture-of-experts MLP (see moe.h): its buffers and the routing
 * on the host; model.c computes an MoE block's MLP half with them. */
#include "common/model/moe.h" /* MoE buffers and routing */

#include "common/device/device.h" /* mem_alloc, copies */
#include "common/core/util.h" /* fatal, xcalloc */

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- buffers ---- */

/* Hands out pieces of one allocation (base NULL: only counts the bytes). */
typedef struct {
    char *base;
    size_t used;
} Pieces;

static void *piece(Pieces *p, size_t bytes) {
    void *at = p->base ? p->base + p->used : NULL;
    p->used += (bytes + 63) / 64 * 64; /* every piece 64-byte aligned */
    return at;
}

/* Carve (or count) the buffers of the MoE blocks in first..last. */
static void carve_acts(MoeActs *a, const ModelConfig *c, int B, int T, int first, int last, Pieces *dev,
                       Pieces *host) {
    size_t N = (size_t)B * T, C = c->dmodel, E = c->moe.experts, NK = N * c->moe.top_k;
    for (int l = 0; l < c->layers; l++) {
        if (l < first || l > last || !moe_layer(c, l)) continue;
        MoeLayerActs *la = &a->layer[l];
        la->xin = piece(dev, NK * C * sizeof(float));
        la->fch = piece(dev, NK * 4 * C * sizeof(float));
        la->y = piece(dev, NK * C * sizeof(float));
        la->src = piece(dev, NK * sizeof(int));
        la->pos = piece(dev, NK * sizeof(int));
        la->gate = piece(dev, NK * sizeof(float));
        la->probs_h = piece(host, N * E * sizeof(float));
        la->expert_h = piece(host, NK * sizeof(int));
        la->gate_h = piece(host, NK * sizeof(float));
        la->pos_h = piece(host, NK * sizeof(int));
        la->src_h = piece(host, NK * sizeof(int));
        la->choices_h = piece(host, (size_t)B * E * sizeof(float));
        la->count_h = piece(host, E * sizeof(int));
    }
}

void moe_acts_create(MoeActs *a, const ModelConfig *c, int B, int T, int first_unit, int last_unit) {
    memset(a, 0, sizeof *a);
    if (!c->moe.experts) return;
    a->layer = xcalloc(c->layers, sizeof(MoeLayerActs));
    Pieces dev = {0}, host = {0};
    carve_acts(a, c, B, T, first_unit, last_unit, &dev, &host);
    if (!dev.used) return; /* no MoE block in the range */
    a->device = mem_alloc(SPACE_DEVICE, CAT_ACTIVATIONS, dev.used, "expert activations");
    a->host = mem_alloc(SPACE_HOST, CAT_ACTIVATIONS, host.used, "expert routing");
    Pieces d = {a->device, 0}, h = {a->host, 0};
    carve_acts(a, c, B, T, first_unit, last_unit, &d, &h);
}

void moe_acts_destroy(MoeActs *a) {
    if (a->device) mem_free(a->device);
    if (a->host) mem_free(a->host);
    free(a->layer);
    memset(a, 0, sizeof *a);
}

static void carve_scratch(MoeScratch *s, const ModelConfig *c, int B, int T, Pieces *dev, Pieces *host) {
    size_t N = (size_t)B * T, C = c->dmodel, E = c->moe.experts, NK = N * c->moe.top_k;
    s->logits = piece(dev, N * E * sizeof(float));
    s->dlogits = piece(dev, N * E * sizeof(float));
    s->dgate = piece(dev, NK * sizeof(float));
    s->gelu = piece(dev, NK * 4 * C * sizeof(float));
    s->dgelu = piece(dev, NK * 4 * C * sizeof(float));
    s->dfch = piece(dev, NK * 4 * C * sizeof(float));
    s->dxin = piece(dev, NK * C * sizeof(float));
    s->dy = piece(dev, NK * C * sizeof(float));
    s->logits_h = piece(host, N * E * sizeof(float));
    s->dlogits_h = piece(host, N * E * sizeof(float));
    s->dgate_h = piece(host, NK * sizeof(float));
}

void moe_scratch_create(MoeScratch *s, const ModelConfig *c, int B, int T) {
    memset(s, 0, sizeof *s);
    if (!c->moe.experts) return;
    Pieces dev = {0}, host = {0};
    carve_scratch(s, c, B, T, &dev, &host);
    s->device = mem_alloc(SPACE_DEVICE, CAT_WORKSPACE, dev.used, "expert gradients");
    s->host = mem_alloc(SPACE_HOST, CAT_WORKSPACE, host.used, "router gradients");
    Pieces d = {s->device, 0}, h = {s->host, 0};
    carve_scratch(s, c, B, T, &d, &h);
}

void moe_scratch_destroy(MoeScratch *s) {
    if (s->device) mem_free(s->device);
    if (s->host) mem_free(s->host);
    memset(s, 0, sizeof *s);
}

/* ---- routing (host) ---- */

/* An expert's capacity per sequence: ceil(F * T * K / E) choices, or all T*K of them when dropless. */
static int capacity(const MoeConfig *moe, int T) {
    if (moe->capacity_factor <= 0.0f) return T * moe->top_k;
    return (int)ceil((double)moe->capacity_factor * T * moe->top_k / moe->experts);
}

int moe_expert_rows_max(const MoeConfig *moe, int B, int T) {
    int cap = capacity(moe, T);
    return B * (cap < T ? cap : T);
}

void moe_route(const MoeConfig *moe, const float *logits, int B, int T, MoeLayerActs *la, MoeStats *stats) {
    int E = moe->experts, K = moe->top_k, N = B * T, cap = capacity(moe, T);
    /* the softmax, then the K largest probabilities (ties to the lower expert), renormalised */
    for (int n = 0; n < N; n++) {
        const float *z = logits + (size_t)n * E;
        float *p = la->probs_h + (size_t)n * E;
        double max = z[0], sum = 0.0;
        for (int e = 1; e < E; e++) max = z[e] > max ? z[e] : max;
        for (int e = 0; e < E; e++) sum += exp((double)z[e] - max);
        for (int e = 0; e < E; e++) p[e] = (float)(exp((double)z[e] - max) / sum);
        int *chosen = la->expert_h + (size_t)n * K;
        double kept = 0.0;
        for (int k = 0; k < K; k++) {
            int best = -1;
            for (int e = 0; e < E; e++) {
                int taken = 0;
                for (int j = 0; j < k; j++) taken |= chosen[j] == e;
                /* strictly larger: the lower index wins a tie */
                if (!taken && (best < 0 || p[e] > p[best])) best = e;
            }
            chosen[k] = best;
            kept += p[best];
        }
        for (int k = 0; k < K; k++) la->gate_h[(size_t)n * K + k] = (float)(p[chosen[k]] / kept);
    }
    /* capacity, per sequence, in token order; the choices counted before it */
    memset(la->count_h, 0, E * sizeof(int));
    int per_seq[MAX_EXPERTS];
    for (int b = 0; b < B; b++) {
        float *choices = la->choices_h + (size_t)b * E;
        memset(per_seq, 0, sizeof per_seq);
        for (int e = 0; e < E; e++) choices[e] = 0.0f;
        for (int t = 0; t < T; t++)
            for (int k = 0; k < K; k++) {
                size_t slot = ((size_t)b * T + t) * K + k;
                int e = la->expert_h[slot];
                choices[e] += 1.0f;
                int keep = per_seq[e] < cap;
                per_seq[e] += keep;
                la->pos_h[slot] = keep ? 0 : -1; /* its row below */
            }
        for (int e = 0; e < E; e++) la->count_h[e] += per_seq[e];
    }
    /* rows grouped by expert, in token order within an expert */
    int start[MAX_EXPERTS], filled[MAX_EXPERTS] = {0};
    la->rows = 0;
    for (int e = 0; e < E; e++) {
        start[e] = la->rows;
        la->rows += la->count_h[e];
    }
    for (size_t slot = 0; slot < (size_t)N * K; slot++) {
        if (la->pos_h[slot] < 0) continue;
        int e = la->expert_h[slot], row = start[e] + filled[e]++;
        la->pos_h[slot] = row;
        la->src_h[row] = (int)(slot / K);
    }
    /* what the step reports, and the balancing loss of each sequence */
    for (int e = 0; e < E; e++) stats->tokens[e] += la->count_h[e];
    stats->dropped += (double)N * K - la->rows;
    /* EXERCISE 01.4 BEGIN: the balancing loss and its gradient (course.md, exercise 01.4) */
    for (int b = 0; b < B; b++) {
        double aux = 0.0;
        for (int e = 0; e < E; e++) {
            double mean_p = 0.0;
            for (int t = 0; t < T; t++) mean_p += la->probs_h[((size_t)b * T + t) * E + e];
            aux += (la->choices_h[(size_t)b * E + e] / ((double)T * K)) * (mean_p / T);
        }
        stats->aux_sum += moe->aux_coef * E * aux;
    }
    /* EXERCISE 01.4 END */
}

void moe_route_backward(const MoeConfig *moe, const MoeLayerActs *la, const float *dgate, float dloss, int B,
                        int T, float *dlogits) {
    int E = moe->experts, K = moe->top_k, N = B * T;
    double dp[MAX_EXPERTS];
    for (int n = 0; n < N; n++) {
        const float *p = la->probs_h + (size_t)n * E;
        const int *chosen = la->expert_h + (size_t)n * K;
        const float *gate = la->gate_h + (size_t)n * K, *dg = dgate + (size_t)n * K;
        /* gate_k = p[e_k] / S, S = sum_j p[e_j]: d gate_k / d p[e_j] = (delta_kj - gate_k) / S */
        double S = 0.0, dg_dot_gate = 0.0;
        for (int k = 0; k < K; k++) {
            S += p[chosen[k]];
            dg_dot_gate += (double)dg[k] * gate[k];
        }
        /* dp[e] = d objective / d p[e] of this token: first the balancing loss's part, set (=) for every e */
        /* EXERCISE 01.4 BEGIN: the balancing loss and its gradient (course.md, exercise 01.4) */
        /* the balancing loss: coef * (mean over sequences) E * sum_e f_e * mean_t p[e], so
         * d/dp[e] = coef * E * f_e / (sequences * T) = coef * E * f_e * dloss */
        const float *choices = la->choices_h + (size_t)(n / T) * E;
        for (int e = 0; e < E; e++)
            dp[e] = (double)moe->aux_coef * E * (choices[e] / ((double)T * K)) * dloss;
        /* EXERCISE 01.4 END */
        /* then the gates' */
        for (int k = 0; k < K; k++) dp[chosen[k]] += (dg[k] - dg_dot_gate) / S;
        /* the softmax: dz = p * (dp - p . dp) */
        double p_dot_dp = 0.0;
        for (int e = 0; e < E; e++) p_dot_dp += p[e] * dp[e];
        for (int e = 0; e < E; e++) dlogits[(size_t)n * E + e] = (float)(p[e] * (dp[e] - p_dot_dp));
    }
}
