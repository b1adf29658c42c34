/* util.h: errors, logging and hashing shared by every program of the course.
 *
 * Errors: every failure goes through fatal(), which prints one line
 *   "error: ..." (prefixed with the rank once the communication layer has
 *   registered one) and ends the whole job. A multi-process program registers
 *   an abort hook (MPI_Abort) so that one failing rank never leaves the others
 *   waiting in a collective.
 * Exit codes: EXIT_RUNTIME (1) for failures of the machine or a library,
 *   EXIT_USAGE (2) for bad input of any kind (a configuration that does not
 *   fit in memory included), EXIT_DIVERGED (3) when the loss
 *   stops being a finite number. */
#ifndef UTIL_H
#define UTIL_H

#include <setjmp.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

enum { EXIT_RUNTIME = 1, EXIT_USAGE = 2, EXIT_DIVERGED = 3 };

/* Sizes of path buffers: a path the user gives (--out, --save, ...), and
 * such a path joined with '/' and a file name of up to 100 bytes. */
enum { PATH_BYTES = 4096, JOINED_PATH_BYTES = PATH_BYTES + 104 };

/* Bytes in a mebibyte, for the MiB figures printed in summaries. */
#define BYTES_PER_MIB 1048576.0

/* Print "error: <message>" on stderr and end the job with exit_code, once:
 * from several threads at once (an OpenMP loop), the first speaks and ends
 * the process, the others wait for it. */
void fatal(int exit_code, const char *fmt, ...) __attribute__((format(printf, 2, 3), noreturn));

/* What a stubbed exercise calls in a student copy (see `make exercises`):
 * prints "exercise ID not implemented: see WHERE" and ends the program
 * (fatal: once, however many of a loop's threads reach the stub). */
void exercise_not_implemented(const char *id, const char *where) __attribute__((noreturn));

/* What an exercise region calls first in a traced copy (exercises.py --trace,
 * used by common/python/exercise_deps.py to find which exercises each grader's runs
 * reach): with COURSE_EXERCISE_TRACE=FILE set, appends "ID" to FILE, once per
 * process and exercise. */
void exercise_reached(const char *id);

/* Catching usage errors instead of ending the program. A multi-rank program
 * checks its flags on every rank, then the ranks agree on one verdict (see
 * config_parse_ranks): while a trap is armed, fatal(EXIT_USAGE, ...) copies its
 * message into the trap and longjmps back to the setjmp on trap->where:
 *
 *     UsageTrap trap;
 *     usage_trap_arm(&trap);
 *     if (setjmp(trap.where) == 0) { ...checks that may call fatal... }
 *     else { ...trap.message holds the error... }
 *     usage_trap_disarm();
 */
typedef struct {
    jmp_buf where;
    char message[1024];
} UsageTrap;
void usage_trap_arm(UsageTrap *trap);
void usage_trap_disarm(void);

/* Temporary files (PATH.tmp before a rename) that fatal() removes, so a failed
 * run leaves none behind. Register after creating, forget after renaming. */
void temp_file_register(const char *path);
void temp_file_forget(const char *path);

/* Files. */
/* The directory a file name is in: "." for a bare name, "/" at the root. */
void directory_of(const char *path, char dir[PATH_BYTES]);
/* Do a and b name the same file (device and inode), whatever the spelling
 * (links, "..", symlinks)? 0 when either does not exist. */
int same_file(const char *a, const char *b);
/* The output-file rule, one for every program and tool that writes a file
 * the user names (--save, common/ckpt export, common/plan --csv, ...): it
 * writes PATH only if PATH is a new name, or an existing regular file it
 * recognises BY CONTENT as its own earlier output: OutputKind's signature,
 * the bytes its output holds at signature_offset (the exact CSV header it
 * writes, a checkpoint's magic, ...). Anything else, a directory, a device
 * or FIFO, the --data file, a checkpoint, any other file, ends the program
 * with EXIT_USAGE and one line:
 *   "FLAG PATH: is a directory (valid: a file name)"
 *   "FLAG PATH: not a regular file (valid: a new name or an earlier EARLIER)"
 *   "FLAG PATH: exists and is not WHAT (valid: a new name or an earlier EARLIER)"
 *   "FLAG PATH: the directory DIR does not exist"
 * It reads PATH and writes nothing. common/scripts/outputs.sh states the same
 * rule for the shell scripts, common/python for the Python tools. */
