/* dry_work.c: see dry_work.h. */
#include "common/run/dry_work.h" /* dry-work.csv */

#include "common/run/run_dir.h" /* the --out directory and its files */
#include "common/kernels/work_ledger.h" /* a dry run's counted work */

void dry_work_csv_write(const char *dir) {
    int count;
    const WorkPiece *w = work_pieces(&count);
    OutFile *f = out_open(dir, "dry-work.csv", OUT_WHOLE, 0);
    out_printf(f, "order,action,micro,micro2,chunk,flops,matmul_flops,bytes,adam_params\n");
    for (int i = 0; i < count; i++)
        out_printf(f, "%d,%s,%d,%d,%d,%.0f,%.0f,%.0f,%.0f\n", i, w[i].action, w[i].micro, w[i].micro2, w[i].chunk,
                   w[i].flops, w[i].matmul_flops, w[i].bytes, w[i].adam_params);
    out_close(f);
}
