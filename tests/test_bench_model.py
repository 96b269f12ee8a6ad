"""`strata bench model` (pyrunner.bench.bench_model) on the tiny preset: the JSON structure, the numbers are
positive and consistent with each other, the prompt is the fixed seeded one, the human table, clean errors, and a
llama.cpp that crashes (a real signal in its child process): Strata's figures, the crash message, exit status 1.
Nothing here asserts a speed."""
from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest
from click.testing import CliRunner

from pyrunner import bench
from pyrunner._native import ISA_NAMES
from pyrunner.cli import main
from pyrunner.models import make_model

RATE_KEYS = {"prefill_tps", "decode_tps", "prefill_s", "decode_s", "prompt_tokens", "generated_tokens", "load_s"}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("bench_model") / "tiny-q8_0.gguf"
    make_model("tiny", str(out), "q8_0", 0)
    return out


def _check_rates(r: dict, prompt: int, gen: int, strata: bool = False) -> None:
    assert set(r) == RATE_KEYS | ({"tokenize_first_s", "repack_bytes"} if strata else set())
    if strata:
        assert r["tokenize_first_s"] > 0
        assert r["repack_bytes"] == 0      # a q8_0 file: no type with a converted prefill layout
    assert r["prompt_tokens"] == prompt and r["generated_tokens"] == gen
    for k in ("prefill_s", "decode_s", "prefill_tps", "decode_tps"):
        assert r[k] > 0, k
    assert r["load_s"] >= 0
    assert r["prefill_tps"] == pytest.approx(prompt / r["prefill_s"])
    assert r["decode_tps"] == pytest.approx(gen / r["decode_s"])


