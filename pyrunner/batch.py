"""batch.py — a prompt file in, one JSON result per line out; a killed run resumes where it stopped.

Input (JSONL, one request per line; blank lines are ignored):
    {"id": "q1", "prompt": "Once upon a time"}
    {"id": 2, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 64, "temperature": 0}
`id` (a string or an integer, unique in the file) and exactly one of `prompt` (text, continued as is)
or `messages` (rendered with the model's chat template) are required; the optional sampling fields
have OpenAI's names: max_tokens, temperature, top_p, top_k, min_p, seed, stop, presence_penalty,
frequency_penalty, repeat_penalty, repeat_last_n, logit_bias. Fields a line leaves out come from the
command's flags. Any other field is an error (a typo must not silently fall back to a default).

Output (JSONL, appended): per request {"id", "text", "finish_reason", "stats"} (stats: generate.py's
keys), or {"id", "error"} for a line that cannot run (bad JSON, missing or unknown fields, a prompt too
long for the context...), plus "line" (1-based) when the line has no usable id. The run goes on after
a bad line.

Prefix reuse: the requests run in one session, in file order; where a request's prompt and the next
one's share a beginning (a system prompt), a checkpoint is kept there, so the next request evaluates
only what differs (its stats' reused_prompt_tokens).

Resume: before it starts, the run reads OUT and skips every request whose id is there (results and
errors alike). Each result is written with one write() of one complete line and flushed before the
next request starts, so a run killed at any moment (kill -9) loses at most the request in flight; a
line cut short by the kill (no final newline) is removed on resume, so its request runs again. Nothing
is lost and nothing is written twice.
"""
from __future__ import annotations

import json
import os
import sys
from dataclasses import asdict

from ._native import StrataError
from .generate import generate, prompt_ids, render_messages
from .sampling import SamplingParams

FIELDS = ("max_tokens", "temperature", "top_p", "top_k", "min_p", "seed", "stop", "presence_penalty",
          "frequency_penalty", "repeat_penalty", "repeat_last_n", "logit_bias")


class BatchError(Exception):
    """The batch cannot start (unreadable input, OUT not writable); the message says what to do."""


def _key(rec_id) -> str:
    """Identity of an id in OUT ("1" and 1 are different ids, as in JSON)."""
    return json.dumps(rec_id)


def _valid_id(v) -> bool:
    return isinstance(v, str) or (isinstance(v, int) and not isinstance(v, bool))


