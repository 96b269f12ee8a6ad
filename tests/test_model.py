"""The qwen4exp forward pass (pyrunner.Model) against transformers fp32 and llama.cpp on tiny random models.

(a) f32 parity with transformers: tools/make_tiny_hf.py's topology (4 layers GDN, GDN, GDN, QSA; GDN V heads 4 !=
    K heads 2; 8 experts top-3 + shared expert; PLE on layer 1) with the QSA budget binding (budget 8, ratio 4:
    two blocks + the tail out of up to 34), for both GDN output gates, on a 136-token sequence (crossing the GDN's
    64-token chunks) with both EOS ids inside (the PLE resets on the first). Converted by `strata convert` at f32,
    run with f32 KV: max |dlogit| <= 1e-3 at every position for one-shot prefill, prefill then token-by-token
    decode, uneven chunks 1 + 7 + 64 + rest, and a small internal prefill chunk. Positions where transformers'
    QSA selection had a score tie at the cut are excluded and counted (tests/model_oracles.py; <= 5 %).
(b) f32 parity with llama.cpp where QSA does not bind (budget 256 > sequence): max |dlogit| <= 1e-3 (sigmoid
    gate: llama.cpp hard-codes it).
(c) quantized: a wider model (hidden 256, so that 256-value blocks fit) through `strata quantize` q8_0, nvfp4 and
    iq2_xs: the share of weights that got the target type, top-1 agreement and KL(transformers || Strata) against
    transformers fp32 at documented thresholds, and top-1 agreement with llama.cpp on the same file (>= 96 % on
    this random model's near-flat logits; the 99 % of issue 3 is asserted on the trained model,
    tests/test_flash_small.py).
(d) files made by llama.cpp's quantizer (Q8_0, Q4_K_M) load and run in Strata.
"""
from __future__ import annotations

import importlib
import importlib.util
from pathlib import Path

import numpy as np
import pytest

import model_oracles as mo

importlib.import_module("torch")
importlib.import_module("transformers")
if importlib.util.find_spec("llama_cpp") is None:      # found, not loaded: llama.cpp runs in child processes
    raise ImportError("llama-cpp-python==0.3.36 (a test dependency) is not installed: bash tools/test.sh installs it")
import pyrunner  # noqa: E402
from pyrunner.convert import convert  # noqa: E402
from pyrunner.model import Model  # noqa: E402  (pyrunner.Model)
from pyrunner.quantize import quantize_file  # noqa: E402

F32_TOL = 1e-3
TIE_MAX = 0.05          # share of positions whose reference QSA selection had a tie at the cut
SEQ = 136               # > 64 (GDN chunk) and 17x the QSA budget of 8
SCHEDULES = {
    "one-shot": [SEQ],
    "prefill+decode": [72] + [1] * (SEQ - 72),
    "chunks-1-7-64-rest": [1, 7, 64, SEQ - 72],
    "prefill_chunk-16": [SEQ],          # one call, split inside the engine (Model(prefill_chunk=16))
}


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("model")


def _model(path: Path, **kw):
    return Model(str(path), threads=2, n_ctx=512, kv_type="f32", **kw)


def _run(model, ids: list[int], schedule: list[int]) -> np.ndarray:
    """Feed ids in calls of the schedule's sizes; single-token calls use the last-position form."""
    sess = model.session()
    out, pos = [], 0
    for n in schedule:
        part = ids[pos:pos + n]
        if n == 1:
            row = sess.eval(part)
            assert row.shape == (model.n_vocab,) and row.dtype == np.float32
            out.append(row[None])
        else:
            rows = sess.eval(part, all_logits=True)
            assert rows.shape == (n, model.n_vocab) and rows.dtype == np.float32
            out.append(rows)
        pos += n
        assert sess.n_past == pos
    assert pos == len(ids)
    return np.concatenate(out)


# ------------------------------------------------------------------------------------------ (a) f32 vs transformers

_binding: dict[str, dict] = {}
_models: list = []


@pytest.fixture(scope="module", params=["sigmoid", "silu"])
def binding(request, work):
    """A budget-8 model, its f32 GGUF, the sequence, transformers' logits and tie positions."""
    gate = request.param
    if gate not in _binding:
        hf = mo.make_hf(work / f"hf-{gate}", seed=2, gate=gate, budget=8)
        gguf = work / f"tiny-{gate}-f32.gguf"
        convert(str(hf), str(gguf), "f32")
        ids = mo.prompt(2, SEQ)
        logits, ties, counts = mo.HFReference(hf).logits_and_ties(ids)
        _binding[gate] = dict(gate=gate, gguf=gguf, ids=ids, ref=logits, ties=ties, counts=counts, models={})
    yield _binding[gate]


