"""quantize.py — `strata quantize`: re-encode the weights of a GGUF to a per-tensor type mix (a recipe),
streamed tensor by tensor, with every metadata key copied.

Recipes (the type each tensor gets; `n` = how many tensors of that kind the file has, `k` = this one's
ordinal among them, "more bits" = k < n/8 or k >= 7n/8 or (k - n/8) % 3 == 2, llama.cpp's rule for the
layers that get a larger type):

| recipe | matmul weights | exceptions |
|--------|----------------|------------|
| q8_0   | Q8_0   | — (the choice `strata convert --outtype q8_0` makes, byte for byte) |
| q4_k_m | Q4_K   | output and attn_qkv (the GDN's fused q/k/v; llama.cpp: Q5_K) Q6_K; attn_v,   |
|        |        | ffn_down_exps, ffn_down_shexp: Q6_K on the "more bits" tensors               |
| iq2_xs | IQ2_XS | output Q6_K (llama.cpp: Q5_K), token_embd Q4_K (llama.cpp: Q2_K), attn_v and |
|        |        | attn_qkv Q4_K (llama.cpp's rule for models with >= 4 experts)                 |
| nvfp4  | NVFP4  | —                                                                            |

Substitutions: Strata's quantizer writes Q8_0, Q6_K, Q4_K, Q5_1, IQ4_NL, IQ2_XS, NVFP4 and MXFP4 (plus F16 /
F32 in numpy), so where llama.cpp's mix uses Q5_K or Q2_K the next larger writable type is used, as
listed. llama.cpp's name-substring quirks (e.g. `hc_ffn_down` caught by its `ffn_down` rule, or the bumps
for exactly 8 experts) are not copied: the rules match whole tensor kinds.

Kept at F32 in every recipe: 1-D tensors (ggml_n_dims <= 1, so `ffn_gate_inp_shexp` {E,1} too), names
ending `_norm.weight`, tensors not named `*.weight` (ssm_a, ssm_dt.bias), `ssm_conv1d.weight`, the router
`ffn_gate_inp.weight`. Also kept at F32 in q4_k_m, iq2_xs and nvfp4 (llama.cpp's quantizer does the same):
the QSA indexer projections `indexer.*` — small, and their scores pick blocks by top-k, where noise flips
picks. (q8_0 quantizes them, as the converter does.)

The MTP block (blk.{L} of a file with nextn_predict_layers, recognised by its `nextn.*` tensors) takes the
same rules as a trunk block: its experts as trunk experts, `nextn.eh_proj` / `nextn.hc_head_{down,up}` as the
matmul weights and hyper-connection matrices they are, its norms F32. It is left out of the "more bits"
ordinals, so a file's trunk gets the same types with or without its MTP block, and it counts as the last
layer (so it gets the larger type where the rule gives one, as llama.cpp's last layers do).

Fallback when a row (ggml ne[0]) is not a multiple of the target's block: Q4_K -> Q5_1 (llama.cpp: Q5_0,
which Strata does not write; Q5_1 is what real files use for 640-wide expert rows), Q6_K -> Q8_0,
IQ2_XS -> IQ4_NL (as the real UD/IQ2 files store the 640-wide `ffn_down_exps` rows), NVFP4 -> IQ4_NL
(the same 4.5 bits per weight; e.g. the 160-value PLE rows), then any of those -> F16 when 32 does not
divide the row either (llama.cpp does the same), e.g. `ple_conv1d`.

NVFP4 `.scale` tensors (a llama.cpp-known optional tensor, `{1}` or `{n_expert}` for `*_exps`, multiplied
into the product; llama.cpp knows it only for the weights in SCALE_KINDS) are added where useful (`nvfp4_scale="auto"`, the default): NVFP4 block scales are UE4M3,
whose normal range starts at 2^-6, so a block with max |w| < 6 * 2^-6 gets a scale with fewer mantissa
bits. Measured on gaussian rows: relative RMSE 0.081 at std 1, 0.089 at std 0.02, 0.110 at 0.005, 0.282
at 0.001 without a scale; 0.081 at every std with one (s = amax / (6 * 448), ModelOpt's weight_scale_2).
Real LLM weights (std ~0.01-0.02) get one; the tiny test models (std ~0.06) do not. An input's `X.scale`
is kept with its weight when the weight is copied unchanged, and otherwise folded into the weight's
values before re-encoding and dropped (applying it again would scale the output twice). `.input_scale`
tensors are copied unchanged.

Importance matrix (--imatrix): llama.cpp's legacy `.dat` (llama-imatrix's binary) or its GGUF imatrix
(`<tensor>.in_sum2` / `<tensor>.counts`). Searched formats (Q4_K, Q6_K, IQ4_NL, IQ2_XS, NVFP4) weight
their error by it; without one IQ2_XS and the others use the quantizer's default weighting.
"""
from __future__ import annotations

