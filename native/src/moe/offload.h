/*
 * offload.h — the MoE offload engine of seed 000 (DESIGN §4): an expert device (sim or cuda), an
 * ExpertCache of device slots plus a few staging slots, the split of missing experts between the
 * link (pcie_frac) and the CPU ExpertPool, tail skip, and counters.
 *
 * Dependencies point one way: the engine sees the device (device/device.h), the cache
 * (moe/expert_cache.h) and util; never the model. The model (model/load.c) describes each layer's
 * routed experts with an off_layer_desc — shapes, types, where expert e's bytes are, its scales, the
 * file identity of its tensors — and hands them to off_create; model/moe.c drives one layer step
 * with a plan: off_begin → off_submit → (CPU pool work) → off_finish.
 *
 * Threading and the lock: every call comes from a thread running an eval on one of the model's
 * sessions. off_begin takes the engine's mutex and returns the plan, which holds the lock until
 * off_finish (always called once per off_begin, on error paths too) releases it: one MoE layer of
 * one session at a time uses the device and the cache. The plan's arrays (kind, slot, min_rank, the
 * staging ring, the pinned and borrowed slots) are allocated once at off_create, sized from the
 * model (n_expert) and the settings (slots), and reused by every plan: no allocation per step.
 * The stats / log / resident / set_pcie_frac / events calls take the same mutex.
 * Loads: a copy into a cache slot (admit, or a swap of an adjustment round) is remembered as
 * (slot, seq); the slot is published (ec_loaded) only once the device reports done ≥ seq.
 * Slot reuse: every copy into a slot (staging, borrowed, admitted or swapped) names the last
 * computation that reads the slot (slot_use) and the device starts it only after that one finished;
 * every computation on a copied slot names its copy. Resident slots read by a layer are pinned until
 * off_finish, so borrowing or a swap never takes a slot a queued computation still reads.
 */
#ifndef STRATA_MOE_OFFLOAD_H
#define STRATA_MOE_OFFLOAD_H

#include <stdint.h>
#include <stdio.h>

#include "strata.h"
#include "device/device.h"

/* Where an expert tensor sits in the model file: (offset, size, ggml type). The expert pack records
 * a hash of every one of them (pyrunner/expert_pack.py), so a pack built for another file is refused. */
typedef struct {
    uint64_t offset, size;
    int32_t type;
} off_tensor_id;

/* One layer's routed experts, as the model holds them. Expert e's gate (or fused gate_up) matrix
 * is gate + e * gate_stride, likewise up (NULL when fused) and down. Scales: NULL = 1, n == 1 =
 * one for every expert, else one per expert (NVFP4 `.scale`). Pointers stay valid until off_free. */
typedef struct off_layer_desc {
    mdev_expert_shape shape;            /* types, widths, bytes of one expert's matrices */
    const char *gate, *up, *down;
    size_t gate_stride, up_stride, down_stride;
    const float *gate_scale, *up_scale;
    int64_t n_gate_scale, n_up_scale;
    off_tensor_id ident[3];             /* gate (or gate_up), [up,] down: n_ident of them */
    int32_t n_ident;
} off_layer_desc;

/* The engine's settings (the model params' offload fields, resolved by the model). */
typedef struct off_params {
    int32_t device;            /* strata_device: SIM or CUDA give a device; CPU: tail skip only */
    int32_t n_layer, n_expert, n_expert_used;
    uint64_t cache_bytes;      /* device memory for resident experts */
    float pcie_frac;           /* < 0: 0.55 x probe / 20, clamped to [0, 1] */
    float sim_link_gbps;       /* <= 0: 16 */
    int32_t tail_skip;         /* < 0: auto (DESIGN §4), 0: off, K > 0: rank K */
    int32_t n_staging;         /* <= 0: 4 */
    int32_t adjust_interval;   /* <= 0: 32 windows */
    int32_t stream_min;        /* <= 0: 1024 tokens */
    int32_t max_swaps;         /* swaps per adjustment round; <= 0: the cache's default (96) */
    int32_t isa;               /* STRATA_ISA_IDX_*: kernels the sim device computes with */
    const char *expert_pack;   /* NULL or "": copy the pieces from the descriptors' sources */
    int32_t split;             /* strata_split */
    int32_t no_swaps;          /* 1: no adjustment rounds: the cache fills by admission only (the expert
                                  store's direct reads: a swap's copy, landing later, would read a RAM
                                  slot the store may reuse first) */
    int32_t sync_swaps;        /* 1: publishing waits for every queued copy (strata_model_params.sync_swaps) */
} off_params;

