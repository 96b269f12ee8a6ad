"""strata batch --ray / pyrunner.ray_batch on a local Ray cluster of two actors, bound to 127.0.0.1 only
(no dashboard, usage stats off), started once for the module: the records equal --parallel 1's (greedy,
bad lines the same errors), each id once; ids already in OUT are skipped; an actor that dies has its
batch run again and every record still comes once. Without Ray, --ray says how to install it."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from pyrunner import ray_batch
from pyrunner.batch import BatchError, run_batch
from pyrunner.cli import main
from pyrunner.model import Model
from pyrunner.models import make_model
from pyrunner.sampling import SamplingParams

ROOT = Path(__file__).resolve().parents[1]
# Ray Data's own context copies set its deprecated fields (ray/data/context.py), whatever the caller does
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning:ray.data.context")
GREEDY = SamplingParams(temperature=0, max_tokens=16)
ENGINE = {"threads": 1, "n_ctx": 512}


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("ray") / "tiny.gguf"
    make_model("tiny", str(path), "f32", 0)
    return str(path)


@pytest.fixture(scope="module")
def cluster():
    """The module's one local cluster (ray_batch.start_local): two CPUs, one per actor; its GCS address."""
    pytest.importorskip("ray.data")
    ray = ray_batch.start_local(num_cpus=2)
    try:
        assert {n["NodeManagerAddress"] for n in ray.nodes()} == {"127.0.0.1"}
        yield ray.get_runtime_context().gcs_address
    finally:
        ray.shutdown()


def _write(path, recs) -> None:
    Path(path).write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in recs))


def _lines(path) -> list[dict]:
    return [json.loads(x) for x in Path(path).read_text().splitlines()]


def _requests(n: int) -> list:
    reqs = [{"id": i, "prompt": f"request {i} says " * (1 + i % 3)} for i in range(n)]
    reqs.insert(3, "not json")                                   # the driver's error record
    reqs.insert(6, {"id": "badp", "prompt": "a", "top_p": 3})    # an actor's error record
    return reqs


@pytest.fixture(scope="module")
def reference(tiny_path, tmp_path_factory):
    """(IN, its --parallel 1 records) for _requests(10)."""
    d = tmp_path_factory.mktemp("ref")
    inp, out = d / "in.jsonl", d / "ref.jsonl"
    _write(inp, _requests(10))
    with Model(tiny_path, **ENGINE) as m:
        run_batch(m, str(inp), str(out), GREEDY, progress=False, parallel=1)
    return inp, _lines(out)


def _same(a: list[dict], b: list[dict]) -> None:
    assert [r.get("id") for r in a] == [r.get("id") for r in b]          # each id once, in input order
    for x, y in zip(a, b):
        assert (x.get("text"), x.get("finish_reason"), x.get("error")) == \
               (y.get("text"), y.get("finish_reason"), y.get("error")), x.get("id")


def test_ray_gives_the_records_of_parallel_1_through_the_cli(cluster, tiny_path, reference, tmp_path):
    """The real command, joining the module's cluster by its address as a second driver."""
    inp, ref = reference
    out = tmp_path / "out.jsonl"
    args = [sys.executable, "-m", "pyrunner.cli", "batch", str(inp), "-o", str(out), "-m", tiny_path, "-n", "16",
            "--temp", "0", "--threads", "1", "--n-ctx", "512", "-q", "--ray", cluster]
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    r = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "12 requests" in r.stderr and "10 run, 2 with errors" in r.stderr
    recs = _lines(out)
    _same(recs, ref)
    assert all("stats" in x for x in recs if "error" not in x)
    assert recs[3] == {"id": None, "error": ref[3]["error"], "line": 4}


def test_ids_already_in_out_are_skipped_and_each_id_ends_once(cluster, tiny_path, reference, tmp_path):
    inp, ref = reference
    out = tmp_path / "out.jsonl"
    kept = [ref[0], ref[2], ref[8]]                                    # ids 0, 2, 6
    stale = {"id": 5, "error": "line 8: an old failure", "line": 8}     # --retry-errors runs it again
    _write(out, kept + [stale, {"id": "gone", "text": "from an older input", "finish_reason": "stop", "stats": {}}])
    before = out.read_text().splitlines()
    counts = ray_batch.run_batch_ray(tiny_path, ENGINE, str(inp), str(out), GREEDY, retry_errors=True,
                                     progress=False)
    assert counts == {"total": 12, "skipped": 3, "done": 7, "errors": 2, "duplicates": 0}
    recs = _lines(out)
    _same(recs[:-1], ref)
    assert recs[-1]["id"] == "gone"                        # an id no longer in the input stays, last
    lines = out.read_text().splitlines()
    assert [lines[i] for i in (0, 2, 8)] == before[:3]     # the records already there, untouched


