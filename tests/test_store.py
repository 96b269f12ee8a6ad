"""The expert store's RAM tier over the model file (issue 20 points 1 and 4): O_DIRECT reads of experts
into RAM slots on demand, a replacement policy, faults that end a request with a clear error.

Every test runs on the shipped flash-small model (q8_0, 16 layers x 32 experts, MTP head), with a RAM
budget far below its routed experts so that slots are evicted and reread all the time."""
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from pyrunner._native import StrataError
from pyrunner.model import Model, cache_policies

HERE = os.path.dirname(os.path.abspath(__file__))
MODEL = os.path.join(HERE, "..", "models", "flash-small", "flash-small-q8_0.gguf")
PROMPT = "def fibonacci(n):\n    "
SMALL = 0.01      # GiB: 87 slots of one 0.12 MiB expert, 32 of them one layer's scratch; the model has 544


@pytest.fixture(scope="module")
def reference():
    with Model(MODEL, mtp=0) as m:
        return m.generate(PROMPT, max_tokens=24, temperature=0).tokens


def _greedy(**kw):
    with Model(MODEL, **kw) as m:
        out = m.generate(PROMPT, max_tokens=24, temperature=0)
        return out.tokens, m.store_stats(), m.store_log, out.stats


@pytest.mark.parametrize("backend", ["io_uring", "pread"])
@pytest.mark.parametrize("policy", cache_policies())
def test_small_budget_gives_the_same_tokens_on_cpu(reference, backend, policy):
    toks, st, log, stats = _greedy(mtp=0, expert_io="direct", ram_gib=SMALL, expert_io_backend=backend,
                                   cache_policy=policy)
    assert toks == reference
    assert "direct (asked for)" in log and f"policy {policy}" in log
    # the budget holds a fraction of the experts: some picks miss and are read, some hit
    assert 0 < st["ram_hits"] < st["ram_lookups"]
    assert st["ram_miss_bytes"] > 0 and st["read_bytes"] >= st["ram_miss_bytes"]
    assert st["evictions"] > 0
    # aligned supersets: less than one 4 KiB block more at each end of a piece
    assert st["read_bytes"] < st["ram_miss_bytes"] + st["prefetch_bytes"] + st["reads"] * 2 * 4096
    assert stats["ram_hits"] >= 0 and stats["ram_miss_bytes"] > 0


def test_sim_device_with_ram_tier_gives_the_same_tokens(reference):
    with Model(MODEL, mtp=0, device="sim", cache_gib=0.002, tail_skip=0, expert_io="direct", ram_gib=SMALL) as m:
        toks = m.generate(PROMPT, max_tokens=24, temperature=0).tokens
        off, st = m.offload_stats(), m.store_stats()
        assert "copies from the expert store's RAM slots" in m.offload_log
    assert toks == reference
    # three tiers in use: device-resident hits, groups copied from RAM slots, RAM misses read from the file
    assert off["cache_hits"] > 0 and off["pcie_groups"] + off["cache_admits"] > 0 and st["ram_miss_bytes"] > 0


def test_mtp_drafts_with_the_ram_tier_give_the_same_tokens():
    with Model(MODEL, mtp=2) as m:
        ref = m.generate(PROMPT, max_tokens=24, temperature=0).tokens
    toks, st, _, stats = _greedy(mtp=2, expert_io="direct", ram_gib=SMALL)
    assert toks == ref and stats["drafts_proposed"] > 0 and st["ram_lookups"] > 0


def test_a_budget_below_one_layer_is_refused_with_the_smallest_that_works():
    with pytest.raises(StrataError) as e:
        Model(MODEL, expert_io="direct", ram_gib=0.001)
    msg = str(e.value)
    assert "one layer routes to up to 32" in msg and "give at least" in msg
    least = float(msg.split("--ram-gib ")[1].split(")")[0])
    with Model(MODEL, expert_io="direct", ram_gib=least, mtp=0) as m:   # the figure it names works
        assert m.generate(PROMPT, max_tokens=4, temperature=0).tokens


def test_auto_keeps_mmap_when_the_experts_fit():
    with Model(MODEL) as m:
        assert m.store_log.startswith("experts: mmap (auto:") and m.store_stats()["active"] == 0


def test_bad_arguments_say_what_to_use():
    with pytest.raises(ValueError, match="choose one of auto, mmap, direct"):
        Model(MODEL, expert_io="odirect")
    with pytest.raises(ValueError, match="cache_policy 'belady'"):
        Model(MODEL, cache_policy="belady")
    with pytest.raises(ValueError, match="ram_gib sizes the RAM slots"):
        Model(MODEL, expert_io="mmap", ram_gib=1)


def test_an_injected_short_read_ends_the_request_and_the_model_stays_usable(reference, monkeypatch):
    monkeypatch.setenv("STRATA_EXPERT_IO_TEST_SHORT_AT", "40")
    with Model(MODEL, mtp=0, expert_io="direct", ram_gib=SMALL) as m:
        with pytest.raises(StrataError, match="short read of layer .* expert .*: the file was truncated or replaced"):
            m.generate(PROMPT, max_tokens=24, temperature=0)
        # the hook fires once; the slot whose read failed is not trusted: the next request reads it again
        assert m.generate(PROMPT, max_tokens=24, temperature=0).tokens == reference


