/*
 * policy.c — the replacement policies of policy.h (protocol and policy definitions there).
 *
 * Two victim structures:
 *   - score policies (lru, lfu, lfru, frecency): one indexed binary min-heap per layer over its
 *     unpinned resident slots (the victim: the least of the n_layer tops); a key's score changes
 *     only when the key is accessed (decayed counts are kept in the log domain against a fixed
 *     origin, so keys that are not accessed keep their order as time passes), so an access is
 *     O(log n_slots) and an insert O(n_layer + log n_slots);
 *   - list policies (layer-lru, least-stale): one doubly linked LRU list of resident slots per
 *     layer (head = least recent); pinned slots stay in their list and are stepped over.
 * Pinning takes a slot out of the heap and unpinning puts it back, so the heap's top is always an
 * eligible victim.
 */
#include "policy.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/error.h"

typedef enum {
    XP_FRECENCY = 0, /* the default: first in names */
    XP_LRU,
    XP_LFU,
    XP_LFRU,
    XP_LAYER_LRU,
    XP_LEAST_STALE,
    XP_N
} xp_kind;

static const char *const xp_name[XP_N] = {"frecency", "lru", "lfu", "lfru", "layer-lru", "least-stale"};
static const char xp_names_csv[] = "frecency,lru,lfu,lfru,layer-lru,least-stale";

/* lfru: half-life of a pick, in windows. */
#define XP_LFRU_HALF_LIFE 64.0
/* frecency: the candidate half-lives (windows) of its shadow caches, the windows between two
 * choices of the one the table follows, and the factor on the shadows' hit counts per choice. */
#define XP_NH 4
static const double xp_frec_h[XP_NH] = {0.25, 8.0, 24.0, 96.0};
#define XP_FREC_EPOCH 16
#define XP_FREC_FORGET 0.5

struct xpol {
    xp_kind kind;
    int32_t n_layer, n_expert, n_slots, n_keys;
    int32_t *where;   /* [n_keys] slot or -1 */
    int32_t *skey;    /* [n_slots] key or -1 */
    int32_t *pins;    /* [n_slots] */
    int32_t *free_stack; /* [n_slots]; free_stack[n_free - 1] goes next */
    int32_t n_free;
    /* per key */
    uint64_t *count;  /* [n_keys] picks since creation */
    int64_t *last;    /* [n_keys] line number of the last access, -1 never */
    int64_t *lastw;   /* [n_keys] window of the last access, -1 never */
    double *score;    /* [n_keys] primary score (score policies); larger = kept longer. For frecency
                         it points at fscore + cur * n_keys, the followed shadow's scores */
    double *fscore;   /* [XP_NH * n_keys] log2 of the decayed pick sums against window 0, one row per
                         half-life (lfru uses row 0) */
    /* frecency's shadows: caches of keys only, one per half-life, same capacity and admission */
    int32_t *sh_heap[XP_NH]; /* [n_slots] keys, min-heap by that row's score */
    int32_t *sh_pos[XP_NH];  /* [n_keys] index in sh_heap or -1 */
    int32_t sh_n[XP_NH];
    double sh_hits[XP_NH];   /* picks each shadow would have hit, decayed per choice */
    int cur;                 /* the followed half-life */
    /* heap (score policies) */
    int32_t *heap;    /* [n_layer * hcap] slots: layer g's min-heap at heap + g * hcap */
    int32_t *hpos;    /* [n_slots] index in its layer's heap or -1 */
    int32_t *hn;      /* [n_layer] entries of each layer's heap */
    int32_t hcap;     /* min(n_slots, n_expert): the most keys one layer can hold */
    /* lists (list policies) */
    int32_t *prev, *next; /* [n_slots] */
    int32_t *head, *tail; /* [n_layer] */
    int32_t *n_res_layer; /* [n_layer] resident keys per layer */
    int32_t *quota;       /* [n_layer] layer-lru */
    /* time */
    int64_t window;   /* windows begun - 1 (-1 before the first) */
    int64_t line;     /* line number: bumped when (window, layer) changes */
    int32_t line_layer;
    int64_t line_window;
    int32_t n_resident;
};

/* ---------------------------------------------------------------- names */

