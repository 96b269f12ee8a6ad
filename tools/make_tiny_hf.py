#!/usr/bin/env python3
"""make_tiny_hf.py — build a tiny random Qwen4ExpForCausalLM checkpoint (transformers, torch CPU) plus a
small byte-level BPE tokenizer, for converter and parity tests.

    python tools/make_tiny_hf.py OUT_DIR [--seed S] [--gate sigmoid|silu] [--budget B] [--fused-experts]

The topology exercises every part of qwen4exp at toy widths: 4 layers (GDN, GDN, GDN, QSA), V heads != K
heads in the GDN, 8 experts + a shared expert, PLE on a GDN layer with small hash tables split into row
shards, and eos_token_id a list whose entries differ (PLE resets on the FIRST one). transformers
zero-initialises every (1+w) norm and the PLE conv (DESIGN §8); they are randomised here, as are all
other weights, at a scale that gives O(1) logits.

Test-only tool: needs torch==2.13.0, transformers==5.23.0 and tokenizers (pyproject test extras).
"""
from __future__ import annotations

import argparse
import json
import os
import sys

# Special tokens follow the byte/merge vocabulary, as in Qwen's vocabularies.
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# The pre-tokenizer split of Qwen2-family tokenizers (llama.cpp's "qwen2" pre-tokenizer).
QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
               r"|\s*[\r\n]+|\s+(?!\S)|\s+")
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
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
    """Train a byte-level BPE of N_MERGED tokens on CORPUS, append SPECIALS, save tokenizer.json and
    tokenizer_config.json. Returns the special-token ids."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=N_MERGED, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(CORPUS * 20, trainer=trainer)
    n_base = tok.get_vocab_size()
    if n_base > N_MERGED:
        raise RuntimeError(f"BPE training produced {n_base} tokens, more than {N_MERGED}")
    tok.add_special_tokens(SPECIALS)
    ids = {s: tok.token_to_id(s) for s in SPECIALS}
    tok.save(os.path.join(out_dir, "tokenizer.json"))
    cfg = {
        "tokenizer_class": "Qwen2Tokenizer",
        "model_max_length": 4096,
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "add_bos_token": False,
        "chat_template": CHAT_TEMPLATE,
        "added_tokens_decoder": {str(i): {"content": s, "special": True, "lstrip": False, "rstrip": False,
                                          "normalized": False, "single_word": False}
                                 for s, i in ids.items()},
    }
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    return ids


def tiny_config(gate: str, budget: int, eos: list[int], pad: int) -> dict:
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
    )


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


def make(out_dir: str, seed: int = 0, gate: str = "sigmoid", budget: int = 64, fused_experts: bool = False) -> str:
    import torch
    from transformers import Qwen4ExpForCausalLM, Qwen4ExpTextConfig

    os.makedirs(out_dir, exist_ok=True)
    ids = build_tokenizer(out_dir)
    eos = [ids["<|endoftext|>"], ids["<|im_end|>"]]   # a list with different entries: PLE uses the first
    torch.manual_seed(seed)
    cfg = Qwen4ExpTextConfig(**tiny_config(gate, budget, eos, ids["<|endoftext|>"]))
    model = Qwen4ExpForCausalLM(cfg).eval()
    randomise(model, seed)
    model.save_pretrained(out_dir)
    if fused_experts:
        _fuse_experts(out_dir)
    return out_dir


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
    a = ap.parse_args(argv)
    make(a.out_dir, a.seed, a.gate, a.budget, a.fused_experts)
    print(a.out_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
