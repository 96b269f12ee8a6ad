"""pyrunner.Model / Session and the C model API: loading checks, errors, state handling, KV types.

Numbers against transformers and llama.cpp are in test_model.py; this file checks what the API
promises on its own: a file that is not a valid qwen4exp model is refused with a message naming
the key or tensor, results do not depend on threads or on how a sequence is cut into calls,
sessions are independent, and the f16 / int8 KV caches stay close to f32.
"""
from __future__ import annotations

import math
import threading
from pathlib import Path

import numpy as np
import pytest

from pyrunner import models
from pyrunner._native import FormatError, StrataError, UnsupportedError
from pyrunner.model import Model

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> str:
    out = tmp_path_factory.mktemp("model_api") / "tiny.gguf"
    models.make_model("tiny", str(out), recipe="f32", seed=3)
    return str(out)


@pytest.fixture(scope="module")
def micro(tmp_path_factory) -> str:
    out = tmp_path_factory.mktemp("model_api") / "micro.gguf"
    models.make_model("micro", str(out), recipe="f32", seed=1)
    return str(out)


def _ids(n: int, seed: int = 0, vocab: int = 300) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, vocab, n)


def _rewrite(src: str, dst: str, drop_tensor: str | None = None, reshape: tuple[str, tuple] | None = None,
             drop_key: str | None = None, set_key: tuple[str, object] | None = None) -> str:
    """Copy a GGUF with one thing changed (gguf-py reader -> writer)."""
    import gguf

    r = gguf.GGUFReader(src)
    arch = str(bytes(r.fields["general.architecture"].parts[-1]), "utf-8")
    w = gguf.GGUFWriter(dst, arch if not (set_key and set_key[0] == "general.architecture") else set_key[1])
    for name, f in r.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture" or name == drop_key:
            continue
        if set_key and name == set_key[0]:
            w.add_uint32(name, set_key[1])
            continue
        vtype = f.types[0]
        if vtype == gguf.GGUFValueType.ARRAY:
            sub = f.types[-1]
            if sub == gguf.GGUFValueType.STRING:
                val = [str(bytes(f.parts[i]), "utf-8") for i in f.data]
            else:
                val = [f.parts[i].tolist()[0] for i in f.data]
            w.add_key_value(name, val, vtype, sub_type=sub)
        elif vtype == gguf.GGUFValueType.STRING:
            w.add_key_value(name, str(bytes(f.parts[-1]), "utf-8"), vtype)
        else:
            w.add_key_value(name, f.parts[-1].tolist()[0], vtype)
    for t in r.tensors:
        if t.name == drop_tensor:
            continue
        data = np.array(t.data)
        if reshape and t.name == reshape[0]:
            data = np.zeros(reshape[1], dtype=np.float32)
        w.add_tensor(t.name, data, raw_dtype=t.tensor_type if data.dtype == np.uint8 else None)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dst


# ------------------------------------------------------------------ loading checks

def test_model_info(tiny):
    m = Model(tiny, threads=1, n_ctx=256, kv_type="f32")
    assert m.n_vocab == 320 and m.n_embd == 64 and m.n_layer == 4 and m.n_ctx == 256
    assert m.weight_bytes > 0 and m.state_bytes > 0
    assert "qwen4exp" in repr(m) or "Model(" in repr(m)
    assert m.metadata["general.architecture"] == "qwen4exp"


def test_missing_tensor_is_named(micro, tmp_path):
    bad = _rewrite(micro, str(tmp_path / "bad.gguf"), drop_tensor="blk.1.attn_k.weight")
    with pytest.raises(FormatError, match=r"blk\.1\.attn_k\.weight is missing"):
        Model(bad)


def test_wrong_shape_is_named(micro, tmp_path):
    bad = _rewrite(micro, str(tmp_path / "bad.gguf"), reshape=("blk.0.ssm_out.weight", (32, 15)))
    with pytest.raises(FormatError, match=r"blk\.0\.ssm_out\.weight has shape \{15, 32"):
        Model(bad)


def test_missing_key_is_named(micro, tmp_path):
    bad = _rewrite(micro, str(tmp_path / "bad.gguf"), drop_key="qwen4exp.hyper_connection.count")
    with pytest.raises(FormatError, match=r"qwen4exp\.hyper_connection\.count is missing"):
        Model(bad)


def test_bad_hyperparameter_is_named(micro, tmp_path):
    bad = _rewrite(micro, str(tmp_path / "bad.gguf"), set_key=("qwen4exp.ssm.time_step_rank", 3))
    with pytest.raises(FormatError, match=r"time_step_rank"):
        Model(bad)


