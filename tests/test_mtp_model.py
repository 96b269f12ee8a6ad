"""The MTP head in the file format and in C (spec/qwen4exp-mtp.md): convert, load, strata_session_mtp.

There is no engine oracle for the MTP step (transformers 5.23 drops `mtp.*`; llama-cpp-python 0.3.36's llama.cpp
has no qwen4exp MTP), so the step is checked against a PyTorch float64 reference written here from the spec
(§2.2 / §5: fusion with ONE RMS over the whole hidden row, one QSA + MoE layer with its own cache, its own mixer,
the trunk's embedding and LM head) on the tiny checkpoint's own `mtp.*` tensors (tools/make_tiny_hf.py --mtp).

(1) convert: blk.{L} (trunk block names + nextn.*) with the spec's shapes, block_count L+1, nextn_predict_layers 1,
    compress_ratios[L] = the trunk's QSA ratio; --no-mtp: none of it, and llama.cpp loads that file and agrees
    with Strata.
(2) load: both files; the trunk's logits and pre-mixer rows are identical with and without the MTP block; a
    compress ratio of 0 for the MTP block (upstream's files) runs QSA at the trunk's ratio; broken MTP tensors and
    more than one MTP layer are errors naming them.
(3) the step against the reference: a draft-extend over many rows, then chained single rows feeding back the
    returned chain; with the MTP's QSA selection binding (budget 8 = 2 blocks of 4, more rows than that); a second
    draft-extend from pos0 > 0 (inside a block) replacing rows; inside the session's row cap and in chunks of it.
(4) errors: no MTP block, bad arguments; refused calls leave the MTP cache as it was.
(5) `strata quantize` recipes on the MTP file: the MTP block quantized like a trunk block, the trunk's types
    unchanged by it, and the quantized head runs.
"""
from __future__ import annotations

import importlib
import inspect
import json
import math
from pathlib import Path

import numpy as np
import pytest

import model_oracles as mo

torch = importlib.import_module("torch")
importlib.import_module("transformers")
from safetensors.torch import load_file  # noqa: E402

import pyrunner  # noqa: E402
from pyrunner._native import StrataError, ffi, lib  # noqa: E402
from pyrunner.convert import convert  # noqa: E402
from pyrunner.gguf import GGUFFile  # noqa: E402
from pyrunner.model import Model  # noqa: E402

BUDGET = 8              # indexer budget: 2 blocks of 4 (+ the tail), so QSA binds from 12 visible rows on
SEQ = 24                # trunk tokens
TOL = 1e-4              # max |dlogit| / max(1, max |logit|) against the float64 reference (fp32 engine)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    work = tmp_path_factory.mktemp("mtp")
    hf = mo.make_hf(work / "hf", seed=3, budget=BUDGET, mtp=True)
    g, g0 = work / "mtp.gguf", work / "nomtp.gguf"
    convert(str(hf), str(g), "f32")
    convert(str(hf), str(g0), "f32", mtp=False)
    with open(hf / "config.json") as f:
        cfg = json.load(f)
    return dict(work=work, hf=hf, gguf=g, gguf0=g0, cfg=cfg)


def _model(path, **kw):
    return Model(str(path), threads=2, n_ctx=64, kv_type="f32", **kw)


# ------------------------------------------------------------------------------------------ the reference

