/* fmt_float.c — F32 F16 BF16: scalar reference (not yet written). */
#include "quant.h"

void strata_quant_register_float(strata_qtraits *t) { (void)t; }
