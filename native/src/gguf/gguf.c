/*
 * gguf.c — the GGUF v2/v3 parser: one buffer (a mapped file or a caller's bytes) -> gguf_file.
 *
 * The format. Every integer is little-endian; nothing is aligned or padded except the start
 * of the data section.
 *
 *   offset  0  u32  magic, the bytes "GGUF"
 *           4  u32  version: 3, or 2 (same layout; version 1 had u32 counts: not supported)
 *           8  u64  n_tensors
 *          16  u64  n_kv
 *          24  n_kv      x { string key; u32 value_type; value }
 *              n_tensors x { string name; u32 n_dims; u64 ne[n_dims]; u32 ggml_type; u64 offset }
 *              zero padding up to a multiple of `alignment`         <- data_offset
 *              tensor data; tensor i starts at data_offset + offset_i
 *
 *   string = u64 byte length, then the bytes (UTF-8, not NUL-terminated)
 *   value  = by value_type: 0 u8, 1 i8, 2 u16, 3 i16, 4 u32, 5 i32, 6 f32, 7 bool (1 byte),
 *            10 u64, 11 i64, 12 f64: the bytes; 8 string: a string;
 *            9 array: u32 element type, u64 count, then count values of that type without
 *            per-element tags. Elements may be strings or arrays again (arrays of arrays),
 *            so such arrays have variable-size elements: the parser records where each
 *            element starts (gguf_file.pool) to make element lookup O(1).
 *   alignment = the u32 kv "general.alignment" if present (a non-zero power of two), else 32.
 *   ne[0] is the contiguous dimension; a tensor's bytes are ne[0]/block_size * type_size per
 *   row times ne[1]*ne[2]*ne[3] rows.
 *
 * What a file must satisfy here (else STRATA_ERR_FORMAT naming the file, the field and its
 * byte offset). Every count and length is checked against the bytes left before it is
 * used, nothing is read outside [base, base + size), and the tables grow with the entries
 * actually parsed (never sized from a count in the file), so memory stays a small multiple
 * of the bytes read, whatever a corrupt count says.
 *   - magic "GGUF"; version 2 or 3; the counts fit in the bytes left;
 *   - keys and tensor names are non-empty, contain no NUL byte and are unique (tensor names
 *     across all splits: see gguf_open.c); bools are 0 or 1; value types are 0..12;
 *   - arrays nest at most GGUF_MAX_DEPTH (8) deep; any count, including 0, is allowed;
 *   - general.alignment, when present, is a u32 and a non-zero power of two;
 *   - n_dims is 1..4; every ne is in [0, INT64_MAX] and so is their product; ne = 0 is
 *     allowed (an empty tensor, as ggml and gguf-py accept it); ne[0] is a multiple of the
 *     type's block size; the type id is one Strata knows the block size of (every
 *     registered block format, plus the plain I8 I16 I32 I64 F64 element types);
 *   - offset is a multiple of the alignment and the data lies inside the file. Tensors may
 *     come in any order and padding after the last one may be missing (llama.cpp's mmap
 *     loader accepts both).
 */
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gguf_internal.h"
#include "../quant/quant.h"
#include "../util/error.h"

#define GGUF_MAGIC_STR "GGUF"
#define GGUF_HEADER_SIZE 24u
/* Smallest possible encodings: they bound counts by the bytes left before we allocate. */
#define GGUF_MIN_KV_SIZE 14u     /* key length 8 + 1 key byte + type 4 + 1 value byte */
#define GGUF_MIN_TENSOR_SIZE 33u /* name length 8 + 1 + n_dims 4 + one ne 8 + type 4 + offset 8 */

static inline uint32_t ld_u32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static inline uint64_t ld_u64(const uint8_t *p) {
    return (uint64_t)ld_u32(p) | (uint64_t)ld_u32(p + 4) << 32;
}

uint32_t gguf_scalar_size(uint32_t type) {
    switch (type) {
    case STRATA_GGUF_UINT8: case STRATA_GGUF_INT8: case STRATA_GGUF_BOOL: return 1;
    case STRATA_GGUF_UINT16: case STRATA_GGUF_INT16: return 2;
    case STRATA_GGUF_UINT32: case STRATA_GGUF_INT32: case STRATA_GGUF_FLOAT32: return 4;
    case STRATA_GGUF_UINT64: case STRATA_GGUF_INT64: case STRATA_GGUF_FLOAT64: return 8;
    default: return 0;
    }
}

