/*
 * store.c — the model's side of the expert store (moe/xstore.h, issue 20 point 1): which access mode
 * the routed experts get, the RAM budget, and the API calls.
 *
 * expert_io AUTO picks DIRECT when the routed experts do not fit in what the process may use next to
 * the rest: allowed = min(MemAvailable, the memory cgroup's limit — v1 memory.limit_in_bytes or v2
 * memory.max, the smallest up the hierarchy), and the rest = dense weights (page cache: a cgroup is
 * charged for it) + one session's state at min(n_ctx, 8192) tokens + a margin of 512 MiB + 1/16 of
 * allowed (the interpreter, buffers, scratch). The default RAM budget is allowed minus the rest.
 */
#include "model.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gguf/gguf_internal.h"
#include "moe/policy.h"
#include "util/aio.h"
#include "util/error.h"

static const char EXPS[3][40] = {"blk.%d.ffn_gate_up_exps.weight", "blk.%d.ffn_gate_exps.weight", "blk.%d.ffn_up_exps.weight"};
static const char EXPS_DOWN[] = "blk.%d.ffn_down_exps.weight";

static int find(const strata_model *m, const char *fmt, int il, strata_gguf_tensor *t) {
    char name[96];
    snprintf(name, sizeof name, fmt, il);
    int64_t i;
    return strata_gguf_find_tensor(m->gguf, name, &i) == STRATA_OK && strata_gguf_tensor_info(m->gguf, i, t) == STRATA_OK;
}

static uint64_t read_u64_file(const char *path) {
    FILE *f = fopen(path, "r");
    if (!f) return UINT64_MAX;
    char buf[64] = "";
    uint64_t v = UINT64_MAX;
    if (fgets(buf, sizeof buf, f) && strncmp(buf, "max", 3)) {
        char *end;
        errno = 0;
        const unsigned long long x = strtoull(buf, &end, 10);
        if (!errno && end != buf) v = x;
    }
    fclose(f);
    return v;
}

/* The smallest memory limit of this process's cgroup and its parents (UINT64_MAX: none). */
static uint64_t cgroup_limit(char *where, size_t n) {
    FILE *f = fopen("/proc/self/cgroup", "r");
    if (!f) return UINT64_MAX;
    char line[1024], v1[512] = "", v2[512] = "";
    int have1 = 0, have2 = 0;
    while (fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = 0;
        char *a = strchr(line, ':'), *b = a ? strchr(a + 1, ':') : NULL;
        if (!a || !b) continue;
        *b = 0;
        const char *ctrl = a + 1, *path = b + 1;
        if (!strcmp(ctrl, "")) { snprintf(v2, sizeof v2, "%s", path); have2 = 1; }
        else {
            /* v1: a comma-separated controller list naming memory */
            char c[256];
            snprintf(c, sizeof c, ",%s,", ctrl);
            if (strstr(c, ",memory,")) { snprintf(v1, sizeof v1, "%s", path); have1 = 1; }
        }
    }
    fclose(f);
    uint64_t best = UINT64_MAX;
    for (int v = 0; v < 2; v++) {
        if (v == 0 ? !have1 : !have2) continue;
        char dir[512];
        snprintf(dir, sizeof dir, "%s", v == 0 ? v1 : v2);
        for (;;) {
            char p[700];
            snprintf(p, sizeof p, v == 0 ? "/sys/fs/cgroup/memory%s/memory.limit_in_bytes" : "/sys/fs/cgroup%s/memory.max",
                     strcmp(dir, "/") ? dir : "");
            const uint64_t lim = read_u64_file(p);
            /* v1 writes a page-rounded 2^63 for "no limit" */
            if (lim < ((uint64_t)1 << 60) && lim < best) {
                best = lim;
                snprintf(where, n, "%s", p);
            }
            char *slash = strrchr(dir, '/');
            if (!slash || slash == dir) {
                if (strcmp(dir, "/") && strcmp(dir, "")) { snprintf(dir, sizeof dir, "/"); continue; }
                break;
            }
            *slash = 0;
        }
    }
    return best;
}

