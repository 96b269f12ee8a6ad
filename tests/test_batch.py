"""strata batch / pyrunner.batch on the tiny preset: results equal generate()'s, bad lines (bad JSON,
not UTF-8, ...) get an "error" naming their line and the run goes on, a BOM is skipped, -o the input is
refused, --retry-errors replaces error records, and runs killed with SIGKILL at several moments of a
--retry-errors run resume to one complete record per id (including a last line a kill cut short)."""
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
from click.testing import CliRunner

from pyrunner.batch import BatchError, parse_request, run_batch
from pyrunner.cli import main
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
                 {"id": "long", "prompt": "x " * 600}, {"id": "badp", "prompt": "a", "top_p": 3}, good[2],
                 {"id": "role", "messages": [{"role": ["user"], "content": "x"}]},
                 {"id": "lb", "prompt": "a", "logit_bias": 3.5}])     # stopped the whole run once (AttributeError)
    out = tmp_path / "out.jsonl"
    counts = run_batch(model, str(inp), str(out), SamplingParams(max_tokens=4), progress=False)
    assert counts == {"total": 11, "skipped": 0, "done": 3, "errors": 8, "duplicates": 1}
    recs = _lines(out)
    assert len(recs) == 11
    by = {json.dumps(r["id"]): r for r in recs if r["id"] is not None}
    assert "unknown field(s) temprature" in by['"typo"']["error"]
    assert "exactly one of" in by['"both"']["error"]
    assert "context holds 512" in by['"long"']["error"]
    assert "--top-p" in by['"badp"']["error"]
    assert "messages[0].role must be a string" in by['"role"']["error"]
    assert "--logit-bias" in by['"lb"']["error"]
    anon = [r for r in recs if r["id"] is None]
    assert [r["line"] for r in anon] == [2, 3] and "not valid JSON" in anon[0]["error"]
    # every error names its input line, in the record and in the message (run-time errors too)
    errs = [r for r in recs if "error" in r]
    assert [r["line"] for r in errs] == [2, 3, 4, 5, 9, 10, 12, 13]
    assert all(r["error"].startswith(f"line {r['line']}: ") for r in errs)
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
    assert again["skipped"] == 11 and again["done"] == again["errors"] == 0
    assert len(_lines(out)) == 11


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


def test_resume_drops_a_cut_last_line_through_a_rename_and_skips_done_ids(model, tmp_path, capsys):
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    reqs = [{"id": f"r{i}", "prompt": f"prompt number {i}", "max_tokens": 4, "temperature": 0} for i in range(6)]
    _write(inp, reqs[:3])
    run_batch(model, str(inp), str(out), progress=False)
    with open(out, "ab") as f:
        f.write(b'{"id": "r3", "text": "half wri')       # what a kill in the middle of a write leaves
    inode = out.stat().st_ino
    _write(inp, reqs)
    counts = run_batch(model, str(inp), str(out), progress=False)
    assert counts["skipped"] == 3 and counts["done"] == 3
    assert "partly written last line" in capsys.readouterr().err
    assert [r["id"] for r in _lines(out)] == [f"r{i}" for i in range(6)] and out.read_bytes().endswith(b"\n")
    # never repaired in place: a new file renamed over OUT, and no temporary file left beside it
    assert out.stat().st_ino != inode
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.jsonl", "out.jsonl"]


def test_an_out_file_that_is_not_a_batch_output_is_left_alone(model, tmp_path):
    inp, out = tmp_path / "in.jsonl", tmp_path / "notes.txt"
    _write(inp, [{"id": 1, "prompt": "a", "max_tokens": 2}])
    out.write_bytes(b'{"id": 0, "text": "x"}\nmy notes, not JSON\n')
    with pytest.raises(BatchError, match="line 2 is not a record strata batch wrote"):
        run_batch(model, str(inp), str(out), progress=False)
    assert out.read_bytes() == b'{"id": 0, "text": "x"}\nmy notes, not JSON\n'


