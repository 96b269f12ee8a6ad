/* api.c — exported entry points that are not owned by a subsystem: versions, build info,
 * CPU path selection, the context (thread pool) and the block-format calls. */
#include "strata.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "context.h"
#include "quant/quant.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/gemm.h"
#include "util/error.h"
#include "util/threadpool.h"

struct strata_context {
    strata_pool *pool;
};

uint32_t strata_abi_version(void) { return STRATA_ABI_VERSION; }
const char *strata_version(void) { return STRATA_VERSION_STR; }

const char *strata_build_info(void) {
    return "strata " STRATA_VERSION_STR
#if STRATA_HAVE_AVX2
           " avx2=compiled"
#else
           " avx2=absent"
#endif
#if STRATA_HAVE_AVX_VNNI
           " avx_vnni=compiled"
#else
           " avx_vnni=absent"
#endif
#if STRATA_HAVE_AVX512
           " avx512=compiled"
#else
           " avx512=absent"
#endif
#if STRATA_HAVE_AMX
           " amx=compiled"
#else
           " amx=absent"
#endif
#if STRATA_HAVE_CUDA
           " cuda=compiled"
#else
           " cuda=absent"
#endif
#if STRATA_SANITIZED
           " sanitize=address,undefined"
#endif
        ;
}

/* ---------------------------------------------------------------- CPU paths */

static const char *const g_isa_names[] = {"auto", "scalar", "avx2", "avx_vnni", "avx512", "amx"};
enum { N_PUBLIC_ISA = (int)(sizeof g_isa_names / sizeof g_isa_names[0]) };

static int g_isa_env = -1; /* the table index STRATA_ISA names, if this CPU runs it; else -1 */
static pthread_once_t g_env_once = PTHREAD_ONCE_INIT;

/* getenv is not thread-safe against setenv: read once. The debugging override, the one variable
 * the library reads (strata.h lists it next to strata_isa_best; every setting is a params field,
 * read from the environment in Python, which also refuses a name this CPU cannot run). */
static void isa_env(void) {
    const char *env = getenv("STRATA_ISA");
    if (!env) return;
    for (int i = 1; i < N_PUBLIC_ISA; i++)
        if (strcmp(env, g_isa_names[i]) == 0 && strata_cpu_has_isa(i - 1)) g_isa_env = i - 1;
}

const char *strata_isa_name(strata_isa isa) {
    return (int)isa >= 0 && (int)isa < N_PUBLIC_ISA ? g_isa_names[isa] : NULL;
}

int32_t strata_isa_supported(strata_isa isa) {
    if (isa == STRATA_ISA_AUTO) return 1;
    return (int)isa > 0 && (int)isa < N_PUBLIC_ISA && strata_cpu_has_isa((int)isa - 1);
}

int64_t strata_set_gemm_from(int64_t n_cols) { return strata_gemm_set_from(n_cols); }
int32_t strata_set_repack(int32_t on) { return strata_matmul_set_repack(on); }

strata_isa strata_isa_best(void) {
    pthread_once(&g_env_once, isa_env);
    if (g_isa_env >= 0) return (strata_isa)(g_isa_env + 1);
    for (int i = STRATA_N_ISA - 1; i > 0; i--)
        if (strata_cpu_has_isa(i)) return (strata_isa)(i + 1);
    return STRATA_ISA_SCALAR;
}

/* Resolves a public isa to a table index, or fails if it cannot run here. */
static strata_status isa_index(strata_isa isa, int *idx) {
    if (isa == STRATA_ISA_AUTO) isa = strata_isa_best();
    if ((int)isa <= 0 || (int)isa >= N_PUBLIC_ISA) return strata_fail(STRATA_ERR_INVALID_ARG, "unknown isa %d", (int)isa);
    if (!strata_cpu_has_isa((int)isa - 1))
        return strata_fail(STRATA_ERR_UNSUPPORTED, "isa %s requested but this CPU, its OS or this build cannot run it "
                           "(strata_build_info() lists what was compiled in)", g_isa_names[isa]);
    *idx = (int)isa - 1;
    return STRATA_OK;
}

/* ---------------------------------------------------------------- context */

strata_context_params strata_context_default_params(void) {
    strata_context_params p;
    memset(&p, 0, sizeof p);
    p.n_threads = 0;
    return p;
}