static uint64_t mem_available(void) {
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f) return UINT64_MAX;
    char line[256];
    uint64_t v = UINT64_MAX;
    while (fgets(line, sizeof line, f)) {
        unsigned long long kb;
        if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1) { v = (uint64_t)kb * 1024; break; }
    }
    fclose(f);
    return v;
}

static double gib(uint64_t b) { return (double)b / (1024.0 * 1024.0 * 1024.0); }

strata_status mdl_store_open(strata_model *m) {
    const strata_model_params *p = &m->params;
    const mdl_hparams *hp = &m->hp;
    m->xs = NULL;
    m->store_log[0] = 0;
    if (p->expert_io < STRATA_EXPERT_IO_AUTO || p->expert_io > STRATA_EXPERT_IO_DIRECT)
        return strata_fail(STRATA_ERR_INVALID_ARG, "model: expert_io %d (use 0 auto, 1 mmap, 2 direct)", p->expert_io);
    if (p->expert_io == STRATA_EXPERT_IO_MMAP) {
        snprintf(m->store_log, sizeof m->store_log, "experts: mmap (asked for)");
        return STRATA_OK;
    }
    const int32_t n_store = hp->n_layer + hp->n_mtp;
    xs_layer *layers = calloc((size_t)n_store, sizeof *layers);
    if (!layers) return strata_fail(STRATA_ERR_NOMEM, "expert store: no memory");
    uint64_t expert_bytes = 0;
    int32_t split = -1;
    const char *why_not = NULL;
    for (int32_t il = 0; il < n_store && !why_not; il++) {
        strata_gguf_tensor t[3];
        int n = 0;
        if (find(m, EXPS[0], il, &t[0])) n = 1;
        else if (find(m, EXPS[1], il, &t[0]) && find(m, EXPS[2], il, &t[1])) n = 2;
        if (!n || !find(m, EXPS_DOWN, il, &t[n])) { why_not = "a layer has no routed expert tensors"; break; }
        n++;
        const mdl_layer *l = &m->layers[il];
        const mdl_mat *mats[3];
        int nm = 0;
        mats[nm++] = &l->exp_gate;
        if (!l->exp_fused) mats[nm++] = &l->exp_up;
        mats[nm++] = &l->exp_down;
        if (nm != n) { why_not = "the expert tensors do not match the loaded layer"; break; }
        layers[il].n_part = n;
        for (int q = 0; q < n; q++) {
            const mdl_mat *w = mats[q];
            if (split < 0) split = t[q].split;
            if (t[q].split != split) { why_not = "the experts span several split files"; break; }
            layers[il].off[q] = t[q].offset;
            layers[il].stride[q] = w->mat_bytes;
            layers[il].bytes[q] = w->mat_bytes;
            expert_bytes += (uint64_t)w->mat_bytes * (uint64_t)hp->n_expert;
        }
    }
    const char *path = split >= 0 ? gguf_split_path(m->gguf, split) : NULL;
    if (!why_not && !path) why_not = "the model was not loaded from a file";
    if (why_not) {
        free(layers);
        if (p->expert_io == STRATA_EXPERT_IO_DIRECT)
            return strata_fail(STRATA_ERR_UNSUPPORTED, "expert_io direct: %s", why_not);
        snprintf(m->store_log, sizeof m->store_log, "experts: mmap (%s)", why_not);
        return STRATA_OK;
    }
    char where[700] = "MemAvailable";
    const uint64_t avail = mem_available(), lim = cgroup_limit(where, sizeof where);
    const uint64_t allowed = lim < avail ? lim : avail;
    if (lim >= avail) snprintf(where, sizeof where, "MemAvailable");
    const int64_t ctx = p->n_ctx < 8192 ? p->n_ctx : 8192;
    const uint64_t dense = m->weight_bytes > expert_bytes ? m->weight_bytes - expert_bytes : 0;
    const uint64_t rest = dense + mdl_state_bytes(m, ctx) + ((uint64_t)512 << 20) + (allowed == UINT64_MAX ? 0 : allowed / 16);
    const uint64_t room = allowed == UINT64_MAX ? UINT64_MAX : allowed > rest ? allowed - rest : 0;
    char why[400];
    if (p->expert_io == STRATA_EXPERT_IO_AUTO) {
        if (allowed == UINT64_MAX || expert_bytes <= room) {
            free(layers);
            snprintf(m->store_log, sizeof m->store_log,
                     "experts: mmap (auto: %.2f GiB of routed experts fit beside %.2f GiB of the rest in %.2f GiB allowed by %s)",
                     gib(expert_bytes), gib(rest), gib(allowed), where);
            return STRATA_OK;
        }
        snprintf(why, sizeof why, "auto: %.2f GiB of routed experts do not fit beside %.2f GiB of the rest in %.2f GiB allowed by %s",
                 gib(expert_bytes), gib(rest), gib(allowed), where);
    } else {
        snprintf(why, sizeof why, "asked for");
    }
    uint64_t budget = p->ram_bytes;
    char budget_why[200];
    if (budget) snprintf(budget_why, sizeof budget_why, "--ram-gib");
    else {
        budget = room == UINT64_MAX ? expert_bytes : room;
        snprintf(budget_why, sizeof budget_why, "what %s allows minus %.2f GiB for the rest", where, gib(rest));
        /* no room: two layers' worth (one for the policy), not a refusal: the user asked for no budget */
        const uint64_t least = 2 * (uint64_t)hp->n_expert * (expert_bytes / ((uint64_t)hp->n_expert * (uint64_t)n_store) + 3 * 4096);
        if (budget < least) {
            budget = least;
            snprintf(budget_why, sizeof budget_why, "two layers' experts: %s leaves no room beside %.2f GiB for the rest "
                     "(give --ram-gib)", where, gib(rest));
        }
    }
    const xs_params xp = {.path = path, .n_layer = n_store, .n_expert = hp->n_expert, .ram_bytes = budget,
                          .policy = p->cache_policy, .io_backend = p->expert_io_backend, .io_depth = p->expert_io_depth,
                          .test_short_read_at = p->expert_io_test_short_read_at};
    strata_status rc = xs_create(&xp, layers, &m->xs);
    free(layers);
    if (rc) return rc;
    snprintf(m->store_log, sizeof m->store_log, "experts: direct (%s); budget from %s; %s", why, budget_why, xs_log(m->xs));
    return STRATA_OK;
}

