#!/usr/bin/env python3
"""The host op checks of the CUDA forward's kernels (issue 19 point 4), in the manner of llama.cpp's
test-backend-ops: every family's shared source (native/src/kernels/cuda/<family>.cuh) run on the host
against the library's C path, op by op.

Each family has a check, tests/native/test_cuda_ops_<family>.c, built by CMake like every native unit test
(gcc, linked to the static library). It prints one line per op (and weight type)

    OP <family>.<op> <type,type,...|-> pass|fail <max relative error>

and `all checks passed` when nothing failed. Its header lists mutations of the shared source, one a line,

    // MUTATION: <path under native/src> | <old text, once in that file> | <new text> | <op that must fail>

which tests/test_cuda_ops.py applies to a copy of the kernels to prove each check can fail.

    python tools/cuda_ops.py [--build DIR] [--json] [--out FILE]
        build (CUDA off) and run every check; print the ops (as JSON), write them to FILE
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CHECKS = ROOT / "tests" / "native"
KERNELS = ROOT / "native" / "src" / "kernels" / "cuda"
PREFIX = "test_cuda_ops_"
# the tests' build (tests/test_cuda_ops.py, tests/test_dense_ops.py share it); STRATA_CUDA_OPS_BUILD moves it
TEST_BUILD = Path(os.environ.get("STRATA_CUDA_OPS_BUILD", ROOT / "build" / "cuda_ops")).resolve()
# the op families issue 19 names; every op name begins with one of them (tools/device_check.sh's summary.json)
FAMILIES = ("gemv", "gemm", "norm", "hc", "gdn", "qsa", "rope", "router", "ple", "merge", "lmhead", "mtp")

OP_LINE = re.compile(r"^OP (\S+) (\S+) (pass|fail) (\S+)\s*$")


@dataclass(frozen=True)
class Mutation:
    check: str        # the check's name, test_cuda_ops_<family>
    path: str         # under native/src
    old: str
    new: str
    op: str           # the op that must fail

    @property
    def id(self) -> str:
        return f"{self.op}:{self.path.rsplit('/', 1)[-1]}:{re.sub(r'[^A-Za-z0-9]+', '_', self.new)[:24]}"


def checks() -> list[str]:
    """Names of the check executables: one per tests/native/test_cuda_ops_*.c."""
    return sorted(p.stem for p in CHECKS.glob(PREFIX + "*.c"))


def mutations() -> list[Mutation]:
    out = []
    for name in checks():
        for line in (CHECKS / f"{name}.c").read_text().splitlines():
            if not line.startswith("// MUTATION:"):
                continue
            parts = [p.strip() for p in line[len("// MUTATION:"):].split(" | ")]
            if len(parts) != 4:
                raise ValueError(f"{name}.c: a MUTATION line needs 4 fields separated by ' | ': {line!r}")
            out.append(Mutation(name, *parts))
    return out


def build(build_dir: Path, jobs: int | None = None) -> dict[str, Path]:
    """Configures build_dir (Release, CUDA off, native tests on) and builds every check; name -> executable."""
    names = checks()
    build_dir = Path(build_dir).resolve()     # the checks run in their own folder
    subprocess.run(["cmake", "-S", str(ROOT / "native"), "-B", str(build_dir), "-DCMAKE_BUILD_TYPE=Release",
                    "-DSTRATA_BUILD_TESTS=ON", "-DSTRATA_CUDA=OFF", "-DCMAKE_EXPORT_COMPILE_COMMANDS=ON",
                    f"-DPython3_EXECUTABLE={sys.executable}"], check=True, capture_output=True)
    r = subprocess.run(["cmake", "--build", str(build_dir), "-j", str(jobs or os.cpu_count() or 2),
                        "--target", *names], capture_output=True, text=True)
    if r.returncode:
        raise RuntimeError("building the CUDA op checks failed:\n" + r.stdout[-4000:] + r.stderr[-4000:])
    return {n: build_dir / "tests_native" / n for n in names}


def parse(stdout: str) -> dict[str, dict]:
    """OP lines -> {op: {"types": [...], "host": "pass"|"fail", "max_rel_err": float}}."""
    ops: dict[str, dict] = {}
    for line in stdout.splitlines():
        m = OP_LINE.match(line)
        if not m:
            continue
        name, types, verdict, err = m.groups()
        entry = ops.setdefault(name, {"types": [], "host": "pass", "max_rel_err": 0.0})
        for t in ([] if types == "-" else types.split(",")):
            if t not in entry["types"]:
                entry["types"].append(t)
        if verdict == "fail":
            entry["host"] = "fail"
        try:
            entry["max_rel_err"] = max(entry["max_rel_err"], float(err))
        except ValueError:
            entry["max_rel_err"] = float("nan")
    return ops


def run(exe: Path, timeout: float = 300) -> tuple[int, str, dict[str, dict]]:
    r = subprocess.run([str(exe)], capture_output=True, text=True, timeout=timeout, cwd=exe.parent)
    return r.returncode, r.stdout + r.stderr, parse(r.stdout)


def rebuild_mutated(build_dir: Path, mut: Mutation, work: Path) -> Path:
    """The check of `mut` compiled again (same command as CMake's) against a copy of native/src/kernels/cuda
    with the mutation applied, found first on the include path; returns the executable."""
    if not mut.path.startswith("kernels/cuda/"):
        raise ValueError(f"{mut.check}: a mutation must change the shared kernel source (kernels/cuda/...), "
                         f"not {mut.path}")
    build_dir, work = Path(build_dir).resolve(), Path(work).resolve()
    shadow = work / "src"
    if shadow.exists():
        shutil.rmtree(shadow)
    shutil.copytree(KERNELS, shadow / "kernels" / "cuda")
    target = shadow / mut.path
    text = target.read_text()
    if text.count(mut.old) != 1:
        raise ValueError(f"{mut.check}: mutation text {mut.old!r} occurs {text.count(mut.old)} times in {mut.path}")
    target.write_text(text.replace(mut.old, mut.new))
    src = str(CHECKS / f"{mut.check}.c")
    cmds = json.loads((build_dir / "compile_commands.json").read_text())
    entry = next((c for c in cmds if os.path.samefile(c["file"], src)), None)
    if entry is None:
        raise RuntimeError(f"{mut.check}.c is not in {build_dir}/compile_commands.json")
    argv = shlex.split(entry["command"])
    obj = work / f"{mut.check}.o"
    i = argv.index("-o")
    argv[i + 1] = str(obj)
    argv.insert(1, f"-I{shadow}")
    subprocess.run(argv, check=True, cwd=entry["directory"], capture_output=True)
    tests_dir = build_dir / "tests_native"
    link = shlex.split((tests_dir / "CMakeFiles" / f"{mut.check}.dir" / "link.txt").read_text())
    exe = work / mut.check
    link = [str(obj) if a.endswith(f"{mut.check}.c.o") else a for a in link]
    link[link.index("-o") + 1] = str(exe)
    subprocess.run(link, check=True, cwd=tests_dir, capture_output=True)
    return exe


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", type=Path, default=ROOT / "build" / "cuda_ops", help="CMake build folder")
    ap.add_argument("--json", action="store_true", help="print {op: {types, host, max_rel_err}} as JSON")
    ap.add_argument("--out", type=Path, help="also write that JSON to this file")
    a = ap.parse_args()
    exes = build(a.build)
    ops: dict[str, dict] = {}
    failed = False
    for name, exe in exes.items():
        rc, out, got = run(exe)
        if rc or not got:
            failed = True
            print(f"{name}: exit {rc}\n{out[-2000:]}", file=sys.stderr)
        ops.update(got)
    if a.out:
        a.out.write_text(json.dumps(ops, indent=1, sort_keys=True))
    if a.json:
        print(json.dumps(ops, indent=1, sort_keys=True))
    else:
        for op, e in sorted(ops.items()):
            print(f"{op:28s} {e['host']:4s} {e['max_rel_err']:.3g}  {','.join(e['types'])}")
    return 1 if failed or any(e["host"] != "pass" for e in ops.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
