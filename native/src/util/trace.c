/* trace.c — the request watchdog and the timeline recorder; see trace.h for the protocol. */
#include "trace.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "util/error.h"

/* ---------------------------------------------------------------- watchdog */

static _Thread_local wd_state tl_wd;
/* the settings survive evals; the rest is per eval */
wd_state *wd_self(void) { return &tl_wd; }

double wd_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void wd_eval_begin(int64_t n_ids, int64_t cap) {
    wd_state *w = &tl_wd;
    w->active = 1;
    w->fired = 0;
    w->beat = wd_now();
    w->step = 0;
    w->n_steps = cap > 0 ? (n_ids + cap - 1) / cap : 1;
    w->tokens = 0;
    w->layer = -1;
    w->part = NULL;
    w->wait = NULL;
}

void wd_eval_end(void) {
    tl_wd.active = 0;
    tl_wd.wait = NULL;
}

int wd_expired(void) {
    const wd_state *w = &tl_wd;
    if (!w->active) return 0;
    return w->fired || (w->timeout_s > 0 && wd_now() - w->beat > w->timeout_s);
}

/* Appends to buf[0..n) at *k, keeping it NUL-terminated; silently truncates. */
static void append(char *buf, size_t n, size_t *k, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static void append(char *buf, size_t n, size_t *k, const char *fmt, ...) {
    if (*k + 1 >= n) return;
    va_list ap;
    va_start(ap, fmt);
    const int r = vsnprintf(buf + *k, n - *k, fmt, ap);
    va_end(ap);
    if (r > 0) *k = *k + (size_t)r < n - 1 ? *k + (size_t)r : n - 1;
}

void wd_stage(char *buf, size_t n) {
    const wd_state *w = &tl_wd;
    size_t k = 0;
    if (!n) return;
    buf[0] = 0;
    append(buf, n, &k, "%s", w->label[0] ? w->label : "eval");
    if (w->n_steps > 1) append(buf, n, &k, ", forward step %lld of %lld", (long long)w->step, (long long)w->n_steps);
    if (w->tokens > 1) append(buf, n, &k, " (%lld tokens)", (long long)w->tokens);
    if (w->layer >= 0) append(buf, n, &k, ", layer %d", w->layer);
    if (w->part) append(buf, n, &k, " %s", w->part);
    if (w->wait) append(buf, n, &k, ": %s", w->wait);
}

strata_status wd_fail(const char *what) {
    wd_state *w = &tl_wd;
    if (what) w->wait = what;
    const double idle = wd_now() - w->beat;
    char stage[400];
    wd_stage(stage, sizeof stage);
    w->fired = 1;
    if (trc_on()) {
        const uint64_t t = trc_now();
        trc_emit(TRC_WATCHDOG, t, t, w->layer, 0, (int64_t)w->step, 0);
    }
    return strata_fail(STRATA_ERR_IO, "watchdog: no progress for %.1f s (limit %g s, --watchdog-s / "
                       "STRATA_WATCHDOG_S) in %s; the request was aborted and its session must be reset",
                       idle, w->timeout_s, stage);
}

strata_status strata_watchdog_set(double seconds) {
    tl_wd.timeout_s = seconds > 0 ? seconds : 0.0;
    return STRATA_OK;
}

void strata_watchdog_label(const char *label) {
    if (!label) label = "";
    snprintf(tl_wd.label, sizeof tl_wd.label, "%s", label);
}

int32_t strata_watchdog_fired(void) { return tl_wd.fired; }

int32_t strata_watchdog_stage(char *buf, uint64_t size) {
    char tmp[400];
    wd_stage(tmp, sizeof tmp);
    if (buf && size) snprintf(buf, (size_t)size, "%s", tmp);
    return (int32_t)strlen(tmp);
}

/* ---------------------------------------------------------------- recorder */

_Atomic int trc_enabled_flag = 0;

#define TRC_MAX_THREADS 256

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static strata_trace_event *g_buf;          /* [g_cap], g_n used; under g_mu */
static int64_t g_n, g_cap, g_max;
static uint64_t g_dropped;
static char g_names[TRC_MAX_THREADS][32];  /* under g_mu */
static int32_t g_next_tid;
static _Thread_local int32_t tl_tid = -1;
static _Thread_local char tl_name[32];     /* trc_thread_name before the thread's first record */

uint64_t trc_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* under g_mu */
static int32_t my_tid(void) {
    /* indices are handed out on a thread's first record, so threads that never record (the pools of
     * the many models a process may load) do not use them up */
    if (tl_tid < 0) {
        tl_tid = g_next_tid < TRC_MAX_THREADS ? g_next_tid++ : TRC_MAX_THREADS - 1;
        if (tl_name[0]) snprintf(g_names[tl_tid], sizeof g_names[0], "%s", tl_name);
        else snprintf(g_names[tl_tid], sizeof g_names[0], "thread %d", tl_tid);
    }
    return tl_tid;
}

static _Thread_local int32_t tl_experts = -1;
void trc_note_experts(int32_t n) { tl_experts = n; }
int32_t trc_take_experts(void) {
    const int32_t n = tl_experts;
    tl_experts = -1;
    return n;
}

void trc_thread_name(const char *name) {
    snprintf(tl_name, sizeof tl_name, "%s", name);
    if (tl_tid >= 0) {
        pthread_mutex_lock(&g_mu);
        snprintf(g_names[tl_tid], sizeof g_names[0], "%s", name);
        pthread_mutex_unlock(&g_mu);
    }
}

void trc_emit(int32_t kind, uint64_t t0, uint64_t t1, int32_t a, int32_t b, int64_t c, int64_t d) {
    pthread_mutex_lock(&g_mu);
    if (!trc_on()) { pthread_mutex_unlock(&g_mu); return; }
    if (g_n == g_cap) {
        int64_t nc = g_cap ? 2 * g_cap : 65536;
        if (nc > g_max) nc = g_max;
        strata_trace_event *nb = nc > g_cap ? realloc(g_buf, (size_t)nc * sizeof *nb) : NULL;
        if (!nb) {
            g_dropped++;
            pthread_mutex_unlock(&g_mu);
            return;
        }
        g_buf = nb;
        g_cap = nc;
    }
    strata_trace_event *e = &g_buf[g_n++];
    e->t0_ns = t0;
    e->t1_ns = t1 < t0 ? t0 : t1;
    e->kind = kind;
    e->tid = my_tid();
    e->a = a;
    e->b = b;
    e->c = c;
    e->d = d;
    pthread_mutex_unlock(&g_mu);
}

strata_status strata_trace_enable(int32_t on, uint64_t max_events) {
    pthread_mutex_lock(&g_mu);
    g_n = 0;
    g_dropped = 0;
    g_max = max_events ? (int64_t)max_events : (int64_t)4 << 20;
    if (!on) {
        free(g_buf);
        g_buf = NULL;
        g_cap = 0;
    }
    atomic_store_explicit(&trc_enabled_flag, on ? 1 : 0, memory_order_relaxed);
    if (on) {
        /* the enabling thread is normally the one that runs evals */
        if (!tl_name[0]) snprintf(tl_name, sizeof tl_name, "model");
        const int32_t t = my_tid();
        snprintf(g_names[t], sizeof g_names[0], "%s", tl_name);
    }
    pthread_mutex_unlock(&g_mu);
    return STRATA_OK;
}

int32_t strata_trace_enabled(void) { return trc_on(); }

int64_t strata_trace_drain(strata_trace_event *out, int64_t cap) {
    pthread_mutex_lock(&g_mu);
    int64_t n = g_n < cap ? g_n : cap;
    if (!out || n < 0) n = 0;
    if (n) {
        memcpy(out, g_buf, (size_t)n * sizeof *out);
        memmove(g_buf, g_buf + n, (size_t)(g_n - n) * sizeof *g_buf);
        g_n -= n;
    }
    pthread_mutex_unlock(&g_mu);
    return n;
}

int64_t strata_trace_pending(void) {
    pthread_mutex_lock(&g_mu);
    const int64_t n = g_n;
    pthread_mutex_unlock(&g_mu);
    return n;
}

uint64_t strata_trace_dropped(void) {
    pthread_mutex_lock(&g_mu);
    const uint64_t n = g_dropped;
    pthread_mutex_unlock(&g_mu);
    return n;
}

uint64_t strata_trace_now_ns(void) { return trc_now(); }

const char *strata_trace_kind_name(int32_t kind) {
    static const char *const names[TRC_KIND_COUNT] = {
        [TRC_STEP] = "step", [TRC_LAYER] = "layer", [TRC_MIXER] = "mixer", [TRC_MOE] = "moe",
        [TRC_PLE] = "ple", [TRC_PLE_WAIT] = "ple_wait", [TRC_PLE_HASH] = "ple_hash",
        [TRC_PLE_PREFETCH] = "ple_prefetch", [TRC_PLE_GATHER] = "ple_gather", [TRC_PLE_STALL] = "ple_stall",
        [TRC_POOL_TASK] = "pool_task", [TRC_DEV_COPY] = "dev_copy", [TRC_DEV_COMPUTE] = "dev_compute",
        [TRC_MERGE_WAIT] = "merge_wait", [TRC_CACHE_SWAP] = "cache_swap", [TRC_CACHE_ADMIT] = "cache_admit",
        [TRC_MOE_CPU] = "moe_cpu", [TRC_WATCHDOG] = "watchdog",
    };
    return kind > 0 && kind < TRC_KIND_COUNT && names[kind] ? names[kind] : "?";
}

int32_t strata_trace_thread_name(int32_t tid, char *buf, uint64_t size) {
    if (tid < 0 || tid >= TRC_MAX_THREADS) return -1;
    pthread_mutex_lock(&g_mu);
    const int known = tid < g_next_tid;
    char name[32];
    snprintf(name, sizeof name, "%s", g_names[tid]);
    pthread_mutex_unlock(&g_mu);
    if (!known) return -1;
    if (buf && size) snprintf(buf, (size_t)size, "%s", name);
    return (int32_t)strlen(name);
}
