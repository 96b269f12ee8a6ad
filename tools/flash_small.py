#!/usr/bin/env python3
"""flash_small.py — ship and measure Strata's small trained Flash-Next (issue 8).

    python tools/flash_small.py ship CORPUS RUN WORK [--models models/flash-small]
    python tools/flash_small.py measure CORPUS WORK [--json WORK/measure.json] [--windows N] ...

The chain is tools/make_corpus.py (CORPUS) -> tools/train.py (RUN) -> `ship` -> `measure`.

ship: exports RUN's checkpoint as a transformers directory (WORK/hf), converts it with `strata convert`
(MTP head included) to WORK/flash-small-f32.gguf, quantizes that to q8_0, iq2_xs and nvfp4, and writes
the training report next to the shipped model: loss.png (training CE of the trunk and of the MTP head,
held-out perplexity at each evaluation, the unigram baseline) and report.json (tokens seen, steps, time,
held-out perplexity against the unigram model's). The q8_0 and iq2_xs files are copied into --models.

measure: on the held-out split of CORPUS and the files in WORK (a file that is missing is reported as
such; the checkout's shipped files are found in models/flash-small when WORK lacks them):
  perplexity   held-out perplexity in windows of --seq tokens (the training context), each window a
               fresh session, every position but the first scored: f32, q8_0, iq2_xs, nvfp4 with
               Strata, and f32 with transformers (the checkpoint in WORK/hf): stock, and with QSA's
               indexer choosing among equal scores by Strata's rule, as in training (tools/train.py)
  mtp          greedy generation from held-out prompts with k = 1..3 drafts per verify window:
               acceptance rate and mean accepted length (pyrunner.mtp's counters); the text is checked
               to be the same as without drafts
  cache        a routing trace of held-out text fed one token at a time (a decode's windows),
               replayed by `strata cache-sim`'s simulator: hotness vs LRU vs Belady at 25/50/75 %
  tail skip    the same held-out tokens one at a time on the `sim` device with half of the experts
               resident: tail skip at rank K vs off: top-1 agreement of the next-token choice and
               the perplexity change (K = 7 as DESIGN's default and the ranks that bind at top-k 4)
  llama        Strata vs llama.cpp (llama-cpp-python) on trunk-only copies of each file (ship writes
               WORK/flash-small-nomtp-*.gguf), prompts of 64 held-out tokens (QSA does not bind): top-1
               agreement and the largest logit difference
"""
from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

RECIPES = ("q8_0", "iq2_xs", "nvfp4")
SHIPPED = ("q8_0", "iq2_xs")
NAME = "flash-small"


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def gguf_path(work: str, kind: str) -> str:
    return os.path.join(work, f"{NAME}-{kind}.gguf")


def find_file(work: str, kind: str) -> str | None:
    """WORK's file of this kind, else the checkout's shipped copy."""
    for d in (work, os.path.join(ROOT, "models", NAME)):
        p = gguf_path(d, kind)
        if os.path.isfile(p):
            return p
    return None


# ------------------------------------------------------------------------------------------------ ship

