/*
 * gguf_open.c — GGUF handles: mapping files, split sets, lookups (the strata_gguf_* API).
 *
 * Files are mapped PROT_READ/MAP_SHARED and never copied: keys, values and tensor data are
 * pointers into the mappings, valid until strata_gguf_close. (A file truncated by someone
 * else while mapped faults on access, as with any mmap reader.)
 *
 * Split sets, as llama.cpp's gguf-split writes them: <prefix>-00001-of-0000N.gguf ..
 * <prefix>-0000N-of-0000N.gguf; every file carries split.no (0-based), split.count (N) and
 * split.tensors.count (tensors in all files; we check the sum when it is present). Metadata
 * comes from the first file; tensors from all, each tagged with its file index, with its
 * offset absolute in its own file. Names must be unique across the whole set.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "gguf_internal.h"
#include "../util/error.h"

#define GGUF_SPLIT_SUFFIX_LEN 20 /* strlen("-00001-of-00003.gguf") */
#define GGUF_MAX_SPLITS 65535    /* split.count is a u16 in llama.cpp */

struct strata_gguf {
    int32_t n_files;
    gguf_file *files;          /* files[0] holds the metadata */
    int64_t n_tensors;
    gguf_tensor *tensors;      /* all files' tensors, file by file */
    gguf_index tensor_index;
};

static char *dup_str(const char *s) {
    const size_t n = strlen(s) + 1;
    char *d = malloc(n);
    if (d) memcpy(d, s, n);
    return d;
}

static const char *errno_str(int err, char *buf, size_t n) {
    /* strerror is not thread-safe; the build defines _GNU_SOURCE, whose strerror_r returns the text */
#if defined(_GNU_SOURCE)
    return strerror_r(err, buf, n);
#else
    return strerror_r(err, buf, n) == 0 ? buf : "unknown error";
#endif
}

static void file_release(gguf_file *f) {
    gguf_file_free_tables(f);
    if (f->mapped && f->base) munmap((void *)f->base, (size_t)f->size);
    free(f->name);
    memset(f, 0, sizeof *f);
}

static strata_status map_file(const char *path, gguf_file *f) {
    char eb[128];
    memset(f, 0, sizeof *f);
    f->name = dup_str(path);
    if (!f->name) return strata_fail(STRATA_ERR_NOMEM, "%s: out of memory", path);
    const int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        const int err = errno;
        return strata_fail(STRATA_ERR_IO, "%s: cannot open: %s", path, errno_str(err, eb, sizeof eb));
    }
    struct stat st;
    if (fstat(fd, &st) != 0) {
        const int err = errno;
        close(fd);
        return strata_fail(STRATA_ERR_IO, "%s: cannot stat: %s", path, errno_str(err, eb, sizeof eb));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return strata_fail(STRATA_ERR_IO, "%s: not a regular file", path);
    }
    if (st.st_size <= 0) {
        close(fd);
        return strata_fail(STRATA_ERR_FORMAT, "%s: header: the file is empty; a GGUF file starts with a "
                           "24-byte header (byte offset 0)", path);
    }
    if ((uint64_t)st.st_size > SIZE_MAX) {
        close(fd);
        return strata_fail(STRATA_ERR_IO, "%s: %" PRIu64 " bytes do not fit in the address space", path,
                           (uint64_t)st.st_size);
    }
    void *m = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_SHARED, fd, 0);
    const int err = errno;
    close(fd); /* the mapping keeps the file */
    if (m == MAP_FAILED)
        return strata_fail(STRATA_ERR_IO, "%s: cannot map %" PRIu64 " bytes: %s", path, (uint64_t)st.st_size,
                           errno_str(err, eb, sizeof eb));
    f->base = m;
    f->size = (uint64_t)st.st_size;
    f->mapped = 1;
    return STRATA_OK;
}

void strata_gguf_close(strata_gguf *g) {
    if (!g) return;
    for (int32_t i = 0; i < g->n_files; i++) file_release(&g->files[i]);
    free(g->files);
    free(g->tensors);
    gguf_index_free(&g->tensor_index);
    free(g);
}

/* ---------------------------------------------------------------- split sets */

static const gguf_kv *find_kv(const gguf_file *f, const char *key) {
    const int64_t i = gguf_index_find(&f->kv_index, key, strlen(key));
    return i < 0 ? NULL : &f->kvs[i];
}

