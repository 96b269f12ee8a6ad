/* fmt_fp4.c — IQ4 NL MXFP4 NVFP4: scalar reference (not yet written). */
#include "quant.h"

void strata_quant_register_fp4(strata_qtraits *t) { (void)t; }
