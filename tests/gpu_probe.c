/* gpu_probe.c: exits 0 when this build has CUDA and a GPU is visible, 1 otherwise.
 * The parity tests use it to decide between running and skipping. */
#include "common/device/device.h" /* mem_alloc, copies, streams, timers */

#include <stdio.h>

int main(void) {
    if (device_cuda_available()) {
        device_init("cuda", 0);
        printf("%s\n", device_name());
        return 0;
    }
    printf("no usable GPU (this build %s CUDA)\n",
#ifdef USE_CUDA
           "has"
#else
           "lacks"
#endif
    );
    return 1;
}
