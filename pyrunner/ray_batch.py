"""ray_batch.py — `strata batch IN -o OUT --ray [ADDRESS]`: the batch file fanned over a Ray cluster with
Ray Data; OUT is the same JSONL as batch.py writes, with the same resume rules.

Who does what:
  driver (this process)  reads IN, compacts OUT and picks the requests still to run exactly as
                         batch.run_batch does; writes the error records of bad lines itself; puts the
                         others into a Ray Dataset, one row per request: {"req": the parsed request as
                         JSON text} (one string column, whatever fields each request has); appends every
                         record that comes back to OUT at once (batch.RecordWriter: one write() of one
                         whole line), and compacts OUT at the end.
  actors (BatchActor)    a fixed pool of `actors`; each loads the model once, in __init__, and runs each
                         batch of rows it is handed (a few consecutive requests, so prefix reuse still
                         finds a shared system prompt) on the continuous-batching engine
                         (batch.run_records, `parallel` sequences at once); it returns the batch's
                         records, {"rec": record as JSON text}.
Rows stream back as batches end, in no particular order; the compaction puts OUT in input order.

Failures: an actor that dies (its process crashed, its node went away) is started again
(`max_restarts=-1`) and the batch it held is run again on it, up to TASK_RETRIES more times; only a
finished batch sends records, so a batch is written once however often it ran (and the driver drops a
record whose id it already wrote in this run, should Ray ever hand a batch twice). A batch that keeps
killing its actor, a model that does not load, or a lost driver end the run; what is in OUT stays, and
running the command again resumes: ids already in OUT are skipped (batch.py's module docstring), so a
driver killed with kill -9 loses only the batches in flight.

The cluster: address None or "local" starts a Ray instance on this machine bound to the loopback
interface only (node address 127.0.0.1, no dashboard, usage stats off) and shuts it down at the end;
an address ("HEAD:6379") joins that cluster as one more driver and leaves it running. A process that
has already called ray.init() (a test's cluster) runs on that cluster and keeps it.
"""
from __future__ import annotations

import json
import logging
import math
import os
import warnings

from .batch import BatchError, RecordWriter, _out_key, check_paths, compact, read_input, run_records
from . import settings
from .sampling import SamplingParams

BATCH_SIZE = 8          # requests per batch handed to an actor (at least `parallel`): small, so records stream back
TASK_RETRIES = 3        # runs of a batch after the first, when its actor dies running it
LOCAL_ACTORS = 2        # actors of a local cluster unless told
LOCAL_OBJECT_STORE = 256 * 2**20     # bytes; rows and records are small JSON texts
RAY_MISSING = "--ray needs Ray: pip install 'ray[data]'"


def _import_ray():
    """ray, with usage stats off unless the environment already says (it must be set before the import)."""
    settings.ray_environment(local=False)
    try:
        import ray
        import ray.data  # noqa: F401
    except ImportError:
        raise BatchError(RAY_MISSING) from None
    return ray


def start_local(num_cpus: int, object_store_memory: int = LOCAL_OBJECT_STORE):
    """Start a Ray instance on this machine that talks over 127.0.0.1 only, always a new one ("local":
    not one that RAY_ADDRESS or an earlier `ray start` names), with no dashboard and usage stats off;
    returns the ray module (ray.shutdown() stops it). Nothing may leave 127.0.0.0/8: on Linux Ray turns
    a node address of 127.0.0.1 into the host's routable address (services.resolve_ip_for_localhost)
    unless it runs as a one-machine cluster, RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 (read at import, and
    inherited by the raylet and workers); the node's address is checked once it is up."""
    settings.ray_environment(local=True)
    ray = _import_ray()
    consts = getattr(getattr(ray, "_private", None), "ray_constants", None)
    if consts is not None and hasattr(consts, "ENABLE_RAY_CLUSTER"):
        consts.ENABLE_RAY_CLUSTER = False           # ray was imported before the variable was set
    # Ray's own default (token auth on for a new local cluster) without its notice on every run
    logging.getLogger("ray._private.authentication.authentication_token_setup").setLevel(logging.ERROR)
    ray.init(address="local", num_cpus=num_cpus, include_dashboard=False, _node_ip_address="127.0.0.1",
             object_store_memory=object_store_memory, logging_level=logging.WARNING)
    addrs = {nd.get("NodeManagerAddress") for nd in ray.nodes()}
    if addrs != {"127.0.0.1"}:
        ray.shutdown()
        raise BatchError(f"the local Ray cluster came up on {', '.join(sorted(map(str, addrs)))}, not on 127.0.0.1 "
                         f"only; stopped it (this Ray version ignores the loopback setting)")
    return ray


