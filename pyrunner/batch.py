"""batch.py — a prompt file in, one JSON result per line out; a killed run resumes where it stopped.

Input (JSONL, UTF-8, one request per line; blank lines are ignored, a byte-order mark at the start is
skipped):
    {"id": "q1", "prompt": "Once upon a time"}
    {"id": 2, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 64, "temperature": 0}
`id` (a string or an integer, unique in the file: a repeated id's later lines are ignored) and exactly
one of `prompt` (text, continued as is) or `messages` (rendered with the model's chat template) are
required; the optional sampling fields have OpenAI's names: max_tokens, temperature, top_p, top_k,
min_p, seed, stop, presence_penalty, frequency_penalty, repeat_penalty, repeat_last_n, logit_bias.
Fields a line leaves out come from the command's flags. Any other field is an error (a typo must not
silently fall back to a default).

Output (JSONL): per request {"id", "text", "finish_reason", "stats"} (stats: generate.py's keys), or
{"id", "error", "line"} for a request that cannot run (bad JSON, a line that is not UTF-8, missing or
unknown fields, a prompt too long for the context, ...): "line" is its 1-based line in the input and the
message starts with "line N:"; "id" is null when the line has no usable id. The run goes on after a bad
line. OUT holds one record per request, in input order; it must not be the input file (refused).

Prefix reuse: the requests run in one session, in file order; where a request's prompt and the next
one's share a beginning (a system prompt), a checkpoint is kept there, so the next request evaluates
only what differs (its stats' reused_prompt_tokens).

Resume and retry: OUT is read first; a later line for the same id is newer than an earlier one. The run
skips every request whose newest record is there (results and errors alike), or, with retry_errors
(`--retry-errors`), only those whose newest record is a result: requests whose record is an error run
again, and the id-less error records ("line" ones) are replaced by whatever their input line gives now.
During the run each record is appended with one write() of one complete line, so a run killed at any
moment (kill -9) loses at most the request in flight, and OUT may then hold an id's old and new record.
OUT is compacted when a run starts and when it ends (or is interrupted with Ctrl-C): the newest record
per id, in input order, a last line cut short by a kill dropped (its request runs again), error records
of lines that now hold an id dropped; records of ids no longer in the input are kept, after the others.
The compaction never edits OUT in place: it writes `.OUT.strata-tmp` in OUT's folder, fsyncs it and
renames it over OUT, so a kill at any moment leaves the old file or the new one, never a torn one.
After a run, or after a killed run is resumed, OUT holds exactly one complete line per id.
"""
from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import asdict

from ._native import StrataError
from .generate import generate, prompt_ids, render_messages
from .sampling import SamplingParams

FIELDS = ("max_tokens", "temperature", "top_p", "top_k", "min_p", "seed", "stop", "presence_penalty",
          "frequency_penalty", "repeat_penalty", "repeat_last_n", "logit_bias")
BOM = b"\xef\xbb\xbf"


class BatchError(Exception):
    """The batch cannot start (unreadable input, OUT not writable or not a batch output, OUT = the
    input); the message says what to do."""


def _key(rec_id) -> str:
    """Identity of an id in OUT ("1" and 1 are different ids, as in JSON)."""
    return json.dumps(rec_id)


def _valid_id(v) -> bool:
    return isinstance(v, str) or (isinstance(v, int) and not isinstance(v, bool))


def _error(req: dict, msg: str) -> dict:
    """The error record of a request (or of a line with no usable id: req["id"] None): it names the line."""
    return {"id": req["id"], "error": f"line {req['line']}: {msg}", "line": req["line"]}


def check_paths(in_path: str, out_path: str) -> None:
    """BatchError when OUT is the input file (the results would overwrite the requests; a symlink, a
    hard link or another spelling of its path is the same file) or OUT's folder does not exist."""
    try:
        same = os.path.exists(out_path) and os.path.samefile(in_path, out_path)
    except OSError:
        same = os.path.realpath(in_path) == os.path.realpath(out_path)
    if same:
        stem = os.path.splitext(in_path)[0]
        raise BatchError(f"-o {out_path} is the input file {in_path} itself: the results would overwrite the "
                         f"requests; write them to another file, e.g. -o {stem}.out.jsonl")
    d = os.path.dirname(os.path.abspath(out_path))
    if not os.path.isdir(d):
        raise BatchError(f"-o {out_path}: the folder {d} does not exist")


