/*
 * test_expert_cache.c — the ExpertCache table (native/src/moe/expert_cache.h): admit fills free
 * slots only, the hotness rules (threshold, per-round cap, decay, pairing within a layer, pinned
 * and loading slots are never victims), and a randomized stress of admit / plan / loaded / pin /
 * unpin / borrow / lookup against a shadow model, checking every invariant after every step;
 * then the same protocol with a real copy thread and a real compute thread reading slot memory
 * while the model thread swaps. Runs in the ASan+UBSan build too. Exit code 0 = pass.
 */
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moe/expert_cache.h"

#include "check.h"

static expert_cache *make(int32_t nl, int32_t ne, int32_t ns) {
    ec_params p = ec_default_params();
    p.n_layer = nl;
    p.n_expert = ne;
    p.n_slots = ns;
    expert_cache *c = NULL;
    if (ec_create(&p, &c) != STRATA_OK || !c) {
        fprintf(stderr, "ec_create failed: %s\n", strata_last_error());
        exit(1);
    }
    return c;
}

static void validate(const expert_cache *c, int line) {
    char why[256];
    if (ec_validate(c, why, sizeof why)) {
        fprintf(stderr, "line %d: invariant broken: %s\n", line, why);
        g_failed++;
    }
}

/* Admit and finish the copy at once. */
static int32_t put(expert_cache *c, int32_t l, int32_t e) {
    int32_t s = -1;
    if (!ec_admit(c, l, e, &s)) return -1;
    ec_loaded(c, s);
    return s;
}

static void note_n(expert_cache *c, int32_t l, int32_t e, int n) {
    for (int i = 0; i < n; i++) ec_note(c, l, e);
}

/* ---------------------------------------------------------------- parameters */

static void test_params(void) {
    ec_params p = ec_default_params();
    CHECK(p.max_swaps == 96 && p.min_diff == 1.5f && p.decay == 0.7f);
    expert_cache *c = NULL;
    p.n_layer = 2, p.n_expert = 4, p.n_slots = -1;
    CHECK(ec_create(&p, &c) == STRATA_ERR_INVALID_ARG && c == NULL);
    CHECK(strstr(strata_last_error(), "n_slots") != NULL);
    p.n_slots = 2, p.min_diff = 0.0f;
    CHECK(ec_create(&p, &c) == STRATA_ERR_INVALID_ARG);
    CHECK(strstr(strata_last_error(), "min_diff") != NULL);
    p.min_diff = 1.5f, p.decay = 1.5f;
    CHECK(ec_create(&p, &c) == STRATA_ERR_INVALID_ARG);
    CHECK(strstr(strata_last_error(), "decay") != NULL);
    CHECK(ec_create(NULL, &c) == STRATA_ERR_INVALID_ARG);
    /* No budget: a table with no slots works and never admits. */
    c = make(2, 4, 0);
    int32_t s = -7;
    CHECK(ec_admit(c, 0, 1, &s) == 0 && s == -7);
    ec_note(c, 0, 1);
    ec_swap sw[4];
    CHECK(ec_plan_round(c, sw, 4) == 0);
    CHECK(ec_lookup(c, 0, 1) == -1);
    CHECK(ec_get_stats(c).lookups == 1 && ec_get_stats(c).hits == 0);
    validate(c, __LINE__);
    ec_free(c);
}

/* ---------------------------------------------------------------- admit */

