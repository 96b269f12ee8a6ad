#!/usr/bin/env python3
"""make_model.py — write a random qwen4exp GGUF from a preset in models/ (deterministic: the same preset,
recipe and seed give the same bytes).

    python tools/make_model.py PRESET -o OUT.gguf [--recipe f32|q8_0|iq2_xs|nvfp4|q4_k_m] [--seed S]
    python tools/make_model.py PRESET --dry-run [--recipe R]      # tensor list, types and size only

PRESET is a name in models/ (tiny, small, bench, ple-full) or a path to such a JSON file: the
hyperparameters in transformers' config.json spelling, plus `n_real_tokens` (size of the generated
byte-level BPE vocabulary; the rest of vocab_size is padding, as in the real model),
`ngram_vocab_size_base` (the PLE hash heads take consecutive primes from here, rows padded to a multiple
of 128 as transformers pads them), optionally `ple_layer_multipliers`, and `direct_blocks`.

The tensor list, names, shapes and metadata are pyrunner.convert's own: the tool hands the converter's plan
a random "checkpoint" with transformers' tensor names, so the two cannot drift apart.

Two ways to fill the tensors:
  * direct_blocks false (tiny, small): float weights at a scale that gives O(1) logits ((1+w) norms
    and the PLE conv randomised around their neutral values, as tools/make_tiny_hf.py does), quantized by
    pyrunner.quant for the recipe's types;
  * direct_blocks true (bench, ple-full): every quantized tensor is written as random *valid blocks*
    (random code bytes, fp16 / UE4M3 scales set so that weights have std ~ 1/sqrt(row width)), streamed
    tensor by tensor, so memory stays small and no float copy of the model exists. Only the small F32
    tensors (norms, routers, convs, per-head scalars) come from floats.

Recipes: f32 keeps every tensor F32; q8_0, q4_k_m, iq2_xs and nvfp4 are `strata quantize`'s
(pyrunner.quantize.plan_types, which documents each mix and its row-width fallbacks, e.g. the 640-wide
ffn_down_exps rows to IQ4_NL under iq2_xs), so a file made here has the types that quantizing the f32 file
would give it.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
import zlib

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
if REPO not in sys.path:
    sys.path.insert(0, REPO)

from pyrunner import convert  # noqa: E402
from pyrunner.gguf import writing as gguf_writing  # noqa: E402

MODELS_DIR = os.path.join(REPO, "models")
RECIPES = ("f32", "q8_0", "iq2_xs", "nvfp4", "q4_k_m")
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
# largest F32 tensor a direct-blocks preset may generate from floats (its matrices must be quantized)
MAX_FLOAT_VALUES = 64 << 20


class MakeModelError(Exception):
    """Bad preset / recipe / arguments; the message says what to do."""


# ---------------------------------------------------------------------------------------------- presets

def preset_names() -> list[str]:
    return sorted(f[:-5] for f in os.listdir(MODELS_DIR) if f.endswith(".json"))


def load_preset(name: str) -> dict:
    path = name if name.endswith(".json") and os.path.exists(name) else os.path.join(MODELS_DIR, name + ".json")
    try:
        with open(path) as f:
            p = json.load(f)
    except FileNotFoundError:
        raise MakeModelError(f"no preset {name!r}: choose one of {', '.join(preset_names())} or give a path to "
                             f"a preset .json") from None
    except ValueError as e:
        raise MakeModelError(f"{path}: not valid JSON ({e})") from None
    p["_name"] = os.path.basename(path)[:-5]
    p["_path"] = path
    for k in ("vocab_size", "n_real_tokens", "hidden_size", "num_hidden_layers"):
        if k not in p:
            raise MakeModelError(f"{path}: missing {k!r}")
    if p["n_real_tokens"] + len(SPECIALS) > p["vocab_size"] or p["n_real_tokens"] < 256:
        raise MakeModelError(f"{path}: n_real_tokens must be >= 256 (the byte tokens) and leave room for "
                             f"{len(SPECIALS)} special tokens within vocab_size {p['vocab_size']}")
    return p


def _is_prime(n: int) -> bool:
    if n < 2:
        return False
    if n % 2 == 0:
        return n == 2
    f = 3
    while f * f <= n:
        if n % f == 0:
            return False
        f += 2
    return True


def ple_constants(p: dict) -> dict:
    """The n-gram hash constants (spec §4) for a preset: head sizes = consecutive primes from
    ngram_vocab_size_base, offsets = their running sum, rows = the sum padded to a multiple of 128,
    multipliers m_j < (2^63 - 1) / vocab_size (so int64 and uint64 hashing agree)."""
    heads = (p["ngram_size"] - 1) * p["heads_per_ngram"]
    sizes, n = [], p["ngram_vocab_size_base"]
    while len(sizes) < heads:
        if _is_prime(n):
            sizes.append(n)
        n += 1
    offsets = [sum(sizes[:k]) for k in range(heads)]
    rows = -(-sum(sizes) // 128) * 128
    limit = (2 ** 63 - 1) // p["vocab_size"]
    mult = p.get("ple_layer_multipliers")
    if mult is None:
        rng = np.random.default_rng(1234)
        mult = [int(x) | 1 for x in rng.integers(limit // 4, limit, p["ngram_size"], dtype=np.int64)]
    if len(mult) < p["ngram_size"] or any(not 0 < m < limit for m in mult):
        raise MakeModelError(f"{p['_path']}: ple_layer_multipliers must give {p['ngram_size']} values in "
                             f"(0, {limit})")
    return dict(multipliers=[int(m) for m in mult], offsets=offsets, sizes=sizes, rows=rows,
                row_dim=p["hidden_size"] // heads)


def hf_config(p: dict) -> dict:
    raw = {k: v for k, v in p.items() if not k.startswith("_") and k not in ("direct_blocks", "n_real_tokens")}
    raw.setdefault("model_type", "qwen4_exp_text")
    raw["eos_token_id"] = p["n_real_tokens"] + SPECIALS.index("<|endoftext|>")  # the PLE reset token
    raw["tie_word_embeddings"] = False
    raw.setdefault("split_ngram_parts", 1)
    try:
        return convert.config_from_dict(raw, p["_path"])
    except convert.ConvertError as e:
        raise MakeModelError(str(e)) from None


def hf_shapes(cfg: dict, ple: dict | None) -> dict[str, tuple]:
    """transformers' tensor names and shapes (PyTorch order) for a config; experts fused."""
    e, hc, r = cfg["hidden_size"], cfg["hc_count"], cfg["hc_lowrank"]
    s: dict[str, tuple] = {"model.embed_tokens.weight": (cfg["vocab_size"], e),
                           "lm_head.weight": (cfg["vocab_size"], e)}

    def hcs(prefix, inject=True):
        s[f"{prefix}.hc_norm.weight"] = (hc * e,)
        s[f"{prefix}.input_mix_weight_down.weight"] = (r, hc * e)
        s[f"{prefix}.input_mix_weight_up.weight"] = (hc * e, r)
        if inject:
            s[f"{prefix}.block_inject_weight.weight"] = (hc, hc * e)
    hcs("model.hyper_connection_mixer", inject=False)
    nk, nv = cfg["linear_num_key_heads"], cfg["linear_num_value_heads"]
    dk, dv = cfg["linear_key_head_dim"], cfg["linear_value_head_dim"]
    h, hkv, hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    ne, fe, fs = cfg["num_experts"], cfg["moe_intermediate_size"], cfg["shared_expert_intermediate_size"]
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}"
        hcs(f"{p}.attn_hyper_connection")
        hcs(f"{p}.mlp_hyper_connection")
        if i + 1 in cfg["ple_layer_ids"]:
            q = f"{p}.ple"
            s[f"{q}.key_proj.weight"] = (hc * e, e)
            s[f"{q}.value_proj.weight"] = (e, e)
            for n in ("norm_key", "norm_query", "norm_conv"):
                s[f"{q}.{n}.weight"] = (hc * e,)
            s[f"{q}.conv1d.weight"] = (hc * e, 1, cfg["ple_conv_kernel_size"])
            s[f"{q}.ple_embedding.ngram_embedding.weight"] = (ple["rows"], ple["row_dim"])
            for n, v in (("layer_multipliers", ple["multipliers"]), ("ngram_heads_offsets", ple["offsets"]),
                         ("ngram_heads_vocab_sizes", ple["sizes"])):
                s[f"{q}.ple_embedding.{n}"] = (len(v),)
        if cfg["is_qsa"][i]:
            a = f"{p}.self_attn"
            s[f"{a}.q_proj.weight"] = (2 * h * hd, e)
            s[f"{a}.k_proj.weight"] = (hkv * hd, e)
            s[f"{a}.v_proj.weight"] = (hkv * hd, e)
            s[f"{a}.o_proj.weight"] = (e, h * hd)
            s[f"{a}.q_norm.weight"] = (hd,)
            s[f"{a}.k_norm.weight"] = (hd,)
            di = cfg["indexer_head_dim"]
            s[f"{a}.indexer.index_qk_proj.weight"] = ((cfg["indexer_n_heads"] + 1) * di, e)
            s[f"{a}.indexer.q_layernorm.weight"] = (di,)
            s[f"{a}.indexer.k_layernorm.weight"] = (di,)
        else:
            a = f"{p}.linear_attn"
            conv = 2 * nk * dk + nv * dv
            s.update({f"{a}.in_proj_qkv.weight": (conv, e), f"{a}.in_proj_z.weight": (nv * dv, e),
                      f"{a}.in_proj_a.weight": (nv, e), f"{a}.in_proj_b.weight": (nv, e),
                      f"{a}.dt_bias": (nv,), f"{a}.A_log": (nv,),
                      f"{a}.conv1d.weight": (conv, 1, cfg["linear_conv_kernel_dim"]),
                      f"{a}.norm.weight": (dv,), f"{a}.out_proj.weight": (e, nv * dv)})
        m = f"{p}.mlp"
        s[f"{m}.gate.weight"] = (ne, e)
        s[f"{m}.experts.gate_up_proj"] = (ne, 2 * fe, e)
        s[f"{m}.experts.down_proj"] = (ne, e, fe)
        s[f"{m}.shared_expert_gate.weight"] = (1, e)
        s[f"{m}.shared_expert.gate_proj.weight"] = (fs, e)
        s[f"{m}.shared_expert.up_proj.weight"] = (fs, e)
        s[f"{m}.shared_expert.down_proj.weight"] = (e, fs)
    return s


