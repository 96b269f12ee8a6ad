/* fmt_iq.c — IQ2 XXS IQ2 XS IQ3 XXS: scalar reference (not yet written). */
#include "quant.h"

void strata_quant_register_iq(strata_qtraits *t) { (void)t; }