def _strata(case: dict, prefill_chunk: int | None = None):
    """The case's Strata model (one per prefill chunk setting, kept for the module)."""
    if prefill_chunk not in case["models"]:
        kw = {} if prefill_chunk is None else {"prefill_chunk": prefill_chunk}
        case["models"][prefill_chunk] = m = _model(case["gguf"], **kw)
        _models.append(m)
    return case["models"][prefill_chunk]


@pytest.fixture(scope="module", autouse=True)
def _close_models():
    yield
    for m in _models:
        m.close()
    _models.clear()
    _binding.clear()


def test_reference_selection_binds_and_ties_are_rare(binding):
    """The sequence makes QSA select a strict subset at most positions; ties at the cut are rare."""
    c = binding["counts"]
    print(f"\n{binding['gate']}: {c}")
    assert c["binding"] >= 0.9 * (SEQ - 12)          # every position from 12 on has more than 2 complete blocks
    assert c["ties"] <= TIE_MAX * SEQ
    assert c["checked"] + c["ties"] == c["binding"]


def test_tie_detector_rejects_a_selection_it_did_not_compute(work):
    """The recomputed block scores are a real check: one moved token in transformers' selection mask at a
    binding, untied position is reported."""
    hf = mo.make_hf(work / "hf-check", seed=2, gate="sigmoid", budget=8)
    ref = mo.HFReference(hf)
    _, captured = ref.capture_indexers(mo.prompt(2, 48))
    module, hs, mask = captured[0]
    ties, binding, checked = mo.qsa_ties(module, ref.config, hs, mask)
    t = int(np.nonzero(binding & ~ties)[0][-1])
    bad = mask.clone()
    row = bad[0, 0, t]
    on, off = int(np.nonzero(row.numpy())[0][0]), int(np.nonzero(~row[: t + 1].numpy())[0][0])
    row[on], row[off] = False, True
    with pytest.raises(AssertionError, match=f"position {t}"):
        mo.qsa_ties(module, ref.config, hs, bad)


@pytest.mark.parametrize("schedule", list(SCHEDULES))
def test_f32_matches_transformers(binding, schedule):
    model = _strata(binding, 16 if schedule == "prefill_chunk-16" else None)
    assert model.n_vocab == binding["ref"].shape[1]
    got = _run(model, binding["ids"], SCHEDULES[schedule])
    assert np.isfinite(got).all()
    keep = ~binding["ties"]
    diff = np.abs(got - binding["ref"]).max(axis=1)
    worst = int(np.argmax(np.where(keep, diff, -1)))
    print(f"\n{binding['gate']} {schedule}: max|dlogit| {diff[keep].max():.3g} at position {worst} over "
          f"{int(keep.sum())} positions ({int((~keep).sum())} tied excluded; at those: {diff[~keep].tolist()})")
    assert diff[keep].max() <= F32_TOL, f"position {worst}: {diff[worst]:.3g}"


def test_reset_starts_the_sequence_again(binding):
    model = _strata(binding)
    sess = model.session()
    ids = binding["ids"][:20]
    first = sess.eval(ids, all_logits=True)
    sess.eval(binding["ids"][20:30])
    sess.reset()
    assert sess.n_past == 0
    np.testing.assert_array_equal(sess.eval(ids, all_logits=True), first)


# ------------------------------------------------------------------------------------------ (b) f32 vs llama.cpp

@pytest.fixture(scope="module")
def dense(work):
    """Budget 256: QSA selects every visible token for these sequences, where llama.cpp agrees with transformers."""
    hf = mo.make_hf(work / "hf-dense", seed=3, gate="sigmoid", budget=256)
    gguf = work / "tiny-dense-f32.gguf"
    convert(str(hf), str(gguf), "f32")
    prompts = [mo.prompt(s, 100) for s in (4, 5)]
    return dict(hf=hf, gguf=gguf, prompts=prompts)


def test_f32_matches_llama_cpp_where_qsa_does_not_bind(dense):
    ref = mo.llama_logits(dense["gguf"], dense["prompts"])
    hf = mo.HFReference(dense["hf"])
    with _model(dense["gguf"]) as model:
        for ids, want in zip(dense["prompts"], ref):
            got = model.session().eval(ids, all_logits=True)
            d_llama = float(np.abs(got - want).max())
            d_hf = float(np.abs(got - hf.logits(ids)).max())
            print(f"\nf32 dense: max|dlogit| vs llama.cpp {d_llama:.3g}, vs transformers {d_hf:.3g}")
            assert d_llama <= F32_TOL and d_hf <= F32_TOL