strata_status strata_context_init(const strata_context_params *params, strata_context **out) {
    if (!out) return strata_fail(STRATA_ERR_INVALID_ARG, "strata_context_init: out is NULL");
    strata_context_params p = params ? *params : strata_context_default_params();
    if (p.n_threads < 0 || p.n_threads > 1024)
        return strata_fail(STRATA_ERR_INVALID_ARG, "n_threads %d out of range 0..1024", p.n_threads);
    if (p.n_threads == 0) {
        const long n = sysconf(_SC_NPROCESSORS_ONLN);
        p.n_threads = n > 0 ? (int32_t)n : 1;
    }
    strata_context *ctx = calloc(1, sizeof *ctx);
    if (!ctx) return strata_fail(STRATA_ERR_NOMEM, "context: out of memory");
    ctx->pool = strata_pool_create(p.n_threads);
    if (!ctx->pool) {
        free(ctx);
        return strata_fail(STRATA_ERR_NOMEM, "could not start %d worker threads", p.n_threads - 1);
    }
    *out = ctx;
    return STRATA_OK;
}

void strata_context_free(strata_context *ctx) {
    if (!ctx) return;
    strata_pool_destroy(ctx->pool);
    free(ctx);
}

strata_pool *strata_context_pool(strata_context *ctx) { return ctx ? ctx->pool : NULL; }

int32_t strata_context_n_threads(const strata_context *ctx) {
    return ctx ? strata_pool_n_threads(ctx->pool) : 1;
}

/* ---------------------------------------------------------------- block formats */

static strata_status traits_for(int32_t type, const strata_qtraits **out) {
    const strata_qtraits *t = strata_qtraits_get(type);
    if (!t) return strata_fail(STRATA_ERR_UNSUPPORTED, "ggml type id %d is not supported by Strata", (int)type);
    *out = t;
    return STRATA_OK;
}

strata_status strata_type_info_get(int32_t type, strata_type_info *out) {
    const strata_qtraits *t = NULL;
    if (!out) return strata_fail(STRATA_ERR_INVALID_ARG, "strata_type_info_get: out is NULL");
    strata_status st = traits_for(type, &t);
    if (st) return st;
    out->type = t->type;
    out->name = t->name;
    out->block_size = t->block_size;
    out->type_size = t->type_size;
    out->act_block = t->act == STRATA_ACT_Q8_32 ? 32 : t->act == STRATA_ACT_Q8_256 ? QK_K : 1;
    out->has_kernels = t->dequant[0] && t->vec_dot[0];
    out->has_quantize = t->quantize != NULL;
    return STRATA_OK;
}

strata_status strata_type_from_name(const char *name, int32_t *type) {
    if (!name || !type) return strata_fail(STRATA_ERR_INVALID_ARG, "strata_type_from_name: NULL argument");
    for (int32_t i = 0; i < STRATA_QTYPE_MAX; i++) {
        const strata_qtraits *t = strata_qtraits_get(i);
        if (t && strcmp(t->name, name) == 0) { *type = i; return STRATA_OK; }
    }
    return strata_fail(STRATA_ERR_NOT_FOUND, "unknown type name '%s' (expected a gguf.GGMLQuantizationType name such as Q4_K)", name);
}

static strata_status row_size(const strata_qtraits *t, int64_t n, uint64_t *bytes) {
    if (n < 0 || n % t->block_size != 0)
        return strata_fail(STRATA_ERR_INVALID_ARG, "%s: %lld values is not a multiple of the block size %d",
                           t->name, (long long)n, t->block_size);
    *bytes = (uint64_t)(n / t->block_size) * (uint64_t)t->type_size;
    return STRATA_OK;
}

strata_status strata_type_row_size(int32_t type, int64_t n, uint64_t *bytes) {
    const strata_qtraits *t = NULL;
    if (!bytes) return strata_fail(STRATA_ERR_INVALID_ARG, "strata_type_row_size: bytes is NULL");
    strata_status st = traits_for(type, &t);
    return st ? st : row_size(t, n, bytes);
}

strata_status strata_dequantize(int32_t type, const void *src, uint64_t src_size, float *dst,
                                int64_t n, strata_isa isa) {
    const strata_qtraits *t = NULL;
    uint64_t need = 0;
    int idx = 0;
    strata_status st;
    if ((st = traits_for(type, &t)) || (st = row_size(t, n, &need)) || (st = isa_index(isa, &idx))) return st;
    if (!t->dequant[idx]) return strata_fail(STRATA_ERR_UNSUPPORTED, "%s: no dequantization kernel", t->name);
    if (src_size != need)
        return strata_fail(STRATA_ERR_INVALID_ARG, "%s: %lld values need %llu bytes, got %llu", t->name,
                           (long long)n, (unsigned long long)need, (unsigned long long)src_size);
    if (n && (!src || !dst)) return strata_fail(STRATA_ERR_INVALID_ARG, "strata_dequantize: NULL buffer");
    t->dequant[idx](src, dst, n);
    return STRATA_OK;
}

