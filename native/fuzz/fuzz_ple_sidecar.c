/*
 * fuzz_ple_sidecar.c — libFuzzer target for the packed PLE table's sidecar (pack-ple's <table>.json): the
 * flat-JSON field readers and the checks of ple_sidecar_parse, which a load runs on the file next to the
 * table. The first input byte picks the model's row width D (0 of 256 widths is 160, the real one; others
 * are any multiple of 16 or not), the rest is the sidecar's text. A sidecar that is accepted must describe
 * a table the gather can index: whole positive counts that agree, D/2 + D/16-byte rows, one positive finite
 * scale per shard. A refused one must say why. Nothing may crash or touch memory it does not own (ASan +
 * UBSan). Seeds: sidecars as pack-ple writes them (tests/test_fuzz.py).
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ple/ple.h"
#include "strata.h"

static void require(int cond) {
    if (!cond) __builtin_trap();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    const int64_t D = data[0] == 0 ? 160 : (int64_t)data[0] * (data[0] & 1 ? 1 : 8);
    char *js = malloc(size);                       /* the text after the first byte, NUL-terminated */
    if (!js) return 0;
    memcpy(js, data + 1, size - 1);
    js[size - 1] = 0;
    ple_sidecar sc;
    const strata_status rc = ple_sidecar_parse(js, "fuzz.json", D, &sc);
    if (rc == STRATA_OK) {
        require(sc.rows >= 1 && sc.n_shard >= 1 && sc.shard_rows >= 1 && sc.gscale);
        require(sc.shard_rows * (sc.n_shard - 1) < sc.rows && sc.rows <= sc.shard_rows * sc.n_shard);
        require(D % 16 == 0 && sc.width == D / 2 + D / 16);
        for (int64_t i = 0; i < sc.n_shard; i++) require(sc.gscale[i] > 0 && sc.gscale[i] < 3.5e38f);
        require(strlen(sc.source) < sizeof sc.source);
        free(sc.gscale);
    } else {
        require(!sc.gscale && strata_last_error()[0]);
    }
    /* the field readers on their own, with room for fewer values than the text may hold */
    double x, v[4];
    char s[8];
    ple_json_number(js, "total_rows", &x);
    if (ple_json_string(js, "format", s, sizeof s)) require(strlen(s) < sizeof s);
    const int64_t n = ple_json_numbers(js, "global_scales", v, 4);
    require(n >= -1 && n <= 4);
    free(js);
    return 0;
}
