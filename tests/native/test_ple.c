/*
 * test_ple.c — the PLE table access layer (native/src/ple/ple.h) without a model: a table file of
 * known rows read in mmap and direct mode (the same bytes, the backing file found from the mapping),
 * WILLNEED prefetch counting distinct pages (rows straddling a page count both), the hash against a
 * direct transcription of spec §6, NVFP4 packed-row decoding, the sidecar JSON reader, and the gather
 * worker: many steps from two threads sharing one channel (each result checked), and a stalled step
 * that fails at the timeout and is caught up by the next submit. Runs in the ASan+UBSan build too (and
 * builds with -fsanitize=thread). Exit code 0 = pass.
 */
#define _GNU_SOURCE
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "ple/ple.h"
#include <stdatomic.h>

#include "check.h"

#define ROWB 90
#define NROWS 4000

static uint8_t row_byte(uint64_t r, size_t i) { return (uint8_t)((r * 131u + i * 7u + (r >> 8)) & 0xFF); }

static char g_path[256];

static void make_file(void) {
    snprintf(g_path, sizeof g_path, "/tmp/strata_test_ple_%d.bin", (int)getpid());
    FILE *f = fopen(g_path, "wb");
    if (!f) { perror("fopen"); exit(1); }
    for (uint64_t r = 0; r < NROWS; r++)
        for (size_t i = 0; i < ROWB; i++) fputc(row_byte(r, i), f);
    fclose(f);
}

static int row_ok(const uint8_t *p, uint64_t r) {
    for (size_t i = 0; i < ROWB; i++)
        if (p[i] != row_byte(r, i)) return 0;
    return 1;
}