@pytest.fixture
def model_copy(tmp_path):
    dst = tmp_path / "copy.gguf"
    shutil.copyfile(MODEL, dst)
    return str(dst)


def test_a_file_truncated_under_the_engine_gives_the_error(model_copy):
    with Model(model_copy, mtp=0, expert_io="direct", ram_gib=SMALL) as m:
        m.generate(PROMPT, max_tokens=4, temperature=0)
        size = os.path.getsize(model_copy)
        os.truncate(model_copy, size // 2)
        for _ in range(2):   # and again: an error each time, never a crash
            with pytest.raises(StrataError, match="changed size since it was loaded .* reload the model"):
                m.generate("Another prompt entirely, to miss in RAM: " * 3, max_tokens=8, temperature=0)


def test_a_file_rewritten_under_the_engine_gives_the_error(model_copy):
    with Model(model_copy, mtp=0, expert_io="direct", ram_gib=SMALL) as m:
        m.generate(PROMPT, max_tokens=4, temperature=0)
        st = os.stat(model_copy)
        os.utime(model_copy, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
        with pytest.raises(StrataError, match="was modified since it was loaded"):
            m.generate("Another prompt entirely, to miss in RAM: " * 3, max_tokens=8, temperature=0)


def _cgroup_v1():
    """The v1 memory controller when this test may make groups in it: root, and not inside the sanitizer run
    (its children inherit ASan, whose shadow memory does not fit a few hundred MiB)."""
    root = "/sys/fs/cgroup/memory"
    if os.environ.get("STRATA_UNDER_SANITIZER") == "1":
        return None
    return root if os.path.isfile(os.path.join(root, "memory.limit_in_bytes")) and os.access(root, os.W_OK) else None


@pytest.mark.skipif(_cgroup_v1() is None, reason="needs a writable cgroup v1 memory controller (root), outside the sanitizer run")
def test_auto_picks_direct_under_a_memory_limit(tmp_path):
    """In a memory cgroup too small for the experts beside the rest, auto reads them directly, says why, and
    the budget is what the limit leaves."""
    cg = os.path.join(_cgroup_v1(), f"strata-test-{os.getpid()}")
    os.mkdir(cg)
    try:
        with open(os.path.join(cg, "memory.limit_in_bytes"), "w") as f:
            f.write(str(520 << 20))   # below flash-small's rest (dense, state, a 512 MiB margin + 1/16): no room
        code = ("import os,sys; open(sys.argv[1] + '/cgroup.procs', 'w').write(str(os.getpid()));"
                "from pyrunner.model import Model; m = Model(sys.argv[2], mtp=0, n_ctx=2048);"
                "print(m.store_log); print(m.generate('def f(x):', max_tokens=8, temperature=0).tokens)")
        r = subprocess.run([sys.executable, "-c", code, cg, MODEL], capture_output=True, text=True, timeout=300,
                           env={**os.environ, "PYTHONPATH": os.path.join(HERE, "..")})
        assert r.returncode == 0, r.stderr
        log = r.stdout.splitlines()[0]
        assert "experts: direct (auto:" in log and "memory.limit_in_bytes" in log, log
    finally:
        os.rmdir(cg)


def test_prefetch_never_changes_results_and_is_counted(reference):
    on_toks, on, _, stats = _greedy(mtp=0, expert_io="direct", ram_gib=SMALL)
    off_toks, off, _, _ = _greedy(mtp=0, expert_io="direct", ram_gib=SMALL, expert_prefetch=False)
    assert on_toks == off_toks == reference
    assert off["prefetch_experts"] == 0 and off["predicted"] == 0
    assert on["prefetch_experts"] > 0 and on["prefetch_bytes"] > 0
    assert 0 <= on["prefetch_unused_bytes"] <= on["prefetch_bytes"]
    assert 0 < on["predicted_right"] <= on["predicted"]
    assert 0.0 < stats["prefetch_recall"] <= 1.0
    # experts read ahead and then used are RAM hits of the next layer: fewer demand misses than without
    assert on["ram_miss_bytes"] < off["ram_miss_bytes"]


@pytest.mark.skipif(_cgroup_v1() is None, reason="needs a writable cgroup v1 memory controller (root), outside the sanitizer run")
def test_bench_model_under_a_memory_limit_reports_every_run():
    """strata bench model --mem-limit-gib: each run in its own child in its own cgroup; what it reports."""
    from pyrunner import bench

    res = bench.bench_model_limited(MODEL, 0.55, prompt_tokens=8, gen_tokens=4, log=lambda s: None)
    runs = res["runs"]
    assert set(runs) == {"strata", "strata_limited", "strata_mmap_limited"}
    assert all(r["decode_tps"] > 0 for r in runs.values())
    lim = runs["strata_limited"]
    assert "experts: direct" in lim["store_log"] and "memory.limit_in_bytes" in lim["store_log"]
    assert lim["ram_miss_bytes_per_token"] >= 0 and 0 <= lim["ram_hit_rate"] <= 1
    assert runs["strata"]["store_log"].startswith("experts: mmap")
    assert res["ratios"]["limited_over_strata"] > 0
    assert "limited_over_llama_limited" not in res["ratios"]       # llama.cpp was not asked for
    assert "memory limit 0.55 GiB per engine" in bench.format_limited_table(res)