class TorchMTP:
    """spec/qwen4exp-mtp.md §2.2 / §5 in float64 from the HF checkpoint's tensors, with the MTP layer's cache as
    per-position rows (K after norm + RoPE, V, raw index key) that a call at pos0 replaces from pos0 on. QSA as the
    trunk's (spec/qwen4exp-math.md §8): blocks of r raw keys mean-pooled, normed, roped at the block's first
    position; the budget/r best blocks by sum_h relu(q_h . K_b) / sqrt(dI) (ties: lower block) plus the tail."""

    def __init__(self, hf_dir: Path, cfg: dict, n_ctx: int):
        self.w = {k: v.double() for k, v in load_file(str(hf_dir / "model.safetensors")).items()}
        c = self.c = cfg
        self.H, self.hc = c["hidden_size"], c["hc_count"]
        self.nh, self.nkv, self.hd = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
        self.ni, self.di = c["indexer_n_heads"], c["indexer_head_dim"]
        self.r, self.budget = c["indexer_compress_ratio"], c["indexer_budget"]
        rp = c["rope_parameters"]
        self.n_rot = int(self.hd * rp["partial_rotary_factor"])
        self.theta = float(rp["rope_theta"])
        self.eps = c["rms_norm_eps"]
        self.K = torch.zeros(n_ctx, self.nkv, self.hd, dtype=torch.float64)
        self.V = torch.zeros_like(self.K)
        self.IK = torch.zeros(n_ctx, self.di, dtype=torch.float64)
        self.binding = 0                      # queries whose block selection was sparse
        self.grouped_hidden = False           # True: upstream llama.cpp's per-stream hidden norm (spec ⚠)

    def rms(self, x, w):
        """GemmaRMSNorm over the last axis: x / rms(x) * (1 + w) (w stored zero-centred)."""
        return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + self.eps) * (1.0 + w)

    def rope(self, x, pos):
        """Partial NeoX RoPE on the first n_rot dims (pairs i, i + n_rot/2) at position pos."""
        h = self.n_rot // 2
        inv = 1.0 / self.theta ** (torch.arange(0, self.n_rot, 2, dtype=torch.float64) / self.n_rot)
        cs, sn = torch.cos(pos * inv), torch.sin(pos * inv)
        a, b = x[..., :h].clone(), x[..., h:self.n_rot].clone()
        out = x.clone()
        out[..., :h] = a * cs - b * sn
        out[..., h:self.n_rot] = b * cs + a * sn
        return out

    def hc_mix(self, X, p, inject=True):
        """(block input, inject factors) of a hyper-connection module p over the stream state X [hc, H]."""
        w = self.w
        Xn = self.rms(X, w[f"{p}.hc_norm.weight"].view(self.hc, self.H))          # grouped: one RMS per stream
        a = torch.nn.functional.silu(w[f"{p}.input_mix_weight_down.weight"] @ Xn.reshape(-1) / self.hc)
        g = torch.sigmoid(w[f"{p}.input_mix_weight_up.weight"] @ a).view(self.hc, self.H)
        u = (g * Xn).mean(0)
        inj = 2 * torch.sigmoid(w[f"{p}.block_inject_weight.weight"] @ Xn.reshape(-1) / self.hc) if inject else None
        return u, inj

    def attn(self, m, P):
        w, a = self.w, "mtp.layers.0.self_attn"
        qg = (w[f"{a}.q_proj.weight"] @ m).view(self.nh, 2, self.hd)
        q = self.rope(self.rms(qg[:, 0], w[f"{a}.q_norm.weight"]), P)
        gate = qg[:, 1]
        self.K[P] = self.rope(self.rms((w[f"{a}.k_proj.weight"] @ m).view(self.nkv, self.hd), w[f"{a}.k_norm.weight"]), P)
        self.V[P] = (w[f"{a}.v_proj.weight"] @ m).view(self.nkv, self.hd)
        iqk = w[f"{a}.indexer.index_qk_proj.weight"] @ m
        iq = self.rope(self.rms(iqk[: self.ni * self.di].view(self.ni, self.di), w[f"{a}.indexer.q_layernorm.weight"]), P)
        self.IK[P] = iqk[self.ni * self.di:]
        n, r = P + 1, self.r
        nb, topk = n // r, self.budget // r
        if nb <= topk:
            keys = list(range(n))
        else:
            self.binding += 1
            pooled = self.IK[: nb * r].view(nb, r, self.di).mean(1)
            kb = torch.stack([self.rope(self.rms(pooled[b], w[f"{a}.indexer.k_layernorm.weight"]), b * r)
                              for b in range(nb)])
            s = torch.relu(kb @ iq.T).sum(-1) / math.sqrt(self.di)
            order = sorted(range(nb), key=lambda b: (-float(s[b]), b))
            keys = sorted([b * r + j for b in order[:topk] for j in range(r)] + list(range(nb * r, n)))
        grp = self.nh // self.nkv
        o = torch.empty(self.nh, self.hd, dtype=torch.float64)
        for h in range(self.nh):
            kk, vv = self.K[keys, h // grp], self.V[keys, h // grp]
            p = torch.softmax(kk @ q[h] / math.sqrt(self.hd), 0)
            o[h] = p @ vv
        o = o * torch.sigmoid(gate)
        return w[f"{a}.o_proj.weight"] @ o.reshape(-1)

    def moe(self, x):
        w, p, c = self.w, "mtp.layers.0.mlp", self.c
        fe = c["moe_intermediate_size"]
        pr = torch.softmax(w[f"{p}.gate.weight"] @ x, 0)
        top = sorted(range(len(pr)), key=lambda e: (-float(pr[e]), e))[: c["num_experts_per_tok"]]
        ws = pr[top] / pr[top].sum()
        y = torch.zeros_like(x)
        for wk, e in zip(ws, top):
            gu = w[f"{p}.experts.gate_up_proj"][e] @ x
            y = y + wk * (w[f"{p}.experts.down_proj"][e] @ (torch.nn.functional.silu(gu[:fe]) * gu[fe:]))
        sh = (w[f"{p}.shared_expert.down_proj.weight"]
              @ (torch.nn.functional.silu(w[f"{p}.shared_expert.gate_proj.weight"] @ x)
                 * (w[f"{p}.shared_expert.up_proj.weight"] @ x)))
        return y + torch.sigmoid(w[f"{p}.shared_expert_gate.weight"] @ x) * sh

    def step(self, h, tok, P):
        """One MTP row: hidden h (hc*H), next token tok, position P -> (logits, chain)."""
        w, L = self.w, "mtp.layers.0"
        u = w["mtp.fc_embedding.weight"] @ self.rms(w["model.embed_tokens.weight"][tok], w["mtp.pre_fc_norm_embedding.weight"])
        h = torch.as_tensor(h, dtype=torch.float64)
        if self.grouped_hidden:
            hn = self.rms(h.view(self.hc, self.H), w["mtp.pre_fc_norm_hidden.weight"].view(self.hc, self.H))
        else:
            hn = self.rms(h, w["mtp.pre_fc_norm_hidden.weight"]).view(self.hc, self.H)
        r = hn @ w["mtp.fc_hidden.weight"].T + u                       # ONE RMS over all hc*H values, then per stream
        m, inj = self.hc_mix(r, f"{L}.attn_hyper_connection")
        r = r + inj[:, None] * self.attn(m, P)
        m, inj = self.hc_mix(r, f"{L}.mlp_hyper_connection")
        r = r + inj[:, None] * self.moe(m)
        y, _ = self.hc_mix(r, "mtp.hyper_connection_mixer", inject=False)
        return (w["lm_head.weight"] @ y).numpy(), r.reshape(-1).numpy()

    def run(self, hidden, ids, pos0):
        out = [self.step(hidden[i], int(ids[i]), pos0 + i) for i in range(len(ids))]
        return np.stack([o[0] for o in out]), np.stack([o[1] for o in out])


def _err(got, want) -> float:
    return float(np.abs(got - want).max() / max(1.0, float(np.abs(want).max())))


def _trunk_hidden(sess, ids):
    """Strata's own pre-mixer rows of ids when eval can return them (strata_session_eval_ex), else random rows
    at the trunk's scale (the MTP step is a function of its inputs either way)."""
    if "hidden" in inspect.signature(sess.eval).parameters:
        _, hid = sess.eval(ids, all_logits=True, hidden=True)
        return hid, "trunk"
    rng = np.random.default_rng(0)
    return rng.standard_normal((len(ids), sess.model.n_hidden)).astype(np.float32), "random"


# ------------------------------------------------------------------------------------------ (1) convert

def test_convert_writes_the_mtp_block(tiny):
    c = tiny["cfg"]
    L, E, hc, R = c["num_hidden_layers"], c["hidden_size"], c["hc_count"], c["hc_lowrank"]
    f = GGUFFile(str(tiny["gguf"]))
    md = f.metadata()
    shapes = {t["name"]: t["shape"] for t in f.tensors()}         # ggml ne order
    assert md["qwen4exp.block_count"] == L + 1
    assert md["qwen4exp.nextn_predict_layers"] == 1
    ratios = md["qwen4exp.attention.compress_ratios"]
    assert len(ratios) == L + 1 and ratios[L] == c["indexer_compress_ratio"] == max(ratios[:L]) > 0
    assert md["qwen4exp.attention.recurrent_layers"][L] is False
    b = f"blk.{L}"
    W = hc * E
    want = {f"{b}.nextn.enorm.weight": [E], f"{b}.nextn.hnorm.weight": [W], f"{b}.nextn.eh_proj.weight": [2 * E, E],
            f"{b}.nextn.hc_head_norm.weight": [W], f"{b}.nextn.hc_head_down.weight": [W, R],
            f"{b}.nextn.hc_head_up.weight": [R, W]}
    for name, shp in want.items():
        assert shapes.get(name) == shp, (name, shapes.get(name))
    # the decoder block under the trunk's names and shapes (a trunk QSA block: layer L-1 in the tiny topology)
    trunk = {n[len(f"blk.{L - 1}."):]: s for n, s in shapes.items() if n.startswith(f"blk.{L - 1}.")}
    mtp = {n[len(b) + 1:]: s for n, s in shapes.items() if n.startswith(b + ".") and ".nextn." not in n}
    assert mtp == trunk and "indexer.k_proj.weight" in mtp and "ffn_gate_exps.weight" in mtp
    # folded (1+w) norms and the [fc_embedding | fc_hidden] concatenation
    sd = load_file(str(tiny["hf"] / "model.safetensors"))
    eh = np.frombuffer(bytes(f.tensor_data(f"{b}.nextn.eh_proj.weight")), "<f4").reshape(E, 2 * E)
    assert np.array_equal(eh[:, :E], sd["mtp.fc_embedding.weight"].numpy())
    assert np.array_equal(eh[:, E:], sd["mtp.fc_hidden.weight"].numpy())
    hn = np.frombuffer(bytes(f.tensor_data(f"{b}.nextn.hnorm.weight")), "<f4")
    assert np.allclose(hn, sd["mtp.pre_fc_norm_hidden.weight"].numpy() + 1, atol=0, rtol=1e-7)
    hh = np.frombuffer(bytes(f.tensor_data(f"{b}.nextn.hc_head_norm.weight")), "<f4")
    assert np.allclose(hh, sd["mtp.hyper_connection_mixer.hc_norm.weight"].numpy() + 1, atol=0, rtol=1e-7)


def test_no_mtp_file_is_the_trunk_and_llama_cpp_runs_it(tiny):
    c = tiny["cfg"]
    L = c["num_hidden_layers"]
    f = GGUFFile(str(tiny["gguf0"]))
    md = f.metadata()
    assert md["qwen4exp.block_count"] == L and "qwen4exp.nextn_predict_layers" not in md
    assert len(md["qwen4exp.attention.compress_ratios"]) == L
    assert not any(t["name"].startswith(f"blk.{L}.") for t in f.tensors())
    # short prompts: the trunk's QSA stays dense (<= 11 visible rows for budget 8), where llama.cpp agrees
    prompts = [mo.prompt(s, 11) for s in (1, 2)]
    ref = mo.llama_logits(tiny["gguf0"], prompts, n_ctx=64)
    with _model(tiny["gguf0"]) as m:
        for ids, want in zip(prompts, ref):
            got = m.session().eval(ids, all_logits=True)
            d = float(np.abs(got - want).max())
            print(f"\n--no-mtp file: max|dlogit| vs llama.cpp {d:.3g}")
            assert d <= 1e-3


# ------------------------------------------------------------------------------------------ (2) load

def test_mtp_block_does_not_change_the_trunk(tiny):
    ids = mo.prompt(7, SEQ)
    with _model(tiny["gguf"]) as m, _model(tiny["gguf0"]) as m0:
        assert m.n_layer == m0.n_layer == tiny["cfg"]["num_hidden_layers"]
        assert m.n_mtp == 1 and m0.n_mtp == 0
        assert m.n_hidden == m0.n_hidden == tiny["cfg"]["hc_count"] * tiny["cfg"]["hidden_size"]
        a, b = m.session(), m0.session()
        assert np.array_equal(a.eval(ids, all_logits=True), b.eval(ids, all_logits=True))
        if "hidden" in inspect.signature(a.eval).parameters:
            _, ha = a.eval([5, 6], all_logits=True, hidden=True)
            _, hb = b.eval([5, 6], all_logits=True, hidden=True)
            assert np.array_equal(ha, hb)
        # an MTP call does not disturb the trunk: the next eval is unchanged
        a.mtp(np.ones((3, m.n_hidden), np.float32), [1, 2, 3], 0, all_rows=True)
        assert np.array_equal(a.eval([9]), b.eval([9]))


def _rewrite(src: Path, dst: Path, drop=(), kv=None, reshape=None) -> Path:
    """A copy of the f32 GGUF src without the tensors in drop, with metadata values replaced (kv) and tensors
    given other shapes (reshape: {name: numpy shape})."""
    import gguf

    r = gguf.GGUFReader(str(src))
    w = gguf.GGUFWriter(str(dst), "qwen4exp")
    kv = kv or {}
    for k, f in r.fields.items():
        if k.startswith("GGUF.") or k == "general.architecture":
            continue
        vt = f.types[0]
        sub = f.types[1] if vt == gguf.GGUFValueType.ARRAY else None
        w.add_key_value(k, kv.get(k, f.contents()), vt, sub_type=sub)
    for t in r.tensors:
        if t.name in drop:
            continue
        a = np.array(t.data, dtype=np.float32).reshape(list(reversed([int(x) for x in t.shape])))
        if reshape and t.name in reshape:
            a = a.reshape(reshape[t.name])
        w.add_tensor(t.name, a)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dst


def test_mtp_ratio_zero_runs_qsa_at_the_trunk_ratio(tiny, capfd):
    c = tiny["cfg"]
    L = c["num_hidden_layers"]
    ratios = GGUFFile(str(tiny["gguf"])).metadata()["qwen4exp.attention.compress_ratios"]
    up = _rewrite(tiny["gguf"], tiny["work"] / "upstream-ratio.gguf",
                  kv={"qwen4exp.attention.compress_ratios": ratios[:L] + [0]})
    rng = np.random.default_rng(5)
    n = 20                                                         # > 12: the selection binds
    with _model(tiny["gguf"]) as m, _model(up) as mu:
        err = capfd.readouterr().err
        assert f"MTP block {L} has compress ratio 0" in err and "trunk's QSA ratio 4" in err
        hid = rng.standard_normal((n, m.n_hidden)).astype(np.float32)
        ids = mo.prompt(8, n)
        a = m.session().mtp(hid, ids, 0, all_rows=True)
        b = mu.session().mtp(hid, ids, 0, all_rows=True)
        assert np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1])


