/*
 * expert_cache.c — the residency table and hotness policy of expert_cache.h (protocol there).
 */
#include "expert_cache.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/error.h"

/* Invariant checks as the calls go: on in debug builds and in the sanitizer build (which is
 * RelWithDebInfo, so NDEBUG is set there too). A broken invariant is a Strata bug: abort with
 * the reason rather than compute on a slot that is being overwritten. */
#if !defined(NDEBUG) || (defined(STRATA_SANITIZED) && STRATA_SANITIZED)
#define EC_CHECKS 1
#else
#define EC_CHECKS 0
#endif

#define EC_ASSERT(cond)                                                                       \
    do {                                                                                      \
        if (EC_CHECKS && !(cond)) {                                                           \
            fprintf(stderr, "strata: expert cache invariant broken at %s:%d: %s\n", __FILE__,  \
                    __LINE__, #cond);                                                         \
            abort();                                                                          \
        }                                                                                     \
    } while (0)

typedef struct {
    int32_t layer, expert; /* -1 when FREE or BORROWED */
    int32_t pins;
    int32_t state;         /* ec_slot_state */
} ec_slot;

typedef struct {
    float heat;
    int32_t expert;
} ec_cand;

typedef struct {
    float diff;
    int32_t layer, in_expert, out_expert;
} ec_pair;

struct expert_cache {
    ec_params p;
    int32_t *where;   /* [n_layer * n_expert] slot or -1 */
    float *heat;      /* [n_layer * n_expert] */
    ec_slot *slot;    /* [n_slots] */
    int32_t *free_stack; /* [n_slots] FREE slots; free_stack[n_free - 1] is handed out next */
    int32_t n_free;
    ec_cand *hot, *cold; /* [n_expert] scratch of ec_plan_round */
    ec_pair *pairs;      /* [n_slots] scratch: at most one pair per resident */
    ec_stats st;
};

ec_params ec_default_params(void) {
    ec_params p = {0};
    p.max_swaps = 96;
    p.min_diff = 1.5f;
    p.decay = 0.7f;
    return p;
}

static int64_t key(const expert_cache *c, int32_t layer, int32_t expert) {
    return (int64_t)layer * c->p.n_expert + expert;
}

static int in_range(const expert_cache *c, int32_t layer, int32_t expert) {
    return layer >= 0 && layer < c->p.n_layer && expert >= 0 && expert < c->p.n_expert;
}

static int slot_ok(const expert_cache *c, int32_t s) { return s >= 0 && s < c->p.n_slots; }

strata_status ec_create(const ec_params *p, expert_cache **out) {
    if (!p || !out) return strata_fail(STRATA_ERR_INVALID_ARG, "ec_create: params and out must not be NULL");
    *out = NULL;
    if (p->n_layer < 0 || p->n_expert < 0 || p->n_slots < 0)
        return strata_fail(STRATA_ERR_INVALID_ARG, "expert cache: n_layer %d, n_expert %d, n_slots %d must be >= 0",
                           (int)p->n_layer, (int)p->n_expert, (int)p->n_slots);
    if (p->max_swaps < 0)
        return strata_fail(STRATA_ERR_INVALID_ARG, "expert cache: max_swaps %d must be >= 0", (int)p->max_swaps);
    if (!(p->min_diff > 0.0f) || p->min_diff > 1e30f)
        return strata_fail(STRATA_ERR_INVALID_ARG, "expert cache: min_diff %g must be a positive number",
                           (double)p->min_diff);
    if (!(p->decay >= 0.0f && p->decay <= 1.0f))
        return strata_fail(STRATA_ERR_INVALID_ARG, "expert cache: decay %g must be in [0, 1]", (double)p->decay);
    const int64_t n_keys = (int64_t)p->n_layer * p->n_expert;
    if (n_keys > (int64_t)1 << 30)
        return strata_fail(STRATA_ERR_INVALID_ARG, "expert cache: %d layers x %d experts is too large",
                           (int)p->n_layer, (int)p->n_expert);
    expert_cache *c = calloc(1, sizeof *c);
    if (!c) return strata_fail(STRATA_ERR_NOMEM, "expert cache: out of memory");
    c->p = *p;
    c->where = malloc((size_t)(n_keys ? n_keys : 1) * sizeof *c->where);
    c->heat = calloc((size_t)(n_keys ? n_keys : 1), sizeof *c->heat);
    c->slot = malloc((size_t)(p->n_slots ? p->n_slots : 1) * sizeof *c->slot);
    c->free_stack = malloc((size_t)(p->n_slots ? p->n_slots : 1) * sizeof *c->free_stack);
    c->hot = malloc((size_t)(p->n_expert ? p->n_expert : 1) * sizeof *c->hot);
    c->cold = malloc((size_t)(p->n_expert ? p->n_expert : 1) * sizeof *c->cold);
    c->pairs = malloc((size_t)(p->n_slots ? p->n_slots : 1) * sizeof *c->pairs);
    if (!c->where || !c->heat || !c->slot || !c->free_stack || !c->hot || !c->cold || !c->pairs) {
        ec_free(c);
        return strata_fail(STRATA_ERR_NOMEM, "expert cache: out of memory for %d slots, %lld experts",
                           (int)p->n_slots, (long long)n_keys);
    }
    for (int64_t i = 0; i < n_keys; i++) c->where[i] = -1;
    for (int32_t s = 0; s < p->n_slots; s++) {
        c->slot[s] = (ec_slot){.layer = -1, .expert = -1, .pins = 0, .state = EC_FREE};
        c->free_stack[s] = p->n_slots - 1 - s; /* slot 0 is handed out first */
    }
    c->n_free = p->n_slots;
    *out = c;
    return STRATA_OK;
}

void ec_free(expert_cache *c) {
    if (!c) return;
    free(c->where);
    free(c->heat);
    free(c->slot);
    free(c->free_stack);
    free(c->hot);
    free(c->cold);
    free(c->pairs);
    free(c);
}

int32_t ec_lookup(const expert_cache *c, int32_t layer, int32_t expert) {
    if (!in_range(c, layer, expert)) return -1;
    const int32_t s = c->where[key(c, layer, expert)];
    if (s < 0 || c->slot[s].state != EC_READY) return -1;
    EC_ASSERT(c->slot[s].layer == layer && c->slot[s].expert == expert);
    return s;
}

void ec_note(expert_cache *c, int32_t layer, int32_t expert) {
    EC_ASSERT(in_range(c, layer, expert));
    if (!in_range(c, layer, expert)) return;
    const int64_t k = key(c, layer, expert);
    c->heat[k] += 1.0f;
    c->st.lookups++;
    const int32_t s = c->where[k];
    if (s >= 0 && c->slot[s].state == EC_READY) c->st.hits++;
}

/* Pops a FREE slot, or -1. */
static int32_t take_free(expert_cache *c) {
    if (c->n_free == 0) return -1;
    const int32_t s = c->free_stack[--c->n_free];
    EC_ASSERT(c->slot[s].state == EC_FREE && c->slot[s].pins == 0 && c->slot[s].expert < 0);
    return s;
}

static void push_free(expert_cache *c, int32_t s) {
    EC_ASSERT(c->n_free < c->p.n_slots);
    c->slot[s] = (ec_slot){.layer = -1, .expert = -1, .pins = 0, .state = EC_FREE};
    c->free_stack[c->n_free++] = s;
}

int ec_admit(expert_cache *c, int32_t layer, int32_t expert, int32_t *slot) {
    EC_ASSERT(in_range(c, layer, expert));
    if (!in_range(c, layer, expert)) return 0;
    const int64_t k = key(c, layer, expert);
    if (c->where[k] >= 0) return 0; /* already READY or LOADING: never resident twice */
    const int32_t s = take_free(c);
    if (s < 0) return 0;
    c->slot[s] = (ec_slot){.layer = layer, .expert = expert, .pins = 0, .state = EC_LOADING};
    c->where[k] = s;
    c->st.admits++;
    if (slot) *slot = s;
    return 1;
}

void ec_loaded(expert_cache *c, int32_t slot) {
    EC_ASSERT(slot_ok(c, slot) && c->slot[slot].state == EC_LOADING);
    if (!slot_ok(c, slot) || c->slot[slot].state != EC_LOADING) return;
    c->slot[slot].state = EC_READY;
}

void ec_abort(expert_cache *c, int32_t slot) {
    EC_ASSERT(slot_ok(c, slot) && c->slot[slot].state == EC_LOADING && c->slot[slot].pins == 0);
    if (!slot_ok(c, slot) || c->slot[slot].state != EC_LOADING) return;
    c->where[key(c, c->slot[slot].layer, c->slot[slot].expert)] = -1;
    push_free(c, slot);
}

void ec_pin(expert_cache *c, int32_t slot) {
    EC_ASSERT(slot_ok(c, slot) && (c->slot[slot].state == EC_READY || c->slot[slot].state == EC_LOADING));
    if (!slot_ok(c, slot)) return;
    c->slot[slot].pins++;
}

void ec_unpin(expert_cache *c, int32_t slot) {
    EC_ASSERT(slot_ok(c, slot) && c->slot[slot].pins > 0);
    if (!slot_ok(c, slot) || c->slot[slot].pins <= 0) return;
    c->slot[slot].pins--;
}

/* ---------------------------------------------------------------- the adjustment round */

static int cmp_hot(const void *a, const void *b) { /* heat descending, expert ascending */
    const ec_cand *x = a, *y = b;
    if (x->heat != y->heat) return x->heat > y->heat ? -1 : 1;
    return (x->expert > y->expert) - (x->expert < y->expert);
}

static int cmp_cold(const void *a, const void *b) { /* heat ascending, expert ascending */
    const ec_cand *x = a, *y = b;
    if (x->heat != y->heat) return x->heat < y->heat ? -1 : 1;
    return (x->expert > y->expert) - (x->expert < y->expert);
}

static int cmp_pair(const void *a, const void *b) { /* difference descending, layer, in_expert */
    const ec_pair *x = a, *y = b;
    if (x->diff != y->diff) return x->diff > y->diff ? -1 : 1;
    if (x->layer != y->layer) return x->layer < y->layer ? -1 : 1;
    return (x->in_expert > y->in_expert) - (x->in_expert < y->in_expert);
}

int ec_plan_round(expert_cache *c, ec_swap *out, int cap) {
#if EC_CHECKS
    {
        char why[256];
        if (ec_validate(c, why, sizeof why)) {
            fprintf(stderr, "strata: expert cache invariant broken before a round: %s\n", why);
            abort();
        }
    }
#endif
    const int32_t ne = c->p.n_expert;
    int n_pairs = 0;
    for (int32_t l = 0; l < c->p.n_layer; l++) {
        int n_hot = 0, n_cold = 0;
        const float *h = c->heat + key(c, l, 0);
        const int32_t *w = c->where + key(c, l, 0);
        for (int32_t e = 0; e < ne; e++) {
            if (w[e] < 0) {
                if (h[e] > 0.0f) c->hot[n_hot++] = (ec_cand){h[e], e};
            } else if (c->slot[w[e]].state == EC_READY && c->slot[w[e]].pins == 0) {
                c->cold[n_cold++] = (ec_cand){h[e], e};
            }
        }
        if (n_hot == 0 || n_cold == 0) continue;
        qsort(c->hot, (size_t)n_hot, sizeof *c->hot, cmp_hot);
        qsort(c->cold, (size_t)n_cold, sizeof *c->cold, cmp_cold);
        /* Hottest outsider against coldest resident, and so on: the difference only shrinks
         * along the pairing, so the first pair under the threshold ends the layer. */
        const int n = n_hot < n_cold ? n_hot : n_cold;
        for (int i = 0; i < n; i++) {
            const float d = c->hot[i].heat - c->cold[i].heat;
            if (!(d >= c->p.min_diff)) break;
            EC_ASSERT(n_pairs < c->p.n_slots);
            c->pairs[n_pairs++] = (ec_pair){d, l, c->hot[i].expert, c->cold[i].expert};
        }
    }
    if (n_pairs > 1) qsort(c->pairs, (size_t)n_pairs, sizeof *c->pairs, cmp_pair);
    int n_swaps = n_pairs;
    if (n_swaps > c->p.max_swaps) n_swaps = c->p.max_swaps;
    if (n_swaps > cap) n_swaps = cap < 0 ? 0 : cap;
    for (int i = 0; i < n_swaps; i++) {
        const ec_pair *pr = &c->pairs[i];
        const int64_t kin = key(c, pr->layer, pr->in_expert), kout = key(c, pr->layer, pr->out_expert);
        const int32_t s = c->where[kout];
        EC_ASSERT(s >= 0 && c->slot[s].state == EC_READY && c->slot[s].pins == 0 && c->where[kin] < 0);
        c->where[kout] = -1; /* the victim is invisible from here on */
        c->where[kin] = s;
        c->slot[s].expert = pr->in_expert; /* same layer */
        c->slot[s].state = EC_LOADING;
        out[i] = (ec_swap){pr->layer, pr->in_expert, pr->out_expert, s};
    }
    c->st.swaps += (uint64_t)n_swaps;
    const int64_t n_keys = (int64_t)c->p.n_layer * ne;
    for (int64_t i = 0; i < n_keys; i++) c->heat[i] *= c->p.decay;
    return n_swaps;
}

/* ---------------------------------------------------------------- prefill borrowing */

int ec_borrow(expert_cache *c, int32_t *slot) {
    int32_t s = take_free(c);
    if (s < 0) {
        float best = 0.0f;
        int64_t best_key = -1;
        for (int32_t i = 0; i < c->p.n_slots; i++) {
            const ec_slot *x = &c->slot[i];
            if (x->state != EC_READY || x->pins != 0) continue;
            const int64_t k = key(c, x->layer, x->expert);
            if (s < 0 || c->heat[k] < best || (c->heat[k] == best && k < best_key)) {
                s = i;
                best = c->heat[k];
                best_key = k;
            }
        }
        if (s < 0) return 0;
        c->where[best_key] = -1;
    }
    c->slot[s] = (ec_slot){.layer = -1, .expert = -1, .pins = 0, .state = EC_BORROWED};
    if (slot) *slot = s;
    return 1;
}

void ec_return(expert_cache *c, int32_t slot) {
    EC_ASSERT(slot_ok(c, slot) && c->slot[slot].state == EC_BORROWED);
    if (!slot_ok(c, slot) || c->slot[slot].state != EC_BORROWED) return;
    push_free(c, slot);
}

/* ---------------------------------------------------------------- inspection */

ec_stats ec_get_stats(const expert_cache *c) { return c->st; }

int32_t ec_n_slots(const expert_cache *c) { return c->p.n_slots; }

float ec_heat(const expert_cache *c, int32_t layer, int32_t expert) {
    return in_range(c, layer, expert) ? c->heat[key(c, layer, expert)] : 0.0f;
}

int ec_slot_info(const expert_cache *c, int32_t slot, int32_t *layer, int32_t *expert, int32_t *pins) {
    if (!slot_ok(c, slot)) return -1;
    if (layer) *layer = c->slot[slot].layer;
    if (expert) *expert = c->slot[slot].expert;
    if (pins) *pins = c->slot[slot].pins;
    return c->slot[slot].state;
}

#define EC_BAD(...)                                                   \
    do {                                                              \
        if (why && why_size) snprintf(why, why_size, __VA_ARGS__);   \
        return 1;                                                     \
    } while (0)

int ec_validate(const expert_cache *c, char *why, size_t why_size) {
    const int64_t n_keys = (int64_t)c->p.n_layer * c->p.n_expert;
    for (int64_t k = 0; k < n_keys; k++) {
        const int32_t s = c->where[k];
        if (s == -1) continue;
        if (!slot_ok(c, s)) EC_BAD("where[%lld] = %d is not a slot", (long long)k, (int)s);
        const ec_slot *x = &c->slot[s];
        if (x->state != EC_LOADING && x->state != EC_READY)
            EC_BAD("expert %lld points to slot %d in state %d", (long long)k, (int)s, (int)x->state);
        if (key(c, x->layer, x->expert) != k || !in_range(c, x->layer, x->expert))
            EC_BAD("expert %lld points to slot %d, which holds layer %d expert %d", (long long)k, (int)s,
                   (int)x->layer, (int)x->expert);
    }
    int32_t n_free_state = 0;
    for (int32_t s = 0; s < c->p.n_slots; s++) {
        const ec_slot *x = &c->slot[s];
        if (x->pins < 0) EC_BAD("slot %d has %d pins", (int)s, (int)x->pins);
        switch (x->state) {
        case EC_FREE:
        case EC_BORROWED:
            if (x->pins != 0 || x->layer != -1 || x->expert != -1)
                EC_BAD("slot %d (state %d) holds layer %d expert %d with %d pins", (int)s, (int)x->state,
                       (int)x->layer, (int)x->expert, (int)x->pins);
            n_free_state += x->state == EC_FREE;
            break;
        case EC_LOADING:
        case EC_READY:
            /* where[] points back here: two slots claiming one expert cannot both pass. */
            if (!in_range(c, x->layer, x->expert) || c->where[key(c, x->layer, x->expert)] != s)
                EC_BAD("slot %d holds layer %d expert %d, which is not mapped to it (expert resident twice?)",
                       (int)s, (int)x->layer, (int)x->expert);
            break;
        default: EC_BAD("slot %d has unknown state %d", (int)s, (int)x->state);
        }
    }
    if (n_free_state != c->n_free) EC_BAD("%d FREE slots but %d on the free stack", (int)n_free_state, (int)c->n_free);
    /* Every entry FREE and no entry twice: with the count above, the stack is exactly the FREE set. */
    unsigned char *seen = calloc((size_t)(c->p.n_slots ? c->p.n_slots : 1), 1);
    if (!seen) EC_BAD("out of memory while validating");
    for (int32_t i = 0; i < c->n_free; i++) {
        const int32_t s = c->free_stack[i];
        const int bad_state = !slot_ok(c, s) || c->slot[s].state != EC_FREE;
        const int twice = !bad_state && seen[s];
        if (!bad_state) seen[s] = 1;
        if (bad_state || twice) {
            free(seen);
            if (bad_state) EC_BAD("free stack entry %d is slot %d, which is not FREE", (int)i, (int)s);
            EC_BAD("slot %d is on the free stack twice", (int)s);
        }
    }
    free(seen);
    return 0;
}