static void test_admit_fills_free_slots_only(void) {
    expert_cache *c = make(2, 8, 3);
    int32_t s0 = -1, s1 = -1, s2 = -1, s3 = -1;
    CHECK(ec_admit(c, 0, 1, &s0) == 1);
    CHECK(ec_lookup(c, 0, 1) == -1); /* LOADING is invisible */
    CHECK(ec_admit(c, 0, 1, &s3) == 0 && s3 == -1); /* never resident twice */
    ec_loaded(c, s0);
    CHECK(ec_lookup(c, 0, 1) == s0);
    CHECK(ec_admit(c, 0, 1, &s3) == 0);
    CHECK(ec_admit(c, 1, 1, &s1) == 1); /* same expert id, other layer: another expert */
    CHECK(ec_admit(c, 0, 5, &s2) == 1);
    CHECK(s0 != s1 && s1 != s2 && s0 != s2);
    CHECK(s0 >= 0 && s0 < 3 && s1 >= 0 && s1 < 3 && s2 >= 0 && s2 < 3);
    ec_loaded(c, s1);
    /* Full: admit never evicts, however hot the newcomer. */
    note_n(c, 1, 7, 50);
    CHECK(ec_admit(c, 1, 7, &s3) == 0 && s3 == -1);
    CHECK(ec_lookup(c, 0, 1) == s0);
    CHECK(ec_get_stats(c).admits == 3);
    /* Out-of-range lookups answer "not resident". */
    CHECK(ec_lookup(c, 2, 0) == -1 && ec_lookup(c, 0, 8) == -1 && ec_lookup(c, -1, 0) == -1);
    /* A failed copy gives the slot back. */
    ec_abort(c, s2);
    CHECK(ec_lookup(c, 0, 5) == -1);
    int32_t s4 = -1;
    CHECK(ec_admit(c, 1, 7, &s4) == 1 && s4 == s2);
    ec_loaded(c, s4);
    /* Hits count routed picks of READY experts; lookups count every pick. */
    ec_stats before = ec_get_stats(c);
    ec_note(c, 0, 1);
    ec_note(c, 0, 2);
    ec_note(c, 1, 7);
    ec_stats after = ec_get_stats(c);
    CHECK(after.lookups - before.lookups == 3 && after.hits - before.hits == 2);
    /* Borrowing from a full cache evicts the coldest unpinned resident; returning frees it. */
    ec_pin(c, s0);
    int32_t b = -1;
    CHECK(ec_borrow(c, &b) == 1);
    CHECK(b == s1); /* (1,1) has heat 0, (0,1) is pinned, (1,7) is hot */
    CHECK(ec_lookup(c, 1, 1) == -1);
    CHECK(ec_slot_info(c, b, NULL, NULL, NULL) == EC_BORROWED);
    CHECK(ec_admit(c, 1, 1, &s3) == 0); /* a borrowed slot is not free */
    validate(c, __LINE__);
    ec_return(c, b);
    CHECK(ec_admit(c, 1, 1, &s3) == 1 && s3 == b);
    ec_unpin(c, s0);
    validate(c, __LINE__);
    ec_free(c);
}

/* ---------------------------------------------------------------- hotness rules */

static void test_threshold(void) {
    /* One slot holding expert 0 (heat 0). Expert 1 picked once: difference 1 < 1.5, no swap. */
    expert_cache *c = make(1, 4, 1);
    const int32_t s = put(c, 0, 0);
    CHECK(s == 0);
    ec_note(c, 0, 1);
    ec_swap sw[4];
    CHECK(ec_plan_round(c, sw, 4) == 0);
    CHECK(ec_heat(c, 0, 1) == 0.7f);
    /* Picked again: 0.7 + 1 = 1.7 ≥ 1.5: swap. */
    ec_note(c, 0, 1);
    CHECK(ec_plan_round(c, sw, 4) == 1);
    CHECK(sw[0].layer == 0 && sw[0].in_expert == 1 && sw[0].out_expert == 0 && sw[0].slot == s);
    CHECK(ec_lookup(c, 0, 0) == -1); /* the victim is invisible at once */
    CHECK(ec_lookup(c, 0, 1) == -1); /* the newcomer only after its copy */
    CHECK(ec_slot_info(c, s, NULL, NULL, NULL) == EC_LOADING);
    ec_loaded(c, s);
    CHECK(ec_lookup(c, 0, 1) == s);
    CHECK(ec_get_stats(c).swaps == 1);
    validate(c, __LINE__);
    ec_free(c);

    /* Exactly at the threshold (exact binary fractions with decay 0.5): 2.0 - 0.5 = 1.5 swaps. */
    for (int variant = 0; variant < 2; variant++) {
        ec_params p = ec_default_params();
        p.n_layer = 1, p.n_expert = 4, p.n_slots = 1, p.decay = 0.5f;
        p.min_diff = variant == 0 ? 1.5f : 1.5001f;
        CHECK(ec_create(&p, &c) == STRATA_OK);
        put(c, 0, 2);
        ec_note(c, 0, 2);
        CHECK(ec_plan_round(c, sw, 4) == 0); /* nothing non-resident is hot */
        CHECK(ec_heat(c, 0, 2) == 0.5f);
        note_n(c, 0, 3, 2);
        CHECK(ec_plan_round(c, sw, 4) == (variant == 0 ? 1 : 0));
        ec_free(c);
    }
}

