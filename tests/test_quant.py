"""Block formats: dequantization against gguf.quants (bit for bit), dot products against a
float64 reference (within a documented bound), every ISA path == scalar (bit for bit), and
matmul results that do not depend on batch size or thread count. A path this CPU or build cannot
run is skipped with its name (pytest -rs lists them).

The dot-product bound (every type). Weights w are the gguf.quants dequantization of the
blocks; x the float activations. Quantized types multiply against x quantized to int8 in
blocks of B values (B = 32 or 256, `act_block`), whose per-element error is at most
amax(block)/254, plus amax(block) * 2^-11 where a B = 32 block's scale is stored at fp16
precision (as ggml's q8_0: quant.h strata_act_d_q8_32), so

    |dot - sum_i w_i x_i| <= sum_i |w_i| * (amax_B(x, i)/254 * 1.0001 [+ amax_B(x, i) * 2^-11])
                                                                           (activation rounding)
                             + 1e-5 * sum_i |w_i x_i| + 1e-30              (float accumulation)

Float types (F32, F16, BF16; B = 1) have only the second term.
"""
from __future__ import annotations

import zlib

import numpy as np
import pytest
from gguf import GGMLQuantizationType, quants

from pyrunner import quant
from pyrunner._native import ISA_NAMES, Context, isa_supported

ALL_TYPES = ["F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q2_K", "Q3_K", "Q4_K",
             "Q5_K", "Q6_K", "IQ2_XXS", "IQ2_XS", "IQ3_XXS", "IQ4_NL", "IQ4_XS", "MXFP4", "NVFP4"]

# Scale fields inside a block: (byte offset, encoding). Used to make blocks with sane scales;
# the "raw" kind leaves them random (NaN, Inf, subnormal scales included).
SCALES = {
    "Q8_0": [(0, "f16")], "Q4_0": [(0, "f16")], "Q4_1": [(0, "f16"), (2, "f16")],
    "Q5_0": [(0, "f16")], "Q5_1": [(0, "f16"), (2, "f16")],
    "Q2_K": [(80, "f16"), (82, "f16")], "Q3_K": [(108, "f16")],
    "Q4_K": [(0, "f16"), (2, "f16")], "Q5_K": [(0, "f16"), (2, "f16")], "Q6_K": [(208, "f16")],
    "IQ2_XXS": [(0, "f16")], "IQ2_XS": [(0, "f16")], "IQ3_XXS": [(0, "f16")],
    "IQ4_NL": [(0, "f16")], "IQ4_XS": [(0, "f16")],
    "MXFP4": [(0, "e8m0")], "NVFP4": [(0, "ue4m3"), (1, "ue4m3"), (2, "ue4m3"), (3, "ue4m3")],
}
FLOATS = {"F32": np.float32, "F16": np.float16}
ISAS = list(ISA_NAMES)                 # scalar, avx2, avx_vnni, avx512, amx
FAST_ISAS = ISAS[1:]                   # each checked against scalar, the reference
KINDS = ["random", "raw", "zeros", "ones", "high"]


def seed(*parts) -> int:
    """A stable seed per test case (hash() of str is salted per process)."""
    return zlib.crc32(repr(parts).encode())


def block_info(name):
    return quants.GGML_QUANT_SIZES[GGMLQuantizationType[name]]


def make_blocks(name: str, n_values: int, kind: str, rng: np.random.Generator) -> bytes:
    """n_values worth of blocks of a type. kinds: random (random codes, sane scales), raw (every
    byte random), zeros, ones (every code byte 0xff, sane scales), high (0x80 code bytes)."""
    if name in FLOATS or name == "BF16":
        if kind == "raw":
            nbytes = n_values * (4 if name == "F32" else 2)
            return rng.integers(0, 256, nbytes, dtype=np.uint8).tobytes()
        v = rng.standard_normal(n_values).astype(np.float32)
        if kind == "zeros":
            v[:] = 0
        elif kind in ("ones", "high"):
            v = np.where(rng.random(n_values) < 0.5, -1, 1).astype(np.float32) * (65000 if kind == "high" else 1)
        if name == "BF16":
            return (v.view(np.uint32) >> 16).astype(np.uint16).tobytes()
        return v.astype(FLOATS[name]).tobytes()
    bs, ts = block_info(name)
    nb = n_values // bs
    if kind == "zeros":
        return bytes(nb * ts)
    blocks = rng.integers(0, 256, (nb, ts), dtype=np.uint8)
    if kind == "ones":
        blocks[:] = 0xFF
    elif kind == "high":
        blocks[:] = 0x80
    if kind != "raw":
        for off, enc in SCALES[name]:
            if enc == "f16":
                mag = np.exp2(rng.uniform(-12, 0, nb)) * np.where(rng.random(nb) < 0.2, -1, 1)
                blocks[:, off:off + 2] = mag.astype(np.float16).view(np.uint8).reshape(nb, 2)
            elif enc == "e8m0":
                blocks[:, off] = rng.integers(112, 136, nb)
            else:
                blocks[:, off] = rng.integers(1, 0x7F, nb)
    return blocks.tobytes()


