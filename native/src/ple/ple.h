/*
 * ple.h — the PLE table access layer (DESIGN §6, seed 003): where the n-gram table's rows come
 * from, how they are read, and the worker thread that gathers them off the model thread.
 *
 * The table is rows of `row_bytes` bytes, row r at file offset `file_off + r * row_bytes`: either
 * the GGUF tensor per_layer_token_embd.weight used in place (its mapping belongs to the GGUF
 * reader) or a packed NVFP4 file made by `strata pack-ple` (mapped here). Two access modes:
 *   mmap    rows are copied out of the read-only mapping; madvise(MADV_RANDOM) on the table's
 *           pages so a fault reads one 4 KiB page instead of the readahead window (8 MiB on this
 *           VM's virtio disk, DESIGN §8). Nothing is copied into anonymous memory: the pages
 *           are file-backed page cache and stay evictable.
 *   direct  pread() of exactly the needed rows into the engine's buffer, on our own descriptor
 *           with POSIX_FADV_RANDOM (no readahead). A step without WILLNEED prefetch (decode: one
 *           token, or a verify window of up to PLE_DIRECT_STEP_MAX tokens: such steps skip WILLNEED)
 *           reads through a second descriptor opened with O_DIRECT: whole aligned 512-byte
 *           sectors (the device's logical block; 4 KiB where it needs that) into an aligned bounce
 *           buffer, the rows sorted by sector and rows sharing or touching sectors read as one run,
 *           so a cold 90-byte row costs 512 or 1024 bytes of storage, not the 4 KiB page a buffered
 *           pread fills; the runs are in flight together (Linux AIO, up to PLE_AIO_DEPTH). A longer
 *           (prefill) step keeps the buffered descriptor and WILLNEED: it overlaps the page reads of
 *           thousands of rows, and O_DIRECT would read those pages again. Where O_DIRECT is
 *           refused (tmpfs, some filesystems) every step uses the buffered pread; `why` says so.
 * "auto" picks one with a short read probe at open; ple_table.why says which and why.
 *
 * Prefetch: for a step of more than one token (in direct mode with O_DIRECT: of more than
 * PLE_DIRECT_STEP_MAX tokens) every needed row is known up front; the rows are
 * mapped to their first and last 4 KiB page, the pages deduplicated and sorted, runs of
 * consecutive pages merged, and each run announced with posix_fadvise(POSIX_FADV_WILLNEED)
 * (madvise(MADV_WILLNEED) when there is no descriptor) before the gather. Advisory only: a
 * failure leaves the gather to fault the pages in; results never change.
 *
 * ---------------------------------------------------------------- the worker protocol
 * One gather worker per model (a pthread started at load). The request/response channel:
 *
 *   field                   written by                     read by
 *   ---------------------   ----------------------------   -------------------------------
 *   owner                   model thread M, under mu       other model threads, under mu
 *   hist, n_tok, prefetch   M, before publishing req_seq   worker W, after it sees req_seq
 *   req_seq                 M (atomic, release), under mu  W (acquire), woken by cv
 *   rows, buf, result       W, before publishing done_seq  M, after it sees done_seq >= seq
 *   done_seq                W (atomic, release)            M (acquire, polling)
 *   stop                    M at close, under mu           W
 *
 * Ordering, for step `seq`:
 *   1. M takes the channel (ple_submit): under mu it waits until no other session owns it, then
 *      sets owner. If done_seq < req_seq the worker is still busy with an earlier step that
 *      timed out: M waits for it (with the same timeout) before writing anything.
 *   2. M grows the buffers if the step is longer than any before (the worker is idle), writes the
 *      request (token history, count, prefetch flag), then stores req_seq = seq with release order
 *      and signals cv. A failure in step 1 or 2 releases the channel.
 *   3. W wakes, loads req_seq (acquire), reads the request, hashes the n-grams to row ids,
 *      prefetches, gathers the packed rows into buf and fills `result` (its own measurements:
 *      rows, bytes read, faults, times). Only then does it store done_seq = seq (release): the
 *      number is written after the rows are in place (for a device: after the copy completed).
 *   4. M (ple_wait) polls done_seq >= seq: a short spin, then 50 µs sleeps; after `timeout_s`
 *      (ple_params.step_timeout_s, default 300 s) it fails with STRATA_ERR_IO instead of hanging.
 *      After a timeout M does not read buf; it releases the channel, and the next step 1 (of any
 *      session) waits for the worker to catch up before writing the request. The request
 *      watchdog (util/trace.h) ends the wait the same way, earlier.
 *   5. M reads buf (dequantizes the rows: the cpu device does it on the model thread) and
 *      releases the channel (ple_release: owner = NULL, broadcast).
 * The worker never touches a session: sessions see only what M copies out of `result`.
 * ple_worker_stop joins the worker, so a stalled step delays model close but never leaks.
 *
 * The row cache (ple_cache below) belongs to the worker: only W reads or writes it, inside a
 * step, so it adds no lock; M reads its `used` count (atomic) for reports. A read-ahead step
 * (ple_submit with warm = 1: strata_session_ple_prefetch) hashes its ids and reads the rows the
 * cache misses into the cache; M does not wait for it nor read buf: it releases the channel at
 * once, and the next step 1 waits for the worker as after a timeout. W adds the read-ahead's
 * measurements into `warm`, which M (owning the channel, worker idle) folds into the session
 * that consumes the next step and clears.
 *
 * Instrumentation (per step, by the worker on itself): rows, bytes read (read_bytes of
 * /proc/thread-self/io), major/minor faults (getrusage(RUSAGE_THREAD)), prefetched pages, hash,
 * prefetch and gather time; M adds its wait time. Pages resident (mincore) are counted on demand.
 */
