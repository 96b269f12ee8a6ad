"""settings.py — the one place pyrunner reads the environment (STYLE: one owner for every setting).

A setting of the library is a field of a params struct in native/include/strata.h
(strata_model_params, strata_context_params); its default lives there, in
strata_*_default_params(). This module only reads the STRATA_* variables a user may set and hands
their values, parsed, to whoever builds those structs: pyrunner.Model, pyrunner._native (the
default context, the library path) and pyrunner.trace (the request watchdog). A function returns
None when its variable is unset or empty, so the caller keeps the library's default; a value that
does not parse raises ValueError naming the variable. Nothing is cached: each call reads the
environment as it is then (tests set variables with monkeypatch).

    variable                   reaches                                      read by
    -------------------------  -------------------------------------------  -------------------------
    STRATA_LIB                 the libstrata.so to load (not a setting of   _native, at import
                               the library: where it is)
    STRATA_THREADS             strata_model_params.n_threads and the        Model(threads=None),
                               default context's strata_context_params      _native.default_context()
    STRATA_ROUTE_TAIL_SKIP     strata_model_params.tail_skip                Model(tail_skip=None)
    STRATA_SIM_LINK_GBPS       strata_model_params.sim_link_gbps            Model(sim_link_gbps=None)
    STRATA_PLE_MADV_RANDOM     strata_model_params.ple_madv_random (0/1)    Model(ple_madv_random=None)
    STRATA_PLE_PREFETCH        strata_model_params.ple_prefetch (0/1)       Model(ple_prefetch=None)
    STRATA_PLE_STEP_TIMEOUT    strata_model_params.ple_step_timeout_s       Model(ple_step_timeout_s=None)
    STRATA_PLE_CACHE_MIB       strata_model_params.ple_cache_bytes (MiB)    Model(ple_cache_mib=None)
    STRATA_SYNC_SWAPS          strata_model_params.sync_swaps (0/1)         Model (replay hook)
    STRATA_PLE_TEST_STALL_MS   strata_model_params.ple_test_stall_ms        Model (test hook)
    STRATA_PLE_TEST_STALL_AT   strata_model_params.ple_test_stall_at        Model (test hook)
    STRATA_EXPERT_IO_TEST_SHORT_AT  strata_model_params.                    Model (test hook)
                               expert_io_test_short_read_at
    STRATA_WATCHDOG_S          the request watchdog (strata_watchdog_set)   trace.watchdog_seconds(None)
    STRATA_GEMM                strata_set_gemm_from (0 off, N every type    _native, at import
                               from N columns on; a measuring knob)
    STRATA_REPACK              strata_set_repack (0 off: what --no-repack   _native, at import;
                               does)                                        Model(repack=None)

The CLI's flags also come as STRATA_<FLAG> (DESIGN §9: STRATA_DEVICE, STRATA_N_CTX, …); click parses
those itself (`envvar=`, named by env_name() below) because it checks them like the flag (types,
choices) and shows them in --help. A flag left unset reaches Model as None, so its default is
Model's, i.e. the library's: there is no second copy of a default in the CLI.

One variable is read inside libstrata as well, on purpose: STRATA_ISA=scalar|avx2|avx_vnni|avx512|amx,
a debugging override of which CPU kernel path runs (process-wide, read once by the CPU detection,
before any params exist); strata.h documents it next to strata_isa_best(). Here isa() reads it only
so that _native can refuse a name the library does not know or this CPU cannot run (the library
itself would silently keep its best path): _native.check_settings() raises that, or a bad
STRATA_GEMM, from every Context and Model and before every `strata` command (one line, no traceback).
"""
from __future__ import annotations

import os

# The names above, for tests and `--help` texts; each is read by exactly one function below.
LIB = "STRATA_LIB"
THREADS = "STRATA_THREADS"
ROUTE_TAIL_SKIP = "STRATA_ROUTE_TAIL_SKIP"
SIM_LINK_GBPS = "STRATA_SIM_LINK_GBPS"
PLE_MADV_RANDOM = "STRATA_PLE_MADV_RANDOM"
PLE_PREFETCH = "STRATA_PLE_PREFETCH"
PLE_STEP_TIMEOUT = "STRATA_PLE_STEP_TIMEOUT"
PLE_CACHE_MIB = "STRATA_PLE_CACHE_MIB"
SYNC_SWAPS = "STRATA_SYNC_SWAPS"
PLE_TEST_STALL_MS = "STRATA_PLE_TEST_STALL_MS"
PLE_TEST_STALL_AT = "STRATA_PLE_TEST_STALL_AT"
EXPERT_IO_TEST_SHORT_AT = "STRATA_EXPERT_IO_TEST_SHORT_AT"
WATCHDOG_S = "STRATA_WATCHDOG_S"
GEMM = "STRATA_GEMM"
REPACK = "STRATA_REPACK"
ISA = "STRATA_ISA"