typedef struct {
    const char *what;      /* "a checkpoint of this course" */
    const char *earlier;   /* "checkpoint": what "an earlier ..." names */
    const char *signature; /* the bytes its own output holds at signature_offset */
    size_t signature_bytes, signature_offset;
} OutputKind;
int output_file_is_own(const char *path, const OutputKind *kind);
void output_file_check(const char *flag, const char *path, const OutputKind *kind);
/* A value no other call, process or machine is likely to return (the time,
 * the process, a counter, hashed): names a save and a start-up token. */
uint64_t unique_id(void);

/* Ctrl-C (SIGINT) and kill (SIGTERM; mpirun passes both on to its ranks as
 * SIGTERM) end the program at once: the temporary files registered above
 * are removed, rank 0 prints "interrupted at step N; last checkpoint: step
 * K at PATH" (or "no checkpoint saved"), and the exit status is 130 or 143
 * (128 + the signal, as a shell reports it). config_parse installs the
 * handler; the step in progress and each checkpoint saved are noted as the
 * run goes. */
void interrupt_handlers_install(void);
void interrupt_note_step(int step);
void interrupt_note_checkpoint(int step, const char *path);

/* Multi-process programs install these: the rank named in error messages, and a
 * function that ends every process of the job (it must not return). */
void set_error_rank(int rank);
void set_abort_hook(void (*hook)(int exit_code));

/* printf on stdout from rank 0 only (set_log_rank sets who we are, of how
 * many ranks), flushed at once. */
