/* watchdog.c: see watchdog.h.
 *
 * The recorder is a ring of entries under one lock; the watchdog thread
 * sleeps on a condition variable (one second, or until watchdog_stop), then
 * answers the questions other ranks' watchdogs sent it, writes the ring
 * when SIGUSR1 asked for it, and checks the open entries against the
 * timeout. Questions and answers are small messages on `ask_comm`, a
 * duplicate of the world communicator that only watchdog threads use, so
 * they never mix with training traffic. */
#include "common/comm/watchdog.h" /* the flight recorder and --timeout */

#include "common/core/util.h" /* fatal, log_info, exit codes, flag parsing */

#include <errno.h>
#include <mpi.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

struct WatchGroup {
    uint64_t id;    /* the same on every member: creation order and members */
    char label[64]; /* "g1 (ranks 0-1)" */
    int size;
    int *world_ranks;           /* (size): member i's rank in the world */
    long collectives, messages; /* sequence numbers handed out */
    const char *last_op;        /* its latest collective (NULL: none yet) */
    long last_seq;
    int last_done;
};

typedef struct {
    int used, done;
    const char *op;    /* a fault point's name: "allreduce", "send", ... */
    WatchGroup *group; /* NULL once the group is freed (label kept) */
    uint64_t group_id;
    char group_label[64];
    int to, from; /* world ranks a message goes to, comes from (-1: none; both: a collective) */
    size_t bytes;
    long seq; /* #seq of the group's collectives (or messages, with a peer) */
    int step;
    double start_ms, end_ms;
} Entry;

/* A question (the group a rank waits in) and its answer. */
typedef struct {
    uint64_t group_id;
} Question;
#define AWAITS_MAX 64 /* ranks an answer names as awaited */
typedef struct {
    int known;        /* the answering rank is a member of the group */
    char last_op[24]; /* its latest collective there ("" none) */
    long last_seq;
    int last_done;
    char waiting[200];                  /* what it waits in now ("" nothing) */
    int awaits[AWAITS_MAX], num_awaits; /* the world ranks that wait waits for */
} Answer;

enum { TAG_QUESTION = 1, TAG_ANSWER = 2 };
#define MAX_GROUPS 64

/* Everything process-wide, in one place. */
static struct {
    pthread_mutex_t lock;
    Entry ring[WATCHDOG_RING];
    int next; /* slot of the next entry */
    int step;
    int groups_made;                /* for group ids: the same count on every member */
    WatchGroup *groups[MAX_GROUPS]; /* live groups, for answering questions */
    int rank, size, timeout_s, running, stop;
    double start_ms; /* wall_ms() at start: entries' times are relative to it */
    char out_dir[PATH_BYTES];
    MPI_Comm ask_comm;
    int have_ask_comm;
    pthread_t thread;
    pthread_cond_t wake;
} W = {.lock = PTHREAD_MUTEX_INITIALIZER, .wake = PTHREAD_COND_INITIALIZER, .step = 0};

static volatile sig_atomic_t dump_requested = 0;
static __thread int current_slot = -1; /* this thread's open entry (watchdog_explain) */

/* ---- groups ---- */

/* "0-3" or "0,2,4": a list of ranks, runs joined. */
static void rank_list(const int *ranks, int n, char *out, size_t size) {
    out[0] = '\0';
    for (int i = 0; i < n;) {
        int j = i;
        while (j + 1 < n && ranks[j + 1] == ranks[j] + 1) j++;
        size_t used = strlen(out);
        if (j > i)
            snprintf(out + used, size - used, "%s%d-%d", i ? "," : "", ranks[i], ranks[j]);
        else
            snprintf(out + used, size - used, "%s%d", i ? "," : "", ranks[i]);
        i = j + 1;
    }
}

