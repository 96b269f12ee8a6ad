/*
 * test_xstore.c — the expert store's RAM tier (native/src/moe/xstore.h) and its reads (util/aio.h) on a
 * file of known bytes: every acquired expert's pieces equal the file's bytes, for io_uring and the pread
 * threads, with and without prefetch, from two threads taking turns on one store (the store's lock), under
 * a budget that keeps a fraction of the experts so slots are evicted and reread all the time; the policy's
 * invariants after every line; a budget below one layer refused; a truncated file and an injected short
 * read give the error and leave the store usable. Runs in the ASan+UBSan and TSan builds too.
 */
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "moe/xstore.h"
#include "util/aio.h"

#include "check.h"

enum { NL = 4, NE = 24, LINES = 300 };
static const uint64_t PIECE[3] = {5000, 7001, 3333};   /* odd sizes: pieces straddle 4 KiB blocks */
static char g_path[256];
static xs_layer g_layers[NL];
static uint64_t g_size;

static unsigned char byte_at(uint64_t off) { return (unsigned char)((off * 2654435761u) >> 13); }

static void make_file(void) {
    snprintf(g_path, sizeof g_path, "/tmp/strata-xstore-%d.bin", (int)getpid());
    uint64_t off = 777;                                  /* tensors at unaligned offsets, as GGUF's 32 */
    for (int il = 0; il < NL; il++) {
        g_layers[il].n_part = 3;
        for (int q = 0; q < 3; q++) {
            g_layers[il].off[q] = off;
            g_layers[il].stride[q] = PIECE[q] + 32;      /* a gap between experts */
            g_layers[il].bytes[q] = PIECE[q];
            off += (uint64_t)NE * g_layers[il].stride[q] + 96;
        }
    }
    g_size = off + 123;
    FILE *f = fopen(g_path, "wb");
    unsigned char *buf = malloc(g_size);
    for (uint64_t i = 0; i < g_size; i++) buf[i] = byte_at(i);
    fwrite(buf, 1, g_size, f);
    fclose(f);
    free(buf);
}

static xs_store *open_store(int backend, uint64_t slots, uint64_t short_at) {
    /* one slot: each piece's aligned superset region */
    uint64_t slot = 0;
    for (int q = 0; q < 3; q++) slot += (PIECE[q] + 4096 + 4095) / 4096 * 4096;
    const xs_params p = {.path = g_path, .n_layer = NL, .n_expert = NE, .ram_bytes = slots * slot,
                         .io_backend = backend, .io_depth = 16, .test_short_read_at = short_at};
    xs_store *x = NULL;
    CHECK(xs_create(&p, g_layers, &x) == STRATA_OK && x);
    return x;
}

/* One random line of layer il: distinct experts, pieces checked against the file. */
static int one_line(xs_store *x, unsigned *seed, int prefetch) {
    int32_t il = (int32_t)(rand_r(seed) % NL), n = 1 + (int32_t)(rand_r(seed) % 8), e[NE], picks[NE], rank[NE];
    uint8_t used[NE] = {0};
    for (int32_t i = 0; i < n;) {
        /* a skewed choice: low ids are hot */
        const int32_t c = (int32_t)((rand_r(seed) % NE) * (rand_r(seed) % NE) / NE);
        if (used[c]) continue;
        used[c] = 1;
        e[i] = c; picks[i] = 1 + (int32_t)(rand_r(seed) % 3); rank[i] = (int32_t)(rand_r(seed) % 10);
        i++;
    }
    const char *ptr[NE * XS_MAX_PARTS];
    if (xs_acquire(x, il, e, picks, rank, n, ptr) != STRATA_OK) return 1;
    int bad = 0;
    for (int32_t i = 0; i < n; i++)
        for (int q = 0; q < 3; q++) {
            const uint64_t off = g_layers[il].off[q] + (uint64_t)e[i] * g_layers[il].stride[q];
            for (uint64_t k = 0; k < PIECE[q]; k += 97)
                if ((unsigned char)ptr[i * XS_MAX_PARTS + q][k] != byte_at(off + k)) { bad = 1; break; }
        }
    CHECK(!bad);
    if (prefetch && il + 1 < NL) {
        int32_t pe[4] = {(int32_t)(rand_r(seed) % NE), 0, 0, 0};
        pe[1] = (pe[0] + 1) % NE; pe[2] = (pe[0] + 5) % NE; pe[3] = (pe[0] + 11) % NE;
        xs_prefetch(x, il + 1, pe, 4);
    }
    xs_release(x);
    char why[200];
    CHECK(xs_validate(x, why, sizeof why) == 0);   /* takes the lock: outside acquire .. release */
    return 0;
}