/* An integer kv of any integer type, as a non-negative value; 0 = absent. */
static strata_status kv_uint(const gguf_file *f, const char *key, int *present, uint64_t *out) {
    const gguf_kv *kv = find_kv(f, key);
    *present = kv != NULL;
    if (!kv) return STRATA_OK;
    const uint8_t *d = kv->value.data;
    int64_t s = 0;
    uint64_t u = 0;
    int is_signed = 0;
    switch (kv->value.type) {
    case STRATA_GGUF_UINT8: u = d[0]; break;
    case STRATA_GGUF_UINT16: u = (uint64_t)d[0] | (uint64_t)d[1] << 8; break;
    case STRATA_GGUF_UINT32: { uint32_t v; memcpy(&v, d, 4); u = v; break; }
    case STRATA_GGUF_UINT64: memcpy(&u, d, 8); break;
    case STRATA_GGUF_INT8: { int8_t v; memcpy(&v, d, 1); s = v; is_signed = 1; break; }
    case STRATA_GGUF_INT16: { int16_t v; memcpy(&v, d, 2); s = v; is_signed = 1; break; }
    case STRATA_GGUF_INT32: { int32_t v; memcpy(&v, d, 4); s = v; is_signed = 1; break; }
    case STRATA_GGUF_INT64: memcpy(&s, d, 8); is_signed = 1; break;
    default:
        return strata_fail(STRATA_ERR_FORMAT, "%s: kv '%s' must be an integer (byte offset %" PRIu64 ")",
                           f->name, key, kv->off);
    }
    if (is_signed) {
        if (s < 0)
            return strata_fail(STRATA_ERR_FORMAT, "%s: kv '%s' is negative (%" PRId64 ") (byte offset %" PRIu64 ")",
                               f->name, key, s, kv->off);
        u = (uint64_t)s;
    }
    *out = u;
    return STRATA_OK;
}

/* Splits "<prefix>-00001-of-00003.gguf" into its prefix length, number and count. */
static int split_name_parse(const char *path, size_t *prefix_len, uint32_t *no, uint32_t *count) {
    const size_t n = strlen(path);
    if (n <= GGUF_SPLIT_SUFFIX_LEN) return 0;
    const char *s = path + n - GGUF_SPLIT_SUFFIX_LEN;
    if (s[0] != '-' || memcmp(s + 6, "-of-", 4) != 0 || memcmp(s + 15, ".gguf", 5) != 0) return 0;
    uint32_t a = 0, b = 0;
    for (int i = 0; i < 5; i++) {
        if (s[1 + i] < '0' || s[1 + i] > '9' || s[10 + i] < '0' || s[10 + i] > '9') return 0;
        a = a * 10 + (uint32_t)(s[1 + i] - '0');
        b = b * 10 + (uint32_t)(s[10 + i] - '0');
    }
    *prefix_len = n - GGUF_SPLIT_SUFFIX_LEN;
    *no = a;
    *count = b;
    return 1;
}

/* Checks split.no / split.count of file i of n. */
static strata_status check_split_keys(const gguf_file *f, uint64_t i, uint64_t n) {
    int has_no, has_count;
    uint64_t no = 0, count = 0;
    strata_status st = kv_uint(f, "split.count", &has_count, &count);
    if (!st) st = kv_uint(f, "split.no", &has_no, &no);
    if (st) return st;
    if (!has_count || count != n)
        return strata_fail(STRATA_ERR_FORMAT, "%s: split %" PRIu64 " of %" PRIu64 ": split.count is %s%" PRIu64
                           " (expected %" PRIu64 ")", f->name, i + 1, n, has_count ? "" : "missing, read as ",
                           count, n);
    if (!has_no || no != i)
        return strata_fail(STRATA_ERR_FORMAT, "%s: split %" PRIu64 " of %" PRIu64 ": split.no is %s%" PRIu64
                           " (expected %" PRIu64 ", 0-based)", f->name, i + 1, n, has_no ? "" : "missing, read as ",
                           no, i);
    return STRATA_OK;
}