def gguf_dequant(name: str, data: bytes, n_values: int) -> np.ndarray:
    arr = np.frombuffer(data, dtype=np.uint8)
    if name == "F32":
        return arr.view(np.float32).copy()
    if name == "F16":
        return arr.view(np.float16).astype(np.float32)
    out = quants.dequantize(arr, GGMLQuantizationType[name])
    return np.asarray(out, dtype=np.float32).reshape(n_values)


def assert_bits_equal(a: np.ndarray, b: np.ndarray, what: str):
    """Bit-for-bit equality, except that any NaN matches any NaN (payloads may differ)."""
    a = np.asarray(a, dtype=np.float32)
    b = np.asarray(b, dtype=np.float32)
    assert a.shape == b.shape, what
    nan_a, nan_b = np.isnan(a), np.isnan(b)
    bad = np.flatnonzero(nan_a != nan_b)
    assert bad.size == 0, f"{what}: NaN mismatch at {bad[:5]}: {a[bad[:5]]} vs {b[bad[:5]]}"
    ok = ~nan_a
    diff = np.flatnonzero(a[ok].view(np.uint32) != b[ok].view(np.uint32))
    assert diff.size == 0, f"{what}: {diff.size} values differ, first at {diff[:5]}: {a[ok][diff[:5]]} vs {b[ok][diff[:5]]}"


def need_isa(isa):
    if not isa_supported(isa):
        pytest.skip(f"{isa} path not available on this CPU/build")


def test_every_type_is_registered():
    have = set(quant.supported_types())
    missing = [t for t in ALL_TYPES if t not in have]
    assert not missing, f"types without kernels: {missing}"


@pytest.mark.parametrize("name", ALL_TYPES)
def test_type_info_matches_gguf(name):
    info = quant.type_info(name)
    assert (info["block_size"], info["type_size"]) == block_info(name)
    assert info["type"] == int(GGMLQuantizationType[name])


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("name", ALL_TYPES)
def test_dequantize_matches_gguf(name, isa, kind):
    need_isa(isa)
    rng = np.random.default_rng(seed(name, kind))
    n = 4096
    data = make_blocks(name, n, kind, rng)
    got = quant.dequantize(name, data, n, isa=isa)
    assert_bits_equal(got, gguf_dequant(name, data, n), f"{name} {isa} {kind}")


