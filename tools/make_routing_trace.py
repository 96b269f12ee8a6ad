"""make_routing_trace.py — a synthetic routing trace of the real model's shape (issue 20 point 3).

Flash-Next routes each token to the top 10 of 512 experts in each of its 48 MoE layers. Its own
routing is not at hand; the one published replay of it (kekzl/imp #2061) gives LRU hit rates of
43.5 / 62.0 / 72.0 / 78.9 % with 93 / 186 / 279 / 372 slots per layer. This tool writes a trace in
the `--trace-routing` format (pyrunner/cachesim.py's docstring) from a model whose parameters were
fitted so that per-layer LRU (`layer-lru`, each layer owning that many slots of a shared table)
matches those figures within 2 points. `--check` prints the figures against the published ones.

The model, per layer l (all layers alike, each with its own random ordering of its experts):
  - popularity over ranks r = 0..511: log p(r) = -ZIPF_S·log(1 + r) - r / CUTOFF (a power law with
    an exponential cut-off: a hot set of some 150 experts, a cold rest);
  - drift: the ranking moves along a fixed cycle of the experts by DRIFT ranks per window (the hot
    set drifts through the experts: some enter it from the cold end, some leave it, every window);
  - temporal reuse: a per-expert recency trace h (h ← RHO·h, then +1 for each pick of the token)
    raises an expert's log-odds by BETA·h (tokens of one passage route alike);
  - a floor: a share FLOOR of the routing mass is spread evenly over all experts (the diffuse tail
    of the router's choices): the odds are q = (1 - FLOOR)·softmax(log p + BETA·h) + FLOOR / 512;
  - a token's top 10: sampled without replacement in proportion to q (the Gumbel top-k trick),
    ordered by their perturbed score (rank 0 first); weights: q renormalised over the ten.
Fitted (a grid over the six, per-layer LRU on 1500 windows of 8 layers, then checked on 48 layers,
1000 and 3000 windows, other seeds): the largest difference from the published figures is < 1 point.
A decode window holds one token; `--mtp K` makes windows of 1 + K consecutive tokens.
Deterministic from --seed (numpy's PCG64).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

N_LAYER = 48
N_EXPERT = 512
TOP_K = 10

# Fitted parameters (see --check); a change moves every figure tests/test_cachesim.py checks.
ZIPF_S = 0.55
BETA = 0.3
RHO = 0.65
DRIFT = 2.2
FLOOR = 0.1
CUTOFF = 150.0

# The published Flash-Next replay: slots per layer -> LRU hit rate.
PUBLISHED_LRU = {93: 0.435, 186: 0.620, 279: 0.720, 372: 0.789}


class RoutingModel:
    """The model's state and random stream, one draw at a time (generate() runs it; tools/policy_bound.py
    tells its policies this state). rank(w)[l, e]: expert e's popularity rank in layer l at window w;
    h: the recency trace."""

    def __init__(self, seed: int = 0, n_layer: int = N_LAYER, n_expert: int = N_EXPERT, top_k: int = TOP_K,
                 zipf_s: float = ZIPF_S, beta: float = BETA, rho: float = RHO, drift: float = DRIFT,
                 floor: float = FLOOR, cutoff: float = CUTOFF):
        self.rng = np.random.default_rng(seed)
        self.n_expert, self.top_k = n_expert, top_k
        self.beta, self.rho, self.drift, self.floor = beta, rho, drift, floor
        ranks = np.arange(n_expert, dtype=np.float64)
        self.base = -zipf_s * np.log1p(ranks) - ranks / cutoff      # base log-odds by rank
        self.rank0 = np.stack([self.rng.permutation(n_expert) for _ in range(n_layer)])
        self.h = np.zeros((n_layer, n_expert))
        self.rows = np.arange(n_layer)[:, None]

    def rank(self, w: int):
        """The ranking at window w: it moves along a fixed cycle, so the hot set drifts through the experts."""
        return (self.rank0 + int(self.drift * w)) % self.n_expert if self.drift else self.rank0

    def odds(self, w: int, h=None):
        """q[l, e]: the chance that one draw of window w picks e (with recency trace h, default the current)."""
        local = self.base[self.rank(w)] + self.beta * (self.h if h is None else h)
        local = np.exp(local - local.max(axis=1, keepdims=True))
        return (1.0 - self.floor) * local / local.sum(axis=1, keepdims=True) + self.floor / self.n_expert

    def draw(self, w: int):
        """One token of window w: (its top-k, best first; their weights), and the recency trace moves on."""
        logit = np.log(self.odds(w))
        score = logit + self.rng.gumbel(size=logit.shape)
        top = np.argpartition(-score, self.top_k, axis=1)[:, :self.top_k]
        top = top[self.rows, np.argsort(-score[self.rows, top], axis=1)]
        lt = logit[self.rows, top]
        wt = np.exp(lt - lt.max(axis=1, keepdims=True))
        self.h *= self.rho
        self.h[self.rows, top] += 1.0
        return top, wt / wt.sum(axis=1, keepdims=True)


def generate(n_windows: int, seed: int = 0, mtp: int = 0, n_layer: int = N_LAYER, n_expert: int = N_EXPERT,
             top_k: int = TOP_K, zipf_s: float = ZIPF_S, beta: float = BETA, rho: float = RHO,
             drift: float = DRIFT, floor: float = FLOOR,
             cutoff: float = CUTOFF):
    """Returns (experts, weights): int32 and float32 arrays (n_windows, n_layer, 1 + mtp, top_k),
    experts best first."""
    gen = RoutingModel(seed, n_layer, n_expert, top_k, zipf_s, beta, rho, drift, floor, cutoff)
    experts = np.empty((n_windows, n_layer, 1 + mtp, top_k), dtype=np.int32)
    weights = np.empty((n_windows, n_layer, 1 + mtp, top_k), dtype=np.float32)
    for w in range(n_windows):
        for t in range(1 + mtp):
            experts[w, :, t], weights[w, :, t] = gen.draw(w)
    return experts, weights


def write(path, experts, weights) -> None:
    n_windows, n_layer = experts.shape[:2]
    with open(path, "w") as f:
        for w in range(n_windows):
            for layer in range(n_layer):
                f.write(json.dumps({"window": w, "layer": layer, "tokens": experts[w, layer].tolist(),
                                    "weights": [[float(f"{x:.6g}") for x in row] for row in weights[w, layer]]},
                                   separators=(",", ":")) + "\n")


def flat(experts):
    """The trace as pyrunner.cachesim.FlatTrace, without the JSON round trip."""
    from pyrunner.cachesim import FlatTrace
    n_windows, n_layer, n_tok, k = experts.shape
    n_lines = n_windows * n_layer
    line_window = np.repeat(np.arange(n_windows, dtype=np.int64), n_layer)
    line_layer = np.tile(np.arange(n_layer, dtype=np.int32), n_windows)
    pick_off = np.arange(n_lines + 1, dtype=np.int64) * (n_tok * k)
    pick_rank = np.tile(np.arange(k, dtype=np.int32), n_lines * n_tok)
    window_end = (np.arange(1, n_windows + 1, dtype=np.int64) * n_layer)
    return FlatTrace(line_window, line_layer, pick_off, experts.reshape(-1).astype(np.int32), pick_rank,
                     n_windows, window_end)


def lru_figures(experts) -> dict[int, float]:
    """Per-layer LRU (cache-sim's layer-lru with n_layer x slots slots) at the published slot counts."""
    from pyrunner.cachesim import replay_c
    f = flat(experts)
    n_layer, n_expert = experts.shape[1], N_EXPERT
    out = {}
    for per_layer in PUBLISHED_LRU:
        hits, lookups = replay_c(f, "layer-lru", per_layer * n_layer, n_layer, n_expert)
        out[per_layer] = hits / lookups
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", nargs="?", help="the JSON-lines trace to write")
    ap.add_argument("--windows", type=int, default=3000, help="decode windows [3000]")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--mtp", type=int, default=0, help="drafted tokens per window (windows of 1 + K tokens) [0]")
    ap.add_argument("--check", action="store_true", help="print per-layer LRU against the published replay")
    a = ap.parse_args(argv)
    experts, weights = generate(a.windows, a.seed, a.mtp)
    if a.out:
        write(a.out, experts, weights)
        print(f"wrote {a.out}: {a.windows} windows x {N_LAYER} layers, top-{TOP_K} of {N_EXPERT}", file=sys.stderr)
    if a.check:
        got = lru_figures(experts)
        worst = 0.0
        for per_layer, want in PUBLISHED_LRU.items():
            worst = max(worst, abs(got[per_layer] - want))
            print(f"{per_layer:4d} slots/layer: LRU {100 * got[per_layer]:.1f} % (published {100 * want:.1f} %)")
        print(f"largest difference {100 * worst:.2f} points")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    raise SystemExit(main())
