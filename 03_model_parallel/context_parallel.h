/* context_parallel.h: context parallelism, attention as a ring (chapter 03, --cp N).
 *
 * Activations grow with the sequence length T, and at long T they, not the
 * weights, fill a device. Context parallelism splits every sequence over N
 * ranks (the grid's cp axis, grid.h): each holds T/N of its positions, for
 * every layer. Almost everything in a block works on one token at a time
 * (layernorms, the linear layers, GELU, the residuals, the loss), so a rank
 * computes it for its own tokens, with the whole model's weights, as a
 * data-parallel replica would; the weight gradients are summed over the cp
 * ranks like dp's. Two things need the other positions:
 *
 *   the position embedding: a rank adds the wpe rows of the positions it
 *     holds, and its gradient goes back into those rows;
 *   attention: a query needs every earlier key. The ranks pass their keys
 *     and values (k | v, 2C floats a token) round a ring, N - 1 hops: at
 *     each hop a rank computes its queries against the block it holds while
 *     the block moves on (a posted send), and folds the result into its
 *     running output with the log-sum-exp merge (kernels.h,
 *     attention_merge): two softmaxes over disjoint keys, each normalised by
 *     its own sum e^lse, become the softmax over both, exactly. Backward
 *     sends the blocks round again, and with each block the gradient of its
 *     keys and values, which every rank adds to; after N hops it is home.
 *
 * Zig-zag. With the causal mask, the last positions see every key and the
 * first see almost none: give rank r the r-th N-th of the sequence and rank
 * N-1 has about 2N-1 times rank 0's work. So the sequence is cut into 2N
 * chunks and rank r holds chunks r and 2N-1-r: a light one and a heavy one,
 * the same work on every rank (context_parallel_chunk; --cp-order contiguous
 * gives rank r chunks 2r and 2r+1 instead, to see the imbalance in busy.csv).
 * A chunk of queries against a chunk of keys is all (the keys come first),
 * none (they come after) or the causal triangle (the same chunk).
 *
 * With tensor parallelism (--mp tensor) each tp rank holds NH/tp heads, and
 * its ring (the cp ranks of the same tp rank) passes those heads' keys and
 * values only: C below is then C/tp for the ring, still C for the embedding.
 *
 * Bytes per layer and micro-batch, with S = B x (T/N) x 2C x 4 the k | v of
 * one rank: forward (N-1) S sent by each rank; backward (N-1) S for the
 * blocks and N S for their gradients. A rank keeps activations of T/N
 * tokens, plus four S-sized ring buffers.
 *
 * --cp-mode ulysses keeps this split of the sequence (and of the embedding)
 * but runs attention on a head split instead of the ring (ulysses.h). */
#ifndef CONTEXT_PARALLEL_H
#define CONTEXT_PARALLEL_H

#include "common/comm/comm.h" /* collectives and messages between ranks */
#include "common/model/model.h" /* GPT, its forward and backward */
#include "common/run/config.h" /* Config and the flag tables */
#include "common/run/timeline.h" /* timeline.csv for the Gantt charts */

#include <stddef.h>

enum { MAX_CP = 1024 }; /* the --cp flag's range */

/* Which chunk (of 2N, each T/(2N) positions) is this rank's first (half 0)
 * or second (half 1): zig-zag r and 2N-1-r, or contiguous 2r and 2r+1. */
int context_parallel_chunk(int rank, int N, int half, int zigzag);
/* The split in one line, for the run's header: which cp rank holds each of
 * the 2N chunks, and each rank's attention work in blocks (a chunk of
 * queries against a chunk of keys; the causal one on the diagonal counts
 * 1/2): 2N on every rank with zig-zag, 4r + 2 on rank r without. */
void context_parallel_describe(char *text, size_t size, int N, int zigzag);
/* Why sequences of T tokens cannot be split over N ranks; NULL when they can. */
const char *context_parallel_problem(int T, int N);
/* Refuses (exit 2, one line) a flag that shapes context parallelism (--cp-order,
 * --cp-send, --cp-mode, --alltoall) given with --cp 1, where it would do nothing. */
void context_parallel_check_given(const Config *cfg, int cp);

typedef struct {
    CommGroup *group; /* the cp ranks sharing these sequences (grid.h) */
    int rank, size;   /* this rank's place in it, N */
    int zigzag;       /* 1: chunks r and 2N-1-r; 0: 2r and 2r+1 */
    int B, T;         /* capacity: B sequences of T tokens, T/N of them held here */
    int C, NH;
    int *tokens, *targets;        /* (B,T) the whole sequences, uploaded here first (device) */
    float *kv[2], *dkv[2];        /* (B,T/N,2C) ring buffers: the block in hand, the one arriving */
    float *block_out, *block_lse; /* (B,T/N,C), (B,NH,T/N) one block's result before its merge */
    float *wpe_rows, *dwpe_rows;  /* (T/N,C) the held positions' rows of wpe, their gradient */
    double comm_ms;               /* time waiting for the ring (this rank) */
    double bytes_sent;            /* round the ring by this rank, over the run */
    SequenceSplit split;          /* what the model calls (model.h): this rank's embedding, attention */
    /* timeline.csv: each hop's blocks (attn_fwd, attn_bwd), its sends in flight from posting to their
     * wait (kv_send, dkv_send) and the time blocked taking the next block (kv_wait, dkv_wait), in
     * training steps only (context_parallel_begin_step starts recording, _pause stops it) */
    Timeline timeline;
    int recording, step;
    int posted;          /* the sends posted (overlapped) or exchanged after the block (blocking) */
    const float *unsent; /* blocking: the block ring_post was given, sent by ring_take */
    double origin_ms;    /* the step's start (every rank starts a step together) */
    /* --cp-mode ulysses (ulysses.h): attention on NH/N heads of the whole sequences; no ring buffers */
    int ulysses;
    int pairwise;                  /* the course's all-to-all (alltoall.h), else the library's */
    float *a2a_send, *a2a_recv;    /* (B,T/N,3C) one all-to-all's blocks, out and in */
    float *heads_qkv, *heads_dqkv; /* (B,T,3C/N) every position, this rank's heads */
    float *heads_out, *heads_dout; /* (B,T,C/N) */
} ContextParallel;

/* tp: the ranks of a tensor-parallel group each pass only their NH/tp heads' keys and values. */
/* send: "posted" (comm_post_send before each block's computation, overlapped;
 * the mpi transport only), "blocking" (comm_sendrecv after it; any transport)
 * or "auto" (posted where the transport can). ring 0: the split without
 * the ring's buffers and attention, which ulysses_create adds (ulysses.h). */
void context_parallel_create(ContextParallel *cp, CommGroup *group, const ModelConfig *m, int B, int T,
                             int zigzag, int tp, const char *send, int ring);
void context_parallel_destroy(ContextParallel *cp); /* the ring's buffers or Ulysses' */
/* Record the ring's work from now on as step `step` (0-based) of the timeline. */
void context_parallel_begin_step(ContextParallel *cp, int step);
/* Stop recording (evaluation and sampling are not the step's work). */
void context_parallel_pause(ContextParallel *cp);
/* Copy this rank's positions of the whole sequences in cp->tokens, cp->targets
 * into tokens, targets (B, T/N). */
void context_parallel_select(ContextParallel *cp, int *tokens, int *targets, int B);

#endif