import os
import struct
import sys
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

import numpy as np

from . import quant
from ._native import StrataError
from .gguf import GGUFFile
from .gguf import writing as gguf_writing


class QuantizeError(Exception):
    """A user error: bad recipe, unreadable input, bad importance matrix. The message says what to do."""


# general.file_type values (llama.cpp's llama_ftype) per recipe
_FILE_TYPE = {"q8_0": 7, "q4_k_m": 15, "iq2_xs": 20, "nvfp4": 39}
RECIPES = {
    "q8_0": "every 2-D matmul weight Q8_0 (F16 where 32 does not divide a row); norms and 1-D stay F32",
    "q4_k_m": "Q4_K, with Q6_K for output and attn_qkv, and for attn_v/ffn_down(_exps/_shexp) on 'more bits' layers; "
              "Q5_1/Q8_0 where 256 does not divide a row",
    "iq2_xs": "experts IQ2_XS (ffn_down_exps with 640-wide rows: IQ4_NL), rest as llama.cpp's IQ2_XS mix "
              "(output Q6_K, token_embd and attn_v/attn_qkv Q4_K, the rest IQ2_XS / IQ4_NL)",
    "nvfp4": "every matmul weight NVFP4 (64-value blocks), IQ4_NL where 64 does not divide a row; a per-tensor "
             "(per-expert) .scale where block scales would be subnormal",
}
_BLOCK = {"F32": 1, "F16": 1, "Q8_0": 32, "Q5_1": 32, "IQ4_NL": 32, "NVFP4": 64, "Q4_K": 256, "Q6_K": 256,
          "IQ2_XS": 256}
_FALLBACK = {"Q4_K": "Q5_1", "Q6_K": "Q8_0", "IQ2_XS": "IQ4_NL", "NVFP4": "IQ4_NL", "Q8_0": "F16", "Q5_1": "F16",
             "IQ4_NL": "F16"}
_CHUNK_VALUES = 1 << 22         # values per quantize call (16 MiB of f32): bounds RAM, feeds the pool


# ------------------------------------------------------------------------------------------- the recipe

def _kind(name: str) -> str:
    """blk.7.attn_v.weight -> attn_v.weight; output.weight -> output.weight."""
    parts = name.split(".")
    return ".".join(parts[2:]) if parts[0] == "blk" and len(parts) > 2 else name


def _n_dims(ne: list[int]) -> int:
    n = len(ne)
    while n > 1 and ne[n - 1] == 1:
        n -= 1
    return n


def _kept_f32(name: str, ne: list[int], recipe: str) -> bool:
    kind = _kind(name)
    if _n_dims(ne) <= 1 or not name.endswith(".weight") or name.endswith("_norm.weight"):
        return True
    if kind in ("ssm_conv1d.weight", "ffn_gate_inp.weight"):
        return True
    return recipe != "q8_0" and kind.startswith("indexer.")


def _more_bits(k: int, n: int) -> bool:
    return k < n // 8 or k >= 7 * n // 8 or (k - n // 8) % 3 == 2


def _wanted(name: str, recipe: str, k: int, n: int) -> str:
    """The recipe's type for a quantizable tensor before the row-length fallback."""
    kind = _kind(name)
    if recipe == "q8_0":
        return "Q8_0"
    if recipe == "nvfp4":
        return "NVFP4"
    if recipe == "q4_k_m":
        if kind in ("output.weight", "attn_qkv.weight"):
            return "Q6_K"
        if kind in ("attn_v.weight", "ffn_down_exps.weight", "ffn_down_shexp.weight"):
            return "Q6_K" if _more_bits(k, n) else "Q4_K"
        return "Q4_K"
    if recipe == "iq2_xs":
        if kind == "output.weight":
            return "Q6_K"
        if kind in ("token_embd.weight", "attn_v.weight", "attn_qkv.weight"):
            return "Q4_K"
        return "IQ2_XS"
    raise QuantizeError(f"unknown recipe {recipe!r}: choose one of {', '.join(RECIPES)}")


