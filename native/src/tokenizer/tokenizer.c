/* tokenizer.c — byte-level BPE from the GGUF tokenizer.ggml.* arrays.
 *
 * Built once, read-only after: (all tables owned by strata_tokenizer)
 *   bytes[]        raw bytes of every token, back to back (byte-level text decoded)
 *   tok_off/len[n_tokens]   where token i's bytes lie in bytes[]
 *   tok_type[n_tokens]      strata_token_type
 *   piece map      raw bytes -> id, NORMAL tokens only (first id wins on duplicates)
 *   merge map      (left id, right id) -> (rank, result id); rank = index in the merges list
 *   byte_id[256]   the token of each single byte (-1: none)
 *   added[]        CONTROL / USER_DEFINED tokens, longest first, matched literally in text
 *
 * Encoding a piece: if ignore_merges and the whole piece is a token, that token (tiktoken
 * and HF's ignore_merges do this; a vocabulary that is not BPE-closed, like Qwen 3.5's,
 * needs it). Otherwise start from single bytes and repeatedly merge the adjacent pair of
 * lowest rank, leftmost on ties, until no pair has a merge: what HF's BPE and tiktoken
 * both do.
 */
#include "strata.h"
#include "tokenizer_internal.h"
#include "util/error.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------- hash maps */

static uint64_t hash_bytes(const uint8_t *p, size_t n) {
    uint64_t h = 0xcbf29ce484222325ull;  /* FNV-1a, then a final mix */
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 0x100000001b3ull;
    h ^= h >> 29;
    h *= 0xbf58476d1ce4e5b9ull;
    return h ^ (h >> 32);
}

static uint64_t hash_u64(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    return x ^ (x >> 33);
}

typedef struct merge_slot {
    uint64_t key;     /* (left << 32) | right; UINT64_MAX = empty */
    int32_t rank;
    int32_t result;
} merge_slot;

typedef struct added_token {
    int32_t id;
    int32_t type;
    uint32_t off, len;
} added_token;

struct strata_tokenizer {
    int64_t n_tokens;
    uint8_t *bytes;           /* [total] raw token bytes */
    uint32_t *tok_off;        /* [n_tokens] */
    uint32_t *tok_len;        /* [n_tokens] */
    int32_t *tok_type;        /* [n_tokens] */
    int32_t *piece_slots;     /* [piece_cap] token ids, -1 = empty; open addressing */
    uint64_t piece_cap;       /* power of two */
    merge_slot *merge_slots;  /* [merge_cap] */
    uint64_t merge_cap;       /* power of two */
    int32_t byte_id[256];
    added_token *added;       /* [n_added], longest first */
    int64_t n_added;
    uint8_t added_first[256]; /* 1 if some added token starts with this byte */
    strata_tokenizer_params params;
};

static uint64_t pow2_at_least(uint64_t n) {
    uint64_t c = 16;
    while (c < n) c <<= 1;
    return c;
}

static int32_t piece_find(const strata_tokenizer *t, const uint8_t *p, size_t n) {
    uint64_t mask = t->piece_cap - 1, h = hash_bytes(p, n) & mask;
    for (;;) {
        int32_t id = t->piece_slots[h];
        if (id < 0) return -1;
        if (t->tok_len[id] == n && memcmp(t->bytes + t->tok_off[id], p, n) == 0) return id;
        h = (h + 1) & mask;
    }
}

static void piece_insert(strata_tokenizer *t, int32_t id) {
    const uint8_t *p = t->bytes + t->tok_off[id];
    size_t n = t->tok_len[id];
    uint64_t mask = t->piece_cap - 1, h = hash_bytes(p, n) & mask;
    for (;;) {
        int32_t cur = t->piece_slots[h];
        if (cur < 0) { t->piece_slots[h] = id; return; }
        if (t->tok_len[cur] == n && memcmp(t->bytes + t->tok_off[cur], p, n) == 0) return;
        h = (h + 1) & mask;
    }
}

static inline const merge_slot *merge_find(const strata_tokenizer *t, int32_t a, int32_t b) {
    uint64_t key = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
    uint64_t mask = t->merge_cap - 1, h = hash_u64(key) & mask;
    for (;;) {
        const merge_slot *s = &t->merge_slots[h];
        if (s->key == key) return s;
        if (s->key == UINT64_MAX) return NULL;
        h = (h + 1) & mask;
    }
}