static void test_cap_and_order(void) {
    /* Two layers, 128 residents each at heat 0, 128 outsiders each with heats 2..129:
     * 256 pairs qualify, a round executes the 96 largest differences, ties by layer. */
    expert_cache *c = make(2, 256, 256);
    for (int32_t l = 0; l < 2; l++)
        for (int32_t e = 0; e < 128; e++) CHECK(put(c, l, e) >= 0);
    for (int32_t l = 0; l < 2; l++)
        for (int32_t i = 0; i < 128; i++) note_n(c, l, 128 + i, 2 + i);
    ec_swap sw[300];
    const int n = ec_plan_round(c, sw, 300);
    CHECK(n == 96);
    for (int k = 0; k < n && k < 96; k++) {
        const int32_t rank = k / 2;             /* 0 = hottest */
        CHECK(sw[k].layer == k % 2);             /* equal differences: layer 0 first */
        CHECK(sw[k].in_expert == 255 - rank);
        CHECK(sw[k].out_expert == rank);         /* coldest residents, ties by expert id */
        CHECK(ec_slot_info(c, sw[k].slot, NULL, NULL, NULL) == EC_LOADING);
    }
    validate(c, __LINE__);
    for (int k = 0; k < n; k++) ec_loaded(c, sw[k].slot);
    /* The caller's cap also bounds a round (and the rest waits for the next one). */
    for (int32_t l = 0; l < 2; l++)
        for (int32_t i = 0; i < 80; i++) note_n(c, l, 128 + i, 2);
    const int m = ec_plan_round(c, sw, 10);
    CHECK(m == 10);
    for (int k = 0; k < m; k++) ec_loaded(c, sw[k].slot);
    CHECK(ec_get_stats(c).swaps == 106);
    validate(c, __LINE__);
    ec_free(c);
}

static void test_decay(void) {
    expert_cache *c = make(2, 4, 2);
    note_n(c, 0, 1, 3);
    note_n(c, 1, 3, 5);
    ec_swap sw[4];
    ec_plan_round(c, sw, 4);
    CHECK(ec_heat(c, 0, 1) == 3.0f * 0.7f);
    CHECK(ec_heat(c, 1, 3) == 5.0f * 0.7f);
    ec_note(c, 0, 1);
    ec_plan_round(c, sw, 4);
    CHECK(ec_heat(c, 0, 1) == (3.0f * 0.7f + 1.0f) * 0.7f);
    CHECK(ec_heat(c, 1, 3) == 5.0f * 0.7f * 0.7f);
    CHECK(ec_heat(c, 0, 0) == 0.0f);
    ec_free(c);
}

static void test_pairs_within_layer_and_skips_busy_slots(void) {
    /* A hot layer-1 expert never evicts a cold layer-0 resident. */
    expert_cache *c = make(2, 4, 1);
    const int32_t s = put(c, 0, 0);
    note_n(c, 1, 3, 10);
    ec_swap sw[4];
    CHECK(ec_plan_round(c, sw, 4) == 0);
    CHECK(ec_lookup(c, 0, 0) == s);
    ec_free(c);

    /* The coldest resident is pinned: the next coldest is the victim; LOADING slots are not victims. */
    c = make(1, 6, 3);
    const int32_t a = put(c, 0, 0), b = put(c, 0, 1);
    int32_t lo = -1;
    CHECK(ec_admit(c, 0, 2, &lo) == 1); /* stays LOADING, heat 0 */
    ec_note(c, 0, 1);                   /* a: 0, b: 1 */
    ec_pin(c, a);
    note_n(c, 0, 4, 6);
    note_n(c, 0, 5, 5);
    CHECK(ec_plan_round(c, sw, 4) == 1);
    CHECK(sw[0].in_expert == 4 && sw[0].out_expert == 1 && sw[0].slot == b);
    CHECK(ec_lookup(c, 0, 0) == a);
    ec_unpin(c, a);
    ec_loaded(c, b);
    /* Unpinned now: expert 5 (heat 3.5) replaces expert 0 (heat 0). */
    CHECK(ec_plan_round(c, sw, 4) == 1);
    CHECK(sw[0].in_expert == 5 && sw[0].out_expert == 0 && sw[0].slot == a);
    CHECK(ec_slot_info(c, lo, NULL, NULL, NULL) == EC_LOADING);
    validate(c, __LINE__);
    ec_free(c);
}