def parse_request(raw: str | bytes, lineno: int) -> tuple[str, dict]:
    """(key, request) for one input line (bytes as read from the file, or text); request is
    {"id", "line", "prompt" | "messages", "sampling": {...}} or an error record {"id", "error", "line"}
    when the line cannot run."""
    def bad(msg, rec_id=None):
        return f"line:{lineno}" if rec_id is None else _key(rec_id), _error({"id": rec_id, "line": lineno}, msg)

    if isinstance(raw, bytes):
        try:
            raw = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            # Name the request when its id itself is readable, so that --retry-errors finds it by id
            # once the file is fixed.
            try:
                rid = json.loads(raw.decode("utf-8", "surrogateescape")).get("id")
                if isinstance(rid, str):
                    rid.encode("utf-8")             # the bad bytes are inside the id: no usable id
            except (ValueError, AttributeError, UnicodeEncodeError):
                rid = None
            return bad(f"not valid UTF-8 at byte {e.start} of the line (counting from 0; that byte is "
                       f"0x{raw[e.start]:02x}); save the file as UTF-8", rid if _valid_id(rid) else None)
    try:
        rec = json.loads(raw)
    except ValueError as e:
        return bad(f"not valid JSON ({e})")
    if not isinstance(rec, dict):
        return bad("each line must be a JSON object with an id and a prompt or messages")
    if "id" not in rec or not _valid_id(rec["id"]):
        return bad("needs an \"id\" (a string or an integer) to name its result")
    rid = rec["id"]
    has_p, has_m = "prompt" in rec, "messages" in rec
    if has_p == has_m:
        return bad("give exactly one of \"prompt\" (text) or \"messages\" (a chat)", rid)
    if has_p and not isinstance(rec["prompt"], str):
        return bad("\"prompt\" must be a string", rid)
    if has_m and (not isinstance(rec["messages"], list) or not rec["messages"]
                  or not all(isinstance(m, dict) for m in rec["messages"])):
        return bad("\"messages\" must be a non-empty list of {\"role\", \"content\"} objects", rid)
    for i, m in enumerate(rec.get("messages") or ()):
        if not isinstance(m.get("role"), str):          # the template would fail on it with a TypeError
            return bad(f"messages[{i}].role must be a string such as \"user\", got {json.dumps(m.get('role'))}", rid)
    unknown = sorted(set(rec) - {"id", "prompt", "messages"} - set(FIELDS))
    if unknown:
        return bad(f"unknown field(s) {', '.join(unknown)}; sampling fields are {', '.join(FIELDS)}", rid)
    req = {"id": rid, "line": lineno, "sampling": {k: rec[k] for k in FIELDS if k in rec}}
    req["prompt" if has_p else "messages"] = rec["prompt" if has_p else "messages"]
    return _key(rid), req


