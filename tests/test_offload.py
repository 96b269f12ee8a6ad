"""The MoE offload engine (DESIGN §4, issue 5) on the `sim` device: a host-memory GPU with its own
thread and a rate-limited copy engine, so every scheduling path runs without a GPU.

- With tail skip off, `sim` at cache budgets of 0 %, 30 % and 100 % of the routed experts and
  pcie_frac 0, 0.5 and 1 gives the tokens and logits of `cpu` over 64 greedy steps, and the counters
  show that each path was taken (hits with a budget, PCIe groups with pcie_frac > 0, swaps with a
  partial budget).
- Tail skip follows its rule exactly, checked against the routing trace of the same run: an active
  expert is skipped iff it is not resident and every token ranks it >= K; the defaults (off on cpu
  unless asked; on the offload path only while the cache holds < 90 % of expert bytes).
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from model_oracles import greedy_run
from pyrunner import models
from pyrunner._native import check, ffi, lib
from pyrunner.model import Model

N_STEPS = 64


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> str:
    out = tmp_path_factory.mktemp("offload") / "tiny.gguf"
    models.make_model("tiny", str(out), recipe="f32", seed=7)
    return str(out)


def _greedy(model: Model, prompt, steps: int = N_STEPS):
    return greedy_run(model, prompt, steps)


def _raw_stats(model: Model):
    """The C struct itself (strata_offload_stats), with the group counters Model.offload_stats may not list."""
    st = ffi.new("strata_offload_stats *")
    check(lib.strata_model_offload_stats(model._ptr, st))
    return st


def _routed_bytes(path: str) -> int:
    m = Model(path, threads=1, n_ctx=64, device="sim", tail_skip=0)
    st = m.offload_stats()
    return st["slot_bytes"] * m.n_layer * 8      # tiny: 8 experts per layer


@pytest.fixture(scope="module")
def reference(tiny):
    prompt = list(np.random.default_rng(1).integers(0, 300, 24))
    toks, rows = _greedy(Model(tiny, threads=2, n_ctx=256, kv_type="f32"), prompt)
    return prompt, toks, rows


@pytest.mark.parametrize("budget", [0.0, 0.3, 1.0])
@pytest.mark.parametrize("pcie", [0.0, 0.5, 1.0])
def test_sim_gives_the_cpu_numbers(tiny, reference, budget, pcie):
    prompt, want, want_rows = reference
    gib = budget * _routed_bytes(tiny) / 2**30
    m = Model(tiny, threads=2, n_ctx=256, kv_type="f32", device="sim", cache_gib=gib, pcie_frac=pcie,
              tail_skip=0, sim_link_gbps=64)
    toks, rows = _greedy(m, prompt)
    assert toks == want
    assert np.abs(rows - want_rows).max() <= 1e-4
    st = m.offload_stats()
    assert st["cache_lookups"] > 0 and st["skipped_experts"] == 0
    if budget > 0:
        assert st["cache_hits"] > 0 and st["cache_admits"] > 0
    else:
        assert st["cache_hits"] == 0
    if pcie > 0 and budget < 1:
        assert st["pcie_groups"] > st["cache_admits"], "no missing group went over the link"
    if pcie == 0 and budget < 1:
        assert st["cpu_groups"] > 0 and st["pcie_groups"] == st["cache_admits"]
    if 0 < budget < 1:
        assert st["cache_swaps"] > 0, "a partial budget never swapped (adjustment rounds did nothing)"
    # one lookup per routed PICK (each token's each routed expert, every trunk layer), groups apart
    raw = _raw_stats(m)
    k = int(m.metadata[f"{m.metadata['general.architecture']}.expert_used_count"])
    assert st["cache_lookups"] == (len(prompt) + N_STEPS) * k * m.n_layer
    assert raw.cache_group_lookups < st["cache_lookups"], "the prompt's repeated picks were not merged into groups"
    assert raw.cache_group_hits <= raw.cache_group_lookups and st["cache_hits"] >= raw.cache_group_hits
    if budget == 0:
        assert raw.cache_group_hits == 0
    if budget == 1:
        # every missing group is admitted (one miss per group; its picks all miss), nothing runs on the CPU
        assert st["cpu_groups"] == 0 and raw.cache_group_hits == raw.cache_group_lookups - st["cache_admits"]
        assert st["cache_hits"] < st["cache_lookups"] - st["cache_admits"], "an admitted prompt group had one pick"


def test_tail_skip_follows_its_rule(tiny, reference, tmp_path):
    prompt, want, _ = reference
    k = 1          # tiny routes each token to 3 experts: skip what no token ranks first
    m = Model(tiny, threads=2, n_ctx=256, kv_type="f32", device="sim", pcie_frac=0.5, tail_skip=k,
              cache_gib=0.3 * _routed_bytes(tiny) / 2**30)
    trace = tmp_path / "routing.jsonl"
    m.trace_routing(trace)
    _greedy(m, prompt, steps=16)
    m.trace_routing(None)
    records = [json.loads(line) for line in trace.read_text().splitlines()]
    assert len(records) == (1 + 16) * m.n_layer
    n_skipped = 0
    for r in records:
        best = {}
        for ranked in r["tokens"]:
            for rank, e in enumerate(ranked):
                best[e] = min(best.get(e, rank), rank)
        resident = set(r["resident"])
        want_skip = {e for e, rk in best.items() if e not in resident and rk >= k}
        assert set(r["skipped"]) == want_skip, r
        assert not set(r["skipped"]) & resident
        n_skipped += len(r["skipped"])
        assert all(abs(sum(w) - 1) < 1e-5 for w in r["weights"])   # weights are never renormalised by a skip
    assert n_skipped > 0
    assert m.offload_stats()["skipped_experts"] == n_skipped


@pytest.fixture(scope="module")
def top10(tmp_path_factory) -> str:
    """tiny with 16 experts and top-10 routing (the real model's k), so the default skip rank 7 applies."""
    d = tmp_path_factory.mktemp("offload10")
    preset = json.loads((Path(models.presets_dir()) / "tiny.json").read_text())
    preset.update(num_experts=16, num_experts_per_tok=10)
    (d / "top10.json").write_text(json.dumps(preset))
    out = d / "top10.gguf"
    models.make_model(str(d / "top10.json"), str(out), recipe="f32", seed=2)
    return str(out)


def test_tail_skip_defaults(tiny, top10, monkeypatch):
    monkeypatch.delenv("STRATA_ROUTE_TAIL_SKIP", raising=False)
    cpu = Model(top10, threads=1, n_ctx=64)
    assert "cpu" in cpu.offload_log and cpu.offload_stats()["tail_skip"] == 0
    small = Model(top10, threads=1, n_ctx=64, device="sim", cache_gib=0.0)
    assert small.offload_stats()["tail_skip"] == 7 and "cache holds < 90%" in small.offload_log
    ss = small.session()
    for t in range(5):                  # one-token windows: the experts ranked 7..9 are skipped
        ss.eval([t])
    assert small.offload_stats()["skipped_experts"] == 5 * 4 * 3
    whole = Model(top10, threads=1, n_ctx=64, device="sim", tail_skip=0).offload_stats()["slot_bytes"] * 4 * 16
    full = Model(top10, threads=1, n_ctx=64, device="sim", cache_gib=whole / 2**30)
    assert full.offload_stats()["tail_skip"] == 0 and ">= 90%" in full.offload_log
    # a model routing to fewer experts than the rank never skips, and says why
    few = Model(tiny, threads=1, n_ctx=64, device="sim", cache_gib=0.0)
    assert few.offload_stats()["tail_skip"] == 0 and "fewer experts" in few.offload_log
    # asked for on the cpu device: it skips, and says it was asked
    monkeypatch.setenv("STRATA_ROUTE_TAIL_SKIP", "1")
    asked = Model(tiny, threads=1, n_ctx=64)
    assert asked.offload_stats()["tail_skip"] == 1 and "asked" in asked.offload_log
    asked.session().eval(list(range(20)))
    assert asked.offload_stats()["skipped_experts"] > 0


def test_offload_arguments(tiny):
    with pytest.raises(ValueError, match="device"):
        Model(tiny, device="tpu")
    with pytest.raises(ValueError, match="pcie_frac"):
        Model(tiny, device="sim", pcie_frac=1.5)
    m = Model(tiny, threads=1, n_ctx=64, device="sim", cache_gib=0.0, pcie_frac=0.25)
    assert m.offload_stats()["pcie_frac"] == pytest.approx(0.25)
    m.set_pcie_frac(0.75)
    assert m.offload_stats()["pcie_frac"] == pytest.approx(0.75)
    with pytest.raises(Exception, match="pcie_frac"):
        m.set_pcie_frac(2.0)
    # initial share from the link probe: 0.55 x probe / 20, clamped to [0, 1]
    auto = Model(tiny, threads=1, n_ctx=64, device="sim", sim_link_gbps=4)
    st = auto.offload_stats()
    assert 0 < st["probe_gbps"] <= 4.5
    assert st["pcie_frac"] == pytest.approx(min(1.0, 0.55 * st["probe_gbps"] / 20), rel=1e-4)


def test_prefill_streams_through_the_staging_ring(tiny, reference, tmp_path):
    """A prefill step of >= prefill_stream_min tokens sends every missing expert over the link
    through a ring of staging slots plus borrowed cache slots; the event log of the sim device shows
    the ring's order: a copy into a slot starts only after the last computation reading it ended
    ("used"), a computation on a copied slot only after its copy ended ("copied"); copies into other
    slots run ahead of the computations; the numbers are the CPU's."""
    prompt, want, want_rows = reference
    m = Model(tiny, threads=2, n_ctx=256, kv_type="f32", device="sim", pcie_frac=0.0, tail_skip=0,
              cache_gib=0.3 * _routed_bytes(tiny) / 2**30, prefill_stream_min=8, sim_link_gbps=0.05)
    m.device_events()
    s = m.session()
    got = s.eval(prompt)                      # one 24-token step: streamed
    log = tmp_path / "events.jsonl"
    m.device_events(log)
    assert np.abs(got - want_rows[0]).max() <= 1e-4
    st = m.offload_stats()
    assert st["prefill_chunks"] == 1 and st["borrowed_slots"] > 0
    assert st["cpu_groups"] == 0, "a streamed prefill left missing experts to the CPU"
    assert st["pcie_groups"] > 0
    ev = [json.loads(line) for line in log.read_text().splitlines()]
    copies = {e["seq"]: e for e in ev if e["engine"] == "copy"}
    computes = sorted((e for e in ev if e["engine"] == "compute"), key=lambda e: e["seq"])
    assert copies and computes
    for c in computes:                        # "copied": a computation starts after its copy ended
        if c["after"]:
            assert copies[c["after"]]["t1"] <= c["t0"]
    by_seq = {c["seq"]: c for c in computes}
    for cp in copies.values():                # "used": a copy starts after the slot's last reader ended
        if cp["after"]:
            assert cp["slot"] in by_seq[cp["after"]]["slots"]
            assert by_seq[cp["after"]]["t1"] <= cp["t0"]
    reuse = [cp for cp in copies.values() if cp["after"]]
    assert reuse, "no staging slot was reused within the chunk (the ring never wrapped)"
    # the copy engine runs ahead: copies into other slots are queued without waiting for computations
    # (whether they also overlap in time depends on how the OS schedules the engine threads)
    free_running = [cp for cp in copies.values() if not cp["after"]]
    assert len(free_running) >= 2
    # decode steps after it are not streamed (one token), and the borrowed slots came back
    for t in want[:4]:
        s.eval([t])
    assert m.offload_stats()["prefill_chunks"] == 1


def test_controller_adapts_pcie_frac_during_generation(tiny, capsys):
    """--split seed with pcie_frac unset: the share starts from the link probe and the controller
    (pyrunner.controller) updates it from measured rates once enough decode windows and missing groups were
    seen. With pcie_frac given the default split is seed and the share stays fixed; without, it is online."""
    assert Model(tiny, n_ctx=64, device="sim").split == "online"
    m = Model(tiny, threads=2, n_ctx=512, device="sim", cache_gib=0.0, tail_skip=0, sim_link_gbps=8, split="seed")
    start = m.offload_stats()["pcie_frac"]
    ban = {i: float("-inf") for i in range(300, m.n_vocab)}      # no end-of-generation token: run to -n
    c = m.generate("The offload engine", max_tokens=90, temperature=0, logit_bias=ban)
    assert c.stats["generated_tokens"] == 90
    ctl = m.controller
    assert ctl.updates >= 1, ctl.log
    assert c.stats["pcie_frac"] == pytest.approx(ctl.pcie_frac) and ctl.pcie_frac != pytest.approx(start)
    assert "pcie_frac" in capsys.readouterr().err
    fixed = Model(tiny, threads=2, n_ctx=512, device="sim", cache_gib=0.0, tail_skip=0, pcie_frac=0.3)
    assert fixed.split == "seed"
    c = fixed.generate("The offload engine", max_tokens=60, temperature=0, logit_bias=ban)
    assert c.stats["pcie_frac"] == pytest.approx(0.3)


def test_split_online_moves_per_layer_shares_and_keeps_the_tokens(tiny, reference):
    """--split online (strata.h strata_split): every layer's share moves on its own from what its windows
    cost, the Python controller stands aside, and the tokens are the cpu's whatever shares it picks."""
    prompt, want, _ = reference
    m = Model(tiny, threads=2, n_ctx=256, kv_type="f32", device="sim", cache_gib=0.0, tail_skip=0, split="online")
    assert m.controller is None and "split online" in m.offload_log
    toks, _ = _greedy(m, prompt)
    assert toks == want
    st = m.offload_stats()
    # whether a share moved depends on timings (the rule itself: tests/native/test_split.c); it stays bounded
    assert st["split"] == "online" and st["split_updates"] >= 0
    eps = 1e-6                                  # float32 shares, their mean in double
    assert 0.02 - eps <= st["pcie_frac_min"] <= st["pcie_frac"] + eps <= st["pcie_frac_max"] + 2 * eps <= 0.98 + 3 * eps
    m.set_pcie_frac(0.4)                       # sets every layer's share
    st = m.offload_stats()
    assert st["pcie_frac_min"] == pytest.approx(0.4) and st["pcie_frac_max"] == pytest.approx(0.4)
    with pytest.raises(ValueError, match="split 'fast'"):
        Model(tiny, device="sim", split="fast")


def test_session_stats_carry_the_offload_counters(tiny):
    m = Model(tiny, threads=1, n_ctx=64, device="sim", cache_gib=0.0002, pcie_frac=0.5, tail_skip=0)
    s = m.session()
    s.eval(list(range(12)))
    st = s.stats()
    assert st["cache_lookups"] > 0 and 0 <= st["hit_rate"] <= 1 and "ple_rows" in st
    assert "cache_lookups" not in Model(tiny, threads=1, n_ctx=64).session().stats()


def test_expert_pack(tiny, reference, tmp_path):
    """One blob per (layer, expert), byte for byte the GGUF's gate|up|down slices; copies read it (one
    copy per expert) with the same numbers; a pack that does not match the model is refused with a
    message naming it, and pyrunner rebuilds a stale one."""
    from pyrunner import expert_pack as xp
    from pyrunner._native import FormatError
    from pyrunner.gguf import GGUFFile

    pack = str(tmp_path / "tiny.experts.bin")
    side = xp.build(tiny, pack)
    data = open(pack, "rb").read()
    g = GGUFFile(tiny)
    for lay in side["layers"]:
        blob = lay["blob_bytes"]
        for e in (0, 5):
            want = b"".join(bytes(g.tensor_data(pc["tensor"])[e * pc["bytes"]:(e + 1) * pc["bytes"]])
                            for pc in lay["pieces"])
            assert data[lay["offset"] + e * blob: lay["offset"] + (e + 1) * blob] == want
    assert len(data) == side["header_bytes"] + side["payload_bytes"]

    prompt, want_toks, want_rows = reference
    kw = dict(threads=2, n_ctx=256, kv_type="f32", device="sim", cache_gib=0.3 * _routed_bytes(tiny) / 2**30,
              pcie_frac=0.5, tail_skip=0)
    with_pack = Model(tiny, expert_pack=pack, **kw)
    assert "expert pack" in with_pack.offload_log
    toks, rows = _greedy(with_pack, prompt, steps=16)
    assert toks == want_toks[:16] and np.abs(rows - want_rows[:17]).max() <= 1e-4
    without = Model(tiny, expert_pack=None, **kw)
    assert "three pieces" in without.offload_log
    _greedy(without, prompt, steps=16)
    assert with_pack.offload_stats()["pcie_bytes"] == without.offload_stats()["pcie_bytes"] > 0

    bad = bytearray(data)
    bad[32] ^= 1                                      # the model identity
    (tmp_path / "bad.bin").write_bytes(bad)
    with pytest.raises(FormatError, match=r"bad\.bin: built for another model file.*delete it"):
        Model(tiny, expert_pack=str(tmp_path / "bad.bin"), **kw)
    (tmp_path / "short.bin").write_bytes(data[:-10])
    with pytest.raises(FormatError, match=r"short\.bin: truncated"):
        Model(tiny, expert_pack=str(tmp_path / "short.bin"), **kw)
    assert xp.ensure(tiny, str(tmp_path / "bad.bin"), log=lambda s: None) == str(tmp_path / "bad.bin")
    Model(tiny, expert_pack=str(tmp_path / "bad.bin"), **kw)     # rebuilt: loads