/* ---------------------------------------------------------------- byte-level text */

/* GPT-2's map: bytes that are printable and not space stand for themselves; the other 68
 * (0x00-0x20, 0x7F-0xA0, 0xAD) are written as U+0100 + their order among those. */
static int byte_is_self(int b) { return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE; }

static int16_t g_char_to_byte[0x144];  /* filled once (pthread_once), read-only after */
static pthread_once_t g_byte_map_once = PTHREAD_ONCE_INIT;

static void init_byte_map(void) {
    int n = 0;
    for (int i = 0; i < 0x144; i++) g_char_to_byte[i] = -1;
    for (int b = 0; b < 256; b++) {
        if (byte_is_self(b)) g_char_to_byte[b] = (int16_t)b;
        else g_char_to_byte[0x100 + n++] = (int16_t)b;
    }
}

/* Decodes byte-level text s[0..n) into out (n bytes at most); returns the length, or -1
 * when a char is outside the map or the UTF-8 is malformed. */
static int64_t byte_level_decode(const uint8_t *s, size_t n, uint8_t *out) {
    size_t i = 0, o = 0;
    while (i < n) {
        uint32_t c = s[i], cp;
        if (c < 0x80) { cp = c; i += 1; }
        else if ((c & 0xE0) == 0xC0 && i + 1 < n && (s[i + 1] & 0xC0) == 0x80) {
            cp = ((c & 0x1F) << 6) | (s[i + 1] & 0x3F);
            i += 2;
        } else return -1;  /* every mapped char is below U+0800 */
        if (cp >= 0x144 || g_char_to_byte[cp] < 0) return -1;
        out[o++] = (uint8_t)g_char_to_byte[cp];
    }
    return (int64_t)o;
}

/* ---------------------------------------------------------------- build */

strata_tokenizer_params strata_tokenizer_default_params(void) {
    strata_tokenizer_params p;
    p.pre = STRATA_TOKENIZER_PRE_QWEN2;
    p.ignore_merges = 1;
    return p;
}

void strata_tokenizer_free(strata_tokenizer *t) {
    if (!t) return;
    free(t->bytes);
    free(t->tok_off);
    free(t->tok_len);
    free(t->tok_type);
    free(t->piece_slots);
    free(t->merge_slots);
    free(t->added);
    free(t);
}

int64_t strata_tokenizer_n_tokens(const strata_tokenizer *t) { return t ? t->n_tokens : 0; }

static int is_bpe_type(int32_t type) { return type == STRATA_TOKEN_NORMAL || type == STRATA_TOKEN_UNDEFINED; }

static int cmp_added(const void *a, const void *b) {
    const added_token *x = a, *y = b;
    if (x->len != y->len) return x->len < y->len ? 1 : -1;
    return x->id < y->id ? -1 : x->id > y->id;
}

