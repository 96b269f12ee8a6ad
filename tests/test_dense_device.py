"""The dense forward on a device (native/src/model/fwd_dev.c, issue 19), run without a GPU: `dense="emu"` runs
the GPU forward with every CUDA kernel emulated on the host over its launch grid (kernels/cuda/emu_*.h, the same
unit functions the kernels run), device state and work buffers included. Each case compares it with the C
forward on the same file:

- logits within 1e-2 of each row's spread (max - min), the issue's criterion for cuda against cpu; not
  bit-identical (the device path sums in its kernels' order: equality would mean the C path ran);
- greedy tokens the same, compared while the C forward's top two are apart by more than 1e-3 of the spread
  (a near-tie may go either way under another summation order, so the comparison stops there);
- prefill (the gemm and chunked-GDN paths) and decode (gemv, recurrent GDN), every recipe and KV type, QSA's
  selection binding (the prompt passes the tiny model's 64-key budget), verify windows with rollback,
  checkpoints, a batch of sequences, the MTP head, the PLE layer (GGUF and packed NVFP4 tables), the MoE's
  device half with the sim expert device reading the forward's own memory (cache 0 / 50 / 100 %), the bytes
  that cross the link, and the start-up plan (--vram-gib, the fitted cache, the prefill path).

The GPU itself (launch configurations, streams, speed) is tools/device_check.sh's part.
"""
from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from pyrunner import Model
from pyrunner._native import StrataError
from pyrunner.models import load_preset, make_model
from pyrunner.ple import model_info as ple_model_info

# the judging is tools/dense_check.py's (device_check.sh's models rows): rel, greedy, decided, TOL, TIE
_spec = importlib.util.spec_from_file_location("dense_check", Path(__file__).resolve().parents[1] / "tools" /
                                               "dense_check.py")
dense_check = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(dense_check)
rel, greedy, decided, TOL = dense_check.rel, dense_check.greedy, dense_check.decided, dense_check.TOL


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    d = tmp_path_factory.mktemp("dense")
    out = {}
    for recipe in ("f32", "q8_0", "iq2_xs", "nvfp4", "q4_k_m"):
        path = d / f"tiny-{recipe}.gguf"
        make_model("tiny", str(path), recipe, 3)
        out[recipe] = str(path)
    path = d / "tiny-mtp.gguf"
    make_model("tiny", str(path), "q8_0", 3, mtp=True)
    out["mtp"] = str(path)
    return out


def prompt(n, seed=0, vocab=300):
    return np.random.default_rng(seed).integers(0, vocab, n).tolist()


def check_same(path, n_prompt=100, n_gen=24, **kw):
    with Model(path, threads=2, **kw) as cpu, Model(path, threads=2, dense="emu", **kw) as dev:
        assert cpu.device_log == "" and dev.device_log.startswith("dense forward on emu")
        ids = prompt(n_prompt)
        a = cpu.session().eval(ids, all_logits=True)
        b = dev.session().eval(ids, all_logits=True)
        assert rel(b, a) < TOL
        assert not np.array_equal(a, b)      # another summation order: the device path ran
        ta, la = greedy(cpu, ids, n_gen)
        tb, _ = greedy(dev, ids, n_gen)
        k = decided(la)
        assert k >= n_gen // 2, f"near-tie at step {k}: pick another prompt"
        assert ta[:k] == tb[:k]


@pytest.mark.parametrize("recipe", ["f32", "q8_0", "iq2_xs", "nvfp4", "q4_k_m"])
def test_every_recipe_matches_the_c_forward(tiny, recipe):
    check_same(tiny[recipe])


@pytest.mark.parametrize("kv", ["f32", "int8"])
def test_every_kv_type_matches(tiny, kv):
    check_same(tiny["q8_0"], kv_type=kv, n_gen=12)


def test_decode_after_a_long_prompt_with_the_selection_binding(tiny):
    """200 tokens: the indexer's 64-key budget binds for most queries (16 blocks of 4), in prefill and decode."""
    check_same(tiny["f32"], n_prompt=200, n_gen=16)


def test_steps_split_by_the_prefill_chunk(tiny):
    """A prompt cut into steps of 48 (n_ubatch): each step's QSA at its own p0, the GDN state carried across."""
    check_same(tiny["q8_0"], n_prompt=130, n_gen=8, prefill_chunk=48)