#ifndef STRATA_PLE_PLE_H
#define STRATA_PLE_PLE_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "strata.h"

#define PLE_MAX_NGRAM 8
#define PLE_MAX_HEADS 64
#define PLE_MAX_SEGS STRATA_BATCH_MAX   /* sequences one step may gather for (a batched forward's) */
#define PLE_PAGE 4096u
#define PLE_SECTOR 512u
#define PLE_BOUNCE (1u << 20)   /* bytes of O_DIRECT reads in flight at once (and of one read) at most */
#define PLE_AIO_DEPTH 64        /* O_DIRECT reads in flight at once at most */
#define PLE_DIRECT_STEP_MAX 16  /* direct mode: steps up to this many tokens read O_DIRECT, without WILLNEED */
#define PLE_INLINE_ROWS 256     /* a step of at most this many rows, all in the row cache, is gathered by the
                                   submitting thread (ple_table.c gather_inline), not the worker */

enum { PLE_MODE_AUTO = 0, PLE_MODE_MMAP = 1, PLE_MODE_DIRECT = 2 };

/* The settings of the table access and of the worker. This layer never reads the environment:
 * the model fills these from strata_model_params' ple_* fields (pyrunner/settings.py is where
 * STRATA_PLE_* are read into those). ple_default_params() owns the defaults; strata_model_params'
 * defaults are copied from it. A NULL `const ple_params *` argument means the defaults. */
typedef struct {
    int madv_random;         /* 1 (default): madvise(MADV_RANDOM) on the mapped rows; 0: the kernel's
                                default readahead (a benchmark knob: bench ple measures both) */
    int prefetch;            /* 1 (default): WILLNEED the pages of a multi-token step first; 0: off */
    double step_timeout_s;   /* ple_wait fails after this long; <= 0 means the default, 300 s */
    unsigned test_stall_ms;  /* test hook: the worker sleeps this long before publishing; 0: never */
    uint64_t test_stall_at;  /* test hook: only step (seq) N stalls; 0: every step */
    uint64_t cache_bytes;    /* the row cache's budget (default 64 MiB; 0: off) */
} ple_params;

ple_params ple_default_params(void);

/* The hash of spec §6: order m (2..n) of token t mixes its m-1 predecessors (eos0 past an eos0),
 * head h of order m takes row (mix mod size_h) + off_h. */
