/* plan_by_hand.c: see plan_by_hand.h. */
#include "common/tools/plan_by_hand.h" /* exercise 06.3's plan by hand */

#include "common/model/model_config.h" /* ModelConfig */

void plan_by_hand(const ByHandLayout *layout, const Machine *m, ByHand *h) {
    /* the layout, given (the course's: 256, 64, 64, 2 blocks; 2 ranks; 8 sequences) */
    /* V: the vocabulary's rows as the model holds them, padded for the kernels (model_config.h) */
    const double V = vocab_padded(layout->vocab), T = layout->seq, C = layout->dmodel, L = layout->layers;
    const double N = layout->ranks, B = layout->batch; /* ranks; sequences per step, all ranks together */
    /* EXERCISE 06.3 BEGIN: a layout planned by hand (course.md, exercise 06.3) */
    double per_block = 4 * C + 3 * C * C + 3 * C + C * C + C + 4 * C * C + 4 * C + 4 * C * C + C;
    double P = V * C + T * C + L * per_block + 2 * C + V * C; /* wte, wpe, the blocks, ln_f, the head */
    double mine = P / N;                  /* this rank's shard: every unit divides by N, no padding */
    h->params_bytes = P * 2;              /* stage 1 keeps the 16-bit parameters whole */
    h->grads_bytes = P * 2;               /* and the 16-bit gradients */
    h->optimizer_bytes = mine * (4 + 8);  /* fp32 master weights, Adam's m and v: its shard only */
    double gathered = (N - 1) * mine * 2; /* one collective of the whole shard, 16-bit */
    h->sent_bytes = gathered + gathered;  /* reduce-scatter the gradients, all-gather the parameters */
    double units = L + 2, calls = 2 * units;
    double compute_s = (6 * P + 12 * L * T * C) * B * T / N / m->flops;
    double update_s = mine / m->device_adam_params_per_s;
    double comm_s = calls * (N - 1) * m->alpha_s + h->sent_bytes / m->beta_bytes_per_s;
    h->step_ms = (compute_s + update_s + comm_s) * 1000;
    /* EXERCISE 06.3 END */
}
