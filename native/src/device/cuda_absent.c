/* cuda_absent.c — the device probe of a build without CUDA. */
#include "strata.h"

#if !STRATA_HAVE_CUDA
int32_t strata_cuda_device_count(const char **reason) {
    if (reason) *reason = "this libstrata was built without CUDA (STRATA_CUDA=OFF)";
    return 0;
}
#endif
