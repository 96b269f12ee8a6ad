"""model_oracles.py — the reference side of the model parity tests (tests/test_model.py, tests/test_bench_model.py).

* make_hf(): a tiny random transformers Qwen4Exp checkpoint (tools/make_tiny_hf.py's topology and randomisation,
  with config fields overridden: gate, QSA budget, widths).
* HFReference: transformers fp32 logits for a whole sequence in one forward, plus, for every position, whether the
  reference's QSA block selection had a score tie at the cut (see qsa_ties()).
* llama_logits(), llama_text_logits(), llama_quantize(), ggml_quantize(), llama_sampler_chains(): llama.cpp
  (llama-cpp-python) as an oracle, each call in a child process (pyrunner/llama_child.py): its crash fails the
  test with a message naming the file and the signal, never kills pytest.
* prompt(), kl(): the small pieces the tests share.

QSA tie rule. transformers selects blocks with torch.topk, which has no tie order; Strata breaks ties by descending
score, then ascending block index. Where two blocks score the same at the cut (the last selected and the first
unselected), the reference's choice is arbitrary, so a position with such a tie cannot be compared exactly. The
block scores are recomputed here from spec/qwen4exp-math.md §8.2 with the indexer's own weights and the inputs a
forward hook captured; where the recomputation has no tie it must select the same token set as transformers did
(asserted, so the recomputation is checked on every position it clears).
"""
from __future__ import annotations

import functools
import importlib
import importlib.util
import math
from pathlib import Path

import numpy as np

from pyrunner import llama_child

ROOT = Path(__file__).resolve().parents[1]

# Two block scores closer than this (relative to the larger) count as tied: exact ties (ReLU zeros) plus scores
# whose order could flip between two fp32 evaluations that round differently (the recomputation here, Strata).
TIE_RTOL = 1e-5
# tools/make_tiny_hf.py's tokenizer: 300 byte/merge tokens, then <|endoftext|> 300, <|im_start|> 301,
# <|im_end|> 302; eos_token_id = [300, 302] (the PLE resets on the first).
N_TEXT_TOKENS = 300
EOS0, EOS_LAST = 300, 302


@functools.lru_cache(maxsize=None)
def tiny_hf_tool():
    """tools/make_tiny_hf.py as a module (loaded once per process)."""
    spec = importlib.util.spec_from_file_location("make_tiny_hf", ROOT / "tools" / "make_tiny_hf.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def make_hf(out_dir: Path, seed: int = 0, gate: str = "sigmoid", budget: int = 64, mtp: bool = False,
            **overrides) -> Path:
    """make_tiny_hf.make() with config fields overridden (its make() has fixed widths); mtp: with the MTP head's
    mtp.* tensors (make_tiny_hf.add_mtp)."""
    torch = importlib.import_module("torch")
    transformers = importlib.import_module("transformers")
    tool = tiny_hf_tool()
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    ids = tool.build_tokenizer(str(out_dir))
    cfg = tool.tiny_config(gate, budget, [ids["<|endoftext|>"], ids["<|im_end|>"]], ids["<|endoftext|>"])
    cfg.update(overrides)
    torch.manual_seed(seed)
    model = transformers.Qwen4ExpForCausalLM(transformers.Qwen4ExpTextConfig(**cfg)).eval()
    tool.randomise(model, seed)
    model.save_pretrained(str(out_dir))
    if mtp:
        tool.add_mtp(str(out_dir), cfg, seed)
    return out_dir


def prompt(seed: int, n: int, eos_every: int = 29) -> list[int]:
    """n random text ids with both EOS ids inside: eos0 (the PLE reset) and the last EOS id (which must not reset
    it, as llama.cpp's own converter would make it)."""
    rng = np.random.default_rng(seed)
    ids = [int(x) for x in rng.integers(0, N_TEXT_TOKENS, n)]
    for i, p in enumerate(range(11, n, eos_every)):
        ids[p] = EOS0 if i % 2 == 0 else EOS_LAST
    return ids


