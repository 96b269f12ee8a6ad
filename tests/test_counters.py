"""One hit rate (issue 16 point 2): the engine's cache counters and `strata cache-sim` count the same
thing — one lookup per routed pick (token, expert), a hit when the expert was resident — so the
routing trace of a run, replayed through cache-sim's `hotness` with the engine's capacity and
scheduler settings, gives the engine's hits and lookups exactly: as Session.stats() / offload_stats()
report them, as `generate --json` reports them (cache_hits, cache_lookups, hit_rate), and as the
`--trace` timeline's counters and MoE spans add them up.

The run is a prefill in chunks of 8 tokens plus MTP decode (verify windows of 1 + 2 drafted tokens)
on the `sim` device with tail skip off, long enough for several adjustment rounds (every 32
windows). Windows of more than one token are what tell the definitions apart: counted per expert
group, a chunk whose tokens share experts has fewer lookups than picks.

Timing. cache-sim assumes a copy lands before the engine looks at its slot again. For admits and
staged copies the scheduler guarantees it (off_finish waits for the computation that follows each
copy on the device, and the next off_begin publishes it). For a swap nothing does by default: the
round's copies are queued at the end of a window and published by the first off_begin that finds
them done (offload.c; device_sim.c's copy engine runs on its own thread), so on a busy machine a
swap can land a window late — CI once saw it with a 10 TB/s simulated link (2 hits fewer than the
replay, at the window after the first round). These tests set STRATA_SYNC_SWAPS=1, which makes that
off_begin wait for the copies; the slow-link case (a copy of a tiny expert then takes ~0.2 ms, longer
than the window that follows) replays exactly only because of it. The trace's per-line `resident`
lists let a failure say where the engine and the replay part.
"""
from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

from pyrunner import cachesim, models, settings
from pyrunner.cli import main
from pyrunner.generate import generate
from pyrunner.model import Model

FAST_LINK_GBPS = 10_000.0     # copies as fast as a memcpy
SLOW_LINK_GBPS = 0.02         # copies that take longer than the window after them
PROMPT = [int(t) for t in np.random.default_rng(5).integers(1, 300, 48)]
N_NEW = 80
CHUNK = 8


@pytest.fixture(scope="module")
def tiny_mtp(tmp_path_factory) -> str:
    out = tmp_path_factory.mktemp("counters") / "tiny-mtp.gguf"
    models.make_model("tiny", str(out), recipe="f32", seed=3, mtp=True)
    return str(out)


def _gib_for_slots(path: str, n_slots: int) -> float:
    """A cache budget of n_slots slots (half a slot over, so byte rounding cannot lose one)."""
    slot = Model(path, threads=1, n_ctx=64, device="sim", tail_skip=0).offload_stats()["slot_bytes"]
    return (n_slots + 0.5) * slot / 2**30


def _picks_in_resident(records: list[dict]) -> tuple[int, int]:
    """(picks of a resident expert, picks) straight from the trace's lines."""
    hits = picks = 0
    for r in records:
        res = set(r["resident"])
        for t in r["tokens"]:
            picks += len(t)
            hits += sum(e in res for e in t)
    return hits, picks


def _replay(trace_path, st: dict, n_layer: int, stream_min: int) -> cachesim.SimResult:
    records = cachesim.read_trace(trace_path)
    return cachesim.simulate(records, st["cache_slots"], "hotness", n_layer=n_layer, n_expert=8,
                             interval=cachesim.HOT_INTERVAL, stream_min=stream_min, staging=st["staging_slots"])


def _first_divergence(trace_path, st, n_layer, stream_min) -> str:
    """Where the engine's residency (trace `resident`) and the replay's first differ, for a failure
    message: replays growing prefixes of the trace."""
    records = cachesim.read_trace(trace_path)
    raw = [json.loads(line) for line in open(trace_path)]
    for i in range(1, len(records) + 1):
        got = cachesim.simulate(records[:i], st["cache_slots"], "hotness", n_layer=n_layer, n_expert=8,
                                stream_min=stream_min, staging=st["staging_slots"]).hits
        want, _ = _picks_in_resident(raw[:i])
        if got != want:
            return (f"the replay's residency first differs from the engine's (the trace's `resident`) at "
                    f"line {i - 1}: {raw[i - 1]}")
    return "the replay's residency is the engine's on every line: the counters count something else"


