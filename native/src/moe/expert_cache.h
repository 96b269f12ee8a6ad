/*
 * expert_cache.h — the ExpertCache: which (layer, expert) lives in which device slot, and the
 * hotness policy that decides what to swap (DESIGN §4, seed 000). The table only; the copies
 * are the scheduler's (device.h), the slot memory is the device's.
 *
 * Layout
 *   where[layer * n_expert + expert] -> slot, or -1          (an expert is in at most one slot)
 *   heat [layer * n_expert + expert]  float, every expert, resident or not
 *   slot[s] = { layer, expert, state, pins }
 *
 *   slot states      FREE ──admit──▶ LOADING ──ec_loaded──▶ READY ──plan_round (victim)──▶ LOADING
 *                      ▲                │                      │
 *                      │             ec_abort               ec_borrow (prefill staging)
 *                      └──ec_return── BORROWED ◀───────────────┘  (also FREE ──ec_borrow──▶ BORROWED)
 *
 *   FREE      no expert; only ec_admit and ec_borrow hand it out.
 *   LOADING   owned by one in-flight copy of `expert` into the slot; `where` already points here
 *             (so the expert is not admitted or swapped in twice) but ec_lookup returns -1.
 *   READY     the copy completed; ec_lookup returns the slot.
 *   BORROWED  lent to prefill staging; no expert; invisible; nothing else hands it out.
 *
 * Thread rules and ordering
 *   - Every call comes from one thread, the model thread (the table has no locks). Device and
 *     ExpertPool threads never call in; they only read slot memory the model thread told them to.
 *   - ec_loaded(slot) is called by the model thread after it *observed* that the copy into the
 *     slot completed (the device's done counter / event, acquire). Only then does lookup return
 *     the slot, so no computation is ever issued on bytes still being written.
 *   - A computation that reads a slot is bracketed by ec_pin (when it is issued) and ec_unpin
 *     (when the model thread observed its completion). A pinned slot is never chosen as a swap
 *     victim nor borrowed, so it is never overwritten while it is read. Pins count: several
 *     computations may read one slot. (A scheduler that instead relies on the device's in-order
 *     queue — a copy submitted after a compute completes after it — may skip pinning; the table
 *     then only guarantees the visibility half.)
 *   - ec_plan_round makes each victim invisible at once (lookup returns -1 for it from the
 *     return on) and puts its slot in LOADING for the incoming expert; the caller copies and
 *     calls ec_loaded, or ec_abort if the copy could not be issued.
 * Invariants (ec_validate checks them all; debug and sanitizer builds assert them as they go):
 *   no expert resident twice; where[] and slot[].{layer,expert} agree; a LOADING, BORROWED or
 *   pinned slot is never handed out; lookup never returns a slot that is not READY; FREE and
 *   BORROWED slots are unpinned and hold no expert.
 *
 * Hotness policy: every routed pick adds 1 to its expert's heat (ec_note). An adjustment round
 * (ec_plan_round, the scheduler decides how often) pairs, within each layer, the non-resident
 * experts by heat descending with the READY unpinned resident ones by heat ascending, keeps the
 * pairs whose difference is ≥ min_diff (1.5), sorts all layers' pairs by difference descending
 * (ties: layer, then incoming expert, ascending), executes at most max_swaps (96), and then
 * multiplies every heat by decay (0.7). pyrunner/cachesim.py replays the same rule on traces.
 */
#ifndef STRATA_MOE_EXPERT_CACHE_H
#define STRATA_MOE_EXPERT_CACHE_H

#include <stddef.h>
#include <stdint.h>

#include "strata.h"

typedef struct ec_params {
    int32_t n_layer, n_expert, n_slots; /* n_slots = budget / slot size (0 = no cache) */
    int32_t max_swaps;                  /* swaps per adjustment round (96) */
    float min_diff, decay;              /* heat difference to swap (1.5, > 0); heat factor per round (0.7) */
} ec_params;

/* n_layer = n_expert = n_slots = 0; max_swaps 96, min_diff 1.5, decay 0.7. */
ec_params ec_default_params(void);

typedef struct expert_cache expert_cache;

/* Counters since creation; the scheduler reads them (differences per request). */
typedef struct ec_stats {
    uint64_t hits;     /* ec_note calls whose expert was READY at the time */
    uint64_t lookups;  /* ec_note calls (routed picks) */
    uint64_t swaps;    /* swaps planned by ec_plan_round */
    uint64_t admits;   /* successful ec_admit calls */
} ec_stats;

typedef enum { EC_FREE = 0, EC_LOADING = 1, EC_READY = 2, EC_BORROWED = 3 } ec_slot_state;

/* Fails with STRATA_ERR_INVALID_ARG (message names the field) or STRATA_ERR_NOMEM. */
strata_status ec_create(const ec_params *p, expert_cache **out);
void ec_free(expert_cache *c);

/* The READY slot holding (layer, expert), or -1 (not resident, still loading, or out of range). */
int32_t ec_lookup(const expert_cache *c, int32_t layer, int32_t expert);

/* One routed pick of (layer, expert): heat += 1; counts a lookup, and a hit if it is READY now.
 * Call it once per (token, pick) when routing, before the window's admits and swaps. */
void ec_note(expert_cache *c, int32_t layer, int32_t expert);

/* Takes a FREE slot for (layer, expert): returns 1 with *slot set (state LOADING: the caller
 * copies, then ec_loaded), or 0 when no slot is free or the expert already has a slot. */
int ec_admit(expert_cache *c, int32_t layer, int32_t expert, int32_t *slot);

/* The copy into a LOADING slot completed (observed by the model thread): READY, visible. */
void ec_loaded(expert_cache *c, int32_t slot);

/* The copy into a LOADING slot was not done (error): the slot returns to FREE, the expert to
 * not resident. */
void ec_abort(expert_cache *c, int32_t slot);

/* A computation reads the slot (READY or LOADING after its copy was observed) / finished.
 * A pinned slot is never chosen as a victim, borrowed or overwritten. */
void ec_pin(expert_cache *c, int32_t slot);
void ec_unpin(expert_cache *c, int32_t slot);

typedef struct {
    int32_t layer, in_expert, out_expert, slot;
} ec_swap;

/* One adjustment round (the policy above). Writes at most min(cap, max_swaps) swaps to out,
 * each slot already LOADING for in_expert and out_expert already invisible; then decays every
 * heat. Returns the number of swaps. */
int ec_plan_round(expert_cache *c, ec_swap *out, int cap);

/* Prefill staging: takes a FREE slot, or else evicts the coldest READY unpinned expert (its
 * slot; ties: lowest layer, expert), and marks it BORROWED. Returns 1 with *slot set, or 0. */
int ec_borrow(expert_cache *c, int32_t *slot);
/* Gives a BORROWED slot back: FREE, to be refilled by ec_admit. */
void ec_return(expert_cache *c, int32_t slot);

ec_stats ec_get_stats(const expert_cache *c);
int32_t ec_n_slots(const expert_cache *c);
/* Heat of (layer, expert) (0 when out of range). */
float ec_heat(const expert_cache *c, int32_t layer, int32_t expert);
/* What a slot holds: state (ec_slot_state), and layer/expert/pins (-1/-1/0 when none). Any out
 * pointer may be NULL. Returns the state, or -1 for an out-of-range slot. */
int ec_slot_info(const expert_cache *c, int32_t slot, int32_t *layer, int32_t *expert, int32_t *pins);

/* Checks every invariant; returns 0, or 1 with a description in why (if not NULL). O(table). */
int ec_validate(const expert_cache *c, char *why, size_t why_size);

#endif