def read_done(out_path: str) -> set[str]:
    """Keys of the requests OUT already holds. A last line without its newline (a write cut by a
    kill) is truncated away first; an unreadable line in the middle is reported and ignored."""
    done: set[str] = set()
    if not os.path.exists(out_path):
        return done
    try:
        with open(out_path, "rb+") as f:
            data = f.read()
            end = data.rfind(b"\n") + 1
            if end < len(data):
                f.truncate(end)
                print(f"strata batch: {out_path}: removed a partly written last line "
                      f"({len(data) - end} bytes); its request runs again", file=sys.stderr)
    except OSError as e:
        raise BatchError(f"cannot read and repair the output file {out_path}: {e.strerror or e}") from None
    for n, line in enumerate(data[:end].splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except ValueError:
            print(f"strata batch: {out_path}:{n}: not a JSON line; ignored", file=sys.stderr)
            continue
        if isinstance(rec, dict):
            if "id" in rec and _valid_id(rec["id"]):
                done.add(_key(rec["id"]))
            elif "line" in rec:
                done.add(f"line:{rec['line']}")
    return done


def parse_request(raw: str, lineno: int) -> tuple[str, dict]:
    """(key, request) for one input line; request is {"id", "prompt" | "messages", "sampling": {...}}
    or {"id", "error", ["line"]} when the line cannot run."""
    def bad(msg, rec_id=None):
        if rec_id is None:
            return f"line:{lineno}", {"id": None, "error": f"line {lineno}: {msg}", "line": lineno}
        return _key(rec_id), {"id": rec_id, "error": f"line {lineno}: {msg}"}

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
    unknown = sorted(set(rec) - {"id", "prompt", "messages"} - set(FIELDS))
    if unknown:
        return bad(f"unknown field(s) {', '.join(unknown)}; sampling fields are {', '.join(FIELDS)}", rid)
    req = {"id": rid, "sampling": {k: rec[k] for k in FIELDS if k in rec}}
    req["prompt" if has_p else "messages"] = rec["prompt" if has_p else "messages"]
    return _key(rid), req


def _write_line(fd: int, rec: dict) -> None:
    data = (json.dumps(rec, ensure_ascii=False) + "\n").encode("utf-8")
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


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


def run_one(model, session, req: dict, defaults: SamplingParams, next_ids: list[int] | None = None,
            watchdog_s: float | None = None) -> dict:
    """The result record of one parsed request (an error record if it cannot run). next_ids: the next
    request's prompt, so that a checkpoint is kept where the two part (a shared system prompt is then
    evaluated once). A request the watchdog aborted (watchdog_s, pyrunner.generate) gets an error record
    that keeps its partial "text", "finish_reason": "error" and its "stats"."""
    try:
        params = SamplingParams.from_dict({**asdict(defaults), **req["sampling"]})
        ids = request_ids(model, req)
        kw = asdict(params)
        share = shared_prefix(ids, next_ids)
        c = generate(model, ids, session=session, checkpoint_at=[share] if share else (), watchdog_s=watchdog_s,
                     **kw)
    except (ValueError, TypeError, StrataError) as e:   # bad fields, template errors, prompt too long,
        return {"id": req["id"], "error": str(e)}            # a failed evaluation: the next line goes on
    if c.error is not None:
        return {"id": req["id"], "error": c.error, "text": c.text, "finish_reason": c.finish_reason,
                "stats": c.stats}
    return {"id": req["id"], "text": c.text, "finish_reason": c.finish_reason, "stats": c.stats}


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
              progress: bool = True, watchdog_s: float | None = None) -> dict:
    """Run every request of in_path that out_path does not hold yet; returns counts
    {"total", "skipped", "done", "errors", "duplicates"}. The progress bar shows the running tokens/s,
    cache hit rate and draft acceptance (LiveStats)."""
    defaults = defaults or SamplingParams()
    try:
        with open(in_path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise BatchError(f"cannot read the input file {in_path}: {getattr(e, 'strerror', None) or e}") from None
    d = os.path.dirname(os.path.abspath(out_path))
    if not os.path.isdir(d):
        raise BatchError(f"-o {out_path}: the folder {d} does not exist")
    done = read_done(out_path)
    todo, seen, skipped, duplicates = [], set(), 0, 0
    for n, raw in enumerate(lines, 1):
        if not raw.strip():
            continue
        key, req = parse_request(raw, n)
        if key in seen:
            duplicates += 1
            print(f"strata batch: {in_path}:{n}: id {req['id']!r} appears again; only its first line runs",
                  file=sys.stderr)
            continue
        seen.add(key)
        if key in done:
            skipped += 1
            continue
        todo.append(req)
    total = len(seen)
    counts = {"total": total, "skipped": skipped, "done": 0, "errors": 0, "duplicates": duplicates}
    try:
        fd = os.open(out_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    except OSError as e:
        raise BatchError(f"cannot write the output file {out_path}: {e.strerror or e}") from None
    session = model.session()
    bar = None
    try:
        if progress:
            import click
            label = f"batch: {len(todo)} to run" + (f", {skipped} already in {out_path}" if skipped else "")
            bar = click.progressbar(length=len(todo), label=label, file=sys.stderr, show_pos=True,
                                    show_eta=True, item_show_func=lambda item: item)
            bar.__enter__()
        live = LiveStats()
        ids = [None] * len(todo)
        for i, req in enumerate(todo):
            if i + 1 < len(todo) and "error" not in todo[i + 1]:
                try:
                    ids[i + 1] = request_ids(model, todo[i + 1])
                except (ValueError, TypeError, StrataError):
                    pass                                    # run_one reports it when its turn comes
            nxt = ids[i + 1] if i + 1 < len(todo) else None
            rec = req if "error" in req else run_one(model, session, req, defaults, nxt, watchdog_s)
            _write_line(fd, rec)
            counts["errors" if "error" in rec else "done"] += 1
            live.add(rec.get("stats") or {})
            if bar is not None:
                bar.update(1, live.line())
    finally:
        if bar is not None:
            bar.__exit__(None, None, None)
        os.close(fd)
    return counts