static const char *value_type_name(uint32_t type) {
    static const char *const names[] = {"u8", "i8", "u16", "i16", "u32", "i32", "f32", "bool",
                                        "string", "array", "u64", "i64", "f64"};
    return type < sizeof names / sizeof names[0] ? names[type] : "unknown";
}

/* Block geometry of a tensor type: the registry's block formats, plus the plain element
 * types that carry no kernels (ggml ids 24..28) but are legal in any GGUF. */
static int tensor_type_geometry(uint32_t type, int32_t *block_size, int32_t *type_size,
                                const char **name) {
    if (type < STRATA_QTYPE_MAX) {
        const strata_qtraits *t = strata_qtraits_get((int32_t)type);
        if (t && t->block_size > 0 && t->type_size > 0) {
            *block_size = t->block_size;
            *type_size = t->type_size;
            *name = t->name;
            return 1;
        }
    }
    static const struct { uint32_t type; int32_t size; const char *name; } plain[] = {
        {GT_I8, 1, "I8"}, {GT_I16, 2, "I16"}, {GT_I32, 4, "I32"}, {GT_I64, 8, "I64"}, {GT_F64, 8, "F64"},
    };
    for (size_t i = 0; i < sizeof plain / sizeof plain[0]; i++) {
        if (plain[i].type == type) {
            *block_size = 1;
            *type_size = plain[i].size;
            *name = plain[i].name;
            return 1;
        }
    }
    return 0;
}

/* ---------------------------------------------------------------- parser state and errors */

typedef struct {
    gguf_file *f;
    const uint8_t *base;
    uint64_t size;
    char where[192];                /* "kv 3 'general.name'", "tensor 5 'blk.0.attn_q.weight'" */
    int depth;                      /* arrays we are inside of */
    uint64_t idx[GGUF_MAX_DEPTH];   /* element index at each level, for messages */
    uint64_t pool_cap;
} gguf_parser;

/* What a user can do about a header that ends too soon. Most such files are an interrupted
 * download or copy, so the message says so; where a count or length read from the file runs
 * past its end, a corrupt field is as likely, and the message says both. */
#define GGUF_CUT_SHORT ": the file is cut short, the copy is incomplete (download it again)"
#define GGUF_CUT_OR_CORRUPT ": the file is cut short or corrupt (download it again)"

__attribute__((format(printf, 4, 0)))
static strata_status vperr(const gguf_parser *p, uint64_t off, const char *tail, const char *fmt, va_list ap) {
    char detail[512];
    char path[GGUF_MAX_DEPTH * 24 + 8];
    size_t n = 0;
    vsnprintf(detail, sizeof detail, fmt, ap);
    path[0] = '\0';
    for (int d = 0; d < p->depth && n < sizeof path; d++)
        n += (size_t)snprintf(path + n, sizeof path - n, "[%" PRIu64 "]", p->idx[d]);
    return strata_fail(STRATA_ERR_FORMAT, "%s: %s%s: %s (byte offset %" PRIu64 ")%s", p->f->name,
                       p->where, path, detail, off, tail);
}

__attribute__((format(printf, 3, 4)))
static strata_status perr(const gguf_parser *p, uint64_t off, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    const strata_status st = vperr(p, off, "", fmt, ap);
    va_end(ap);
    return st;
}

/* perr for a file that ends too soon; tail is GGUF_CUT_SHORT (the file ends inside a field of
 * fixed size) or GGUF_CUT_OR_CORRUPT (a count or length read from it runs past its end). */
__attribute__((format(printf, 4, 5)))
static strata_status perr_end(const gguf_parser *p, uint64_t off, const char *tail, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    const strata_status st = vperr(p, off, tail, fmt, ap);
    va_end(ap);
    return st;
}

