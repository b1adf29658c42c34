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

/* Model shape: everything needed to build the same GPT anywhere. */
typedef struct {
    int layers; /* L */
    int dmodel; /* C */
    int heads;  /* NH */
    int seq;    /* T: maximum sequence length (wpe rows) and training length */
    int vocab;  /* V: 256 for bytes; more is allowed (unused rows) */
} ModelConfig;

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
