"""The PLE path (DESIGN §6, issue 6): mmap / direct access and WILLNEED prefetch give the same logits;
the packed NVFP4 table (pack-ple + convert --ple-external) gives the logits of a GGUF that holds the same
dequantized values; sidecar mismatch, truncated table and wrong row width are refused; a stalled gather
worker makes eval fail after STRATA_PLE_STEP_TIMEOUT instead of hanging.

Models: the `tiny` preset (f32) for the access modes; tools/make_tiny_hf.py --modelopt-nvfp4 (its PLE table
is ModelOpt NVFP4 shards, one weight_scale_2 each) for the packed table."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from pyrunner import models, ple
from pyrunner._native import ffi, lib
from pyrunner.cli import main as cli
from pyrunner.convert import ConvertError, convert
from pyrunner.model import Model

ROOT = Path(__file__).resolve().parent.parent
IDS = [int(x) for x in np.random.default_rng(5).integers(0, 250, size=37)]
DECODE = [17, 3, 200, 45, 9]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> str:
    out = tmp_path_factory.mktemp("ple") / "tiny.gguf"
    models.make_model("tiny", str(out), recipe="f32", seed=4)
    return str(out)


def _run(path: str, **kw) -> tuple[np.ndarray, dict, dict]:
    """Prefill IDS (all logits), then decode DECODE one token at a time; (logits, info, stats)."""
    with Model(path, threads=2, n_ctx=256, kv_type="f32", **kw) as m:
        s = m.session()
        out = [s.eval(IDS, all_logits=True)]
        out += [s.eval([t])[None] for t in DECODE]
        return np.concatenate(out), ple.model_info(m), s.stats()


@pytest.fixture(scope="module")
def reference(tiny):
    return _run(tiny, ple_mode="mmap")


@pytest.mark.parametrize("mode", ["direct", "auto"])
@pytest.mark.parametrize("prefetch", ["1", "0"])
def test_modes_and_prefetch_give_the_same_logits(tiny, reference, mode, prefetch, monkeypatch):
    monkeypatch.setenv("STRATA_PLE_PREFETCH", prefetch)
    logits, info, stats = _run(tiny, ple_mode=mode)
    np.testing.assert_array_equal(logits, reference[0])
    assert info["prefetch"] == (prefetch == "1")
    if mode == "direct":
        assert info["mode"] == "direct" and "asked for" in info["why"]
    else:
        assert info["mode"] in ("mmap", "direct") and "auto" in info["why"]
    assert info["path"] == os.path.realpath(tiny)
    assert stats["ple_prefill_prefetch_pages"] > 0 if prefetch == "1" else stats["ple_prefill_prefetch_pages"] == 0


def test_mmap_reports_madv_random_and_counts_rows(tiny, reference):
    _, info, stats = reference
    assert info["mode"] == "mmap" and info["madv_random"] and not info["external"]
    heads = 4   # tiny: (ngram 3 - 1) x 2 heads per order
    assert stats["ple_prefill_steps"] == 1 and stats["ple_prefill_tokens"] == len(IDS)
    assert stats["ple_decode_steps"] == len(DECODE) and stats["ple_decode_tokens"] == len(DECODE)
    assert stats["ple_prefill_rows"] == len(IDS) * heads and stats["ple_decode_rows"] == len(DECODE) * heads
    assert stats["ple_rows"] == (len(IDS) + len(DECODE)) * heads
    assert stats["ple_prefill_gather_s"] > 0 and stats["ple_decode_wait_s"] > 0
    assert {"ple_read_bytes", "ple_major_faults", "ple_wait_s"} <= set(stats)


def test_describe_names_mode_and_reason(tiny):
    with Model(tiny, threads=1, n_ctx=32, ple_mode="direct") as m:
        line = ple.describe(m)
    assert line.startswith("PLE table in the GGUF (") and "direct pread (asked for" in line and "prefetch on" in line


def test_resident_pages_count_the_table(tiny):
    with Model(tiny, threads=1, n_ctx=64) as m:
        m.session().eval(IDS[:8])
        res, total = ple.resident(m)
        info = ple.model_info(m)
    assert total >= info["table_bytes"] // 4096 and 0 < res <= total


def test_bad_ple_mode_is_refused(tiny):
    with pytest.raises(ValueError, match="ple_mode 'fast'"):
        Model(tiny, ple_mode="fast")


# ---------------------------------------------------------------------------------------------- the row cache

# a text of the tiny vocabulary that repeats itself (n-grams recur) and wanders (the working set outgrows a
# small cache): 600 tokens, 2,400 row lookups, ~1,000 distinct rows
_TEXT = [int(x) for x in np.random.default_rng(11).integers(0, 40, size=300)] * 2


@pytest.mark.parametrize("mode", ["mmap", "direct"])
def test_row_cache_returns_the_table_rows_and_stays_bounded(tiny, mode):
    """Gathers through a row cache smaller than the working set (so CLOCK evicts) give the bytes a
    cache-less gather reads, row for row, in decode-sized and prefill-sized steps."""
    budget = 100 * 64                                          # 100 rows of the tiny f32 table (64 B a row)
    with Model(tiny, threads=1, n_ctx=64, ple_mode=mode, ple_cache_mib=0) as m:
        off_ids, off_rows, off_st = ple.gather(m, _TEXT, one_token_steps=True)
        assert ple.model_info(m)["cache_capacity"] == 0
    assert off_st["cache_lookups"] == 0 and off_st["cache_hits"] == 0
    assert off_st["miss_pages"] == off_st["floor_pages"] > 0 and off_st["miss_sectors"] == off_st["floor_sectors"]
    with Model(tiny, threads=1, n_ctx=64, ple_mode=mode, ple_cache_mib=budget / 2**20) as m:
        info = ple.model_info(m)
        assert info["row_bytes"] == 64 and info["cache_capacity"] == 100
        if mode == "direct" and info["odirect"]:
            assert info["dio_align"] in (512, 4096) and "O_DIRECT" in info["why"]
        for one in (True, False):
            ids, rows, st = ple.gather(m, _TEXT, one_token_steps=one)
            np.testing.assert_array_equal(ids, off_ids)
            np.testing.assert_array_equal(rows, off_rows)
            assert st["cache_lookups"] == st["rows"] == len(_TEXT) * 4
            assert 0 < st["cache_hits"] < st["cache_lookups"]        # the second half repeats the first
            assert st["cache_hit_bytes"] == 64 * st["cache_hits"]
            assert st["miss_sectors"] <= st["floor_sectors"] and st["miss_pages"] <= st["floor_pages"]
            info = ple.model_info(m)
            assert info["cache_used"] == info["cache_capacity"]     # full, and no more than that
            assert info["cache_used"] * info["row_bytes"] <= budget


def test_a_repeated_token_hits_the_row_cache(tiny):
    with Model(tiny, threads=1, n_ctx=64) as m:                 # default budget: the whole tiny table fits
        info = ple.model_info(m)
        assert info["cache_capacity"] == info["rows"] and info["cache_index_bytes"] > 0
        ctx = [5, 6]
        _, a, first = ple.gather(m, [7, 8, 9], ctx=ctx)
        _, b, again = ple.gather(m, [7, 8, 9], ctx=ctx)
    np.testing.assert_array_equal(a, b)
    assert first["cache_lookups"] == again["cache_lookups"] == 12
    assert again["cache_hits"] == 12 and again["miss_pages"] == 0 and again["miss_sectors"] == 0
    assert first["cache_hits"] < 12 and again["floor_pages"] == first["floor_pages"]


def _gather_threads(m, calls) -> tuple[list, list[str]]:
    """(ple.gather's result for each of `calls`, its arguments; the name of the thread that ran each one's
    ple_gather)."""
    lib.strata_trace_enable(1, 4096)
    try:
        got = [ple.gather(m, *c) for c in calls]
        buf = ffi.new("strata_trace_event[]", 4096)
        n = lib.strata_trace_drain(buf, 4096)
        names = []
        for i in range(n):
            if ffi.string(lib.strata_trace_kind_name(buf[i].kind)).decode() == "ple_gather":
                name = ffi.new("char[]", 64)
                lib.strata_trace_thread_name(buf[i].tid, name, 64)
                names.append(ffi.string(name).decode())
    finally:
        lib.strata_trace_enable(0, 0)
    return got, names


def test_a_step_the_row_cache_holds_is_gathered_without_the_worker(tiny, reference):
    """A step whose rows are all in the row cache is gathered by the thread that asks (no storage to wait
    for: the worker's wake-up and the wait for it cost more than the copies); one with a row the cache lacks
    goes to the worker. The rows and the counters are the same either way, and so are the logits."""
    with Model(tiny, threads=1, n_ctx=64) as m:
        got, names = _gather_threads(m, [([7, 8, 9], [5, 6]), ([7, 8, 9], [5, 6]), ([7, 8, 9], [5, 6]), ([40], [9, 8])])
    (_, a, first), (_, b, again), (_, c, third), (_, _, other) = got
    assert first["cache_hits"] < 12 and again["cache_hits"] == third["cache_hits"] == 12
    assert other["cache_hits"] < 4                         # an n-gram not seen yet: its step reads the table
    np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(a, c)
    for k in ("rows", "floor_pages", "floor_sectors", "cache_lookups"):
        assert first[k] == again[k], k
    assert again["read_bytes"] == 0 and again["miss_pages"] == 0 and again["wait_s"] >= 0
    assert names[0] == names[3] == "PLE worker" and names[1] == names[2] != "PLE worker"
    # decoding a text twice: the second pass finds its rows cached; the logits are the worker's, bit for bit
    with Model(tiny, threads=2, n_ctx=256, kv_type="f32", ple_mode="mmap") as m:
        for _ in range(2):
            s = m.session()
            out = [s.eval(IDS, all_logits=True)] + [s.eval([t])[None] for t in DECODE]
        st = s.stats()
    np.testing.assert_array_equal(np.concatenate(out), reference[0])
    assert st["ple_decode_cache_hits"] == st["ple_decode_cache_lookups"] == len(DECODE) * 4


def test_a_batched_step_gathers_once_and_shares_its_counters(tiny):
    """Several sequences in one strata_batch_eval make one gather on the PLE worker (issue 18): each
    session's rows, tokens and steps are its own, and the shared counters (lookups, hits, floors,
    bytes) add up over the sessions to the step's. The logits are those of each one alone."""
    V, steps = None, [np.array(x, np.int32) for x in ([3, 4, 5], [9], [9, 10], [11])]
    with Model(tiny, threads=1, n_ctx=64) as m:
        V = m.n_vocab
        NH = ple.model_info(m)["heads"]
        alone, batched = [m.session() for _ in steps], [m.session() for _ in steps]
        ref = [np.empty(V, np.float32) for _ in steps]
        out = [np.empty(V, np.float32) for _ in steps]
        for s, ids, o in zip(alone, steps, ref):
            m.eval_batch([(s, ids, 0, o, None)])
        lib.strata_trace_enable(1, 4096)
        try:
            m.eval_batch([(s, ids, 0, o, None) for s, ids, o in zip(batched, steps, out)])
            buf = ffi.new("strata_trace_event[]", 4096)
            kinds = [ffi.string(lib.strata_trace_kind_name(buf[i].kind)).decode()
                     for i in range(lib.strata_trace_drain(buf, 4096))]
        finally:
            lib.strata_trace_enable(0, 0)
        got = [s.stats() for s in batched]
        assert kinds.count("ple_gather") == 1 and kinds.count("ple_wait") == 1
        solo = [s.stats() for s in alone]
    for a, b in zip(ref, out):
        assert np.array_equal(a, b)
    for ids, g, o in zip(steps, got, solo):
        ph = "prefill" if ids.size > 1 else "decode"
        assert g[f"ple_{ph}_steps"] == o[f"ple_{ph}_steps"] == 1
        assert g[f"ple_{ph}_tokens"] == ids.size and g["ple_rows"] == o["ple_rows"] == ids.size * NH
    # the one gather's lookups are every row's; shared out, they add up to it exactly
    assert sum(g["ple_prefill_cache_lookups"] + g["ple_decode_cache_lookups"] for g in got) == \
        sum(ids.size for ids in steps) * NH
    total_pages = sum(g["ple_prefill_floor_pages"] + g["ple_decode_floor_pages"] for g in got)
    assert 0 < total_pages <= sum(o["ple_prefill_floor_pages"] + o["ple_decode_floor_pages"] for o in solo)