/* ---------------------------------------------------------------- randomized stress */

static uint64_t g_rng = 0x9E3779B97F4A7C15ull;
static uint32_t rnd(uint32_t n) {
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return n ? (uint32_t)((g_rng >> 11) % n) : 0;
}

enum { NL = 3, NE = 16, NS = 20, MAX_READS = 64 };

typedef struct {
    int state;             /* ec_slot_state as the test knows it from the API's answers */
    int32_t layer, expert;
    int pins;
    uint64_t data;         /* "slot memory": the tag of whatever was last copied into it */
} shadow_slot;

typedef struct {
    int32_t slot;
    uint64_t tag;          /* what the computation saw when it started */
} read_op;

static uint64_t tag_of(int32_t l, int32_t e) { return ((uint64_t)l << 32) | (uint64_t)(uint32_t)e | (1ull << 63); }

/* The slot the shadow says (l, e) is READY in, or -1. */
static int32_t shadow_ready(const shadow_slot *sh, int32_t l, int32_t e) {
    for (int32_t s = 0; s < NS; s++)
        if (sh[s].state == EC_READY && sh[s].layer == l && sh[s].expert == e) return s;
    return -1;
}

static int check_all(const expert_cache *c, const shadow_slot *sh, int step) {
    int bad = 0;
    char why[256];
    if (ec_validate(c, why, sizeof why)) {
        fprintf(stderr, "step %d: %s\n", step, why);
        bad = 1;
    }
    for (int32_t l = 0; l < NL; l++)
        for (int32_t e = 0; e < NE; e++) {
            const int32_t got = ec_lookup(c, l, e), want = shadow_ready(sh, l, e);
            if (got != want) {
                fprintf(stderr, "step %d: lookup(%d,%d) = %d, the protocol says %d\n", step, l, e, got, want);
                bad = 1;
            }
            if (got >= 0 && sh[got].state != EC_READY) {
                fprintf(stderr, "step %d: lookup returned slot %d in state %d\n", step, got, sh[got].state);
                bad = 1;
            }
            int holders = 0;
            for (int32_t s = 0; s < NS; s++)
                holders += (sh[s].state == EC_READY || sh[s].state == EC_LOADING) && sh[s].layer == l &&
                           sh[s].expert == e;
            if (holders > 1) {
                fprintf(stderr, "step %d: layer %d expert %d held by %d slots\n", step, l, e, holders);
                bad = 1;
            }
        }
    for (int32_t s = 0; s < NS; s++) {
        int32_t L, E, P;
        const int st = ec_slot_info(c, s, &L, &E, &P);
        if (st != sh[s].state || P != sh[s].pins ||
            ((st == EC_READY || st == EC_LOADING) && (L != sh[s].layer || E != sh[s].expert))) {
            fprintf(stderr, "step %d: slot %d is (%d, %d/%d, %d pins), the protocol says (%d, %d/%d, %d)\n", step, s,
                    st, L, E, P, sh[s].state, sh[s].layer, sh[s].expert, sh[s].pins);
            bad = 1;
        }
    }
    return bad;
}

/* A slot handed out for a new copy: it must have been FREE (admit, borrow) or READY (a victim),
 * and never pinned or LOADING. The copy starts writing the slot's memory at once. */