/* where = "<what> <i>" or "<what> <i> '<name>'" with the name made printable and cut short. */
static void set_where(gguf_parser *p, const char *what, int64_t i, const char *s, uint64_t len) {
    int n = snprintf(p->where, sizeof p->where, "%s %" PRId64, what, i);
    if (!s || n < 0) return;
    size_t k = (size_t)n;
    const uint64_t shown = len > 96 ? 96 : len;
    p->where[k++] = ' ';
    p->where[k++] = '\'';
    for (uint64_t j = 0; j < shown; j++) {
        const unsigned char c = (unsigned char)s[j];
        p->where[k++] = (c >= 0x20 && c < 0x7f) || c >= 0x80 ? (char)c : '?';
    }
    if (shown < len) { memcpy(p->where + k, "...", 3); k += 3; }
    p->where[k++] = '\'';
    p->where[k] = '\0'; /* at most 20 + 2 + 96 + 3 + 1 + 1 < sizeof where */
}

static inline uint64_t left(const gguf_parser *p, uint64_t pos) { return p->size - pos; }

static strata_status need(const gguf_parser *p, uint64_t pos, uint64_t n, const char *what) {
    if (left(p, pos) < n)
        return perr_end(p, pos, GGUF_CUT_SHORT, "%s: the data ends after %" PRIu64 " of its %" PRIu64 " bytes",
                        what, left(p, pos), n);
    return STRATA_OK;
}

/* Room for one more element of a growing array (capacity doubles). The tables grow with
 * what has been parsed, never with a count read from the file, so memory stays a small
 * multiple of the bytes actually read even when a count is corrupt. Returns the (possibly
 * moved) array, or NULL with *v untouched. */
static void *grow(void *v, uint64_t *cap, uint64_t len, size_t elem) {
    if (len < *cap) return v;
    const uint64_t c = *cap ? *cap * 2 : 16;
    if (c > SIZE_MAX / elem) return NULL;
    void *nv = realloc(v, (size_t)c * elem);
    if (nv) *cap = c;
    return nv;
}

static strata_status nomem(const gguf_parser *p, const char *what) {
    return strata_fail(STRATA_ERR_NOMEM, "%s: out of memory for the %s", p->f->name, what);
}

/* Appends to a u64 list (the element pool or a temporary one). */
static strata_status push_u64(const gguf_parser *p, uint64_t **v, uint64_t *len, uint64_t *cap, uint64_t x) {
    uint64_t *nv = grow(*v, cap, *len, sizeof **v);
    if (!nv) return nomem(p, "array element table");
    nv[(*len)++] = x;
    *v = nv;
    return STRATA_OK;
}

/* ---------------------------------------------------------------- values */

static strata_status parse_string(gguf_parser *p, uint64_t *pos, const char *what,
                                  const uint8_t **s, uint64_t *len) {
    const uint64_t at = *pos;
    strata_status st = need(p, at, 8, what);
    if (st) return st;
    const uint64_t n = ld_u64(p->base + at);
    if (n > left(p, at + 8))
        return perr_end(p, at, GGUF_CUT_OR_CORRUPT, "%s length %" PRIu64 " runs past the end of the data (%"
                        PRIu64 " bytes left)", what, n, left(p, at + 8));
    *s = p->base + at + 8;
    *len = n;
    *pos = at + 8 + n;
    return STRATA_OK;
}

static strata_status check_bools(const gguf_parser *p, uint64_t at, uint64_t n) {
    for (uint64_t i = 0; i < n; i++) {
        const uint8_t b = p->base[at + i];
        if (b > 1) return perr(p, at + i, "bool byte %" PRIu64 " is %u, not 0 or 1", i, b);
    }
    return STRATA_OK;
}