static void test_modes_read_the_same_rows(void) {
    const uint64_t rows[] = {0, 1, 45, 46, 1000, 3999, 45, 2222};
    const int n = sizeof rows / sizeof rows[0];
    uint8_t buf[sizeof rows / sizeof rows[0] * ROWB];
    for (int mode = PLE_MODE_MMAP; mode <= PLE_MODE_DIRECT; mode++) {
        ple_table t;
        CHECK(ple_table_open_file(&t, g_path, ROWB, NROWS, mode, NULL) == STRATA_OK);
        CHECK(t.mode == mode && t.madv_random && t.fd >= 0);
        memset(buf, 0, sizeof buf);
        CHECK(ple_gather(&t, rows, n, buf) == STRATA_OK);
        for (int i = 0; i < n; i++) CHECK(row_ok(buf + i * ROWB, rows[i]));
        /* the mapping found from an address inside it names the same file and offset */
        char p[1024];
        uint64_t off = 0;
        CHECK(ple_backing_file(t.rows + 5 * ROWB, p, sizeof p, &off) && off == 5 * ROWB);
        ple_table mt;
        CHECK(ple_table_open_mapped(&mt, t.rows, ROWB, NROWS, PLE_MODE_DIRECT, NULL) == STRATA_OK);
        CHECK(mt.mode == PLE_MODE_DIRECT && mt.fd >= 0 && mt.file_off == 0);
        memset(buf, 0, sizeof buf);
        CHECK(ple_gather(&mt, rows, n, buf) == STRATA_OK);
        for (int i = 0; i < n; i++) CHECK(row_ok(buf + i * ROWB, rows[i]));
        ple_table_close(&mt);
        uint64_t res = 0, tot = 0;
        CHECK(ple_resident(&t, &res, &tot) == STRATA_OK && tot == (NROWS * ROWB + 4095) / 4096 && res <= tot);
        ple_table_close(&t);
    }
    /* a table in anonymous memory has no file: mmap mode whatever was asked */
    uint8_t *mem = mmap(NULL, 8192, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    ple_table t;
    CHECK(ple_table_open_mapped(&t, mem, ROWB, 8192 / ROWB, PLE_MODE_DIRECT, NULL) == STRATA_OK);
    CHECK(t.mode == PLE_MODE_MMAP && t.fd < 0 && strstr(t.why, "not backed by a file"));
    ple_table_close(&t);
    munmap(mem, 8192);
}

static void test_size_mismatch_refused(void) {
    ple_table t;
    CHECK(ple_table_open_file(&t, g_path, ROWB, NROWS + 1, PLE_MODE_MMAP, NULL) == STRATA_ERR_FORMAT);
    CHECK(strstr(strata_last_error(), "truncated") != NULL);
    CHECK(ple_table_open_file(&t, "/nonexistent/x.bin", ROWB, 1, PLE_MODE_MMAP, NULL) == STRATA_ERR_IO);
}

static void test_prefetch_pages(void) {
    ple_table t;
    CHECK(ple_table_open_file(&t, g_path, ROWB, NROWS, PLE_MODE_MMAP, NULL) == STRATA_OK);
    /* row 45 spans bytes 4050..4139: pages 0 and 1; row 0: page 0; row 1000: 90000..90089: page 21 */
    const uint64_t rows[] = {45, 0, 1000, 45, 1000};
    CHECK(ple_prefetch(&t, rows, 5) == 3);
    CHECK(ple_prefetch(&t, rows, 0) == 0);
    ple_table_close(&t);
}

static void test_hash_matches_the_spec(void) {
    ple_hash h;
    memset(&h, 0, sizeof h);
    h.n = 3;
    h.heads_per = 2;
    h.eos = 7;
    h.mult[0] = 23703573157769ull; h.mult[1] = 20109073645365ull; h.mult[2] = 8052911324071ull;
    const uint64_t size[4] = {1009, 1013, 1019, 1021};
    uint64_t off = 0;
    for (int i = 0; i < 4; i++) { h.size[i] = size[i]; h.off[i] = off; off += size[i]; }
    const int32_t hist[] = {7, 7, 100, 7, 200, 300};   /* two context ids, then 4 tokens */
    uint64_t rows[4 * 4];
    ple_hash_rows(&h, hist, 4, rows);
    for (int t = 0; t < 4; t++) {
        const int p = 2 + t;
        uint64_t s[3] = {(uint64_t)hist[p], 0, 0};
        int cut = 0;
        for (int k = 1; k < 3; k++) { s[k] = cut ? 7u : (uint64_t)hist[p - k]; if (hist[p - k] == 7) cut = 1; }
        const uint64_t m2 = s[0] * h.mult[0] ^ s[1] * h.mult[1], m3 = m2 ^ s[2] * h.mult[2];
        for (int g = 0; g < 2; g++) {
            CHECK(rows[t * 4 + g] == m2 % size[g] + h.off[g]);
            CHECK(rows[t * 4 + 2 + g] == m3 % size[2 + g] + h.off[2 + g]);
        }
    }
}

static void test_nvfp4_row(void) {
    uint8_t row[16 / 2 + 1];
    /* codes 0..15 (value 2j low nibble), block scale E4M3 0x38 = 1.0, global 0.5 */
    for (int j = 0; j < 8; j++) row[j] = (uint8_t)((2 * j) | ((2 * j + 1) << 4));
    row[8] = 0x38;
    float out[16];
    ple_nvfp4_row(row, out, 16, 0.5f);
    const float e2m1[8] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6};
    for (int i = 0; i < 16; i++) CHECK(out[i] == (i < 8 ? e2m1[i] : -e2m1[i - 8]) * 0.5f);
    row[8] = 0x01;                       /* smallest subnormal E4M3: 2^-9 */
    ple_nvfp4_row(row, out, 16, 1.0f);
    CHECK(out[2] == ldexpf(1.0f, -9));
}