@pytest.mark.parametrize("stream_min,gbps", [(None, FAST_LINK_GBPS), (CHUNK, FAST_LINK_GBPS), (None, SLOW_LINK_GBPS)])
def test_cache_sim_replays_the_engines_counts(tiny_mtp, tmp_path, monkeypatch, stream_min, gbps):
    """The Python API: Session.stats(), offload_stats() and generate()'s stats against the replay.
    stream_min None: the prefill chunks admit (the default 1024 is above a chunk); CHUNK: every
    chunk streams and borrows cache slots for its staging ring."""
    monkeypatch.setenv(settings.SYNC_SWAPS, "1")
    m = Model(tiny_mtp, threads=2, n_ctx=512, kv_type="f32", device="sim", tail_skip=0, pcie_frac=0.5,
              cache_gib=_gib_for_slots(tiny_mtp, 12), sim_link_gbps=gbps, prefill_chunk=CHUNK,
              prefill_stream_min=stream_min, mtp=2)
    st0 = m.offload_stats()
    assert st0["cache_slots"] == 12 and st0["tail_skip"] == 0 and st0["cache_lookups"] == 0
    trace = tmp_path / "routing.jsonl"
    m.trace_routing(trace)
    sess = m.session()
    c = generate(m, PROMPT, max_tokens=N_NEW, temperature=0, session=sess, mtp=2)
    m.trace_routing(None)
    st = m.offload_stats()
    raw = [json.loads(line) for line in trace.read_text().splitlines()]
    windows = [r["tokens"] for r in raw if r["layer"] == 0]
    # the run is what the test needs: > 1 token windows in prefill and decode, rounds that swapped
    assert c.stats["drafts_proposed"] > 0 and st["windows"] == len(windows) >= 2 * cachesim.HOT_INTERVAL
    assert {len(w) for w in windows[: len(PROMPT) // CHUNK]} == {CHUNK}
    assert max(len(w) for w in windows[len(PROMPT) // CHUNK:]) == 3
    assert st["cache_swaps"] > 0 and st["cache_admits"] > 0
    if stream_min:
        assert st["borrowed_slots"] > 0 and st["prefill_chunks"] == len(PROMPT) // CHUNK
    picks = sum(len(t) for r in raw for t in r["tokens"])
    groups = sum(len({e for t in r["tokens"] for e in t}) for r in raw)
    assert groups < picks       # tokens of a window share experts: the two definitions differ here

    sim = _replay(trace, st, m.n_layer, stream_min or cachesim.HOT_STREAM_MIN)
    engine = (st["cache_hits"], st["cache_lookups"])
    assert sim.lookups == picks
    assert (sim.hits, sim.lookups) == engine, _first_divergence(trace, st, m.n_layer, stream_min or 1024)
    assert _picks_in_resident(raw) == engine            # the trace's own lines say the same
    # every report reads the same counters
    s = sess.stats()
    assert (s["cache_hits"], s["cache_lookups"]) == engine and s["hit_rate"] == pytest.approx(sim.hit_rate)
    # generate()'s stats cover its request, which is the whole run here
    assert (c.stats["cache_hits"], c.stats["cache_lookups"]) == engine
    assert c.stats["hit_rate"] == pytest.approx(sim.hit_rate)


def test_json_and_trace_counters_are_the_replays(tiny_mtp, tmp_path, monkeypatch):
    """`strata generate --json --trace-routing R --trace T` (the CLI path): the --json stats, the
    timeline's cache counters and the sum of its MoE spans' hits are the replay's figures."""
    monkeypatch.setenv("STRATA_ROUTE_TAIL_SKIP", "0")
    monkeypatch.setenv(settings.SYNC_SWAPS, "1")
    routing, timeline = tmp_path / "routing.jsonl", tmp_path / "trace.json"
    gib = _gib_for_slots(tiny_mtp, 12)
    prompt = "the quick brown fox jumps over the lazy dog " * 4
    out = CliRunner().invoke(main, [
        "generate", prompt, "-m", tiny_mtp, "-n", str(N_NEW), "--temp", "0", "--json", "--threads", "2",
        "--device", "sim", "--cache-gib", repr(gib), "--pcie-frac", "0.5", "--sim-link-gbps", repr(FAST_LINK_GBPS),
        "--prefill-chunk", str(CHUNK), "--mtp", "2", "--kv-type", "f32",
        "--trace-routing", str(routing), "--trace", str(timeline)])
    assert out.exit_code == 0, out.output
    # (the runner's output also holds the log lines around it: the start-up log, the trace's note)
    js = json.loads(next(line for line in out.output.splitlines() if line.startswith('{"text"')))["stats"]
    raw = [json.loads(line) for line in routing.read_text().splitlines()]
    n_layer = max(r["layer"] for r in raw) + 1
    assert sum(r["layer"] == 0 for r in raw) >= 2 * cachesim.HOT_INTERVAL and js["cache_swaps"] > 0
    assert max(len(r["tokens"]) for r in raw) > 1
    st = {"cache_slots": 12, "staging_slots": cachesim.HOT_STAGING}
    sim = _replay(routing, st, n_layer, cachesim.HOT_STREAM_MIN)
    assert (js["cache_hits"], js["cache_lookups"]) == (sim.hits, sim.lookups), \
        _first_divergence(routing, st, n_layer, cachesim.HOT_STREAM_MIN)
    assert js["hit_rate"] == pytest.approx(sim.hit_rate)
    ev = json.loads(timeline.read_text())["traceEvents"]
    moe = [e for e in ev if e.get("cat") == "moe" and e["ph"] == "X"]
    assert sum(e["args"]["hits"] for e in moe) == sim.hits
    cache = [e["args"] for e in ev if e["ph"] == "C" and e["name"] == "cache"]
    assert len(cache) >= 2
    assert (cache[-1]["hits"] - cache[0]["hits"], cache[-1]["lookups"] - cache[0]["lookups"]) == (sim.hits, sim.lookups)