def test_row_cache_off_keeps_the_counters_and_logits(tiny, reference):
    logits, info, st = _run(tiny, ple_mode="mmap", ple_cache_mib=0)
    np.testing.assert_array_equal(logits, reference[0])
    assert info["cache_capacity"] == 0 and st["ple_cache_lookups"] == 0 and st["ple_cache_hits"] == 0
    ref = reference[2]
    for k in ("ple_rows", "ple_prefill_steps", "ple_decode_steps", "ple_prefill_tokens", "ple_decode_tokens",
              "ple_prefill_floor_pages", "ple_decode_floor_sectors"):
        assert st[k] == ref[k], k
    assert st["ple_decode_miss_pages"] == st["ple_decode_floor_pages"]
    # the default run (cache on) looked every row up: the decode tokens continue the prompt's n-grams
    assert ref["ple_cache_lookups"] == ref["ple_rows"]


def test_ple_cache_mib_from_the_environment_and_refused_below_zero(tiny, monkeypatch):
    monkeypatch.setenv("STRATA_PLE_CACHE_MIB", "0")
    with Model(tiny, threads=1, n_ctx=32) as m:
        assert ple.model_info(m)["cache_capacity"] == 0
    monkeypatch.delenv("STRATA_PLE_CACHE_MIB")
    with pytest.raises(ValueError, match="ple_cache_mib"):
        Model(tiny, ple_cache_mib=-1)


