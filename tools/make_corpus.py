#!/usr/bin/env python3
"""make_corpus.py — the training corpus and tokenizer of Strata's small trained model (issue 8).

    python tools/make_corpus.py OUT_DIR [--vocab 8192] [--heldout 0.02] [--seed 0]

Sources (all on this machine, permissively licensed; recorded with their licences in OUT_DIR/sources.json
and in models/flash-small/sources.json):
  * the Python standard library's source (*.py under the running interpreter's stdlib; PSF-2.0), test
    suites included, site-packages excluded;
  * the Chinese translation of Vim's tutor (vimtutor zh_cn, /usr/share/vim/*/tutor/; the Vim licence,
    a charityware licence that allows copying and distribution) when it is installed.
Files are normalised to NFC, deduplicated by content (exact SHA-256 of the text), shuffled with the seed,
and split into documents for training and a held-out share; each document ends with <|endoftext|>.

The tokenizer is a byte-level BPE trained (HF `tokenizers`) on the training split only, with the
Qwen 3.5 pre-tokenizer split, NFC, and the ChatML special tokens after the merges: written as a
transformers tokenizer (tokenizer.json + tokenizer_config.json with the chat template), which
`strata convert` turns into tokenizer.ggml.* like any Qwen tokenizer.

Outputs: train.bin / heldout.bin (uint16 token ids), tokenizer.json, tokenizer_config.json,
sources.json (files, bytes, licences, SHA-256 of the corpus), stats.json (documents, tokens, unigram
perplexity of the held-out split under the training split's unigram distribution with add-one smoothing:
the baseline the trained model must beat ten times over).
"""
from __future__ import annotations

import argparse
import glob
import hashlib
import json
import math
import os
import random
import sys
import sysconfig
import unicodedata

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from hfkit import SPECIALS, train_bpe  # noqa: E402

# Qwen 3.5's pre-tokenizer split (llama.cpp "qwen35"): single digits, letters with marks, punctuation runs.
QWEN35_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")


def sources(pattern: str | None = None) -> list[tuple[str, str, str]]:
    """(path, licence, group) of every source file, sorted; `pattern` (a glob, tests) replaces them."""
    if pattern:
        return [(p, "test input", "test") for p in sorted(glob.glob(pattern, recursive=True))]
    out = []
    stdlib = sysconfig.get_paths()["stdlib"]
    for p in sorted(glob.glob(os.path.join(stdlib, "**", "*.py"), recursive=True)):
        if "site-packages" in p or "dist-packages" in p:
            continue
        out.append((p, "PSF-2.0", "python-stdlib"))
    for p in sorted(glob.glob("/usr/share/vim/vim*/tutor/tutor.zh_cn.utf-8")):
        out.append((p, "Vim licence (charityware)", "vimtutor-zh_cn"))
    return out


def read_docs(seed: int, pattern: str | None = None) -> tuple[list[str], list[dict]]:
    seen, docs, meta = set(), [], []
    for path, lic, group in sources(pattern):
        try:
            with open(path, encoding="utf-8") as f:
                text = unicodedata.normalize("NFC", f.read())
        except (UnicodeDecodeError, OSError):
            continue
        h = hashlib.sha256(text.encode()).hexdigest()
        if not text.strip() or h in seen:
            continue
        seen.add(h)
        docs.append(text)
        meta.append({"path": path, "licence": lic, "group": group, "bytes": len(text.encode()), "sha256": h})
    order = list(range(len(docs)))
    random.Random(seed).shuffle(order)
    return [docs[i] for i in order], [meta[i] for i in order]


def train_tokenizer(texts: list[str], vocab: int, out_dir: str):
    return train_bpe(texts, vocab - len(SPECIALS), QWEN35_SPLIT, out_dir)


def encode(tok, docs: list[str], eot: int) -> np.ndarray:
    """Documents as text (a literal "<|endoftext|>" in a source file is text, not the control token), each
    followed by the real <|endoftext|>."""
    tok.encode_special_tokens = True
    out = []
    for enc in tok.encode_batch(docs, add_special_tokens=False):
        out.extend(enc.ids)
        out.append(eot)
    return np.asarray(out, dtype=np.uint16)


def unigram_ppl(train: np.ndarray, held: np.ndarray, vocab: int) -> float:
    counts = np.bincount(train, minlength=vocab).astype(np.float64) + 1.0
    logp = np.log(counts / counts.sum())
    return float(math.exp(-logp[held].mean()))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out_dir")
    ap.add_argument("--vocab", type=int, default=8192, help="tokens including the 3 specials")
    ap.add_argument("--heldout", type=float, default=0.02, help="share of documents held out")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--sources", default=None, help="a glob of text files to use instead (tests)")
    a = ap.parse_args(argv)
    os.makedirs(a.out_dir, exist_ok=True)
    docs, meta = read_docs(a.seed, a.sources)
    if not docs:
        raise SystemExit("make_corpus: no source files found")
    n_held = max(1, int(len(docs) * a.heldout))
    held_docs, train_docs = docs[:n_held], docs[n_held:]
    for m in meta[:n_held]:
        m["split"] = "heldout"
    for m in meta[n_held:]:
        m["split"] = "train"
    tok, ids = train_tokenizer(train_docs, a.vocab, a.out_dir)
    if tok.get_vocab_size() > 65535:
        raise SystemExit("make_corpus: the vocabulary does not fit uint16")
    train = encode(tok, train_docs, ids["<|endoftext|>"])
    held = encode(tok, held_docs, ids["<|endoftext|>"])
    train.tofile(os.path.join(a.out_dir, "train.bin"))
    held.tofile(os.path.join(a.out_dir, "heldout.bin"))
    corpus_sha = hashlib.sha256("".join(m["sha256"] for m in meta).encode()).hexdigest()
    with open(os.path.join(a.out_dir, "sources.json"), "w") as f:
        json.dump({"seed": a.seed, "corpus_sha256": corpus_sha, "files": meta}, f, indent=1)
    stats = {"documents": len(docs), "train_documents": len(train_docs), "heldout_documents": len(held_docs),
             "train_bytes": sum(m["bytes"] for m in meta if m["split"] == "train"),
             "heldout_bytes": sum(m["bytes"] for m in meta if m["split"] == "heldout"),
             "train_tokens": int(train.size), "heldout_tokens": int(held.size), "vocab": tok.get_vocab_size(),
             "unigram_ppl_heldout": unigram_ppl(train, held, tok.get_vocab_size()),
             "groups": {g: sum(1 for m in meta if m["group"] == g) for g in sorted({m["group"] for m in meta})}}
    with open(os.path.join(a.out_dir, "stats.json"), "w") as f:
        json.dump(stats, f, indent=1)
    print(json.dumps(stats))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