typedef struct {
    int32_t n, heads_per;
    uint64_t eos;
    uint64_t mult[PLE_MAX_NGRAM];
    uint64_t off[PLE_MAX_HEADS], size[PLE_MAX_HEADS];
} ple_hash;

/* rows[t * NH + head] for the L tokens hist[n-1 .. n-1+L) (hist holds n-1 earlier ids first). */
void ple_hash_rows(const ple_hash *h, const int32_t *hist, int64_t L, uint64_t *rows);

typedef struct {
    const uint8_t *rows;     /* row 0 in a read-only mapping */
    size_t row_bytes;
    int64_t n_rows;
    int fd;                  /* our descriptor of the backing file, -1 if none (table in memory) */
    int dfd;                 /* direct mode: the same file opened O_DIRECT, -1 if refused / not direct */
    uint32_t dio_align;      /* O_DIRECT offset/length/buffer alignment (512 or 4096); 0 without dfd */
    uint64_t file_off;       /* file offset of row 0 */
    void *own_map;           /* a mapping we made (packed file), else NULL */
    size_t own_len;
    int mode;                /* PLE_MODE_MMAP or PLE_MODE_DIRECT */
    int madv_random;         /* MADV_RANDOM is in force on the rows */
    int prefetch;            /* WILLNEED before multi-token gathers */
    char path[1024];         /* backing file ("" if none) */
    char why[256];           /* one line for the start-up log: mode and reason */
} ple_table;

/* The in-place GGUF table: rows already mapped (by the GGUF reader). Finds the backing file of
 * the mapping (Linux /proc/self/maps) for pread/fadvise; a table with none runs in mmap mode. */
strata_status ple_table_open_mapped(ple_table *t, const void *rows, size_t row_bytes, int64_t n_rows, int mode,
                                    const ple_params *p);
/* A packed table file: maps it read-only and checks its size is n_rows * row_bytes. */
strata_status ple_table_open_file(ple_table *t, const char *path, size_t row_bytes, int64_t n_rows, int mode,
                                  const ple_params *p);
void ple_table_close(ple_table *t);
/* Announces the pages of rows[0..n) (WILLNEED); returns the number of distinct pages. */
uint64_t ple_prefetch(const ple_table *t, const uint64_t *rows, int64_t n);
/* Copies rows[0..n) to dst (n * row_bytes). IO on a failed pread. */
strata_status ple_gather(const ple_table *t, const uint64_t *rows, int64_t n, uint8_t *dst);
/* O_DIRECT reads (t->dfd) of rows[idx[0..n)] into dst + idx[i] * row_bytes: sorted by sector, runs of
 * touching sectors read whole (at most `bounce_len` bytes a read) through `bounce` (dio_align-aligned),
 * up to PLE_AIO_DEPTH runs in flight together through `aio` (NULL: one after the other). sc: n entries
 * of scratch. Returns the bytes asked of storage in *req_bytes. */
typedef struct { uint64_t lo; int64_t i; } ple_span;
typedef struct ple_aio ple_aio;      /* a Linux AIO context (io_setup) and its request table; one thread */
ple_aio *ple_aio_open(void);         /* NULL where the kernel refuses one */
void ple_aio_close(ple_aio *a);
strata_status ple_read_direct(const ple_table *t, const uint64_t *rows, const int64_t *idx, int64_t n, uint8_t *dst,
                              uint8_t *bounce, size_t bounce_len, ple_span *sc, ple_aio *aio, uint64_t *req_bytes);
/* The floors of reading rows[idx[0..n)] (idx NULL: rows[0..n)): the distinct 4 KiB pages and 512-byte
 * sectors of the file holding them (every sector and page a row touches); sc: n entries of scratch. */
void ple_floors(const ple_table *t, const uint64_t *rows, const int64_t *idx, int64_t n, ple_span *sc, uint64_t *pages,
                uint64_t *sectors);