@pytest.fixture(scope="module")
def tiny_mtp(tmp_path_factory) -> str:
    out = tmp_path_factory.mktemp("ple_mtp") / "tiny-mtp.gguf"
    models.make_model("tiny", str(out), recipe="f32", seed=3, mtp=True)
    return str(out)


def test_greedy_generation_is_the_same_with_and_without_the_row_cache(tiny_mtp):
    """Plain decode and MTP windows (whose drafts' rows are read ahead into the cache) give the same tokens
    with the cache off, evicting (40 rows) and holding the table."""
    out = {}
    for mib in (0, 40 * 64 / 2**20, None):
        for mtp in (0, 2):
            with Model(tiny_mtp, threads=1, n_ctx=256, kv_type="f32", mtp=mtp, ple_cache_mib=mib) as m:
                c = m.generate(IDS, max_tokens=24, temperature=0.0)
                s = m.own_session.stats()
            out[(mib, mtp)] = (c.tokens, s)
    for key, (tokens, _) in out.items():
        assert tokens == out[(0, 0)][0], key
    assert c.stats["ple_cache_lookups"] == c.stats["ple_rows"] > 0 and 0 < c.stats["ple_cache_hits"] <= c.stats["ple_rows"]
    for mib in (40 * 64 / 2**20, None):       # MTP windows read their rows ahead; plain decode does not
        warm = lambda st: st["ple_prefill_warm_rows"] + st["ple_decode_warm_rows"]
        assert warm(out[(mib, 2)][1]) > 0 and warm(out[(mib, 0)][1]) == 0
    assert out[(0, 2)][1]["ple_prefill_warm_rows"] == 0


