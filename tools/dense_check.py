#!/usr/bin/env python3
"""Whole models on the device forward against the C forward (issue 19 point 5: summary.json's "models" rows).

For every model given, for each expert-cache budget (a share of the routed experts' bytes) and pcie_frac, it loads
the file twice — `--device cpu` (the C forward, every expert on the CPU pool) and the device forward (`--dense
device` with `--device cuda` on a GPU; `--dense emu` with `--device sim` without one: the same forward with every
kernel emulated on the host) — and compares:

  max_rel_logit_diff  the largest |device - cpu| over a prompt's logits, each row over its spread (max - min);
                      the criterion is 1e-2. Compared up to the first row where the two runs route a token to
                      different experts (both runs' --trace-routing): a row whose router had two experts tied but
                      for rounding may pick either, and the rows after it (which attend to it) then follow another
                      model; such a difference must be a near-tie (the swapped experts' weights within 2e-3) or
                      the row fails. logit_rows and routing_near_tie_row say where the comparison stopped
  same_tokens         64 greedy steps give the same tokens, judged up to the first step where the C forward's top
                      two are within 1e-3 of the spread (a near-tie may go either way under another summation order;
                      `decided` says how many steps were judged)
  mtp_same_tokens     (a model with an MTP head) greedy generation with 2 drafts a window gives those tokens too

Tail skip is off (it drops experts, on purpose, where cpu runs them all), so the experts' split changes only the
order of sums.

    python tools/dense_check.py MODEL... [--dense device|emu] [--budgets 0,0.5,1] [--pcie 0,0.5,1] [--json OUT]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pyrunner.model import Model  # noqa: E402

TOL = 1e-2
TIE = 1e-3


def rel(a, b) -> float:
    a, b = np.atleast_2d(a), np.atleast_2d(b)
    spread = b.max(axis=1) - b.min(axis=1)
    return float((np.abs(a - b).max(axis=1) / spread).max())


def greedy(model: Model, ids: list[int], n: int):
    s = model.session()
    lg = s.eval(ids)
    toks, rows = [], []
    for _ in range(n):
        t = int(np.argmax(lg))
        toks.append(t)
        rows.append(lg)
        lg = s.eval([t])
    s.close()
    return toks, rows


def decided(rows) -> int:
    for i, lg in enumerate(rows):
        top = np.sort(lg)[-2:]
        if top[1] - top[0] < TIE * (lg.max() - lg.min()):
            return i
    return len(rows)


def routing_tie(cpu_trace: Path, dev_trace: Path, n_layer: int) -> tuple[int | None, bool]:
    """The first prompt row whose experts differ between the two runs' routing (the first n_layer records of each
    --trace-routing file: the prompt's one window per layer), and whether every difference is a near-tie: the
    experts one run picked and the other did not carry the same renormalised weight within 2e-3 (the router's
    K-th and (K+1)-th were equal but for rounding). (None, True) when the routing is the same."""
    a = [json.loads(x) for x in cpu_trace.read_text().splitlines()[:n_layer]]
    b = [json.loads(x) for x in dev_trace.read_text().splitlines()[:n_layer]]
    first, ties = None, True
    for ra, rb in zip(a, b):
        for i, (pa, pb) in enumerate(zip(ra["tokens"], rb["tokens"])):
            if sorted(pa) == sorted(pb):
                continue
            wa = max(w for e, w in zip(pa, ra["weights"][i]) if e not in pb)
            wb = max(w for e, w in zip(pb, rb["weights"][i]) if e not in pa)
            ties = ties and abs(wa - wb) < 2e-3
            first = i if first is None else min(first, i)
            break
    return first, ties


def routed_gib(path: str) -> float:
    """Bytes of the routed experts (slot bytes x experts x layers), from a model on the sim device."""
    with Model(path, threads=1, device="sim", cache_gib=0, tail_skip=0, expert_pack=None) as m:
        st = m.offload_stats()
        arch = m.metadata_value("general.architecture")
        n_exp = int(m.metadata_value(f"{arch}.expert_count"))
        return st["slot_bytes"] * n_exp * m.n_layer / 2**30


def check(path: str, dense: str, budgets, pcies, n_prompt: int, n_gen: int, threads: int,
          prefill_f16: bool = False) -> list[dict]:
    vocab = None
    rows = []
    work = Path(tempfile.mkdtemp(prefix="dense_check."))
    with Model(path, threads=threads) as cpu:
        vocab = cpu.n_vocab
        n_layer = cpu.n_layer
        ids = np.random.default_rng(0).integers(0, min(vocab, 4000) - 1, n_prompt).tolist()
        cpu.trace_routing(str(work / "cpu.jsonl"))
        ref = cpu.session().eval(ids, all_logits=True)
        ref_toks, ref_rows = greedy(cpu, ids, n_gen)
    k = decided(ref_rows)
    total = routed_gib(path)
    device = "cuda" if dense == "device" else "sim"
    recipe = Path(path).stem
    for b in budgets:
        for pf in pcies:
            kw = dict(threads=threads, device=device, dense=dense, cache_gib=b * total * 1.0001, pcie_frac=pf,
                      tail_skip=0, expert_pack=None, prefill_f16=prefill_f16)
            with Model(path, **kw) as m:
                m.trace_routing(str(work / "dev.jsonl"))
                got = m.session().eval(ids, all_logits=True)
                toks, _ = greedy(m, ids, n_gen)
                mtp = m.generate(ids, max_tokens=min(n_gen, 24), temperature=0, mtp=2).tokens if m.n_mtp else None
            tie, ties = routing_tie(work / "cpu.jsonl", work / "dev.jsonl", n_layer)
            rows_cmp = len(ids) if tie is None else tie   # rows after a routing near-tie are another model's
            row = {"recipe": recipe, "budget": b, "pcie_frac": pf, "dense": dense, "prefill_f16": prefill_f16,
                   "max_rel_logit_diff": rel(got[:rows_cmp], ref[:rows_cmp]) if rows_cmp else 0.0,
                   "logit_rows": rows_cmp, "routing_near_tie_row": tie,
                   "same_tokens": toks[:k] == ref_toks[:k], "decided": k}
            row["pass"] = row["max_rel_logit_diff"] < TOL and row["same_tokens"] and ties
            if mtp is not None:   # greedy with two drafts a window: the tokens of greedy without
                n = min(len(mtp), k)
                row["mtp_same_tokens"] = mtp[:n] == ref_toks[:n]
                row["pass"] = row["pass"] and row["mtp_same_tokens"]
            rows.append(row)
            print(f"{recipe:18s} budget {b:4.2f} pcie {pf:4.2f}  max rel {row['max_rel_logit_diff']:.2e} "
                  f"({rows_cmp} rows{'' if tie is None else ', a routing near-tie at row %d' % tie}{'' if ties else ' NOT a tie'})  "
                  f"same tokens {row['same_tokens']} ({k} decided)  {'pass' if row['pass'] else 'FAIL'}", flush=True)
    shutil.rmtree(work, ignore_errors=True)
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("models", nargs="+")
    ap.add_argument("--dense", choices=("device", "emu"), default="device")
    ap.add_argument("--budgets", default="0,0.5,1")
    ap.add_argument("--pcie", default="0,0.5,1")
    ap.add_argument("--prompt", type=int, default=96)
    ap.add_argument("--gen", type=int, default=64)
    ap.add_argument("--threads", type=int, default=min(8, os.cpu_count() or 2))
    ap.add_argument("--prefill-f16", action="store_true", help="prefill products on cuBLAS's f16 path (Model(prefill_f16))")
    ap.add_argument("--json", dest="out", default=None, help="write the rows as a JSON list here")
    a = ap.parse_args()
    budgets = [float(x) for x in a.budgets.split(",")]
    pcies = [float(x) for x in a.pcie.split(",")]
    rows = []
    for path in a.models:
        rows += check(path, a.dense, budgets, pcies, a.prompt, a.gen, a.threads, a.prefill_f16)
    if a.out:
        Path(a.out).write_text(json.dumps(rows, indent=1))
    bad = [r for r in rows if not r["pass"]]
    print(f"{len(rows) - len(bad)} of {len(rows)} rows pass")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
