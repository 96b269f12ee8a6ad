/* fmt_legacy.c — Q4 0 Q4 1 Q5 0 Q5 1 Q8 0: scalar reference (not yet written). */
#include "quant.h"

void strata_quant_register_legacy(strata_qtraits *t) { (void)t; }
