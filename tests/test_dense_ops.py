"""The device op runner (tests/native/dense_ops.c, strata_dense_ops): every CUDA launcher run through the device
table of native/src/device/dense.h and, on the same input bytes, through the host emulation's table, op by op;
the GPU's outputs within 1e-5 of the emulation's (integers equal). The host checks (tests/test_cuda_ops.py) hold
the emulation to the C path; the runner holds the GPU to the emulation.

Without a GPU (here and in CI), on the build tests/test_cuda_ops.py makes (tools/cuda_ops.py, CUDA off; the runner
is built in the same folder):
- `--device emu` (the emulation on both sides: the runner's own plumbing) passes every op bit for bit, and prints
  every op the host checks print, with the same type fields (tools/device_check.sh puts the two side by side);
- `--device emu --break OP` (OP's device output perturbed after its launch) fails OP and no other op: the
  comparison can fail, and one op's result does not leak into another's;
- the default mode, in a build without CUDA, says `no GPU: <why>` and exits 77.
With a GPU (skipped otherwise; tools/device_check.sh runs the runner itself): every op passes on the device.
"""
from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("cuda_ops", ROOT / "tools" / "cuda_ops.py")
cuda_ops = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = cuda_ops          # its dataclass looks its module up there
_spec.loader.exec_module(cuda_ops)

BUILD = cuda_ops.TEST_BUILD   # tests/test_cuda_ops.py's build folder
RUNNER = "strata_dense_ops"
# ops broken one at a time: a family each; float, integer (router picks, kept keys) and typed outputs
BREAK = ("gemv.q4_k", "hc.read", "router.topk", "gdn.chunked", "qsa.select", "ple.dequant", "mtp.norm_concat")

pytestmark = pytest.mark.skipif(shutil.which("cmake") is None, reason="cmake is needed to build the runner")


def _gpu_count() -> int:
    """strata_cuda_device_count of the package's library; 0 without one (the host cases need none)."""
    try:
        from pyrunner._native import ffi, lib
    except ImportError:
        return 0
    reason = ffi.new("const char **")
    return int(lib.strata_cuda_device_count(reason))


def _build_runner(build: Path) -> Path:
    r = subprocess.run(["cmake", "--build", str(build), "-j", str(os.cpu_count() or 2), "--target", RUNNER],
                       capture_output=True, text=True)
    if r.returncode:
        raise RuntimeError(f"building {RUNNER} failed:\n" + r.stdout[-4000:] + r.stderr[-4000:])
    return build / "tests_native" / RUNNER


@pytest.fixture(scope="module")
def checks() -> dict:
    """The host checks' executables; the runner is built next to them."""
    return cuda_ops.build(BUILD)


@pytest.fixture(scope="module")
def runner(checks) -> Path:
    return _build_runner(BUILD)


@pytest.fixture(scope="module")
def host_ops(checks) -> dict:
    """{op: {"types", "host", "max_rel_err"}} as the host checks print them."""
    ops = {}
    for name, exe in checks.items():
        _, out, got = cuda_ops.run(exe)
        assert got, f"{name} printed no OP line:\n{out[-2000:]}"
        ops.update(got)
    return ops


@pytest.fixture(scope="module")
def emu_runs(runner) -> dict:
    """`--device emu` (key None) and `--device emu --break OP` for every OP of BREAK, run side by side:
    key -> (exit status, stdout + stderr, parsed OP lines)."""
    args = {None: []} | {op: ["--break", op] for op in BREAK}
    procs = {k: subprocess.Popen([str(runner), "--device", "emu", *a], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 text=True, cwd=runner.parent) for k, a in args.items()}
    out = {}
    for k, p in procs.items():
        so, se = p.communicate(timeout=300)
        out[k] = (p.returncode, so + se, cuda_ops.parse(so))
    return out


def test_the_emulation_against_itself_passes_bit_for_bit(emu_runs):
    rc, out, ops = emu_runs[None]
    assert ops, out[-3000:]
    bad = {op: e for op, e in ops.items() if e["host"] != "pass" or e["max_rel_err"] != 0.0}
    assert not bad, f"ops that differ with the emulation on both sides: {bad}\n{out[-3000:]}"
    assert rc == 0 and "all checks passed" in out, out[-3000:]


def test_every_op_of_the_host_checks_runs_on_the_device(emu_runs, host_ops):
    _, out, ops = emu_runs[None]
    assert sorted(ops) == sorted(host_ops), (
        f"only in the host checks: {sorted(set(host_ops) - set(ops))}; only in the runner: "
        f"{sorted(set(ops) - set(host_ops))}")
    types = {op: (ops[op]["types"], host_ops[op]["types"]) for op in ops if ops[op]["types"] != host_ops[op]["types"]}
    assert not types, f"type fields (runner, host checks) differ: {types}"


@pytest.mark.parametrize("op", BREAK)
def test_a_broken_op_fails_and_only_it(emu_runs, op):
    rc, out, ops = emu_runs[op]
    assert sorted(ops) == sorted(emu_runs[None][2]), f"--break {op}: not every op ran:\n{out[-3000:]}"
    assert ops[op]["host"] == "fail", f"--break {op} left {op} passing:\n{out[-3000:]}"
    others = sorted(o for o, e in ops.items() if o != op and e["host"] != "pass")
    assert not others, f"--break {op} also failed {others}:\n{out[-3000:]}"
    assert rc == 1 and "all checks passed" not in out


def test_without_a_gpu_it_says_why(runner):
    """The shared build has no CUDA: the device mode cannot run, and says so with the skip status 77."""
    r = subprocess.run([str(runner)], capture_output=True, text=True, timeout=60, cwd=runner.parent)
    assert r.returncode == 77 and r.stdout.startswith("no GPU: "), (r.returncode, r.stdout, r.stderr)


def _cuda_runner() -> Path:
    """A runner built with CUDA: STRATA_DENSE_OPS, or the one next to STRATA_LIB's library (tools/device_check.sh
    builds both there), else one built here for this GPU."""
    if os.environ.get("STRATA_DENSE_OPS"):
        return Path(os.environ["STRATA_DENSE_OPS"])
    if os.environ.get("STRATA_LIB"):
        exe = Path(os.environ["STRATA_LIB"]).resolve().parent / "tests_native" / RUNNER
        if exe.is_file():
            return exe
    build = ROOT / "build" / "dense_ops_cuda"
    subprocess.run(["cmake", "-S", str(ROOT / "native"), "-B", str(build), "-DCMAKE_BUILD_TYPE=Release",
                    "-DSTRATA_BUILD_TESTS=ON", "-DSTRATA_CUDA=ON", "-DCMAKE_CUDA_ARCHITECTURES=native",
                    f"-DPython3_EXECUTABLE={sys.executable}"], check=True, capture_output=True)
    return _build_runner(build)


@pytest.mark.skipif(_gpu_count() <= 0, reason="no CUDA device")
def test_the_gpu_agrees_with_its_emulation(host_ops):
    exe = _cuda_runner()
    r = subprocess.run([str(exe)], capture_output=True, text=True, timeout=300, cwd=exe.parent)
    out, ops = r.stdout + r.stderr, cuda_ops.parse(r.stdout)
    assert r.returncode != 77, f"{exe} has no GPU (a build without CUDA?): {r.stdout.strip()}"
    assert sorted(ops) == sorted(host_ops), out[-3000:]
    failed = sorted(op for op, e in ops.items() if e["host"] != "pass")
    assert not failed, f"ops where the GPU and its emulation differ: {failed}\n{out[-4000:]}"
    assert r.returncode == 0 and "all checks passed" in out, out[-3000:]
