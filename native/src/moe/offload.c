/*
 * offload.c — set-up, per-layer planning and bookkeeping of the MoE offload engine (offload.h).
 *
 * Per MoE layer and window (model/moe.c drives it):
 *   off_begin      lock; publish finished loads; for every active expert group: note its picks
 *                  (heat, one lookup each), look it up: resident → device (its slot pinned for this
 *                  layer); missing → tail skip (if on and every token ranks it ≥ K), else admitted
 *                  into a free cache slot (copy, then device), else staged: in a prefill chunk of
 *                  ≥ stream_min tokens every missing group streams through the staging ring (plus
 *                  cache slots borrowed for the chunk), otherwise the pcie_frac share of them; the
 *                  rest → the CPU pool;
 *   off_submit     one computation for the resident groups, then per staged/admitted group a copy
 *                  (after the last computation that read its slot: "used") and its computation
 *                  (after that copy: "copied"), so copies overlap the computations before them;
 *   off_finish     wait for the device, unpin, give borrowed slots back, count, run an adjustment
 *                  round every adjust_interval windows (copies queued now, published later), unlock.
 */
#include "moe/offload.h"
#include "device/device_cuda.h"
#include "moe/expert_cache.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/error.h"
#include "util/trace.h"

typedef struct {
    int32_t slot;
    uint64_t seq;
} off_load;

struct off_engine {
    pthread_mutex_t mu;
    off_params p;                  /* as given (expert_pack not kept: only read in off_create) */
    int32_t n_layer, n_expert, n_expert_used;
    off_layer_desc *layer;         /* [n_layer] the model's descriptors (copies: shape addresses stay put) */
    mdev *dev;
    expert_cache *ec;
    int32_t n_cache_slots, n_staging;
    size_t slot_bytes;
    float pcie_frac;
    int32_t tail_skip;             /* K > 0: skip rule on; 0: off */
    const char *tail_skip_why;
    int32_t adjust_interval;       /* windows between adjustment rounds */
    int32_t max_swaps;             /* swaps per round (the size of `swaps`) */
    uint64_t windows;              /* MoE calls of layer 0 (verify windows / prefill chunks) */
    off_load *pending;
    int32_t n_pending, cap_pending;
    double probe_gbps;
    int32_t stream_min;            /* prefill chunks of at least this many tokens stream every missing group */
    uint64_t *slot_use;            /* per device slot: the last computation that reads it */
    /* the plan's storage, sized once: [n_expert] kind / slot / min_rank, the ring (staging slots plus
     * borrowed ones: at most n_staging + n_cache_slots), the pinned (one per expert) and borrowed slots */
    off_plan plan;
    int8_t *kind;
    int32_t *slot, *min_rank, *ring, n_ring;
    int32_t *borrowed, n_borrowed; /* cache slots lent to this chunk's staging ring */
    int32_t *pinned, n_pinned;     /* resident slots read by this layer */
    mdev_group *groups;            /* [n_expert] the resident groups' computation */
    ec_swap *swaps;                /* [max_swaps] an adjustment round */
    uint64_t borrow_total, stream_chunks;
    const char *pack;              /* expert pack mapping (NULL: copy the three pieces from the sources) */
    uint64_t pack_size;
    uint64_t *pack_layer_off;      /* per layer: offset of blob (layer, 0) in the pack */
    char log[800];
    /* counters. Pick hits/lookups, admits and swaps have one owner, the cache (ec_get_stats); the
     * engine counts expert GROUPS here (a group merges a window's picks of one (layer, expert)). */
    uint64_t group_hits, group_lookups, pcie_groups, pcie_bytes, cpu_groups, cpu_bytes, skipped;
    double cpu_s;
    /* the ONLINE split: every layer's share and its probes */
    off_split_state *frac;
    uint64_t split_updates;
};

static const float SPLIT_LO = 0.02f, SPLIT_HI = 0.98f, SPLIT_DELTA = 0.05f, SPLIT_MOVE = 0.05f;
static const double SPLIT_GAIN = 0.03;   /* one side must be this much faster to move the centre */
enum { SPLIT_PAIRS = 4 };                /* windows on each side of the centre per decision */

static float clamp_share(double f) { return (float)(f < SPLIT_LO ? SPLIT_LO : f > SPLIT_HI ? SPLIT_HI : f); }

float off_split_use(const off_split_state *s) {
    return clamp_share(s->f + ((s->n_plus + s->n_minus) % 2 == 0 ? SPLIT_DELTA : -SPLIT_DELTA));
}