def test_verify_window_and_rollback(tiny):
    ids = prompt(40, seed=1)
    win = prompt(4, seed=2)
    res = []
    for dense in ("cpu", "emu"):
        with Model(tiny["q8_0"], threads=2, dense=dense) as m:
            s = m.session()
            s.eval(ids)
            s.set_spec_max(4)
            s.eval(win, all_logits=True, keep_states=True)
            s.rollback(len(ids) + 2)          # keep two of the window's four
            after = s.eval([7, 8], all_logits=True)
            fresh = m.session()
            ref = fresh.eval(ids + win[:2] + [7, 8], all_logits=True)[-2:]
            res.append(after)
            assert rel(after, ref) < TOL      # the rolled-back state is the state after two tokens
    assert rel(res[1], res[0]) < TOL


def test_checkpoint_and_restore(tiny):
    ids = prompt(50, seed=3)
    with Model(tiny["q8_0"], threads=2, dense="emu") as m, Model(tiny["q8_0"], threads=2) as c:
        s = m.session()
        s.eval(ids)
        cp = s.checkpoint()
        one = s.eval([5, 6, 7], all_logits=True)
        s.eval([9, 9, 9, 9])                 # moves on; the restore takes the state back
        s.restore(cp)
        two = s.eval([5, 6, 7], all_logits=True)
        assert np.array_equal(one, two)      # the device state copied down and up again, bit for bit
        ref = c.session().eval(ids + [5, 6, 7], all_logits=True)[-3:]
        assert rel(two, ref) < TOL


def test_a_batch_of_sequences_gives_each_its_own_logits(tiny):
    a_ids, b_ids = prompt(30, seed=4), prompt(45, seed=5)
    with Model(tiny["q8_0"], threads=2, dense="emu") as m:
        alone = [m.session().eval(x, all_logits=True) for x in (a_ids, b_ids)]
        sa, sb = m.session(), m.session()
        outs = []
        items = []
        for s, x in ((sa, a_ids), (sb, b_ids)):
            ids32 = np.asarray(x, dtype=np.int32)
            out = np.empty((len(x), m.n_vocab), dtype=np.float32)
            outs.append(out)
            from pyrunner._native import lib
            items.append((s, ids32, lib.STRATA_EVAL_ALL_LOGITS, out, None))
        m.eval_batch(items)
        for got, ref in zip(outs, alone):
            assert np.array_equal(got, ref)  # batch-invariant: a row's sums do not depend on the other rows


def test_prefill_has_the_bits_of_decode(tiny):
    """Without cuBLAS the prefill product sums in the decode kernel's order (gemm.cuh gemm_tile_dot), and the
    chunked GDN form gives the recurrent form's bits here: one eval of a prompt gives the logits of feeding it
    token by token, bit for bit, as the C forward does."""
    ids = prompt(40, seed=7)
    with Model(tiny["q4_k_m"], threads=2, dense="emu") as m:
        one = m.session().eval(ids, all_logits=True)
        s = m.session()
        steps = np.stack([s.eval([t]) for t in ids])
    assert np.array_equal(one, steps)


def test_mtp_drafts_on_the_device_forward(tiny):
    """The MTP head runs on the host from the hidden rows the device forward copies down; greedy text with
    drafts equals greedy text without, on the device forward as on the C one."""
    outs = []
    for dense in ("cpu", "emu"):
        with Model(tiny["mtp"], threads=2, dense=dense, mtp=2) as m:
            c = m.generate(prompt(20, seed=6), max_tokens=16, temperature=0)
            outs.append(c.tokens)
            assert c.stats.get("drafts_proposed", 0) > 0
    assert outs[0] == outs[1]


def test_the_mtp_head_runs_on_the_device(tiny):
    """strata_session_mtp on the device (fusion, the MTP block on its own device cache, its mixer, the LM head):
    logits and chain rows of a draft-extend over a prompt, then of a chain step, against the C head."""
    ids = prompt(40, seed=8)
    res = []
    for dense in ("cpu", "emu"):
        with Model(tiny["mtp"], threads=2, dense=dense) as m:
            s = m.session()
            _, hid = s.eval(ids, hidden=True)
            lg, ch = s.mtp(hid[:-1], ids[1:], 0, all_rows=True)         # row i: hidden i with token i + 1
            lg2, ch2 = s.mtp(ch[-1:], [int(np.argmax(lg[-1]))], len(ids) - 1)
            res.append((lg, ch, lg2, ch2))
    (a, ca, a2, ca2), (b, cb, b2, cb2) = res
    assert rel(b, a) < TOL and rel(b2[None], a2[None]) < TOL
    assert rel(cb, ca) < TOL and rel(cb2[None], ca2[None]) < TOL
    assert not np.array_equal(a, b)          # the device head ran


