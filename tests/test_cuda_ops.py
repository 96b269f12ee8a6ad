"""The CUDA forward's kernels checked on the host, op by op (issue 19 point 4; tools/cuda_ops.py).

Every family's arithmetic (native/src/kernels/cuda/<family>.cuh) is the source the GPU compiles and the source
these checks run on the host, over the whole launch grid, against the library's C path. Here:
- every check builds and passes, each op on a line of its own, and together they cover every op family the
  issue names (gemv, gemm, norm, hc, gdn, qsa, rope, router, ple, merge, lmhead, mtp);
- every mutation a check lists (a broken lane, index or operand in the shared source) makes its op fail: so a
  check cannot pass by calling the C path, and a kernel that drifts from it is caught;
- every header of the family compiles as C11 without warnings (the host half of the rule).
The GPU half (the same kernels launched on a device) is tools/device_check.sh's.
"""
from __future__ import annotations

import importlib.util
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

BUILD = cuda_ops.TEST_BUILD

pytestmark = pytest.mark.skipif(shutil.which("cmake") is None, reason="cmake is needed to build the checks")


@pytest.fixture(scope="module")
def exes() -> dict:
    return cuda_ops.build(BUILD)


@pytest.fixture(scope="module")
def results(exes) -> dict:
    return {name: cuda_ops.run(exe) for name, exe in exes.items()}


@pytest.mark.parametrize("name", cuda_ops.checks())
def test_every_op_passes_on_the_host(results, name):
    rc, out, ops = results[name]
    assert ops, f"{name} printed no OP line:\n{out[-3000:]}"
    failed = [op for op, e in ops.items() if e["host"] != "pass"]
    assert not failed, f"{name}: {failed} fail:\n{out[-3000:]}"
    assert rc == 0 and "all checks passed" in out, out[-3000:]


def test_every_family_of_the_forward_is_checked(results):
    ops = {op for _, _, got in results.values() for op in got}
    families = {op.split(".", 1)[0] for op in ops}
    assert families >= set(cuda_ops.FAMILIES), f"no host check for {sorted(set(cuda_ops.FAMILIES) - families)}"
    assert families <= set(cuda_ops.FAMILIES), f"ops outside the issue's families: {sorted(families - set(cuda_ops.FAMILIES))}"


def test_every_op_has_a_mutation(results):
    """An op is proved checkable by a mutation of its own; an op run per weight type (gemv.q4_k, gemv.q8_0 ...)
    shares its kernel with its family's other types, so a mutation of the family's kernel covers it."""
    ops = {op: e for _, _, got in results.values() for op, e in got.items()}
    named = {m.op for m in cuda_ops.mutations()}
    families = {op.split(".", 1)[0] for op in named}
    missing = sorted(op for op, e in ops.items()
                     if op not in named and not (e["types"] and op.split(".", 1)[0] in families))
    assert not missing, f"ops no mutation proves checkable: {missing}"


@pytest.mark.parametrize("mut", cuda_ops.mutations(), ids=lambda m: m.id)
def test_a_mutated_kernel_fails_its_check(exes, results, mut, tmp_path):
    _, _, clean = results[mut.check]
    assert mut.op in clean and clean[mut.op]["host"] == "pass", f"{mut.op} is not a passing op of {mut.check}"
    exe = cuda_ops.rebuild_mutated(BUILD, mut, tmp_path)
    rc, out, ops = cuda_ops.run(exe)
    assert mut.op in ops, f"the mutated {mut.check} no longer reports {mut.op} (it must still run):\n{out[-2000:]}"
    assert ops[mut.op]["host"] == "fail", f"{mut.path}: {mut.old!r} -> {mut.new!r} left {mut.op} passing"
    assert rc != 0 and "all checks passed" not in out


@pytest.mark.parametrize("header", sorted(p.name for p in (*cuda_ops.KERNELS.glob("*.cuh"),
                                                           *cuda_ops.KERNELS.glob("emu_*.h"))))
def test_kernel_headers_compile_as_c11(header, exes):
    gen = BUILD / "generated"
    r = subprocess.run(["gcc", "-std=c11", "-Wall", "-Wextra", "-Werror", "-fsyntax-only", "-x", "c",
                        "-I", str(ROOT / "native" / "src"), "-I", str(ROOT / "native" / "include"), "-I", str(gen),
                        str(cuda_ops.KERNELS / header)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]


def test_shared_sigmoid_is_within_two_ulp_and_the_vectorised_mix_keeps_its_bits(exes):
    """tests/native/test_ops_math.c: ops_sigmoid (ops_common.cuh; the C path's hyper-connection mix and
    the GPU's run it) against the double formula over every binade, and hc.c's vectorised mix against the same
    formula one value at a time, bit for bit."""
    r = subprocess.run(["cmake", "--build", str(BUILD), "--target", "test_ops_math"], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    out = subprocess.run([str(BUILD / "tests_native" / "test_ops_math")], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "worst" in out.stdout and "values" in out.stdout
