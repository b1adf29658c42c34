/* comm_worker.c: see comm_worker.h.
 *
 * A ring of `capacity` job slots under one lock: the caller fills slot
 * (ticket % capacity) and bumps `queued`; the worker takes tickets in order,
 * runs each without the lock, and bumps `finished`, announcing it on a
 * condition variable. Ticket t is done when finished > t. */
#include "common/comm/comm_worker.h" /* collectives run while the caller computes */

#include "common/device/device.h" /* mem_alloc, copies, streams, timers */
#include "common/core/util.h" /* fatal, log_info, exit codes, flag parsing */

#include <pthread.h>
#include <sys/prctl.h>
#include <stdlib.h>

/* How long the worker sleeps between two tests of a collective in flight
 * (comm.h, "Cores"): its wake-ups move the collective on while the compute
 * thread keeps the core the rest of the time. */
#define WORKER_NAP_US 20
/* Linux lets a sleep run late by the thread's "timer slack" (50 us by
 * default) so as to batch wake-ups; for a nap of 20 us that more than
 * triples it, and every collective ends up to a slack later. The worker
 * asks for 1 ns: measured on 2 CPU ranks of ZeRO-3 (6 small layers), 7-8%
 * off the step, with and without prefetch (common/bench_results/README.md). */
#define WORKER_TIMER_SLACK_NS 1UL

typedef enum { JOB_ALLGATHER, JOB_REDUCE_SCATTER, JOB_ALLREDUCE } JobKind;

typedef struct {
    JobKind kind;
    const void *send;
    void *recv;
    size_t count;
    CommDtype dtype;
    ReduceOp op;
    void (*allreduce)(CommGroup *g, void *buf, size_t count, CommDtype dtype,
                      ReduceOp op); /* JOB_ALLREDUCE: another implementation */
    DeviceEvent *ready;             /* recorded on the compute stream when queued */
    double start_ms, end_ms;
} Job;

struct CommWorker {
    CommGroup *group; /* the worker's own duplicate */
    Job *jobs;
    int capacity;
    pthread_t thread;
    pthread_mutex_t lock;
    pthread_cond_t changed;
    long queued, finished; /* tickets handed out; tickets done */
    int stop;
};

static void run_job(CommWorker *w, Job *j) {
    fault_point("worker"); /* tests/robustness/faults.bats: COURSE_FAULT_KILL (util.h) */
    switch (j->kind) {
    case JOB_ALLGATHER:
        comm_allgather_typed(w->group, j->send, j->recv, j->count, j->dtype, j->ready);
        break;
    case JOB_REDUCE_SCATTER:
        comm_reduce_scatter_typed(w->group, j->send, j->recv, j->count, j->dtype, j->op, j->ready);
        break;
    case JOB_ALLREDUCE:
        if (j->allreduce)
            j->allreduce(w->group, j->recv, j->count, j->dtype, j->op);
        else
            comm_allreduce_typed(w->group, j->recv, j->count, j->dtype, j->op, j->ready);
        break;
    }
}

static void *work(void *arg) {
    CommWorker *w = arg;
    prctl(PR_SET_TIMERSLACK, WORKER_TIMER_SLACK_NS); /* this thread's naps wake on time */
    device_bind_thread(); /* on a GPU: this rank's GPU, not the thread default */
    pthread_mutex_lock(&w->lock);
    for (;;) {
        while (w->finished == w->queued && !w->stop) pthread_cond_wait(&w->changed, &w->lock);
        if (w->finished == w->queued) break; /* stopped, nothing left */
        Job *j = &w->jobs[w->finished % w->capacity];
        pthread_mutex_unlock(&w->lock);
        j->start_ms = wall_ms();
        run_job(w, j);
        j->end_ms = wall_ms();
        pthread_mutex_lock(&w->lock);
        w->finished++;
        pthread_cond_broadcast(&w->changed);
    }
    pthread_mutex_unlock(&w->lock);
    return NULL;
}

/* every rank one color, in its own order: a duplicate of the group */
static int same_group(const void *ctx, int rank, int *key) {
    (void)ctx;
    *key = rank;
    return 0;
}