/* Parses a value of `type` at *pos (after its type tag) into *out and advances *pos. */
static strata_status parse_value(gguf_parser *p, uint64_t *pos, uint32_t type, strata_gguf_value *out) {
    const uint64_t at = *pos;
    strata_status st;
    out->type = (int32_t)type;
    out->elem_type = -1;
    out->offset = at;
    out->node = GGUF_NONE;

    const uint32_t sz = gguf_scalar_size(type);
    if (sz) {
        if ((st = need(p, at, sz, value_type_name(type)))) return st;
        if (type == STRATA_GGUF_BOOL && (st = check_bools(p, at, 1))) return st;
        out->count = 1;
        out->data = p->base + at;
        *pos = at + sz;
        return STRATA_OK;
    }
    if (type == STRATA_GGUF_STRING) {
        const uint8_t *s;
        uint64_t len;
        if ((st = parse_string(p, pos, "string", &s, &len))) return st;
        out->count = len;
        out->data = s;
        return STRATA_OK;
    }
    if (type != STRATA_GGUF_ARRAY)
        return perr(p, at, "unknown value type %" PRIu32 " (known: 0..12)", type);

    if (p->depth >= GGUF_MAX_DEPTH)
        return perr(p, at, "arrays nested more than %d deep", GGUF_MAX_DEPTH);
    if ((st = need(p, at, 12, "array header"))) return st;
    const uint32_t et = ld_u32(p->base + at);
    const uint64_t n = ld_u64(p->base + at + 4);
    const uint64_t body = at + 12;
    if (et > STRATA_GGUF_FLOAT64)
        return perr(p, at, "array element type %" PRIu32 " is unknown (known: 0..12)", et);
    out->elem_type = (int32_t)et;
    out->count = n;
    out->data = NULL;

    const uint32_t esz = gguf_scalar_size(et);
    if (esz) {
        if (n > left(p, body) / esz)
            return perr_end(p, at + 4, GGUF_CUT_OR_CORRUPT, "array count %" PRIu64 " of %s (%" PRIu32
                            " bytes each) cannot fit in the %" PRIu64 " bytes left", n, value_type_name(et), esz,
                            left(p, body));
        if (et == STRATA_GGUF_BOOL && (st = check_bools(p, body, n))) return st;
        out->data = p->base + body;
        *pos = body + n * esz;
        return STRATA_OK;
    }

    /* Strings take at least 8 bytes and arrays at least 12: a count that cannot fit is
     * rejected here, before any element is looked at. */
    const uint64_t min_elem = et == STRATA_GGUF_STRING ? 8 : 12;
    if (n > left(p, body) / min_elem)
        return perr_end(p, at + 4, GGUF_CUT_OR_CORRUPT, "array count %" PRIu64 " of %s cannot fit in the %"
                        PRIu64 " bytes left", n, value_type_name(et), left(p, body));

    gguf_file *f = p->f;
    uint64_t cur = body;
    const int level = p->depth;
    p->depth++;
    if (et == STRATA_GGUF_STRING) {
        /* nothing else enters the pool while the strings are read: they land contiguously */
        out->node = f->pool_len;
        for (uint64_t i = 0; i < n; i++) {
            const uint8_t *s;
            uint64_t len;
            p->idx[level] = i;
            if ((st = push_u64(p, &f->pool, &f->pool_len, &p->pool_cap, cur)) ||
                (st = parse_string(p, &cur, "string", &s, &len)))
                return st; /* depth stays raised: the message shows the element path */
        }
    } else {
        /* the elements add their own tables to the pool while they are parsed, so this
         * array's (offset, node) pairs are collected aside and appended at the end */
        uint64_t *pairs = NULL, n_pairs = 0, cap = 0;
        for (uint64_t i = 0; i < n && !st; i++) {
            strata_gguf_value elem;
            p->idx[level] = i;
            const uint64_t elem_at = cur;
            if (!(st = parse_value(p, &cur, STRATA_GGUF_ARRAY, &elem)) &&
                !(st = push_u64(p, &pairs, &n_pairs, &cap, elem_at)))
                st = push_u64(p, &pairs, &n_pairs, &cap, elem.node);
        }
        out->node = f->pool_len;
        for (uint64_t i = 0; i < n_pairs && !st; i++)
            st = push_u64(p, &f->pool, &f->pool_len, &p->pool_cap, pairs[i]);
        free(pairs);
        if (st) return st;
    }
    p->depth--;
    *pos = cur;
    return STRATA_OK;
}