def plot_report(run_log: dict, unigram: float, out_png: str, eval_every: int = 100) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = np.array(run_log["log"], dtype=np.float64)       # step, tokens, ce, mtp ce, elapsed
    evals = np.array(run_log["evals"], dtype=np.float64)    # step, tokens, perplexity
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4.2))
    k = max(1, min(len(rows), max(5, len(rows) // 100)))
    smooth = lambda v: np.convolve(v, np.ones(k) / k, mode="valid")  # noqa: E731
    a.plot(rows[k - 1:, 1] / 1e6, smooth(rows[:, 2]), label="trunk CE (next token)")
    a.plot(rows[k - 1:, 1] / 1e6, smooth(rows[:, 3]), label="MTP head CE (token t+2)")
    a.set_xlabel("training tokens (M)")
    a.set_ylabel(f"cross-entropy, nats (mean of {k} steps)")
    a.grid(alpha=0.3)
    a.legend()
    # train.py evaluates the first 64 held-out windows every --eval-every steps, and the whole split when a
    # session ends (at the last step: the figure in report.json)
    part = evals[:, 0] % eval_every == 0
    b.plot(evals[part, 1] / 1e6, evals[part, 2], "o-", label="held-out perplexity (first 64 windows)")
    b.plot(evals[~part, 1] / 1e6, evals[~part, 2], "*", ms=12, color="C1", label="whole held-out split")
    b.axhline(unigram, color="grey", ls="--", label=f"unigram model {unigram:.0f}")
    b.axhline(unigram / 10, color="red", ls=":", label=f"target: unigram / 10 = {unigram / 10:.0f}")
    b.set_yscale("log")
    b.set_xlabel("training tokens (M)")
    b.set_ylabel("perplexity")
    b.grid(alpha=0.3, which="both")
    b.legend()
    fig.suptitle(f"{NAME}: {run_log['step']} steps, {run_log['tokens'] / 1e6:.2f} M tokens, "
                 f"{run_log['elapsed_s'] / 3600:.2f} h of 2-core step time, seed {run_log['seed']}")
    fig.tight_layout()
    fig.savefig(out_png, dpi=100)
    plt.close(fig)


def sources_record(corpus: str, out: str) -> None:
    """The corpus's sources with their licences: a summary per group, then every file (make_corpus.py)."""
    with open(os.path.join(corpus, "sources.json")) as f:
        src = json.load(f)
    groups: dict[str, dict] = {}
    for rec in src["files"]:
        g = groups.setdefault(rec["group"], {"group": rec["group"], "licence": rec["licence"], "files": 0,
                                             "bytes": 0, "heldout_files": 0})
        g["files"] += 1
        g["bytes"] += rec["bytes"]
        g["heldout_files"] += rec["split"] == "heldout"
    with open(out, "w") as f:
        json.dump({"seed": src["seed"], "corpus_sha256": src["corpus_sha256"], "groups": list(groups.values()),
                   "files": src["files"]}, f, indent=0, ensure_ascii=False)
        f.write("\n")


def heldout_sample(corpus: str, out: str, n_tokens: int = 4096) -> None:
    """The first n_tokens of the held-out split as text (the tokenizer's decoding), for tests in a checkout
    that has no corpus."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(os.path.join(corpus, "tokenizer.json"))
    ids = np.fromfile(os.path.join(corpus, "heldout.bin"), dtype=np.uint16)[:n_tokens]
    with open(out, "w", encoding="utf-8") as f:
        f.write(tok.decode(ids.tolist(), skip_special_tokens=False))


def ship(a) -> int:
    from pyrunner.convert import convert
    from pyrunner.gguf import trunk_only
    from pyrunner.quantize import quantize_file

    os.makedirs(a.work, exist_ok=True)
    hf = os.path.join(a.work, "hf")
    log(f"exporting {a.run} to {hf}")
    cmd = [sys.executable, os.path.join(ROOT, "tools", "train.py"), a.corpus, a.run, "--export", hf]
    subprocess.check_call(cmd + (["--config", a.train_config] if a.train_config else []))
    f32 = gguf_path(a.work, "f32")
    res = convert(hf, f32, "f32", None, log=None, mtp=True)
    log(f"converted: {f32} ({res['bytes'] / 2**20:.1f} MiB, {res['tensors']} tensors)")
    for r in RECIPES:
        out = gguf_path(a.work, r)
        quantize_file(f32, out, r, progress=False)
        log(f"quantized: {out} ({os.path.getsize(out) / 2**20:.1f} MiB)")
    # the trunk alone, for llama.cpp (0.3.36 loads no qwen4exp MTP block)
    for r in ("f32",) + RECIPES:
        trunk_only(gguf_path(a.work, r), gguf_path(a.work, f"nomtp-{r}"))
    log("wrote the trunk-only copies for llama.cpp (nomtp-*)")
    os.makedirs(a.models, exist_ok=True)
    for r in SHIPPED:
        shutil.copyfile(gguf_path(a.work, r), gguf_path(a.models, r))
    with open(os.path.join(a.run, "log.json")) as f:
        run_log = json.load(f)
    with open(os.path.join(a.corpus, "stats.json")) as f:
        cstats = json.load(f)
    with open(os.path.join(hf, "config.json")) as f:
        config = json.load(f)
    sources_record(a.corpus, os.path.join(a.models, "sources.json"))
    heldout_sample(a.corpus, os.path.join(a.models, "heldout-sample.txt"))
    unigram = cstats["unigram_ppl_heldout"]
    plot_report(run_log, unigram, os.path.join(a.models, "loss.png"), a.eval_every)
    step, tokens, ppl = run_log["evals"][-1]
    report = {
        "model": NAME, "seed": run_log["seed"], "steps": run_log["step"], "tokens_seen": run_log["tokens"],
        "train_hours": round(run_log["elapsed_s"] / 3600, 3), "heldout_tokens": cstats["heldout_tokens"],
        "train_tokens": cstats["train_tokens"], "vocab": cstats["vocab"],
        "heldout_ppl": round(ppl, 3), "heldout_ppl_at_step": step, "unigram_ppl": round(unigram, 3),
        "ratio_to_unigram": round(ppl / unigram, 4),
        "evals": [[s, t, round(p, 3)] for s, t, p in run_log["evals"]],
        "files": {r: {"bytes": os.path.getsize(gguf_path(a.work, r))} for r in ("f32",) + RECIPES},
        "config": {k: config[k] for k in sorted(config) if k not in ("architectures", "transformers_version")},
    }
    with open(os.path.join(a.models, "report.json"), "w") as f:
        json.dump(report, f, indent=1)
        f.write("\n")
    log(f"report: held-out perplexity {ppl:.2f} vs unigram {unigram:.1f} ({ppl / unigram:.4f}); "
        f"{a.models}/loss.png, report.json")
    return 0


# ------------------------------------------------------------------------------------------------ measure

def heldout_windows(corpus: str, seq: int, n: int | None) -> np.ndarray:
    toks = np.fromfile(os.path.join(corpus, "heldout.bin"), dtype=np.uint16).astype(np.int64)
    m = (len(toks) - 1) // seq
    if n is not None:
        m = min(m, n)
    return np.stack([toks[w * seq:(w + 1) * seq] for w in range(m)])


def _nll_rows(logits: np.ndarray, targets: np.ndarray) -> np.ndarray:
    z = logits.astype(np.float64)
    z -= z.max(axis=1, keepdims=True)
    return np.log(np.exp(z).sum(axis=1)) - z[np.arange(len(targets)), targets]


def strata_ppl(path: str, windows: np.ndarray, threads: int | None) -> dict:
    from pyrunner import Model

    nll, cnt, t0 = 0.0, 0, time.time()
    with Model(path, threads=threads, n_ctx=windows.shape[1] + 8) as m:
        sess = m.session()
        for w in windows:
            sess.reset()
            out = sess.eval(w, all_logits=True)
            nll += float(_nll_rows(out[:-1], w[1:]).sum())
            cnt += len(w) - 1
    return {"ppl": math.exp(nll / cnt), "tokens_scored": cnt, "seconds": round(time.time() - t0, 1)}


def transformers_ppl(hf: str, windows: np.ndarray, threads: int, tie_rule: bool = False) -> dict:
    """tie_rule: QSA's indexer selects with Strata's rule for equal scores (tools/train.py's indexer, which
    the model was trained with); stock transformers breaks ties in torch.topk's unspecified order, and
    relu scores of 0 tie often. Call with tie_rule=False first: the patch replaces the indexer's forward for the rest of the process."""
    import torch
    import transformers

    torch.set_num_threads(threads)
    if tie_rule:
        sys.path.insert(0, os.path.join(ROOT, "tools"))
        from train import fast_indexer
        from transformers.models.qwen4_exp import modeling_qwen4_exp as mq
        fast_indexer(mq)
    cfg = transformers.AutoConfig.from_pretrained(hf)
    cfg._experts_implementation = "eager"       # the same math as grouped_mm, ~50x faster on CPU at this size
    model = transformers.Qwen4ExpForCausalLM.from_pretrained(hf, config=cfg, torch_dtype=torch.float32)
    model.eval()
    nll, cnt, t0 = 0.0, 0, time.time()
    with torch.no_grad():
        for i in range(0, len(windows), 8):
            ids = torch.from_numpy(windows[i:i + 8])
            logits = model(input_ids=ids, use_cache=False).logits
            nll += torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]),
                                                     ids[:, 1:].reshape(-1), reduction="sum").item()
            cnt += ids[:, 1:].numel()
    return {"ppl": math.exp(nll / cnt), "tokens_scored": cnt, "seconds": round(time.time() - t0, 1)}