static int hand_out(shadow_slot *sh, int32_t s, int from_ready_ok, int step, const char *who) {
    if (s < 0 || s >= NS) {
        fprintf(stderr, "step %d: %s returned slot %d\n", step, who, s);
        return 1;
    }
    const int ok_state = sh[s].state == EC_FREE || (from_ready_ok && sh[s].state == EC_READY);
    if (!ok_state || sh[s].pins != 0) {
        fprintf(stderr, "step %d: %s handed out slot %d in state %d with %d pins\n", step, who, s, sh[s].state,
                sh[s].pins);
        return 1;
    }
    sh[s].data = 0xDEADull ^ (uint64_t)step; /* bytes in flight */
    return 0;
}

static void test_stress(uint64_t seed, int steps) {
    g_rng = seed;
    expert_cache *c = make(NL, NE, NS);
    shadow_slot sh[NS];
    for (int s = 0; s < NS; s++) sh[s] = (shadow_slot){EC_FREE, -1, -1, 0, 0};
    read_op reads[MAX_READS];
    int n_reads = 0, failures = 0;
    ec_swap sw[NS + 4];
    uint64_t n_swaps = 0, n_hits_seen = 0;
    for (int step = 0; step < steps && failures < 5; step++) {
        const uint32_t op = rnd(100);
        if (op < 35) { /* a window's routing: skewed picks, then admit misses while slots are free */
            for (int k = 0; k < 4; k++) {
                const int32_t l = (int32_t)rnd(NL);
                /* A hot set of 6 per layer that moves every 500 steps, plus uniform noise. */
                const int32_t e = (int32_t)(rnd(4) == 0 ? rnd(NE) : (step / 500 * 5 + rnd(6)) % NE);
                ec_note(c, l, e);
                const int32_t s = ec_lookup(c, l, e);
                if (s >= 0) {
                    n_hits_seen++;
                    if (n_reads < MAX_READS && rnd(2)) { /* a computation starts reading it */
                        ec_pin(c, s);
                        sh[s].pins++;
                        reads[n_reads++] = (read_op){s, sh[s].data};
                        if (sh[s].data != tag_of(l, e)) {
                            fprintf(stderr, "step %d: slot %d holds %llx, not (%d,%d)\n", step, s,
                                    (unsigned long long)sh[s].data, l, e);
                            failures++;
                        }
                    }
                } else {
                    int32_t a = -1;
                    if (ec_admit(c, l, e, &a)) {
                        failures += hand_out(sh, a, 0, step, "admit");
                        if (a >= 0 && a < NS) sh[a] = (shadow_slot){EC_LOADING, l, e, 0, sh[a].data};
                    }
                }
            }
        } else if (op < 55) { /* copies complete */
            for (int32_t s = 0; s < NS; s++)
                if (sh[s].state == EC_LOADING && rnd(2)) {
                    sh[s].data = tag_of(sh[s].layer, sh[s].expert);
                    ec_loaded(c, s);
                    sh[s].state = EC_READY;
                }
        } else if (op < 75) { /* computations finish: the slot must still hold what they read */
            for (int i = 0; i < n_reads;) {
                if (rnd(3) == 0) {
                    const read_op r = reads[i];
                    if (sh[r.slot].data != r.tag) {
                        fprintf(stderr, "step %d: slot %d was overwritten while read\n", step, r.slot);
                        failures++;
                    }
                    ec_unpin(c, r.slot);
                    sh[r.slot].pins--;
                    reads[i] = reads[--n_reads];
                } else {
                    i++;
                }
            }
        } else if (op < 88) { /* an adjustment round */
            const int cap = (int)rnd(NS + 2);
            const int n = ec_plan_round(c, sw, cap);
            if (n < 0 || n > cap) {
                fprintf(stderr, "step %d: plan_round returned %d with cap %d\n", step, n, cap);
                failures++;
                continue;
            }
            n_swaps += (uint64_t)n;
            for (int i = 0; i < n; i++) {
                const int32_t s = sw[i].slot;
                if (hand_out(sh, s, 1, step, "plan_round")) {
                    failures++;
                    continue;
                }
                if (sh[s].state != EC_READY || sh[s].layer != sw[i].layer || sh[s].expert != sw[i].out_expert) {
                    fprintf(stderr, "step %d: swap out of (%d,%d) from slot %d, which holds (%d,%d)\n", step,
                            sw[i].layer, sw[i].out_expert, s, sh[s].layer, sh[s].expert);
                    failures++;
                }
                sh[s] = (shadow_slot){EC_LOADING, sw[i].layer, sw[i].in_expert, 0, sh[s].data};
            }
        } else if (op < 92) { /* prefill borrows a slot */
            int32_t b = -1;
            if (ec_borrow(c, &b)) {
                failures += hand_out(sh, b, 1, step, "borrow");
                if (b >= 0 && b < NS) sh[b] = (shadow_slot){EC_BORROWED, -1, -1, 0, sh[b].data};
            }
        } else if (op < 97) { /* and gives one back */
            for (int32_t s = 0; s < NS; s++)
                if (sh[s].state == EC_BORROWED) {
                    ec_return(c, s);
                    sh[s] = (shadow_slot){EC_FREE, -1, -1, 0, sh[s].data};
                    break;
                }
        } else { /* a copy fails */
            for (int32_t s = 0; s < NS; s++)
                if (sh[s].state == EC_LOADING && sh[s].pins == 0) {
                    ec_abort(c, s);
                    sh[s] = (shadow_slot){EC_FREE, -1, -1, 0, sh[s].data};
                    break;
                }
        }
        failures += check_all(c, sh, step);
    }
    CHECK(failures == 0);
    const ec_stats st = ec_get_stats(c);
    CHECK(st.swaps == n_swaps);
    CHECK(st.hits == n_hits_seen);
    /* The stress really exercised the paths. */
    if (!(n_swaps > 50 && st.hits > 100 && st.admits > 20))
        fprintf(stderr, "stress: swaps %llu hits %llu admits %llu\n", (unsigned long long)n_swaps,
                (unsigned long long)st.hits, (unsigned long long)st.admits);
    CHECK(n_swaps > 50 && st.hits > 100 && st.admits > 20);
    ec_free(c);
}