static strata_status build_tokens(strata_tokenizer *t, const char *token_data, const uint32_t *token_lens,
                                  const int32_t *token_types) {
    uint64_t total = 0;
    for (int64_t i = 0; i < t->n_tokens; i++) total += token_lens[i];
    if (total > UINT32_MAX)
        return strata_fail(STRATA_ERR_UNSUPPORTED, "tokenizer: %llu bytes of token text (at most 4 GiB)",
                           (unsigned long long)total);
    t->bytes = malloc(total ? total : 1);
    t->tok_off = malloc(sizeof(uint32_t) * (size_t)t->n_tokens);
    t->tok_len = malloc(sizeof(uint32_t) * (size_t)t->n_tokens);
    t->tok_type = malloc(sizeof(int32_t) * (size_t)t->n_tokens);
    t->piece_cap = pow2_at_least((uint64_t)t->n_tokens * 2);
    t->piece_slots = malloc(sizeof(int32_t) * t->piece_cap);
    if (!t->bytes || !t->tok_off || !t->tok_len || !t->tok_type || !t->piece_slots)
        return strata_fail(STRATA_ERR_NOMEM, "tokenizer: out of memory for %lld tokens", (long long)t->n_tokens);
    memset(t->piece_slots, 0xff, sizeof(int32_t) * t->piece_cap);
    for (int i = 0; i < 256; i++) t->byte_id[i] = -1;

    const uint8_t *src = (const uint8_t *)token_data;
    uint32_t o = 0;
    int64_t n_added = 0;
    for (int64_t i = 0; i < t->n_tokens; i++) {
        int32_t type = token_types ? token_types[i] : STRATA_TOKEN_NORMAL;
        if (type < STRATA_TOKEN_UNDEFINED || type > STRATA_TOKEN_BYTE)
            return strata_fail(STRATA_ERR_FORMAT, "tokenizer.ggml.token_type[%lld] = %d is not a GGUF token type "
                               "(0..6)", (long long)i, type);
        t->tok_type[i] = type;
        t->tok_off[i] = o;
        if (is_bpe_type(type)) {
            int64_t n = byte_level_decode(src, token_lens[i], t->bytes + o);
            if (n < 0)
                return strata_fail(STRATA_ERR_FORMAT, "tokenizer.ggml.tokens[%lld] = \"%.*s\" is not byte-level "
                                   "BPE text (GPT-2 byte map); is tokenizer.ggml.model really gpt2?",
                                   (long long)i, (int)(token_lens[i] > 64 ? 64 : token_lens[i]), (const char *)src);
            if (n == 0)
                return strata_fail(STRATA_ERR_FORMAT, "tokenizer.ggml.tokens[%lld] is empty", (long long)i);
            t->tok_len[i] = (uint32_t)n;
        } else if (type == STRATA_TOKEN_UNUSED) {
            t->tok_len[i] = 0;
        } else {
            memcpy(t->bytes + o, src, token_lens[i]);  /* added tokens are literal text */
            t->tok_len[i] = token_lens[i];
            if ((type == STRATA_TOKEN_CONTROL || type == STRATA_TOKEN_USER_DEFINED) && token_lens[i] > 0) n_added++;
        }
        o += t->tok_len[i];
        src += token_lens[i];
    }
    /* insert in id order so that duplicates resolve to the lowest id */
    for (int64_t i = 0; i < t->n_tokens; i++) {
        if (!is_bpe_type(t->tok_type[i])) continue;
        piece_insert(t, (int32_t)i);
        if (t->tok_len[i] == 1 && t->byte_id[t->bytes[t->tok_off[i]]] < 0)
            t->byte_id[t->bytes[t->tok_off[i]]] = (int32_t)i;
    }
    t->added = malloc(sizeof(added_token) * (size_t)(n_added ? n_added : 1));
    if (!t->added) return strata_fail(STRATA_ERR_NOMEM, "tokenizer: out of memory");
    for (int64_t i = 0; i < t->n_tokens; i++) {
        int32_t type = t->tok_type[i];
        if ((type == STRATA_TOKEN_CONTROL || type == STRATA_TOKEN_USER_DEFINED) && t->tok_len[i] > 0) {
            added_token *a = &t->added[t->n_added++];
            a->id = (int32_t)i;
            a->type = type;
            a->off = t->tok_off[i];
            a->len = t->tok_len[i];
            t->added_first[t->bytes[a->off]] = 1;
        }
    }
    qsort(t->added, (size_t)t->n_added, sizeof(added_token), cmp_added);
    return STRATA_OK;
}

