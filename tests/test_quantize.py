"""Quantizers (float -> blocks, native/src/quant/quantize*.c).

Q8_0, Q5_1 and MXFP4 must write exactly the bytes gguf.quants.quantize writes. The searched
quantizers (Q4_K, Q6_K, IQ4_NL, NVFP4, IQ2_XS) are held to llama.cpp's own quantizer
(ggml_quantize_chunk of llama-cpp-python, run in a child process; a declared test dependency:
these tests FAIL, not skip, without it): on the same rows their error may be at most RATIO_MAX times llama.cpp's.

Error measure: rel = sqrt(sum w (y - x)^2 / sum w x^2) over all rows, y = gguf.quants.dequantize
of the blocks, w = the importance matrix when one is given (it is what a quantizer with an
imatrix minimises: the expected output error of a matmul), else 1. Both quantizers are scored
with the same w. Data: 64 gaussian rows x 2560 ("gauss"), the same with 1% of the values
scaled by 8 ("outliers"); imatrix: none, or a fixed non-uniform one (weights over 5 decades).

Bound per type (rel <= bound on every data set above; measured values in the comment):

| type   | bound | measured rel: gauss / outliers, without .. with the imatrix |
|--------|-------|-------------------------------------------------------------|
| Q8_0   | 0.010 | 0.0054 / 0.0086                                             |
| Q6_K   | 0.028 | 0.0165 / 0.0241 .. 0.0145 / 0.0227                          |
| Q5_1   | 0.053 | 0.0379 / 0.0465                                             |
| Q4_K   | 0.100 | 0.0701 / 0.0872 .. 0.0626 / 0.0795                          |
| NVFP4  | 0.100 | 0.0815 / 0.0855 .. 0.0707 / 0.0769                          |
| IQ4_NL | 0.115 | 0.0735 / 0.1021 .. 0.0673 / 0.0956                          |
| MXFP4  | 0.165 | 0.1154 / 0.1460                                             |
| IQ2_XS | 0.450 | llama.cpp's: 0.300 / 0.405 .. 0.234 / 0.342 (bound = 1.1x)  |

(Q8_0, Q5_1 and MXFP4 ignore the imatrix, as gguf does.) Run with `pytest -s` to see the
measured values and ratios.
"""
from __future__ import annotations

import threading
import warnings

import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, quants

from model_oracles import ggml_quantize
from pyrunner import quant

BOUND = {"Q8_0": 0.010, "Q6_K": 0.028, "Q5_1": 0.053, "Q4_K": 0.100, "NVFP4": 0.100,
         "IQ4_NL": 0.115, "MXFP4": 0.165, "IQ2_XS": 0.450}
RATIO_MAX = 1.1
EXACT = ["Q8_0", "Q5_1", "MXFP4"]
SEARCHED = ["Q4_K", "Q6_K", "IQ4_NL", "NVFP4", "IQ2_XS"]
ROWS, N_PER_ROW = 64, 2560


# ---------------------------------------------------------------- data

def gauss_rows(seed=1):
    return np.random.default_rng(seed).standard_normal((ROWS, N_PER_ROW)).astype(np.float32)


def outlier_rows(seed=2):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((ROWS, N_PER_ROW)).astype(np.float32)
    x[rng.random(x.shape) < 0.01] *= 8.0
    return x


def nonuniform_imatrix(seed=3):
    """Positive weights spread over about five decades, as real activation statistics are."""
    return (np.random.default_rng(seed).uniform(0.05, 3.0, N_PER_ROW) ** 3).astype(np.float32)


DATA = {"gauss": gauss_rows, "outliers": outlier_rows}
IMATRIX = {"none": lambda: None, "imatrix": nonuniform_imatrix}


def dequant(type_name: str, blocks: bytes, shape) -> np.ndarray:
    raw = np.frombuffer(blocks, dtype=np.uint8).reshape(shape[0], -1)
    return quants.dequantize(raw, GGMLQuantizationType[type_name]).reshape(shape)


def rel_err(x: np.ndarray, y: np.ndarray, w: np.ndarray | None) -> float:
    w = np.ones(x.shape[-1]) if w is None else w.astype(np.float64)
    x64, y64 = x.astype(np.float64), y.astype(np.float64)
    return float(np.sqrt(np.sum(w * (y64 - x64) ** 2) / np.sum(w * x64 ** 2)))


# ---------------------------------------------------------------- llama.cpp oracle