WatchGroup *watchdog_group_create(const int *world_ranks, int size) {
    WatchGroup *g = xcalloc(1, sizeof *g);
    g->size = size;
    g->world_ranks = xcalloc(size, sizeof(int));
    memcpy(g->world_ranks, world_ranks, size * sizeof(int));
    pthread_mutex_lock(&W.lock);
    int index = W.groups_made++, slot = 0;
    while (slot < MAX_GROUPS && W.groups[slot]) slot++;
    if (slot < MAX_GROUPS) W.groups[slot] = g;
    pthread_mutex_unlock(&W.lock);
    if (slot == MAX_GROUPS)
        fatal(EXIT_RUNTIME, "watchdog: more than %d communication groups at once", MAX_GROUPS);
    g->id = hash64((uint64_t)index) ^ hash_bytes(world_ranks, size * sizeof(int));
    char ranks[48];
    rank_list(world_ranks, size, ranks, sizeof ranks);
    snprintf(g->label, sizeof g->label, "g%d (ranks %s)", index, ranks);
    return g;
}

void watchdog_group_free(WatchGroup *g) {
    if (!g) return;
    pthread_mutex_lock(&W.lock);
    for (int i = 0; i < MAX_GROUPS; i++)
        if (W.groups[i] == g) W.groups[i] = NULL;
    for (int i = 0; i < WATCHDOG_RING; i++)
        if (W.ring[i].group == g) W.ring[i].group = NULL;
    pthread_mutex_unlock(&W.lock);
    free(g->world_ranks);
    free(g);
}

/* ---- the recorder ---- */

/* The world rank of group rank r of g; -1 for none. */
static int world_rank_of(const WatchGroup *g, int r) {
    return r >= 0 && r < g->size ? g->world_ranks[r] : -1;
}

static int is_message(const Entry *e) {
    return e->to >= 0 || e->from >= 0;
}

int watchdog_begin(WatchGroup *g, const char *op, int dest, int source, size_t bytes) {
    pthread_mutex_lock(&W.lock);
    int slot = W.next;
    for (int tries = 1; tries < WATCHDOG_RING && W.ring[slot].used && !W.ring[slot].done; tries++)
        slot = (slot + 1) % WATCHDOG_RING; /* keep the entries still waiting */
    W.next = (slot + 1) % WATCHDOG_RING;
    Entry *e = &W.ring[slot];
    *e = (Entry){.used = 1, .op = op, .group = g, .group_id = g->id, .bytes = bytes, .step = W.step};
    snprintf(e->group_label, sizeof e->group_label, "%s", g->label);
    e->to = world_rank_of(g, dest);
    e->from = world_rank_of(g, source);
    if (e->to >= 0 || e->from >= 0) {
        e->seq = ++g->messages;
    } else {
        e->seq = ++g->collectives;
        g->last_op = op;
        g->last_seq = e->seq;
        g->last_done = 0;
    }
    e->start_ms = wall_ms();
    pthread_mutex_unlock(&W.lock);
    current_slot = slot;
    return slot;
}

void watchdog_end(int slot) {
    pthread_mutex_lock(&W.lock);
    Entry *e = &W.ring[slot];
    e->done = 1;
    e->end_ms = wall_ms();
    if (!is_message(e) && e->group && e->group->last_seq == e->seq) e->group->last_done = 1;
    pthread_mutex_unlock(&W.lock);
    current_slot = -1;
}

void watchdog_set_step(int step) {
    pthread_mutex_lock(&W.lock);
    W.step = step;
    pthread_mutex_unlock(&W.lock);
}

/* "allreduce #8 on g0 (ranks 0-1)", "send #3 to rank 1 on g2 (ranks 0-3)",
 * "sendrecv #5 to rank 3 and from rank 1 on g2 (ranks 0-3)". */
static void describe(const Entry *e, char *out, size_t size) {
    if (e->to >= 0 && e->from >= 0 && e->to != e->from)
        snprintf(out, size, "%s #%ld to rank %d and from rank %d on %s", e->op, e->seq, e->to, e->from,
                 e->group_label);
    else if (e->to >= 0 && e->from >= 0)
        snprintf(out, size, "%s #%ld with rank %d on %s", e->op, e->seq, e->to, e->group_label);
    else if (is_message(e))
        snprintf(out, size, "%s #%ld %s rank %d on %s", e->op, e->seq, e->to >= 0 ? "to" : "from",
                 e->to >= 0 ? e->to : e->from, e->group_label);
    else
        snprintf(out, size, "%s #%ld on %s", e->op, e->seq, e->group_label);
}

