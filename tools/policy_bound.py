"""policy_bound.py — how near Belady an online cache policy can come on the synthetic routing trace
(issue 20 point 3: the goal is >= 0.95 of Belady's hit rate at 25 / 50 / 75 % capacity).

tools/make_routing_trace.py draws every window from a distribution its state fixes (a popularity that
drifts along a cycle, a recency boost, a floor). A policy that is *told* that state knows more than any
online policy can learn from the picks, so what it reaches says what is reachable:

  stationary  The generator with drift and recency off: every window an independent draw from one fixed
              distribution. No online policy, even one that fetches for free, expects more hits in a
              window than the set of the C keys most likely to be picked (A0, held from the first
              window): its hit rate bounds them all. (A0 as demand paging, holding the C most likely of the
              keys asked for so far, is in --json.) Printed next to Belady, LRU and the engine's default
              policy on the same draws.
  drifting    The committed trace itself (drift and recency on). `prefetch`: told the state, it holds
              the C keys most likely to be picked in the next window, fetching them for free -- the bound
              for any online policy that may fetch what was not asked for. `demand`: told the state, it
              keeps (of what it held and what the window asked for) the C keys with the most expected
              picks over the coming windows, sum_j g^j min(1, K q_{t+j}), best of a few g. That is not
              proved optimal (demand paging under drift is a decision process); it is what a policy
              knowing everything the generator knows gets by keeping what will be used most.

Usage: python tools/policy_bound.py [--windows 3000] [--seed 0] [--json]   (~2 min for 3000 windows)
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import make_routing_trace as mrt  # noqa: E402

FRACTIONS = (0.25, 0.5, 0.75)
GAMMAS = (0.9, 0.95, 0.98)
EXACT = 10          # windows of the horizon evaluated with the recency trace; the rest by rank alone
HORIZON = 700       # windows in the demand policy's value (g^700 < 1e-6 for every g above)


def _picked(top, n_keys: int):
    n_layer = top.shape[0]
    keys = (np.arange(n_layer)[:, None] * mrt.N_EXPERT + top).ravel()
    out = np.zeros(n_keys, bool)
    out[keys] = True
    return out


def _keep(cand, value, c: int):
    """Of the candidate keys, the c of highest value (all of them if there are fewer)."""
    sc = np.where(cand, value, -np.inf)
    if c >= sc.size:
        return cand.copy()
    out = np.zeros(sc.size, bool)
    out[np.argpartition(-sc, c)[:c]] = True
    return out & cand


def stationary(n_windows: int, seed: int, n_layer: int = mrt.N_LAYER):
    """A0 on the stationary generator: (experts, {fraction: the C most likely keys held from the first
    window -- the bound}, {fraction: A0 as demand paging -- the C most likely of the keys asked for so far})."""
    st = mrt.RoutingModel(seed, n_layer, drift=0.0, beta=0.0)
    n_keys = n_layer * mrt.N_EXPERT
    q = st.odds(0).ravel()
    caps = [int(f * n_keys) for f in FRACTIONS]
    best = [_keep(np.ones(n_keys, bool), q, c) for c in caps]      # the C most likely keys, held from the start
    cache = [np.zeros(n_keys, bool) for _ in caps]
    seen = np.zeros(n_keys, bool)
    hits = np.zeros(len(caps))
    bound = np.zeros(len(caps))
    experts = np.empty((n_windows, n_layer, 1, mrt.TOP_K), np.int32)
    for w in range(n_windows):
        top, _ = st.draw(w)
        experts[w, :, 0] = top
        pk = _picked(top, n_keys)
        fresh = (pk & ~seen).any()
        seen |= pk
        for i, c in enumerate(caps):
            bound[i] += (pk & best[i]).sum()
            hits[i] += (pk & cache[i]).sum()
            if fresh:      # the C most likely of the keys asked for so far (q does not move)
                cache[i] = _keep(seen, q, c)
    lookups = n_windows * n_layer * mrt.TOP_K
    return experts, {f: bound[i] / lookups for i, f in enumerate(FRACTIONS)}, \
        {f: hits[i] / lookups for i, f in enumerate(FRACTIONS)}


def drifting(n_windows: int, seed: int, gammas=GAMMAS, n_layer: int = mrt.N_LAYER):
    """The told-the-state policies on the committed trace: (experts, {fraction: prefetch rate},
    {fraction: {gamma: demand rate}})."""
    st = mrt.RoutingModel(seed, n_layer)
    n_keys = n_layer * mrt.N_EXPERT
    caps = [int(f * n_keys) for f in FRACTIONS]
    q0 = st.odds(0, np.zeros_like(st.h))[0][np.argsort(st.rank0[0])]     # the odds by rank, no recency
    js = np.arange(EXACT + 1, HORIZON)
    pre = np.zeros(len(caps))
    dem = np.zeros((len(gammas), len(caps)))
    cache = [[np.zeros(n_keys, bool) for _ in caps] for _ in gammas]
    experts = np.empty((n_windows, n_layer, 1, mrt.TOP_K), np.int32)
    k = mrt.TOP_K
    for w in range(n_windows):
        q = st.odds(w).ravel()
        top, _ = st.draw(w)
        experts[w, :, 0] = top
        pk = _picked(top, n_keys)
        for i, c in enumerate(caps):
            pre[i] += (pk & _keep(np.ones(n_keys, bool), q, c)).sum()
        shift = np.floor(mrt.DRIFT * (w + js)).astype(np.int64) - int(mrt.DRIFT * w)
        near = [np.minimum(1.0, k * st.odds(w + j, st.h * mrt.RHO ** (j - 1))) for j in range(1, EXACT + 1)]
        far = np.minimum(1.0, k * q0[(np.arange(mrt.N_EXPERT)[:, None] + shift[None, :]) % mrt.N_EXPERT])
        for g_i, g in enumerate(gammas):
            value = sum(g ** j * near[j - 1] for j in range(1, EXACT + 1))
            value = (value + (far @ g ** js)[st.rank(w)]).ravel()
            for i, c in enumerate(caps):
                dem[g_i, i] += (pk & cache[g_i][i]).sum()
                cache[g_i][i] = _keep(cache[g_i][i] | pk, value, c)
    lookups = n_windows * n_layer * k
    return (experts, {f: pre[i] / lookups for i, f in enumerate(FRACTIONS)},
            {f: {g: dem[g_i, i] / lookups for g_i, g in enumerate(gammas)} for i, f in enumerate(FRACTIONS)})


def replayed(experts) -> dict:
    """Belady, LRU and the engine's default policy on the trace, at each fraction."""
    from pyrunner import cachesim
    n_windows, n_layer = experts.shape[:2]
    records = [cachesim.TraceRecord(w, layer, experts[w, layer].tolist())
               for w in range(n_windows) for layer in range(n_layer)]
    flat = mrt.flat(experts)
    default = cachesim.c_default_policy()
    out = {}
    for f in FRACTIONS:
        c = int(f * n_layer * mrt.N_EXPERT)
        row = {"belady": cachesim.simulate(records, c, "belady").hit_rate}
        for name in ("lru", default):
            hits, lookups = cachesim.replay_c(flat, name, c, n_layer, mrt.N_EXPERT)
            row[name] = hits / lookups
        out[f] = row
    return out, default


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--windows", type=int, default=3000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    ex_s, a0, a0_demand = stationary(a.windows, a.seed)
    rep_s, default = replayed(ex_s)
    ex_d, pre, dem = drifting(a.windows, a.seed)
    rep_d, _ = replayed(ex_d)
    res = {"windows": a.windows, "seed": a.seed, "default_policy": default, "stationary": {}, "drifting": {}}
    for f in FRACTIONS:
        b = rep_s[f]["belady"]
        res["stationary"][f"{f:.0%}"] = {**rep_s[f], "a0": a0[f], "a0_demand": a0_demand[f],
                                         "a0_over_belady": a0[f] / b}
        b = rep_d[f]["belady"]
        best = max(dem[f].values())
        res["drifting"][f"{f:.0%}"] = {**rep_d[f], "told_prefetch": pre[f], "told_demand": best,
                                       "told_demand_by_gamma": {str(g): v for g, v in dem[f].items()},
                                       "told_demand_over_belady": best / b}
    if a.json:
        print(json.dumps(res, indent=1))
        return 0
    print(f"synthetic trace, {a.windows} windows, seed {a.seed}; hit rates (/ Belady)")
    print(f"{'':12s}{'capacity':>9s}{'belady':>8s}{'lru':>15s}{default:>15s}{'A0 / told dem.':>15s}{'told prefetch':>16s}")
    for kind, key in (("stationary", "a0"), ("drifting", "told_demand")):
        for f, r in res[kind].items():
            b = r["belady"]
            pre_s = f"{r['told_prefetch']:.3f} ({r['told_prefetch'] / b:.3f})" if kind == "drifting" else ""
            print(f"{kind:12s}{f:>9s}{b:8.3f}{r['lru']:8.3f} ({r['lru'] / b:.3f}){r[default]:8.3f} ({r[default] / b:.3f})"
                  f"{r[key]:8.3f} ({r[key] / b:.3f}){pre_s:>16s}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
