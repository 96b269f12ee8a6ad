/* registry.c — the table of block formats, filled once by each format family. */
#include "quant.h"

#include <pthread.h>

static strata_qtraits g_traits[STRATA_QTYPE_MAX];
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

static void registry_init(void) {
    strata_quant_register_float(g_traits);
    strata_quant_register_legacy(g_traits);
    strata_quant_register_fp4(g_traits);
    strata_quant_register_kquants(g_traits);
    strata_quant_register_iq(g_traits);
    strata_quant_register_quantizers(g_traits);
    /* A slot left empty by a family takes its fallback path's function (filled first: a fallback
     * has a lower index). A path with a vec_dot of its own keeps its own rows kernel or none: the
     * fallback's rows kernel would be slower than its vec_dot or want other activations. */
    for (int i = 0; i < STRATA_QTYPE_MAX; i++) {
        strata_qtraits *t = &g_traits[i];
        if (!t->name) continue;
        for (int isa = 1; isa < STRATA_N_ISA; isa++) {
            const int fb = strata_isa_fallback(isa);
            if (!t->dequant[isa]) t->dequant[isa] = t->dequant[fb];
            if (!t->conv[isa]) { t->conv[isa] = t->conv[fb]; t->conv_dot[isa] = t->conv_dot[fb]; }
            if (!t->vec_dot[isa]) {
                t->vec_dot[isa] = t->vec_dot[fb];
                if (!t->rows[isa]) { t->rows[isa] = t->rows[fb]; t->rows_when[isa] = t->rows_when[fb]; }
            }
        }
    }
}

const strata_qtraits *strata_qtraits_get(int32_t type) {
    pthread_once(&g_once, registry_init);
    if (type < 0 || type >= STRATA_QTYPE_MAX || !g_traits[type].name) return NULL;
    return &g_traits[type];
}