def _rng(seed: int, name: str) -> np.random.Generator:
    return np.random.default_rng([seed, zlib.crc32(name.encode())])


def random_float(name: str, shape: tuple, seed: int) -> np.ndarray:
    """Values for one transformers tensor, by its role (as tools/make_tiny_hf.py randomises them)."""
    g = _rng(seed, name)
    if name.endswith("linear_attn.norm.weight"):               # plain gamma
        return (1.0 + 0.2 * g.standard_normal(shape)).astype(np.float32)
    if name.endswith("norm.weight") or "layernorm" in name or ".ple.norm_" in name:
        return (0.3 * g.standard_normal(shape)).astype(np.float32)    # (1+w): w around 0
    if name.endswith("ple.conv1d.weight"):
        return (0.3 * g.standard_normal(shape)).astype(np.float32)
    if name.endswith("A_log"):
        return np.log(g.random(shape) * 8 + 0.5).astype(np.float32)
    if name.endswith("dt_bias") or "ngram_embedding" in name:
        return g.standard_normal(shape, dtype=np.float32)
    fan_in = shape[-1] if len(shape) >= 2 else 1
    return (g.standard_normal(shape, dtype=np.float32) / np.float32(math.sqrt(fan_in)))


class RandomCheckpoint:
    """Duck-types pyrunner.convert.Checkpoint: transformers names and shapes, random values made on demand
    (the last tensor is kept, so the converter's per-expert slices do not regenerate it)."""

    def __init__(self, shapes: dict[str, tuple], ints: dict[str, list[int]], seed: int):
        self.entries = shapes
        self._ints, self.seed = ints, seed
        self._last: tuple[str, np.ndarray] | None = None

    def __contains__(self, name):
        return name in self.entries

    def shape(self, name):
        return self.entries[name]

    def f32(self, name, index=None):
        if self._last is None or self._last[0] != name:
            shape = self.entries[name]
            if math.prod(shape) > MAX_FLOAT_VALUES:
                raise MakeModelError(f"{name} {shape} is too large to generate as floats; use a quantized recipe "
                                     f"(this preset writes quantized blocks directly)")
            self._last = (name, random_float(name, shape, self.seed))
        a = self._last[1]
        return a if index is None else a[index]

    def ints(self, name):
        return list(self._ints[name])


