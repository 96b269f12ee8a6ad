"""convert.py — a transformers qwen4exp checkpoint (safetensors) -> GGUF with llama.cpp's `qwen4exp` names,
shapes and layouts (spec/qwen4exp-gguf.md), streaming tensor by tensor.

Input: a directory written by `save_pretrained` of Qwen4ExpForCausalLM, or the text part of
Qwen4ExpForConditionalGeneration (`model.language_model.*`; `model.visual.*` is dropped),
with experts per expert (`experts.{e}.{gate,up,down}_proj.weight`) or fused (`experts.gate_up_proj`,
`experts.down_proj`), the PLE table in `split_ngram_parts` row shards and its three int64 buffers.

safetensors is read here directly: 8-byte little-endian header length, a JSON header of
{name: {dtype, shape, data_offsets}}, then raw little-endian data. Every tensor is a view of a read-only
memory map; the large outputs (stacked experts, the PLE table) are written one expert / one shard at a
time, so peak RAM stays around the largest single source tensor.

Transformations (spec §3), all in float32:
  * (1+w) gammas folded: every hyper-connection hc_norm, attention q/k norm, indexer q/k layernorm and
    the three PLE norms get +1 (linear_attn.norm is a plain gamma and does not);
  * GDN: A_log -> ssm_a = -exp(A_log); conv [C,1,K] -> [C,K]; when V heads != K heads, the V heads are
    permuted from HF's grouped order (by K head) to ggml's tiled order in the V rows of in_proj_qkv,
    in_proj_z, in_proj_a/b, A_log, dt_bias, the V channels of the conv and the columns of out_proj;
  * QSA: index_qk_proj split into indexer.q_proj (first Hi*Di rows) and indexer.k_proj (last Di rows);
  * experts stacked to 3-D (fused gate_up split into gate = first half, up = second half);
  * PLE shards concatenated in index order; the int64 buffers become UINT64 metadata arrays (exact).
MTP head (spec/qwen4exp-mtp.md §4): the checkpoint's top-level `mtp.*` tensors become block blk.{L} (L =
num_hidden_layers; block_count = L + 1, nextn_predict_layers = 1): the decoder layer `mtp.layers.0.*` under the
trunk's block names (same transformations: (1+w) norms, index_qk_proj split, experts stacked), plus
blk.{L}.nextn.{enorm, hnorm} (pre_fc_norm_embedding / _hidden, +1), nextn.eh_proj = cat([fc_embedding,
fc_hidden], dim=1) ({2E, E}: input columns 0..E-1 take the normed embedding, E..2E-1 one normed stream) and
nextn.hc_head_{norm (+1), down, up} (the MTP's hyper_connection_mixer). Its compress ratio is the trunk's QSA
ratio, not the 0 (dense) upstream writes: the reference runs QSA in the MTP layer. mtp=False (--no-mtp) drops
the head: the file then is the trunk alone, which llama.cpp builds without qwen4exp MTP support load.
Two llama.cpp converter bugs are NOT repeated: compress_ratios are written for every QSA layer whatever
transformers calls it ("full_attention" or "indexed_attention"), and the PLE EOS is eos_token_id[0], the
one transformers' n-gram module resets on.

ModelOpt NVFP4 checkpoints (config.json quantization_config and/or hf_quant_config.json with quant_algo NVFP4,
or MIXED_PRECISION whose every layer is NVFP4; any other algorithm or quantization method is an error): a
quantized linear weight is X.weight U8 [rows, cols/2] (two E2M1 codes per byte, value 2j in the low nibble),
X.weight_scale F8_E4M3 [rows, cols/16], X.weight_scale_2 F32 (one value), maybe X.input_scale F32; a weight
without its weight_scale / weight_scale_2 is an error naming it. Its value is (code x weight_scale) x
weight_scale_2 in float32 (the first product is exact, so one rounding). Such a weight stays NVFP4 (ggml type
40: per 64 values four UE4M3 scales = the E4M3 bits, then 32 bytes of codes, byte 8j+i = values 16j+i (low) and
16j+8+i (high)) with weight_scale_2 as a F32 `X.scale` ({1}; {n_expert} for the stacked *_exps) and a
non-trivial input_scale as `X.input_scale`, as llama.cpp's converter writes them; scales that are exactly 1
are omitted. The transformations move codes and scales together: per-expert stacking (one scale2 per
expert), the V-head rows (grouped -> tiled), the index_qk_proj row split; the columns of ssm_out are permuted
in whole 16-value groups, which keeps each group with its block scale when the V head width is a multiple of
16 (real model: 128). Where NVFP4 cannot be kept, the exactly dequantized values are written at the
--outtype of float tensors (exact at f32, one rounding at f16/bf16): a permutation that would split scale
groups; rows that are not whole 64-value blocks (e.g. a 32-wide expert down row; the PLE table, whose 160-
or 16-value rows are not either -- its packed-file path is separate, DESIGN §6); and weights llama.cpp's
qwen4exp loader accepts no `.scale` for (hc_*, ple_*, indexer.*, token_embd, the routers), since weight_scale_2
cannot be folded into UE4M3 block scales exactly. Unquantized tensors (norms, routers, embeddings, ...)
are converted as usual; ModelOpt's KV-cache k_scale/v_scale tensors are dropped (the KV type is a run option).

Output types follow llama.cpp's converter: 1-D tensors, *_norm.weight, the routers (ffn_gate_inp,
ffn_gate_inp_shexp), ssm_conv1d and non-".weight" tensors stay F32; everything else takes --outtype, and a
q8_0 tensor whose rows are not a multiple of 32 falls back to F16 (as llama.cpp's does).
"""
from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from typing import Callable, Iterator

import numpy as np

from .safetensors_io import PACKED_DTYPES as _PACKED_DTYPES
from .safetensors_io import Checkpoint, CheckpointError

ARCH = "qwen4exp"
OUTTYPES = ("f32", "f16", "bf16", "q8_0")
# general.file_type values (llama.cpp's LlamaFileType); the recipe names are tools/make_model.py's
_FILE_TYPE = {"f32": 0, "f16": 1, "q8_0": 7, "bf16": 32, "q4_k_m": 15, "iq2_xs": 20, "nvfp4": 39}

_QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN35_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+"
                 r"[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_KNOWN_PRE = {_QWEN2_SPLIT: "qwen2", _QWEN35_SPLIT: "qwen35"}

# gguf token types
_TT_NORMAL, _TT_CONTROL, _TT_USER_DEFINED, _TT_UNUSED = 1, 3, 4, 5


# ConvertError is the checkpoint reader's error class, so an error from either reads the same to callers
ConvertError = CheckpointError


# ---------------------------------------------------------------------------------------------- config

def load_config(hf_dir: str) -> dict:
    """config.json with text_config merged to the root and transformers' defaults filled in."""
    path = os.path.join(hf_dir, "config.json")
    try:
        with open(path) as f:
            raw = json.load(f)
    except FileNotFoundError:
        raise ConvertError(f"{hf_dir}: no config.json (convert needs a save_pretrained directory)") from None
    except ValueError as e:
        raise ConvertError(f"{path}: not valid JSON ({e})") from None
    return config_from_dict(raw, path)


