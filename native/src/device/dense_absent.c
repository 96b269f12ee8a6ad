/* dense_absent.c — mdl_dk_cuda in a build without CUDA (dense.h). */
#include "device/dense.h"

#if !STRATA_HAVE_CUDA
const mdl_dk *mdl_dk_cuda(const char **why) {
    if (why) *why = "this libstrata was built without CUDA (STRATA_CUDA=OFF)";
    return NULL;
}
#endif