/* The number of files in the set file 0 starts (1 when it is not split). */
static strata_status split_count(const gguf_file *f0, const char *path, uint64_t *n,
                                 size_t *prefix_len) {
    int has_count, has_no;
    uint64_t count = 0, no = 0;
    strata_status st = kv_uint(f0, "split.count", &has_count, &count);
    if (!st) st = kv_uint(f0, "split.no", &has_no, &no);
    if (st) return st;
    *n = 1;
    if (!has_count || count == 1) return STRATA_OK;
    if (count == 0 || count > GGUF_MAX_SPLITS)
        return strata_fail(STRATA_ERR_FORMAT, "%s: split.count %" PRIu64 " is not in 1..%d", path, count,
                           GGUF_MAX_SPLITS);
    uint32_t name_no = 0, name_count = 0;
    const int named = split_name_parse(path, prefix_len, &name_no, &name_count);
    if (has_no && no != 0) {
        if (named)
            return strata_fail(STRATA_ERR_FORMAT, "%s: this is split %" PRIu64 " of %" PRIu64
                               "; open the first one, %.*s-00001-of-%05" PRIu64 ".gguf",
                               path, no + 1, count, (int)*prefix_len, path, count);
        return strata_fail(STRATA_ERR_FORMAT, "%s: this is split %" PRIu64 " of %" PRIu64 "; open the first one",
                           path, no + 1, count);
    }
    if (!has_no)
        return strata_fail(STRATA_ERR_FORMAT, "%s: split.count is %" PRIu64 " but split.no is missing",
                           path, count);
    if (!named || name_no != 1 || name_count != count)
        return strata_fail(STRATA_ERR_FORMAT, "%s: split.count is %" PRIu64 " but the file name does not end "
                           "in -00001-of-%05" PRIu64 ".gguf, so the other splits cannot be found",
                           path, count, count);
    *n = count;
    return STRATA_OK;
}

/* Gathers every file's tensors into one list and one name index; names must be unique. */
static strata_status build_tensor_index(strata_gguf *g) {
    int64_t total = 0;
    for (int32_t i = 0; i < g->n_files; i++) total += g->files[i].n_tensors;
    g->tensors = calloc(total ? (size_t)total : 1, sizeof *g->tensors);
    if (!g->tensors || gguf_index_init(&g->tensor_index, (uint64_t)total))
        return strata_fail(STRATA_ERR_NOMEM, "%s: cannot allocate the tensor index (%" PRId64 " tensors)",
                           g->files[0].name, total);
    int64_t k = 0;
    for (int32_t i = 0; i < g->n_files; i++) {
        gguf_file *f = &g->files[i];
        for (int64_t j = 0; j < f->n_tensors; j++, k++) {
            const gguf_tensor *t = &f->tensors[j];
            const int64_t prev = gguf_index_insert(&g->tensor_index, t->t.name, t->t.name_len, k);
            if (prev >= 0) {
                const int32_t of = g->tensors[prev].t.split;
                int64_t local = prev;
                for (int32_t s = 0; s < of; s++) local -= g->files[s].n_tensors;
                return strata_fail(STRATA_ERR_FORMAT, "%s: tensor %" PRId64 " '%.*s': duplicate name (first "
                                   "defined by tensor %" PRId64 " of %s) (byte offset %" PRIu64 ")", f->name, j,
                                   (int)(t->t.name_len > 200 ? 200 : t->t.name_len), t->t.name, local,
                                   g->files[of].name, t->info_off);
            }
            g->tensors[k] = *t;
        }
        free(f->tensors); /* the handle's list replaces the file's */
        f->tensors = NULL;
    }
    g->n_tensors = total;
    return STRATA_OK;
}

static strata_status new_handle(int32_t n_files, strata_gguf **out) {
    strata_gguf *g = calloc(1, sizeof *g);
    if (g) g->files = calloc((size_t)n_files, sizeof *g->files);
    if (!g || !g->files) {
        free(g);
        return strata_fail(STRATA_ERR_NOMEM, "strata_gguf_open: out of memory");
    }
    *out = g;
    return STRATA_OK;
}