# ---------------------------------------------------------------------------------------------- the handshake

_STALL = """
import sys, time
from pyrunner.model import Model
from pyrunner._native import StrataError
m = Model(sys.argv[1], threads=1, n_ctx=64)
s = m.session()
t0 = time.monotonic()
try:
    s.eval([1, 2, 3])
    print("NO ERROR")
except StrataError as e:
    print("ERR", round(time.monotonic() - t0, 2), e)
t1 = time.monotonic()
m.close()
print("CLOSED", round(time.monotonic() - t1, 2))
"""


def test_stalled_worker_times_out_and_nothing_hangs(tiny):
    env = dict(os.environ, STRATA_PLE_STEP_TIMEOUT="0.3", STRATA_PLE_TEST_STALL_MS="1500")
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-c", _STALL, tiny], env=env, capture_output=True, text=True, timeout=60,
                       cwd=ROOT)
    wall = time.monotonic() - t0
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].startswith("ERR"), r.stdout
    assert "did not finish within 0.3 s" in lines[0] and "STRATA_PLE_STEP_TIMEOUT" in lines[0]
    assert float(lines[0].split()[1]) < 1.2          # failed at the timeout, not after the stall
    assert lines[1].startswith("CLOSED")             # close joined the worker once it finished
    assert wall < 30