@pytest.mark.parametrize("case", ["missing", "shape", "two-layers", "no-indexer-key"])
def test_broken_mtp_block_is_a_format_error(tiny, case):
    c = tiny["cfg"]
    L, E = c["num_hidden_layers"], c["hidden_size"]
    b = f"blk.{L}"
    if case == "missing":
        args, want = dict(drop={f"{b}.nextn.eh_proj.weight"}), f"{b}.nextn.eh_proj.weight"
    elif case == "shape":
        args, want = dict(reshape={f"{b}.nextn.eh_proj.weight": (2 * E, E)}), f"{b}.nextn.eh_proj.weight"
    elif case == "two-layers":
        args, want = dict(kv={"qwen4exp.nextn_predict_layers": 2}), "nextn_predict_layers 2"
    else:
        args, want = dict(drop={f"{b}.indexer.k_proj.weight"}), f"{b}.indexer.k_proj.weight"
    bad = _rewrite(tiny["gguf"], tiny["work"] / f"bad-{case}.gguf", **args)
    with pytest.raises(StrataError) as e:
        _model(bad)
    assert want in str(e.value)
    kind = pyrunner.UnsupportedError if case == "two-layers" else pyrunner.FormatError
    assert isinstance(e.value, kind), type(e.value)


def test_hc_head_norm_as_ne_e_by_hc_loads(tiny):
    """Some builds store nextn.hc_head_norm as {E, hc} (spec §4): the same values in the same order."""
    c = tiny["cfg"]
    L, E, hc = c["num_hidden_layers"], c["hidden_size"], c["hc_count"]
    alt = _rewrite(tiny["gguf"], tiny["work"] / "head-norm-2d.gguf",
                   reshape={f"blk.{L}.nextn.hc_head_norm.weight": (hc, E)})
    hid = np.random.default_rng(1).standard_normal((4, hc * E)).astype(np.float32)
    with _model(tiny["gguf"]) as m, _model(alt) as ma:
        a = m.session().mtp(hid, [1, 2, 3, 4], 0, all_rows=True)
        b = ma.session().mtp(hid, [1, 2, 3, 4], 0, all_rows=True)
        assert np.array_equal(a[0], b[0])