typedef struct { xs_store *x; unsigned seed; int prefetch; } worker;

static void *run_lines(void *arg) {
    worker *w = arg;
    for (int i = 0; i < LINES; i++) CHECK(one_line(w->x, &w->seed, w->prefetch) == 0);
    return NULL;
}

static void stress(int backend, int prefetch) {
    xs_store *x = open_store(backend, NE + 20, 0);   /* 20 policy slots of 96 experts */
    if (!x) return;
    worker w[2] = {{x, 1u + (unsigned)backend, prefetch}, {x, 7u + (unsigned)backend, prefetch}};
    pthread_t t;
    CHECK(pthread_create(&t, NULL, run_lines, &w[1]) == 0);
    run_lines(&w[0]);
    pthread_join(t, NULL);
    xs_stats st;
    xs_get_stats(x, &st);
    CHECK(st.hits > 0 && st.hits < st.lookups && st.evictions > 0);
    CHECK(st.read_bytes >= st.miss_bytes);
    if (prefetch) CHECK(st.prefetch_experts > 0 && st.prefetch_unused_experts <= st.prefetch_experts);
    else CHECK(st.prefetch_experts == 0);
    printf("backend %s prefetch %d: %s; hits %llu / %llu, %llu reads\n", backend == AIO_PREAD ? "pread" : "io_uring",
           prefetch, xs_log(x), (unsigned long long)st.hits, (unsigned long long)st.lookups, (unsigned long long)st.reads);
    xs_free(x);
}

int main(void) {
    make_file();
    for (int b = 0; b < 2; b++)
        for (int pf = 0; pf < 2; pf++) stress(b ? AIO_PREAD : AIO_AUTO, pf);

    /* below one layer's experts: refused, naming the smallest that works */
    {
        const xs_params p = {.path = g_path, .n_layer = NL, .n_expert = NE, .ram_bytes = 4096};
        xs_store *x = NULL;
        CHECK(xs_create(&p, g_layers, &x) == STRATA_ERR_INVALID_ARG && !x);
        CHECK(strstr(strata_last_error(), "give at least") != NULL);
    }
    /* an injected short read: the error, then the same line works (the slot is read again) */
    {
        xs_store *x = open_store(AIO_AUTO, NE + 4, 2);
        int32_t e[2] = {3, 4}, pk[2] = {1, 1}, rk[2] = {0, 1};
        const char *ptr[2 * XS_MAX_PARTS];
        CHECK(xs_acquire(x, 1, e, pk, rk, 2, ptr) == STRATA_ERR_IO);
        CHECK(strstr(strata_last_error(), "short read") != NULL);
        CHECK(xs_acquire(x, 1, e, pk, rk, 2, ptr) == STRATA_OK);
        const uint64_t off = g_layers[1].off[0] + 3 * g_layers[1].stride[0];
        CHECK((unsigned char)ptr[0][0] == byte_at(off) && (unsigned char)ptr[0][4999] == byte_at(off + 4999));
        xs_release(x);
        xs_free(x);
    }
    /* the file truncated under the store: an error naming the change, every time */
    {
        xs_store *x = open_store(AIO_AUTO, NE + 4, 0);
        CHECK(truncate(g_path, (off_t)(g_size / 2)) == 0);
        int32_t e[1] = {20}, pk[1] = {1}, rk[1] = {0};
        const char *ptr[XS_MAX_PARTS];
        for (int i = 0; i < 2; i++) {
            CHECK(xs_acquire(x, 3, e, pk, rk, 1, ptr) == STRATA_ERR_IO);
            CHECK(strstr(strata_last_error(), "changed size") != NULL);
        }
        char why[200];
        CHECK(xs_validate(x, why, sizeof why) == 0);
        xs_free(x);
    }
    unlink(g_path);
    if (!g_failed) printf("test_xstore: all checks passed\n");
    return g_failed != 0;
}