/* Keys and tensor names: non-empty and free of NUL (they are looked up by C strings). */
static strata_status check_name(const gguf_parser *p, uint64_t at, const uint8_t *s, uint64_t len,
                                const char *what) {
    if (len == 0) return perr(p, at, "%s is empty", what);
    const void *nul = memchr(s, 0, (size_t)len);
    if (nul)
        return perr(p, at, "%s contains a NUL byte at position %td", what, (const uint8_t *)nul - s);
    return STRATA_OK;
}

/* ---------------------------------------------------------------- header, kvs, tensors */

static strata_status parse_header(gguf_parser *p, uint64_t *n_tensors, uint64_t *n_kv) {
    gguf_file *f = p->f;
    snprintf(p->where, sizeof p->where, "header");
    if (p->size < 4 || memcmp(p->base, GGUF_MAGIC_STR, 4) != 0) {
        char shown[16] = "";
        size_t k = 0;
        for (uint64_t i = 0; i < 4 && i < p->size; i++)
            k += (size_t)snprintf(shown + k, sizeof shown - k, "%s%02x", i ? " " : "", p->base[i]);
        /* the first bytes of "GGUF" and nothing after: a copy cut short, not another format */
        if (p->size < 4 && memcmp(p->base, GGUF_MAGIC_STR, (size_t)p->size) == 0)
            return perr_end(p, 0, GGUF_CUT_SHORT, "the file ends after %" PRIu64 " bytes [%s] of the magic "
                            "\"GGUF\"", p->size, shown);
        return perr(p, 0, "not a GGUF file: it starts with bytes [%s]%s, expected 47 47 55 46 (\"GGUF\")",
                    shown, p->size < 4 ? " and ends there" : "");
    }
    strata_status st = need(p, 4, 4, "version");
    if (st) return st;
    const uint32_t v = ld_u32(p->base + 4);
    if (v == 1)
        return perr(p, 4, "GGUF version 1 is not supported (Strata reads versions 2 and 3; "
                    "convert the file with a current llama.cpp)");
    if (v != 2 && v != 3) {
        const uint32_t swapped = __builtin_bswap32(v);
        if (swapped >= 1 && swapped <= 3)
            return perr(p, 4, "version field is 0x%08" PRIx32 ": a big-endian GGUF (Strata reads "
                        "little-endian files only)", v);
        return perr(p, 4, "unknown GGUF version %" PRIu32 " (Strata reads versions 2 and 3)", v);
    }
    f->version = v;
    if ((st = need(p, 8, 8, "tensor count")) || (st = need(p, 16, 8, "kv count"))) return st;
    *n_tensors = ld_u64(p->base + 8);
    *n_kv = ld_u64(p->base + 16);
    const uint64_t rest = left(p, GGUF_HEADER_SIZE);
    if (*n_kv > rest / GGUF_MIN_KV_SIZE)
        return perr_end(p, 16, GGUF_CUT_OR_CORRUPT, "kv count %" PRIu64 " cannot fit in the %" PRIu64
                        " bytes left", *n_kv, rest);
    if (*n_tensors > rest / GGUF_MIN_TENSOR_SIZE ||
        *n_tensors * GGUF_MIN_TENSOR_SIZE > rest - *n_kv * GGUF_MIN_KV_SIZE)
        return perr_end(p, 8, GGUF_CUT_OR_CORRUPT, "tensor count %" PRIu64 " cannot fit in the %" PRIu64
                        " bytes left after %" PRIu64 " kvs", *n_tensors, rest, *n_kv);
    return STRATA_OK;
}

