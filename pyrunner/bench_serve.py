"""bench_serve.py — `strata bench serve`: the engine (pyrunner/engine.py) under 1..16 concurrent sequences.

For each concurrency c (model load excluded, one Model for every run):
  decode   c requests with short random prompts, each generating `gen_tokens` greedy tokens (end of
           generation banned, so every request runs its full length); generated tokens/s over the
           wall time from the first submit to the last token, and over the decode phase (once every
           request has its first token; `vs_single` compares this one), time to first token, inter-token
           latency p50 / p99 (the gaps between a request's tokens, over all requests), and the expert
           bytes read per generated token: from the routing trace (strata.h strata_model_trace_routing),
           every (step, layer) reads each expert some row picked once, so it is the union of the
           step's picks times the expert's bytes, over the tokens generated.
  mixed    the same c decoding requests, and once they have 16 tokens each, one more request whose prompt is
           `long_prompt` tokens long; the decoders run on until it is prefilled (then they are cancelled):
           their inter-token p50 / p99 while it is prefilled (its
           pieces of at most `prefill_chunk` tokens share each step's `token_budget` with their decode
           tokens; None: the model's step; pieces of any length keep the output generate()'s), and with
           `itl_factor` sized from live costs so a step takes about that many decode-only steps).
and a file-style batch: `batch_requests` prompts x `batch_tokens` tokens through the engine with
max_seqs 1 and then `batch_parallel`, generated tokens/s of each and their ratio.

Ratios are measured side by side in one run; nothing here asserts a speed (the machine is shared).
"""
from __future__ import annotations

import json
import os
import statistics
import tempfile
import time

import numpy as np

from .engine import DECODE_WINDOW, Engine
from .generate import end_of_generation_ids
from .sampling import SamplingParams


