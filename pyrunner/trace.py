"""trace.py — the request watchdog's Python side and the `--trace FILE` timeline (DESIGN §7).

Watchdog. libstrata tracks progress in C (a beat per layer, the stage it is in, the wait it sits
in; native/src/util/trace.h) and gives up inside its waits once no progress was made for the
configured time. The setting is per thread: `watchdog(seconds, label)` applies it to the evals that
follow on the calling thread; generate() does this for every request (its `watchdog_s`, else
STRATA_WATCHDOG_S, else 600 s) and labels each eval ("prefill of 900 tokens", "decode step 12").
A failed eval whose cause was the watchdog surfaces as WatchdogError (a StrataError whose message
names the stage); generate() turns it into a Completion with finish_reason "error" that keeps the
partial output.

Trace. `Tracer(path)` switches libstrata's recorder on; the C hooks record forward steps (windows),
layers, mixers, MoE blocks, thread-pool work per worker (a span per thread and job, with its task
count), the sim device's copies and computations (args: slot, bytes), the merge and PLE waits, the
PLE worker's hash / prefetch / gather, cache admits and swaps; each staging slot of the device also gets its own track (its copies and the
computations reading it, the "copied"/"used" ring of DESIGN §4). Python adds its own spans (requests, prefill, decode steps, MTP draft / verify /
rollback / extend) with `span(...)`, and counters sampled per decode step (`sample`): cache hits
and lookups, resident experts per layer, PCIe bytes, pcie_frac, RSS, page-cache-resident PLE table
pages, process read bytes and major faults, generated tokens. `close()` drains the recorder and
writes Chrome-trace / Perfetto JSON: {"traceEvents": [...], "metadata": {...}} with "X" complete
events (ts, dur in µs from the trace's start), "i" instants, "C" counters and "M" thread names.
The module-level functions (span, sample, request_begin/end) do nothing when no tracer is active,
so the generation loop calls them unconditionally.
"""
from __future__ import annotations

import contextlib
import json
import math
import os
import resource
import time

from . import settings
from ._native import StrataError, ffi, lib

# ------------------------------------------------------------------------------------ watchdog

DEFAULT_WATCHDOG_S = 600.0


class WatchdogError(StrataError):
    """A request made no progress for the watchdog's time; the message names the stage."""


def watchdog_seconds(value: float | None) -> float:
    """The watchdog time for a request: value, else STRATA_WATCHDOG_S, else 600 (<= 0: off)."""
    if value is None:
        value = settings.watchdog_s()          # the environment is read in pyrunner.settings only
    value = float(DEFAULT_WATCHDOG_S if value is None else value)
    if math.isnan(value):                      # compared false with 0, it turned the watchdog off unsaid
        raise ValueError("watchdog_s (--watchdog-s) = nan: give a number of seconds (<= 0 turns it off)")
    return value


def watchdog(seconds: float) -> None:
    """Applies the watchdog to the evals that follow on this thread (<= 0: off)."""
    lib.strata_watchdog_set(float(seconds))


def label(text: str) -> None:
    """Names the stage of the evals that follow on this thread (the watchdog's message uses it)."""
    lib.strata_watchdog_label(text.encode("utf-8", "replace")[:127])


def fired() -> bool:
    return bool(lib.strata_watchdog_fired())


def stage() -> str:
    buf = ffi.new("char[512]")
    lib.strata_watchdog_stage(buf, 512)
    return ffi.string(buf).decode("utf-8", "replace")


def as_watchdog(e: StrataError) -> StrataError:
    """e as a WatchdogError when the watchdog caused it (checked on the thread that ran the eval)."""
    if isinstance(e, WatchdogError) or not fired():
        return e
    return WatchdogError(e.status, str(e))


# ------------------------------------------------------------------------------------ trace

_current: "Tracer | None" = None

