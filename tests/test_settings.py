"""One owner for every setting (STYLE; issue 16.3): pyrunner/settings.py is the only place pyrunner reads
the environment, every STRATA_* setting of the library reaches it as a strata_model_params field, and
inside libstrata only the one documented debugging override (STRATA_ISA) is read; STRATA_GEMM reaches it by a call.

Each variable is checked end to end for a Model made in Python (not through the CLI): set in the
environment, read back from what the library reports (model info, PLE info, offload stats, an eval that
stalls), so a variable that stopped reaching the library fails here. The source checks read the files."""
from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from pyrunner import models, ple, settings, trace
from pyrunner._native import StrataError, lib
from pyrunner.model import Model

ROOT = Path(__file__).resolve().parent.parent
NATIVE_SRC = ROOT / "native" / "src"
PLE_VARS = (settings.PLE_MADV_RANDOM, settings.PLE_PREFETCH, settings.PLE_STEP_TIMEOUT,
            settings.PLE_TEST_STALL_MS, settings.PLE_TEST_STALL_AT)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> str:
    out = tmp_path_factory.mktemp("settings") / "tiny.gguf"        # the tiny preset has a PLE layer
    models.make_model("tiny", str(out), recipe="f32", seed=4)
    return str(out)


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    for v in (settings.THREADS, settings.ROUTE_TAIL_SKIP, settings.SIM_LINK_GBPS, settings.WATCHDOG_S, settings.SYNC_SWAPS) + PLE_VARS:
        monkeypatch.delenv(v, raising=False)


# ------------------------------------------------------------------------------ each variable reaches libstrata

def test_threads(tiny, monkeypatch):
    monkeypatch.setenv(settings.THREADS, "1")
    with Model(tiny, n_ctx=64) as m:
        assert m.n_threads == 1
    monkeypatch.setenv(settings.THREADS, "2")
    with Model(tiny, n_ctx=64) as m:
        assert m.n_threads == 2
    with Model(tiny, n_ctx=64, threads=1) as m:       # an argument wins over the environment
        assert m.n_threads == 1


def test_route_tail_skip(tiny, monkeypatch):
    with Model(tiny, threads=1, n_ctx=64) as m:
        assert m.offload_stats()["tail_skip"] == 0      # cpu: off unless asked (DESIGN §4)
    monkeypatch.setenv(settings.ROUTE_TAIL_SKIP, "1")   # tiny routes to 3 experts
    with Model(tiny, threads=1, n_ctx=64) as m:
        assert m.offload_stats()["tail_skip"] == 1
    with Model(tiny, threads=1, n_ctx=64, tail_skip=0) as m:
        assert m.offload_stats()["tail_skip"] == 0


def _sim_probe(path: str) -> float:
    with Model(path, threads=1, n_ctx=64, device="sim", cache_gib=0.0, expert_pack=None) as m:
        return m.offload_stats()["probe_gbps"]


def test_sim_link_gbps(tiny, monkeypatch):
    # the sim device's link probe measures its copy engine, which runs at sim_link_gbps
    monkeypatch.setenv(settings.SIM_LINK_GBPS, "2")
    slow = _sim_probe(tiny)
    monkeypatch.setenv(settings.SIM_LINK_GBPS, "64")
    fast = _sim_probe(tiny)
    assert 0 < slow <= 2.5 and fast > 2 * slow, (slow, fast)


def test_ple_madv_random_and_prefetch(tiny, monkeypatch):
    with Model(tiny, threads=1, n_ctx=64, ple_mode="mmap") as m:
        i = ple.model_info(m)
    assert i["madv_random"] and i["prefetch"]            # the library's defaults
    monkeypatch.setenv(settings.PLE_MADV_RANDOM, "0")
    monkeypatch.setenv(settings.PLE_PREFETCH, "0")
    with Model(tiny, threads=1, n_ctx=64, ple_mode="mmap") as m:
        i = ple.model_info(m)
    assert not i["madv_random"] and not i["prefetch"] and "default readahead" in i["why"]
    with Model(tiny, threads=1, n_ctx=64, ple_mode="mmap", ple_madv_random=True, ple_prefetch=True) as m:
        i = ple.model_info(m)
    assert i["madv_random"] and i["prefetch"]


def test_ple_step_timeout_and_stall_hooks(tiny, monkeypatch):
    # STALL_MS makes the worker sleep before publishing, STALL_AT picks the step, STEP_TIMEOUT fails
    # the eval that waits: step 1 (the prompt) passes, step 2 times out after 0.3 s, not 1.2 s.
    monkeypatch.setenv(settings.PLE_TEST_STALL_MS, "1200")
    monkeypatch.setenv(settings.PLE_TEST_STALL_AT, "2")
    monkeypatch.setenv(settings.PLE_STEP_TIMEOUT, "0.3")
    with Model(tiny, threads=1, n_ctx=64) as m:
        s = m.session()
        s.eval([1, 2, 3])
        t0 = time.monotonic()
        with pytest.raises(StrataError, match=r"did not finish within 0\.3 s"):
            s.eval([4])
        assert time.monotonic() - t0 < 1.0


def test_ple_test_stall_out_of_range_is_named(monkeypatch):
    monkeypatch.setenv(settings.PLE_TEST_STALL_MS, "-1")        # an OverflowError from cffi once
    with pytest.raises(ValueError, match="STRATA_PLE_TEST_STALL_MS=-1 is out of range"):
        settings.ple_test_stall()


