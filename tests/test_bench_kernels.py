"""`strata bench kernels` (pyrunner/bench.py run() and its yardsticks): the batch-1 rotation is sized
from the last-level cache, the int8 peak probe runs on every path this host has and refuses the others,
and each row's two shares and its bound follow from its timing and the yardsticks."""
from __future__ import annotations

import functools
import math

import pytest
from click.testing import CliRunner

from pyrunner import bench
from pyrunner._native import (ISA_NAMES, Context, StrataError, UnsupportedError, check, ffi, isa_best, isa_paths,
                              isa_supported, lib)
from pyrunner.cli import main

MiB = 1 << 20


def _cache_dir(root, index, level, kind, size):
    d = root / f"index{index}"
    d.mkdir()
    (d / "level").write_text(f"{level}\n")
    (d / "type").write_text(f"{kind}\n")
    (d / "size").write_text(f"{size}\n")


def test_llc_is_the_highest_data_cache_level_sysfs_lists(tmp_path, monkeypatch):
    _cache_dir(tmp_path, 0, 1, "Data", "48K")
    _cache_dir(tmp_path, 1, 1, "Instruction", "32K")
    _cache_dir(tmp_path, 2, 3, "Unified", "49152K")
    _cache_dir(tmp_path, 3, 2, "Unified", "2M")
    assert bench.sysfs_llc_bytes(tmp_path) == 48 * MiB
    only_l2 = tmp_path / "l2"
    only_l2.mkdir()
    _cache_dir(only_l2, 0, 1, "Data", "32K")
    _cache_dir(only_l2, 1, 2, "Unified", "1M")
    _cache_dir(only_l2, 2, 4, "Instruction", "64M")   # an instruction cache never counts
    assert bench.sysfs_llc_bytes(only_l2) == MiB
    assert bench.sysfs_llc_bytes(tmp_path / "absent") is None

    def no_name(name):
        raise ValueError(f"unrecognized configuration name {name}")
    monkeypatch.setattr(bench.os, "sysconf", no_name)   # as on this host's CPython
    monkeypatch.setattr(bench, "CACHE_SYSFS", str(tmp_path))
    assert bench.llc_bytes() == 48 * MiB
    monkeypatch.setattr(bench.os, "sysconf", lambda name: 32 * MiB if name == "SC_LEVEL3_CACHE_SIZE" else 0)
    assert bench.llc_bytes() == 32 * MiB


@pytest.mark.parametrize("llc", [None, MiB, 48 * MiB, 200 * MiB])
def test_rotation_follows_the_llc_without_a_copy_cap(llc):
    target = bench.rotation_target(llc)
    assert target == max(8 * (llc or 0), bench.COLD_BYTES) and target >= 8 * (llc or 0)
    expert = 1_740_800                               # Q8_0 640 x 2560: an expert gate/up matrix
    n = bench.rotation_copies(expert, llc)
    assert n * expert >= target > (n - 1) * expert   # enough copies, and no more than that
    if llc and llc >= 48 * MiB:
        assert n > 64                                # the old cap kept 64 MB of copies in a 48 MB L3
    assert bench.rotation_copies(2 * target, llc) == 1


def test_cold_copies_are_aligned_distinct_and_equal():
    w = bytes(range(256)) * 3 + b"\x07"              # 769 bytes: the stride rounds up to 832
    c = bench.cold_copies(w, 5)
    assert c.shape == (5, 832) and c.ctypes.data % 64 == 0 and c.strides[0] == 832
    assert all(c[k, :len(w)].tobytes() == w for k in range(5))


@pytest.fixture
def small_yardsticks(monkeypatch):
    """run() on a small rotation (llc 3 MiB -> 24 MiB of copies) and a 64 MiB bandwidth probe, so a run
    takes a few seconds; both stay real measurements."""
    monkeypatch.setattr(bench, "llc_bytes", lambda: 3 * MiB)
    monkeypatch.setattr(bench, "COLD_BYTES", 4 * MiB)
    monkeypatch.setattr(bench, "probe_bandwidth", functools.partial(bench.probe_bandwidth, nbytes=64 * MiB, reps=2))