def test_a_line_that_is_not_utf8_gets_an_error_naming_line_and_byte_and_the_rest_runs(model, tmp_path):
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    bad_prompt = b'{"id": "latin1", "prompt": "caf\xe9 au lait", "max_tokens": 2}'
    bad_id = b'{"id": "\xff\xfe", "prompt": "x", "max_tokens": 2}'
    inp.write_bytes(b'{"id": "a", "prompt": "first", "max_tokens": 2, "temperature": 0}\n' + bad_prompt + b"\n"
                    + bad_id + b'\n{"id": "b", "prompt": "last", "max_tokens": 2, "temperature": 0}\n')
    counts = run_batch(model, str(inp), str(out), progress=False)
    assert counts == {"total": 4, "skipped": 0, "done": 2, "errors": 2, "duplicates": 0}
    recs = _lines(out)
    assert [r["id"] for r in recs] == ["a", "latin1", None, "b"]
    assert "text" in recs[0] and "text" in recs[3]
    at, at_id = bad_prompt.index(b"\xe9"), bad_id.index(b"\xff")
    assert recs[1]["line"] == 2 and recs[1]["error"].startswith(f"line 2: not valid UTF-8 at byte {at} of the line")
    assert recs[2]["line"] == 3 and recs[2]["error"].startswith(f"line 3: not valid UTF-8 at byte {at_id} ")


def test_a_byte_order_mark_and_crlf_line_ends_are_accepted(model, tmp_path):
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    inp.write_bytes(b'\xef\xbb\xbf{"id": 1, "prompt": "hello", "max_tokens": 3, "temperature": 0}\r\n'
                    b'{"id": 2, "prompt": "again", "max_tokens": 3, "temperature": 0}\r\n')
    counts = run_batch(model, str(inp), str(out), progress=False)
    assert counts["done"] == 2 and counts["errors"] == 0
    recs = _lines(out)
    ref = generate(model, prompt_ids(model, "hello"), max_tokens=3, temperature=0, session=model.session())
    assert [r["id"] for r in recs] == [1, 2] and recs[0]["text"] == ref.text


def test_output_that_is_the_input_is_refused_before_anything_is_written(model, tiny_path, tmp_path):
    inp = tmp_path / "in.jsonl"
    _write(inp, [{"id": 1, "prompt": "a", "max_tokens": 2}])
    before = inp.read_bytes()
    (tmp_path / "sub").mkdir()
    (tmp_path / "link.jsonl").symlink_to(inp)
    os.link(inp, tmp_path / "hard.jsonl")
    for same in (inp, tmp_path / "link.jsonl", tmp_path / "sub" / ".." / "in.jsonl", tmp_path / "hard.jsonl"):
        with pytest.raises(BatchError, match="is the input file"):
            run_batch(model, str(inp), str(same), progress=False)
    r = CliRunner().invoke(main, ["batch", str(inp), "-o", str(tmp_path / "link.jsonl"), "-m", tiny_path, "-q"])
    assert r.exit_code == 1 and "is the input file" in r.output and "-o " in r.output, r.output
    assert inp.read_bytes() == before
    # a link the other way round (the input through a link, OUT the file itself) is the same file too
    r = CliRunner().invoke(main, ["batch", str(tmp_path / "link.jsonl"), "-o", str(inp), "-m", tiny_path, "-q"])
    assert r.exit_code == 1 and "is the input file" in r.output
    assert inp.read_bytes() == before