def test_without_stall_the_same_timeout_passes(tiny):
    env = dict(os.environ, STRATA_PLE_STEP_TIMEOUT="30")
    r = subprocess.run([sys.executable, "-c", _STALL, tiny], env=env, capture_output=True, text=True, timeout=60,
                       cwd=ROOT)
    assert r.stdout.startswith("NO ERROR"), r.stdout + r.stderr


# ---------------------------------------------------------------------------------------------- packed NVFP4

from model_oracles import tiny_hf_tool as _tool  # noqa: E402  (tools/make_tiny_hf.py, loaded once)


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    work = tmp_path_factory.mktemp("ple_packed")
    hf = _tool().make(str(work / "mo"), seed=2, modelopt_nvfp4=True)
    res = CliRunner().invoke(cli, ["pack-ple", hf, "-o", str(work / "packed")])
    assert res.exit_code == 0, res.output
    inplace = str(work / "inplace.gguf")
    external = str(work / "gguf" / "external.gguf")
    os.makedirs(work / "gguf")
    convert(hf, inplace, "f32")
    convert(hf, external, "f32", ple_external=str(work / "packed"))
    return {"hf": hf, "dir": work / "packed", "inplace": inplace, "external": external, "work": work}


def test_pack_ple_layout(packed):
    from pyrunner.safetensors_io import Checkpoint
    table, meta = ple.read_sidecar(str(packed["dir"]))
    ck = Checkpoint(packed["hf"])
    _, names = ple.find_shards(ck)
    assert meta["num_shards"] == len(names) == 4 and meta["row_dim"] == 16
    assert meta["row_width"] == 9 and meta["code_bytes"] == 8 and meta["scale_bytes"] == 1
    raw = np.fromfile(table, dtype=np.uint8).reshape(meta["total_rows"], 9)
    r0 = 0
    for n in names:
        w, s = ck.raw(n), ck.raw(n + "_scale")
        np.testing.assert_array_equal(raw[r0:r0 + w.shape[0], :8], w)
        np.testing.assert_array_equal(raw[r0:r0 + w.shape[0], 8:], s)
        r0 += w.shape[0]
    assert r0 == meta["total_rows"]
    assert meta["global_scales"] == [float(np.asarray(ck.raw(n + "_scale_2")).reshape(-1)[0]) for n in names]
    assert not [p for p in os.listdir(packed["dir"]) if p.endswith(".tmp")]


def test_packed_table_matches_the_dequantized_gguf(packed):
    from gguf import GGUFReader
    ext = GGUFReader(packed["external"])
    assert "per_layer_token_embd.weight" not in {t.name for t in ext.tensors}
    assert "per_layer_token_embd.weight" in {t.name for t in GGUFReader(packed["inplace"]).tensors}
    a, ia, _ = _run(packed["inplace"], ple_mode="mmap")
    for mode in ("mmap", "direct"):
        b, ib, st = _run(packed["external"], ple_mode=mode)
        assert ib["external"] and ib["row_bytes"] == 9 and ib["mode"] == mode
        np.testing.assert_array_equal(a, b)
    assert not ia["external"]


def test_convert_cli_ple_external(packed, tmp_path):
    from gguf import GGUFReader
    out = tmp_path / "cli.gguf"
    r = CliRunner().invoke(cli, ["convert", packed["hf"], "-o", str(out), "--ple-external", str(packed["dir"]), "-q"])
    assert r.exit_code == 0, r.output
    kv = GGUFReader(str(out)).fields
    rel = bytes(kv["strata.ple_external"].parts[-1]).decode()
    assert os.path.normpath(os.path.join(tmp_path, rel)) == os.path.normpath(packed["dir"] / ple.TABLE_NAME)
    with Model(str(out), n_ctx=32) as m:
        assert ple.model_info(m)["external"]


