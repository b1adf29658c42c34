/* test_checkpoint.c: the checkpoint's sharded writer (common/run/checkpoint.h) in
 * one process, with the layout chapter 06 will use: two pipeline stages, each
 * stage's units sharded over three data-parallel ranks (ZeRO-2 of the
 * offloaded state), in host memory. Six "ranks" write one file through the
 * writer's steps in the order checkpoint_sharded.c runs them; the file must
 * read back into a whole-model layout in device memory as the values that
 * were written, and have the checksum a single writer of the whole model
 * gives. With `gap`, one rank's segments are left out, and the commit must
 * refuse the file. With `stale`, the second stage's ranks see another
 * directory (one the ranks do not share) holding a stale ck.tmp of the right
 * size from an earlier save: they must refuse to write into it, since it is
 * not the file rank 0 created for this save.
 *
 *   build/tests/test_checkpoint DIR        round trip (prints PASS)
 *   build/tests/test_checkpoint DIR gap    exits 1 naming the missing elements
 *   build/tests/test_checkpoint DIR stale  exits 1 naming the stale DIR/elsewhere/ck.tmp */
#include "common/run/checkpoint.h" /* save and resume */
#include "common/device/device.h" /* mem_alloc, copies, streams, timers */
#include "common/model/param_table.h" /* the parameter table and its units */
#include "common/core/util.h" /* fatal, log_info, exit codes, flag parsing */

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

enum { STAGES = 2, DP = 3 };

/* Element g of array a: exact in fp32, different in each array. */
static float value_of(int a, size_t g) {
    return (float)((g * 7 + (size_t)a * 13) % 1000) / 8.0f - 60.0f;
}

static void fail(const char *what) {
    printf("FAIL: %s\n", what);
    exit(1);
}

static void make_config(Config *cfg, const char *dir) {
    memset(cfg, 0, sizeof *cfg);
    cfg->model = (ModelConfig){.layers = 2, .dmodel = 64, .heads = 4, .seq = 64, .vocab = 256};
    cfg->seed = 1337;
    cfg->batch = 8;
    cfg->micro = 1;
    cfg->steps = 6;
    cfg->warmup = 2;
    cfg->lr = 1e-3f;
    cfg->wd = 0.1f;
    cfg->clip = 1.0f;
    cfg->beta1 = 0.9f;
    cfg->beta2 = 0.95f;
    cfg->eps = 1e-8f;
    snprintf(cfg->save, sizeof cfg->save, "%s/ck", dir);
}

/* DIR/elsewhere/ck.tmp as a crashed save left it: the right size, but
 * another save's; cfg saves there. */
static void make_stale_directory(Config *cfg, const char *dir) {
    char elsewhere[4000 + 16];
    snprintf(elsewhere, sizeof elsewhere, "%.4000s/elsewhere", dir); /* room for "/ck" */
    if (mkdir(elsewhere, 0755) != 0 && errno != EEXIST) fail("cannot create DIR/elsewhere");
    make_config(cfg, elsewhere);
    CkptLayout none;
    ckpt_layout_init(&none, "an earlier save");
    CkptState state = {0};
    CkptWriter w;
    ckpt_writer_init(&w, cfg, &none, &state);
    ckpt_writer_create(&w);
    temp_file_forget(w.tmp); /* left behind, as by a crash */
    ckpt_writer_free(&w);
    ckpt_layout_free(&none);
}

/* Write cfg->save from `ranks` layouts, as checkpoint_save_sharded does;
 * ranks from `apart` on (when below `ranks`) write into `elsewhere`'s save path. */
static uint64_t write_sharded(const Config *cfg, CkptLayout *layouts, int ranks, const CkptState *state,
                              const Config *elsewhere, int apart) {
    CkptWriter *w = xcalloc(ranks, sizeof *w);
    for (int r = 0; r < ranks; r++) ckpt_writer_init(&w[r], r < apart ? cfg : elsewhere, &layouts[r], state);
    ckpt_writer_create(&w[0]);
    for (int r = 1; r < ranks; r++) w[r].nonce = w[0].nonce; /* rank 0 tells every rank */
    for (int r = 0; r < ranks; r++) ckpt_writer_write(&w[r]);
    double written[CKPT_ARRAYS] = {0};
    uint64_t chunks = 0;
    for (int r = 0; r < ranks; r++) {
        for (int a = 0; a < CKPT_ARRAYS; a++) written[a] += (double)w[r].written[a];
        chunks ^= ckpt_writer_hash_chunks(&w[r], r, ranks);
    }
    uint64_t checksum = ckpt_writer_commit(&w[0], chunks, written);
    for (int r = 0; r < ranks; r++) ckpt_writer_free(&w[r]);
    free(w);
    return checksum;
}

