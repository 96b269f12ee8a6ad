/*
 * xstore.h — the expert store's RAM tier over the model file (issue 20 point 1): RAM slots the engine
 * owns, filled on demand with O_DIRECT reads of each expert's bytes straight from the GGUF's tensor
 * slices (aligned supersets of them), through io_uring or a pool of pread threads, never through the
 * page cache. The CPU pool computes from the slots. A replacement policy (moe/policy.h) decides what
 * stays.
 *
 * Use, per MoE layer line (model/moe.c): xs_acquire(layer, experts) makes every listed expert
 * resident (or, if the policy declines to keep one, readable from a scratch slot) and pins them;
 * the caller computes from the returned pointers; xs_release unpins. The store's lock is held from
 * acquire to release: one layer line of one session at a time (the thread pool serialises the
 * computation anyway). Lock order: the offload engine's lock (off_begin) before this one.
 *
 * Slots: `slot_bytes` each, one region per expert piece (gate or gate_up, up, down), each region
 * holding the piece's aligned superset: the piece starts at (file offset mod align) in its region.
 * The budget buys n_slots = budget / slot_bytes; the last n_expert of them are scratch (a line of one
 * layer never reads more than n_expert experts), the rest the policy's. So the smallest budget that
 * works is n_expert slots: one layer's routed experts.
 *
 * Faults: every batch of reads first checks the file (fstat) against what was opened: a size or
 * mtime change, a short read or an I/O error fails the acquire with STRATA_ERR_IO naming the file and
 * the expert, and leaves the store consistent (a key whose read failed is not resident).
 */
#ifndef STRATA_MOE_XSTORE_H
#define STRATA_MOE_XSTORE_H

#include <stddef.h>
#include <stdint.h>

#include "strata.h"

enum { XS_MAX_PARTS = 3 };

/* One layer's routed experts in the file: piece p of expert e is bytes[p] bytes at
 * off[p] + e * stride[p] (absolute file offsets). */
typedef struct {
    int32_t n_part;
    uint64_t off[XS_MAX_PARTS], stride[XS_MAX_PARTS], bytes[XS_MAX_PARTS];
} xs_layer;

typedef struct {
    const char *path;          /* the model file */
    int32_t n_layer, n_expert;
    uint64_t ram_bytes;        /* the RAM tier's budget */
    const char *policy;        /* NULL or "": xpol_default() */
    int32_t io_backend;        /* AIO_AUTO / AIO_URING / AIO_PREAD */
    int32_t io_depth;          /* reads in flight; <= 0: 32 */
    int32_t buffered;          /* 1: do not ask for O_DIRECT (a test and benchmark knob) */
    uint64_t test_short_read_at; /* test hook: read number N (1-based since open) comes back short */
} xs_params;

typedef struct xs_store xs_store;

typedef struct {
    uint64_t lookups, hits;    /* per routed pick (like the device cache's counters) */
    uint64_t groups, group_hits; /* per (line, expert) */
    uint64_t miss_bytes;       /* bytes of the experts missed (their pieces, not the aligned reads) */
    uint64_t read_bytes;       /* bytes asked of storage (aligned supersets) */
    uint64_t reads;            /* read requests */
    uint64_t evictions, bypassed;
    double read_s;             /* wall time in read batches (demand reads, and waits for prefetches) */
    /* prefetch (xs_prefetch): experts read ahead, their bytes, those the next line did not read */
    uint64_t prefetch_experts, prefetch_bytes, prefetch_unused_experts, prefetch_unused_bytes;
    uint64_t predicted, predicted_right; /* the predicted layer's experts, and how many were predicted (recall) */
} xs_stats;

/* Fails with INVALID_ARG (the budget is below one layer's experts: the message says the smallest),
 * IO (the file), NOMEM. */
strata_status xs_create(const xs_params *p, const xs_layer *layers, xs_store **out);
void xs_free(xs_store *x);
/* One line of layer il: experts[0..n) distinct, with their routed picks and best ranks; ptr[i * 3 + p]
 * is where piece p of experts[i] starts. On error nothing stays pinned and the lock is released. */
strata_status xs_acquire(xs_store *x, int32_t il, const int32_t *experts, const int32_t *picks,
                         const int32_t *best_rank, int32_t n, const char **ptr);
void xs_release(xs_store *x);
/* Between xs_acquire and xs_release: starts reads of the experts layer il is predicted to route to (best
 * first; at most what one batch of reads in flight holds), into slots the policy gives, pinned until the
 * next xs_acquire waits for them. Experts already in RAM are skipped. A failed read only leaves its slot
 * invalid (the demand read reports errors). The next xs_acquire counts recall against its line when it is
 * layer il, and every prefetched expert its line does not read as unused. */
void xs_prefetch(xs_store *x, int32_t il, const int32_t *experts, int32_t n);
void xs_get_stats(xs_store *x, xs_stats *out);
/* One line: budget, slots, policy, access (O_DIRECT or why not), reads backend. */
const char *xs_log(const xs_store *x);
int32_t xs_n_slots(const xs_store *x);
uint64_t xs_slot_size(const xs_store *x);
/* Checks the policy's table; 0 or 1 with why. Takes the lock: not between xs_acquire and xs_release. */
int xs_validate(xs_store *x, char *why, size_t n);

#endif
