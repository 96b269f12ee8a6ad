/*
 * test_policy.c — the replacement policies of native/src/moe/policy.h under a randomized stress:
 * every policy, several shapes and capacities, random lookups / accesses / inserts / pins / unpins
 * / windows in the order a demand-filled tier makes them, checking after every call that
 *   - xpol_validate holds (no key resident twice, where[] and slots agree, victim structures sound);
 *   - a pinned slot is never a victim (its key stays resident while pinned);
 *   - insert returns a slot that then holds the key, evicts only what it reports, and fails only
 *     for a bypass (a score policy) or when every slot is pinned;
 *   - the resident count never exceeds the slots.
 * Also: a bad name fails with a message listing every accepted name.
 * `test_policy [SEEDS [STEPS]]`; tests/test_cachesim.py runs it (and CTest with no arguments).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "moe/policy.h"

static uint64_t rng_next(uint64_t *s) {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

static int32_t rnd(uint64_t *s, int32_t n) { return (int32_t)(rng_next(s) % (uint64_t)n); }

static void stress(const char *name, int32_t n_layer, int32_t n_expert, int32_t n_slots, uint64_t seed, int steps) {
    xpol *p = NULL;
    CHECK(xpol_create(name, n_layer, n_expert, n_slots, &p) == STRATA_OK);
    if (!p) return;
    CHECK(strcmp(xpol_name(p), name) == 0);
    int32_t *pins = calloc((size_t)(n_slots > 0 ? n_slots : 1), sizeof *pins);  /* our own pin counts */
    int32_t *line = malloc((size_t)n_expert * sizeof *line);
    char why[256];
    uint64_t s = seed;
    for (int step = 0; step < steps; step++) {
        if (rnd(&s, 4) == 0) xpol_window(p);
        int32_t layer = rnd(&s, n_layer);
        /* a line: 1..8 distinct experts, skewed to low ids so that some hit */
        int32_t n = 1 + rnd(&s, 8 < n_expert ? 8 : n_expert), m = 0;
        while (m < n) {
            int32_t e = rnd(&s, 3) ? rnd(&s, (n_expert + 3) / 4) : rnd(&s, n_expert);
            int dup = 0;
            for (int32_t i = 0; i < m; i++) dup |= line[i] == e;
            if (!dup) line[m++] = e;
        }
        int32_t was[8];
        for (int32_t i = 0; i < m; i++) was[i] = xpol_lookup(p, layer, line[i]);
        for (int32_t i = 0; i < m; i++) xpol_access(p, layer, line[i], 1 + rnd(&s, 3), rnd(&s, 10));
        /* the line computes from its hits: pinned while its misses are filled, so none is a victim */
        for (int32_t i = 0; i < m; i++)
            if (was[i] >= 0) {
                CHECK(xpol_lookup(p, layer, line[i]) == was[i]); /* access never moves a key */
                xpol_pin(p, was[i]);
                pins[was[i]]++;
            }
        for (int32_t i = 0; i < m; i++) {
            if (was[i] >= 0) continue;
            int32_t evl = -7, eve = -7, before = xpol_n_resident(p);
            int32_t slot = xpol_insert(p, layer, line[i], &evl, &eve);
            CHECK(xpol_n_resident(p) <= n_slots);
            if (slot >= 0) {
                CHECK(slot < n_slots);
                CHECK(xpol_lookup(p, layer, line[i]) == slot);
                if (evl >= 0) {
                    CHECK(pins[slot] == 0);                       /* a pinned slot is never a victim */
                    CHECK(xpol_lookup(p, evl, eve) == -1);
                    CHECK(!(evl == layer && eve == line[i]));
                    CHECK(xpol_n_resident(p) == before);
                } else {
                    CHECK(evl == -1 && eve == -1);
                    CHECK(xpol_n_resident(p) == before + 1);
                }
                if (rnd(&s, 3) == 0) { /* the line computes from it: pin, maybe leave it pinned a while */
                    xpol_pin(p, slot);
                    pins[slot]++;
                }
            } else {
                CHECK(evl == -1 && eve == -1);
                CHECK(xpol_lookup(p, layer, line[i]) == -1);
                CHECK(xpol_n_resident(p) == before);
            }
        }
        for (int32_t i = 0; i < m; i++)
            if (was[i] >= 0) {
                CHECK(xpol_lookup(p, layer, line[i]) == was[i]);
                xpol_unpin(p, was[i]);
                pins[was[i]]--;
            }
        /* unpin some: pinned slots must still hold their keys */
        for (int32_t sl = 0; sl < n_slots; sl++) {
            int32_t l, e, pc;
            CHECK(xpol_slot_info(p, sl, &l, &e, &pc) == 0);
            CHECK(pc == pins[sl]);
            if (pins[sl] > 0) CHECK(l >= 0 && xpol_lookup(p, l, e) == sl);
            if (pins[sl] > 0 && rnd(&s, 2) == 0) {
                xpol_unpin(p, sl);
                pins[sl]--;
            }
        }
        if (xpol_validate(p, why, sizeof why) != 0) {
            fprintf(stderr, "%s (%d x %d, %d slots, seed %llu) step %d: %s\n", name, n_layer, n_expert, n_slots,
                    (unsigned long long)seed, step, why);
            g_failed++;
            break;
        }
    }
    free(pins);
    free(line);
    xpol_free(p);
}

static void test_names(void) {
    xpol *p = (xpol *)1;
    CHECK(xpol_create("fifo", 2, 4, 2, &p) == STRATA_ERR_INVALID_ARG);
    CHECK(p == NULL);
    const char *msg = strata_last_error();
    CHECK(strstr(msg, "fifo") != NULL);
    char names[256];
    snprintf(names, sizeof names, "%s", xpol_names());
    for (char *tok = strtok(names, ","); tok; tok = strtok(NULL, ",")) {
        CHECK(strstr(msg, tok) != NULL);
        CHECK(xpol_create(tok, 2, 4, 2, &p) == STRATA_OK);
        xpol_free(p);
    }
    CHECK(strncmp(xpol_names(), xpol_default(), strlen(xpol_default())) == 0); /* the default first */
    CHECK(xpol_create("lru", 0, 4, 2, &p) == STRATA_ERR_INVALID_ARG);
}

int main(int argc, char **argv) {
    int seeds = argc > 1 ? atoi(argv[1]) : 3, steps = argc > 2 ? atoi(argv[2]) : 2000;
    test_names();
    char names[256];
    snprintf(names, sizeof names, "%s", xpol_names());
    const char *list[16];
    int n = 0;
    for (char *tok = strtok(names, ","); tok && n < 16; tok = strtok(NULL, ",")) list[n++] = tok;
    static const int32_t shapes[][3] = {{1, 8, 3}, {3, 16, 12}, {4, 32, 32}, {5, 24, 0}, {2, 8, 16}, {6, 40, 61}};
    for (int i = 0; i < n; i++)
        for (size_t j = 0; j < sizeof shapes / sizeof shapes[0]; j++)
            for (int sd = 1; sd <= seeds; sd++)
                stress(list[i], shapes[j][0], shapes[j][1], shapes[j][2], 0x9E3779B97F4A7C15ull * (uint64_t)sd + j,
                       steps);
    if (g_failed) fprintf(stderr, "test_policy: %d failures\n", g_failed);
    else printf("test_policy: ok (%d policies)\n", n);
    return g_failed != 0;
}