def read_input(in_path: str) -> tuple[list[tuple[str, dict]], int]:
    """The requests of in_path in file order, one per key: [(key, request or error record)], and the
    number of lines dropped for repeating an earlier line's id. The file is read as bytes, line by line,
    so that a line that is not UTF-8 becomes an error record and the others still run."""
    try:
        with open(in_path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise BatchError(f"cannot read the input file {in_path}: {e.strerror or e}") from None
    if data.startswith(BOM):            # Windows editors write one; it is not part of the first request
        data = data[len(BOM):]
    entries, seen, duplicates = [], set(), 0
    for n, raw in enumerate(data.split(b"\n"), 1):
        raw = raw[:-1] if raw.endswith(b"\r") else raw
        if not raw.strip():
            continue
        key, req = parse_request(raw, n)
        if key in seen:
            duplicates += 1
            print(f"strata batch: {in_path}:{n}: id {req['id']!r} appears again; only its first line runs",
                  file=sys.stderr)
            continue
        seen.add(key)
        entries.append((key, req))
    return entries, duplicates


# ------------------------------------------------------------------ OUT: read, compact, append


def _out_key(rec) -> str | None:
    """The key a record of OUT answers for (None: not a batch record)."""
    if not isinstance(rec, dict):
        return None
    if "id" in rec and _valid_id(rec["id"]):
        return _key(rec["id"])
    if rec.get("id") is None and isinstance(rec.get("line"), int) and "error" in rec:
        return f"line:{rec['line']}"
    return None


def read_out(out_path: str) -> tuple[dict[str, tuple[dict, bytes]], bytes]:
    """The newest record of every key in OUT as {key: (record, its line)} (a later line is newer), and
    the file's bytes. A last line without its newline (a write cut by a kill) is left out, with a note;
    any other line that is not a batch record is a BatchError: OUT is then not a batch output file, and
    compacting it would destroy it."""
    recs: dict[str, tuple[dict, bytes]] = {}
    try:
        with open(out_path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return recs, b""
    except OSError as e:
        raise BatchError(f"cannot read the output file {out_path}: {e.strerror or e}") from None
    end = data.rfind(b"\n") + 1
    if end < len(data):
        print(f"strata batch: {out_path}: dropped a partly written last line ({len(data) - end} bytes); "
              f"its request runs again", file=sys.stderr)
    for n, line in enumerate(data[:end].split(b"\n")[:-1], 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except ValueError:
            rec = None
        key = _out_key(rec)
        if key is None:
            raise BatchError(f"-o {out_path}: line {n} is not a record strata batch wrote ({line[:60]!r}); "
                             f"this is not a batch output file, or it was edited: give another -o, or fix or "
                             f"delete that line")
        recs[key] = (rec, line)
    return recs, data


def _temp_path(out_path: str) -> str:
    real = os.path.realpath(out_path)     # rename over the file a symlink names, not over the link
    return os.path.join(os.path.dirname(real), "." + os.path.basename(real) + ".strata-tmp")


def _replace(out_path: str, data: bytes) -> None:
    """OUT := data, atomically: a temporary file in OUT's folder, fsync, rename over OUT, fsync the
    folder (the rename itself survives a crash). A kill at any point leaves the old OUT or the new one."""
    real, tmp = os.path.realpath(out_path), _temp_path(out_path)
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            _write_all(fd, data)
            if os.path.exists(real):
                os.chmod(tmp, os.stat(real).st_mode & 0o7777)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, real)
        dfd = os.open(os.path.dirname(real), os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    except OSError as e:
        raise BatchError(f"cannot rewrite the output file {out_path} (through {tmp}): {e.strerror or e}") from None


def compact(out_path: str, keys: list[str]) -> dict[str, dict]:
    """Rewrite OUT (only if that changes it) with the newest record per key: the input's keys in input
    order (`keys`), then the ids OUT holds that the input no longer has. An id-less error record of a
    line that no longer is id-less is dropped: the line now runs under its id. Returns {key: record}."""
    recs, data = read_out(out_path)
    stale = os.path.exists(_temp_path(out_path))        # a kill during an earlier compaction left it
    in_input = set(keys)
    order = [k for k in keys if k in recs]
    order += [k for k in recs if k not in in_input and not k.startswith("line:")]
    new = b"".join(recs[k][1] + b"\n" for k in order)
    if new != data:
        _replace(out_path, new)
    elif stale:
        os.unlink(_temp_path(out_path))
    return {k: recs[k][0] for k in order}


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def _write_line(fd: int, rec: dict) -> None:
    _write_all(fd, (json.dumps(rec, ensure_ascii=False) + "\n").encode("utf-8"))


# ------------------------------------------------------------------ running the requests


def request_ids(model, req: dict) -> list[int]:
    """The prompt ids of a parsed request (ValueError and friends for a bad one)."""
    if "messages" in req:
        return prompt_ids(model, render_messages(model, req["messages"]), add_special=False)
    return prompt_ids(model, req["prompt"])


def shared_prefix(a: list[int] | None, b: list[int] | None) -> int:
    """Length of the common prefix of two id lists (0 when either is missing)."""
    if not a or not b:
        return 0
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def _prepare(model, req: dict, defaults: SamplingParams):
    """(params, prompt ids) of a parsed request; ValueError / TypeError for a bad one."""
    params = SamplingParams.from_dict({**asdict(defaults), **req["sampling"]})
    return params, request_ids(model, req)


def _record(req: dict, c) -> dict:
    """The OUT record of a request's Completion."""
    if c.error is not None:
        return {**_error(req, c.error), "text": c.text, "finish_reason": c.finish_reason, "stats": c.stats}
    return {"id": req["id"], "text": c.text, "finish_reason": c.finish_reason, "stats": c.stats}


def run_one(model, session, req: dict, defaults: SamplingParams, next_ids: list[int] | None = None,
            watchdog_s: float | None = None) -> dict:
    """The result record of one parsed request (an error record if it cannot run). next_ids: the next
    request's prompt, so that a checkpoint is kept where the two part (a shared system prompt is then
    evaluated once). An error record names the request's input line ("line"). A request the watchdog
    aborted (watchdog_s, pyrunner.generate) gets an error record that keeps its partial "text",
    "finish_reason": "error" and its "stats"."""
    try:
        params, ids = _prepare(model, req, defaults)
        share = shared_prefix(ids, next_ids)
        c = generate(model, ids, session=session, checkpoint_at=[share] if share else (), watchdog_s=watchdog_s,
                     **asdict(params))
    except (ValueError, TypeError, StrataError) as e:   # bad fields, template errors, prompt too long,
        return _error(req, str(e))                           # a failed evaluation: the next line goes on
    return _record(req, c)


def run_records(model, reqs: list[dict], defaults: SamplingParams, on_record, parallel: int | None = None,
                watchdog_s: float | None = None) -> None:
    """Runs parsed requests (read_input's, error records passed through) on an Engine of `parallel`
    sequences (None: as many as fit, at most 16), calling on_record(record) from this thread as each
    one ends (not in input order). Greedy records equal run_one's: the engine runs generate's own loop,
    bit-identical whatever shares a step. Up to twice `parallel` requests are in flight at a time, so
    that a free sequence always finds the next one waiting; each request's checkpoint_at is where its
    prompt parts from the next one's, as in the one-at-a-time run."""
    from .engine import Engine

    eng = Engine(model, max_seqs=parallel, watchdog_s=watchdog_s)
    try:
        window = 2 * eng.max_seqs
        inflight: list = []          # (req, Request)
        prepared = [None] * len(reqs)

        def prep(i):
            if prepared[i] is None and "error" not in reqs[i]:
                try:
                    prepared[i] = _prepare(model, reqs[i], defaults)
                except (ValueError, TypeError, StrataError) as e:
                    prepared[i] = e
            return prepared[i]

        def finish_one() -> None:
            """Hands on the first finished request (waits for one)."""
            while True:
                for x in inflight:
                    if x[1].done:
                        inflight.remove(x)
                        on_record(_record(x[0], x[1].result()))
                        return
                inflight[0][1].wait(0.05)

        for i, req in enumerate(reqs):
            if "error" in req:
                on_record(req)
                continue
            got = prep(i)
            if isinstance(got, Exception):
                on_record(_error(req, str(got)))
                continue
            params, ids = got
            nxt = prep(i + 1) if i + 1 < len(reqs) else None
            share = shared_prefix(ids, nxt[1] if isinstance(nxt, tuple) else None)
            try:
                r = eng.submit(ids, params, checkpoint_at=[share] if share else ())
            except (ValueError, TypeError) as e:
                on_record(_error(req, str(e)))
                continue
            inflight.append((req, r))
            prepared[i] = None
            while len(inflight) >= window or (inflight and any(x[1].done for x in inflight)):
                finish_one()
        while inflight:
            finish_one()
    finally:
        eng.close(cancel=True)


class LiveStats:
    """Running totals over a batch's results for its progress line: tokens/s, cache hit rate and MTP
    acceptance as they change."""

    def __init__(self):
        self.tokens = 0
        self.decode_s = 0.0
        self.hits = self.lookups = 0
        self.proposed = self.accepted = 0

    def add(self, stats: dict) -> None:
        self.tokens += int(stats.get("generated_tokens", 0))
        self.decode_s += float(stats.get("decode_s", 0.0)) + float(stats.get("prefill_s", 0.0))
        self.hits += int(stats.get("cache_hits", 0))
        self.lookups += int(stats.get("cache_lookups", 0))
        self.proposed += int(stats.get("drafts_proposed", 0))
        self.accepted += int(stats.get("drafts_accepted", 0))

    def line(self) -> str:
        parts = [f"{self.tokens / self.decode_s:.1f} tok/s" if self.decode_s > 0 else "- tok/s"]
        if self.lookups:
            parts.append(f"hit rate {100 * self.hits / self.lookups:.1f} %")
        if self.proposed:
            parts.append(f"draft accepted {self.accepted}/{self.proposed}")
        return ", ".join(parts)


def run_batch(model, in_path: str, out_path: str, defaults: SamplingParams | None = None,
              progress: bool = True, watchdog_s: float | None = None, retry_errors: bool = False,
              parallel: int | None = 1) -> dict:
    """Run every request of in_path that out_path does not hold yet (with retry_errors: nor holds as
    an error); returns counts {"total", "skipped", "done", "errors", "duplicates"}. OUT is compacted
    before and after (module docstring). parallel: sequences run at once (1: one after another in one
    session; N > 1 or None (as many as fit, at most 16): pyrunner.engine, run_records); records are
    appended as requests end and ordered by the compaction. The progress bar shows the running
    tokens/s, cache hit rate and draft acceptance (LiveStats)."""
    defaults = defaults or SamplingParams()
    check_paths(in_path, out_path)
    entries, duplicates = read_input(in_path)
    keys = [k for k, _ in entries]
    held = compact(out_path, keys)
    todo = [req for k, req in entries if k not in held or (retry_errors and "error" in held[k])]
    skipped = len(entries) - len(todo)
    counts = {"total": len(entries), "skipped": skipped, "done": 0, "errors": 0, "duplicates": duplicates}
    try:
        _run_todo(model, todo, out_path, defaults, counts, progress, watchdog_s, parallel)
    except KeyboardInterrupt:
        compact(out_path, keys)     # Ctrl-C leaves OUT compact too; after a kill -9 the next start does it
        raise
    compact(out_path, keys)         # a retried id's old record goes
    return counts


class RecordWriter:
    """Appends records to OUT, each as one write() of one complete line, counting them and moving the
    progress bar (tokens/s, cache hit rate, draft acceptance; with `overall`, the generated tokens per
    second of wall time too, which is what several sequences at once raise)."""

    def __init__(self, out_path: str, counts: dict, total: int, progress: bool, overall: bool = False):
        self.out_path, self.counts, self.overall = out_path, counts, overall
        try:
            self.fd = os.open(out_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        except OSError as e:
            raise BatchError(f"cannot write the output file {out_path}: {e.strerror or e}") from None
        self.live = LiveStats()
        self.t0 = time.perf_counter()
        self.bar = None
        if progress:
            import click
            skipped = counts["skipped"]
            label = f"batch: {total} to run" + (f", {skipped} already in {out_path}" if skipped else "")
            self.bar = click.progressbar(length=total, label=label, file=sys.stderr, show_pos=True,
                                         show_eta=True, item_show_func=lambda item: item)
            self.bar.__enter__()

    def __call__(self, rec: dict) -> None:
        try:
            _write_line(self.fd, rec)
        except OSError as e:
            raise BatchError(f"cannot write to the output file {self.out_path}: {e.strerror or e}; the results "
                             f"written so far are kept, re-run the command to go on") from None
        self.counts["errors" if "error" in rec else "done"] += 1
        self.live.add(rec.get("stats") or {})
        if self.bar is not None:
            line = self.live.line()
            if self.overall:
                line = f"{self.live.tokens / max(time.perf_counter() - self.t0, 1e-9):.1f} tok/s overall, {line}"
            self.bar.update(1, line)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.__exit__(None, None, None)
        os.close(self.fd)


def _run_todo(model, todo: list[dict], out_path: str, defaults: SamplingParams, counts: dict, progress: bool,
              watchdog_s: float | None, parallel: int | None = 1) -> None:
    """Run the requests (in order, or `parallel` at a time), appending each record to OUT."""
    out = RecordWriter(out_path, counts, len(todo), progress, overall=parallel != 1)
    try:
        if parallel != 1:
            run_records(model, todo, defaults, out, parallel, watchdog_s)
            return
        session = model.session()
        ids = [None] * len(todo)
        for i, req in enumerate(todo):
            if i + 1 < len(todo) and "error" not in todo[i + 1]:
                try:
                    ids[i + 1] = request_ids(model, todo[i + 1])
                except (ValueError, TypeError, StrataError):
                    pass                                    # run_one reports it when its turn comes
            nxt = ids[i + 1] if i + 1 < len(todo) else None
            out(req if "error" in req else run_one(model, session, req, defaults, nxt, watchdog_s))
    finally:
        out.close()