static void test_json(void) {
    const char *js = "{\"format\": \"strata-ple-nvfp4-v1\", \"total_rows\": 12345, \"path\": \"a\\\"b\",\n"
                     " \"global_scales\": [0.5, 1e-3, 2], \"empty\": []}";
    char s[64];
    double x = 0, v[4];
    CHECK(ple_json_string(js, "format", s, sizeof s) && !strcmp(s, "strata-ple-nvfp4-v1"));
    CHECK(ple_json_string(js, "path", s, sizeof s) && !strcmp(s, "a\"b"));
    CHECK(ple_json_number(js, "total_rows", &x) && x == 12345);
    CHECK(!ple_json_number(js, "missing", &x) && !ple_json_string(js, "total_rows", s, sizeof s));
    CHECK(ple_json_numbers(js, "global_scales", v, 4) == 3 && v[0] == 0.5 && v[1] == 1e-3 && v[2] == 2);
    CHECK(ple_json_numbers(js, "global_scales", v, 2) == -1);   /* more values than room */
    CHECK(ple_json_numbers(js, "empty", v, 4) == 0);
}

/* The sidecar's checks: a whole sidecar accepted with its fields; counts that are not whole numbers, scales
 * that are not positive as floats, rows that do not fit the shards, another row width: refused, saying why. */
static void test_sidecar(void) {
    char js[1024];
    const char *fmt = "{\"format\": \"strata-ple-nvfp4-v1\", \"source\": \"ckpt\", \"total_rows\": %s, \"num_shards\": %s,"
                      " \"rows_per_shard\": 400, \"row_dim\": 160, \"code_bytes\": 80, \"scale_bytes\": 10,"
                      " \"row_width\": 90, \"global_scales\": [%s]}";
    ple_sidecar sc;
    snprintf(js, sizeof js, fmt, "1000", "3", "0.5, 1e-3, 2");
    CHECK(ple_sidecar_parse(js, "t.json", 160, &sc) == STRATA_OK);
    CHECK(sc.rows == 1000 && sc.n_shard == 3 && sc.shard_rows == 400 && sc.width == 90 && !strcmp(sc.source, "ckpt"));
    CHECK(sc.gscale && sc.gscale[0] == 0.5f && sc.gscale[1] == 1e-3f && sc.gscale[2] == 2.0f);
    free(sc.gscale);
    CHECK(ple_sidecar_parse(js, "t.json", 64, &sc) == STRATA_ERR_FORMAT && !sc.gscale);   /* another row width */
    CHECK(strstr(strata_last_error(), "t.json") && strstr(strata_last_error(), "64-value rows"));
    const char *bad[][3] = {{"1000", "2.5", "0.5, 1, 2"},      /* a fractional shard count */
                            {"1000.5", "3", "0.5, 1, 2"},      /* a fractional row count */
                            {"1201", "3", "0.5, 1, 2"},        /* more rows than three shards hold */
                            {"800", "3", "0.5, 1, 2"},         /* the last shard empty */
                            {"1000", "3", "0.5, 1e-50, 2"},    /* zero as a float */
                            {"1000", "3", "0.5, 1e300, 2"},    /* infinite as a float */
                            {"1000", "3", "0.5, 1"},           /* a scale short */
                            {"1000", "1e300", "1"},            /* a million shards at most */
                            {"1000", "-1", "1"}};              /* no shards (an absent count reads -1) */
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        snprintf(js, sizeof js, fmt, bad[i][0], bad[i][1], bad[i][2]);
        CHECK(ple_sidecar_parse(js, "t.json", 160, &sc) == STRATA_ERR_FORMAT && !sc.gscale);
        CHECK(strstr(strata_last_error(), "do not agree") != NULL);
    }
    CHECK(ple_sidecar_parse("{\"format\": \"other\"}", "t.json", 160, &sc) == STRATA_ERR_FORMAT);
    CHECK(strstr(strata_last_error(), "strata pack-ple") != NULL);
}

/* ---------------------------------------------------------------- the worker */

typedef struct {
    ple_worker *w;
    ple_hash *h;
    int steps, who;
    int bad;
    int inline_steps;            /* repeated steps whose rows were all cached (gathered by the client) */
} client;

