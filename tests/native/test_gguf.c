/*
 * test_gguf.c — the GGUF reader from C, on files built byte by byte here: every value type,
 * nested arrays through strata_gguf_array_get, tensors, alignment, v2, split sets on disk,
 * truncation at every byte and random mutations (run it under the ASan+UBSan build too).
 * Exit code 0 = pass.
 */
#define _POSIX_C_SOURCE 200809L /* mkdtemp */
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "strata.h"

#include "check.h"

/* ---------------------------------------------------------------- a byte builder */

typedef struct {
    uint8_t *p;
    size_t n, cap;
} buf;

static void put(buf *b, const void *src, size_t n) {
    if (b->n + n > b->cap) {
        b->cap = (b->n + n) * 2 + 64;
        b->p = realloc(b->p, b->cap);
        if (!b->p) abort();
    }
    if (n) memcpy(b->p + b->n, src, n);
    b->n += n;
}
static void put_u8(buf *b, uint8_t v) { put(b, &v, 1); }
static void put_u32(buf *b, uint32_t v) {
    uint8_t x[4] = {(uint8_t)v, (uint8_t)(v >> 8), (uint8_t)(v >> 16), (uint8_t)(v >> 24)};
    put(b, x, 4);
}
static void put_u64(buf *b, uint64_t v) {
    put_u32(b, (uint32_t)v);
    put_u32(b, (uint32_t)(v >> 32));
}
static void put_str(buf *b, const char *s) {
    put_u64(b, strlen(s));
    put(b, s, strlen(s));
}
static void pad_to(buf *b, size_t align) {
    while (b->n % align) put_u8(b, 0);
}

/* Header + kvs + tensor infos of the test model; tensors: "w.f32" F32 {8,2}, "w.i32" I32 {3},
 * "w.q8" Q8_0 {64} if the registry has Q8_0 (it may still be being written: then skipped). */
typedef struct {
    int with_q8;
    uint32_t version, alignment; /* alignment 0: no general.alignment key */
} model_opts;

static int have_type(int32_t t) {
    strata_type_info info;
    return strata_type_info_get(t, &info) == STRATA_OK;
}

static buf build_model(model_opts o, size_t *data_start) {
    buf b = {0};
    const int n_tensors = 2 + o.with_q8;
    put(&b, "GGUF", 4);
    put_u32(&b, o.version);
    put_u64(&b, (uint64_t)n_tensors);
    put_u64(&b, o.alignment ? 9 : 8);
    /* kv 0..7 */
    put_str(&b, "general.architecture"); put_u32(&b, STRATA_GGUF_STRING); put_str(&b, "test");
    put_str(&b, "t.u8"); put_u32(&b, STRATA_GGUF_UINT8); put_u8(&b, 200);
    put_str(&b, "t.i64"); put_u32(&b, STRATA_GGUF_INT64); put_u64(&b, (uint64_t)-5);
    put_str(&b, "t.f64"); put_u32(&b, STRATA_GGUF_FLOAT64);
    { double d = 0.125; uint64_t u; memcpy(&u, &d, 8); put_u64(&b, u); }
    put_str(&b, "t.bool"); put_u32(&b, STRATA_GGUF_BOOL); put_u8(&b, 1);
    /* array of strings */
    put_str(&b, "t.strs"); put_u32(&b, STRATA_GGUF_ARRAY); put_u32(&b, STRATA_GGUF_STRING); put_u64(&b, 3);
    put_str(&b, "alpha"); put_str(&b, ""); put_str(&b, "gamma");
    /* [[1, 2, 3], [], [["x"], ["y", "zz"]]] is not expressible (elements share one type), so:
     * array of arrays of u16: [[1, 2, 3], [], [7]] */
    put_str(&b, "t.nest"); put_u32(&b, STRATA_GGUF_ARRAY); put_u32(&b, STRATA_GGUF_ARRAY); put_u64(&b, 3);
    put_u32(&b, STRATA_GGUF_UINT16); put_u64(&b, 3);
    { const uint8_t v[] = {1, 0, 2, 0, 3, 0}; put(&b, v, 6); }
    put_u32(&b, STRATA_GGUF_UINT16); put_u64(&b, 0);
    put_u32(&b, STRATA_GGUF_UINT16); put_u64(&b, 1); put_u8(&b, 7); put_u8(&b, 0);
    /* array of arrays of arrays of strings: [[["x"], ["y", "zz"]]] */
    put_str(&b, "t.deep"); put_u32(&b, STRATA_GGUF_ARRAY); put_u32(&b, STRATA_GGUF_ARRAY); put_u64(&b, 1);
    put_u32(&b, STRATA_GGUF_ARRAY); put_u64(&b, 2);
    put_u32(&b, STRATA_GGUF_STRING); put_u64(&b, 1); put_str(&b, "x");
    put_u32(&b, STRATA_GGUF_STRING); put_u64(&b, 2); put_str(&b, "y"); put_str(&b, "zz");
    if (o.alignment) { put_str(&b, "general.alignment"); put_u32(&b, STRATA_GGUF_UINT32); put_u32(&b, o.alignment); }
    const uint64_t a = o.alignment ? o.alignment : 32;
    /* tensor infos */
    put_str(&b, "w.f32"); put_u32(&b, 2); put_u64(&b, 8); put_u64(&b, 2); put_u32(&b, 0); put_u64(&b, 0);
    uint64_t off = (64 + a - 1) / a * a;
    put_str(&b, "w.i32"); put_u32(&b, 1); put_u64(&b, 3); put_u32(&b, 26); put_u64(&b, off);
    off += (12 + a - 1) / a * a;
    if (o.with_q8) { put_str(&b, "w.q8"); put_u32(&b, 1); put_u64(&b, 64); put_u32(&b, 8); put_u64(&b, off); }
    pad_to(&b, a);
    *data_start = b.n;
    for (int i = 0; i < 16; i++) { float f = (float)i * 0.5f; put(&b, &f, 4); }
    pad_to(&b, a);
    for (int32_t i = 0; i < 3; i++) { int32_t v = -i; put(&b, &v, 4); }
    if (o.with_q8) {
        pad_to(&b, a);
        for (int i = 0; i < 68; i++) put_u8(&b, (uint8_t)i);
    }
    return b;
}

