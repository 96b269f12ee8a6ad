"""The routing-trace format and `strata cache-sim` (pyrunner/cachesim.py): each policy on constructed
traces whose answers are worked out by hand, the hotness replay's scheduler steps (admit order, tail
skip, the last layer's admits in flight at a round, streaming steps that borrow slots), Belady at least
as good as every online policy on random traces, the hotness policy against a plain re-statement of its
rule and against the C table, the rule's constants against the C cache's defaults, and the CLI. The
replay against the engine itself is tests/test_counters.py."""
from __future__ import annotations

import io
import json
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from pyrunner import cachesim
from pyrunner.cachesim import TraceRecord, simulate
from pyrunner.cli import main

ROOT = Path(__file__).resolve().parents[1]


def rec(window, layer, *tokens):
    return TraceRecord(window, layer, [list(t) for t in tokens], [[1.0 / len(t)] * len(t) for t in tokens])


def seq(layer_picks):
    """One window per pick: [(layer, expert), ...] -> records of one token with one pick."""
    return [rec(w, l, [e]) for w, (l, e) in enumerate(layer_picks)]


def random_trace(seed, n_windows=120, n_layer=3, n_expert=24, k=4, max_tokens=3, drift=40):
    """Skewed, drifting routing with windows of 1..max_tokens tokens, written and parsed back."""
    rng = np.random.default_rng(seed)
    f = io.StringIO()
    perm = [rng.permutation(n_expert) for _ in range(n_layer)]
    p = 1.0 / np.arange(1, n_expert + 1) ** 1.1
    p /= p.sum()
    for w in range(n_windows):
        n_tok = int(rng.integers(1, max_tokens + 1))
        for layer in range(n_layer):
            if w % drift == 0:
                perm[layer] = np.roll(perm[layer], int(rng.integers(1, n_expert)))
            ex = np.stack([perm[layer][rng.choice(n_expert, size=k, replace=False, p=p)] for _ in range(n_tok)])
            wt = rng.random((n_tok, k))
            cachesim.write_trace_record(f, w, layer, ex, -np.sort(-wt / wt.sum(1, keepdims=True), axis=1))
    return cachesim.parse_trace(f.getvalue().splitlines())


# ------------------------------------------------------------------ format

def test_trace_round_trip_and_format(tmp_path):
    p = tmp_path / "t.jsonl"
    with open(p, "w") as f:
        cachesim.write_trace_record(f, 0, 2, np.array([[5, 1, 7], [1, 9, 2]]), np.array([[0.5, 0.3, 0.2], [0.4, 0.35, 0.25]]))
        cachesim.write_trace_record(f, 1, 2, [3, 4], [0.123456789, 0.876543211])   # one token, as a flat list
    lines = p.read_text().splitlines()
    assert json.loads(lines[0]) == {"window": 0, "layer": 2, "tokens": [[5, 1, 7], [1, 9, 2]],
                                    "weights": [[0.5, 0.3, 0.2], [0.4, 0.35, 0.25]]}
    assert json.loads(lines[1])["weights"] == [[0.123457, 0.876543]]
    recs = cachesim.read_trace(p)
    assert [(r.window, r.layer, r.tokens) for r in recs] == [(0, 2, [[5, 1, 7], [1, 9, 2]]), (1, 2, [[3, 4]])]
    assert cachesim.trace_shape(recs) == (3, 10)
    with pytest.raises(ValueError, match="experts"):
        cachesim.write_trace_record(io.StringIO(), 0, 0, [[1, 2]], [[0.5]])


def test_engine_lines_with_extra_keys_parse():
    line = '{"window": 3, "layer": 1, "tokens": [[4, 2]], "weights": [[0.7, 0.3]], "resident": [4], "skipped": []}'
    (r,) = cachesim.parse_trace([line])
    assert (r.window, r.layer, r.tokens, r.weights) == (3, 1, [[4, 2]], [[0.7, 0.3]])


@pytest.mark.parametrize("line, what", [
    ("not json", "not JSON"),
    ('{"window": 0, "layer": 1}', 'missing "tokens"'),
    ('{"window": -1, "layer": 0, "tokens": [[1]]}', '"window"'),
    ('{"window": 0, "layer": 0, "tokens": [[1, 1]]}', "appears twice"),
    ('{"window": 0, "layer": 0, "tokens": [[1, -2]]}', "non-negative"),
    ('{"window": 0, "layer": 0, "tokens": [[1, 2]], "weights": [[0.5]]}', "shape"),
])
def test_bad_trace_lines_are_named(tmp_path, line, what):
    p = tmp_path / "bad.jsonl"
    p.write_text('{"window": 0, "layer": 0, "tokens": [[1, 2]], "weights": [[0.6, 0.4]]}\n\n' + line + "\n")
    with pytest.raises(cachesim.TraceError) as e:
        cachesim.read_trace(p)
    assert f"{p}:3:" in str(e.value) and what in str(e.value)


