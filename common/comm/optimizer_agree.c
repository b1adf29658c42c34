/* optimizer_agree.c: see optimizer_agree.h. */
#include "common/comm/optimizer_agree.h" /* grad_norm_agree across ranks */

#include "common/comm/comm.h" /* collectives and messages between ranks */

#include <math.h>

double grad_norm_agree(const GradShards *g, double sharded, double replicated) {
    double squares = g->sum_group ? comm_allreduce_double(g->sum_group, sharded, 0) : sharded;
    if (g->spans) squares += replicated; /* replicated elements: once, after the sum over ranks */
    /* A sum carries an Inf or NaN to every rank of its group; the agree group
     * reaches the ranks outside it (other replicas, or no sum at all). */
    if (g->agree_group && !comm_all(g->agree_group, isfinite(squares))) squares = INFINITY;
    return squares;
}
