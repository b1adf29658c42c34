/* run_dir.h: the run directory (--out) and how every file in it is written.
 *
 * Nothing is lost silently: every write, flush and close is checked, and a
 * failure (a full disk: ENOSPC, EIO) ends the run with EXIT_RUNTIME naming
 * the file and the reason. What a run writes appears only complete:
 * steps.csv is flushed line by line (on an error it is cut back to its last
 * complete line); every other file is written to NAME.tmp and renamed when
 * complete. A directory holding another run's files is refused unless
 * --overwrite; the same program with the same configuration replaces its own
 * earlier run; a resume from a checkpoint this directory's run saved appends
 * to its steps.csv. run-info.txt says which program and configuration wrote
 * the directory, whether the run completed, and the checkpoints it saved.
 * The CSVs themselves: run_csv.h. */
#ifndef RUN_DIR_H
#define RUN_DIR_H

#include "common/run/config.h" /* Config and the flag tables */

#include <stdint.h>
#include <stdio.h>

/* ---- files in --out ---- */
typedef struct OutFile OutFile;
typedef enum {
    OUT_LINES,        /* NAME itself, each line flushed and checked (steps.csv) */
    OUT_LINES_APPEND, /* the same, appending to NAME */
    OUT_WHOLE,        /* NAME.tmp, renamed to NAME by out_close */
    OUT_WHOLE_PART,   /* NAME.tmp, begun (0) or continued (1) by several ranks in turn; out_publish renames */
} OutKind;
OutFile *out_open(const char *dir, const char *name, OutKind kind, int continued);
void out_printf(OutFile *f, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void out_close(OutFile *f);
/* Rename an OUT_WHOLE_PART file's NAME.tmp to NAME; out_part_path gives NAME.tmp. */
void out_publish(const char *dir, const char *name);
const char *out_part_path(const char *dir, const char *name);

/* ---- the run directory ---- */
/* Before training (any rank): is cfg->out usable, and what to do with the
 * files it holds (OUT_NEW, OUT_REPLACE, OUT_APPEND)? Refuses (EXIT_USAGE) a
 * non-directory and another run's files without --overwrite. Creates
 * nothing: a missing directory is made by out_dir_prepare. */
OutMode out_dir_check(const Config *cfg, const char *program);
/* Is `name` (in --out) one of the files a run writes there, or its NAME.tmp?
 * (steps.csv, run.csv, memory.csv, run-info.txt, ...: what --save must not replace) */
int out_is_run_file(const char *name);
/* mkdir -p dir for --out; fails (exit 2, one line naming what could not be
 * created) like out_dir_check. */
void out_make_directories(const char *dir);
/* The writing rank, once the job agreed to run: create the directory, remove
 * the replaced run's files, write run-info.txt (status running). */
void out_dir_prepare(const Config *cfg, const char *program);
/* run-info.txt: a checkpoint this run saved (a later --resume from it appends
 * here), and the end of the run (status complete). */
void run_info_checkpoint(const Config *cfg, const char *path, int step, uint64_t checksum);
void run_info_complete(const Config *cfg);

#endif