def test_capacity_parsing():
    assert cachesim.parse_capacity("96", 4, 64) == 96
    assert cachesim.parse_capacity("25%", 4, 64) == 64
    assert cachesim.parse_capacity("12.5 %", 2, 10) == 2
    for bad in ("-3", "lots", "150%"):
        with pytest.raises(ValueError):
            cachesim.parse_capacity(bad, 4, 64)


def test_constants_match_the_c_cache():
    src = (ROOT / "native" / "src" / "moe" / "expert_cache.c").read_text()
    body = src[src.index("ec_params ec_default_params(void)"):]
    body = body[:body.index("return p;")]
    assert re.search(r"max_swaps\s*=\s*(\d+);", body).group(1) == str(cachesim.HOT_MAX_SWAPS)
    assert float(re.search(r"min_diff\s*=\s*([\d.]+)f;", body).group(1)) == cachesim.HOT_MIN_DIFF
    assert float(re.search(r"decay\s*=\s*([\d.]+)f;", body).group(1)) == cachesim.HOT_DECAY


# ------------------------------------------------------------------ constructed traces

ABACBA = seq([(0, "A"), (0, "B"), (0, "A"), (0, "C"), (0, "B"), (0, "A")])
for r in ABACBA:   # letters -> ids
    r.tokens = [[{"A": 0, "B": 1, "C": 2}[e] for e in t] for t in r.tokens]


def test_lru_known_answer():
    # capacity 2: A- B- A+ C-(out B) B-(out A) A-(out C)
    assert simulate(ABACBA, 2, "lru").hits == 1
    # capacity 3 holds all: only the three first picks miss
    assert simulate(ABACBA, 3, "lru").hits == 3
    assert simulate(ABACBA, 0, "lru").hits == 0


def test_lfu_known_answer():
    # capacity 2: A- B- A+(A:2) C-(out B, count 1) B-(out C: count 1 < A's 2) A+  -> 2
    assert simulate(ABACBA, 2, "lfu").hits == 2


def test_belady_known_answer():
    # capacity 2: A- B- A+ C-(not kept: used never again) B+ A+  -> 3
    assert simulate(ABACBA, 2, "belady").hits == 3
    # capacity 1: A- B-(not kept: A comes back first) A+ C-(not kept) B-(not kept) A+  -> 2
    assert simulate(ABACBA, 1, "belady").hits == 2
    assert simulate(ABACBA, 0, "belady").hits == 0


def test_one_window_sees_the_cache_as_it_began():
    # Two tokens of one window pick the missing expert 5: both miss; the next window hits twice.
    trace = [rec(0, 0, [5, 1], [5, 2]), rec(1, 0, [5, 3], [5, 4])]
    for policy in ("hotness", "lru", "lfu"):
        r = simulate(trace, 3, policy)
        assert (r.hits, r.lookups) == (2, 8), policy
    # Belady answers pick by pick: 5 is kept after its first pick and hits three times.
    assert simulate(trace, 3, "belady").hits == 3
    # Layers are different experts: expert 5 of layer 1 is not expert 5 of layer 0.
    assert simulate([rec(0, 0, [5]), rec(1, 1, [5])], 4, "lru").hits == 0


def test_hotness_known_answer():
    # capacity 1, a round after every window: A is admitted (free slot); B needs heat 1 + 0.7·…:
    # round after w1: B 1.0 vs A 0.7 -> 0.3;  after w2: B 1.7 vs A 0.49 -> 1.21;
    # after w3: B 2.19 vs A 0.343 -> 1.847 >= 1.5: swap; w4 hits.
    trace = seq([(0, 0), (0, 1), (0, 1), (0, 1), (0, 1)])
    assert simulate(trace, 1, "hotness", interval=1).hits == 1
    assert simulate(trace, 1, "lru").hits == 3
    # With min_diff 1.0 the swap comes one round earlier (after w2: 1.21 >= 1.0).
    assert simulate(trace, 1, "hotness", interval=1, min_diff=1.0).hits == 2
    # Rounds every 2 windows: the same rule, checked against the plain re-statement below.
    assert simulate(trace, 1, "hotness", interval=2).hits == brute_hotness(trace, 1, interval=2)


