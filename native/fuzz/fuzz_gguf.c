/*
 * fuzz_gguf.c — libFuzzer target for the GGUF reader (strata_gguf_open_memory) and the tokenizer
 * built from a file's arrays (strata_tokenizer_init_gguf).
 *
 * Each input is parsed as a GGUF; a rejected input must fail with STRATA_ERR_FORMAT and a
 * message that starts with the name we passed. An accepted one is walked completely: every
 * kv (every array element, nested arrays included, each byte of each value touched so ASan
 * sees any pointer outside the input), every tensor (its data must lie inside the input and
 * be found again by name). A broken invariant traps, which libFuzzer reports as a crash.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "strata.h"

#define FUZZ_NAME "fuzz.gguf"

static const uint8_t *g_lo, *g_hi; /* the input, [lo, hi) */
static volatile uint8_t g_sink;

static void require(int cond) {
    if (!cond) __builtin_trap();
}

static void touch(const void *p, uint64_t n) {
    require(n == 0 || ((const uint8_t *)p >= g_lo && n <= (uint64_t)(g_hi - (const uint8_t *)p)));
    uint8_t acc = 0;
    for (uint64_t i = 0; i < n; i++) acc ^= ((const uint8_t *)p)[i];
    g_sink = acc;
}

static uint32_t scalar_size(int32_t type) {
    switch (type) {
    case STRATA_GGUF_UINT8: case STRATA_GGUF_INT8: case STRATA_GGUF_BOOL: return 1;
    case STRATA_GGUF_UINT16: case STRATA_GGUF_INT16: return 2;
    case STRATA_GGUF_UINT32: case STRATA_GGUF_INT32: case STRATA_GGUF_FLOAT32: return 4;
    case STRATA_GGUF_UINT64: case STRATA_GGUF_INT64: case STRATA_GGUF_FLOAT64: return 8;
    default: return 0;
    }
}

static void walk_value(const strata_gguf *g, const strata_gguf_value *v, int depth) {
    require(depth <= 8);
    require(v->offset < (uint64_t)(g_hi - g_lo));
    if (v->type == STRATA_GGUF_STRING) {
        touch(v->data, v->count);
        return;
    }
    if (v->type != STRATA_GGUF_ARRAY) {
        const uint32_t sz = scalar_size(v->type);
        require(sz != 0 && v->count == 1);
        touch(v->data, sz);
        if (v->type == STRATA_GGUF_BOOL) require(*(const uint8_t *)v->data <= 1);
        return;
    }
    const uint32_t esz = scalar_size(v->elem_type);
    if (esz) touch(v->data, v->count * esz); /* the parser bounded count * esz by the input */
    else require(v->data == NULL);
    for (uint64_t i = 0; i < v->count; i++) {
        strata_gguf_value e;
        require(strata_gguf_array_get(g, v, i, &e) == STRATA_OK);
        require(e.type == v->elem_type);
        if (esz) require((const uint8_t *)e.data == (const uint8_t *)v->data + i * esz);
        walk_value(g, &e, depth + 1);
    }
    strata_gguf_value e;
    require(strata_gguf_array_get(g, v, v->count, &e) == STRATA_ERR_INVALID_ARG);
}

static void walk(const strata_gguf *g, size_t size) {
    const int64_t n_kv = strata_gguf_n_kv(g);
    for (int64_t i = 0; i < n_kv; i++) {
        const char *key;
        uint64_t key_len;
        strata_gguf_value v;
        require(strata_gguf_kv(g, i, &key, &key_len, &v) == STRATA_OK);
        touch(key, key_len);
        require(key_len > 0 && memchr(key, 0, key_len) == NULL);
        char *z = malloc(key_len + 1);
        require(z != NULL);
        memcpy(z, key, key_len);
        z[key_len] = '\0';
        int64_t j = -1;
        require(strata_gguf_find_kv(g, z, &j) == STRATA_OK && j == i);
        free(z);
        walk_value(g, &v, 0);
    }
    const uint64_t align = strata_gguf_alignment(g);
    require(align != 0 && (align & (align - 1)) == 0);
    const int64_t n_t = strata_gguf_n_tensors(g);
    for (int64_t i = 0; i < n_t; i++) {
        strata_gguf_tensor t;
        require(strata_gguf_tensor_info(g, i, &t) == STRATA_OK);
        touch(t.name, t.name_len);
        require(t.n_dims >= 1 && t.n_dims <= 4 && t.split == 0);
        for (int d = 0; d < 4; d++) require(t.ne[d] >= 0);
        require(t.offset <= size && t.size <= size - t.offset);
        require((const uint8_t *)t.data == g_lo + t.offset);
        require((t.offset - strata_gguf_data_offset(g, 0)) % align == 0);
        touch(t.data, t.size < 64 ? t.size : 64);
        if (t.size > 64) touch((const uint8_t *)t.data + t.size - 64, 64);
        char *z = malloc(t.name_len + 1);
        require(z != NULL);
        memcpy(z, t.name, t.name_len);
        z[t.name_len] = '\0';
        int64_t j = -1;
        require(strata_gguf_find_tensor(g, z, &j) == STRATA_OK && j == i);
        free(z);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    /* a private copy, so ASan bounds every access to exactly `size` bytes */
    uint8_t *copy = malloc(size ? size : 1);
    require(copy != NULL);
    if (size) memcpy(copy, data, size);
    g_lo = copy;
    g_hi = copy + size;
    strata_gguf *g = NULL;
    const strata_status st = strata_gguf_open_memory(copy, size, FUZZ_NAME, &g);
    if (st == STRATA_OK) {
        require(g != NULL);
        require(strata_gguf_version(g) == 2 || strata_gguf_version(g) == 3);
        walk(g, size);
        /* the tokenizer read straight from the file's tokenizer.ggml.* arrays: built, or refused with
         * a format error (a file without them, wrong types, bad entries), never a crash */
        strata_tokenizer *tok = NULL;
        const strata_status ts = strata_tokenizer_init_gguf(g, NULL, &tok);
        require(ts == STRATA_OK ? tok != NULL : tok == NULL);
        if (tok) {
            int32_t ids[64];
            uint64_t need = 0;
            (void)strata_tokenizer_encode(tok, "fuzz, 123 text", 14, 1, ids, 64, &need);
            strata_tokenizer_free(tok);
        }
        strata_gguf_close(g);
    } else {
        require(st == STRATA_ERR_FORMAT && g == NULL);
        require(strncmp(strata_last_error(), FUZZ_NAME ": ", sizeof FUZZ_NAME + 1) == 0);
    }
    free(copy);
    return 0;
}
