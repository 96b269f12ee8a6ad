"""The `cuda` expert device (issue 5; native/src/device/device_cuda.cu, kernels/cuda/blocks.cuh).

Without a GPU (here and in CI, wherever nvcc exists):
- the block decoders the CUDA kernels use (blocks.cuh, __host__ __device__) are compiled by nvcc as
  host code and give, bit for bit, what the library's C dequantizers give on random valid blocks of
  every type the loader accepts (odd block counts; subnormal and huge scales included);
- the kernels' dot-product arithmetic (gemv.cuh: activations quantized per block as the CPU's matmul
  does, then 32 lanes of w * x' sums folded as the warp folds them) is within float rounding of
  strata_matmul;
- `--device cuda` fails with a message (no GPU / not built with CUDA), never a crash.
With a GPU (skipped otherwise; tools/device_check.sh runs them):
- the decoders on the device equal the host's, bit for bit; the matrix kernels match strata_matmul and
  equal, bit for bit, their own arithmetic run on the host;
- cuda and cpu give the same tokens and logits (<= 1e-3) over greedy steps on `tiny` in every recipe and
  on `small` quantized q4_k_m / iq2_xs (so Q8_0, Q5_1, Q4_K, IQ2_XS, IQ4_NL and NVFP4 experts run),
  the cache hits, the event log orders copies before the computations that read them, the link probe
  reports a positive GB/s. The same check runs on the `sim` device everywhere (the cuda device is the sim's
  engine machinery with GPU work), so the GPU test's own logic is known to pass.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from model_oracles import greedy_run as _greedy
from pyrunner import quant
from pyrunner._native import StrataError, ffi, lib

ROOT = Path(__file__).resolve().parent.parent
NVCC = shutil.which("nvcc")

# type: (ggml id, values per block, bytes per block, offsets of fp16 scales, activation format):
# every type the loader accepts (blocks.cuh decodes them all)
TYPES = {
    "Q4_0": (2, 32, 18, (0,), 1),
    "Q4_1": (3, 32, 20, (0, 2), 1),
    "Q5_0": (6, 32, 22, (0,), 1),
    "Q5_1": (7, 32, 24, (0, 2), 1),
    "Q8_0": (8, 32, 34, (0,), 1),
    "IQ4_NL": (20, 32, 18, (0,), 1),
    "MXFP4": (39, 32, 17, (), 1),
    "NVFP4": (40, 64, 36, (), 1),
    "Q2_K": (10, 256, 84, (80, 82), 2),
    "Q3_K": (11, 256, 110, (108,), 2),
    "Q4_K": (12, 256, 144, (0, 2), 2),
    "Q5_K": (13, 256, 176, (0, 2), 2),
    "Q6_K": (14, 256, 210, (208,), 2),
    "IQ4_XS": (23, 256, 136, (0,), 2),
    "IQ2_XXS": (16, 256, 66, (0,), 2),
    "IQ2_XS": (17, 256, 74, (0,), 2),
    "IQ3_XXS": (18, 256, 98, (0,), 2),
    "F16": (1, 1, 2, None, 0),
    "BF16": (30, 1, 2, None, 0),
    "F32": (0, 1, 4, None, 0),
}


def _gpu_count() -> int:
    reason = ffi.new("const char **")
    return int(lib.strata_cuda_device_count(reason))


needs_nvcc = pytest.mark.skipif(NVCC is None, reason="no nvcc")
needs_gpu = pytest.mark.skipif(NVCC is None or _gpu_count() <= 0, reason="no CUDA device")


@pytest.fixture(scope="module")
def checker(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("cuda_check")
    subprocess.run([sys.executable, str(ROOT / "native/cmake/gen_quant_tables.py"), str(d / "quant_tables.h")],
                   check=True)
    exe = d / "cuda_blocks_check"
    r = subprocess.run([NVCC, "-O1", "-Xcompiler", "-Wall,-Wextra", "-I", str(ROOT / "native/src"), "-I", str(d),
                        "-o", str(exe), str(ROOT / "tests/native/cuda_blocks_check.cu")],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "warning" not in r.stderr.lower(), r.stderr
    return exe


def _halves(rng, n) -> np.ndarray:
    """Finite fp16 scales: mostly ordinary, some subnormal, some large."""
    v = rng.uniform(-2.0, 2.0, n)
    kind = rng.integers(0, 8, n)
    v = np.where(kind == 0, v * 1e-6, np.where(kind == 1, v * 3e3, v))
    return v.astype(np.float16).view(np.uint16)


def random_blocks(name: str, n_blocks: int, rng, sane: bool = False) -> bytes:
    """Random valid blocks; sane: block scales that keep dot products finite (MXFP4 exponents near 1)."""
    tid, bs, nbytes, scales, _ = TYPES[name]
    if name == "F32":
        return rng.standard_normal(n_blocks).astype(np.float32).tobytes()
    if name == "F16":
        return _halves(rng, n_blocks).tobytes()
    if name == "BF16":   # the top halves of floats: finite, with their signs and exponents
        return (rng.standard_normal(n_blocks).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16).tobytes()
    raw = rng.integers(0, 256, (n_blocks, nbytes), dtype=np.uint8)
    for off in scales:
        raw[:, off:off + 2] = _halves(rng, n_blocks).view(np.uint8).reshape(n_blocks, 2)
    if sane and name == "MXFP4":
        raw[:, 0] = rng.integers(118, 136, n_blocks)
    return raw.tobytes()


def _run(exe: Path, args: list, data: bytes) -> np.ndarray:
    r = subprocess.run([str(exe)] + [str(a) for a in args], input=data, capture_output=True)
    assert r.returncode == 0, r.stderr.decode()
    return np.frombuffer(r.stdout, dtype=np.float32)


def _same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and np.array_equal(a.view(np.uint32), b.view(np.uint32))


@needs_nvcc
@pytest.mark.parametrize("name", list(TYPES))
def test_host_decoders_equal_the_c_dequantizers(checker, name):
    rng = np.random.default_rng(TYPES[name][0])
    bs = TYPES[name][1]
    for n_blocks in (1, 3, 7, 33):
        n = n_blocks * bs if bs > 1 else n_blocks * 5
        data = random_blocks(name, n // bs, rng)
        got = _run(checker, ["dq", TYPES[name][0], n], data)
        want = quant.dequantize(name, data, n, isa="scalar")
        if not _same_bits(got, want):
            bad = np.flatnonzero(got.view(np.uint32) != want.view(np.uint32))
            pytest.fail(f"{name}: {bad.size} of {n} values differ, first at {bad[0]}: {got[bad[0]]} != {want[bad[0]]}")


@needs_nvcc
@pytest.mark.parametrize("name", list(TYPES))
def test_host_dot_products_match_strata_matmul(checker, name):
    """The kernels' arithmetic (blocks.cuh's activation quantization + float sums) against the CPU's."""
    rng = np.random.default_rng(100 + TYPES[name][0])
    tid, bs, _, _, act = TYPES[name]
    R = 5
    K = bs * (3 if bs == 256 else 5) if bs > 1 else 96   # e.g. 160 for 32-value blocks: not a multiple of 256
    if bs == 32:
        K = 640                                          # the fallback width of real expert down rows
    w = random_blocks(name, R * K // bs, rng, sane=True)
    x = rng.standard_normal(K).astype(np.float32)
    got = _run(checker, ["dot", tid, act, R, K], w + x.tobytes())
    want = quant.matmul(name, w, R, K, x, isa="scalar")
    wf = quant.dequantize(name, w, R * K, isa="scalar").reshape(R, K).astype(np.float64)
    scale = np.abs(wf) @ np.abs(x.astype(np.float64)) + 1e-30
    err = np.abs(got.astype(np.float64) - want) / scale
    assert err.max() <= 1e-5, f"{name}: relative error {err.max():.3g} (got {got}, want {want})"


def test_cuda_device_refuses_cleanly_without_a_gpu(tmp_path):
    if _gpu_count() > 0:
        pytest.skip("a CUDA device is present")
    from pyrunner import models
    from pyrunner.model import Model
    path = tmp_path / "tiny.gguf"
    models.make_model("tiny", str(path), recipe="q8_0", seed=3)
    with pytest.raises(StrataError) as e:
        Model(str(path), threads=1, n_ctx=64, device="cuda")
    msg = str(e.value)
    assert "device cuda" in msg and ("without CUDA" in msg or "GPU" in msg or "CUDA" in msg), msg


# ------------------------------------------------------------------------------------ with a GPU

@needs_gpu
@pytest.mark.parametrize("name", [n for n in TYPES])
def test_device_decoders_equal_the_host(checker, name):
    rng = np.random.default_rng(7 + TYPES[name][0])
    bs = TYPES[name][1]
    n = bs * 37 if bs > 1 else 999
    data = random_blocks(name, n // bs, rng)
    host = _run(checker, ["dq", TYPES[name][0], n], data)
    dev = _run(checker, ["dq", TYPES[name][0], n, "--gpu"], data)
    assert _same_bits(host, dev), f"{name}: device decode differs from host decode"


@needs_gpu
@pytest.mark.parametrize("name", list(TYPES))
def test_device_kernels_match_strata_matmul(checker, name):
    """k_act_quant + k_matvec on the GPU, 3 activation rows, against the CPU's matmul."""
    rng = np.random.default_rng(200 + TYPES[name][0])
    tid, bs, _, _, act = TYPES[name]
    R, NT = 37, 3
    K = 640 if bs == 32 else (bs * 3 if bs > 1 else 96)
    w = random_blocks(name, R * K // bs, rng, sane=True)
    x = rng.standard_normal((NT, K)).astype(np.float32)
    got = _run(checker, ["dot", tid, act, R, K, NT, "--gpu"], w + x.tobytes()).reshape(NT, R)
    want = quant.matmul(name, w, R, K, x, isa="scalar")
    wf = quant.dequantize(name, w, R * K, isa="scalar").reshape(R, K).astype(np.float64)
    scale = np.abs(x.astype(np.float64)) @ np.abs(wf).T + 1e-30
    err = np.abs(got.astype(np.float64) - want) / scale
    assert err.max() <= 1e-5, f"{name}: relative error {err.max():.3g}"


@needs_gpu
@pytest.mark.parametrize("name", list(TYPES))
def test_device_kernels_equal_their_host_run(checker, name):
    """k_gemv_act + k_gemv on the GPU give bit for bit what the same source gives on the host (the host
    op check, tests/native/test_cuda_ops_gemv.c, stands on this)."""
    rng = np.random.default_rng(300 + TYPES[name][0])
    tid, bs, _, _, act = TYPES[name]
    R, NT = 37, 3
    K = 2560 if bs > 1 else 100
    w = random_blocks(name, R * K // bs, rng, sane=True)
    x = rng.standard_normal((NT, K)).astype(np.float32)
    host = _run(checker, ["dot", tid, act, R, K, NT], w + x.tobytes())
    dev = _run(checker, ["dot", tid, act, R, K, NT, "--gpu"], w + x.tobytes())
    assert _same_bits(host, dev), f"{name}: device sums differ from the host's"


MODEL_CASES = [("tiny", "q8_0"), ("tiny", "q4_k_m"), ("tiny", "iq2_xs"), ("tiny", "nvfp4"),
               ("small", "q4_k_m"), ("small", "iq2_xs"), ("small", "nvfp4")]


@pytest.fixture(scope="module")
def model_files(tmp_path_factory):
    from pyrunner import models
    d = tmp_path_factory.mktemp("cuda_models")
    made = {}

    def get(preset, recipe):
        key = (preset, recipe)
        if key not in made:
            pre = os.environ.get("STRATA_CUDA_MODEL_DIR")
            cand = Path(pre) / f"{preset}-{recipe}.gguf" if pre else None
            if cand is not None and cand.exists():
                made[key] = str(cand)
            else:
                out = d / f"{preset}-{recipe}.gguf"
                models.make_model(preset, str(out), recipe=recipe, seed=11)
                made[key] = str(out)
        return made[key]
    return get


def _check_device(path: str, device: str, tmp_path: Path) -> None:
    from pyrunner.model import Model
    steps = 16
    prompt = list(np.random.default_rng(1).integers(0, 250, 12))
    want_toks, want = _greedy(Model(path, threads=2, n_ctx=256, kv_type="f32"), prompt, steps)
    m = Model(path, threads=2, n_ctx=256, kv_type="f32", device=device, cache_gib=1.0, pcie_frac=0.5, tail_skip=0)
    assert f"device {device}" in m.offload_log, m.offload_log
    m.device_events()
    got_toks, got = _greedy(m, prompt, steps)
    log = tmp_path / "events.jsonl"
    m.device_events(log)
    st = m.offload_stats()
    err = np.abs(got - want).max()
    assert err <= 1e-3, f"{path} on {device}: logits differ by {err:.3g}"
    assert got_toks == want_toks
    assert st["cache_hits"] > 0
    assert st["probe_gbps"] > 0
    ev = [json.loads(line) for line in log.read_text().splitlines()]
    copies = {e["seq"]: e for e in ev if e["engine"] == "copy"}
    computes = [e for e in ev if e["engine"] == "compute"]
    assert copies and computes
    for c in computes:                       # a computation starts after the copy it names ended
        if c["after"]:
            assert copies[c["after"]]["t1"] <= c["t0"]
    assert any(c["after"] for c in computes), "no computation waited for a copy"


def test_the_device_check_on_sim(model_files, tmp_path):
    """The GPU test's own logic, on the sim device (same engine machinery), so it is known to pass."""
    _check_device(model_files("tiny", "q8_0"), "sim", tmp_path)


@needs_gpu
@pytest.mark.parametrize("preset,recipe", MODEL_CASES)
def test_cuda_gives_the_cpu_numbers(model_files, preset, recipe, tmp_path):
    _check_device(model_files(preset, recipe), "cuda", tmp_path)
