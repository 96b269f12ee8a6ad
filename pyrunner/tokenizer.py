"""tokenizer.py — byte-level BPE over libstrata, built from GGUF tokenizer.ggml.* metadata.

The hot loop (added-token matching, the Qwen pre-tokenizer split, BPE merges) is native
(native/src/tokenizer/). Python does what it does best around it: NFC normalisation where
the source tokenizer has it (Qwen's HF tokenizers do; DESIGN §8), BOS/EOS, and streaming
decode that never splits a UTF-8 sequence across token boundaries. Text that is not UTF-8 is
refused by the native encoder, the one check on the way to ids ("the prompt is not valid UTF-8
at byte N"); Python passes such text on as the caller's bytes so that N counts in them.

    tok = Tokenizer.from_gguf("model.gguf")
    ids = tok.tokenize("Hello <|im_end|>")            # add_special=True, parse_special=True
    text = tok.detokenize(ids)
    stream = tok.stream()
    pieces = [stream.push(i) for i in ids] + [stream.flush()]
"""
from __future__ import annotations

import codecs
import os
import unicodedata
from typing import Iterable, Sequence

import numpy as np

from ._native import StrataError, check, ffi, last_error, lib
from .gguf import value_of

PRE = {"qwen2": lib.STRATA_TOKENIZER_PRE_QWEN2, "qwen35": lib.STRATA_TOKENIZER_PRE_QWEN35}
# Pre-tokenizer names other tools write for the same two patterns.
_PRE_ALIASES = {"qwen3": "qwen2", "qwen3.5": "qwen35", "qwen3_5": "qwen35"}
NORMALIZERS = ("NFC", "none")

TOKEN_NORMAL, TOKEN_CONTROL, TOKEN_USER_DEFINED, TOKEN_UNUSED = 1, 3, 4, 5


class InvalidTextError(StrataError, ValueError):
    """Text to tokenize is not valid UTF-8; the message names the byte offset
    ("the prompt is not valid UTF-8 at byte N ...")."""


def _raw_surrogates(e: UnicodeEncodeError) -> tuple[bytes, int]:
    """Codec error handler: a lone surrogate back to bytes. U+DC80..U+DCFF are the bytes that
    Python escaped while decoding argv, a file name or a stream with surrogateescape (PEP 383),
    so they become those bytes again; any other surrogate becomes its 3-byte form (ED xx xx).
    Either way the native encoder then sees what the caller gave and names the byte offset."""
    out = bytearray()
    for ch in e.object[e.start:e.end]:
        c = ord(ch)
        out += bytes([c - 0xDC00]) if 0xDC80 <= c <= 0xDCFF else ch.encode("utf-8", "surrogatepass")
    return bytes(out), e.end


codecs.register_error("strata.raw_surrogates", _raw_surrogates)


def _gguf_scalar(g, key: str, default=None):
    """One string, integer or bool key of an open strata_gguf, or default when absent: what the
    tokenizer needs besides its arrays, read without GGUFFile.metadata() unpacking every array."""
    v = value_of(g, key, default)
    if isinstance(v, list):
        raise ValueError(f"{key} is an array, not a string, integer or bool")
    return v


def _pack(strings: Sequence[str | bytes]) -> tuple[bytes, np.ndarray]:
    raw = [s.encode("utf-8") if isinstance(s, str) else bytes(s) for s in strings]
    lens = np.fromiter((len(b) for b in raw), dtype=np.uint32, count=len(raw))
    return b"".join(raw), lens


def _normalizer_name(value) -> str:
    """The normaliser a GGUF records (strata.tokenizer_normalizer: "NFC", "none", or HF's
    type list such as "NFC" / "Sequence,NFC")."""
    kinds = [k.strip() for k in str(value).split(",") if k.strip() and k.strip() != "Sequence"]
    if kinds in ([], ["none"]):
        return "none"
    if kinds == ["NFC"]:
        return "NFC"
    raise ValueError(f"normaliser {value!r} is not supported (only NFC or none)")


