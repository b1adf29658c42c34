/* checkpoint_sharded.c: see checkpoint_sharded.h. */
#include "common/run/checkpoint_sharded.h" /* each rank's part of one checkpoint */

#include "common/run/run_dir.h" /* the --out directory and its files */
#include "common/core/util.h" /* fatal, log_info, exit codes, flag parsing */

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Rank 0's value on every rank of g, in two exact halves (doubles hold 32
 * bits exactly); an all-reduce, so also a barrier. */
static uint64_t from_rank0(CommGroup *g, uint64_t value) {
    int root = comm_rank(g) == 0;
    double high = comm_allreduce_double(g, root ? (double)(value >> 32) : 0.0, 0);
    double low = comm_allreduce_double(g, root ? (double)(value & 0xffffffffu) : 0.0, 0);
    return (uint64_t)high << 32 | (uint64_t)low;
}

/* Does this rank find the token file rank 0 wrote, holding `token`? */
static int sees_token(const char *path, uint64_t token) {
    uint64_t found = 0;
    int fd = open(path, O_RDONLY);
    if (fd < 0) return 0;
    ssize_t got = read(fd, &found, sizeof found);
    close(fd);
    return got == (ssize_t)sizeof found && found == token;
}

/* "rank 1 does", "ranks 1,3 do": the ranks whose flag in seen[] is 0, for a message. */
static void describe_blind_ranks(const int *seen, int ranks, char *out, size_t size) {
    int blind = 0;
    char list[512] = "";
    for (int r = 0; r < ranks; r++)
        if (!seen[r]) {
            size_t used = strlen(list);
            snprintf(list + used, sizeof list - used, "%s%d", blind++ ? "," : "", r);
        }
    snprintf(out, size, "rank%s %s do%s", blind > 1 ? "s" : "", list, blind > 1 ? "" : "es");
}

void checkpoint_check_shared_directory(CommGroup *g, const Config *cfg) {
    int rank = comm_rank(g), ranks = comm_size(g);
    if (!cfg->save[0] || ranks == 1) return;
    char dir[PATH_BYTES], token_path[JOINED_PATH_BYTES];
    directory_of(cfg->save, dir);
    uint64_t token = rank == 0 ? unique_id() : 0;
    if (rank == 0) {
        snprintf(token_path, sizeof token_path, "%s/.ckpt-shared-%016llx", dir, (unsigned long long)token);
        int fd = open(token_path, O_WRONLY | O_CREAT | O_EXCL, 0600);
        if (fd < 0 || write(fd, &token, sizeof token) != (ssize_t)sizeof token || close(fd) != 0)
            fatal(EXIT_RUNTIME, "--save %s: cannot write %s (%s)", cfg->save, token_path, strerror(errno));
        temp_file_register(token_path);
    }
    token = from_rank0(g, token); /* the token is on the disk before anyone looks */
    snprintf(token_path, sizeof token_path, "%s/.ckpt-shared-%016llx", fault_save_directory(dir),
             (unsigned long long)token);
    int mine = sees_token(token_path, token);
    int *seen = xcalloc(ranks, sizeof(int));
    comm_gather_bytes(g, &mine, sizeof mine, seen, 0);
    int all_see = comm_all(g, mine); /* every rank has looked */
    if (rank == 0) {
        unlink(token_path);
        temp_file_forget(token_path);
    }
    if (!all_see && rank == 0) {
        char blind[600];
        describe_blind_ranks(seen, ranks, blind, sizeof blind);
        fatal(EXIT_USAGE,
              "--save %s: %s not see the directory %s as rank 0 does (valid: a --save directory every rank "
              "shares)",
              cfg->save, blind, dir);
    }
    free(seen);
    if (!all_see) comm_barrier(g); /* rank 0 ends the job */
}

uint64_t checkpoint_save_sharded(CommGroup *g, const Config *cfg, const CkptLayout *l, const CkptState *s) {
    int rank = comm_rank(g), ranks = comm_size(g);
    CkptWriter w;
    ckpt_writer_init(&w, cfg, l, s);
    if (rank == 0) ckpt_writer_create(&w);
    w.nonce = from_rank0(g, w.nonce); /* PATH.tmp exists before anyone opens it, and its mark is known */

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
    checksum = from_rank0(g, checksum); /* on every rank, and the rename is done */
    if (rank == 0) {
        run_info_checkpoint(cfg, cfg->save, s->step, checksum);
        log_info("saved checkpoint %s at step %d (%d ranks wrote their parts)\n", cfg->save, s->step, ranks);
    }
    return checksum;
}