/* ---------------------------------------------------------------- walking a handle */

/* Reads every kv and every element (nested too) and every tensor; returns elements seen. */
static uint64_t walk_value(const strata_gguf *g, const strata_gguf_value *v, int depth) {
    uint64_t seen = 1;
    if (v->type != STRATA_GGUF_ARRAY) return seen;
    for (uint64_t i = 0; i < v->count; i++) {
        strata_gguf_value e;
        CHECK(strata_gguf_array_get(g, v, i, &e) == STRATA_OK);
        CHECK(e.type == v->elem_type);
        seen += walk_value(g, &e, depth + 1);
    }
    return seen;
}

static uint64_t walk(const strata_gguf *g) {
    uint64_t seen = 0;
    for (int64_t i = 0; i < strata_gguf_n_kv(g); i++) {
        const char *k;
        uint64_t kl;
        strata_gguf_value v;
        CHECK(strata_gguf_kv(g, i, &k, &kl, &v) == STRATA_OK);
        seen += walk_value(g, &v, 0);
    }
    for (int64_t i = 0; i < strata_gguf_n_tensors(g); i++) {
        strata_gguf_tensor t;
        CHECK(strata_gguf_tensor_info(g, i, &t) == STRATA_OK);
        seen++;
    }
    return seen;
}

static int value_is_str(const strata_gguf_value *v, const char *s) {
    return v->type == STRATA_GGUF_STRING && v->count == strlen(s) && memcmp(v->data, s, v->count) == 0;
}

static void get_kv(const strata_gguf *g, const char *key, strata_gguf_value *v) {
    int64_t i = -1;
    CHECK(strata_gguf_find_kv(g, key, &i) == STRATA_OK);
    CHECK(strata_gguf_kv(g, i, NULL, NULL, v) == STRATA_OK);
}

/* ---------------------------------------------------------------- tests */

