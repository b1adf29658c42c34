/* preflight_ranks.c: config_parse_ranks (preflight.h), the pre-flight of a
 * job of many ranks: each rank's own checks, then their agreement. */
#include "common/run/agreement.h" /* ranks_agree on the command line */
#include "common/comm/comm.h" /* collectives and messages between ranks */
#include "common/run/preflight.h" /* checks before anything is built */
#include "common/core/util.h" /* fatal, log_info, exit codes, flag parsing */
#include "common/comm/watchdog.h" /* the flight recorder and --timeout */

#include <setjmp.h>
#include <stdlib.h>

void config_parse_ranks(Config *cfg, int argc, char **argv, const char *program, const char *summary,
                        const ChapterFlags *chapter) {
    UsageTrap trap;
    int status;
    usage_trap_arm(&trap);
    if (setjmp(trap.where) == 0)
        status = config_parse_and_check(cfg, argc, argv, program, chapter);
    else
        status = 2;
    usage_trap_disarm();
    if (ranks_agree(status, trap.message, &cfg->record)) {
        if (comm_rank(comm_world()) == 0) config_print_help(program, summary, chapter);
        comm_finalize();
        exit(0);
    }
    if (!comm_dry())
        watchdog_start(cfg->timeout, cfg->out, cfg->resume_step + 1); /* --timeout (watchdog.h) */
}
