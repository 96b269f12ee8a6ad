/*
 * device.h — the expert device seen by the MoE scheduler: slots of device memory that hold expert
 * blobs, an ordered queue of copies into slots and of expert computations that read them.
 *
 * Implementations: `sim` (device_sim.c: host memory, one device thread, a copy engine limited to
 * a configured GB/s — every scheduling path runs without a GPU) and `cuda` (device_cuda.cu, when
 * built with CUDA and a GPU is present). The `cpu` device is no device at all: the scheduler then
 * runs every expert on the ExpertPool.
 *
 * Ordering protocol (one submitting thread: the model thread):
 *   - every submit (copy or compute) gets the next sequence number; operations complete in
 *     submission order; `done` is the last completed sequence number, written by the device thread
 *     with a release store after the operation's effects (slot bytes, output rows) are in place;
 *   - the submitter reads `done` with an acquire load (dev_done) or blocks in dev_wait(seq) until
 *     done ≥ seq; only then may it read a compute's outputs or treat a copy's slot as loaded;
 *   - a slot may be overwritten by a copy only when no submitted computation that reads it is still
 *     pending: the scheduler keeps, per slot, the sequence number of its last reader and checks it
 *     (or relies on in-order completion: a copy submitted after a compute completes after it).
 * A blob is [gate rows | up rows | down rows] of one (layer, expert), still quantized; `gate` holds
 * the 2·Fe fused rows when the file has ffn_gate_up_exps (then up_bytes = 0).
 */
#ifndef STRATA_MOE_DEVICE_H
#define STRATA_MOE_DEVICE_H

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

/* One expert computation: n token rows x (host) -> out[n x E] = down(silu(gate x · sg) ⊙ (up x · su)),
 * not yet multiplied by the down scale or the routing weights (the merge does that). */
typedef struct {
    const mdev_expert_shape *shape;
    int32_t slot;
    float sg, su;                         /* .scale of gate / up for this expert (1 if none) */
    const float *x;
    int64_t n;
    float *out;
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
/* Queue a copy of `bytes` (in up to three pieces: the blob's matrices) into slot. */
strata_status mdev_copy(mdev *d, int32_t slot, const void *const src[3], const size_t bytes[3], uint64_t *seq);
/* Queue computations (groups are copied; x and out must stay valid until done ≥ seq). */
strata_status mdev_compute(mdev *d, const mdev_group *groups, int n, uint64_t *seq);
uint64_t mdev_done(mdev *d);
void mdev_wait(mdev *d, uint64_t seq);
/* Timed host -> device copy of `bytes`, best of reps, in GB/s (the link probe). */
double mdev_probe(mdev *d, size_t bytes, int reps);
/* Totals since creation: bytes copied, seconds the copy engine was busy, seconds computing. */
void mdev_counters(mdev *d, uint64_t *copy_bytes, double *copy_s, double *compute_s);
const char *mdev_name(const mdev *d);

/* The expert FFN on the CPU, shared by the sim device and tests: the same calls and rounding as
 * the ExpertPool path in model/moe.c. */
strata_status mdev_expert_ffn(const mdev_expert_shape *s, const char *blob, float sg, float su, int isa,
                              const float *x, int64_t n, float *out);

#endif
