/* avx512_act.h — AVX-512 activation quantization (avx512_act.c): quant/act.c's blocks, bit for bit. */
#ifndef STRATA_KERNELS_CPU_AVX512_ACT_H
#define STRATA_KERNELS_CPU_AVX512_ACT_H

#include "../../quant/quant.h"

#if STRATA_HAVE_AVX512
void strata_avx512_act_q8_32(const float *x, act_q8_32 *y, int64_t n);
void strata_avx512_act_q8_256(const float *x, act_q8_256 *y, int64_t n);
#endif

#endif
