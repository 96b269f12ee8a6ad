"""Builds the libFuzzer targets (native/fuzz, clang + ASan + UBSan, coverage-guided over the
library) and fuzzes every parser for a bounded time:
  - fuzz_gguf: the GGUF reader, seeded with valid files from tools/make_gguf_corpus.py, for
    STRATA_FUZZ_SECONDS (default 60);
  - fuzz_tokenizer: the tokenizer's encoder and vocabulary parser, seeded with texts and a
    vocabulary, for STRATA_FUZZ_TOKENIZER_SECONDS (default 30);
  - fuzz_model: the qwen4exp loader (hyperparameters, tensor shapes) and a short forward on
    whatever loads, seeded with `micro` preset models, for STRATA_FUZZ_MODEL_SECONDS (default 30);
  - fuzz_ple_sidecar: the packed PLE table's sidecar JSON (field readers and checks), seeded with
    sidecars as pack-ple writes them, for STRATA_FUZZ_SIDECAR_SECONDS (default 15);
  - fuzz_sampler: the sampling chain (strata_sampler_draw, strata_sampler_sample) on settings and
    logits as a request or a C application sends them, for STRATA_FUZZ_SAMPLER_SECONDS (default 15).
Any crash, sanitizer report, timeout or OOM fails the test; the offending inputs are kept
under build/fuzz/artifacts for reproduction (`build/fuzz/fuzz/<target> <file>`)."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BUILD = ROOT / "build" / "fuzz"
INSTALL_HINT = "apt-get install clang libclang-rt-14-dev"
TARGETS = ("fuzz_gguf", "fuzz_tokenizer", "fuzz_model", "fuzz_ple_sidecar", "fuzz_sampler")

pytestmark = pytest.mark.slow


def _run(cmd, **kw):
    r = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, **kw)
    if r.returncode != 0:
        tail = (r.stdout + r.stderr)[-4000:]
        hint = f"\n(the fuzzer needs clang with libFuzzer: {INSTALL_HINT})" if "fuzzer" in tail.lower() else ""
        pytest.fail(f"{' '.join(map(str, cmd))} failed ({r.returncode}):\n{tail}{hint}")
    return r


@pytest.fixture(scope="module")
def fuzzers() -> Path:
    """Configures and builds the targets once (they share the instrumented library)."""
    clang = shutil.which("clang")
    if clang is None:
        pytest.fail(f"clang is not installed; the fuzzers need it: {INSTALL_HINT}")
    cmake = shutil.which("cmake")
    assert cmake, "cmake is needed to build the fuzzers"
    jobs = os.environ.get("STRATA_BUILD_JOBS", "2")
    # STRATA_NATIVE off: no -march/-mtune=native. With -mtune=native on a Zen 3 host clang 14 spent over 10
    # minutes on avx512_iq.c alone under these sanitizers (the whole build: 715 s, 191 s without); the
    # fuzzers test what the code does with an input, which the CPU tuning does not change
    _run([cmake, "-S", ROOT / "native", "-B", BUILD, f"-DCMAKE_C_COMPILER={clang}", "-DSTRATA_FUZZ=ON",
          "-DSTRATA_NATIVE=OFF", "-DSTRATA_CUDA=OFF", "-DCMAKE_BUILD_TYPE=RelWithDebInfo",
          f"-DPython3_EXECUTABLE={sys.executable}"])
    _run([cmake, "--build", BUILD, "--target", *TARGETS, "-j", jobs])
    for name in TARGETS:
        assert (BUILD / "fuzz" / name).is_file(), f"{name} was not built"
    return BUILD / "fuzz"


def _fuzz(fuzzer: Path, seeds: Path, seconds: int, tmp_path: Path, max_len: int = 65536):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    artifacts = tmp_path / "artifacts"
    artifacts.mkdir()
    # libFuzzer's -rss_limit_mb reads getrusage's ru_maxrss, and Linux keeps a process's peak RSS across
    # fork and exec: started from pytest straight away, the fuzzer begins at the suite's own peak (2,764 MB
    # on one host, late in the suite) and reports an out-of-memory on its first input. A shell between them
    # forks the fuzzer (the command is not its last) from a small process, so the limit is the fuzzer's own.
    args = [str(fuzzer), f"-max_total_time={seconds}", f"-max_len={max_len}", "-timeout=10", "-rss_limit_mb=2048",
            f"-artifact_prefix={artifacts}/", "-print_final_stats=1", str(corpus), str(seeds)]
    proc = subprocess.Popen(["/bin/sh", "-c", '"$@"; exit $?', "sh", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=seconds + 300)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)                 # the shell and the fuzzer it forked
        out, err = proc.communicate()
    r = subprocess.CompletedProcess(args, proc.returncode, out, err)
    # a slow-unit file is libFuzzer's hint that one input took > 10 s once (on a shared VM a stall can do
    # that); a real hang is a timeout (-timeout=10, a crash artifact): only crashes, leaks, timeouts and
    # OOMs fail the test, slow units are kept for a look
    found = sorted(p.name for p in artifacts.iterdir() if not p.name.startswith("slow-unit-"))
    slow = sorted(p.name for p in artifacts.iterdir() if p.name.startswith("slow-unit-"))
    if slow:
        keep = BUILD / "artifacts"
        keep.mkdir(exist_ok=True)
        for name in slow:
            shutil.copy(artifacts / name, keep / f"{fuzzer.name}-{name}")
        print(f"{fuzzer.name}: {len(slow)} slow unit(s) kept in {keep}")
    if r.returncode != 0 or found:
        keep = BUILD / "artifacts"
        keep.mkdir(exist_ok=True)
        for p in artifacts.iterdir():
            shutil.copy(p, keep / f"{fuzzer.name}-{p.name}")
        pytest.fail(f"{fuzzer.name} exited {r.returncode}, artifacts {found} (copied to {keep}):\n{r.stderr[-6000:]}")
    assert "Done" in r.stderr, r.stderr[-2000:]


def test_fuzz_gguf(fuzzers, tmp_path):
    seeds = tmp_path / "seeds"
    _run([sys.executable, ROOT / "tools" / "make_gguf_corpus.py", seeds])
    assert len(list(seeds.glob("*.gguf"))) >= 5
    _fuzz(fuzzers / "fuzz_gguf", seeds, int(os.environ.get("STRATA_FUZZ_SECONDS", "60")), tmp_path)


def test_fuzz_tokenizer(fuzzers, tmp_path):
    seeds = tmp_path / "seeds"
    seeds.mkdir()
    texts = ["hello world", "Hello, World!\n\n  x = 1  # 注释\r\n", "日本語のテキスト、한국어 😀👍🏽",
             "e\u0301 a\u0308 \u0915\u093f", "<|im_start|>user\nhi<tool>", "123456 3.14 ٣", "\t \u00a0\u2003end  "]
    for i, text in enumerate(texts):
        for mode in (0, 1, 4, 5):  # qwen2/qwen35 x parse_special off/on
            (seeds / f"text{i}-{mode}").write_bytes(bytes([mode]) + text.encode())
    (seeds / "invalid-utf8").write_bytes(b"\x00\xff\xfe\xc3\x28\xe2\x82\x80abc\xf0\x90")
    vocab = [b"a", b"b", b"ab", b"\xc4\xa0", b"<s>"]
    merges = [b"a b", b"ab \xc4\xa0"]
    (seeds / "vocab").write_bytes(bytes([3, len(vocab) - 1]) + b"\x00".join(vocab + merges))
    _fuzz(fuzzers / "fuzz_tokenizer", seeds, int(os.environ.get("STRATA_FUZZ_TOKENIZER_SECONDS", "30")), tmp_path)


def test_fuzz_model(fuzzers, tmp_path):
    seeds = tmp_path / "seeds"
    seeds.mkdir()
    for recipe in ("f32", "q8_0"):
        _run([sys.executable, ROOT / "tools" / "make_model.py", "micro", "-o", seeds / f"micro-{recipe}.gguf",
              "--recipe", recipe])
    _run([sys.executable, ROOT / "tools" / "make_model.py", "micro", "-o", seeds / "micro-mtp.gguf",
          "--recipe", "q8_0", "--mtp"])
    _fuzz(fuzzers / "fuzz_model", seeds, int(os.environ.get("STRATA_FUZZ_MODEL_SECONDS", "30")), tmp_path,
          max_len=200000)


def test_fuzz_ple_sidecar(fuzzers, tmp_path):
    from pyrunner.ple import FORMAT
    seeds = tmp_path / "seeds"
    seeds.mkdir()
    good = {"format": FORMAT, "table": "ple_nvfp4.bin", "source": "ckpt sha256:0123456789abcdef", "total_rows": 1000,
            "num_shards": 3, "rows_per_shard": 400, "shard_rows": [400, 400, 200], "row_dim": 160, "code_bytes": 80,
            "scale_bytes": 10, "row_width": 90, "global_scales": [0.5, 1e-3, 2.0], "file_bytes": 90000}
    variants = [good, dict(good, num_shards=2.5), dict(good, global_scales=[0.5, -1, 2]), dict(good, total_rows=1201),
                dict(good, row_dim=64, code_bytes=32, scale_bytes=4, row_width=36), dict(good, source="a\\\"b")]
    for i, v in enumerate(variants):
        text = json.dumps(v, indent=i % 2 * 2).encode()
        (seeds / f"sidecar{i}").write_bytes(b"\x00" + text)
        (seeds / f"sidecar{i}-w64").write_bytes(b"\x08" + text)     # first byte 8: rows of 64 values
    _fuzz(fuzzers / "fuzz_ple_sidecar", seeds, int(os.environ.get("STRATA_FUZZ_SIDECAR_SECONDS", "15")), tmp_path)


def test_fuzz_sampler(fuzzers, tmp_path):
    import numpy as np
    seeds = tmp_path / "seeds"
    seeds.mkdir()
    rng = np.random.default_rng(0)
    settings = [bytes([40, 0, 0, 0, 0, 0, 2, 18, 9, 7]) + bytes(6),      # k 40, p 0.95, a small min-p, t ~0.01
                bytes([0, 0, 0, 0, 1, 3, 1, 3, 2, 2]) + bytes(6),        # k 3, top_p 0, min_p 1e-12, t 1e-30
                bytes([0, 0, 0, 0, 0, 0, 0, 0, 48, 1]) + bytes(range(6))]  # every filter off
    vectors = [(rng.standard_normal(64) * 3).astype(np.float32), np.zeros(17, np.float32),
               np.array([1, np.nan, np.inf, -np.inf, 1, 2, 2, -1e-45], np.float32),
               rng.integers(-2, 3, 300).astype(np.float32),
               np.array([0, 5.8e-39, 1.17e-38, 1e-40, 2.3e-38], np.float32)]   # one log-probability: ties by id
    for i, st in enumerate(settings):
        for j, v in enumerate(vectors):
            (seeds / f"s{i}-v{j}").write_bytes(st + v.tobytes())
    _fuzz(fuzzers / "fuzz_sampler", seeds, int(os.environ.get("STRATA_FUZZ_SAMPLER_SECONDS", "15")), tmp_path)