# ---------------------------------------------------------------------------------------------- types

def _block(qtype: str) -> tuple[int, int]:
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
    return GGML_QUANT_SIZES[GGMLQuantizationType[qtype]]


def nbytes(shape: tuple, qtype: str) -> int:
    bs, ts = _block(qtype)
    return math.prod(shape) // bs * ts


def assign_types(tensors: list, recipe: str) -> None:
    """Set .qtype of every planned tensor for a recipe (see the module docstring)."""
    if recipe not in RECIPES:
        raise MakeModelError(f"--recipe {recipe!r}: choose one of {', '.join(RECIPES)}")
    if recipe == "f32":
        for t in tensors:
            t.qtype = convert.choose_type(t, "f32")
        return
    from pyrunner.quantize import plan_types
    types = plan_types([{"name": t.name, "shape": list(reversed(t.shape))} for t in tensors], recipe)
    for t in tensors:
        t.qtype = types[t.name]


# ---------------------------------------------------------------------------------------------- tokenizer

def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character map (printable Latin-1 bytes map to themselves, the other bytes
    to code points from 256 up, in byte order)."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    out, extra = {}, 0
    for b in range(256):
        if b in keep:
            out[b] = chr(b)
        else:
            out[b] = chr(256 + extra)
            extra += 1
    return out