def test_json_vs_llama_cpp(tiny):
    res = CliRunner().invoke(main, ["bench", "model", "-m", str(tiny), "--json", "--vs-llama-cpp",
                                    "--prompt-tokens", "24", "--gen-tokens", "6", "--threads", "2"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)                 # progress lines go to stderr
    assert {"strata", "llama_cpp", "ratios", "settings", "same_tokens"} <= set(out)
    _check_rates(out["strata"], 24, 6, strata=True)
    _check_rates(out["llama_cpp"], 24, 6)
    for k in ("prefill_tps", "decode_tps"):
        assert out["ratios"][k] == pytest.approx(out["strata"][k] / out["llama_cpp"][k])
    s = out["settings"]
    assert (s["threads"], s["prompt_tokens"], s["gen_tokens"], s["kv_type"]) == (2, 24, 6, "f16")
    assert s["llama_cpp_kv"] == "K f16, V f16, flash attention off"
    assert s["strata_isa"] in ISA_NAMES and s["llama_cpp_cpu"], s   # the ISA each side used
    assert isinstance(out["same_tokens"], bool)


def _segfaulting_llama_run(path, *args):
    """Stands in for bench._llama_run in llama.cpp's child process: dies as a crashing llama.cpp does."""
    os.kill(os.getpid(), signal.SIGSEGV)


def test_llama_cpp_crash_keeps_stratas_figures_and_exits_1(tiny, monkeypatch):
    # the child unpickles this module's function by name: a real SIGSEGV in a real child process
    monkeypatch.setattr(bench, "_llama_run", _segfaulting_llama_run)
    want = f"llama.cpp crashed with signal 11 (SIGSEGV) on {tiny}"
    args = ["bench", "model", "-m", str(tiny), "--vs-llama-cpp", "--prompt-tokens", "12", "--gen-tokens", "3"]
    res = CliRunner().invoke(main, args + ["--json"])
    assert res.exit_code == 1, res.output
    out = json.loads(res.stdout)
    _check_rates(out["strata"], 12, 3, strata=True)
    assert set(out["llama_cpp"]) == {"error"} and out["llama_cpp"]["error"].startswith(want)
    assert "ratios" not in out and "same_tokens" not in out
    assert want in res.stderr and "Traceback" not in res.output
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 1
    rows = res.stdout.splitlines()
    assert float(next(r for r in rows if r.startswith("strata ")).split()[1]) > 0
    assert any(r.startswith("llama.cpp") and "no figures" in r and "SIGSEGV" in r for r in rows)
    assert not any(r.startswith("ratio") for r in rows)
    assert want in res.stderr


def test_table_strata_only(tiny):
    res = CliRunner().invoke(main, ["bench", "model", "-m", str(tiny), "--prompt-tokens", "16", "--gen-tokens", "4",
                                    "--kv-type", "f32"])
    assert res.exit_code == 0, res.output
    lines = res.stdout.splitlines()
    row = next(line for line in lines if line.startswith("strata "))
    assert float(row.split()[1]) > 0 and float(row.split()[2]) > 0
    assert not any(line.startswith(("llama.cpp", "ratio")) for line in lines)
    isa = next(line for line in lines if line.startswith("kernel paths: strata "))
    assert "(no prefill repack)" in isa, isa          # q8_0: nothing converts its rows


def test_prompt_is_fixed_and_in_vocab():
    a = bench.bench_prompt(320, 512)
    assert a == bench.bench_prompt(320, 512) and len(a) == 512
    assert 0 <= min(a) and max(a) < 320 and len(set(a)) > 200
    assert bench.bench_prompt(320, 512, seed=1) != a


def test_errors_are_clean(tiny, tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF\x03\x00\x00\x00" + b"\xff" * 16)
    res = CliRunner().invoke(main, ["bench", "model", "-m", str(bad), "--gen-tokens", "1", "--prompt-tokens", "2"])
    assert res.exit_code == 1 and "bad.gguf" in res.output and "Traceback" not in res.output
    res = CliRunner().invoke(main, ["bench", "model", "-m", str(tiny), "--prompt-tokens", "0"])
    assert res.exit_code == 1 and "--prompt-tokens" in res.output
    res = CliRunner().invoke(main, ["bench", "model", "-m", str(tiny), "--kv-type", "q4"])
    assert res.exit_code == 2
    res = CliRunner().invoke(main, ["bench", "model", "-m", str(tmp_path / "missing.gguf")])
    assert res.exit_code == 2 and "missing.gguf" in res.output


def test_mtp_next_to_plain_decode_at_forced_rates(tmp_path):
    path = tmp_path / "tiny-mtp.gguf"
    make_model("tiny", str(path), "f32", 0, mtp=True)
    r = CliRunner().invoke(main, ["bench", "model", "-m", str(path), "--json", "--mtp", "2", "--prompt-tokens", "40",
                                  "--gen-tokens", "24"])
    assert r.exit_code == 0, r.output
    res = json.loads(r.stdout)
    assert res["settings"]["mtp"] == 2 and res["plain"]["decode_tps"] > 0
    forced = {f["rate"]: f for f in res["forced"]}
    assert set(forced) == set(bench.MTP_RATES)
    assert all(f["same_tokens"] for f in res["forced"]) and res["natural"]["same_tokens"]
    assert forced[1.0]["drafts_accepted"] == forced[1.0]["drafts_proposed"] > 0
    assert forced[0.0]["drafts_accepted"] == 0 and forced[0.0]["mean_accepted_len"] == 1.0
    assert forced[1.0]["mean_accepted_len"] > forced[0.5]["mean_accepted_len"] > 1.0
    for f in res["forced"]:
        assert f["windows"] > 0 and f["verify_ms"] > 0 and f["rollback_ms"] >= 0
    # a file without the head is refused with a way out
    plain = tmp_path / "tiny.gguf"
    make_model("tiny", str(plain), "f32", 0)
    r = CliRunner().invoke(main, ["bench", "model", "-m", str(plain), "--mtp", "2"])
    assert r.exit_code != 0 and "no MTP block" in r.output


def test_mtp_auto_next_to_every_fixed_k(tmp_path):
    """bench model --mtp auto: auto and k = 0..mtp-max side by side with the head's own drafts, at every
    forced rate and on the switching schedule (the JSON the issue names); every run decodes the same
    greedy tokens; forced rate 1 takes every draft auto made; the first auto run probes."""
    path = tmp_path / "tiny-mtp.gguf"
    make_model("tiny", str(path), "f32", 0, mtp=True)
    r = CliRunner().invoke(main, ["bench", "model", "-m", str(path), "--json", "--mtp", "auto", "--mtp-max", "2",
                                  "--prompt-tokens", "20", "--gen-tokens", "140"])
    assert r.exit_code == 0, r.output
    res = json.loads(r.stdout)
    assert res["settings"]["mtp"] == "auto" and res["settings"]["mtp_max"] == 2
    rows = [res["natural"], res["switching"]] + res["forced"]
    assert [f["rate"] for f in res["forced"]] == list(bench.MTP_RATES)
    for row in rows:
        assert set(row["fixed"]) == {"0", "1", "2"} and set(row["vs_each"]) == {"0", "1", "2"}
        assert row["auto"]["same_tokens"] and all(f["same_tokens"] for f in row["fixed"].values())
        assert 0 <= row["auto"]["mtp_k"] <= 2 and row["vs_best_fixed"] > 0
    one = next(f for f in res["forced"] if f["rate"] == 1.0)
    assert one["auto"]["drafts_accepted"] == one["auto"]["drafts_proposed"]
    # the process's first auto request probes; later ones may not, when the costs it carried (Model.mtp_ratios)
    # say no draft can pay on this tiny model (DraftPolicy(ratios=...))
    assert res["natural"]["auto"]["drafts_proposed"] > 0
    assert one["fixed"]["0"]["drafts_proposed"] == 0
    assert "auto/best" in bench.format_mtp_auto_table(res)
    r = CliRunner().invoke(main, ["bench", "model", "-m", str(path), "--mtp", "often"])
    assert r.exit_code == 2 and "'auto'" in r.output


def test_mtp_auto_rounds_and_rates(tmp_path):
    """--rounds N runs every row N times, auto first and last in turn, and reports each round's tokens/s and
    ratios with their medians; --mtp-rates picks the forced rates; bad rates are refused."""
    path = tmp_path / "tiny-mtp.gguf"
    make_model("tiny", str(path), "f32", 0, mtp=True)
    r = CliRunner().invoke(main, ["bench", "model", "-m", str(path), "--json", "--mtp", "auto", "--mtp-max", "1",
                                  "--prompt-tokens", "12", "--gen-tokens", "40", "--rounds", "3",
                                  "--mtp-rates", "0,0.9"])
    assert r.exit_code == 0, r.output
    res = json.loads(r.stdout)
    assert res["settings"]["rounds"] == 3 and [f["rate"] for f in res["forced"]] == [0.0, 0.9]
    for row in [res["natural"], res["switching"]] + res["forced"]:
        assert len(row["rounds"]) == 3 and row["same_tokens"]
        ratios = [rd["vs_best_fixed"] for rd in row["rounds"]]
        assert row["vs_best_fixed"] == pytest.approx(sorted(ratios)[1])
        for rd in row["rounds"]:
            assert rd["vs_best_fixed"] == pytest.approx(rd["auto"] / max(rd["fixed"].values()))
    table = bench.format_mtp_auto_table(res)
    assert "forced 0.90 r3" in table and "median" in table
    r = CliRunner().invoke(main, ["bench", "model", "-m", str(path), "--mtp", "auto", "--mtp-rates", "0,2"])
    assert r.exit_code == 2 and "[0, 1]" in r.output


def test_mtp_auto_rows(tmp_path):
    """--mtp-rows runs only the rows named (here the switching schedule: the slow part on a big model is the
    other rows); a row it does not know is refused with the ones it does."""
    path = tmp_path / "tiny-mtp.gguf"
    make_model("tiny", str(path), "f32", 0, mtp=True)
    r = CliRunner().invoke(main, ["bench", "model", "-m", str(path), "--json", "--mtp", "auto", "--mtp-max", "1",
                                  "--prompt-tokens", "12", "--gen-tokens", "24", "--mtp-rows", "switching"])
    assert r.exit_code == 0, r.output
    res = json.loads(r.stdout)
    assert res["settings"]["rows"] == ["switching"] and "natural" not in res and "forced" not in res
    assert set(res["switching"]["fixed"]) == {"0", "1"} and res["switching"]["same_tokens"]
    table = bench.format_mtp_auto_table(res)
    assert "switch 0.2/0.95" in table and "head's own" not in table and "forced" not in table
    r = CliRunner().invoke(main, ["bench", "model", "-m", str(path), "--mtp", "auto", "--mtp-rows", "switching,fast"])
    assert r.exit_code != 0 and "natural, forced, switching" in r.output


def test_break_even_interpolates():
    assert bench._break_even([(0.0, 0.5), (0.5, 0.9), (1.0, 1.3)]) == pytest.approx(0.625)
    assert bench._break_even([(0.0, 1.1), (1.0, 2.0)]) == 0.0
    assert bench._break_even([(0.0, 0.2), (1.0, 0.9)]) is None


def test_split_compare_reports_both_splits_side_by_side():
    """strata bench model --split-compare: rounds of (seed, online) on sim with the same tokens; what it reports."""
    from pyrunner import bench

    flash = str(Path(__file__).resolve().parent.parent / "models" / "flash-small" / "flash-small-q8_0.gguf")
    res = bench.bench_split(flash, cache_gib=0.004, prompt_tokens=8, gen_tokens=8, rounds=1, log=lambda s: None)
    assert [r["split"] for r in res["runs"]] == ["seed", "online"]
    assert res["same_tokens"] and all(r["tokens"] == 8 and r["decode_tps"] > 0 for r in res["runs"])
    assert len(res["ratio_per_round"]) == 1 and res["ratio_per_round"][0] > 0
    assert "online / seed per round" in bench.format_split_table(res)

