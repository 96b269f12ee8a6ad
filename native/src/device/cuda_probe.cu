// cuda_probe.cu — does this process have a usable CUDA device? Never fails: a missing
// driver, an old driver or no GPU all mean "no device", with the reason kept for the log.
#include "strata.h"

#include <cuda_runtime.h>
#include <stdio.h>

static char g_reason[256];

extern "C" int32_t strata_cuda_device_count(const char **reason) {
    int n = 0;
    cudaError_t err = cudaGetDeviceCount(&n);
    if (err != cudaSuccess) {
        snprintf(g_reason, sizeof g_reason, "CUDA unavailable: %s", cudaGetErrorString(err));
        (void)cudaGetLastError();  // clear the sticky error
        n = 0;
    } else if (n == 0) {
        snprintf(g_reason, sizeof g_reason, "CUDA runtime found no GPU");
    }
    if (reason) *reason = n > 0 ? "" : g_reason;
    return n;
}
