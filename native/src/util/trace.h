/*
 * trace.h — the request watchdog and the timeline event recorder (DESIGN §7, issue 9).
 *
 * ---------------------------------------------------------------- watchdog
 * Per thread: the thread that runs an eval (the "model thread") owns a wd_state in thread-local
 * storage. The eval marks itself active (wd_eval_begin), names the forward step it is in, beats
 * at every layer (progress), and names the wait it enters (wd_wait_begin: "waiting for the PLE
 * gather worker"). Every blocking wait of the model thread — the PLE handshake (ple/ple_table.c), the
 * sim device's engines (moe/device_sim.c) — polls wd_expired() and gives up with an error built
 * by wd_fail() once no progress was made for the configured time; forward() also checks between
 * layers. Only the model thread reads or writes its state: no locking. The settings
 * (strata_watchdog_set / _label) apply to evals run afterwards on the calling thread.
 *
 * ---------------------------------------------------------------- recorder
 * Off by default: every hook is `if (trc_on()) …`, one relaxed load of a global and a branch that
 * is always predicted. On (strata_trace_enable), a hook appends a fixed-size record — kind,
 * thread index, start and end (CLOCK_MONOTONIC ns, the clock Python's time.monotonic_ns reads),
 * four integer arguments — to one global buffer under a mutex (records are appended by the model
 * thread, pool workers, the PLE worker and the sim device's engines; a few hundred thousand per
 * second at most, so one uncontended lock is cheaper than per-thread buffers' drain protocol).
 * Python drains the buffer (strata_trace_drain) and writes the JSON. A full buffer drops records
 * and counts them. Thread indices are small integers handed out on a thread's first record;
 * trc_thread_name names the calling thread (pool workers, engines, the PLE worker at start).
 */
#ifndef STRATA_UTIL_TRACE_H
#define STRATA_UTIL_TRACE_H

#include <stdatomic.h>
#include <stdint.h>

#include "strata.h"

/* ---------------------------------------------------------------- watchdog */

typedef struct {
    int active;              /* inside an eval */
    double timeout_s;        /* 0: off */
    double beat;             /* last progress (monotonic seconds) */
    char label[128];         /* the caller's stage ("decode step 12") */
    int64_t step, n_steps, tokens;   /* forward step within the eval (1-based), steps, its tokens */
    int32_t layer;           /* layer in progress, -1 before the first */
    const char *part;        /* "mixer", "MoE", "PLE", "embeddings", NULL */
    const char *wait;        /* the wait in progress (static text) or NULL */
    int fired;               /* the last eval was aborted by the watchdog */
} wd_state;

wd_state *wd_self(void);
double wd_now(void);
void wd_eval_begin(int64_t n_ids, int64_t cap);
void wd_eval_end(void);
static inline void wd_beat(void) { wd_self()->beat = wd_now(); }
/* 1 when an eval is active, the watchdog on and no progress for its time (or it already fired). */
int wd_expired(void);
/* Marks the abort and formats "watchdog: no progress for S s in <stage>: <what>" as the thread's
 * last error; returns STRATA_ERR_IO. */
strata_status wd_fail(const char *what);
static inline void wd_wait_begin(const char *what) { wd_self()->wait = what; }
static inline void wd_wait_end(void) { wd_self()->wait = NULL; }
/* The stage in words (label, step, layer, wait). */
void wd_stage(char *buf, size_t n);

/* ---------------------------------------------------------------- recorder */

enum {
    TRC_STEP = 1,        /* a forward step (verify window / prefill chunk part): a = tokens, b = step, c = n_past */
    TRC_LAYER,           /* a = layer */
    TRC_MIXER,           /* a = layer, b = 1 for QSA, 0 for GDN */
    TRC_MOE,             /* a = layer, b = experts routed (distinct), c = tokens, d = cache hits (offload) */
    TRC_PLE,             /* the PLE layer on the model thread: a = layer, c = tokens */
    TRC_PLE_WAIT,        /* model thread waiting for the gather worker: c = seq */
    TRC_PLE_HASH,        /* worker: c = rows */
    TRC_PLE_PREFETCH,    /* worker: c = pages announced */
    TRC_PLE_GATHER,      /* worker: c = rows, d = bytes read from storage */
    TRC_PLE_STALL,       /* worker: the test hook's sleep */
    TRC_POOL_TASK,       /* a thread's share of one pool job: a = first task, b = thread, c = tasks run, d = job's tasks */
    TRC_DEV_COPY,        /* a = slot, c = bytes, d = seq */
    TRC_DEV_COMPUTE,     /* a = first slot, b = groups, d = seq */
    TRC_MERGE_WAIT,      /* model thread waiting for the device's computations: a = layer, d = seq */
    TRC_CACHE_SWAP,      /* instant: a = layer, b = expert in, c = expert out, d = slot */
    TRC_CACHE_ADMIT,     /* instant: a = layer, b = expert, d = slot */
    TRC_MOE_CPU,         /* the CPU pool's expert work of a layer: a = layer, b = groups */
    TRC_WATCHDOG,        /* instant: the watchdog fired */
    TRC_KIND_COUNT
};

extern _Atomic int trc_enabled_flag;
static inline int trc_on(void) { return atomic_load_explicit(&trc_enabled_flag, memory_order_relaxed); }
uint64_t trc_now(void);
/* Appends one record (t1 == t0: an instant). */
void trc_emit(int32_t kind, uint64_t t0, uint64_t t1, int32_t a, int32_t b, int64_t c, int64_t d);
/* The MoE block notes how many experts a layer routed to; the layer's span picks it up (model
 * thread only). trc_take_experts returns it and clears it (-1: none noted). */
void trc_note_experts(int32_t n);
int32_t trc_take_experts(void);
/* Names the calling thread in the trace ("pool 1", "sim copy", "PLE worker"). */
void trc_thread_name(const char *name);

#endif