def test_retry_errors_replaces_error_records_and_keeps_one_per_id(model, tmp_path):
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    a = {"id": "a", "prompt": "fine from the start", "max_tokens": 3, "temperature": 0}
    d = {"id": "d", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "temperature": 0}
    _write(inp, [a, {"id": "b", "prompt": "x " * 600, "max_tokens": 3}, {"id": "c", "prompt": "q", "temprature": 0},
                 "{not json", d])
    first = run_batch(model, str(inp), str(out), progress=False)
    assert first["done"] == 2 and first["errors"] == 3
    before = {json.dumps(r["id"]): r for r in _lines(out)}
    assert "context holds 512" in before['"b"']["error"] and before["null"]["line"] == 4
    # without the flag an error counts as done; with it, a still-bad line errs again, once per id
    assert run_batch(model, str(inp), str(out), progress=False)["skipped"] == 5
    again = run_batch(model, str(inp), str(out), progress=False, retry_errors=True)
    assert again["skipped"] == 2 and again["errors"] == 3 and len(_lines(out)) == 5
    # the file fixed: each error is replaced by its result, the results already there are not run again
    _write(inp, [a, {"id": "b", "prompt": "x " * 6, "max_tokens": 3, "temperature": 0},
                 {"id": "c", "prompt": "q", "temperature": 0, "max_tokens": 3}, {"id": "e", "prompt": "was bad"}, d])
    fixed = run_batch(model, str(inp), str(out), SamplingParams(max_tokens=3), progress=False, retry_errors=True)
    assert fixed == {"total": 5, "skipped": 2, "done": 3, "errors": 0, "duplicates": 0}
    recs = _lines(out)
    assert [r["id"] for r in recs] == ["a", "b", "c", "e", "d"]         # input order, the line record gone
    assert all("error" not in r and "text" in r for r in recs)
    assert recs[0] == before['"a"'] and recs[4] == before['"d"']        # their stats' timings: not run again
    ref = generate(model, prompt_ids(model, "x " * 6), max_tokens=3, temperature=0, session=model.session())
    assert recs[1]["text"] == ref.text


def test_parse_request_keys_ids_by_json_value():
    assert parse_request('{"id": 1, "prompt": "a"}', 1)[0] != parse_request('{"id": "1", "prompt": "a"}', 2)[0]
    key, rec = parse_request('{"id": true, "prompt": "a"}', 4)
    assert key == "line:4" and rec["line"] == 4 and "id" in rec["error"]


def _kill_when(proc, ready, what: str) -> None:
    """SIGKILL proc as soon as ready() holds (polled every millisecond; bounded at 60 s)."""
    deadline = time.time() + 60
    while time.time() < deadline and proc.poll() is None and not ready():
        time.sleep(0.001)
    assert proc.poll() is None, f"the run ended before it could be killed {what}: {proc.communicate()}"
    proc.send_signal(signal.SIGKILL)
    proc.wait()


def test_kill_9_during_retry_errors_then_resume_leaves_one_whole_record_per_id(model, tiny_path, tmp_path):
    eog = sorted(end_of_generation_ids(model))
    n, ntok = 64, 32
    params = SamplingParams(temperature=0, max_tokens=ntok, logit_bias={t: -np.inf for t in eog})
    inp, out, ref_out = tmp_path / "in.jsonl", tmp_path / "out.jsonl", tmp_path / "ref.jsonl"
    # every request but each 4th errs first (a bad top_p); the file is then fixed and retried
    _write(inp, [{"id": i, "prompt": f"request {i} says", **({} if i % 4 == 0 else {"top_p": 3})} for i in range(n)])
    first = run_batch(model, str(inp), str(out), params, progress=False)
    assert first["errors"] == n - n // 4
    kept = {r["id"]: r for r in _lines(out) if "error" not in r}
    _write(inp, [{"id": i, "prompt": f"request {i} says"} for i in range(n)])
    args = [sys.executable, "-m", "pyrunner.cli", "batch", str(inp), "-o", str(out), "--retry-errors", "-m",
            tiny_path, "-n", str(ntok), "--temp", "0", "--threads", "1", "--n-ctx", "512", "-q"]
    args += [a for t in eog for a in ("--logit-bias", f"{t}-inf")]
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    run = lambda: subprocess.Popen(args, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)

    # 1: in the middle of the retries, once OUT holds new records after the old errors of their ids
    _kill_when(run(), lambda: out.read_bytes().count(b"\n") >= n + 5, "mid-run")
    assert len(_lines(out)) > len({r["id"] for r in _lines(out)})     # an id's error and its result: both
    with open(out, "ab") as f:          # as if the kill had landed inside a write
        f.write(b'{"id": 1, "text": "cut sh')
    # 2: right after the resumed run's compaction renamed a new OUT into place
    inode = out.stat().st_ino
    proc = run()
    _kill_when(proc, lambda: out.stat().st_ino != inode, "after its compaction")
    assert "partly written last line" in proc.stderr.read().decode()
    # 3: while it starts (reading the files, loading the model)
    t0 = time.time()
    _kill_when(run(), lambda: time.time() > t0 + 0.3, "while it starts")
    r = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr

    data = out.read_bytes()
    assert data.endswith(b"\n")
    recs = [json.loads(x) for x in data.split(b"\n")[:-1]]              # every line whole JSON
    assert [x["id"] for x in recs] == list(range(n))                     # each id once, in input order
    assert all("error" not in x for x in recs)
    assert all(recs[i] == kept[i] for i in kept)                         # results never run again
    # the same results as a run that was never interrupted
    ref = run_batch(model, str(inp), str(ref_out), params, progress=False)
    assert ref["done"] == n
    assert [x["text"] for x in recs] == [x["text"] for x in _lines(ref_out)]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.jsonl", "out.jsonl", "ref.jsonl"]


