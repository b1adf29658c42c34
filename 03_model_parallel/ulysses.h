/* ulysses.h: DeepSpeed-Ulysses, context parallelism by a head split (chapter
 * 03, --cp N --cp-mode ulysses; the ring is context_parallel.h).
 *
 * As with the ring, a cp rank holds T/N positions of every sequence, for
 * every head, and computes everything that works on one token at a time for
 * those positions. Attention is where it differs. After the QKV projection,
 * an all-to-all over the N cp ranks turns "T/N positions of all NH heads"
 * into "all T positions of NH/N heads": rank r sends to rank d the q | k | v
 * columns of d's heads for its own positions, and receives from every rank
 * its positions of r's heads. Each rank then runs ordinary causal attention
 * over the whole sequence (kernels.h's attention_forward, C/N channels and
 * NH/N heads of the same head size), and a second all-to-all turns its
 * output back into T/N positions of all heads. No log-sum-exp merge, no
 * blocks: a head's softmax sees its whole row on one rank. The backward
 * mirrors it: dout goes to the head split, attention_backward runs there,
 * and dqkv comes back to the token split; the head-split qkv and out it
 * needs are exchanged again rather than kept (the forward's buffers are
 * reused by the next layer), and lse, B x NH/N x T = B x NH x T/N floats,
 * is kept in the model's own lse buffer.
 *
 * The permutation: a token row of qkv is [q | k | v], each C = NH heads of
 * hs; rank d's share of it is columns d C/N .. (d+1) C/N of each of the
 * three (a strided copy, device.h's copy_on_device_2d). What arrives from
 * rank s are its positions: with --cp-order zigzag two chunks of T/(2N)
 * (context_parallel_chunk), placed where they belong in the sequence.
 *
 * Heads must divide by N; with tensor parallelism it is not written yet.
 * Chapters 04-06 run it inside their stages as they run the ring. Bytes:
 * each all-to-all sends (N-1)/N of its buffer; per layer and micro-batch of
 * B sequences, with E = B x T/N x C x 4 bytes (one rank's C-wide
 * activation): forward 3E (qkv) + E (out), backward 3E (qkv) + E (out) +
 * E (dout) + 3E (dqkv); in all 12 E (N-1)/N a rank, falling as 1/N, where
 * the ring's (3N-2) 2E stays near 6 B T C x 4. Memory: two all-to-all
 * buffers of 3E (comm) and the head split's qkv, dqkv (3E each), out and
 * dout (E each) as workspace; no ring buffers. */
#ifndef ULYSSES_H
#define ULYSSES_H

#include "03_model_parallel/context_parallel.h" /* 03: ring attention (--cp) */

/* Why NH heads cannot be split over N ranks; NULL when they can. */
const char *ulysses_problem(int heads, int N);
/* The flags' refusals, in one line each (chapters 03-06): mode "ulysses"
 * with heads N does not divide or with tp > 1 tensor-parallel ranks (not
 * written), or with --cp-send given (send_given: the ring's); --alltoall
 * given (alltoall_given) without it. */
void ulysses_check_flags(const ModelConfig *m, int cp, int tp, const char *mode, int alltoall_given,
                         int send_given);
/* Ulysses' buffers (B sequences of T tokens, model m) and its attention
 * hooks in cp->split, after context_parallel_create(..., ring 0);
 * context_parallel_destroy frees them. pairwise: the course's all-to-all
 * (alltoall.h), else the library's (comm_alltoall_typed). */
void ulysses_create(ContextParallel *cp, const ModelConfig *m, int B, int T, int pairwise);

#endif
