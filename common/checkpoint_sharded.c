/* checkpoint_sharded.c: see checkpoint_sharded.h. */
#include "checkpoint_sharded.h"

#include "csvlog.h"
#include "util.h"

#include <stdlib.h>

uint64_t checkpoint_save_sharded(CommGroup *g, const Config *cfg, const CkptLayout *l, const CkptState *s) {
    int rank = comm_rank(g), ranks = comm_size(g);
    CkptWriter w;
    ckpt_writer_init(&w, cfg, l, s);
    if (rank == 0) ckpt_writer_create(&w);
    comm_barrier(g); /* PATH.tmp exists before anyone opens it */

    ckpt_writer_write(&w);
    double written[CKPT_ARRAYS];
    for (int a = 0; a < CKPT_ARRAYS; a++) written[a] = comm_allreduce_double(g, (double)w.written[a], 0);

    /* every rank's writes are on the disk: hash the chunks, a share each */
    uint64_t mine = ckpt_writer_hash_chunks(&w, rank, ranks), chunks = 0;
    uint64_t *all = xcalloc(ranks, sizeof(uint64_t));
    comm_gather_bytes(g, &mine, sizeof mine, all, 0);
    for (int r = 0; r < ranks; r++) chunks ^= all[r];
    free(all);

    uint64_t checksum = 0;
    if (rank == 0) checksum = ckpt_writer_commit(&w, chunks, written);
    ckpt_writer_free(&w);
    /* rank 0's checksum to every rank, in two exact halves (and a barrier: the rename is done) */
    double high = comm_allreduce_double(g, rank == 0 ? (double)(checksum >> 32) : 0.0, 0);
    double low = comm_allreduce_double(g, rank == 0 ? (double)(checksum & 0xffffffffu) : 0.0, 0);
    checksum = (uint64_t)high << 32 | (uint64_t)low;
    if (rank == 0) {
        run_info_checkpoint(cfg, cfg->save, s->step, checksum);
        log_info("saved checkpoint %s at step %d (%d ranks wrote their parts)\n", cfg->save, s->step, ranks);
    }
    return checksum;
}