static strata_status build_merges(strata_tokenizer *t, const char *merge_data, const uint32_t *merge_lens,
                                  int64_t n_merges) {
    t->merge_cap = pow2_at_least((uint64_t)(n_merges > 0 ? n_merges : 1) * 2);
    t->merge_slots = malloc(sizeof(merge_slot) * t->merge_cap);
    if (!t->merge_slots) return strata_fail(STRATA_ERR_NOMEM, "tokenizer: out of memory for %lld merges",
                                            (long long)n_merges);
    memset(t->merge_slots, 0xff, sizeof(merge_slot) * t->merge_cap);
    uint32_t max_len = 0;
    for (int64_t i = 0; i < n_merges; i++) if (merge_lens[i] > max_len) max_len = merge_lens[i];
    uint8_t *buf = malloc((size_t)max_len + 1);
    if (!buf) return strata_fail(STRATA_ERR_NOMEM, "tokenizer: out of memory");
    const uint8_t *src = (const uint8_t *)merge_data;
    strata_status st = STRATA_OK;
    for (int64_t i = 0; i < n_merges; i++, src += merge_lens[i - 1]) {
        size_t n = merge_lens[i];
        const uint8_t *sp = memchr(src, ' ', n);
        if (!sp || sp == src || sp + 1 == src + n) {
            st = strata_fail(STRATA_ERR_FORMAT, "tokenizer.ggml.merges[%lld] = \"%.*s\" is not \"left right\"",
                             (long long)i, (int)(n > 64 ? 64 : n), (const char *)src);
            break;
        }
        size_t nl = (size_t)(sp - src);
        int64_t a_len = byte_level_decode(src, nl, buf);
        int64_t b_len = a_len < 0 ? -1 : byte_level_decode(sp + 1, n - nl - 1, buf + a_len);
        int32_t a = a_len < 0 ? -1 : piece_find(t, buf, (size_t)a_len);
        int32_t b = b_len < 0 ? -1 : piece_find(t, buf + a_len, (size_t)b_len);
        int32_t r = (a < 0 || b < 0) ? -1 : piece_find(t, buf, (size_t)(a_len + b_len));
        if (r < 0) {
            st = strata_fail(STRATA_ERR_FORMAT, "tokenizer.ggml.merges[%lld] = \"%.*s\": %s is not a token",
                             (long long)i, (int)(n > 64 ? 64 : n), (const char *)src,
                             a < 0 ? "the left part" : b < 0 ? "the right part" : "the merged text");
            break;
        }
        uint64_t key = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
        uint64_t mask = t->merge_cap - 1, h = hash_u64(key) & mask;
        while (t->merge_slots[h].key != UINT64_MAX && t->merge_slots[h].key != key) h = (h + 1) & mask;
        if (t->merge_slots[h].key == UINT64_MAX) {  /* a repeated pair keeps its first rank */
            t->merge_slots[h].key = key;
            t->merge_slots[h].rank = (int32_t)i;
            t->merge_slots[h].result = r;
        }
    }
    free(buf);
    return st;
}

strata_status strata_tokenizer_init(const char *token_data, const uint32_t *token_lens,
                                    const int32_t *token_types, int64_t n_tokens,
                                    const char *merge_data, const uint32_t *merge_lens,
                                    int64_t n_merges, const strata_tokenizer_params *params,
                                    strata_tokenizer **out) {
    if (!out) return strata_fail(STRATA_ERR_INVALID_ARG, "strata_tokenizer_init: out is NULL");
    if (n_tokens <= 0 || n_tokens > INT32_MAX || !token_lens || !token_data)
        return strata_fail(STRATA_ERR_INVALID_ARG, "strata_tokenizer_init: need 1..2^31-1 tokens with data and "
                           "lengths (got %lld)", (long long)n_tokens);
    if (n_merges < 0 || n_merges > INT32_MAX || (n_merges > 0 && (!merge_data || !merge_lens)))
        return strata_fail(STRATA_ERR_INVALID_ARG, "strata_tokenizer_init: bad merges (%lld)", (long long)n_merges);
    strata_tokenizer_params p = params ? *params : strata_tokenizer_default_params();
    if (p.pre != STRATA_TOKENIZER_PRE_QWEN2 && p.pre != STRATA_TOKENIZER_PRE_QWEN35)
        return strata_fail(STRATA_ERR_UNSUPPORTED, "tokenizer: pre-tokenizer %d is not supported (qwen2 = 0, "
                           "qwen35 = 1)", p.pre);
    pthread_once(&g_byte_map_once, init_byte_map);
    strata_tokenizer *t = calloc(1, sizeof *t);
    if (!t) return strata_fail(STRATA_ERR_NOMEM, "tokenizer: out of memory");
    t->n_tokens = n_tokens;
    t->params = p;
    strata_status st = build_tokens(t, token_data, token_lens, token_types);
    if (st == STRATA_OK) st = build_merges(t, merge_data, merge_lens, n_merges);
    if (st != STRATA_OK) {
        strata_tokenizer_free(t);
        return st;
    }
    *out = t;
    return STRATA_OK;
}

/* ---------------------------------------------------------------- encode */

/* Pieces up to this many bytes use the quadratic scan (fastest when short). */
enum { BPE_SCAN_MAX = 64 };

typedef struct id_sink {
    int32_t *ids;
    uint64_t capacity;
    uint64_t n;
} id_sink;

static inline void emit(id_sink *o, int32_t id) {
    if (o->n < o->capacity) o->ids[o->n] = id;
    o->n++;
}

/* BPE of one piece. parts[] holds the current tokens, rank[k] the rank of merging parts k
 * and k+1 (INT32_MAX: none). Each step merges the lowest rank, leftmost on ties: O(n^2) in
 * the piece length, which is short for anything but long runs of one char. */
