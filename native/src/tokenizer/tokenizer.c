/* tokenizer.c — byte-level BPE from the GGUF tokenizer.ggml.* arrays.
 *
 * Built once, read-only after: (all tables owned by strata_tokenizer)
 *   bytes[]        raw bytes of every token, back to back (byte-level text decoded)
 *   tok[n_tokens]  (offset, length): where token i's bytes lie in bytes[]
 *   tok_type[n_tokens]      strata_token_type
 *   piece map      raw bytes -> id, NORMAL tokens only (first id wins on duplicates)
 *   merge map      (left id, right id) -> (rank, result id); rank = index in the merges list
 *
 * The build reads each token and merge string once, where the caller has it (packed buffers,
 * or the GGUF mapping itself: strata_tokenizer_init_gguf), and is bound by the random reads of
 * ~1.5M hash-slot probes on a 248k-token vocabulary: the tables are sized once, come zeroed
 * from calloc, and their slots are prefetched a batch ahead (build_tokens, build_merges).
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

/* Eight bytes a step, then splitmix64's finaliser: tokens average ~11 bytes, and a byte-wise
 * hash was a visible share of building the tables from 750k strings. */
static inline uint64_t hash_bytes(const uint8_t *p, size_t n) {
    uint64_t h = 0x9e3779b97f4a7c15ull ^ (uint64_t)n;
    for (; n >= 8; p += 8, n -= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        h = (h ^ w) * 0xbf58476d1ce4e5b9ull;
        h ^= h >> 31;
    }
    if (n) {
        uint64_t w = 0;
        for (size_t k = 0; k < n; k++) w |= (uint64_t)p[k] << (8 * k);
        h = (h ^ w) * 0x94d049bb133111ebull;
    }
    h = (h ^ (h >> 30)) * 0xbf58476d1ce4e5b9ull;
    h = (h ^ (h >> 27)) * 0x94d049bb133111ebull;
    return h ^ (h >> 31);
}

static uint64_t hash_u64(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    return x ^ (x >> 33);
}

/* Both tables use 0 for an empty slot, so that they come zeroed from calloc (fresh pages,
 * no 20 MB memset) and a probe reads one slot: a piece slot is (high 32 bits of the hash) << 32
 * | (id + 1), compared by tag before the token's bytes are touched; a merge key has bit 63 set
 * (ids are below 2^31). */
#define TAG_MASK 0xffffffff00000000ull

typedef struct merge_slot {
    uint64_t key;     /* 1 << 63 | left << 32 | right; 0 = empty */
    int32_t rank;
    int32_t result;
} merge_slot;

typedef struct tok_span {
    uint32_t off, len;  /* together: verifying a candidate costs one miss, not two */
} tok_span;

typedef struct added_token {
    int32_t id;
    int32_t type;
    uint32_t off, len;
} added_token;