def build_tokenizer(n_vocab: int, n_real: int) -> dict:
    """A BPE-closed byte-level vocabulary: the 256 byte tokens, then n_real - 256 merges of two earlier
    tokens (letter-like pieces, drawn from a fixed generator so that every preset of the same size gets the
    same vocabulary), then the special tokens, then padding. Values for pyrunner.convert._metadata."""
    b2u = _bytes_to_unicode()
    tokens = [b2u[b] for b in range(256)]
    seen = set(tokens)
    letters = [b2u[b] for b in list(range(ord("a"), ord("z") + 1)) + list(range(ord("A"), ord("Z") + 1))]
    space = b2u[ord(" ")]
    merges: list[str] = []
    lefts, rights = list(letters), list(letters)      # rights never start with a space
    for c in letters:                                 # " x" pieces first, as in any English BPE
        if len(tokens) < n_real:
            tokens.append(space + c)
            seen.add(space + c)
            merges.append(f"{space} {c}")
            lefts.append(space + c)
    rng = np.random.default_rng(0x6D6F64)
    while len(tokens) < n_real:
        li = rng.integers(0, len(lefts), 4096)
        ri = rng.integers(0, min(len(rights), 512), 4096)
        for i, j in zip(li, ri):
            a, b = lefts[i], rights[j]
            new = a + b
            if new in seen or len(new) > 24:
                continue
            seen.add(new)
            tokens.append(new)
            merges.append(f"{a} {b}")
            lefts.append(new)
            if not new.startswith(space):
                rights.append(new)
            if len(tokens) >= n_real:
                break
    toktypes = [1] * len(tokens)
    for s in SPECIALS:
        tokens.append(s)
        toktypes.append(3)
    while len(tokens) < n_vocab:
        tokens.append(f"[PAD{len(tokens)}]")
        toktypes.append(5)
    ids = {s: n_real + k for k, s in enumerate(SPECIALS)}
    return dict(tokens=tokens, toktypes=toktypes, merges=merges, pre="qwen2", normalizer="NFC", bos=None,
                eos=ids["<|im_end|>"], pad=ids["<|endoftext|>"], add_bos=False, chat_template=CHAT_TEMPLATE)