class BatchActor:
    """One actor of the pool: the model, loaded once; each call runs a batch of requests."""

    def __init__(self, model_path: str | None, model_kwargs: dict, defaults: SamplingParams, parallel: int | None,
                 watchdog_s: float | None):
        from .model import Model
        from .models import default_model

        if model_path is None:              # each node's own default model (the shipped one, or the demo)
            model_path, _ = default_model()
        self.model = Model(model_path, **model_kwargs)
        self.defaults = defaults
        self.parallel, self.watchdog_s = parallel, watchdog_s

    def run(self, reqs: list[dict]) -> list[dict]:
        """The records of parsed requests, as they end."""
        recs: list[dict] = []
        run_records(self.model, reqs, self.defaults, recs.append, parallel=self.parallel, watchdog_s=self.watchdog_s)
        return recs

    def __call__(self, batch: dict) -> dict:
        import numpy as np

        recs = self.run([json.loads(s) for s in batch["req"]])
        return {"rec": np.array([json.dumps(r) for r in recs], dtype=object)}


def _plan(ray, local: bool, actors: int | None, threads: int | None) -> tuple[int, int, float]:
    """(actors, model threads per actor, CPUs each actor reserves). A local cluster: LOCAL_ACTORS unless
    told, the cores shared among them. A cluster: unless told, as many actors of `threads` threads as its
    CPUs hold, `threads` defaulting to the smallest node's CPUs (one actor per node)."""
    if local:
        n = actors or LOCAL_ACTORS
        return n, threads or max(1, (os.cpu_count() or 1) // n), 1
    node_cpus = [int(nd["Resources"].get("CPU", 0)) for nd in ray.nodes() if nd.get("Alive")]
    node_cpus = [c for c in node_cpus if c > 0] or [1]
    total = sum(node_cpus)
    t = threads or (max(1, min(min(node_cpus), total // actors)) if actors else min(node_cpus))
    n = actors or max(1, total // t)
    return n, t, min(t, max(node_cpus))


def _summary(e: Exception) -> str:
    """The last meaningful line of a Ray error (its message carries the remote traceback)."""
    lines = [x.strip() for x in str(e).splitlines() if x.strip()]
    return lines[-1] if lines else type(e).__name__


def run_batch_ray(model_path: str | None, model_kwargs: dict, in_path: str, out_path: str,
                  defaults: SamplingParams | None = None, address: str | None = None, actors: int | None = None,
                  parallel: int | None = None, retry_errors: bool = False, progress: bool = True,
                  watchdog_s: float | None = None, batch_size: int | None = None, actor_cls: type = BatchActor) -> dict:
    """Run every request of in_path that out_path does not hold yet (with retry_errors: nor holds as an
    error) on a Ray cluster (module docstring); returns run_batch's counts {"total", "skipped", "done",
    "errors", "duplicates"}. model_path None: each actor loads its node's default model; model_kwargs:
    pyrunner.Model's (threads unset: _plan's). actors: the pool's size (_plan). parallel: sequences each
    actor runs at once (run_records). batch_size: requests per batch (default: BATCH_SIZE, or `parallel`
    if more, so that an actor's engine can fill its sequences; fewer when the file is short, so that
    every actor gets some). actor_cls: BatchActor or a subclass (a test's, that fails)."""
    defaults = defaults or SamplingParams()
    model_path = os.path.abspath(model_path) if model_path else None    # the actors' folder is not ours
    check_paths(in_path, out_path)
    entries, duplicates = read_input(in_path)
    keys = [k for k, _ in entries]
    held = compact(out_path, keys)
    todo = [req for k, req in entries if k not in held or (retry_errors and "error" in held[k])]
    counts = {"total": len(entries), "skipped": len(entries) - len(todo), "done": 0, "errors": 0,
              "duplicates": duplicates}
    runnable = [r for r in todo if "error" not in r]
    ray = _import_ray() if runnable else None       # before OUT is touched: a missing Ray changes nothing
    try:
        out = RecordWriter(out_path, counts, len(todo), progress, overall=True)
        started = False
        try:
            for r in todo:                   # bad lines: their error records need no model
                if "error" in r:
                    out(r)
            if runnable:
                local = address in (None, "local")
                if ray.is_initialized():
                    local = False            # the caller's cluster: size the pool from what it has
                elif local:
                    start_local(max(os.cpu_count() or 1, actors or LOCAL_ACTORS))
                    started = True
                else:
                    _join(ray, address)
                    started = True
                n, threads, cpus = _plan(ray, local, actors, model_kwargs.get("threads"))
                _stream(ray, actor_cls, runnable, out, batch_size or max(BATCH_SIZE, parallel or 0), n, cpus,
                        dict(model_path=model_path, model_kwargs={**model_kwargs, "threads": threads},
                             defaults=defaults, parallel=parallel, watchdog_s=watchdog_s))
        finally:
            out.close()
            if started:
                ray.shutdown()
    except KeyboardInterrupt:
        compact(out_path, keys)      # Ctrl-C leaves OUT compact too; after a kill -9 the next start does it
        raise
    compact(out_path, keys)
    return counts


def _join(ray, address: str) -> None:
    try:
        ray.init(address=address, logging_level=logging.WARNING)
    except (ConnectionError, ValueError, RuntimeError) as e:
        raise BatchError(f"--ray {address}: cannot join that Ray cluster ({_summary(e)}); give the head's "
                         f"address as `ray start --head` printed it, e.g. --ray HEAD:6379") from None


def _stream(ray, actor_cls, reqs: list[dict], out, batch_size: int, n: int, cpus: float, actor_kwargs: dict) -> None:
    """Run reqs on a pool of n actors, appending each record to OUT (out) as its batch comes back."""
    ctx = ray.data.DataContext.get_current()
    ctx.enable_progress_bars = False            # the driver's own bar (RecordWriter) counts the records
    ctx.print_on_execution_start = False
    for name in ("ray.data._internal.progress", "ray.data._internal.execution.streaming_executor"):
        logging.getLogger(name).setLevel(logging.ERROR)     # "progress bars disabled", "execution finished"
    size = max(1, min(batch_size, math.ceil(len(reqs) / n)))
    # One block per batch, each row one request as JSON text (ASCII: a lone surrogate a \u escape made
    # stays an escape, which Arrow's UTF-8 strings could not hold).
    ds = ray.data.from_items([{"req": json.dumps(r)} for r in reqs], override_num_blocks=math.ceil(len(reqs) / size))
    with warnings.catch_warnings():
        # Ray 2.5x deprecates passing actor options this way but names no other for these two
        warnings.filterwarnings("ignore", message=".*ray_remote_args.* is deprecated")
        ds = ds.map_batches(actor_cls, batch_size=size, batch_format="numpy", num_cpus=cpus,
                            compute=ray.data.ActorPoolStrategy(size=n), fn_constructor_kwargs=actor_kwargs,
                            max_restarts=-1, max_task_retries=TASK_RETRIES)
    written: set[str] = set()
    try:
        for row in ds.iter_rows():
            rec = json.loads(row["rec"])
            key = _out_key(rec)
            if key in written:                  # a batch handed twice: its records are in OUT already
                continue
            written.add(key)
            out(rec)
    except BatchError:
        raise
    except Exception as e:  # noqa: BLE001  (Ray wraps what failed on an actor in its own types)
        why = _summary(e)
        if isinstance(e, ray.exceptions.RayActorError):
            why = (f"an actor died {1 + TASK_RETRIES} times running one batch of up to {size} requests (a crash, or "
                   f"memory ran out: the Ray logs say, /tmp/ray/session_latest/logs on its node): {why}")
        raise BatchError(f"the Ray run stopped: {why}; the {out.counts['done'] + out.counts['errors']} records "
                         f"written so far stay in {out.out_path}, and running the command again goes on from "
                         f"there") from None
