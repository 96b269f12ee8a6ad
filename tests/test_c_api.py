"""The C API for applications: tools/examples/generate.c is compiled against strata.h and the
library under test, and run on a tiny model (two sessions on two threads); its greedy tokens
must equal pyrunner's; tools/examples/batch.c runs several prompts in one strata_batch_eval per step
and must give each prompt's tokens alone. The C sampler is checked distributionally against pyrunner.sampling
(same chain, same survivors, frequencies within sampling error)."""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from pyrunner import models
from pyrunner._native import LIB_PATH, check, ffi, lib
from pyrunner.model import Model
from pyrunner.sampling import make_sampler

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> str:
    out = tmp_path_factory.mktemp("c_api") / "tiny.gguf"
    models.make_model("tiny", str(out), recipe="f32", seed=5)
    return str(out)


def _build(tmp_path_factory, name: str) -> Path:
    cc = shutil.which("cc") or shutil.which("gcc")
    assert cc, "a C compiler is needed to build the example"
    exe = tmp_path_factory.mktemp("c_api") / name
    lib_dir = os.path.dirname(LIB_PATH)
    r = subprocess.run([cc, "-O2", "-Wall", "-Wextra", "-Werror", str(ROOT / "tools" / "examples" / f"{name}.c"),
                        "-I", str(ROOT / "native" / "include"), LIB_PATH, "-lpthread", f"-Wl,-rpath,{lib_dir}",
                        "-o", str(exe)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return exe


@pytest.fixture(scope="module")
def example(tmp_path_factory) -> Path:
    return _build(tmp_path_factory, "generate")


def _run(exe, *args) -> list[list[int]]:
    r = subprocess.run([str(exe), *map(str, args)], capture_output=True, text=True, errors="replace", timeout=300,
                       env=dict(os.environ, LD_LIBRARY_PATH=os.path.dirname(LIB_PATH)))
    assert r.returncode == 0, r.stderr
    return [list(map(int, line.split()[1:])) for line in r.stdout.splitlines() if line.startswith("tokens:")]


def _python_greedy(m, prompt: str, n: int) -> list[int]:
    """The examples' greedy rule in pyrunner: argmax (lowest id on ties), stop after the file's EOS."""
    s = m.session()
    logits = s.eval(m.tokenize(prompt))
    eos = m.metadata.get("tokenizer.ggml.eos_token_id")
    want = []
    for _ in range(n):
        t = int(np.argmax(logits))
        want.append(t)
        if t == eos:
            break
        logits = s.eval([t])
    return want


def test_example_matches_python_greedy(tiny, example):
    prompt = "The quick brown fox"
    runs = _run(example, tiny, prompt, "-n", 20, "--temp", 0, "--parallel", 2)
    assert len(runs) == 2 and runs[0] == runs[1] and len(runs[0]) >= 1
    assert runs[0] == _python_greedy(Model(tiny, n_ctx=4096), prompt, 20)


def test_example_sampling_is_reproducible(tiny, example):
    a = _run(example, tiny, "hello", "-n", 12, "--temp", 0.9, "--seed", 7, "--parallel", 2)
    b = _run(example, tiny, "hello", "-n", 12, "--temp", 0.9, "--seed", 7)
    assert a[0] == a[1] == b[0]


def test_example_reports_errors(example, tmp_path):
    bad = tmp_path / "not.gguf"
    bad.write_bytes(b"GGUF but not really")
    r = subprocess.run([str(example), str(bad), "x"], capture_output=True, text=True)
    assert r.returncode == 1 and str(bad) in r.stderr


def _c_sampler(**kw):
    p = ffi.new("strata_sampler_params *", lib.strata_sampler_default_params())
    for k, v in kw.items():
        setattr(p, k, v)
    out = ffi.new("strata_sampler **")
    check(lib.strata_sampler_init(p, out))
    return ffi.gc(out[0], lib.strata_sampler_free)


def _draw(s, logits: np.ndarray) -> int:
    tok = ffi.new("int32_t *")
    x = np.ascontiguousarray(logits, dtype=np.float32)
    check(lib.strata_sampler_sample(s, ffi.cast("const float *", x.ctypes.data), x.size, tok))
    return tok[0]


@pytest.mark.parametrize("kw", [dict(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0),
                                dict(temperature=0.7, top_k=5, top_p=1.0, min_p=0.0),
                                dict(temperature=1.3, top_k=0, top_p=0.8, min_p=0.0),
                                dict(temperature=1.0, top_k=12, top_p=0.9, min_p=0.05)])
def test_c_sampler_matches_python_distribution(kw):
    rng = np.random.default_rng(11)
    logits = (rng.standard_normal(40) * 2).astype(np.float32)
    py = make_sampler(temperature=kw["temperature"], top_k=kw["top_k"], top_p=kw["top_p"], min_p=kw["min_p"])
    want = py.distribution(logits)
    s = _c_sampler(seed=3, **kw)
    n = 20000
    counts = np.bincount([_draw(s, logits) for _ in range(n)], minlength=40)
    assert set(np.flatnonzero(counts)) <= set(np.flatnonzero(want > 0)), "drew a token the chain removes"
    sigma = np.sqrt(want * (1 - want) / n)
    assert np.all(np.abs(counts / n - want) <= 5 * sigma + 1e-3)


def test_c_sampler_greedy_and_errors():
    logits = np.array([0.5, 3.0, 3.0, -1.0], dtype=np.float32)
    assert lib.strata_sample_greedy(ffi.cast("const float *", logits.ctypes.data), 4) == 1
    assert _draw(_c_sampler(temperature=0.0), logits) == 1
    p = ffi.new("strata_sampler_params *", lib.strata_sampler_default_params())
    p.top_p = 0.0
    with pytest.raises(Exception, match="top_p"):
        check(lib.strata_sampler_init(p, ffi.new("strata_sampler **")))
    s = _c_sampler(temperature=1.0)
    with pytest.raises(Exception, match="no finite logit"):
        _draw(s, np.full(4, -np.inf, dtype=np.float32))


def test_batch_example_gives_each_prompt_its_tokens_alone(tiny, tmp_path_factory):
    exe = _build(tmp_path_factory, "batch")
    prompts = ["The quick brown fox", "hello", "a much longer prompt than the others, with many words in it"]
    r = subprocess.run([str(exe), tiny, *prompts, "-n", "12"], capture_output=True, text=True, errors="replace",
                       timeout=300)
    assert r.returncode == 0, r.stderr
    got = [list(map(int, line.split()[1:])) for line in r.stdout.splitlines() if line.startswith("tokens:")]
    steps = int(r.stdout.rsplit("steps:", 1)[1])
    assert steps <= 12                       # one forward per step for all three
    m = Model(tiny, n_ctx=4096)
    for p, toks in zip(prompts, got):
        assert toks == _python_greedy(m, p, 12)
    bad = subprocess.run([str(exe), tiny], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "usage" in bad.stderr