def test_parallel_gives_the_records_of_one_at_a_time(model, tmp_path):
    """--parallel N (pyrunner.engine): the same records as --parallel 1, each id once and in input
    order after the compaction, bad lines the same errors; requests sharing a system prompt still
    reuse it (the engine hands a free session holding it to the next one)."""
    system = {"role": "system", "content": "You answer in one short sentence. " * 6}
    reqs = [{"id": f"q{i}", "messages": [system, {"role": "user", "content": f"question {i}?"}],
             "max_tokens": 3 + i % 5, "temperature": 0} for i in range(10)]
    reqs += [{"id": i, "prompt": f"request {i} says " * (1 + i % 7), "max_tokens": 2 + i % 9, "temperature": 0}
             for i in range(12)]
    reqs.insert(5, "not json")
    reqs.insert(9, {"id": "badp", "prompt": "a", "top_p": 3})
    inp = tmp_path / "in.jsonl"
    _write(inp, reqs)
    one, par = tmp_path / "one.jsonl", tmp_path / "par.jsonl"
    c1 = run_batch(model, str(inp), str(one), progress=False, parallel=1)
    c4 = run_batch(model, str(inp), str(par), progress=False, parallel=4)
    assert c1 == c4
    a, b = _lines(one), _lines(par)
    assert [r["id"] for r in a] == [r["id"] for r in b]
    for x, y in zip(a, b):
        assert x.get("text") == y.get("text") and x.get("error") == y.get("error")
        assert x.get("finish_reason") == y.get("finish_reason")
    assert sum(r["stats"]["reused_prompt_tokens"] > 20 for r in b if "stats" in r) >= 5


def test_a_failed_engine_ends_the_batch_with_its_message_and_keeps_the_results(tiny_path, tmp_path, monkeypatch):
    """The engine's own loop failing (test_engine's test of it) ends `strata batch --parallel 2` with an
    error message, not an uncaught exception; the records written before stay in OUT and a rerun resumes."""
    from faults import planner_failing_at
    from pyrunner.engine import Engine

    plan = Engine._plan_for
    monkeypatch.setattr(Engine, "_plan_for", planner_failing_at(plan, 15))
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    _write(inp, [{"id": i, "prompt": f"line {i}", "max_tokens": 6, "temperature": 0} for i in range(12)])
    r = CliRunner().invoke(main, ["batch", str(inp), "-o", str(out), "-m", str(tiny_path), "--parallel", "2", "-q"])
    assert r.exit_code == 1 and "the engine stopped on an error of its own (OverflowError" in r.output, r.output
    # the engine prints the bug's traceback (for a report); the command itself ends with its message
    assert isinstance(r.exception, SystemExit) and r.output.rstrip().splitlines()[-1].startswith("Error: the engine")
    done = [x for x in _lines(out) if "error" not in x]
    assert 0 < len(done) < 12
    monkeypatch.setattr(Engine, "_plan_for", plan)
    r = CliRunner().invoke(main, ["batch", str(inp), "-o", str(out), "-m", str(tiny_path), "--parallel", "2", "-q",
                                  "--retry-errors"])
    assert r.exit_code == 0, r.output
    assert sorted(x["id"] for x in _lines(out) if "error" not in x) == list(range(12))