def plan_types(tensors: list[dict], recipe: str) -> dict[str, str]:
    """{tensor name: output type} for a file's tensor list (gguf_info-style dicts with name/shape)."""
    if recipe not in RECIPES:
        raise QuantizeError(f"unknown recipe {recipe!r}: choose one of {', '.join(RECIPES)}")
    # MTP blocks (they hold nextn.* tensors): not counted among the trunk's ordinals
    mtp = {t["name"].split(".")[1] for t in tensors if t["name"].startswith("blk.") and ".nextn." in t["name"]}

    def in_mtp(name: str) -> bool:
        return name.startswith("blk.") and name.split(".")[1] in mtp

    counts: dict[str, int] = {}
    for t in tensors:
        if not in_mtp(t["name"]):
            counts[_kind(t["name"])] = counts.get(_kind(t["name"]), 0) + 1
    seen: dict[str, int] = {}
    out = {}
    for t in tensors:
        name, ne, kind = t["name"], t["shape"], _kind(t["name"])
        if in_mtp(name):
            n_kind = counts.get(kind, 0)
            k, counts_kind = max(n_kind - 1, 0), max(n_kind, 1)   # as the trunk's last layer
        else:
            k, counts_kind = seen.get(kind, 0), counts[kind]
            seen[kind] = k + 1
        if _kept_f32(name, ne, recipe):
            out[name] = "F32"
            continue
        typ = _wanted(name, recipe, k, counts_kind)
        while ne[0] % _BLOCK[typ]:
            typ = _FALLBACK[typ]
        out[name] = typ
    return out


# ------------------------------------------------------------------------------------ importance matrix

def load_imatrix(path: str) -> dict[str, np.ndarray]:
    """{tensor name: mean squared activation per input column (ne[0] values, times n_expert for *_exps)}."""
    try:
        with open(path, "rb") as f:
            head = f.read(4)
    except OSError as e:
        raise QuantizeError(f"--imatrix {path}: cannot read it ({e.strerror})") from None
    if head == b"GGUF":
        return _imatrix_gguf(path)
    return _imatrix_dat(path)


def _imatrix_dat(path: str) -> dict[str, np.ndarray]:
    data = open(path, "rb").read()
    bad = QuantizeError(f"--imatrix {path}: not a llama.cpp importance matrix (.dat or GGUF); "
                        "make one with llama-imatrix")
    try:
        (n,), pos = struct.unpack_from("<i", data, 0), 4
        if n <= 0:
            raise bad
        out = {}
        for _ in range(n):
            (ln,) = struct.unpack_from("<i", data, pos)
            if not 0 < ln < 4096:
                raise bad
            name = data[pos + 4:pos + 4 + ln].decode()
            pos += 4 + ln
            ncall, nval = struct.unpack_from("<ii", data, pos)
            pos += 8
            if nval <= 0 or pos + 4 * nval > len(data):
                raise bad
            v = np.frombuffer(data, dtype="<f4", count=nval, offset=pos).astype(np.float32)
            pos += 4 * nval
            out[name] = v / ncall if ncall > 0 else v
        return out
    except (struct.error, UnicodeDecodeError):
        raise bad from None


def _imatrix_gguf(path: str) -> dict[str, np.ndarray]:
    from gguf import GGUFReader
    try:
        r = GGUFReader(path)
    except Exception as e:  # noqa: BLE001 - gguf raises several types for a broken file
        raise QuantizeError(f"--imatrix {path}: not a readable GGUF imatrix ({e})") from None
    ts = {t.name: t for t in r.tensors}
    out = {}
    for name, t in ts.items():
        if not name.endswith(".in_sum2"):
            continue
        base = name[:-len(".in_sum2")]
        s = np.asarray(t.data, dtype=np.float32).reshape(-1, int(t.shape[0]))  # (n_mat, ne0)
        c = ts.get(base + ".counts")
        cnt = np.asarray(c.data, dtype=np.float32).reshape(-1, 1) if c is not None else np.ones((s.shape[0], 1))
        out[base] = (s / np.maximum(cnt, 1)).reshape(-1).astype(np.float32)
    if not out:
        raise QuantizeError(f"--imatrix {path}: a GGUF without *.in_sum2 tensors is not an importance matrix")
    return out


