"""strata_gemm: the dequantize-then-f32 GEMM (native/src/kernels/cpu/gemm.c) and its use in the model.

The GEMM decodes weight rows with the type's exact dequantization and multiplies them by the
float activations (no q8 rounding), so against float64 on the gguf.quants weights its only
error is float32 accumulation: |y - ref| <= 1e-5 * |w_r| * |x_j| (row norms). Its summation
order is fixed per output (gemm.h), so the scalar and AVX2 kernels, the thread count and the
batch size do not change a bit. The model switches to it for products of many columns; the
last test runs a small model with every product on the GEMM (STRATA_GEMM=1, subprocess: the
setting is read once per process) and with none (STRATA_GEMM=0) and compares the logits.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import test_quant as tq
from pyrunner import quant
from pyrunner._native import Context, check, default_context, ffi, isa_id, lib

ROOT = Path(__file__).resolve().parent.parent


def gemm(name: str, data: bytes, rows: int, cols: int, x: np.ndarray, isa: str = "auto",
         ctx: Context | None = None) -> np.ndarray:
    xv = np.ascontiguousarray(x, dtype=np.float32)
    y = np.empty((xv.shape[0], rows), dtype=np.float32)
    src = ffi.from_buffer(data)
    check(lib.strata_gemm((ctx or default_context()).ptr, quant.type_id(name), src, len(src), rows, cols,
                          ffi.from_buffer("float[]", xv), xv.shape[0], ffi.from_buffer("float[]", y),
                          isa_id(isa)))
    return y


def placed(x: np.ndarray, offset: int) -> np.ndarray:
    """A copy of x starting `offset` floats past a 64-byte boundary."""
    buf = np.empty(x.size + 16 + offset, np.float32)
    start = (-buf.ctypes.data % 64) // 4 + offset
    out = buf[start:start + x.size].reshape(x.shape)
    out[:] = x
    assert out.ctypes.data % 64 == 4 * offset
    return out


def widths(name: str) -> list[int]:
    """Row widths: odd block counts, the model's 640-wide expert rows, widths past one depth
    chunk (1024 values), and for float types widths that end mid-vector."""
    if name in ("F32", "F16", "BF16"):
        return [37, 96, 640, 1291]
    bs = tq.block_info(name)[0]
    return [c for c in (bs * 3, bs * 5, 640, 1280, 2560) if c % bs == 0]


@pytest.mark.parametrize("name", tq.ALL_TYPES)
def test_gemm_matches_float64(name):
    rng = np.random.default_rng(tq.seed(name, "gemm"))
    for cols in widths(name):
        rows = 13
        for kind in ("random", "ones"):
            data = tq.make_blocks(name, rows * cols, kind, rng)
            w = tq.gguf_dequant(name, data, rows * cols).reshape(rows, cols).astype(np.float64)
            for style in ("normal", "outlier", "sparse", "tiny"):
                for n in (1, 3, 17, 64):
                    x = tq.make_x(rng, n, cols, style)
                    got = gemm(name, data, rows, cols, x)
                    ref = x.astype(np.float64) @ w.T
                    scale = np.linalg.norm(x.astype(np.float64), axis=1)[:, None] * np.linalg.norm(w, axis=1)[None, :]
                    err = np.abs(got - ref)
                    bad = err > 1e-5 * scale + 1e-30
                    assert not bad.any(), (f"{name} {cols} {kind} {style} n={n}: error {err[bad].max():.3g} "
                                           f"over 1e-5 of the norm product {scale[bad].min():.3g}")


@pytest.mark.parametrize("name", tq.ALL_TYPES)
def test_gemm_bits_do_not_depend_on_threads_batch_or_isa(name):
    rng = np.random.default_rng(tq.seed(name, "gemm-bits"))
    bs = 1 if name in ("F32", "F16", "BF16") else tq.block_info(name)[0]
    cols = 1280 if bs in (1, 256) else 640    # past one depth chunk (1024 values)
    rows = 101                                 # several tasks and row blocks, a partial register tile
    data = tq.make_blocks(name, rows * cols, "random", rng)
    x = tq.make_x(rng, 64, cols, "normal")
    one, two = Context(1), Context(2)
    full = gemm(name, data, rows, cols, x, ctx=two)
    tq.assert_bits_equal(gemm(name, data, rows, cols, x, ctx=one), full, f"{name}: 1 vs 2 threads")
    for n in (1, 3, 17):
        tq.assert_bits_equal(gemm(name, data, rows, cols, x[:n], ctx=two), full[:n], f"{name}: batch {n} vs 64")
    # activations on 64-byte-aligned rows are used in place, others packed first (gemm.c): same bits
    for offset in (0, 1, 4):
        tq.assert_bits_equal(gemm(name, data, rows, cols, placed(x, offset), ctx=two), full,
                             f"{name}: x {offset} floats past a 64-byte boundary")
    if tq.isa_supported("avx2"):
        tq.assert_bits_equal(gemm(name, data, rows, cols, x, isa="scalar", ctx=two),
                             gemm(name, data, rows, cols, x, isa="avx2", ctx=two), f"{name}: scalar vs AVX2")


def test_gemm_close_to_matmul():
    """Same product as strata_matmul, rounded differently: within strata_matmul's own bound."""
    rng = np.random.default_rng(5)
    rows, cols = 40, 512
    for name in ("Q4_K", "Q8_0", "IQ2_XS", "F16"):
        data = tq.make_blocks(name, rows * cols, "random", rng)
        w = tq.gguf_dequant(name, data, rows * cols).reshape(rows, cols)
        x = tq.make_x(rng, 20, cols, "normal")
        diff = np.abs(gemm(name, data, rows, cols, x) - quant.matmul(name, data, rows, cols, x))
        assert np.all(diff <= tq.dot_bound(w, x, quant.type_info(name)["act_block"]) * 1.01), name