static strata_status parse_kvs(gguf_parser *p, uint64_t *pos, uint64_t n_kv) {
    gguf_file *f = p->f;
    strata_status st;
    uint64_t cap = 0;
    for (uint64_t i = 0; i < n_kv; i++) {
        gguf_kv *kvs = grow(f->kvs, &cap, i, sizeof *f->kvs);
        if (!kvs) return nomem(p, "kv table");
        f->kvs = kvs;
        gguf_kv *kv = &f->kvs[i];
        const uint8_t *key;
        uint64_t key_len;
        set_where(p, "kv", (int64_t)i, NULL, 0);
        kv->off = *pos;
        if ((st = parse_string(p, pos, "key", &key, &key_len))) return st;
        set_where(p, "kv", (int64_t)i, (const char *)key, key_len);
        if ((st = check_name(p, kv->off, key, key_len, "key"))) return st;
        kv->key = (const char *)key;
        kv->key_len = key_len;
        f->n_kv = (int64_t)i + 1;
        if ((st = need(p, *pos, 4, "value type"))) return st;
        const uint32_t type = ld_u32(p->base + *pos);
        if (type > STRATA_GGUF_FLOAT64)
            return perr(p, *pos, "unknown value type %" PRIu32 " (known: 0..12)", type);
        *pos += 4;
        if ((st = parse_value(p, pos, type, &kv->value))) return st;
    }
    if ((st = gguf_index_init(&f->kv_index, n_kv)))
        return strata_fail(st, "%s: cannot allocate the key index", f->name);
    for (uint64_t i = 0; i < n_kv; i++) {
        const gguf_kv *kv = &f->kvs[i];
        const int64_t prev = gguf_index_insert(&f->kv_index, kv->key, kv->key_len, (int64_t)i);
        if (prev >= 0) {
            set_where(p, "kv", (int64_t)i, kv->key, kv->key_len);
            return perr(p, kv->off, "duplicate key (first defined by kv %" PRId64 ")", prev);
        }
    }
    return STRATA_OK;
}

static strata_status read_alignment(gguf_parser *p) {
    gguf_file *f = p->f;
    f->alignment = GGUF_DEFAULT_ALIGNMENT;
    const int64_t i = gguf_index_find(&f->kv_index, "general.alignment", 17);
    if (i < 0) return STRATA_OK;
    const gguf_kv *kv = &f->kvs[i];
    set_where(p, "kv", i, kv->key, kv->key_len);
    if (kv->value.type != STRATA_GGUF_UINT32)
        return perr(p, kv->value.offset, "general.alignment must be a u32, not %s",
                    value_type_name((uint32_t)kv->value.type));
    const uint32_t a = ld_u32(kv->value.data);
    if (a == 0 || (a & (a - 1)) != 0)
        return perr(p, kv->value.offset, "general.alignment %" PRIu32 " is not a non-zero power of two", a);
    f->alignment = a;
    return STRATA_OK;
}

/* Checked a * b for non-negative int64; 0 on overflow. */
static int mul_i64(int64_t a, int64_t b, int64_t *out) {
    if (a != 0 && b > INT64_MAX / a) return 0;
    *out = a * b;
    return 1;
}