@pytest.fixture(scope="module")
def ggml() -> dict:
    """llama.cpp's blocks for every (type, data, imatrix) case of test_error_vs_llama_cpp, made in one child
    process (tests/model_oracles.py): a crash of llama.cpp fails these tests with its message, pytest lives on."""
    keys = [(t, d, i) for t in SEARCHED for d in DATA for i in IMATRIX]
    try:
        blocks = ggml_quantize([(t, DATA[d](), IMATRIX[i]()) for t, d, i in keys])
    except (ImportError, OSError) as e:
        pytest.fail(f"llama-cpp-python==0.3.36 (test dependency) is not usable: {e}")
    return dict(zip(keys, blocks))


# ---------------------------------------------------------------- gguf-exact quantizers

def exact_cases():
    rng = np.random.default_rng(7)
    yield "gauss", rng.standard_normal((64, 256)).astype(np.float32)
    z = rng.standard_normal((16, 256)).astype(np.float32)
    z[:, ::3] = 0
    z[3] = 0
    z[4, :32] = -0.0
    yield "zeros", z
    for e in (-45, -40, -38, -30, -20, 20, 30, 37, 38):  # 1e38 * gauss overflows to inf: kept
        with np.errstate(over="ignore"):
            yield f"1e{e}", (rng.standard_normal((8, 256)) * 10.0 ** e).astype(np.float32)
    yield "subnormal", (rng.standard_normal((8, 256)) * 1e-39).astype(np.float32)
    yield "half_steps", (rng.integers(-300, 300, (32, 256)) * 0.5).astype(np.float32)  # ties
    yield "quarters", (rng.integers(-16, 16, (32, 256)) / 4.0).astype(np.float32)
    p2 = (2.0 ** rng.integers(-10, 10, (32, 256)) * rng.choice([-1, 1], (32, 256))).astype(np.float32)
    yield "powers_of_2", p2  # MXFP4's exponent is floor(log2(amax)): exact powers and just below
    yield "below_powers_of_2", np.nextafter(p2, np.float32(0))
    yield "positive", (np.abs(rng.standard_normal((16, 256))) + 1).astype(np.float32)
    yield "constant", np.full((4, 256), 3.3, np.float32)
    bits = rng.integers(0, 2 ** 32, (32, 256), dtype=np.uint64).astype(np.uint32).view(np.float32)
    yield "random_bits", np.where(np.isfinite(bits), bits, 0).astype(np.float32)
    nf = rng.standard_normal((6, 64)).astype(np.float32)
    nf[0, 3], nf[1, 40], nf[2, :32], nf[3, 7], nf[4, 9], nf[5, 33] = np.inf, -np.inf, np.nan, np.nan, np.inf, -np.inf
    yield "non_finite", nf


@pytest.mark.parametrize("type_name", EXACT)
@pytest.mark.parametrize("case", [name for name, _ in exact_cases()])
def test_bit_identical_to_gguf(type_name, case):
    x = dict(exact_cases())[case]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # gguf's casts of inf/nan
        want = quants.quantize(x, GGMLQuantizationType[type_name]).tobytes()
    got = quant.quantize(type_name, x)
    if got != want:
        a, b = np.frombuffer(got, np.uint8), np.frombuffer(want, np.uint8)
        k = np.flatnonzero(a != b)
        bs, ts = GGML_QUANT_SIZES[GGMLQuantizationType[type_name]]
        pytest.fail(f"{len(k)} bytes differ; first at byte {k[0]} (block {k[0] // ts}, offset "
                    f"{k[0] % ts}): got {a[k[0]]:#04x}, gguf {b[k[0]]:#04x}")
    # gguf has no importance matrix: ours must ignore it, not change the bytes
    assert quant.quantize(type_name, x, imatrix=np.linspace(0.1, 5, x.shape[1], dtype=np.float32)) == want


@pytest.mark.parametrize("type_name", EXACT)
@pytest.mark.parametrize("data", list(DATA))
def test_exact_type_error_bound(type_name, data):
    x = DATA[data]()
    rel = rel_err(x, dequant(type_name, quant.quantize(type_name, x), x.shape), None)
    print(f"\n{type_name:7s} {data:9s} rel {rel:.4f} (bound {BOUND[type_name]})")
    assert rel <= BOUND[type_name]


# ---------------------------------------------------------------- searched quantizers vs llama.cpp