int off_split_step(off_split_state *s, double t) {
    if (!(t > 0)) return 0;
    if ((s->n_plus + s->n_minus) % 2 == 0) { s->t_plus += t; s->n_plus++; }
    else { s->t_minus += t; s->n_minus++; }
    if (s->n_minus < SPLIT_PAIRS) return 0;
    const double plus = s->t_plus / s->n_plus, minus = s->t_minus / s->n_minus;
    const float old = s->f;
    if (plus < minus * (1 - SPLIT_GAIN)) s->f = clamp_share(s->f + SPLIT_MOVE);
    else if (minus < plus * (1 - SPLIT_GAIN)) s->f = clamp_share(s->f - SPLIT_MOVE);
    s->t_plus = s->t_minus = 0;
    s->n_plus = s->n_minus = 0;
    return s->f != old;
}

static double wall_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static size_t blob_bytes(const mdev_expert_shape *s) { return s->gate_bytes + s->up_bytes + s->down_bytes; }

static void expert_src(const off_engine *o, int il, int32_t e, const void *src[3], size_t bytes[3]) {
    const off_layer_desc *l = &o->layer[il];
    const mdev_expert_shape *s = &l->shape;
    if (o->pack) {                       /* one contiguous blob: one copy */
        src[0] = o->pack + o->pack_layer_off[il] + (size_t)e * blob_bytes(s);
        bytes[0] = blob_bytes(s);
        src[1] = src[2] = NULL;
        bytes[1] = bytes[2] = 0;
        return;
    }
    src[0] = l->gate + (size_t)e * l->gate_stride;
    bytes[0] = s->gate_bytes;
    src[1] = s->fused ? NULL : l->up + (size_t)e * l->up_stride;
    bytes[1] = s->up_bytes;
    src[2] = l->down + (size_t)e * l->down_stride;
    bytes[2] = s->down_bytes;
}

static float scale_of(const float *sc, int64_t n, int64_t e) { return sc ? sc[n == 1 ? 0 : e] : 1.0f; }


/* ---------------------------------------------------------------- expert pack (pyrunner/expert_pack.py) */

enum { PACK_HEADER = 4096 };

static uint64_t fnv_u64(uint64_t h, uint64_t v) {
    for (int i = 0; i < 8; i++) {
        h ^= (v >> (8 * i)) & 0xffu;
        h *= 0x100000001B3ull;
    }
    return h;
}

static strata_status open_pack(off_engine *o, const char *path) {
    /* the identity the pack was built for: (offset, size, type) of every expert tensor */
    uint64_t ident = 0xCBF29CE484222325ull, payload = 0;
    o->pack_layer_off = calloc((size_t)o->n_layer, sizeof(uint64_t));
    if (!o->pack_layer_off) return strata_fail(STRATA_ERR_NOMEM, "expert pack: no memory");
    for (int il = 0; il < o->n_layer; il++) {
        const off_layer_desc *l = &o->layer[il];
        for (int k = 0; k < l->n_ident; k++)
            ident = fnv_u64(fnv_u64(fnv_u64(ident, l->ident[k].offset), l->ident[k].size), (uint64_t)l->ident[k].type);
        o->pack_layer_off[il] = PACK_HEADER + payload;
        payload += (uint64_t)blob_bytes(&l->shape) * (uint64_t)o->n_expert;
    }
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return strata_fail(STRATA_ERR_IO, "expert pack %s: cannot open (%s)", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st)) { close(fd); return strata_fail(STRATA_ERR_IO, "expert pack %s: cannot stat", path); }
    const uint64_t size = (uint64_t)st.st_size;
    uint8_t h[48];
    if (size < PACK_HEADER || pread(fd, h, sizeof h, 0) != (ssize_t)sizeof h) {
        close(fd);
        return strata_fail(STRATA_ERR_FORMAT, "expert pack %s: %llu bytes, shorter than its header; delete it to rebuild",
                           path, (unsigned long long)size);
    }
    uint32_t ver, nl, ne;
    uint64_t ph, pid, ppay;
    memcpy(&ver, h + 8, 4); memcpy(&nl, h + 12, 4); memcpy(&ne, h + 16, 4);
    memcpy(&ph, h + 24, 8); memcpy(&pid, h + 32, 8); memcpy(&ppay, h + 40, 8);
    const char *why = NULL;
    if (memcmp(h, "STRXPACK", 8)) why = "not an expert pack (bad magic)";
    else if (ver != 1) why = "unsupported pack version";
    else if ((int32_t)nl != o->n_layer || (int32_t)ne != o->n_expert) why = "layer or expert count differs from the model";
    else if (pid != ident) why = "built for another model file (identity differs)";
    else if (ppay != payload) why = "blob sizes differ from the model's";
    else if (size != PACK_HEADER + payload) why = "truncated or padded (file size does not match)";
    if (why) {
        close(fd);
        return strata_fail(STRATA_ERR_FORMAT, "expert pack %s: %s; delete it and run again to rebuild", path, why);
    }
    void *base = mmap(NULL, (size_t)size, PROT_READ, MAP_SHARED, fd, 0);
    close(fd);
    if (base == MAP_FAILED) return strata_fail(STRATA_ERR_IO, "expert pack %s: cannot map (%s)", path, strerror(errno));
    o->pack = base;
    o->pack_size = size;
    return STRATA_OK;
}