def _copy_external(packed, name: str) -> tuple[str, str]:
    """A private copy of the external GGUF and its packed table (the GGUF names it relatively)."""
    d = packed["work"] / name
    shutil.copytree(packed["work"] / "gguf", d / "gguf")
    shutil.copytree(packed["dir"], d / "packed")
    return str(d / "gguf" / "external.gguf"), str(d / "packed" / ple.TABLE_NAME)


def _edit_sidecar(table: str, **kw) -> None:
    side = ple.sidecar_path(table)
    with open(side) as f:
        meta = json.load(f)
    meta.update(kw)
    with open(side, "w") as f:
        json.dump(meta, f)


def test_truncated_table_is_refused(packed):
    gguf, table = _copy_external(packed, "trunc")
    with open(table, "r+b") as f:
        f.truncate(os.path.getsize(table) - 9)
    with pytest.raises(Exception, match=r"truncated or from another checkpoint.*pack-ple"):
        Model(gguf, n_ctx=32)


def test_wrong_row_width_is_refused(packed):
    gguf, table = _copy_external(packed, "width")
    _edit_sidecar(table, row_dim=32, code_bytes=16, scale_bytes=2, row_width=18)
    with pytest.raises(Exception, match=r"rows of 32 values .* do not fit this model's 16-value rows"):
        Model(gguf, n_ctx=32)


def test_sidecar_counts_that_are_not_whole_numbers_are_refused(packed):
    gguf, table = _copy_external(packed, "counts")
    with open(ple.sidecar_path(table)) as f:
        meta = json.load(f)
    _edit_sidecar(table, num_shards=meta["num_shards"] + 0.5)
    with pytest.raises(Exception, match=r"num_shards .* do not agree; rebuild it with `strata pack-ple`"):
        Model(gguf, n_ctx=32)


def test_sidecar_from_another_checkpoint_is_refused(packed):
    gguf, table = _copy_external(packed, "source")
    _edit_sidecar(table, source="other sha256:0000000000000000")
    with pytest.raises(Exception, match=r"source \"other sha256:0+\" is not the checkpoint"):
        Model(gguf, n_ctx=32)
    gguf, table = _copy_external(packed, "rows")
    with open(ple.sidecar_path(table)) as f:
        meta = json.load(f)
    _edit_sidecar(table, total_rows=meta["total_rows"] - 1)
    with pytest.raises(Exception, match=r"do not agree|another checkpoint|truncated"):
        Model(gguf, n_ctx=32)


def test_missing_table_is_refused(packed):
    gguf, table = _copy_external(packed, "missing")
    os.unlink(ple.sidecar_path(table))
    with pytest.raises(Exception, match=r"sidecar .* cannot be opened"):
        Model(gguf, n_ctx=32)


def test_a_refused_table_closes_no_descriptor_of_the_process(packed):
    """A load refused before its table opened closed descriptor 0 (the table's direct-read descriptor was
    zero-initialised): the process lost its stdin, and a later child process (nvcc) failed on it."""
    gguf, table = _copy_external(packed, "fds")
    os.unlink(ple.sidecar_path(table))
    code = ("import os, sys\n"
            "from pyrunner.model import Model\n"
            "before = sorted(os.listdir('/proc/self/fd'))\n"
            "try:\n    Model(sys.argv[1], n_ctx=32)\nexcept Exception:\n    pass\n"
            "print(before, sorted(os.listdir('/proc/self/fd')))\n"
            "os.fstat(0)\n")
    r = subprocess.run([sys.executable, "-c", code, gguf], stdin=subprocess.PIPE, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]


def test_convert_refuses_a_table_of_another_checkpoint(packed, tmp_path):
    other = _tool().make(str(tmp_path / "other"), seed=7, modelopt_nvfp4=True)
    with pytest.raises(ConvertError, match="not from this checkpoint"):
        convert(other, str(tmp_path / "x.gguf"), "f32", ple_external=str(packed["dir"]))


def test_pack_ple_refuses_a_float_table(packed):
    float_twin = _tool().dequant_dir(packed["hf"])
    r = CliRunner().invoke(cli, ["pack-ple", float_twin, "-o", str(packed["work"] / "f")])
    assert r.exit_code != 0 and "not ModelOpt NVFP4 codes" in r.output and "stays in the GGUF" in r.output