int main(int argc, char **argv) {
    if (argc < 2) fail("usage: test_checkpoint DIR [gap|stale]");
    int gap = argc == 3 && strcmp(argv[2], "gap") == 0;
    int stale = argc == 3 && strcmp(argv[2], "stale") == 0;
    device_init("cpu", 0);
    Config cfg, elsewhere;
    make_config(&cfg, argv[1]);
    if (stale) make_stale_directory(&elsewhere, argv[1]);
    ParamTable t;
    param_table_build(&t, &cfg.model);
    int L = cfg.model.layers;
    int first_unit[STAGES] = {LAYER_EMBEDDING, 1}, last_unit[STAGES] = {0, L};

    /* every rank's host shards of its stage's units, filled with value_of */
    CkptLayout layouts[STAGES * DP];
    float *buffers[STAGES * DP][CKPT_ARRAYS];
    int ranks = 0;
    for (int s = 0; s < STAGES; s++)
        for (int d = 0; d < DP; d++) {
            if (gap && s == 1 && d == 2) continue; /* this rank's part goes missing */
            size_t n = 0, base = shard_unit_offset(&t, first_unit[s], DP);
            for (int u = first_unit[s]; u <= last_unit[s]; u++) n += shard_slice_numel(&t, u, DP);
            for (int a = 0; a < CKPT_ARRAYS; a++) {
                float *b = buffers[ranks][a] = xcalloc(n, sizeof(float));
                for (int u = first_unit[s]; u <= last_unit[s]; u++) {
                    size_t first, count, local = shard_unit_offset(&t, u, DP) - base;
                    shard_slice_elements(&t, u, d, DP, &first, &count);
                    for (size_t i = 0; i < count; i++) b[local + i] = value_of(a, first + i);
                }
            }
            ckpt_layout_init(&layouts[ranks], "test_checkpoint: pp 2 x dp 3, host shards");
            ckpt_layout_shards(&layouts[ranks], &t, first_unit[s], last_unit[s], buffers[ranks][0],
                               buffers[ranks][1], buffers[ranks][2], d, DP, 1);
            ranks++;
        }
    CkptState state = {.step = 3, .adam_t = 3, .rng = 99, .loss_scale = 1.0f};
    /* with a gap or a stale file: exits 1 here */
    uint64_t sharded = write_sharded(&cfg, layouts, ranks, &state, &elsewhere, stale ? DP : ranks);
    printf("%d ranks wrote %zu parameters x 3 arrays, checksum %016llx\n", ranks, t.num_params,
           (unsigned long long)sharded);

    /* read back into one whole-model layout in device memory */
    snprintf(cfg.resume, sizeof cfg.resume, "%s", cfg.save);
    int step;
    checkpoint_check(cfg.resume, &cfg, &step, &cfg.resume_checksum);
    CkptLayout whole;
    ckpt_layout_init(&whole, "test_checkpoint: whole");
    float *device[CKPT_ARRAYS];
    for (int a = 0; a < CKPT_ARRAYS; a++) {
        device[a] = mem_alloc(SPACE_DEVICE, CAT_WORKSPACE, t.num_params * sizeof(float), "whole array");
        ckpt_set_buffer(&whole, a, device[a], t.num_params, 0);
        ckpt_hold(&whole, a, 0, t.num_params, 0, 1);
    }
    AdamW opt = {0};
    uint64_t rng = 0;
    if (checkpoint_resume(&cfg, &whole, &opt.t, &rng, NULL) != 3 || opt.t != 3 || rng != 99)
        fail("the step, Adam's count or the RNG state did not come back");
    float *host = xmalloc(t.num_params * sizeof(float));
    for (int a = 0; a < CKPT_ARRAYS; a++) {
        copy_to_host(host, device[a], t.num_params * sizeof(float));
        for (size_t g = 0; g < t.num_params; g++)
            if (host[g] != value_of(a, g)) {
                printf("FAIL: %s element %zu is %g, written %g\n", ckpt_array_names[a], g, host[g],
                       value_of(a, g));
                return 1;
            }
    }
    printf("the whole model read back every element of the six shards\n");

    /* one writer of the whole model gives the same checksum */
    snprintf(cfg.save, sizeof cfg.save, "%s/ck.whole", argv[1]);
    uint64_t single = write_sharded(&cfg, &whole, 1, &state, NULL, 1);
    if (single != sharded) fail("the whole-model writer's checksum differs from the sharded writers'");
    printf("one writer of the whole model gives the same checksum\nPASS\n");

    for (int r = 0; r < ranks; r++) {
        ckpt_layout_free(&layouts[r]);
        for (int a = 0; a < CKPT_ARRAYS; a++) free(buffers[r][a]);
    }
    for (int a = 0; a < CKPT_ARRAYS; a++) mem_free(device[a]);
    ckpt_layout_free(&whole);
    free(host);
    param_table_free(&t);
    device_shutdown();
    return 0;
}
