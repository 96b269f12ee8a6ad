/* dense_emu.c — the `emu` table of dense.h: host memory, and each launcher emulated over its kernel's
 * launch grid by kernels/cuda/emu_*.h (the kernels' own unit functions, run lane by lane). */
#include "device/dense.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kernels/cuda/emu_mixers.h"
#include "kernels/cuda/emu_small.h"
#include "util/error.h"

static void *emu_alloc(size_t bytes) { return malloc(bytes ? bytes : 1); }
static void emu_free(void *p) { free(p); }

static strata_status emu_copy(void *dst, const void *src, size_t bytes, int kind, void *stream) {
    (void)kind; (void)stream;
    if (bytes) memmove(dst, src, bytes);
    return STRATA_OK;
}

static strata_status emu_copy2d(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width, size_t rows,
                                int kind, void *stream) {
    (void)kind; (void)stream;
    for (size_t r = 0; r < rows; r++) memmove((char *)dst + r * dpitch, (const char *)src + r * spitch, width);
    return STRATA_OK;
}

static strata_status emu_zero(void *dst, size_t bytes, void *stream) {
    (void)stream;
    if (bytes) memset(dst, 0, bytes);
    return STRATA_OK;
}

static strata_status emu_sync(void *stream) { (void)stream; return STRATA_OK; }

/* The emulated device's memory is the host's: what is available of it, of the physical total (so a fitted
 * expert cache on the sim device takes no more than the machine has; --vram-gib caps it further). */
static strata_status emu_mem_info(uint64_t *free_bytes, uint64_t *total_bytes) {
    const long page = sysconf(_SC_PAGESIZE), av = sysconf(_SC_AVPHYS_PAGES), ph = sysconf(_SC_PHYS_PAGES);
    if (page <= 0 || av < 0 || ph <= 0) return strata_fail(STRATA_ERR_IO, "emu device: the host's memory size is unknown");
    *free_bytes = (uint64_t)av * (uint64_t)page;
    *total_bytes = (uint64_t)ph * (uint64_t)page;
    return STRATA_OK;
}


static const mdl_dk EMU = {
    .name = "emu",
    .alloc = emu_alloc, .free = emu_free, .host_alloc = emu_alloc, .host_free = emu_free, .copy = emu_copy, .copy2d = emu_copy2d, .zero = emu_zero,
    .sync = emu_sync, .mem_info = emu_mem_info,
    .act_quant = emu_act_quant, .gemv = emu_gemv, .scale = emu_scale, .gemm_create = emu_gemm_create,
    .gemm_destroy = emu_gemm_destroy, .gemm_tile_bytes = emu_gemm_tile_bytes, .gemm = emu_gemm,
    .rmsnorm_rows = emu_rmsnorm_rows, .rope_angles = emu_rope_angles, .rope_apply = emu_rope_apply,
    .hc_read_norm = emu_hc_read_norm, .hc_read_act = emu_hc_read_act, .hc_read_mix = emu_hc_read_mix,
    .hc_inject = emu_hc_inject, .hc_write = emu_hc_write,
    .gdn_conv = emu_gdn_conv, .gdn_prep = emu_gdn_prep, .gdn_recurrent = emu_gdn_recurrent,
    .gdn_chunked_work_floats = emu_gdn_chunked_work_floats, .gdn_chunked = emu_gdn_chunked, .gdn_out = emu_gdn_out,
    .qsa_store = emu_qsa_store, .qsa_idx_store = emu_qsa_idx_store, .qsa_blk_pool = emu_qsa_blk_pool,
    .qsa_index = emu_qsa_index, .qsa_select = emu_qsa_select, .qsa_attn = emu_qsa_attn,
    .router_topk = emu_router_topk, .router_group = emu_router_group, .merge_glu = emu_merge_glu,
    .merge_shared_gate = emu_merge_shared_gate, .merge_gather = emu_merge_gather, .merge_sum = emu_merge_sum,
    .ple_dequant = emu_ple_dequant, .ple_key_norm = emu_ple_key_norm, .ple_gate = emu_ple_gate,
    .ple_conv = emu_ple_conv, .mtp_norm_concat = emu_mtp_norm_concat,
};

const mdl_dk *mdl_dk_emu(void) { return &EMU; }
