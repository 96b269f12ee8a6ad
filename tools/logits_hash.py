#!/usr/bin/env python3
"""tools/logits_hash.py — a fingerprint of the forward pass, to show that a refactor changed no number.

For the tiny preset at f32 and the small preset at iq2_xs (made with pyrunner.models.make_model, seed 0),
on the `cpu` device and on `sim` with half the routed experts resident and tail skip off: a fixed 64-token
prompt (random ids, seed 0), then 32 greedy decode steps, 2 threads, f32 KV. Prints one line per setting:
the greedy tokens and the SHA-256 of every f32 logit row in order (the prompt's rows, then each step's).

    python tools/logits_hash.py [--work DIR] [--json]

Run it before a change and after; the lines must be the same. Models are made once into DIR (default
$XDG_CACHE_HOME/strata/logits_hash) and reused.
"""
import argparse
import hashlib
import json
import os
import sys
from pathlib import Path

import numpy as np

SETTINGS = [("tiny", "f32"), ("small", "iq2_xs"), ("tiny-gdn128", "f32")]
# Presets made here from a shipped one: the real model's GDN head width (128), which the tiny and small
# presets (16, 64) do not reach, so that the 128-wide sweeps of gdn.c's chunked prefill are fingerprinted.
DERIVED = {"tiny-gdn128": ("tiny", {"linear_key_head_dim": 128, "linear_value_head_dim": 128})}
PROMPT_TOKENS, DECODE_STEPS, THREADS = 64, 32, 2


def _model_file(work: Path, preset: str, recipe: str) -> Path:
    from pyrunner.models import make_model

    path = work / f"{preset}-{recipe}.gguf"
    if not path.exists():
        tmp = path.with_suffix(".partial.gguf")
        source = preset
        if preset in DERIVED:
            base, overrides = DERIVED[preset]
            cfg = json.loads((Path(__file__).resolve().parent.parent / "models" / f"{base}.json").read_text())
            cfg.update(overrides)
            source = str(work / f"{preset}.json")
            Path(source).write_text(json.dumps(cfg))
        make_model(source, str(tmp), recipe=recipe, seed=0)
        tmp.rename(path)
    return path


def _routed_expert_bytes(path: Path) -> int:
    """Bytes of every routed expert of the file (the sim device's slot size × layers × experts)."""
    from pyrunner import Model

    m = Model(str(path), threads=1, n_ctx=64, device="sim", tail_skip=0)
    try:
        n_expert = int(m.metadata[f"{m.metadata['general.architecture']}.expert_count"])
        return m.offload_stats()["slot_bytes"] * m.n_layer * n_expert
    finally:
        m.close()


def fingerprint(path: Path, device: str, cache_gib: float | None) -> dict:
    from pyrunner import Model

    kw = dict(device=device, tail_skip=0, cache_gib=cache_gib, pcie_frac=0.5) if device == "sim" else {}
    m = Model(str(path), threads=THREADS, n_ctx=PROMPT_TOKENS + DECODE_STEPS + 8, kv_type="f32", **kw)
    try:
        rng = np.random.default_rng(0)
        prompt = [int(t) for t in rng.integers(0, min(m.n_vocab, 300), PROMPT_TOKENS)]
        s = m.session()
        h = hashlib.sha256()
        rows = s.eval(prompt, all_logits=True)
        h.update(np.ascontiguousarray(rows, dtype=np.float32).tobytes())
        tokens = []
        last = rows[-1]
        for _ in range(DECODE_STEPS):
            t = int(np.argmax(last))
            tokens.append(t)
            last = s.eval([t])
            h.update(np.ascontiguousarray(last, dtype=np.float32).tobytes())
        return {"tokens": tokens, "sha256": h.hexdigest()}
    finally:
        m.close()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    ap.add_argument("--work", default=os.path.join(xdg, "strata", "logits_hash"), help="where the models are kept")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    work = Path(a.work)
    work.mkdir(parents=True, exist_ok=True)
    out = []
    for preset, recipe in SETTINGS:
        path = _model_file(work, preset, recipe)
        half = _routed_expert_bytes(path) / 2 / 2**30
        for device, gib in (("cpu", None), ("sim", half)):
            r = fingerprint(path, device, gib)
            r.update(preset=preset, recipe=recipe, device=device)
            out.append(r)
            if not a.json:
                where = device + (" half resident, tail skip off" if device == "sim" else "")
                print(f"{preset} {recipe} {where}: sha256 {r['sha256']} tokens {' '.join(map(str, r['tokens']))}")
    if a.json:
        json.dump(out, sys.stdout)
        sys.stdout.write("\n")


if __name__ == "__main__":
    main()
