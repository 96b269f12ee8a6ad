/* test_api.c — native unit tests of the pieces under everything: status/error reporting,
 * the thread pool, half-precision conversion, activation quantization (scalar == AVX2), the
 * tokenizer's refusal of text that is not UTF-8, and the sampling chain's draws. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "strata.h"
#include "quant/quant.h"
#include "util/error.h"
#include "util/threadpool.h"

static int g_failures;
#define CHECK(cond, ...)                                                  \
    do {                                                                  \
        if (!(cond)) {                                                    \
            g_failures++;                                                 \
            fprintf(stderr, "%s:%d: CHECK(%s) failed: ", __FILE__, __LINE__, #cond); \
            fprintf(stderr, __VA_ARGS__);                                 \
            fprintf(stderr, "\n");                                        \
        }                                                                 \
    } while (0)

static void test_errors(void) {
    CHECK(strata_abi_version() == STRATA_ABI_VERSION, "abi");
    CHECK(strcmp(strata_status_str(STRATA_ERR_FORMAT), "format error") == 0, "status str");
    CHECK(strcmp(strata_status_str((strata_status)999), "unknown status") == 0, "bad status");
    strata_status st = strata_fail(STRATA_ERR_IO, "file %s offset %d", "x.gguf", 12);
    CHECK(st == STRATA_ERR_IO, "fail returns its status");
    CHECK(strcmp(strata_last_error(), "file x.gguf offset 12") == 0, "message: %s", strata_last_error());
    /* long messages are truncated, not overflowed */
    char big[4096];
    memset(big, 'a', sizeof big - 1);
    big[sizeof big - 1] = 0;
    strata_fail(STRATA_ERR_IO, "%s", big);
    CHECK(strlen(strata_last_error()) < 1024, "truncated");
    strata_context *ctx = NULL;
    strata_context_params p = strata_context_default_params();
    p.n_threads = -3;
    CHECK(strata_context_init(&p, &ctx) == STRATA_ERR_INVALID_ARG && ctx == NULL, "bad threads");
    CHECK(strstr(strata_last_error(), "n_threads") != NULL, "message names the argument");
    strata_type_info ti;
    CHECK(strata_type_info_get(999, &ti) == STRATA_ERR_UNSUPPORTED, "unknown type");
    CHECK(strata_type_info_get(-1, &ti) == STRATA_ERR_UNSUPPORTED, "negative type");
}

typedef struct { int64_t *hits; } pool_arg;
static void count_task(void *arg, int64_t task, int thread) {
    (void)thread;
    pool_arg *a = arg;
    __atomic_fetch_add(&a->hits[task], 1, __ATOMIC_RELAXED);
}

static void test_pool(void) {
    for (int nt = 1; nt <= 4; nt++) {
        strata_pool *pool = strata_pool_create(nt);
        CHECK(pool != NULL, "pool %d", nt);
        if (!pool) continue;
        CHECK(strata_pool_n_threads(pool) == nt, "n_threads");
        int64_t hits[257];
        pool_arg a = {hits};
        for (int round = 0; round < 200; round++) {
            const int64_t n = 1 + round % 257;
            memset(hits, 0, sizeof hits);
            strata_pool_run(pool, count_task, &a, n);
            for (int64_t i = 0; i < n; i++) CHECK(hits[i] == 1, "task %lld ran %lld times", (long long)i, (long long)hits[i]);
            for (int64_t i = n; i < 257; i++) CHECK(hits[i] == 0, "task %lld beyond n ran", (long long)i);
        }
        strata_pool_run(pool, count_task, &a, 0); /* no tasks: returns at once */
        strata_pool_destroy(pool);
    }
    strata_pool_destroy(NULL);
}