# ------------------------------------------------------------------------------------------ (3) the step

@pytest.mark.parametrize("prefill_chunk", [None, 8], ids=["one-step", "rows-in-chunks-of-8"])
def test_mtp_step_matches_the_reference(tiny, prefill_chunk):
    c = tiny["cfg"]
    kw = {} if prefill_chunk is None else {"prefill_chunk": prefill_chunk}
    ids = mo.prompt(11, SEQ)
    with _model(tiny["gguf"], **kw) as m:
        sess = m.session()
        hid, source = _trunk_hidden(sess, ids)
        ref = TorchMTP(tiny["hf"], c, 64)
        errs = []
        # draft-extend: row j = (H_j, x_{j+1}) at position j, for j = 0 .. SEQ-2
        lg, ch = sess.mtp(hid[:-1], ids[1:], 0, all_rows=True)
        assert lg.shape == (SEQ - 1, m.n_vocab) and ch.shape == (SEQ - 1, m.n_hidden)
        rl, rc = ref.run(hid[:-1], ids[1:], 0)
        errs.append((_err(lg, rl), _err(ch, rc)))
        # the last row only (flags 0) is the same row: rerunning from pos0 = SEQ-2 rewrites just that one (one
        # row takes the dot-product kernels where many take the GEMM: equal up to rounding)
        l1, c1 = sess.mtp(hid[-2:-1], ids[-1:], SEQ - 2)
        assert _err(l1, lg[-1]) <= 1e-5 and _err(c1, ch[-1]) <= 1e-5
        # chained steps: the previous chain and a next token, one position further each
        g, gr = ch[-1], rc[-1]
        toks = mo.prompt(12, 6)
        for k, t in enumerate(toks):
            p = SEQ - 1 + k
            lo, g = sess.mtp(g[None], [t], p)
            rlo, rg = ref.run(gr[None], [t], p)
            gr = rg[0]
            errs.append((_err(lo, rlo[0]), _err(g, gr)))
        # a second draft-extend from inside a block (pos0 % r != 0) with other hidden rows: rows from pos0 on are
        # replaced (K/V, index keys, and the block summary that covered them); rows before pos0 are read
        p0 = 6
        hid2 = (hid[p0:-1] * 0.5 + np.roll(hid[p0:-1], 1, axis=1) * 0.5).astype(np.float32)
        lg2, ch2 = sess.mtp(hid2, ids[p0 + 1:], p0, all_rows=True)
        rl2, rc2 = ref.run(hid2, ids[p0 + 1:], p0)
        errs.append((_err(lg2, rl2), _err(ch2, rc2)))
        assert _err(lg2[-1], lg[-1]) > 1e-3      # the rewrite changed what later rows see
    worst_l, worst_c = max(e[0] for e in errs), max(e[1] for e in errs)
    print(f"\nMTP vs float64 reference ({source} hidden rows, {ref.binding} binding queries): "
          f"max rel|dlogit| {worst_l:.3g}, max rel|dchain| {worst_c:.3g}")
    assert ref.binding >= 10                     # the MTP layer's QSA selection was sparse in many rows
    assert worst_l <= TOL and worst_c <= TOL, errs