def test_watchdog_s(monkeypatch):
    assert trace.watchdog_seconds(None) == trace.DEFAULT_WATCHDOG_S
    monkeypatch.setenv(settings.WATCHDOG_S, "0.5")
    assert trace.watchdog_seconds(None) == 0.5
    assert trace.watchdog_seconds(7) == 7.0
    with pytest.raises(ValueError, match="watchdog_s .* nan"):     # turned the watchdog off unsaid
        trace.watchdog_seconds(float("nan"))
    monkeypatch.setenv(settings.WATCHDOG_S, "soon")
    with pytest.raises(ValueError, match="STRATA_WATCHDOG_S='soon' is not a number of seconds"):
        trace.watchdog_seconds(None)


def test_a_bad_value_names_its_variable(tiny, monkeypatch):
    monkeypatch.setenv(settings.SIM_LINK_GBPS, "fast")
    with pytest.raises(ValueError, match="STRATA_SIM_LINK_GBPS='fast'"):
        Model(tiny, threads=1, n_ctx=64)


def test_ple_defaults_have_one_owner():
    # strata_model_default_params() copies the PLE table layer's defaults; Python adds none of its own
    p = lib.strata_model_default_params()
    assert (p.ple_madv_random, p.ple_prefetch, p.ple_step_timeout_s, p.ple_test_stall_ms, p.ple_test_stall_at) \
        == (1, 1, 300.0, 0, 0)


# ------------------------------------------------------------------------------ who reads the environment

def _c_sources():
    return [p for p in NATIVE_SRC.rglob("*") if p.suffix in (".c", ".h", ".cu", ".cuh")]


def test_native_reads_only_the_documented_variables():
    found = {}
    for p in _c_sources():
        text = p.read_text()
        for m in re.finditer(r"\bgetenv\s*\(", text):
            lit = re.match(r'\s*"([A-Z0-9_]+)"\s*\)', text[m.end():])
            line = text.count("\n", 0, m.start()) + 1
            call = text[text.rfind("\n", 0, m.start()) + 1:m.start()]
            if call.lstrip().startswith(("/*", "*", "//")):
                continue                                     # a comment that mentions getenv
            assert lit, f"{p}:{line}: getenv of a non-literal name (the set of variables must be greppable)"
            found.setdefault(lit.group(1), []).append(f"{p.relative_to(ROOT)}:{line}")
    assert set(found) == {"STRATA_ISA"}, found
    header = (ROOT / "native" / "include" / "strata.h").read_text()
    block = header[header.index("strata_isa strata_isa_best(void)") - 1200:header.index("strata_isa strata_isa_best(void)")]
    for name in found:                                      # documented as debugging overrides, next to STRATA_ISA
        assert name in block, f"{name} is read in C but not documented in strata.h next to strata_isa_best"


def test_python_reads_strata_variables_only_in_settings():
    reads = re.compile(r"os\.environ\.get\(|os\.getenv\(|os\.environ\[|environ\.setdefault\(|os\.environ\.pop\(|"
                       r"os\.environ\.update\(")
    offenders = []
    for p in sorted((ROOT / "pyrunner").glob("*.py")):
        if p.name == "settings.py":
            continue
        for n, line in enumerate(p.read_text().splitlines(), 1):
            if reads.search(line) and "XDG_CACHE_HOME" not in line:    # the cache folder is not a setting
                offenders.append(f"{p.name}:{n}: {line.strip()}")
    assert offenders == [], "read the environment through pyrunner.settings:\n" + "\n".join(offenders)


def test_cli_spells_flags_as_settings_does():
    assert settings.env_name("--sim-link-gbps") == "STRATA_SIM_LINK_GBPS" == settings.SIM_LINK_GBPS
    assert settings.env_name("--threads") == settings.THREADS
    from click.testing import CliRunner
    from pyrunner.cli import main
    out = CliRunner().invoke(main, ["generate", "--help"]).output
    assert "STRATA_SIM_LINK_GBPS" in out and "STRATA_PLE_MODE" in out


@pytest.mark.parametrize("env, says", [({"STRATA_ISA": "sse9"}, "STRATA_ISA='sse9' is not a kernel path"),
                                       ({"STRATA_ISA": "amx"}, "STRATA_ISA=amx"),
                                       ({"STRATA_GEMM": "lots"}, "STRATA_GEMM='lots' is not a column count")])
def test_cli_says_a_bad_setting_without_a_traceback(env, says):
    """A bad STRATA_* value reaches a `strata` user as one line naming the variable (exit 1), not a traceback
    from the import that checks it. amx: refused where this machine cannot run it (here and in CI)."""
    import os
    import subprocess
    import sys

    from pyrunner._native import isa_supported

    if env.get("STRATA_ISA") == "amx" and isa_supported("amx"):
        pytest.skip("this machine runs amx, so STRATA_ISA=amx is a valid setting here")
    r = subprocess.run([sys.executable, "-c", "from pyrunner.cli import main; main()", "config"],
                       env={**os.environ, **env}, capture_output=True, text=True, timeout=120)
    assert r.returncode == 1, (r.returncode, r.stderr)
    assert r.stderr.startswith("Error: " + says), r.stderr
    assert "Traceback" not in r.stderr
