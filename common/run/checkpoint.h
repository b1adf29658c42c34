/* checkpoint.h: save and resume training, in any layout.
 *
 * A checkpoint holds the LOGICAL state of a run, not the memory of the ranks
 * that wrote it: three arrays in the order of the whole model's parameter
 * table (param_table.h), whatever split, slice or shard each rank held,
 *
 *   params   the fp32 weights of record (in 16-bit runs: the master weights;
 *            the 16-bit weights are those rounded, so they are not stored)
 *   adam_m   Adam's first moment
 *   adam_v   Adam's second moment
 *
 * and what the next step needs to continue exactly as if never stopped:
 * the step reached (which is also the data position: the batch of step s
 * comes from (seed, s) only), Adam's update count, the text sampler's RNG
 * state, fp16's loss scale and its count of clean steps, and the
 * configuration. So chapter 01 resumes what 05 stage 3 on 4 ranks saved, and
 * 03's tensor parallel what 02 saved: layout-independent.
 *
 * The file (little-endian), self-describing:
 *
 *   CheckpointHeader        240 bytes: magic "GPTCKPT\0", version 4, model shape,
 *                           configuration, state, the directory's sizes, the
 *                           writer (program and layout, for people), whether
 *                           the embeddings are tied, checksum
 *   CkptTensorEntry  x num_tensors  64 bytes each: name, unit, shape, offset, numel
 *   CkptArrayEntry   x num_arrays   40 bytes each: name, dtype (0 = f32), numel, file offset
 *   zeros up to data_offset (a multiple of 4096)
 *   f32 params[num_params], f32 adam_m[num_params], f32 adam_v[num_params]
 *
 * The checksum covers the header (but not its writer text), the directory
 * and the arrays. The arrays are hashed in chunks of CKPT_CHUNK_BYTES, each
 * chunk's hash keyed by its index and the keys XOR-ed, so the ranks of a
 * sharded writer hash chunks in parallel and the value does not depend on
 * who wrote what: equal logical content, equal checksum.
 *
 * Layouts. Each rank describes what it holds of each array as segments:
 * elements [first, first + count) of the whole array sit at `local` in this
 * rank's buffer. A chapter-01 rank holds one segment (everything); a stage
 * of a layer split, one (its units' range); a ZeRO shard, one per unit (its
 * slice of each); a tensor-parallel rank, many (a column slice of a matrix
 * is a run of elements in every row). One holder of each element `writes` it
 * (replicas share the writing); every holder reads it back on resume.
 *
 * Writing is atomic: every rank pwrite()s its segments into PATH.tmp at
 * their known offsets (after checking the file carries this save's nonce:
 * the one rank 0 created, not a stale one) and fsyncs; rank 0 checks that
 * the segments written cover each array exactly once, combines the chunk
 * hashes, writes the header, fsyncs and renames PATH.tmp to PATH. A crash anywhere before the
 * rename leaves the previous PATH as it was. Reading: every rank pread()s
 * exactly its own segments, under its own layout.
 *
 * Reading refuses, with one line (EXIT_USAGE), a file that is not a
 * checkpoint, has another version, is truncated or longer than it says, has
 * a header field out of its range, a model shape this course cannot build
 * (heads that do not divide the width, ...), a directory that does not
 * describe its model, a checksum that does not match, another model shape, or nothing
 * left to do. Any precision resumes any other (the arrays are fp32 in every
 * precision); only fp16's loss scale is precision-specific: it carries over
 * from an fp16 checkpoint into an fp16 run with a dynamic scale and starts
 * afresh otherwise. */
#ifndef CHECKPOINT_H
#define CHECKPOINT_H

#include "common/run/config.h" /* Config and the flag tables */
#include "common/model/mixed.h" /* mixed precision: 16-bit weights, loss scaling */
#include "common/model/model.h" /* GPT, its forward and backward */
#include "common/model/optim.h" /* AdamW and the learning-rate schedule */
#include "common/model/param_table.h" /* the parameter table and its units */
#include "common/core/util.h" /* fatal, log_info, exit codes, flag parsing */

#include <stddef.h>
#include <stdint.h>

#define CKPT_VERSION 4u
#define CKPT_CHUNK_BYTES (1u << 20)