strata_status off_create(const off_params *p, const off_layer_desc *layers, off_engine **out) {
    *out = NULL;
    if (!p || !layers || p->n_layer <= 0 || p->n_expert <= 0 || p->n_expert_used <= 0)
        return strata_fail(STRATA_ERR_INVALID_ARG, "offload: no layers or experts described");
    if (p->device == STRATA_DEVICE_CUDA) {
        const char *why = NULL;
        if (strata_cuda_device_count(&why) <= 0)
            return strata_fail(STRATA_ERR_NO_DEVICE, "device cuda: %s; use --device cpu or sim", why ? why : "no GPU");
    }
    if (p->device != STRATA_DEVICE_CPU && p->device != STRATA_DEVICE_SIM && p->device != STRATA_DEVICE_CUDA)
        return strata_fail(STRATA_ERR_INVALID_ARG, "device %d: use 0 cpu, 1 sim, 2 cuda", p->device);
    off_engine *o = calloc(1, sizeof *o);
    if (!o) return strata_fail(STRATA_ERR_NOMEM, "offload: no memory");
    pthread_mutex_init(&o->mu, NULL);
    o->p = *p;
    o->p.expert_pack = NULL;
    o->n_layer = p->n_layer;
    o->n_expert = p->n_expert;
    o->n_expert_used = p->n_expert_used;
    strata_status rc = STRATA_OK;
#define FAIL(...) do { rc = strata_fail(__VA_ARGS__); goto fail; } while (0)
    o->layer = malloc((size_t)o->n_layer * sizeof *o->layer);
    if (!o->layer) FAIL(STRATA_ERR_NOMEM, "offload: no memory");
    memcpy(o->layer, layers, (size_t)o->n_layer * sizeof *o->layer);
    uint64_t routed_bytes = 0;
    for (int il = 0; il < o->n_layer; il++) {
        const mdev_expert_shape *s = &o->layer[il].shape;
        if (blob_bytes(s) > o->slot_bytes) o->slot_bytes = blob_bytes(s);
        routed_bytes += (uint64_t)blob_bytes(s) * (uint64_t)o->n_expert;
#if STRATA_HAVE_CUDA
        if (p->device == STRATA_DEVICE_CUDA && !cudev_supports(s))
            FAIL(STRATA_ERR_UNSUPPORTED, "device cuda: layer %d's expert types (%s, %s) have no CUDA kernel; "
                 "use --device sim or cpu", il, s->tg->name, s->td->name);
#endif
    }
    if (!o->slot_bytes) FAIL(STRATA_ERR_INVALID_ARG, "offload: experts of zero bytes");
    const int64_t total_experts = (int64_t)o->n_layer * o->n_expert;
    const int on_device = p->device == STRATA_DEVICE_SIM || p->device == STRATA_DEVICE_CUDA;
    int64_t n_cache = on_device ? (int64_t)(p->cache_bytes / o->slot_bytes) : 0;
    if (n_cache > total_experts) n_cache = total_experts;
    o->n_cache_slots = (int32_t)n_cache;
    o->n_staging = on_device ? (p->n_staging > 0 ? p->n_staging : 4) : 0;
    o->adjust_interval = p->adjust_interval > 0 ? p->adjust_interval : 32;
    o->stream_min = p->stream_min > 0 ? p->stream_min : 1024;
    o->max_swaps = p->max_swaps > 0 ? p->max_swaps : ec_default_params().max_swaps;   /* the cache owns the 96 */
    const double covered = routed_bytes ? (double)n_cache * (double)o->slot_bytes / (double)routed_bytes : 0.0;
    if (p->tail_skip == 0) { o->tail_skip = 0; o->tail_skip_why = "off (asked)"; }
    else if (p->tail_skip > 0) { o->tail_skip = p->tail_skip; o->tail_skip_why = "on (asked)"; }
    else if (p->device == STRATA_DEVICE_CPU) { o->tail_skip = 0; o->tail_skip_why = "off (cpu device: exact output)"; }
    else if (covered < 0.9) { o->tail_skip = 7; o->tail_skip_why = "on (cache holds < 90% of routed expert bytes)"; }
    else { o->tail_skip = 0; o->tail_skip_why = "off (cache holds >= 90% of routed expert bytes)"; }
    if (o->tail_skip >= o->n_expert_used) {
        o->tail_skip = 0;
        o->tail_skip_why = "off (the model routes to fewer experts than the skip rank)";
    }
    /* the plan's arrays, once */
    const size_t ne = (size_t)o->n_expert;
    o->kind = malloc(ne);
    o->slot = malloc(ne * sizeof(int32_t));
    o->min_rank = malloc(ne * sizeof(int32_t));
    if (!o->kind || !o->slot || !o->min_rank) FAIL(STRATA_ERR_NOMEM, "offload: no memory");
    if (on_device) {
        mdev_params dp = {.kind = p->device == STRATA_DEVICE_CUDA ? MDEV_CUDA : MDEV_SIM,
                          .n_slots = o->n_cache_slots + o->n_staging, .slot_bytes = o->slot_bytes,
                          .link_gbps = p->sim_link_gbps > 0 ? p->sim_link_gbps : 16.0, .isa = p->isa};
        if ((rc = mdev_create(&dp, &o->dev))) goto fail;
        ec_params ep = ec_default_params();
        ep.n_layer = o->n_layer;
        ep.n_expert = o->n_expert;
        ep.n_slots = o->n_cache_slots;
        ep.max_swaps = o->max_swaps;
        if ((rc = ec_create(&ep, &o->ec))) goto fail;
        o->slot_use = calloc((size_t)dp.n_slots, sizeof(uint64_t));
        o->ring = malloc((size_t)(o->n_staging + o->n_cache_slots + 1) * sizeof(int32_t));
        o->borrowed = malloc((size_t)(o->n_cache_slots + 1) * sizeof(int32_t));
        o->pinned = malloc((ne + 1) * sizeof(int32_t));
        o->groups = malloc(ne * sizeof *o->groups);
        o->swaps = malloc((size_t)o->max_swaps * sizeof *o->swaps);
        if (!o->slot_use || !o->ring || !o->borrowed || !o->pinned || !o->groups || !o->swaps)
            FAIL(STRATA_ERR_NOMEM, "offload: no memory");
        o->probe_gbps = mdev_probe(o->dev, (size_t)16 << 20, 3);
        if (p->expert_pack && p->expert_pack[0] && (rc = open_pack(o, p->expert_pack))) goto fail;
    }
#undef FAIL
    /* initial share: 0.55 x probe / 20, clamped (DESIGN §4), unless given; the one place it is
     * computed (Python reads it from strata_offload_stats.pcie_frac) */
    o->pcie_frac = p->pcie_frac >= 0 ? p->pcie_frac : (float)(0.55 * o->probe_gbps / 20.0);
    if (!(o->pcie_frac >= 0.0f)) o->pcie_frac = 0.0f;
    if (o->pcie_frac > 1.0f) o->pcie_frac = 1.0f;
    if (!o->dev) o->pcie_frac = 0.0f;
    if (o->dev && p->split == STRATA_SPLIT_ONLINE) {
        o->frac = calloc((size_t)o->n_layer, sizeof *o->frac);
        if (!o->frac) { rc = strata_fail(STRATA_ERR_NOMEM, "offload: no memory"); goto fail; }
        for (int32_t i = 0; i < o->n_layer; i++) o->frac[i].f = o->pcie_frac;
    }
    snprintf(o->log, sizeof o->log,
             "device %s: %d cache slots of %.2f MiB (%.1f%% of routed expert bytes), %d staging slots, "
             "link probe %.2f GB/s, pcie_frac %.2f%s, tail skip %s%s, copies from %s",
             o->dev ? mdev_name(o->dev) : "cpu", o->n_cache_slots, (double)o->slot_bytes / (1 << 20), 100.0 * covered,
             o->n_staging, o->probe_gbps, o->pcie_frac, o->frac ? " (start; split online: per layer, from live costs)" : "",
             o->tail_skip_why,
             o->tail_skip ? (o->tail_skip == 7 ? " (rank >= 7)" : " (custom rank)") : "",
             p->no_swaps ? "the expert store's RAM slots (direct reads; admission only, no swaps)"
             : o->pack ? "the expert pack (one blob per expert)" : "the GGUF (three pieces per expert)");
    *out = o;
    return STRATA_OK;
fail:
    off_free(o);
    return rc;
}

