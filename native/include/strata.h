/*
 * strata.h — the one public C API of libstrata.
 *
 * Conventions
 *   - Handles are opaque; each has an init/open function and a free/close function.
 *   - Every call that can fail returns a strata_status. On failure the calling thread's
 *     strata_last_error() holds a message that names what was wrong (file, field, byte
 *     offset, argument) and outputs are left untouched unless documented otherwise.
 *   - Parameter structs come from strata_*_default_params(); set only what you change.
 *   - The library never aborts or exits the host process, and never prints unless asked.
 *   - Sizes are bytes, counts are elements; integer types are sized.
 *
 * The block between STRATA_CDEF_BEGIN and STRATA_CDEF_END is macro-free on purpose: the
 * Python binding (pyrunner/_native.py) hands it to cffi as is, so declarations are never
 * retyped on the Python side. Keep it free of #define, #if and function-like macros.
 */
#ifndef STRATA_H
#define STRATA_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Bumped whenever a declaration below changes in a way that breaks callers. */
#define STRATA_ABI_VERSION 11
/* strata_model_params.cache_bytes: fit the expert cache into what the device has left after the dense
 * weights, one session's state at n_ctx, the work buffers and a margin (strata_model_device_log says how
 * much that was). The binding spells it 2**64 - 1. */
#define STRATA_CACHE_AUTO UINT64_MAX

#if defined(__GNUC__)
#pragma GCC visibility push(default)
#endif

/* STRATA_CDEF_BEGIN */

/* ---------------------------------------------------------------- status and errors */

typedef enum strata_status {
    STRATA_OK = 0,
    STRATA_ERR_INVALID_ARG = 1,     /* a caller argument is wrong (null, out of range, mismatched size) */
    STRATA_ERR_IO = 2,              /* open/stat/mmap/read failed */
    STRATA_ERR_FORMAT = 3,          /* a file is malformed: message names file, field, offset */
    STRATA_ERR_UNSUPPORTED = 4,     /* valid but not supported (type, version, operation) */
    STRATA_ERR_NOMEM = 5,           /* allocation failed */
    STRATA_ERR_BUFFER_TOO_SMALL = 6,/* caller buffer too small; the needed size is reported */
    STRATA_ERR_NOT_FOUND = 7,       /* a looked-up key or tensor does not exist */
    STRATA_ERR_NO_DEVICE = 8,       /* no usable accelerator (message says why) */
    STRATA_ERR_INTERNAL = 9         /* a bug in Strata: please report the message */
} strata_status;

/* ABI version the library was built with; the binding refuses a mismatch. */
uint32_t strata_abi_version(void);
/* Library version string, e.g. "0.1.0". Static storage. */
const char *strata_version(void);
/* One line describing the build: ISA paths, CUDA, sanitizers. Static storage. */
const char *strata_build_info(void);
/* Short English name of a status, e.g. "format error". Static storage. */
const char *strata_status_str(strata_status status);
/* Message of the last failed call on this thread ("" if none). Valid until the next
 * failing call on the same thread. */
const char *strata_last_error(void);

/* ---------------------------------------------------------------- CPU paths */

typedef enum strata_isa {
    STRATA_ISA_AUTO = 0,     /* the best path this CPU supports */
    STRATA_ISA_SCALAR = 1,   /* portable C: the reference */
    STRATA_ISA_AVX2 = 2,     /* AVX2 + FMA + F16C: the x86-64 floor */
    STRATA_ISA_AVX_VNNI = 3, /* AVX2 + AVX-VNNI (256-bit vpdpbusd, VEX): Intel Core 12th gen on */
    STRATA_ISA_AVX512 = 4,   /* AVX2 + AVX-512 F/BW/DQ/VL + VNNI + VBMI: Zen 4/5, Ice Lake and later Xeons */
    STRATA_ISA_AMX = 5       /* AVX512 + AMX-TILE/AMX-INT8 (tiles granted by the kernel): prefill GEMM */
} strata_isa;

/* 1 if the path can run on this CPU and was compiled in, else 0. Every path runs the kernels of
 * the paths below it where it has none of its own: AVX_VNNI and AVX512 those of AVX2, AMX those
 * of AVX512 (an AVX-512 CPU need not have AVX-VNNI). */
int32_t strata_isa_supported(strata_isa isa);
/* "scalar", "avx2", "avx_vnni", "avx512", "amx" ("auto" for STRATA_ISA_AUTO); NULL if unknown. */
const char *strata_isa_name(strata_isa isa);
/* The path STRATA_ISA_AUTO resolves to: the best this CPU supports, or the one STRATA_ISA names.
 *
 * The environment inside libstrata: every setting is a params field or a call (pyrunner/settings.py
 * reads the STRATA_* variables into them), except one debugging override read once per process,
 * because the CPU detection it replaces runs before any params exist:
 *   STRATA_ISA=scalar|avx2|avx_vnni|avx512|amx   the path every AUTO call takes (api.c); a name this
 *                       CPU cannot run is ignored here (AUTO stays the best path), and pyrunner
 *                       refuses it with a message (settings.py) */
strata_isa strata_isa_best(void);

/* Which matrix products take the CPU GEMM path instead of matrix x vector, for the whole process
 * (a measuring knob; pyrunner sets it from STRATA_GEMM at import): n_cols < 0 restores the default
 * (float weights — F32, F16, BF16 — from 8 token columns on, quantized weights never:
 * kernels/cpu/gemm.c says why), 0 turns the GEMM off, N > 0 sends every weight type to it from N
 * columns on. Set it before forward calls start; returns the value it replaced. */
int64_t strata_set_gemm_from(int64_t n_cols);

/* Whether products of many token columns (prefill) convert their weight rows first, for the whole
 * process (pyrunner sets it from --no-repack / STRATA_REPACK): on (1, the default), a product of at
 * least 32 columns whose type has a converted layout on the kernel path (today IQ2_XXS, IQ2_XS and
 * IQ3_XXS on avx512 and amx: kernels/cpu/avx512_iq.c) decodes 16 weight rows at a time into int16
 * weights with the scales folded in, in a per-thread scratch (strata_model_info.repack_bytes; never
 * a second copy of the model), and multiplies them by every column. Results are bit-identical
 * either way. 0 turns it off. Set it before forward calls start; returns the value it replaced. */
int32_t strata_set_repack(int32_t on);
/* Bytes of that scratch one thread needs for a product of `type` weights with rows of `cols` values
 * on path isa (AUTO: the best), 0 when the conversion does not apply there (or is off); *out. */
strata_status strata_repack_scratch_bytes(int32_t type, int64_t cols, strata_isa isa, uint64_t *out);

/* ---------------------------------------------------------------- context (thread pool) */

typedef struct strata_context strata_context;

typedef struct strata_context_params {
    int32_t n_threads;   /* worker threads including the caller; 0 = one per online core */
} strata_context_params;

strata_context_params strata_context_default_params(void);
/* Starts the persistent worker pool; *out is set only on success. */
strata_status strata_context_init(const strata_context_params *params, strata_context **out);
/* Joins the workers. NULL is allowed. No call may be running on ctx. */
void strata_context_free(strata_context *ctx);
int32_t strata_context_n_threads(const strata_context *ctx);