# ------------------------------------------------------------------------------------------ (c) quantized recipes

# the widths of tests/test_quantize_file.py: 256-value blocks fit the 256-wide rows; the 192-wide expert down rows
# take the recipes' fallbacks as the real 640-wide rows do
WIDE = dict(hidden_size=256, head_dim=64, linear_key_head_dim=64, linear_value_head_dim=64,
            moe_intermediate_size=192, shared_expert_intermediate_size=192, hc_lowrank=32)
# the type each recipe must give the experts (ffn_gate/up/down_exps), and the least share of all matmul-weight
# values that must have the recipe's main type
EXPERT_TYPES = {"q8_0": ("Q8_0", "Q8_0", "Q8_0"), "nvfp4": ("NVFP4", "NVFP4", "NVFP4"),
                "iq2_xs": ("IQ2_XS", "IQ2_XS", "IQ4_NL")}
MAIN_TYPE = {"q8_0": "Q8_0", "nvfp4": "NVFP4", "iq2_xs": "IQ2_XS"}
MAIN_SHARE_MIN = {"q8_0": 0.99, "nvfp4": 0.95, "iq2_xs": 0.60}     # of non-F32 values; made: 0.999, 0.961, 0.623
# Over 3 prompts x 80 positions. Strata vs transformers fp32: top-1 agreement floor and mean / max KL(transformers ||
# Strata) ceilings in nats. Measured (pytest -s): q8_0 top-1 0.925, KL mean 3.4e-4, max 3.4e-3; nvfp4 0.487, 0.0184,
# 0.113; iq2_xs 0.300, 0.0434, 0.116 (llama.cpp on the same files: 0.921, 3.0e-4, 3.0e-3; 0.488, 0.0184, 0.112;
# 0.304, 0.0433, 0.116). The logits of a random tiny model are nearly flat (std 0.48, median top-1/top-2 margin
# 0.10), so small perturbations flip the argmax (iq2_xs: KL 0.04 but top-1 0.30): KL is the sharper check; top-1
# is a floor against a broken file, not a quality figure. The thresholds leave about 2x margin on KL.
TOP1_MIN = {"q8_0": 0.85, "nvfp4": 0.40, "iq2_xs": 0.22}
KL_MEAN_MAX = {"q8_0": 1e-3, "nvfp4": 0.04, "iq2_xs": 0.09}
KL_MAX_MAX = {"q8_0": 0.01, "nvfp4": 0.25, "iq2_xs": 0.25}
# Strata vs llama.cpp on the same quantized file: top-1 agreement measured 0.992 (q8_0), 0.979 (nvfp4), 0.992
# (iq2_xs). On the same weights dequantized to F32 the two engines agree to < 1e-3 (top-1 1.000); what is left is
# each engine's int8 activation rounding, which moves its logits from that float result by a median 0.03-0.05 (max
# 0.19-0.26; top-1 0.91-0.96 against itself on this random model, whose logits are nearly flat). Strata's
# act_q8_32 blocks store their scale rounded to fp16 as ggml's q8_0 does (quant.h strata_act_d_q8_32), so for
# Q8_0 / IQ4_NL / ... weights the engines multiply the same integers; before that (fp32 scales) agreement was 0.971,
# 0.971, 0.958. llama.cpp's NVFP4 path quantizes activations its own way, hence 0.979 there. On the trained model
# (tests/test_flash_small.py) agreement is >= 99.5 % at q8_0, iq2_xs and nvfp4. Asserted: identical results on the
# dequantized weights, Strata's activation-rounding error no larger than 1.5x llama.cpp's, and top-1 >= 0.96.
LLAMA_TOP1_MIN = 0.96
DEQ_TOP1_MIN = 0.99
NOISE_RATIO_MAX = 1.5        # max|Strata(q) - Strata(deq)| / max|llama(q) - llama(deq)|: measured 1.00, 1.08, 1.01
# llama.cpp's own files in Strata, top-1 vs transformers: measured Q8_0 0.925, Q4_K_M 0.658
LLAMA_FILE_TOP1_MIN = {"Q8_0": 0.85, "Q4_K_M": 0.55}
QPROMPT = 80


@pytest.fixture(scope="module")
def wide(work):
    hf = mo.make_hf(work / "hf-wide", seed=0, gate="sigmoid", budget=256, **WIDE)
    gguf = work / "wide-f32.gguf"
    convert(str(hf), str(gguf), "f32")
    prompts = [mo.prompt(s, QPROMPT) for s in (7, 8, 9)]
    ref = mo.HFReference(hf)
    return dict(hf=hf, gguf=gguf, prompts=prompts, ref=np.stack([ref.logits(p) for p in prompts]))


