"""llama.cpp in a child process (pyrunner/llama_child.py) and the oracle's build flags (tools/llama_oracle.py).

A child killed by a signal on purpose (SIGSEGV, SIGABRT, SIGILL: what a broken llama.cpp build dies of) is a
LlamaCrash naming llama.cpp, the file and the signal, and this pytest process lives on; a child's exception comes
back as itself with the child's traceback; results round-trip; the child's output stays visible, on stderr.
The oracle's CMAKE_ARGS never turn on an ISA the host lacks nor AMX (which crashes on qwen4exp: DESIGN §8), and the
installed oracle reports no AMX. (`strata bench model --vs-llama-cpp` with a crashing llama.cpp: test_bench_model.)
"""
from __future__ import annotations

import importlib.util
import os
import re
import signal
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from pyrunner import llama_child
from pyrunner.llama_child import ChildTraceback, LlamaChildError, LlamaCrash, LlamaTimeout

ROOT = Path(__file__).resolve().parents[1]


# ------------------------------------------------------------------------------------------ child sides

def _arrays(n: int) -> dict:
    return {"pid": os.getpid(), "f32": np.linspace(0, 1, n, dtype=np.float32), "ids": list(range(n)),
            "raw": b"\x00\xff", "nested": [np.eye(2, dtype=np.int64)]}


def _die(signum: int) -> None:
    print("child: about to die", file=sys.stderr, flush=True)
    print("child: on stdout", flush=True)
    os.kill(os.getpid(), signum)
    time.sleep(10)                           # not reached: the signal's default action ends the process


def _raise_value_error(text: str) -> None:
    raise ValueError(text)


class _Unpicklable(Exception):
    def __init__(self, a, b):                # two required arguments: pickle cannot rebuild it from args
        super().__init__(f"{a} and {b}")

    def __reduce__(self):
        raise TypeError("not picklable")


def _raise_unpicklable() -> None:
    raise _Unpicklable(1, 2)


def _system_info() -> str:
    import llama_cpp
    return llama_cpp.llama_print_system_info().decode()


# ------------------------------------------------------------------------------------------ the runner

def test_result_round_trips():
    got = llama_child.call(_arrays, (5,))
    assert got["pid"] != os.getpid()                                   # it ran elsewhere
    assert got["f32"].dtype == np.float32 and np.array_equal(got["f32"], np.linspace(0, 1, 5, dtype=np.float32))
    assert got["ids"] == [0, 1, 2, 3, 4] and got["raw"] == b"\x00\xff"
    assert got["nested"][0].dtype == np.int64 and np.array_equal(got["nested"][0], np.eye(2))


@pytest.mark.parametrize("sig", [signal.SIGSEGV, signal.SIGABRT, signal.SIGILL], ids=lambda s: s.name)
def test_signal_is_a_crash_naming_llama_cpp_the_file_and_the_signal(sig, tmp_path, capfd, monkeypatch):
    monkeypatch.chdir(tmp_path)             # this host's core_pattern is "core": a dump would land in the cwd
    gguf = tmp_path / "m.gguf"
    with pytest.raises(LlamaCrash) as e:
        llama_child.call(_die, (int(sig),), gguf=gguf)
    msg = str(e.value)
    assert msg.startswith(f"llama.cpp crashed with signal {int(sig)} ({sig.name}) on {gguf}"), msg
    assert "tools/llama_oracle.py install" in msg or "AMX off" in msg, msg    # what to do about it
    assert e.value.signum == sig and e.value.gguf == str(gguf)
    err = capfd.readouterr()
    # the child's own messages stay visible, on stderr (its stdout too: a parent's --json stdout stays clean)
    assert "child: about to die" in err.err and "child: on stdout" in err.err and "child:" not in err.out
    assert not list(tmp_path.glob("core*"))           # reported by message, no core file left behind


def test_crash_message_says_what_each_signal_means(monkeypatch):
    ill = llama_child.crash_message(int(signal.SIGILL), "/m.gguf")
    assert "instruction this CPU lacks" in ill and "python tools/llama_oracle.py install" in ill
    monkeypatch.setattr(llama_child, "_installed_flags", lambda: None)          # a plain `pip install` build
    segv = llama_child.crash_message(int(signal.SIGSEGV), "/m.gguf")
    assert "AMX path is known to crash" in segv and "python tools/llama_oracle.py install" in segv
    flags = "-DGGML_NATIVE=OFF -DGGML_AMX_INT8=OFF"
    monkeypatch.setattr(llama_child, "_installed_flags", lambda: flags)         # tools/llama_oracle.py's build
    segv = llama_child.crash_message(int(signal.SIGSEGV), "/m.gguf")
    assert "not the known AMX crash" in segv and "rebuild" not in segv     # a rebuild would change nothing


def test_child_exception_comes_back_as_itself_with_its_traceback():
    with pytest.raises(ValueError, match="no such tensor: blk.9") as e:
        llama_child.call(_raise_value_error, ("no such tensor: blk.9",))
    cause = e.value.__cause__
    assert isinstance(cause, ChildTraceback)
    assert "_raise_value_error" in str(cause) and "raise ValueError(text)" in str(cause)
    with pytest.raises(LlamaChildError, match=r"raised _Unpicklable: 1 and 2") as e:
        llama_child.call(_raise_unpicklable)
    assert "_raise_unpicklable" in str(e.value.__cause__)