void off_free(off_engine *o) {
    if (!o) return;
    mdev_free(o->dev);
    free(o->frac);
    if (o->ec) ec_free(o->ec);
    free(o->layer);
    free(o->pending);
    if (o->pack) munmap((void *)o->pack, (size_t)o->pack_size);
    free(o->pack_layer_off);
    free(o->slot_use);
    free(o->kind);
    free(o->slot);
    free(o->min_rank);
    free(o->ring);
    free(o->borrowed);
    free(o->pinned);
    free(o->groups);
    free(o->swaps);
    pthread_mutex_destroy(&o->mu);
    free(o);
}

static strata_status add_pending(off_engine *o, int32_t slot, uint64_t seq) {
    if (o->n_pending == o->cap_pending) {
        const int32_t nc = o->cap_pending ? 2 * o->cap_pending : 64;
        off_load *np = realloc(o->pending, (size_t)nc * sizeof *np);
        if (!np) return strata_fail(STRATA_ERR_NOMEM, "offload: no memory");
        o->pending = np;
        o->cap_pending = nc;
    }
    o->pending[o->n_pending++] = (off_load){slot, seq};
    return STRATA_OK;
}

static void publish_loads(off_engine *o) {
    if (!o->dev) return;
    if (o->p.sync_swaps && o->n_pending)   /* every queued copy lands first (the copy engine's sequence numbers
                                              grow in the order pending holds them; on the watchdog's expiry,
                                              what has landed is published) */
        (void)mdev_wait_copy(o->dev, o->pending[o->n_pending - 1].seq);
    const uint64_t done = mdev_copies_done(o->dev);
    int32_t k = 0;
    for (int32_t i = 0; i < o->n_pending; i++) {
        if (o->pending[i].seq <= done) ec_loaded(o->ec, o->pending[i].slot);
        else o->pending[k++] = o->pending[i];
    }
    o->n_pending = k;
}

