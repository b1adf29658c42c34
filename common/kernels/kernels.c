/* kernels.c: which table of kernels.h runs, the CPU's or the GPU's.
 *
 * device_init chose the backend (device.h); ops() returns its table. The
 * first call also registers the release of the backend's on-demand
 * workspaces with device_shutdown, which cannot name the kernels itself:
 * the device layer sits below this one. */
#include "common/kernels/kernels.h" /* ops(): the kernel table */

#include "common/device/device.h" /* mem_alloc, copies, streams, timers */

#include <pthread.h>

static const KernelOps *active_table(void) {
    if (device_dry()) return &kernels_dry; /* a dry run computes nothing (device.h) */
#ifdef USE_CUDA
    if (device_backend() == BACKEND_CUDA) return &kernels_cuda;
#endif
    return &kernels_cpu;
}

static void release_active_workspaces(void) {
    active_table()->release_workspaces();
}

static pthread_once_t registered = PTHREAD_ONCE_INIT;
static void register_release(void) {
    device_on_shutdown(release_active_workspaces);
}

const KernelOps *ops(void) {
    pthread_once(&registered, register_release);
    return active_table();
}
