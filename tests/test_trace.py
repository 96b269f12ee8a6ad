"""Request watchdog, --trace timeline, `strata plot` and live stats (DESIGN §7, issue 9).

Real stalls, no mocks: the PLE gather worker stalled by its test hook (STRATA_PLE_TEST_STALL_MS, only
at worker step STRATA_PLE_TEST_STALL_AT; both read when a model loads), and the sim device's link made
so slow that one expert copy takes hours. The trace's content is checked against the request's own
stats (cache hits and lookups, PLE rows, PCIe copies), its nesting per thread (window > layer > mixer /
MoE) and its counters; tracing on leaves tokens and logits bit-identical."""
from __future__ import annotations

import json
import time
from collections import defaultdict

import numpy as np
import pytest
from click.testing import CliRunner

from pyrunner import trace
from pyrunner.cli import main as cli
from pyrunner.generate import generate
from pyrunner.gguf import GGUFFile
from pyrunner.model import Model
from pyrunner.models import make_model

PROMPT = [int(x) for x in np.random.default_rng(9).integers(1, 250, size=21)]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("trace") / "tiny.gguf"
    make_model("tiny", str(path), recipe="f32", seed=0)
    return str(path)


@pytest.fixture(scope="module")
def tiny_mtp(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("trace_mtp") / "tiny_mtp.gguf"
    make_model("tiny", str(path), recipe="f32", seed=0, mtp=True)
    return str(path)


@pytest.fixture(scope="module")
def reference(tiny) -> list[int]:
    with Model(tiny, threads=2, n_ctx=256) as m:
        return generate(m, PROMPT, max_tokens=10, temperature=0, watchdog_s=0).tokens


def _sim(path, **kw) -> Model:
    args = dict(threads=2, n_ctx=256, device="sim", tail_skip=0)
    args.update(kw)
    return Model(path, **args)


def _traced(path, tmp_path, model_kw=None, **gen_kw):
    out = tmp_path / "t.json"
    with _sim(path, **(model_kw or {})) as m, trace.Tracer(out):
        c = generate(m, PROMPT, temperature=0, **gen_kw)
        n_layer, ple_layer = m.n_layer, m.ple_layer
    return c, json.loads(out.read_text()), n_layer, ple_layer


# ------------------------------------------------------------------------------------ trace content


def test_trace_windows_layers_nesting_and_counters(tiny, tmp_path):
    c, d, n_layer, ple_layer = _traced(tiny, tmp_path, dict(cache_gib=0.0002, pcie_frac=0.5), max_tokens=8)
    assert c.finish_reason == "length" and c.stats["pcie_groups"] > 0 and c.stats["cache_hits"] > 0
    md = GGUFFile(tiny).metadata()
    k_used = int(md[f"{md['general.architecture']}.expert_used_count"])
    ev = d["traceEvents"]
    names = {e["tid"]: e["args"]["name"] for e in ev if e["ph"] == "M" and e["name"] == "thread_name"}
    assert {"model", "PLE worker", "sim copy", "sim compute"} <= set(names.values())
    model_tid = next(t for t, n in names.items() if n == "model")
    # pool work per thread: share 0 is the caller's (the model thread), share k the worker "pool k"
    pool = [e for e in ev if e.get("cat") == "pool_task"]
    assert pool and all(e["args"]["tasks"] >= 1 for e in pool)
    for e in pool:
        k = e["args"]["thread"]
        assert names[e["tid"]] == ("model" if k == 0 else f"pool {k}")
    X = [e for e in ev if e["ph"] == "X"]
    windows = sorted((e for e in X if e["cat"] == "step"), key=lambda e: e["ts"])
    # one forward step for the prompt, one per decode step (the last sampled token is not evaluated)
    assert [w["args"]["tokens"] for w in windows] == [len(PROMPT)] + [1] * (c.stats["generated_tokens"] - 1)
    assert all(w["tid"] == model_tid for w in windows)

    def inside(e, outer):
        return outer["ts"] <= e["ts"] + 1e-3 and e["ts"] + e["dur"] <= outer["ts"] + outer["dur"] + 1e-3

    layers = [e for e in X if e["cat"] == "layer"]
    for w in windows:
        ls = sorted((e for e in layers if inside(e, w)), key=lambda e: e["ts"])
        assert [e["args"]["layer"] for e in ls] == list(range(n_layer))      # every layer, in order
        for e in ls:
            parts = [p for p in X if p["cat"] in ("mixer", "moe", "ple") and inside(p, e) and p["tid"] == model_tid]
            kinds = [p["cat"] for p in sorted(parts, key=lambda p: p["ts"])]
            want = (["ple"] if e["args"]["layer"] == ple_layer else []) + ["mixer", "moe"]
            assert kinds == want
    # on every thread, spans nest or follow each other (no partial overlap)
    by_tid = defaultdict(list)
    for e in X:
        by_tid[e["tid"]].append((e["ts"], e["ts"] + e["dur"]))
    for tid, spans in by_tid.items():
        stack = []
        for t0, t1 in sorted(spans, key=lambda s: (s[0], -s[1])):
            while stack and stack[-1] <= t0 + 1e-3:
                stack.pop()
            assert not stack or t1 <= stack[-1] + 1e-3, f"thread {names.get(tid)}: overlapping spans"
            stack.append(t1)
    # the trace's events add up to the request's stats
    moe = [e for e in X if e["cat"] == "moe"]
    # hits and lookups count routed picks: a layer's event of `tokens` rows looked up tokens x K picks
    # (K routed experts per token); `experts` counts its groups, which are fewer once tokens share one
    assert sum(e["args"]["hits"] for e in moe) == c.stats["cache_hits"]
    assert sum(e["args"]["tokens"] * k_used for e in moe) == c.stats["cache_lookups"]
    assert sum(e["args"]["experts"] for e in moe) < c.stats["cache_lookups"]
    assert sum(e["args"]["rows"] for e in X if e["cat"] == "ple_gather") == c.stats["ple_rows"]
    copy_tid = next(t for t, n in names.items() if n == "sim copy")
    copies = [e for e in X if e["cat"] == "dev_copy" and e["tid"] == copy_tid]   # (not their slot tracks)
    assert len(copies) == c.stats["pcie_groups"] + c.stats["cache_swaps"]
    assert all(e["args"]["bytes"] > 0 for e in copies)
    assert any(e["cat"] == "dev_compute" for e in X) and any(e["cat"] == "pool_task" for e in X)
    assert any(e["cat"] == "merge_wait" for e in X) and any(e["cat"] == "ple_wait" for e in X)
    # the staging ring, one track per slot: a copy first, and (by the nesting check above) a slot's copy and
    # the computation reading it never overlap
    slots = {t: n for t, n in names.items() if n.startswith("staging slot ")}
    assert slots
    for tid in slots:
        track = sorted((e for e in X if e["tid"] == tid), key=lambda e: e["ts"])
        assert track[0]["cat"] == "dev_copy" and {e["cat"] for e in track} <= {"dev_copy", "dev_compute"}
    # counters: sampled at the request's start and end, so their difference is the request's
    cache = [e["args"] for e in ev if e["ph"] == "C" and e["name"] == "cache"]
    assert cache[-1]["hits"] - cache[0]["hits"] == c.stats["cache_hits"]
    assert cache[-1]["lookups"] - cache[0]["lookups"] == c.stats["cache_lookups"]
    counters = {e["name"] for e in ev if e["ph"] == "C"}
    assert {"rss_mib", "storage", "major_faults", "pcie", "pcie_frac", "resident_experts",
            "ple_resident_pages"} <= counters
    req = [e for e in X if e["cat"] == "request"]
    assert len(req) == 1 and req[0]["args"]["stats"] == c.stats
    assert [e["name"] for e in X if e["cat"] == "decode"] == ["decode step"] * (c.stats["generated_tokens"] - 1)
    assert d["metadata"]["dropped_events"] == 0


def test_trace_mtp_spans(tiny_mtp, tmp_path):
    c, d, _, _ = _traced(tiny_mtp, tmp_path, dict(device="cpu"), max_tokens=8, mtp=2)
    names = {e["name"] for e in d["traceEvents"] if e.get("cat") == "mtp"}
    assert {"mtp draft", "mtp verify", "mtp extend"} <= names
    n_verify = sum(1 for e in d["traceEvents"] if e.get("name") == "mtp verify")
    assert n_verify == c.stats["mtp_windows"]
    n_rollback = sum(1 for e in d["traceEvents"] if e.get("name") == "mtp rollback")
    assert n_rollback <= c.stats["mtp_windows"]


def test_tracing_leaves_outputs_bit_identical(tiny, tmp_path):
    with _sim(tiny, cache_gib=0.0002, pcie_frac=0.5) as m:
        def run():
            s = m.session()
            lg = s.eval(PROMPT, all_logits=True)
            return lg, generate(m, PROMPT, max_tokens=6, temperature=0, session=m.session()).tokens
        off_logits, off_tokens = run()
        with trace.Tracer(tmp_path / "t.json"):
            on_logits, on_tokens = run()
        again_logits, _ = run()
    assert on_tokens == off_tokens
    assert np.array_equal(on_logits, off_logits) and np.array_equal(again_logits, off_logits)


def test_plot_renders_png_and_summary(tiny, tmp_path):
    _traced(tiny, tmp_path, dict(cache_gib=0.0002, pcie_frac=0.5), max_tokens=4)
    out = tmp_path / "t.png"
    r = CliRunner().invoke(cli, ["plot", str(tmp_path / "t.json"), "-o", str(out)])
    assert r.exit_code == 0, r.output
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 10_000
    assert "decode tok/s" in r.output and "length" in r.output
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    r = CliRunner().invoke(cli, ["plot", str(bad), "-o", str(out)])
    assert r.exit_code != 0 and "traceEvents" in r.output


# ------------------------------------------------------------------------------------ watchdog


def _stall(monkeypatch, ms=1000, at=4):
    monkeypatch.setenv("STRATA_PLE_TEST_STALL_MS", str(ms))
    monkeypatch.setenv("STRATA_PLE_TEST_STALL_AT", str(at))


def test_watchdog_ple_stall_keeps_partial_output(tiny, reference, monkeypatch):
    _stall(monkeypatch, ms=2000)      # worker step 4 = decode step 3 (step 1 is the prompt)
    with Model(tiny, threads=2, n_ctx=256) as m:
        t = time.perf_counter()
        c = generate(m, PROMPT, max_tokens=10, temperature=0, watchdog_s=0.5)
        assert time.perf_counter() - t < 1.8                   # it did not wait for the worker
        assert c.finish_reason == "error"
        assert "watchdog" in c.error and "decode step 3" in c.error and "PLE gather worker" in c.error
        assert f"layer {m.ple_layer}" in c.error
        assert c.tokens == reference[:3]                       # the tokens sampled before the stall
        assert c.to_dict()["error"] == c.error and c.stats["generated_tokens"] == 3
        time.sleep(1.6)                                        # the worker finishes its stalled step
        c2 = generate(m, PROMPT, max_tokens=10, temperature=0, watchdog_s=0.5)
        assert c2.finish_reason == "length" and c2.tokens == reference and c2.error is None


def test_watchdog_device_stall_cancels_copies(tiny, reference):
    # a link of 100 kB/s: a layer's expert copies take seconds (the load's link probe a fraction of one)
    with _sim(tiny, cache_gib=0, pcie_frac=0.0, sim_link_gbps=1e-4) as m:
        m.set_pcie_frac(1.0)
        t = time.perf_counter()
        c = generate(m, PROMPT, max_tokens=10, temperature=0, watchdog_s=0.3)
        assert time.perf_counter() - t < 3
        assert c.finish_reason == "error" and c.tokens == []
        assert "prefill of 21 prompt tokens" in c.error and "layer 0 MoE" in c.error
        assert "device's copies" in c.error
        m.set_pcie_frac(0.0)                                   # no copies: the next request runs
        c2 = generate(m, PROMPT, max_tokens=10, temperature=0, watchdog_s=0.3)
        assert c2.finish_reason == "length" and c2.tokens == reference
        t = time.perf_counter()
    assert time.perf_counter() - t < 2                         # closing does not wait for the link


def test_watchdog_cli_generate_prints_partial_then_fails(tiny, reference, monkeypatch, tmp_path):
    _stall(monkeypatch)
    env_run = CliRunner()
    monkeypatch.setenv("STRATA_WATCHDOG_S", "0.5")              # the environment spelling of --watchdog-s
    with Model(tiny, threads=2, n_ctx=256) as m:
        prompt = m.detokenize(PROMPT)
    r = env_run.invoke(cli, ["generate", prompt, "-m", tiny, "--temp", "0", "-n", "10", "--threads", "2",
                             "--n-ctx", "256", "--json"])
    assert r.exit_code == 1
    rec = json.loads(next(x for x in r.output.splitlines() if x.startswith("{")))
    assert rec["finish_reason"] == "error" and "decode step 3" in rec["error"] and len(rec["tokens"]) == 3
    assert "watchdog" in r.output.splitlines()[-1]


def test_watchdog_under_the_engine_names_the_step(tiny, reference, monkeypatch):
    """Under pyrunner.engine the watchdog's message names the engine's step (its sequences and tokens),
    which runs every request's evaluation at once, not the label of whichever request queued last."""
    from pyrunner.engine import Engine
    from pyrunner.sampling import SamplingParams
    _stall(monkeypatch, ms=900, at=4)
    with Model(tiny, threads=2, n_ctx=256) as m:
        with Engine(m, max_seqs=1, mtp=0, watchdog_s=0.5) as eng:
            c = eng.submit(PROMPT, SamplingParams(max_tokens=10, temperature=0)).result(30)
        time.sleep(1.0)                                        # the worker finishes its stalled step
    assert c.finish_reason == "error" and c.tokens == reference[:3]
    # the prompt was engine step 1 and each token a step after it; PLE step 4 stalled
    assert "engine step 4: 1 sequences, 1 tokens" in c.error and "PLE gather worker" in c.error, c.error


def test_watchdog_batch_writes_error_record_and_goes_on(tiny, reference, monkeypatch, tmp_path):
    _stall(monkeypatch, ms=900, at=4)
    inp = tmp_path / "in.jsonl"
    inp.write_text(json.dumps({"id": "a", "prompt": "hello"}) + "\n" + json.dumps({"id": "b", "prompt": "bye"}) + "\n")
    out = tmp_path / "out.jsonl"
    # one request at a time: the stall hits request a's 4th PLE step (with --parallel both requests share
    # each step, and an aborted step ends every request in it)
    r = CliRunner().invoke(cli, ["batch", str(inp), "-o", str(out), "-m", tiny, "--temp", "0", "-n", "6",
                                 "--watchdog-s", "0.6", "--threads", "2", "--n-ctx", "256", "--parallel", "1"])
    assert r.exit_code == 0, r.output
    recs = [json.loads(x) for x in out.read_text().splitlines()]
    assert recs[0]["id"] == "a" and "watchdog" in recs[0]["error"] and recs[0]["finish_reason"] == "error"
    assert isinstance(recs[0]["text"], str) and recs[0]["stats"]["generated_tokens"] == 3
    assert recs[1]["id"] == "b" and "error" not in recs[1] and recs[1]["finish_reason"] == "length"
    assert "1 with errors" in r.output


def test_watchdog_chat_keeps_running_and_stats(tiny, monkeypatch):
    _stall(monkeypatch, ms=900, at=4)
    r = CliRunner().invoke(cli, ["chat", "-m", tiny, "--temp", "0", "-n", "6", "--watchdog-s", "0.6",
                                 "--threads", "2", "--n-ctx", "512"], input="hi\nhello again\n/stats\n/exit\n")
    assert r.exit_code == 0, r.output
    assert "error: watchdog" in r.output and "decode step 3" in r.output
    assert "(prompt " in r.output and "conversation:" in r.output and "tok/s" in r.output


# ------------------------------------------------------------------------------------ bench, live stats


def test_bench_model_trace_reports_the_recorder_cost(tiny, tmp_path):
    out = tmp_path / "bench.json"
    r = CliRunner().invoke(cli, ["bench", "model", "-m", tiny, "--prompt-tokens", "16", "--gen-tokens", "4",
                                 "--threads", "2", "--trace", str(out), "--json"])
    assert r.exit_code == 0, r.output
    res = json.loads(next(x for x in r.output.splitlines() if x.startswith("{")))
    t = res["trace"]
    assert t["events"] > 0 and t["decode_tps"] > 0 and "decode_overhead_pct" in t
    d = json.loads(out.read_text())
    assert d["metadata"]["overhead"]["decode_tps_off"] == res["strata"]["decode_tps"]
    assert sum(1 for e in d["traceEvents"] if e.get("cat") == "step") >= 4


def test_live_stats_line():
    from pyrunner.batch import LiveStats

    live = LiveStats()
    assert live.line() == "- tok/s"
    live.add({"generated_tokens": 10, "decode_s": 1.5, "prefill_s": 0.5, "cache_hits": 3, "cache_lookups": 4,
              "drafts_proposed": 8, "drafts_accepted": 6})
    live.add({"generated_tokens": 10, "decode_s": 2.0})
    assert live.line() == "5.0 tok/s, hit rate 75.0 %, draft accepted 6/8"


def test_trace_shows_the_model_thread_waiting_on_a_stalled_gather(tiny, monkeypatch, tmp_path):
    # the seed's question: what does the engine wait on? The worker's stall and the model thread's wait line up.
    _stall(monkeypatch, ms=300, at=3)
    c, d, _, ple_layer = _traced(tiny, tmp_path, dict(cache_gib=0.0002, pcie_frac=0.5), max_tokens=4, watchdog_s=10)
    assert c.finish_reason == "length"
    X = [e for e in d["traceEvents"] if e["ph"] == "X"]
    stall = [e for e in X if e["cat"] == "ple_stall"]
    assert len(stall) == 1 and stall[0]["dur"] >= 290e3
    wait = max((e for e in X if e["cat"] == "ple_wait"), key=lambda e: e["dur"])
    assert wait["dur"] >= 250e3 and wait["ts"] < stall[0]["ts"] + stall[0]["dur"] <= wait["ts"] + wait["dur"] + 1e3
    layer = next(e for e in X if e["cat"] == "ple" and e["ts"] <= wait["ts"] <= e["ts"] + e["dur"])
    assert layer["args"]["layer"] == ple_layer
    assert c.stats["ple_wait_s"] >= 0.25


def test_cli_generate_trace(tiny, tmp_path):
    out = tmp_path / "g.json"
    r = CliRunner().invoke(cli, ["generate", "hello", "-m", tiny, "--temp", "0", "-n", "4", "--threads", "2",
                                 "--n-ctx", "256", "--device", "sim", "--cache-gib", "0.0002", "--trace", str(out)])
    assert r.exit_code == 0, r.output
    assert f"events in {out}" in r.output and "strata plot" in r.output
    d = json.loads(out.read_text())
    req = [e for e in d["traceEvents"] if e.get("cat") == "request" and e["ph"] == "X"]
    assert len(req) == 1 and req[0]["args"]["finish_reason"] == "length"
    assert d["metadata"]["requests"] == 1