def test_a_dead_actor_s_batch_runs_again_and_every_record_comes_once(cluster, tiny_path, reference, tmp_path):
    inp, ref = reference
    out, marker = tmp_path / "out.jsonl", tmp_path / "crashed"

    class CrashOnce(ray_batch.BatchActor):
        """Kills its process the first time it is handed request 8 (pickled by value: defined here)."""

        def run(self, reqs):
            if any(r["id"] == 8 for r in reqs) and not os.path.exists(marker):
                Path(marker).write_text(str(os.getpid()))
                os._exit(1)
            return super().run(reqs)

    counts = ray_batch.run_batch_ray(tiny_path, ENGINE, str(inp), str(out), GREEDY, progress=False, batch_size=2,
                                     actor_cls=CrashOnce)
    assert marker.exists()                                 # it did die
    assert counts == {"total": 12, "skipped": 0, "done": 10, "errors": 2, "duplicates": 0}
    _same(_lines(out), ref)


def test_ray_alone_starts_a_local_cluster_and_an_address_joins_one(tiny_path, tmp_path, monkeypatch):
    seen = []

    def fake(path, engine, in_path, out_path, params, address, **kw):
        seen.append((path, engine, address, kw["parallel"]))
        return {"total": 0, "skipped": 0, "done": 0, "errors": 0, "duplicates": 0}

    monkeypatch.setattr(ray_batch, "run_batch_ray", fake)
    inp = tmp_path / "in.jsonl"
    _write(inp, [{"id": 1, "prompt": "a"}])
    base = ["batch", str(inp), "-o", str(tmp_path / "out.jsonl"), "-m", tiny_path, "--threads", "1"]
    for extra, address in ((["--ray"], "local"), (["--ray", "HEAD:6379", "--parallel", "4"], "HEAD:6379")):
        r = CliRunner().invoke(main, base + extra)
        assert r.exit_code == 0, r.output
        assert seen[-1][0] == tiny_path and seen[-1][1] == {"threads": 1} and seen[-1][2] == address
    assert seen[-1][3] == 4
    r = CliRunner().invoke(main, base + ["--ray", "--trace", str(tmp_path / "t.json")])
    assert r.exit_code != 0 and "--trace" in r.output


def test_without_ray_the_error_says_how_to_install_it(tiny_path, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)          # `import ray` raises ImportError
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    _write(inp, [{"id": 1, "prompt": "a"}])
    with pytest.raises(BatchError, match=r"--ray needs Ray: pip install 'ray\[data\]'"):
        ray_batch.run_batch_ray(tiny_path, ENGINE, str(inp), str(out), GREEDY, progress=False)
    r = CliRunner().invoke(main, ["batch", str(inp), "-o", str(out), "-m", tiny_path, "--ray"])
    assert r.exit_code == 1 and "pip install 'ray[data]'" in r.output
    assert not out.exists() or out.read_text() == ""


def test_a_batch_that_always_kills_its_actor_ends_the_run_and_keeps_the_others(cluster, tiny_path, reference,
                                                                              tmp_path):
    """Bounded: after TASK_RETRIES more runs the batch's failure ends the run; what finished is in OUT,
    and a rerun (here with an actor that no longer dies) completes it, each id once."""
    inp, ref = reference
    out, deaths = tmp_path / "out.jsonl", tmp_path / "deaths"
    deaths.mkdir()

    class CrashAlways(ray_batch.BatchActor):
        def run(self, reqs):
            if any(r["id"] == 8 for r in reqs):
                (deaths / str(os.getpid())).touch()
                os._exit(1)
            return super().run(reqs)

    with pytest.raises(BatchError, match="the Ray run stopped: .*running the command again goes on"):
        ray_batch.run_batch_ray(tiny_path, ENGINE, str(inp), str(out), GREEDY, progress=False, batch_size=2,
                                actor_cls=CrashAlways)
    assert 2 <= len(list(deaths.iterdir())) <= 1 + ray_batch.TASK_RETRIES     # retried, and bounded
    got = _lines(out)
    assert 8 not in [r["id"] for r in got] and len(got) == len({r["id"] for r in got})
    counts = ray_batch.run_batch_ray(tiny_path, ENGINE, str(inp), str(out), GREEDY, progress=False)
    assert counts["skipped"] == len(got) and counts["done"] + counts["errors"] == 12 - len(got)
    _same(_lines(out), ref)
