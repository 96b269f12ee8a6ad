/* fmt_kquants.c — Q2 K to Q6 K and IQ4 XS: scalar reference (not yet written). */
#include "quant.h"

void strata_quant_register_kquants(strata_qtraits *t) { (void)t; }