CommWorker *comm_worker_create(CommGroup *g, int capacity) {
    if (capacity < 1)
        fatal(EXIT_RUNTIME, "comm_worker_create: room for %d collectives (valid: >= 1)", capacity);
    CommWorker *w = xcalloc(1, sizeof *w);
    w->capacity = capacity;
    w->jobs = xcalloc(capacity, sizeof(Job));
    for (int i = 0; i < capacity; i++) w->jobs[i].ready = device_event_create();
    w->group = comm_split_by(g, same_group, NULL); /* the same ranks, in the same order */
    comm_group_count_into(w->group, comm_group_counter(g)); /* its bytes are g's */
    comm_group_nap_while_waiting(w->group, WORKER_NAP_US);
    pthread_mutex_init(&w->lock, NULL);
    pthread_cond_init(&w->changed, NULL);
    if (pthread_create(&w->thread, NULL, work, w) != 0)
        fatal(EXIT_RUNTIME, "cannot start the communication thread of a comm worker");
    return w;
}

void comm_worker_destroy(CommWorker *w) {
    if (!w) return;
    pthread_mutex_lock(&w->lock);
    w->stop = 1; /* the worker finishes what is queued: the other ranks expect it */
    pthread_cond_broadcast(&w->changed);
    pthread_mutex_unlock(&w->lock);
    pthread_join(w->thread, NULL);
    comm_group_free(w->group);
    for (int i = 0; i < w->capacity; i++) device_event_destroy(w->jobs[i].ready);
    pthread_mutex_destroy(&w->lock);
    pthread_cond_destroy(&w->changed);
    free(w->jobs);
    free(w);
}

static long queue_job(CommWorker *w, Job job) {
    pthread_mutex_lock(&w->lock);
    while (w->queued - w->finished == w->capacity) pthread_cond_wait(&w->changed, &w->lock);
    Job *j = &w->jobs[w->queued % w->capacity];
    job.ready = j->ready;
    *j = job;
    /* after the kernels queued so far: the input's writers, the output's last readers */
    device_event_record(j->ready, device_stream(STREAM_COMPUTE));
    long ticket = w->queued++;
    pthread_cond_broadcast(&w->changed);
    pthread_mutex_unlock(&w->lock);
    return ticket;
}

long comm_worker_allgather(CommWorker *w, const void *send, void *recv, size_t count, CommDtype dtype) {
    return queue_job(
        w, (Job){.kind = JOB_ALLGATHER, .send = send, .recv = recv, .count = count, .dtype = dtype});
}

long comm_worker_reduce_scatter(CommWorker *w, const void *send, void *recv, size_t count, CommDtype dtype,
                                ReduceOp op) {
    return queue_job(w, (Job){.kind = JOB_REDUCE_SCATTER,
                              .send = send,
                              .recv = recv,
                              .count = count,
                              .dtype = dtype,
                              .op = op});
}

long comm_worker_allreduce(CommWorker *w, void *buf, size_t count, CommDtype dtype, ReduceOp op) {
    return queue_job(w, (Job){.kind = JOB_ALLREDUCE, .recv = buf, .count = count, .dtype = dtype, .op = op});
}

long comm_worker_allreduce_with(CommWorker *w,
                                void (*allreduce)(CommGroup *g, void *buf, size_t count, CommDtype dtype,
                                                  ReduceOp op),
                                void *buf, size_t count, CommDtype dtype, ReduceOp op) {
    return queue_job(w, (Job){.kind = JOB_ALLREDUCE,
                              .recv = buf,
                              .count = count,
                              .dtype = dtype,
                              .op = op,
                              .allreduce = allreduce});
}

double comm_worker_wait(CommWorker *w, long ticket, double *start_ms, double *end_ms) {
    double start = wall_ms();
    pthread_mutex_lock(&w->lock);
    if (ticket < 0 || ticket >= w->queued)
        fatal(EXIT_RUNTIME, "comm_worker_wait: ticket %ld was never handed out (%ld so far)", ticket,
              w->queued);
    while (w->finished <= ticket) pthread_cond_wait(&w->changed, &w->lock);
    if ((start_ms || end_ms) && w->queued > ticket + w->capacity)
        fatal(EXIT_RUNTIME,
              "comm_worker_wait: the times of ticket %ld are gone, its slot holds a later collective "
              "(%ld queued; create the worker with room for more than %d)",
              ticket, w->queued, w->capacity);
    const Job *j = &w->jobs[ticket % w->capacity]; /* its times stay until `capacity` more are queued */
    if (start_ms) *start_ms = j->start_ms;
    if (end_ms) *end_ms = j->end_ms;
    pthread_mutex_unlock(&w->lock);
    return wall_ms() - start;
}

double comm_worker_wait_all(CommWorker *w) {
    double start = wall_ms();
    pthread_mutex_lock(&w->lock);
    while (w->finished < w->queued) pthread_cond_wait(&w->changed, &w->lock);
    pthread_mutex_unlock(&w->lock);
    return wall_ms() - start;
}