static void *client_main(void *arg) {
    client *c = arg;
    int32_t hist[2 + 40];
    uint64_t want[40 * 4];
    for (int s = 0; s < c->steps; s++) {
        const int L = 1 + (s * 7 + c->who) % 40;
        for (int i = 0; i < 2 + L; i++) hist[i] = (int32_t)((s * 31 + i * 17 + c->who * 1000) % 5000);
        ple_hash_rows(c->h, hist, L, want);
        /* each step twice: where the cache kept its rows, the second is gathered here, not by the worker */
        for (int again = 0; again < 2; again++) {
            uint64_t seq;
            if (ple_submit(c->w, c, hist, L, &seq) != STRATA_OK) { c->bad++; continue; }
            double wait_s;
            if (ple_wait(c->w, seq, &wait_s) != STRATA_OK) { c->bad++; ple_release(c->w, c); continue; }
            if (c->w->result.rows != (uint64_t)L * 4) c->bad++;
            if (again && c->w->result.cache_hits == (uint64_t)L * 4) c->inline_steps++;
            for (int i = 0; i < L * 4; i++)
                if (c->w->rows[i] != want[i] || !row_ok(c->w->buf + (size_t)i * ROWB, want[i])) c->bad++;
            ple_release(c->w, c);
        }
    }
    return NULL;
}

static ple_hash small_hash(void) {
    ple_hash h;
    memset(&h, 0, sizeof h);
    h.n = 3;
    h.heads_per = 2;
    h.eos = 0;
    h.mult[0] = 3; h.mult[1] = 5; h.mult[2] = 7;
    for (int i = 0; i < 4; i++) { h.size[i] = 997; h.off[i] = (uint64_t)i * 997; }
    return h;
}

typedef struct {
    ple_worker *w;
    _Atomic int stop;
    int submitted;
} warmer;

/* Read-ahead requests (strata_session_ple_prefetch's) racing the clients: taken only when the channel is
 * free and the worker idle, never in a client's way. */
static void *warmer_main(void *arg) {
    warmer *q = arg;
    int32_t hist[2 + 4];
    for (int s = 0; !atomic_load(&q->stop); s++) {
        for (int i = 0; i < 6; i++) hist[i] = (int32_t)((s * 13 + i * 29) % 5000);
        q->submitted += ple_submit_warm(q->w, q, hist, 1 + s % 4);
    }
    return NULL;
}

static void test_worker_two_threads(void) {
    /* row cache off, evicting (50 rows), holding the table; a third thread submitting read-aheads */
    const uint64_t budgets[3] = {0, 50 * ROWB, 64u << 20};
    for (int mode = PLE_MODE_MMAP; mode <= PLE_MODE_DIRECT; mode++)
        for (int b = 0; b < 3; b++) {
            ple_table t;
            CHECK(ple_table_open_file(&t, g_path, ROWB, NROWS, mode, NULL) == STRATA_OK);
            ple_hash h = small_hash();
            ple_worker w;
            ple_params pp = ple_default_params();
            pp.cache_bytes = budgets[b];
            CHECK(ple_worker_start(&w, &t, &h, 40, &pp) == STRATA_OK);
            CHECK(w.cache.cap == (b == 0 ? 0 : b == 1 ? 50 : NROWS));
            client c[2] = {{&w, &h, 150, 0, 0, 0}, {&w, &h, 150, 1, 0, 0}};
            warmer q = {&w, 0, 0};
            pthread_t th[2], tq;
            pthread_create(&tq, NULL, warmer_main, &q);
            for (int i = 0; i < 2; i++) pthread_create(&th[i], NULL, client_main, &c[i]);
            for (int i = 0; i < 2; i++) pthread_join(th[i], NULL);
            atomic_store(&q.stop, 1);
            pthread_join(tq, NULL);
            CHECK(c[0].bad == 0 && c[1].bad == 0);
            /* a cache holding the table serves every repeated step from the client's thread */
            CHECK(b != 2 || (c[0].inline_steps == 150 && c[1].inline_steps == 150));
            CHECK(b != 0 || c[0].inline_steps + c[1].inline_steps == 0);
            CHECK(b > 0 || q.submitted == 0);            /* no cache: read-ahead is a no-op */
            /* every step, the clients' 600 (300, each twice) and the read-aheads, was done once; the worker ends idle */
            double ws;
            CHECK(ple_wait(&w, atomic_load(&w.req_seq), &ws) == STRATA_OK);
            CHECK(atomic_load(&w.done_seq) == 600 + (uint64_t)q.submitted && atomic_load(&w.req_seq) == atomic_load(&w.done_seq));
            CHECK(atomic_load(&w.cache.used) <= w.cache.cap);
            ple_worker_stop(&w);
            ple_table_close(&t);
        }
}