const char *xpol_names(void) { return xp_names_csv; }
const char *xpol_default(void) { return xp_name[XP_FRECENCY]; }
const char *xpol_name(const xpol *p) { return xp_name[p->kind]; }

/* ---------------------------------------------------------------- scores */

static double log2add(double a, double b) {
    if (a == -INFINITY) return b;
    if (b == -INFINITY) return a;
    double hi = a > b ? a : b, lo = a > b ? b : a;
    return hi + log2(1.0 + exp2(lo - hi));
}

/* Heap order: a before b (a is evicted first). */
static int key_less(const xpol *p, int32_t ka, int32_t kb) {
    switch (p->kind) {
    case XP_LRU:
        if (p->last[ka] != p->last[kb]) return p->last[ka] < p->last[kb];
        return ka < kb;
    case XP_LFU:
        if (p->count[ka] != p->count[kb]) return p->count[ka] < p->count[kb];
        if (p->last[ka] != p->last[kb]) return p->last[ka] < p->last[kb];
        return ka < kb;
    default:
        if (p->score[ka] != p->score[kb]) return p->score[ka] < p->score[kb];
        if (p->last[ka] != p->last[kb]) return p->last[ka] < p->last[kb];
        return ka < kb;
    }
}

static int is_heap_kind(xp_kind k) { return k != XP_LAYER_LRU && k != XP_LEAST_STALE; }

/* ---------------------------------------------------------------- heaps (one per layer) */

static int slot_less(const xpol *p, int32_t sa, int32_t sb) { return key_less(p, p->skey[sa], p->skey[sb]); }

static int32_t slot_layer(const xpol *p, int32_t s) { return p->skey[s] / p->n_expert; }

static void heap_set(xpol *p, int32_t *h, int32_t i, int32_t s) {
    h[i] = s;
    p->hpos[s] = i;
}

/* Moves entry i of layer g's heap down to its place (up first when up_too). */
static void heap_move(xpol *p, int32_t g, int32_t i, int up_too) {
    int32_t *h = p->heap + (size_t)g * p->hcap, n = p->hn[g], s = h[i];
    while (up_too && i > 0 && slot_less(p, s, h[(i - 1) / 2])) {
        heap_set(p, h, i, h[(i - 1) / 2]);
        i = (i - 1) / 2;
    }
    for (;;) {
        int32_t c = 2 * i + 1;
        if (c >= n) break;
        if (c + 1 < n && slot_less(p, h[c + 1], h[c])) c++;
        if (!slot_less(p, h[c], s)) break;
        heap_set(p, h, i, h[c]);
        i = c;
    }
    heap_set(p, h, i, s);
}

static void heap_sift(xpol *p, int32_t g, int32_t i) { heap_move(p, g, i, 1); }

static void heap_push(xpol *p, int32_t s) {
    int32_t g = slot_layer(p, s);
    heap_set(p, p->heap + (size_t)g * p->hcap, p->hn[g]++, s);
    heap_sift(p, g, p->hn[g] - 1);
}

static void heap_remove(xpol *p, int32_t s) {
    int32_t i = p->hpos[s];
    if (i < 0) return;
    int32_t g = slot_layer(p, s), *h = p->heap + (size_t)g * p->hcap;
    p->hpos[s] = -1;
    int32_t last = h[--p->hn[g]];
    if (i == p->hn[g]) return;
    heap_set(p, h, i, last);
    heap_sift(p, g, i);
}

static void heap_fix(xpol *p, int32_t s) {
    if (p->hpos[s] >= 0) heap_sift(p, slot_layer(p, s), p->hpos[s]);
}

/* The victim of a score policy for a line of layer l: the least of the layers' tops. frecency
 * values a key at the time of its layer's last visit: a layer after l has not been visited in
 * this window yet, so its keys' sums count one window less decay (+1/H in the log domain; at a
 * short half-life this is least-stale's rule: a key about to be read is not the victim). */