class Tokenizer:
    """Byte-level BPE (GGUF tokenizer.ggml.model = "gpt2") with the Qwen split patterns.

    tokens / token_types / merges are the tokenizer.ggml.* arrays: tokens written byte-level
    (GPT-2's byte map) except CONTROL / USER_DEFINED ones (literal text), merges as "left
    right" in rank order. pre is "qwen2" (Qwen 2/2.5/3) or "qwen35" (Qwen 3.5/3.6).
    ignore_merges: a pre-token that is itself a token becomes that token (tiktoken, HF's
    ignore_merges=true); needed for a vocabulary that is not BPE-closed."""

    def __init__(self, tokens: Sequence[str], token_types: Sequence[int] | None = None,
                 merges: Sequence[str] = (), pre: str = "qwen2", normalizer: str = "NFC",
                 bos_id: int | None = None, eos_id: int | None = None, add_bos: bool = False,
                 add_eos: bool = False, ignore_merges: bool = True):
        params = self._params(pre, ignore_merges)
        self._specials(len(tokens), normalizer, bos_id, eos_id, add_bos, add_eos)
        tdata, tlens = _pack(tokens)
        types = None
        if token_types is not None:
            if len(token_types) != len(tokens):
                raise ValueError(f"{len(token_types)} token types for {len(tokens)} tokens")
            types = np.ascontiguousarray(token_types, dtype=np.int32)
        mdata, mlens = _pack(merges)
        out = ffi.new("strata_tokenizer **")
        check(lib.strata_tokenizer_init(
            ffi.from_buffer(tdata), ffi.from_buffer("uint32_t[]", tlens),
            ffi.from_buffer("int32_t[]", types) if types is not None else ffi.NULL, len(tokens),
            ffi.from_buffer(mdata), ffi.from_buffer("uint32_t[]", mlens), len(merges), params, out))
        self._t = ffi.gc(out[0], lib.strata_tokenizer_free)

    def _params(self, pre: str, ignore_merges: bool):
        pre = _PRE_ALIASES.get(pre, pre)
        if pre not in PRE:
            raise ValueError(f"pre-tokenizer {pre!r} is not supported; Strata knows {sorted(PRE)}")
        self.pre = pre
        params = ffi.new("strata_tokenizer_params *", lib.strata_tokenizer_default_params())
        params.pre = PRE[pre]
        params.ignore_merges = 1 if ignore_merges else 0
        return params

    def _specials(self, n_vocab: int, normalizer: str, bos_id, eos_id, add_bos: bool, add_eos: bool) -> None:
        self.normalizer = _normalizer_name(normalizer)
        self.n_vocab = n_vocab
        for name, v in (("bos_id", bos_id), ("eos_id", eos_id)):
            if v is not None and not 0 <= v < self.n_vocab:
                raise ValueError(f"{name} {v} is outside the vocabulary (0..{self.n_vocab - 1})")
        if add_bos and bos_id is None:
            raise ValueError("add_bos is set but the tokenizer has no bos_id")
        if add_eos and eos_id is None:
            raise ValueError("add_eos is set but the tokenizer has no eos_id")
        self.bos_id, self.eos_id, self.add_bos, self.add_eos = bos_id, eos_id, add_bos, add_eos

    # ------------------------------------------------------------------ construction

    @classmethod
    def from_metadata(cls, md: dict, source: str = "metadata") -> "Tokenizer":
        """From GGUF metadata as pyrunner.gguf.GGUFFile.metadata() returns it (Python lists:
        slow on a real vocabulary; from_gguf reads the file's arrays natively)."""
        get = md.get
        cls._check_model(get, source)
        if "tokenizer.ggml.tokens" not in md:
            raise ValueError(f"{source}: no tokenizer.ggml.tokens; convert the model with its tokenizer files")
        try:
            return cls(md["tokenizer.ggml.tokens"], md.get("tokenizer.ggml.token_type"),
                       md.get("tokenizer.ggml.merges", []), pre=get("tokenizer.ggml.pre", "qwen2"),
                       **cls._special_keys(get))
        except ValueError as e:
            raise ValueError(f"{source}: {e}") from None

    @staticmethod
    def _check_model(get, source: str) -> None:
        model = get("tokenizer.ggml.model")
        if model != "gpt2":
            raise ValueError(f"{source}: tokenizer.ggml.model is {model!r}; Strata reads byte-level BPE (gpt2)")

    @staticmethod
    def _special_keys(get) -> dict:
        """The scalar keys besides the arrays, as keyword arguments; get(key, default) reads one."""
        # Qwen's HF tokenizers normalise with NFC; a GGUF from llama.cpp does not record it.
        return dict(normalizer=get("strata.tokenizer_normalizer", "NFC"),
                    bos_id=get("tokenizer.ggml.bos_token_id"), eos_id=get("tokenizer.ggml.eos_token_id"),
                    add_bos=bool(get("tokenizer.ggml.add_bos_token", False)),
                    add_eos=bool(get("tokenizer.ggml.add_eos_token", False)))

    @classmethod
    def from_gguf(cls, path) -> "Tokenizer":
        """From a GGUF file: the tables are built natively from the mapped tokenizer.ggml.*
        arrays (strata_tokenizer_init_gguf), which are never unpacked into Python objects."""
        out = ffi.new("strata_gguf **")
        check(lib.strata_gguf_open(os.fsencode(path), out))
        g = ffi.gc(out[0], lib.strata_gguf_close)
        return cls.from_gguf_handle(g, str(path))

    @classmethod
    def from_gguf_handle(cls, g, source: str = "GGUF") -> "Tokenizer":
        """From an open `strata_gguf *` (Model passes strata_model_gguf's); the tokenizer does not
        refer to it afterwards. source names the file in messages."""
        def get(key, default=None):
            return _gguf_scalar(g, key, default)

        cls._check_model(get, source)
        self = cls.__new__(cls)
        try:
            params = self._params(get("tokenizer.ggml.pre", "qwen2"), True)
            out = ffi.new("strata_tokenizer **")
            check(lib.strata_tokenizer_init_gguf(g, params, out))
            self._t = ffi.gc(out[0], lib.strata_tokenizer_free)
            self._specials(lib.strata_tokenizer_n_tokens(self._t), **cls._special_keys(get))
        except StrataError as e:
            raise type(e)(e.status, f"{source}: {e}") from None
        except ValueError as e:
            raise ValueError(f"{source}: {e}") from None
        return self

    @classmethod
    def from_vocab(cls, vocab: dict[str, int], merges: Sequence[str | Sequence[str]],
                   added: dict[str, int] | None = None, n_vocab: int | None = None,
                   **kw) -> "Tokenizer":
        """From a HF-style byte-level vocab {token: id}, merges ("a b" or [a, b]) and added
        (CONTROL) tokens {text: id}; ids nobody names become UNUSED."""
        added = added or {}
        size = max(list(vocab.values()) + list(added.values())) + 1
        n_vocab = size if n_vocab is None else n_vocab
        tokens = [f"[PAD{i}]" for i in range(n_vocab)]
        types = [TOKEN_UNUSED] * n_vocab
        for s, i in vocab.items():
            tokens[i], types[i] = s, TOKEN_NORMAL
        for s, i in added.items():
            tokens[i], types[i] = s, TOKEN_CONTROL
        merges = [m if isinstance(m, str) else " ".join(m) for m in merges]
        return cls(tokens, types, merges, **kw)

    # ------------------------------------------------------------------ encode / decode

    def _utf8(self, text: str | bytes) -> bytes:
        """The bytes to encode: text in UTF-8, NFC-normalised where the tokenizer normalises.
        Text that is not valid UTF-8 (bytes, or a str holding lone surrogates) is passed on as
        the caller gave it, not normalised, so that the native encoder's check (the only one)
        reports the byte offset in the caller's text."""
        if isinstance(text, (bytes, bytearray, memoryview)):
            data = bytes(text)
            try:
                text = data.decode("utf-8")
            except UnicodeDecodeError:
                return data
        elif isinstance(text, str):
            try:
                data = text.encode("utf-8")
            except UnicodeEncodeError:
                return text.encode("utf-8", "strata.raw_surrogates")
        else:
            raise TypeError(f"tokenize takes str or bytes, not {type(text).__name__}")
        if self.normalizer == "NFC" and not unicodedata.is_normalized("NFC", text):
            return unicodedata.normalize("NFC", text).encode("utf-8")
        return data

    def tokenize(self, text: str | bytes, add_special: bool = True, parse_special: bool = True) -> list[int]:
        """Token ids of text (str, or UTF-8 bytes). add_special adds BOS/EOS where the model asks
        for them; parse_special matches control tokens written in the text (user-defined ones
        always). Text that is not valid UTF-8 raises InvalidTextError (a ValueError) naming the
        byte offset; a str's lone surrogates count as the bytes they escape (see _raw_surrogates)."""
        data = self._utf8(text)
        buf = np.empty(len(data) + 1, dtype=np.int32)   # every id consumes at least one byte
        n = ffi.new("uint64_t *")
        st = lib.strata_tokenizer_encode(self._t, data, len(data), 1 if parse_special else 0,
                                         ffi.from_buffer("int32_t[]", buf), len(buf), n)
        if st == lib.STRATA_ERR_INVALID_ARG:    # the one argument error a caller's text can cause
            raise InvalidTextError(st, last_error())
        check(st)
        ids = buf[:n[0]].tolist()
        if add_special:
            if self.add_bos:
                ids.insert(0, self.bos_id)
            if self.add_eos:
                ids.append(self.eos_id)
        return ids

    def detokenize_bytes(self, ids: Iterable[int]) -> bytes:
        arr = np.ascontiguousarray(list(ids) if not isinstance(ids, np.ndarray) else ids, dtype=np.int32)
        n = ffi.new("uint64_t *")
        cap = max(16, 8 * len(arr))
        for _ in range(2):
            buf = bytearray(cap)
            st = lib.strata_tokenizer_decode(self._t, ffi.from_buffer("int32_t[]", arr), len(arr),
                                             ffi.from_buffer(buf), cap, n)
            if st == lib.STRATA_ERR_BUFFER_TOO_SMALL:
                cap = n[0]
                continue
            check(st)
            return bytes(buf[:n[0]])
        raise AssertionError("unreachable: the second call has the size the first reported")

    def detokenize(self, ids: Iterable[int]) -> str:
        """The text of ids; bytes that are not valid UTF-8 become U+FFFD (as tiktoken and HF)."""
        return self.detokenize_bytes(ids).decode("utf-8", "replace")

    def token_bytes(self, id: int) -> bytes:
        """The bytes of token id, kept once asked for: a streaming decode asks for every token it emits,
        and a call into the library releases the GIL, which a server's request threads then queue for."""
        id = int(id)
        cache = self.__dict__.get("_token_bytes")
        if cache is None:
            cache = self._token_bytes = {}
        b = cache.get(id)
        if b is None:
            data = ffi.new("const char **")
            n = ffi.new("uint64_t *")
            check(lib.strata_tokenizer_token_bytes(self._t, id, data, n))
            b = cache[id] = ffi.unpack(data[0], n[0])
        return b

    def stream(self) -> "StreamDecoder":
        return StreamDecoder(self)


class StreamDecoder:
    """Decodes ids one at a time for streaming: push() returns only complete characters and
    keeps the bytes of a character split across tokens until the rest arrives; flush() ends
    the stream (an unfinished character becomes U+FFFD). The pieces joined equal
    tokenizer.detokenize(all ids)."""

    def __init__(self, tokenizer: Tokenizer):
        self._tok = tokenizer
        self._dec = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, ids: int | Iterable[int]) -> str:
        if isinstance(ids, (int, np.integer)):
            return self._dec.decode(self._tok.token_bytes(int(ids)))
        return self._dec.decode(self._tok.detokenize_bytes(ids))

    def flush(self) -> str:
        out = self._dec.decode(b"", final=True)
        self._dec.reset()
        return out
