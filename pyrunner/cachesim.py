"""cachesim.py — routing traces and the expert-cache simulator (DESIGN §4, issue 5 point 10).

Routing trace format (written by `--trace-routing FILE`, read by `strata cache-sim`)
-----------------------------------------------------------------------------------
JSON lines, one line per (verify window, MoE layer), in the order the engine ran them:

    {"window": 12, "layer": 3, "tokens": [[17, 4, 250], [4, 9, 17]], "weights": [[0.5, 0.3, 0.2], [0.6, 0.25, 0.15]]}

- `window`: the verify window's number, counting up over the whole run (a decode step of 1 +
  drafted tokens, or one prefill chunk). All lines of one window are consecutive; a line with a
  different number starts the next window.
- `layer`: the MoE layer index (0-based; layers without experts have no lines).
- `tokens[i]`: the routed experts of the window's i-th token, best first (rank 0 = largest
  weight), as many as the model routes per token; no expert twice in one token.
- `weights[i]`: their routing weights in the same order, as the merge multiplies them
  (written with 6 significant digits).
- Other keys are allowed (the offload path adds `resident` and `skipped`: the experts that were
  device-resident and those tail skip dropped in that window); `skipped` is kept (a skipped expert
  is not admitted), the rest ignored here.
`write_trace_record` writes one line; `read_trace` reads a file back, naming the line of any error.

The simulator
-------------
Every routed pick (token, expert) is one lookup, a hit when the expert is resident: the definition
of the engine's counters (`cache_hits` / `cache_lookups` of `Session.stats()`, `--json` and the trace
counters, all read from the C counters), so for the same run and the same capacity and policy
settings `hotness` reproduces the engine's figures (tests/test_counters.py checks it on a prefill +
MTP run). `capacity` is the number of expert slots, shared by all layers. Online policies see the
engine's timing: the lookups of a (window, layer) line are answered from the cache as it was when the
line began (the engine routes the whole window before any copy lands), and a change made for that
line is visible from the next window on. So two tokens of one window that pick the same missing
expert are two misses.

- `hotness`: the engine's scheduler (native/src/moe/offload.c) driving the table and policy of
  native/src/moe/expert_cache.h, step for step and with the same constants. Per line: every pick adds
  1 heat (float32, as in C, so thresholds and ties fall the same way); the line's missing experts
  that tail skip did not drop (the trace's `skipped`) are admitted in ascending expert id while a slot
  is free, and their copies complete within the line, so they are visible from the next line on. A
  line of at least `stream_min` tokens (a prefill chunk that streams) admits nothing and instead
  borrows cache slots for its staging ring: min(missing - `staging`, capacity // 2) of them, a free
  slot first, else it evicts the coldest resident expert that the line does not read (ties: lowest
  layer, then expert) and gives the slot back empty. Every `interval` windows, after the window's
  last layer, an adjustment round pairs, within each layer, non-resident experts by heat descending
  with resident ones by heat ascending, keeps pairs whose difference is >= 1.5, sorts all pairs by
  difference (ties: layer, then incoming expert), swaps at most `max_swaps` (96), then multiplies
  every heat by 0.7. Experts admitted by the last layer's line of that window are still loading at
  the round (the engine publishes a copy at the next line's start): neither outsiders nor victims.
  A swap's victim is gone at once and its replacement is resident from the next window on: in the
  engine that holds when the swap's copy completes before the next window reaches that layer, which
  nothing waits for (the copy engine runs on while the model thread goes on); a fast link
  (`--sim-link-gbps` large) makes it so in practice, and the trace's `resident` lists show where not.
- The policies of native/src/moe/policy.h (`frecency` (the engine's default), `lru`, `lfu`, `lfru`,
  `layer-lru`, `least-stale`; that header defines each): the engine's `--cache-policy` code itself,
  run by strata_policy_replay (strata.h) with the timing of a demand-filled tier. Per line (one MoE
  layer of one window): every pick is one lookup, a hit when its (layer, expert) was resident as the
  line began; then every distinct expert of the line is accessed once (its picks and best rank), in
  order of first appearance, hits and misses alike; then each missing one is inserted (a free slot,
  else the policy's victim, or not kept when the policy bypasses it), resident from the next line
  on. So two tokens of one window that pick the same missing expert are two misses, and a line's
  residents are the most recent keys when its misses choose victims. (`lru`/`lfu` were Python
  loops that inserted in first-appearance order before touching the line's later hits; the C
  order touches all first: the two differ only when a line reads more experts than the table
  holds.) The trace's `skipped` lists are not used: every read expert is filled.
  Every one of them is online: what it decides at window t depends only on windows <= t;
  `check_online` replays every prefix length it is given and asserts that the hits of the first t
  windows do not change when the later windows are removed.
- `belady`: the clairvoyant optimum (Belady's MIN with bypass): pick by pick, a missing expert
  replaces the resident one whose next pick is furthest away, or is not kept when its own next pick
  is later still. MIN with bypass is optimal for a tier that may decline to keep what it read. It
  is answered pick by pick, which no policy with the demand-fill timing above can beat (a pick may
  hit on an expert the same line read before), so it bounds them all; where every line's picks are
  distinct experts (decode windows of one token: a token never routes to an expert twice) the
  two timings coincide and it is exactly the optimum of the demand-filled tier.
- `compare` runs every policy at capacity fractions (a share of n_layer x n_expert slots) and
  gives each hit rate with its ratio to Belady's.

The traces issue 20 measures on: flash-small's, recorded with
`strata generate PROMPT -n 512 --temp 0.8 --seed N --threads 1 --trace-routing FILE` on code prompts
and concatenated with the window numbers continued; and the synthetic trace of the real model's
shape from `tools/make_routing_trace.py` (its docstring gives the model and its fitted parameters).
"""
from __future__ import annotations