static int32_t heap_victim(const xpol *p, int32_t l, double *eff_out) {
    int32_t best = -1;
    double best_eff = 0;
    for (int32_t g = 0; g < p->n_layer; g++) {
        if (p->hn[g] == 0) continue;
        int32_t s = p->heap[(size_t)g * p->hcap];
        if (p->kind == XP_FRECENCY) {
            int32_t k = p->skey[s];
            double eff = p->score[k] + (g > l ? 1.0 / xp_frec_h[p->cur] : 0.0);
            if (best < 0 || eff < best_eff || (eff == best_eff && key_less(p, k, p->skey[best]))) {
                best = s;
                best_eff = eff;
            }
        } else if (best < 0 || slot_less(p, s, best)) {
            best = s;
        }
    }
    if (eff_out) *eff_out = best_eff;
    return best;
}

/* ---------------------------------------------------------------- lists */

static void list_unlink(xpol *p, int32_t s, int32_t layer) {
    if (p->prev[s] >= 0) p->next[p->prev[s]] = p->next[s];
    else p->head[layer] = p->next[s];
    if (p->next[s] >= 0) p->prev[p->next[s]] = p->prev[s];
    else p->tail[layer] = p->prev[s];
    p->prev[s] = p->next[s] = -1;
}

static void list_append(xpol *p, int32_t s, int32_t layer) {
    p->prev[s] = p->tail[layer];
    p->next[s] = -1;
    if (p->tail[layer] >= 0) p->next[p->tail[layer]] = s;
    else p->head[layer] = s;
    p->tail[layer] = s;
}

/* The least recent unpinned slot of a layer's list, or -1. */
static int32_t list_oldest(const xpol *p, int32_t layer) {
    for (int32_t s = p->head[layer]; s >= 0; s = p->next[s])
        if (p->pins[s] == 0) return s;
    return -1;
}

/* ---------------------------------------------------------------- create / free */

strata_status xpol_create(const char *name, int32_t n_layer, int32_t n_expert, int32_t n_slots, xpol **out) {
    if (!out) return strata_fail(STRATA_ERR_INVALID_ARG, "xpol_create: out is NULL");
    *out = NULL;
    int kind = -1;
    for (int k = 0; name && k < XP_N; k++)
        if (strcmp(name, xp_name[k]) == 0) kind = k;
    if (kind < 0)
        return strata_fail(STRATA_ERR_INVALID_ARG, "unknown cache policy '%s'; choose one of %s",
                           name ? name : "(null)", xp_names_csv);
    if (n_layer < 1 || n_expert < 1 || n_slots < 0 || (int64_t)n_layer * n_expert > INT32_MAX)
        return strata_fail(STRATA_ERR_INVALID_ARG,
                           "cache policy %s: n_layer %d and n_expert %d must be >= 1 (product < 2^31), "
                           "n_slots %d >= 0", name, n_layer, n_expert, n_slots);
    if (n_slots > n_layer * n_expert) n_slots = n_layer * n_expert; /* more slots than keys: never used */
    xpol *p = calloc(1, sizeof *p);
    if (!p) return strata_fail(STRATA_ERR_NOMEM, "cache policy: out of memory");
    p->kind = (xp_kind)kind;
    p->n_layer = n_layer;
    p->n_expert = n_expert;
    p->n_slots = n_slots;
    p->n_keys = n_layer * n_expert;
    size_t nk = (size_t)p->n_keys, ns = (size_t)(n_slots ? n_slots : 1), nl = (size_t)n_layer;
    p->where = malloc(nk * sizeof *p->where);
    p->count = calloc(nk, sizeof *p->count);
    p->last = malloc(nk * sizeof *p->last);
    p->lastw = malloc(nk * sizeof *p->lastw);
    p->fscore = malloc(XP_NH * nk * sizeof *p->fscore);
    p->score = p->fscore;
    int shadows_ok = 1;
    if (kind == XP_FRECENCY)
        for (int i = 0; i < XP_NH; i++) {
            p->sh_heap[i] = malloc(ns * sizeof *p->sh_heap[i]);
            p->sh_pos[i] = malloc(nk * sizeof *p->sh_pos[i]);
            if (!p->sh_heap[i] || !p->sh_pos[i]) shadows_ok = 0;
            else for (size_t k = 0; k < nk; k++) p->sh_pos[i][k] = -1;
        }
    p->skey = malloc(ns * sizeof *p->skey);
    p->pins = calloc(ns, sizeof *p->pins);
    p->free_stack = malloc(ns * sizeof *p->free_stack);
    p->hcap = n_slots < n_expert ? n_slots : n_expert;
    p->heap = malloc((size_t)(p->hcap ? p->hcap : 1) * nl * sizeof *p->heap);
    p->hn = calloc(nl, sizeof *p->hn);
    p->hpos = malloc(ns * sizeof *p->hpos);
    p->prev = malloc(ns * sizeof *p->prev);
    p->next = malloc(ns * sizeof *p->next);
    p->head = malloc(nl * sizeof *p->head);
    p->tail = malloc(nl * sizeof *p->tail);
    p->n_res_layer = calloc(nl, sizeof *p->n_res_layer);
    p->quota = malloc(nl * sizeof *p->quota);
    if (!shadows_ok || !p->where || !p->count || !p->last || !p->lastw || !p->fscore || !p->skey ||
        !p->pins || !p->free_stack || !p->heap || !p->hn || !p->hpos || !p->prev || !p->next || !p->head || !p->tail ||
        !p->n_res_layer || !p->quota) {
        xpol_free(p);
        return strata_fail(STRATA_ERR_NOMEM, "cache policy: out of memory for %d keys and %d slots",
                           p->n_keys, n_slots);
    }
    for (size_t k = 0; k < nk; k++) {
        p->where[k] = -1;
        p->last[k] = p->lastw[k] = -1;
        for (int i = 0; i < XP_NH; i++) p->fscore[(size_t)i * nk + k] = -INFINITY;
    }
    for (int32_t s = 0; s < n_slots; s++) {
        p->skey[s] = -1;
        p->hpos[s] = p->prev[s] = p->next[s] = -1;
        p->free_stack[s] = n_slots - 1 - s; /* slot 0 goes first */
    }
    p->n_free = n_slots;
    for (int32_t l = 0; l < n_layer; l++) {
        p->head[l] = p->tail[l] = -1;
        p->quota[l] = n_slots / n_layer + (l < n_slots % n_layer ? 1 : 0);
    }
    if (p->kind == XP_FRECENCY) { /* start from the middle half-life until the shadows have counted */
        p->cur = 1;
        p->score = p->fscore + (size_t)p->cur * nk;
    }
    p->window = -1;
    p->line = -1;
    p->line_layer = -1;
    p->line_window = -1;
    *out = p;
    return STRATA_OK;
}

