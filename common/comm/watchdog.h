/* watchdog.h: a flight recorder of each rank's communication, and a watchdog
 * that ends a hung job naming the ranks that never arrived.
 *
 * Why. A collective returns only when every rank of its group has called
 * it. When one rank never does (its machine froze, it is stopped in a
 * debugger, it took another branch and called a different collective), the
 * others wait forever: no error, no message, a job that holds its machines
 * until someone notices. Hangs are the most reported pain of distributed
 * training. PyTorch's answer for NCCL is a watchdog thread per process and a
 * "flight recorder" (TORCH_NCCL_TRACE_BUFFER_SIZE, the
 * torch.distributed.flight_recorder analyzer); this module is a small one.
 *
 * Flight recorder. Every call of comm.h opens an entry (operation, group,
 * peer, bytes, sequence number, training step, start time) and closes it
 * when it returns; a ring keeps the last WATCHDOG_RING entries. Sequence
 * numbers count each group's collectives (and, apart, its messages), so the
 * k-th collective of a group carries #k on every rank of it: ranks that show
 * different operations at one number took different paths.
 *
 * Watchdog. A thread per rank wakes every second and looks at the open
 * entries. When one has waited longer than --timeout seconds, the rank
 *   1. prints which operation it waits in and since when,
 *   2. writes its ring to OUT/flight-RANK.txt (OUT is --out),
 *   3. asks the ranks it waits for (a collective's group; a message's
 *      destination and source, both of a send-receive), over its own
 *      duplicate of the world communicator that only watchdog threads use,
 *      for their latest operation in that group (the ranks asked write
 *      their flight files too); a rank that answers that it waits itself,
 *      for others, has those asked in turn (in a ring or a pipeline the
 *      stopped rank is often not the one this rank waits for),
 *   4. ends the job (fatal, so MPI_Abort) naming who never arrived: a rank
 *      that does not answer within WATCHDOG_ASK_SECONDS (stopped, or stuck
 *      outside communication: in a loop, a kernel, a debugger), or one that
 *      answers from another place ("rank 1 is at allreduce #7 while rank 0
 *      waits in allreduce #8").
 * The watchdog times the host's waits (an entry is open while the host is in
 * the call), so it is the same on every transport: with NCCL the call
 * returns when the communication stream's work is done (comm.h).
 *
 * SIGUSR1 (kill -USR1 PID of one rank) writes that rank's ring to stderr and
 * to its flight file, and the run goes on: a live look at a slow job.
 *
 * The recorder and the watchdog are process-wide (one per rank), so their
 * state lives here, in one place, under one lock. */
#ifndef WATCHDOG_H
#define WATCHDOG_H

#include <stddef.h>

#define WATCHDOG_RING 64       /* entries kept per rank */
#define WATCHDOG_ASK_SECONDS 3 /* how long a timed-out rank waits for answers */

/* A group as the recorder knows it: its members' world ranks (in group rank
 * order), its sequence numbers and latest collective. comm.c makes one per
 * CommGroup (collectively, in the same order on every rank). */
typedef struct WatchGroup WatchGroup;
WatchGroup *watchdog_group_create(const int *world_ranks, int size);
void watchdog_group_free(WatchGroup *g);

/* Open an entry for a call of `bytes` on g: a message to group rank dest
 * and/or from group rank source (a send-receive has both), or a collective
 * (both -1). Returns the entry's slot for watchdog_end. Thread-safe (the
 * communication worker records too). */
int watchdog_begin(WatchGroup *g, const char *op, int dest, int source, size_t bytes);
void watchdog_end(int slot);

/* The training step in progress, shown in entries (comm.c sets it as each
 * step is logged). */
void watchdog_set_step(int step);

/* For an error inside a call of this thread (an MPI error): asks the ranks
 * of its group where they are, as a timed-out wait does, writes the flight
 * file, and puts " in OP #SEQ on GROUP: <who is elsewhere> (flight recorder:
 * PATH)" into out ("" when this thread is in no call, or before
 * watchdog_start). The ranks of a group that called different collectives
 * often meet in an error rather than a hang (MPI matches the two calls and
 * finds the sizes differ): this names them. */
void watchdog_explain(char *out, size_t size);

/* Start the watchdog thread of this rank (collective over the world: it
 * duplicates the communicator): timeout_s 0 records and answers SIGUSR1
 * but never ends the job; out_dir is where flight-RANK.txt goes. */
void watchdog_start(int timeout_s, const char *out_dir, int first_step);
void watchdog_stop(void); /* before MPI_Finalize */

#endif