# ---------------------------------------------------------------------------------------------- plan

def build_plan(p: dict, seed: int):
    """(cfg, converter plan over a RandomCheckpoint, PLE constants or None)."""
    cfg = hf_config(p)
    if len(cfg["ple_layer_ids"]) > 1:
        raise MakeModelError(f"{p['_path']}: ple_layer_ids {cfg['ple_layer_ids']}: one PLE layer at most")
    ple = ple_constants(p) if cfg["ple_layer_ids"] else None
    shapes = hf_shapes(cfg, ple)
    ints = {}
    if ple:
        q = f"model.layers.{cfg['ple_layer_ids'][0] - 1}.ple.ple_embedding"
        ints = {f"{q}.layer_multipliers": ple["multipliers"], f"{q}.ngram_heads_offsets": ple["offsets"],
                f"{q}.ngram_heads_vocab_sizes": ple["sizes"]}
    ck = RandomCheckpoint(shapes, ints, seed)
    plan = convert._Plan(ck, cfg)
    try:
        plan.build()
    except convert.ConvertError as e:
        raise MakeModelError(f"{p['_path']}: {e}") from None
    return cfg, plan, ple


def plan_model(preset: str | dict, recipe: str = "f32", seed: int = 0) -> dict:
    """Dry run: {"preset", "recipe", "tensors": [{"name", "type", "shape" (ggml ne), "size"}], "bytes"
    (tensor data), "types": {type: bytes}} without generating any weight."""
    p = load_preset(preset) if isinstance(preset, str) else preset
    if recipe not in RECIPES:
        raise MakeModelError(f"--recipe {recipe!r}: choose one of {', '.join(RECIPES)}")
    _, plan, _ = build_plan(p, seed)
    out, types = [], {}
    assign_types(plan.tensors, recipe)
    for t in plan.tensors:
        t.nbytes = nbytes(t.shape, t.qtype)
        out.append({"name": t.name, "type": t.qtype, "shape": list(reversed(t.shape)), "size": t.nbytes})
        types[t.qtype] = types.get(t.qtype, 0) + t.nbytes
    return {"preset": p["_name"], "recipe": recipe, "tensors": out, "bytes": sum(x["size"] for x in out),
            "types": types, "_plan": plan}


# ---------------------------------------------------------------------------------------------- data

# rms of the dequantized codes with every scale field = 1 (roughly), so that d = std / CODE_RMS
CODE_RMS = {"Q8_0": 73.0, "Q5_1": 9.0, "IQ4_NL": 70.0, "IQ2_XS": 50.0, "Q4_K": 300.0, "Q6_K": 1300.0}
# fp16 scale fields per block type (byte offset); the second field of Q4_K (dmin) / Q5_1 (m) is a minimum
F16_FIELDS = {"Q8_0": [0], "Q5_1": [0, 2], "IQ4_NL": [0], "IQ2_XS": [0], "Q4_K": [0, 2], "Q6_K": [208]}
CHUNK_BYTES = 64 << 20