# per C kind: (name, category, args from (a, b, c, d))
_C_ARGS = {
    "step": lambda a, b, c, d: {"tokens": a, "step": b, "n_past": c},
    "layer": lambda a, b, c, d: {"layer": a, "tokens": c},
    "mixer": lambda a, b, c, d: {"layer": a, "qsa": b, "tokens": c},
    "moe": lambda a, b, c, d: {"layer": a, "experts": b, "tokens": c, "hits": d},
    "ple": lambda a, b, c, d: {"layer": a, "tokens": c},
    "ple_wait": lambda a, b, c, d: {"seq": c},
    "ple_hash": lambda a, b, c, d: {"rows": c},
    "ple_prefetch": lambda a, b, c, d: {"pages": c},
    "ple_gather": lambda a, b, c, d: {"rows": c, "read_bytes": d},
    "ple_stall": lambda a, b, c, d: {"seq": c},
    "pool_task": lambda a, b, c, d: {"first_task": a, "thread": b, "tasks": c, "job_tasks": d},
    "dev_copy": lambda a, b, c, d: {"slot": a, "bytes": c, "seq": d},
    "dev_compute": lambda a, b, c, d: {"slot": a, "groups": b, "seq": d},
    "merge_wait": lambda a, b, c, d: {"layer": a, "seq": d},
    "cache_swap": lambda a, b, c, d: {"layer": a, "expert_in": b, "expert_out": c, "slot": d},
    "cache_admit": lambda a, b, c, d: {"layer": a, "expert": b, "slot": d},
    "moe_cpu": lambda a, b, c, d: {"layer": a, "groups": b},
    "watchdog": lambda a, b, c, d: {"layer": a, "step": c},
}


def _event_name(kind: str, a: int, b: int) -> str:
    if kind == "step":
        return "window"
    if kind == "layer":
        return f"layer {a}"
    if kind == "mixer":
        return "qsa" if b else "gdn"
    return kind


def _proc_io() -> dict:
    out = {}
    try:
        with open("/proc/self/io") as f:
            for line in f:
                k, _, v = line.partition(":")
                out[k.strip()] = int(v)
    except OSError:
        pass
    return out


def _rss_bytes() -> int:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