off_plan *off_begin(off_engine *o, int il, int64_t L, const int64_t *count, const int32_t *pick) {
    pthread_mutex_lock(&o->mu);
    const int64_t Ne = o->n_expert, K = o->n_expert_used;
    off_plan *pl = &o->plan;
    *pl = (off_plan){.o = o, .il = il, .L = L, .n_expert = Ne, .count = count, .kind = o->kind, .slot = o->slot};
    int8_t *kind = o->kind;
    int32_t *slot = o->slot, *min_rank = o->min_rank;
    /* the best rank any token gave each expert (the tail-skip rule) */
    for (int64_t e = 0; e < Ne; e++) min_rank[e] = INT32_MAX;
    for (int64_t i = 0; i < L * K; i++)
        if ((int32_t)(i % K) < min_rank[pick[i]]) min_rank[pick[i]] = (int32_t)(i % K);
    publish_loads(o);
    if (il == 0) o->windows++;
    o->n_pinned = 0;
    o->n_borrowed = 0;
    int64_t n_missing = 0;
    for (int64_t e = 0; e < Ne; e++) {
        const int64_t n = count[e + 1] - count[e];
        kind[e] = OFF_NONE;
        if (!n) continue;
        int32_t s = -1;
        if (o->ec) {
            /* one lookup per routed pick, a hit if READY now (the cache counts them: ec_stats) */
            for (int64_t i = 0; i < n; i++) ec_note(o->ec, il, (int32_t)e);
            s = ec_lookup(o->ec, il, (int32_t)e);
            o->group_lookups++;
        }
        if (s >= 0) {
            o->group_hits++;
            kind[e] = OFF_DEVICE;
            slot[e] = s;
            ec_pin(o->ec, s);                 /* not borrowed or swapped out while this layer reads it */
            o->pinned[o->n_pinned++] = s;
        } else if (o->tail_skip > 0 && min_rank[e] >= o->tail_skip) {
            kind[e] = OFF_SKIP;
            o->skipped++;
        } else {
            kind[e] = OFF_CPU;
            n_missing++;
        }
    }
    if (!o->dev) return pl;
    const int stream = L >= o->stream_min;   /* prefill chunk: every missing group streams */
    if (stream) o->stream_chunks += il == 0;
    /* ring: the staging slots, plus cache slots borrowed for this chunk (up to one per missing group
     * beyond the staging ring, at most half the cache); `ring` holds n_staging + n_cache_slots */
    int32_t *ring = o->ring;
    int32_t n_ring = 0;
    for (int32_t i = 0; i < o->n_staging; i++) ring[n_ring++] = o->n_cache_slots + i;
    if (stream && o->ec) {
        int64_t want = n_missing - o->n_staging;
        if (want > o->n_cache_slots / 2) want = o->n_cache_slots / 2;
        int32_t bs;
        while (want-- > 0 && ec_borrow(o->ec, &bs)) {
            o->borrowed[o->n_borrowed++] = bs;
            ring[n_ring++] = bs;
        }
        o->borrow_total += (uint64_t)o->n_borrowed;
    }
    o->n_ring = n_ring;
    int64_t i_missing = 0;
    int32_t next = 0;
    for (int64_t e = 0; e < Ne; e++) {
        if (kind[e] != OFF_CPU) continue;
        int32_t s;
        if (!stream && o->ec && ec_admit(o->ec, il, (int32_t)e, &s)) {
            kind[e] = OFF_ADMIT;
            slot[e] = s;
            if (trc_on()) {
                const uint64_t t = trc_now();
                trc_emit(TRC_CACHE_ADMIT, t, t, il, (int32_t)e, 0, s);
            }
            continue;
        }
        /* decode: spread the pcie_frac share evenly, group i goes when floor((i+1)f) > floor(i f) */
        const double f = o->frac ? off_split_use(&o->frac[il]) : o->pcie_frac;
        const int go = stream || floor((double)(i_missing + 1) * f) > floor((double)i_missing * f);
        if (n_ring > 0 && go) {
            kind[e] = OFF_STAGE;
            slot[e] = ring[next];
            next = (next + 1) % n_ring;
        }
        i_missing++;
    }
    return pl;
}

