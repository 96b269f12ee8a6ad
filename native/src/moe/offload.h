/*
 * offload.h — the MoE offload engine of seed 000 (DESIGN §4): per model, an expert device
 * (sim or cuda), an ExpertCache of device slots plus a few staging slots, the split of missing
 * experts between the link (pcie_frac) and the CPU ExpertPool, tail skip, and counters.
 *
 * Threading: every call comes from a thread running an eval on one of the model's sessions;
 * `mu` serialises them (one MoE layer of one session at a time uses the device and the cache).
 * Loads: a copy into a cache slot (admit, or a swap of an adjustment round) is remembered as
 * (slot, seq); the slot is published (ec_loaded) only once the device reports done ≥ seq.
 * Slot reuse: every copy into a slot (staging, borrowed, admitted or swapped) names the last
 * computation that reads the slot (slot_use) and the device starts it only after that one finished;
 * every computation on a copied slot names its copy. Resident slots read by a layer are pinned until
 * off_finish, so borrowing or a swap never takes a slot a queued computation still reads.
 */
#ifndef STRATA_MOE_OFFLOAD_H
#define STRATA_MOE_OFFLOAD_H

#include <pthread.h>
#include <stdint.h>

#include "moe/device.h"
#include "moe/expert_cache.h"

typedef struct {
    int32_t slot;
    uint64_t seq;
} off_load;

typedef struct mdl_offload {
    pthread_mutex_t mu;
    mdev *dev;
    expert_cache *ec;
    int32_t n_cache_slots, n_staging, next_staging;
    mdev_expert_shape *shape;      /* per layer */
    size_t slot_bytes;
    float pcie_frac;
    int32_t tail_skip;             /* K > 0: skip rule on; 0: off */
    const char *tail_skip_why;
    int32_t adjust_interval;       /* windows between adjustment rounds */
    uint64_t windows;              /* MoE calls of layer 0 (verify windows / prefill chunks) */
    off_load *pending;
    int32_t n_pending, cap_pending;
    double probe_gbps;
    int32_t stream_min;            /* prefill chunks of at least this many tokens stream every missing group */
    uint64_t *slot_use;            /* per device slot: the last computation that reads it */
    int32_t *borrowed, n_borrowed; /* cache slots lent to this chunk's staging ring */
    int32_t *pinned, n_pinned;     /* resident slots read by this layer */
    uint64_t borrow_total, stream_chunks;
    const char *pack;              /* expert pack mapping (NULL: copy the three pieces from the GGUF) */
    uint64_t pack_size;
    uint64_t *pack_layer_off;      /* per layer: offset of blob (layer, 0) in the pack */
    char log[640];
    /* counters */
    uint64_t hits, lookups, swaps, admits, pcie_groups, pcie_bytes, cpu_groups, cpu_bytes, skipped;
    double cpu_s;
} mdl_offload;

/* What runs a layer's expert group. */
enum { OFF_NONE = 0, OFF_CPU = 1, OFF_DEVICE = 2, OFF_ADMIT = 3, OFF_STAGE = 4, OFF_SKIP = 5 };

struct strata_model;
/* Sets m->off when the model's params ask for an offload path (device sim/cuda, or tail skip). */
strata_status off_create(struct strata_model *m);
void off_free(struct strata_model *m);
/* Locks the engine and classifies every active expert e (count: prefix sums of rows per expert,
 * min_rank[e]: the best rank any token gave e) into kind[e] / slot[e]. */
void off_begin(struct strata_model *m, int il, int64_t L, int64_t Ne, const int64_t *count, const int32_t *min_rank,
               int8_t *kind, int32_t *slot);
/* Queues copies and the device computation of the DEVICE / ADMIT / STAGE groups; rows of xg in,
 * rows of out filled by the device when done >= *seq (0: nothing queued). */
strata_status off_submit(struct strata_model *m, int il, int64_t Ne, const int64_t *count, const int8_t *kind,
                         const int32_t *slot, const float *xg, float *out, uint64_t *seq);
/* Waits for *seq, adds the CPU pool's share to the counters, runs an adjustment round when due,
 * unlocks. */
strata_status off_finish(struct strata_model *m, int il, uint64_t seq, double cpu_s, uint64_t cpu_groups,
                         uint64_t cpu_bytes);
uint64_t off_blob_bytes(const struct strata_model *m, int il);
/* The cache's hit and lookup counters (0s without an engine), under the lock (for traces). */
void off_counts(const struct strata_model *m, uint64_t *hits, uint64_t *lookups);

#endif