def measure_llama(work: str, corpus: str, n_prompts: int, n_tok: int, threads) -> dict:
    """Strata vs llama.cpp (llama-cpp-python) on the trunk-only files, over prompts short enough that QSA
    does not bind: top-1 agreement of every position and the largest logit difference. llama.cpp runs in a child
    process (pyrunner/llama_child.py): a file it crashes on gets {"error": the message}, the others are measured."""
    from pyrunner import Model
    from pyrunner.llama_child import LlamaCrash, logits

    toks = np.fromfile(os.path.join(corpus, "heldout.bin"), dtype=np.uint16).astype(np.int64)
    stride = (len(toks) - n_tok) // n_prompts
    prompts = [toks[i * stride:i * stride + n_tok].tolist() for i in range(n_prompts)]
    out = {"prompts": n_prompts, "tokens": n_tok}
    for kind in ("f32",) + RECIPES:
        path = gguf_path(work, f"nomtp-{kind}")
        if not os.path.isfile(path):
            out[kind] = None
            continue
        try:
            ref = logits(path, prompts, n_ctx=n_tok + 16, n_threads=threads or 2)
        except LlamaCrash as e:
            out[kind] = {"error": str(e)}
            log(f"vs llama.cpp {kind}: {e}")
            continue
        with Model(path, threads=threads, n_ctx=n_tok + 16, kv_type="f32") as m:
            got = [m.session().eval(p, all_logits=True) for p in prompts]
        g, r = np.concatenate(got), np.concatenate(ref)
        out[kind] = {"top1_agreement": float((g.argmax(1) == r.argmax(1)).mean()),
                     "max_abs_dlogit": float(np.abs(g - r).max()), "positions": len(g)}
        log(f"vs llama.cpp {kind}: top-1 {out[kind]['top1_agreement']:.4f}, max|dlogit| "
            f"{out[kind]['max_abs_dlogit']:.3g}")
    return out