static void test_model(model_opts o) {
    size_t data_start = 0;
    buf b = build_model(o, &data_start);
    strata_gguf *g = NULL;
    CHECK(strata_gguf_open_memory(b.p, b.n, "model", &g) == STRATA_OK);
    if (!g) { free(b.p); return; }
    CHECK(strata_gguf_version(g) == o.version);
    CHECK(strata_gguf_alignment(g) == (o.alignment ? o.alignment : 32));
    CHECK(strata_gguf_data_offset(g, 0) == data_start);
    CHECK(strata_gguf_n_splits(g) == 1);
    CHECK(strata_gguf_n_kv(g) == (o.alignment ? 9 : 8));

    strata_gguf_value v, e, e2, e3;
    get_kv(g, "general.architecture", &v);
    CHECK(value_is_str(&v, "test"));
    get_kv(g, "t.u8", &v);
    CHECK(v.type == STRATA_GGUF_UINT8 && *(const uint8_t *)v.data == 200);
    get_kv(g, "t.i64", &v);
    { int64_t x; memcpy(&x, v.data, 8); CHECK(v.type == STRATA_GGUF_INT64 && x == -5); }
    get_kv(g, "t.f64", &v);
    { double x; memcpy(&x, v.data, 8); CHECK(x == 0.125); }
    get_kv(g, "t.strs", &v);
    CHECK(v.type == STRATA_GGUF_ARRAY && v.elem_type == STRATA_GGUF_STRING && v.count == 3 && v.data == NULL);
    CHECK(strata_gguf_array_get(g, &v, 0, &e) == STRATA_OK && value_is_str(&e, "alpha"));
    CHECK(strata_gguf_array_get(g, &v, 1, &e) == STRATA_OK && value_is_str(&e, ""));
    CHECK(strata_gguf_array_get(g, &v, 2, &e) == STRATA_OK && value_is_str(&e, "gamma"));
    CHECK(strata_gguf_array_get(g, &v, 3, &e) == STRATA_ERR_INVALID_ARG);
    CHECK((const uint8_t *)e.data - b.p == (ptrdiff_t)e.offset + 8); /* pointers into the buffer */

    get_kv(g, "t.nest", &v);
    CHECK(v.elem_type == STRATA_GGUF_ARRAY && v.count == 3);
    CHECK(strata_gguf_array_get(g, &v, 0, &e) == STRATA_OK);
    CHECK(e.type == STRATA_GGUF_ARRAY && e.elem_type == STRATA_GGUF_UINT16 && e.count == 3);
    CHECK(strata_gguf_array_get(g, &e, 2, &e2) == STRATA_OK && e2.type == STRATA_GGUF_UINT16 &&
          *(const uint8_t *)e2.data == 3);
    CHECK(strata_gguf_array_get(g, &v, 1, &e) == STRATA_OK && e.count == 0);
    CHECK(strata_gguf_array_get(g, &e, 0, &e2) == STRATA_ERR_INVALID_ARG);
    CHECK(strata_gguf_array_get(g, &v, 2, &e) == STRATA_OK && e.count == 1);
    CHECK(strata_gguf_array_get(g, &e, 0, &e2) == STRATA_OK && *(const uint8_t *)e2.data == 7);

    get_kv(g, "t.deep", &v);
    CHECK(strata_gguf_array_get(g, &v, 0, &e) == STRATA_OK && e.elem_type == STRATA_GGUF_ARRAY && e.count == 2);
    CHECK(strata_gguf_array_get(g, &e, 1, &e2) == STRATA_OK && e2.elem_type == STRATA_GGUF_STRING && e2.count == 2);
    CHECK(strata_gguf_array_get(g, &e2, 1, &e3) == STRATA_OK && value_is_str(&e3, "zz"));
    CHECK(strata_gguf_array_get(g, &e, 0, &e2) == STRATA_OK);
    CHECK(strata_gguf_array_get(g, &e2, 0, &e3) == STRATA_OK && value_is_str(&e3, "x"));
    get_kv(g, "t.u8", &v);
    CHECK(strata_gguf_array_get(g, &v, 0, &e) == STRATA_ERR_INVALID_ARG); /* not an array */

    int64_t idx = -1;
    CHECK(strata_gguf_find_kv(g, "t.missing", &idx) == STRATA_ERR_NOT_FOUND);
    CHECK(strata_gguf_n_tensors(g) == 2 + o.with_q8);
    strata_gguf_tensor t;
    if (strata_gguf_find_tensor(g, "w.f32", &idx) == STRATA_OK && strata_gguf_tensor_info(g, idx, &t) == STRATA_OK) {
        CHECK(t.type == 0 && t.n_dims == 2 && t.ne[0] == 8 && t.ne[1] == 2 && t.ne[2] == 1 && t.ne[3] == 1);
        CHECK(t.offset == data_start && t.size == 64 && t.data == b.p + data_start && t.split == 0);
        CHECK(t.name_len == 5 && memcmp(t.name, "w.f32", 5) == 0);
        float f;
        memcpy(&f, (const uint8_t *)t.data + 4 * 5, 4);
        CHECK(f == 2.5f);
    } else {
        CHECK(!"w.f32 not found");
    }
    CHECK(strata_gguf_find_tensor(g, "w.i32", &idx) == STRATA_OK);
    CHECK(strata_gguf_tensor_info(g, idx, &t) == STRATA_OK && t.size == 12 && t.offset % strata_gguf_alignment(g) == 0);
    if (o.with_q8) {
        CHECK(strata_gguf_find_tensor(g, "w.q8", &idx) == STRATA_OK);
        CHECK(strata_gguf_tensor_info(g, idx, &t) == STRATA_OK && t.size == 68 && t.type == 8);
    }
    CHECK(strata_gguf_find_tensor(g, "w", &idx) == STRATA_ERR_NOT_FOUND);
    CHECK(walk(g) > 20);
    strata_gguf_close(g);

    /* truncation anywhere before the end of the last tensor's data fails cleanly */
    size_t end = b.n;
    for (size_t n = 0; n < end; n++) {
        uint8_t *cut = malloc(n ? n : 1); /* a fresh allocation: ASan sees any overread */
        memcpy(cut, b.p, n);
        strata_gguf *h = NULL;
        const strata_status st = strata_gguf_open_memory(cut, n, "cut.gguf", &h);
        CHECK(st == STRATA_ERR_FORMAT && h == NULL);
        CHECK(strncmp(strata_last_error(), "cut.gguf: ", 10) == 0);
        CHECK(strstr(strata_last_error(), "byte offset") != NULL);
        free(cut);
    }
    free(b.p);
}