def test_every_byte_over_the_link_is_counted(tiny):
    """Offload stats count the dense forward's traffic: one decode step of one token copies up its embedding
    streams, the routed experts' rows of each MoE layer and the PLE layer's gathered rows, and copies down each
    MoE layer's input and routing and the logits. The C forward moves nothing."""
    with Model(tiny["q8_0"], threads=2) as m:
        m.session().eval(prompt(5))
        st = m.offload_stats()
        assert st["dense_h2d_bytes"] == st["dense_d2h_bytes"] == st["dense_weight_bytes"] == 0
    p = load_preset("tiny")
    E, hc, K, Ne = p["hidden_size"], p["hc_count"], p["num_experts_per_tok"], p["num_experts"]
    n_moe, ple_rows = p["num_hidden_layers"], (p["ngram_size"] - 1) * p["heads_per_ngram"]
    with Model(tiny["q8_0"], threads=2, dense="emu", device="sim", cache_gib=None) as m:
        s = m.session()
        s.eval(prompt(5))
        a = m.offload_stats()
        s.eval([3])
        b = m.offload_stats()
        assert a["dense_weight_bytes"] > 0
        assert b["cache_group_hits"] - a["cache_group_hits"] == n_moe * K   # every expert resident
        # the experts ran on the device from its own memory: no row of theirs crossed (only the skip marks)
        up = hc * E * 4 + n_moe * Ne + ple_rows * ple_model_info(m)["row_bytes"]
        down = (n_moe * (E + 2 * K) + m.n_vocab) * 4
        assert b["dense_h2d_bytes"] - a["dense_h2d_bytes"] == up
        assert b["dense_d2h_bytes"] - a["dense_d2h_bytes"] == down
        assert b["act_bytes"] == a["act_bytes"]
    with Model(tiny["q8_0"], threads=2, dense="emu", device="sim", cache_gib=0) as m:
        s = m.session()
        s.eval(prompt(5))
        a = m.offload_stats()
        s.eval([3])
        b = m.offload_stats()
        # no cache: every expert on the CPU pool, its rows up; pcie_frac's staged groups run on the device
        staged = b["pcie_groups"] - a["pcie_groups"]
        up = hc * E * 4 + n_moe * Ne + ple_rows * ple_model_info(m)["row_bytes"] + (n_moe * K - staged) * E * 4
        assert b["dense_h2d_bytes"] - a["dense_h2d_bytes"] == up


@pytest.mark.parametrize("recipe", ["q8_0", "iq2_xs"])
def test_the_expert_device_shares_the_forward_memory(tiny, recipe):
    """The sim expert device with the emu dense device: resident and staged groups read their rows from the
    forward's memory and leave theirs there, the CPU pool's come up; at cache budgets 0 / 50 / 100 % and
    pcie_frac 0 / 1 the logits and greedy tokens are the C forward's (tools/dense_check.py, device_check.sh's
    models rows)."""
    rows = dense_check.check(tiny[recipe], "emu", (0.0, 0.5, 1.0), (0.0, 1.0), 96, 24, 2)
    assert len(rows) == 6 and all(r["pass"] for r in rows), rows