/* Long pieces (a megabyte of DNA or base64 is one pre-token) take the same merges in
 * O(n log n): symbols in a linked list, candidate pairs in a min-heap ordered by (rank,
 * start of the left symbol), stale entries skipped when popped. The heap's minimum is the
 * scan's choice (lowest rank, leftmost), so both paths give the same ids. */
typedef struct heap_entry {
    int32_t rank;
    uint32_t pos;   /* index of the left symbol (its first byte) */
    uint32_t right; /* index of the right symbol when pushed */
    int32_t result;
} heap_entry;

static inline int heap_less(const heap_entry *a, const heap_entry *b) {
    return a->rank < b->rank || (a->rank == b->rank && a->pos < b->pos);
}

static void heap_push(heap_entry *h, size_t *n, heap_entry e) {
    size_t i = (*n)++;
    while (i > 0) {
        size_t parent = (i - 1) / 2;
        if (!heap_less(&e, &h[parent])) break;
        h[i] = h[parent];
        i = parent;
    }
    h[i] = e;
}

static heap_entry heap_pop(heap_entry *h, size_t *n) {
    heap_entry top = h[0], last = h[--(*n)];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= *n) break;
        if (c + 1 < *n && heap_less(&h[c + 1], &h[c])) c++;
        if (!heap_less(&h[c], &last)) break;
        h[i] = h[c];
        i = c;
    }
    if (*n) h[i] = last;
    return top;
}

static strata_status bpe_long(const strata_tokenizer *t, const uint8_t *p, size_t n, id_sink *o) {
    /* id[k], next[k], prev[k] for the symbol starting at byte k (id -1: absorbed) */
    int32_t *id = malloc(sizeof(int32_t) * n);
    uint32_t *next = malloc(sizeof(uint32_t) * n), *prev = malloc(sizeof(uint32_t) * n);
    heap_entry *heap = malloc(sizeof(heap_entry) * n * 3);  /* n - 1 pairs, then 2 per merge */
    size_t hn = 0;
    strata_status st = STRATA_OK;
    if (!id || !next || !prev || !heap) {
        st = strata_fail(STRATA_ERR_NOMEM, "tokenizer: out of memory for a %zu-byte piece", n);
        goto done;
    }
    for (size_t k = 0; k < n; k++) {
        id[k] = t->byte_id[p[k]];
        if (id[k] < 0) {
            st = strata_fail(STRATA_ERR_FORMAT, "tokenizer: byte 0x%02x has no token in the vocabulary", p[k]);
            goto done;
        }
        next[k] = (uint32_t)(k + 1);  /* n = none */
        prev[k] = (uint32_t)(k - 1);  /* wraps for k = 0: never read */
    }
    for (size_t k = 0; k + 1 < n; k++) {
        const merge_slot *s = merge_find(t, id[k], id[k + 1]);
        if (s) heap_push(heap, &hn, (heap_entry){s->rank, (uint32_t)k, (uint32_t)(k + 1), s->result});
    }
    while (hn) {
        heap_entry e = heap_pop(heap, &hn);
        if (id[e.pos] < 0 || next[e.pos] != e.right || e.right >= n) continue;          /* stale */
        const merge_slot *cur = merge_find(t, id[e.pos], id[e.right]);
        if (!cur || cur->rank != e.rank) continue;                                      /* stale */
        id[e.pos] = e.result;
        id[e.right] = -1;
        next[e.pos] = next[e.right];
        if (next[e.pos] < n) prev[next[e.pos]] = e.pos;
        if (e.pos > 0) {
            uint32_t l = prev[e.pos];
            const merge_slot *s = merge_find(t, id[l], id[e.pos]);
            if (s) heap_push(heap, &hn, (heap_entry){s->rank, l, e.pos, s->result});
        }
        if (next[e.pos] < n) {
            const merge_slot *s = merge_find(t, id[e.pos], id[next[e.pos]]);
            if (s) heap_push(heap, &hn, (heap_entry){s->rank, e.pos, next[e.pos], s->result});
        }
    }
    for (size_t k = 0; k < n; k = next[k]) emit(o, id[k]);
done:
    free(id);
    free(next);
    free(prev);
    free(heap);
    return st;
}