/* Reads a `bytes` buffer `reps` times on every thread of ctx (NULL: the caller only) and
 * reports the best pass in GB/s (1e9 bytes/s): the memory read bandwidth the kernels are
 * measured against. */
strata_status strata_probe_read_bandwidth(strata_context *ctx, uint64_t bytes, int32_t reps,
                                          double *gbps);
/* The int8 multiply-accumulate peak of kernel path isa (AUTO: strata_isa_best()) on every thread
 * of ctx (NULL: the caller only), best pass, in G MAC/s (1e9 int8 products summed per second):
 * the compute yardstick the kernels are measured against. Independent accumulator chains of the
 * path's int8 dot instruction on operands in L1: AVX2 vpmaddubsw + vpmaddwd + vpaddd (32 MACs per
 * 256-bit vpmaddubsw), AVX512 vpdpbusd zmm (64 MACs); SCALAR a plain C int8 dot loop as this build
 * compiles the portable kernels (vectorised under STRATA_NATIVE). A path without a loop of its
 * own measures its fallback's: AVX_VNNI that of AVX2, AMX that of AVX512 (tiles are not probed).
 * Takes about 0.1 s. Fails with STRATA_ERR_UNSUPPORTED for a path this CPU cannot run
 * (strata_isa_supported), STRATA_ERR_INVALID_ARG for an unknown isa or a NULL gmacs. */
strata_status strata_probe_int8_peak(strata_context *ctx, strata_isa isa, double *gmacs);

/* ---------------------------------------------------------------- block formats */

/* Type ids are ggml's (gguf.GGMLQuantizationType), e.g. 0 F32, 1 F16, 8 Q8_0, 12 Q4_K,
 * 17 IQ2_XS, 20 IQ4_NL, 30 BF16, 39 MXFP4, 40 NVFP4. */
typedef struct strata_type_info {
    int32_t type;          /* ggml type id */
    const char *name;      /* "Q4_K"; static storage */
    int32_t block_size;    /* values per block */
    int32_t type_size;     /* bytes per block */
    int32_t act_block;     /* values per activation block in dot products (1 = float activations) */
    int32_t has_kernels;   /* dequantize + dot product available */
    int32_t has_quantize;  /* float -> blocks available */
} strata_type_info;

/* Fails with STRATA_ERR_UNSUPPORTED for ids Strata does not know. */
strata_status strata_type_info_get(int32_t type, strata_type_info *out);
/* Name as in gguf.GGMLQuantizationType ("IQ2_XS"); case-sensitive. */
strata_status strata_type_from_name(const char *name, int32_t *type);
/* Bytes of n values of a type; n must be a multiple of the block size. */
strata_status strata_type_row_size(int32_t type, int64_t n, uint64_t *bytes);

/* n values (a multiple of the block size) from src (src_size bytes, exactly the row size). */
strata_status strata_dequantize(int32_t type, const void *src, uint64_t src_size,
                                float *dst, int64_t n, strata_isa isa);

/* nrows rows of n_per_row floats -> blocks. imatrix: NULL or n_per_row importance weights
 * (used by formats that search, e.g. IQ2_XS, Q4_K). *written = bytes produced.
 * Fails with STRATA_ERR_BUFFER_TOO_SMALL (and *written = bytes needed) if dst_size is short. */
strata_status strata_quantize(int32_t type, const float *src, int64_t nrows, int64_t n_per_row,
                              const float *imatrix, void *dst, uint64_t dst_size,
                              uint64_t *written);

/* y[j, r] = sum_c W[r, c] * x[j, c] for r < rows, j < n.
 * W: rows x cols in `type` (row-major rows of row_size(type, cols) bytes, w_size bytes in all);
 * x: n x cols floats; y: n x rows floats. Runs on ctx's pool (NULL: single-threaded).
 * Each output equals the single-column result bit for bit, whatever n and thread count. */
strata_status strata_matmul(strata_context *ctx, int32_t type, const void *w, uint64_t w_size,
                            int64_t rows, int64_t cols, const float *x, int64_t n, float *y,
                            strata_isa isa);
/* The same product as strata_matmul (same arguments), as a dequantize-then-f32 GEMM for many
 * columns: tiles of W are decoded exactly to floats and multiplied by x with float FMAs.
 * Rounding differs from strata_matmul (activations are not quantized, so it is closer to the
 * float product); each output is the same whatever n and thread count. Measured per core:
 * about 2x strata_matmul on F32 weights and 1.4x on F16/BF16 from 16 columns on, even on Q8_0,
 * NVFP4, IQ4_NL from 64 on, slower on Q4_K and IQ2_XS (whose int8 dot products are faster). */
strata_status strata_gemm(strata_context *ctx, int32_t type, const void *w, uint64_t w_size,
                          int64_t rows, int64_t cols, const float *x, int64_t n, float *y,
                          strata_isa isa);

/* ---------------------------------------------------------------- GGUF reader */

typedef struct strata_gguf strata_gguf;

typedef enum strata_gguf_type {
    STRATA_GGUF_UINT8 = 0,
    STRATA_GGUF_INT8 = 1,
    STRATA_GGUF_UINT16 = 2,
    STRATA_GGUF_INT16 = 3,
    STRATA_GGUF_UINT32 = 4,
    STRATA_GGUF_INT32 = 5,
    STRATA_GGUF_FLOAT32 = 6,
    STRATA_GGUF_BOOL = 7,
    STRATA_GGUF_STRING = 8,
    STRATA_GGUF_ARRAY = 9,
    STRATA_GGUF_UINT64 = 10,
    STRATA_GGUF_INT64 = 11,
    STRATA_GGUF_FLOAT64 = 12
} strata_gguf_type;

/* A metadata value. Pointers point into the read-only mapping and live as long as the
 * handle. Multi-byte values are little-endian and may be unaligned: copy, don't cast. */
typedef struct strata_gguf_value {
    int32_t type;         /* strata_gguf_type */
    int32_t elem_type;    /* ARRAY: element type; otherwise -1 */
    uint64_t count;       /* ARRAY: element count; STRING: byte length; otherwise 1 */
    const void *data;     /* scalar: the value; STRING: the bytes (not NUL-terminated);
                             ARRAY of scalars: the contiguous elements;
                             ARRAY of STRING/ARRAY: NULL, use strata_gguf_array_get */
    uint64_t offset;      /* absolute byte offset of the value in the file */
    uint64_t node;        /* internal reference used by strata_gguf_array_get */
} strata_gguf_value;

typedef struct strata_gguf_tensor {
    const char *name;     /* not NUL-terminated; see name_len */
    uint64_t name_len;
    int32_t type;         /* ggml type id */
    int32_t n_dims;       /* 1..4 */
    int64_t ne[4];        /* ggml order: ne[0] is the contiguous dimension; unused = 1 */
    uint64_t offset;      /* absolute byte offset of the data in its file */
    uint64_t size;        /* bytes */
    int32_t split;        /* index of the file (0 for a single file) */
    const void *data;     /* read-only mapped data */
} strata_gguf_tensor;

/* Opens and validates a GGUF (v2 or v3). A path like name-00001-of-00003.gguf opens every
 * split and presents them as one model (metadata of the first split, tensors of all).
 * Files are mapped read-only, never copied. */
strata_status strata_gguf_open(const char *path, strata_gguf **out);
/* Parses a GGUF held in memory (no splits); `name` is used in messages. The buffer must
 * outlive the handle. Used by the fuzzer and tests. */