def _expert_bytes(model) -> dict:
    """Bytes of one routed expert (gate + up + down, or the fused gate_up + down) per layer index."""
    from .gguf import GGUFFile

    n_exp = int(model.metadata_value(f"{model.metadata_value('general.architecture')}.expert_count") or 0)
    per: dict = {}
    for t in GGUFFile(model.path).tensors():
        name = t["name"]
        if name.startswith("blk.") and "_exps." in name:
            il = int(name.split(".")[1])
            per[il] = per.get(il, 0) + int(t["size"])
    return {il: b // max(n_exp, 1) for il, b in per.items()}


def _routing_bytes(path: str, per_expert: dict) -> int:
    """Expert bytes the steps of a routing trace read: per (window, layer), the distinct experts."""
    total = 0
    with open(path) as f:
        for line in f:
            rec = json.loads(line)
            picked = {e for tok in rec["tokens"] for e in tok}
            total += len(picked) * per_expert.get(rec["layer"], 0)
    return total


def _pct(xs, q) -> float:
    return float(np.percentile(xs, q)) if len(xs) else 0.0


class _Timed:
    """A request's token arrival times (one per token of every piece)."""

    def __init__(self, req):
        self.req = req
        self.times: list = []

    def run(self):
        for piece in self.req:
            now = time.perf_counter()
            self.times.extend([now] * max(1, len(piece.tokens)))


def _drain(timed: list) -> None:
    """Reads every request's pieces on a thread of its own (their arrival times are the point)."""
    import threading

    ths = [threading.Thread(target=t.run, daemon=True) for t in timed]
    for th in ths:
        th.start()
    for th in ths:
        th.join()


def _random_prompt(rng, model, n: int) -> list:
    return [int(x) for x in rng.integers(0, model.n_vocab, n)]


def run_concurrency(model, c: int, gen_tokens: int, prompt_tokens: int, long_prompt: int, seed: int,
                    mixed: bool, trace_dir: str, prefill_chunk: int | None = None,
                    token_budget: int | None = None, itl_factor: float | None = None) -> dict:
    eog = end_of_generation_ids(model)
    # mixed: the decoders go on until the long prompt is prefilled (then they are cancelled), so every
    # step of its prefill has them beside it
    params = SamplingParams(max_tokens=model.n_ctx - prompt_tokens - 8 if mixed else gen_tokens, temperature=0,
                            logit_bias={t: -np.inf for t in eog})
    rng = np.random.default_rng(seed + c)
    per_expert = _expert_bytes(model)
    route = os.path.join(trace_dir, f"route-{c}-{int(mixed)}.jsonl")
    out = {"concurrency": c, "mode": "mixed" if mixed else "decode"}
    with Engine(model, max_seqs=c + (1 if mixed else 0), mtp=0, prefill_chunk=prefill_chunk,
                token_budget=token_budget, itl_factor=itl_factor) as eng:
        # warm-up: one step of everything the run will use
        eng.submit(_random_prompt(rng, model, prompt_tokens), SamplingParams(max_tokens=2, temperature=0)).result()
        model.trace_routing(route)
        t0 = time.perf_counter()
        timed = [_Timed(eng.submit(_random_prompt(rng, model, prompt_tokens), params)) for _ in range(c)]
        big = None
        if mixed:
            import threading

            th = threading.Thread(target=_drain, args=(timed,), daemon=True)
            th.start()
            # every decoder is past its first tokens: the engine has seen what a decode step costs (its
            # itl_factor plans from the last 16 decode-only steps, engine.DECODE_WINDOW)
            while any(len(t.times) < DECODE_WINDOW for t in timed):
                time.sleep(0.001)
            t_big = time.perf_counter()
            big = eng.submit(_random_prompt(rng, model, long_prompt), SamplingParams(max_tokens=1, temperature=0))
            big.result()
            t_big_end = time.perf_counter()
            for t in timed:
                t.req.cancel()
            th.join()
        else:
            _drain(timed)
        t1 = time.perf_counter()
        model.trace_routing(None)
    gen = sum(len(t.times) for t in timed)
    gaps = [b - a for t in timed for a, b in zip(t.times, t.times[1:])]
    # the decode phase: from the moment every request has its first token (their prompts are prefilled
    # together in the first steps) to the last token
    t_dec = max(t.times[0] for t in timed if t.times)
    n_dec = sum(sum(1 for x in t.times if x > t_dec) for t in timed)
    out.update({"requests": c, "generated_tokens": gen, "wall_s": t1 - t0,
                "generated_tps": gen / (t1 - t0) if t1 > t0 else 0.0,
                "decode_tps": n_dec / (t1 - t_dec) if t1 > t_dec else 0.0,
                "ttft_s_p50": _pct([t.times[0] - t0 for t in timed if t.times], 50),
                "itl_ms_p50": 1e3 * _pct(gaps, 50), "itl_ms_p99": 1e3 * _pct(gaps, 99)})
    if mixed:
        during = [b - a for t in timed for a, b in zip(t.times, t.times[1:]) if t_big <= b <= t_big_end]
        out.update({"long_prompt_tokens": long_prompt, "long_prefill_s": t_big_end - t_big,
                    "itl_ms_p50_during_prefill": 1e3 * _pct(during, 50),
                    "itl_ms_p99_during_prefill": 1e3 * _pct(during, 99),
                    "itl_p99_over_p50": (_pct(during, 99) / _pct(gaps, 50)) if gaps and during else None})
        # (run() adds itl_p99_over_decode_p50: this p99 over the decode-only run's median)
    else:
        read = _routing_bytes(route, per_expert)
        out["expert_bytes_per_token"] = read / gen if gen else 0.0
    os.unlink(route)
    return out


def run_batch_ratio(model, n_requests: int, gen_tokens: int, parallel: int, seed: int, rounds: int = 3) -> dict:
    """n_requests short prompts x gen_tokens through the engine with max_seqs 1 and with `parallel`, in
    `rounds` rounds that alternate the order (1 then N, N then 1, ...): on a shared host one pair of runs
    moved by +-20 % from pair to pair, so the ratio reported is the median of the rounds' ratios, each
    round's own figures kept beside it."""
    eog = end_of_generation_ids(model)
    params = SamplingParams(max_tokens=gen_tokens, temperature=0, logit_bias={t: -np.inf for t in eog})
    rng = np.random.default_rng(seed)
    prompts = [_random_prompt(rng, model, 8 + int(rng.integers(0, 24))) for _ in range(n_requests)]

    def one(p):
        with Engine(model, max_seqs=p, mtp=0) as eng:
            t0 = time.perf_counter()
            reqs = [eng.submit(x, params) for x in prompts]
            texts = [r.result() for r in reqs]
            dt = time.perf_counter() - t0
        return sum(len(c.tokens) for c in texts) / dt, [c.tokens for c in texts]

    per, tokens = [], []
    for r in range(max(1, rounds)):
        got = {p: one(p) for p in ((1, parallel) if r % 2 == 0 else (parallel, 1))}
        per.append({"tps_parallel_1": got[1][0], f"tps_parallel_{parallel}": got[parallel][0],
                    "ratio": got[parallel][0] / got[1][0] if got[1][0] else None})
        tokens += [got[1][1], got[parallel][1]]
    ratios = [x["ratio"] for x in per if x["ratio"] is not None]
    return {"requests": n_requests, "gen_tokens": gen_tokens, "parallel": parallel, "rounds": per,
            "tps_parallel_1": statistics.median(x["tps_parallel_1"] for x in per),
            f"tps_parallel_{parallel}": statistics.median(x[f"tps_parallel_{parallel}"] for x in per),
            "ratio": statistics.median(ratios) if ratios else None,
            "same_tokens": all(t == tokens[0] for t in tokens)}


def run(model, concurrency=(1, 2, 4, 8, 16), gen_tokens: int = 64, prompt_tokens: int = 16, long_prompt: int = 3000,
        batch_requests: int = 64, batch_tokens: int = 256, batch_parallel: int = 8, seed: int = 0,
        batch_rounds: int = 3,
        progress=None, prefill_chunk: int | None = None, token_budget: int | None = None,
        itl_factor: float | None = None) -> dict:
    rows = []
    with tempfile.TemporaryDirectory(prefix="strata-bench-serve-") as d:
        for c in concurrency:
            for mixed in (False, True):
                if mixed and (long_prompt <= 0 or long_prompt + 8 > model.n_ctx):
                    continue
                rows.append(run_concurrency(model, c, gen_tokens, prompt_tokens, long_prompt, seed, mixed, d,
                                            prefill_chunk, token_budget, itl_factor))
                if progress:
                    progress(rows[-1])
    dec = {r["concurrency"]: r for r in rows if r["mode"] == "decode"}
    for r in rows:      # the target's "its median": the same concurrency decoding undisturbed
        if r["mode"] == "mixed" and r["concurrency"] in dec and dec[r["concurrency"]]["itl_ms_p50"] > 0:
            r["itl_p99_over_decode_p50"] = r["itl_ms_p99_during_prefill"] / dec[r["concurrency"]]["itl_ms_p50"]
    base = next((r["decode_tps"] for r in rows if r["concurrency"] == 1 and r["mode"] == "decode"), None)
    for r in rows:
        if r["mode"] == "decode" and base:
            r["vs_single"] = r["decode_tps"] / base
    out = {"settings": {"model": model.path, "threads": model.n_threads, "device": model.device,
                        "gen_tokens": gen_tokens, "prompt_tokens": prompt_tokens, "long_prompt": long_prompt,
                        "prefill_chunk": prefill_chunk or min(512, getattr(model, "prefill_chunk", 512)),
                        "token_budget": token_budget or prefill_chunk or min(512, getattr(model, "prefill_chunk", 512)),
                        "itl_factor": itl_factor},
           "rows": rows}
    if batch_requests > 0:
        out["batch"] = run_batch_ratio(model, batch_requests, batch_tokens, batch_parallel, seed, batch_rounds)
    return out


def table(res: dict) -> str:
    lines = [f"{'conc':>4} {'mode':>6} {'tok/s':>8} {'decode':>8} {'x1':>6} {'ttft ms':>8} {'itl p50':>8} "
             f"{'itl p99':>8} {'experts MB/tok':>14} {'prefill p99/decode p50':>22}"]
    for r in res["rows"]:
        lines.append(f"{r['concurrency']:>4} {r['mode']:>6} {r['generated_tps']:>8.1f} {r['decode_tps']:>8.1f} "
                     f"{r.get('vs_single', float('nan')):>6.2f} {1e3 * r['ttft_s_p50']:>8.1f} "
                     f"{r['itl_ms_p50']:>8.2f} {r['itl_ms_p99']:>8.2f} "
                     f"{r.get('expert_bytes_per_token', float('nan')) / 1e6:>14.2f} "
                     f"{(r.get('itl_p99_over_decode_p50') or float('nan')):>22.2f}")
    b = res.get("batch")
    if b:
        p = b["parallel"]
        each = ", ".join(f"{x['ratio']:.2f}x" for x in b["rounds"] if x["ratio"] is not None)
        lines.append(f"batch {b['requests']} x {b['gen_tokens']} tokens, median of {len(b['rounds'])} rounds: --parallel 1 "
                     f"{b['tps_parallel_1']:.1f} tok/s, --parallel {p} {b[f'tps_parallel_{p}']:.1f} tok/s: {b['ratio']:.2f}x "
                     f"(rounds {each}; same tokens: {b['same_tokens']})")
    return "\n".join(lines)