@pytest.mark.parametrize("type_name", SEARCHED)
@pytest.mark.parametrize("data", list(DATA))
@pytest.mark.parametrize("imat", list(IMATRIX))
def test_error_vs_llama_cpp(ggml, type_name, data, imat):
    x, im = DATA[data](), IMATRIX[imat]()
    info = quant.type_info(type_name)
    assert info["has_quantize"], f"Strata has no {type_name} quantizer"
    ours = rel_err(x, dequant(type_name, quant.quantize(type_name, x, imatrix=im), x.shape), im)
    ref = rel_err(x, dequant(type_name, ggml[type_name, data, imat], x.shape), im)
    ratio = ours / ref
    print(f"\n{type_name:7s} {data:9s} {imat:8s} rel {ours:.4f}  llama.cpp {ref:.4f}  ratio {ratio:.3f}")
    assert ratio <= RATIO_MAX, f"{type_name}: error {ours:.5f} is {ratio:.3f}x llama.cpp's {ref:.5f}"
    assert ours <= BOUND[type_name]


# ---------------------------------------------------------------- properties of every quantizer

ALL = EXACT + SEARCHED


@pytest.mark.parametrize("type_name", ALL)
def test_deterministic_and_row_independent(type_name):
    """Same bytes on every call, and a row's blocks do not depend on the other rows (the
    converter quantizes row ranges in parallel)."""
    x, im = gauss_rows(5)[:8], nonuniform_imatrix(6)
    for imatrix in (None, im):
        whole = quant.quantize(type_name, x, imatrix=imatrix)
        assert quant.quantize(type_name, x, imatrix=imatrix) == whole
        assert b"".join(quant.quantize(type_name, x[r], imatrix=imatrix) for r in range(len(x))) == whole


@pytest.mark.parametrize("type_name", ALL)
def test_concurrent_calls(type_name):
    """cffi drops the GIL during the call, so these run the quantizer on several threads at once."""
    inputs = [gauss_rows(10 + k)[:16] for k in range(4)]
    want = [quant.quantize(type_name, v) for v in inputs]
    got = [None] * len(inputs)

    def work(k):
        for _ in range(3):
            got[k] = quant.quantize(type_name, inputs[k])

    threads = [threading.Thread(target=work, args=(k,)) for k in range(len(inputs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert got == want


@pytest.mark.parametrize("type_name", ["Q4_K", "Q6_K", "IQ4_NL", "NVFP4"])
@pytest.mark.parametrize("kind", ["zeros", "constant", "tiny", "huge", "one_spike", "non_finite"])
def test_edge_inputs(type_name, kind):
    """Degenerate rows give the right size and finite values; zeros stay zeros."""
    rng = np.random.default_rng(11)
    x = rng.standard_normal((4, 512)).astype(np.float32)
    if kind == "zeros":
        x[:] = 0
    elif kind == "constant":
        x[:] = -0.75
    elif kind == "tiny":
        x *= 1e-30
    elif kind == "huge":
        x *= 1e9  # beyond what an fp16 super-scale can reach: must saturate, not overflow
    elif kind == "one_spike":
        x[:] = 0
        x[:, 77] = 5.0
    elif kind == "non_finite":
        x[0, 3], x[1, 100], x[2, 200:260] = np.nan, np.inf, -np.inf
    blocks = quant.quantize(type_name, x)
    assert len(blocks) == quant.row_size(type_name, 512) * 4
    if kind == "non_finite":
        return  # any bytes will do; it must not crash (the sanitizer build checks for UB)
    y = dequant(type_name, blocks, x.shape)
    assert np.all(np.isfinite(y))
    if kind == "zeros":
        assert np.all(y == 0)
    elif kind in ("constant", "one_spike"):
        assert rel_err(x, y, None) <= BOUND[type_name]


@pytest.mark.parametrize("type_name", ["Q4_K", "Q6_K", "IQ4_NL", "NVFP4"])
def test_imatrix_zero_groups(type_name):
    """Columns an imatrix marks unused (zero weight over a whole group) are still quantized as
    well as without an imatrix, and the weighted columns no worse than with the full imatrix."""
    x = gauss_rows(12)[:16]
    im = nonuniform_imatrix(13)
    im[:512] = 0.0
    y = dequant(type_name, quant.quantize(type_name, x, imatrix=im), x.shape)
    y0 = dequant(type_name, quant.quantize(type_name, x), x.shape)
    assert rel_err(x[:, :512], y[:, :512], None) <= 1.001 * rel_err(x[:, :512], y0[:, :512], None)
    assert rel_err(x[:, 512:], y[:, 512:], im[512:]) <= BOUND[type_name]
