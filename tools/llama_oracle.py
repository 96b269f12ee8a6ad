#!/usr/bin/env python3
"""tools/llama_oracle.py — builds and installs the llama.cpp test oracle (llama-cpp-python) for this CPU.

Why: `GGML_NATIVE=ON` compiles every ISA the build host has, AMX included, and llama.cpp's AMX path
crashes on qwen4exp files (DESIGN §8). So the oracle is built with `GGML_NATIVE=OFF` and one explicit
flag per feature that /proc/cpuinfo lists (never one the host lacks: that would be SIGILL), AMX always
off. pip's wheel cache is keyed by the sdist, not by CMAKE_ARGS, so the wheel is kept here instead, in a
folder named by a hash of the flags: CI builds it once per flag set and reuses it after.

    python tools/llama_oracle.py flags     # the CMAKE_ARGS this host gets, and their key
    python tools/llama_oracle.py install   # build (if no wheel for this key yet) and install it

The cache folder is $STRATA_ORACLE_CACHE, else $XDG_CACHE_HOME/strata/oracle (default ~/.cache/...).
"""
import hashlib
import os
import subprocess
import sys
from pathlib import Path

VERSION = "0.3.36"
PACKAGE = "llama-cpp-python"
MARKER = "STRATA_ORACLE_FLAGS"  # written into the installed llama_cpp package: the flags it was built with

# ggml's CMake option  <-  the /proc/cpuinfo flags it needs (all of them)
ISA_OPTIONS = [
    ("GGML_SSE42", ("sse4_2",)),
    ("GGML_AVX", ("avx",)),
    ("GGML_F16C", ("f16c",)),
    ("GGML_FMA", ("fma",)),
    ("GGML_BMI2", ("bmi2",)),
    ("GGML_AVX2", ("avx2",)),
    ("GGML_AVX_VNNI", ("avx_vnni",)),
    # ggml's AVX512 option compiles with -mavx512f -mavx512cd -mavx512vl -mavx512dq -mavx512bw
    ("GGML_AVX512", ("avx512f", "avx512cd", "avx512vl", "avx512dq", "avx512bw")),
    ("GGML_AVX512_VBMI", ("avx512f", "avx512vbmi")),
    ("GGML_AVX512_VNNI", ("avx512f", "avx512_vnni")),
    ("GGML_AVX512_BF16", ("avx512f", "avx512_bf16")),
]
# never on, whatever the host has: llama.cpp's AMX path crashes on qwen4exp (DESIGN §8)
FORCED_OFF = ("GGML_AMX_TILE", "GGML_AMX_INT8", "GGML_AMX_BF16")


def cpu_flags(cpuinfo_text):
    """The feature flags of the first processor in a /proc/cpuinfo text."""
    for line in cpuinfo_text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "flags":
            return set(value.split())
    return set()


def cmake_args(flags):
    """CMAKE_ARGS for a host with these cpuinfo flags: explicit ISA options, AMX and CUDA off."""
    args = ["-DGGML_NATIVE=OFF", "-DGGML_CUDA=OFF"]
    for option, needs in ISA_OPTIONS:
        args.append(f"-D{option}={'ON' if all(n in flags for n in needs) else 'OFF'}")
    args += [f"-D{option}=OFF" for option in FORCED_OFF]
    return args


def key(args):
    return hashlib.sha256(f"{PACKAGE}=={VERSION} {' '.join(args)}".encode()).hexdigest()[:16]


def cache_dir():
    root = os.environ.get("STRATA_ORACLE_CACHE")
    if root:
        return Path(root)
    xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(xdg) / "strata" / "oracle"


def host_args():
    with open("/proc/cpuinfo") as f:
        return cmake_args(cpu_flags(f.read()))


def installed_marker():
    """The flags the installed llama_cpp was built with, per its marker, or None."""
    try:
        out = subprocess.run([sys.executable, "-c", "import llama_cpp, os; print(os.path.dirname(llama_cpp.__file__))"],
                             capture_output=True, text=True, check=True).stdout.strip()
    except subprocess.CalledProcessError:
        return None, None
    marker = Path(out) / MARKER
    return (marker.read_text().strip() if marker.exists() else None), marker


def install():
    args = host_args()
    k = key(args)
    have, _ = installed_marker()
    if have == " ".join(args):
        print(f"llama_oracle: {PACKAGE} {VERSION} already installed with this host's flags (key {k})")
        return
    wheel_dir = cache_dir() / f"{PACKAGE}-{VERSION}-{k}"
    wheels = sorted(wheel_dir.glob("*.whl"))
    if not wheels:
        print(f"llama_oracle: building {PACKAGE} {VERSION} with CMAKE_ARGS={' '.join(args)} "
              f"(once per flag set, ~8 min on 2 cores) into {wheel_dir}", flush=True)
        tmp = wheel_dir.with_name(wheel_dir.name + ".partial")
        tmp.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ, CMAKE_ARGS=" ".join(args), CMAKE_BUILD_PARALLEL_LEVEL=str(os.cpu_count() or 2))
        # --no-cache-dir: pip's cache would hand back a wheel built with other flags
        subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-cache-dir",
                        "--no-binary", PACKAGE, f"{PACKAGE}=={VERSION}", "-w", str(tmp)], env=env, check=True)
        built = sorted(tmp.glob("*.whl"))
        if not built:
            sys.exit(f"llama_oracle: pip wheel made no wheel in {tmp}")
        tmp.rename(wheel_dir)
        wheels = sorted(wheel_dir.glob("*.whl"))
    print(f"llama_oracle: installing {wheels[-1].name} (key {k})", flush=True)
    # its Python dependencies (numpy, jinja2, typing-extensions, diskcache) come from the index as usual
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--force-reinstall", "--no-deps", str(wheels[-1])],
                   check=True)
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", str(wheels[-1])], check=True)
    have, marker = installed_marker()
    if marker is None:
        sys.exit("llama_oracle: the wheel installed but `import llama_cpp` fails")
    marker.write_text(" ".join(args) + "\n")


def main(argv):
    cmd = argv[1] if len(argv) > 1 else "flags"
    if cmd == "flags":
        args = host_args()
        print(" ".join(args))
        print(f"key {key(args)}", file=sys.stderr)
    elif cmd == "install":
        install()
    else:
        sys.exit(f"usage: {argv[0]} flags|install")


if __name__ == "__main__":
    main(sys.argv)