def measure_mtp(path: str, corpus: str, n_prompts: int, prompt_len: int, n_gen: int, threads) -> dict:
    from pyrunner import Model
    from pyrunner.generate import generate

    toks = np.fromfile(os.path.join(corpus, "heldout.bin"), dtype=np.uint16).astype(np.int64)
    stride = (len(toks) - prompt_len) // n_prompts
    prompts = [toks[i * stride:i * stride + prompt_len].tolist() for i in range(n_prompts)]
    out = {}
    with Model(path, threads=threads, n_ctx=prompt_len + n_gen + 16) as m:
        base, t0 = [], time.time()
        for p in prompts:
            base.append(generate(m, p, max_tokens=n_gen, temperature=0.0, add_special=False, mtp=0,
                                 session=m.session()).tokens)
        out["0"] = {"seconds": round(time.time() - t0, 2), "tokens": sum(map(len, base))}
        for k in (1, 2, 3):
            prop = acc = win = 0
            same, t0 = True, time.time()
            for p, ref in zip(prompts, base):
                c = generate(m, p, max_tokens=n_gen, temperature=0.0, add_special=False, mtp=k, session=m.session())
                same &= c.tokens == ref
                prop += c.stats.get("drafts_proposed", 0)
                acc += c.stats.get("drafts_accepted", 0)
                win += c.stats.get("mtp_windows", 0) or 0
            out[str(k)] = {"drafts_proposed": prop, "drafts_accepted": acc,
                           "acceptance_rate": acc / prop if prop else None,
                           "mean_accepted_len": (acc + win) / win if win else None,
                           "same_tokens_as_without": same, "seconds": round(time.time() - t0, 2)}
            log(f"mtp k={k}: acceptance {out[str(k)]['acceptance_rate']}, mean accepted length "
                f"{out[str(k)]['mean_accepted_len']}, same text {same}")
    return out