# ------------------------------------------------------------------------------------------------ transformers

class HFReference:
    """transformers fp32 on one checkpoint folder."""

    def __init__(self, hf_dir: Path):
        self.torch = importlib.import_module("torch")
        from transformers import AutoModelForCausalLM
        self.model = AutoModelForCausalLM.from_pretrained(str(hf_dir), dtype=self.torch.float32).eval()
        self.config = self.model.config
        self.indexers = [layer.self_attn.indexer for layer in self.model.model.layers
                         if hasattr(getattr(layer, "self_attn", None), "indexer")]

    def logits(self, ids: list[int]) -> np.ndarray:
        with self.torch.no_grad():
            return self.model(self.torch.tensor([ids])).logits[0].float().numpy()

    def capture_indexers(self, ids: list[int]) -> tuple[np.ndarray, list[tuple]]:
        """Logits (T, V) of one forward and, per QSA layer, (indexer module, its input hidden states, its output
        selection mask), captured by forward hooks."""
        captured = []

        def hook(module, args, kwargs, output):
            captured.append((module, args[0] if args else kwargs["hidden_states"], output))

        handles = [m.register_forward_hook(hook, with_kwargs=True) for m in self.indexers]
        try:
            logits = self.logits(ids)
        finally:
            for h in handles:
                h.remove()
        if len(captured) != len(self.indexers):
            raise AssertionError(f"captured {len(captured)} indexer calls for {len(self.indexers)} QSA layers")
        return logits, captured

    def logits_and_ties(self, ids: list[int]) -> tuple[np.ndarray, np.ndarray, dict]:
        """Logits (T, V) of one forward, a bool (T,) marking positions where a QSA layer's selection had a tie at
        the cut, and counts: {"positions", "binding" (positions where some QSA layer selected fewer blocks than it
        had), "ties", "checked" (binding positions whose recomputed selection was compared and equal)}.
        With the tiny topology's single QSA layer last, a tie at position t can change only logits row t."""
        logits, captured = self.capture_indexers(ids)
        ties = np.zeros(len(ids), dtype=bool)
        binding = np.zeros(len(ids), dtype=bool)
        checked = 0
        for module, hs, mask in captured:
            t, b, c = qsa_ties(module, self.config, hs, mask)
            ties |= t
            binding |= b
            checked += c
        return logits, ties, {"positions": len(ids), "binding": int(binding.sum()), "ties": int(ties.sum()),
                              "checked": checked}


def _rms_1pw(x, w, eps):
    """N1: x / rms(x) * (1 + w), per last axis, fp32 (spec §2)."""
    return x * (1.0 / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)) * (1.0 + w)