def test_pack_ple_cli_errors(tmp_path):
    r = CliRunner().invoke(cli, ["pack-ple", str(tmp_path), "-o", str(tmp_path / "o")])
    assert r.exit_code != 0 and "no *.safetensors" in r.output


def test_bench_ple_cli(tiny):
    r = CliRunner().invoke(cli, ["bench", "ple", "-m", tiny, "--json", "--decode-tokens", "3", "--prompt-tokens", "40",
                                 "--gather-tokens", "5", "--threads", "1"])
    assert r.exit_code == 0, r.output
    res = json.loads(r.stdout.strip().splitlines()[-1])
    assert [d["setting"] for d in res["decode"]] == ["mmap, default readahead", "mmap, MADV_RANDOM", "direct pread"]
    assert "default readahead" in res["decode"][0]["why"] and "MADV_RANDOM" in res["decode"][1]["why"]
    assert all(d["tokens"] == 3 and d["rows_per_token"] == 4 for d in res["decode"])
    assert [(p["mode"], p["prefetch"]) for p in res["prefill"]] == [("mmap", False), ("mmap", True),
                                                                    ("direct", False), ("direct", True)]
    assert all(p["rows"] == 40 * 4 for p in res["prefill"]) and all(g["rows"] == 5 * 4 for g in res["gather"])
    assert all((p["prefetch_pages"] > 0) == p["prefetch"] for p in res["prefill"])
    # issue 21.3: storage per decode token against the access mode's floor, cache off and on, cold then warm
    fl = res["floor"]
    assert [(r["mode"], r["cache_mib"], r["phase"]) for r in fl] == [
        (m, c, p) for m in ("mmap", "direct") for c in (0.0, 64.0) for p in ("cold", "warm")]
    for r in fl:
        assert r["tokens"] == 3 and r["floor_kib_per_token"] > 0 and r["vs_seed"] >= 0
        assert r["sector_floor_kib_per_token"] <= 4 * 1.0 and r["page_floor_kib_per_token"] <= 4 * 8.0
        assert (r["hit_rate"] is None) == (r["cache_mib"] == 0)
    on_warm = [r for r in fl if r["cache_mib"] and r["phase"] == "warm"]
    assert all(r["hit_rate"] == 1.0 and r["miss_floor_kib_per_token"] == 0 for r in on_warm)
    assert res["seed_kib_per_token"] == 57.0


def test_bench_ple_corpus_hit_rate(tiny, tmp_path):
    corpus = tmp_path / "ids.npy"
    np.save(corpus, np.asarray(_TEXT, dtype=np.int32))
    r = CliRunner().invoke(cli, ["bench", "ple", "-m", tiny, "--json", "--decode-tokens", "2", "--prompt-tokens", "8",
                                 "--gather-tokens", "2", "--threads", "1", "--corpus", str(corpus),
                                 "--corpus-budgets", "0.006103515625,1"])
    assert r.exit_code == 0, r.output
    res = json.loads(r.stdout.strip().splitlines()[-1])
    assert res["decode_ids"] == "corpus" and res["corpus"]["tokens"] == len(_TEXT)
    small, big = res["corpus"]["runs"]
    assert small["cache_rows"] == 100 and big["cache_rows"] == big["table_rows"]
    assert small["lookups"] == big["lookups"] == 4 * len(_TEXT)
    assert 0 < small["hit_rate"] <= big["hit_rate"] < 1          # the second half of the text repeats the first
    assert big["saved_row_bytes"] == 64 * big["hits"] and big["saved_sector_bytes_per_token"] > 0
    bad = tmp_path / "bad.npy"
    np.save(bad, np.asarray([10**6], dtype=np.int32))
    r = CliRunner().invoke(cli, ["bench", "ple", "-m", tiny, "--decode-tokens", "1", "--prompt-tokens", "4",
                                 "--gather-tokens", "1", "--threads", "1", "--corpus", str(bad)])
    assert r.exit_code != 0 and "token ids must lie in" in r.output