def config_from_dict(raw: dict, path: str = "config") -> dict:
    """A config.json dict (text_config merged to the root) with transformers' defaults filled in and the
    derived fields (is_qsa, rope_parameters, gdn_output_gate) added; `path` names it in errors."""
    cfg = dict(raw)
    if isinstance(raw.get("text_config"), dict):
        cfg.update(raw["text_config"])
    archs = raw.get("architectures") or []
    mt = cfg.get("model_type", "")
    if not (mt.startswith("qwen4_exp") or any(a.startswith("Qwen4Exp") for a in archs)):
        raise ConvertError(f"{path}: model_type {mt!r} / architectures {archs} is not a qwen4_exp model")
    defaults = dict(vocab_size=248320, hidden_size=2048, num_hidden_layers=40, num_attention_heads=16,
                    num_key_value_heads=2, hidden_act="silu", max_position_embeddings=32768, rms_norm_eps=1e-6,
                    head_dim=256, linear_conv_kernel_dim=4, linear_key_head_dim=128, linear_value_head_dim=128,
                    linear_num_key_heads=16, linear_num_value_heads=32, moe_intermediate_size=512,
                    shared_expert_intermediate_size=512, num_experts_per_tok=10, num_experts=512,
                    hc_count=4, hc_lowrank=320, ple_layer_ids=[], ple_embed_dim=None, ple_conv_kernel_size=4,
                    ngram_size=3, heads_per_ngram=8, split_ngram_parts=512, output_gate_type=None,
                    tie_word_embeddings=False, attention_bias=False)
    for k, v in defaults.items():
        if cfg.get(k) is None:
            cfg[k] = v
    cfg["ple_layer_ids"] = sorted(set(cfg["ple_layer_ids"] or []))
    if cfg["ple_embed_dim"] is None:
        cfg["ple_embed_dim"] = cfg["hidden_size"]
    n = cfg["num_hidden_layers"]
    if not cfg.get("layer_types"):
        interval = cfg.get("full_attention_interval", 4)
        cfg["layer_types"] = ["linear_attention" if (i + 1) % interval else "indexed_attention" for i in range(n)]
    bad = sorted(set(cfg["layer_types"]) - {"linear_attention", "full_attention", "indexed_attention"})
    if bad or len(cfg["layer_types"]) != n:
        raise ConvertError(f"{path}: layer_types must list {n} entries of linear_attention / full_attention / "
                           f"indexed_attention, got {cfg['layer_types']}")
    # Every attention layer of qwen4exp is QSA, whichever name the config gives it (transformers rewrites
    # "full_attention" to "indexed_attention"; llama.cpp's converter only matched the former).
    cfg["is_qsa"] = [t != "linear_attention" for t in cfg["layer_types"]]
    rp = dict(cfg.get("rope_parameters") or cfg.get("rope_scaling") or {})
    rp.setdefault("rope_theta", cfg.get("rope_theta", 10000.0))
    rp.setdefault("partial_rotary_factor", cfg.get("partial_rotary_factor", 1.0))
    rp.setdefault("rope_type", rp.get("type", "default"))
    cfg["rope_parameters"] = rp
    gate = cfg["output_gate_type"] or cfg["hidden_act"]
    if gate not in ("sigmoid", "silu"):
        raise ConvertError(f"{path}: output_gate_type {gate!r} is not sigmoid or silu")
    cfg["gdn_output_gate"] = gate
    return cfg


# ---------------------------------------------------------------------------------------------- ModelOpt NVFP4

# E2M1 code -> value (bit 3 sign, bits 2-1 exponent, bit 0 mantissa); ggml's NVFP4 table holds the same values
_E2M1 = np.array([0, .5, 1, 1.5, 2, 3, 4, 6, -0., -.5, -1, -1.5, -2, -3, -4, -6], dtype=np.float32)


def _e4m3_table() -> np.ndarray:
    """F8 E4M3 (fn: bias 7, no infinities, 0x7F/0xFF NaN) byte -> float32."""
    b = np.arange(256)
    e, m = (b >> 3) & 15, (b & 7).astype(np.float64)
    v = np.where(e == 0, m / 8 * 2.0 ** -6, (1 + m / 8) * 2.0 ** (e - 7))
    v = np.where(b >> 7, -v, v)
    v[(b & 0x7F) == 0x7F] = np.nan
    return v.astype(np.float32)


_E4M3 = _e4m3_table()
NVFP4_GROUP = 16          # values per ModelOpt block scale
NVFP4_BLOCK = 64          # values per ggml NVFP4 block (four UE4M3 sub-block scales)


@dataclass
class NvSource:
    """One ModelOpt NVFP4 linear weight: X.weight U8 [rows, cols/2] (two E2M1 codes per byte, value 2j in the
    low nibble of byte j), X.weight_scale F8_E4M3 [rows, cols/16], X.weight_scale_2 F32 (one), maybe
    X.input_scale F32 (one). Names are stored names."""
    weight: str
    scale: str
    scale2: str
    input_scale: str | None
    shape: tuple            # logical (rows, cols)


def read_modelopt(hf_dir: str, raw: dict) -> dict | None:
    """The ModelOpt quantization of a checkpoint from config.json's quantization_config and/or
    hf_quant_config.json: {"algo": "NVFP4", "exclude": [module patterns], "source": file}, or None for an
    unquantized checkpoint. Anything but NVFP4 (per checkpoint, or per layer under MIXED_PRECISION) is an
    error, as is a quantization method other than ModelOpt's."""
    cfg_path = os.path.join(hf_dir, "config.json")
    qc = raw.get("quantization_config")
    if qc is None and isinstance(raw.get("text_config"), dict):
        qc = raw["text_config"].get("quantization_config")
    qc = qc if isinstance(qc, dict) else {}
    hq_path = os.path.join(hf_dir, "hf_quant_config.json")
    hq = {}
    if os.path.exists(hq_path):
        try:
            with open(hq_path) as f:
                hq = json.load(f)
        except ValueError as e:
            raise ConvertError(f"{hq_path}: not valid JSON ({e})") from None
    hqq = hq.get("quantization") if isinstance(hq.get("quantization"), dict) else {}
    method = qc.get("quant_method")
    if method is not None and str(method).lower() != "modelopt":
        raise ConvertError(f"{cfg_path}: quantization_config.quant_method {method!r}: this converter reads "
                           f"unquantized checkpoints and ModelOpt NVFP4 ones only (dequantize the checkpoint "
                           f"first, or convert its unquantized original)")
    producer = str((hq.get("producer") or {}).get("name", "modelopt")).lower() if hq else None
    if producer not in (None, "modelopt"):
        raise ConvertError(f"{hq_path}: producer {producer!r}; only ModelOpt checkpoints are understood")
    algo = hqq.get("quant_algo") or qc.get("quant_algo")
    src = hq_path if hqq.get("quant_algo") else cfg_path
    if not algo:
        return None
    if algo == "MIXED_PRECISION":
        layers = hqq.get("quantized_layers") or qc.get("quantized_layers") or {}
        bad = sorted(k for k, v in layers.items() if not (isinstance(v, dict) and v.get("quant_algo") == "NVFP4"))
        if bad or not layers:
            raise ConvertError(f"{src}: quant_algo MIXED_PRECISION with layers that are not NVFP4 "
                               f"({bad[:4]}{' ...' if len(bad) > 4 else ''}): only NVFP4 weights can be converted")
        algo = "NVFP4"
    if algo != "NVFP4":
        raise ConvertError(f"{src}: ModelOpt quant_algo {algo!r} is not supported; the converter reads NVFP4 "
                           f"checkpoints (weights kept NVFP4) and unquantized ones")
    group = hqq.get("group_size") or qc.get("group_size")
    if group is not None and int(group) != NVFP4_GROUP:
        raise ConvertError(f"{src}: NVFP4 group_size {group}; NVFP4 has one block scale per {NVFP4_GROUP} values")
    exclude = hqq.get("exclude_modules") or qc.get("exclude_modules") or qc.get("ignore") or []
    return {"algo": algo, "exclude": list(exclude), "source": src}