/* ---------------------------------------------------------------- the row cache
 * A RAM tier of table rows keyed by row id: rows, not pages, so a 90-byte row costs 90 bytes of RAM
 * where the page cache spends the 4 KiB page holding it. Layout (all allocated once, at start):
 *   data  [cap x row_bytes]  entry e's row at data + e * row_bytes
 *   key   [cap]              row id held by entry e (valid for e < used)
 *   ref   [cap]              CLOCK reference bit: set by a hit, cleared by the passing hand
 *   slot  [nslot]            open-addressing hash, linear probing: entry + 1, 0 = empty; nslot is a
 *                            power of two >= 2 cap (load <= 1/2); deletion shifts back (no tombstones)
 * Replacement: CLOCK (second chance). A hit costs one probe and a bit set (no list to relink, as
 * LRU would on every hit of every step); the hand sweeps entries in order, clearing bits, and
 * evicts the first entry not referenced since its last pass. A new entry starts unreferenced, so a
 * row seen once (most n-grams of a text) is the first to go and a row hit again survives a sweep:
 * the hot head of the n-gram distribution stays, the long tail cycles. Owned by the worker thread
 * (ple.h protocol): no locks; `used` is atomic only because reports read it from another thread. */
typedef struct {
    uint8_t *data;
    uint64_t *key;
    uint8_t *ref;
    uint32_t *slot;
    uint64_t cap, nslot, hand;
    _Atomic uint64_t used;
    size_t row_bytes;
    unsigned shift;              /* 64 - log2(nslot) */
} ple_cache;

/* cap = min(budget / row_bytes, max_rows); budget 0 (or cap 0) leaves the cache off (cap 0). */
strata_status ple_cache_init(ple_cache *c, uint64_t budget, size_t row_bytes, uint64_t max_rows);
void ple_cache_free(ple_cache *c);
/* The cached row (marked referenced), or NULL. */
const uint8_t *ple_cache_find(ple_cache *c, uint64_t row);
/* Stores a row not in the cache (a present row is left as is), evicting by CLOCK when full. */
void ple_cache_put(ple_cache *c, uint64_t row, const uint8_t *src);
uint64_t ple_cache_index_bytes(const ple_cache *c);
/* Pages of the table resident in the page cache (mincore) and the table's page count. */
strata_status ple_resident(const ple_table *t, uint64_t *resident, uint64_t *total);
/* The path of the file mapped at addr and the file offset of addr (0 if none; Linux only). */
int ple_backing_file(const void *addr, char *path, size_t n, uint64_t *file_off);

/* One step's measurements (worker side). */
typedef struct {
    uint64_t rows, read_bytes, major_faults, minor_faults, prefetch_pages;
    uint64_t cache_lookups, cache_hits, floor_pages, floor_sectors, miss_pages, miss_sectors;
    uint64_t direct_bytes;       /* bytes asked of storage by O_DIRECT reads */
    double hash_s, prefetch_s, gather_s;
    strata_status status;
    char error[256];
} ple_result;

typedef struct {
    pthread_t thread;
    int started;
    pthread_mutex_t mu;
    pthread_cond_t cv;           /* worker: a request or stop; model threads: the channel is free */
    const void *owner;           /* session holding the channel, NULL if free */
    int stop;
    _Atomic uint64_t req_seq, done_seq;
    /* request */
    int32_t *hist;               /* [(n-1) * PLE_MAX_SEGS + alloc]: n_seg segments back to back, each its
                                    sequence's n-1 context ids then its seg_len new ids */
    int64_t n_tok;               /* the sum of seg_len */
    int n_seg;
    int64_t seg_len[PLE_MAX_SEGS];
    int prefetch;
    int warm;                    /* a read-ahead step: fill the cache, no result for M (see above) */
    /* response */
    uint64_t *rows;              /* [alloc * NH] */
    uint8_t *buf;                /* [alloc * NH * row_bytes] packed rows */
    ple_result result;
    ple_result warm_acc;         /* read-ahead steps' measurements not yet folded into a session */
    /* worker-owned */
    ple_cache cache;
    int64_t *miss;               /* [alloc * NH] indexes of the rows the cache missed */
    ple_span *spans;             /* [alloc * NH] scratch of ple_read_direct and ple_floors */
    uint8_t *bounce;             /* [PLE_BOUNCE] aligned O_DIRECT buffer (NULL without dfd) */
    ple_aio *aio;                /* the O_DIRECT reads' AIO context (NULL: none, reads one by one) */
    int io_fd;                   /* the worker thread's /proc/thread-self/io (-1: none), its own */
    int64_t cap;                 /* most tokens a step may have */
    int64_t alloc;               /* tokens the buffers hold now (grown on demand up to cap) */
    /* settings */
    const ple_table *table;
    const ple_hash *hash;
    int64_t n_heads;
    double timeout_s;            /* ple_params.step_timeout_s (read by M only) */
    _Atomic unsigned stall_ms;   /* ple_params.test_stall_ms: test hook, the worker sleeps before publishing */
    uint64_t stall_at;           /* ple_params.test_stall_at: only step (seq) N stalls (0: every step);
                                    written before the worker starts, then only read */
} ple_worker;