void xpol_free(xpol *p) {
    if (!p) return;
    for (int i = 0; i < XP_NH; i++) {
        free(p->sh_heap[i]);
        free(p->sh_pos[i]);
    }
    free(p->where); free(p->count); free(p->last); free(p->lastw); free(p->fscore); free(p->skey); free(p->pins); free(p->free_stack); free(p->heap); free(p->hn); free(p->hpos);
    free(p->prev); free(p->next); free(p->head); free(p->tail); free(p->n_res_layer); free(p->quota);
    free(p);
}

/* ---------------------------------------------------------------- calls */


static int key_of(const xpol *p, int32_t layer, int32_t expert) {
    if (layer < 0 || layer >= p->n_layer || expert < 0 || expert >= p->n_expert) return -1;
    return layer * p->n_expert + expert;
}

int32_t xpol_lookup(const xpol *p, int32_t layer, int32_t expert) {
    int k = key_of(p, layer, expert);
    return k < 0 ? -1 : p->where[k];
}

/* ---------------------------------------------------------------- frecency's shadows */

static int sh_less(const xpol *p, int i, int32_t ka, int32_t kb) {
    const double *row = p->fscore + (size_t)i * p->n_keys;
    if (row[ka] != row[kb]) return row[ka] < row[kb];
    return ka < kb;
}

static void sh_set(xpol *p, int i, int32_t j, int32_t k) {
    p->sh_heap[i][j] = k;
    p->sh_pos[i][k] = j;
}

static void sh_sift(xpol *p, int i, int32_t j) {
    int32_t *h = p->sh_heap[i], k = h[j];
    while (j > 0 && sh_less(p, i, k, h[(j - 1) / 2])) {
        sh_set(p, i, j, h[(j - 1) / 2]);
        j = (j - 1) / 2;
    }
    for (;;) {
        int32_t c = 2 * j + 1;
        if (c >= p->sh_n[i]) break;
        if (c + 1 < p->sh_n[i] && sh_less(p, i, h[c + 1], h[c])) c++;
        if (!sh_less(p, i, h[c], k)) break;
        sh_set(p, i, j, h[c]);
        j = c;
    }
    sh_set(p, i, j, k);
}