static strata_status bpe_piece(const strata_tokenizer *t, const uint8_t *p, size_t n, id_sink *o) {
    if (t->params.ignore_merges || n == 1) {
        int32_t id = piece_find(t, p, n);
        if (id >= 0) { emit(o, id); return STRATA_OK; }
    }
    if (n > BPE_SCAN_MAX) return bpe_long(t, p, n, o);
    int32_t parts[BPE_SCAN_MAX], rank[BPE_SCAN_MAX], res[BPE_SCAN_MAX];
    for (size_t k = 0; k < n; k++) {
        parts[k] = t->byte_id[p[k]];
        if (parts[k] < 0)
            return strata_fail(STRATA_ERR_FORMAT, "tokenizer: byte 0x%02x has no token in the vocabulary", p[k]);
    }
    size_t m = n;
    for (size_t k = 0; k + 1 < m; k++) {
        const merge_slot *s = merge_find(t, parts[k], parts[k + 1]);
        rank[k] = s ? s->rank : INT32_MAX;
        res[k] = s ? s->result : -1;
    }
    while (m > 1) {
        size_t best = 0;
        int32_t br = INT32_MAX;
        for (size_t k = 0; k + 1 < m; k++)
            if (rank[k] < br) { br = rank[k]; best = k; }
        if (br == INT32_MAX) break;
        parts[best] = res[best];
        /* parts best+1.. close up by one; so do the pairs after the merged one (m - 1 pairs
         * before, m - 2 after); pairs best - 1 and best are recomputed below */
        memmove(parts + best + 1, parts + best + 2, sizeof(int32_t) * (m - best - 2));
        if (m >= best + 3) {
            memmove(rank + best + 1, rank + best + 2, sizeof(int32_t) * (m - best - 3));
            memmove(res + best + 1, res + best + 2, sizeof(int32_t) * (m - best - 3));
        }
        m--;
        if (best > 0) {
            const merge_slot *s = merge_find(t, parts[best - 1], parts[best]);
            rank[best - 1] = s ? s->rank : INT32_MAX;
            res[best - 1] = s ? s->result : -1;
        }
        if (best + 1 < m) {
            const merge_slot *s = merge_find(t, parts[best], parts[best + 1]);
            rank[best] = s ? s->rank : INT32_MAX;
            res[best] = s ? s->result : -1;
        }
    }
    for (size_t k = 0; k < m; k++) emit(o, parts[k]);
    return STRATA_OK;
}

static strata_status encode_segment(const strata_tokenizer *t, const uint8_t *s, size_t n, id_sink *o) {
    const int marks = t->params.pre == STRATA_TOKENIZER_PRE_QWEN35;
    size_t i = 0;
    while (i < n) {
        size_t j = strata_pretok_next(s, n, i, marks);
        strata_status st = bpe_piece(t, s + i, j - i, o);
        if (st != STRATA_OK) return st;
        i = j;
    }
    return STRATA_OK;
}

/* The added token that starts at s[i], longest first, or NULL. */
static const added_token *added_at(const strata_tokenizer *t, const uint8_t *s, size_t n, size_t i,
                                   int parse_special) {
    for (int64_t k = 0; k < t->n_added; k++) {
        const added_token *a = &t->added[k];
        if (a->type == STRATA_TOKEN_CONTROL && !parse_special) continue;
        if (a->len <= n - i && memcmp(s + i, t->bytes + a->off, a->len) == 0) return a;
    }
    return NULL;
}

/* Offset of the first byte of s[0..n) that does not start a well-formed UTF-8 sequence
 * (Unicode 15 table 3-7: no overlong forms, no surrogates, nothing above U+10FFFF; a sequence
 * cut off by the end counts as malformed at its first byte), or n when all of it is valid.
 * Python's strict decoder agrees on the offset (UnicodeDecodeError.start). */
static size_t utf8_invalid_at(const uint8_t *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        const uint8_t c = s[i];
        if (c < 0x80) { i++; continue; }
        size_t len;
        uint8_t lo = 0x80, hi = 0xbf;  /* the range of the second byte */
        if (c >= 0xc2 && c <= 0xdf) len = 2;
        else if (c >= 0xe0 && c <= 0xef) {
            len = 3;
            if (c == 0xe0) lo = 0xa0;       /* overlong */
            else if (c == 0xed) hi = 0x9f;  /* U+D800..U+DFFF */
        } else if (c >= 0xf0 && c <= 0xf4) {
            len = 4;
            if (c == 0xf0) lo = 0x90;       /* overlong */
            else if (c == 0xf4) hi = 0x8f;  /* above U+10FFFF */
        } else return i;                    /* a continuation byte, C0, C1 or F5..FF */
        if (n - i < len || s[i + 1] < lo || s[i + 1] > hi) return i;
        for (size_t k = 2; k < len; k++)
            if ((s[i + k] & 0xc0) != 0x80) return i;
        i += len;
    }
    return n;
}