strata_status strata_gguf_open_memory(const void *data, uint64_t size, const char *name,
                                      strata_gguf **out);
void strata_gguf_close(strata_gguf *g);

uint32_t strata_gguf_version(const strata_gguf *g);
int32_t strata_gguf_n_splits(const strata_gguf *g);
uint64_t strata_gguf_alignment(const strata_gguf *g);
/* Absolute offset of the tensor data section of split `split`. */
uint64_t strata_gguf_data_offset(const strata_gguf *g, int32_t split);

int64_t strata_gguf_n_kv(const strata_gguf *g);
/* Key i (pointer into the mapping, not NUL-terminated) and its value. */
strata_status strata_gguf_kv(const strata_gguf *g, int64_t i, const char **key,
                             uint64_t *key_len, strata_gguf_value *value);
/* Index of a key, or STRATA_ERR_NOT_FOUND. */
strata_status strata_gguf_find_kv(const strata_gguf *g, const char *key, int64_t *index);
/* Element i of an ARRAY value (works for every element type, nested arrays included). */
strata_status strata_gguf_array_get(const strata_gguf *g, const strata_gguf_value *array,
                                    uint64_t i, strata_gguf_value *element);

int64_t strata_gguf_n_tensors(const strata_gguf *g);
strata_status strata_gguf_tensor_info(const strata_gguf *g, int64_t i, strata_gguf_tensor *out);
strata_status strata_gguf_find_tensor(const strata_gguf *g, const char *name, int64_t *index);

/* ---------------------------------------------------------------- tokenizer */

/* Byte-level BPE (GGUF tokenizer.ggml.model = "gpt2") with the Qwen pre-tokenizer split.
 * Built from the tokenizer.ggml.* arrays, passed as plain buffers so that any reader can
 * feed it. Immutable after init: one tokenizer may be used from many threads at once.
 * Text in and out is UTF-8 bytes; normalisation (NFC for Qwen) is the caller's step. */
typedef struct strata_tokenizer strata_tokenizer;

typedef enum strata_tokenizer_pre {
    STRATA_TOKENIZER_PRE_QWEN2 = 0,  /* tokenizer.ggml.pre = "qwen2": Qwen2/2.5/3 pattern */
    STRATA_TOKENIZER_PRE_QWEN35 = 1  /* "qwen35": the Qwen 3.5/3.6 pattern, marks (\p{M}) join letters */
} strata_tokenizer_pre;

/* GGUF token types (tokenizer.ggml.token_type). NORMAL (and UNDEFINED) tokens are BPE
 * pieces written byte-level (GPT-2's byte-to-char map); CONTROL and USER_DEFINED tokens
 * are literal text matched in the input before splitting (USER_DEFINED always, CONTROL
 * only with parse_special); UNUSED tokens never come out of encoding and decode to "". */
typedef enum strata_token_type {
    STRATA_TOKEN_UNDEFINED = 0,
    STRATA_TOKEN_NORMAL = 1,
    STRATA_TOKEN_UNKNOWN = 2,
    STRATA_TOKEN_CONTROL = 3,
    STRATA_TOKEN_USER_DEFINED = 4,
    STRATA_TOKEN_UNUSED = 5,
    STRATA_TOKEN_BYTE = 6
} strata_token_type;

typedef struct strata_tokenizer_params {
    int32_t pre;            /* strata_tokenizer_pre; default QWEN2 */
    int32_t ignore_merges;  /* 1 (default): a pre-token that is itself a token is that token,
                               as tiktoken and HF's BPE(ignore_merges=true) do; 0: merges only */
} strata_tokenizer_params;

strata_tokenizer_params strata_tokenizer_default_params(void);

/* tokens: n_tokens strings back to back in token_data, token_lens[i] bytes each (not
 * NUL-terminated); token_types: n_tokens strata_token_type values (NULL = all NORMAL);
 * merges: n_merges strings "left right" back to back in merge_data, merge_lens[i] bytes
 * each, in rank order (first = applied first). Inputs are copied; nothing is kept.
 * Fails with STRATA_ERR_FORMAT naming the token or merge that is malformed. */
strata_status strata_tokenizer_init(const char *token_data, const uint32_t *token_lens,
                                    const int32_t *token_types, int64_t n_tokens,
                                    const char *merge_data, const uint32_t *merge_lens,
                                    int64_t n_merges, const strata_tokenizer_params *params,
                                    strata_tokenizer **out);
void strata_tokenizer_free(strata_tokenizer *tok);

int64_t strata_tokenizer_n_tokens(const strata_tokenizer *tok);

/* Encodes text_len bytes of UTF-8 into token ids. Writes at most `capacity` ids to `ids`
 * and sets *n_ids to the number the text needs; STRATA_ERR_BUFFER_TOO_SMALL when that is
 * more than capacity (call again with a larger buffer; ids is then partly written).
 * parse_special: 1 matches CONTROL tokens in the text; 0 encodes them as plain text.
 * Text that is not well-formed UTF-8 (Unicode's definition, as Python's strict decoder:
 * no overlong forms, no surrogates U+D800..U+DFFF, nothing above U+10FFFF, no sequence cut
 * off by the end) fails with STRATA_ERR_INVALID_ARG before anything is written, and
 * strata_last_error() reads "the prompt is not valid UTF-8 at byte N (0xXX); ..." where N is
 * the 0-based offset of the first byte of the first malformed sequence. */
strata_status strata_tokenizer_encode(const strata_tokenizer *tok, const char *text,
                                      uint64_t text_len, int32_t parse_special, int32_t *ids,
                                      uint64_t capacity, uint64_t *n_ids);

/* The bytes token `id` stands for (raw bytes, not byte-level text; "" for UNUSED):
 * a pointer into the tokenizer, valid while it lives. STRATA_ERR_INVALID_ARG when id is
 * out of range. Bytes of one token may be an incomplete UTF-8 sequence. */
strata_status strata_tokenizer_token_bytes(const strata_tokenizer *tok, int32_t id,
                                           const char **data, uint64_t *len);

/* Concatenated bytes of n_ids tokens into buf (capacity bytes); *len gets the size
 * needed; STRATA_ERR_BUFFER_TOO_SMALL when it exceeds capacity. */
strata_status strata_tokenizer_decode(const strata_tokenizer *tok, const int32_t *ids,
                                      uint64_t n_ids, char *buf, uint64_t capacity,
                                      uint64_t *len);

/* The same tokenizer as strata_tokenizer_init, read straight from g's mapped
 * tokenizer.ggml.tokens, .token_type (optional) and .merges (optional) arrays, with nothing
 * unpacked or copied first (the fast way to the first tokenize). params: pre and
 * ignore_merges (NULL = defaults; tokenizer.ggml.pre is the caller's to map). The tokenizer
 * does not refer to g afterwards. Fails with STRATA_ERR_FORMAT naming the array or entry. */
strata_status strata_tokenizer_init_gguf(const strata_gguf *g, const strata_tokenizer_params *params,
                                         strata_tokenizer **out);

/* ---------------------------------------------------------------- model and sessions */
/* A qwen4exp model loaded from a GGUF (llama.cpp's layout; single file or split set). Weights
 * stay in the read-only mapping; the model owns a worker pool. One model serves any number of
 * sessions; each session holds one sequence's state. Calls on different sessions of one model
 * may run concurrently from different threads (their kernels take turns on the pool); calls on
 * one session must not overlap. */