static uint64_t xorshift(uint64_t *s) {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

static void test_mutations(void) {
    size_t data_start;
    model_opts o = {.with_q8 = 0, .version = 3, .alignment = 0};
    buf b = build_model(o, &data_start);
    uint64_t seed = 0x9e3779b97f4a7c15ull;
    int ok = 0, bad = 0;
    for (int it = 0; it < 20000; it++) {
        uint8_t *m = malloc(b.n);
        memcpy(m, b.p, b.n);
        const int edits = 1 + (int)(xorshift(&seed) % 4);
        for (int k = 0; k < edits; k++) {
            const size_t at = (size_t)(xorshift(&seed) % data_start);
            const uint64_t r = xorshift(&seed);
            m[at] = (r & 3) == 0 ? 0xff : (r & 3) == 1 ? 0 : (uint8_t)(r >> 8);
        }
        strata_gguf *g = NULL;
        const strata_status st = strata_gguf_open_memory(m, b.n, "mut", &g);
        if (st == STRATA_OK) {
            ok++;
            walk(g);
            strata_gguf_close(g);
        } else {
            bad++;
            CHECK(st == STRATA_ERR_FORMAT || st == STRATA_ERR_NOMEM);
        }
        free(m);
    }
    CHECK(ok > 0 && bad > 0);
    free(b.p);
}

static void write_file(const char *path, const buf *b) {
    FILE *f = fopen(path, "wb");
    CHECK(f != NULL);
    if (!f) return;
    CHECK(fwrite(b->p, 1, b->n, f) == b->n);
    fclose(f);
}

/* A shard: split keys + one F32 tensor {32} named name (the first also carries general.name). */
static buf shard(int no, int count, int total, const char *name) {
    buf b = {0};
    put(&b, "GGUF", 4);
    put_u32(&b, 3);
    put_u64(&b, 1);
    put_u64(&b, no == 0 ? 4 : 3);
    if (no == 0) { put_str(&b, "general.name"); put_u32(&b, STRATA_GGUF_STRING); put_str(&b, "split"); }
    put_str(&b, "split.no"); put_u32(&b, STRATA_GGUF_UINT16); put_u8(&b, (uint8_t)no); put_u8(&b, 0);
    put_str(&b, "split.count"); put_u32(&b, STRATA_GGUF_UINT16); put_u8(&b, (uint8_t)count); put_u8(&b, 0);
    put_str(&b, "split.tensors.count"); put_u32(&b, STRATA_GGUF_INT32); put_u32(&b, (uint32_t)total);
    put_str(&b, name); put_u32(&b, 1); put_u64(&b, 32); put_u32(&b, 0); put_u64(&b, 0);
    pad_to(&b, 32);
    for (int i = 0; i < 32; i++) { float f = (float)(no * 100 + i); put(&b, &f, 4); }
    return b;
}

static void test_split(void) {
    char dir[] = "/tmp/strata_test_gguf_XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    char p[3][256];
    const char *names[3] = {"a.weight", "b.weight", "c.weight"};
    for (int i = 0; i < 3; i++) {
        snprintf(p[i], sizeof p[i], "%s/m-%05d-of-00003.gguf", dir, i + 1);
        buf b = shard(i, 3, 3, names[i]);
        write_file(p[i], &b);
        free(b.p);
    }
    strata_gguf *g = NULL;
    CHECK(strata_gguf_open(p[0], &g) == STRATA_OK);
    if (g) {
        CHECK(strata_gguf_n_splits(g) == 3 && strata_gguf_n_tensors(g) == 3 && strata_gguf_n_kv(g) == 4);
        for (int i = 0; i < 3; i++) {
            int64_t idx = -1;
            strata_gguf_tensor t;
            CHECK(strata_gguf_find_tensor(g, names[i], &idx) == STRATA_OK && idx == i);
            CHECK(strata_gguf_tensor_info(g, idx, &t) == STRATA_OK && t.split == i);
            CHECK(t.offset == strata_gguf_data_offset(g, i));
            float f;
            memcpy(&f, (const uint8_t *)t.data + 4, 4);
            CHECK(f == (float)(i * 100 + 1));
        }
        strata_gguf_close(g);
    }
    /* opening a later split points at the first */
    CHECK(strata_gguf_open(p[1], &g) == STRATA_ERR_FORMAT && strstr(strata_last_error(), "m-00001-of-00003.gguf"));
    /* a duplicate name across splits */
    buf b = shard(2, 3, 3, "a.weight");
    write_file(p[2], &b);
    free(b.p);
    CHECK(strata_gguf_open(p[0], &g) == STRATA_ERR_FORMAT && strstr(strata_last_error(), "duplicate name"));
    /* a missing split is an I/O error naming it */
    unlink(p[2]);
    CHECK(strata_gguf_open(p[0], &g) == STRATA_ERR_IO && strstr(strata_last_error(), "m-00003-of-00003.gguf"));
    unlink(p[0]);
    unlink(p[1]);
    rmdir(dir);
}

static void test_versions(void) {
    size_t ds;
    model_opts o = {.with_q8 = 0, .version = 1, .alignment = 0};
    buf b = build_model(o, &ds);
    strata_gguf *g = NULL;
    CHECK(strata_gguf_open_memory(b.p, b.n, "v1", &g) == STRATA_ERR_FORMAT && strstr(strata_last_error(), "version 1"));
    free(b.p);
}

int main(void) {
    const int q8 = have_type(8);
    if (!have_type(0)) {
        fprintf(stderr, "test_gguf: F32 is not registered in the block-format table yet\n");
        return 1;
    }
    test_model((model_opts){.with_q8 = q8, .version = 3, .alignment = 0});
    test_model((model_opts){.with_q8 = q8, .version = 2, .alignment = 0});
    test_model((model_opts){.with_q8 = q8, .version = 3, .alignment = 128});
    test_model((model_opts){.with_q8 = q8, .version = 3, .alignment = 1});
    test_mutations();
    test_split();
    test_versions();
    if (g_failed) {
        fprintf(stderr, "test_gguf: %d checks failed\n", g_failed);
        return 1;
    }
    printf("test_gguf: ok%s\n", q8 ? "" : " (Q8_0 not registered: its tensor skipped)");
    return 0;
}
