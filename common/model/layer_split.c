/* layer_split.c: see layer_split.h. */
#include "common/model/layer_split.h" /* which blocks each stage runs */

#include "common/model/model_config.h" /* ModelConfig */
#include "common/core/util.h" /* fatal, log_info, exit codes, flag parsing */

#include <math.h>
#include <stdio.h>
#include <string.h>

/* --split's numbers, one per piece of `stages` x `chunks` (chunks > 1: --virtual's). */
static void parse_pieces(const char *text, int stages, int chunks, int layers, int *blocks) {
    char copy[1024];
    snprintf(copy, sizeof copy, "%s", text);
    int count = 0, sum = 0, pieces = stages * chunks;
    for (char *item = strtok(copy, ","); item; item = strtok(NULL, ",")) {
        int n = (int)parse_int_flag("--split", item, 1, MAX_LAYERS);
        if (count < pieces) blocks[count] = n;
        count++;
        sum += n;
    }
    if (count != pieces && chunks == 1)
        fatal(EXIT_USAGE, "--split %s names %d stage%s but the job has %d (valid: one number per stage)",
              text, count, count == 1 ? "" : "s", stages);
    if (count != pieces)
        fatal(EXIT_USAGE,
              "--split %s names %d piece%s but --pp %d x --virtual %d = %d chunks need one number each "
              "(valid: %d numbers, chunk by chunk in the model's order: chunk 0 of stages 0..%d, then "
              "chunk 1, ...)",
              text, count, count == 1 ? "" : "s", stages, chunks, pieces, pieces, stages - 1);
    if (sum != layers)
        fatal(EXIT_USAGE,
              "--split %s holds %d layers but the model has %d (valid: numbers summing to --layers)", text,
              sum, layers);
}

void layer_split_parse(const char *text, int stages, int layers, int *blocks) {
    parse_pieces(text, stages, 1, layers, blocks);
}

void layer_split_parse_chunks(const char *text, int stages, int chunks, int layers, int *blocks) {
    parse_pieces(text, stages, chunks, layers, blocks);
}

const char *layer_split_pieces_problem(int stages, int chunks, int layers) {
    static char message[320];
    int most = layers / stages; /* chunks per stage the layers allow */
    if (stages > layers)
        snprintf(message, sizeof message,
                 "--pp %d stages for a model of %d layers (valid: 1..%d, every stage needs a block)", stages,
                 layers, layers);
    else if (stages * chunks > layers && most >= 2)
        snprintf(message, sizeof message,
                 "--pp %d x --virtual %d = %d pieces need at least %d layers; the model has %d (valid: "
                 "--virtual %s%d with --pp %d here, every piece needs a block)",
                 stages, chunks, stages * chunks, stages * chunks, layers, most > 2 ? "2.." : "", most,
                 stages);
    else if (stages * chunks > layers)
        snprintf(message, sizeof message,
                 "--pp %d x --virtual %d = %d pieces need at least %d layers; the model has %d (valid: "
                 "--virtual 2 needs at least %d layers with --pp %d; this model takes one chunk a stage)",
                 stages, chunks, stages * chunks, stages * chunks, layers, 2 * stages, stages);
    else
        return NULL;
    return message;
}

/* blocks[] for `stages` contiguous runs of the L blocks whose largest sum of weight[] is as small
 * as possible (weight[l]: block l, with the embedding or head it travels with). */
static void partition(const double *weight, int L, int stages, int *blocks) {
    if (stages < 1 || stages > L || L > MAX_LAYERS)
        fatal(EXIT_USAGE, "%d stages for %d layers (valid: 1 <= stages <= layers <= %d)", stages, L,
              MAX_LAYERS);
    /* best[s][i]: the smallest possible largest stage when stages 0..s hold
     * blocks 0..i-1 (linear partition by dynamic programming) */
    static double best[MAX_LAYERS][MAX_LAYERS + 1];
    static int cut[MAX_LAYERS][MAX_LAYERS + 1];
    for (int s = 0; s < stages; s++)
        for (int i = 0; i <= L; i++) best[s][i] = INFINITY;
    double sum = 0.0;
    for (int i = 1; i <= L; i++) best[0][i] = sum += weight[i - 1];
    for (int s = 1; s < stages; s++) {
        for (int i = s + 1; i <= L; i++) {
            double tail = 0.0;
            for (int j = i - 1; j >= s; j--) { /* stage s holds blocks j..i-1 */
                tail += weight[j];
                double worst = fmax(best[s - 1][j], tail);
                if (worst < best[s][i]) {
                    best[s][i] = worst;
                    cut[s][i] = j;
                }
            }
        }
    }
    for (int s = stages - 1, i = L; s >= 0; s--) {
        int j = s == 0 ? 0 : cut[s][i];
        blocks[s] = i - j;
        i = j;
    }
}