typedef struct strata_model strata_model;
typedef struct strata_session strata_session;

typedef enum strata_kv_type {
    STRATA_KV_F32 = 0,   /* exact; parity tests */
    STRATA_KV_F16 = 1,   /* default: ~2e-3 on logits against fp32 */
    STRATA_KV_INT8 = 2   /* int8 codes with one scale per token and head */
} strata_kv_type;

typedef struct strata_model_params {
    int32_t n_threads;   /* threads including the caller; 0 = one per online core */
    int64_t n_ctx;       /* tokens a session can hold; default 32768 */
    int32_t kv_type;     /* strata_kv_type; default STRATA_KV_F16 */
    int32_t n_ubatch;    /* tokens per internal forward step (a longer eval is split); default 512 */
    /* MoE offload (DESIGN §4) */
    int32_t device;      /* strata_device: CPU (default: every expert on the CPU pool), SIM, CUDA */
    uint64_t cache_bytes;/* device memory for resident experts (SIM/CUDA); 0 = none */
    float pcie_frac;     /* share of missing experts copied to the device; < 0 = from the link probe */
    float sim_link_gbps; /* SIM copy-engine bandwidth in GB/s; default 16 */
    int32_t tail_skip;   /* -1 (default): rank 7 on the offload path while the cache holds < 90 %
                            of routed expert bytes, off on CPU; 0: off; K > 0: skip experts that
                            every token ranks >= K (0-based) when not resident */
    int32_t n_staging;   /* device staging slots for missing experts; default 4 */
    int32_t adjust_interval; /* windows between expert-cache adjustment rounds; default 32 */
    int32_t prefill_stream_min; /* a forward step of at least this many tokens streams every missing
                            expert through the staging ring (borrowing cache slots); default 1024 */
    int32_t max_swaps;   /* at most this many expert-cache swaps per adjustment round; default 96 */
    const char *expert_pack; /* the model's expert pack (pyrunner/expert_pack.py: one blob per expert,
                            checked against the model at load); NULL: copy each expert's three
                            pieces from the GGUF. Only read during strata_model_load. */
    int32_t ple_mode;    /* strata_ple_mode: how the PLE table is read; default STRATA_PLE_AUTO */
    /* PLE table access and gather worker (DESIGN §6). The library reads no environment for these:
       pyrunner/settings.py reads STRATA_PLE_* into them. */
    int32_t ple_madv_random;   /* 1 (default): madvise(MADV_RANDOM) on the mapped table; 0: the kernel's
                                  default readahead (a benchmark knob) */
    int32_t ple_prefetch;      /* 1 (default): WILLNEED a multi-token step's pages before gathering; 0: off */
    double ple_step_timeout_s; /* an eval fails when a gather step is not done after this long; default
                                  300; <= 0 means the default */
    uint32_t ple_test_stall_ms;/* test hook: the worker sleeps this long before publishing a step; default 0 */
    uint64_t ple_test_stall_at;/* test hook: only worker step (seq) N stalls; default 0 = every step */
    /* The expert store (issue 20): RAM slots over the model file. */
    int32_t expert_io;         /* strata_expert_io; default STRATA_EXPERT_IO_AUTO */
    uint64_t ram_bytes;        /* RAM slots for routed experts with direct reads; 0 = what the process may
                                  use (the cgroup limit or MemAvailable) minus dense weights, one session's
                                  state and a margin */
    const char *cache_policy;  /* replacement policy of the RAM slots; NULL or "" = the default
                                  (strata_cache_policies lists them). Only read during strata_model_load. */
    int32_t expert_io_depth;   /* reads in flight; default 64 */
    int32_t expert_io_backend; /* 0 (default): io_uring, else pread threads; 1: io_uring only; 2: pread threads */
    uint64_t expert_io_test_short_read_at; /* test hook: the N-th read (1-based) comes back short; 0 = never */
    int32_t expert_prefetch;   /* with direct reads, while layer l computes, read ahead the experts layer l+1's
                                  router ranks best for layer l's MoE input: this many ranks of every token of a
                                  window of <= 16 tokens (at most n_expert_used); default 2 (on the bench preset
                                  under a memory limit: more ranks read more than they save); 0: off */
    int32_t split;             /* strata_split: how pcie_frac is chosen; default STRATA_SPLIT_ONLINE (which
                                  starts from pcie_frac when that is given and moves it; SEED keeps it) */
    uint64_t ple_cache_bytes;  /* the PLE row cache (DESIGN §6): RAM for table rows kept by row id, budget /
                                  row_bytes entries (at most the table's rows) plus an index of 17-25 bytes
                                  an entry (64 MiB of 90-byte rows: 745,654 rows, 14.7 MB of index); gathers read only the rows it misses. Default 64 MiB; 0 = off
                                  (every row read from the table, as before the cache) */
    int32_t dense;             /* strata_dense: where the dense forward runs; default AUTO */
    uint64_t vram_bytes;       /* --vram-gib: GPU memory Strata may use in all (dense weights, state, work buffers,
                                  expert cache); 0 = the device's free memory */
    int32_t prefill_f16;       /* --prefill-f16: the device forward's products of more than 8 rows go to cuBLAS on f16
                                  tiles and activations (tensor cores). Faster, but a row's sums then depend on how
                                  many rows its step holds. Default 0: a kernel summing in the decode kernel's order,
                                  so prefill gives decode's bits and batches are invariant. No effect without cuBLAS
                                  (the start-up log says which runs) */
    int32_t sync_swaps;        /* 1: the first window after an expert-cache adjustment round waits for the round's
                                  copies before it looks anything up, so which experts are resident follows from
                                  the routing alone, as `strata cache-sim` replays it (a replay hook: on a busy
                                  machine an unwaited copy may land a window late). Default 0: nothing waits; a
                                  copy is used from the first window that finds it landed */
} strata_model_params;


/* Where the dense forward (hyper-connections, GDN, QSA, the LM head) runs. AUTO: on the GPU with
 * STRATA_DEVICE_CUDA, else on the CPU. CPU: the C forward, with experts on whatever device is chosen.
 * DEVICE: on the GPU (an error without one). EMU: the GPU forward run on the host, every kernel emulated
 * over its launch grid (kernels/cuda/emu_*.h): the device forward's own numbers and buffer handling on a
 * machine without a GPU, for tests; slow. The routed experts run where the offload engine puts them (device
 * cache, staging, CPU pool); everything else of a step, the PLE layer and the MTP head included, on the device. */
typedef enum strata_dense {
    STRATA_DENSE_AUTO = 0,
    STRATA_DENSE_CPU = 1,
    STRATA_DENSE_DEVICE = 2,
    STRATA_DENSE_EMU = 3
} strata_dense;

/* The split of missing expert groups between the link and the CPU pool (DESIGN §4). SEED: one global
 * pcie_frac from the probe, set by the caller (pyrunner.controller's three updates). ONLINE: one share per
 * MoE layer, moved by what decode windows of that layer cost: windows alternate a little above and below the
 * layer's share, and after 4 of each the faster side (by more than 3 % of the layer's expert-stage time)
 * moves the share 0.05 its way; kept within [0.02, 0.98] (moe/offload.h off_split_state);
 * strata_model_set_pcie_frac sets every layer's share. */