static void test_stalled_step_times_out(void) {
    ple_table t;
    CHECK(ple_table_open_file(&t, g_path, ROWB, NROWS, PLE_MODE_MMAP, NULL) == STRATA_OK);
    ple_hash h = small_hash();
    ple_worker w;
    CHECK(ple_worker_start(&w, &t, &h, 8, NULL) == STRATA_OK);
    w.timeout_s = 0.2;
    w.stall_ms = 600;
    const int32_t hist[] = {1, 2, 3, 4};
    uint64_t seq;
    double wait_s = 0;
    int owner = 0;
    CHECK(ple_submit(&w, &owner, hist, 2, &seq) == STRATA_OK && seq == 1);
    const double t0 = ple_now();
    CHECK(ple_wait(&w, seq, &wait_s) == STRATA_ERR_IO);
    CHECK(strstr(strata_last_error(), "did not finish within 0.2 s") != NULL);
    CHECK(ple_now() - t0 < 0.55 && wait_s >= 0.2);
    ple_release(&w, &owner);
    /* the next submit waits for the stalled step (another 0.2 s is not enough: refused) ... */
    int other = 0;
    CHECK(ple_submit(&w, &other, hist, 2, &seq) == STRATA_ERR_IO);
    CHECK(strstr(strata_last_error(), "still busy with step 1") != NULL);
    ple_release(&w, &other);
    /* ... and once the worker has caught up, steps run again */
    w.stall_ms = 0;
    w.timeout_s = 5;
    CHECK(ple_submit(&w, &other, hist, 2, &seq) == STRATA_OK && seq == 2);
    CHECK(ple_wait(&w, seq, &wait_s) == STRATA_OK && w.result.rows == 8);
    ple_release(&w, &other);
    ple_worker_stop(&w);
    ple_table_close(&t);
}

/* The settings arrive as ple_params, not from the environment: madv_random and prefetch off as
 * asked, and the worker's timeout and stall hook (step 2 only) from the same struct. */
static void test_params_are_the_settings(void) {
    ple_params p = ple_default_params();
    CHECK(p.madv_random == 1 && p.prefetch == 1 && p.step_timeout_s == 300.0 && p.test_stall_ms == 0);
    p.madv_random = 0;
    p.prefetch = 0;
    ple_table t;
    CHECK(ple_table_open_file(&t, g_path, ROWB, NROWS, PLE_MODE_MMAP, &p) == STRATA_OK);
    CHECK(t.madv_random == 0 && t.prefetch == 0 && strstr(t.why, "default readahead") != NULL);
    ple_table_close(&t);
    CHECK(ple_table_open_file(&t, g_path, ROWB, NROWS, PLE_MODE_MMAP, NULL) == STRATA_OK);
    CHECK(t.madv_random == 1 && t.prefetch == 1);
    ple_hash h = small_hash();
    ple_worker w;
    p = ple_default_params();
    p.step_timeout_s = 0.2;
    p.test_stall_ms = 600;
    p.test_stall_at = 2;
    CHECK(ple_worker_start(&w, &t, &h, 8, &p) == STRATA_OK);
    CHECK(w.timeout_s == 0.2 && w.stall_at == 2 && w.prefetch == 1);
    const int32_t hist[] = {1, 2, 3, 4};
    uint64_t seq;
    double wait_s = 0;
    int owner = 0;
    CHECK(ple_submit(&w, &owner, hist, 2, &seq) == STRATA_OK && seq == 1);
    CHECK(ple_wait(&w, seq, &wait_s) == STRATA_OK);              /* step 1 does not stall */
    ple_release(&w, &owner);
    CHECK(ple_submit(&w, &owner, hist, 2, &seq) == STRATA_OK && seq == 2);
    CHECK(ple_wait(&w, seq, &wait_s) == STRATA_ERR_IO);          /* step 2 does, past the 0.2 s timeout */
    CHECK(strstr(strata_last_error(), "did not finish within 0.2 s") != NULL);
    ple_release(&w, &owner);
    ple_worker_stop(&w);                                         /* joins once the stalled step ends */
    ple_table_close(&t);
    /* a timeout <= 0 means the default */
    p = ple_default_params();
    p.step_timeout_s = 0;
    CHECK(ple_table_open_file(&t, g_path, ROWB, NROWS, PLE_MODE_MMAP, NULL) == STRATA_OK);
    CHECK(ple_worker_start(&w, &t, &h, 8, &p) == STRATA_OK && w.timeout_s == 300.0);
    ple_worker_stop(&w);
    ple_table_close(&t);
}

