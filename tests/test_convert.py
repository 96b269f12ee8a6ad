"""strata convert: a tiny random transformers Qwen4Exp checkpoint -> GGUF.

(a) the file follows the qwen4exp contract (names, ggml shapes, types, metadata, the two llama.cpp converter
    bugs not repeated) and every transformation is checked value by value against the checkpoint;
(b) the oracle: llama.cpp (llama-cpp-python) runs the f32 file and matches transformers fp32 per position
    where QSA does not bind (prompt shorter than the budget) on a prompt containing EOS tokens;
(c) the q8_0 file loads in llama.cpp and mostly agrees on the top-1 token.
"""
from __future__ import annotations

import importlib.util
import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

torch = importlib.import_module("torch")
importlib.import_module("transformers")
from gguf import GGUFReader  # noqa: E402
from gguf import quants as gq  # noqa: E402
from gguf.constants import GGMLQuantizationType as QT  # noqa: E402

from pyrunner.convert import ConvertError, convert  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
PROMPT_LEN = 40          # < indexer budget 64: QSA selects everything, llama.cpp and transformers agree
F32_TOL = 1e-3
# q8_0 top-1 vs transformers fp32: 0.95 on this test's model and prompt; 0.775-1.0 over 4 model seeds x 3
# prompts. Random tiny logits have many near-ties, and a Q8_0 perturbation that flips an expert choice moves
# logits by 0.3-1.4, so this is a floor against a broken file, not a quality figure.
Q8_TOP1_MIN = 0.75