typedef enum strata_split {
    STRATA_SPLIT_SEED = 0,
    STRATA_SPLIT_ONLINE = 1
} strata_split;

/* How routed experts are read (issue 20). MMAP: in place from the file's mapping, through the page
 * cache (the default when they fit in the RAM the process may use). DIRECT: O_DIRECT reads of each
 * expert into RAM slots the engine owns, on demand, never through the page cache; a replacement
 * policy keeps the hot ones. AUTO picks DIRECT when the experts do not fit; strata_model_store_log
 * says what was chosen and why. */
typedef enum strata_expert_io {
    STRATA_EXPERT_IO_AUTO = 0,
    STRATA_EXPERT_IO_MMAP = 1,
    STRATA_EXPERT_IO_DIRECT = 2
} strata_expert_io;

typedef enum strata_device {
    STRATA_DEVICE_CPU = 0,
    STRATA_DEVICE_SIM = 1,
    STRATA_DEVICE_CUDA = 2
} strata_device;
strata_model_params strata_model_default_params(void);

typedef struct strata_model_info {
    int64_t n_vocab;
    int64_t n_embd;
    int32_t n_layer;
    int32_t n_threads;
    int64_t n_ctx;
    int64_t n_ctx_train;
    int32_t kv_type;
    int32_t n_expert;
    int32_t n_expert_used;
    int32_t ple_layer;      /* -1: no PLE */
    uint64_t weight_bytes;  /* bytes of tensor data */
    uint64_t state_bytes;   /* bytes of one session's state at n_ctx (the most it can grow to) */
    int32_t n_mtp;          /* MTP blocks in the file (nextn_predict_layers; 0: none) */
    int32_t n_hidden;       /* floats of one row of the pre-mixer stream state: hc x n_embd */
    uint64_t repack_bytes;  /* scratch of the prefill conversion (strata_set_repack), all threads, sized
                               at load from the widest converted tensor; 0: none (off, or no such type) */
    uint64_t state_fixed_bytes;  /* a session's state whatever it holds (GDN, PLE conv) */
    uint64_t state_token_bytes;  /* and per token it holds (K/V, indexer keys, summaries, id; rounded up):
                                    the caches grow with use (strata_session_state_bytes) */
} strata_model_info;

/* Opens the GGUF, checks every hyperparameter and tensor against the qwen4exp contract, and
 * binds the weights. Fails with FORMAT (message names the key or tensor) or UNSUPPORTED. */
strata_status strata_model_load(const char *path, const strata_model_params *params,
                                strata_model **out);
/* No session of m may be alive. NULL is allowed. */
void strata_model_free(strata_model *m);
strata_status strata_model_get_info(const strata_model *m, strata_model_info *out);
/* Offload counters since load (cumulative: a caller takes differences per request). */
typedef struct strata_offload_stats {
    int32_t device;          /* strata_device */
    float pcie_frac;
    int32_t tail_skip;       /* K in effect (0 = off) */
    int32_t cache_slots;
    int32_t staging_slots;
    uint64_t slot_bytes;
    double probe_gbps;       /* link probe at load (0 on CPU) */
    /* Hits and lookups count routed PICKS (as the seed's log does): every (token, routed expert)
     * of a trunk MoE layer on the offload path is one lookup, a hit when that expert was resident
     * (READY) when the layer was planned. One owner: the ExpertCache (ec_stats). */
    uint64_t cache_hits;
    uint64_t cache_lookups;
    uint64_t cache_swaps;
    uint64_t cache_admits;
    uint64_t pcie_groups;    /* missing expert groups copied and run on the device */
    uint64_t pcie_bytes;
    uint64_t cpu_groups;     /* expert groups run on the CPU pool */
    uint64_t cpu_bytes;      /* their weight bytes */
    uint64_t skipped_experts;
    double cpu_s;            /* wall time of the CPU expert stages */
    double copy_s;           /* copy-engine busy time */
    double device_s;         /* device compute time */
    uint64_t windows;
    uint64_t prefill_chunks;  /* forward steps that streamed every missing expert */
    uint64_t borrowed_slots;  /* cache slots lent to their staging rings (summed over layers) */
    uint64_t copy_bytes;      /* every byte the copy engine moved (staging, admits, swaps) */
    uint64_t cache_group_hits;     /* expert GROUPS (one per active (layer, expert) of a window) found resident */
    uint64_t cache_group_lookups;  /* expert groups looked up (a group merges every pick of one expert) */
    int32_t split;                 /* strata_split in effect */
    uint64_t split_updates;        /* per-layer share updates (ONLINE) */
    float pcie_frac_min, pcie_frac_max;  /* the per-layer shares' range (ONLINE; pcie_frac is their mean) */
    /* The rest of the link's traffic (with copy_bytes, every byte that crosses it): */
    uint64_t act_bytes;            /* the expert device's rows: each group's input up and output down */
    uint64_t dense_weight_bytes;   /* the dense forward's weights and vectors, uploaded at load */
    uint64_t dense_h2d_bytes;      /* its per-step copies up: embeddings, PLE rows, the CPU experts' rows */
    uint64_t dense_d2h_bytes;      /* and down: MoE inputs and routing, logits, hidden rows */
} strata_offload_stats;
strata_status strata_model_offload_stats(strata_model *m, strata_offload_stats *out);
/* The share of missing expert groups sent over the link from now on (the controller's output). */
strata_status strata_model_set_pcie_frac(strata_model *m, float pcie_frac);
/* Device event log (SIM): path == NULL clears the log and starts recording; a path writes the
 * recorded operations as JSON lines {"engine": "copy"|"compute", "seq", "after", "slot", "slots",
 * "t0", "t1"} and stops recording. UNSUPPORTED without a device. */
strata_status strata_model_device_events(strata_model *m, const char *path);
/* One line on how the offload engine was set up (device, slots, probe, pcie_frac, tail skip and
 * why); static until the model is freed. */
const char *strata_model_offload_log(const strata_model *m);

/* The expert store's counters since load (cumulative; zeros and active = 0 with expert_io mmap).
 * Lookups and hits count routed picks, as the device cache's do. */
typedef struct strata_store_stats {
    int32_t active;          /* 1: DIRECT (RAM slots over the file) */
    int32_t ram_slots;       /* experts the RAM slots hold (the policy's and one layer's scratch) */
    uint64_t ram_bytes;      /* bytes of RAM slots */
    uint64_t ram_lookups;
    uint64_t ram_hits;
    uint64_t ram_groups;     /* (window, layer, expert) groups looked up */
    uint64_t ram_group_hits;
    uint64_t ram_miss_bytes; /* bytes of the experts that were not in RAM */
    uint64_t read_bytes;     /* bytes asked of storage (aligned supersets of the missed experts) */
    uint64_t reads;          /* read requests */
    uint64_t evictions;
    uint64_t bypassed;       /* misses the policy did not keep */
    double read_s;           /* wall time waiting for reads */
    uint64_t prefetch_experts;       /* experts read ahead (expert_prefetch) */
    uint64_t prefetch_bytes;         /* their bytes */
    uint64_t prefetch_unused_experts;/* read ahead but not read by the next layer */
    uint64_t prefetch_unused_bytes;
    uint64_t predicted;              /* experts of the predicted layers' lines */
    uint64_t predicted_right;        /* of them, those the prediction named (recall = right / predicted) */
} strata_store_stats;
strata_status strata_model_store_stats(strata_model *m, strata_store_stats *out);
/* One line: the access mode chosen and why, the budget, slots, policy, read backend. Static until the
 * model is freed. */
