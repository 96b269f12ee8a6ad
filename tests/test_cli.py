"""The `strata` command line: inspect (human and --json) and bench kernels."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from gguf import GGUFReader

from pyrunner import bench
from pyrunner.cli import main

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def demo(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("cli") / "demo.gguf"
    subprocess.run([sys.executable, str(ROOT / "tools" / "make_demo_gguf.py"), str(path)], check=True)
    return path


def test_inspect_json_matches_gguf_reader(demo):
    r = CliRunner().invoke(main, ["inspect", str(demo), "--json"])
    assert r.exit_code == 0, r.output
    info = json.loads(r.output)
    assert set(info) == {"metadata", "tensors"}
    ref = GGUFReader(str(demo))
    assert info["metadata"]["general.architecture"] == "qwen4exp"
    assert info["metadata"]["qwen4exp.ple.layer_multipliers"] == [15411308609579, 2523213358983, 11275943025685]
    assert info["metadata"]["tokenizer.ggml.tokens"] == ["a", "b", "<|endoftext|>"]
    assert [t["name"] for t in info["tensors"]] == [t.name for t in ref.tensors]
    for got, want in zip(info["tensors"], ref.tensors):
        assert set(got) == {"name", "type", "shape", "offset", "size"}
        assert got["type"] == want.tensor_type.name
        assert got["shape"] == [int(d) for d in want.shape]
        assert got["offset"] == int(want.data_offset)
        assert got["size"] == int(want.n_bytes)


def test_inspect_human_output_lists_tensors_and_type_shares(demo):
    r = CliRunner().invoke(main, ["inspect", str(demo)])
    assert r.exit_code == 0, r.output
    assert "blk.0.ffn_gate_exps.weight" in r.output and "Q8_0" in r.output
    assert "weights by type:" in r.output
    shares = [float(line.split()[-2]) for line in r.output.split("weights by type:")[1].strip().splitlines()]
    assert abs(sum(shares) - 100.0) < 0.05


def test_inspect_bad_file_is_a_clean_error(tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF\x03\x00\x00\x00" + b"\xff" * 16)
    r = CliRunner().invoke(main, ["inspect", str(bad)])
    assert r.exit_code == 1
    assert "Error:" in r.output and "bad.gguf" in r.output
    assert "Traceback" not in r.output


def test_bench_kernels_measures(capsys):
    res = bench.run(types=["Q8_0", "Q4_K"], threads=2, batches=(1, 3), shapes=[("small", 64, 512)],
                    log=lambda s: None)
    assert res["threads"] == 2 and res["probe_gbps"]["1"] > 0
    rows = res["results"]
    assert {(r["type"], r["batch"], r["threads"]) for r in rows} == {
        (t, b, n) for t in ("Q8_0", "Q4_K") for b in (1, 3) for n in (1, 2)}
    for r in rows:
        assert r["seconds"] > 0 and np.isfinite(r["weight_gbps"]) and r["gflops"] > 0
        assert r["gflops"] == pytest.approx(2 * 64 * 512 * r["batch"] / r["seconds"] / 1e9)


def test_bench_kernels_takes_type_names_as_the_recipes_spell_them(monkeypatch):
    seen = {}
    monkeypatch.setattr(bench, "run", lambda **kw: seen.update(kw) or {})
    r = CliRunner().invoke(main, ["bench", "kernels", "--types", "q8_0, iq2_xs,Q4_K", "--json"])
    assert r.exit_code == 0, r.output
    assert seen["types"] == ["Q8_0", "IQ2_XS", "Q4_K"]


def test_bench_kernels_rejects_unknown_type():
    r = CliRunner().invoke(main, ["bench", "kernels", "--types", "Q9_9"])
    assert r.exit_code != 0 and "unknown or unsupported types" in r.output


def test_quantize_command_writes_the_recipe_and_reports_shares(demo, tmp_path):
    out = tmp_path / "demo-q8.gguf"
    r = CliRunner().invoke(main, ["quantize", str(demo), str(out), "--recipe", "q8_0", "--quiet"])
    assert r.exit_code == 0, r.output
    assert "Q8_0" in r.output and "%" in r.output
    info = json.loads(CliRunner().invoke(main, ["inspect", str(out), "--json"]).output)
    types = {t["name"]: t["type"] for t in info["tensors"]}
    assert types["blk.0.attn_q.weight"] == "Q8_0"        # was BF16
    assert types["blk.0.attn_q_norm.weight"] == "F32"    # norms stay F32
    bad = CliRunner().invoke(main, ["quantize", str(demo), str(out), "--recipe", "q3"])
    assert bad.exit_code == 2 and "q3" in bad.output