def test_timeout_kills_the_child():
    t0 = time.perf_counter()
    with pytest.raises(LlamaTimeout, match=r"within 1 s on /m.gguf"):
        llama_child.call(time.sleep, (60,), gguf="/m.gguf", timeout=1)
    assert time.perf_counter() - t0 < 30


# ------------------------------------------------------------------------------------------ the oracle's build

def _oracle_tool():
    spec = importlib.util.spec_from_file_location("llama_oracle", ROOT / "tools" / "llama_oracle.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


BASE = "fpu sse sse2 ssse3 sse4_1 sse4_2 avx f16c fma bmi1 bmi2 avx2"
AVX512 = "avx512f avx512cd avx512dq avx512bw avx512vl avx512vbmi avx512_vnni"
HOSTS = {
    # name: (cpuinfo flags, the ggml options that must be ON: written out here, not derived from the tool's table)
    "avx2-only": (BASE, {"SSE42", "AVX", "F16C", "FMA", "BMI2", "AVX2"}),
    "avx512-vnni": (f"{BASE} {AVX512}", {"SSE42", "AVX", "F16C", "FMA", "BMI2", "AVX2", "AVX512", "AVX512_VBMI",
                                         "AVX512_VNNI"}),
    "amx": (f"{BASE} {AVX512} avx_vnni avx512_bf16 amx_bf16 amx_tile amx_int8",
            {"SSE42", "AVX", "F16C", "FMA", "BMI2", "AVX2", "AVX512", "AVX512_VBMI", "AVX512_VNNI", "AVX_VNNI",
             "AVX512_BF16"}),
}


def _cpuinfo(flags: str) -> str:
    # two processors, and a "vmx flags" line (real Intel hosts have one; not the ISA list) put first, holding
    # words the host's flags lack: only the "flags" key counts
    one = (f"processor\t: {{}}\nvendor_id\t: GenuineIntel\nvmx flags\t: vnmi ept amx_int8 avx512f\n"
           f"flags\t\t: {flags}\nbugs\t\t: spectre_v1\n\n")
    return one.format(0) + one.format(1)


def _options(args: list[str]) -> dict[str, str]:
    out = {}
    for a in args:
        m = re.fullmatch(r"-D(GGML_\w+)=(ON|OFF)", a)
        assert m, a
        out[m.group(1)] = m.group(2)
    return out


@pytest.mark.parametrize("host", list(HOSTS))
def test_cmake_args_take_what_the_host_has_and_never_amx(host):
    tool = _oracle_tool()
    flags, want_on = HOSTS[host]
    assert tool.cpu_flags(_cpuinfo(flags)) == set(flags.split())
    opts = _options(tool.cmake_args(tool.cpu_flags(_cpuinfo(flags))))
    assert opts["GGML_NATIVE"] == "OFF" and opts["GGML_CUDA"] == "OFF"     # native would compile AMX in
    on = {k[len("GGML_"):] for k, v in opts.items() if v == "ON"}
    assert on == want_on, (on ^ want_on)
    assert all(opts[k] == "OFF" for k in ("GGML_AMX_TILE", "GGML_AMX_INT8", "GGML_AMX_BF16"))


def test_flag_sets_get_their_own_wheel_key():
    tool = _oracle_tool()
    keys = {h: tool.key(tool.cmake_args(tool.cpu_flags(_cpuinfo(f)))) for h, (f, _) in HOSTS.items()}
    assert len(set(keys.values())) == len(keys)
    assert keys["amx"] == tool.key(tool.cmake_args(set(HOSTS["amx"][0].split())))     # stable


# llama.cpp's system-info names (ggml_cpu_has_*: what the build compiled in) -> the cpuinfo flag each needs
SYSTEM_INFO_NEEDS = {"SSE3": "pni", "SSSE3": "ssse3", "AVX": "avx", "AVX_VNNI": "avx_vnni", "AVX2": "avx2",
                     "F16C": "f16c", "FMA": "fma", "BMI2": "bmi2", "AVX512": "avx512f", "AVX512_VBMI": "avx512vbmi",
                     "AVX512_VNNI": "avx512_vnni", "AVX512_BF16": "avx512_bf16", "AMX_INT8": "amx_int8"}


def test_installed_oracle_has_no_amx_and_nothing_this_host_lacks():
    if importlib.util.find_spec("llama_cpp") is None:
        pytest.skip("llama-cpp-python is not installed (bash tools/test.sh builds it: tools/llama_oracle.py)")
    info = llama_child.call(_system_info)
    print(f"\nllama.cpp system info: {info}")
    assert "AMX_INT8 = 1" not in info, info
    host = _oracle_tool().cpu_flags(Path("/proc/cpuinfo").read_text())
    built = set(re.findall(r"(\w+) = 1", info))
    lacking = {f for f in built if f in SYSTEM_INFO_NEEDS and SYSTEM_INFO_NEEDS[f] not in host}
    assert not lacking, f"the installed llama.cpp uses {sorted(lacking)}, which this CPU lacks: {info}"