def _nv_sources(ck: "Checkpoint", names: dict[str, str], modelopt: dict | None) -> dict[str, NvSource]:
    """canonical X.weight -> NvSource for every ModelOpt NVFP4 weight; checks that each one is complete."""
    out: dict[str, NvSource] = {}
    for canon, stored in names.items():
        if not canon.endswith(".weight_scale"):
            continue
        wc, ws = canon[:-len("_scale")], stored[:-len("_scale")]
        if wc not in names:
            raise ConvertError(f"checkpoint has {stored} but no {ws} it would scale")
        w, sc = ck.entries[ws], ck.entries[stored]
        if w.dtype != "U8" or sc.dtype != "F8_E4M3":
            raise ConvertError(f"{ws} is {w.dtype} with a {sc.dtype} weight_scale: not ModelOpt NVFP4 (U8 codes with "
                               f"F8_E4M3 block scales); other quantizations (FP8, INT4, ...) are not supported")
        if len(w.shape) != 2 or len(sc.shape) != 2 or sc.shape != (w.shape[0], w.shape[1] * 2 // NVFP4_GROUP) \
                or (w.shape[1] * 2) % NVFP4_GROUP:
            raise ConvertError(f"{ws} has shape {w.shape} and {stored} {sc.shape}: expected [rows, cols/2] U8 "
                               f"and [rows, cols/{NVFP4_GROUP}] F8_E4M3 (2-D, one scale per {NVFP4_GROUP} values)")
        s2 = ws + "_scale_2"
        if s2 not in ck.entries:
            raise ConvertError(f"ModelOpt NVFP4 weight {ws} has no {s2} (its per-tensor scale); the checkpoint is "
                               f"incomplete")
        if int(np.prod(ck.entries[s2].shape, dtype=np.int64)) != 1:
            raise ConvertError(f"{s2} has shape {ck.entries[s2].shape}; expected one value (per-tensor scale)")
        inp = ws[:-len("weight")] + "input_scale"
        out[wc] = NvSource(ws, stored, s2, inp if inp in ck.entries else None, (w.shape[0], w.shape[1] * 2))
    if out and modelopt is None:
        first = next(iter(out.values())).weight
        raise ConvertError(f"tensors such as {first} carry ModelOpt NVFP4 scales, but neither config.json's "
                           f"quantization_config nor hf_quant_config.json says quant_algo NVFP4")
    for n, st in names.items():           # packed codes without their block scales cannot be read
        if n.endswith(".weight") and n not in out and ck.entries[st].dtype in _PACKED_DTYPES:
            raise ConvertError(f"{st} is stored as {ck.entries[st].dtype} (packed NVFP4 codes) but the checkpoint "
                               f"has no {st}_scale for it")
    return out


def _nv_scales(ck: "Checkpoint", src: NvSource) -> np.ndarray:
    """The F8_E4M3 block-scale bytes of src, checked: a ModelOpt block scale is >= 0 and not NaN."""
    sc = np.asarray(ck.raw(src.scale))
    if ((sc & 0x80) != 0).any() or ((sc & 0x7F) == 0x7F).any():
        raise ConvertError(f"{src.scale} has negative or NaN block scales; a ModelOpt NVFP4 block scale is >= 0")
    return sc


def _nv_unpack(packed: np.ndarray) -> np.ndarray:
    """[..., cols/2] bytes -> [..., cols] E2M1 codes (value 2j in the low nibble of byte j, as ModelOpt packs)."""
    c = np.empty(packed.shape[:-1] + (packed.shape[-1] * 2,), dtype=np.uint8)
    c[..., 0::2] = packed & 0x0F
    c[..., 1::2] = packed >> 4
    return c


def nv_dequantize(packed: np.ndarray, scales: np.ndarray, scale2: float) -> np.ndarray:
    """ModelOpt's NVFP4 dequantization, in float32: (code x weight_scale) x weight_scale_2. The first product
    is exact (at most 6 significant bits), so each value is rounded once -- as a GGUF NVFP4 value (exact in
    ggml) times its `.scale` is."""
    packed, scales = np.asarray(packed), np.asarray(scales)
    out = np.empty(packed.shape[:-1] + (packed.shape[-1] * 2,), dtype=np.float32)
    step = max(1, (1 << 22) // max(1, out.shape[-1]))         # rows per piece: temporaries stay ~100 MB
    for r in range(0, packed.shape[0], step):
        d = np.repeat(_E4M3[scales[r:r + step]], NVFP4_GROUP, axis=-1)
        np.multiply(_E2M1[_nv_unpack(packed[r:r + step])] * d, np.float32(scale2), out=out[r:r + step])
    return out


def nv_pack_ggml(codes: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """E2M1 codes [rows, cols] and E4M3 block scales [rows, cols/16] -> ggml NVFP4 blocks [rows, cols/64*36]:
    per 64 values four UE4M3 scales (the E4M3 bits; the sign bit is 0 for a valid scale), then 32 bytes where
    byte 8j+i holds value 16j+i in the low nibble and value 16j+8+i in the high nibble."""
    rows, cols = codes.shape
    nb = cols // NVFP4_BLOCK
    c = codes.reshape(rows, nb, 4, 16)
    qs = (c[..., :8] | (c[..., 8:] << 4)).reshape(rows, nb, 32)
    d = scales.reshape(rows, nb, 4)
    return np.concatenate([d, qs], axis=-1).reshape(rows, nb * 36)


# ---------------------------------------------------------------------------------------------- tensor plan

@dataclass
class OutTensor:
    name: str
    shape: tuple                     # numpy order (ggml ne reversed)
    chunks: Callable[[], Iterator[np.ndarray]]   # float32 pieces along axis 0, in order
    force_f32: bool = False
    qtype: str = "F32"               # decided by choose_type
    nbytes: int = 0
    notes: list = field(default_factory=list)
    # ModelOpt NVFP4 sources that can stay NVFP4: {"srcs": [canonical X.weight, one per matrix (expert)],
    # "rows": row index array or None, "cols": column permutation or None}; chunks() then still gives the
    # exactly dequantized values, for when the tensor cannot stay NVFP4
    nv: dict | None = None


def _tiled_perm(n_k: int, n_v: int, width: int) -> np.ndarray:
    """Row permutation grouped -> tiled for n_v V heads of `width` rows over n_k K heads: new position
    (j, k) = (replica j of K head k) takes HF's head k*(n_v/n_k) + j."""
    r = n_v // n_k
    return np.arange(n_v * width).reshape(n_k, r, width).transpose(1, 0, 2).reshape(-1)


class _Plan:
    def __init__(self, ck: Checkpoint, cfg: dict, modelopt: dict | None = None, mtp: bool = True):
        self.ck, self.cfg = ck, cfg
        self.keep_mtp = mtp
        self.n_mtp = 0                    # MTP blocks written (set by build)
        self.names = self._canonical_names()
        self.used: set[str] = set()
        self.nv = _nv_sources(ck, self.names, modelopt)
        canon = {st: n for n, st in self.names.items()}
        for src in self.nv.values():          # the scale tensors belong to their weight
            self.used.update(canon[x] for x in (src.scale, src.scale2, src.input_scale) if x in canon)
        # ModelOpt's KV-cache scales (kv_cache_quant_algo) concern a KV cache type, a run option here
        self.used.update(n for n in self.names if n.endswith((".k_scale", ".v_scale")) and modelopt is not None)
        self.tensors: list[OutTensor] = []
        self.ple: dict | None = None

    def _canonical_names(self) -> dict[str, str]:
        """HF-runtime name -> stored name, with language_model prefixes stripped; vision dropped, and the MTP head
        when it is not kept."""
        out = {}
        for stored in self.ck.entries:
            n = stored
            if (n.startswith("mtp.") and not self.keep_mtp) or ".visual." in n or n.startswith("visual.") or n.startswith("model.visual"):
                continue
            n = n.replace("model.language_model.", "model.").replace("language_model.model.", "model.")
            n = n.replace("language_model.lm_head.", "lm_head.")
            out[n] = stored
        return out

    def has(self, name: str) -> bool:
        return name in self.names

    def get(self, name: str, index=None) -> np.ndarray:
        """float32 values; a ModelOpt NVFP4 weight is dequantized exactly (nv_dequantize)."""
        if name not in self.names:
            raise ConvertError(f"checkpoint is missing tensor {name}")
        self.used.add(name)
        src = self.nv.get(name)
        if src is not None:
            a = nv_dequantize(self.ck.raw(src.weight), _nv_scales(self.ck, src), self.nv_scale2(name))
            return a if index is None else a[index]
        return self.ck.f32(self.names[name], index)

    def nv_scale2(self, name: str) -> float:
        return float(self.ck.f32(self.nv[name].scale2).reshape(-1)[0])

    def nv_spec(self, srcs: list[str], rows=None, cols=None) -> dict | None:
        """The NVFP4 description of an output made of these sources (None unless all are NVFP4)."""
        return {"srcs": list(srcs), "rows": rows, "cols": cols} if all(s in self.nv for s in srcs) else None

    def shape(self, name: str) -> tuple:
        if name not in self.names:
            raise ConvertError(f"checkpoint is missing tensor {name}")
        if name in self.nv:
            return self.nv[name].shape
        return self.ck.shape(self.names[name])

    def add(self, name: str, shape: tuple, fn: Callable[[], np.ndarray], force_f32: bool = False,
            nv: dict | None = None) -> None:
        self.tensors.append(OutTensor(name, tuple(shape), lambda: iter([fn()]), force_f32, nv=nv))

    def add_chunked(self, name: str, shape: tuple, gen: Callable[[], Iterator[np.ndarray]], force_f32=False,
                    nv: dict | None = None):
        self.tensors.append(OutTensor(name, tuple(shape), gen, force_f32, nv=nv))

    def copy(self, gguf_name: str, hf_name: str, plus_one: bool = False, squeeze: bool = False,
             force_f32: bool = False) -> None:
        shape = self.shape(hf_name)
        self.used.add(hf_name)
        if squeeze:
            shape = tuple(d for d in shape if d != 1) if len(shape) == 3 else shape

        def fn(h=hf_name, p=plus_one, s=squeeze, shp=shape):
            a = self.get(h)
            a = a.reshape(shp) if s else a
            return a + np.float32(1.0) if p else a
        self.add(gguf_name, shape, fn, force_f32, nv=None if plus_one or squeeze else self.nv_spec([hf_name]))

    # -- build ---------------------------------------------------------------------------------------------

    def build(self) -> None:
        c = self.cfg
        self.copy("token_embd.weight", "model.embed_tokens.weight")
        if self.shape("model.embed_tokens.weight") != (c["vocab_size"], c["hidden_size"]):
            raise ConvertError(f"model.embed_tokens.weight has shape {self.shape('model.embed_tokens.weight')}, "
                               f"config says vocab {c['vocab_size']} x hidden {c['hidden_size']}")
        self._hc("output_hc", "model.hyper_connection_mixer", inject=False)
        for i in range(c["num_hidden_layers"]):
            self._layer(i)
        if any(n.startswith("mtp.") for n in self.names):
            self._mtp(c["num_hidden_layers"])
        if self.has("lm_head.weight"):
            self.copy("output.weight", "lm_head.weight")
        elif not c.get("tie_word_embeddings"):
            raise ConvertError("checkpoint has no lm_head.weight and tie_word_embeddings is false")
        leftovers = sorted(n for n in self.names if n not in self.used)
        if leftovers:
            more = f" ... ({len(leftovers)} in all)" if len(leftovers) > 8 else ""
            raise ConvertError(f"checkpoint tensors this converter does not know: {leftovers[:8]}{more}")

    def _hc(self, g: str, p: str, inject: bool = True) -> None:
        self.copy(f"{g}_norm.weight", f"{p}.hc_norm.weight", plus_one=True)
        self.copy(f"{g}_down.weight", f"{p}.input_mix_weight_down.weight")
        self.copy(f"{g}_up.weight", f"{p}.input_mix_weight_up.weight")
        if inject:
            self.copy(f"{g}_inject.weight", f"{p}.block_inject_weight.weight")

    def _layer(self, i: int) -> None:
        c, p, b = self.cfg, f"model.layers.{i}", f"blk.{i}"
        if i + 1 in c["ple_layer_ids"]:
            self._ple(i)
        self._hc(f"{b}.hc_attn", f"{p}.attn_hyper_connection")
        self._hc(f"{b}.hc_ffn", f"{p}.mlp_hyper_connection")
        if c["is_qsa"][i]:
            self._qsa(p, b)
        else:
            self._gdn(p, b)
        self._moe(p, b)

    def _mtp(self, L: int) -> None:
        """The MTP head as block blk.{L} (module docstring; spec/qwen4exp-mtp.md §4)."""
        c = self.cfg
        layers = sorted({int(m.group(1)) for n in self.names if (m := re.match(r"mtp\.layers\.(\d+)\.", n))})
        n_cfg = c.get("mtp_num_hidden_layers", c.get("num_nextn_predict_layers"))
        if layers != [0] or (n_cfg is not None and int(n_cfg) != 1):
            raise ConvertError(f"the checkpoint's MTP head has layers {layers} (config: {n_cfg}); Strata runs one MTP "
                               f"layer (mtp.layers.0.*) -- convert with --no-mtp to drop the head")
        e, hc = c["hidden_size"], c["hc_count"]
        p, b = "mtp.layers.0", f"blk.{L}"
        self._hc(f"{b}.hc_attn", f"{p}.attn_hyper_connection")
        self._hc(f"{b}.hc_ffn", f"{p}.mlp_hyper_connection")
        self._qsa(p, b)             # always QSA (vLLM: qwen_sparse_attention; SGLang: full_attention)
        self._moe(p, b)
        self.copy(f"{b}.nextn.enorm.weight", "mtp.pre_fc_norm_embedding.weight", plus_one=True)
        self.copy(f"{b}.nextn.hnorm.weight", "mtp.pre_fc_norm_hidden.weight", plus_one=True)
        fe, fh = "mtp.fc_embedding.weight", "mtp.fc_hidden.weight"
        for n, want in ((fe, (e, e)), (fh, (e, e)), ("mtp.pre_fc_norm_embedding.weight", (e,)),
                        ("mtp.pre_fc_norm_hidden.weight", (hc * e,)),
                        ("mtp.hyper_connection_mixer.hc_norm.weight", (hc * e,))):
            if self.shape(n) != want:
                raise ConvertError(f"{n} has shape {self.shape(n)}, expected {want} from config.json")
        self.used.update([fe, fh])
        # one {2E, E} matrix: [fc_embedding | fc_hidden] along the input axis (spec §2.2 step 3)
        self.add(f"{b}.nextn.eh_proj.weight", (e, 2 * e),
                 lambda: np.concatenate([self.get(fe), self.get(fh)], axis=1))
        self._hc(f"{b}.nextn.hc_head", "mtp.hyper_connection_mixer", inject=False)
        # a mixer inject weight (if any) is discarded, as vLLM and the trunk loader do; a dedicated head copy
        # (mtp.shared_head.head) is the trunk's lm_head when mtp_use_dedicated_embeddings is false
        self.used.update(n for n in self.names if n in ("mtp.hyper_connection_mixer.block_inject_weight.weight",
                                                           "mtp.shared_head.head.weight"))
        self.n_mtp = 1

    def _qsa(self, p: str, b: str) -> None:
        c = self.cfg
        a = f"{p}.self_attn"
        if c.get("attention_bias"):
            raise ConvertError("attention_bias=True: llama.cpp's qwen4exp has no attention biases")
        self.copy(f"{b}.attn_q.weight", f"{a}.q_proj.weight")
        self.copy(f"{b}.attn_k.weight", f"{a}.k_proj.weight")
        self.copy(f"{b}.attn_v.weight", f"{a}.v_proj.weight")
        self.copy(f"{b}.attn_output.weight", f"{a}.o_proj.weight")
        self.copy(f"{b}.attn_q_norm.weight", f"{a}.q_norm.weight", plus_one=True)
        self.copy(f"{b}.attn_k_norm.weight", f"{a}.k_norm.weight", plus_one=True)
        qk = f"{a}.indexer.index_qk_proj.weight"
        n_q = c["indexer_n_heads"] * c["indexer_head_dim"]
        shp = self.shape(qk)
        if shp[0] != n_q + c["indexer_head_dim"]:
            raise ConvertError(f"{qk} has {shp[0]} rows, expected (indexer_n_heads+1)*indexer_head_dim = "
                               f"{n_q + c['indexer_head_dim']}")
        self.used.add(qk)
        self.add(f"{b}.indexer.q_proj.weight", (n_q, shp[1]), lambda: self.get(qk)[:n_q],
                 nv=self.nv_spec([qk], rows=np.arange(n_q)))
        self.add(f"{b}.indexer.k_proj.weight", (shp[0] - n_q, shp[1]), lambda: self.get(qk)[n_q:],
                 nv=self.nv_spec([qk], rows=np.arange(n_q, shp[0])))
        self.copy(f"{b}.indexer.q_norm.weight", f"{a}.indexer.q_layernorm.weight", plus_one=True)
        self.copy(f"{b}.indexer.k_norm.weight", f"{a}.indexer.k_layernorm.weight", plus_one=True)

    def _gdn(self, p: str, b: str) -> None:
        c = self.cfg
        a = f"{p}.linear_attn"
        nk, nv = c["linear_num_key_heads"], c["linear_num_value_heads"]
        dk, dv = c["linear_key_head_dim"], c["linear_value_head_dim"]
        if nv % nk:
            raise ConvertError(f"linear_num_value_heads {nv} is not a multiple of linear_num_key_heads {nk}")
        kd = 2 * nk * dk
        e = c["hidden_size"]
        expect = {"in_proj_qkv.weight": (kd + nv * dv, e), "in_proj_z.weight": (nv * dv, e),
                  "in_proj_a.weight": (nv, e), "in_proj_b.weight": (nv, e), "dt_bias": (nv,), "A_log": (nv,),
                  "conv1d.weight": (kd + nv * dv, 1, c["linear_conv_kernel_dim"]), "norm.weight": (dv,),
                  "out_proj.weight": (e, nv * dv)}
        for k, shp in expect.items():
            if self.shape(f"{a}.{k}") != shp:
                raise ConvertError(f"{a}.{k} has shape {self.shape(f'{a}.{k}')}, expected {shp} from config.json")
            self.used.add(f"{a}.{k}")
        pv = _tiled_perm(nk, nv, dv)       # V rows / channels
        ph = _tiled_perm(nk, nv, 1)        # per-V-head scalars and rows

        def qkv():
            w = self.get(f"{a}.in_proj_qkv.weight")
            return np.concatenate([w[:kd], w[kd:][pv]])
        self.add(f"{b}.attn_qkv.weight", self.shape(f"{a}.in_proj_qkv.weight"), qkv,
                 nv=self.nv_spec([f"{a}.in_proj_qkv.weight"], rows=np.concatenate([np.arange(kd), kd + pv])))
        self.add(f"{b}.attn_gate.weight", self.shape(f"{a}.in_proj_z.weight"),
                 lambda: self.get(f"{a}.in_proj_z.weight")[pv], nv=self.nv_spec([f"{a}.in_proj_z.weight"], rows=pv))
        conv_shape = self.shape(f"{a}.conv1d.weight")

        def conv():
            w = self.get(f"{a}.conv1d.weight").reshape(conv_shape[0], conv_shape[-1])
            return np.concatenate([w[:kd], w[kd:][pv]])
        self.add(f"{b}.ssm_conv1d.weight", (conv_shape[0], conv_shape[-1]), conv, force_f32=True)
        self.add(f"{b}.ssm_dt.bias", (nv,), lambda: self.get(f"{a}.dt_bias")[ph])
        self.add(f"{b}.ssm_a", (nv,), lambda: -np.exp(self.get(f"{a}.A_log").astype(np.float32))[ph])
        self.add(f"{b}.ssm_beta.weight", self.shape(f"{a}.in_proj_b.weight"),
                 lambda: self.get(f"{a}.in_proj_b.weight")[ph], nv=self.nv_spec([f"{a}.in_proj_b.weight"], rows=ph))
        self.add(f"{b}.ssm_alpha.weight", self.shape(f"{a}.in_proj_a.weight"),
                 lambda: self.get(f"{a}.in_proj_a.weight")[ph], nv=self.nv_spec([f"{a}.in_proj_a.weight"], rows=ph))
        self.copy(f"{b}.ssm_norm.weight", f"{a}.norm.weight")      # plain gamma: no +1
        # a column permutation keeps NVFP4 only where it moves whole 16-value scale groups (dv % 16 == 0)
        self.add(f"{b}.ssm_out.weight", self.shape(f"{a}.out_proj.weight"),
                 lambda: self.get(f"{a}.out_proj.weight")[:, pv], nv=self.nv_spec([f"{a}.out_proj.weight"], cols=pv))

    def _moe(self, p: str, b: str) -> None:
        c = self.cfg
        m = f"{p}.mlp"
        ne, fe, e = c["num_experts"], c["moe_intermediate_size"], c["hidden_size"]
        self.copy(f"{b}.ffn_gate_inp.weight", f"{m}.gate.weight", force_f32=True)
        if self.has(f"{m}.experts.gate_up_proj"):
            gu, dn = f"{m}.experts.gate_up_proj", f"{m}.experts.down_proj"
            if self.shape(gu) != (ne, 2 * fe, e) or self.shape(dn) != (ne, e, fe):
                raise ConvertError(f"{gu} / {dn} have shapes {self.shape(gu)} / {self.shape(dn)}, expected "
                                   f"{(ne, 2 * fe, e)} / {(ne, e, fe)}")
            self.used.update([gu, dn])
            self.add_chunked(f"{b}.ffn_gate_exps.weight", (ne, fe, e),
                             lambda: (self.get(gu, (x, slice(0, fe))) for x in range(ne)))
            self.add_chunked(f"{b}.ffn_up_exps.weight", (ne, fe, e),
                             lambda: (self.get(gu, (x, slice(fe, None))) for x in range(ne)))
            self.add_chunked(f"{b}.ffn_down_exps.weight", (ne, e, fe), lambda: (self.get(dn, x) for x in range(ne)))
        else:
            for proj, g, shp in (("gate_proj", "ffn_gate_exps", (fe, e)), ("up_proj", "ffn_up_exps", (fe, e)),
                                 ("down_proj", "ffn_down_exps", (e, fe))):
                names = [f"{m}.experts.{x}.{proj}.weight" for x in range(ne)]
                for n in names:
                    if self.shape(n) != shp:
                        raise ConvertError(f"{n} has shape {self.shape(n)}, expected {shp}")
                self.used.update(names)
                self.add_chunked(f"{b}.{g}.weight", (ne,) + shp,
                                 lambda names=names: (self.get(n)[None] for n in names), nv=self.nv_spec(names))
        self.copy(f"{b}.ffn_gate_inp_shexp.weight", f"{m}.shared_expert_gate.weight", force_f32=True)
        self.copy(f"{b}.ffn_gate_shexp.weight", f"{m}.shared_expert.gate_proj.weight")
        self.copy(f"{b}.ffn_up_shexp.weight", f"{m}.shared_expert.up_proj.weight")
        self.copy(f"{b}.ffn_down_shexp.weight", f"{m}.shared_expert.down_proj.weight")

    def _ple(self, i: int) -> None:
        c = self.cfg
        p, b = f"model.layers.{i}.ple", f"blk.{i}"
        e = c["hidden_size"]
        if c["is_qsa"][i]:
            raise ConvertError(f"ple_layer_ids puts PLE on layer {i + 1} (1-based), an attention layer; "
                               f"qwen4exp allows PLE only on linear_attention layers")
        if c["ple_embed_dim"] != e:
            raise ConvertError(f"ple_embed_dim {c['ple_embed_dim']} != hidden_size {e}: llama.cpp's qwen4exp "
                               f"format needs them equal")
        self.copy(f"{b}.ple_key.weight", f"{p}.key_proj.weight")
        self.copy(f"{b}.ple_value.weight", f"{p}.value_proj.weight")
        self.copy(f"{b}.ple_norm_key.weight", f"{p}.norm_key.weight", plus_one=True)
        self.copy(f"{b}.ple_norm_query.weight", f"{p}.norm_query.weight", plus_one=True)
        self.copy(f"{b}.ple_norm_conv.weight", f"{p}.norm_conv.weight", plus_one=True)
        self.copy(f"{b}.ple_conv1d.weight", f"{p}.conv1d.weight", squeeze=True)
        emb = f"{p}.ple_embedding"
        pat = re.compile(re.escape(emb) + r"\.ngram_embedding\.shard_(\d+)\.weight$")
        shards = sorted((int(m.group(1)), n) for n in self.names if (m := pat.match(n)))
        if self.has(f"{emb}.ngram_embedding.weight"):
            shards = [(0, f"{emb}.ngram_embedding.weight")]
        elif len(shards) != c["split_ngram_parts"] or [k for k, _ in shards] != list(range(len(shards))):
            raise ConvertError(f"layer {i}: found PLE shards {[k for k, _ in shards][:8]}... ({len(shards)} of "
                               f"them); expected shard_0..shard_{c['split_ngram_parts'] - 1} (split_ngram_parts)")
        names = [n for _, n in shards]
        widths = {self.shape(n)[1] for n in names}
        if len(widths) != 1:
            raise ConvertError(f"layer {i}: PLE shards have different row widths {sorted(widths)}")
        row_dim = widths.pop()
        rows = sum(self.shape(n)[0] for n in names)
        self.used.update(names)
        self.add_chunked("per_layer_token_embd.weight", (rows, row_dim), lambda: (self.get(n) for n in names),
                         nv=self.nv_spec(names) if any(n in self.nv for n in names) else None)
        consts = {}
        for key in ("layer_multipliers", "ngram_heads_offsets", "ngram_heads_vocab_sizes"):
            n = f"{emb}.{key}"
            if not self.has(n):
                raise ConvertError(f"checkpoint is missing the PLE buffer {n}")
            self.used.add(n)
            consts[key] = self.ck.ints(self.names[n])
        heads = (c["ngram_size"] - 1) * c["heads_per_ngram"]
        if row_dim * heads != e:
            raise ConvertError(f"PLE row width {row_dim} x {heads} heads != hidden_size {e}")
        if len(consts["layer_multipliers"]) < c["ngram_size"] or len(consts["ngram_heads_offsets"]) < heads:
            raise ConvertError(f"PLE buffers too short for ngram_size {c['ngram_size']} and {heads} heads")
        last = max(o + s for o, s in zip(consts["ngram_heads_offsets"], consts["ngram_heads_vocab_sizes"]))
        if last > rows:
            raise ConvertError(f"PLE table has {rows} rows but the hash heads reach row {last}")
        self.ple = dict(layer=i, row_dim=row_dim, **consts)


# ---------------------------------------------------------------------------------------------- types

def choose_type(t: OutTensor, outtype: str) -> str:
    n_dims = len(t.shape)
    if n_dims <= 1 or t.name.endswith("_norm.weight") or t.force_f32 or not t.name.endswith(".weight"):
        return "F32"
    want = {"f32": "F32", "f16": "F16", "bf16": "BF16", "q8_0": "Q8_0"}[outtype]
    if want == "Q8_0" and t.shape[-1] % 32:
        return "F16"          # llama.cpp's converter falls back the same way
    return want


def nv_block_reason(t: OutTensor, scale_kinds: frozenset) -> str | None:
    """Why an output made of ModelOpt NVFP4 sources cannot stay NVFP4 (None: it can). The fallback is the
    exactly dequantized values at the --outtype of float tensors."""
    kind = ".".join(t.name.split(".")[2:]) if t.name.startswith("blk.") else t.name
    if t.force_f32:
        return "kept F32 (router / conv), as in unquantized checkpoints"
    if kind not in scale_kinds:
        return "llama.cpp's qwen4exp loader takes no .scale for this tensor, so weight_scale_2 cannot be kept"
    if t.shape[-1] % NVFP4_BLOCK:
        return f"rows of {t.shape[-1]} values are not whole {NVFP4_BLOCK}-value ggml NVFP4 blocks"
    cols = t.nv["cols"]
    if cols is not None:
        g = np.asarray(cols).reshape(-1, NVFP4_GROUP)
        if not (np.all(g[:, 0] % NVFP4_GROUP == 0) and np.all(g == g[:, :1] + np.arange(NVFP4_GROUP))):
            return (f"its column permutation splits {NVFP4_GROUP}-value scale groups (V head width not a multiple "
                    f"of {NVFP4_GROUP})")
    return None


def _nv_chunks(plan: "_Plan", t: OutTensor) -> Callable[[], Iterator[np.ndarray]]:
    """ggml NVFP4 bytes of t, one source matrix (expert) at a time: codes and block scales move together
    (rows with their scales; a column permutation of whole 16-value groups moves the groups' scales)."""
    rows, cols = t.nv["rows"], t.nv["cols"]

    def gen():
        for name in t.nv["srcs"]:
            src = plan.nv[name]
            codes = _nv_unpack(np.asarray(plan.ck.raw(src.weight)))
            sc = _nv_scales(plan.ck, src)
            if rows is not None:
                codes, sc = codes[rows], sc[rows]
            if cols is not None:
                codes, sc = codes[:, cols], sc[:, np.asarray(cols)[::NVFP4_GROUP] // NVFP4_GROUP]
            yield nv_pack_ggml(codes, sc)
    return gen


def _nv_outputs(plan: "_Plan", t: OutTensor, log) -> list[OutTensor]:
    """t as NVFP4 plus its `.scale` ({1}, or {n_expert} for stacked experts; omitted when every value is 1) and
    `.input_scale` (likewise; llama.cpp loads it but does not compute with it), as llama.cpp's converter
    writes them; or t unchanged (dequantized) with the reason logged."""
    from .quantize import SCALE_KINDS

    why = nv_block_reason(t, SCALE_KINDS)
    if why is not None:
        t.notes.append(f"NVFP4 source dequantized: {why}")
        if log:
            log(f"{t.name}: ModelOpt NVFP4 -> dequantized ({why})")
        return [t]
    t.qtype, t.chunks = "NVFP4", _nv_chunks(plan, t)
    out = [t]
    stacked = len(t.shape) == 3
    base = t.name[:-len(".weight")]
    s2 = np.array([plan.nv_scale2(n) for n in t.nv["srcs"]], dtype=np.float32)
    extra = [(".scale", s2)]
    inp = [plan.nv[n].input_scale for n in t.nv["srcs"]]
    if all(x is not None for x in inp):
        extra.append((".input_scale", np.array([plan.ck.f32(x).reshape(-1)[0] for x in inp], dtype=np.float32)))
    for suffix, v in extra:
        if np.all(v == 1.0):
            continue
        v = v if stacked else v[:1]
        out.append(OutTensor(base + suffix, v.shape, lambda v=v: iter([v]), force_f32=True))
    return out


def _encode(a: np.ndarray, qtype: str) -> np.ndarray:
    if qtype == "NVFP4":          # already ggml blocks
        return np.ascontiguousarray(a, dtype=np.uint8)
    a = np.ascontiguousarray(a, dtype=np.float32)
    if qtype == "F32":
        return a
    if qtype == "F16":
        return a.astype(np.float16)
    if qtype == "BF16":
        # round to nearest even, NaN kept quiet (as gguf.quants does)
        u = a.view(np.uint32).astype(np.uint64)
        nan = (u & 0x7FFFFFFF) > 0x7F800000
        r = ((u + (0x7FFF + ((u >> 16) & 1))) >> 16).astype(np.uint16)
        return np.where(nan, ((u >> 16) | 64).astype(np.uint16), r)
    if qtype == "Q8_0":
        from . import quant
        rows = a.reshape(-1, a.shape[-1])
        return np.frombuffer(quant.quantize("Q8_0", rows), dtype=np.uint8)
    raise ValueError(qtype)


def _nbytes(shape: tuple, qtype: str) -> int:
    n = int(np.prod(shape, dtype=np.int64))
    if qtype == "F32":
        return 4 * n
    if qtype in ("F16", "BF16"):
        return 2 * n
    if qtype == "Q8_0":
        return n // 32 * 34
    if qtype == "NVFP4":
        return n // NVFP4_BLOCK * 36
    raise ValueError(qtype)


class _Chunked:
    """Duck-types the part of np.ndarray that GGUFWriter.write_tensor_data uses (nbytes, tofile), writing
    the tensor one encoded piece at a time."""

    def __init__(self, t: OutTensor):
        self.t, self.nbytes = t, t.nbytes

    def tofile(self, fout) -> None:
        written = 0
        for piece in self.t.chunks():
            enc = _encode(piece, self.t.qtype)
            enc.tofile(fout)
            written += enc.nbytes
        if written != self.nbytes:
            raise ConvertError(f"{self.t.name}: wrote {written} bytes, planned {self.nbytes}")


# ---------------------------------------------------------------------------------------------- tokenizer

def read_tokenizer(hf_dir: str, n_vocab: int, pre: str | None) -> dict:
    """tokenizer.ggml.* values from tokenizer.json / tokenizer_config.json (gpt2-style byte-level BPE)."""
    tj = os.path.join(hf_dir, "tokenizer.json")
    try:
        with open(tj, encoding="utf-8") as f:
            tok = json.load(f)
    except FileNotFoundError:
        raise ConvertError(f"{hf_dir}: no tokenizer.json; the GGUF needs the tokenizer (copy the model's "
                           f"tokenizer files into the directory)") from None
    model = tok.get("model") or {}
    if model.get("type") != "BPE":
        raise ConvertError(f"{tj}: tokenizer model {model.get('type')!r} is not BPE")
    tcfg = {}
    tc_path = os.path.join(hf_dir, "tokenizer_config.json")
    if os.path.exists(tc_path):
        with open(tc_path, encoding="utf-8") as f:
            tcfg = json.load(f)
    vocab: dict[int, str] = {i: s for s, i in model["vocab"].items()}
    types = {i: _TT_NORMAL for i in vocab}
    for at in tok.get("added_tokens", []):
        vocab[at["id"]] = at["content"]
        types[at["id"]] = _TT_CONTROL if at.get("special") else _TT_USER_DEFINED
    too_big = [i for i in vocab if i >= n_vocab]
    if too_big:
        raise ConvertError(f"{tj}: token ids up to {max(too_big)} but the model's vocab_size is {n_vocab}")
    tokens = [vocab.get(i, f"[PAD{i}]") for i in range(n_vocab)]
    toktypes = [types.get(i, _TT_UNUSED) for i in range(n_vocab)]
    merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges", [])]

    if pre is None:
        pre = _detect_pre(tok, tj)
    norm = tok.get("normalizer")
    norm_name = "none"
    if norm:
        kinds = [n.get("type") for n in norm.get("normalizers", [norm])]
        norm_name = ",".join(k for k in kinds if k) or "none"

    ids = {s: i for i, s in vocab.items()}

    def special(key):
        v = tcfg.get(key)
        if isinstance(v, dict):
            v = v.get("content")
        if v is None:
            return None
        if v not in ids:
            raise ConvertError(f"{tc_path}: {key} {v!r} is not in the vocabulary")
        return ids[v]

    chat = tcfg.get("chat_template")
    jinja = os.path.join(hf_dir, "chat_template.jinja")
    if chat is None and os.path.exists(jinja):
        with open(jinja, encoding="utf-8") as f:
            chat = f.read()
    if isinstance(chat, list):     # named templates: keep the default one
        chat = next((t["template"] for t in chat if t.get("name") == "default"), chat[0]["template"])
    return dict(tokens=tokens, toktypes=toktypes, merges=merges, pre=pre, normalizer=norm_name,
                bos=special("bos_token"), eos=special("eos_token"), pad=special("pad_token"),
                add_bos=bool(tcfg.get("add_bos_token", False)), chat_template=chat)


def _detect_pre(tok: dict, path: str) -> str:
    pt = tok.get("pre_tokenizer") or {}
    for p in pt.get("pretokenizers", [pt]):
        if p.get("type") == "Split":
            pat = p.get("pattern", {})
            regex = pat.get("Regex") if isinstance(pat, dict) else None
            if regex in _KNOWN_PRE:
                return _KNOWN_PRE[regex]
            raise ConvertError(f"{path}: unknown pre-tokenizer split {regex!r}; pass --tokenizer-pre NAME "
                               f"(a llama.cpp pre-tokenizer name such as qwen2 or qwen35)")
    raise ConvertError(f"{path}: no Split pre-tokenizer found; pass --tokenizer-pre NAME")


# ---------------------------------------------------------------------------------------------- metadata

def _metadata(w, cfg: dict, plan: _Plan, tk: dict, outtype: str, name: str) -> None:
    from gguf import GGUFValueType as VT

    a = ARCH
    n = cfg["num_hidden_layers"]
    rp = cfg["rope_parameters"]
    if rp.get("rope_type", "default") not in ("default", "mrope"):
        raise ConvertError(f"rope_type {rp.get('rope_type')!r} is not supported by this converter (only the "
                           f"default rope, as in the released model)")
    hd = cfg["head_dim"]
    nk, nv = cfg["linear_num_key_heads"], cfg["linear_num_value_heads"]
    dk, dv = cfg["linear_key_head_dim"], cfg["linear_value_head_dim"]
    if dk != dv:
        raise ConvertError(f"linear_key_head_dim {dk} != linear_value_head_dim {dv}: llama.cpp's qwen4exp needs "
                           f"them equal")
    if cfg.get("indexer_n_heads") is None and any(cfg["is_qsa"]):
        raise ConvertError("config has attention layers but no indexer_* fields (QSA needs them)")
    sections = list(rp.get("mrope_section") or [11, 11, 10])
    sections = (sections + [0, 0, 0, 0])[:4]
    qsa = [i for i in range(n) if cfg["is_qsa"][i]]
    interval = qsa[0] + 1 if qsa else 4

    w.add_string("general.name", name)
    w.add_uint32("general.file_type", _FILE_TYPE[outtype])
    w.add_uint32("general.quantization_version", 2)
    w.add_uint32(f"{a}.context_length", cfg["max_position_embeddings"])
    w.add_uint32(f"{a}.embedding_length", cfg["hidden_size"])
    w.add_uint32(f"{a}.block_count", n + plan.n_mtp)
    if plan.n_mtp:
        w.add_uint32(f"{a}.nextn_predict_layers", plan.n_mtp)
    w.add_uint32(f"{a}.attention.head_count", cfg["num_attention_heads"])
    w.add_uint32(f"{a}.attention.head_count_kv", cfg["num_key_value_heads"])
    w.add_uint32(f"{a}.attention.key_length", hd)
    w.add_uint32(f"{a}.attention.value_length", hd)
    w.add_float32(f"{a}.attention.layer_norm_rms_epsilon", cfg["rms_norm_eps"])
    w.add_float32(f"{a}.rope.freq_base", float(rp["rope_theta"]))
    w.add_uint32(f"{a}.rope.dimension_count", int(hd * rp["partial_rotary_factor"]))
    w.add_key_value(f"{a}.rope.dimension_sections", sections, VT.ARRAY, sub_type=VT.INT32)
    w.add_uint32(f"{a}.expert_count", cfg["num_experts"])
    w.add_uint32(f"{a}.expert_used_count", cfg["num_experts_per_tok"])
    w.add_uint32(f"{a}.expert_feed_forward_length", cfg["moe_intermediate_size"])
    w.add_uint32(f"{a}.expert_shared_feed_forward_length", cfg["shared_expert_intermediate_size"])
    w.add_uint32(f"{a}.ssm.conv_kernel", cfg["linear_conv_kernel_dim"])
    w.add_uint32(f"{a}.ssm.state_size", dk)
    w.add_uint32(f"{a}.ssm.group_count", nk)
    w.add_uint32(f"{a}.ssm.time_step_rank", nv)
    w.add_uint32(f"{a}.ssm.inner_size", nv * dv)
    # the MTP block (blk.{n}) is attention
    w.add_key_value(f"{a}.attention.recurrent_layers", [not q for q in cfg["is_qsa"]] + [False] * plan.n_mtp,
                    VT.ARRAY, sub_type=VT.BOOL)
    w.add_uint32(f"{a}.full_attention_interval", interval)
    w.add_uint32(f"{a}.hyper_connection.count", cfg["hc_count"])
    w.add_uint32(f"{a}.hyper_connection.low_rank", cfg["hc_lowrank"])
    if qsa:
        w.add_uint32(f"{a}.attention.indexer.head_count", cfg["indexer_n_heads"])
        w.add_uint32(f"{a}.attention.indexer.key_length", cfg["indexer_head_dim"])
        w.add_uint32(f"{a}.attention.indexer.top_k", cfg["indexer_budget"])
        ratio = cfg["indexer_compress_ratio"]
        # the MTP block gets the trunk's QSA ratio (upstream writes 0 = dense, an approximation past the budget)
        w.add_key_value(f"{a}.attention.compress_ratios", [ratio if q else 0 for q in cfg["is_qsa"]] + [ratio] * plan.n_mtp,
                        VT.ARRAY, sub_type=VT.INT32)
    if plan.ple is not None:
        eos = cfg.get("eos_token_id")
        if isinstance(eos, list):
            eos = eos[0] if eos else None     # transformers' n-gram module resets on the FIRST entry
        if eos is None:
            raise ConvertError("config has PLE layers but no eos_token_id (the n-gram hash resets on it)")
        ple = plan.ple
        w.add_key_value(f"{a}.ple.layers", [ple["layer"]], VT.ARRAY, sub_type=VT.INT32)
        w.add_uint32(f"{a}.ple.ngram_size", cfg["ngram_size"])
        w.add_uint32(f"{a}.ple.heads_per_ngram", cfg["heads_per_ngram"])
        w.add_uint32(f"{a}.ple.conv_kernel", cfg["ple_conv_kernel_size"])
        w.add_uint32(f"{a}.ple.eos_token_id", int(eos))
        if cfg.get("image_token_id") is not None:
            w.add_uint32(f"{a}.ple.image_token_id", int(cfg["image_token_id"]))
        w.add_uint32(f"{a}.embedding_length_per_layer_input", ple["row_dim"])
        for key, vals in (("layer_multipliers", ple["layer_multipliers"]),
                          ("head_offsets", ple["ngram_heads_offsets"]),
                          ("head_vocab_sizes", ple["ngram_heads_vocab_sizes"])):
            if any(v < 0 for v in vals):
                raise ConvertError(f"PLE buffer {key} has negative entries")
            w.add_key_value(f"{a}.ple.{key}", vals, VT.ARRAY, sub_type=VT.UINT64)
    # keys of ours (llama.cpp ignores them): what llama.cpp's format does not record
    w.add_string("strata.gdn_output_gate", cfg["gdn_output_gate"])
    w.add_string("strata.tokenizer_normalizer", tk["normalizer"])
    # tokenizer
    w.add_string("tokenizer.ggml.model", "gpt2")
    w.add_string("tokenizer.ggml.pre", tk["pre"])
    w.add_key_value("tokenizer.ggml.tokens", tk["tokens"], VT.ARRAY, sub_type=VT.STRING)
    w.add_key_value("tokenizer.ggml.token_type", tk["toktypes"], VT.ARRAY, sub_type=VT.INT32)
    if tk["merges"]:
        w.add_key_value("tokenizer.ggml.merges", tk["merges"], VT.ARRAY, sub_type=VT.STRING)
    for key, v in (("bos_token_id", tk["bos"]), ("eos_token_id", tk["eos"]), ("padding_token_id", tk["pad"])):
        if v is not None:
            w.add_uint32(f"tokenizer.ggml.{key}", v)
    w.add_bool("tokenizer.ggml.add_bos_token", tk["add_bos"])
    if tk["chat_template"]:
        w.add_string("tokenizer.chat_template", tk["chat_template"])


# ---------------------------------------------------------------------------------------------- entry point

def _ple_external(ck: Checkpoint, plan: "_Plan", hf_dir: str, out_path: str, packed: str) -> tuple[str, int, str]:
    """--ple-external: checks the packed table against the checkpoint, drops the table tensor from the plan and
    returns (table path relative to the GGUF, rows, source identity)."""
    from . import ple

    if plan.ple is None:
        raise ConvertError("--ple-external: the checkpoint has no PLE layer, so there is no table to keep outside")
    try:
        table, meta = ple.read_sidecar(packed)
        _, names = ple.find_shards(ck)
        src = ple.source_identity(ck, names, hf_dir)
    except ple.PleError as e:
        raise ConvertError(f"--ple-external: {e}") from None
    t = next(t for t in plan.tensors if t.name == "per_layer_token_embd.weight")
    rows, dim = t.shape
    if meta["source"] != src or meta["total_rows"] != rows or meta["row_dim"] != dim:
        raise ConvertError(f"--ple-external: {table} was packed from {meta['source']!r} ({meta['total_rows']} rows of "
                           f"{meta['row_dim']}), not from this checkpoint ({src!r}, {rows} rows of {dim}); run "
                           f"`strata pack-ple {hf_dir} -o DIR` first")
    plan.tensors = [x for x in plan.tensors if x is not t]
    rel = os.path.relpath(os.path.abspath(table), os.path.dirname(os.path.abspath(out_path)))
    return rel, int(rows), src


def convert(hf_dir: str, out_path: str, outtype: str = "f32", tokenizer_pre: str | None = None,
            log: Callable[[str], None] | None = None, ple_external: str | None = None, mtp: bool = True) -> dict:
    """Convert the checkpoint in hf_dir to out_path. Returns {"tensors", "bytes", "types": {type: bytes},
    "nvfp4_dequantized": {gguf name: why} (ModelOpt NVFP4 sources that could not stay NVFP4)}.
    ple_external: a `strata pack-ple` output (directory or table file) made from this checkpoint: the GGUF
    then holds no per_layer_token_embd.weight and names the packed table in strata.ple_external (a path
    relative to the GGUF), with strata.ple_external.rows / .source to identify it (pyrunner/ple.py).
    mtp: write the checkpoint's MTP head (if it has one) as block blk.{L}; False drops it (--no-mtp)."""
    import gguf

    from .gguf import writing as gguf_writing

    if outtype not in OUTTYPES:
        raise ConvertError(f"--outtype {outtype!r}: choose one of {', '.join(OUTTYPES)}")
    if not os.path.isdir(hf_dir):
        raise ConvertError(f"{hf_dir}: not a directory")
    cfg = load_config(hf_dir)
    with open(os.path.join(hf_dir, "config.json")) as f:
        modelopt = read_modelopt(hf_dir, json.load(f))
    if len(cfg["ple_layer_ids"]) > 1:
        raise ConvertError(f"ple_layer_ids {cfg['ple_layer_ids']}: llama.cpp's qwen4exp format holds one PLE layer")
    ck = Checkpoint(hf_dir)
    plan = _Plan(ck, cfg, modelopt, mtp=mtp)
    plan.build()
    ext = _ple_external(ck, plan, hf_dir, out_path, ple_external) if ple_external is not None else None
    tk = read_tokenizer(hf_dir, cfg["vocab_size"], tokenizer_pre)

    tensors: list[OutTensor] = []
    for t in plan.tensors:
        t.qtype = choose_type(t, outtype)
        tensors.extend(_nv_outputs(plan, t, log) if t.nv is not None else [t])
    plan.tensors = tensors
    for t in plan.tensors:
        t.nbytes = _nbytes(t.shape, t.qtype)
    n_nv = sum(t.qtype == "NVFP4" for t in plan.tensors)

    # GGUFWriter's constructor already added general.architecture; _metadata adds the rest
    with gguf_writing(out_path, ARCH) as w:
        _metadata(w, cfg, plan, tk, "nvfp4" if n_nv else outtype, os.path.basename(os.path.normpath(hf_dir)))
        if ext is not None:
            w.add_string("strata.ple_external", ext[0])
            w.add_uint64("strata.ple_external.rows", ext[1])
            w.add_string("strata.ple_external.source", ext[2])
        for t in plan.tensors:
            raw = getattr(gguf.GGMLQuantizationType, t.qtype)
            w.add_tensor_info(t.name, t.shape, np.dtype(np.float32), t.nbytes, raw_dtype=raw)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_ti_data_to_file()
        types: dict[str, int] = {}
        for k, t in enumerate(plan.tensors):
            w.write_tensor_data(_Chunked(t))
            types[t.qtype] = types.get(t.qtype, 0) + t.nbytes
            if log:
                log(f"[{k + 1:4d}/{len(plan.tensors)}] {t.name:40s} {t.qtype:5s} "
                    f"{{{', '.join(str(d) for d in reversed(t.shape))}}}")
    return {"tensors": len(plan.tensors), "bytes": os.path.getsize(out_path), "types": types,
            "nvfp4_dequantized": {t.name: t.notes[-1] for t in plan.tensors if t.nv is not None and t.qtype != "NVFP4"}}
