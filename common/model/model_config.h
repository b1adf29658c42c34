/* model_config.h: what the model layer needs to know of a run, and nothing
 * else: the model's shape and the precision its parameters are stored in.
 *
 * The run's configuration (config.h, in common/run) holds a ModelConfig and a
 * Precision; the model, its parameter table, mixed precision and the layer
 * split take only these, so the layers below the run never see the command
 * line. */
#ifndef MODEL_CONFIG_H
#define MODEL_CONFIG_H

/* The largest --layers (fixed-size per-stage arrays such as blocks[] rely on
 * it) and the largest --vocab. */
enum { MAX_LAYERS = 256, MAX_VOCAB = 1048576 };
/* The largest --experts (steps.csv has a column per expert). */
enum { MAX_EXPERTS = 64 };

/* A mixture of experts (--experts E, moe.h): the MLP of every `every`-th
 * block replaced by a router and E expert MLPs, each token sent to K of them.
 * experts 0: the dense model. */
typedef struct {
    int experts;           /* E: 0 (dense) or 1..MAX_EXPERTS */
    int top_k;             /* K: experts per token, 1..E */
    int every;             /* blocks every-1, 2*every-1, ... are MoE blocks (1: all of them) */
    float capacity_factor; /* each expert takes at most ceil(factor * T * K / E) tokens of a
                              sequence, the rest dropped; 0: dropless */
    float aux_coef;        /* the load-balancing loss's weight (Switch/GShard: E sum_e f_e P_e) */
    int parts, part;       /* not flags: the ranks each MoE block's experts are split over (expert
                              parallelism's local model, 03_model_parallel/expert_parallel.h); this
                              model holds experts part E/parts .. (part + 1) E/parts - 1, the router
                              still choosing among all E. parts 0 or 1: all of them */
} MoeConfig;

/* Model shape: everything needed to build the same GPT anywhere. */
typedef struct {
    int layers; /* L */
    int dmodel; /* C */
    int heads;  /* NH */
    int seq;    /* T: maximum sequence length (wpe rows) and training length */
    int vocab;  /* V: 256 for bytes, 50257 for GPT-2's tokens; the kernels see vocab_padded(V) rows */
    int tied;   /* --tie-embeddings: the head reads wte, there is no lm_head (GPT-2's choice) */
    int loss_chunks; /* --loss-chunks: the head and the loss run on this many pieces of a
                        micro-batch's tokens, one at a time (0 or 1: all at once; model.h) */
    int vocab_parts; /* not a flag: the ranks wte and the head are split over by vocabulary rows
                        (tensor parallelism's local model); each holds vocab_padded(V) / parts
                        rows. 0 or 1: whole */
    MoeConfig moe;   /* --experts ...: experts instead of some blocks' MLPs (moe.h) */
} ModelConfig;

/* Whether block l's MLP is a mixture of experts. */
static inline int moe_layer(const ModelConfig *m, int l) {
    return m->moe.experts > 0 && (l + 1) % m->moe.every == 0;
}

/* The experts of each MoE block this model holds (moe.parts above): their
 * number, and the first one's index among the E. */
static inline int moe_experts_held(const ModelConfig *m) {
    return m->moe.experts / (m->moe.parts > 1 ? m->moe.parts : 1);
}
static inline int moe_first_held(const ModelConfig *m) {
    return m->moe.parts > 1 ? m->moe.part * moe_experts_held(m) : 0;
}
/* The whole model's config but for its MoE blocks, which hold part `part`
 * of `parts` of their experts (expert parallelism; parts 0 or 1, or a
 * dense model: the config unchanged). */
static inline ModelConfig moe_part_config(const ModelConfig *whole, int parts, int part) {
    ModelConfig held = *whole;
    if (parts > 1 && held.moe.experts) held.moe.parts = parts, held.moe.part = part;
    return held;
}

/* The vocabulary rows the kernels see: V rounded up to a multiple of
 * VOCAB_PAD_ROWS, as llm.c pads GPT-2's 50257 tokens to 50304. wte and
 * lm_head have this many rows and the logits this many columns; the rows past
 * V are no token: their logits are left out of the softmax (probability 0),
 * so they are never predicted, never in the loss, and their gradients stay 0.
 * 128, llm.c's choice, rather than 64: the padded matmul's row count is then a
 * multiple of the GPU's 128-wide tiles, and 50304 is the same either way.
 * V = 256 (bytes) needs no padding. The model, the planner and the memory
 * accounting all call this one function. */
enum { VOCAB_PAD_ROWS = 128 };
static inline int vocab_padded(int V) {
    return (V + VOCAB_PAD_ROWS - 1) / VOCAB_PAD_ROWS * VOCAB_PAD_ROWS;
}

/* The vocabulary rows this model holds of wte and the head: all of them, or
 * its share under a vocabulary split (vocab_parts). */
static inline int vocab_rows_held(const ModelConfig *m) {
    return vocab_padded(m->vocab) / (m->vocab_parts > 1 ? m->vocab_parts : 1);
}
/* The tokens of one piece of the head for a micro-batch of `tokens` (B x T):
 * all of them, or with --loss-chunks K a K-th (model.h, "The head in pieces"). */
static inline int head_piece_tokens(const ModelConfig *m, int tokens) {
    int k = m->loss_chunks > 1 ? m->loss_chunks : 1;
    return (tokens + k - 1) / k;
}

/* --precision: what the parameters and gradients are stored in. fp32 is the
 * course's reference; bf16 and fp16 are mixed precision (mixed.h): 16-bit
 * parameters and gradients, fp32 master weights and AdamW moments. */
typedef enum { PRECISION_FP32 = 0, PRECISION_BF16, PRECISION_FP16 } Precision;
/* "fp32", "bf16", "fp16" */
static inline const char *precision_name(Precision p) {
    static const char *names[] = {"fp32", "bf16", "fp16"};
    return p >= PRECISION_FP32 && p <= PRECISION_FP16 ? names[p] : "?";
}

#endif