def test_hotness_cap_and_order():
    # Two layers, expert 0 resident in each (heat 1); outsiders: layer 0 expert 1 picked 4 times,
    # layer 1 expert 1 picked 3 times; one round after window 4: differences 3 and 2, both >= 1.5.
    # max_swaps 1 swaps only the larger difference; window 5 probes both.
    fill = [rec(0, 0, [0]), rec(0, 1, [0])]
    heat = [rec(w, layer, [1]) for w in (1, 2, 3) for layer in (0, 1)] + [rec(4, 0, [1])]
    probe = [rec(5, 0, [1]), rec(5, 1, [1])]
    trace = fill + heat + probe
    kw = dict(interval=5)
    # No hit before the probe (expert 0 is never picked again, expert 1 only comes in by a swap).
    assert simulate(trace, 2, "hotness", max_swaps=1, **kw).hits == 1
    assert simulate(trace, 2, "hotness", max_swaps=2, **kw).hits == 2
    assert simulate(trace, 2, "hotness", max_swaps=0, **kw).hits == 0
    # Equal differences in two layers: the lower layer goes first.
    tie = fill + [rec(w, layer, [1]) for w in (1, 2, 3, 4) for layer in (0, 1)]
    assert simulate(tie + [rec(5, 0, [1])], 2, "hotness", max_swaps=1, **kw).hits == 1
    assert simulate(tie + [rec(5, 1, [1])], 2, "hotness", max_swaps=1, **kw).hits == 0
    # Pairs stay within their layer: a hot layer-1 expert does not evict layer 0's resident.
    trace = [rec(0, 0, [0])] + [rec(w, 1, [3]) for w in range(1, 6)] + [rec(6, 1, [3]), rec(7, 0, [0])]
    assert simulate(trace, 1, "hotness", interval=1).hits == 1


def test_hotness_schedules_as_the_engine():
    # Admits go in ascending expert id (offload.c walks the groups by id), not in rank order.
    assert simulate([rec(0, 0, [5, 2]), rec(1, 0, [2])], 1, "hotness").hits == 1
    assert simulate([rec(0, 0, [5, 2]), rec(1, 0, [5])], 1, "hotness").hits == 0
    # An expert tail skip dropped is counted and heated but not admitted.
    skip = rec(0, 0, [3])
    skip.skipped = [3]
    assert simulate([skip, rec(1, 0, [3])], 4, "hotness").hits == 0
    assert simulate([rec(0, 0, [3]), rec(1, 0, [3])], 4, "hotness").hits == 1
    # The last layer's admits are still in flight at the round: not victims. Expert 7 (skipped,
    # heat 3) against 3 (admitted, heat 1): no swap when layer 0 is the last layer; a swap when a
    # layer 1 follows (layer 0's copy is published at layer 1's start, before the round).
    w0 = rec(0, 0, [7], [7], [7], [3])
    w0.skipped = [7]
    probe = [w0, rec(1, 0, [7])]
    assert simulate(probe, 1, "hotness", interval=1).hits == 0
    assert simulate(probe, 1, "hotness", interval=1, n_layer=2).hits == 1
    assert brute_hotness(probe, 1, interval=1) == 0 and brute_hotness(probe, 1, interval=1, n_layer=2) == 1


def test_streaming_steps_borrow_instead_of_admitting():
    kw = dict(stream_min=2, interval=1000)   # no rounds: only admits and borrows move experts
    fill = rec(0, 0, [0, 1, 2, 3])                   # fills all 4 slots (heat 1 each)
    back = [rec(2, 0, [0, 1, 2, 3]), rec(3, 0, [0, 1, 2, 3])]
    # Four missing groups, no staging: borrow min(4 - 0, 4 // 2) = 2 slots, evicting the two
    # coldest (ties: lowest id): 0 and 1. They come back empty, so window 2 hits 2 and 3 and
    # re-admits 0 and 1; window 3 hits all four.
    stream = rec(1, 0, [4, 5], [6, 7])
    assert simulate([fill, stream] + back, 4, "hotness", staging=0, **kw).hits == 2 + 4
    # Three staging slots: only 4 - 3 = 1 borrowed.
    assert simulate([fill, stream] + back, 4, "hotness", staging=3, **kw).hits == 3 + 4
    # A streaming step admits nothing: 4 and 5 are missed again.
    assert simulate([rec(0, 0, [4, 5], [4, 5]), rec(1, 0, [4])], 4, "hotness", **kw).hits == 0
    assert simulate([rec(0, 0, [4, 5]), rec(1, 0, [4])], 4, "hotness", **kw).hits == 1
    # The step's own resident groups are pinned: after its notes 0 ties 1..3 at heat 2 and would
    # go first by id, but it is read, so 1 and 2 are evicted.
    warm = rec(1, 0, [1, 2, 3])
    reads0 = rec(2, 0, [0, 4], [5, 6])
    assert simulate([fill, warm, reads0, rec(3, 0, [0])], 4, "hotness", staging=0, **kw).hits == 3 + 1 + 1
    assert simulate([fill, warm, reads0, rec(3, 0, [1])], 4, "hotness", staging=0, **kw).hits == 3 + 1 + 0
    # Free slots are borrowed before anything is evicted.
    assert simulate([rec(0, 0, [0, 1]), rec(1, 0, [4, 5], [6, 7]), rec(2, 0, [0, 1])], 4, "hotness",
                    staging=0, **kw).hits == 2