static mdev_group make_group(const off_engine *o, int il, int64_t e, int32_t slot, const float *x, int64_t n, float *out,
                             int dev_io) {
    const off_layer_desc *l = &o->layer[il];
    const float sg = scale_of(l->gate_scale, l->n_gate_scale, e);
    return (mdev_group){.shape = &l->shape, .slot = slot, .sg = sg,
                        .su = l->shape.fused ? sg : scale_of(l->up_scale, l->n_up_scale, e), .x = x, .n = n, .out = out,
                        .dev_io = dev_io};
}

strata_status off_submit(off_plan *pl, const float *xg, float *out, int dev_io) {
    off_engine *o = pl->o;
    const int il = pl->il;
    const int64_t E = o->layer[il].shape.E, Ne = pl->n_expert;
    const int64_t *count = pl->count;
    const int8_t *kind = pl->kind;
    const int32_t *slot = pl->slot;
    uint64_t *seq = &pl->seq;
    if (!o->dev) return STRATA_OK;
    mdev_group *g = o->groups;
    int ng = 0;
    strata_status rc;
    /* resident groups first, in one computation: the compute engine starts on them at once */
    for (int64_t e = 0; e < Ne; e++)
        if (kind[e] == OFF_DEVICE) g[ng++] = make_group(o, il, e, slot[e], xg + count[e] * E, count[e + 1] - count[e],
                                                        out + count[e] * E, dev_io);
    if (ng) {
        if ((rc = mdev_compute(o->dev, g, ng, 0, seq))) return rc;
        for (int i = 0; i < ng; i++) o->slot_use[g[i].slot] = *seq;
    }
    /* then each copied group: copy after the slot's last reader, compute after the copy */
    for (int64_t e = 0; e < Ne; e++) {
        if (kind[e] != OFF_ADMIT && kind[e] != OFF_STAGE) continue;
        const void *src[3];
        size_t bytes[3];
        uint64_t cs;
        expert_src(o, il, (int32_t)e, src, bytes);
        if (pl->src) {             /* from the expert store's RAM slots: the three pieces */
            const mdev_expert_shape *sh = &o->layer[il].shape;
            for (int q = 0; q < 3; q++) src[q] = pl->src[e * 3 + q];
            bytes[0] = sh->gate_bytes;
            bytes[1] = sh->fused ? 0 : sh->up_bytes;
            bytes[2] = sh->down_bytes;
        }
        if ((rc = mdev_copy(o->dev, slot[e], src, bytes, o->slot_use[slot[e]], &cs))) return rc;
        if (kind[e] == OFF_ADMIT && (rc = add_pending(o, slot[e], cs))) return rc;
        o->pcie_groups++;
        o->pcie_bytes += bytes[0] + bytes[1] + bytes[2];
        mdev_group one =
            make_group(o, il, e, slot[e], xg + count[e] * E, count[e + 1] - count[e], out + count[e] * E, dev_io);
        if ((rc = mdev_compute(o->dev, &one, 1, cs, seq))) return rc;
        o->slot_use[slot[e]] = *seq;
    }
    return STRATA_OK;
}