typedef struct off_engine off_engine;

/* What runs a layer's expert group. */
enum { OFF_NONE = 0, OFF_CPU = 1, OFF_DEVICE = 2, OFF_ADMIT = 3, OFF_STAGE = 4, OFF_SKIP = 5 };

/* One layer step, between off_begin and off_finish (it holds the engine's lock). The caller reads
 * kind[e] for every expert e (OFF_CPU: the pool runs it; OFF_SKIP: it adds nothing; the others run
 * on the device). Owned by the engine. */
typedef struct off_plan {
    off_engine *o;
    int32_t il;
    int64_t L, n_expert;
    const int64_t *count;      /* prefix sums of rows per expert (the caller's, valid until finish) */
    int8_t *kind;              /* [n_expert] OFF_* */
    int32_t *slot;             /* [n_expert] device slot of the DEVICE / ADMIT / STAGE groups */
    uint64_t seq;              /* the last device computation queued (0: none) */
    const char *const *src;    /* NULL, or the caller's [n_expert * 3] sources of the ADMIT / STAGE groups'
                                  copies (gate or gate_up, up or NULL, down): the expert store's RAM
                                  slots, valid until off_finish returns (it waits for the device) */
} off_plan;

/* Descriptors of n_layer layers (copied). Fails with NO_DEVICE (cuda without a GPU), UNSUPPORTED,
 * FORMAT (expert pack), INVALID_ARG or NOMEM; *out is then NULL. */
strata_status off_create(const off_params *p, const off_layer_desc *layers, off_engine **out);
void off_free(off_engine *o);
/* Locks the engine and classifies every active expert of layer il: count[e]..count[e+1] are its
 * rows, pick[t * K + k] the experts token t routed to in rank order (K = n_expert_used). */
off_plan *off_begin(off_engine *o, int il, int64_t L, const int64_t *count, const int32_t *pick);
/* Queues copies and the device computation of the DEVICE / ADMIT / STAGE groups; rows of xg in,
 * rows of out filled by the device before off_finish returns. dev_io: xg and out are the device's memory
 * (mdev_group.dev_io). */
strata_status off_submit(off_plan *p, const float *xg, float *out, int dev_io);
/* Waits for the device, adds the CPU pool's share to the counters, runs an adjustment round when
 * due, unlocks. The plan is gone afterwards. */
strata_status off_finish(off_plan *p, double cpu_s, uint64_t cpu_groups, uint64_t cpu_bytes);

/* The cache's per-pick hit and lookup counters (0s without a cache), under the lock (traces). */
void off_counts(off_engine *o, uint64_t *hits, uint64_t *lookups);
/* Every counter and setting since creation (strata_offload_stats, except `device`). */
void off_get_stats(off_engine *o, strata_offload_stats *out);
/* From now on (clamped: 0 without a device); with the ONLINE split every layer's share starts from it. */
void off_set_pcie_frac(off_engine *o, float pcie_frac);

/* The ONLINE split (strata.h strata_split) of one layer: a centre share f and a probe around it. Windows
 * alternate between f + 0.05 and f - 0.05; after 4 of each, the side whose mean time was lower by more than
 * 3 % moves the centre 0.05 its way (else it stays). Held to [0.02, 0.98]. The time is the layer's expert
 * stage as measured (the CPU pool's share, then the merge's wait for the device's), so the split follows
 * whatever makes a path cost what it does: the layer's expert type, the link, a device sharing the cores. */
typedef struct off_split_state {
    float f;
    int32_t n_plus, n_minus;
    double t_plus, t_minus;
} off_split_state;
/* The share the layer's next window uses. */
float off_split_use(const off_split_state *s);
/* That window took t seconds; returns 1 when the centre moved. Pure, for tests. */
int off_split_step(off_split_state *s, double t);
/* One line on how the engine was set up; valid until off_free. */
const char *off_log(const off_engine *o);
/* READY cache slots per layer (per_layer[0..n) zeroed first). */
void off_resident(off_engine *o, int32_t *per_layer, int32_t n);
/* 1 when the engine has a device (sim or cuda). */
int off_has_device(const off_engine *o);
/* The device's event log: path NULL clears and starts recording; a path writes the recorded
 * operations as JSON lines and stops (the format strata.h documents for the device-events call). */
strata_status off_device_events(off_engine *o, const char *path);

#endif
