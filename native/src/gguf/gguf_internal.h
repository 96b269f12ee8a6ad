/*
 * gguf_internal.h — what the GGUF parser (gguf.c) hands to the handle code (gguf_open.c).
 *
 * Ownership: a gguf_file owns its tables (kvs, tensors, pool, index) and, when `mapped`, the
 * mapping; every pointer in a key, value or tensor points into `base`. The handle owns its
 * files and one index over the tensors of all of them. Nothing is written after open, so a
 * handle may be read from any number of threads.
 */
#ifndef STRATA_GGUF_INTERNAL_H
#define STRATA_GGUF_INTERNAL_H

#include <stdint.h>

#include "strata.h"

#define GGUF_DEFAULT_ALIGNMENT 32u
#define GGUF_MAX_DEPTH 8           /* arrays nest at most this deep (a top-level array is 1) */
#define GGUF_NONE UINT64_MAX       /* strata_gguf_value.node of a value without elements to index */

/* Name -> index hash table (open addressing, linear probing) over keys or tensor names. */
typedef struct {
    const char *s;
    uint64_t n;
    int64_t idx; /* -1: empty slot */
} gguf_slot;

typedef struct {
    gguf_slot *slots;
    uint64_t mask; /* capacity - 1; capacity is a power of two > 2 * entries */
} gguf_index;

/* Returns STRATA_ERR_NOMEM or OK; n = entries the table will hold. */
strata_status gguf_index_init(gguf_index *ix, uint64_t n);
void gguf_index_free(gguf_index *ix);
/* Inserts (s, n) -> idx unless present; returns the index already stored, or -1 if inserted. */
int64_t gguf_index_insert(gguf_index *ix, const char *s, uint64_t n, int64_t idx);
int64_t gguf_index_find(const gguf_index *ix, const char *s, uint64_t n);

typedef struct {
    const char *key;        /* into the mapping; key_len bytes, non-empty, no NUL */
    uint64_t key_len;
    uint64_t off;           /* byte offset of the kv (its key length field) */
    strata_gguf_value value;
} gguf_kv;

typedef struct {
    strata_gguf_tensor t;   /* as strata_gguf_tensor_info returns it */
    uint64_t info_off;      /* byte offset of the tensor info (its name length field) */
} gguf_tensor;

typedef struct {
    char *name;             /* path or caller's name, for messages (owned) */
    const uint8_t *base;    /* whole file */
    uint64_t size;
    int mapped;             /* base is our mmap: munmap on close */
    uint32_t version;
    uint64_t alignment;
    uint64_t data_offset;   /* absolute start of the data section */
    int64_t n_kv;
    gguf_kv *kvs;
    gguf_index kv_index;
    int64_t n_tensors;
    gguf_tensor *tensors;   /* t.split is set to `split`, t.offset is absolute */
    /* Element tables of arrays of strings / arrays, indexed by strata_gguf_value.node:
     * ARRAY of STRING: pool[node + i] = offset of element i (its length field);
     * ARRAY of ARRAY:  pool[node + 2i] = offset of element i (its element-type field),
     *                  pool[node + 2i + 1] = the node of element i (GGUF_NONE for scalars). */
    uint64_t *pool;
    uint64_t pool_len;
} gguf_file;

/* Parses and validates the GGUF in f->base[0, f->size) (name, base, size already set);
 * fills the rest of f. Tensors get t.split = split. On failure f's tables are freed
 * (base/name untouched) and the message names f->name, the field and the byte offset. */
strata_status gguf_parse(gguf_file *f, int32_t split);
/* Frees the tables gguf_parse allocated (not the mapping or the name). */
void gguf_file_free_tables(gguf_file *f);

/* The file behind split `split` (NULL when out of range or not a file: a buffer from the caller). */
const char *gguf_split_path(const strata_gguf *g, int32_t split);

/* Byte size of a scalar GGUF value type, 0 for STRING/ARRAY/unknown. */
uint32_t gguf_scalar_size(uint32_t type);

#endif
