/* schedule_sim.c: see schedule_sim.h. Checking a list, then the simulation. */
#include "common/model/schedule_sim.h" /* a pipeline schedule replayed in time */

#include "common/model/layer_split.h" /* which blocks each stage runs */
#include "common/core/util.h" /* fatal, log_info, exit codes, flag parsing */

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const op_names[] = {"fwd",       "bwd",        "recv_act",           "send_act",
                                       "recv_grad", "send_grad",  "send_act_recv_grad", "send_grad_recv_act",
                                       "bwd_input", "bwd_weight", "post_act",           "post_grad"};

const char *schedule_op_name(OpKind kind) {
    return op_names[kind];
}

int schedule_op_parse(const char *name) {
    for (int k = 0; k < (int)(sizeof op_names / sizeof op_names[0]); k++)
        if (strcmp(name, op_names[k]) == 0) return k;
    return -1;
}

int schedule_op_backward(OpKind kind) {
    return kind == OP_BACKWARD || kind == OP_BACKWARD_INPUT || kind == OP_BACKWARD_WEIGHT;
}

/* The kind and micro-batches of an action: F3, sa3|rg1, ... */
static void format_kind_micro(const Action *a, char *buf, size_t len) {
    switch (a->kind) {
    case OP_FORWARD:
        snprintf(buf, len, "F%d", a->micro);
        break;
    case OP_BACKWARD:
        snprintf(buf, len, "B%d", a->micro);
        break;
    case OP_RECV_ACT:
        snprintf(buf, len, "ra%d", a->micro);
        break;
    case OP_SEND_ACT:
        snprintf(buf, len, "sa%d", a->micro);
        break;
    case OP_RECV_GRAD:
        snprintf(buf, len, "rg%d", a->micro);
        break;
    case OP_SEND_GRAD:
        snprintf(buf, len, "sg%d", a->micro);
        break;
    case OP_SEND_ACT_RECV_GRAD:
        snprintf(buf, len, "sa%d|rg%d", a->micro, a->micro2);
        break;
    case OP_SEND_GRAD_RECV_ACT:
        snprintf(buf, len, "sg%d|ra%d", a->micro, a->micro2);
        break;
    case OP_BACKWARD_INPUT:
        snprintf(buf, len, "B%d", a->micro);
        break;
    case OP_BACKWARD_WEIGHT:
        snprintf(buf, len, "W%d", a->micro);
        break;
    case OP_POST_ACT:
        snprintf(buf, len, "pa%d", a->micro);
        break;
    case OP_POST_GRAD:
        snprintf(buf, len, "pg%d", a->micro);
        break;
    }
}

/* The action as printed: its kind and micro-batches, then c<chunk> unless chunk 0. */
void schedule_format_action(const Action *a, char *buf, size_t len) {
    format_kind_micro(a, buf, len);
    if (a->chunk != 0) {
        size_t used = strlen(buf);
        snprintf(buf + used, len - used, "c%d", a->chunk);
    }
}

/* ---- checking a list: once each, in dependency order ---- */

/* What one stage has done to one (chunk, micro-batch) so far. */
typedef struct {
    char has_act, has_grad;       /* its activations, the gradient of its output, received */
    char forward, backward, b, w; /* how often: F, whole backward, B, W */
} MicroState;

static int check_fail(char *where, size_t len, int stage, const Action *a, const char *what) {
    char buf[32];
    schedule_format_action(a, buf, sizeof buf);
    snprintf(where, len, "stage %d, %s: %s", stage, buf, what);
    return 1;
}

/* 0 if stage `stage`'s list keeps the rules of schedule_simulate_lists; else
 * 1 with the first broken rule in `where`. */