/* ---- the file ---- */
typedef struct {
    char magic[8];         /* "GPTCKPT\0" */
    uint32_t version;      /* CKPT_VERSION */
    uint32_t header_bytes; /* sizeof(CheckpointHeader): the tensor directory starts here */
    int32_t layers, dmodel, heads, seq, vocab;
    int32_t num_tensors, num_arrays;
    int32_t precision;    /* of the run that wrote it (Precision) */
    uint64_t num_params;  /* elements of each array */
    uint64_t data_offset; /* where the first array starts */
    /* configuration */
    uint64_t seed;
    int32_t batch, micro, steps, warmup;
    float lr, wd, clip, beta1, beta2, eps;
    /* state */
    int32_t step, adam_t;
    uint64_t rng_state;
    float loss_scale;
    int32_t loss_scale_clean_steps;
    char writer[88];         /* "05_zero/train: 4 ranks, zero 3": for people, outside the checksum */
    int32_t tied_embeddings; /* 1: --tie-embeddings: the head reads wte, there is no lm_head tensor */
    int16_t experts;         /* --experts E (moe.h): 0 for the dense model */
    int16_t moe_every;       /* --moe-every: which blocks hold the experts (0 when dense) */
    uint64_t checksum;
} CheckpointHeader;

typedef struct {
    char name[32];
    int32_t layer, rows, cols, reserved;
    uint64_t offset, numel;
} CkptTensorEntry;

typedef struct {
    char name[16];
    uint32_t dtype, reserved; /* dtype 0: f32 */
    uint64_t numel, offset;   /* offset: bytes from the start of the file */
} CkptArrayEntry;

typedef enum { CKPT_PARAMS, CKPT_ADAM_M, CKPT_ADAM_V, CKPT_ARRAYS } CkptArray;
extern const char *const ckpt_array_names[CKPT_ARRAYS]; /* "params", "adam_m", "adam_v" */

/* ---- what a rank holds ---- */
typedef struct {
    size_t first, count; /* elements [first, first + count) of the whole array */
    size_t local;        /* where they start in this rank's buffer */
    int writes;          /* this rank writes them (exactly one holder of each element does) */
} CkptSegment;

typedef struct {
    float *buffer;  /* this rank's buffer for the array */
    size_t local_n; /* its elements */
    int on_host;    /* host memory (chapter 06's offloaded state), else device memory */
    CkptSegment *segments;
    int count, capacity;
} CkptHolding;

typedef struct {
    CkptHolding array[CKPT_ARRAYS];
    char writer[88];
} CkptLayout;

/* An empty layout; writer: the program and its layout, for the header. */
void ckpt_layout_init(CkptLayout *l, const char *writer_fmt, ...) __attribute__((format(printf, 2, 3)));
void ckpt_layout_free(CkptLayout *l);
/* This rank's buffer for an array (local_n elements, device or host memory). */
void ckpt_set_buffer(CkptLayout *l, CkptArray a, float *buffer, size_t local_n, int on_host);
/* Elements [first, first + count) of array a are at `local` in its buffer;
 * a segment continuing the previous one is merged into it. */
void ckpt_hold(CkptLayout *l, CkptArray a, size_t first, size_t count, size_t local, int writes);

/* The common layouts, for all three arrays at once. */
/* A contiguous range of the table (the whole model, or a pipeline stage's
 * units: model's params over [param_first, +param_count), opt over the same
 * elements), or with model->unit_at several runs of units (a stage's chunks),
 * held alike by `replicas` ranks: replica r writes share r of it (of each
 * unit, with several runs). */
void ckpt_layout_range(CkptLayout *l, const GPT *model, const AdamW *opt, int replica, int replicas);
/* ZeRO over `ranks` ranks (param_table.h's shard layout): the optimizer state
 * is rank's shard (stage >= 1), and so are the parameters at stage 3; below
 * that the parameters are whole (num_params). on_host: the buffers are host
 * memory (chapter 06). */
void ckpt_layout_zero(CkptLayout *l, const ParamTable *t, int stage, float *params, float *m, float *v,
                      int rank, int ranks, int on_host);
/* All three arrays as rank's ZeRO shards of units first_unit..last_unit
 * (chapter 06: a pipeline stage's units, their fp32 master weights, m and v
 * sharded over its data-parallel ranks, in host memory): each buffer holds
 * the slices of those units one after the other, first_unit's first, as
 * param_table.h lays out a shard (padding included). */
void ckpt_layout_shards(CkptLayout *l, const ParamTable *t, int first_unit, int last_unit, float *params,
                        float *m, float *v, int rank, int ranks, int on_host);
/* Array a alone as such a shard (its buffer set with ckpt_set_buffer). */
void ckpt_hold_shard(CkptLayout *l, CkptArray a, const ParamTable *t, int first_unit, int last_unit, int rank,
                     int ranks);

/* ---- the training state besides the arrays ---- */
typedef struct {
    int step;         /* optimizer steps done: the data position too (batches come from (seed, step)) */
    int adam_t;       /* AdamW updates applied (fewer than step when fp16 skipped some) */
    uint64_t rng;     /* the text sampler's generator */
    float loss_scale; /* fp16: the loss scale and the clean steps since it last changed */
    int clean_steps;
} CkptState;