/* The open entry that has waited longest, copied; 0 when none is open. */
static int oldest_open(Entry *out) {
    int found = 0;
    pthread_mutex_lock(&W.lock);
    for (int i = 0; i < WATCHDOG_RING; i++) {
        const Entry *e = &W.ring[i];
        if (e->used && !e->done && (!found || e->start_ms < out->start_ms)) {
            *out = *e;
            found = 1;
        }
    }
    pthread_mutex_unlock(&W.lock);
    return found;
}

/* ---- the flight file ---- */

/* The clock time (HH:MM:SS) of a wall_ms() time. */
static void clock_of(double ms, char *out, size_t size) {
    time_t then = time(NULL) - (time_t)((wall_ms() - ms) / 1000.0);
    struct tm tm;
    localtime_r(&then, &tm);
    strftime(out, size, "%H:%M:%S", &tm);
}

static void write_ring(FILE *f, const char *why) {
    Entry ring[WATCHDOG_RING];
    pthread_mutex_lock(&W.lock);
    memcpy(ring, W.ring, sizeof ring);
    int next = W.next;
    pthread_mutex_unlock(&W.lock);
    char now[16];
    clock_of(wall_ms(), now, sizeof now);
    fprintf(
        f, "# flight recorder of rank %d (pid %d) at %s, %s: its last %d communication calls, oldest first\n",
        W.rank, (int)getpid(), now, why, WATCHDOG_RING);
    fprintf(
        f,
        "# times in seconds since the watchdog started; peer is a world rank (TO>FROM for a send-receive);\n"
        "# seq counts the group's collectives (messages apart), the same number for the same collective\n"
        "# on every member\n");
    fprintf(f, "%-15s %6s %-22s %9s %12s %6s %9s %9s  %s\n", "op", "seq", "group", "peer", "bytes", "step",
            "start_s", "end_s", "state");
    double now_ms = wall_ms();
    for (int k = 0; k < WATCHDOG_RING; k++) {
        const Entry *e = &ring[(next + k) % WATCHDOG_RING];
        if (!e->used) continue;
        char peer[24] = "-", end[16] = "-", state[40] = "done";
        if (e->to >= 0 && e->from >= 0 && e->to != e->from)
            snprintf(peer, sizeof peer, "%d>%d", e->to, e->from);
        else if (is_message(e))
            snprintf(peer, sizeof peer, "%d", e->to >= 0 ? e->to : e->from);
        if (e->done)
            snprintf(end, sizeof end, "%.3f", (e->end_ms - W.start_ms) / 1000.0);
        else
            snprintf(state, sizeof state, "WAITING %.1f s", (now_ms - e->start_ms) / 1000.0);
        fprintf(f, "%-15s %6ld %-22s %9s %12zu %6d %9.3f %9s  %s\n", e->op, e->seq, e->group_label, peer,
                e->bytes, e->step, (e->start_ms - W.start_ms) / 1000.0, end, state);
    }
    fflush(f);
}

/* OUT/flight-RANK.txt, written whole; where it cannot be, say so. Returns
 * the path in `path`. */
static void write_flight_file(const char *why, char *path, size_t size) {
    snprintf(path, size, "%s/flight-%d.txt", W.out_dir, W.rank);
    FILE *f = fopen(path, "w");
    if (!f) {
        fprintf(stderr, "watchdog: [rank %d] cannot write %s: %s\n", W.rank, path, strerror(errno));
        snprintf(path, size, "(not written)");
        return;
    }
    write_ring(f, why);
    fclose(f);
}

/* ---- questions and answers between watchdogs ---- */

/* The world ranks e waits for (at most max): the ranks of a message, or the
 * other members of a collective's group. */
static int awaited_ranks(const Entry *e, int *ranks, int max) {
    int n = 0;
    if (is_message(e)) {
        if (e->from >= 0) ranks[n++] = e->from; /* a send-receive waits above all for what it receives */
        if (e->to >= 0 && e->to != e->from && n < max) ranks[n++] = e->to;
        return n;
    }
    pthread_mutex_lock(&W.lock);
    for (int i = 0; i < MAX_GROUPS; i++) {
        const WatchGroup *g = W.groups[i];
        if (!g || g->id != e->group_id) continue;
        for (int m = 0; m < g->size && n < max; m++)
            if (g->world_ranks[m] != W.rank) ranks[n++] = g->world_ranks[m];
        break;
    }
    pthread_mutex_unlock(&W.lock);
    return n;
}