static void test_fp16(void) {
    /* every half -> float -> half is the identity (NaNs stay NaN) */
    for (uint32_t h = 0; h < 65536; h++) {
        const float f = strata_fp16_to_fp32((uint16_t)h);
        const uint16_t back = strata_fp32_to_fp16(f);
        if ((h & 0x7c00u) == 0x7c00u && (h & 0x3ffu)) {
            CHECK(isnan(f) && (back & 0x7c00u) == 0x7c00u && (back & 0x3ffu), "nan %04x", h);
        } else {
            CHECK(back == h, "roundtrip %04x -> %g -> %04x", h, (double)f, back);
        }
#if defined(__FLT16_MAX__)
        _Float16 ref;
        memcpy(&ref, &h, 2);
        if (!isnan(f)) CHECK(f == (float)ref, "value of %04x", h);
#endif
    }
#if defined(__FLT16_MAX__)
    /* float -> half rounds to nearest even like the compiler's conversion */
    uint32_t state = 12345;
    for (int i = 0; i < 2000000; i++) {
        state = state * 1664525u + 1013904223u;
        uint32_t bits = state;
        if (i % 3 == 0) bits = (bits & 0x807fffffu) | ((uint32_t)(100 + (state >> 24) % 60) << 23);
        float f;
        memcpy(&f, &bits, 4);
        if (isnan(f)) continue;
        const _Float16 r = (_Float16)f;
        uint16_t rb;
        memcpy(&rb, &r, 2);
        CHECK(strata_fp32_to_fp16(f) == rb, "fp32 %08x -> %04x, expected %04x", bits, strata_fp32_to_fp16(f), rb);
        if (g_failures > 20) return;
    }
#endif
}

static void test_act_quant(void) {
    enum { N = 2560 };
    static float x[N];
    static act_q8_32 a32[3][N / 32];
    static act_q8_256 a256[3][N / 256];
    /* the scalar reference, then each vector path this CPU runs: the same blocks, byte for byte */
    static const int path[3] = {STRATA_ISA_IDX_SCALAR, STRATA_ISA_IDX_AVX2, STRATA_ISA_IDX_AVX512};
    static const char *const path_name[3] = {"scalar", "avx2", "avx512"};
    uint32_t s = 7;
    for (int trial = 0; trial < 50; trial++) {
        for (int i = 0; i < N; i++) {
            s = s * 1664525u + 1013904223u;
            x[i] = ((float)(s >> 8) / 16777216.0f - 0.5f) * (trial % 5 == 0 ? 1e-30f : 3.0f);
            if (trial % 7 == 3 && i % 40 == 0) x[i] = 0;
            if (trial % 11 == 4 && i % 97 == 0) x[i] *= 1000;
        }
        if (trial == 1) memset(x, 0, sizeof x);
        if (trial == 2) { /* scales whose inverse overflows, NaN and inf inputs */
            for (int i = 0; i < 32 * 8; i++) x[i] = (float)(i % 7) * 1e-39f;
            x[300] = NAN;
            x[333] = -NAN;
            x[600] = INFINITY;
            x[1100] = -INFINITY;
            for (int i = 1200; i < 1232; i++) x[i] = NAN;
        }
        for (int p = 0; p < 3; p++) {
            if (!strata_cpu_has_isa(path[p])) continue;
            strata_act_quantize_q8_32(x, a32[p], N, path[p]);
            strata_act_quantize_q8_256(x, a256[p], N, path[p]);
        }
        for (int b = 0; b < N / 32; b++) {
            float amax = 0;
            int32_t sum = 0;
            for (int i = 0; i < 32; i++) amax = fmaxf(amax, fabsf(x[b * 32 + i]));
            for (int i = 0; i < 32; i++) {
                CHECK(a32[0][b].qs[i] >= -127 && a32[0][b].qs[i] <= 127, "code range %d", a32[0][b].qs[i]);
                if (!isfinite(amax) || !isfinite(x[b * 32 + i])) continue;
                const float err = fabsf(x[b * 32 + i] - a32[0][b].d * (float)a32[0][b].qs[i]);
                /* half a code step, plus the scale stored at fp16 precision where that is a normal fp16
                 * (strata_act_d_q8_32): up to 2^-11 of amax */
                const float f16 = amax / 127.0f >= 0x1p-14f ? amax * 0x1p-11f : 0.0f;
                CHECK(err <= amax / 254.0f * 1.0001f + f16 + 1e-37f, "q8_32 error %g amax %g", (double)err,
                      (double)amax);
            }
            for (int i = 0; i < 32; i++) sum += a32[0][b].qs[i];
            CHECK(sum == a32[0][b].sum, "sum");
            CHECK(isfinite(a32[0][b].d), "finite scale");
        }
        for (int b = 0; b < N / 256; b++)
            for (int j = 0; j < 16; j++) {
                int32_t sum = 0;
                for (int i = 0; i < 16; i++) sum += a256[0][b].qs[16 * j + i];
                CHECK(sum == a256[0][b].bsums[j], "bsums");
            }
        for (int p = 1; p < 3; p++) {
            if (!strata_cpu_has_isa(path[p])) continue;
            CHECK(memcmp(a32[0], a32[p], sizeof a32[0]) == 0, "q8_32 scalar != %s (trial %d)", path_name[p], trial);
            CHECK(memcmp(a256[0], a256[p], sizeof a256[0]) == 0, "q8_256 scalar != %s (trial %d)", path_name[p], trial);
        }
    }
}

