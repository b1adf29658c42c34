/* checkpoint_sharded.h: every rank of a job writes its part of one
 * checkpoint (checkpoint.h), in parallel, into one file.
 *
 *   rank 0      create PATH.tmp at its final size, the directory in place,
 *               marked with a nonce new for this save
 *   -- the nonce, from rank 0 to every rank --
 *   every rank  check PATH.tmp carries the nonce (so no rank ever writes into
 *               a stale PATH.tmp that rank 0 did not create), pwrite its
 *               segments at their offsets (checkpoint.h: the layout), fsync
 *   -- the elements written, summed over the ranks --
 *   every rank  hash its share of the file's chunks, read back from the disk
 *   -- the chunk hashes, XOR-ed over the ranks --
 *   rank 0      check that the ranks wrote each array exactly once, write the
 *               header with the checksum, fsync, rename PATH.tmp to PATH
 *   -- barrier --
 *
 * Until the rename PATH is untouched, so a job killed during a save
 * (tests/robustness/faults.bats) leaves the previous checkpoint as it was. The ranks must
 * see one file system (one machine, or a shared one): before training,
 * checkpoint_check_shared_directory proves it, so that a job whose ranks
 * write to disks of their own ends at start-up, not after training. */
#ifndef CHECKPOINT_SHARDED_H
#define CHECKPOINT_SHARDED_H

#include "common/run/checkpoint.h" /* save and resume */
#include "common/comm/comm.h" /* collectives and messages between ranks */

/* Every rank of g, before training, when --save is given: rank 0 writes a
 * token file of a unique name into --save's directory, every rank must read
 * it there; else the job ends (EXIT_USAGE) naming the ranks that do not see
 * it. (COURSE_FAULT_SAVE_DIR, util.h, plays such a rank in the tests.) */
void checkpoint_check_shared_directory(CommGroup *g, const Config *cfg);

/* Every rank of g: write cfg->save from this rank's layout l. Rank 0 records
 * it in run-info.txt and says so. Returns the checksum (on every rank). */
uint64_t checkpoint_save_sharded(CommGroup *g, const Config *cfg, const CkptLayout *l, const CkptState *s);

#endif