/* Starts the worker for steps of up to `cap` tokens; p: timeout and test hooks (NULL: defaults). */
strata_status ple_worker_start(ple_worker *w, const ple_table *t, const ple_hash *h, int64_t cap,
                               const ple_params *p);
void ple_worker_stop(ple_worker *w);
/* Steps 1-2 for the `L` tokens at hist[n-1..) (hist: n-1 earlier ids, then the L ids; L <= cap).
 * Returns the step's seq in *seq. */
strata_status ple_submit(ple_worker *w, const void *owner, const int32_t *hist, int64_t L, uint64_t *seq);
/* The same for the n_seg sequences of one batched step: hist holds each one's n-1 context ids and then
 * its Ls[i] new ids, one after the other (each Ls[i] <= the worker's cap); the rows come back in that
 * order, t-major within each, in one buffer. */
strata_status ple_submit_segs(ple_worker *w, const void *owner, const int32_t *hist, const int64_t *Ls, int n_seg,
                              uint64_t *seq);
/* A read-ahead step (warm, above) of hist's L tokens: only if the channel is free and the worker idle
 * (else returns 0 and does nothing); the channel is released before returning. 1: submitted. */
int ple_submit_warm(ple_worker *w, const void *owner, const int32_t *hist, int64_t L);
/* Step 4: waits for done_seq >= seq; *wait_s gets the time spent. */
strata_status ple_wait(ple_worker *w, uint64_t seq, double *wait_s);
/* Step 5. */
void ple_release(ple_worker *w, const void *owner);

/* Packed NVFP4 rows (pack-ple): dim/2 bytes of E2M1 codes (value 2j in the low nibble of byte j),
 * then dim/16 FP8 E4M3 block scales; value = (code x block scale) x global scale, in float32 (the
 * first product is exact: one rounding, as the converter's exact dequantization). The global
 * scale is the row's shard's weight_scale_2. */
void ple_nvfp4_row(const uint8_t *row, float *out, int64_t dim, float global_scale);

/* A flat JSON object's number or string field (the pack-ple sidecar); 0 if absent/mistyped. */
int ple_json_number(const char *json, const char *key, double *out);
int ple_json_string(const char *json, const char *key, char *out, size_t n);
/* A flat array of numbers: up to max values into out; returns the count, -1 if absent/mistyped. */
int64_t ple_json_numbers(const char *json, const char *key, double *out, int64_t max);

/* A packed table's sidecar (pack-ple's <table>.json), read and checked against rows of D values: its
 * format, row layout (D/2 code + D/16 scale bytes), row and shard counts (whole numbers that agree) and
 * one positive finite global scale per shard. No files: `side` only names the sidecar in the messages.
 * On success *out holds the fields and gscale (n_shard floats, malloc'd: the caller frees it). */
typedef struct {
    char source[256];            /* "" if absent */
    int64_t rows, width, n_shard, shard_rows;
    float *gscale;
} ple_sidecar;
strata_status ple_sidecar_parse(const char *json, const char *side, int64_t D, ple_sidecar *out);

double ple_now(void);

#endif