class Tracer:
    """One trace file. Only one tracer is active at a time (the recorder is process-wide)."""

    PY_TID = 10_000          # the track of Python's spans when the model thread is unknown
    SLOT_TID = 20_000        # + slot: a staging slot's own track (its copies and the computations reading it)
    sample_interval_s = 0.01
    slow_interval_s = 0.25   # the counters that scan a table (mincore over the PLE table, the cache's slots)

    def __init__(self, path, max_events: int = 0):
        global _current
        if _current is not None:
            raise RuntimeError("a trace is already being recorded; close it first")
        self.path = os.fspath(path)
        with open(self.path, "w"):         # fail now, not after the run, when it cannot be written
            pass
        self.events: list[dict] = []
        self.t_origin = time.monotonic_ns()
        self._last_sample = 0.0
        self._last_slow = 0.0
        self._requests = 0
        self.meta: dict = {"tool": "strata", "clock": "CLOCK_MONOTONIC", "pid": os.getpid()}
        self.staging: range | None = None   # the device's staging slots (learnt from the model in sample())
        lib.strata_trace_enable(1, int(max_events))
        self.model_tid = self._find_tid("model")
        _current = self

    # ---------------------------------------------------------------- helpers
    @staticmethod
    def _find_tid(name: str) -> int | None:
        buf = ffi.new("char[64]")
        for tid in range(256):
            n = lib.strata_trace_thread_name(tid, buf, 64)
            if n < 0:
                return None
            if ffi.string(buf).decode() == name:
                return tid
        return None

    def _us(self, ns: int) -> float:
        return (ns - self.t_origin) / 1000.0

    @property
    def tid(self) -> int:
        return self.model_tid if self.model_tid is not None else self.PY_TID

    def complete(self, name: str, cat: str, t0_ns: int, t1_ns: int, args: dict | None = None) -> None:
        ev = {"name": name, "cat": cat, "ph": "X", "ts": self._us(t0_ns), "dur": max(0.0, (t1_ns - t0_ns) / 1000.0),
              "pid": 1, "tid": self.tid}
        if args:
            ev["args"] = args
        self.events.append(ev)

    def instant(self, name: str, cat: str, args: dict | None = None) -> None:
        ev = {"name": name, "cat": cat, "ph": "i", "s": "p", "ts": self._us(time.monotonic_ns()), "pid": 1,
              "tid": self.tid}
        if args:
            ev["args"] = args
        self.events.append(ev)

    def counter(self, name: str, values: dict, t_ns: int | None = None) -> None:
        self.events.append({"name": name, "ph": "C", "ts": self._us(t_ns or time.monotonic_ns()), "pid": 1,
                            "args": values})

    @contextlib.contextmanager
    def span(self, name: str, cat: str = "python", **args):
        t0 = time.monotonic_ns()
        try:
            yield
        finally:
            self.complete(name, cat, t0, time.monotonic_ns(), args or None)

    def drain(self) -> None:
        n = lib.strata_trace_pending()
        if n <= 0:
            return
        buf = ffi.new("strata_trace_event[]", n)
        got = lib.strata_trace_drain(buf, n)
        names = {}
        for i in range(got):
            e = buf[i]
            kind = names.get(e.kind)
            if kind is None:
                kind = names[e.kind] = ffi.string(lib.strata_trace_kind_name(e.kind)).decode()
            argf = _C_ARGS.get(kind)
            args = argf(e.a, e.b, e.c, e.d) if argf else {"a": e.a, "b": e.b, "c": e.c, "d": e.d}
            ev = {"name": _event_name(kind, e.a, e.b), "cat": kind, "ts": self._us(e.t0_ns), "pid": 1,
                  "tid": e.tid, "args": args}
            if e.t1_ns == e.t0_ns and kind in ("cache_swap", "cache_admit", "watchdog"):
                ev["ph"] = "i"
                ev["s"] = "t"
            else:
                ev["ph"] = "X"
                ev["dur"] = (e.t1_ns - e.t0_ns) / 1000.0
            self.events.append(ev)
            if kind in ("dev_copy", "dev_compute") and self.staging is not None and e.a in self.staging:
                # the staging ring per slot: copy into it, then the computation that reads it
                self.events.append(dict(ev, tid=self.SLOT_TID + e.a))

    def sample(self, model=None, session=None, force: bool = False, **extra) -> None:
        """Counters now (at most every sample_interval_s unless forced)."""
        now = time.monotonic()
        if not force and now - self._last_sample < self.sample_interval_s:
            return
        self._last_sample = now
        slow = force or now - self._last_slow >= self.slow_interval_s
        if slow:
            self._last_slow = now
        t = time.monotonic_ns()
        io = _proc_io()
        ru = resource.getrusage(resource.RUSAGE_SELF)
        self.counter("rss_mib", {"rss": _rss_bytes() / 2**20}, t)
        self.counter("storage", {"read_bytes": io.get("read_bytes", 0), "rchar": io.get("rchar", 0)}, t)
        self.counter("major_faults", {"major_faults": ru.ru_majflt}, t)
        self.counter("cpu_s", {"user": ru.ru_utime, "system": ru.ru_stime}, t)
        if model is not None and getattr(model, "_ptr", None) is not None:
            try:
                st = model.offload_stats()
            except StrataError:
                st = None
            if st is not None and model.device != "cpu":
                self.staging = range(st["cache_slots"], st["cache_slots"] + st["staging_slots"])
                self.counter("cache", {"hits": st["cache_hits"], "lookups": st["cache_lookups"]}, t)
                self.counter("pcie", {"pcie_bytes": st["pcie_bytes"], "copy_bytes": st["copy_bytes"]}, t)
                self.counter("pcie_frac", {"pcie_frac": st["pcie_frac"]}, t)
                self.counter("device_busy_s", {"copy_s": st["copy_s"], "compute_s": st["device_s"]}, t)
                n = model.n_layer
                per = ffi.new("int32_t[]", n)
                if slow and lib.strata_model_resident_experts(model._ptr, per, n) == lib.STRATA_OK:
                    self.counter("resident_experts", {f"L{i}": per[i] for i in range(n)}, t)
                    self.counter("resident_total", {"experts": sum(per[i] for i in range(n)),
                                                    "bytes": sum(per[i] for i in range(n)) * st["slot_bytes"]}, t)
            if slow and getattr(model, "has_ple", False):
                res = ffi.new("uint64_t *")
                tot = ffi.new("uint64_t *")
                if lib.strata_model_ple_resident(model._ptr, res, tot) == lib.STRATA_OK:
                    self.counter("ple_resident_pages", {"resident": res[0], "total": tot[0]}, t)
        if extra:
            self.counter("request", extra, t)
        if lib.strata_trace_pending() > 200_000:
            self.drain()

    # ---------------------------------------------------------------- requests
    def request_begin(self, model=None, session=None, **args) -> int:
        self._requests += 1
        self.sample(model, session, force=True)
        self._req_t0 = time.monotonic_ns()
        self._req_args = dict(args, request=self._requests)
        self.instant(f"request {self._requests} begin", "request", self._req_args)
        return self._requests

    def request_end(self, model=None, session=None, completion=None) -> None:
        args = dict(getattr(self, "_req_args", {}))
        if completion is not None:
            args.update({"finish_reason": completion.finish_reason, "stats": dict(completion.stats)})
            if getattr(completion, "error", None):
                args["error"] = completion.error
        self.complete(f"request {args.get('request', self._requests)}", "request",
                      getattr(self, "_req_t0", self.t_origin), time.monotonic_ns(), args)
        self.sample(model, session, force=True)
        self.drain()

    def close(self) -> None:
        global _current
        if _current is not self:
            return
        self.drain()
        dropped = int(lib.strata_trace_dropped())
        lib.strata_trace_enable(0, 0)
        _current = None
        buf = ffi.new("char[64]")
        tids = sorted({e["tid"] for e in self.events if "tid" in e})
        meta = []
        for tid in tids:
            if tid == self.PY_TID:
                name = "python"
            elif tid >= self.SLOT_TID:
                name = f"staging slot {tid - self.SLOT_TID}"
            else:
                name = ffi.string(buf).decode() if lib.strata_trace_thread_name(tid, buf, 64) >= 0 else f"thread {tid}"
            meta.append({"name": "thread_name", "ph": "M", "pid": 1, "tid": tid, "args": {"name": name}})
        meta.append({"name": "process_name", "ph": "M", "pid": 1, "args": {"name": "strata"}})
        self.meta.update({"events": len(self.events), "dropped_events": dropped, "requests": self._requests,
                          "duration_s": (time.monotonic_ns() - self.t_origin) / 1e9})
        with open(self.path, "w") as f:
            json.dump({"traceEvents": meta + self.events, "displayTimeUnit": "ms", "metadata": self.meta}, f)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def current() -> Tracer | None:
    return _current


def span(name: str, cat: str = "python", **args):
    """A span on the active tracer; a no-op context when none is."""
    t = _current
    return t.span(name, cat, **args) if t is not None else contextlib.nullcontext()


def since(name: str, cat: str, t0: float, **args) -> None:
    """A span from t0 (a time.perf_counter() value: CLOCK_MONOTONIC on Linux, the recorder's clock)
    to now on the active tracer; nothing when none is. For code that already times itself."""
    t = _current
    if t is not None:
        t.complete(name, cat, int(t0 * 1e9), time.monotonic_ns(), args or None)


def sample(model=None, session=None, **extra) -> None:
    t = _current
    if t is not None:
        t.sample(model, session, **extra)