def test_a_count_past_int32_is_refused(micro, tmp_path):
    # found by fuzz_model: an expert_used_count of 2^31 + 2 became negative as an int32, passed
    # "used <= expert_count", and the first MoE layer asked malloc for -40 GB
    bad = _rewrite(micro, str(tmp_path / "bad.gguf"), set_key=("qwen4exp.expert_used_count", 2**31 + 2))
    with pytest.raises(FormatError, match=r"expert_used_count must be positive and below 2\^31 \(got 2147483650\)"):
        Model(bad)


def test_block_count_past_the_tensor_table_is_refused(micro, tmp_path):
    # found by fuzz_model: a block_count of ~10^9 made the loader ask for 34 GB of per-block records
    # before any tensor was checked; now the count is held to the file's tensor table first
    bad = _rewrite(micro, str(tmp_path / "bad.gguf"), set_key=("qwen4exp.block_count", 1_000_000_000))
    with pytest.raises(FormatError, match=r"block_count 1000000000 but the file holds \d+ tensors"):
        Model(bad)


def test_other_architecture_is_refused(micro, tmp_path):
    bad = _rewrite(micro, str(tmp_path / "bad.gguf"), set_key=("general.architecture", "llama"))
    with pytest.raises(UnsupportedError, match=r"architecture is 'llama'"):
        Model(bad)


def test_argument_errors(tiny, tmp_path):
    with pytest.raises(FileNotFoundError):
        Model(tmp_path / "nope.gguf")
    with pytest.raises(ValueError, match="kv_type"):
        Model(tiny, kv_type="q4")
    # sizes and rates: NaN passed the range checks, a huge value overflowed the bytes field, a negative
    # link rate silently became the default
    for kw, msg in [({"cache_gib": math.nan}, "cache_gib must be a number of GiB >= 0"),
                    ({"vram_gib": math.inf}, "vram_gib must be"), ({"ram_gib": 1e300}, "ram_gib = 1e\\+300 GiB is more"),
                    ({"ple_cache_mib": 1e30}, "ple_cache_mib = .* is more"), ({"ple_cache_mib": -1}, "ple_cache_mib must"),
                    ({"sim_link_gbps": -1}, "sim_link_gbps must"), ({"cache_gib": "2"}, "cache_gib must")]:
        with pytest.raises(ValueError, match=msg):
            Model(tiny, **kw)
    m = Model(tiny, threads=1, n_ctx=16, kv_type="f32")
    s = m.session()
    with pytest.raises(ValueError, match="outside the vocabulary"):
        s.eval([1, 320])
    with pytest.raises(ValueError, match="at least one"):
        s.eval([])
    s.eval(_ids(10))
    with pytest.raises(StrataError, match="exceed the context of 16"):
        s.eval(_ids(7))
    assert s.n_past == 10          # a refused eval leaves the state as it was
    s.eval(_ids(6))
    assert s.n_past == 16


# ------------------------------------------------------------------ state handling

def test_threads_and_cuts_do_not_change_results(tiny):
    ids = _ids(90, seed=1)
    ref = Model(tiny, threads=1, n_ctx=256, kv_type="f32").session().eval(ids, all_logits=True)
    two = Model(tiny, threads=2, n_ctx=256, kv_type="f32").session().eval(ids, all_logits=True)
    assert np.array_equal(ref, two), "a second thread changed the bits"
    # small internal steps (prefill_chunk) and uneven calls: same numbers up to the GDN's two forms
    m = Model(tiny, threads=2, n_ctx=256, kv_type="f32", prefill_chunk=7)
    s = m.session()
    parts = [s.eval(ids[a:b], all_logits=True) for a, b in ((0, 1), (1, 40), (40, 41), (41, 90))]
    got = np.concatenate(parts)
    assert np.abs(got - ref).max() < 1e-4
    last = m.session().eval(ids)
    assert np.abs(last - ref[-1]).max() < 1e-4


def test_reset_and_independent_sessions(tiny):
    m = Model(tiny, threads=2, n_ctx=256, kv_type="f32")
    a, b = m.session(), m.session()
    ids1, ids2 = _ids(40, seed=2), _ids(40, seed=3)
    ra = a.eval(ids1, all_logits=True)
    b.eval(ids2, all_logits=True)
    a.reset()
    assert a.n_past == 0
    assert np.array_equal(a.eval(ids1, all_logits=True), ra)
    # interleaved continuation: each session only sees its own tokens
    x = a.eval([5])
    y = b.eval([5])
    c = m.session()
    c.eval(ids2)
    assert np.array_equal(c.eval([5]), y)
    assert not np.array_equal(x, y)
    assert b.n_past == 41 and a.n_past == 41