def _ue4m3_table() -> np.ndarray:
    b = np.arange(128)
    e, m = b >> 3, b & 7
    return np.where(e == 0, m / 8 * 2.0 ** -6, (1 + m / 8) * 2.0 ** (e - 7))


def random_blocks(qtype: str, n_blocks: int, std: float, g: np.random.Generator) -> np.ndarray:
    """n_blocks valid blocks of qtype: random code bytes, scales set for weights of about `std`."""
    bs, ts = _block(qtype)
    blocks = np.frombuffer(bytearray(g.bytes(n_blocks * ts)), dtype=np.uint8).reshape(n_blocks, ts)
    if qtype == "NVFP4":
        # four UE4M3 sub-block scales; E2M1 codes have rms ~ 3.3
        table = _ue4m3_table()
        want = np.log2(std / 3.3) + g.uniform(-1, 1, (n_blocks, 4))
        idx = np.clip(np.searchsorted(table[1:127], np.exp2(want)) + 1, 1, 126)
        blocks[:, 0:4] = idx.astype(np.uint8)
        return blocks
    d = (std / CODE_RMS[qtype]) * np.exp2(g.uniform(-1, 1, n_blocks))
    offs = F16_FIELDS[qtype]
    blocks[:, offs[0]:offs[0] + 2] = d.astype(np.float16).view(np.uint8).reshape(n_blocks, 2)
    if len(offs) > 1:      # a minimum (Q5_1 m, Q4_K dmin) centring the codes
        mn = -16.0 * d if qtype == "Q5_1" else d / 8
        blocks[:, offs[1]:offs[1] + 2] = mn.astype(np.float16).view(np.uint8).reshape(n_blocks, 2)
    return blocks