strata_status strata_quantize(int32_t type, const float *src, int64_t nrows, int64_t n_per_row,
                              const float *imatrix, void *dst, uint64_t dst_size, uint64_t *written) {
    const strata_qtraits *t = NULL;
    uint64_t rs = 0;
    strata_status st;
    if (!written) return strata_fail(STRATA_ERR_INVALID_ARG, "strata_quantize: written is NULL");
    if ((st = traits_for(type, &t)) || (st = row_size(t, n_per_row, &rs))) return st;
    if (!t->quantize) return strata_fail(STRATA_ERR_UNSUPPORTED, "%s: Strata has no quantizer for this type", t->name);
    if (nrows < 0) return strata_fail(STRATA_ERR_INVALID_ARG, "nrows %lld < 0", (long long)nrows);
    const uint64_t need = rs * (uint64_t)nrows;
    if (dst_size < need) {
        *written = need;
        return strata_fail(STRATA_ERR_BUFFER_TOO_SMALL, "%s: %lld x %lld values need %llu bytes, buffer has %llu",
                           t->name, (long long)nrows, (long long)n_per_row, (unsigned long long)need,
                           (unsigned long long)dst_size);
    }
    if (need && (!src || !dst)) return strata_fail(STRATA_ERR_INVALID_ARG, "strata_quantize: NULL buffer");
    *written = need ? t->quantize(src, dst, nrows, n_per_row, imatrix) : 0;
    if (*written != need)
        return strata_fail(STRATA_ERR_INTERNAL, "%s quantizer wrote %llu bytes, expected %llu", t->name,
                           (unsigned long long)*written, (unsigned long long)need);
    return STRATA_OK;
}

/* The checks strata_matmul and strata_gemm share. *run is 0 when there is nothing to compute. */
static strata_status product_args(const char *what, int32_t type, const void *w, uint64_t w_size, int64_t rows,
                                  int64_t cols, const float *x, int64_t n, const float *y, strata_isa isa,
                                  const strata_qtraits **t, int *idx, int *run) {
    uint64_t rs = 0;
    strata_status st;
    *run = 0;
    if ((st = traits_for(type, t)) || (st = row_size(*t, cols, &rs)) || (st = isa_index(isa, idx))) return st;
    if (rows < 0 || n < 0) return strata_fail(STRATA_ERR_INVALID_ARG, "%s: negative rows or n", what);
    if (!(*t)->vec_dot[*idx] || !(*t)->dequant[STRATA_ISA_IDX_SCALAR])
        return strata_fail(STRATA_ERR_UNSUPPORTED, "%s: no %s kernel", (*t)->name, what);
    if (rs * (uint64_t)rows != w_size)
        return strata_fail(STRATA_ERR_INVALID_ARG, "%s: %lld x %lld weights need %llu bytes, got %llu", (*t)->name,
                           (long long)rows, (long long)cols, (unsigned long long)(rs * (uint64_t)rows),
                           (unsigned long long)w_size);
    if (rows == 0 || n == 0) return STRATA_OK;
    if (!w || !x || !y) return strata_fail(STRATA_ERR_INVALID_ARG, "%s: NULL buffer", what);
    *run = 1;
    return STRATA_OK;
}

strata_status strata_repack_scratch_bytes(int32_t type, int64_t cols, strata_isa isa, uint64_t *out) {
    const strata_qtraits *t = NULL;
    uint64_t rs = 0;
    int idx = 0;
    strata_status st;
    if (!out) return strata_fail(STRATA_ERR_INVALID_ARG, "strata_repack_scratch_bytes: out is NULL");
    *out = 0;
    if ((st = traits_for(type, &t)) || (st = row_size(t, cols, &rs)) || (st = isa_index(isa, &idx))) return st;
    *out = strata_matmul_conv_bytes(t, idx, cols);
    return STRATA_OK;
}

strata_status strata_matmul(strata_context *ctx, int32_t type, const void *w, uint64_t w_size,
                            int64_t rows, int64_t cols, const float *x, int64_t n, float *y,
                            strata_isa isa) {
    const strata_qtraits *t = NULL;
    int idx = 0, run = 0;
    strata_status st = product_args("matmul", type, w, w_size, rows, cols, x, n, y, isa, &t, &idx, &run);
    if (st || !run) return st;
    return strata_matmul_run(ctx ? ctx->pool : NULL, t, idx, w, rows, cols, x, n, y);
}

strata_status strata_gemm(strata_context *ctx, int32_t type, const void *w, uint64_t w_size,
                          int64_t rows, int64_t cols, const float *x, int64_t n, float *y,
                          strata_isa isa) {
    const strata_qtraits *t = NULL;
    int idx = 0, run = 0;
    strata_status st = product_args("gemm", type, w, w_size, rows, cols, x, n, y, isa, &t, &idx, &run);
    if (st || !run) return st;
    return strata_gemm_run(ctx ? ctx->pool : NULL, t, idx, w, rows, cols, x, n, y);
}