strata_status strata_gguf_open(const char *path, strata_gguf **out) {
    if (!path || !out) return strata_fail(STRATA_ERR_INVALID_ARG, "strata_gguf_open: NULL argument");
    gguf_file f0;
    strata_status st = map_file(path, &f0);
    if (!st) st = gguf_parse(&f0, 0);
    uint64_t n = 1;
    size_t prefix_len = 0;
    if (!st) st = split_count(&f0, path, &n, &prefix_len);
    strata_gguf *g = NULL;
    if (!st) st = new_handle((int32_t)n, &g);
    if (st) {
        file_release(&f0);
        return st;
    }
    g->files[0] = f0;
    g->n_files = 1;

    char *split_path = NULL;
    if (n > 1) {
        const size_t cap = prefix_len + GGUF_SPLIT_SUFFIX_LEN + 1;
        split_path = malloc(cap);
        if (!split_path) st = strata_fail(STRATA_ERR_NOMEM, "%s: out of memory", path);
        for (uint64_t i = 1; !st && i < n; i++) {
            snprintf(split_path, cap, "%.*s-%05" PRIu64 "-of-%05" PRIu64 ".gguf", (int)prefix_len, path, i + 1, n);
            gguf_file *f = &g->files[i];
            st = map_file(split_path, f);
            g->n_files = (int32_t)i + 1; /* f is released by close even if it failed halfway */
            if (!st) st = gguf_parse(f, (int32_t)i);
            if (!st) st = check_split_keys(f, i, n);
        }
        int has_total = 0;
        uint64_t total = 0, sum = 0;
        if (!st) st = kv_uint(&g->files[0], "split.tensors.count", &has_total, &total);
        for (int32_t i = 0; !st && i < g->n_files; i++) {
            sum += (uint64_t)g->files[i].n_tensors;
            int has = 0;
            uint64_t v = 0;
            st = kv_uint(&g->files[i], "split.tensors.count", &has, &v);
            if (!st && has_total && has && v != total)
                st = strata_fail(STRATA_ERR_FORMAT, "%s: split.tensors.count is %" PRIu64 " but %s says %" PRIu64,
                                 g->files[i].name, v, path, total);
        }
        if (!st && has_total && sum != total)
            st = strata_fail(STRATA_ERR_FORMAT, "%s: split.tensors.count is %" PRIu64 " but the %" PRIu64
                             " splits hold %" PRIu64 " tensors", path, total, n, sum);
        free(split_path);
    }
    if (!st) st = build_tensor_index(g);
    if (st) {
        strata_gguf_close(g);
        return st;
    }
    *out = g;
    return STRATA_OK;
}

strata_status strata_gguf_open_memory(const void *data, uint64_t size, const char *name, strata_gguf **out) {
    if (!out || (!data && size)) return strata_fail(STRATA_ERR_INVALID_ARG, "strata_gguf_open_memory: NULL argument");
    strata_gguf *g = NULL;
    strata_status st = new_handle(1, &g);
    if (st) return st;
    gguf_file *f = &g->files[0];
    g->n_files = 1;
    f->name = dup_str(name ? name : "<memory>");
    f->base = data ? data : (const void *)"";
    f->size = size;
    if (!f->name) st = strata_fail(STRATA_ERR_NOMEM, "strata_gguf_open_memory: out of memory");
    if (!st) st = gguf_parse(f, 0);
    if (!st) st = build_tensor_index(g);
    if (st) {
        strata_gguf_close(g);
        return st;
    }
    *out = g;
    return STRATA_OK;
}

/* ---------------------------------------------------------------- accessors */

uint32_t strata_gguf_version(const strata_gguf *g) { return g ? g->files[0].version : 0; }
int32_t strata_gguf_n_splits(const strata_gguf *g) { return g ? g->n_files : 0; }
uint64_t strata_gguf_alignment(const strata_gguf *g) { return g ? g->files[0].alignment : 0; }

uint64_t strata_gguf_data_offset(const strata_gguf *g, int32_t split) {
    if (!g || split < 0 || split >= g->n_files) return 0;
    return g->files[split].data_offset;
}

int64_t strata_gguf_n_kv(const strata_gguf *g) { return g ? g->files[0].n_kv : 0; }

strata_status strata_gguf_kv(const strata_gguf *g, int64_t i, const char **key, uint64_t *key_len,
                             strata_gguf_value *value) {
    if (!g) return strata_fail(STRATA_ERR_INVALID_ARG, "strata_gguf_kv: NULL handle");
    const gguf_file *f = &g->files[0];
    if (i < 0 || i >= f->n_kv)
        return strata_fail(STRATA_ERR_INVALID_ARG, "strata_gguf_kv: index %" PRId64 " out of range (%" PRId64 " kvs)",
                           i, f->n_kv);
    if (key) *key = f->kvs[i].key;
    if (key_len) *key_len = f->kvs[i].key_len;
    if (value) *value = f->kvs[i].value;
    return STRATA_OK;
}

strata_status strata_gguf_find_kv(const strata_gguf *g, const char *key, int64_t *index) {
    if (!g || !key || !index) return strata_fail(STRATA_ERR_INVALID_ARG, "strata_gguf_find_kv: NULL argument");
    const int64_t i = gguf_index_find(&g->files[0].kv_index, key, strlen(key));
    if (i < 0) return strata_fail(STRATA_ERR_NOT_FOUND, "%s: no key '%s'", g->files[0].name, key);
    *index = i;
    return STRATA_OK;
}