/* Unpins this layer's resident slots and gives the borrowed ones back (what a finished layer does). */
static void release_layer(off_engine *o) {
    for (int32_t i = 0; i < o->n_pinned; i++) ec_unpin(o->ec, o->pinned[i]);
    o->n_pinned = 0;
    for (int32_t i = 0; i < o->n_borrowed; i++) ec_return(o->ec, o->borrowed[i]);
    o->n_borrowed = 0;
}

strata_status off_finish(off_plan *pl, double cpu_s, uint64_t cpu_groups, uint64_t cpu_bytes) {
    off_engine *o = pl->o;
    const int il = pl->il;
    const uint64_t seq = pl->seq;
    strata_status rc = STRATA_OK;
    double wait_s = 0;                        /* how long the merge waited for the device (the ONLINE split) */
    if (o->dev && seq) {
        const uint64_t t0 = trc_on() ? trc_now() : 0;
        wd_wait_begin("waiting for the device's copies and computations (merge)");
        const double w0 = o->frac ? wall_s() : 0;
        const int gave_up = mdev_wait_compute(o->dev, seq);
        if (o->frac) wait_s = wall_s() - w0;
        if (trc_on()) trc_emit(TRC_MERGE_WAIT, t0, trc_now(), il, 0, 0, (int64_t)seq);
        if (gave_up) {
            /* the watchdog: drop the queued work (it reads this layer's buffers), publish the loads
             * that landed, forget those that did not, and give back what a finished layer would */
            const uint64_t landed = mdev_cancel(o->dev);
            for (int32_t i = 0; i < o->n_pending; i++) {
                if (o->pending[i].seq <= landed) ec_loaded(o->ec, o->pending[i].slot);
                else ec_abort(o->ec, o->pending[i].slot);
            }
            o->n_pending = 0;
            release_layer(o);
            pthread_mutex_unlock(&o->mu);
            return wd_fail("waiting for the device's copies and computations (merge); the queued device work "
                           "was cancelled (is the link too slow? see --sim-link-gbps, --pcie-frac)");
        }
        wd_wait_end();
    }
    if (o->ec) release_layer(o);
    o->cpu_s += cpu_s;
    o->cpu_groups += cpu_groups;
    o->cpu_bytes += cpu_bytes;
    if (o->frac && o->dev && pl->L < o->stream_min && cpu_groups) {
        /* the ONLINE split, after a decode window of this layer that gave the CPU pool work: the time of its
         * expert stage (the CPU pool's share, then the wait for the device's) at the share it used */
        o->split_updates += (uint64_t)off_split_step(&o->frac[il], cpu_s + wait_s);
    }
    if (o->ec && !o->p.no_swaps && il == o->n_layer - 1 && o->windows % (uint64_t)o->adjust_interval == 0) {
        ec_swap *sw = o->swaps;
        const int n = ec_plan_round(o->ec, sw, o->max_swaps);
        if (trc_on()) {
            const uint64_t t = trc_now();
            for (int i = 0; i < n; i++)
                trc_emit(TRC_CACHE_SWAP, t, t, sw[i].layer, sw[i].in_expert, sw[i].out_expert, sw[i].slot);
        }
        for (int i = 0; i < n; i++) {
            const void *src[3];
            size_t bytes[3];
            uint64_t cs;
            strata_status r = rc;
            if (!r) {
                expert_src(o, sw[i].layer, sw[i].in_expert, src, bytes);
                r = mdev_copy(o->dev, sw[i].slot, src, bytes, o->slot_use[sw[i].slot], &cs);
                if (!r) r = add_pending(o, sw[i].slot, cs);   /* (on failure here the copy still lands;
                                                                  the slot is then just never published) */
            }
            if (r) {
                ec_abort(o->ec, sw[i].slot);      /* a swap whose copy was not issued frees its slot */
                rc = r;
            }
        }
    }
    pl->o = NULL;                             /* the plan ends with the lock */
    pthread_mutex_unlock(&o->mu);
    return rc;
}

void off_counts(off_engine *o, uint64_t *hits, uint64_t *lookups) {
    *hits = *lookups = 0;
    if (!o || !o->ec) return;
    pthread_mutex_lock(&o->mu);
    const ec_stats st = ec_get_stats(o->ec);
    *hits = st.hits;
    *lookups = st.lookups;
    pthread_mutex_unlock(&o->mu);
}