def _strata_logits(path: Path, prompts) -> np.ndarray:
    with _model(path) as model:
        return np.stack([model.session().eval(p, all_logits=True) for p in prompts])


@pytest.mark.parametrize("recipe", ["q8_0", "nvfp4", "iq2_xs"])
def test_quantized_recipe_against_transformers_and_llama_cpp(wide, work, recipe):
    out = work / f"wide-{recipe}.gguf"
    quantize_file(str(wide["gguf"]), str(out), recipe, progress=False)
    tensors = {t["name"]: t for t in pyrunner.gguf_info(str(out))["tensors"]}       # what the file really holds
    for i in range(4):
        for kind, want in zip(("ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"), EXPERT_TYPES[recipe]):
            assert tensors[f"blk.{i}.{kind}.weight"]["type"] == want, (recipe, i, kind)
    values: dict[str, int] = {}
    for t in tensors.values():
        if t["type"] != "F32":
            values[t["type"]] = values.get(t["type"], 0) + int(np.prod(t["shape"]))
    share = values.get(MAIN_TYPE[recipe], 0) / sum(values.values())
    got = _strata_logits(out, wide["prompts"])
    assert np.isfinite(got).all()
    ref = wide["ref"]
    top1 = float(np.mean(got.argmax(-1) == ref.argmax(-1)))
    k = mo.kl(ref.reshape(-1, ref.shape[-1]), got.reshape(-1, got.shape[-1]))
    llama = np.stack(mo.llama_logits(out, wide["prompts"]))
    top1_llama = float(np.mean(got.argmax(-1) == llama.argmax(-1)))
    deq = mo.dequantized_copy(out, work / f"wide-{recipe}-deq.gguf")
    got_deq = _strata_logits(deq, wide["prompts"])
    llama_deq = np.stack(mo.llama_logits(deq, wide["prompts"]))
    d_deq = float(np.abs(got_deq - llama_deq).max())
    top1_deq = float(np.mean(got_deq.argmax(-1) == llama_deq.argmax(-1)))
    noise_s, noise_l = float(np.abs(got - got_deq).max()), float(np.abs(llama - llama_deq).max())
    print(f"\n{recipe}: {MAIN_TYPE[recipe]} share of non-F32 weight values {share:.3f}; vs transformers fp32: top-1 "
          f"{top1:.3f}, KL mean {k.mean():.2e} max {k.max():.2e}; vs llama.cpp: top-1 {top1_llama:.3f} "
          f"(max|dlogit| {np.abs(got - llama).max():.3g}); on the dequantized weights: max|dlogit| {d_deq:.2e}, top-1 "
          f"{top1_deq:.3f}; activation-rounding max|dlogit| Strata {noise_s:.3f}, llama.cpp {noise_l:.3f}")
    assert share >= MAIN_SHARE_MIN[recipe]
    assert top1 >= TOP1_MIN[recipe]
    assert k.mean() <= KL_MEAN_MAX[recipe] and k.max() <= KL_MAX_MAX[recipe]
    assert d_deq <= F32_TOL and top1_deq >= DEQ_TOP1_MIN
    assert noise_s <= NOISE_RATIO_MAX * noise_l
    assert top1_llama >= LLAMA_TOP1_MIN


@pytest.mark.parametrize("ftype", ["Q8_0", "Q4_K_M"])
def test_llama_cpp_quantized_files_run(wide, work, ftype):
    out = mo.llama_quantize(wide["gguf"], work / f"wide-llama-{ftype}.gguf", ftype)
    types = {t["type"] for t in pyrunner.gguf_info(str(out))["tensors"]}
    got = _strata_logits(out, wide["prompts"])
    assert np.isfinite(got).all()
    ref = wide["ref"]
    top1 = float(np.mean(got.argmax(-1) == ref.argmax(-1)))
    llama = np.stack(mo.llama_logits(out, wide["prompts"]))
    top1_llama = float(np.mean(got.argmax(-1) == llama.argmax(-1)))
    k = mo.kl(ref.reshape(-1, ref.shape[-1]), got.reshape(-1, got.shape[-1]))
    print(f"\nllama.cpp {ftype} ({sorted(types)}): Strata vs transformers top-1 {top1:.3f}, KL mean {k.mean():.2e} "
          f"max {k.max():.2e}; top-1 vs llama.cpp {top1_llama:.3f}")
    assert {"Q8_0": "Q8_0", "Q4_K_M": "Q4_K"}[ftype] in types
    assert top1 >= LLAMA_FILE_TOP1_MIN[ftype]
    assert top1_llama >= LLAMA_TOP1_MIN
