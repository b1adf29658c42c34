/* agreement.h: before any training traffic, do the ranks of a job agree on
 * their command line? (agreement_ranks.c, linked by the programs that use MPI) */
#ifndef AGREEMENT_H
#define AGREEMENT_H

#include "common/core/record.h" /* the configuration record */

/* The ranks' agreement before any collective of training (config_parse_ranks,
 * preflight.h, and commbench with its own command line): every rank says how
 * its checks went and sends its configuration record (record.h) to rank 0.
 * When they all pass and the records are equal, the run goes on. Otherwise
 * rank 0 prints one message and every rank leaves through comm_finalize:
 * --help (exit 0), the same error on every rank (exit 2, printed once), an
 * error on some ranks (exit 2, the first such rank named), or records that
 * differ (exit 2, naming the first flag or file that differs, its values and
 * which ranks have them). Items are matched by name, so a flag only some
 * ranks record (fp16's --loss-scale) is named like any other, as "(none)"
 * where absent.
 * status 0 ready, 1 --help, 2 a usage error (message); record may be NULL.
 * Returns 1 when every rank asked for --help (rank 0 prints it, then all call
 * comm_finalize), 0 to go on; any disagreement or error ends the job as above. */
int ranks_agree(int status, const char *message, const ConfigRecord *record);

#endif