/* strata_tokenizer_encode refuses malformed UTF-8 with the offset of the first bad byte,
 * leaves its outputs alone, and takes well-formed multi-byte text. */
static void test_tokenizer_utf8(void) {
    /* byte-level tokens (GPT-2's byte map): a b c, then the bytes of "é" (C3 A9) and "€" (E2 82 AC) */
    static const char *toks[] = {"a", "b", "c", "\xc3\x83", "\xc2\xa9", "\xc3\xa2", "\xc4\xa4", "\xc2\xac"};
    enum { NT = sizeof toks / sizeof toks[0] };
    char data[64];
    uint32_t lens[NT];
    size_t off = 0;
    for (int i = 0; i < NT; i++) {
        lens[i] = (uint32_t)strlen(toks[i]);
        memcpy(data + off, toks[i], lens[i]);
        off += lens[i];
    }
    strata_tokenizer *tok = NULL;
    strata_tokenizer_params p = strata_tokenizer_default_params();
    CHECK(strata_tokenizer_init(data, lens, NULL, NT, "", NULL, 0, &p, &tok) == STRATA_OK, "init: %s",
          strata_last_error());
    if (!tok) return;
    int32_t ids[16];
    uint64_t n = 0;
    CHECK(strata_tokenizer_encode(tok, "a\xc3\xa9\xe2\x82\xac", 6, 1, ids, 16, &n) == STRATA_OK && n == 6,
          "valid text: %s", strata_last_error());
    static const struct { const char *text; uint64_t at; } bad[] = {
        {"\xff", 0},              /* never in UTF-8 */
        {"ab\x80" "c", 2},        /* a lone continuation byte */
        {"a\xc3", 1},             /* a sequence cut off by the end */
        {"a\xe2\x82", 1},
        {"\xe2\x82" "a", 0},       /* cut off by an ASCII byte */
        {"\xc0\xaf", 0},          /* overlong "/" */
        {"\xe0\x80\xaf", 0},
        {"\xc3\xa9\xed\xa0\x80", 2}, /* a surrogate, U+D800, after a valid "é" */
        {"\xf4\x90\x80\x80", 0},  /* above U+10FFFF */
        {"abc\xf5", 3},
    };
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        char want[96];
        snprintf(want, sizeof want, "the prompt is not valid UTF-8 at byte %llu (", (unsigned long long)bad[k].at);
        n = 777;
        ids[0] = -5;
        const strata_status st = strata_tokenizer_encode(tok, bad[k].text, strlen(bad[k].text), 1, ids, 16, &n);
        CHECK(st == STRATA_ERR_INVALID_ARG, "case %zu: status %d", k, (int)st);
        CHECK(strncmp(strata_last_error(), want, strlen(want)) == 0, "case %zu: message '%s', expected '%s...'", k,
              strata_last_error(), want);
        CHECK(n == 777 && ids[0] == -5, "case %zu: outputs written on failure", k);
    }
    strata_tokenizer_free(tok);
}

