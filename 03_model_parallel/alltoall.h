/* alltoall.h: the course's own all-to-all, on point-to-point messages
 * (chapter 03, as chapter 02 wrote its own ring all-reduce).
 *
 * Every rank holds `size` blocks and each block has one destination: block j
 * goes to rank j, and arrives there as block r (the sender's rank). Expert
 * parallelism needs it twice a layer (tokens to their experts' ranks, and
 * back), and Ulysses twice an attention (a sequence split becomes a head
 * split, and back). The pairwise exchange: in step s = 1 .. size-1, rank r
 * sends its block for rank r+s and receives rank r-s's block for it, one
 * send and one receive at a time, so no rank is ever the target of two
 * messages at once (a ring of distance s). After size-1 steps every block has
 * arrived; the rank's own block is a copy on the device. Each rank sends
 * (size-1)/size of its buffer, as the library's MPI_Alltoall does, in
 * size-1 messages (the ring all-reduce sends 2(size-1)/size in 2(size-1)).
 * Its bytes count as sends (comm.h's ledger), the library's as all-to-all. */
#ifndef ALLTOALL_H
#define ALLTOALL_H

#include "common/comm/comm.h" /* collectives and messages between ranks */

#include <stddef.h>

/* comm_alltoall_typed's contract (comm.h), on DEVICE buffers of the active
 * backend: send and recv (size * count elements each) must not overlap. */
void pairwise_alltoall_typed(CommGroup *g, const void *send, void *recv, size_t count, CommDtype type);

#endif