strata_status strata_tokenizer_encode(const strata_tokenizer *t, const char *text, uint64_t text_len,
                                      int32_t parse_special, int32_t *ids, uint64_t capacity, uint64_t *n_ids) {
    if (!t || (!text && text_len) || !n_ids || (!ids && capacity))
        return strata_fail(STRATA_ERR_INVALID_ARG, "strata_tokenizer_encode: NULL tokenizer, text, ids or n_ids");
    const uint8_t *s = (const uint8_t *)text;
    size_t n = (size_t)text_len, seg = 0;
    /* The one check of every text that becomes ids (pyrunner hands its text here unchanged
     * when it is not UTF-8): byte-level BPE would encode any bytes, but the model never saw
     * such text and the caller has most likely mixed up an encoding. */
    const size_t bad = utf8_invalid_at(s, n);
    if (bad < n)
        return strata_fail(STRATA_ERR_INVALID_ARG, "the prompt is not valid UTF-8 at byte %llu (0x%02x); give "
                           "the text in UTF-8", (unsigned long long)bad, s[bad]);
    id_sink o = {ids, capacity, 0};
    strata_status st = STRATA_OK;
    if (t->n_added) {
        for (size_t i = 0; i < n && st == STRATA_OK;) {
            const added_token *a = t->added_first[s[i]] ? added_at(t, s, n, i, parse_special) : NULL;
            if (!a) { i++; continue; }
            st = encode_segment(t, s + seg, i - seg, &o);
            emit(&o, a->id);
            i += a->len;
            seg = i;
        }
    }
    if (st == STRATA_OK) st = encode_segment(t, s + seg, n - seg, &o);
    if (st != STRATA_OK) return st;
    *n_ids = o.n;
    if (o.n > capacity)
        return strata_fail(STRATA_ERR_BUFFER_TOO_SMALL, "strata_tokenizer_encode: the text needs %llu ids, the "
                           "buffer holds %llu", (unsigned long long)o.n, (unsigned long long)capacity);
    return STRATA_OK;
}

/* ---------------------------------------------------------------- decode */

strata_status strata_tokenizer_token_bytes(const strata_tokenizer *t, int32_t id, const char **data, uint64_t *len) {
    if (!t || !data || !len) return strata_fail(STRATA_ERR_INVALID_ARG, "strata_tokenizer_token_bytes: NULL argument");
    if (id < 0 || id >= t->n_tokens)
        return strata_fail(STRATA_ERR_INVALID_ARG, "token id %d is out of range (the vocabulary has %lld)", id,
                           (long long)t->n_tokens);
    *data = (const char *)t->bytes + t->tok_off[id];
    *len = t->tok_len[id];
    return STRATA_OK;
}

strata_status strata_tokenizer_decode(const strata_tokenizer *t, const int32_t *ids, uint64_t n_ids, char *buf,
                                      uint64_t capacity, uint64_t *len) {
    if (!t || (!ids && n_ids) || !len || (!buf && capacity))
        return strata_fail(STRATA_ERR_INVALID_ARG, "strata_tokenizer_decode: NULL argument");
    uint64_t o = 0;
    for (uint64_t k = 0; k < n_ids; k++) {
        int32_t id = ids[k];
        if (id < 0 || id >= t->n_tokens)
            return strata_fail(STRATA_ERR_INVALID_ARG, "ids[%llu] = %d is out of range (the vocabulary has %lld)",
                               (unsigned long long)k, id, (long long)t->n_tokens);
        uint32_t l = t->tok_len[id];
        if (o + l <= capacity) memcpy(buf + o, t->bytes + t->tok_off[id], l);
        o += l;
    }
    *len = o;
    if (o > capacity)
        return strata_fail(STRATA_ERR_BUFFER_TOO_SMALL, "strata_tokenizer_decode: %llu bytes needed, the buffer "
                           "holds %llu", (unsigned long long)o, (unsigned long long)capacity);
    return STRATA_OK;
}