static strata_status parse_tensor_info(gguf_parser *p, uint64_t *pos, int64_t i, int32_t split,
                                       gguf_tensor *gt) {
    strata_gguf_tensor *t = &gt->t;
    strata_status st;
    const uint8_t *name;
    uint64_t name_len;
    set_where(p, "tensor", i, NULL, 0);
    gt->info_off = *pos;
    if ((st = parse_string(p, pos, "name", &name, &name_len))) return st;
    set_where(p, "tensor", i, (const char *)name, name_len);
    if ((st = check_name(p, gt->info_off, name, name_len, "name"))) return st;
    t->name = (const char *)name;
    t->name_len = name_len;
    t->split = split;

    if ((st = need(p, *pos, 4, "n_dims"))) return st;
    const uint32_t n_dims = ld_u32(p->base + *pos);
    if (n_dims < 1 || n_dims > 4) return perr(p, *pos, "n_dims %" PRIu32 " is not in 1..4", n_dims);
    t->n_dims = (int32_t)n_dims;
    *pos += 4;
    if ((st = need(p, *pos, 8ull * n_dims, "ne"))) return st;
    const uint64_t ne_off = *pos;
    int64_t nelem = 1;
    for (int d = 0; d < 4; d++) t->ne[d] = 1;
    for (uint32_t d = 0; d < n_dims; d++) {
        const uint64_t ne = ld_u64(p->base + *pos);
        if (ne > (uint64_t)INT64_MAX)
            return perr(p, *pos, "ne[%" PRIu32 "] = %" PRIu64 " exceeds INT64_MAX", d, ne);
        t->ne[d] = (int64_t)ne;
        *pos += 8;
    }
    for (int d = 0; d < 4; d++) {
        if (!mul_i64(nelem, t->ne[d], &nelem))
            return perr(p, ne_off, "element count %" PRId64 " x %" PRId64 " x %" PRId64 " x %" PRId64
                        " overflows int64", t->ne[0], t->ne[1], t->ne[2], t->ne[3]);
    }

    if ((st = need(p, *pos, 4, "type"))) return st;
    const uint32_t type = ld_u32(p->base + *pos);
    int32_t bs = 0, ts = 0;
    const char *type_name = NULL;
    if (!tensor_type_geometry(type, &bs, &ts, &type_name))
        return perr(p, *pos, "ggml type id %" PRIu32 " is unknown to Strata", type);
    t->type = (int32_t)type;
    if (t->ne[0] % bs != 0)
        return perr(p, ne_off, "ne[0] = %" PRId64 " is not a multiple of the %s block size %" PRId32,
                    t->ne[0], type_name, bs);
    *pos += 4;

    /* bytes = ne[0]/bs * ts per row, times ne[1]*ne[2]*ne[3] rows */
    int64_t row = 0, rows = 0, bytes = 0;
    if (!mul_i64(t->ne[0] / bs, ts, &row) || !mul_i64(t->ne[1], t->ne[2], &rows) ||
        !mul_i64(rows, t->ne[3], &rows) || !mul_i64(row, rows, &bytes))
        return perr(p, ne_off, "byte size of %" PRId64 " x %" PRId64 " x %" PRId64 " x %" PRId64
                    " %s values overflows int64", t->ne[0], t->ne[1], t->ne[2], t->ne[3], type_name);
    t->size = (uint64_t)bytes;

    if ((st = need(p, *pos, 8, "offset"))) return st;
    t->offset = ld_u64(p->base + *pos); /* relative until the data section is known */
    if (t->offset % p->f->alignment != 0)
        return perr(p, *pos, "data offset %" PRIu64 " is not a multiple of the alignment %" PRIu64,
                    t->offset, p->f->alignment);
    *pos += 8;
    return STRATA_OK;
}

/* Byte offset of a tensor's data-offset field: name, n_dims, ne[] and type come before it. */
static uint64_t offset_field(const gguf_tensor *t) {
    return t->info_off + 8 + t->t.name_len + 4 + 8 * (uint64_t)t->t.n_dims + 4;
}

static strata_status parse_tensors(gguf_parser *p, uint64_t *pos, uint64_t n_tensors, int32_t split) {
    gguf_file *f = p->f;
    strata_status st;
    /* re-check against what is left now that the kvs are known */
    if (n_tensors > left(p, *pos) / GGUF_MIN_TENSOR_SIZE) {
        snprintf(p->where, sizeof p->where, "header");
        return perr_end(p, 8, GGUF_CUT_OR_CORRUPT, "tensor count %" PRIu64 " cannot fit in the %" PRIu64
                        " bytes left after the kvs", n_tensors, left(p, *pos));
    }
    uint64_t cap = 0;
    for (uint64_t i = 0; i < n_tensors; i++) {
        gguf_tensor *ts = grow(f->tensors, &cap, i, sizeof *f->tensors);
        if (!ts) return nomem(p, "tensor table");
        f->tensors = ts;
        memset(&f->tensors[i], 0, sizeof f->tensors[i]);
        if ((st = parse_tensor_info(p, pos, (int64_t)i, split, &f->tensors[i]))) return st;
        f->n_tensors = (int64_t)i + 1;
    }

    /* the data section starts at the next multiple of the alignment */
    f->data_offset = (*pos + f->alignment - 1) / f->alignment * f->alignment;
    /* The end of the data the tensors need. A file that ends before it is nearly always an
     * interrupted download or copy (the header is whole, the data is not), so the message gives
     * both sizes and says what to do; an end that overflows 64 bits is a corrupt offset. */
    uint64_t need_end = 0;
    int64_t last = -1;
    for (int64_t i = 0; i < f->n_tensors; i++) {
        const strata_gguf_tensor *t = &f->tensors[i].t;
        const uint64_t rel = t->offset;
        if (rel > UINT64_MAX - f->data_offset || t->size > UINT64_MAX - f->data_offset - rel) {
            set_where(p, "tensor", i, t->name, t->name_len);
            return perr(p, offset_field(&f->tensors[i]),
                        "%" PRIu64 " bytes of data at offset %" PRIu64 " of the data section (which starts at %"
                        PRIu64 ") run past the end of the data (%" PRIu64 " bytes)",
                        t->size, rel, f->data_offset, p->size);
        }
        if (f->data_offset + rel + t->size > need_end) {
            need_end = f->data_offset + rel + t->size;
            last = i;
        }
    }
    if (need_end > p->size) {
        const gguf_tensor *lt = &f->tensors[last];
        set_where(p, "tensor", last, lt->t.name, lt->t.name_len);
        return strata_fail(STRATA_ERR_FORMAT, "%s: the file has %" PRIu64 " bytes, its tensors need %" PRIu64
                           ": the copy is incomplete (download it again); %s ends there (byte offset %" PRIu64
                           " holds its data offset)", f->name, p->size, need_end, p->where, offset_field(lt));
    }
    for (int64_t i = 0; i < f->n_tensors; i++) {
        strata_gguf_tensor *t = &f->tensors[i].t;
        t->offset = f->data_offset + t->offset;
        t->data = p->base + t->offset;
    }
    return STRATA_OK;
}

