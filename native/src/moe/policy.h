/*
 * policy.h — replacement policies for the expert tiers (issue 20 point 3): which (layer, expert)
 * keeps a slot of a tier of n_slots slots shared by all layers, and which one leaves when a
 * missing expert needs a slot. The table and the decision only; the bytes are the tier's.
 * pyrunner/cachesim.py replays traces through this same code (strata_policy_replay in api.c).
 *
 * Layout (all sized at xpol_create; no call allocates)
 *   where[layer * n_expert + expert] -> slot, or -1        (a key is in at most one slot)
 *   skey [slot]  -> key, or -1 (free);  pins[slot] >= 0
 *   per-key state of every key, resident or not (counts, decayed sums, last line): a non-resident
 *   key's history is kept, so frequency policies remember what they evicted (a ghost).
 *   victims: one binary min-heap per layer of its unpinned resident slots ordered by the policy's
 *   score (lru, lfu, lfru, frecency), or one LRU list per layer (layer-lru, least-stale).
 *
 * Call protocol, per MoE layer line (one layer of one window), from one thread:
 *   xpol_window() when a window begins;
 *   xpol_lookup() for the line's picks (no side effects);
 *   xpol_access() once for every expert the line reads, hits and misses alike;
 *   xpol_insert() for each missing expert that is to be read into the tier; the key is resident
 *   (lookup returns its slot) from the return on — a demand-filled tier reads it before the layer
 *   computes. xpol_pin/unpin bracket a computation reading a slot: a pinned slot is never a victim.
 * A policy's decision depends only on the calls made so far (every policy here is online).
 *
 * Policies (xpol_names(); the default first):
 *   frecency     the default: recency-weighted frequency (LRFU) whose half-life adapts. Each key
 *                keeps four decayed pick sums (half-lives 0.25, 8, 24 and 96 windows: from LRU to
 *                near-LFU); four shadow caches of keys only, one per half-life, replay the same
 *                calls and count the picks they would have hit; every 16 windows the table follows
 *                the shadow with the most hits (counts halved per choice; the 8-window one until
 *                the first choice), evicting the lowest sum of that half-life, each valued at its
 *                layer's last visit (at a line of layer l, a later layer's keys have not had this
 *                window's chance yet: least-stale's rule, in the decayed sums). A missing key whose
 *                sum is not above the victim's is not kept (bypass: admission by frequency; evicted
 *                keys keep their sums, as ghosts).
 *   lru          the least recently accessed key (ties: lower key).
 *   lfu          the fewest picks since creation (ties: least recent line, then lower key).
 *   lfru         recency-weighted frequency: picks decayed by 2^(-1/H) per window (H = 64), the
 *                lowest evicted; no bypass.
 *   layer-lru    layer-aware LRU: each layer owns n_slots / n_layer slots (the remainder to the
 *                first layers) and evicts its own least recent key.
 *   least-stale  staleness in missed layer visits: at a line of layer l in window t, a key of
 *                layer l' last read in window w has missed t - w - 1 + [l' <= l] chances to be
 *                read; the most-missed goes, ties: the key whose layer comes back last.
 *
 * Measured (strata cache-sim TRACE --compare; hit rate at 25 / 50 / 75 % of n_layer x n_expert slots):
 *   flash-small, 8 sampled code continuations (4 x 32, top-4, 3584 windows):
 *     frecency 0.708 / 0.927 / 0.992, lfru 0.690 / 0.925 / 0.992, lru 0.592 / 0.902 / 0.991,
 *     hotness 0.520 / 0.914 / 0.990, belady 0.817 / 0.964 / 0.996;
 *   tools/make_routing_trace.py (48 x 512, top-10, 3000 windows):
 *     frecency 0.5250 / 0.6949 / 0.8034, lru 0.5132 / 0.6932 / 0.8032, layer-lru 0.5180 / 0.6947 /
 *     0.8040, lfru 0.340 / 0.587 / 0.786, belady 0.745 / 0.860 / 0.931.
 * frecency is the best online policy measured at every point but one (synthetic 75 %: layer-lru by
 * 0.0006) and above LRU at all six, hence the default.
 */
#ifndef STRATA_MOE_POLICY_H
#define STRATA_MOE_POLICY_H

#include <stddef.h>
#include <stdint.h>

#include "strata.h"

typedef struct xpol xpol;

/* name: one of xpol_names(); n_slots >= 0 slots shared by all layers (keys are (layer, expert)); slots
 * beyond n_layer x n_expert are never handed out. Memory: O(n_layer x n_expert + n_slots). Fails with STRATA_ERR_INVALID_ARG (an unknown name: the message lists the accepted ones) or
 * STRATA_ERR_NOMEM. */
strata_status xpol_create(const char *name, int32_t n_layer, int32_t n_expert, int32_t n_slots, xpol **out);
void xpol_free(xpol *p);
const char *xpol_name(const xpol *p);
const char *xpol_names(void);          /* "frecency,lru,..." the accepted names, the default first */
const char *xpol_default(void);        /* the engine's default: the best measured online policy */
void xpol_window(xpol *p);             /* a window (decode verify window or prefill chunk) begins */
int32_t xpol_lookup(const xpol *p, int32_t layer, int32_t expert);   /* slot or -1; no side effects */
/* Every expert one MoE layer line reads, once each, with the number of routed picks (tokens) it had
   and, when known, its best rank among them (0 = top; < 0 unknown); called for hits and misses alike,
   after the lookups and before the inserts of the line. */
void xpol_access(xpol *p, int32_t layer, int32_t expert, int32_t n_picks, int32_t best_rank);
/* A slot for a missing (layer, expert): a free one, else the policy's victim among unpinned slots
   (*ev_layer, *ev_expert get the evicted key, -1 when none); returns -1 when the policy declines to
   keep it (bypass) or every slot is pinned. The key is resident from the return on. */
int32_t xpol_insert(xpol *p, int32_t layer, int32_t expert, int32_t *ev_layer, int32_t *ev_expert);
void xpol_pin(xpol *p, int32_t slot);  /* counts; a pinned slot is never a victim */
void xpol_unpin(xpol *p, int32_t slot);
int xpol_validate(const xpol *p, char *why, size_t n);  /* invariants: no key twice, maps agree */

/* Resident keys and slot contents, for tests and reports. */
int32_t xpol_n_resident(const xpol *p);
/* What a slot holds: its key's layer/expert (-1/-1 when free) and pins; returns 0, -1 out of range. */
int xpol_slot_info(const xpol *p, int32_t slot, int32_t *layer, int32_t *expert, int32_t *pins);

#endif