def test_bench_ple_refuses_a_model_without_ple(tmp_path):
    p = json.load(open(ROOT / "models" / "micro.json"))
    p["ple_layer_ids"] = []
    (tmp_path / "nople.json").write_text(json.dumps(p))
    out = str(tmp_path / "nople.gguf")
    models.make_model(str(tmp_path / "nople.json"), out, recipe="f32", seed=0)
    r = CliRunner().invoke(cli, ["bench", "ple", "-m", out, "--decode-tokens", "1"])
    assert r.exit_code != 0 and "has no PLE table" in r.output


def _write_safetensors(path: str, tensors: dict) -> None:
    """A safetensors file from {name: (dtype name, numpy array)} (raw bytes, header as the format says)."""
    header, off, blobs = {}, 0, []
    for name, (dt, a) in tensors.items():
        b = np.ascontiguousarray(a).tobytes()
        header[name] = {"dtype": dt, "shape": list(a.shape), "data_offsets": [off, off + len(b)]}
        off += len(b)
        blobs.append(b)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(len(h).to_bytes(8, "little") + h)
        for b in blobs:
            f.write(b)


_PACK_RSS = """
import resource, sys
from pyrunner import ple
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
ple.CHUNK_ROWS = 4096
ple.pack_ple(sys.argv[1], sys.argv[2])
print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) * 1024)
"""


def test_pack_ple_streams_with_bounded_memory(tmp_path):
    """16 shards of 40,000 rows (160 values: 57.6 MB packed), two safetensors files: the packed bytes are
    the shards' codes and scales in order, and the packer's peak resident memory grows by far less than
    the table (it reads one chunk at a time)."""
    rng = np.random.default_rng(0)
    ck = tmp_path / "ck"
    ck.mkdir()
    pre = "model.layers.1.ple.ple_embedding.ngram_embedding"
    shards = []
    for part in range(2):
        t = {}
        for i in range(part * 8, part * 8 + 8):
            w = rng.integers(0, 256, (40000, 80), dtype=np.uint8)
            s = rng.integers(0x20, 0x50, (40000, 10), dtype=np.uint8)
            t[f"{pre}.shard_{i}.weight"] = ("U8", w)
            t[f"{pre}.shard_{i}.weight_scale"] = ("F8_E4M3", s)
            t[f"{pre}.shard_{i}.weight_scale_2"] = ("F32", np.array([0.01 * (i + 1)], dtype=np.float32))
            shards.append((w, s))
        _write_safetensors(str(ck / f"model-{part}.safetensors"), t)
    out = tmp_path / "out"
    r = subprocess.run([sys.executable, "-c", _PACK_RSS, str(ck), str(out)], capture_output=True, text=True,
                       timeout=120, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    grew = int(r.stdout.split()[-1])
    table, meta = ple.read_sidecar(str(out))
    assert meta["total_rows"] == 640000 and meta["rows_per_shard"] == 40000 and meta["row_width"] == 90
    assert meta["global_scales"] == [float(np.float32(0.01 * (i + 1))) for i in range(16)]
    raw = np.fromfile(table, dtype=np.uint8).reshape(-1, 90)
    for i, (w, s) in enumerate(shards):
        np.testing.assert_array_equal(raw[i * 40000:(i + 1) * 40000, :80], w)
        np.testing.assert_array_equal(raw[i * 40000:(i + 1) * 40000, 80:], s)
    assert grew < 24 << 20, f"pack-ple's resident memory grew by {grew / 2**20:.1f} MiB for a 57.6 MB table"


# ---------------------------------------------------------------------------------------------- imports

@pytest.mark.parametrize("mod, other", [("pyrunner.ple", "pyrunner.convert"), ("pyrunner.convert", "pyrunner.ple")])
def test_ple_and_convert_do_not_import_each_other(mod, other):
    # both read checkpoints through pyrunner.safetensors_io; importing one must not load the other
    code = f"import sys, {mod}; print('pyrunner.safetensors_io' in sys.modules, {other!r} in sys.modules)"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["True", "False"], r.stdout
    # nor later, inside a function: pack-ple reads shards without the converter
    assert "from .convert" not in (ROOT / "pyrunner" / "ple.py").read_text()
