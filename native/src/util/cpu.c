/* cpu.c — which kernel paths this CPU (and this build, and the OS) can run, detected once.
 *
 * A path needs three things: its kernels compiled in (CMake sets STRATA_HAVE_<path> when the
 * compiler takes the flags), the CPU's feature bits (cpuid), and the OS saving the registers it
 * uses across context switches (XCR0 via xgetbv; for AMX tiles also a per-process permission that
 * Linux grants on request, arch_prctl ARCH_REQ_XCOMP_PERM). cpuid is a VM exit under a hypervisor
 * (tens of microseconds here), far too slow for a per-call check: everything is read once. */
#include "../quant/quant.h"

#include <pthread.h>
#include <stdint.h>

#if STRATA_HAVE_AVX2
#include <cpuid.h>
#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif
#endif

static int g_has[STRATA_N_ISA];
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

#if STRATA_HAVE_AVX2
static uint64_t xgetbv0(void) {
    uint32_t lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((uint64_t)hi << 32) | lo;
}

#if STRATA_HAVE_AMX
/* Linux gives a process the AMX tile data state only after it asks (kernel 5.16 on). */
static int amx_permitted(void) {
#if defined(__linux__) && defined(SYS_arch_prctl)
    enum { ARCH_REQ_XCOMP_PERM = 0x1023, XFEATURE_XTILEDATA = 18 };
    return syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
#else
    return 0;
#endif
}
#endif
#endif

static void detect(void) {
    g_has[STRATA_ISA_IDX_SCALAR] = 1;
#if STRATA_HAVE_AVX2
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (!__get_cpuid(1, &a, &b, &c, &d)) return;
    const int osxsave = (c >> 27) & 1, avx = (c >> 28) & 1, fma = (c >> 12) & 1, f16c = (c >> 29) & 1;
    if (!osxsave || !avx) return;
    const uint64_t xcr0 = xgetbv0();
    const int os_ymm = (xcr0 & 0x6) == 0x6;              /* SSE and AVX state */
    const int os_zmm = os_ymm && (xcr0 & 0xe0) == 0xe0;  /* opmask, ZMM_Hi256, Hi16_ZMM */
    const int os_tile = (xcr0 & 0x60000) == 0x60000;     /* XTILECFG, XTILEDATA */
    unsigned b7 = 0, c7 = 0, d7 = 0, a71 = 0, x = 0;
    if (__get_cpuid_max(0, NULL) >= 7) {
        __cpuid_count(7, 0, a, b7, c7, d7);
        __cpuid_count(7, 1, a71, x, x, x);
    }
    const int avx2 = (b7 >> 5) & 1;
    const int avx512 = ((b7 >> 16) & 1) /* F */ && ((b7 >> 17) & 1) /* DQ */ && ((b7 >> 30) & 1) /* BW */ &&
                       ((b7 >> 31) & 1) /* VL */ && ((c7 >> 1) & 1) /* VBMI */ && ((c7 >> 11) & 1) /* VNNI */;
    const int avx_vnni = (a71 >> 4) & 1;
    const int amx = ((d7 >> 24) & 1) /* TILE */ && ((d7 >> 25) & 1) /* INT8 */;
    const int base = os_ymm && avx2 && fma && f16c;
    g_has[STRATA_ISA_IDX_AVX2] = base;
#if STRATA_HAVE_AVX_VNNI
    g_has[STRATA_ISA_IDX_AVX_VNNI] = base && avx_vnni;
#else
    (void)avx_vnni;
#endif
#if STRATA_HAVE_AVX512
    g_has[STRATA_ISA_IDX_AVX512] = base && os_zmm && avx512;
#if STRATA_HAVE_AMX
    g_has[STRATA_ISA_IDX_AMX] = g_has[STRATA_ISA_IDX_AVX512] && amx && os_tile && amx_permitted();
#endif
#endif
    (void)os_zmm; (void)avx512; (void)amx; (void)os_tile;
#endif
}

int strata_cpu_has_isa(int idx) {
    pthread_once(&g_once, detect);
    return idx >= 0 && idx < STRATA_N_ISA && g_has[idx];
}
