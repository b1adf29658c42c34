/* ring.h: the course's own all-reduce, a ring of send/recv (chapter 02).
 *
 * n ranks in a ring each send to the right and receive from the left. The
 * buffer is cut into n chunks. A reduce-scatter (n-1 steps: pass a chunk on,
 * add the one that arrives) leaves each rank with one fully summed chunk; an
 * all-gather (n-1 more steps: pass the finished chunks on) gives every rank
 * every chunk. Each rank sends 2(n-1)/n of the buffer, however many ranks
 * there are: the reason the ring is bandwidth-optimal.
 * Works for any group size and any count (chunks may be empty).
 *
 * Any element type of comm.h: fp32, or the 16-bit gradients of mixed
 * precision (bf16, fp16), which travel as 16 bits (2 bytes per element,
 * counted so). Each addition of the reduce-scatter is done in fp32: the
 * arriving chunk and this rank's are widened (exactly), added, and the sum
 * rounded once to the storage type (half.h, to nearest even). A chunk's
 * partial sum is so rounded at every hop, n-1 roundings in all, as NCCL's
 * ring rounds it and as the library's MPI sum (comm.c) does: the order of the
 * additions differs from one device's accumulation, which is why 16-bit
 * layouts match chapter 01 within a tolerance and not bit for bit. Summing
 * the whole chunk in fp32 would need fp32 on the wire: twice the bytes. */
#ifndef RING_H
#define RING_H

#include "common/comm/comm.h" /* collectives and messages between ranks */

#include <stddef.h>

/* In place on a DEVICE buffer of the active backend, of `count` elements of
 * `type`. COMM_AVG divides the sum by the group size (16-bit: in fp32, then
 * rounded). */
void ring_allreduce_typed(CommGroup *g, void *buf, size_t count, CommDtype type, ReduceOp op);
/* The same on floats. */
void ring_allreduce(CommGroup *g, float *buf, size_t count, ReduceOp op);

/* The scratch one hop needs for chunks of up to `chunk` elements of `type`:
 * the arriving chunk, then (16-bit types) room for it widened to fp32, which
 * starts *widened_at bytes in, a multiple of 16 (a GPU faults on a float read
 * at a 2-byte boundary, which an odd chunk of bf16 would give). Returns the
 * bytes. */
size_t ring_scratch_bytes(size_t chunk, CommDtype type, size_t *widened_at);

/* Chunk c of n over count elements: [chunk_begin(c), chunk_begin(c+1)). */
size_t ring_chunk_begin(size_t count, int n, int c);

#endif