static int check_list(const StageSchedule *s, int stage, int P, int V, int M, char *where, size_t len) {
    MicroState *st = xcalloc((size_t)V * M, sizeof(MicroState));
    int bad = 0;
    for (int i = 0; i < s->count && !bad; i++) {
        const Action *a = &s->actions[i];
        int two = a->kind == OP_SEND_ACT_RECV_GRAD || a->kind == OP_SEND_GRAD_RECV_ACT;
        if (a->chunk < 0 || a->chunk >= V || a->micro < 0 || a->micro >= M ||
            (two && (a->micro2 < 0 || a->micro2 >= M))) {
            bad = check_fail(where, len, stage, a, "chunk or micro-batch out of range");
            break;
        }
        StageChunk at = {stage, a->chunk};
        int first = layer_split_prev(at, P, V).stage < 0, last = layer_split_next(at, P, V).stage < 0;
        MicroState *m = &st[a->chunk * M + a->micro];
        MicroState *m2 = two ? &st[a->chunk * M + a->micro2] : NULL;
        int done_backward = m->backward || m->b; /* the input's gradient exists */
        switch (a->kind) {
        case OP_FORWARD:
            if (m->forward)
                bad = check_fail(where, len, stage, a, "a second forward");
            else if (!first && !m->has_act)
                bad = check_fail(where, len, stage, a, "forward before its activations arrive");
            m->forward++;
            break;
        case OP_BACKWARD:
        case OP_BACKWARD_INPUT:
            if (done_backward)
                bad = check_fail(where, len, stage, a, "a second backward");
            else if (!m->forward)
                bad = check_fail(where, len, stage, a, "backward before its forward");
            else if (!last && !m->has_grad)
                bad = check_fail(where, len, stage, a, "backward before its gradient arrives");
            if (a->kind == OP_BACKWARD)
                m->backward++;
            else
                m->b++;
            break;
        case OP_BACKWARD_WEIGHT:
            if (m->w || m->backward)
                bad = check_fail(where, len, stage, a, "a second weight gradient");
            else if (!m->b)
                bad = check_fail(where, len, stage, a, "W before its B");
            m->w++;
            break;
        case OP_RECV_ACT:
            m->has_act = 1;
            break;
        case OP_RECV_GRAD:
            m->has_grad = 1;
            break;
        case OP_SEND_ACT:
        case OP_POST_ACT:
            if (!m->forward) bad = check_fail(where, len, stage, a, "sends activations before its forward");
            break;
        case OP_SEND_GRAD:
        case OP_POST_GRAD:
            if (!done_backward)
                bad = check_fail(where, len, stage, a, "sends a gradient before its backward");
            break;
        case OP_SEND_ACT_RECV_GRAD:
            if (!m->forward) bad = check_fail(where, len, stage, a, "sends activations before its forward");
            m2->has_grad = 1;
            break;
        case OP_SEND_GRAD_RECV_ACT:
            if (!done_backward)
                bad = check_fail(where, len, stage, a, "sends a gradient before its backward");
            m2->has_act = 1;
            break;
        }
    }
    for (int c = 0; c < V && !bad; c++)
        for (int k = 0; k < M && !bad; k++) {
            const MicroState *m = &st[c * M + k];
            int whole = m->backward == 1 && !m->b && !m->w, split = m->b == 1 && m->w == 1 && !m->backward;
            if (m->forward != 1 || !(whole || split)) {
                snprintf(where, len,
                         "stage %d, chunk %d, micro-batch %d: forward %d, backward %d, B %d, W %d times "
                         "(need F once, then B once, whole or as B and W)",
                         stage, c, k, m->forward, m->backward, m->b, m->w);
                bad = 1;
            }
        }
    free(st);
    return bad;
}

/* ---- simulation with blocking messages ---- */

static int is_compute(OpKind k) {
    return k == OP_FORWARD || k == OP_BACKWARD || k == OP_BACKWARD_INPUT || k == OP_BACKWARD_WEIGHT;
}
static double compute_time(OpKind k, double tf, double tb, double tw) {
    return k == OP_FORWARD ? tf : k == OP_BACKWARD ? tb + tw : k == OP_BACKWARD_INPUT ? tb : tw;
}
/* Is the partner of this message the next piece of the model (activations
 * out, gradients in), rather than the previous one? */
static int towards_next(OpKind k) {
    return k == OP_SEND_ACT || k == OP_RECV_GRAD || k == OP_SEND_ACT_RECV_GRAD || k == OP_POST_ACT;
}

/* Do a (on a piece) and b (on the piece after it) complete each other? */
static int matches(const Action *a, const Action *b) {
    switch (a->kind) {
    case OP_SEND_ACT:
        return b->kind == OP_RECV_ACT && b->micro == a->micro;
    case OP_RECV_GRAD:
        return b->kind == OP_SEND_GRAD && b->micro == a->micro;
    case OP_SEND_ACT_RECV_GRAD:
        return b->kind == OP_SEND_GRAD_RECV_ACT && b->micro == a->micro2 && b->micro2 == a->micro;
    default:
        return 0;
    }
}

/* Posted messages: posted[(kind x pieces + receiving piece) x M + micro] is
 * the time a message left for that piece (kind 0 activations, 1 gradients),
 * or -1 while none waits there. */
static double *posted_slot(double *posted, int gradient, int piece, int pieces, int M, int micro) {
    return &posted[((size_t)gradient * pieces + piece) * M + micro];
}