static inline uint64_t rd_u64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = v << 8 | p[i];
    return v;
}

strata_status strata_gguf_array_get(const strata_gguf *g, const strata_gguf_value *a, uint64_t i,
                                    strata_gguf_value *e) {
    if (!g || !a || !e) return strata_fail(STRATA_ERR_INVALID_ARG, "strata_gguf_array_get: NULL argument");
    if (a->type != STRATA_GGUF_ARRAY)
        return strata_fail(STRATA_ERR_INVALID_ARG, "strata_gguf_array_get: value type %d is not an array", a->type);
    if (i >= a->count)
        return strata_fail(STRATA_ERR_INVALID_ARG, "strata_gguf_array_get: index %" PRIu64 " out of range (%" PRIu64
                           " elements)", i, a->count);
    const gguf_file *f = &g->files[0];
    const uint8_t *base = f->base;
    const uint32_t esz = gguf_scalar_size((uint32_t)a->elem_type);
    /* The array must come from this handle; these checks keep a stale or foreign value
     * from indexing outside our tables. */
    if (esz) {
        if (a->offset > f->size || f->size - a->offset < 12 || a->count > (f->size - a->offset - 12) / esz)
            return strata_fail(STRATA_ERR_INVALID_ARG, "strata_gguf_array_get: the array is not from %s", f->name);
        const uint64_t off = a->offset + 12 + i * esz;
        *e = (strata_gguf_value){.type = a->elem_type, .elem_type = -1, .count = 1, .data = base + off,
                                 .offset = off, .node = GGUF_NONE};
        return STRATA_OK;
    }
    const uint64_t stride = a->elem_type == STRATA_GGUF_STRING ? 1 : a->elem_type == STRATA_GGUF_ARRAY ? 2 : 0;
    if (!stride || a->node > f->pool_len || a->count > (f->pool_len - a->node) / stride)
        return strata_fail(STRATA_ERR_INVALID_ARG, "strata_gguf_array_get: the array is not from %s", f->name);
    const uint64_t off = f->pool[a->node + stride * i];
    if (stride == 1) {
        const uint64_t len = rd_u64(base + off); /* validated by the parser */
        *e = (strata_gguf_value){.type = STRATA_GGUF_STRING, .elem_type = -1, .count = len, .data = base + off + 8,
                                 .offset = off, .node = GGUF_NONE};
    } else {
        const uint32_t et = (uint32_t)base[off] | (uint32_t)base[off + 1] << 8 | (uint32_t)base[off + 2] << 16 |
                            (uint32_t)base[off + 3] << 24;
        *e = (strata_gguf_value){.type = STRATA_GGUF_ARRAY, .elem_type = (int32_t)et, .count = rd_u64(base + off + 4),
                                 .data = gguf_scalar_size(et) ? base + off + 12 : NULL, .offset = off,
                                 .node = f->pool[a->node + 2 * i + 1]};
    }
    return STRATA_OK;
}

int64_t strata_gguf_n_tensors(const strata_gguf *g) { return g ? g->n_tensors : 0; }

strata_status strata_gguf_tensor_info(const strata_gguf *g, int64_t i, strata_gguf_tensor *out) {
    if (!g || !out) return strata_fail(STRATA_ERR_INVALID_ARG, "strata_gguf_tensor_info: NULL argument");
    if (i < 0 || i >= g->n_tensors)
        return strata_fail(STRATA_ERR_INVALID_ARG, "strata_gguf_tensor_info: index %" PRId64 " out of range (%"
                           PRId64 " tensors)", i, g->n_tensors);
    *out = g->tensors[i].t;
    return STRATA_OK;
}

strata_status strata_gguf_find_tensor(const strata_gguf *g, const char *name, int64_t *index) {
    if (!g || !name || !index) return strata_fail(STRATA_ERR_INVALID_ARG, "strata_gguf_find_tensor: NULL argument");
    const int64_t i = gguf_index_find(&g->tensor_index, name, strlen(name));
    if (i < 0) return strata_fail(STRATA_ERR_NOT_FOUND, "%s: no tensor '%s'", g->files[0].name, name);
    *index = i;
    return STRATA_OK;
}

const char *gguf_split_path(const strata_gguf *g, int32_t split) {
    if (!g || split < 0 || split >= g->n_files || !g->files[split].mapped) return NULL;
    return g->files[split].name;
}