# ------------------------------------------------------------------ random traces

def brute_hotness(records, capacity, interval=cachesim.HOT_INTERVAL, max_swaps=cachesim.HOT_MAX_SWAPS,
                  min_diff=cachesim.HOT_MIN_DIFF, decay=cachesim.HOT_DECAY, n_layer=None):
    """The rule as stated in DESIGN §4 with the scheduler's order (offload.c: admits in ascending
    expert id; the last layer's admits still loading at the round), in plain loops over dicts,
    float32 like the C table. No streaming steps (every line has < 1024 tokens)."""
    f32 = np.float32
    heat: dict = {}
    resident: set = set()
    hits = lookups = 0
    n_windows = 0
    last_layer = (n_layer or max(r.layer for r in records) + 1) - 1

    def adjust(loading):
        pairs = []
        for layer in sorted({k[0] for k in heat} | {k[0] for k in resident}):
            outside = [e for (l, e), h in heat.items() if l == layer and (l, e) not in resident and h > 0]
            inside = [e for (l, e) in resident if l == layer and (l, e) not in loading]
            outside.sort(key=lambda e: (-heat[(layer, e)], e))
            inside.sort(key=lambda e: (heat.get((layer, e), f32(0)), e))
            for a, b in zip(outside, inside):
                d = f32(heat[(layer, a)] - heat.get((layer, b), f32(0)))
                if not d >= f32(min_diff):
                    break
                pairs.append((d, layer, a, b))
        pairs.sort(key=lambda p: (-p[0], p[1], p[2]))
        for _, layer, a, b in pairs[:max_swaps]:
            resident.remove((layer, b))
            resident.add((layer, a))
        for k in heat:
            heat[k] = f32(heat[k] * f32(decay))

    i = 0
    while i < len(records):
        w = records[i].window
        loading = set()
        while i < len(records) and records[i].window == w:
            r = records[i]
            start = set(resident)
            for t in r.tokens:
                for e in t:
                    lookups += 1
                    hits += (r.layer, e) in start
                    heat[(r.layer, e)] = f32(heat.get((r.layer, e), f32(0)) + f32(1))
            loading = set()
            for e in sorted({e for t in r.tokens for e in t} - set(r.skipped)):
                if len(resident) < capacity and (r.layer, e) not in resident:
                    resident.add((r.layer, e))
                    loading.add((r.layer, e))
            if r.layer != last_layer:
                loading = set()
            i += 1
        n_windows += 1
        if n_windows % interval == 0:
            adjust(loading)
    return hits


