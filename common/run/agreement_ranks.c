/* agreement_ranks.c: see agreement.h. The verdicts travel as start-up
 * messages (comm.h), before the watchdog and the byte ledger start. */
#include "common/run/agreement.h" /* ranks_agree on the command line */

#include "common/comm/comm.h" /* collectives and messages between ranks */
#include "common/core/util.h" /* fatal, log_info, exit codes, flag parsing */

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* What each rank tells rank 0 after checking its command line. */
typedef struct {
    int status; /* 0 ready, 1 --help, 2 a usage error */
    char message[1024];
    ConfigRecord record;
} RankVerdict;

/* Records are compared by name, not by position: a rank whose record has
 * an item the others lack (fp16 adds --loss-scale, a resumed run adds its
 * checkpoint) still gets the first flag that differs named, with the values.
 * Section FLAGS is items [0, flag_items), FILES the rest. */
enum { FLAGS, FILES };

/* Rank v's value of the item called `name` in a section, or "(none)". */
static const char *item_value(const RankVerdict *v, int section, const char *name) {
    const ConfigRecord *r = &v->record;
    int from = section == FLAGS ? 0 : r->flag_items, to = section == FLAGS ? r->flag_items : r->count;
    for (int i = from; i < to; i++)
        if (strcmp(r->items[i].name, name) == 0) return r->items[i].value;
    return "(none)";
}

/* "0", "1,3", "1-3": the ranks whose value of `name` is `value`. */
static void ranks_with_value(const RankVerdict *all, int n, int section, const char *name, const char *value,
                             char *out, size_t size) {
    out[0] = '\0';
    int run_start = -1;
    for (int r = 0; r <= n; r++) {
        int same = r < n && strcmp(item_value(&all[r], section, name), value) == 0;
        if (same && run_start < 0) run_start = r;
        if (!same && run_start >= 0) {
            size_t used = strlen(out);
            if (r - 1 == run_start)
                snprintf(out + used, size - used, "%s%d", used ? "," : "", run_start);
            else
                snprintf(out + used, size - used, "%s%d-%d", used ? "," : "", run_start, r - 1);
            run_start = -1;
        }
    }
}

/* The first item of a section (in rank 0's order, then the others') whose
 * value differs between ranks, as a message naming it, two of its values
 * and the ranks holding each; 0 when they all agree. */
static int describe_difference(const RankVerdict *all, int n, int section, char *message, size_t size) {
    for (int holder = 0; holder < n; holder++) {
        const ConfigRecord *r = &all[holder].record;
        int from = section == FLAGS ? 0 : r->flag_items, to = section == FLAGS ? r->flag_items : r->count;
        for (int i = from; i < to; i++) {
            const char *name = r->items[i].name, *value0 = item_value(&all[0], section, name);
            int other = -1;
            for (int k = 1; k < n && other < 0; k++)
                if (strcmp(item_value(&all[k], section, name), value0) != 0) other = k;
            if (other < 0) continue;
            const char *value1 = item_value(&all[other], section, name);
            char ranks0[128], ranks1[128];
            ranks_with_value(all, n, section, name, value0, ranks0, sizeof ranks0);
            ranks_with_value(all, n, section, name, value1, ranks1, sizeof ranks1);
            snprintf(message, size,
                     "the ranks disagree on %s: '%s' on rank%s %s, '%s' on rank%s %s (valid: the same flags "
                     "and files on every rank)",
                     name, value0, strpbrk(ranks0, ",-") ? "s" : "", ranks0, value1,
                     strpbrk(ranks1, ",-") ? "s" : "", ranks1);
            return 1;
        }
    }
    return 0;
}

/* Rank 0's verdict for the job: 0 run, else the exit code (message to print). */
static int judge(const RankVerdict *all, int n, char *message, size_t size) {
    int helps = 0, errors = 0, first_error = -1, same_error = 1;
    for (int r = 0; r < n; r++) {
        helps += all[r].status == 1;
        if (all[r].status == 2) {
            errors++;
            if (first_error < 0) first_error = r;
            same_error &= strcmp(all[r].message, all[first_error].message) == 0;
        }
    }
    if (helps == n) return -1; /* print the help */
    if (helps > 0) {
        snprintf(message, size,
                 "--help was given to %d of the %d ranks (valid: the same flags on every rank)", helps, n);
        return EXIT_USAGE;
    }
    /* Flags first: an error that follows from a flag only some ranks got
     * (a checkpoint with nothing left to do at --steps 3) is that flag's. */
    int all_read = 1;
    for (int r = 0; r < n; r++) all_read &= all[r].record.flag_items > 0;
    if (all_read && describe_difference(all, n, FLAGS, message, size)) return EXIT_USAGE;
    if (errors == n && same_error) {
        snprintf(message, size, "%s", all[first_error].message);
        return EXIT_USAGE;
    }
    if (errors) {
        snprintf(message, size, "[rank %d] %.990s", first_error, all[first_error].message);
        return EXIT_USAGE;
    }
    if (describe_difference(all, n, FILES, message, size)) return EXIT_USAGE;
    return 0;
}

int ranks_agree(int status, const char *message, const ConfigRecord *record) {
    if (comm_dry()) { /* one rank: its own verdict */
        if (status != 2) return status == 1;
        fprintf(stderr, "error: %s\n", message);
        exit(EXIT_USAGE);
    }
    RankVerdict *mine = xcalloc(1, sizeof *mine);
    mine->status = status;
    snprintf(mine->message, sizeof mine->message, "%s", message ? message : "");
    if (record) mine->record = *record;
    int n = comm_size(comm_world()), rank = comm_rank(comm_world());
    RankVerdict *all = rank == 0 ? xcalloc(n, sizeof *all) : NULL;
    comm_startup_gather(mine, sizeof *mine, all);
    struct {
        int code;
        char message[1024];
    } verdict = {0, ""};
    if (rank == 0) verdict.code = judge(all, n, verdict.message, sizeof verdict.message);
    comm_startup_broadcast(&verdict, sizeof verdict);
    free(all);
    free(mine);
    if (verdict.code <= 0) return verdict.code < 0;
    if (rank == 0) fprintf(stderr, "error: %s\n", verdict.message);
    fflush(stdout);
    fflush(stderr);
    comm_finalize();
    exit(verdict.code);
}