void off_resident(off_engine *o, int32_t *per_layer, int32_t n) {
    memset(per_layer, 0, (size_t)n * sizeof *per_layer);
    if (!o->ec) return;
    pthread_mutex_lock(&o->mu);
    const int32_t ns = ec_n_slots(o->ec);
    for (int32_t sl = 0; sl < ns; sl++) {
        int32_t layer, expert;
        if (ec_slot_info(o->ec, sl, &layer, &expert, NULL) == EC_READY && layer >= 0 && layer < n) per_layer[layer]++;
    }
    pthread_mutex_unlock(&o->mu);
}

void off_get_stats(off_engine *o, strata_offload_stats *out) {
    pthread_mutex_lock(&o->mu);
    out->pcie_frac = o->pcie_frac;
    out->split = o->frac ? STRATA_SPLIT_ONLINE : STRATA_SPLIT_SEED;
    out->split_updates = o->split_updates;
    out->pcie_frac_min = out->pcie_frac_max = o->pcie_frac;
    if (o->frac) {
        double sum = 0;
        for (int32_t i = 0; i < o->n_layer; i++) {
            const float f = o->frac[i].f;
            sum += f;
            if (f < out->pcie_frac_min) out->pcie_frac_min = f;
            if (f > out->pcie_frac_max) out->pcie_frac_max = f;
        }
        out->pcie_frac = (float)(sum / o->n_layer);
    }
    out->tail_skip = o->tail_skip;
    out->cache_slots = o->n_cache_slots;
    out->staging_slots = o->n_staging;
    out->slot_bytes = o->slot_bytes;
    out->probe_gbps = o->probe_gbps;
    if (o->ec) {
        const ec_stats st = ec_get_stats(o->ec);
        out->cache_hits = st.hits;
        out->cache_lookups = st.lookups;
        out->cache_swaps = st.swaps;
        out->cache_admits = st.admits;
    }
    out->cache_group_hits = o->group_hits;
    out->cache_group_lookups = o->group_lookups;
    out->pcie_groups = o->pcie_groups;
    out->pcie_bytes = o->pcie_bytes;
    out->cpu_groups = o->cpu_groups;
    out->cpu_bytes = o->cpu_bytes;
    out->skipped_experts = o->skipped;
    out->cpu_s = o->cpu_s;
    out->windows = o->windows;
    out->prefill_chunks = o->stream_chunks;
    out->borrowed_slots = o->borrow_total;
    if (o->dev) mdev_counters(o->dev, &out->copy_bytes, &out->act_bytes, &out->copy_s, &out->device_s);
    pthread_mutex_unlock(&o->mu);
}

void off_set_pcie_frac(off_engine *o, float pcie_frac) {
    pthread_mutex_lock(&o->mu);
    o->pcie_frac = o->dev ? pcie_frac : 0.0f;
    if (o->frac)
        for (int32_t i = 0; i < o->n_layer; i++) o->frac[i] = (off_split_state){.f = o->pcie_frac};
    pthread_mutex_unlock(&o->mu);
}

const char *off_log(const off_engine *o) { return o->log; }

int off_has_device(const off_engine *o) { return o && o->dev != NULL; }

strata_status off_device_events(off_engine *o, const char *path) {
    if (!o || !o->dev)
        return strata_fail(STRATA_ERR_UNSUPPORTED, "device events: the model runs without a device (use device sim)");
    mdev *d = o->dev;
    if (!path) {
        mdev_events_enable(d, 1);
        return STRATA_OK;
    }
    FILE *f = fopen(path, "w");
    if (!f) return strata_fail(STRATA_ERR_IO, "device events: cannot write %s", path);
    const int64_t n = mdev_events(d, NULL, 0);
    mdev_event *ev = malloc((size_t)(n > 0 ? n : 1) * sizeof *ev);
    if (!ev) { fclose(f); return strata_fail(STRATA_ERR_NOMEM, "device events: no memory"); }
    const int64_t got = mdev_events(d, ev, n);
    mdev_events_enable(d, 0);
    for (int64_t i = 0; i < got && i < n; i++) {
        fprintf(f, "{\"engine\": \"%s\", \"seq\": %llu, \"after\": %llu, \"slot\": %d, \"slots\": [",
                ev[i].engine ? "compute" : "copy", (unsigned long long)ev[i].seq, (unsigned long long)ev[i].after, ev[i].slot);
        for (int k = 0; k < ev[i].n_slots && k < 8; k++) fprintf(f, k ? ", %d" : "%d", ev[i].slots[k]);
        fprintf(f, "], \"t0\": %.9f, \"t1\": %.9f}\n", ev[i].t0, ev[i].t1);
    }
    free(ev);
    return fclose(f) ? strata_fail(STRATA_ERR_IO, "device events: error writing %s", path) : STRATA_OK;
}
