"""tools/make_model.py: presets in models/ -> random qwen4exp GGUFs.

(a) tiny at f32 / q8_0 follows the contract (spec/qwen4exp-gguf.md §1-§2, §4) as read back by
    pyrunner.gguf_info: names and ggml shapes derived here from the preset alone, types, metadata, PLE hash
    constants, a BPE-closed tokenizer;
(b) llama.cpp (llama-cpp-python) loads tiny at every recipe, and a direct-blocks variant, and gives finite,
    non-degenerate logits; its tokenizer round-trips text;
(c) determinism: same preset + seed -> same bytes, another seed -> other bytes (float and direct paths);
(d) bench and ple-full are not generated (too big): their dry-run plans have the real shapes, the recipe's
    types (with the 256-block fallback on expert down rows) and the size bounds (iq2_xs bench <= 12 GB,
    ple-full's table 320,001,536 rows of IQ4_NL = 26.8 GiB).
"""
from __future__ import annotations

import hashlib
import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT
from gguf import quants as gq

from model_oracles import llama_text_logits  # llama.cpp in a child process: a crash fails the test
from pyrunner import gguf_info

ROOT = Path(__file__).resolve().parents[1]
A = "qwen4exp."
# llama.cpp's required keys for qwen4exp (spec §1) plus the PLE ones this preset needs
REQUIRED_KEYS = ["general.architecture", A + "context_length", A + "embedding_length", A + "block_count",
                 A + "attention.layer_norm_rms_epsilon", A + "rope.dimension_sections", A + "ssm.conv_kernel",
                 A + "ssm.state_size", A + "ssm.group_count", A + "ssm.time_step_rank", A + "ssm.inner_size",
                 A + "hyper_connection.count", A + "hyper_connection.low_rank",
                 A + "attention.indexer.head_count", A + "attention.indexer.key_length",
                 A + "attention.indexer.top_k", A + "attention.compress_ratios", A + "ple.layers",
                 A + "ple.ngram_size", A + "ple.heads_per_ngram", A + "ple.conv_kernel", A + "ple.eos_token_id",
                 A + "embedding_length_per_layer_input", A + "ple.layer_multipliers", A + "ple.head_offsets",
                 A + "ple.head_vocab_sizes", "tokenizer.ggml.model", "tokenizer.ggml.tokens",
                 "tokenizer.ggml.merges", "tokenizer.ggml.eos_token_id"]


