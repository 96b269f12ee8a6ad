/* avx2.h — entry points of the AVX2+FMA+F16C kernels (files kernels/cpu/avx2_*.c, the only
 * files compiled with -mavx2 -mfma -mf16c). Callers reach them only after
 * strata_cpu_has_isa(STRATA_ISA_IDX_AVX2) said yes. STRATA_HAVE_AVX2 is set by CMake on x86-64. */
#ifndef STRATA_KERNELS_CPU_AVX2_H
#define STRATA_KERNELS_CPU_AVX2_H

#include "../../quant/quant.h"

#if STRATA_HAVE_AVX2
void strata_avx2_act_q8_32(const float *x, act_q8_32 *y, int64_t n);
void strata_avx2_act_q8_256(const float *x, act_q8_256 *y, int64_t n);
#endif

#endif