/* schedule_simulate_lists with each computing action's time from action_s, or (NULL) from tf, tb, tw. */
static void simulate(const StageSchedule *s, int P, int V, int M, double tf, double tb, double tw,
                     const double *const *action_s, ScheduleReport *r) {
    memset(r, 0, sizeof *r);
    for (int p = 0; p < P; p++)
        if (check_list(&s[p], p, P, V, M, r->where, sizeof r->where)) {
            r->invalid = 1;
            return;
        }
    int pieces = P * V;
    int *pc = xcalloc(P, sizeof(int)), *in_flight = xcalloc(P, sizeof(int));
    double *clock = xcalloc(P, sizeof(double));
    double *posted = xcalloc((size_t)2 * pieces * M, sizeof(double));
    for (size_t i = 0; i < (size_t)2 * pieces * M; i++) posted[i] = -1.0;
    double busy = 0.0;
    for (;;) {
        int progress = 0, done = 1;
        for (int p = 0; p < P; p++) {
            if (pc[p] == s[p].count) continue;
            done = 0;
            const Action *a = &s[p].actions[pc[p]];
            if (is_compute(a->kind)) {
                double t = action_s ? action_s[p][pc[p]] : compute_time(a->kind, tf, tb, tw);
                clock[p] += t;
                busy += t;
                in_flight[p] += a->kind == OP_FORWARD ? 1 : a->kind == OP_BACKWARD_INPUT ? 0 : -1;
                if (p < 64 && in_flight[p] > r->max_in_flight[p]) r->max_in_flight[p] = in_flight[p];
                pc[p]++;
                progress = 1;
                continue;
            }
            /* the partner: the piece after (or before) this stage's chunk, on rank q of the ring */
            int next = towards_next(a->kind);
            StageChunk at = {p, a->chunk};
            StageChunk peer = next ? layer_split_next(at, P, V) : layer_split_prev(at, P, V);
            int q = peer.stage;
            if (q < 0) continue;                                     /* no partner: stuck */
            if (a->kind == OP_POST_ACT || a->kind == OP_POST_GRAD) { /* leaves now, waits for nobody */
                *posted_slot(posted, a->kind == OP_POST_GRAD, layer_split_piece(peer, P), pieces, M,
                             a->micro) = clock[p];
                pc[p]++;
                progress = 1;
                continue;
            }
            if (a->kind == OP_RECV_ACT || a->kind == OP_RECV_GRAD) { /* posted already? */
                double *left = posted_slot(posted, a->kind == OP_RECV_GRAD, layer_split_piece(at, P), pieces,
                                           M, a->micro);
                if (*left >= 0.0) {
                    if (*left > clock[p]) clock[p] = *left;
                    *left = -1.0;
                    pc[p]++;
                    progress = 1;
                    continue;
                }
            }
            if (pc[q] == s[q].count) continue; /* no partner: stuck */
            const Action *b = &s[q].actions[pc[q]];
            int ok = b->chunk == peer.chunk && (next ? matches(a, b) : matches(b, a));
            if (!ok) continue;
            double t = clock[p] > clock[q] ? clock[p] : clock[q]; /* both wait for the later one */
            clock[p] = clock[q] = t;
            pc[p]++;
            pc[q]++;
            progress = 1;
        }
        if (done) break;
        if (!progress) {
            r->deadlock = 1;
            size_t used = 0;
            for (int p = 0; p < P && used < sizeof r->where - 24; p++) {
                if (pc[p] == s[p].count) continue;
                char buf[32];
                schedule_format_action(&s[p].actions[pc[p]], buf, sizeof buf);
                used += snprintf(r->where + used, sizeof r->where - used, "%sstage %d in %s",
                                 used ? ", " : "", p, buf);
            }
            break;
        }
    }
    for (size_t i = 0; i < (size_t)2 * pieces * M && !r->deadlock; i++)
        if (posted[i] >= 0.0) {
            int micro = (int)(i % M), piece = (int)(i / M % pieces);
            snprintf(r->where, sizeof r->where, "posted %s of micro-batch %d for piece %d never received",
                     i / M / pieces ? "gradient" : "activations", micro, piece);
            r->invalid = 1;
            break;
        }
    for (int p = 0; p < P; p++)
        if (clock[p] > r->makespan) r->makespan = clock[p];
    r->bubble = r->makespan > 0 ? 1.0 - busy / (P * r->makespan) : 0.0;
    free(pc);
    free(in_flight);
    free(clock);
    free(posted);
}

void schedule_simulate_lists(const StageSchedule *s, int P, int V, int M, double tf, double tb, double tw,
                             ScheduleReport *r) {
    simulate(s, P, V, M, tf, tb, tw, NULL, r);
}

void schedule_replay_lists(const StageSchedule *s, int P, int V, int M, const double *const *action_s,
                           ScheduleReport *r) {
    simulate(s, P, V, M, 0.0, 0.0, 0.0, action_s, r);
}