/* The state after `step` steps and adam_t AdamW updates (AdamW.t, or
 * chapter 06's host optimizer's Offload.t); ls may be NULL (fp32 chapters). */
CkptState ckpt_state(int step, int adam_t, uint64_t rng, const LossScaler *ls);

/* ---- before training (config.c) ---- */
/* Check the checkpoint at path completely (header, directory, size,
 * checksum, the model shape, and that cfg has steps left after it); returns
 * its step and checksum, the checkpoint's identity. */
void checkpoint_check(const char *path, const Config *cfg, int *step, uint64_t *checksum);
/* Can a checkpoint be saved at cfg->save? util.h's output-file rule: a new
 * name or an earlier checkpoint (its magic says so), in a directory where a
 * file can be created; never the --data file or one of the run's own files
 * in --out, however spelled. */
void checkpoint_check_save_path(const Config *cfg);
/* What --save writes: a file that opens with the magic (util.h's output-file rule). */
extern const OutputKind checkpoint_output;

/* ---- saving and resuming ---- */
/* Is a checkpoint due after `step` steps? At every --save-every K-th step and
 * at the run's last step, when --save is given. */
int checkpoint_due(const Config *cfg, int step, int last_step);
/* One process (chapter 01): write cfg->save from layout l, record it in
 * run-info.txt, say so. Returns the checksum. Multi-rank programs call
 * checkpoint_save_sharded (checkpoint_sharded.h) on every rank instead. */
uint64_t checkpoint_save(const Config *cfg, const CkptLayout *l, const CkptState *s);
/* Only the write of checkpoint_save (cfg->save from l, atomically), without
 * run-info.txt or a word: for a tool (common/ckpt import-hf). */
uint64_t checkpoint_write(const Config *cfg, const CkptLayout *l, const CkptState *s);
/* Every rank, after building its layout: read its segments of cfg->resume
 * into its buffers, and the state into *adam_t (AdamW.t, or Offload.t),
 * *rng and ls (may be NULL). Returns the step reached. 16-bit runs then
 * round their 16-bit weights from the master weights read (mixed.h:
 * mixed_weights_from_master; zero.h, offload.h: their own). */
int checkpoint_resume(const Config *cfg, const CkptLayout *l, int *adam_t, uint64_t *rng, LossScaler *ls);

/* ---- the steps of a save, for checkpoint_sharded.c ---- */
typedef struct {
    const Config *cfg;
    const CkptLayout *layout;
    char path[PATH_BYTES], tmp[JOINED_PATH_BYTES];
    CheckpointHeader header;
    void *directory; /* the tensor and array entries */
    size_t directory_bytes;
    size_t written[CKPT_ARRAYS]; /* elements this rank wrote */
    uint64_t nonce;              /* this save's: rank 0's create makes it, the other ranks are told it */
} CkptWriter;
/* Header and directory from the configuration, layout and state (every rank). */
void ckpt_writer_init(CkptWriter *w, const Config *cfg, const CkptLayout *l, const CkptState *s);
void ckpt_writer_free(CkptWriter *w);
/* Rank 0: create PATH.tmp (replacing a stale one) at its final size, marked
 * with a new w->nonce (which the other ranks' writers must be given). */
void ckpt_writer_create(CkptWriter *w);
/* Every rank: write its segments into PATH.tmp and fsync; refuses a PATH.tmp
 * that does not carry w->nonce (not the one rank 0 created for this save). */
void ckpt_writer_write(CkptWriter *w);
/* Every rank: the XOR of the keyed hashes of chunks rank, rank + ranks, ...
 * of the arrays, read back from PATH.tmp. */
uint64_t ckpt_writer_hash_chunks(CkptWriter *w, int rank, int ranks);
/* Rank 0: with the chunks' XOR and the elements written per array (summed
 * over the ranks), check the coverage, write the header, fsync, rename. */
uint64_t ckpt_writer_commit(CkptWriter *w, uint64_t chunks, const double written[CKPT_ARRAYS]);

/* ---- reading without a run (common/ckpt, the inspector) ---- */
typedef struct {
    CheckpointHeader header;
    CkptTensorEntry *tensors;
    CkptArrayEntry *arrays;
    long long file_bytes;
    int fd;
} CkptFile;
/* Open and check everything but the checksum; `what` names the file in
 * messages (e.g. "--resume PATH"). Ends the program with EXIT_USAGE on any
 * problem. */
void ckpt_file_open(CkptFile *f, const char *path, const char *what);
void ckpt_file_close(CkptFile *f);
/* The checksum its contents give (parallel over chunks). */
uint64_t ckpt_file_checksum(const CkptFile *f, const char *path, const char *what);

#endif