def dot_bound(w: np.ndarray, x: np.ndarray, act_block: int) -> np.ndarray:
    """Per-output bound (see the module docstring). w: (rows, cols); x: (n, cols) -> (n, rows)."""
    aw = np.abs(w.astype(np.float64))
    ax = np.abs(x.astype(np.float64))
    term = 1e-5 * (ax @ aw.T) + 1e-30
    if act_block > 1:
        n, cols = x.shape
        amax = ax.reshape(n, cols // act_block, act_block).max(axis=2)
        # half a code step per value; act_q8_32 stores its scale at fp16 precision where that is a normal
        # fp16 (quant.h strata_act_d_q8_32): up to 2^-11 of amax more per value
        fp16 = (act_block == 32) & (amax / 127 >= 2.0 ** -14)
        e = np.repeat(amax / 254.0 * 1.0001 + np.where(fp16, amax * 2.0 ** -11, 0.0), act_block, axis=1)
        term = term + e @ aw.T
    return term


def make_x(rng, n, cols, style):
    x = rng.standard_normal((n, cols)).astype(np.float32)
    if style == "outlier":
        x[:, ::97] *= 50
    elif style == "sparse":
        x[rng.random((n, cols)) < 0.7] = 0
    elif style == "tiny":
        x *= 1e-6
    return x


@pytest.mark.parametrize("kind", ["random", "ones", "high"])
@pytest.mark.parametrize("name", ALL_TYPES)
def test_matmul_within_bound_of_float64(name, kind):
    rng = np.random.default_rng(seed(name, kind, "dot"))
    rows, cols = 12, 2560
    data = make_blocks(name, rows * cols, kind, rng)
    w = gguf_dequant(name, data, rows * cols).reshape(rows, cols)
    act_block = quant.type_info(name)["act_block"]
    for style in ("normal", "outlier", "sparse", "tiny"):
        x = make_x(rng, 3, cols, style)
        ref = x.astype(np.float64) @ w.astype(np.float64).T
        got = quant.matmul(name, data, rows, cols, x)
        err = np.abs(got - ref)
        bound = dot_bound(w, x, act_block)
        worst = np.max(err / bound)
        assert np.all(err <= bound), f"{name} {kind} {style}: error {err.max():.3g} exceeds bound by x{worst:.3g}"


@pytest.mark.parametrize("isa", FAST_ISAS)
@pytest.mark.parametrize("name", ALL_TYPES)
def test_every_path_agrees_with_scalar_bit_for_bit(name, isa):
    need_isa(isa)
    rng = np.random.default_rng(seed(name, "isa"))
    bs = block_info(name)[0] if name not in FLOATS and name != "BF16" else 1
    # Row lengths whose block count leaves 1..7 blocks after groups of 8 (the real model's 640-wide
    # expert down rows are 20 blocks of 32: 4 left), besides the long rows.
    tails = [bs * k for k in (1, 3, 5, 9, 12, 20, 23) if (bs * k) % max(bs, 32) == 0] if bs < 256 else [256 * 3, 256 * 9]
    shapes = [(3, 256), (5, 2560), (2, 4608)] + [(3, c) for c in tails if bs > 1] + ([(4, 640)] if bs <= 64 else [])
    for kind in ("random", "ones", "high", "zeros"):
        for rows, cols in shapes:
            data = make_blocks(name, rows * cols, kind, rng)
            for style in ("normal", "outlier", "sparse"):
                for n in (1, 2, 7, 16, 19):
                    x = make_x(rng, n, cols, style)
                    a = quant.matmul(name, data, rows, cols, x, isa="scalar")
                    b = quant.matmul(name, data, rows, cols, x, isa=isa)
                    assert_bits_equal(a, b, f"{name} {isa} {kind} {rows}x{cols} n={n} {style}")


def covering_shapes():
    """(rows, blocks, columns) cases in which every row count 1..37, block count 1..40 and column
    count 1..19 and 512 occurs at least once (a cyclic walk through the three lists), and the
    extremes of each occur with the extremes of the others; not the full cross product."""
    rows, blocks, cols = list(range(1, 38)), list(range(1, 41)), list(range(1, 20)) + [512]
    walk = [(rows[i % len(rows)], blocks[(7 * i) % len(blocks)], cols[(3 * i) % len(cols)]) for i in range(40)]
    edges = [(r, b, c) for r in (1, 37) for b in (1, 40) for c in (1, 19, 512)]
    return walk + edges


def test_covering_shapes_cover():
    cases = covering_shapes()
    assert {r for r, _, _ in cases} == set(range(1, 38))
    assert {b for _, b, _ in cases} == set(range(1, 41))
    assert {c for _, _, c in cases} == set(range(1, 20)) | {512}


@pytest.mark.parametrize("name", ALL_TYPES)
def test_every_path_on_covering_shapes(name):
    """Every path this host runs against the scalar reference, bit for bit, over the covering set of
    shapes (rows x blocks per row x columns), with the block kinds in turn (raw blocks included:
    NaN/Inf scales must come out the same way). Paths the host lacks are named in the skip."""
    paths = [isa for isa in FAST_ISAS if isa_supported(isa)]
    if not paths:
        pytest.skip(f"no path but scalar runs here (skipped: {', '.join(FAST_ISAS)})")
    rng = np.random.default_rng(seed(name, "cover"))
    bs = block_info(name)[0] if name not in FLOATS and name != "BF16" else 1
    # float types have no blocks: a "block" is 32 values there (rows of 32..1280 values)
    unit = bs if bs > 1 else 32
    for i, (rows, blocks, n) in enumerate(covering_shapes()):
        cols = unit * blocks
        if bs == 256 and n == 512 and blocks > 8:
            blocks, cols = 8, unit * 8      # 512 columns x 40 super-blocks costs the scalar path seconds
        kind = KINDS[i % len(KINDS)]
        data = make_blocks(name, rows * cols, kind, rng)
        x = make_x(rng, n, cols, ("normal", "outlier", "sparse")[i % 3])
        ref = quant.matmul(name, data, rows, cols, x, isa="scalar")
        for isa in paths:
            got = quant.matmul(name, data, rows, cols, x, isa=isa)
            assert_bits_equal(got, ref, f"{name} {isa} {kind} rows={rows} blocks={blocks} cols={n}")
    skipped = [isa for isa in FAST_ISAS if isa not in paths]
    print(f"{name}: checked {', '.join(paths)}; skipped (not on this host): {', '.join(skipped) or 'none'}")


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("name", ALL_TYPES)
def test_matmul_same_for_any_batch_and_thread_count(name, isa):
    need_isa(isa)
    rng = np.random.default_rng(seed(name, "batch"))
    rows, cols = 67, 512
    data = make_blocks(name, rows * cols, "random", rng)
    x = make_x(rng, 40, cols, "normal")
    one = Context(1)
    full = quant.matmul(name, data, rows, cols, x, isa=isa)
    serial = quant.matmul(name, data, rows, cols, x, isa=isa, ctx=one)
    assert_bits_equal(full, serial, f"{name}: threads")
    singles = np.stack([quant.matmul(name, data, rows, cols, x[j], isa=isa, ctx=one) for j in range(len(x))])
    assert_bits_equal(full, singles, f"{name}: batch 40 vs one column at a time")
    for n in (2, 5, 16, 17):
        assert_bits_equal(quant.matmul(name, data, rows, cols, x[:n], isa=isa), full[:n], f"{name}: batch {n}")


def test_bad_arguments_raise_with_message():
    with pytest.raises(Exception, match="unknown type name"):
        quant.type_id("Q9_9")
    with pytest.raises(Exception, match="multiple of the block size"):
        quant.dequantize("Q8_0", bytes(34), 31)
    with pytest.raises(Exception, match="need 34 bytes"):
        quant.dequantize("Q8_0", bytes(33), 32)
    with pytest.raises(Exception, match="weights need"):
        quant.matmul("Q8_0", bytes(34), 2, 32, np.zeros(32, np.float32))
    with pytest.raises(ValueError, match="shape"):
        quant.matmul("Q8_0", bytes(68), 2, 32, np.zeros(31, np.float32))


@pytest.mark.parametrize("isa", FAST_ISAS)
@pytest.mark.parametrize("name", ["IQ4_NL", "MXFP4", "NVFP4", "IQ2_XXS", "IQ2_XS", "IQ3_XXS", "Q2_K", "Q3_K", "Q4_K",
                                  "Q5_K", "Q6_K", "IQ4_XS", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1"])
def test_row_group_kernels_match_scalar(name, isa):
    """Types whose products may take a kernel working on several rows at once (quant.h rows[isa]):
    row counts that leave 1..7 rows in the last group, rows of 1..8 blocks, several column
    counts (for the IQ types' biased kernels also 12: a pass of 8 and one of 4); bit for bit against
    the scalar path."""
    need_isa(isa)
    rng = np.random.default_rng(seed(name, "rows"))
    bs = block_info(name)[0]
    column_counts = (1, 3, 12, 16, 19) if name in CONV_TYPES else (1, 3, 16, 19)
    for kind in ("random", "ones", "high", "zeros", "raw"):
        for rows in (1, 7, 8, 9, 37):
            for cols in [c for c in (32, 64, 96, 160, 256, 320, 480, 1024, 1088, 2304) if c % bs == 0]:
                data = make_blocks(name, rows * cols, kind, rng)
                for style in ("normal", "outlier", "sparse"):
                    for n in column_counts:
                        x = make_x(rng, n, cols, style)
                        a = quant.matmul(name, data, rows, cols, x, isa="scalar")
                        b = quant.matmul(name, data, rows, cols, x, isa=isa)
                        assert_bits_equal(a, b, f"{name} {isa} {kind} {rows}x{cols} n={n} {style}")


@pytest.mark.parametrize("isa", FAST_ISAS)
@pytest.mark.parametrize("name", ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0"])
def test_legacy_several_column_rows_kernel(name, isa):
    """The 32-value formats' rows kernel for 4..16 columns (avx2_legacy.c qr_rows: codes transposed
    across the lanes) and for 1..3 columns on rows of one group and a part (9..15 blocks, and 8 at one
    column: ql_rows_few, the columns in registers): rows shorter than a group and rows of whole groups
    (qr_lanes, rows across the lanes; most products here have fewer than 8 rows, which it hands to
    vec_dot: test_legacy_short_rows_kernel has sets of 8), every partial last group (rows of 8..23
    blocks: 0..7 left after groups of 8), the activations taken in column chunks when a row is long (7,680 values: 7 columns at once) and
    the fallback to vec_dot when it is longer still (16,384 values); extreme codes (0xff, and 0x80,
    Q8_0's -128) included; bit for bit against the scalar path."""
    need_isa(isa)
    rng = np.random.default_rng(seed(name, "rows4"))
    cases = [(5, 32 * b, n) for b in range(1, 24) for n in (4, 5, 8, 9)] + \
            [(r, 32 * b, n) for b in range(7, 17) for n in (1, 2, 3) for r in (1, 6)] + \
            [(3, 7680, 16), (2, 7680, 12), (2, 16384, 8), (9, 256, 16), (1, 2560, 6)]
    matmul_equals_scalar(name, isa, cases, rng)


def test_q8_0_amx_tiles():
    """Q8_0 products of 12..16 columns on AMX tiles (amx_legacy.c: the codes read straight from the rows
    into tiles, one block per product, the float steps in vec_dot's order), bit for bit against the
    scalar path: rows of 1..9 blocks, around the 32-block chunk of sums (31..33, 64, 65: the columns'
    layout leaves the stack past 64 blocks), the longest row it takes (512 blocks) and the first it hands
    back (513), and 11 columns (the AVX-512 kernel's); extreme codes included. 600 rows on 2 threads: matmul
    hands the kernel tasks of 37 rows (75 at one block), so every product has whole groups of 16 rows and
    a partial one (checked once: with the tiles' float step mutated, every case but the all-zero blocks, the
    513-block rows and the 11 columns fails). Runs where the amx path does."""
    need_isa("amx")
    rng = np.random.default_rng(seed("Q8_0", "amx"))
    ctx = Context(threads=2)
    cases = [(600, 32 * b, 12 + b % 5) for b in range(1, 10)] + \
            [(600, 32 * b, 16) for b in (31, 32, 33, 64, 65)] + [(600, 16384, 13), (600, 16416, 16), (600, 256, 11)]
    matmul_equals_scalar("Q8_0", "amx", cases, rng, ctx)


def matmul_equals_scalar(name, isa, cases, rng, ctx=None):
    """Each (rows, cols, n) product on path isa bit for bit against the scalar path, block kinds and
    activation styles taken in turn (ctx: the pool to run on; None: the default one)."""
    for i, (rows, cols, n) in enumerate(cases):
        kind = KINDS[i % len(KINDS)]
        data = make_blocks(name, rows * cols, kind, rng)
        x = make_x(rng, n, cols, ("normal", "outlier", "sparse")[i % 3])
        a = quant.matmul(name, data, rows, cols, x, isa="scalar", ctx=ctx)
        b = quant.matmul(name, data, rows, cols, x, isa=isa, ctx=ctx)
        assert_bits_equal(a, b, f"{name} {isa} {kind} {rows}x{cols} n={n}")


@pytest.mark.parametrize("isa", FAST_ISAS)
@pytest.mark.parametrize("name", ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0"])
def test_legacy_short_rows_kernel(name, isa):
    """The 32-value formats' rows kernel in the row lanes (avx2_legacy.c qr_lanes: eight rows across the
    lanes) for rows shorter than a group (flash-small's hyper-connection up rows are one block) at one
    column (matmul's SHORT1 case) and at 2, 3, 16 and 17 (columns in chunks of 16): rows of 1..7 blocks
    at every row count 1..37 (whole and partial sets of 8 rows), and the rows of 8..16 blocks that matmul
    also hands the rows kernel at one column (they take vec_dot); and rows of whole groups, one group
    (256 values) at 2..17 columns, 2..4 groups at 2 and 3, beside one at 5 columns that stays in the
    groups; extreme codes included; bit for bit against the scalar path."""
    need_isa(isa)
    rng = np.random.default_rng(seed(name, "short1"))
    cases = [(r, 32 * (1 + (r * 3) % 7), (1, 2, 3, 16, 17)[r % 5]) for r in range(1, 38)] + \
            [(1024, 32, 1), (64, 224, 1), (17, 256, 1), (9, 512, 1), (8, 384, 1)] + \
            [(r, 256 * g, n) for r, g, n in [(8, 1, 2), (13, 1, 3), (21, 1, 4), (37, 1, 8), (16, 1, 16), (19, 1, 17),
                                              (11, 2, 2), (24, 3, 3), (9, 4, 2), (17, 2, 5)]]
    matmul_equals_scalar(name, isa, cases, rng)


CONV_TYPES = ["IQ2_XXS", "IQ2_XS", "IQ3_XXS"]


def conv_cases():
    """(rows, blocks, columns) for the prefill conversion (products of >= 96 columns): every row count
    1..37 (partial and whole groups of 16) and block count 1..40, columns 96..99 (the 3-column passes'
    remainders) and 512, in a cyclic walk, plus the extremes with each other."""
    rows, blocks, cols = list(range(1, 38)), list(range(1, 41)), [96, 97, 98, 99, 512]
    walk = [(rows[i % len(rows)], blocks[(7 * i) % len(blocks)], cols[i % len(cols)]) for i in range(40)]
    return walk + [(r, b, c) for r in (1, 37) for b in (1, 40) for c in (96, 512)]


@pytest.mark.parametrize("name", CONV_TYPES)
def test_repacked_equals_plain(name):
    """The prefill conversion (strata_set_repack: rows decoded once into int16 weights across the lanes)
    against the plain kernels of the same path and the scalar reference, bit for bit, on every path
    here that has it; paths without it are named in the skip."""
    paths = [isa for isa in FAST_ISAS if isa_supported(isa) and quant.repack_scratch_bytes(name, 256, isa)]
    if not paths:
        pytest.skip(f"{name}: no path here converts rows (it is avx512's and amx's; runs here: "
                    f"{', '.join(i for i in ISAS if isa_supported(i))})")
    rng = np.random.default_rng(seed(name, "repack"))
    try:
        for i, (rows, blocks, n) in enumerate(conv_cases()):
            cols = 256 * blocks
            kind = ("random", "raw", "ones", "high")[i % 4]
            data = make_blocks(name, rows * cols, kind, rng)
            x = make_x(rng, n, cols, ("normal", "outlier", "sparse")[i % 3])
            for isa in paths:
                quant.set_repack(False)
                plain = quant.matmul(name, data, rows, cols, x, isa=isa)
                quant.set_repack(True)
                conv = quant.matmul(name, data, rows, cols, x, isa=isa)
                assert_bits_equal(conv, plain, f"{name} {isa} {kind} rows={rows} blocks={blocks} cols={n}")
            if i % 8 == 0:   # the scalar path costs seconds on the long rows: a sample of the cases
                ref = quant.matmul(name, data, rows, cols, x, isa="scalar")
                assert_bits_equal(conv, ref, f"{name} scalar {kind} rows={rows} blocks={blocks} cols={n}")
    finally:
        quant.set_repack(True)
    print(f"{name}: conversion checked on {', '.join(paths)}")


def test_repack_scratch_is_sized_and_switches_off():
    """The scratch is 16 rows of int16 weights plus a float per row and block; off, and for types or
    paths without a converted layout, 0."""
    assert quant.repack_scratch_bytes("Q4_K", 2560, "scalar") == 0
    assert quant.repack_scratch_bytes("IQ2_XS", 2560, "scalar") == 0
    if not (isa_supported("avx512") and quant.repack_scratch_bytes("IQ2_XS", 2560, "avx512")):
        pytest.skip("no avx512 path here: nothing converts rows")
    assert quant.repack_scratch_bytes("IQ2_XS", 2560, "avx512") == 10 * (16 * 256 * 2 + 16 * 4)
    try:
        assert quant.set_repack(False) is True
        assert quant.repack_scratch_bytes("IQ2_XS", 2560, "avx512") == 0
    finally:
        quant.set_repack(True)