def _tool():
    spec = importlib.util.spec_from_file_location("make_tiny_hf", ROOT / "tools" / "make_tiny_hf.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("convert")


@pytest.fixture(scope="module")
def hf(work) -> Path:
    return Path(_tool().make(str(work / "tiny"), seed=0, gate="sigmoid", budget=64))


@pytest.fixture(scope="module")
def cfg(hf) -> dict:
    return json.loads((hf / "config.json").read_text())


@pytest.fixture(scope="module")
def sd(hf) -> dict:
    from safetensors.numpy import load_file
    return load_file(str(hf / "model.safetensors"))


@pytest.fixture(scope="module")
def f32(hf, work) -> Path:
    out = work / "tiny-f32.gguf"
    convert(str(hf), str(out), "f32")
    return out


@pytest.fixture(scope="module")
def q8(hf, work) -> Path:
    out = work / "tiny-q8_0.gguf"
    convert(str(hf), str(out), "q8_0")
    return out


@pytest.fixture(scope="module")
def prompt() -> list[int]:
    rng = np.random.default_rng(7)
    ids = [int(x) for x in rng.integers(0, 300, PROMPT_LEN)]
    ids[13] = 300          # eos_token_id[0]: PLE resets here in transformers
    ids[27] = 302          # eos_token_id[-1]: what llama.cpp's own converter would have used
    return ids


@pytest.fixture(scope="module")
def ref_logits(hf, prompt) -> np.ndarray:
    from transformers import AutoModelForCausalLM
    torch.manual_seed(0)
    m = AutoModelForCausalLM.from_pretrained(str(hf), dtype=torch.float32).eval()
    with torch.no_grad():
        return m(torch.tensor([prompt])).logits[0].float().numpy()


def _fields(path) -> tuple[dict, dict]:
    r = GGUFReader(str(path))
    md = {k: f.contents() for k, f in r.fields.items() if not k.startswith("GGUF.")}
    return md, {t.name: t for t in r.tensors}


def _llama_logits(path, ids) -> np.ndarray:
    llama_cpp = importlib.import_module("llama_cpp")
    llm = llama_cpp.Llama(str(path), logits_all=True, flash_attn=False, type_k=0, type_v=0, n_threads=2,
                          n_ctx=128, verbose=False)
    try:
        llm.eval(ids)
        return np.array(llm.scores[:len(ids)], dtype=np.float32)
    finally:
        llm.close()


def _expected_shapes(c: dict) -> dict[str, tuple]:
    """The contract (spec/qwen4exp-gguf.md §2) in ggml ne order, from the config alone."""
    E, V, hc, r = c["hidden_size"], c["vocab_size"], c["hc_count"], c["hc_lowrank"]
    H, Hkv, hd = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
    Gk, Gv, dk = c["linear_num_key_heads"], c["linear_num_value_heads"], c["linear_key_head_dim"]
    Ne, Fe, Fs = c["num_experts"], c["moe_intermediate_size"], c["shared_expert_intermediate_size"]
    Hi, Di, K = c["indexer_n_heads"], c["indexer_head_dim"], c["linear_conv_kernel_dim"]
    s = {"token_embd.weight": (E, V), "output.weight": (E, V), "output_hc_norm.weight": (hc * E,),
         "output_hc_down.weight": (hc * E, r), "output_hc_up.weight": (r, hc * E)}
    for i, t in enumerate(c["layer_types"]):
        b = f"blk.{i}"
        for g in ("attn", "ffn"):
            s |= {f"{b}.hc_{g}_norm.weight": (hc * E,), f"{b}.hc_{g}_down.weight": (hc * E, r),
                  f"{b}.hc_{g}_up.weight": (r, hc * E), f"{b}.hc_{g}_inject.weight": (hc * E, hc)}
        if t == "linear_attention":
            s |= {f"{b}.attn_qkv.weight": (E, 2 * Gk * dk + Gv * dk), f"{b}.attn_gate.weight": (E, Gv * dk),
                  f"{b}.ssm_conv1d.weight": (K, 2 * Gk * dk + Gv * dk), f"{b}.ssm_dt.bias": (Gv,),
                  f"{b}.ssm_a": (Gv,), f"{b}.ssm_beta.weight": (E, Gv), f"{b}.ssm_alpha.weight": (E, Gv),
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
                  f"{b}.ple_norm_conv.weight": (hc * E,), f"{b}.ple_conv1d.weight": (c["ple_conv_kernel_size"], hc * E)}
        s |= {f"{b}.ffn_gate_inp.weight": (E, Ne), f"{b}.ffn_gate_exps.weight": (E, Fe, Ne),
              f"{b}.ffn_up_exps.weight": (E, Fe, Ne), f"{b}.ffn_down_exps.weight": (Fe, E, Ne),
              f"{b}.ffn_gate_inp_shexp.weight": (E, 1), f"{b}.ffn_gate_shexp.weight": (E, Fs),
              f"{b}.ffn_up_shexp.weight": (E, Fs), f"{b}.ffn_down_shexp.weight": (Fs, E)}
    heads = (c["ngram_size"] - 1) * c["heads_per_ngram"]
    total = sum(_primes_after(c["ngram_vocab_size_base"], heads))
    s["per_layer_token_embd.weight"] = (E // heads, -(-total // 128) * 128)
    return s


def _primes_after(base: int, n: int) -> list[int]:
    out, x = [], base
    while len(out) < n:
        if x > 1 and all(x % d for d in range(2, int(x ** 0.5) + 1)):
            out.append(x)
        x += 1
    return out


# ------------------------------------------------------------------------------------------ (a) the contract

def test_names_shapes_types(f32, cfg):
    _, tensors = _fields(f32)
    want = _expected_shapes(cfg)
    assert set(tensors) == set(want)
    for name, t in tensors.items():
        assert tuple(int(d) for d in t.shape) == want[name], name
        assert t.tensor_type == QT.F32, name


def test_metadata(f32, cfg, sd):
    md, _ = _fields(f32)
    a = "qwen4exp."
    assert md["general.architecture"] == "qwen4exp"
    assert md[a + "block_count"] == 4 and md[a + "embedding_length"] == 64
    assert md[a + "attention.head_count"] == 4 and md[a + "attention.head_count_kv"] == 2
    assert md[a + "attention.key_length"] == 32 and md[a + "attention.value_length"] == 32
    assert md[a + "rope.dimension_count"] == 8            # head_dim 32 x partial 0.25
    assert md[a + "rope.dimension_sections"] == [2, 1, 1, 0]
    assert md[a + "rope.freq_base"] == pytest.approx(1e7)
    assert md[a + "ssm.group_count"] == 2 and md[a + "ssm.time_step_rank"] == 4
    assert md[a + "ssm.state_size"] == 16 and md[a + "ssm.inner_size"] == 64 and md[a + "ssm.conv_kernel"] == 4
    assert md[a + "expert_count"] == 8 and md[a + "expert_used_count"] == 3
    assert md[a + "hyper_connection.count"] == 4 and md[a + "hyper_connection.low_rank"] == 16
    assert md[a + "attention.recurrent_layers"] == [True, True, True, False]
    assert md[a + "attention.indexer.top_k"] == 64
    # llama.cpp's converter writes 0 here (dense attention); every QSA layer needs its ratio
    assert md[a + "attention.compress_ratios"] == [0, 0, 0, 4]
    # PLE: 1-based ple_layer_ids -> 0-based; EOS = eos_token_id[0] as transformers' n-gram module uses
    assert cfg["eos_token_id"] == [300, 302]
    assert md[a + "ple.layers"] == [1]
    assert md[a + "ple.eos_token_id"] == 300
    assert md[a + "embedding_length_per_layer_input"] == 16
    emb = "model.layers.1.ple.ple_embedding."
    assert md[a + "ple.layer_multipliers"] == [int(x) for x in sd[emb + "layer_multipliers"]]
    assert md[a + "ple.head_offsets"] == [int(x) for x in sd[emb + "ngram_heads_offsets"]]
    assert md[a + "ple.head_vocab_sizes"] == [int(x) for x in sd[emb + "ngram_heads_vocab_sizes"]]
    r = GGUFReader(str(f32))
    for k in ("layer_multipliers", "head_offsets", "head_vocab_sizes"):
        assert r.fields[a + "ple." + k].types[-1].name == "UINT64"      # exact 45-bit values, not f32
    assert md["strata.gdn_output_gate"] == "sigmoid"
    assert md["strata.tokenizer_normalizer"] == "NFC"


def test_tokenizer_metadata(f32, hf):
    md, _ = _fields(f32)
    tok = json.loads((hf / "tokenizer.json").read_text())
    assert md["tokenizer.ggml.model"] == "gpt2" and md["tokenizer.ggml.pre"] == "qwen2"
    tokens, types = md["tokenizer.ggml.tokens"], md["tokenizer.ggml.token_type"]
    assert len(tokens) == len(types) == 320
    for s, i in tok["model"]["vocab"].items():
        assert tokens[i] == s and types[i] == 1
    assert tokens[300:303] == ["<|endoftext|>", "<|im_start|>", "<|im_end|>"] and types[300:303] == [3, 3, 3]
    assert tokens[303] == "[PAD303]" and set(types[303:]) == {5}
    assert md["tokenizer.ggml.merges"] == [" ".join(m) if isinstance(m, list) else m for m in tok["model"]["merges"]]
    assert md["tokenizer.ggml.eos_token_id"] == 302 and md["tokenizer.ggml.padding_token_id"] == 300
    assert "bos_token_id" not in md
    assert "<|im_start|>" in md["tokenizer.chat_template"]


def test_transformations(f32, cfg, sd):
    """Each converter rule against the checkpoint, written independently of the converter."""
    _, t = _fields(f32)

    def g(name):
        return np.asarray(t[name].data, dtype=np.float32)

    nk, nv, d = 2, 4, 16
    r = nv // nk
    # tiled position (j, k) holds HF's V head k*r + j (HF groups V heads by K head)
    tiled = [k * r + j for j in range(r) for k in range(nk)]
    rows = np.concatenate([np.arange(h * d, (h + 1) * d) for h in tiled])
    la = "model.layers.0.linear_attn."
    qkv = sd[la + "in_proj_qkv.weight"]
    np.testing.assert_array_equal(g("blk.0.attn_qkv.weight"), np.concatenate([qkv[:64], qkv[64:][rows]]))
    np.testing.assert_array_equal(g("blk.0.attn_gate.weight"), sd[la + "in_proj_z.weight"][rows])
    np.testing.assert_array_equal(g("blk.0.ssm_out.weight"), sd[la + "out_proj.weight"][:, rows])
    np.testing.assert_array_equal(g("blk.0.ssm_beta.weight"), sd[la + "in_proj_b.weight"][tiled])
    np.testing.assert_array_equal(g("blk.0.ssm_alpha.weight"), sd[la + "in_proj_a.weight"][tiled])
    np.testing.assert_array_equal(g("blk.0.ssm_dt.bias"), sd[la + "dt_bias"][tiled])
    np.testing.assert_allclose(g("blk.0.ssm_a"), -np.exp(sd[la + "A_log"][tiled]), rtol=1e-6)
    conv = sd[la + "conv1d.weight"][:, 0, :]
    np.testing.assert_array_equal(g("blk.0.ssm_conv1d.weight"), np.concatenate([conv[:64], conv[64:][rows]]))
    np.testing.assert_array_equal(g("blk.0.ssm_norm.weight"), sd[la + "norm.weight"])     # no +1
    # (1+w) norms
    for gg, hh in (("blk.2.hc_attn_norm", "model.layers.2.attn_hyper_connection.hc_norm"),
                   ("output_hc_norm", "model.hyper_connection_mixer.hc_norm"),
                   ("blk.3.attn_q_norm", "model.layers.3.self_attn.q_norm"),
                   ("blk.3.indexer.k_norm", "model.layers.3.self_attn.indexer.k_layernorm"),
                   ("blk.1.ple_norm_conv", "model.layers.1.ple.norm_conv")):
        np.testing.assert_array_equal(g(gg + ".weight"), sd[hh + ".weight"] + np.float32(1))
    # QSA: q_proj as is, index_qk_proj split
    at = "model.layers.3.self_attn."
    np.testing.assert_array_equal(g("blk.3.attn_q.weight"), sd[at + "q_proj.weight"])
    np.testing.assert_array_equal(g("blk.3.indexer.q_proj.weight"), sd[at + "indexer.index_qk_proj.weight"][:32])
    np.testing.assert_array_equal(g("blk.3.indexer.k_proj.weight"), sd[at + "indexer.index_qk_proj.weight"][32:])
    # experts stacked in expert order
    for e in (0, 5):
        m = f"model.layers.2.mlp.experts.{e}."
        np.testing.assert_array_equal(g("blk.2.ffn_gate_exps.weight")[e], sd[m + "gate_proj.weight"])
        np.testing.assert_array_equal(g("blk.2.ffn_up_exps.weight")[e], sd[m + "up_proj.weight"])
        np.testing.assert_array_equal(g("blk.2.ffn_down_exps.weight")[e], sd[m + "down_proj.weight"])
    # PLE: shards concatenated in index order, conv squeezed
    p = "model.layers.1.ple."
    shards = [sd[f"{p}ple_embedding.ngram_embedding.shard_{i}.weight"] for i in range(cfg["split_ngram_parts"])]
    np.testing.assert_array_equal(g("per_layer_token_embd.weight"), np.concatenate(shards))
    np.testing.assert_array_equal(g("blk.1.ple_conv1d.weight"), sd[p + "conv1d.weight"][:, 0, :])


# ------------------------------------------------------------------------------------------ (b) the oracle

def test_llama_cpp_f32_matches_transformers(f32, prompt, ref_logits):
    got = _llama_logits(f32, prompt)
    diff = np.abs(got - ref_logits).max()
    print(f"llama.cpp f32 vs transformers fp32: max|dlogit| {diff:.3g} over {len(prompt)} positions")
    assert diff <= F32_TOL
    assert (got.argmax(1) == ref_logits.argmax(1)).all()


def test_oracle_detects_wrong_ple_eos(f32, work, prompt, ref_logits):
    """The same file with llama.cpp's choice of PLE EOS (the last list entry) fails the oracle: the parity
    test above can see that bug."""
    bad = work / "tiny-f32-eos-last.gguf"
    shutil.copy(f32, bad)
    r = GGUFReader(str(bad), "r+")
    f = r.fields["qwen4exp.ple.eos_token_id"]
    f.parts[f.data[0]][0] = 302
    r.data.flush()
    del r
    assert np.abs(_llama_logits(bad, prompt) - ref_logits).max() > 0.1


# ------------------------------------------------------------------------------------------ (c) q8_0

def test_q8_0_types_and_blocks(q8, f32):
    _, t8 = _fields(q8)
    _, t32 = _fields(f32)
    for name, t in t8.items():
        shape = tuple(int(d) for d in t.shape)
        if len(shape) == 1 or name.endswith("_norm.weight") or "ffn_gate_inp" in name or "ssm_conv1d" in name \
                or not name.endswith(".weight"):
            want = QT.F32
        elif shape[0] % 32:
            want = QT.F16
        else:
            want = QT.Q8_0
        assert t.tensor_type == want, name
        ref = np.asarray(t32[name].data, dtype=np.float32)
        if want == QT.Q8_0:   # bit-identical to gguf's quantizer
            assert np.array_equal(np.asarray(t.data).reshape(-1), gq.quantize(ref, QT.Q8_0).reshape(-1)), name
        elif want == QT.F16:
            assert np.array_equal(np.asarray(t.data), ref.astype(np.float16)), name
    assert t8["blk.0.ffn_down_exps.weight"].tensor_type == QT.Q8_0
    assert t8["blk.1.ple_conv1d.weight"].tensor_type == QT.F16           # rows of 4 values


def test_llama_cpp_q8_0_top1(q8, prompt, ref_logits):
    got = _llama_logits(q8, prompt)
    agree = float((got.argmax(1) == ref_logits.argmax(1)).mean())
    print(f"llama.cpp q8_0 vs transformers fp32: top-1 {agree:.3f}, max|dlogit| {np.abs(got - ref_logits).max():.3g}")
    assert np.isfinite(got).all()
    assert agree >= Q8_TOP1_MIN


def test_f16_bf16(hf, work, f32):
    _, t32 = _fields(f32)
    for outtype, qt in (("f16", QT.F16), ("bf16", QT.BF16)):
        out = work / f"tiny-{outtype}.gguf"
        convert(str(hf), str(out), outtype)
        _, t = _fields(out)
        a, b = t["blk.3.attn_q.weight"], t["blk.1.ple_conv1d.weight"]
        assert a.tensor_type == qt and b.tensor_type == qt
        assert t["blk.3.attn_q_norm.weight"].tensor_type == QT.F32
        ref = np.asarray(t32["blk.3.attn_q.weight"].data, dtype=np.float32)
        assert np.array_equal(np.asarray(a.data).reshape(-1).view(np.uint8),
                              gq.quantize(ref, qt).reshape(-1).view(np.uint8))


# ------------------------------------------------------------------------------------------ checkpoint layouts

def _rewrite(src: Path, dst: Path, rename, extra: dict | None = None, config=None) -> None:
    from safetensors.numpy import load_file, save_file
    shutil.copytree(src, dst)
    sd = load_file(str(src / "model.safetensors"))
    out = {rename(k): v for k, v in sd.items()}
    out.update(extra or {})
    os.remove(dst / "model.safetensors")
    half = sorted(out)[: len(out) // 2]          # two files, as sharded checkpoints are
    save_file({k: out[k] for k in half}, str(dst / "model-00001-of-00002.safetensors"))
    save_file({k: v for k, v in out.items() if k not in half}, str(dst / "model-00002-of-00002.safetensors"))
    if config:
        c = json.loads((src / "config.json").read_text())
        (dst / "config.json").write_text(json.dumps(config(c)))


def test_fused_experts_and_multimodal_layout_give_the_same_file(hf, work, f32):
    """Experts stored fused, the text model under model.language_model.* with a nested text_config, MTP and
    vision tensors present (dropped), two safetensors files: the same GGUF bytes."""
    fused = work / "fused" / "tiny"
    shutil.copytree(hf, fused)
    _tool()._fuse_experts(str(fused))
    mm = work / "mm" / "tiny"
    _rewrite(fused, mm, lambda k: k.replace("model.", "model.language_model.", 1) if k.startswith("model.") else k,
             extra={"mtp.layers.0.mlp.gate.weight": np.ones((8, 64), np.float32),
                    "model.visual.patch_embed.weight": np.ones((4, 4), np.float32)},
             config=lambda c: {"architectures": ["Qwen4ExpForConditionalGeneration"], "model_type": "qwen4_exp",
                               "text_config": c, "vision_config": {}})
    for d in (fused, mm):
        out = d.parent / "out.gguf"
        convert(str(d), str(out), "f32")
        assert out.read_bytes() == f32.read_bytes(), d


def test_silu_gate_recorded(hf, work):
    d = work / "silu" / "tiny"
    shutil.copytree(hf, d)
    c = json.loads((d / "config.json").read_text())
    del c["output_gate_type"]               # absent: transformers falls back to hidden_act (silu)
    (d / "config.json").write_text(json.dumps(c))
    out = d.parent / "silu.gguf"
    convert(str(d), str(out), "f32")
    assert _fields(out)[0]["strata.gdn_output_gate"] == "silu"


def test_errors_name_the_problem(hf, work):
    d = work / "broken" / "tiny"
    _rewrite(hf, d, lambda k: k)
    from safetensors.numpy import load_file, save_file
    f = d / "model-00002-of-00002.safetensors"
    part = load_file(str(f))
    shard = next(k for k in part if "shard_2" in k) if any("shard_2" in k for k in part) else None
    if shard is None:
        f = d / "model-00001-of-00002.safetensors"
        part = load_file(str(f))
        shard = next(k for k in part if "shard_2" in k)
    del part[shard]
    save_file(part, str(f))
    with pytest.raises(ConvertError, match="PLE shards"):
        convert(str(d), str(work / "broken.gguf"), "f32")
    assert not (work / "broken.gguf").exists() and not (work / "broken.gguf.tmp").exists()

    from click.testing import CliRunner

    from pyrunner.cli import main
    d2 = work / "notok" / "tiny"
    shutil.copytree(hf, d2)
    os.remove(d2 / "tokenizer.json")
    res = CliRunner().invoke(main, ["convert", str(d2), "-o", str(work / "x.gguf"), "-q"])
    assert res.exit_code == 1 and "no tokenizer.json" in res.output
    res = CliRunner().invoke(main, ["convert", str(hf), "-o", str(work / "cli.gguf"), "--outtype", "q8_0", "-q"])
    assert res.exit_code == 0, res.output
    assert "Q8_0" in res.output and (work / "cli.gguf").stat().st_size > 0


def test_bf16_checkpoint(hf, work, sd):
    """A checkpoint stored in bfloat16 (fused experts): every value is the bf16 value, widened exactly."""
    from safetensors.torch import load_file, save_file
    d = work / "bf16" / "tiny"
    shutil.copytree(hf, d)
    _tool()._fuse_experts(str(d))
    f = d / "model.safetensors"
    save_file({k: (v.to(torch.bfloat16) if v.is_floating_point() else v) for k, v in load_file(str(f)).items()},
              str(f), metadata={"format": "pt"})
    out = d.parent / "bf16.gguf"
    convert(str(d), str(out), "f32")
    _, t = _fields(out)

    def bf(a):
        return torch.from_numpy(np.ascontiguousarray(a)).to(torch.bfloat16).float().numpy()
    np.testing.assert_array_equal(np.asarray(t["token_embd.weight"].data), bf(sd["model.embed_tokens.weight"]))
    np.testing.assert_array_equal(np.asarray(t["blk.3.ffn_up_exps.weight"].data)[6],
                                  bf(sd["model.layers.3.mlp.experts.6.up_proj.weight"]))
    np.testing.assert_array_equal(np.asarray(t["blk.3.ffn_down_exps.weight"].data)[6],
                                  bf(sd["model.layers.3.mlp.experts.6.down_proj.weight"]))
    np.testing.assert_array_equal(np.asarray(t["blk.1.ple_norm_key.weight"].data),
                                  bf(sd["model.layers.1.ple.norm_key.weight"]) + np.float32(1))


@pytest.mark.parametrize("outtype", ["f32", "q8_0"])
def test_streams_tensor_by_tensor(hf, work, outtype):
    """Peak Python/numpy allocation stays well below the checkpoint size (measured 0.15x at f32, 0.26x at
    q8_0: the largest single tensor plus the tokenizer metadata); holding all tensors would be >= 1x."""
    import tracemalloc
    size = (hf / "model.safetensors").stat().st_size
    tracemalloc.start()
    try:
        convert(str(hf), str(work / f"stream-{outtype}.gguf"), outtype)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 0.5 * size, (peak, size)