def test_reference_tells_grouped_hidden_norm_apart(tiny):
    """The test can fail: a head that normalised the hidden row per stream (upstream llama.cpp's graph_mtp,
    spec ⚠) differs from the reference by far more than TOL on these rows."""
    c = tiny["cfg"]
    rng = np.random.default_rng(2)
    E, hc = c["hidden_size"], c["hc_count"]
    hid = rng.standard_normal((6, hc * E)).astype(np.float32) * np.repeat(rng.uniform(0.2, 3, (6, hc)), E, 1).astype(np.float32)
    ids = mo.prompt(3, 6)
    with _model(tiny["gguf"]) as m:
        got, _ = m.session().mtp(hid, ids, 0, all_rows=True)
    ref = TorchMTP(tiny["hf"], c, 64)
    want, _ = ref.run(hid, ids, 0)
    grouped = TorchMTP(tiny["hf"], c, 64)
    grouped.grouped_hidden = True
    bad, _ = grouped.run(hid, ids, 0)
    assert _err(got, want) <= TOL
    assert _err(bad, want) > 100 * TOL


# ------------------------------------------------------------------------------------------ (4) errors

def test_mtp_on_a_model_without_the_head(tiny):
    with _model(tiny["gguf0"]) as m:
        with pytest.raises(pyrunner.UnsupportedError, match="no MTP block.*convert"):
            m.session().mtp(np.zeros((1, m.n_hidden), np.float32), [1], 0)