void layer_split_balanced(const ParamTable *table, int stages, int *blocks) {
    int L = table->cfg.layers;
    double weight[MAX_LAYERS] = {0}; /* parameters of block l, plus the embedding or head it travels with */
    for (int u = LAYER_EMBEDDING; u <= L && L <= MAX_LAYERS; u++) {
        int l = u < 0 ? 0 : u >= L ? L - 1 : u;
        weight[l] += (double)table_unit(table, u)->numel;
    }
    partition(weight, L, stages, blocks);
}

double layer_split_unit_flops(const ModelConfig *m, int unit) {
    double C = m->dmodel, T = m->seq;
    if (unit == LAYER_EMBEDDING) return 0;                       /* a lookup */
    if (unit == m->layers) return 2 * C * vocab_padded(m->vocab); /* the head's matmul */
    return 24 * C * C + 4 * T * C;                               /* qkv, attproj, fc, fcproj; QK^T and AV */
}

void layer_split_balanced_flops(const ModelConfig *m, int stages, int *blocks) {
    int L = m->layers;
    double weight[MAX_LAYERS] = {0}; /* forward FLOPs a token of block l, with the head on the last */
    for (int u = LAYER_EMBEDDING; u <= L && L <= MAX_LAYERS; u++) {
        int l = u < 0 ? 0 : u >= L ? L - 1 : u;
        weight[l] += layer_split_unit_flops(m, u);
    }
    partition(weight, L, stages, blocks);
}

int layer_split_by_flops(const char *split) {
    return strcmp(split, "flops") == 0;
}

void layer_split_range(const int *blocks, int stage, int *first_block, int *last_block) {
    int first = 0;
    for (int s = 0; s < stage; s++) first += blocks[s];
    *first_block = first;
    *last_block = first + blocks[stage] - 1;
}

void layer_split_units(int first_block, int last_block, int stage, int stages, int layers, int *first_unit,
                       int *last_unit) {
    *first_unit = stage == 0 ? LAYER_EMBEDDING : first_block; /* stage 0: the embedding too */
    *last_unit = stage == stages - 1 ? layers : last_block;   /* the last: the head too */
}

int layer_split_piece(StageChunk at, int stages) {
    return at.chunk * stages + at.stage;
}

void layer_split_chunk_range(const int *blocks, int stages, StageChunk at, int *first_block,
                             int *last_block) {
    layer_split_range(blocks, layer_split_piece(at, stages), first_block, last_block);
}

/* The piece `offset` (+1 or -1) pieces from `at`: round the ring of stages,
 * into the next (previous) chunk where the ring wraps. */
static StageChunk piece_step(StageChunk at, int stages, int chunks, int offset) {
    int piece = layer_split_piece(at, stages) + offset;
    if (piece < 0 || piece >= stages * chunks) return (StageChunk){-1, -1};
    return (StageChunk){piece % stages, piece / stages};
}

StageChunk layer_split_next(StageChunk at, int stages, int chunks) {
    return piece_step(at, stages, chunks, +1);
}

StageChunk layer_split_prev(StageChunk at, int stages, int chunks) {
    return piece_step(at, stages, chunks, -1);
}

void layer_split_stage(const ModelConfig *m, const char *split, int stages, int stage, int *blocks,
                       int *first_block, int *last_block, int *first_unit, int *last_unit) {
    if (layer_split_by_flops(split)) {
        layer_split_balanced_flops(m, stages, blocks);
    } else if (split[0]) {
        layer_split_parse(split, stages, m->layers, blocks);
    } else {
        ParamTable table;
        param_table_build(&table, m);
        layer_split_balanced(&table, stages, blocks);
        param_table_free(&table);
    }
    layer_split_range(blocks, stage, first_block, last_block);
    layer_split_units(*first_block, *last_block, stage, stages, m->layers, first_unit, last_unit);
}