void mdl_store_close(strata_model *m) {
    xs_free(m->xs);
    m->xs = NULL;
}

strata_status strata_model_store_stats(strata_model *m, strata_store_stats *out) {
    if (!m || !out) return strata_fail(STRATA_ERR_INVALID_ARG, "strata_model_store_stats: null argument");
    memset(out, 0, sizeof *out);
    if (!m->xs) return STRATA_OK;
    xs_stats s;
    xs_get_stats(m->xs, &s);
    out->active = 1;
    out->ram_slots = xs_n_slots(m->xs);
    out->ram_bytes = (uint64_t)xs_n_slots(m->xs) * xs_slot_size(m->xs);
    out->ram_lookups = s.lookups;
    out->ram_hits = s.hits;
    out->ram_groups = s.groups;
    out->ram_group_hits = s.group_hits;
    out->ram_miss_bytes = s.miss_bytes;
    out->read_bytes = s.read_bytes;
    out->reads = s.reads;
    out->evictions = s.evictions;
    out->bypassed = s.bypassed;
    out->read_s = s.read_s;
    out->prefetch_experts = s.prefetch_experts;
    out->prefetch_bytes = s.prefetch_bytes;
    out->prefetch_unused_experts = s.prefetch_unused_experts;
    out->prefetch_unused_bytes = s.prefetch_unused_bytes;
    out->predicted = s.predicted;
    out->predicted_right = s.predicted_right;
    return STRATA_OK;
}

const char *strata_model_store_log(const strata_model *m) { return m ? m->store_log : ""; }

const char *strata_cache_policies(void) { return xpol_names(); }
