/* moe.h: the mixture-of-experts MLP (--experts E --top-k K, model_config.h).
 *
 * A dense block's MLP sends every token through one C -> 4C -> C network.
 * An MoE block holds E such networks, the experts, and a router: a linear
 * layer C -> E (no bias) whose softmax p(E) says, per token, how much each
 * expert suits it. Each token goes to its K most probable experts (ties to
 * the lower index), and the block's output is their outputs weighted by
 * their probabilities renormalised over the K:
 *
 *     p = softmax(ln2(x) @ Wr^T)        top-K experts e_1..e_K of p
 *     out = sum_k (p[e_k] / sum_j p[e_j]) * expert_{e_k}(ln2(x))
 *
 * so the parameters grow E times and a token's FLOPs only K times. With K = 1
 * every weight is 1: the router then learns only from the balancing loss.
 *
 * Balance. Nothing stops the router from sending every token to one expert.
 * The auxiliary loss of Switch and GShard, per sequence of T tokens,
 *     aux = E * sum_e f_e * P_e,
 * f_e the fraction of the sequence's T*K choices that picked e (a count: no
 * gradient) and P_e the mean of p[e] over its tokens, is 1 when the choices
 * are spread evenly and E when one expert takes all; the run's objective adds
 * --aux-loss-coef times its mean over sequences, summed over the MoE blocks.
 *
 * Capacity. With --capacity-factor F each expert takes at most
 * ceil(F * T * K / E) of a sequence's choices, filled in token order; the
 * choices past that are dropped: they add nothing to the output (the
 * residual passes the token on) and are counted. F = 0 is dropless.
 *
 * Routing is decided on the host, from the router's logits copied there, in
 * a fixed order (tokens, then slots, then experts), so every layout that
 * computes the same logits makes the same choices; capacity and the balancing
 * loss are per sequence, so splitting a batch over ranks (data parallelism)
 * changes nothing. The tokens then travel on the device: gathered into rows
 * grouped by expert (kernels.h, moe_gather), each expert's rows through its
 * two linear layers, and combined back per token (moe_combine).
 *
 * This file holds the buffers and the routing; model.c calls moe_forward and
 * moe_backward (model.h) in an MoE block's MLP half. */
#ifndef MOE_H
#define MOE_H

#include "common/model/model_config.h" /* ModelConfig, MoeConfig */

#include <stddef.h>

/* What the forwards since the last reset routed: the chapter reports it per step. */
typedef struct {
    double tokens[MAX_EXPERTS]; /* choices each expert computed, summed over the MoE blocks */
    double dropped;             /* choices dropped past an expert's capacity */
    double aux_sum;             /* sum over sequences and MoE blocks of aux_coef * aux */
} MoeStats;

/* One MoE block's routing and values for a micro-batch of N = B*T tokens, K
 * slots each (slot n*K + k). Device buffers for the kernels, their host
 * copies where the routing is decided. */
typedef struct {
    int rows;         /* R: the choices kept, the rows dispatched (<= N*K) */
    float *xin;       /* (N*K, C) device: ln2 of each row's token, rows grouped by expert */
    float *fch;       /* (N*K, 4C) device: the experts' hidden layer, before GELU */
    float *y;         /* (N*K, C) device: the experts' outputs */
    int *src;         /* (N*K) device: the token of row i */
    int *pos;         /* (N*K) device: the row of slot (n,k), -1 when dropped */
    float *gate;      /* (N*K) device: the slot's renormalised weight */
    float *probs_h;   /* (N, E) host: the router's softmax */
    int *expert_h;    /* (N*K) host: the expert of slot (n,k) */
    float *gate_h;    /* (N*K) host */
    int *pos_h;       /* (N*K) host */
    int *src_h;       /* (N*K) host */
    float *choices_h; /* (B, E) host: each sequence's choices of each expert, before capacity */
    int *count_h;     /* (E) host: rows of each expert (after capacity) */
} MoeLayerActs;

typedef struct {
    MoeLayerActs *layer; /* L of them; all zero for a dense block or one outside the range */
    float dloss;         /* the backward's d(objective)/d(token loss): the balancing loss's scale */
    MoeStats stats;      /* added to by every forward */
    void *device, *host; /* the two allocations the buffers are carved from */
} MoeActs;

/* Gradients and transient values of the MoE block at hand (shared by all). */
typedef struct {
    float *logits, *dlogits;               /* (N, E) device */
    float *dgate;                          /* (N*K) device */
    float *gelu, *dgelu;                   /* (N*K, 4C) device: GELU(fch), and its gradient */
    float *dfch;                           /* (N*K, 4C) device */
    float *dxin, *dy;                      /* (N*K, C) device */
    float *logits_h, *dlogits_h, *dgate_h; /* host copies */
    void *device, *host;
} MoeScratch;

/* The MoE buffers of units first_unit..last_unit (nothing for a dense model):
 * activations (CAT_ACTIVATIONS, device and host) and scratch (CAT_WORKSPACE). */
void moe_acts_create(MoeActs *a, const ModelConfig *cfg, int B, int T, int first_unit, int last_unit);
void moe_acts_destroy(MoeActs *a);
void moe_scratch_create(MoeScratch *s, const ModelConfig *cfg, int B, int T);
void moe_scratch_destroy(MoeScratch *s);

/* The most rows one expert can get in a micro-batch of B sequences of T
 * tokens: a choice per token, at most its capacity per sequence. */
int moe_expert_rows_max(const MoeConfig *moe, int B, int T);

/* The routing of one MoE block (above), on the host: from logits (B*T, E),
 * la's host arrays (probs, experts, gates, capacity, rows) and la->rows;
 * stats added to. */
void moe_route(const MoeConfig *moe, const float *logits, int B, int T, MoeLayerActs *la, MoeStats *stats);
/* The router's logit gradients (B*T, E) from the gates' (dgate, N*K) and the
 * balancing loss's, scaled by dloss (d objective / d token loss). */
void moe_route_backward(const MoeConfig *moe, const MoeLayerActs *la, const float *dgate, float dloss, int B,
                        int T, float *dlogits);

#endif