def decode_pass(path: str, seqs: np.ndarray, threads, trace: str | None = None, **engine) -> dict:
    """Feeds each row of seqs one token at a time (fresh session per row); returns the logits' argmax and
    the NLL of the next token at every position but the last, and the engine's offload counters."""
    from pyrunner import Model

    top, nll = [], []
    with Model(path, threads=threads, n_ctx=seqs.shape[1] + 8, **engine) as m:
        if trace:
            m.trace_routing(trace)
        sess = m.session()
        for row in seqs:
            sess.reset()
            for j in range(len(row) - 1):
                lg = sess.eval([int(row[j])])
                top.append(int(np.argmax(lg)))
                nll.append(float(_nll_rows(lg[None, :], np.array([row[j + 1]]))[0]))
        if trace:
            m.trace_routing(None)
        engine = {"log": m.offload_log, "stats": m.offload_stats()}
    return {"top": np.array(top), "nll": np.array(nll), "engine": engine}


def measure_cache(trace: str, pcts=(25, 50, 75)) -> dict:
    from pyrunner import cachesim

    records = cachesim.read_trace(trace)
    n_layer, n_expert = cachesim.trace_shape(records)
    out = {"layers": n_layer, "experts": n_expert, "windows": sum(1 for _ in cachesim.windows(records))}
    for pct in pcts:
        slots = cachesim.parse_capacity(f"{pct}%", n_layer, n_expert)
        row = {"slots": slots}
        for pol in ("hotness", "lru", "belady"):
            res = cachesim.simulate(records, slots, pol, n_layer=n_layer, n_expert=n_expert)
            row[pol] = res.hit_rate
        out[f"{pct}%"] = row
        log(f"cache {pct}% ({slots} slots): " + ", ".join(f"{p} {row[p]:.3f}" for p in ("hotness", "lru", "belady")))
    return out