static Answer answer_for(uint64_t group_id) {
    Answer a = {0};
    pthread_mutex_lock(&W.lock);
    for (int i = 0; i < MAX_GROUPS; i++) {
        const WatchGroup *g = W.groups[i];
        if (!g || g->id != group_id) continue;
        a.known = 1;
        snprintf(a.last_op, sizeof a.last_op, "%s", g->last_op ? g->last_op : "");
        a.last_seq = g->last_seq;
        a.last_done = g->last_done;
    }
    pthread_mutex_unlock(&W.lock);
    Entry open;
    if (oldest_open(&open)) {
        char what[160];
        describe(&open, what, sizeof what);
        snprintf(a.waiting, sizeof a.waiting, "%s for %.1f s", what, (wall_ms() - open.start_ms) / 1000.0);
        a.num_awaits = awaited_ranks(&open, a.awaits, AWAITS_MAX);
    }
    return a;
}

/* Answer every question that has arrived. A rank that is asked is in a hung
 * job: it writes its flight file first, while it still can. */
static void answer_questions(void) {
    for (;;) {
        int arrived = 0;
        MPI_Status st;
        MPI_Message message; /* matched probe: another thread asking cannot take it meanwhile */
        MPI_Improbe(MPI_ANY_SOURCE, TAG_QUESTION, W.ask_comm, &arrived, &message, &st);
        if (!arrived) return;
        Question q;
        MPI_Mrecv(&q, sizeof q, MPI_BYTE, &message, MPI_STATUS_IGNORE);
        char path[JOINED_PATH_BYTES];
        write_flight_file("asked by a rank whose wait timed out", path, sizeof path);
        Answer a = answer_for(q.group_id);
        MPI_Send(&a, sizeof a, MPI_BYTE, st.MPI_SOURCE, TAG_ANSWER, W.ask_comm);
    }
}

/* Ask `n` ranks about the group, and wait up to WATCHDOG_ASK_SECONDS for
 * their answers (answering others meanwhile); answered[i] says who did. */
static void ask(const int *ranks, int n, uint64_t group_id, Answer *answers, int *answered) {
    Question q = {group_id};
    MPI_Request *sent = xcalloc(n, sizeof *sent);
    for (int i = 0; i < n; i++) {
        answered[i] = 0;
        MPI_Isend(&q, sizeof q, MPI_BYTE, ranks[i], TAG_QUESTION, W.ask_comm, &sent[i]);
    }
    double deadline = wall_ms() + 1000.0 * WATCHDOG_ASK_SECONDS;
    int missing = n;
    while (missing > 0 && wall_ms() < deadline) {
        answer_questions();
        int arrived = 0;
        MPI_Status st;
        MPI_Message message;
        MPI_Improbe(MPI_ANY_SOURCE, TAG_ANSWER, W.ask_comm, &arrived, &message, &st);
        if (!arrived) {
            usleep(10000);
            continue;
        }
        Answer a;
        MPI_Mrecv(&a, sizeof a, MPI_BYTE, &message, MPI_STATUS_IGNORE);
        for (int i = 0; i < n; i++)
            if (ranks[i] == st.MPI_SOURCE && !answered[i]) {
                answers[i] = a;
                answered[i] = 1;
                missing--;
            }
    }
    free(sent); /* the job ends next: requests to ranks that never listened are left */
}

/* ---- the verdict ---- */

/* Why rank `peer` (its answer, or none) keeps rank W.rank waiting in e;
 * "" when it waits in the same collective (not the one missing). */
