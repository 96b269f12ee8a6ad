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
    /* An AVX2 slot left empty by a family falls back to the scalar reference. */
    for (int i = 0; i < STRATA_QTYPE_MAX; i++) {
        strata_qtraits *t = &g_traits[i];
        if (!t->name) continue;
        if (!t->dequant[STRATA_ISA_IDX_AVX2]) t->dequant[STRATA_ISA_IDX_AVX2] = t->dequant[0];
        if (!t->vec_dot[STRATA_ISA_IDX_AVX2]) t->vec_dot[STRATA_ISA_IDX_AVX2] = t->vec_dot[0];
    }
}

const strata_qtraits *strata_qtraits_get(int32_t type) {
    pthread_once(&g_once, registry_init);
    if (type < 0 || type >= STRATA_QTYPE_MAX || !g_traits[type].name) return NULL;
    return &g_traits[type];
}