/* ---------------------------------------------------------------- with real threads */

/* Slot memory read by a compute thread and written by a copy thread, while the model thread runs
 * the table. Each word is atomic (relaxed) so a protocol bug shows as a wrong tag, not as UB. */
enum { TW = 32, TQ = 256 };

typedef struct {
    int32_t slot;
    uint64_t tag;
    _Atomic int done;
} job;

typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    job *q[TQ];
    int head, count, stop;
} queue;

static void q_push(queue *q, job *j) {
    pthread_mutex_lock(&q->mu);
    while (q->count == TQ) {
        pthread_mutex_unlock(&q->mu);
        sched_yield();
        pthread_mutex_lock(&q->mu);
    }
    q->q[(q->head + q->count++) % TQ] = j;
    pthread_cond_signal(&q->cv);
    pthread_mutex_unlock(&q->mu);
}

static job *q_pop(queue *q) {
    pthread_mutex_lock(&q->mu);
    while (q->count == 0 && !q->stop) pthread_cond_wait(&q->cv, &q->mu);
    job *j = NULL;
    if (q->count) {
        j = q->q[q->head];
        q->head = (q->head + 1) % TQ;
        q->count--;
    }
    pthread_mutex_unlock(&q->mu);
    return j;
}

static _Atomic uint64_t g_mem[NS][TW];
static _Atomic int g_torn;

static void *copier(void *arg) {
    queue *q = arg;
    job *j;
    while ((j = q_pop(q))) {
        for (int w = 0; w < TW; w++) {
            atomic_store_explicit(&g_mem[j->slot][w], j->tag ^ (uint64_t)w, memory_order_relaxed);
            if ((w & 7) == 7) sched_yield();
        }
        atomic_store_explicit(&j->done, 1, memory_order_release);
    }
    return NULL;
}

static void *computer(void *arg) {
    queue *q = arg;
    job *j;
    while ((j = q_pop(q))) {
        for (int rep = 0; rep < 3; rep++) {
            for (int w = 0; w < TW; w++)
                if (atomic_load_explicit(&g_mem[j->slot][w], memory_order_relaxed) != (j->tag ^ (uint64_t)w))
                    atomic_fetch_add(&g_torn, 1);
            sched_yield();
        }
        atomic_store_explicit(&j->done, 1, memory_order_release);
    }
    return NULL;
}