/* Shadow i after an access of key k (its score updated): reorder a resident k, else admit it as the
 * table would (a free place, or the lowest score if k's is higher). */
static void shadow_touch(xpol *p, int i, int32_t k) {
    if (p->sh_pos[i][k] >= 0) {
        sh_sift(p, i, p->sh_pos[i][k]);
        return;
    }
    if (p->n_slots == 0) return;
    if (p->sh_n[i] < p->n_slots) {
        sh_set(p, i, p->sh_n[i]++, k);
        sh_sift(p, i, p->sh_n[i] - 1);
        return;
    }
    int32_t top = p->sh_heap[i][0];
    if (!sh_less(p, i, top, k)) return;
    p->sh_pos[i][top] = -1;
    sh_set(p, i, 0, k);
    sh_sift(p, i, 0);
}

/* Every XP_FREC_EPOCH windows: follow the shadow with the most (decayed) hits; the table's heap is
 * rebuilt under the new order when that changes. */
static void frecency_choose(xpol *p) {
    int best = p->cur;
    for (int i = 0; i < XP_NH; i++)
        if (p->sh_hits[i] > p->sh_hits[best]) best = i;
    for (int i = 0; i < XP_NH; i++) p->sh_hits[i] *= XP_FREC_FORGET;
    if (best == p->cur) return;
    p->cur = best;
    p->score = p->fscore + (size_t)best * p->n_keys;
    for (int32_t g = 0; g < p->n_layer; g++)
        for (int32_t j = p->hn[g] / 2 - 1; j >= 0; j--) heap_move(p, g, j, 0); /* heapify: down only */
}

void xpol_window(xpol *p) {
    p->window++;
    if (p->kind == XP_FRECENCY && p->window > 0 && p->window % XP_FREC_EPOCH == 0) frecency_choose(p);
}

void xpol_access(xpol *p, int32_t layer, int32_t expert, int32_t n_picks, int32_t best_rank) {
    int k = key_of(p, layer, expert);
    if (k < 0 || n_picks < 0) return;
    int64_t w = p->window < 0 ? 0 : p->window;
    if (w != p->line_window || layer != p->line_layer) {
        p->line++;
        p->line_window = w;
        p->line_layer = layer;
    }
    p->count[k] += (uint64_t)n_picks;
    p->last[k] = p->line;
    p->lastw[k] = w;
    double picks = n_picks > 0 ? (double)n_picks : 1.0;
    (void)best_rank; /* kept for policies that weigh a pick by its rank; none here measured better */
    switch (p->kind) {
    case XP_LFRU:
        p->score[k] = log2add(p->score[k], log2(picks) + (double)w / XP_LFRU_HALF_LIFE);
        break;
    case XP_FRECENCY:
        for (int i = 0; i < XP_NH; i++) {
            double *row = p->fscore + (size_t)i * p->n_keys;
            row[k] = log2add(row[k], log2(picks) + (double)w / xp_frec_h[i]);
            if (p->sh_pos[i][k] >= 0) p->sh_hits[i] += picks;
            shadow_touch(p, i, k);
        }
        break;
    default:
        break;
    }
    int32_t s = p->where[k];
    if (s < 0) return;
    if (is_heap_kind(p->kind)) {
        heap_fix(p, s);
    } else {
        list_unlink(p, s, layer);
        list_append(p, s, layer);
    }
}

/* least-stale: the victim over every layer's least recent unpinned key, at a line of layer l. */
static int32_t least_stale_victim(const xpol *p, int32_t l) {
    int32_t best = -1;
    int64_t best_missed = -1;
    int32_t best_dist = -1;
    int64_t t = p->window < 0 ? 0 : p->window;
    for (int32_t lp = 0; lp < p->n_layer; lp++) {
        int32_t s = list_oldest(p, lp);
        if (s < 0) continue;
        int64_t w = p->lastw[p->skey[s]];
        int64_t missed = t - w - 1 + (lp <= l ? 1 : 0);
        /* distance to the layer's next visit: lp == l comes back last (a whole window), l + 1 first */
        int32_t dist = ((lp - l) % p->n_layer + p->n_layer) % p->n_layer;
        if (dist == 0) dist = p->n_layer;
        if (missed > best_missed || (missed == best_missed && dist > best_dist)) {
            best = s;
            best_missed = missed;
            best_dist = dist;
        }
    }
    return best;
}