import heapq
import json
import math
import re
from dataclasses import dataclass, field
from typing import IO, Iterable, Sequence

import numpy as np

def _c_policy_names() -> tuple[str, ...]:
    from ._native import ffi, lib
    return tuple(ffi.string(lib.strata_policy_names()).decode().split(","))


# The C policies (policy.h, the default first), the seed's hotness replay, and the clairvoyant bound.
C_POLICIES = _c_policy_names()
POLICIES = ("hotness",) + C_POLICIES + ("belady",)
ONLINE_POLICIES = POLICIES[:-1]

# The hotness rule's constants: ec_default_params() in native/src/moe/expert_cache.c
# (tests/test_cachesim.py checks that the two agree).
HOT_MAX_SWAPS = 96
HOT_MIN_DIFF = 1.5
HOT_DECAY = 0.7
# The scheduler's defaults (strata_model_default_params in native/src/model/model.c; settings in
# both): windows between two adjustment rounds, the token count from which a forward step streams
# (prefill_stream_min), and the staging slots of the ring a streaming step fills first (n_staging).
HOT_INTERVAL = 32
HOT_STREAM_MIN = 1024
HOT_STAGING = 4
# The scheduler's staging ring holds at most this many slots (staging + borrowed; offload.c).
_RING_MAX = 4096


class TraceError(ValueError):
    """A routing trace that cannot be read: the message names the file and line."""


@dataclass
class TraceRecord:
    window: int
    layer: int
    tokens: list[list[int]]
    weights: list[list[float]] = field(default_factory=list)
    skipped: list[int] = field(default_factory=list)   # experts tail skip dropped (offload path)


@dataclass
class SimResult:
    policy: str
    capacity: int
    hits: int
    lookups: int

    @property
    def hit_rate(self) -> float:
        return self.hits / self.lookups if self.lookups else 0.0

    def to_json(self) -> dict:
        """The DESIGN §9 `cache-sim --json` object."""
        return {"policy": self.policy, "capacity": self.capacity, "hits": self.hits,
                "lookups": self.lookups, "hit_rate": self.hit_rate}


# ------------------------------------------------------------------ trace files

