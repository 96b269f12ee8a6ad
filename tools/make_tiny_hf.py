#!/usr/bin/env python3
"""make_tiny_hf.py — build a tiny random Qwen4ExpForCausalLM checkpoint (transformers, torch CPU) plus a
small byte-level BPE tokenizer, for converter and parity tests.

    python tools/make_tiny_hf.py OUT_DIR [--seed S] [--gate sigmoid|silu] [--budget B] [--fused-experts]
                                 [--modelopt-nvfp4] [--expert-width N] [--mtp]

The topology exercises every part of qwen4exp at toy widths: 4 layers (GDN, GDN, GDN, QSA), V heads != K
heads in the GDN, 8 experts + a shared expert, PLE on a GDN layer with small hash tables split into row
shards, and eos_token_id a list whose entries differ (PLE resets on the FIRST one). transformers
zero-initialises every (1+w) norm and the PLE conv (DESIGN §8); they are randomised here, as are all
other weights, at a scale that gives O(1) logits.

--modelopt-nvfp4 stores the checkpoint as NVIDIA ModelOpt exports an NVFP4 model (see modelopt_nvfp4()) and
writes OUT_DIR-dequant next to it: the same model with every quantized weight replaced by its dequantized
float32 values, which transformers can run (it has no ModelOpt NVFP4 loader).

--mtp adds the multi-token-prediction head as the released checkpoint stores it (spec/qwen4exp-mtp.md §1): the
31 top-level `mtp.*` tensors (fused experts), random at the trunk's scale, written into model.safetensors next to
the model's tensors (transformers ignores `mtp.*` when loading), and `mtp_num_hidden_layers: 1` in config.json.

Test-only tool: needs torch==2.13.0, transformers==5.23.0 and tokenizers (pyproject test extras).
"""
from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from hfkit import mark_mtp, train_bpe  # noqa: E402

# The pre-tokenizer split of Qwen2-family tokenizers (llama.cpp's "qwen2" pre-tokenizer).
QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
               r"|\s*[\r\n]+|\s+(?!\S)|\s+")
CORPUS = [
    "The quick brown fox jumps over the lazy dog. ",
    "Strata runs hybrid mixture-of-experts models on one machine; the experts stream from RAM. ",
    "def forward(self, x):\n    return self.proj(x) + x\n",
    "In the beginning there were tokens, and the tokens were merged into words. ",
    "1234567890 + 42 = 1234567932\n",
]
N_MERGED = 300          # bytes + learned merges
VOCAB_SIZE = 320        # config vocab: 303 real tokens, the rest padding rows (as in the real model)


def build_tokenizer(out_dir: str) -> dict[str, int]:
    """Train a byte-level BPE of N_MERGED tokens on CORPUS, append the ChatML specials, save tokenizer.json and
    tokenizer_config.json. Returns the special-token ids."""
    return train_bpe(CORPUS * 20, N_MERGED, QWEN2_SPLIT, out_dir)[1]


def tiny_config(gate: str, budget: int, eos: list[int], pad: int, **overrides) -> dict:
    """The tiny topology; keyword overrides replace fields (e.g. moe_intermediate_size=64)."""
    return dict(
        vocab_size=VOCAB_SIZE, hidden_size=64, num_hidden_layers=4,
        layer_types=["linear_attention"] * 3 + ["full_attention"],  # as the released config spells it
        num_attention_heads=4, num_key_value_heads=2, head_dim=32,
        linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=16,
        linear_conv_kernel_dim=4,
        num_experts=8, num_experts_per_tok=3, moe_intermediate_size=32, shared_expert_intermediate_size=32,
        hc_count=4, hc_lowrank=16,
        ple_layer_ids=[2], ngram_size=3, heads_per_ngram=2, ple_conv_kernel_size=4,
        ngram_vocab_size_base=1000, split_ngram_parts=4,
        indexer_n_heads=2, indexer_kv_heads=1, indexer_head_dim=16, indexer_budget=budget, indexer_compress_ratio=4,
        rope_parameters={"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25,
                         "mrope_section": [2, 1, 1]},
        rms_norm_eps=1e-6, max_position_embeddings=4096, initializer_range=0.1,
        eos_token_id=eos, pad_token_id=pad, output_gate_type=gate, tie_word_embeddings=False,
    ) | overrides


