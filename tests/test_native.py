"""The native library's surface: exported symbols equal the header's declarations, the ABI
check, errors that carry messages, the context, the device probe and the CLI basics."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pyrunner import _native
from pyrunner._native import ffi, lib

ROOT = Path(__file__).resolve().parents[1]
HEADER = ROOT / "native" / "include" / "strata.h"


def header_functions() -> set[str]:
    block = _native._cdef_block(HEADER.read_text())
    block = re.sub(r"/\*.*?\*/", "", block, flags=re.S)
    return set(re.findall(r"\b(strata_\w+)\s*\(", block))


def exported_functions(path: str) -> set[str]:
    out = subprocess.run(["nm", "-D", "--defined-only", path], check=True, capture_output=True, text=True).stdout
    return {parts[2] for parts in (line.split() for line in out.splitlines())
            if len(parts) == 3 and parts[1] in "TW" and parts[2].startswith("strata_")}


def test_exported_symbols_equal_header_declarations():
    declared = header_functions()
    exported = exported_functions(_native.LIB_PATH)
    assert len(declared) > 20
    assert declared - exported == set(), "declared in strata.h but not exported"
    assert exported - declared == set(), "exported but not declared in strata.h"


def test_nothing_but_the_api_is_exported():
    out = subprocess.run(["nm", "-D", "--defined-only", _native.LIB_PATH], check=True,
                         capture_output=True, text=True).stdout
    names = [p[2] for p in (line.split() for line in out.splitlines()) if len(p) == 3 and p[1] in "TtWDB"]
    stray = [n for n in names if not n.startswith("strata_") and not n.startswith("_")]
    assert stray == [], f"symbols leak from libstrata: {stray[:10]}"


def test_header_block_is_macro_free():
    block = _native._cdef_block(HEADER.read_text())
    assert "#" not in block


def test_abi_version_checked():
    assert lib.strata_abi_version() == _native.ABI_VERSION


def test_abi_mismatch_is_refused(tmp_path):
    # A header claiming another ABI version makes the binding refuse the library.
    pkg = tmp_path / "pyrunner"
    pkg.mkdir()
    for f in (ROOT / "pyrunner").glob("*.py"):
        (pkg / f.name).write_text(f.read_text())
    (pkg / "strata.h").write_text(HEADER.read_text().replace(
        f"#define STRATA_ABI_VERSION {_native.ABI_VERSION}", "#define STRATA_ABI_VERSION 999"))
    env = dict(os.environ, STRATA_LIB=_native.LIB_PATH, PYTHONPATH=str(tmp_path))
    r = subprocess.run([sys.executable, "-c", "import pyrunner"], env=env, capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode != 0 and "ABI version" in r.stderr


def test_missing_library_message(tmp_path):
    env = dict(os.environ, STRATA_LIB=str(tmp_path / "nope.so"))
    r = subprocess.run([sys.executable, "-c", "import pyrunner"], env=env, capture_output=True, text=True, cwd=ROOT)
    assert r.returncode != 0 and "nope.so" in r.stderr


def test_errors_carry_the_message():
    with pytest.raises(_native.StrataError) as e:
        _native.check(lib.strata_context_init(ffi.NULL, ffi.NULL))
    assert e.value.status == lib.STRATA_ERR_INVALID_ARG
    assert "out is NULL" in str(e.value)
    assert ffi.string(lib.strata_status_str(lib.STRATA_ERR_FORMAT)) == b"format error"


def test_context_threads():
    assert _native.Context(3).n_threads == 3
    assert _native.Context().n_threads == os.cpu_count()


def test_cuda_probe_never_fails():
    reason = ffi.new("const char **")
    n = lib.strata_cuda_device_count(reason)
    assert n >= 0
    if n == 0:
        assert ffi.string(reason[0]).decode()  # says why


def test_build_info_mentions_paths():
    info = _native.build_info()
    assert info.startswith("strata ") and "avx2=" in info and "cuda=" in info


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="no nvcc: STRATA_CUDA defaults to off")
def test_cuda_sources_compiled_when_nvcc_is_present():
    # The default build (not the sanitizer build, which turns CUDA off) compiles the CUDA sources,
    # and the library loaded and ran anyway, GPU or not.
    info = _native.build_info()
    if "sanitize=" in info:
        pytest.skip("sanitizer build is configured with STRATA_CUDA=OFF")
    assert "cuda=compiled" in info


def test_isa_names():
    assert _native.isa_supported("scalar")
    with pytest.raises(ValueError, match="unknown isa"):
        _native.isa_id("neon")


def test_memory_probe_measures_something():
    g = ffi.new("double *")
    _native.check(lib.strata_probe_read_bandwidth(_native.Context(1).ptr, 64 << 20, 2, g))
    assert g[0] > 0.01
    with pytest.raises(_native.StrataError, match="probe"):
        _native.check(lib.strata_probe_read_bandwidth(ffi.NULL, 10, 1, g))
