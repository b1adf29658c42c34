/* cuda_common.cuh: what the CUDA sources of common/ share, and nothing else.
 *
 * Internal to the CUDA backend (device_cuda.cu, kernels_cuda.cu); C sources
 * never include it, they go through cuda_runtime_glue.h and kernels.h.
 *   - cuda_check / cublas_check: end the program with the failing call's file
 *     and line, the way llm.c does, so an error names where it happened.
 *   - cublas_handle: the one cuBLAS handle of the process, created by
 *     cuda_select_device() when the CUDA backend is chosen;
 *   - compute_stream: the stream every kernel launch, cuBLAS call and
 *     memset of the backend goes to (device.h's STREAM_COMPUTE), so they
 *     execute in the order they are issued; other streams (communication,
 *     copies) are ordered against it by events only;
 *   - cuda_tf32_enabled(): whether COURSE_TF32=1 allowed TF32 matmuls.
 *   - cuda_attention_tf32(): whether the fused attention uses one TF32 product.
 * Nothing is launched on the legacy default stream: the three streams are
 * non-blocking, and a launch without a stream (<<<grid, block>>>) would run
 * unordered with respect to them. */
#ifndef CUDA_COMMON_CUH
#define CUDA_COMMON_CUH

#include <cublas_v2.h>
#include <cuda_runtime.h>

/* util.h is a C header without extern "C" guards of its own. */
#include "common/core/util.h" /* fatal, log_info, exit codes, flag parsing */

static inline void cuda_check_at(cudaError_t err, const char *file, int line) {
    if (err != cudaSuccess)
        fatal(EXIT_RUNTIME, "CUDA error at %s:%d: %s", file, line, cudaGetErrorString(err));
}

static inline void cublas_check_at(cublasStatus_t status, const char *file, int line) {
    if (status != CUBLAS_STATUS_SUCCESS)
        fatal(EXIT_RUNTIME, "cuBLAS error at %s:%d: %s", file, line, cublasGetStatusString(status));
}

#define cuda_check(call) cuda_check_at((call), __FILE__, __LINE__)
#define cublas_check(call) cublas_check_at((call), __FILE__, __LINE__)

/* Created by cuda_select_device(); NULL until then. The handle is bound to
 * compute_stream (cublasSetStream). */
extern cublasHandle_t cublas_handle;
extern cudaStream_t compute_stream;

/* COURSE_TF32=1 at cuda_select_device(): matmuls may round their inputs to
 * TF32 (cuBLAS's TF32 math mode, and one TF32 product in attention instead
 * of the fp32-accurate three). */
bool cuda_tf32_enabled(void);
/* Whether the fused attention multiplies with one TF32 product: COURSE_TF32=1,
 * or a 16-bit run (device_set_mixed_precision) unless COURSE_TF32=0. */
bool cuda_attention_tf32(void);

#endif
