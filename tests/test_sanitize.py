"""The sanitizer build: libstrata and the native unit tests compiled with AddressSanitizer +
UndefinedBehaviorSanitizer (STRATA_SANITIZE=ON, in build/asan). Runs the C unit tests under
CTest (the offload engine's test_offload among them), then the native-facing Python suites (block formats,
GGUF reader, quantizers, tokenizer, API, model) against the sanitized library. Any sanitizer report fails
the run. ThreadSanitizer needs a build of its own (build/tsan: the static library and the threaded unit
tests, CUDA off; TSan cannot share a process with ASan), where test_offload runs the engine with the sim
device's copy and compute threads, test_pool the worker pool's jobs and test_ple the PLE gather worker with
two clients and a read-ahead thread."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BUILD = ROOT / "build" / "asan"
TSAN_BUILD = ROOT / "build" / "tsan"
# native unit tests whose subject runs threads: the sim device's engines, the store's reads, the worker pool, the
# PLE gather worker (and the steps its clients gather themselves)
TSAN_TESTS = ["test_offload", "test_xstore", "test_pool", "test_ple"]
SUITES = ["tests/test_native.py", "tests/test_quant.py", "tests/test_gguf.py", "tests/test_quantize.py",
          "tests/test_tokenizer.py", "tests/test_model_api.py", "tests/test_offload.py", "tests/test_ple.py",
          "tests/test_gemm.py", "tests/test_mtp.py", "tests/test_mtp_model.py", "tests/test_trace.py",
          "tests/test_engine.py", "tests/test_store.py", "tests/test_dense_device.py"]

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(os.environ.get("STRATA_UNDER_SANITIZER") == "1", reason="already inside the sanitizer run"),
]


def _runtime(name: str) -> str:
    path = subprocess.run(["gcc", f"-print-file-name={name}"], capture_output=True, text=True).stdout.strip()
    if not os.path.isabs(path):
        pytest.fail(f"gcc has no {name}: install gcc's sanitizer runtimes (apt-get install gcc)")
    return path


@pytest.fixture(scope="module")
def asan_build():
    if shutil.which("cmake") is None:
        pytest.fail("cmake is needed for the sanitizer build")
    subprocess.run(["cmake", "-S", str(ROOT / "native"), "-B", str(BUILD), "-DCMAKE_BUILD_TYPE=RelWithDebInfo",
                    "-DSTRATA_SANITIZE=ON", "-DSTRATA_BUILD_TESTS=ON", "-DSTRATA_CUDA=OFF",
                    f"-DPython3_EXECUTABLE={sys.executable}"], check=True, capture_output=True)
    r = subprocess.run(["cmake", "--build", str(BUILD), "-j", str(os.cpu_count() or 2)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    return BUILD


def _env():
    return dict(os.environ,
                ASAN_OPTIONS="detect_leaks=0:abort_on_error=0:halt_on_error=1",
                UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1")


def test_native_unit_tests_under_sanitizers(asan_build):
    r = subprocess.run(["ctest", "--output-on-failure", "--no-tests=error"], cwd=asan_build, env=_env(),
                       capture_output=True, text=True, timeout=1200)
    assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-2000:]
    assert "tests passed" in r.stdout


def test_python_suites_under_sanitizers(asan_build):
    env = _env()
    env.update(LD_PRELOAD=_runtime("libasan.so") + " " + _runtime("libubsan.so"),
               STRATA_LIB=str(asan_build / "libstrata.so"), STRATA_UNDER_SANITIZER="1")
    suites = list(SUITES)
    assert all((ROOT / s).exists() for s in suites), suites
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", *suites],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=2400)
    tail = r.stdout[-6000:] + r.stderr[-3000:]
    assert r.returncode == 0, tail
    assert "ERROR: AddressSanitizer" not in r.stderr and "runtime error:" not in r.stderr, tail
    assert " passed" in r.stdout


@pytest.fixture(scope="module")
def tsan_build():
    if shutil.which("cmake") is None:
        pytest.fail("cmake is needed for the sanitizer build")
    _runtime("libtsan.so")
    flag = "-fsanitize=thread"
    subprocess.run(["cmake", "-S", str(ROOT / "native"), "-B", str(TSAN_BUILD), "-DCMAKE_BUILD_TYPE=RelWithDebInfo",
                    "-DSTRATA_BUILD_TESTS=ON", "-DSTRATA_CUDA=OFF", f"-DCMAKE_C_FLAGS={flag}",
                    f"-DCMAKE_EXE_LINKER_FLAGS={flag}", f"-DCMAKE_SHARED_LINKER_FLAGS={flag}",
                    f"-DPython3_EXECUTABLE={sys.executable}"], check=True, capture_output=True)
    r = subprocess.run(["cmake", "--build", str(TSAN_BUILD), "-j", str(os.cpu_count() or 2), "--target", *TSAN_TESTS],
                       capture_output=True, text=True, timeout=1200)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    return TSAN_BUILD


@pytest.mark.parametrize("name", TSAN_TESTS)
def test_engine_unit_tests_under_tsan(tsan_build, name):
    env = dict(os.environ, TSAN_OPTIONS="halt_on_error=1:exitcode=66:second_deadlock_stack=1")
    r = subprocess.run([str(tsan_build / "tests_native" / name)], env=env, capture_output=True, text=True, timeout=120)
    tail = r.stdout[-4000:] + r.stderr[-6000:]
    assert r.returncode == 0, tail
    assert "WARNING: ThreadSanitizer" not in r.stderr, tail
    assert "all checks passed" in r.stdout, tail
