"""strata batch / pyrunner.batch on the tiny preset: results equal generate()'s, bad lines get an
"error" and the run goes on, and a run killed with SIGKILL mid-way resumes with no id lost or written
twice (including a last line the kill cut short)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from pyrunner.batch import parse_request, read_done, run_batch
from pyrunner.generate import end_of_generation_ids, generate, prompt_ids, render_messages
from pyrunner.model import Model
from pyrunner.models import make_model
from pyrunner.sampling import SamplingParams

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("batch") / "tiny.gguf"
    make_model("tiny", str(path), "f32", 0)
    return str(path)


@pytest.fixture(scope="module")
def model(tiny_path):
    with Model(tiny_path, threads=2, n_ctx=512) as m:
        yield m


def _lines(path) -> list[dict]:
    return [json.loads(x) for x in Path(path).read_text().splitlines()]


def _write(path, recs) -> None:
    Path(path).write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in recs))


def test_results_match_generate_and_bad_lines_get_errors(model, tmp_path):
    msgs = [{"role": "user", "content": "hi"}]
    good = [{"id": "p", "prompt": "hello there", "max_tokens": 7, "temperature": 0},
            {"id": 7, "messages": msgs, "max_tokens": 5, "temperature": 0},
            {"id": "s", "prompt": "seeded", "max_tokens": 6, "temperature": 1.0, "seed": 3, "top_k": 0,
             "top_p": 1.0, "min_p": 0.0, "stop": ["zz"]}]
    inp = tmp_path / "in.jsonl"
    _write(inp, [good[0], "this is not json", {"prompt": "no id"}, {"id": "both", "prompt": "a", "messages": msgs},
                 {"id": "typo", "prompt": "a", "temprature": 0}, good[1], "", {"id": "p", "prompt": "dup"},
                 {"id": "long", "prompt": "x " * 600}, {"id": "badp", "prompt": "a", "top_p": 3}, good[2]])
    out = tmp_path / "out.jsonl"
    counts = run_batch(model, str(inp), str(out), SamplingParams(max_tokens=4), progress=False)
    assert counts == {"total": 9, "skipped": 0, "done": 3, "errors": 6, "duplicates": 1}
    recs = _lines(out)
    assert len(recs) == 9
    by = {json.dumps(r["id"]): r for r in recs if r["id"] is not None}
    assert "unknown field(s) temprature" in by['"typo"']["error"]
    assert "exactly one of" in by['"both"']["error"]
    assert "context holds 512" in by['"long"']["error"]
    assert "--top-p" in by['"badp"']["error"]
    anon = [r for r in recs if r["id"] is None]
    assert [r["line"] for r in anon] == [2, 3] and "not valid JSON" in anon[0]["error"]
    for g in good:
        kw = {k: v for k, v in g.items() if k not in ("id", "prompt", "messages")}
        if "messages" in g:
            ids = prompt_ids(model, render_messages(model, g["messages"]), add_special=False)
        else:
            ids = prompt_ids(model, g["prompt"])
        ref = generate(model, ids, session=model.session(), **kw)
        r = by[json.dumps(g["id"])]
        assert set(r) == {"id", "text", "finish_reason", "stats"}
        assert r["text"] == ref.text and r["finish_reason"] == ref.finish_reason
        assert r["stats"]["generated_tokens"] == ref.stats["generated_tokens"]
    # a second run finds everything done and writes nothing
    again = run_batch(model, str(inp), str(out), SamplingParams(max_tokens=4), progress=False)
    assert again["skipped"] == 9 and again["done"] == again["errors"] == 0
    assert len(_lines(out)) == 9


def test_requests_sharing_a_system_prompt_evaluate_it_once(model, tmp_path):
    system = {"role": "system", "content": "You answer in one short sentence. " * 6}
    reqs = [{"id": f"q{i}", "messages": [system, {"role": "user", "content": f"question {i}?"}],
             "max_tokens": 3, "temperature": 0} for i in range(3)]
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    _write(inp, reqs)
    run_batch(model, str(inp), str(out), progress=False)
    recs = _lines(out)
    ids = [prompt_ids(model, render_messages(model, r["messages"]), add_special=False) for r in reqs]
    shared = next(i for i in range(len(ids[0])) if ids[0][i] != ids[1][i])
    assert shared > 20
    assert recs[0]["stats"]["reused_prompt_tokens"] == 0
    assert [r["stats"]["reused_prompt_tokens"] for r in recs[1:]] == [shared, shared]
    for r, q in zip(recs, ids):              # the same answers as on a fresh session
        assert r["text"] == generate(model, q, max_tokens=3, temperature=0, session=model.session()).text


def test_resume_repairs_a_cut_last_line_and_skips_done_ids(model, tmp_path):
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    reqs = [{"id": f"r{i}", "prompt": f"prompt number {i}", "max_tokens": 4, "temperature": 0} for i in range(6)]
    _write(inp, reqs[:3])
    run_batch(model, str(inp), str(out), progress=False)
    with open(out, "ab") as f:
        f.write(b'{"id": "r3", "text": "half wri')       # what a kill in the middle of a write leaves
    assert read_done(str(out)) == {'"r0"', '"r1"', '"r2"'}
    assert out.read_bytes().endswith(b"\n")                # the cut line is gone
    _write(inp, reqs)
    counts = run_batch(model, str(inp), str(out), progress=False)
    assert counts["skipped"] == 3 and counts["done"] == 3
    assert [r["id"] for r in _lines(out)] == [f"r{i}" for i in range(6)]


def test_parse_request_keys_ids_by_json_value():
    assert parse_request('{"id": 1, "prompt": "a"}', 1)[0] != parse_request('{"id": "1", "prompt": "a"}', 2)[0]
    key, rec = parse_request('{"id": true, "prompt": "a"}', 4)
    assert key == "line:4" and rec["line"] == 4 and "id" in rec["error"]


def test_kill_9_mid_run_then_resume_loses_and_duplicates_nothing(model, tiny_path, tmp_path):
    eog = sorted(end_of_generation_ids(model))
    n = 160
    inp, out, ref_out = tmp_path / "in.jsonl", tmp_path / "out.jsonl", tmp_path / "ref.jsonl"
    _write(inp, [{"id": i, "prompt": f"request {i} says"} for i in range(n)])
    args = [sys.executable, "-m", "pyrunner.cli", "batch", str(inp), "-o", str(out), "-m", tiny_path,
            "-n", "40", "--temp", "0", "--threads", "1", "--n-ctx", "512", "-q"]
    args += [a for t in eog for a in ("--logit-bias", f"{t}-inf")]
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.Popen(args, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.time() + 60
    while time.time() < deadline and proc.poll() is None:
        if out.exists() and out.read_bytes().count(b"\n") >= 5:
            break
        time.sleep(0.005)
    assert proc.poll() is None, f"the run ended before it could be killed: {proc.communicate()}"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    killed_at = out.read_bytes().count(b"\n")
    assert 5 <= killed_at < n
    with open(out, "ab") as f:          # as if the kill had landed inside a write
        f.write(b'{"id": %d, "text": "cut sh' % killed_at)
    r = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "partly written last line" in r.stderr and f"{killed_at} already in" in r.stderr
    recs = _lines(out)
    assert sorted(x["id"] for x in recs) == list(range(n))
    # the same results as a run that was never interrupted
    ref = run_batch(model, str(inp), str(ref_out),
                    SamplingParams(temperature=0, max_tokens=40, logit_bias={t: -np.inf for t in eog}), progress=False)
    assert ref["done"] == n
    want = {x["id"]: x["text"] for x in _lines(ref_out)}
    assert {x["id"]: x["text"] for x in recs} == want
