/*
 * device.h — the expert device seen by the MoE scheduler: slots of device memory that hold expert
 * blobs, an ordered queue of copies into slots and of expert computations that read them.
 *
 * Implementations: `sim` (device_sim.c: host memory, one device thread, a copy engine limited to
 * a configured GB/s — every scheduling path runs without a GPU) and `cuda` (when built with CUDA and
 * a GPU is present: device_sim.c's engine threads, queues and event log, with the work done on the
 * GPU by device_cuda.cu — slots in device memory, a copy and a compute stream; device_cuda.h). The `cpu` device is no device at all: the scheduler then
 * runs every expert on the ExpertPool.
 *
 * Ordering protocol (one submitting thread: the model thread). The device has two engines, as a
 * GPU has a copy stream and a compute stream:
 *   - every copy gets the next copy sequence number, every computation the next compute sequence
 *     number; each engine completes its operations in submission order and publishes the last
 *     completed number (copies_done / computes_done) with a release store after the operation's
 *     effects (slot bytes, output rows) are in place;
 *   - a computation names the copy it needs (`after_copy`: it starts once copies_done ≥ it), a
 *     copy names the computation that must be finished before its slot is overwritten
 *     (`after_compute`: the last computation that reads the slot) — the "copied" and "used"
 *     events of DESIGN §4's staging ring;
 *   - the submitter reads the counters with acquire loads (mdev_*_done) or blocks in
 *     mdev_wait_*; only then may it read a computation's outputs or publish a copied slot.
 * A blob is [gate rows | up rows | down rows] of one (layer, expert), still quantized; `gate` holds
 * the 2·Fe fused rows when the file has ffn_gate_up_exps (then up_bytes = 0).
 */
#ifndef STRATA_DEVICE_DEVICE_H
#define STRATA_DEVICE_DEVICE_H

#include <stddef.h>
#include <stdint.h>

#include "strata.h"
#include "quant/quant.h"

typedef struct mdev mdev;

typedef enum { MDEV_CPU = 0, MDEV_SIM = 1, MDEV_CUDA = 2 } mdev_kind;

/* The shape of an expert of one layer: types, widths and where each matrix sits in a blob. */
typedef struct {
    const strata_qtraits *tg, *tu, *td;   /* gate (or fused gate_up), up (NULL if fused), down */
    int64_t E, Fe;                        /* hidden, expert width */
    int fused;
    size_t gate_bytes, up_bytes, down_bytes;
} mdev_expert_shape;

/* One expert computation: n token rows x -> out[n x E] = down(silu(gate x · sg) ⊙ (up x · su)), not yet
 * multiplied by the down scale or the routing weights (the merge does that). x and out are host memory, or
 * with dev_io the device's own (the dense forward's buffers on the same GPU, or host memory for sim): then
 * no row crosses the link. */
typedef struct {
    const mdev_expert_shape *shape;
    int32_t slot;
    float sg, su;                         /* .scale of gate / up for this expert (1 if none) */
    const float *x;
    int64_t n;
    float *out;
    int dev_io;
} mdev_group;

typedef struct {
    int kind;                  /* mdev_kind */
    int32_t n_slots;           /* cache + staging slots */
    size_t slot_bytes;         /* the largest blob */
    double link_gbps;          /* sim: copy-engine bandwidth */
    int isa;                   /* kernels the sim device computes with (same numbers as the CPU) */
} mdev_params;

strata_status mdev_create(const mdev_params *p, mdev **out);
void mdev_free(mdev *d);
/* Queue a copy of a blob (up to three pieces: its matrices) into slot, to start once computation
 * after_compute (0: none) finished; *seq = its copy number. */
strata_status mdev_copy(mdev *d, int32_t slot, const void *const src[3], const size_t bytes[3],
                        uint64_t after_compute, uint64_t *seq);
/* Queue computations (groups are copied; x and out must stay valid until done), to start once copy
 * after_copy (0: none) completed; *seq = its compute number. */
strata_status mdev_compute(mdev *d, const mdev_group *groups, int n, uint64_t after_copy, uint64_t *seq);
uint64_t mdev_copies_done(mdev *d);
uint64_t mdev_computes_done(mdev *d);
/* Block until the number completed; return 0, or 1 when the calling thread's request watchdog
 * (util/trace.h) expired first (the operation is still queued: mdev_cancel before freeing what it
 * reads or writes). */
int mdev_wait_copy(mdev *d, uint64_t seq);
int mdev_wait_compute(mdev *d, uint64_t seq);
/* Drops every queued operation unrun (their numbers complete; slots and outputs are not written),
 * cuts a copy's link pacing short, and returns once neither engine runs anything. Returns the last
 * copy number whose bytes really landed (copies complete in order). For the watchdog's abort. */
uint64_t mdev_cancel(mdev *d);
/* Timed host -> device copy of `bytes`, best of reps, in GB/s (the link probe). */
double mdev_probe(mdev *d, size_t bytes, int reps);
/* Totals since creation: bytes copied into slots, bytes of the computations' rows (x up and out down, which
 * cross the link too), seconds the copy engine was busy, seconds computing. */
void mdev_counters(mdev *d, uint64_t *copy_bytes, uint64_t *act_bytes, double *copy_s, double *compute_s);
const char *mdev_name(const mdev *d);

/* Event log (tests and traces): every operation's engine, slot, number, dependency and its start and
 * end times (seconds, CLOCK_MONOTONIC). Off by default; mdev_events copies out up to cap events in
 * completion order per engine and returns how many were recorded. */
typedef struct {
    int32_t engine;        /* 0 copy, 1 compute */
    int32_t slot;          /* copy: its slot; compute: the first group's slot */
    uint64_t seq, after;   /* its number, the other engine's number it waited for */
    int32_t n_slots;       /* compute: slots read (up to 8 listed) */
    int32_t slots[8];
    double t0, t1;
} mdev_event;
void mdev_events_enable(mdev *d, int on);
int64_t mdev_events(mdev *d, mdev_event *out, int64_t cap);

/* The expert FFN on the CPU, shared by the sim device and tests: the same calls and rounding as
 * the ExpertPool path in model/moe.c. */
strata_status mdev_expert_ffn(const mdev_expert_shape *s, const char *blob, float sg, float su, int isa,
                              const float *x, int64_t n, float *out);

#endif