static void place(xpol *p, int32_t s, int k, int32_t layer) {
    p->skey[s] = k;
    p->where[k] = s;
    p->n_res_layer[layer]++;
    p->n_resident++;
    if (is_heap_kind(p->kind)) {
        if (p->pins[s] == 0) heap_push(p, s);
    } else {
        /* the list's tail is its most recent key: an insert without an access counts as one */
        int64_t w = p->window < 0 ? 0 : p->window;
        if (p->lastw[k] < w) p->lastw[k] = w;
        list_append(p, s, layer);
    }
}

static void evict(xpol *p, int32_t s, int32_t *ev_layer, int32_t *ev_expert) {
    int k = p->skey[s];
    int32_t layer = k / p->n_expert;
    if (is_heap_kind(p->kind)) heap_remove(p, s);
    else list_unlink(p, s, layer);
    p->where[k] = -1;
    p->skey[s] = -1;
    p->n_res_layer[layer]--;
    p->n_resident--;
    if (ev_layer) *ev_layer = layer;
    if (ev_expert) *ev_expert = k % p->n_expert;
}

int32_t xpol_insert(xpol *p, int32_t layer, int32_t expert, int32_t *ev_layer, int32_t *ev_expert) {
    if (ev_layer) *ev_layer = -1;
    if (ev_expert) *ev_expert = -1;
    int k = key_of(p, layer, expert);
    if (k < 0 || p->n_slots == 0) return -1;
    if (p->where[k] >= 0) return p->where[k];
    int32_t s = -1;
    if (p->kind == XP_LAYER_LRU) {
        if (p->n_res_layer[layer] < p->quota[layer]) {
            if (p->n_free > 0) s = p->free_stack[--p->n_free];
        } else {
            s = list_oldest(p, layer);
            if (s < 0) return -1;
            evict(p, s, ev_layer, ev_expert);
        }
        if (s < 0) return -1;
        place(p, s, k, layer);
        return s;
    }
    if (p->n_free > 0) {
        s = p->free_stack[--p->n_free];
        place(p, s, k, layer);
        return s;
    }
    if (p->kind == XP_LEAST_STALE) {
        s = least_stale_victim(p, layer);
    } else {
        double eff;
        s = heap_victim(p, layer, &eff);
        if (s < 0) return -1;
        if (p->kind == XP_FRECENCY && p->score[k] <= eff) return -1; /* bypass: k is not worth the victim */
    }
    if (s < 0) return -1;
    evict(p, s, ev_layer, ev_expert);
    place(p, s, k, layer);
    return s;
}

void xpol_pin(xpol *p, int32_t slot) {
    if (slot < 0 || slot >= p->n_slots || p->skey[slot] < 0) return;
    if (p->pins[slot]++ == 0 && is_heap_kind(p->kind)) heap_remove(p, slot);
}

void xpol_unpin(xpol *p, int32_t slot) {
    if (slot < 0 || slot >= p->n_slots || p->pins[slot] <= 0) return;
    if (--p->pins[slot] == 0 && is_heap_kind(p->kind) && p->skey[slot] >= 0) heap_push(p, slot);
}

int32_t xpol_n_resident(const xpol *p) { return p->n_resident; }

int xpol_slot_info(const xpol *p, int32_t slot, int32_t *layer, int32_t *expert, int32_t *pins) {
    if (slot < 0 || slot >= p->n_slots) return -1;
    int k = p->skey[slot];
    if (layer) *layer = k < 0 ? -1 : k / p->n_expert;
    if (expert) *expert = k < 0 ? -1 : k % p->n_expert;
    if (pins) *pins = p->pins[slot];
    return 0;
}

/* ---------------------------------------------------------------- validate */

#define XP_BAD(...)                                  \
    do {                                             \
        if (why && n) snprintf(why, n, __VA_ARGS__); \
        return 1;                                    \
    } while (0)

