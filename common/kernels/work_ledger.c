/* work_ledger.c: see work_ledger.h. One table of rows, grown as pieces open;
 * a lock, because a communication worker's kernels (a ring's additions) may
 * count while the main thread's piece is open. */
#include "common/kernels/work_ledger.h" /* a dry run's counted work */

#include "common/device/device.h" /* mem_alloc, copies, streams, timers */
#include "common/core/util.h" /* fatal, log_info, exit codes, flag parsing */

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static pthread_mutex_t ledger_lock = PTHREAD_MUTEX_INITIALIZER;
static WorkPiece *pieces;
static int count, capacity;
static int depth; /* pieces open: only the outermost has a row */
static int open_row = -1, host_row = -1;
static int step_rows = -1; /* work_step_end: the rows the step opened (-1: the step goes on) */

static int add_row(const char *action, int micro, int micro2, int chunk) {
    if (count == capacity) {
        capacity = capacity ? 2 * capacity : 64;
        pieces = realloc(pieces, (size_t)capacity * sizeof *pieces);
        if (!pieces) fatal(EXIT_RUNTIME, "work ledger: out of host memory for %d pieces", capacity);
    }
    WorkPiece *w = &pieces[count];
    *w = (WorkPiece){.micro = micro, .micro2 = micro2, .chunk = chunk};
    snprintf(w->action, sizeof w->action, "%s", action);
    if (micro < 0) { /* the k-th row of this action in the step */
        w->micro = 0;
        for (int i = 0; i < count; i++) w->micro += strcmp(pieces[i].action, action) == 0;
    }
    return count++;
}

void work_begin_action(const char *action, int micro, int micro2, int chunk) {
    if (!device_dry()) return;
    pthread_mutex_lock(&ledger_lock);
    if (depth++ == 0) open_row = add_row(action, micro, micro2, chunk);
    pthread_mutex_unlock(&ledger_lock);
}

void work_begin(const char *action, int micro, int chunk) {
    work_begin_action(action, micro, -1, chunk);
}

void work_end(void) {
    if (!device_dry()) return;
    pthread_mutex_lock(&ledger_lock);
    if (depth == 0) fatal(EXIT_RUNTIME, "work_end: no piece of work is open");
    if (--depth == 0) open_row = -1;
    pthread_mutex_unlock(&ledger_lock);
}

/* The row work goes to now: the open piece, else an `other` row (the last row if it is one). */
static WorkPiece *current(void) {
    if (open_row < 0 && (count == 0 || strcmp(pieces[count - 1].action, "other") != 0 || count - 1 == host_row))
        add_row("other", -1, -1, 0);
    return &pieces[open_row >= 0 ? open_row : count - 1];
}

void work_add(double flops, double matmul_flops, double bytes) {
    if (!device_dry()) return;
    pthread_mutex_lock(&ledger_lock);
    WorkPiece *w = current();
    w->flops += flops;
    w->matmul_flops += matmul_flops;
    w->bytes += bytes;
    pthread_mutex_unlock(&ledger_lock);
}

void work_add_adam(double params, double bytes) {
    if (!device_dry()) return;
    pthread_mutex_lock(&ledger_lock);
    WorkPiece *w = current();
    w->adam_params += params;
    w->bytes += bytes;
    pthread_mutex_unlock(&ledger_lock);
}

void work_add_host_adam(double params, double bytes) {
    if (!device_dry()) return;
    pthread_mutex_lock(&ledger_lock);
    if (host_row < 0) host_row = add_row("host_update", 0, -1, 0);
    pieces[host_row].adam_params += params;
    pieces[host_row].bytes += bytes;
    pthread_mutex_unlock(&ledger_lock);
}

void work_reset(void) {
    pthread_mutex_lock(&ledger_lock);
    count = 0, depth = 0, open_row = -1, host_row = -1, step_rows = -1;
    pthread_mutex_unlock(&ledger_lock);
}

void work_step_end(void) {
    pthread_mutex_lock(&ledger_lock);
    step_rows = count;
    pthread_mutex_unlock(&ledger_lock);
}

const WorkPiece *work_pieces(int *n) {
    *n = step_rows >= 0 ? step_rows : count;
    return pieces;
}