@pytest.mark.parametrize("isa", [None, "scalar"])
def test_run_rows_carry_both_shares_and_the_bound(small_yardsticks, isa):
    res = bench.run(types=["Q8_0", "F16"], threads=2, batches=(1, 2), shapes=[("small", 64, 512)], isa=isa,
                    min_time=0.03, log=lambda s: None)
    path = isa or isa_best()
    assert res["isa"] == path and res["llc_bytes"] == 3 * MiB and res["rotation_bytes"] == 24 * MiB
    assert set(res["int8_peak_gmacs"]) == {"1", "2"}
    assert len(res["results"]) == 2 * 2 * 2
    for r in res["results"]:
        assert {"type", "batch", "threads", "shape", "pct_of_probe", "isa", "pct_of_int8_peak", "int8_peak_gmacs",
                "bound", "rotation_bytes"} <= set(r)
        assert r["isa"] == path
        nbytes = 64 * (512 * 34 // 32 if r["type"] == "Q8_0" else 512 * 2)
        if r["batch"] == 1:                          # cold: whole copies, >= 8 x LLC together
            assert r["rotation_bytes"] >= 24 * MiB > r["rotation_bytes"] - nbytes and r["rotation_bytes"] % nbytes == 0
        else:
            assert r["rotation_bytes"] == nbytes
        assert r["probe_gbps"] == res["probe_gbps"][str(r["threads"])]
        assert r["pct_of_probe"] == pytest.approx(100 * nbytes / r["seconds"] / 1e9 / r["probe_gbps"])
        if r["type"] == "F16":                       # float FMAs: the int8 peak does not bound them
            assert r["pct_of_int8_peak"] is None and r["bound"] is None
            continue
        peak = res["int8_peak_gmacs"][str(r["threads"])]
        assert r["int8_peak_gmacs"] == peak and peak == max(res["int8_peak_gmacs_start"][str(r["threads"])],
                                                            res["int8_peak_gmacs_end"][str(r["threads"])])
        assert r["pct_of_int8_peak"] == pytest.approx(100 * 64 * 512 * r["batch"] / r["seconds"] / 1e9 / peak)
        assert r["bound"] == ("memory" if r["pct_of_probe"] >= r["pct_of_int8_peak"] else "compute")


@pytest.mark.parametrize("threads", [1, 2])
def test_int8_peak_is_positive_on_every_path_this_host_runs(threads):
    ctx = Context(threads)
    for isa in isa_paths():
        g = bench.probe_int8_peak(ctx, isa)
        assert math.isfinite(g) and g > 0, isa


def test_int8_peak_refuses_a_path_this_host_cannot_run():
    missing = [n for n in ISA_NAMES if not isa_supported(n)]
    if not missing:
        pytest.skip(f"this host runs every path ({', '.join(ISA_NAMES)})")
    with pytest.raises(UnsupportedError, match=f"isa {missing[0]} cannot run on this CPU"):
        bench.probe_int8_peak(Context(1), missing[0])
    g = ffi.new("double *")
    with pytest.raises(StrataError, match="unknown isa 99"):
        check(lib.strata_probe_int8_peak(ffi.NULL, 99, g))
    with pytest.raises(StrataError, match="gmacs is NULL"):
        check(lib.strata_probe_int8_peak(ffi.NULL, lib.STRATA_ISA_AUTO, ffi.NULL))


def test_cli_isa_option_checks_the_path_and_passes_it_on(monkeypatch):
    r = CliRunner().invoke(main, ["bench", "kernels", "--isa", "sse9"])
    assert r.exit_code == 2 and "'sse9': not a kernel path" in r.output and ", ".join(isa_paths()) in r.output
    missing = [n for n in ISA_NAMES if not isa_supported(n)]
    if missing:
        r = CliRunner().invoke(main, ["bench", "kernels", "--isa", missing[0]])
        assert r.exit_code == 2 and "cannot run it" in r.output
    seen = {}

    def fake_run(**kw):
        seen.update(kw)
        return {"results": []}
    monkeypatch.setattr(bench, "run", fake_run)
    r = CliRunner().invoke(main, ["bench", "kernels", "--isa", "scalar", "--types", "Q8_0", "--json"])
    assert r.exit_code == 0, r.output
    assert seen["isa"] == "scalar" and seen["types"] == ["Q8_0"]