static void judge_peer(const Entry *e, int peer, const Answer *a, int answered, char *out, size_t size) {
    char mine[160];
    describe(e, mine, sizeof mine);
    out[0] = '\0';
    if (!answered) {
        snprintf(out, size,
                 "rank %d never arrived (no answer in %d s: stopped, or stuck outside communication)", peer,
                 WATCHDOG_ASK_SECONDS);
        return;
    }
    const char *where = a->waiting[0] ? a->waiting : "no communication";
    if (is_message(e)) { /* a message: what is the peer doing instead? */
        snprintf(out, size, "rank %d waits in %s", peer, where);
        return;
    }
    if (!a->known) {
        snprintf(out, size, "rank %d is not in %s", peer, e->group_label);
    } else if (a->last_seq < e->seq) {
        snprintf(out, size, "rank %d is at %s #%ld while rank %d waits in %s #%ld (rank %d waits in %s)",
                 peer, a->last_op[0] ? a->last_op : "(none)", a->last_seq, W.rank, e->op, e->seq, peer,
                 where);
    } else if (a->last_seq == e->seq && strcmp(a->last_op, e->op) != 0) {
        snprintf(out, size,
                 "rank %d is in %s #%ld while rank %d waits in %s #%ld: they called different collectives",
                 peer, a->last_op, a->last_seq, W.rank, e->op, e->seq);
    } else if (a->last_seq > e->seq) {
        snprintf(out, size, "rank %d is already at %s #%ld, past %s #%ld", peer, a->last_op, a->last_seq,
                 e->op, e->seq);
    }
}

/* Ask the ranks e waits for where they are, and say who is missing. A rank
 * that answers may wait itself, for a rank e does not name (a ring of
 * messages, a pipeline: rank 0 waits for 1, which waits for the stopped 2):
 * the ranks it waits for are asked in turn, until every rank reached has
 * answered or not. Those that never did come first in the verdict. */
static void find_missing(const Entry *e, char *verdict, size_t size) {
    int *ranks = xcalloc(W.size, sizeof(int)), *answered = xcalloc(W.size, sizeof(int));
    int *asked = xcalloc(W.size, sizeof(int)), *asker = xcalloc(W.size, sizeof(int));
    Answer *answers = xcalloc(W.size, sizeof(Answer));
    int direct = awaited_ranks(e, ranks, W.size), n = direct; /* ranks[0..direct): e's own */
    asked[W.rank] = 1;
    for (int i = 0; i < n; i++) {
        asked[ranks[i]] = 1;
        asker[i] = W.rank;
    }
    for (int first = 0; first < n;) { /* ask the ranks found last round */
        int last = n;
        ask(ranks + first, last - first, e->group_id, answers + first, answered + first);
        for (int i = first; i < last; i++)
            for (int k = 0; answered[i] && k < answers[i].num_awaits && n < W.size; k++) {
                int r = answers[i].awaits[k];
                if (r < 0 || r >= W.size || asked[r]) continue;
                asked[r] = 1;
                asker[n] = ranks[i];
                ranks[n++] = r;
            }
        first = last;
    }
    verdict[0] = '\0';
    char one[400];
    for (int pass = 0; pass < 2; pass++) /* the ranks that never answered, then the others' places */
        for (int i = 0; i < n; i++) {
            if (answered[i] != pass) continue;
            if (i < direct)
                judge_peer(e, ranks[i], &answers[i], answered[i], one, sizeof one);
            else if (!answered[i])
                snprintf(one, sizeof one,
                         "rank %d never arrived (no answer in %d s, and rank %d waits for it)", ranks[i],
                         WATCHDOG_ASK_SECONDS, asker[i]);
            else
                one[0] = '\0'; /* a rank further on that answered: its wait is its own */
            if (!one[0]) continue;
            size_t used = strlen(verdict);
            snprintf(verdict + used, size - used, "%s%s", used ? "; " : "", one);
        }
    if (!verdict[0]) snprintf(verdict, size, "every awaited rank answered and waits in it too");
    free(ranks);
    free(answered);
    free(asked);
    free(asker);
    free(answers);
}