def packed_ple_copy(src: str, out_dir: Path, n_shard: int = 3) -> str:
    """A copy of the f32 GGUF src whose PLE table is an external packed NVFP4 file (the layout `strata pack-ple`
    writes: per row dP/2 E2M1 code bytes, then dP/16 E4M3 block scales; one global scale per shard of rows),
    quantized here from the GGUF's own table: pack-ple's real input, a ModelOpt checkpoint, needs torch."""
    import json

    import gguf

    from pyrunner import ple
    from pyrunner.convert import _E2M1, _E4M3

    r = gguf.GGUFReader(src)
    t = next(t for t in r.tensors if t.name == "per_layer_token_embd.weight")
    table = np.array(t.data, dtype=np.float32).reshape(int(t.shape[1]), int(t.shape[0]))
    rows, dP = table.shape
    per = -(-rows // n_shard)
    codes = np.empty((rows, dP // 2), np.uint8)
    scales = np.empty((rows, dP // 16), np.uint8)
    e4m3 = np.where(np.isnan(_E4M3[:127]), np.inf, _E4M3[:127])      # the non-negative codes
    gscales = []
    for k in range(n_shard):
        sh = table[k * per:(k + 1) * per]
        gs = float(np.abs(sh).max()) / (6.0 * 448.0)
        gscales.append(gs)
        blocks = sh.reshape(len(sh), dP // 16, 16)
        want = np.abs(blocks).max(axis=2) / 6.0 / gs                 # each block's scale, in E4M3
        sc = np.abs(e4m3[None, None, :] - want[..., None]).argmin(axis=2).astype(np.uint8)
        d = np.maximum(e4m3[sc], 1e-12)[..., None] * gs
        c = np.abs(_E2M1[None, None, None, :] - (blocks / d)[..., None]).argmin(axis=3).astype(np.uint8)
        c = c.reshape(len(sh), dP)
        codes[k * per:(k + 1) * per] = c[:, 0::2] | (c[:, 1::2] << 4)
        scales[k * per:(k + 1) * per] = sc
    (out_dir / "packed").mkdir(parents=True)
    path = out_dir / "packed" / ple.TABLE_NAME
    np.concatenate([codes, scales], axis=1).tofile(path)
    meta = {"format": ple.FORMAT, "table": ple.TABLE_NAME, "source": "dense-device-test", "total_rows": rows,
            "num_shards": n_shard, "rows_per_shard": per, "row_dim": dP, "code_bytes": dP // 2,
            "scale_bytes": dP // 16, "row_width": dP // 2 + dP // 16, "global_scales": gscales,
            "file_bytes": rows * (dP // 2 + dP // 16)}
    (out_dir / "packed" / (ple.TABLE_NAME + ".json")).write_text(json.dumps(meta))
    dst = str(out_dir / "external.gguf")
    w = gguf.GGUFWriter(dst, "qwen4exp")
    for k, f in r.fields.items():
        if k.startswith("GGUF.") or k == "general.architecture":
            continue
        sub = f.types[1] if f.types[0] == gguf.GGUFValueType.ARRAY else None
        w.add_key_value(k, f.contents(), f.types[0], sub_type=sub)
    w.add_string("strata.ple_external", "packed/" + ple.TABLE_NAME)
    w.add_uint64("strata.ple_external.rows", rows)
    for t in r.tensors:
        if t.name != "per_layer_token_embd.weight":
            w.add_tensor(t.name, np.array(t.data, dtype=np.float32).reshape([int(x) for x in reversed(t.shape)]))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dst


def test_the_packed_nvfp4_ple_table_matches(tiny, tmp_path):
    """The external packed NVFP4 table: the rows' table ids and the shards' scales go up with the rows (ple.dequant's
    packed format), the rest of the layer as with a GGUF table."""
    from pyrunner import ple

    path = packed_ple_copy(tiny["f32"], tmp_path)
    ids = prompt(100, seed=1)                # seed 0 starts on a near-tie with this table
    with Model(path, threads=2) as cpu, Model(path, threads=2, dense="emu") as dev:
        info = ple.model_info(dev)
        assert info["external"] and info["row_bytes"] == 9
        a = cpu.session().eval(ids, all_logits=True)
        b = dev.session().eval(ids, all_logits=True)
        assert rel(b, a) < TOL
        assert not np.array_equal(a, b)
        ta, la = greedy(cpu, ids, 16)
        tb, _ = greedy(dev, ids, 16)
        k = decided(la)
        assert k >= 8, f"near-tie at step {k}: pick another prompt"
        assert ta[:k] == tb[:k]


def test_the_start_up_plan_fits_the_cache_and_honours_vram_gib(tiny):
    with Model(tiny["q8_0"], threads=2, dense="emu", device="sim", cache_gib=None) as m:
        log = m.device_log
        assert "dense weights" in log and "state" in log and "work" in log and "expert cache" in log
        assert "fitted" in log
        st = m.offload_stats()
        assert st["cache_slots"] > 0          # the fitted cache holds every expert of the tiny model
    with pytest.raises(StrataError, match="vram-gib"):
        Model(tiny["q8_0"], threads=2, dense="emu", vram_gib=0.0001)
    with Model(tiny["q8_0"], threads=2, dense="emu", device="cpu") as m:
        assert "CPU pool" in m.device_log
        assert "prefill products: the batch-invariant kernel" in m.device_log
    with Model(tiny["q8_0"], threads=2, dense="emu", prefill_f16=True) as m:   # the emulation has no cuBLAS
        assert "--prefill-f16 asked, but this build has no cuBLAS" in m.device_log


def test_no_gpu_is_a_message(tiny):
    from pyrunner._native import lib
    if lib.strata_cuda_device_count(__import__("pyrunner._native", fromlist=["ffi"]).ffi.NULL) > 0:
        pytest.skip("a GPU is here")
    with pytest.raises(StrataError, match="no GPU"):
        Model(tiny["f32"], threads=2, dense="device")