struct strata_tokenizer {
    int64_t n_tokens;
    uint8_t *bytes;           /* [total] raw token bytes */
    tok_span *tok;            /* [n_tokens] where token i's bytes lie in bytes[] */
    int32_t *tok_type;        /* [n_tokens] */
    uint64_t *piece_slots;    /* [piece_cap] tag << 32 | (id + 1), 0 = empty; open addressing */
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

static inline int32_t piece_find_h(const strata_tokenizer *t, const uint8_t *p, size_t n, uint64_t h) {
    const uint64_t mask = t->piece_cap - 1, tag = h & TAG_MASK;
    for (uint64_t i = h & mask;; i = (i + 1) & mask) {
        const uint64_t s = t->piece_slots[i];
        if (!s) return -1;
        if ((s & TAG_MASK) == tag) {
            const int32_t id = (int32_t)((uint32_t)s - 1);
            const tok_span sp = t->tok[id];
            if (sp.len == n && memcmp(t->bytes + sp.off, p, n) == 0) return id;
        }
    }
}

/* The first id on h's probe chain whose tag matches, unverified; -1: no such token. The
 * build checks it a pass later (piece_is), when its bytes have been prefetched. */
static inline int32_t piece_candidate(const strata_tokenizer *t, uint64_t h) {
    const uint64_t mask = t->piece_cap - 1, tag = h & TAG_MASK;
    for (uint64_t i = h & mask;; i = (i + 1) & mask) {
        const uint64_t s = t->piece_slots[i];
        if (!s) return -1;
        if ((s & TAG_MASK) == tag) return (int32_t)((uint32_t)s - 1);
    }
}

/* piece_find_h, given the candidate: the candidate when its bytes match, else the full probe
 * (a tag shared by two tokens, one in 2^32). */
static inline int32_t piece_is(const strata_tokenizer *t, int32_t cand, const uint8_t *p, size_t n, uint64_t h) {
    if (cand < 0) return -1;
    const tok_span sp = t->tok[cand];
    if (sp.len == n && memcmp(t->bytes + sp.off, p, n) == 0) return cand;
    return piece_find_h(t, p, n, h);
}

static inline int32_t piece_find(const strata_tokenizer *t, const uint8_t *p, size_t n) {
    return piece_find_h(t, p, n, hash_bytes(p, n));
}

static inline uint64_t merge_key(int32_t a, int32_t b) {
    return 1ull << 63 | (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
}

static inline const merge_slot *merge_find(const strata_tokenizer *t, int32_t a, int32_t b) {
    const uint64_t key = merge_key(a, b), mask = t->merge_cap - 1;
    for (uint64_t h = hash_u64(key) & mask;; h = (h + 1) & mask) {
        const merge_slot *s = &t->merge_slots[h];
        if (s->key == key) return s;
        if (!s->key) return NULL;
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

/* A list of strings read front to back: packed (data, lens[i]) as strata_tokenizer_init takes
 * them, or GGUF's own layout (each string after its u64 little-endian length) straight from a
 * mapped file, so that nothing is copied or unpacked first. */
typedef struct str_cursor {
    const uint8_t *p;
    const uint8_t *end;     /* GGUF layout: end of the run (bounds every length) */
    const uint32_t *lens;   /* NULL: GGUF layout */
    const char *key;        /* the metadata array, for messages */
} str_cursor;

static inline strata_status str_next(str_cursor *c, int64_t i, const uint8_t **s, size_t *n) {
    if (c->lens) {
        *s = c->p;
        *n = c->lens[i];
        c->p += *n;
        return STRATA_OK;
    }
    uint64_t len = 0;
    if (c->end - c->p >= 8)
        for (int k = 7; k >= 0; k--) len = len << 8 | c->p[k];
    if (c->end - c->p < 8 || len > (uint64_t)(c->end - c->p) - 8 || len > UINT32_MAX)
        return strata_fail(STRATA_ERR_FORMAT, "%s[%lld] runs past the array's end", c->key, (long long)i);
    *s = c->p + 8;
    *n = (size_t)len;
    c->p += 8 + len;
    return STRATA_OK;
}

strata_tokenizer_params strata_tokenizer_default_params(void) {
    strata_tokenizer_params p;
    p.pre = STRATA_TOKENIZER_PRE_QWEN2;
    p.ignore_merges = 1;
    return p;
}

void strata_tokenizer_free(strata_tokenizer *t) {
    if (!t) return;
    free(t->bytes);
    free(t->tok);
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

/* Slots ahead that a build loop prefetches: enough misses in flight to hide the latency of the
 * random slot reads, which are nearly all of the build's time. */
enum { PREFETCH_AHEAD = 16 };

/* text_bytes: the encoded size of all token strings (decoded text is never longer). types:
 * n_tokens little-endian int32 (read bytewise: a GGUF array need not be aligned), or NULL. */
static strata_status build_tokens(strata_tokenizer *t, str_cursor *src, uint64_t text_bytes, const uint8_t *types) {
    if (text_bytes > UINT32_MAX)
        return strata_fail(STRATA_ERR_UNSUPPORTED, "tokenizer: %llu bytes of token text (at most 4 GiB)",
                           (unsigned long long)text_bytes);
    const size_t n_tok = (size_t)t->n_tokens;
    t->bytes = malloc(text_bytes ? (size_t)text_bytes : 1);
    t->tok = malloc(sizeof(tok_span) * n_tok);
    t->tok_type = malloc(sizeof(int32_t) * n_tok);
    t->piece_cap = pow2_at_least((uint64_t)t->n_tokens * 2);
    t->piece_slots = calloc((size_t)t->piece_cap, sizeof(uint64_t));
    uint64_t *hash = malloc(sizeof(uint64_t) * n_tok);
    if (!t->bytes || !t->tok || !t->tok_type || !t->piece_slots || !hash) {
        free(hash);
        return strata_fail(STRATA_ERR_NOMEM, "tokenizer: out of memory for %lld tokens", (long long)t->n_tokens);
    }
    for (int i = 0; i < 256; i++) t->byte_id[i] = -1;

    uint32_t o = 0;
    int64_t n_added = 0;
    strata_status st = STRATA_OK;
    for (int64_t i = 0; i < t->n_tokens; i++) {
        const uint8_t *s = NULL;
        size_t len = 0;
        if ((st = str_next(src, i, &s, &len)) != STRATA_OK) goto done;
        int32_t type = STRATA_TOKEN_NORMAL;
        if (types) memcpy(&type, types + 4 * i, 4);
        if (type < STRATA_TOKEN_UNDEFINED || type > STRATA_TOKEN_BYTE) {
            st = strata_fail(STRATA_ERR_FORMAT, "tokenizer.ggml.token_type[%lld] = %d is not a GGUF token type "
                             "(0..6)", (long long)i, type);
            goto done;
        }
        t->tok_type[i] = type;
        t->tok[i].off = o;
        if (is_bpe_type(type)) {
            int64_t n = byte_level_decode(s, len, t->bytes + o);
            if (n < 0) {
                st = strata_fail(STRATA_ERR_FORMAT, "tokenizer.ggml.tokens[%lld] = \"%.*s\" is not byte-level "
                                 "BPE text (GPT-2 byte map); is tokenizer.ggml.model really gpt2?",
                                 (long long)i, (int)(len > 64 ? 64 : len), (const char *)s);
                goto done;
            }
            if (n == 0) {
                st = strata_fail(STRATA_ERR_FORMAT, "tokenizer.ggml.tokens[%lld] is empty", (long long)i);
                goto done;
            }
            t->tok[i].len = (uint32_t)n;
            hash[i] = hash_bytes(t->bytes + o, (size_t)n);
        } else if (type == STRATA_TOKEN_UNUSED) {
            t->tok[i].len = 0;
        } else {
            memcpy(t->bytes + o, s, len);  /* added tokens are literal text */
            t->tok[i].len = (uint32_t)len;
            if ((type == STRATA_TOKEN_CONTROL || type == STRATA_TOKEN_USER_DEFINED) && len > 0) n_added++;
        }
        o += t->tok[i].len;
    }
    /* insert in id order so that duplicates resolve to the lowest id */
    const uint64_t mask = t->piece_cap - 1;
    for (int64_t i = 0; i < t->n_tokens; i++) {
        if (i + PREFETCH_AHEAD < t->n_tokens && is_bpe_type(t->tok_type[i + PREFETCH_AHEAD]))
            __builtin_prefetch(&t->piece_slots[hash[i + PREFETCH_AHEAD] & mask], 1);
        if (!is_bpe_type(t->tok_type[i])) continue;
        const uint8_t *p = t->bytes + t->tok[i].off;
        const uint32_t n = t->tok[i].len;
        const uint64_t h = hash[i], tag = h & TAG_MASK;
        for (uint64_t k = h & mask;; k = (k + 1) & mask) {
            const uint64_t cur = t->piece_slots[k];
            if (!cur) { t->piece_slots[k] = tag | (uint32_t)(i + 1); break; }
            if ((cur & TAG_MASK) == tag) {
                const tok_span sp = t->tok[(uint32_t)cur - 1];
                if (sp.len == n && memcmp(t->bytes + sp.off, p, n) == 0) break;
            }
        }
        if (n == 1 && t->byte_id[p[0]] < 0) t->byte_id[p[0]] = (int32_t)i;
    }
    t->added = malloc(sizeof(added_token) * (size_t)(n_added ? n_added : 1));
    if (!t->added) { st = strata_fail(STRATA_ERR_NOMEM, "tokenizer: out of memory"); goto done; }
    for (int64_t i = 0; i < t->n_tokens; i++) {
        int32_t type = t->tok_type[i];
        if ((type == STRATA_TOKEN_CONTROL || type == STRATA_TOKEN_USER_DEFINED) && t->tok[i].len > 0) {
            added_token *a = &t->added[t->n_added++];
            a->id = (int32_t)i;
            a->type = type;
            a->off = t->tok[i].off;
            a->len = t->tok[i].len;
            t->added_first[t->bytes[a->off]] = 1;
        }
    }
    qsort(t->added, (size_t)t->n_added, sizeof(added_token), cmp_added);
done:
    free(hash);
    return st;
}

/* Merges go through in batches, in passes, so that each pass's random reads are all in flight
 * at once (a dependent chain of misses per merge otherwise: slot, token span, token bytes, for
 * each of three lookups, then the merge slot): (1) split "left right", decode both into
 * scratch, hash left, right and their concatenation, prefetch the three piece slots; (2) take
 * each slot's candidate id, prefetch its span; (3) prefetch the candidates' bytes; (4) in rank
 * order, verify the three (the first malformed merge is the one reported) and prefetch the
 * merge slot; (5) insert, in rank order, so that a repeated pair keeps its first rank. */
enum { MERGE_BATCH = 64 };

typedef struct merge_job {
    const uint8_t *src;   /* the merge's text, for messages */
    size_t n;
    size_t at;            /* left's decoded bytes at scratch + at, right's right after */
    int64_t la, lb;       /* decoded lengths; -1: not byte-level text */
    uint64_t ha, hb, hr;  /* hashes of left, right, left + right */
    int32_t ca, cb, cr;   /* their candidate ids (piece_candidate) */
    uint64_t key;
    int32_t result;
} merge_job;

static strata_status merge_error(int64_t i, const merge_job *j, const char *what) {
    return strata_fail(STRATA_ERR_FORMAT, "tokenizer.ggml.merges[%lld] = \"%.*s\"%s", (long long)i,
                       (int)(j->n > 64 ? 64 : j->n), (const char *)j->src, what);
}

static strata_status build_merges(strata_tokenizer *t, str_cursor *src, int64_t n_merges) {
    t->merge_cap = pow2_at_least((uint64_t)(n_merges > 0 ? n_merges : 1) * 2);
    t->merge_slots = calloc((size_t)t->merge_cap, sizeof(merge_slot));
    size_t scratch_cap = 1 << 16;
    uint8_t *scratch = malloc(scratch_cap);
    merge_job *job = malloc(sizeof(merge_job) * MERGE_BATCH);
    strata_status st = STRATA_OK;
    if (!t->merge_slots || !scratch || !job) {
        st = strata_fail(STRATA_ERR_NOMEM, "tokenizer: out of memory for %lld merges", (long long)n_merges);
        goto done;
    }
    const uint64_t pmask = t->piece_cap - 1, mmask = t->merge_cap - 1;
    for (int64_t base = 0; base < n_merges; base += MERGE_BATCH) {
        const int nb = (int)(n_merges - base < MERGE_BATCH ? n_merges - base : MERGE_BATCH);
        size_t used = 0;
        for (int k = 0; k < nb; k++) {
            merge_job *j = &job[k];
            if ((st = str_next(src, base + k, &j->src, &j->n)) != STRATA_OK) goto done;
            if (used + j->n > scratch_cap) {  /* decoded text is never longer than the merge */
                while (used + j->n > scratch_cap) scratch_cap *= 2;
                uint8_t *grown = realloc(scratch, scratch_cap);
                if (!grown) { st = strata_fail(STRATA_ERR_NOMEM, "tokenizer: out of memory"); goto done; }
                scratch = grown;
            }
            j->at = used;
            const uint8_t *sp = memchr(j->src, ' ', j->n);
            if (!sp || sp == j->src || sp + 1 == j->src + j->n) {
                j->la = j->lb = -2;
                continue;
            }
            const size_t nl = (size_t)(sp - j->src);
            j->la = byte_level_decode(j->src, nl, scratch + used);
            j->lb = -1;
            if (j->la < 0) continue;
            j->ha = hash_bytes(scratch + used, (size_t)j->la);
            __builtin_prefetch(&t->piece_slots[j->ha & pmask]);
            j->lb = byte_level_decode(sp + 1, j->n - nl - 1, scratch + used + j->la);
            used += (size_t)j->la;   /* kept even when right is bad: pass 2 still looks left up */
            if (j->lb < 0) continue;
            j->hb = hash_bytes(scratch + used, (size_t)j->lb);
            j->hr = hash_bytes(scratch + j->at, (size_t)(j->la + j->lb));
            __builtin_prefetch(&t->piece_slots[j->hb & pmask]);
            __builtin_prefetch(&t->piece_slots[j->hr & pmask]);
            used += (size_t)j->lb;
        }
        for (int k = 0; k < nb; k++) {
            merge_job *j = &job[k];
            j->ca = j->la < 0 ? -1 : piece_candidate(t, j->ha);
            j->cb = j->lb < 0 ? -1 : piece_candidate(t, j->hb);
            j->cr = j->lb < 0 ? -1 : piece_candidate(t, j->hr);
            if (j->ca >= 0) __builtin_prefetch(&t->tok[j->ca]);
            if (j->cb >= 0) __builtin_prefetch(&t->tok[j->cb]);
            if (j->cr >= 0) __builtin_prefetch(&t->tok[j->cr]);
        }
        for (int k = 0; k < nb; k++) {
            const merge_job *j = &job[k];
            if (j->ca >= 0) __builtin_prefetch(t->bytes + t->tok[j->ca].off);
            if (j->cb >= 0) __builtin_prefetch(t->bytes + t->tok[j->cb].off);
            if (j->cr >= 0) __builtin_prefetch(t->bytes + t->tok[j->cr].off);
        }
        for (int k = 0; k < nb; k++) {
            merge_job *j = &job[k];
            if (j->la == -2) { st = merge_error(base + k, j, " is not \"left right\""); goto done; }
            const uint8_t *s = scratch + j->at;
            const int32_t a = piece_is(t, j->ca, s, (size_t)(j->la < 0 ? 0 : j->la), j->ha);
            const int32_t b = a < 0 ? -1 : piece_is(t, j->cb, s + j->la, (size_t)(j->lb < 0 ? 0 : j->lb), j->hb);
            const int32_t r = b < 0 ? -1 : piece_is(t, j->cr, s, (size_t)(j->la + j->lb), j->hr);
            if (r < 0) {
                st = merge_error(base + k, j, a < 0 ? ": the left part is not a token" : b < 0 ?
                                 ": the right part is not a token" : ": the merged text is not a token");
                goto done;
            }
            j->key = merge_key(a, b);
            j->result = r;
            __builtin_prefetch(&t->merge_slots[hash_u64(j->key) & mmask], 1);
        }
        for (int k = 0; k < nb; k++) {
            const merge_job *j = &job[k];
            uint64_t h = hash_u64(j->key) & mmask;
            while (t->merge_slots[h].key && t->merge_slots[h].key != j->key) h = (h + 1) & mmask;
            if (!t->merge_slots[h].key) {  /* a repeated pair keeps its first rank */
                t->merge_slots[h].key = j->key;
                t->merge_slots[h].rank = (int32_t)(base + k);
                t->merge_slots[h].result = j->result;
            }
        }
    }
done:
    free(scratch);
    free(job);
    return st;
}

static strata_status check_params(const strata_tokenizer_params *params, strata_tokenizer_params *p) {
    *p = params ? *params : strata_tokenizer_default_params();
    if (p->pre != STRATA_TOKENIZER_PRE_QWEN2 && p->pre != STRATA_TOKENIZER_PRE_QWEN35)
        return strata_fail(STRATA_ERR_UNSUPPORTED, "tokenizer: pre-tokenizer %d is not supported (qwen2 = 0, "
                           "qwen35 = 1)", p->pre);
    return STRATA_OK;
}

/* The one builder behind both entry points. */
static strata_status build(str_cursor *tokens, uint64_t text_bytes, const uint8_t *types, int64_t n_tokens,
                           str_cursor *merges, int64_t n_merges, const strata_tokenizer_params *p,
                           strata_tokenizer **out) {
    pthread_once(&g_byte_map_once, init_byte_map);
    strata_tokenizer *t = calloc(1, sizeof *t);
    if (!t) return strata_fail(STRATA_ERR_NOMEM, "tokenizer: out of memory");
    t->n_tokens = n_tokens;
    t->params = *p;
    strata_status st = build_tokens(t, tokens, text_bytes, types);
    if (st == STRATA_OK) st = build_merges(t, merges, n_merges);
    if (st != STRATA_OK) {
        strata_tokenizer_free(t);
        return st;
    }
    *out = t;
    return STRATA_OK;
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
    strata_tokenizer_params p;
    strata_status st = check_params(params, &p);
    if (st != STRATA_OK) return st;
    uint64_t text_bytes = 0;
    for (int64_t i = 0; i < n_tokens; i++) text_bytes += token_lens[i];
    str_cursor tc = {(const uint8_t *)token_data, NULL, token_lens, "tokenizer.ggml.tokens"};
    str_cursor mc = {(const uint8_t *)merge_data, NULL, merge_lens, "tokenizer.ggml.merges"};
    return build(&tc, text_bytes, (const uint8_t *)token_types, n_tokens, &mc, n_merges, &p, out);
}

/* An ARRAY of STRING from g as a cursor over its mapped bytes: a GGUF array's strings lie back
 * to back (u64 length, bytes), from element 0's length to the end of the last element. */
static strata_status gguf_strings(const strata_gguf *g, const char *key, int required, str_cursor *c,
                                  int64_t *count) {
    int64_t idx;
    const char *k;
    uint64_t kl;
    strata_gguf_value v, first, last;
    *c = (str_cursor){NULL, NULL, NULL, key};
    *count = 0;
    if (strata_gguf_find_kv(g, key, &idx) != STRATA_OK) {
        if (!required) return STRATA_OK;
        return strata_fail(STRATA_ERR_FORMAT, "no %s in the GGUF; convert the model with its tokenizer files", key);
    }
    strata_status st = strata_gguf_kv(g, idx, &k, &kl, &v);
    if (st != STRATA_OK) return st;
    if (v.type != STRATA_GGUF_ARRAY || v.elem_type != STRATA_GGUF_STRING)
        return strata_fail(STRATA_ERR_FORMAT, "%s must be an array of strings", key);
    if (v.count > INT32_MAX)
        return strata_fail(STRATA_ERR_UNSUPPORTED, "%s has %llu entries (at most 2^31 - 1)", key,
                           (unsigned long long)v.count);
    if (v.count == 0) return STRATA_OK;
    if ((st = strata_gguf_array_get(g, &v, 0, &first)) != STRATA_OK ||
        (st = strata_gguf_array_get(g, &v, v.count - 1, &last)) != STRATA_OK)
        return st;
    c->p = (const uint8_t *)first.data - 8;
    c->end = (const uint8_t *)last.data + last.count;
    *count = (int64_t)v.count;
    return STRATA_OK;
}

strata_status strata_tokenizer_init_gguf(const strata_gguf *g, const strata_tokenizer_params *params,
                                         strata_tokenizer **out) {
    if (!g || !out) return strata_fail(STRATA_ERR_INVALID_ARG, "strata_tokenizer_init_gguf: NULL argument");
    strata_tokenizer_params p;
    strata_status st = check_params(params, &p);
    if (st != STRATA_OK) return st;
    str_cursor tc, mc;
    int64_t n_tokens, n_merges;
    if ((st = gguf_strings(g, "tokenizer.ggml.tokens", 1, &tc, &n_tokens)) != STRATA_OK) return st;
    if (n_tokens == 0) return strata_fail(STRATA_ERR_FORMAT, "tokenizer.ggml.tokens is empty");
    if ((st = gguf_strings(g, "tokenizer.ggml.merges", 0, &mc, &n_merges)) != STRATA_OK) return st;
    const uint8_t *types = NULL;
    int64_t idx;
    if (strata_gguf_find_kv(g, "tokenizer.ggml.token_type", &idx) == STRATA_OK) {
        const char *k;
        uint64_t kl;
        strata_gguf_value v;
        if ((st = strata_gguf_kv(g, idx, &k, &kl, &v)) != STRATA_OK) return st;
        if (v.type != STRATA_GGUF_ARRAY || v.count != (uint64_t)n_tokens ||
            (v.elem_type != STRATA_GGUF_INT32 && v.elem_type != STRATA_GGUF_UINT32))
            return strata_fail(STRATA_ERR_FORMAT, "tokenizer.ggml.token_type must be %lld int32 values, one per "
                               "token", (long long)n_tokens);
        types = v.data;
    }
    /* the run's size less the length fields bounds the text; the cursor checks each length */
    const uint64_t text_bytes = (uint64_t)(tc.end - tc.p) - 8 * (uint64_t)n_tokens;
    return build(&tc, text_bytes, types, n_tokens, &mc, n_merges, &p, out);
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
    *data = (const char *)t->bytes + t->tok[id].off;
    *len = t->tok[id].len;
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
        uint32_t l = t->tok[id].len;
        if (o + l <= capacity) memcpy(buf + o, t->bytes + t->tok[id].off, l);
        o += l;
    }
    *len = o;
    if (o > capacity)
        return strata_fail(STRATA_ERR_BUFFER_TOO_SMALL, "strata_tokenizer_decode: %llu bytes needed, the buffer "
                           "holds %llu", (unsigned long long)o, (unsigned long long)capacity);
    return STRATA_OK;
}
