/* preflight.h: everything a run checks before it builds anything.
 *
 * The flags (config.h), then the machine (OMP_NUM_THREADS, whether one
 * replica fits in memory), the tests' fault variables, and the files: the
 * data, the checkpoint to resume from, the save path and the output
 * directory, each checked and its identity added to the configuration
 * record. A multi-rank program then has its ranks agree on that record
 * (config_parse_ranks) before any collective of training. */
#ifndef PREFLIGHT_H
#define PREFLIGHT_H

#include "common/run/config.h" /* Config and the flag tables */

/* Everything a run checks before it builds anything, in one call: fill cfg
 * from argv, check every value and every combination, and check the files
 * (the data, the checkpoint to resume, the save path, the output directory),
 * recording all of it in cfg->record. program: e.g. "01_single_gpu/train";
 * summary: one line saying what the program teaches. Exits 0 after --help,
 * EXIT_USAGE on errors. Multi-rank programs call config_parse_ranks instead. */
void config_parse(Config *cfg, int argc, char **argv, const char *program, const char *summary,
                  const ChapterFlags *chapter);
/* The same as two steps, for config_parse_ranks: returns 1 when --help was
 * asked for (nothing else is done then), 0 after every check passed; errors
 * go through fatal(EXIT_USAGE). */
int config_parse_and_check(Config *cfg, int argc, char **argv, const char *program,
                           const ChapterFlags *chapter);
/* config_parse for a job of many ranks: every rank reads and checks its own
 * command line and files, then the ranks agree (ranks_agree, agreement.h) before
 * any collective of training. When they all pass and their configuration
 * records are equal, the run goes on and the watchdog starts (--timeout);
 * otherwise ranks_agree ends the job with one message. (preflight_ranks.c,
 * linked by the programs that use MPI.) */
void config_parse_ranks(Config *cfg, int argc, char **argv, const char *program, const char *summary,
                        const ChapterFlags *chapter);

#endif
