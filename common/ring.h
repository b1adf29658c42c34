/* ring.h: the course's own all-reduce, a ring of send/recv (chapter 02).
 *
 * n ranks in a ring each send to the right and receive from the left. The
 * buffer is cut into n chunks. A reduce-scatter (n-1 steps: pass a chunk on,
 * add the one that arrives) leaves each rank with one fully summed chunk; an
 * all-gather (n-1 more steps: pass the finished chunks on) gives every rank
 * every chunk. Each rank sends 2(n-1)/n of the buffer, however many ranks
 * there are: the reason the ring is bandwidth-optimal.
 * Works for any group size and any count (chunks may be empty). */
#ifndef RING_H
#define RING_H

#include "comm.h"

#include <stddef.h>

/* In place on a DEVICE buffer of the active backend. */
void ring_allreduce(CommGroup *g, float *buf, size_t count, ReduceOp op);

/* Chunk c of n over count elements: [chunk_begin(c), chunk_begin(c+1)). */
size_t ring_chunk_begin(size_t count, int n, int c);

#endif
