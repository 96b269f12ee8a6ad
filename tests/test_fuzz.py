"""Builds the libFuzzer target for the GGUF reader (native/fuzz, clang + ASan + UBSan), seeds it
with valid files from tools/make_gguf_corpus.py and fuzzes for STRATA_FUZZ_SECONDS (default
60). Any crash, sanitizer report, timeout or OOM fails the test."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BUILD = ROOT / "build" / "fuzz"
INSTALL_HINT = "apt-get install clang libclang-rt-14-dev"


def _run(cmd, **kw):
    r = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, **kw)
    if r.returncode != 0:
        tail = (r.stdout + r.stderr)[-4000:]
        hint = f"\n(the fuzzer needs clang with libFuzzer: {INSTALL_HINT})" if "fuzzer" in tail.lower() else ""
        pytest.fail(f"{' '.join(map(str, cmd))} failed ({r.returncode}):\n{tail}{hint}")
    return r


@pytest.mark.slow
def test_fuzz_gguf(tmp_path):
    clang = shutil.which("clang")
    if clang is None:
        pytest.fail(f"clang is not installed; the GGUF fuzzer needs it: {INSTALL_HINT}")
    cmake = shutil.which("cmake")
    assert cmake, "cmake is needed to build the fuzzer"
    jobs = os.environ.get("STRATA_BUILD_JOBS", "2")
    _run([cmake, "-S", ROOT / "native", "-B", BUILD, f"-DCMAKE_C_COMPILER={clang}", "-DSTRATA_FUZZ=ON",
          "-DSTRATA_CUDA=OFF", "-DCMAKE_BUILD_TYPE=RelWithDebInfo", f"-DPython3_EXECUTABLE={sys.executable}"])
    _run([cmake, "--build", BUILD, "--target", "fuzz_gguf", "-j", jobs])
    fuzzer = BUILD / "fuzz" / "fuzz_gguf"
    assert fuzzer.is_file(), f"{fuzzer} was not built"

    seeds = tmp_path / "seeds"
    _run([sys.executable, ROOT / "tools" / "make_gguf_corpus.py", seeds])
    assert len(list(seeds.glob("*.gguf"))) >= 5
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    artifacts = tmp_path / "artifacts"
    artifacts.mkdir()

    seconds = int(os.environ.get("STRATA_FUZZ_SECONDS", "60"))
    r = subprocess.run(
        [str(fuzzer), f"-max_total_time={seconds}", "-max_len=65536", "-timeout=10", "-rss_limit_mb=2048",
         f"-artifact_prefix={artifacts}/", "-print_final_stats=1", str(corpus), str(seeds)],
        capture_output=True, text=True, timeout=seconds + 300)
    found = sorted(p.name for p in artifacts.iterdir())
    if r.returncode != 0 or found:
        keep = BUILD / "artifacts"  # keep the inputs for reproduction: fuzz_gguf <file>
        keep.mkdir(exist_ok=True)
        for p in artifacts.iterdir():
            shutil.copy(p, keep / p.name)
        pytest.fail(f"fuzz_gguf exited {r.returncode}, artifacts {found} (copied to {keep}):\n{r.stderr[-6000:]}")
    assert "Done" in r.stderr, r.stderr[-2000:]