/* The row cache against a brute-force model of what it may hold: every row it returns is the row put
 * under that id, it never holds more than cap rows, a row just put is found, and a row hit again between
 * sweeps survives one (CLOCK). Many puts over a small cap exercise eviction and backward-shift deletion. */
static void test_row_cache(void) {
    ple_cache c;
    CHECK(ple_cache_init(&c, 0, ROWB, 1000) == STRATA_OK && c.cap == 0);
    CHECK(ple_cache_find(&c, 3) == NULL);
    ple_cache_put(&c, 3, (const uint8_t *)"x");       /* off: a no-op */
    CHECK(ple_cache_init(&c, 37 * ROWB + ROWB - 1, ROWB, 1000) == STRATA_OK && c.cap == 37);
    uint8_t row[ROWB];
    uint64_t seed = 99;
    int present = 0;
    for (int step = 0; step < 20000; step++) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        const uint64_t r = (seed >> 33) % (step < 10000 ? 60 : 4000);   /* dense, then sparse ids */
        const uint8_t *p = ple_cache_find(&c, r);
        if (p) { CHECK(row_ok(p, r)); present++; continue; }
        for (size_t i = 0; i < ROWB; i++) row[i] = row_byte(r, i);
        ple_cache_put(&c, r, row);
        p = ple_cache_find(&c, r);
        CHECK(p && row_ok(p, r));
        CHECK(atomic_load(&c.used) <= c.cap);
    }
    CHECK(present > 1000 && atomic_load(&c.used) == c.cap);
    uint64_t held = 0;
    for (uint64_t r = 0; r < 4000; r++) {
        const uint8_t *p = ple_cache_find(&c, r);
        if (p) { CHECK(row_ok(p, r)); held++; }
    }
    CHECK(held == c.cap);                          /* every entry is reachable through the index */
    ple_cache_free(&c);
    /* a table of few rows caps the entries at its row count */
    CHECK(ple_cache_init(&c, 1u << 20, ROWB, 10) == STRATA_OK && c.cap == 10);
    ple_cache_free(&c);
}

/* Direct mode's O_DIRECT reads (where the filesystem allows them) give the rows a buffered read gives,
 * rows sharing sectors read once; the floors count distinct sectors and pages. */
