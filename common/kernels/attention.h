/* attention.h: causal self-attention, one file per backend.
 *
 * attention_cpu.c and attention_cuda.cu implement kernels.h's
 * attention_forward and attention_backward, and ring attention's
 * attention_block_forward, attention_merge and attention_block_backward
 * (same names but for the suffix, same signatures, same semantics: see
 * kernels.h), and release the workspace
 * they grow on demand. The backend tables (kernels_cpu.c, kernels_cuda.cu)
 * point at these functions; nothing else calls them directly (common/plan
 * reads attention_workspace_bytes_cpu, the size of the CPU's workspace). */
#ifndef ATTENTION_H
#define ATTENTION_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Query rows per tile: a tile's scores are ATTENTION_TILE x (keys) floats. */
#define ATTENTION_TILE 64

void attention_forward_cpu(float *out, float *lse, const float *qkv, int B, int T, int C, int NH);
void attention_backward_cpu(float *dqkv, const float *dout, const float *qkv, const float *out,
                            const float *lse, int B, int T, int C, int NH);
void attention_release_cpu(void);
/* The dry run (kernels_dry.c): grow the workspace as a forward or backward over
 * `rows` query rows would (T for the whole attention), computing nothing. */
void attention_workspace_grow_cpu(int rows);
void attention_block_forward_cpu(float *out, float *lse, const float *q, const float *kv, int B, int T,
                                 int rows, int C, int NH, int causal);
void attention_block_backward_cpu(float *dq, float *dkv, const float *dout, const float *out,
                                  const float *lse, const float *q, const float *kv, int B, int T, int rows,
                                  int C, int NH, int causal);
void attention_merge_cpu(float *out, float *lse, const float *block_out, const float *block_lse, int B, int T,
                         int rows, int C, int NH);
/* Bytes of the CPU attention's workspace once it has run on sequences of T
 * tokens with `threads` OpenMP threads (memory.csv: device, workspace). */
size_t attention_workspace_bytes_cpu(int T, int threads);

#ifdef USE_CUDA
void attention_forward_cuda(float *out, float *lse, const float *qkv, int B, int T, int C, int NH);
void attention_backward_cuda(float *dqkv, const float *dout, const float *qkv, const float *out,
                             const float *lse, int B, int T, int C, int NH);
void attention_release_cuda(void);
void attention_block_forward_cuda(float *out, float *lse, const float *q, const float *kv, int B, int T,
                                  int rows, int C, int NH, int causal);
void attention_block_backward_cuda(float *dq, float *dkv, const float *dout, const float *out,
                                   const float *lse, const float *q, const float *kv, int B, int T, int rows,
                                   int C, int NH, int causal);
void attention_merge_cuda(float *out, float *lse, const float *block_out, const float *block_lse, int B,
                          int T, int rows, int C, int NH);
#endif

#ifdef __cplusplus
}
#endif

#endif
