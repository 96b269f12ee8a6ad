/*
 * policy.h — replacement policies of the expert tiers (issue 20 point 3). Keys are (layer, expert);
 * slots are shared by all layers. A demand-filled tier: the caller looks every expert of a layer line
 * up, reports the accesses, then inserts the misses (resident at once).
 */
#ifndef STRATA_MOE_POLICY_H
#define STRATA_MOE_POLICY_H

#include <stddef.h>
#include <stdint.h>

#include "strata.h"

typedef struct xpol xpol;
/* name: one of xpol_names(); n_slots >= 0 slots shared by all layers (keys are (layer, expert)). */
strata_status xpol_create(const char *name, int32_t n_layer, int32_t n_expert, int32_t n_slots, xpol **out);
void xpol_free(xpol *p);
const char *xpol_name(const xpol *p);
const char *xpol_names(void);          /* the accepted names, the default first */
const char *xpol_default(void);        /* the engine's default */
void xpol_window(xpol *p);             /* a window (decode verify window or prefill chunk) begins */
int32_t xpol_lookup(const xpol *p, int32_t layer, int32_t expert);   /* slot or -1; no side effects */
/* Every expert one MoE layer line reads, once each, with its routed picks and best rank (0 = top);
   hits and misses alike, after the lookups and before the inserts of the line. */
void xpol_access(xpol *p, int32_t layer, int32_t expert, int32_t n_picks, int32_t best_rank);
/* A slot for a missing (layer, expert): a free one, else the policy's victim among unpinned slots
   (*ev_layer / *ev_expert get the evicted key, -1 when none); -1 when the policy declines to keep it
   (bypass) or every slot is pinned. The key is resident from the return on. */
int32_t xpol_insert(xpol *p, int32_t layer, int32_t expert, int32_t *ev_layer, int32_t *ev_expert);
void xpol_pin(xpol *p, int32_t slot);  /* counts; a pinned slot is never a victim */
void xpol_unpin(xpol *p, int32_t slot);
int xpol_validate(const xpol *p, char *why, size_t n);

#endif