int xpol_validate(const xpol *p, char *why, size_t n) {
    int32_t resident = 0;
    for (int32_t k = 0; k < p->n_keys; k++) {
        int32_t s = p->where[k];
        if (s < -1 || s >= p->n_slots) XP_BAD("key %d: slot %d out of range", k, s);
        if (s >= 0 && p->skey[s] != k) XP_BAD("key %d -> slot %d, which holds key %d", k, s, p->skey[s]);
        if (s >= 0) resident++;
    }
    int32_t held = 0, in_heap = 0;
    for (int32_t s = 0; s < p->n_slots; s++) {
        int32_t k = p->skey[s];
        if (k < -1 || k >= p->n_keys) XP_BAD("slot %d: key %d out of range", s, k);
        if (k >= 0 && p->where[k] != s) XP_BAD("slot %d holds key %d, which maps to slot %d", s, k, p->where[k]);
        if (p->pins[s] < 0) XP_BAD("slot %d: pins %d", s, p->pins[s]);
        if (k < 0 && p->pins[s] != 0) XP_BAD("free slot %d is pinned", s);
        if (k >= 0) held++;
        if (is_heap_kind(p->kind)) {
            int want = k >= 0 && p->pins[s] == 0;
            if (want != (p->hpos[s] >= 0)) XP_BAD("slot %d: in the victim heap %d, should be %d", s, p->hpos[s] >= 0, want);
            if (p->hpos[s] >= 0) {
                in_heap++;
                int32_t i = p->hpos[s];
                int32_t g = k / p->n_expert;
                const int32_t *h = p->heap + (size_t)g * p->hcap;
                if (i >= p->hn[g] || h[i] != s) XP_BAD("slot %d: heap position %d disagrees", s, i);
                if (i > 0 && slot_less(p, s, h[(i - 1) / 2])) XP_BAD("layer %d's heap order broken at %d", g, i);
            }
        }
    }
    if (resident != held || resident != p->n_resident)
        XP_BAD("resident keys %d, held slots %d, count %d disagree", resident, held, p->n_resident);
    if (held + p->n_free != p->n_slots) XP_BAD("held %d + free %d != slots %d", held, p->n_free, p->n_slots);
    for (int32_t i = 0; i < p->n_free; i++) {
        int32_t s = p->free_stack[i];
        if (s < 0 || s >= p->n_slots || p->skey[s] >= 0) XP_BAD("free stack entry %d: slot %d is not free", i, s);
    }
    if (is_heap_kind(p->kind)) {
        int32_t total = 0;
        for (int32_t g = 0; g < p->n_layer; g++) total += p->hn[g];
        if (in_heap != total) XP_BAD("heaps hold %d, %d slots point in", total, in_heap);
    }
    if (!is_heap_kind(p->kind)) {
        int32_t listed = 0;
        for (int32_t l = 0; l < p->n_layer; l++) {
            int32_t c = 0, prev = -1;
            for (int32_t s = p->head[l]; s >= 0; s = p->next[s]) {
                if (p->skey[s] < 0 || p->skey[s] / p->n_expert != l) XP_BAD("slot %d in layer %d's list", s, l);
                if (p->prev[s] != prev) XP_BAD("slot %d: prev link broken", s);
                if (p->lastw[p->skey[s]] < (prev >= 0 ? p->lastw[p->skey[prev]] : -1))
                    XP_BAD("layer %d's list is not in access order at slot %d", l, s);
                prev = s;
                if (++c > p->n_slots) XP_BAD("layer %d's list loops", l);
            }
            if (p->tail[l] != prev) XP_BAD("layer %d: tail %d, list ends at %d", l, p->tail[l], prev);
            if (c != p->n_res_layer[l]) XP_BAD("layer %d: %d listed, %d counted", l, c, p->n_res_layer[l]);
            if (p->kind == XP_LAYER_LRU && c > p->quota[l]) XP_BAD("layer %d holds %d over its quota %d", l, c, p->quota[l]);
            listed += c;
        }
        if (listed != held) XP_BAD("lists hold %d, %d slots held", listed, held);
    }
    return 0;
}

/* ---------------------------------------------------------------- exported: strata.h replay */

const char *strata_policy_names(void) { return xpol_names(); }
const char *strata_policy_default(void) { return xpol_default(); }

