/* test_tensor_parallel.c: the column- and row-parallel linear layers of
 * 03_model_parallel/tensor_parallel.c against the whole linear layer of the
 * CPU backend, on random inputs.
 *
 * Run under mpirun with tp ranks (any number dividing the sliced width). Every
 * rank builds the same whole input, weight, bias and output gradient from a
 * hash (no communication), runs the whole layer with kernels_cpu, and checks
 * that its slice of the parallel layer gives its slice of every result:
 *   column: out_local = out[:, rows r], dinp = dinp (whole), dW_local = dW[rows r], db_local = db[rows r]
 *   row:    out = out (whole), dinp_local = dinp[:, cols r], dW_local = dW[:, cols r], db = db
 * The gradients start from 0.5 (not 0): they must be ADDED to.
 * Usage: test_tensor_parallel column|row. Exit 0 when every check passes on every rank. */
#include "03_model_parallel/tensor_parallel.h" /* 03: tensor parallelism */
#include "common/comm/comm.h" /* collectives and messages between ranks */
#include "common/device/device.h" /* mem_alloc, copies, streams, timers */
#include "common/kernels/kernels.h" /* ops(): the kernel table */
#include "common/core/util.h" /* fatal, log_info, exit codes, flag parsing */

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int failures = 0;

static float *random_floats(size_t n, uint64_t stream) {
    float *x = xmalloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) x[i] = (float)hash_normal(20261121, stream, i);
    return x;
}

static float *filled(size_t n, float value) {
    float *x = xmalloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) x[i] = value;
    return x;
}

/* got[i] against want[index(i)] with a relative-and-absolute tolerance. */
static void compare(const char *what, const float *got, const float *want, size_t n, size_t rows,
                    size_t cols_local, size_t cols, size_t col0) {
    for (size_t i = 0; i < n; i++) {
        size_t row = i / cols_local, col = i % cols_local;
        float w = want[row * cols + col0 + col];
        if (row >= rows || fabsf(got[i] - w) > 1e-4f * (1.0f + fabsf(w))) {
            failures++;
            fprintf(stderr, "FAIL [rank %d] %s: element %zu is %g, expected %g\n", comm_rank(comm_world()),
                    what, i, got[i], w);
            return;
        }
    }
}

int main(int argc, char **argv) {
    comm_init(&argc, &argv);
    const char *mode = argc > 1 ? argv[1] : "";
    if (strcmp(mode, "column") && strcmp(mode, "row"))
        fatal(EXIT_USAGE, "usage: test_tensor_parallel column|row");
    device_init("cpu", 0);
    comm_select("mpi");
    CommGroup *w = comm_world();
    TensorGroup tp = {.group = w, .rank = comm_rank(w), .size = comm_size(w)};
    const KernelOps *k = &kernels_cpu;
    int shapes[][3] = {{5, 12, 24}, {7, 36, 60}, {64, 48, 192}}; /* N, C, OC: divisible by 2, 3, 4, 6 */

    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        int N = shapes[s][0], C = shapes[s][1], OC = shapes[s][2];
        /* the whole layer */
        float *inp = random_floats((size_t)N * C, 1), *weight = random_floats((size_t)OC * C, 2);
        float *bias = random_floats(OC, 3), *dout = random_floats((size_t)N * OC, 4);
        float *out = filled((size_t)N * OC, 0), *dinp = filled((size_t)N * C, 0);
        float *dweight = filled((size_t)OC * C, 0.5f), *dbias = filled(OC, 0.5f);
        k->linear_forward(out, inp, weight, bias, N, C, OC);
        k->linear_backward(dinp, dweight, dbias, dout, inp, weight, N, C, OC);

        if (strcmp(mode, "column") == 0) {
            /* this rank: rows [r*OCl, (r+1)*OCl) of the weight, outputs, bias */
            int OCl = OC / tp.size, o0 = tp.rank * OCl;
            float *w_local = xmalloc((size_t)OCl * C * sizeof(float)),
                  *dout_local = xmalloc((size_t)N * OCl * 4);
            memcpy(w_local, weight + (size_t)o0 * C, (size_t)OCl * C * sizeof(float));
            for (int n = 0; n < N; n++)
                memcpy(dout_local + (size_t)n * OCl, dout + (size_t)n * OC + o0, OCl * 4);
            float *out_local = filled((size_t)N * OCl, 0), *dinp_got = filled((size_t)N * C, 7.0f);
            float *dw_local = filled((size_t)OCl * C, 0.5f), *db_local = filled(OCl, 0.5f);
            column_parallel_forward(&tp, out_local, inp, w_local, bias + o0, N, C, OCl);
            column_parallel_backward(&tp, dinp_got, dw_local, db_local, dout_local, inp, w_local, N, C, OCl);
            compare("column-parallel forward: this rank's output columns", out_local, out, (size_t)N * OCl, N,
                    OCl, OC, o0);
            compare("column-parallel backward: the whole input gradient", dinp_got, dinp, (size_t)N * C, N, C,
                    C, 0);
            compare("column-parallel backward: this rank's weight gradient rows", dw_local,
                    dweight + (size_t)o0 * C, (size_t)OCl * C, OCl, C, C, 0);
            compare("column-parallel backward: this rank's bias gradient", db_local, dbias + o0, OCl, 1, OCl,
                    OCl, 0);
            free(w_local), free(dout_local), free(out_local), free(dinp_got), free(dw_local), free(db_local);
        } else {
            /* this rank: columns [r*Cl, (r+1)*Cl) of the weight and the input */
            int Cl = C / tp.size, c0 = tp.rank * Cl;
            float *w_local = xmalloc((size_t)OC * Cl * sizeof(float)),
                  *inp_local = xmalloc((size_t)N * Cl * 4);
            for (int o = 0; o < OC; o++)
                memcpy(w_local + (size_t)o * Cl, weight + (size_t)o * C + c0, Cl * 4);
            for (int n = 0; n < N; n++) memcpy(inp_local + (size_t)n * Cl, inp + (size_t)n * C + c0, Cl * 4);
            float *out_got = filled((size_t)N * OC, 7.0f), *dinp_local = filled((size_t)N * Cl, 0);
            float *dw_local = filled((size_t)OC * Cl, 0.5f), *db = filled(OC, 0.5f);
            row_parallel_forward(&tp, out_got, inp_local, w_local, bias, N, Cl, OC);
            row_parallel_backward(&tp, dinp_local, dw_local, db, dout, inp_local, w_local, N, Cl, OC);
            compare("row-parallel forward: the whole output", out_got, out, (size_t)N * OC, N, OC, OC, 0);
            compare("row-parallel backward: this rank's input gradient columns", dinp_local, dinp,
                    (size_t)N * Cl, N, Cl, C, c0);
            compare("row-parallel backward: this rank's weight gradient columns", dw_local, dweight,
                    (size_t)OC * Cl, OC, Cl, C, c0);
            compare("row-parallel backward: the whole bias gradient", db, dbias, OC, 1, OC, OC, 0);
            free(w_local), free(inp_local), free(out_got), free(dinp_local), free(dw_local), free(db);
        }
        free(inp), free(weight), free(bias), free(dout), free(out), free(dinp), free(dweight), free(dbias);
    }
    double total = comm_allreduce_double(w, failures, 0);
    if (comm_rank(w) == 0)
        printf("%s %s-parallel linear on %d ranks, %d failures\n", total == 0 ? "PASS:" : "FAIL:", mode,
               tp.size, (int)total);
    comm_finalize();
    return total == 0 ? 0 : 1;
}