class _TensorData:
    """Duck-types what GGUFWriter.write_tensor_data uses (nbytes, tofile) and writes one tensor in pieces."""

    def __init__(self, t, direct: bool, seed: int):
        self.t, self.nbytes, self.direct, self.seed = t, t.nbytes, direct, seed

    def _pieces(self):
        t = self.t
        if self.direct and t.qtype not in ("F32", "F16"):
            bs, ts = _block(t.qtype)
            total = math.prod(t.shape) // bs
            per = max(1, CHUNK_BYTES // ts)
            g = _rng(self.seed, t.name)
            std = 1.0 / math.sqrt(t.shape[-1])
            if t.name == "per_layer_token_embd.weight":
                std = 1.0
            done = 0
            while done < total:
                n = min(per, total - done)
                yield random_blocks(t.qtype, n, std, g)
                done += n
            return
        for piece in t.chunks():
            yield _encode(piece, t.qtype)

    def tofile(self, fout) -> None:
        written = 0
        for enc in self._pieces():
            enc.tofile(fout)
            written += enc.nbytes
        if written != self.nbytes:
            raise MakeModelError(f"{self.t.name}: wrote {written} bytes, planned {self.nbytes}")


def _encode(a: np.ndarray, qtype: str) -> np.ndarray:
    a = np.ascontiguousarray(a, dtype=np.float32)
    if qtype == "F32":
        return a
    if qtype == "F16":
        return a.astype(np.float16)
    from pyrunner import quant
    rows = a.reshape(-1, a.shape[-1])
    return np.frombuffer(quant.quantize(qtype, rows), dtype=np.uint8)


# ---------------------------------------------------------------------------------------------- entry point

def make_model(preset: str, out_path: str, recipe: str = "f32", seed: int = 0, log=None) -> dict:
    """Write the preset's GGUF to out_path (via a temp name). Returns plan_model's dict (less the plan) plus
    "seconds"."""
    import gguf

    t0 = time.time()
    if not 0 <= seed < 2 ** 32:
        raise MakeModelError(f"--seed {seed}: give an integer from 0 to 2**32 - 1")
    p = load_preset(preset)
    info = plan_model(p, recipe, seed)
    plan = info.pop("_plan")
    cfg = plan.cfg
    direct = bool(p.get("direct_blocks"))
    if direct:
        big = [t for t in plan.tensors if t.qtype in ("F32", "F16") and math.prod(t.shape) > MAX_FLOAT_VALUES]
        if big:
            raise MakeModelError(f"preset {p['_name']} writes quantized blocks directly; recipe {recipe} leaves "
                                 f"{big[0].name} {big[0].qtype} (too large to generate as floats): use a "
                                 f"quantized recipe ({', '.join(r for r in RECIPES if r != 'f32')})")
    d = os.path.dirname(os.path.abspath(out_path))
    if not os.path.isdir(d):
        raise MakeModelError(f"-o {out_path}: directory {d} does not exist")
    free = os.statvfs(d).f_bavail * os.statvfs(d).f_frsize
    if info["bytes"] > free:
        raise MakeModelError(f"-o {out_path}: needs {info['bytes'] / 2**30:.1f} GiB, only {free / 2**30:.1f} GiB "
                             f"free in {d}")
    tk = build_tokenizer(cfg["vocab_size"], p["n_real_tokens"])
    with gguf_writing(out_path, convert.ARCH) as w:
        convert._metadata(w, cfg, plan, tk, recipe, f"strata-{p['_name']}")
        w.add_string("strata.preset", p["_name"])
        w.add_uint32("strata.seed", seed)
        for t in plan.tensors:
            w.add_tensor_info(t.name, t.shape, np.dtype(np.float32), t.nbytes,
                              raw_dtype=getattr(gguf.GGMLQuantizationType, t.qtype))
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_ti_data_to_file()
        for k, t in enumerate(plan.tensors):
            w.write_tensor_data(_TensorData(t, direct, seed))
            if log:
                log(f"[{k + 1:4d}/{len(plan.tensors)}] {t.name:40s} {t.qtype:7s} "
                    f"{{{', '.join(str(x) for x in reversed(t.shape))}}}")
    info["seconds"] = time.time() - t0
    info["file_bytes"] = os.path.getsize(out_path)
    return info


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("preset", help="a preset in models/ or a path to a preset .json")
    ap.add_argument("-o", "--output", help="output GGUF path")
    ap.add_argument("--recipe", default=None, choices=RECIPES,
                    help="type mix (default: f32 for float presets, iq2_xs for direct-block presets)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--dry-run", action="store_true", help="print the planned tensors and size; write nothing")
    ap.add_argument("-q", "--quiet", action="store_true")
    a = ap.parse_args(argv)
    try:
        p = load_preset(a.preset)
        recipe = a.recipe or ("iq2_xs" if p.get("direct_blocks") else "f32")
        if a.dry_run:
            info = plan_model(p, recipe, a.seed)
            info.pop("_plan")
            for t in info["tensors"]:
                print(f"{t['name']:40s} {t['type']:7s} {str(t['shape']):28s} {t['size']:>14,d}")
            print(f"{len(info['tensors'])} tensors, {info['bytes'] / 1e9:.3f} GB ({info['bytes'] / 2**30:.3f} GiB)")
            for k, v in sorted(info["types"].items(), key=lambda kv: -kv[1]):
                print(f"  {k:7s} {v / info['bytes']:6.1%}  {v / 1e9:.3f} GB")
            return 0
        if not a.output:
            ap.error("-o OUT.gguf is required (or --dry-run)")
        info = make_model(a.preset, a.output, recipe, a.seed, log=None if a.quiet else
                          (lambda s: print(s, file=sys.stderr, flush=True)))
        print(f"{a.output}: {info['file_bytes'] / 1e9:.3f} GB, {len(info['tensors'])} tensors, recipe {recipe}, "
              f"seed {a.seed}, {info['seconds']:.1f} s")
        return 0
    except (MakeModelError, convert.ConvertError) as e:
        print(f"make_model: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