def write_trace_record(f: IO[str], window: int, layer: int, experts, weights) -> None:
    """Append one (window, layer) line to an open text file. experts: (n_tokens, k) integer ids,
    best first; weights: (n_tokens, k) routing weights in the same order (lists or numpy arrays)."""
    ex = np.asarray(experts)
    wt = np.asarray(weights, dtype=np.float64)
    if ex.ndim == 1:
        ex, wt = ex[None, :], wt.reshape(1, -1)
    if ex.ndim != 2 or wt.shape != ex.shape:
        raise ValueError(f"routing trace: experts {ex.shape} and weights {wt.shape} must both be (n_tokens, k)")
    if ex.size and not np.issubdtype(ex.dtype, np.integer):
        raise ValueError(f"routing trace: expert ids must be integers, got {ex.dtype}")
    rec = {"window": int(window), "layer": int(layer), "tokens": ex.astype(np.int64).tolist(),
           "weights": [[float(f"{w:.6g}") for w in row] for row in wt.tolist()]}
    f.write(json.dumps(rec, separators=(",", ":")) + "\n")


def _bad(path, line: int, what: str) -> TraceError:
    return TraceError(f"{path}:{line}: {what} (each line is one JSON object "
                      '{"window": W, "layer": L, "tokens": [[expert, ...], ...], "weights": [[w, ...], ...]})')


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def parse_trace(lines: Iterable[str], path: str = "<trace>") -> list[TraceRecord]:
    records = []
    for no, text in enumerate(lines, 1):
        if not text.strip():
            continue
        try:
            obj = json.loads(text)
        except json.JSONDecodeError as e:
            raise _bad(path, no, f"not JSON ({e.msg})") from None
        if not isinstance(obj, dict):
            raise _bad(path, no, "not a JSON object")
        for k in ("window", "layer", "tokens"):
            if k not in obj:
                raise _bad(path, no, f'missing "{k}"')
        w, layer, toks = obj["window"], obj["layer"], obj["tokens"]
        if not _is_int(w) or w < 0:
            raise _bad(path, no, f'"window" must be a non-negative integer, got {w!r}')
        if not _is_int(layer) or layer < 0:
            raise _bad(path, no, f'"layer" must be a non-negative integer, got {layer!r}')
        if not isinstance(toks, list) or not all(isinstance(t, list) for t in toks):
            raise _bad(path, no, '"tokens" must be a list of lists of expert ids')
        for i, t in enumerate(toks):
            if not all(_is_int(e) and e >= 0 for e in t):
                raise _bad(path, no, f"token {i}: expert ids must be non-negative integers, got {t!r}")
            if len(set(t)) != len(t):
                raise _bad(path, no, f"token {i}: an expert appears twice in {t!r}")
        wts = obj.get("weights", [])
        if "weights" in obj:
            if (not isinstance(wts, list) or len(wts) != len(toks)
                    or any(not isinstance(r, list) or len(r) != len(t) for r, t in zip(wts, toks))):
                raise _bad(path, no, '"weights" must have the shape of "tokens"')
        skipped = obj.get("skipped", [])
        if not isinstance(skipped, list) or not all(_is_int(e) and e >= 0 for e in skipped):
            raise _bad(path, no, '"skipped" must be a list of expert ids')
        records.append(TraceRecord(w, layer, toks, wts, skipped))
    return records


def read_trace(path) -> list[TraceRecord]:
    try:
        with open(path, encoding="utf-8") as f:
            records = parse_trace(f, str(path))
    except OSError as e:
        raise TraceError(f"{path}: cannot read the routing trace ({e.strerror})") from None
    except UnicodeDecodeError:
        raise TraceError(f"{path}: not a text file; a routing trace is JSON lines "
                         "written by --trace-routing") from None
    if not records:
        raise TraceError(f"{path}: the routing trace has no records")
    return records


def trace_shape(records: Sequence[TraceRecord]) -> tuple[int, int]:
    """(n_layer, n_expert) as large as the trace needs: largest ids + 1."""
    n_layer = max(r.layer for r in records) + 1
    n_expert = max((e for r in records for t in r.tokens for e in t), default=-1) + 1
    return n_layer, max(n_expert, 1)