def env_name(flag: str) -> str:
    """The environment spelling of a CLI flag (DESIGN §9): --sim-link-gbps -> STRATA_SIM_LINK_GBPS."""
    return "STRATA_" + flag.lstrip("-").upper().replace("-", "_")


def _raw(name: str) -> str | None:
    v = os.environ.get(name)
    return None if v is None or v.strip() == "" else v.strip()


def _int(name: str, what: str = "an integer") -> int | None:
    v = _raw(name)
    if v is None:
        return None
    try:
        return int(v)
    except ValueError:
        raise ValueError(f"{name}={v!r} is not {what}") from None


def _float(name: str, what: str = "a number") -> float | None:
    v = _raw(name)
    if v is None:
        return None
    try:
        return float(v)
    except ValueError:
        raise ValueError(f"{name}={v!r} is not {what}") from None


def _flag(name: str) -> bool | None:
    """A value starting with 0 turns a knob off, any other keeps it on (as libstrata read it)."""
    v = os.environ.get(name)
    return None if v is None or v == "" else not v.startswith("0")


def lib_path() -> str | None:
    return _raw(LIB)


def gemm_from() -> int | None:
    """STRATA_GEMM: 0 turns the CPU GEMM path off, N > 0 sends every weight type to it from N token
    columns on; None: the library's rule (float weights from 8 columns)."""
    v = _int(GEMM, "a column count (0 = off)")
    if v is not None and v < 0:
        raise ValueError(f"{GEMM}={v}: give 0 (off) or a column count N > 0")
    return v


def repack() -> bool | None:
    """STRATA_REPACK: 0 turns the prefill conversion of weight rows off (strata_set_repack); None: on."""
    return _flag(REPACK)


def isa() -> str | None:
    """STRATA_ISA, as given (the library reads it itself; _native checks it against what runs here)."""
    return _raw(ISA)


def threads() -> int | None:
    """STRATA_THREADS; 0 means one per core, the library's default, so it reads as None."""
    return _int(THREADS, "a thread count") or None


def tail_skip() -> int | None:
    return _int(ROUTE_TAIL_SKIP, "a rank (0 = off)")


def expert_io_test_short_read_at() -> int | None:
    """STRATA_EXPERT_IO_TEST_SHORT_AT=N: a test hook, the expert store's N-th read comes back short."""
    return _int(EXPERT_IO_TEST_SHORT_AT, "a read number (1-based)")


def sim_link_gbps() -> float | None:
    """STRATA_SIM_LINK_GBPS; 0 reads as unset (the library's default), as it always did."""
    return _float(SIM_LINK_GBPS, "a bandwidth in GB/s") or None


def ple_madv_random() -> bool | None:
    return _flag(PLE_MADV_RANDOM)


def ple_prefetch() -> bool | None:
    return _flag(PLE_PREFETCH)


def sync_swaps() -> bool | None:
    """STRATA_SYNC_SWAPS=1: an adjustment round's copies land before the next window looks up (the
    residency `strata cache-sim` replays, whatever the machine's load)."""
    return _flag(SYNC_SWAPS)


def ple_step_timeout_s() -> float | None:
    """STRATA_PLE_STEP_TIMEOUT; a value <= 0 keeps the library's default (300 s)."""
    v = _float(PLE_STEP_TIMEOUT, "a number of seconds")
    return v if v is not None and v > 0 else None


def ple_cache_mib() -> float | None:
    """STRATA_PLE_CACHE_MIB: the PLE row cache's budget in MiB (0 = off); None: the library's default."""
    v = _float(PLE_CACHE_MIB, "a size in MiB (0 = off)")
    if v is not None and v < 0:
        raise ValueError(f"{PLE_CACHE_MIB}={v}: give a size in MiB >= 0 (0 turns the row cache off)")
    return v


def ple_test_stall() -> tuple[int | None, int | None]:
    """The gather worker's test hook: (sleep in ms before publishing a step, the only step that
    sleeps; 0 = every step). Tests (tests/test_trace.py, tests/test_ple.py) use it to make a real stall."""
    ms, at = _int(PLE_TEST_STALL_MS, "milliseconds"), _int(PLE_TEST_STALL_AT, "a step number")
    for name, v in ((PLE_TEST_STALL_MS, ms), (PLE_TEST_STALL_AT, at)):
        if v is not None and not 0 <= v < 2**32:   # unsigned fields: a negative one was an OverflowError
            raise ValueError(f"{name}={v} is out of range: give 0 .. 2**32 - 1")
    return ms, at


def watchdog_s() -> float | None:
    return _float(WATCHDOG_S, "a number of seconds")


def ray_environment(local: bool) -> None:
    """The environment Ray reads at import and hands to its processes: usage statistics off (unless the
    environment already says), and for a local cluster (`--ray` alone) always off and a one-machine
    cluster, so that its processes talk over 127.0.0.1 only (pyrunner/ray_batch.py)."""
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    if local:
        os.environ.update({"RAY_USAGE_STATS_ENABLED": "0", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"})