void set_log_rank(int rank, int ranks);
/* The rank set_log_rank registered (0 without mpirun): for fault injection on one rank. */
int process_rank(void);
void log_info(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* malloc for small host-side bookkeeping (not tracked: tensors go through device.h). */
void *xmalloc(size_t bytes);
void *xcalloc(size_t count, size_t bytes);

/* Counter-based randomness: the value depends only on its inputs, never on call
 * order, which is what lets any split of the model or the batch reproduce the
 * same numbers. */
uint64_t hash64(uint64_t x);                             /* splitmix64 finaliser */
uint64_t hash_string(const char *s);                     /* FNV-1a, 64 bit */
uint64_t hash_bytes(const void *data, size_t bytes);     /* checksum of a buffer */
double hash_uniform(uint64_t a, uint64_t b, uint64_t c); /* in [0, 1) */
double hash_normal(uint64_t a, uint64_t b, uint64_t c);  /* standard normal */

/* Sequential generator for the text sampler (its state is saved in checkpoints). */
uint32_t rng_next_u32(uint64_t *state);
float rng_next_float(uint64_t *state); /* in [0, 1) */

/* Wall clock in milliseconds since an arbitrary start (monotonic). */
double wall_ms(void);

/* Fault injection, for the tests. Every COURSE_FAULT_* variable is read here,
 * once: fault_check_environment() (config_parse calls it at start-up) ends
 * the program with EXIT_USAGE and one line for a malformed value; an empty
 * value is unset. RANK is the rank set_log_rank registered (0 without mpirun).
 *
 * COURSE_FAULT_KILL=NAME:RANK[:N]: rank RANK raises SIGKILL on itself the N-th
 *   time (default 1) it reaches fault_point(NAME): a crashed machine, with no
 *   cleanup and no message. The points are one table, fault_points in
 *   util.c, each beside the call that reaches it: every collective and
 *   point-to-point call of comm.c (posted sends count as "send"), the
 *   communication thread ("worker"), 02's ring ("ring") and the checkpoint
 *   writer ("save"). A name not in the table, or a RANK the job does not
 *   have, is refused at start-up in one line that lists the valid ones.
 * COURSE_FAULT_SKIP=NAME:RANK[:N]: fault_skip(NAME) is 1 on rank RANK the N-th
 *   time: the call returns without communicating, a rank-divergent
 *   collective for the watchdog to name (watchdog.h). Points: the table's
 *   calls of comm.c.
 * COURSE_FAULT_DISK_FULL=NAME[:BYTES]: writing to the output file or
 *   checkpoint called NAME fails as if the disk were full once BYTES (default
 *   0) have been written to it (mounting a small filesystem is not allowed in
 *   tests): fault_disk_full returns 1 and sets errno to ENOSPC. Writers call
 *   it before each write of `bytes`.
 * COURSE_FAULT_NAN_STEP=K: the loss of step K becomes NaN (optim.h).
 * COURSE_FAULT_OVERFLOW_STEP=K [COURSE_FAULT_OVERFLOW_RANK=R]: fp16's
 *   gradients of step K overflow on every rank, or on rank R only if given:
 *   the rank's sum of squares in the optimizer step's overflow check is
 *   +Inf, as an overflowed gradient makes it (optimizer_step.h), where every
 *   layout checks, whatever part of the gradient the rank holds. A rank
 *   that holds the whole summed gradient and decides alone (01; 02's
 *   replicas, after their all-reduce) overflows whatever R is: an overflow
 *   on any rank reaches every rank's sum.
 * COURSE_FAULT_REPLICA_RANK=R: rank R's replica differs (chapter 02's check).
 * COURSE_FAULT_PLANT=BYTES: chapter 02's data parallelism (data_parallel.c)
 *   holds BYTES (a multiple of 4, at least 4) of device memory more, in the
 *   comm category, and all-reduces them over the replicas once a step: an
 *   allocation and a message the planner was never told of, for the test
 *   that the plan follows the program (tests/tools/plan.bats).
 * Every RANK and R must be a rank of the job (0..ranks-1).
 * COURSE_FAULT_SAVE_DIR=RANK:DIR: for the test of ranks that do not share
 *   --save's directory (one machine cannot have two disks at one path): rank
 *   RANK looks for the start-up token that proves the directory is shared
 *   (checkpoint_sharded.h) in DIR instead, as a rank on another machine would
 *   look on its own disk; fault_save_directory returns DIR there, else dir. */
void fault_check_environment(void);
void fault_point(const char *name);
int fault_skip(const char *name);
int fault_disk_full(const char *name, size_t bytes);
int fault_nan_step(void);                      /* K, or -1 */
int fault_overflow_at(int step, int any_rank); /* 1: step K, on this rank (or any_rank: on R's) */
int fault_replica_rank(void);                  /* R, or -1 */
int fault_plant_bytes(void);                   /* BYTES rounded down to floats, or 0 */
const char *fault_save_directory(const char *dir);

#ifdef __cplusplus
}
#endif

/* Parse sizes such as "512", "64K", "1.5G" (binary multiples). Returns 0 on
 * success, -1 when the text is not a size. */
int parse_bytes(const char *text, size_t *out);

/* Parsing a flag's value (config.c's rows, a chapter's own text flags such as
 * --split): the value, or the end of the program with a message naming the
 * flag and its valid range. */
long parse_int_flag(const char *flag, const char *value, long lo, long hi);
/* value must be one of `valid` ("naive|flat|overlap"); copied into dst, else
 * "FLAG: unknown NOUN 'value' (valid: naive, flat, overlap)". */
void parse_choice_flag(const char *flag, const char *noun, const char *value, const char *valid, char *dst,
                       size_t size);
double parse_float_flag(const char *flag, const char *value, double lo, double hi);
/* The endings every getopt_long loop of the course's tools shares: getopt's
 * ':' (a flag without its value) and '?' (an unknown flag) end the program
 * with one line naming the flag; after the loop, getopt_no_operands ends it
 * on a word that is not a flag. */
void getopt_refuse(int opt, char **argv) __attribute__((noreturn));
void getopt_no_operands(int argc, char **argv);

#endif