@pytest.mark.parametrize("seed", range(6))
def test_hotness_matches_the_rule(seed):
    trace = random_trace(seed, n_windows=80)
    n_keys = 3 * 24
    for capacity, interval, max_swaps in [(n_keys // 4, 1, 96), (n_keys // 2, 4, 3), (n_keys // 3, 2, 1), (5, 3, 96)]:
        got = simulate(trace, capacity, "hotness", interval=interval, max_swaps=max_swaps)
        assert got.hits == brute_hotness(trace, capacity, interval=interval, max_swaps=max_swaps), \
            (capacity, interval, max_swaps)
        assert got.lookups == sum(len(t) for r in trace for t in r.tokens)


@pytest.fixture(scope="module")
def c_replay(tmp_path_factory):
    """tests/native/test_expert_cache.c's --replay mode: the C table driven as the scheduler drives it."""
    cc = shutil.which("cc") or shutil.which("gcc")
    assert cc, "a C compiler is needed to build the expert-cache replay"
    exe = tmp_path_factory.mktemp("ec") / "test_expert_cache"
    src = ROOT / "native" / "src"
    r = subprocess.run([cc, "-std=c11", "-O1", "-D_GNU_SOURCE", "-I", str(ROOT / "native" / "include"), "-I", str(src),
                        str(ROOT / "tests" / "native" / "test_expert_cache.c"), str(src / "moe" / "expert_cache.c"),
                        str(src / "util" / "error.c"), "-lpthread", "-o", str(exe)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return exe


@pytest.mark.parametrize("seed", range(4))
def test_hotness_matches_the_c_cache(c_replay, seed):
    trace = random_trace(200 + seed, n_windows=150)
    # The replay admits in order of first appearance and completes every copy before a round; the
    # scheduler (and cachesim) admit in ascending expert id and leave the last layer's admits
    # loading through the round. A line's picks in ascending order make the first two agree (its
    # notes do not depend on the order: heat sums of 1.0 are exact in float32, hits are counted
    # against the table as the line began), and one more layer without lines makes that last
    # layer's admits nil, so both run the same table operations in the same order.
    text = "".join(f"{r.window} {r.layer} {len(r.tokens)} {len(r.tokens[0])} "
                   + " ".join(str(e) for e in sorted(e for t in r.tokens for e in t)) + "\n" for r in trace)
    n_layer, n_expert = cachesim.trace_shape(trace)
    n_layer += 1
    for capacity, interval, max_swaps in [(6, 1, 96), (18, 2, 96), (36, 8, 96), (54, 3, 96), (18, 1, 1), (36, 2, 2)]:
        out = subprocess.run([str(c_replay), "--replay", str(n_layer), str(n_expert), str(capacity), str(interval),
                              str(max_swaps)], input=text, capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        hits, lookups = map(int, out.stdout.split())
        py = simulate(trace, capacity, "hotness", interval=interval, max_swaps=max_swaps, n_layer=n_layer)
        assert (hits, lookups) == (py.hits, py.lookups), (capacity, interval, max_swaps)


@pytest.mark.parametrize("seed", range(8))
def test_belady_bounds_every_policy(seed):
    trace = random_trace(100 + seed, n_windows=100)
    n_keys = 3 * 24
    for capacity in (0, 1, n_keys // 4, n_keys // 2, n_keys * 3 // 4, n_keys):
        res = {p: simulate(trace, capacity, p, interval=1 + seed % 4) for p in cachesim.POLICIES}
        best = res["belady"].hits
        for p, r in res.items():
            assert 0 <= r.hits <= best <= r.lookups, (capacity, p, r.hits, best)
        if capacity == 0:
            assert best == 0
    # With room for every expert, only each expert's first pick misses.
    firsts = len({(r.layer, e) for r in trace for t in r.tokens for e in t})
    r = simulate(trace, n_keys, "belady")
    assert r.hits == r.lookups - firsts


def test_policies_differ_on_a_drifting_trace():
    # Not a fixed ranking, only that the policies are really different code paths.
    trace = random_trace(7, n_windows=150)
    hits = {p: simulate(trace, 18, p).hits for p in cachesim.POLICIES}
    assert len(set(hits.values())) >= 3, hits


def test_simulate_rejects_bad_settings():
    with pytest.raises(ValueError, match="policy"):
        simulate(ABACBA, 2, "fifo")
    with pytest.raises(ValueError, match="interval"):
        simulate(ABACBA, 2, "hotness", interval=0)
    with pytest.raises(ValueError, match="capacity"):
        simulate(ABACBA, -1, "lru")
    with pytest.raises(ValueError, match="stream_min"):
        simulate(ABACBA, 2, "hotness", stream_min=0)


# ------------------------------------------------------------------ CLI

def test_cli_json_and_text(tmp_path):
    trace = random_trace(3, n_windows=60)
    p = tmp_path / "trace.jsonl"
    with open(p, "w") as f:
        for r in trace:
            cachesim.write_trace_record(f, r.window, r.layer, r.tokens, r.weights)
    runner = CliRunner()
    out = runner.invoke(main, ["cache-sim", str(p), "--capacity", "25%", "--policy", "belady", "--json"])
    assert out.exit_code == 0, out.output
    d = json.loads(out.output)
    assert set(d) == {"policy", "capacity", "hits", "lookups", "hit_rate"}
    want = simulate(trace, 18, "belady")
    assert d == {"policy": "belady", "capacity": 18, "hits": want.hits, "lookups": want.lookups,
                 "hit_rate": pytest.approx(want.hit_rate)}
    out = runner.invoke(main, ["cache-sim", str(p), "--capacity", "10", "--interval", "2"])
    assert out.exit_code == 0, out.output
    want = simulate(trace, 10, "hotness", interval=2)
    assert out.output.startswith(f"hotness: {want.hits}/{want.lookups} hits")
    # --experts widens the table a percentage refers to.
    out = runner.invoke(main, ["cache-sim", str(p), "--capacity", "50%", "--experts", "48", "--json"])
    assert json.loads(out.output)["capacity"] == 3 * 48 // 2


def test_cli_errors(tmp_path):
    p = tmp_path / "trace.jsonl"
    p.write_text('{"window": 0, "layer": 0, "tokens": [[1, 2]]}\n{"window": 1}\n')
    runner = CliRunner()
    out = runner.invoke(main, ["cache-sim", str(p), "--capacity", "4"])
    assert out.exit_code != 0 and f"{p}:2:" in out.output and 'missing "layer"' in out.output
    p.write_text('{"window": 0, "layer": 0, "tokens": [[1, 2]]}\n')
    out = runner.invoke(main, ["cache-sim", str(p), "--capacity", "many"])
    assert out.exit_code != 0 and "number of expert slots" in out.output
    out = runner.invoke(main, ["cache-sim", str(p), "--capacity", "4", "--experts", "2"])
    assert out.exit_code != 0 and "expert id 2" in out.output
    out = runner.invoke(main, ["cache-sim", str(p), "--capacity", "4", "--interval", "0"])
    assert out.exit_code != 0 and "interval" in out.output
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    out = runner.invoke(main, ["cache-sim", str(empty), "--capacity", "4"])
    assert out.exit_code != 0 and "no records" in out.output


# ------------------------------------------------------------------ the C policies (native/src/moe/policy.h)

def test_policy_names_come_from_c():
    assert cachesim.C_POLICIES[0] == cachesim.c_default_policy()
    assert {"lru", "lfu", "lfru", "layer-lru", "least-stale"} <= set(cachesim.C_POLICIES)
    assert cachesim.POLICIES == ("hotness",) + cachesim.C_POLICIES + ("belady",)


@pytest.fixture(scope="module")
def c_policy_stress(tmp_path_factory):
    """tests/native/test_policy.c: every policy under a randomized stress through the C module."""
    cc = shutil.which("cc") or shutil.which("gcc")
    assert cc, "a C compiler is needed to build the policy stress"
    exe = tmp_path_factory.mktemp("pol") / "test_policy"
    src = ROOT / "native" / "src"
    r = subprocess.run([cc, "-std=c11", "-O1", "-Wall", "-Wextra", "-Werror", "-D_GNU_SOURCE", "-I",
                        str(ROOT / "native" / "include"), "-I", str(src), str(ROOT / "tests" / "native" / "test_policy.c"),
                        str(src / "moe" / "policy.c"), str(src / "util" / "error.c"), "-lm", "-lpthread", "-o", str(exe)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return exe


def test_every_policy_keeps_its_invariants_under_stress(c_policy_stress):
    # No key resident twice, maps agree, pinned slots never victims, inserts report what they evict,
    # and the bad-name message lists every name: 6 shapes x 4 seeds x 3000 calls per policy.
    out = subprocess.run([str(c_policy_stress), "4", "3000"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    assert f"ok ({len(cachesim.C_POLICIES)} policies)" in out.stdout


def brute_lru(records, capacity, n_expert=24):
    """LRU with the demand-fill timing of the module docstring, in plain Python: a line's picks
    answered from the table as the line began, its experts touched, then its misses inserted, each
    evicting the least recently touched key (ties: the lower layer * n_expert + expert)."""
    last: dict = {}   # resident key -> line of its last touch
    hits = 0
    for i, r in enumerate(records):
        keys = list(dict.fromkeys((r.layer, e) for t in r.tokens for e in t))
        start = set(last)
        hits += sum((r.layer, e) in start for t in r.tokens for e in t)
        for k in keys:
            if k in start:
                last[k] = i
        for k in keys:
            if k not in start and capacity > 0:
                if len(last) >= capacity:
                    del last[min(last, key=lambda v: (last[v], v[0] * n_expert + v[1]))]
                last[k] = i
    return hits


@pytest.mark.parametrize("seed", range(4))
def test_c_lru_is_the_stated_rule(seed):
    trace = random_trace(300 + seed, n_windows=80)
    for capacity in (0, 1, 5, 18, 36, 72):
        assert simulate(trace, capacity, "lru").hits == brute_lru(trace, capacity), capacity


def test_replay_known_answers():
    # Two tokens per line; capacity 2. w0: 1- 2- (in: 1, 2)   w1: 1+ 3- (touch 1; 3 evicts 2)
    # w2: 2- 3+ -> lru 2 hits; lfu the same (2 has 1 pick against 1's 2).
    trace = [rec(0, 0, [1], [2]), rec(1, 0, [1], [3]), rec(2, 0, [2], [3])]
    assert simulate(trace, 2, "lru").hits == 2 and simulate(trace, 2, "lfu").hits == 2
    # Two picks of one missing expert in one line are two misses; the next line hits both.
    assert (simulate([rec(0, 0, [5], [5]), rec(1, 0, [5], [5])], 4, "lru").hits) == 2
    # layer-lru gives each of 2 layers 1 slot: layer 1's expert survives layer 0's churn; global LRU
    # evicts it (w1: 7 evicts 5; w2: 8 evicts 6, the least recent).
    churn = [rec(0, 0, [5]), rec(0, 1, [6]), rec(1, 0, [7]), rec(2, 0, [8]), rec(3, 1, [6])]
    assert simulate(churn, 2, "layer-lru").hits == 1
    assert simulate(churn, 2, "lru").hits == 0
    # frecency keeps a much-picked expert against a one-off (bypass): A A A A B A with one slot.
    aab = seq([(0, 0)] * 4 + [(0, 1), (0, 0)])
    assert simulate(aab, 1, "lru").hits == 3
    assert simulate(aab, 1, "frecency").hits == 4
    # least-stale, capacity 2, layers 0..2, one expert each. w0 layer 2: both residents missed no
    # chance; layer 1's comes back last (two lines on), so it goes, where lru evicts layer 0's (the
    # least recent). w1 layer 0 then hits under least-stale only; w1 layer 1 misses under both.
    tri = [rec(0, 0, [1]), rec(0, 1, [1]), rec(0, 2, [1]), rec(1, 0, [1]), rec(1, 1, [1])]
    assert simulate(tri, 2, "least-stale").hits == 1
    assert simulate(tri, 2, "lru").hits == 0


def test_bad_policy_name_lists_the_names():
    from pyrunner import _native
    with pytest.raises(ValueError, match="choose one of"):
        simulate(ABACBA, 2, "fifo")
    flat = cachesim.flatten(ABACBA)
    with pytest.raises(_native.StrataError) as e:
        cachesim.replay_c(flat, "fifo", 2, 1, 3)
    assert "fifo" in str(e.value) and all(n in str(e.value) for n in cachesim.C_POLICIES)


@pytest.mark.parametrize("policy", cachesim.ONLINE_POLICIES)
def test_every_online_policy_passes_the_prefix_check(policy):
    trace = random_trace(11, n_windows=90)
    n_layer, n_expert = cachesim.trace_shape(trace)
    for capacity in (5, 18, 40):
        lengths = cachesim.check_online(trace, capacity, policy, n_layer, n_expert)
        assert len(lengths) >= 5
    # per-window hits add up to the total
    wh = cachesim.window_hits(trace, 18, policy, n_layer, n_expert)
    assert len(wh) == 90 and int(wh.sum()) == simulate(trace, 18, policy, n_layer=n_layer, n_expert=n_expert).hits


def test_the_prefix_check_catches_a_look_ahead(monkeypatch):
    # A fake policy whose first window's hits depend on how long the trace is: not online.
    trace = random_trace(12, n_windows=40)
    real = cachesim.replay_c

    def peeking(flat, policy, capacity, n_layer, n_expert, per_window=False):
        h, n, wh = real(flat, "lru", capacity, n_layer, n_expert, per_window=True)
        wh = wh.copy()
        wh[0] += flat.n_windows % 2
        return (h, n, wh) if per_window else (h, n)

    monkeypatch.setattr(cachesim, "replay_c", peeking)
    with pytest.raises(AssertionError, match="not online"):
        cachesim.check_online(trace, 10, "lru", 3, 24, prefixes=[7, 20])


def test_belady_bounds_the_c_policies_on_multi_token_windows():
    trace = random_trace(21, n_windows=120, max_tokens=4)
    for capacity in (4, 18, 36, 54):
        best = simulate(trace, capacity, "belady").hits
        for p in cachesim.C_POLICIES:
            assert simulate(trace, capacity, p).hits <= best, (p, capacity)


def _load_generator():
    import importlib.util
    spec = importlib.util.spec_from_file_location("make_routing_trace", ROOT / "tools" / "make_routing_trace.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_synthetic_trace_matches_the_published_lru_figures(tmp_path):
    gen = _load_generator()
    experts, weights = gen.generate(1000, seed=5)
    assert experts.shape == (1000, 48, 1, 10) and experts.max() < 512
    assert all(len(set(t)) == 10 for t in experts.reshape(-1, 10)[:500].tolist())
    got = gen.lru_figures(experts)
    for per_layer, want in gen.PUBLISHED_LRU.items():
        assert abs(got[per_layer] - want) <= 0.02, (per_layer, got[per_layer], want)
    # Deterministic from the seed; the file it writes is a trace read_trace reads, with the same figures.
    again, _ = gen.generate(30, seed=5)
    assert np.array_equal(again, gen.generate(30, seed=5)[0])
    p = tmp_path / "synth.jsonl"
    gen.write(p, again, _)
    recs = cachesim.read_trace(p)
    assert len(recs) == 30 * 48 and cachesim.trace_shape(recs)[0] == 48
    flat = gen.flat(again)
    assert cachesim.replay_c(flat, "lru", 48 * 93, 48, 512) == \
        cachesim.replay_c(cachesim.flatten(recs), "lru", 48 * 93, 48, 512)
    # MTP windows: 1 + K tokens each.
    assert gen.generate(5, seed=1, mtp=2)[0].shape == (5, 48, 3, 10)


def _load_tool(name):
    import importlib.util
    spec = importlib.util.spec_from_file_location(name, ROOT / "tools" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_policy_bound_replays_the_generators_draws():
    # tools/policy_bound.py tells its policies the generator's state: it must be the state behind the
    # very draws make_routing_trace writes (the same random stream, consumed in the same order).
    gen, pb = _load_generator(), _load_tool("policy_bound")
    for n_layer, seed in ((4, 3), (48, 0)):
        ex, pre, dem = pb.drifting(25, seed, gammas=(0.9,), n_layer=n_layer)
        assert np.array_equal(ex, gen.generate(25, seed, n_layer=n_layer)[0])
        ex, bound, a0 = pb.stationary(25, seed, n_layer=n_layer)
        assert np.array_equal(ex, gen.generate(25, seed, n_layer=n_layer, drift=0.0, beta=0.0)[0])


def test_a0_bounds_the_online_policies_on_the_stationary_trace():
    # Windows drawn independently from one distribution: no online policy expects more hits than the C
    # most likely keys held from the start (A0). A0 as demand paging admits only what a window asked
    # for, so Belady (MIN, the demand-paging optimum on any sequence) bounds it in turn.
    pb = _load_tool("policy_bound")
    ex, bound, a0 = pb.stationary(500, 2, n_layer=8)
    rep, default = pb.replayed(ex)
    flat = pb.mrt.flat(ex)
    for f in pb.FRACTIONS:
        c = int(f * 8 * 512)
        assert a0[f] <= rep[f]["belady"] and a0[f] <= bound[f], f
        for p in cachesim.C_POLICIES:
            hits, lookups = cachesim.replay_c(flat, p, c, 8, 512)
            assert hits / lookups < bound[f], (p, f, hits / lookups, bound[f])
    assert bound[0.25] < 0.95 * rep[0.25]["belady"]   # the goal at 25 %: out of every online policy's reach


def test_cli_compare_and_online_check(tmp_path):
    trace = random_trace(4, n_windows=60)
    p = tmp_path / "trace.jsonl"
    with open(p, "w") as f:
        for r in trace:
            cachesim.write_trace_record(f, r.window, r.layer, r.tokens, r.weights)
    runner = CliRunner()
    out = runner.invoke(main, ["cache-sim", str(p), "--compare", "--capacities", "0.25,0.5", "--json"])
    assert out.exit_code == 0, out.output
    d = json.loads(out.output)
    assert d["default"] == cachesim.C_POLICIES[0] and d["windows"] == 60
    assert {(r["policy"], r["fraction"]) for r in d["rows"]} == {(q, f) for q in cachesim.POLICIES for f in (0.25, 0.5)}
    for r in d["rows"]:
        best = next(b for b in d["rows"] if b["policy"] == "belady" and b["fraction"] == r["fraction"])
        assert r["hits"] <= best["hits"] and r["vs_belady"] == pytest.approx(r["hits"] / best["hits"])
        assert r["hits"] == simulate(trace, r["capacity"], r["policy"]).hits
        assert ("online_checked" in r) == (r["policy"] != "belady")
    out = runner.invoke(main, ["cache-sim", str(p), "--compare"])
    assert out.exit_code == 0 and "online check passed" in out.output and "least-stale" in out.output
    out = runner.invoke(main, ["cache-sim", str(p), "--capacity", "10", "--policy", "lfru", "--check-online"])
    assert out.exit_code == 0 and out.output.startswith("lfru: ") and "online check passed" in out.output
    out = runner.invoke(main, ["cache-sim", str(p)])
    assert out.exit_code != 0 and "--compare" in out.output


def best_demand_fill(records, capacity):
    """The most hits any policy can get with the demand-fill timing (exhaustive: after each line,
    every way to keep or bypass each missing expert and every choice of victims)."""
    from functools import lru_cache
    from itertools import combinations

    lines = [[(r.layer, int(e)) for t in r.tokens for e in t] for r in records]

    @lru_cache(maxsize=None)
    def go(i, cache):
        if i == len(lines):
            return 0
        picks = lines[i]
        hits = sum(k in cache for k in picks)
        missing = sorted(set(k for k in picks if k not in cache))
        best = 0
        # the cache after the line: any subset of (cache | missing) of at most `capacity` keys (what
        # inserts, evictions and bypasses can reach, and voluntary evictions, which never help)
        pool = sorted(set(cache) | set(missing))
        for n in range(0, min(capacity, len(pool)) + 1):
            for keep in combinations(pool, n):
                best = max(best, go(i + 1, frozenset(keep)))
        return hits + best

    return go(0, frozenset())


@pytest.mark.parametrize("seed", range(3))
def test_belady_is_the_demand_fill_optimum_on_one_token_windows(seed):
    rng = np.random.default_rng(seed)
    trace = [rec(w, int(rng.integers(0, 2)), list(rng.choice(4, size=2, replace=False))) for w in range(9)]
    for capacity in (1, 2, 3):
        opt = best_demand_fill(trace, capacity)
        assert simulate(trace, capacity, "belady").hits == opt, capacity
        for p in cachesim.C_POLICIES:
            assert simulate(trace, capacity, p).hits <= opt