# ---------------------------------------------------------------------------------------- the writing

def _to_f32(typ: str, raw, n: int) -> np.ndarray:
    if typ == "F32":
        return np.frombuffer(raw, dtype="<f4", count=n)
    if typ == "F16":
        return np.frombuffer(raw, dtype="<f2", count=n).astype(np.float32)
    return quant.dequantize(typ, raw, n)


def _encode(typ: str, rows: np.ndarray, im: np.ndarray | None) -> bytes:
    if typ == "F32":
        return np.ascontiguousarray(rows, dtype="<f4").tobytes()
    if typ == "F16":
        return np.ascontiguousarray(rows).astype("<f2").tobytes()
    return quant.quantize(typ, rows, im)


class _Job:
    """One output tensor, written piece by piece (duck-types what GGUFWriter.write_tensor_data uses)."""

    def __init__(self, f: GGUFFile, t: dict, out_type: str, im: np.ndarray | None, pool, width: int, bar,
                 scale: np.ndarray | None = None):
        self.f, self.t, self.out_type, self.im, self.pool, self.width, self.bar = f, t, out_type, im, pool, width, bar
        self.scale = scale                 # folded into the values: (1,) or one per matrix (expert)
        self.divide = None                 # per matrix: values are divided by it (a .scale this tool adds)
        ne = t["shape"]
        self.ne0, self.n = ne[0], int(np.prod(ne, dtype=np.int64))
        self.nbytes = t["size"] if out_type == t["type"] else _row_bytes(out_type, self.ne0) * (self.n // self.ne0)

    def _pieces(self):
        """(first row, end row, matrix index, imatrix slice, fold factor) per piece, in file order."""
        rows = self.n // self.ne0
        # rows per matrix (an expert of a 3-D tensor) so that each piece has one imatrix slice and scale
        per_mat = self.t["shape"][1] if len(self.t["shape"]) > 2 else rows
        step = max(1, min(per_mat, _CHUNK_VALUES // self.ne0))
        for mat0 in range(0, rows, per_mat):
            j = mat0 // per_mat
            im = None
            if self.im is not None:
                k = j % (len(self.im) // self.ne0)
                im = self.im[k * self.ne0:(k + 1) * self.ne0]
            sc = None if self.scale is None else float(self.scale[j % len(self.scale)])
            for r0 in range(mat0, min(mat0 + per_mat, rows), step):
                yield r0, min(r0 + step, mat0 + per_mat, rows), j, im, sc

    def _values(self, raw, r0: int, r1: int, sc: float | None) -> np.ndarray:
        in_row = len(raw) // (self.n // self.ne0)
        vals = _to_f32(self.t["type"], raw[r0 * in_row:r1 * in_row], (r1 - r0) * self.ne0)
        vals = vals.reshape(r1 - r0, self.ne0)
        return vals * np.float32(sc) if sc is not None else vals

    def block_amax(self, block: int) -> list[np.ndarray]:
        """Per matrix, the largest |value| of each `block`-value block (a read-only pass, piece by piece)."""
        raw = self.f.tensor_data(self.t["name"])
        out: dict[int, list] = {}
        for r0, r1, j, _, sc in self._pieces():
            v = np.abs(self._values(raw, r0, r1, sc)).reshape(-1, block).max(axis=1)
            out.setdefault(j, []).append(v)
        return [np.concatenate(out[j]) for j in sorted(out)]

    def tofile(self, fout) -> None:
        raw = self.f.tensor_data(self.t["name"])
        if self.out_type == self.t["type"]:           # nothing to re-encode: copy the bytes
            for o in range(0, len(raw), 1 << 26):
                fout.write(raw[o:o + (1 << 26)])
                self.bar(self.n * len(raw[o:o + (1 << 26)]) // len(raw))
            return

        def work(p):
            r0, r1, j, im, sc = p
            vals = self._values(raw, r0, r1, sc)
            if self.divide is not None:
                vals = vals / np.float32(self.divide[j])
            return _encode(self.out_type, vals, im), (r1 - r0) * self.ne0

        written = 0
        pieces = list(self._pieces())
        # map() keeps order; at most pool-width pieces are in flight at once (bounded RAM)
        for i in range(0, len(pieces), self.width):
            for enc, nv in self.pool.map(work, pieces[i:i + self.width]):
                fout.write(enc)
                written += len(enc)
                self.bar(nv)
        if written != self.nbytes:
            raise QuantizeError(f"{self.t['name']}: wrote {written} bytes, planned {self.nbytes} (a bug)")


class _Extra:
    """A small F32 tensor this tool adds (an NVFP4 `.scale`), written as GGUFWriter expects."""

    def __init__(self, name: str, values: np.ndarray):
        self.data = np.ascontiguousarray(values, dtype="<f4")
        self.t = {"name": name, "type": "F32", "shape": [len(self.data)]}
        self.out_type, self.n, self.nbytes = "F32", len(self.data), self.data.nbytes

    def tofile(self, fout) -> None:
        fout.write(self.data.tobytes())


def _row_bytes(typ: str, n: int) -> int:
    if typ == "F32":
        return 4 * n
    if typ == "F16":
        return 2 * n
    return quant.row_size(typ, n)


def _copy_metadata(w, reader, file_type: int, extra: dict) -> None:
    from gguf import GGUFValueType as VT
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture" or key.startswith("split."):
            continue
        if key in ("general.file_type",) or key in extra:
            continue
        vtype = field.types[0]
        val = field.contents()
        sub = field.types[1] if vtype == VT.ARRAY and len(field.types) > 1 else None
        if vtype == VT.ARRAY and sub is None:          # an empty array: its element type is in the file
            sub = VT(int(field.parts[-2][0])) if len(field.parts) >= 2 else VT.INT32
        w.add_key_value(key, val, vtype, sub_type=sub)
    w.add_uint32("general.file_type", file_type)
    for k, v in extra.items():
        if isinstance(v, str):
            w.add_string(k, v)
        else:
            w.add_uint32(k, int(v))


def _progress(total: int, enabled: bool):
    """A one-line progress bar on stderr; returns (advance(n), close())."""
    state = {"done": 0, "shown": -1}
    if not enabled or total <= 0:
        return (lambda n: None), (lambda: None)
    tty = sys.stderr.isatty()

    def advance(n: int) -> None:
        state["done"] += n
        pct = int(100 * state["done"] / total)
        # a terminal redraws the line at every percent; a log gets a line per 25 %
        if pct != state["shown"] and (tty or pct // 25 != state["shown"] // 25):
            state["shown"] = pct
            fill = pct * 30 // 100
            sys.stderr.write(f"{chr(13) if tty else ''}quantizing [{'#' * fill}{'.' * (30 - fill)}] {pct:3d}%"
                             f"{'' if tty else chr(10)}")
            sys.stderr.flush()

    def close() -> None:
        sys.stderr.write("\n" if tty else "")
        sys.stderr.flush()
    return advance, close


def format_shares(result: dict) -> str:
    """The table quantize_file prints: type, bytes, share of weight bytes, share of weight values."""
    lines = [f"{'type':8s} {'MiB':>10s} {'bytes':>7s} {'values':>7s}"]
    for typ, b in sorted(result["bytes"].items(), key=lambda kv: -kv[1]):
        lines.append(f"{typ:8s} {b / 2**20:10.2f} {100 * result['share'][typ]:6.2f}% "
                     f"{100 * result['value_share'][typ]:6.2f}%")
    return "\n".join(lines)


_E4M3_MAX = 448.0              # largest UE4M3 block scale; E2M1 codes reach 6
_E4M3_MIN_NORMAL = 2.0 ** -6   # below it a block scale keeps fewer than 3 mantissa bits
NVFP4_SCALE_MODES = ("auto", "always", "never")


# The weights whose `.scale` llama.cpp's qwen4exp loader (llama-cpp-python 0.3.36) accepts; a `.scale` on any
# other tensor (hc_*, ple_*, token_embd, ...) makes it refuse the file (tests/test_quantize_file.py checks that
# it loads, and applies the scale, with a scale on every one of these).
SCALE_KINDS = frozenset(f"{k}.weight" for k in (
    "attn_q", "attn_k", "attn_v", "attn_output", "attn_qkv", "attn_gate", "ssm_alpha", "ssm_beta", "ssm_out",
    "ffn_gate_exps", "ffn_up_exps", "ffn_down_exps", "ffn_gate_shexp", "ffn_up_shexp", "ffn_down_shexp",
    "output"))


def _add_nvfp4_scales(jobs: list, names: set, mode: str) -> list:
    """Give re-encoded NVFP4 weights a `.scale` (one per expert for 3-D tensors): the values are divided
    by s = amax / (6 * 448) so the largest block scale is UE4M3's largest and every other block scale stays
    in its normal range (ModelOpt's choice of weight_scale_2). "auto" does it where useful: where > 10 % of
    the non-zero blocks would otherwise get a subnormal scale, or where one would overflow. Only weights
    of SCALE_KINDS get one."""
    if mode == "never":
        return jobs
    out = []
    for j in jobs:
        out.append(j)
        if (not isinstance(j, _Job) or j.out_type != "NVFP4" or j.out_type == j.t["type"]
                or _kind(j.t["name"]) not in SCALE_KINDS):
            continue
        sname = j.t["name"][:-len(".weight")] + ".scale" if j.t["name"].endswith(".weight") else None
        if sname is None or sname in names:
            continue
        amax = j.block_amax(64)
        if mode == "auto":
            nz = np.concatenate(amax)
            nz = nz[nz > 0]
            sub = float(np.mean(nz / 6 < _E4M3_MIN_NORMAL)) if len(nz) else 0.0
            if sub <= 0.10 and (not len(nz) or nz.max() / 6 <= _E4M3_MAX):
                continue
        s = np.array([float(a.max()) / (6 * _E4M3_MAX) if a.size and a.max() > 0 else 1.0 for a in amax],
                     dtype=np.float32)
        j.divide = s
        out.append(_Extra(sname, s))
    return out


def quantize_file(src: str, dst: str, recipe: str, imatrix: str | None = None, progress: bool = True,
                  threads: int | None = None, log: Callable[[str], None] | None = None,
                  nvfp4_scale: str = "auto") -> dict:
    """Quantize the GGUF `src` to `dst` with a recipe (see RECIPES and this module's docstring).

    Wanted CLI (the lead wires it in cli.py):

        strata quantize IN.gguf OUT.gguf --recipe {q8_0,q4_k_m,iq2_xs,nvfp4} [--imatrix FILE]
                        [--threads N] [--nvfp4-scale auto|always|never] [--quiet]

    IN.gguf: any GGUF Strata reads (a split set through its first file); OUT.gguf: one file, written to
    OUT.gguf.tmp and renamed when complete (an existing OUT.gguf is replaced; IN == OUT is refused).
    --imatrix: llama-imatrix output (.dat or GGUF). --threads: quantizer threads (default: all cores).
    --nvfp4-scale: whether NVFP4 weights get a `.scale` tensor (module docstring; default auto).
    --quiet: no progress bar. Output: a progress bar on stderr while writing, then (stdout) the table of
    format_shares(): per type, MiB, share of weight bytes and share of weight values. Errors raise
    QuantizeError (the CLI turns it into a ClickException).

    Returns {"recipe", "tensors", "file_bytes", "bytes": {type: bytes}, "share": {type: share of all
    tensor bytes}, "values": {type: n values}, "value_share": {type: share of all values},
    "types": {tensor name: type}}.
    """
    from gguf import GGMLQuantizationType, GGUFReader

    if recipe not in RECIPES:
        raise QuantizeError(f"unknown recipe {recipe!r}: choose one of {', '.join(RECIPES)}")
    if nvfp4_scale not in NVFP4_SCALE_MODES:
        raise QuantizeError(f"--nvfp4-scale {nvfp4_scale!r}: choose one of {', '.join(NVFP4_SCALE_MODES)}")
    if not os.path.isfile(src):
        raise QuantizeError(f"{src}: no such file")
    if os.path.abspath(src) == os.path.abspath(dst):
        raise QuantizeError(f"{dst}: the output must be a different file from the input")
    if not os.path.isdir(os.path.dirname(os.path.abspath(dst))):
        raise QuantizeError(f"{dst}: its folder does not exist; create it first")
    try:
        f = GGUFFile(src)
        tensors = f.tensors()
    except StrataError as e:
        raise QuantizeError(f"{src}: not a valid GGUF file ({e}); re-download or re-convert it") from None
    known = set(quant.supported_types())
    unreadable = [t for t in tensors if t["type"] not in known]
    if unreadable:
        t = unreadable[0]
        raise QuantizeError(f"{src}: tensor {t['name']} has type {t['type']}, which Strata cannot dequantize; "
                            "quantize from an F32/F16/BF16 file or one of a supported type")
    try:
        reader = GGUFReader(src)
    except Exception as e:  # noqa: BLE001
        raise QuantizeError(f"{src}: cannot read its metadata ({e})") from None
    arch = reader.fields.get("general.architecture")
    if arch is None:
        raise QuantizeError(f"{src}: no general.architecture key; not a model GGUF")
    arch = arch.contents()

    im = load_imatrix(imatrix) if imatrix else None
    types = plan_types(tensors, recipe)
    ims = {}
    for t in tensors:
        if im is None or types[t["name"]] in ("F32", "F16") or t["name"] not in im:
            continue
        v = im[t["name"]]
        if len(v) % t["shape"][0]:
            raise QuantizeError(f"--imatrix {imatrix}: {t['name']} has {len(v)} values, not a multiple of its "
                                f"row length {t['shape'][0]}; was it made for another model?")
        ims[t["name"]] = v

    # X.scale multiplies X.weight's product: fold it into a weight that is re-encoded, and drop it
    by_name = {t["name"]: t for t in tensors}
    scales, dropped = {}, set()
    for t in tensors:
        base = t["name"][:-len(".weight")] if t["name"].endswith(".weight") else None
        st = by_name.get(f"{base}.scale") if base else None
        if st is None:
            continue
        types[st["name"]] = st["type"]                  # a scale itself is never re-encoded
        if types[t["name"]] == t["type"]:
            continue                                    # the weight is copied: its scale stays valid
        v = _to_f32(st["type"], f.tensor_data(st["name"]), int(np.prod(st["shape"], dtype=np.int64)))
        n_mat = t["shape"][2] if len(t["shape"]) > 2 else 1
        if len(v) not in (1, n_mat):
            raise QuantizeError(f"{src}: {st['name']} has {len(v)} values; {t['name']} needs 1 or {n_mat}")
        scales[t["name"]] = np.array(v, dtype=np.float32)
        dropped.add(st["name"])

    extra = {"strata.quantize.recipe": recipe}
    if "general.quantization_version" not in reader.fields:
        extra["general.quantization_version"] = 2       # ggml's block-layout version, as llama.cpp writes
    if imatrix:
        extra |= {"quantize.imatrix.file": os.path.basename(imatrix), "quantize.imatrix.entries_count": len(ims)}

    n_threads = threads or os.cpu_count() or 1
    total = sum(int(np.prod(t["shape"], dtype=np.int64)) for t in tensors if t["name"] not in dropped)
    advance, close = _progress(total, progress)
    try:
        with gguf_writing(dst, arch) as w, ThreadPoolExecutor(n_threads) as pool:
            jobs = [_Job(f, t, types[t["name"]], ims.get(t["name"]), pool, n_threads, advance,
                         scales.get(t["name"])) for t in tensors if t["name"] not in dropped]
            jobs = _add_nvfp4_scales(jobs, set(by_name) - dropped, nvfp4_scale)
            for j in jobs:
                types[j.t["name"]] = j.out_type
            _copy_metadata(w, reader, _FILE_TYPE[recipe], extra)
            for j in jobs:
                # GGUFWriter wants the numpy-order element shape
                w.add_tensor_info(j.t["name"], list(reversed(j.t["shape"])), np.dtype(np.float32), j.nbytes,
                                  raw_dtype=GGMLQuantizationType[j.out_type])
            w.write_header_to_file()
            w.write_kv_data_to_file()
            w.write_ti_data_to_file()
            for j in jobs:
                w.write_tensor_data(j)
                if log:
                    log(f"{j.t['name']:40s} {j.t['type']:>6s} -> {j.out_type}")
    finally:
        close()

    by_bytes: dict[str, int] = {}
    by_vals: dict[str, int] = {}
    for j in jobs:
        by_bytes[j.out_type] = by_bytes.get(j.out_type, 0) + j.nbytes
        by_vals[j.out_type] = by_vals.get(j.out_type, 0) + j.n
    tb, tv = sum(by_bytes.values()) or 1, sum(by_vals.values()) or 1
    result = {"recipe": recipe, "tensors": len(jobs), "file_bytes": os.path.getsize(dst), "bytes": by_bytes,
              "share": {k: v / tb for k, v in by_bytes.items()}, "values": by_vals,
              "value_share": {k: v / tv for k, v in by_vals.items()},
              "types": {k: v for k, v in types.items() if k not in dropped}}
    if progress:
        print(format_shares(result))
    return result