def randomise(model, seed: int) -> None:
    """Give every parameter a non-trivial random value (the HF init leaves norms and the PLE conv at 0)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("linear_attn.norm.weight"):          # plain gamma, used directly
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=g))
            elif name.endswith("norm.weight") or "layernorm" in name or ".ple.norm_" in name:
                p.copy_(0.3 * torch.randn(p.shape, generator=g))  # (1+w)-style: w random around 0
            elif name.endswith("ple.conv1d.weight"):
                p.copy_(0.3 * torch.randn(p.shape, generator=g))
            elif name.endswith("A_log"):
                p.copy_(torch.log(torch.rand(p.shape, generator=g) * 8 + 0.5))
            elif name.endswith("dt_bias"):
                p.copy_(torch.randn(p.shape, generator=g))
            elif "ngram_embedding" in name:
                p.copy_(torch.randn(p.shape, generator=g))
            else:
                fan_in = p.shape[-1] if p.ndim >= 2 else 1
                p.copy_(torch.randn(p.shape, generator=g) / fan_in ** 0.5)


def make(out_dir: str, seed: int = 0, gate: str = "sigmoid", budget: int = 64, fused_experts: bool = False,
         modelopt_nvfp4: bool = False, expert_width: int | None = None, modelopt_exclude: tuple = (),
         mtp: bool = False) -> str:
    """Write the tiny checkpoint to out_dir and return out_dir. modelopt_nvfp4: store it ModelOpt-NVFP4
    quantized, with the dequantized float checkpoint in dequant_dir(out_dir); modelopt_exclude: module
    patterns (fnmatch) left unquantized besides MODELOPT_EXCLUDE. expert_width: the routed and shared expert
    FFN width (default 32; 64 makes the expert down rows whole NVFP4 blocks). mtp: add the MTP head
    (add_mtp())."""
    import torch
    from transformers import Qwen4ExpForCausalLM, Qwen4ExpTextConfig

    if modelopt_nvfp4 and fused_experts:
        raise ValueError("ModelOpt exports experts per expert; --modelopt-nvfp4 and --fused-experts exclude each other")
    os.makedirs(out_dir, exist_ok=True)
    ids = build_tokenizer(out_dir)
    eos = [ids["<|endoftext|>"], ids["<|im_end|>"]]   # a list with different entries: PLE uses the first
    torch.manual_seed(seed)
    over = {} if expert_width is None else dict(moe_intermediate_size=expert_width,
                                                 shared_expert_intermediate_size=expert_width)
    cfg = Qwen4ExpTextConfig(**tiny_config(gate, budget, eos, ids["<|endoftext|>"], **over))
    model = Qwen4ExpForCausalLM(cfg).eval()
    randomise(model, seed)
    model.save_pretrained(out_dir)
    if mtp:
        add_mtp(out_dir, cfg.to_dict(), seed)
    if fused_experts:
        _fuse_experts(out_dir)
    if modelopt_nvfp4:
        modelopt_nvfp4_rewrite(out_dir, dequant_dir(out_dir), tuple(modelopt_exclude))
    return out_dir


# ------------------------------------------------------------------------------------------ MTP head

def mtp_shapes(cfg: dict) -> dict[str, tuple]:
    """The 31 `mtp.*` tensors of spec/qwen4exp-mtp.md §1 and their PyTorch shapes for a config dict."""
    H, hc, R = cfg["hidden_size"], cfg["hc_count"], cfg["hc_lowrank"]
    nh, nkv, hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    ni, di = cfg["indexer_n_heads"], cfg["indexer_head_dim"]
    ne, fe, fs = cfg["num_experts"], cfg["moe_intermediate_size"], cfg["shared_expert_intermediate_size"]
    W = hc * H
    out = {"mtp.pre_fc_norm_embedding.weight": (H,), "mtp.pre_fc_norm_hidden.weight": (W,),
           "mtp.fc_embedding.weight": (H, H), "mtp.fc_hidden.weight": (H, H)}
    L = "mtp.layers.0"
    for hcm in ("attn_hyper_connection", "mlp_hyper_connection"):
        out |= {f"{L}.{hcm}.hc_norm.weight": (W,), f"{L}.{hcm}.input_mix_weight_down.weight": (R, W),
                f"{L}.{hcm}.input_mix_weight_up.weight": (W, R), f"{L}.{hcm}.block_inject_weight.weight": (hc, W)}
    a = f"{L}.self_attn"
    out |= {f"{a}.q_proj.weight": (2 * nh * hd, H), f"{a}.k_proj.weight": (nkv * hd, H),
            f"{a}.v_proj.weight": (nkv * hd, H), f"{a}.o_proj.weight": (H, nh * hd),
            f"{a}.q_norm.weight": (hd,), f"{a}.k_norm.weight": (hd,),
            f"{a}.indexer.index_qk_proj.weight": ((ni + 1) * di, H),
            f"{a}.indexer.q_layernorm.weight": (di,), f"{a}.indexer.k_layernorm.weight": (di,)}
    m = f"{L}.mlp"
    out |= {f"{m}.gate.weight": (ne, H), f"{m}.experts.gate_up_proj": (ne, 2 * fe, H),
            f"{m}.experts.down_proj": (ne, H, fe), f"{m}.shared_expert.gate_proj.weight": (fs, H),
            f"{m}.shared_expert.up_proj.weight": (fs, H), f"{m}.shared_expert.down_proj.weight": (H, fs),
            f"{m}.shared_expert_gate.weight": (1, H)}
    mx = "mtp.hyper_connection_mixer"
    out |= {f"{mx}.hc_norm.weight": (W,), f"{mx}.input_mix_weight_down.weight": (R, W),
            f"{mx}.input_mix_weight_up.weight": (W, R)}
    assert len(out) == 31, len(out)
    return out


def add_mtp(out_dir: str, cfg: dict, seed: int) -> None:
    """Add random `mtp.*` tensors (mtp_shapes) to out_dir's model.safetensors, at randomise()'s scales (norm
    weights w around 0, applied as 1+w; matrices randn / sqrt(fan_in)), and mtp_num_hidden_layers: 1 to its
    config.json."""
    import torch
    from safetensors.torch import load_file, save_file

    path = os.path.join(out_dir, "model.safetensors")
    sd = load_file(path)
    g = torch.Generator().manual_seed(seed + 7919)
    for name, shape in mtp_shapes(cfg).items():
        if name.endswith("norm.weight") or "layernorm" in name or "pre_fc_norm" in name:
            sd[name] = 0.3 * torch.randn(shape, generator=g)
        else:
            sd[name] = torch.randn(shape, generator=g) / shape[-1] ** 0.5
    save_file(sd, path, metadata={"format": "pt"})
    mark_mtp(out_dir)


# ------------------------------------------------------------------------------------------ ModelOpt NVFP4

# Linear layers the tiny ModelOpt checkpoint keeps unquantized (listed by name in exclude_modules, as
# ModelOpt exports do): the LM head, the routers and the hyper-connection mixing weights. Tensors of other
# modules (norms, convs, the token embedding, 1-D parameters) are never quantized; the PLE table shards are,
# as in the real checkpoint.
MODELOPT_EXCLUDE = ("lm_head", "*.mlp.gate", "*.shared_expert_gate", "*_hyper_connection.*",
                    "*.hyper_connection_mixer.*")
NOT_LINEAR = ("model.embed_tokens",)
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
E4M3_MAX = 448.0


def dequant_dir(out_dir: str) -> str:
    """Where make(..., modelopt_nvfp4=True) puts the dequantized float checkpoint."""
    return os.path.normpath(out_dir) + "-dequant"


def nvfp4_quantize(w, input_amax: float | None = None) -> dict:
    """ModelOpt's NVFP4 weight quantization of a float32 [rows, cols] torch tensor (cols % 16 == 0):
    weight_scale_2 = amax / (6 * 448); per 16 values a block scale (block amax / 6) / weight_scale_2 rounded
    to F8 E4M3 (an all-zero block gets 1); codes = E2M1 round-to-nearest (ties to the even code) of
    w / (block scale * weight_scale_2), packed two per byte, value 2j in the low nibble of byte j.
    Returns {"weight", "weight_scale", "weight_scale_2", ["input_scale"], "dequant"} where dequant =
    (E2M1 value x block scale) x weight_scale_2 in float32."""
    import torch

    rows, cols = w.shape
    w = w.float()
    amax = w.abs().max()
    s2 = (amax / (6 * E4M3_MAX)).to(torch.float32) if amax > 0 else torch.tensor(1.0)
    blk = w.reshape(rows, cols // 16, 16)
    bs = blk.abs().amax(-1) / 6 / s2
    bs = torch.where(bs == 0, torch.ones_like(bs), bs).clamp(max=E4M3_MAX).to(torch.float8_e4m3fn)
    x = blk / (bs.float() * s2).unsqueeze(-1)
    vals = torch.tensor(E2M1_VALUES)
    order = torch.tensor([0, 2, 4, 6, 1, 3, 5, 7])          # even codes first: they win exact ties
    dist = (x.abs().unsqueeze(-1) - vals[order]).abs()
    code = order[dist.argmin(-1)].to(torch.uint8) | ((x < 0).to(torch.uint8) << 3)
    code = code.reshape(rows, cols)
    packed = (code[:, 0::2] | (code[:, 1::2] << 4)).contiguous()
    signed = torch.cat([vals, -vals])
    deq = (signed[code.long()].reshape(rows, cols // 16, 16) * bs.float().unsqueeze(-1)).reshape(rows, cols) * s2
    out = {"weight": packed, "weight_scale": bs.contiguous(), "weight_scale_2": s2.reshape(()).clone(),
           "dequant": deq}
    if input_amax is not None:
        out["input_scale"] = torch.tensor(input_amax / (6 * E4M3_MAX), dtype=torch.float32)
    return out


def modelopt_nvfp4_rewrite(out_dir: str, deq_dir: str, exclude: tuple = ()) -> None:
    """Rewrite the checkpoint in out_dir as ModelOpt NVFP4 (every linear layer -- a 2-D X.weight -- whose
    input width is a multiple of 16 and that MODELOPT_EXCLUDE does not name, PLE table shards included; each with
    weight, weight_scale, weight_scale_2 and an input_scale), with quantization_config in config.json and
    hf_quant_config.json; write the dequantized twin to deq_dir. `exclude`: more module patterns to leave
    unquantized."""
    import fnmatch
    import shutil

    from safetensors.torch import load_file, save_file

    path = os.path.join(out_dir, "model.safetensors")
    sd = load_file(path)
    if os.path.exists(deq_dir):
        shutil.rmtree(deq_dir)
    shutil.copytree(out_dir, deq_dir)
    q, deq, excluded = {}, {}, []
    for k in sorted(sd):
        v = sd[k]
        mod = k[:-len(".weight")] if k.endswith(".weight") else None
        ple = ".ngram_embedding.shard_" in k
        if mod is None or v.ndim != 2 or mod in NOT_LINEAR:
            q[k] = deq[k] = v
            continue
        if any(fnmatch.fnmatchcase(mod, p) for p in MODELOPT_EXCLUDE + exclude) or v.shape[1] % 16:
            excluded.append(mod)
            q[k] = deq[k] = v
            continue
        r = nvfp4_quantize(v, input_amax=None if ple else 1.0 + (len(q) % 7) / 7)
        deq[k] = r.pop("dequant")
        for name, t in r.items():
            q[f"{mod}.{name}"] = t
    save_file(q, path, metadata={"format": "pt"})
    save_file(deq, os.path.join(deq_dir, "model.safetensors"), metadata={"format": "pt"})
    quant = {"quant_algo": "NVFP4", "kv_cache_quant_algo": None, "group_size": 16, "exclude_modules": excluded}
    with open(os.path.join(out_dir, "hf_quant_config.json"), "w") as f:
        json.dump({"producer": {"name": "modelopt", "version": "tiny-fixture"}, "quantization": quant}, f, indent=2)
    cpath = os.path.join(out_dir, "config.json")
    with open(cpath) as f:
        cfg = json.load(f)
    cfg["quantization_config"] = {"quant_method": "modelopt", **quant}
    with open(cpath, "w") as f:
        json.dump(cfg, f, indent=2)


def _fuse_experts(out_dir: str) -> None:
    """Rewrite the checkpoint with experts stored fused (gate_up_proj [E,2I,H], down_proj [E,H,I]), the
    other layout a checkpoint can have."""
    import re

    import torch
    from safetensors.torch import load_file, save_file

    path = os.path.join(out_dir, "model.safetensors")
    sd = load_file(path)
    out, groups = {}, {}
    for k, v in sd.items():
        m = re.match(r"(.*\.mlp\.experts)\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight$", k)
        if m:
            groups.setdefault(m.group(1), {})[(int(m.group(2)), m.group(3))] = v
        else:
            out[k] = v
    for prefix, d in groups.items():
        n = 1 + max(e for e, _ in d)
        out[prefix + ".gate_up_proj"] = torch.stack([torch.cat([d[(e, "gate_proj")], d[(e, "up_proj")]]) for e in range(n)])
        out[prefix + ".down_proj"] = torch.stack([d[(e, "down_proj")] for e in range(n)])
    save_file(out, path, metadata={"format": "pt"})


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out_dir")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--gate", choices=["sigmoid", "silu"], default="sigmoid",
                    help="GDN output-gate activation (llama.cpp hard-codes sigmoid)")
    ap.add_argument("--budget", type=int, default=64, help="QSA indexer budget in tokens (multiple of 4)")
    ap.add_argument("--fused-experts", action="store_true", help="store experts fused instead of per expert")
    ap.add_argument("--modelopt-nvfp4", action="store_true",
                    help="store it ModelOpt-NVFP4 quantized; the dequantized twin goes to OUT_DIR-dequant")
    ap.add_argument("--expert-width", type=int, default=None, help="routed and shared expert FFN width (default 32)")
    ap.add_argument("--mtp", action="store_true", help="add the MTP head's 31 mtp.* tensors (spec/qwen4exp-mtp.md)")
    a = ap.parse_args(argv)
    make(a.out_dir, a.seed, a.gate, a.budget, a.fused_experts, modelopt_nvfp4=a.modelopt_nvfp4,
         expert_width=a.expert_width, mtp=a.mtp)
    print(a.out_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