def test_mtp_bad_arguments_are_errors(tiny):
    with _model(tiny["gguf"]) as m:
        s = m.session()
        V, W = m.n_vocab, m.n_hidden
        hid = np.random.default_rng(4).standard_normal((4, W)).astype(np.float32)
        ids = np.array([1, 2, 3, 4], np.int32)
        before = s.mtp(hid, ids, 0, all_rows=True)
        lg = np.empty((4, V), np.float32)
        chn = np.empty((4, W), np.float32)
        H, I = ffi.cast("const float *", hid.ctypes.data), ffi.cast("const int32_t *", ids.ctypes.data)
        LG, CH = ffi.cast("float *", lg.ctypes.data), ffi.cast("float *", chn.ctypes.data)
        A = lib.STRATA_EVAL_ALL_LOGITS
        cases = {
            "null session": (lib.strata_session_mtp(ffi.NULL, H, I, 4, 0, A, LG, lg.size, CH, chn.size), lib.STRATA_ERR_INVALID_ARG),
            "null hidden": (lib.strata_session_mtp(s._ptr, ffi.NULL, I, 4, 0, A, LG, lg.size, CH, chn.size), lib.STRATA_ERR_INVALID_ARG),
            "null ids": (lib.strata_session_mtp(s._ptr, H, ffi.NULL, 4, 0, A, LG, lg.size, CH, chn.size), lib.STRATA_ERR_INVALID_ARG),
            "n = 0": (lib.strata_session_mtp(s._ptr, H, I, 0, 0, A, LG, lg.size, CH, chn.size), lib.STRATA_ERR_INVALID_ARG),
            "n < 0": (lib.strata_session_mtp(s._ptr, H, I, -3, 0, A, LG, lg.size, CH, chn.size), lib.STRATA_ERR_INVALID_ARG),
            "pos0 < 0": (lib.strata_session_mtp(s._ptr, H, I, 4, -1, A, LG, lg.size, CH, chn.size), lib.STRATA_ERR_INVALID_ARG),
            "past n_ctx": (lib.strata_session_mtp(s._ptr, H, I, 4, 61, A, LG, lg.size, CH, chn.size), lib.STRATA_ERR_INVALID_ARG),
            "huge pos0": (lib.strata_session_mtp(s._ptr, H, I, 4, 2**62, A, LG, lg.size, CH, chn.size), lib.STRATA_ERR_INVALID_ARG),
            "logits short": (lib.strata_session_mtp(s._ptr, H, I, 4, 0, A, LG, lg.size - 1, CH, chn.size), lib.STRATA_ERR_BUFFER_TOO_SMALL),
            "chain short": (lib.strata_session_mtp(s._ptr, H, I, 4, 0, A, LG, lg.size, CH, W), lib.STRATA_ERR_BUFFER_TOO_SMALL),
        }
        for bad_id in (-1, V):
            ids2 = ids.copy()
            ids2[2] = bad_id
            cases[f"id {bad_id}"] = (lib.strata_session_mtp(s._ptr, H, ffi.cast("const int32_t *", ids2.ctypes.data), 4, 0,
                                                            A, LG, lg.size, CH, chn.size), lib.STRATA_ERR_INVALID_ARG)
        for name, (rc, want) in cases.items():
            assert rc == want, (name, rc)
            assert lib.strata_last_error() != ffi.NULL and ffi.string(lib.strata_last_error()), name
        # the last row only needs one row of room; NULL outputs are allowed
        assert lib.strata_session_mtp(s._ptr, H, I, 4, 0, 0, LG, V, CH, W) == lib.STRATA_OK
        assert lib.strata_session_mtp(s._ptr, H, I, 4, 0, 0, ffi.NULL, 0, ffi.NULL, 0) == lib.STRATA_OK
        with pytest.raises(ValueError):
            s.mtp(hid[:3], ids, 0)
        # nothing refused touched the cache: the same call gives the same rows
        after = s.mtp(hid, ids, 0, all_rows=True)
        assert np.array_equal(before[0], after[0]) and np.array_equal(before[1], after[1])