/* e has waited too long: say so, leave the ring, find who is missing, end the job. */
static void time_out(const Entry *e) {
    char what[160], since[16], path[JOINED_PATH_BYTES], verdict[1024];
    describe(e, what, sizeof what);
    clock_of(e->start_ms, since, sizeof since);
    double waited = (wall_ms() - e->start_ms) / 1000.0;
    fprintf(stderr,
            "watchdog: [rank %d] waits in %s (%zu bytes, step %d) since %s: %.1f s, over --timeout %d\n",
            W.rank, what, e->bytes, e->step, since, waited, W.timeout_s);
    write_flight_file("a wait timed out", path, sizeof path);
    fprintf(stderr, "watchdog: [rank %d] flight recorder written to %s\n", W.rank, path);
    find_missing(e, verdict, sizeof verdict);
    fatal(EXIT_RUNTIME, "watchdog: %s has waited %.0f s (--timeout %d): %s", what, waited, W.timeout_s,
          verdict);
}

void watchdog_explain(char *out, size_t size) {
    out[0] = '\0';
    if (!W.have_ask_comm || current_slot < 0) return;
    pthread_mutex_lock(&W.lock);
    Entry e = W.ring[current_slot];
    pthread_mutex_unlock(&W.lock);
    char what[160], path[JOINED_PATH_BYTES], verdict[1024];
    describe(&e, what, sizeof what);
    write_flight_file("a communication call failed", path, sizeof path);
    find_missing(&e, verdict, sizeof verdict);
    snprintf(out, size, " in %s: %s (flight recorder: %s)", what, verdict, path);
}

/* ---- the thread ---- */

static void on_sigusr1(int signal) {
    (void)signal;
    dump_requested = 1;
}

static void *watch(void *arg) {
    (void)arg;
    double last_tick_ms = wall_ms();
    pthread_mutex_lock(&W.lock);
    while (!W.stop) {
        struct timespec wake;
        clock_gettime(CLOCK_REALTIME, &wake);
        wake.tv_sec += 1;
        pthread_cond_timedwait(&W.wake, &W.lock, &wake);
        if (W.stop) break;
        pthread_mutex_unlock(&W.lock);
        answer_questions();
        if (dump_requested) {
            dump_requested = 0;
            char path[JOINED_PATH_BYTES];
            write_ring(stderr, "on SIGUSR1");
            write_flight_file("on SIGUSR1", path, sizeof path);
        }
        /* A tick seconds late means this process itself was frozen (SIGSTOP,
         * a suspended machine): its waits are no one else's fault. */
        int was_frozen = wall_ms() - last_tick_ms > 3000.0;
        last_tick_ms = wall_ms();
        Entry e;
        if (W.timeout_s > 0 && !was_frozen && oldest_open(&e) &&
            wall_ms() - e.start_ms > 1000.0 * W.timeout_s)
            time_out(&e);
        pthread_mutex_lock(&W.lock);
    }
    pthread_mutex_unlock(&W.lock);
    return NULL;
}

void watchdog_start(int timeout_s, const char *out_dir, int first_step) {
    int provided = 0;
    MPI_Query_thread(&provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &W.rank);
    MPI_Comm_size(MPI_COMM_WORLD, &W.size);
    MPI_Comm_dup(MPI_COMM_WORLD, &W.ask_comm);
    W.have_ask_comm = 1;
    W.timeout_s = timeout_s;
    W.start_ms = wall_ms();
    W.step = first_step;
    snprintf(W.out_dir, sizeof W.out_dir, "%s", out_dir);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_sigusr1;
    sa.sa_flags = SA_RESTART;
    sigaction(SIGUSR1, &sa, NULL);
    if (provided < MPI_THREAD_MULTIPLE) return; /* no thread may call MPI beside the main one */
    W.stop = 0;
    if (pthread_create(&W.thread, NULL, watch, NULL) != 0)
        fatal(EXIT_RUNTIME, "cannot start the watchdog thread");
    W.running = 1;
}

void watchdog_stop(void) {
    if (W.running) {
        pthread_mutex_lock(&W.lock);
        W.stop = 1;
        pthread_cond_signal(&W.wake);
        pthread_mutex_unlock(&W.lock);
        pthread_join(W.thread, NULL);
        W.running = 0;
    }
    if (W.have_ask_comm) MPI_Comm_free(&W.ask_comm);
    W.have_ask_comm = 0;
}