void gguf_file_free_tables(gguf_file *f) {
    free(f->kvs);
    free(f->tensors);
    free(f->pool);
    gguf_index_free(&f->kv_index);
    f->kvs = NULL;
    f->tensors = NULL;
    f->pool = NULL;
    f->n_kv = f->n_tensors = 0;
    f->pool_len = 0;
}

strata_status gguf_parse(gguf_file *f, int32_t split) {
    gguf_parser p = {.f = f, .base = f->base, .size = f->size};
    uint64_t n_tensors = 0, n_kv = 0, pos = GGUF_HEADER_SIZE;
    strata_status st = parse_header(&p, &n_tensors, &n_kv);
    if (!st) st = parse_kvs(&p, &pos, n_kv);
    if (!st) st = read_alignment(&p);
    if (!st) st = parse_tensors(&p, &pos, n_tensors, split);
    if (st) gguf_file_free_tables(f);
    return st;
}

/* ---------------------------------------------------------------- name index */

static uint64_t hash_bytes(const char *s, uint64_t n) {
    uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a */
    for (uint64_t i = 0; i < n; i++) {
        h ^= (uint8_t)s[i];
        h *= 0x100000001b3ull;
    }
    return h ^ (h >> 29);
}

strata_status gguf_index_init(gguf_index *ix, uint64_t n) {
    uint64_t cap = 16;
    while (cap <= 2 * n) {
        if (cap > (SIZE_MAX / sizeof(gguf_slot)) / 2) return STRATA_ERR_NOMEM;
        cap *= 2;
    }
    ix->slots = malloc((size_t)cap * sizeof(gguf_slot));
    if (!ix->slots) return STRATA_ERR_NOMEM;
    for (uint64_t i = 0; i < cap; i++) ix->slots[i].idx = -1;
    ix->mask = cap - 1;
    return STRATA_OK;
}

void gguf_index_free(gguf_index *ix) {
    free(ix->slots);
    ix->slots = NULL;
    ix->mask = 0;
}

static gguf_slot *index_probe(const gguf_index *ix, const char *s, uint64_t n) {
    for (uint64_t h = hash_bytes(s, n);; h++) {
        gguf_slot *slot = &ix->slots[h & ix->mask];
        if (slot->idx < 0 || (slot->n == n && memcmp(slot->s, s, (size_t)n) == 0)) return slot;
    }
}

int64_t gguf_index_insert(gguf_index *ix, const char *s, uint64_t n, int64_t idx) {
    gguf_slot *slot = index_probe(ix, s, n);
    if (slot->idx >= 0) return slot->idx;
    slot->s = s;
    slot->n = n;
    slot->idx = idx;
    return -1;
}

int64_t gguf_index_find(const gguf_index *ix, const char *s, uint64_t n) {
    if (!ix->slots) return -1;
    return index_probe(ix, s, n)->idx;
}