def _tool():
    spec = importlib.util.spec_from_file_location("make_model", ROOT / "tools" / "make_model.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


mm = _tool()


def _preset(name: str) -> dict:
    return json.loads((ROOT / "models" / f"{name}.json").read_text())


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _is_prime(n: int) -> bool:
    return n > 1 and all(n % d for d in range(2, int(n ** 0.5) + 1))


def expected_shapes(c: dict) -> dict[str, tuple]:
    """spec §2 in ggml ne order, from a preset's hyperparameters alone."""
    E, V, hc, r = c["hidden_size"], c["vocab_size"], c["hc_count"], c["hc_lowrank"]
    H, Hkv, hd = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
    Gk, Gv, dk = c["linear_num_key_heads"], c["linear_num_value_heads"], c["linear_key_head_dim"]
    Ne, Fe, Fs = c["num_experts"], c["moe_intermediate_size"], c["shared_expert_intermediate_size"]
    Hi, Di, K = c["indexer_n_heads"], c["indexer_head_dim"], c["linear_conv_kernel_dim"]
    s = {"token_embd.weight": (E, V), "output.weight": (E, V), "output_hc_norm.weight": (hc * E,),
         "output_hc_down.weight": (hc * E, r), "output_hc_up.weight": (r, hc * E)}
    for i in range(c["num_hidden_layers"]):
        b = f"blk.{i}"
        for g in ("attn", "ffn"):
            s |= {f"{b}.hc_{g}_norm.weight": (hc * E,), f"{b}.hc_{g}_down.weight": (hc * E, r),
                  f"{b}.hc_{g}_up.weight": (r, hc * E), f"{b}.hc_{g}_inject.weight": (hc * E, hc)}
        if (i + 1) % c["full_attention_interval"]:
            conv = 2 * Gk * dk + Gv * dk
            s |= {f"{b}.attn_qkv.weight": (E, conv), f"{b}.attn_gate.weight": (E, Gv * dk),
                  f"{b}.ssm_conv1d.weight": (K, conv), f"{b}.ssm_dt.bias": (Gv,), f"{b}.ssm_a": (Gv,),
                  f"{b}.ssm_beta.weight": (E, Gv), f"{b}.ssm_alpha.weight": (E, Gv),
                  f"{b}.ssm_norm.weight": (dk,), f"{b}.ssm_out.weight": (Gv * dk, E)}
        else:
            s |= {f"{b}.attn_q.weight": (E, 2 * H * hd), f"{b}.attn_k.weight": (E, Hkv * hd),
                  f"{b}.attn_v.weight": (E, Hkv * hd), f"{b}.attn_output.weight": (H * hd, E),
                  f"{b}.attn_q_norm.weight": (hd,), f"{b}.attn_k_norm.weight": (hd,),
                  f"{b}.indexer.q_proj.weight": (E, Hi * Di), f"{b}.indexer.k_proj.weight": (E, Di),
                  f"{b}.indexer.q_norm.weight": (Di,), f"{b}.indexer.k_norm.weight": (Di,)}
        if i + 1 in c["ple_layer_ids"]:
            s |= {f"{b}.ple_key.weight": (E, hc * E), f"{b}.ple_value.weight": (E, E),
                  f"{b}.ple_norm_key.weight": (hc * E,), f"{b}.ple_norm_query.weight": (hc * E,),
                  f"{b}.ple_norm_conv.weight": (hc * E,),
                  f"{b}.ple_conv1d.weight": (c["ple_conv_kernel_size"], hc * E)}
        s |= {f"{b}.ffn_gate_inp.weight": (E, Ne), f"{b}.ffn_gate_exps.weight": (E, Fe, Ne),
              f"{b}.ffn_up_exps.weight": (E, Fe, Ne), f"{b}.ffn_down_exps.weight": (Fe, E, Ne),
              f"{b}.ffn_gate_inp_shexp.weight": (E, 1), f"{b}.ffn_gate_shexp.weight": (E, Fs),
              f"{b}.ffn_up_shexp.weight": (E, Fs), f"{b}.ffn_down_shexp.weight": (Fs, E)}
    return s


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("make_model")


def _make(work: Path, preset: str, recipe: str, seed: int = 0, tag: str = "") -> Path:
    out = work / f"{Path(preset).stem}-{recipe}-{seed}{tag}.gguf"
    if not out.exists():
        mm.make_model(preset, str(out), recipe, seed)
    return out


@pytest.fixture(scope="module")
def direct_preset(work) -> str:
    """tiny with direct_blocks: quantized tensors written as random blocks (the bench/ple-full path)."""
    p = _preset("tiny") | {"direct_blocks": True}
    path = work / "tiny-direct.json"
    path.write_text(json.dumps(p))
    return str(path)


# ------------------------------------------------------------------------------------------ (a) contract

@pytest.mark.parametrize("recipe", ["f32", "q8_0"])
def test_tiny_contract(work, recipe):
    c = _preset("tiny")
    info = gguf_info(_make(work, "tiny", recipe))
    tensors = {t["name"]: t for t in info["tensors"]}
    want = expected_shapes(c)
    heads = (c["ngram_size"] - 1) * c["heads_per_ngram"]
    md = info["metadata"]
    rows = tensors["per_layer_token_embd.weight"]["shape"][1]
    want["per_layer_token_embd.weight"] = (c["hidden_size"] // heads, rows)
    assert set(tensors) == set(want)
    for name, t in tensors.items():
        assert tuple(t["shape"]) == want[name], name
        kept = name.endswith(("_norm.weight", "ffn_gate_inp.weight", "ffn_gate_inp_shexp.weight",
                              "ssm_conv1d.weight")) or not name.endswith(".weight")
        if recipe == "f32" or len(t["shape"]) == 1 or kept:
            assert t["type"] == "F32", name
        else:       # convert's q8_0 rule: rows that 32 does not divide fall back to F16
            assert t["type"] == ("Q8_0" if t["shape"][0] % 32 == 0 else "F16"), name

    for k in REQUIRED_KEYS:
        assert k in md, k
    assert md["general.architecture"] == "qwen4exp"
    assert md[A + "block_count"] == c["num_hidden_layers"] and md[A + "embedding_length"] == c["hidden_size"]
    assert md[A + "attention.recurrent_layers"] == [True, True, True, False]
    assert md[A + "attention.compress_ratios"] == [0, 0, 0, c["indexer_compress_ratio"]]
    assert md[A + "ple.layers"] == [c["ple_layer_ids"][0] - 1]
    assert md["general.file_type"] == {"f32": 0, "q8_0": 7}[recipe]
    # PLE hash constants (spec §4): consecutive primes from the base, running offsets, the padded table
    # covers every head, multipliers small enough that int64 hashing never overflows
    sizes, offs, mult = md[A + "ple.head_vocab_sizes"], md[A + "ple.head_offsets"], md[A + "ple.layer_multipliers"]
    assert len(sizes) == len(offs) == heads and len(mult) == c["ngram_size"]
    assert all(_is_prime(p) for p in sizes) and sizes[0] >= c["ngram_vocab_size_base"]
    assert all(not _is_prime(x) for x in range(c["ngram_vocab_size_base"], sizes[-1]) if x not in sizes)
    assert offs == [sum(sizes[:k]) for k in range(heads)]
    assert rows == -(-sum(sizes) // 128) * 128
    assert all(0 < m < (2 ** 63 - 1) // c["vocab_size"] for m in mult)
    # tokenizer: vocab_size entries; the PLE resets on <|endoftext|>, generation stops on <|im_end|>
    toks = md["tokenizer.ggml.tokens"]
    assert len(toks) == c["vocab_size"] == len(md["tokenizer.ggml.token_type"])
    assert toks[md[A + "ple.eos_token_id"]] == "<|endoftext|>"
    assert toks[md["tokenizer.ggml.eos_token_id"]] == "<|im_end|>"


def test_tokenizer_bpe_closed():
    tk = mm.build_tokenizer(400, 350)
    rank = {t: i for i, t in enumerate(tk["tokens"])}
    assert len(rank) == len(tk["tokens"]), "duplicate tokens"
    assert len(tk["merges"]) == 350 - 256
    for k, m in enumerate(tk["merges"]):
        a, b = m.split(" ")
        assert rank[a] < rank[a + b] and rank[b] < rank[a + b] and rank[a + b] == 256 + k, m
    assert tk["toktypes"][350:353] == [3, 3, 3] and set(tk["toktypes"][353:]) == {5}


# ------------------------------------------------------------------------------------------ (b) llama.cpp

@pytest.mark.parametrize("recipe", mm.RECIPES)
def test_tiny_runs_in_llama_cpp(work, recipe):
    s = llama_text_logits(_make(work, "tiny", recipe), b"The quick brown fox, 42 times.")
    assert np.isfinite(s).all()
    assert s.std(axis=1).min() > 0.05          # not degenerate: logits differ across the vocabulary
    assert np.abs(np.diff(s, axis=0)).max() > 0.05   # and from position to position


def test_direct_blocks_valid_and_run(work, direct_preset):
    path = _make(work, direct_preset, "iq2_xs")
    info = gguf_info(path)
    from pyrunner.gguf import GGUFFile
    f = GGUFFile(path)
    quantized = [t for t in info["tensors"] if t["type"] not in ("F32", "F16")]
    assert {t["type"] for t in quantized} >= {"IQ4_NL"}
    for t in quantized:
        v = gq.dequantize(np.frombuffer(f.tensor_data(t["name"]), dtype=np.uint8), QT[t["type"]])
        assert np.isfinite(v).all(), t["name"]
        w = t["shape"][0]
        std = float(np.std(v))
        want = 1.0 if t["name"] == "per_layer_token_embd.weight" else w ** -0.5
        assert want / 8 < std < want * 8, (t["name"], std, want)
    s = llama_text_logits(path, b"hello world")
    assert np.isfinite(s).all()


# ------------------------------------------------------------------------------------------ (c) determinism

def test_deterministic_float_path(work):
    a = _make(work, "tiny", "q8_0", seed=3, tag="a")
    b = _make(work, "tiny", "q8_0", seed=3, tag="b")
    c = _make(work, "tiny", "q8_0", seed=4)
    assert _sha(a) == _sha(b)
    assert _sha(a) != _sha(c)
    assert gguf_info(a)["metadata"]["strata.seed"] == 3


def test_deterministic_direct_path(work, direct_preset):
    a = _make(work, direct_preset, "nvfp4", seed=5, tag="a")
    b = _make(work, direct_preset, "nvfp4", seed=5, tag="b")
    c = _make(work, direct_preset, "nvfp4", seed=6)
    assert _sha(a) == _sha(b)
    assert _sha(a) != _sha(c)
    assert any(t["type"] == "NVFP4" for t in gguf_info(a)["tensors"])


# ------------------------------------------------------------------------------------------ (d) big presets

def _plan(preset: str, recipe: str) -> tuple[dict, dict]:
    info = mm.plan_model(preset, recipe)
    info.pop("_plan")
    return info, {t["name"]: t for t in info["tensors"]}


def test_bench_plan_iq2_xs():
    c = _preset("bench")
    info, ts = _plan("bench", "iq2_xs")
    assert info["bytes"] <= 12e9
    want = expected_shapes(c)
    assert set(ts) == set(want) | {"per_layer_token_embd.weight"}
    for name, shp in want.items():
        assert tuple(ts[name]["shape"]) == shp, name
    # the real topology (DESIGN §3)
    assert c["num_hidden_layers"] == 48 and c["hidden_size"] == 2560 and c["hc_count"] == 4
    assert c["num_experts"] == 512 and c["num_experts_per_tok"] == 10 and c["vocab_size"] == 248320
    assert ts["blk.3.attn_q.weight"]["shape"] == [2560, 2 * 24 * 256]
    assert ts["blk.0.attn_qkv.weight"]["shape"] == [2560, 2 * 16 * 128 + 48 * 128]
    assert "blk.1.ple_key.weight" in ts and "blk.0.ple_key.weight" not in ts
    assert ts["per_layer_token_embd.weight"]["shape"][0] == 160
    assert (c["ngram_size"] - 1) * c["heads_per_ngram"] == 16
    assert [i for i in range(48) if f"blk.{i}.attn_q.weight" in ts] == list(range(3, 48, 4))
    # types: experts IQ2_XS, down rows (96 wide) fall back to IQ4_NL, PLE table IQ4_NL
    assert ts["blk.0.ffn_gate_exps.weight"]["type"] == "IQ2_XS"
    assert ts["blk.0.ffn_up_exps.weight"]["type"] == "IQ2_XS"
    assert ts["blk.0.ffn_down_exps.weight"]["type"] == "IQ4_NL"
    assert ts["per_layer_token_embd.weight"]["type"] == "IQ4_NL"
    assert ts["output.weight"]["type"] == "Q6_K" and ts["blk.0.ffn_gate_inp.weight"]["type"] == "F32"
    # sizes add up from the block layouts
    g = ts["blk.0.ffn_gate_exps.weight"]
    assert g["size"] == 2560 * 96 * 512 // 256 * 74


def test_bench_plan_other_recipes():
    """The recipes are strata quantize's: 256-value types fall back on the 96-wide expert down rows."""
    _, q4 = _plan("bench", "q4_k_m")
    assert q4["blk.0.ffn_gate_exps.weight"]["type"] == "Q4_K"
    downs = {q4[f"blk.{i}.ffn_down_exps.weight"]["type"] for i in range(48)}
    assert downs == {"Q8_0", "Q5_1"}          # Q6_K on llama.cpp's "more bits" layers, else Q4_K, both fall back
    assert q4["output.weight"]["type"] == "Q6_K"
    _, nv = _plan("bench", "nvfp4")
    assert nv["blk.0.ffn_down_exps.weight"]["type"] == "IQ4_NL"     # 96 % 64 != 0
    assert nv["blk.0.ffn_gate_exps.weight"]["type"] == "NVFP4"
    assert nv["blk.0.ffn_down_shexp.weight"]["type"] == "NVFP4"     # 640 = 10 x 64
    assert nv["per_layer_token_embd.weight"]["type"] == "IQ4_NL"    # 160-value rows


def test_ple_full_plan():
    info, ts = _plan("ple-full", "iq2_xs")
    t = ts["per_layer_token_embd.weight"]
    assert t["shape"] == [160, 320_001_536] and t["type"] == "IQ4_NL"
    assert t["size"] == 320_001_536 * 90 and abs(t["size"] / 2 ** 30 - 26.8) < 0.05
    assert ts["blk.0.ffn_down_exps.weight"]["shape"] == [640, 2560, 512]
    assert ts["blk.0.ffn_down_exps.weight"]["type"] == "IQ4_NL"       # 640-wide rows
    assert max(int(n.split(".")[1]) for n in ts if n.startswith("blk.")) == 3


# ------------------------------------------------------------------------------------------ errors

def test_errors(work, capsys):
    with pytest.raises(mm.MakeModelError, match="tiny"):
        mm.load_preset("no-such-preset")
    with pytest.raises(mm.MakeModelError, match="quantized recipe"):
        mm.make_model("bench", str(work / "bench.gguf"), "f32")
    assert not (work / "bench.gguf").exists() and not (work / "bench.gguf.tmp").exists()
    assert mm.main(["no-such-preset", "-o", str(work / "x.gguf")]) == 2
    assert "no preset 'no-such-preset'" in capsys.readouterr().err


def test_small_plan_gets_the_target_types():
    """small has hidden 512, so the 256-value types really apply (tiny falls back everywhere)."""
    _, ts = _plan("small", "iq2_xs")
    assert ts["blk.0.ffn_gate_exps.weight"]["type"] == "IQ2_XS"
    assert ts["blk.0.ffn_down_exps.weight"]["type"] == "IQ4_NL"     # 128-wide rows
    assert ts["blk.0.attn_qkv.weight"]["type"] == "Q4_K"
    assert ts["blk.0.hc_attn_up.weight"]["type"] == "IQ4_NL"        # 64-wide (low rank) rows
