/* policy.c — LRU only (placeholder until the policy module of issue 20 point 3 lands). */
#include "moe/policy.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/error.h"

struct xpol {
    int32_t n_layer, n_expert, n_slots;
    int32_t *where;      /* [key] slot or -1 */
    int32_t *key;        /* [slot] key or -1 */
    int32_t *pins;       /* [slot] */
    uint64_t *stamp;     /* [slot] last access */
    uint64_t clock;
};

const char *xpol_names(void) { return "lru"; }
const char *xpol_default(void) { return "lru"; }
const char *xpol_name(const xpol *p) { (void)p; return "lru"; }

strata_status xpol_create(const char *name, int32_t n_layer, int32_t n_expert, int32_t n_slots, xpol **out) {
    *out = NULL;
    if (name && *name && strcmp(name, "lru"))
        return strata_fail(STRATA_ERR_INVALID_ARG, "cache policy '%s' is not known; choose one of: %s", name, xpol_names());
    if (n_layer <= 0 || n_expert <= 0 || n_slots < 0)
        return strata_fail(STRATA_ERR_INVALID_ARG, "cache policy: bad shape");
    xpol *p = calloc(1, sizeof *p);
    if (!p) return strata_fail(STRATA_ERR_NOMEM, "cache policy: no memory");
    p->n_layer = n_layer; p->n_expert = n_expert; p->n_slots = n_slots;
    const size_t nk = (size_t)n_layer * (size_t)n_expert, ns = (size_t)n_slots + 1;
    p->where = malloc(nk * sizeof *p->where);
    p->key = malloc(ns * sizeof *p->key);
    p->pins = calloc(ns, sizeof *p->pins);
    p->stamp = calloc(ns, sizeof *p->stamp);
    if (!p->where || !p->key || !p->pins || !p->stamp) { xpol_free(p); return strata_fail(STRATA_ERR_NOMEM, "cache policy: no memory"); }
    for (size_t i = 0; i < nk; i++) p->where[i] = -1;
    for (size_t i = 0; i < ns; i++) p->key[i] = -1;
    *out = p;
    return STRATA_OK;
}

void xpol_free(xpol *p) {
    if (!p) return;
    free(p->where); free(p->key); free(p->pins); free(p->stamp); free(p);
}

void xpol_window(xpol *p) { (void)p; }

int32_t xpol_lookup(const xpol *p, int32_t layer, int32_t expert) {
    if (layer < 0 || layer >= p->n_layer || expert < 0 || expert >= p->n_expert) return -1;
    return p->where[(size_t)layer * p->n_expert + expert];
}

void xpol_access(xpol *p, int32_t layer, int32_t expert, int32_t n_picks, int32_t best_rank) {
    (void)n_picks; (void)best_rank;
    const int32_t s = xpol_lookup(p, layer, expert);
    p->clock++;
    if (s >= 0) p->stamp[s] = p->clock;
}

int32_t xpol_insert(xpol *p, int32_t layer, int32_t expert, int32_t *ev_layer, int32_t *ev_expert) {
    *ev_layer = *ev_expert = -1;
    int32_t best = -1;
    for (int32_t s = 0; s < p->n_slots; s++) {
        if (p->pins[s]) continue;
        if (p->key[s] < 0) { best = s; break; }
        if (best < 0 || p->stamp[s] < p->stamp[best]) best = s;
    }
    if (best < 0) return -1;
    if (p->key[best] >= 0) {
        *ev_layer = p->key[best] / p->n_expert;
        *ev_expert = p->key[best] % p->n_expert;
        p->where[p->key[best]] = -1;
    }
    const int32_t k = layer * p->n_expert + expert;
    p->key[best] = k;
    p->where[k] = best;
    p->stamp[best] = ++p->clock;
    return best;
}

void xpol_pin(xpol *p, int32_t slot) { if (slot >= 0 && slot < p->n_slots) p->pins[slot]++; }
void xpol_unpin(xpol *p, int32_t slot) { if (slot >= 0 && slot < p->n_slots && p->pins[slot] > 0) p->pins[slot]--; }

int xpol_validate(const xpol *p, char *why, size_t n) {
    for (int32_t s = 0; s < p->n_slots; s++)
        if (p->key[s] >= 0 && p->where[p->key[s]] != s) { if (why) snprintf(why, n, "slot %d disagrees", s); return 1; }
    return 0;
}