static void test_direct_reads_and_floors(void) {
    ple_table t;
    CHECK(ple_table_open_file(&t, g_path, ROWB, NROWS, PLE_MODE_DIRECT, NULL) == STRATA_OK);
    const uint64_t rows[] = {0, 1, 5, 6, 3999, 45, 46, 2000, 2000};
    const int64_t n = sizeof rows / sizeof rows[0];
    int64_t idx[16];
    for (int64_t i = 0; i < n; i++) idx[i] = i;
    ple_span sc[32];
    uint64_t pages = 0, sectors = 0;
    /* bytes 0..89, 90..179: sector 0; 450..539 spans sectors 0-1, 540..629 sector 1; 3999 x 90 = 359910..359999:
       sectors 702-703; 45 x 90 = 4050..4139: sectors 7-8 (pages 0-1), 46: 8; 2000 x 90 = 180000..180089: 351 */
    ple_floors(&t, rows, NULL, n, sc, &pages, &sectors);
    CHECK(sectors == 7 && pages == 4);                   /* pages 0, 1, 43, 87 */
    ple_floors(&t, rows, NULL, 2, sc, &pages, &sectors);
    CHECK(sectors == 1 && pages == 1);
    const int64_t some[] = {4, 7};                       /* rows 3999 and 2000 only */
    ple_floors(&t, rows, some, 2, sc, &pages, &sectors);
    CHECK(sectors == 3 && pages == 2);
    /* a row wider than a sector counts every sector it covers (here 1,500-byte rows: 3 or 4 sectors) */
    ple_table wide = t;
    wide.row_bytes = 1500;
    const uint64_t w2[] = {0, 1, 7};                     /* 0..1499: 0-2; 1500..2999: 2-5; 10500..11999: 20-23 */
    ple_floors(&wide, w2, NULL, 3, sc, &pages, &sectors);
    CHECK(sectors == 10 && pages == 2);                  /* pages 0 and 2 */
    if (t.dfd >= 0) {
        CHECK(t.dio_align == 512 || t.dio_align == 4096);
        uint8_t *bounce = NULL;
        CHECK(posix_memalign((void **)&bounce, 4096, PLE_BOUNCE) == 0);
        ple_span sp[16];
        uint8_t buf[16 * ROWB];
        uint64_t req = 0;
        ple_aio *aio = ple_aio_open();
        for (int with_aio = 0; with_aio < 2; with_aio++) {
            ple_aio *a = with_aio ? aio : NULL;
            memset(buf, 0, sizeof buf);
            CHECK(ple_read_direct(&t, rows, idx, n, buf, bounce, PLE_BOUNCE, sp, a, &req) == STRATA_OK);
            for (int64_t i = 0; i < n; i++) CHECK(row_ok(buf + i * ROWB, rows[i]));
            if (t.dio_align == 512) CHECK(req == 512ull * 7);   /* runs 0-1, 7-8, 351, 702-703 */
            /* a bounce buffer of two sectors: runs split into batches (and runs capped at two sectors) */
            memset(buf, 0, sizeof buf);
            CHECK(ple_read_direct(&t, rows, idx, n, buf, bounce, 1024, sp, a, &req) == STRATA_OK);
            for (int64_t i = 0; i < n; i++) CHECK(row_ok(buf + i * ROWB, rows[i]));
        }
        /* many rows: more runs than PLE_AIO_DEPTH in one call */
        uint64_t many[300];
        int64_t mi[300];
        ple_span msp[300];
        static uint8_t mbuf[300 * ROWB];
        for (int i = 0; i < 300; i++) { many[i] = (uint64_t)(i * 13) % NROWS; mi[i] = i; }
        CHECK(ple_read_direct(&t, many, mi, 300, mbuf, bounce, PLE_BOUNCE, msp, aio, &req) == STRATA_OK);
        for (int i = 0; i < 300; i++) CHECK(row_ok(mbuf + i * ROWB, many[i]));
        ple_aio_close(aio);
        free(bounce);
    } else {
        CHECK(strstr(t.why, "O_DIRECT") != NULL);
    }
    ple_table_close(&t);
}

int main(void) {
    make_file();
    test_row_cache();
    test_direct_reads_and_floors();
    test_modes_read_the_same_rows();
    test_size_mismatch_refused();
    test_prefetch_pages();
    test_hash_matches_the_spec();
    test_nvfp4_row();
    test_json();
    test_sidecar();
    test_worker_two_threads();
    test_stalled_step_times_out();
    test_params_are_the_settings();
    unlink(g_path);
    if (g_failed) {
        fprintf(stderr, "test_ple: %d checks failed\n", g_failed);
        return 1;
    }
    printf("test_ple: all checks passed\n");
    return 0;
}