const char *strata_model_store_log(const strata_model *m);
/* Where the dense forward runs and, on a device, every part's size in its memory (dense weights, state,
 * work buffers, expert cache, free and the cap): the start-up log. "" when it runs on the CPU. */
const char *strata_model_device_log(const strata_model *m);
/* The replacement policies the RAM slots accept (comma-separated, the default first). */
const char *strata_cache_policies(void);

/* Writes the routing of every MoE layer and window to path as JSON lines (pyrunner/cachesim.py
 * documents the format; `strata cache-sim` replays it); NULL stops and closes the file. */
strata_status strata_model_trace_routing(strata_model *m, const char *path);

/* The model's GGUF (metadata, tokenizer arrays); valid while m lives. */
const strata_gguf *strata_model_gguf(const strata_model *m);

strata_status strata_session_init(strata_model *m, strata_session **out);
void strata_session_free(strata_session *s);
/* Forgets the sequence: n_past = 0. */
void strata_session_reset(strata_session *s);
/* Bytes of state the session holds now: its per-token caches grow as it fills, in chunks (capacity
 * doubled, at least 256 tokens), up to strata_model_info.state_bytes at n_ctx; they never shrink. */
uint64_t strata_session_state_bytes(const strata_session *s);
int64_t strata_session_n_past(const strata_session *s);
/* Runs n_ids tokens after the session's n_past tokens and advances n_past by n_ids.
 * logits: all_logits == 0: n_vocab floats (the last position); otherwise n_ids x n_vocab.
 * logits_capacity counts floats; BUFFER_TOO_SMALL if short (nothing is run). logits may be
 * NULL (capacity 0) to only advance the state. Fails with INVALID_ARG (an id >= n_vocab, or
 * n_past + n_ids > n_ctx) before touching the state; after any other failure the session's
 * state is undefined: reset it. */
strata_status strata_session_eval(strata_session *s, const int32_t *ids, int64_t n_ids,
                                  int32_t all_logits, float *logits, uint64_t logits_capacity);

/* ---------------------------------------------------------------- speculative windows, rollback,
 * checkpoints and the MTP head (DESIGN §5; spec/qwen4exp-mtp.md) */
typedef enum strata_eval_flags {
    STRATA_EVAL_ALL_LOGITS = 1,   /* logits of every token (else of the last) */
    STRATA_EVAL_KEEP_STATES = 2,  /* keep the state after each token (a verify window; at most the
                                     session's spec_max tokens) so strata_session_rollback can
                                     return to any of them without running the model again */
    STRATA_EVAL_CONTINUED = 4     /* more tokens of this evaluation follow in the session's next eval:
                                     a prompt fed in pieces of any length (a scheduler's prefill chunks)
                                     gets the bits of one eval over all of them. The GDN's chunked form
                                     solves 64-token chunks from where an eval starts; this flag leaves
                                     the partial chunk at the piece's end open (its rows kept, the state
                                     at the chunk's start) and the next eval completes it; that eval
                                     runs the chunked form whatever its length. Exact when the one eval
                                     would run the chunked form in every step (each of its n_ubatch
                                     steps >= 32 tokens: a caller feeds a shorter last step as evals of
                                     its own, without the flag, after a piece that ends on the step).
                                     Needs n_ubatch a multiple of 64; not with KEEP_STATES. While a
                                     chunk is open, checkpoints and verify windows are refused; reset
                                     and restore drop it. */
} strata_eval_flags;
/* strata_session_eval with flags and, optionally, the pre-mixer stream state of every token:
 * hidden (NULL: none) receives n_ids x n_hidden floats, the residual streams after the last
 * layer and before the final mixer (what the MTP head reads). */
strata_status strata_session_eval_ex(strata_session *s, const int32_t *ids, int64_t n_ids, int32_t flags,
                                     float *logits, uint64_t logits_capacity,
                                     float *hidden, uint64_t hidden_capacity);
/* Several sequences in one forward (as llama_batch / llama_decode): entry i evaluates n_ids tokens of
 * its session exactly as strata_session_eval_ex(session, ids, n_ids, flags, logits, ..., hidden, ...)
 * would (its own positions, state, checkpoints and KEEP_STATES window), and every entry's results are
 * bit-identical to that call's whichever other entries share the batch. The work runs in steps: step k
 * takes tokens [k n_ubatch, (k+1) n_ubatch) of every entry that has them, and one forward runs them
 * all: each dense product once over every row, each sequence's GDN / QSA / PLE mixer on its own state,
 * one MoE expert group per expert for every row that picked it (so a step reads each dense weight and
 * each picked expert once for all its sequences). Sessions must be of one model and distinct; an entry
 * with n_ids == 0 does nothing. Every entry is checked before any is run (INVALID_ARG or
 * BUFFER_TOO_SMALL name the entry, and nothing is touched); after any other failure every entry's
 * session state is undefined: reset them. */
enum { STRATA_BATCH_MAX = 256 };   /* entries per strata_batch_eval at most */
typedef struct strata_batch_seq {
    strata_session *session;
    const int32_t *ids;
    int64_t n_ids;
    int32_t flags;              /* strata_eval_flags */
    float *logits;              /* as strata_session_eval_ex's (NULL: none) */
    uint64_t logits_capacity;
    float *hidden;              /* NULL: none */
    uint64_t hidden_capacity;
} strata_batch_seq;
strata_status strata_batch_eval(const strata_batch_seq *seqs, int32_t n_seqs);

/* Sizes the per-token state slots of KEEP_STATES windows (n_max tokens; 0 frees them). */
strata_status strata_session_set_spec_max(strata_session *s, int32_t n_max);
/* Returns the session to n_past tokens, n_past in [w + 1, current] where w is n_past before the
 * last KEEP_STATES eval (no eval since). K/V and indexer rows past n_past are dropped, a QSA
 * block summary that rejected tokens completed is dropped, and the GDN recurrent and conv
 * state, the PLE conv history and n-gram ids are those after token n_past - 1. */
strata_status strata_session_rollback(strata_session *s, int64_t n_past);

/* A copy of a session's recurrent state (GDN, PLE) at its n_past and of the ids it holds; the
 * K/V rows stay in the session. Restoring it is valid while the session's first n_past rows are
 * still those tokens' (no eval has rewritten them since), which restore checks. */
typedef struct strata_checkpoint strata_checkpoint;
strata_status strata_session_checkpoint(strata_session *s, strata_checkpoint **out);
/* Sets the session to the checkpoint's n_past and state. INVALID_ARG (state untouched) if the
 * session no longer holds the checkpoint's prefix. */
strata_status strata_session_restore(strata_session *s, const strata_checkpoint *c);
int64_t strata_checkpoint_n_past(const strata_checkpoint *c);
uint64_t strata_checkpoint_bytes(const strata_checkpoint *c);
void strata_checkpoint_free(strata_checkpoint *c);
/* Tokens whose K/V rows the session holds consistently with its ids (>= n_past). */
int64_t strata_session_n_valid(const strata_session *s);