static void test_threads(int rounds) {
    g_rng = 12345;
    expert_cache *c = make(NL, NE, NS);
    queue cq = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};
    queue rq = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};
    pthread_t tc, tr;
    pthread_create(&tc, NULL, copier, &cq);
    pthread_create(&tr, NULL, computer, &rq);
    job *copies[NS] = {0};          /* in-flight copy per slot */
    job *reads[TQ];
    int n_reads = 0;
    uint64_t computed = 0;
    ec_swap sw[NS];
    for (int r = 0; r < rounds; r++) {
        /* Every 8th window the model thread waits for all copies and computations (as a merge
         * does); otherwise it only polls, so copies, reads and swaps overlap. */
        if (r % 8 == 7) {
            for (int32_t s = 0; s < NS; s++)
                while (copies[s] && !atomic_load_explicit(&copies[s]->done, memory_order_acquire)) sched_yield();
            for (int i = 0; i < n_reads; i++)
                while (!atomic_load_explicit(&reads[i]->done, memory_order_acquire)) sched_yield();
        }
        /* Completed copies become visible (acquire on done, then ec_loaded). */
        for (int32_t s = 0; s < NS; s++)
            if (copies[s] && atomic_load_explicit(&copies[s]->done, memory_order_acquire)) {
                free(copies[s]);
                copies[s] = NULL;
                ec_loaded(c, s);
            }
        /* Completed computations release their slot. */
        for (int i = 0; i < n_reads;) {
            if (atomic_load_explicit(&reads[i]->done, memory_order_acquire)) {
                ec_unpin(c, reads[i]->slot);
                free(reads[i]);
                reads[i] = reads[--n_reads];
            } else {
                i++;
            }
        }
        /* A window: route, compute the resident picks, admit the misses. */
        for (int k = 0; k < 6; k++) { /* the hot half of each layer flips every 200 windows */
            const int32_t l = (int32_t)rnd(NL), e = (int32_t)(r % 400 < 200 ? rnd(NE / 2) : NE / 2 + rnd(NE / 2));
            ec_note(c, l, e);
            const int32_t s = ec_lookup(c, l, e);
            if (s >= 0 && n_reads < TQ - 1) {
                job *j = calloc(1, sizeof *j);
                j->slot = s;
                j->tag = tag_of(l, e);
                ec_pin(c, s);
                reads[n_reads++] = j;
                q_push(&rq, j);
                computed++;
            } else if (s < 0) {
                int32_t a;
                if (ec_admit(c, l, e, &a)) {
                    job *j = calloc(1, sizeof *j);
                    j->slot = a;
                    j->tag = tag_of(l, e);
                    copies[a] = j;
                    q_push(&cq, j);
                }
            }
        }
        if (r % 4 == 3) {
            const int n = ec_plan_round(c, sw, NS);
            for (int i = 0; i < n; i++) {
                CHECK(copies[sw[i].slot] == NULL);
                job *j = calloc(1, sizeof *j);
                j->slot = sw[i].slot;
                j->tag = tag_of(sw[i].layer, sw[i].in_expert);
                copies[sw[i].slot] = j;
                q_push(&cq, j);
            }
        }
        validate(c, __LINE__);
    }
    /* Drain. */
    for (int i = 0; i < n_reads; i++) {
        while (!atomic_load_explicit(&reads[i]->done, memory_order_acquire)) sched_yield();
        ec_unpin(c, reads[i]->slot);
        free(reads[i]);
    }
    for (int32_t s = 0; s < NS; s++)
        if (copies[s]) {
            while (!atomic_load_explicit(&copies[s]->done, memory_order_acquire)) sched_yield();
            free(copies[s]);
        }
    pthread_mutex_lock(&cq.mu), cq.stop = 1, pthread_cond_broadcast(&cq.cv), pthread_mutex_unlock(&cq.mu);
    pthread_mutex_lock(&rq.mu), rq.stop = 1, pthread_cond_broadcast(&rq.cv), pthread_mutex_unlock(&rq.mu);
    pthread_join(tc, NULL);
    pthread_join(tr, NULL);
    CHECK(atomic_load(&g_torn) == 0);
    if (!(computed > 100 && ec_get_stats(c).swaps > 10))
        fprintf(stderr, "threads: computed %llu swaps %llu\n", (unsigned long long)computed,
                (unsigned long long)ec_get_stats(c).swaps);
    CHECK(computed > 100 && ec_get_stats(c).swaps > 10);
    ec_free(c);
}

