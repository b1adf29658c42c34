/* alltoall.c: the pairwise all-to-all (see alltoall.h), over comm_sendrecv_typed. */
#include "03_model_parallel/alltoall.h" /* 03: the pairwise all-to-all */

#include "common/device/device.h" /* mem_alloc, copies, streams, timers */

#define ALLTOALL_TAG 7301

void pairwise_alltoall_typed(CommGroup *g, const void *send, void *recv, size_t count, CommDtype type) {
    int n = comm_size(g), r = comm_rank(g);
    size_t bytes = count * comm_dtype_bytes(type);
    const char *out = send;
    char *in = recv;
    copy_on_device(in + (size_t)r * bytes, out + (size_t)r * bytes, bytes); /* this rank's own block */
    for (int s = 1; s < n; s++) {
        int to = (r + s) % n, from = (r - s + n) % n;
        comm_sendrecv_typed(g, out + (size_t)to * bytes, count, to, in + (size_t)from * bytes, count, from, type,
                            ALLTOALL_TAG);
    }
}