/* One pass of the MTP head (spec/qwen4exp-mtp.md §2) over n rows: row i fuses the hidden row
 * hidden[i] (n_hidden floats: the trunk's pre-mixer state, or the chain state of the previous
 * step) with the embedding of ids[i], at position pos0 + i, through the MTP block (its own K/V
 * and indexer cache: rows from pos0 on are replaced, rows before pos0 are read) and its mixer,
 * then the trunk's LM head. Outputs, for every row with STRATA_EVAL_ALL_LOGITS in flags or the
 * last otherwise: logits (n_vocab floats a row) and chain (n_hidden floats a row, the MTP's own
 * pre-mixer state, the next step's hidden input). UNSUPPORTED when the model has no MTP block. */
strata_status strata_session_mtp(strata_session *s, const float *hidden, const int32_t *ids, int64_t n,
                                 int64_t pos0, int32_t flags, float *logits, uint64_t logits_capacity,
                                 float *chain, uint64_t chain_capacity);

/* ---------------------------------------------------------------- PLE table (DESIGN §6) */
/* The n-gram table is read in place from the GGUF or from a packed NVFP4 file (strata pack-ple;
 * the GGUF names it in strata.ple_external). A worker thread gathers the rows of each step. */
typedef enum strata_ple_mode {
    STRATA_PLE_AUTO = 0,     /* a short read probe at load picks mmap or direct */
    STRATA_PLE_MMAP = 1,     /* rows copied from the read-only mapping (MADV_RANDOM) */
    STRATA_PLE_DIRECT = 2    /* pread of exactly the needed rows */
} strata_ple_mode;

typedef struct strata_ple_info {
    int32_t present;         /* 0: the model has no PLE (nothing else is set) */
    int32_t mode;            /* the mode in force: STRATA_PLE_MMAP or STRATA_PLE_DIRECT */
    int32_t external;        /* 1: a packed NVFP4 file; 0: the GGUF tensor in place */
    int32_t madv_random;     /* MADV_RANDOM is in force on the table's pages */
    int32_t prefetch;        /* WILLNEED prefetch before multi-token gathers (STRATA_PLE_PREFETCH=0: off) */
    int64_t n_rows;
    uint64_t row_bytes;
    uint64_t table_bytes;
    char path[1024];         /* the file the rows are read from ("" when the table is only in memory) */
    char why[256];           /* one line for the start-up log: the mode and why it was chosen */
    uint64_t file_offset;    /* byte offset of row 0 in `path` (e.g. to evict the table's pages) */
    uint64_t cache_capacity; /* row cache entries (ple_cache_bytes / row_bytes, at most n_rows); 0: off */
    uint64_t cache_used;     /* entries holding a row now (<= cache_capacity) */
    uint64_t cache_index_bytes; /* RAM of the cache's index (keys, reference bits, hash slots) */
    int32_t odirect;         /* direct mode reads steps of up to 16 tokens (decode, verify windows) with
                                O_DIRECT: whole aligned sectors, in flight together */
    uint32_t dio_align;      /* the O_DIRECT alignment in bytes (512 where the device allows); 0: not used */
    int32_t n_heads;         /* rows a token reads: (ngram - 1) x heads per order */
    int32_t ngram;           /* n-gram order n: a token's context is the n - 1 ids before it */
} strata_ple_info;
strata_status strata_model_ple_info(const strata_model *m, strata_ple_info *out);
/* Pages of the table resident in the page cache (mincore) and its page count; 0/0 without PLE. */
strata_status strata_model_ple_resident(const strata_model *m, uint64_t *resident_pages,
                                        uint64_t *total_pages);

/* Counters since the session was created (reset() does not clear them). A step of one token
 * counts as decode, a longer one as prefill. */
typedef struct strata_ple_stats {
    uint64_t steps;          /* forward steps that read the table */
    uint64_t tokens;
    uint64_t rows;           /* rows gathered (tokens x hash heads) */
    uint64_t read_bytes;     /* storage reads of the gather worker (/proc/thread-self/io read_bytes) */
    uint64_t major_faults;   /* page faults of the gather worker (getrusage RUSAGE_THREAD) */
    uint64_t minor_faults;
    uint64_t prefetch_pages; /* distinct pages announced with WILLNEED */
    double hash_s;           /* worker: n-gram ids */
    double prefetch_s;       /* worker: WILLNEED calls */
    double gather_s;         /* worker: copying / reading the packed rows */
    double copy_s;           /* packed rows into the dense device's staging; 0 on the C forward (it reads the buffer) */
    double wait_s;           /* model thread waiting for the worker's done sequence number */
    double dequant_s;        /* model thread: dequantizing the gathered rows (the C forward; on a device, the launch) */
    /* the row cache and the floors of the two access modes (every step, cache on or off) */
    uint64_t cache_lookups;  /* rows looked up in the row cache (0 when it is off) */
    uint64_t cache_hits;     /* of those, found: not read from the table */
    uint64_t cache_hit_bytes;/* cache_hits x row_bytes */
    uint64_t floor_pages;    /* distinct 4 KiB pages of the file holding each step's rows: the page-cache floor */
    uint64_t floor_sectors;  /* distinct 512-byte sectors holding them: the direct-read floor */
    uint64_t miss_pages;     /* the same for the rows the cache missed (= floor_* with the cache off) */
    uint64_t miss_sectors;
    uint64_t warm_rows;      /* rows read ahead into the cache by strata_session_ple_prefetch (their reads
                                are in read_bytes of the step that consumed them) */
} strata_ple_stats;
strata_status strata_session_ple_stats(const strata_session *s, strata_ple_stats *prefill,
                                       strata_ple_stats *decode);
/* Reads ahead, into the row cache, the rows of the ids the session's next eval starts with (e.g. a
 * verify window: the last token and the drafts made so far), so that eval's gather finds them. The
 * worker does it while the caller goes on (drafting); nothing is waited for. Advisory: it does
 * nothing when the model has no PLE or no row cache, or when the gather worker is busy (another
 * session's step, an earlier read-ahead); of a long n only the first tokens the gather buffers hold
 * now (at least min(16, n_ubatch)) are read. */
strata_status strata_session_ple_prefetch(strata_session *s, const int32_t *ids, int64_t n);
/* The packed rows an eval's PLE step gathers for ids[0..n) after the n-gram context ctx[0..ngram-1)
 * (NULL: a sequence start), through the worker and the row cache as an eval would (in steps of up
 * to n_ubatch tokens, decode-sized steps when one_token_steps), without running the model: for
 * tests and `strata bench ple`. row_ids (n x heads, may be NULL), packed (n x heads x row_bytes
 * bytes, capacity `packed_capacity`, may be NULL); st (may be NULL) receives this call's counters. */
strata_status strata_model_ple_gather(strata_model *m, const int32_t *ctx, const int32_t *ids, int64_t n,
                                      int32_t one_token_steps, uint64_t *row_ids, uint8_t *packed,
                                      uint64_t packed_capacity, strata_ple_stats *st);

/* The model's tokenizer, built from its tokenizer.ggml.* metadata (free it with
 * strata_tokenizer_free; it does not depend on m afterwards). Text given to it must already be
 * NFC-normalised where the model's tokenizer normalises (Qwen's does; pyrunner does it for you):
 * most text already is. */
strata_status strata_model_tokenizer(const strata_model *m, strata_tokenizer **out);