/* ---------------------------------------------------------------- trace replay */

/* `test_expert_cache --replay N_LAYER N_EXPERT SLOTS INTERVAL [MAX_SWAPS] < trace.txt` drives the table the way
 * the scheduler does and prints "hits lookups": tests/test_cachesim.py compares it with the Python
 * hotness simulator. Input: one line per (window, layer): `window layer n_tokens k e[0] .. e[n*k-1]`.
 * Per line: note every pick, then admit the missing experts in order of first appearance; at the end
 * of a window the admitted copies complete, and every INTERVAL windows a round runs (its copies
 * complete before the next window). */
static int replay(int argc, char **argv) {
    if (argc != 6 && argc != 7) {
        fprintf(stderr, "usage: %s --replay N_LAYER N_EXPERT SLOTS INTERVAL [MAX_SWAPS] < trace\n", argv[0]);
        return 2;
    }
    ec_params p = ec_default_params();
    p.n_layer = atoi(argv[2]);
    p.n_expert = atoi(argv[3]);
    p.n_slots = atoi(argv[4]);
    if (argc == 7) p.max_swaps = atoi(argv[6]);
    const int interval = atoi(argv[5]);
    expert_cache *c = NULL;
    if (ec_create(&p, &c) != STRATA_OK || interval < 1) {
        fprintf(stderr, "replay: %s\n", strata_last_error());
        return 2;
    }
    int32_t *loading = malloc(sizeof(int32_t) * (size_t)(p.n_slots + 1));
    ec_swap *sw = malloc(sizeof(ec_swap) * (size_t)(p.n_slots + 1));
    int n_loading = 0, n_windows = 0, in_window = 0;
    long cur = -1, window, layer, n, k;
    for (;;) {
        const int end = scanf("%ld %ld %ld %ld", &window, &layer, &n, &k) != 4;
        if (in_window && (end || window != cur)) { /* the window ends: its copies completed */
            for (int i = 0; i < n_loading; i++) ec_loaded(c, loading[i]);
            n_loading = 0;
            in_window = 0;
            if (++n_windows % interval == 0) {
                const int m = ec_plan_round(c, sw, p.n_slots);
                for (int i = 0; i < m; i++) ec_loaded(c, sw[i].slot);
            }
        }
        if (end) break;
        cur = window;
        in_window = 1;
        int32_t *ids = malloc(sizeof(int32_t) * (size_t)(n * k + 1));
        for (long i = 0; i < n * k; i++) {
            long e = -1;
            if (scanf("%ld", &e) != 1) fprintf(stderr, "replay: a line is short of expert ids\n");
            ids[i] = (int32_t)e;
            ec_note(c, (int32_t)layer, (int32_t)e);
        }
        for (long i = 0; i < n * k; i++) {
            int seen = 0;
            for (long j = 0; j < i; j++) seen |= ids[j] == ids[i];
            int32_t s;
            if (!seen && ec_lookup(c, (int32_t)layer, ids[i]) < 0 && ec_admit(c, (int32_t)layer, ids[i], &s))
                loading[n_loading++] = s;
        }
        free(ids);
    }
    const ec_stats st = ec_get_stats(c);
    printf("%llu %llu\n", (unsigned long long)st.hits, (unsigned long long)st.lookups);
    free(loading);
    free(sw);
    ec_free(c);
    return 0;
}

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "--replay") == 0) return replay(argc, argv);
    test_params();
    test_admit_fills_free_slots_only();
    test_threshold();
    test_cap_and_order();
    test_decay();
    test_pairs_within_layer_and_skips_busy_slots();
    for (uint64_t seed = 1; seed <= 8; seed++) test_stress(seed * 0x2545F4914F6CDD1Dull, 3000);
    test_threads(4000);
    if (g_failed) {
        fprintf(stderr, "test_expert_cache: %d checks failed\n", g_failed);
        return 1;
    }
    printf("test_expert_cache: all checks passed\n");
    return 0;
}