# ------------------------------------------------------------------------------------------ (5) quantize

@pytest.mark.parametrize("recipe", ["q8_0", "q4_k_m", "iq2_xs", "nvfp4"])
def test_quantized_mtp_head(tiny, recipe):
    from pyrunner.quantize import quantize_file

    c = tiny["cfg"]
    L = c["num_hidden_layers"]
    out = quantize_file(str(tiny["gguf"]), str(tiny["work"] / f"mtp-{recipe}.gguf"), recipe, progress=False)
    out0 = quantize_file(str(tiny["gguf0"]), str(tiny["work"] / f"nomtp-{recipe}.gguf"), recipe, progress=False)
    t, t0 = out["types"], out0["types"]
    # the trunk's types do not depend on the MTP block
    assert {k: v for k, v in t.items() if not k.startswith(f"blk.{L}.")} == t0
    # the MTP block like a trunk QSA block (the last layer), its norms F32, its matrices quantized
    for kind in ("ffn_gate_exps", "ffn_up_exps", "attn_q", "attn_k", "attn_output", "ffn_gate_inp", "indexer.q_proj",
                 "hc_attn_down", "hc_ffn_up", "attn_q_norm"):
        assert t[f"blk.{L}.{kind}.weight"] == t0[f"blk.{L - 1}.{kind}.weight"], kind
    assert t[f"blk.{L}.nextn.enorm.weight"] == t[f"blk.{L}.nextn.hnorm.weight"] == "F32"
    assert t[f"blk.{L}.nextn.hc_head_norm.weight"] == "F32"
    assert t[f"blk.{L}.nextn.eh_proj.weight"] != "F32"
    assert t[f"blk.{L}.nextn.hc_head_down.weight"] == t["output_hc_down.weight"]
    hid = np.random.default_rng(6).standard_normal((16, c["hc_count"] * c["hidden_size"])).astype(np.float32)
    ids = mo.prompt(9, 16)
    with _model(tiny["gguf"]) as m, _model(tiny["work"] / f"mtp-{recipe}.gguf") as mq:
        want, _ = m.session().mtp(hid, ids, 0, all_rows=True)
        got, _ = mq.session().mtp(hid, ids, 0, all_rows=True)
    assert np.isfinite(got).all()
    agree = float((got.argmax(-1) == want.argmax(-1)).mean())
    print(f"\n{recipe}: MTP top-1 agreement with f32 {agree:.2f}")
    assert agree >= (0.9 if recipe == "q8_0" else 0.5)