def measure(a) -> int:
    res = {"seq": a.seq, "started": time.strftime("%Y-%m-%d %H:%M:%S")}
    windows = heldout_windows(a.corpus, a.seq, a.windows)
    res["perplexity"] = {"windows": len(windows)}
    if "ppl" in a.only:
        for kind in ("f32",) + RECIPES:
            p = find_file(a.work, kind)
            if p is None:
                res["perplexity"][kind] = None
                log(f"perplexity {kind}: no file")
                continue
            r = strata_ppl(p, windows, a.threads)
            r["file"], r["bytes"] = os.path.relpath(p, ROOT) if p.startswith(ROOT) else p, os.path.getsize(p)
            res["perplexity"][kind] = r
            log(f"perplexity {kind} (Strata): {r['ppl']:.3f} ({r['seconds']} s)")
        hf = os.path.join(a.work, "hf")
        if os.path.isdir(hf) and not a.no_transformers:
            for tie, key in ((False, "f32_transformers"), (True, "f32_transformers_tie_rule")):
                r = transformers_ppl(hf, windows, a.threads or os.cpu_count() or 2, tie_rule=tie)
                res["perplexity"][key] = r
                log(f"perplexity f32 ({key}): {r['ppl']:.3f} ({r['seconds']} s)")
    if "llama" in a.only:
        res["llama_cpp"] = measure_llama(a.work, a.corpus, a.llama_prompts, a.llama_tokens, a.threads)
    model = find_file(a.work, a.kind)
    if model is None:
        raise SystemExit(f"flash_small: no {a.kind} file in {a.work} or models/{NAME}; run `ship` first")
    res["model"] = os.path.relpath(model, ROOT) if model.startswith(ROOT) else model
    if "mtp" in a.only:
        res["mtp"] = measure_mtp(model, a.corpus, a.mtp_prompts, a.mtp_prompt_len, a.mtp_gen, a.threads)
    seqs = heldout_windows(a.corpus, a.decode_len, None)
    seqs = seqs[np.linspace(0, len(seqs) - 1, a.decode_rows).astype(int)]
    if "cache" in a.only or "tail" in a.only:
        trace = os.path.join(a.work, "routing-heldout.jsonl")
        t0 = time.time()
        off = decode_pass(model, seqs, a.threads, trace=trace)
        log(f"decode pass (cpu, trace): {len(off['top'])} tokens in {time.time() - t0:.0f} s")
        if "cache" in a.only:
            res["cache"] = measure_cache(trace)
            res["cache"]["trace"] = os.path.basename(trace)
    if "tail" in a.only:
        from pyrunner import Model, cachesim

        n_moe, n_exp = cachesim.trace_shape(cachesim.read_trace(trace))
        with Model(model, threads=a.threads, device="sim", cache_gib=0.0, expert_pack=None) as m:
            slot = m.offload_stats()["slot_bytes"]
        cache_gib = a.resident * n_moe * n_exp * slot / 2**30
        tail = {"device": "sim", "resident_share": a.resident, "cache_gib": cache_gib,
                "tokens": int(len(off["top"])), "ppl_cpu": math.exp(off["nll"].mean())}
        runs = {}
        for K in [0] + a.skip_ranks:
            r = decode_pass(model, seqs, a.threads, device="sim", cache_gib=cache_gib, tail_skip=K, pcie_frac=0.0,
                            expert_pack=None)
            st = r["engine"]["stats"]
            runs[str(K)] = {"ppl": math.exp(r["nll"].mean()),
                            "top1_agreement_vs_off": None,
                            "skipped_experts": st["skipped_experts"], "cache_hit_rate": st["cache_hits"] / max(1, st["cache_lookups"]),
                            "log": r["engine"]["log"], "_top": r["top"], "_nll": r["nll"]}
        ref_top, ref_ppl = runs["0"]["_top"], runs["0"]["ppl"]
        tail["off_equals_cpu"] = bool(np.array_equal(ref_top, off["top"]))
        for K, r in runs.items():
            r["top1_agreement_vs_off"] = float((r["_top"] == ref_top).mean())
            r["ppl_change"] = r["ppl"] / ref_ppl - 1
            del r["_top"], r["_nll"]
            log(f"tail skip K={K}: top-1 agreement {r['top1_agreement_vs_off']:.4f}, ppl {r['ppl']:.3f} "
                f"({100 * r['ppl_change']:+.2f} %), skipped {r['skipped_experts']}")
        tail["runs"] = runs
        res["tail_skip"] = tail
    out = a.json or os.path.join(a.work, "measure.json")
    with open(out, "w") as f:
        json.dump(res, f, indent=1)
        f.write("\n")
    log(f"wrote {out}")
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("ship", help="export, convert, quantize, report")
    s.add_argument("corpus")
    s.add_argument("run")
    s.add_argument("work")
    s.add_argument("--models", default=os.path.join(ROOT, "models", NAME), help="where the shipped files go")
    s.add_argument("--train-config", default=None, help="train.py's --config of the run (when it had one)")
    s.add_argument("--eval-every", type=int, default=100, help="train.py's --eval-every of the run (for the plot)")
    m = sub.add_parser("measure", help="the issue's measurements on the held-out split")
    m.add_argument("corpus")
    m.add_argument("work")
    m.add_argument("--json", default=None, help="where the results go (default WORK/measure.json)")
    m.add_argument("--only", default="ppl,llama,mtp,cache,tail",
                   help="comma-separated: ppl, llama, mtp, cache, tail")
    m.add_argument("--llama-prompts", type=int, default=16)
    m.add_argument("--llama-tokens", type=int, default=64, help="prompt length (QSA's budget of 64 does not bind)")
    m.add_argument("--seq", type=int, default=256, help="perplexity window (the training context)")
    m.add_argument("--windows", type=int, default=None, help="perplexity windows (default: the whole split)")
    m.add_argument("--threads", type=int, default=None)
    m.add_argument("--no-transformers", action="store_true")
    m.add_argument("--kind", default="q8_0", help="the file that mtp, cache and tail measure")
    m.add_argument("--mtp-prompts", type=int, default=24)
    m.add_argument("--mtp-prompt-len", type=int, default=48)
    m.add_argument("--mtp-gen", type=int, default=64)
    m.add_argument("--decode-len", type=int, default=256, help="tokens per decode-pass row")
    m.add_argument("--decode-rows", type=int, default=16, help="held-out rows fed one token at a time")
    m.add_argument("--resident", type=float, default=0.5, help="tail skip: share of experts the sim cache holds")
    m.add_argument("--skip-ranks", type=lambda t: [int(x) for x in t.split(",")], default=[7, 3, 2])
    a = ap.parse_args(argv)
    if a.cmd == "ship":
        return ship(a)
    a.only = set(a.only.split(","))
    return measure(a)


if __name__ == "__main__":
    raise SystemExit(main())