def parse_capacity(text: str, n_layer: int, n_expert: int) -> int:
    """'96' -> 96 slots; '25%' -> 25 % of all n_layer x n_expert experts (rounded down)."""
    s = str(text).strip()
    m = re.fullmatch(r"(\d+(?:\.\d+)?)\s*%", s)
    if m:
        pct = float(m.group(1))
        if pct > 100:
            raise ValueError(f"capacity {s}: a percentage is at most 100%")
        return int(math.floor(pct / 100.0 * n_layer * n_expert + 1e-9))
    if re.fullmatch(r"\d+", s):
        return int(s)
    raise ValueError(f"capacity {s!r}: give a number of expert slots (e.g. 96) or a share of all experts (e.g. 25%)")


# ------------------------------------------------------------------ windows

def windows(records: Sequence[TraceRecord]):
    """Groups consecutive records with the same window number."""
    group: list[TraceRecord] = []
    for r in records:
        if group and r.window != group[0].window:
            yield group
            group = []
        group.append(r)
    if group:
        yield group


def _first_appearance(tokens: list[list[int]]) -> list[int]:
    seen: dict[int, None] = {}
    for t in tokens:
        for e in t:
            seen.setdefault(e, None)
    return list(seen)


# ------------------------------------------------------------------ policies

def _sim_hotness(records, capacity, n_layer, n_expert, interval, max_swaps, min_diff, decay,
                 stream_min=HOT_STREAM_MIN, staging=HOT_STAGING, per_window=None):
    """off_begin / off_finish of native/src/moe/offload.c over the expert_cache.c table, line by
    line (the module docstring says which engine steps each part mirrors)."""
    heat = np.zeros((n_layer, n_expert), dtype=np.float32)
    res = np.zeros((n_layer, n_expert), dtype=bool)     # holds a slot: READY or LOADING
    loading: list[tuple[int, int]] = []                 # admitted, copy not yet published
    n_res = 0
    hits = lookups = 0
    one, f_min, f_decay = np.float32(1.0), np.float32(min_diff), np.float32(decay)
    ids = np.arange(n_expert)
    last_layer = n_layer - 1
    for wi, window in enumerate(windows(records), 1):
        if per_window is not None:
            per_window.append(hits)
        for r in window:
            # off_begin publishes the copies that completed: every earlier line's admits (that
            # line's off_finish waited for the computation after each copy)
            loading.clear()
            resident = res[r.layer]
            picks = np.fromiter((e for t in r.tokens for e in t), dtype=np.int64)
            lookups += picks.size
            hits += int(resident[picks].sum())
            np.add.at(heat[r.layer], picks, one)    # sequential float32 += 1, as in C
            groups = np.unique(picks)               # the line's expert groups, ascending id
            skipped = set(r.skipped)
            missing = [int(e) for e in groups if not resident[e] and int(e) not in skipped]
            if len(r.tokens) >= stream_min:
                # a streaming step: no admits; borrow slots for the ring (ec_borrow), free ones first,
                # then the coldest READY resident not read by this line; they come back empty
                want = min(len(missing) - staging, capacity // 2, _RING_MAX - min(staging, _RING_MAX))
                evict = max(0, want - (capacity - n_res))
                if evict > 0:
                    read = np.zeros((n_layer, n_expert), dtype=bool)
                    read[r.layer, groups[resident[groups]]] = True
                    cand = np.flatnonzero((res & ~read).ravel())    # keys layer * n_expert + expert
                    cand = cand[np.lexsort((cand, heat.ravel()[cand]))][:evict]   # heat, then key
                    res.ravel()[cand] = False
                    n_res -= cand.size
                continue
            for e in missing:                       # ec_admit: free slots only, ascending id
                if n_res >= capacity:
                    break
                resident[e] = True
                n_res += 1
                loading.append((r.layer, e))
        if window[-1].layer != last_layer:
            loading.clear()    # (a constructed trace without the last layer: nothing is in flight)
        if wi % interval:
            continue
        # off_finish of the last layer: ec_plan_round; the last line's admits are still loading
        busy = np.zeros((n_layer, n_expert), dtype=bool)
        for layer, e in loading:
            busy[layer, e] = True
        pairs = []
        for layer in range(n_layer):
            h, rs = heat[layer], res[layer]
            hot = ids[(~rs) & (h > 0)]
            cold = ids[rs & ~busy[layer]]
            if not hot.size or not cold.size:
                continue
            hot = hot[np.lexsort((hot, -h[hot]))]        # heat descending, id ascending
            cold = cold[np.lexsort((cold, h[cold]))]     # heat ascending, id ascending
            n = min(hot.size, cold.size)
            d = h[hot[:n]] - h[cold[:n]]                  # float32, non-increasing
            keep = int(np.argmin(d >= f_min)) if not bool((d >= f_min).all()) else n
            pairs += [(float(d[i]), layer, int(hot[i]), int(cold[i])) for i in range(keep)]
        pairs.sort(key=lambda p: (-p[0], p[1], p[2]))
        for _, layer, e_in, e_out in pairs[:max_swaps]:
            res[layer, e_out] = False
            res[layer, e_in] = True
        heat *= f_decay
    return hits, lookups


def _sim_belady(records, capacity):
    seq = [(r.layer, e) for r in records for t in r.tokens for e in t]
    never = len(seq)
    nxt = [never] * len(seq)
    seen: dict = {}
    for i in range(len(seq) - 1, -1, -1):
        nxt[i] = seen.get(seq[i], never)
        seen[seq[i]] = i
    cache: dict = {}   # key -> its next pick
    heap: list = []    # (-next pick, key), stale entries skipped
    hits = 0
    for i, k in enumerate(seq):
        if k in cache:
            hits += 1
        elif capacity <= 0 or nxt[i] == never:
            continue
        elif len(cache) >= capacity:
            while True:   # the resident picked furthest in the future
                neg, v = heap[0]
                if cache.get(v) == -neg:
                    break
                heapq.heappop(heap)
            if -neg <= nxt[i]:
                continue   # keeping what is there loses nothing
            heapq.heappop(heap)
            del cache[v]
        cache[k] = nxt[i]
        heapq.heappush(heap, (-nxt[i], k))
        if nxt[i] == never:
            del cache[k]
    return hits, len(seq)


# ------------------------------------------------------------------ the C policies (policy.h)

@dataclass
class FlatTrace:
    """A trace as the flat arrays strata_policy_replay takes (one entry per line, per pick)."""
    line_window: np.ndarray   # int64 [n_lines]
    line_layer: np.ndarray    # int32 [n_lines]
    pick_off: np.ndarray      # int64 [n_lines + 1]
    pick_expert: np.ndarray   # int32 [n_picks]
    pick_rank: np.ndarray     # int32 [n_picks]: the pick's place in its token (0 = top)
    n_windows: int
    window_end: np.ndarray    # int64 [n_windows]: index of the first line after each window

    def prefix(self, n_windows: int) -> "FlatTrace":
        """The first n_windows windows."""
        n_lines = int(self.window_end[n_windows - 1]) if n_windows else 0
        n_picks = int(self.pick_off[n_lines])
        return FlatTrace(self.line_window[:n_lines], self.line_layer[:n_lines], self.pick_off[:n_lines + 1],
                         self.pick_expert[:n_picks], self.pick_rank[:n_picks], n_windows,
                         self.window_end[:n_windows])


def flatten(records: Sequence[TraceRecord]) -> FlatTrace:
    n = len(records)
    line_window = np.fromiter((r.window for r in records), dtype=np.int64, count=n)
    line_layer = np.fromiter((r.layer for r in records), dtype=np.int32, count=n)
    sizes = np.fromiter((sum(len(t) for t in r.tokens) for r in records), dtype=np.int64, count=n)
    pick_off = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(sizes, out=pick_off[1:])
    total = int(pick_off[-1])
    pick_expert = np.fromiter((e for r in records for t in r.tokens for e in t), dtype=np.int32, count=total)
    pick_rank = np.fromiter((i for r in records for t in r.tokens for i in range(len(t))), dtype=np.int32,
                            count=total)
    starts = np.flatnonzero(np.diff(line_window)) + 1 if n else np.zeros(0, dtype=np.int64)
    window_end = np.append(starts, n).astype(np.int64) if n else np.zeros(0, dtype=np.int64)
    return FlatTrace(line_window, line_layer, pick_off, pick_expert, pick_rank, len(window_end), window_end)


def c_policies() -> tuple[str, ...]:
    """The policies of native/src/moe/policy.h (the engine's --cache-policy names), the default first."""
    return C_POLICIES


def c_default_policy() -> str:
    from ._native import ffi, lib
    return ffi.string(lib.strata_policy_default()).decode()


def replay_c(flat: FlatTrace, policy: str, capacity: int, n_layer: int, n_expert: int,
             per_window: bool = False):
    """strata_policy_replay: (hits, lookups), plus the hits of each window when per_window."""
    from ._native import check, ffi, lib

    def ptr(a, t):
        return ffi.cast(t, ffi.from_buffer(a)) if a.size else ffi.NULL

    hits = ffi.new("uint64_t *")
    lookups = ffi.new("uint64_t *")
    wh = np.zeros(max(flat.n_windows, 1), dtype=np.uint64) if per_window else None
    check(lib.strata_policy_replay(
        policy.encode(), n_layer, n_expert, capacity, len(flat.line_window),
        ptr(flat.line_window, "int64_t *"), ptr(flat.line_layer, "int32_t *"), ptr(flat.pick_off, "int64_t *"),
        ptr(flat.pick_expert, "int32_t *"), ptr(flat.pick_rank, "int32_t *"), flat.n_windows,
        ptr(wh, "uint64_t *") if per_window else ffi.NULL, hits, lookups))
    if per_window:
        return int(hits[0]), int(lookups[0]), wh[:flat.n_windows].astype(np.int64)
    return int(hits[0]), int(lookups[0])


def simulate(records: Sequence[TraceRecord], capacity: int, policy: str = "hotness", *,
             interval: int = HOT_INTERVAL, n_layer: int | None = None, n_expert: int | None = None,
             max_swaps: int = HOT_MAX_SWAPS, min_diff: float = HOT_MIN_DIFF,
             decay: float = HOT_DECAY, stream_min: int = HOT_STREAM_MIN,
             staging: int = HOT_STAGING) -> SimResult:
    """Replays a trace through one policy. capacity: expert slots over all layers. interval,
    max_swaps, min_diff, decay: the hotness rule's settings (windows per adjustment round, swaps
    per round, heat difference to swap, heat factor per round); stream_min, staging: the
    scheduler's (a step of at least stream_min tokens streams and borrows cache slots beyond its
    `staging` staging slots). n_layer: the model's layers (the adjustment round follows the last);
    None: as many as the trace shows."""
    if policy not in POLICIES:
        raise ValueError(f"unknown cache policy {policy!r}; choose one of {', '.join(POLICIES)}")
    if capacity < 0:
        raise ValueError(f"capacity {capacity}: give 0 or more expert slots")
    if interval < 1:
        raise ValueError(f"interval {interval}: an adjustment round needs at least 1 window")
    if not min_diff > 0 or not 0 <= decay <= 1 or max_swaps < 0:
        raise ValueError(f"hotness settings: min_diff {min_diff} must be > 0, decay {decay} in [0, 1], "
                         f"max_swaps {max_swaps} >= 0")
    if stream_min < 1 or staging < 0:
        raise ValueError(f"scheduler settings: stream_min {stream_min} must be >= 1, staging {staging} >= 0")
    if policy == "hotness":
        need_l, need_e = trace_shape(records) if records else (1, 1)
        n_layer = max(n_layer or 0, need_l)
        n_expert = max(n_expert or 0, need_e)
        hits, lookups = _sim_hotness(records, capacity, n_layer, n_expert, interval, max_swaps, min_diff, decay,
                                     stream_min, staging)
    elif policy in C_POLICIES:
        need_l, need_e = trace_shape(records) if records else (1, 1)
        hits, lookups = replay_c(flatten(records), policy, capacity, max(n_layer or 0, need_l),
                                 max(n_expert or 0, need_e))
    else:
        hits, lookups = _sim_belady(records, capacity)
    return SimResult(policy, capacity, hits, lookups)


def window_hits(records: Sequence[TraceRecord], capacity: int, policy: str, n_layer: int, n_expert: int,
                flat: FlatTrace | None = None) -> np.ndarray:
    """The hits of each window (in order) under an online policy."""
    if policy in C_POLICIES:
        return replay_c(flat or flatten(records), policy, capacity, n_layer, n_expert, per_window=True)[2]
    if policy == "hotness":
        before: list[int] = []
        hits, _ = _sim_hotness(records, capacity, n_layer, n_expert, HOT_INTERVAL, HOT_MAX_SWAPS, HOT_MIN_DIFF,
                               HOT_DECAY, per_window=before)
        return np.diff(np.array(before + [hits], dtype=np.int64))
    raise ValueError(f"{policy}: not an online policy")


def check_online(records: Sequence[TraceRecord], capacity: int, policy: str, n_layer: int, n_expert: int,
                 prefixes: Sequence[int] | None = None, flat: FlatTrace | None = None) -> list[int]:
    """Replays prefixes of the trace (the first t windows, for each t in prefixes; default: 8 lengths
    spread over the trace) and raises AssertionError when the hits counted in the first t windows of
    the whole replay differ from the prefix's own: a policy that looked ahead. Returns the lengths."""
    flat = flat or flatten(records)
    n = flat.n_windows
    if prefixes is None:
        prefixes = sorted({max(1, round(n * i / 8)) for i in range(1, 8)} | {1})
    if policy == "hotness":
        full = np.cumsum(window_hits(records, capacity, policy, n_layer, n_expert))
        for t in prefixes:
            got = simulate(records[:int(flat.window_end[t - 1])], capacity, "hotness", n_layer=n_layer,
                           n_expert=n_expert).hits
            if got != full[t - 1]:
                raise AssertionError(f"{policy}: {got} hits in the first {t} windows alone, {full[t - 1]} "
                                     "with the later windows present: not online")
        return list(prefixes)
    full = replay_c(flat, policy, capacity, n_layer, n_expert, per_window=True)[2]
    for t in prefixes:
        part = replay_c(flat.prefix(t), policy, capacity, n_layer, n_expert, per_window=True)[2]
        if not np.array_equal(part, full[:t]):
            w = int(np.flatnonzero(part != full[:t])[0])
            raise AssertionError(f"{policy}: window {w} has {part[w]} hits in a replay of the first {t} windows, "
                                 f"{full[w]} in the whole trace's: its decisions looked ahead (not online)")
    return list(prefixes)


def compare(records: Sequence[TraceRecord], fractions: Sequence[float] = (0.25, 0.5, 0.75), *,
            n_layer: int | None = None, n_expert: int | None = None, policies: Sequence[str] | None = None,
            online_check: bool = False, interval: int = HOT_INTERVAL) -> dict:
    """Every policy at every capacity fraction (a share of n_layer x n_expert slots): hit rates and
    their ratio to Belady's. online_check: also check_online for every online policy."""
    need_l, need_e = trace_shape(records)
    n_layer = max(n_layer or 0, need_l)
    n_expert = max(n_expert or 0, need_e)
    policies = list(policies or POLICIES)
    if "belady" not in policies:
        policies.append("belady")
    flat = flatten(records)
    rows = []
    for frac in fractions:
        if not 0 <= frac <= 1:
            raise ValueError(f"capacity fraction {frac}: give a share of all experts in [0, 1]")
        cap = int(math.floor(frac * n_layer * n_expert + 1e-9))
        best = simulate(records, cap, "belady")
        for p in policies:
            if p == "belady":
                r = best
            elif p in C_POLICIES:
                h, n = replay_c(flat, p, cap, n_layer, n_expert)
                r = SimResult(p, cap, h, n)
            else:
                r = simulate(records, cap, p, n_layer=n_layer, n_expert=n_expert, interval=interval)
            row = {"policy": p, "fraction": frac, **r.to_json(),
                   "vs_belady": r.hits / best.hits if best.hits else (1.0 if r.hits == 0 else float("inf"))}
            if online_check and p != "belady":
                row["online_checked"] = check_online(records, cap, p, n_layer, n_expert, flat=flat)
            rows.append(row)
    return {"n_layer": n_layer, "n_expert": n_expert, "windows": flat.n_windows, "lookups": int(len(flat.pick_expert)),
            "default": C_POLICIES[0], "rows": rows}