def test_gemm_bad_arguments():
    x = np.zeros((2, 32), np.float32)
    with pytest.raises(Exception, match="weights need 68 bytes"):
        gemm("Q8_0", bytes(34), 2, 32, x)
    with pytest.raises(Exception, match="multiple of the block size"):
        gemm("Q8_0", bytes(34), 1, 31, np.zeros((2, 31), np.float32))
    y = gemm("Q8_0", bytes(0), 0, 32, x)       # nothing to compute is not an error
    assert y.shape == (2, 0)


_MODEL_SCRIPT = """
import json, sys
import numpy as np
from pyrunner.model import Model
ids = np.random.default_rng(7).integers(0, 300, 48)
with Model(sys.argv[1], threads=2, n_ctx=128, kv_type="f32") as m:
    s = m.session()
    out = np.concatenate([s.eval(ids[:40], all_logits=True), s.eval(ids[40:], all_logits=True)])
np.save(sys.argv[2], out)
"""


@pytest.fixture(scope="module")
def tiny_f32(tmp_path_factory) -> Path:
    from pyrunner import models
    out = tmp_path_factory.mktemp("gemm") / "tiny.gguf"
    models.make_model("tiny", str(out), recipe="f32", seed=5)
    return out


def _logits(path: Path, setting: str, out: Path) -> np.ndarray:
    env = dict(os.environ, STRATA_GEMM=setting, PYTHONPATH=str(ROOT))
    r = subprocess.run([sys.executable, "-c", _MODEL_SCRIPT, str(path), str(out)], env=env, cwd=ROOT,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    return np.load(out)


def test_model_on_the_gemm_matches_the_dot_products(tiny_f32, tmp_path):
    """F32 weights: both paths multiply floats in the same summation order (lane k % 8, k ascending:
    gemm.h, fmt_float.c), so the logits are the same bits whichever path every product takes (what
    batched sequences rely on: a product's column count must not change a row); on quantized weights
    the GEMM multiplies float activations, the dot path q8 ones, so STRATA_GEMM=1 must change them
    there (the GEMM path is wired), to the same logits up to the q8 rounding of the activations."""
    dots = _logits(tiny_f32, "0", tmp_path / "dots.npy")
    every = _logits(tiny_f32, "1", tmp_path / "gemm.npy")
    assert dots.shape == every.shape == (48, dots.shape[1])
    assert np.array_equal(dots, every), f"max |dlogit| {np.abs(dots - every).max():.3g}"
    from pyrunner import models
    q8 = tmp_path / "tiny-q8.gguf"
    models.make_model("tiny", str(q8), recipe="q8_0", seed=5)
    qd = _logits(q8, "0", tmp_path / "qdots.npy")
    qg = _logits(q8, "1", tmp_path / "qgemm.npy")
    d = np.abs(qd - qg).max()
    print(f"q8_0: max |dlogit| {d:.3g}, logits up to {np.abs(qd).max():.3g}")
    assert np.corrcoef(qd.ravel(), qg.ravel())[0, 1] > 0.9     # the same product, rounded differently
    assert not np.array_equal(qd, qg), "STRATA_GEMM changed nothing: is the GEMM path wired?"