/* strata_sampler_draw: the survivors of each filter, and u's intervals in id order */
static void test_sampler_draw(void) {
    strata_sampler *s = NULL;
    CHECK(strata_sampler_init(NULL, &s) == STRATA_OK, "init: %s", strata_last_error());
    /* ids 0..7; 2 and 5 tie at the top, 6 is NaN, 7 is -inf */
    const float l[8] = {0.0f, -1.0f, 2.0f, 1.0f, -3.0f, 2.0f, NAN, -INFINITY};
    int32_t t = -1;
    /* top-k 1: the lower id of the tie, whatever u */
    for (int i = 0; i < 10; i++) {
        CHECK(strata_sampler_draw(s, l, 8, 1, 1.0, 0.0, 1.0, i / 10.0, &t) == STRATA_OK && t == 2, "k1 u %d: %d", i, t);
        CHECK(strata_sampler_draw(s, l, 8, 0, 0.0, 0.0, 1.0, i / 10.0, &t) == STRATA_OK && t == 2, "p0 u %d: %d", i, t);
    }
    /* top-k 2 keeps 2 and 5 at equal odds: u below one half draws 2, above it 5 */
    CHECK(strata_sampler_draw(s, l, 8, 2, 1.0, 0.0, 1.0, 0.49, &t) == STRATA_OK && t == 2, "k2 low: %d", t);
    CHECK(strata_sampler_draw(s, l, 8, 2, 1.0, 0.0, 1.0, 0.51, &t) == STRATA_OK && t == 5, "k2 high: %d", t);
    /* no filter: the six finite ids in id order, each over an interval as long as its probability */
    double e[8], tot = 0.0;
    for (int i = 0; i < 6; i++) tot += (e[i] = exp((double)l[i] - 2.0));
    double cum = 0.0;
    for (int i = 0; i < 6; i++) {
        const double mid = (cum + e[i] / 2) / tot;
        cum += e[i];
        CHECK(strata_sampler_draw(s, l, 8, 0, 1.0, 0.0, 1.0, mid, &t) == STRATA_OK && t == i, "interval %d: %d", i, t);
    }
    /* min-p 0.3: only the two ties (e^-1 = 0.37 of the top for id 3 survives 0.3, not 0.4) */
    CHECK(strata_sampler_draw(s, l, 8, 0, 1.0, 0.3, 1.0, 0.99, &t) == STRATA_OK && t == 5, "min-p 0.3: %d", t);
    int seen3 = 0;
    for (int i = 0; i < 100; i++) {
        CHECK(strata_sampler_draw(s, l, 8, 0, 1.0, 0.4, 1.0, i / 100.0, &t) == STRATA_OK && (t == 2 || t == 5),
              "min-p 0.4: %d", t);
        CHECK(strata_sampler_draw(s, l, 8, 0, 1.0, 0.3, 1.0, i / 100.0, &t) == STRATA_OK, "min-p 0.3");
        seen3 += t == 3;
    }
    CHECK(seen3 > 0, "min-p 0.3 keeps id 3");
    /* logits too small to part in float64 log-probabilities: top-p ranks their tie by id and keeps id 0, not
     * the highest logit (id 4), and min-p 1 then keeps what top-p kept (the survivors' own maximum) */
    const float tiny[5] = {0.0f, 5.8e-39f, 1.17e-38f, 1.0e-40f, 2.3e-38f};
    for (int i = 0; i < 4; i++)
        CHECK(strata_sampler_draw(s, tiny, 5, 0, 0.01, 1.0, 1.0, i / 4.0, &t) == STRATA_OK && t == 0, "tiny tie: %d", t);
    /* refusals, with a message */
    const float none[3] = {NAN, -INFINITY, INFINITY};
    CHECK(strata_sampler_draw(s, none, 3, 0, 1.0, 0.0, 1.0, 0.5, &t) == STRATA_ERR_INVALID_ARG &&
              strstr(strata_last_error(), "no finite logit"), "no finite: %s", strata_last_error());
    CHECK(strata_sampler_draw(s, l, 8, 0, 1.0, 0.0, 0.0, 0.5, &t) == STRATA_ERR_INVALID_ARG, "temperature 0");
    CHECK(strata_sampler_draw(s, l, 8, 0, 1.5, 0.0, 1.0, 0.5, &t) == STRATA_ERR_INVALID_ARG, "top_p 1.5");
    CHECK(strata_sampler_draw(s, l, 8, 0, 1.0, 0.0, 1.0, 1.0, &t) == STRATA_ERR_INVALID_ARG, "u 1");
    CHECK(strata_sampler_draw(s, l, 0, 0, 1.0, 0.0, 1.0, 0.5, &t) == STRATA_ERR_INVALID_ARG, "no vocabulary");
    strata_sampler_free(s);
    strata_sampler_params p = strata_sampler_default_params();
    p.min_p = NAN;
    CHECK(strata_sampler_init(&p, &s) == STRATA_ERR_INVALID_ARG, "NaN min_p refused");
    p = strata_sampler_default_params();
    p.temperature = INFINITY;
    CHECK(strata_sampler_init(&p, &s) == STRATA_ERR_INVALID_ARG, "infinite temperature refused");
}

int main(void) {
    test_errors();
    test_sampler_draw();
    test_pool();
    test_fp16();
    test_act_quant();
    test_tokenizer_utf8();
    if (g_failures) {
        fprintf(stderr, "test_api: %d failures\n", g_failures);
        return 1;
    }
    printf("test_api: ok\n");
    return 0;
}