def _rope(x, pos, rd, theta):
    """Partial NeoX RoPE on the first rd dims (pairs i, i + rd/2), angles pos * inv_freq in fp32 (spec §1.4)."""
    inv = (1.0 / (theta ** (np.arange(0, rd, 2, dtype=np.float32) / rd))).astype(np.float32)
    ang = pos.astype(np.float32)[:, None] * inv[None, :]
    cos, sin = np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)
    shape = (len(pos),) + (1,) * (x.ndim - 2) + (rd // 2,)
    cos, sin = cos.reshape(shape), sin.reshape(shape)
    out = x.copy()
    a, b = x[..., : rd // 2], x[..., rd // 2: rd]
    out[..., : rd // 2] = a * cos - b * sin
    out[..., rd // 2: rd] = b * cos + a * sin
    return out


def qsa_ties(module, config, hidden_states, output_mask) -> tuple[np.ndarray, np.ndarray, int]:
    """One QSA layer of one unpadded, uncached forward (positions 0..T-1): recompute the block scores of spec §8.2
    from the indexer's weights and its captured input, mark positions with a tie at the cut, and assert that every
    binding position without a tie selects the token set transformers selected (its output mask)."""
    f32 = np.float32
    hs = hidden_states[0].detach().float().numpy()                      # (T, H)
    T = hs.shape[0]
    nI, dI = module.index_n_heads, module.index_head_dim
    r, k_blocks = module.compress_ratio, module.block_topk
    eps = f32(config.rms_norm_eps)
    rp = config.rope_parameters
    rd = int(config.head_dim * rp.get("partial_rotary_factor", 1.0))
    theta = float(rp["rope_theta"])
    w = module.index_qk_proj.weight.detach().float().numpy()
    wq = module.q_layernorm.weight.detach().float().numpy()
    wk = module.k_layernorm.weight.detach().float().numpy()
    qk = hs @ w.T
    q = _rms_1pw(qk[:, : nI * dI].reshape(T, nI, dI), wq, eps)
    q = _rope(q, np.arange(T), rd, theta)                                # (T, nI, dI)
    raw = qk[:, nI * dI: (nI + 1) * dI]                                 # (T, dI): no norm, no RoPE per token
    nb_max = T // r
    pooled = raw[: nb_max * r].reshape(nb_max, r, dI).mean(axis=1, dtype=f32)
    kb = _rope(_rms_1pw(pooled, wk, eps), np.arange(nb_max) * r, rd, theta)    # (nb, dI)
    scores_all = np.maximum(np.einsum("thd,bd->tbh", q, kb), 0).sum(-1) / f32(math.sqrt(dI))   # (T, nb)
    sel = output_mask[0, 0].detach().numpy()                             # (T, kv_len) bool
    ties = np.zeros(T, dtype=bool)
    binding = np.zeros(T, dtype=bool)
    checked = 0
    for t in range(T):
        n = t + 1
        nb = n // r
        if nb <= k_blocks:
            continue                                                     # dense: every visible token
        binding[t] = True
        s = scores_all[t, :nb]
        order = sorted(range(nb), key=lambda b: (-s[b], b))
        last, first_out = s[order[k_blocks - 1]], s[order[k_blocks]]
        if last - first_out <= TIE_RTOL * max(abs(last), abs(first_out)):
            ties[t] = True
            continue
        want = set()
        for b in order[:k_blocks]:
            want.update(range(b * r, b * r + r))
        want.update(range(nb * r, n))
        got = set(np.nonzero(sel[t])[0].tolist())
        if got != want:
            raise AssertionError(f"QSA layer {module.layer_idx} position {t}: the recomputed block scores select "
                                 f"{sorted(want)}, transformers selected {sorted(got)}")
        checked += 1
    return ties, binding, checked


# ------------------------------------------------------------------------------------------------ llama.cpp

# Every use of llama.cpp runs in a child process (pyrunner/llama_child.py): a crash of the oracle is a test failure
# (LlamaCrash, naming the file and the signal), never the death of pytest. The functions named _in_child_* are the
# child sides; each public function here is one child call.

def llama_logits(path: Path, prompts: list[list[int]], n_ctx: int = 512) -> list[np.ndarray]:
    """llama.cpp's per-position logits for each prompt (f32 KV, no flash attention), one context reset between."""
    return llama_child.logits(path, prompts, n_ctx=n_ctx)


def _in_child_quantize(src: str, dst: str, ftype_name: str) -> None:
    import llama_cpp
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{ftype_name}")
    params.nthread = 2
    rc = llama_cpp.llama_model_quantize(src.encode(), dst.encode(), params)
    if rc != 0:
        raise RuntimeError(f"llama_model_quantize({src} -> {ftype_name}) returned {rc}")


def llama_quantize(src: Path, dst: Path, ftype_name: str) -> Path:
    """llama.cpp's own quantizer (llama_model_quantize) with an ftype, e.g. "Q4_K_M" -> LLAMA_FTYPE_MOSTLY_Q4_K_M."""
    llama_child.call(_in_child_quantize, (str(src), str(dst), ftype_name), gguf=src)
    return dst


def _in_child_text_logits(path: str, text: bytes) -> np.ndarray:
    llm = llama_child.open_llama(path, n_ctx=64)
    try:
        ids = llm.tokenize(text, add_bos=False)
        if llm.detokenize(ids) != text:
            raise AssertionError(f"llama.cpp's tokenizer does not round-trip {text!r}: {ids} -> "
                                 f"{llm.detokenize(ids)!r}")
        llm.eval(ids)
        return np.array(llm.scores[:len(ids)], dtype=np.float32)
    finally:
        llm.close()


def llama_text_logits(path: Path, text: bytes) -> np.ndarray:
    """llama.cpp tokenizes text with the file's own tokenizer (asserted to round-trip) and returns its
    per-position logits."""
    return llama_child.call(_in_child_text_logits, (str(path), text), gguf=path)


def _in_child_ggml_quantize(jobs: list) -> list[bytes]:
    import ctypes
    import os

    import llama_cpp
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    libdir = os.path.join(os.path.dirname(llama_cpp.__file__), "lib")
    names = sorted(n for n in os.listdir(libdir) if n.startswith("libggml-base"))
    if not names:
        raise FileNotFoundError(f"no libggml-base in {libdir}")
    f = ctypes.CDLL(os.path.join(libdir, names[0])).ggml_quantize_chunk
    f.restype = ctypes.c_size_t
    f.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64,
                  ctypes.c_void_p]
    out = []
    for type_name, x, imatrix in jobs:
        t = GGMLQuantizationType[type_name]
        bs, ts = GGML_QUANT_SIZES[t]
        x = np.ascontiguousarray(x, dtype=np.float32)
        rows, n = x.shape
        if imatrix is None and type_name == "IQ2_XS":
            imatrix = np.ones(n, np.float32)  # llama.cpp refuses IQ2_XS without one; uniform = none
        im = None if imatrix is None else np.ascontiguousarray(imatrix, dtype=np.float32)
        blocks = np.zeros(rows * (n // bs) * ts, dtype=np.uint8)
        written = f(int(t), x.ctypes.data, blocks.ctypes.data, 0, rows, n, None if im is None else im.ctypes.data)
        if written != blocks.size:
            raise AssertionError(f"ggml_quantize_chunk({type_name}) wrote {written} bytes, expected {blocks.size}")
        out.append(blocks.tobytes())
    return out


def ggml_quantize(jobs: list[tuple[str, np.ndarray, np.ndarray | None]]) -> list[bytes]:
    """llama.cpp's own quantizer (ggml_quantize_chunk of the libggml-base bundled with llama-cpp-python) on each
    (type name, rows (R, N) float32, importance matrix (N,) or None): the blocks, in one child process."""
    return llama_child.call(_in_child_ggml_quantize, (jobs,))


def _in_child_sampler_chains(n: int, cases: list) -> list:
    import ctypes

    import llama_cpp as L
    out = []
    for x, hist, p in cases:
        chain = L.llama_sampler_chain_init(L.llama_sampler_chain_default_params())
        if p.logit_bias:
            lb = (L.llama_logit_bias * len(p.logit_bias))(
                *[L.llama_logit_bias(t, b) for t, b in p.logit_bias.items()])
            L.llama_sampler_chain_add(chain, L.llama_sampler_init_logit_bias(n, len(lb), lb))
        L.llama_sampler_chain_add(chain, L.llama_sampler_init_penalties(
            n, p.repeat_last_n, p.repeat_penalty, p.frequency_penalty, p.presence_penalty))
        if p.temperature <= 0:
            L.llama_sampler_chain_add(chain, L.llama_sampler_init_greedy())
        else:
            L.llama_sampler_chain_add(chain, L.llama_sampler_init_top_k(p.top_k))
            L.llama_sampler_chain_add(chain, L.llama_sampler_init_top_p(p.top_p, 1))
            L.llama_sampler_chain_add(chain, L.llama_sampler_init_min_p(p.min_p, 1))
            L.llama_sampler_chain_add(chain, L.llama_sampler_init_temp(p.temperature))
        for t in hist:
            L.llama_sampler_accept(chain, int(t))
        arr = (L.llama_token_data * n)(*[L.llama_token_data(i, float(v), 0.0) for i, v in enumerate(x)])
        cur = L.llama_token_data_array(data=arr, size=n, selected=-1, sorted=False)
        L.llama_sampler_apply(chain, ctypes.byref(cur))
        if p.temperature <= 0:
            out.append(int(cur.data[cur.selected].id))
        else:
            out.append({int(cur.data[i].id): float(cur.data[i].logit) for i in range(cur.size)
                        if np.isfinite(cur.data[i].logit)})
        L.llama_sampler_free(chain)
    return out


def llama_sampler_chains(n: int, cases: list) -> list:
    """llama.cpp's own sampler chain (logit bias, penalties, then greedy, or top-k, top-p, min-p, temp) over a
    vocabulary of n, for each (logits (n,), history ids, pyrunner.sampling.SamplingParams with repeat_last_n >= 0):
    the greedy pick (an id), or the surviving {id: logit after temperature}. One child process for all cases."""
    return llama_child.call(_in_child_sampler_chains, (n, cases))


# ------------------------------------------------------------------------------------------------ metrics

def log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    m = x.max(-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(-1, keepdims=True))


def kl(ref_logits: np.ndarray, logits: np.ndarray) -> np.ndarray:
    """KL(ref || other) per position, in nats."""
    lp, lq = log_softmax(ref_logits), log_softmax(logits)
    return (np.exp(lp) * (lp - lq)).sum(-1)


def dequantized_copy(src: Path, dst: Path) -> Path:
    """The GGUF src with every tensor dequantized to F32 by Strata's dequantizer (bit-exact against gguf.quants)
    and every `X.scale` multiplied into X.weight: the same weights, so that an engine's own activation quantization
    can be told apart from how it reads the blocks."""
    import gguf

    from pyrunner import quant
    from pyrunner.gguf import GGUFFile

    r, g = gguf.GGUFReader(str(src)), GGUFFile(str(src))
    w = gguf.GGUFWriter(str(dst), "qwen4exp")
    for k, f in r.fields.items():
        if k.startswith("GGUF.") or k == "general.architecture":
            continue
        vt = f.types[0]
        w.add_key_value(k, f.contents(), vt, sub_type=f.types[1] if vt == gguf.GGUFValueType.ARRAY else None)
    tensors = g.tensors()
    names = {t["name"] for t in tensors}
    for t in tensors:
        if t["name"].endswith(".scale"):
            continue
        n = int(np.prod(t["shape"]))
        a = quant.dequantize(t["type"], bytes(g.tensor_data(t["name"])), n)
        sname = t["name"][: -len(".weight")] + ".scale"
        if sname in names:
            s = np.frombuffer(bytes(g.tensor_data(sname)), dtype="<f4")
            a = (a.reshape(len(s), -1) * s[:, None]).reshape(-1)
        w.add_tensor(t["name"], a.reshape(list(reversed(t["shape"]))))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dst


def greedy_run(model, prompt: list[int], steps: int) -> tuple[list[int], np.ndarray]:
    """A fresh session of `model`: the prompt in one eval, then `steps` argmax tokens one at a time.
    Returns (the tokens, the logits rows: after the prompt and after each token)."""
    s = model.session()
    logits = s.eval(prompt)
    toks, rows = [], [logits]
    for _ in range(steps):
        t = int(np.argmax(logits))
        toks.append(t)
        logits = s.eval([t])
        rows.append(logits)
    return toks, np.array(rows)