def test_sessions_on_two_threads(tiny):
    m = Model(tiny, threads=2, n_ctx=256, kv_type="f32")
    seqs = [_ids(60, seed=10 + i) for i in range(2)]
    want = [m.session().eval(q, all_logits=True) for q in seqs]
    got = [None, None]

    def run(i):
        s = m.session()
        got[i] = np.concatenate([s.eval(seqs[i][j:j + 6], all_logits=True) for j in range(0, 60, 6)])

    ts = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    for w, g in zip(want, got):
        assert np.abs(w - g).max() < 1e-4


@pytest.mark.parametrize("kv, tol", [("f16", 2e-3), ("int8", 3e-2)])
def test_kv_types_stay_close_to_f32(tiny, kv, tol):
    """f16 keys/values round to 11 bits, int8 to 8 bits with one scale per token and head. Measured on
    this model (100 tokens, dense and sparse QSA positions, logits up to ~2): f16 max |dlogit| 1.3e-4,
    int8 3.5e-3 (top-1 99 %)."""
    ids = _ids(100, seed=4)
    ref = Model(tiny, threads=2, n_ctx=256, kv_type="f32").session().eval(ids, all_logits=True)
    got = Model(tiny, threads=2, n_ctx=256, kv_type=kv).session().eval(ids, all_logits=True)
    d = np.abs(got - ref).max()
    assert 0 < d < tol, f"kv {kv}: max |dlogit| {d}"
    assert (got.argmax(1) == ref.argmax(1)).mean() >= 0.95


def test_close_frees_and_refuses_use(tiny):
    m = Model(tiny, threads=1, n_ctx=64)
    s = m.session()
    s.eval([1, 2, 3])
    m.close()
    with pytest.raises(RuntimeError, match="closed"):
        s.eval([4])
    with Model(tiny, threads=1, n_ctx=64) as m2:
        assert m2.session().eval([1]).shape == (m2.n_vocab,)


# ------------------------------------------------------------------ context length, llama-cpp-python habits

def _with_context(tmp_path_factory, n: int) -> str:
    """The tiny preset trained (says its context_length) on n tokens."""
    import json

    d = tmp_path_factory.mktemp(f"ctx{n}")
    with open(Path(models.presets_dir()) / "tiny.json") as f:
        p = json.load(f)
    p["max_position_embeddings"] = n
    (d / "preset.json").write_text(json.dumps(p))
    models.make_model(str(d / "preset.json"), str(d / "m.gguf"), recipe="f32", seed=3)
    return str(d / "m.gguf")


@pytest.fixture(scope="module")
def short(tmp_path_factory) -> str:
    return _with_context(tmp_path_factory, 64)


def test_default_context_is_the_trained_one_up_to_32768(short, tiny, tmp_path_factory):
    import warnings

    long = _with_context(tmp_path_factory, 65536)
    with warnings.catch_warnings():
        warnings.simplefilter("error")              # the default never warns
        for path, trained, want in ((short, 64, 64), (tiny, 4096, 4096), (long, 65536, 32768)):
            m = Model(path, threads=1)
            assert m.metadata["qwen4exp.context_length"] == trained
            assert (m.n_ctx_train, m.n_ctx) == (trained, want)
            m.close()
    m = Model(short, threads=1, kv_type="f32")
    s = m.session()
    s.eval(_ids(64))
    with pytest.raises(StrataError, match="exceed the context of 64"):
        s.eval([1])


def test_more_context_than_trained_warns_once(short):
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")             # count every warning, not once per place
        m = Model(short, threads=1, n_ctx=128, kv_type="f32")
        assert m.n_ctx == 128
        m.generate("hello world", max_tokens=4, temperature=0)
        m.session().eval(_ids(100))
        Model(short, threads=1, n_ctx=64).close()   # as much as trained: no warning
    assert len(caught) == 1 and caught[0].category is UserWarning
    msg = str(caught[0].message)
    assert "n_ctx 128" in msg and "trained on (64 tokens" in msg and short in msg


def test_model_path_is_llama_cpp_pythons_name_for_path(tiny):
    m = Model(model_path=tiny, threads=1, n_ctx=32)
    assert m.path == tiny and m.n_ctx == 32
    with pytest.raises(TypeError, match="not both"):
        Model(tiny, model_path=tiny)
    with pytest.raises(TypeError, match="give the GGUF's path"):
        Model()


def test_completion_methods_show_their_parameters():
    import inspect

    for name in ("generate", "create_completion", "create_chat_completion"):
        meth = getattr(Model, name)
        params = inspect.signature(meth).parameters
        assert list(params)[0] == "self"
        assert {"max_tokens", "temperature", "top_p", "top_k", "stop", "seed", "stream", "session"} <= set(params)
        assert "session" in meth.__doc__ and "threads" in meth.__doc__
    assert inspect.signature(Model.generate).parameters["max_tokens"].default == 256
    assert inspect.signature(Model.create_completion).parameters["max_tokens"].default == 16
