/* quantize.c — float -> blocks (not yet written). */
#include "quant.h"

void strata_quant_register_quantizers(strata_qtraits *t) { (void)t; }