/* ---------------------------------------------------------------- sampling */
/* llama.cpp's default chain: top-k -> top-p -> min-p (on the distribution before temperature)
 * -> temperature -> one draw, which inverts the cumulative distribution of the survivors in id
 * order (pyrunner's Sampler runs this chain with its own random numbers: strata_sampler_draw).
 * Reproducible for a seed (splitmix64). One sampler per sequence; different samplers may be used
 * from different threads. */
typedef struct strata_sampler strata_sampler;
typedef struct strata_sampler_params {
    float temperature;   /* <= 0: greedy (argmax, lowest id on ties); default 0.8 */
    int32_t top_k;       /* 0: off; default 40 */
    float top_p;         /* (0, 1]; 1: off; default 0.95 */
    float min_p;         /* [0, 1]; 0: off; default 0.05 */
    uint64_t seed;       /* default 0 */
} strata_sampler_params;
strata_sampler_params strata_sampler_default_params(void);
strata_status strata_sampler_init(const strata_sampler_params *params, strata_sampler **out);
void strata_sampler_free(strata_sampler *s);
/* Draws the next token from n_vocab logits (non-finite logits are never drawn). */
strata_status strata_sampler_sample(strata_sampler *s, const float *logits, int64_t n_vocab,
                                    int32_t *token);
/* The same chain with the settings and the draw's uniform number u in [0, 1) given (s's own
 * settings and random stream are not used, only its buffers): top_k <= 0 or >= n_vocab, top_p = 1
 * and min_p = 0 turn a filter off; temperature > 0 (greedy is strata_sample_greedy). */
strata_status strata_sampler_draw(strata_sampler *s, const float *logits, int64_t n_vocab, int32_t top_k,
                                  double top_p, double min_p, double temperature, double u, int32_t *token);
/* Argmax, lowest id on ties. */
int32_t strata_sample_greedy(const float *logits, int64_t n_vocab);

/* ---------------------------------------------------------------- devices */

/* Number of usable CUDA devices (0 without a driver or GPU, or in a build without CUDA);
 * when 0, *reason (may be NULL) gets a static one-line explanation. Never fails. */
int32_t strata_cuda_device_count(const char **reason);

/* ---------------------------------------------------------------- watchdog and trace (issue 9) */
/* Request watchdog. Per thread: the settings apply to evaluations run afterwards on the calling
 * thread. An eval that makes no progress (no layer finished, no wait ended) for `seconds` fails
 * with STRATA_ERR_IO and a message "watchdog: no progress for S s in <stage>: <what it waited
 * for>"; it gives up inside the waits that can block (the PLE gather handshake, the device's
 * copies and computations: queued device work is cancelled first, so no buffer is read after the
 * call returns) and between layers. The session's state is then undefined: reset it or restore a
 * checkpoint; the model stays usable. seconds <= 0: off (the default). */
strata_status strata_watchdog_set(double seconds);
/* The caller's name for the stage of the evals that follow, used in the watchdog's message
 * ("prefill chunk 3", "decode step 12"); NULL or "" clears it. Copied (up to 127 bytes). */
void strata_watchdog_label(const char *label);
/* 1 when the last eval on this thread was aborted by the watchdog, else 0. */
int32_t strata_watchdog_fired(void);
/* The calling thread's current (or, after an eval, last) stage in words: label, forward step,
 * layer and wait. Writes at most size bytes (NUL-terminated); returns the length. */
int32_t strata_watchdog_stage(char *buf, uint64_t size);

/* Timeline recorder (Chrome trace / Perfetto, written by pyrunner.trace). Off by default; a
 * disabled recorder costs one predictable branch per hook. Enabling clears the buffer; up to
 * max_events records are kept (0: 4M), later ones are dropped and counted. Process-wide. */
typedef struct strata_trace_event {
    uint64_t t0_ns, t1_ns;   /* CLOCK_MONOTONIC (Python: time.monotonic_ns); t1 == t0: an instant */
    int32_t kind;            /* strata_trace_kind_name(kind) */
    int32_t tid;             /* thread index: strata_trace_thread_name(tid) */
    int32_t a, b;            /* arguments; their meaning per kind: native/src/util/trace.h */
    int64_t c, d;
} strata_trace_event;
strata_status strata_trace_enable(int32_t on, uint64_t max_events);
int32_t strata_trace_enabled(void);
/* Moves up to cap of the oldest records to out (NULL: none) and returns how many it moved;
 * strata_trace_pending() says how many are waiting. */
int64_t strata_trace_drain(strata_trace_event *out, int64_t cap);
int64_t strata_trace_pending(void);
uint64_t strata_trace_dropped(void);
uint64_t strata_trace_now_ns(void);
/* Static name of a kind ("layer", "moe", "dev_copy", …), "?" for an unknown one. */
const char *strata_trace_kind_name(int32_t kind);
/* Name of a thread index ("model", "pool 1", "sim copy", "PLE worker"); returns its length, -1
 * for an unknown index. */
int32_t strata_trace_thread_name(int32_t tid, char *buf, uint64_t size);
/* Experts resident on the device per layer: per_layer[il] for il < n (READY slots). 0s on a
 * model without an expert cache. */
strata_status strata_model_resident_experts(strata_model *m, int32_t *per_layer, int32_t n);

/* ---------------------------------------------------------------- expert-tier replacement policies
 * (issue 20 point 3). The policies of native/src/moe/policy.h, the code the engine's expert tiers
 * run, exposed for `strata cache-sim` (pyrunner/cachesim.py) and tests. */
/* The accepted policy names, comma-separated, the default first (a static string). */
const char *strata_policy_names(void);
/* The engine's default policy (the best measured online one). */
const char *strata_policy_default(void);
/* Replays a routing trace through `policy` with `capacity` slots shared by all layers, as a
 * demand-filled tier. Line i (one MoE layer of one window) has window line_window[i], layer
 * line_layer[i] and routed picks pick_off[i] .. pick_off[i+1]-1 (pick_off holds n_lines + 1
 * offsets, the first 0): expert pick_expert[j], ranked pick_rank[j] in its token (0 = top; NULL:
 * unknown). A line whose window differs from the previous line's begins a window. Per line: every
 * pick is one lookup, a hit when its key was resident as the line began; then each distinct expert
 * of the line is accessed (its picks and best rank) in order of first appearance; then each one
 * that missed is inserted (resident, and so a hit, from the next line on). hits/lookups get the
 * totals; window_hits, when not NULL, the hits of each window in order (n_windows entries at least).
 * Fails with STRATA_ERR_INVALID_ARG (an unknown policy: the message lists the names; an id out of
 * range; too few window counters) or STRATA_ERR_NOMEM; outputs are then unspecified. */
strata_status strata_policy_replay(const char *policy, int32_t n_layer, int32_t n_expert, int32_t capacity,
                                   int64_t n_lines, const int64_t *line_window, const int32_t *line_layer,
                                   const int64_t *pick_off, const int32_t *pick_expert, const int32_t *pick_rank,
                                   int64_t n_windows, uint64_t *window_hits, uint64_t *hits, uint64_t *lookups);

/* STRATA_CDEF_END */

#if defined(__GNUC__)
#pragma GCC visibility pop
#endif

#ifdef __cplusplus
}
#endif

#endif /* STRATA_H */