strata_status strata_policy_replay(const char *policy, int32_t n_layer, int32_t n_expert, int32_t capacity,
                                   int64_t n_lines, const int64_t *line_window, const int32_t *line_layer,
                                   const int64_t *pick_off, const int32_t *pick_expert, const int32_t *pick_rank,
                                   int64_t n_windows, uint64_t *window_hits, uint64_t *hits, uint64_t *lookups) {
    if (!hits || !lookups || n_lines < 0 || (n_lines > 0 && (!line_window || !line_layer || !pick_off)))
        return strata_fail(STRATA_ERR_INVALID_ARG, "strata_policy_replay: hits, lookups and the line arrays are required");
    if (n_lines > 0 && pick_off[0] != 0)
        return strata_fail(STRATA_ERR_INVALID_ARG, "strata_policy_replay: pick_off[0] is %lld, not 0", (long long)pick_off[0]);
    if (n_lines > 0 && pick_off[n_lines] > 0 && !pick_expert)
        return strata_fail(STRATA_ERR_INVALID_ARG, "strata_policy_replay: pick_expert is NULL");
    xpol *p = NULL;
    strata_status st = xpol_create(policy, n_layer, n_expert, capacity, &p);
    if (st != STRATA_OK) return st;
    int64_t *stamp = malloc((size_t)n_expert * sizeof *stamp);
    int32_t *npick = malloc((size_t)n_expert * sizeof *npick);
    int32_t *best = malloc((size_t)n_expert * sizeof *best);
    int32_t *order = malloc((size_t)n_expert * sizeof *order);
    uint8_t *was_hit = malloc((size_t)n_expert);
    if (!stamp || !npick || !best || !order || !was_hit) {
        st = strata_fail(STRATA_ERR_NOMEM, "strata_policy_replay: out of memory");
        goto done;
    }
    for (int32_t e = 0; e < n_expert; e++) stamp[e] = -1;
    uint64_t h = 0, n = 0;
    int64_t wi = -1;
    for (int64_t i = 0; i < n_lines; i++) {
        if (i == 0 || line_window[i] != line_window[i - 1]) {
            wi++;
            if (window_hits && wi >= n_windows) {
                st = strata_fail(STRATA_ERR_INVALID_ARG, "strata_policy_replay: more than n_windows %lld windows",
                                 (long long)n_windows);
                goto done;
            }
            if (window_hits) window_hits[wi] = 0;
            xpol_window(p);
        }
        int32_t layer = line_layer[i];
        if (layer < 0 || layer >= n_layer || pick_off[i + 1] < pick_off[i]) {
            st = strata_fail(STRATA_ERR_INVALID_ARG, "strata_policy_replay: line %lld: layer %d (of %d) or pick range bad",
                             (long long)i, layer, n_layer);
            goto done;
        }
        int32_t n_distinct = 0;
        for (int64_t j = pick_off[i]; j < pick_off[i + 1]; j++) {
            int32_t e = pick_expert[j];
            if (e < 0 || e >= n_expert) {
                st = strata_fail(STRATA_ERR_INVALID_ARG, "strata_policy_replay: line %lld: expert %d out of range (%d)",
                                 (long long)i, e, n_expert);
                goto done;
            }
            int32_t r = pick_rank ? pick_rank[j] : -1;
            int hit = xpol_lookup(p, layer, e) >= 0;
            n++;
            h += (uint64_t)hit;
            if (window_hits) window_hits[wi] += (uint64_t)hit;
            if (stamp[e] != i) {
                stamp[e] = i;
                npick[e] = 0;
                best[e] = r;
                was_hit[e] = (uint8_t)hit;
                order[n_distinct++] = e;
            }
            npick[e]++;
            if (r >= 0 && (best[e] < 0 || r < best[e])) best[e] = r;
        }
        for (int32_t d = 0; d < n_distinct; d++) xpol_access(p, layer, order[d], npick[order[d]], best[order[d]]);
        for (int32_t d = 0; d < n_distinct; d++)
            if (!was_hit[order[d]]) xpol_insert(p, layer, order[d], NULL, NULL);
    }
    *hits = h;
    *lookups = n;
done:
    free(stamp); free(npick); free(best); free(order); free(was_hit);
    xpol_free(p);
    return st;
}
