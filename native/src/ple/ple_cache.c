/*
 * ple_cache.c — the PLE row cache (ple.h: layout, CLOCK replacement, ownership). Only the gather
 * worker calls these, so nothing here locks.
 */
#include "ple.h"

#include <stdlib.h>
#include <string.h>

#include "util/error.h"

static uint64_t home(const ple_cache *c, uint64_t row) { return (row * 0x9E3779B97F4A7C15ull) >> c->shift; }

strata_status ple_cache_init(ple_cache *c, uint64_t budget, size_t row_bytes, uint64_t max_rows) {
    memset(c, 0, sizeof *c);
    c->row_bytes = row_bytes;
    uint64_t cap = row_bytes ? budget / row_bytes : 0;
    if (cap > max_rows) cap = max_rows;                /* more entries than rows would stay empty */
    if (cap > 0x7FFFFFFEull) cap = 0x7FFFFFFEull;      /* slots hold entry + 1 in 32 bits */
    if (cap == 0) return STRATA_OK;
    unsigned lg = 1;
    while ((1ull << lg) < 2 * cap) lg++;
    c->nslot = 1ull << lg;
    c->shift = 64 - lg;
    /* allocations this large are mapped: their pages are backed only as entries fill */
    c->data = malloc((size_t)cap * row_bytes);
    c->key = malloc((size_t)cap * sizeof(uint64_t));
    c->ref = calloc((size_t)cap, 1);
    c->slot = calloc((size_t)c->nslot, sizeof(uint32_t));
    if (!c->data || !c->key || !c->ref || !c->slot) {
        ple_cache_free(c);
        return strata_fail(STRATA_ERR_NOMEM, "PLE: no memory for a row cache of %llu rows (%llu MiB); lower "
                           "ple_cache_bytes (--ple-cache-mib)", (unsigned long long)cap,
                           (unsigned long long)(cap * row_bytes >> 20));
    }
    c->cap = cap;
    return STRATA_OK;
}

void ple_cache_free(ple_cache *c) {
    free(c->data);
    free(c->key);
    free(c->ref);
    free(c->slot);
    memset(c, 0, sizeof *c);
}

uint64_t ple_cache_index_bytes(const ple_cache *c) {
    return c->cap ? c->cap * (sizeof(uint64_t) + 1) + c->nslot * sizeof(uint32_t) : 0;
}

/* The slot holding row, or nslot if none. */
static uint64_t slot_of(const ple_cache *c, uint64_t row) {
    const uint64_t mask = c->nslot - 1;
    for (uint64_t j = home(c, row);; j = (j + 1) & mask) {
        const uint32_t s = c->slot[j];
        if (!s) return c->nslot;
        if (c->key[s - 1] == row) return j;
    }
}

const uint8_t *ple_cache_find(ple_cache *c, uint64_t row) {
    if (!c->cap) return NULL;
    const uint64_t j = slot_of(c, row);
    if (j == c->nslot) return NULL;
    const uint32_t e = c->slot[j] - 1;
    c->ref[e] = 1;
    return c->data + (size_t)e * c->row_bytes;
}

/* Empties slot i and shifts later members of its probe run back (linear probing without tombstones):
 * an entry at j whose home k is not cyclically within (i, j] moves into the hole. */
static void slot_delete(ple_cache *c, uint64_t i) {
    const uint64_t mask = c->nslot - 1;
    for (uint64_t j = (i + 1) & mask; c->slot[j]; j = (j + 1) & mask) {
        const uint64_t k = home(c, c->key[c->slot[j] - 1]);
        const int stays = i <= j ? (i < k && k <= j) : (i < k || k <= j);
        if (!stays) {
            c->slot[i] = c->slot[j];
            i = j;
        }
    }
    c->slot[i] = 0;
}

void ple_cache_put(ple_cache *c, uint64_t row, const uint8_t *src) {
    if (!c->cap || slot_of(c, row) != c->nslot) return;
    uint64_t used = atomic_load_explicit(&c->used, memory_order_relaxed), e;
    if (used < c->cap) {
        e = used;
        atomic_store_explicit(&c->used, used + 1, memory_order_relaxed);
    } else {
        while (c->ref[c->hand]) {                        /* second chance */
            c->ref[c->hand] = 0;
            c->hand = c->hand + 1 == c->cap ? 0 : c->hand + 1;
        }
        e = c->hand;
        c->hand = c->hand + 1 == c->cap ? 0 : c->hand + 1;
        slot_delete(c, slot_of(c, c->key[e]));
    }
    c->key[e] = row;
    c->ref[e] = 0;
    memcpy(c->data + (size_t)e * c->row_bytes, src, c->row_bytes);
    const uint64_t mask = c->nslot - 1;
    uint64_t j = home(c, row);
    while (c->slot[j]) j = (j + 1) & mask;
    c->slot[j] = (uint32_t)(e + 1);
}
