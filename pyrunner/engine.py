"""engine.py — many requests at once on one model: continuous batching of sequences.

    eng = Engine(model, max_seqs=8)
    req = eng.submit("def read_config(path):", SamplingParams(max_tokens=64, temperature=0))
    for piece in req: print(piece.text, end="")          # or: async for piece in req.astream()
    req.result().finish_reason
    eng.close()

How it works (vLLM's continuous batching, on generate.py's own request loop):
  - Each running request has a worker, a greenlet on the engine's thread, that runs exactly what
    generate() runs for one request (generate._loop: prefix reuse, prefill, sampling, MTP windows, stop
    strings, max tokens, stats) on a session of its own. Its session's evaluations do not call libstrata
    themselves: Session.eval hands them to the engine (Session.batcher) and switches back to the engine's
    loop, which switches into the worker again once a step ran its tokens.
  - The engine's loop runs a step once every running worker waits on an evaluation (a worker runs until
    it does, or ends): one strata_batch_eval (Model.eval_batch) over all of them, each sequence with its
    own tokens, positions, state, checkpoints and verify window. Dense matmuls run once over every row,
    each sequence's GDN / QSA / PLE mixer on its own state, and the MoE groups merge every sequence's
    picks, so a step reads the dense weights and each picked expert once for all of them. Workers are
    greenlets, not threads, because a thread per request cost two thread hand-offs per request and step
    (the engine waking the worker, the worker waking the engine), each a context switch and a pass of the
    GIL: on a 2-core host that was 0.24 ms of a 1.09 ms step at one sequence, 2.0 of 5.3 ms at eight.
  - Chunked prefill: an evaluation longer than `prefill_chunk` tokens (a prompt) runs a piece per step;
    each step takes every short evaluation (decode tokens, verify windows) and then prefill pieces
    from what is left of `token_budget` (at least a few tokens per step, so a prompt always advances),
    so a long prompt does not stall the requests that are decoding. With `itl_factor` X, while requests
    decode the pieces are also sized from live costs so that a step takes about X times a step of the
    decode tokens alone: the engine measures the native time of decode-only steps (the median of the
    last DECODE_WINDOW) and the time each prefill token adds (a moving average: it grows with the
    prompt's context), and gives the prompts (X - 1) x decode-step / per-token-cost tokens (at least 1).
    The second such step of a prefill, then every DECODE_PROBE-th, carries no prefill (a probe), so the
    decode cost is measured during a long prefill too; a probe well under the window's median (a cost
    learned in a slow spell of the host, which no other step of the prefill could correct) starts the
    window afresh.
  - Batch-invariant: a sequence's logits are bit-identical whichever sequences share its steps
    (libstrata's kernels sum every row in a fixed order whatever the batch, strata.h), and a prompt's
    pieces, of any length, give the bits of one evaluation of the whole prompt: each piece but the
    last is evaluated with STRATA_EVAL_CONTINUED, which leaves the GDN's partial 64-token chunk open
    for the next piece (next_chunk). So greedy output equals the same request run alone with
    generate(), token for token, MTP included.
  - Sequences: at most `max_seqs` run at once (default: as many as the memory their state needs at
    the longest prompt + max_tokens leaves room for, at most 16); requests beyond wait in a queue of at
    most `max_queue` (submit raises QueueFull past it). A finished request's session goes back to a pool
    with its state and prefix-reuse checkpoints: a new request takes the free session that shares the
    longest prefix with its prompt (a system prompt is evaluated once, then reused).
  - cancel() ends one request at the next step (a prefill between two chunks) without disturbing the
    others; its finish_reason is "cancelled".
"""
from __future__ import annotations

import asyncio
import collections
import itertools
import math
import statistics
import sys
import threading
import time
import traceback
from dataclasses import dataclass, field

import greenlet
import numpy as np

from . import trace
from ._native import StrataError
from .generate import Completion, _check_fits, _loop, end_of_generation_ids, prompt_ids
from .mtp import AUTO, MTP_MAX_DEFAULT, parse_mtp
from .sampling import Sampler, SamplingParams

MAX_SEQS_DEFAULT = 16
KEEP_STATES = 2         # strata.h STRATA_EVAL_KEEP_STATES
CONTINUED = 4           # strata.h STRATA_EVAL_CONTINUED
RECENT_PROMPTS = 32     # prompts a new one is compared with for a shared beginning
SHARED_MIN = 32         # a shared beginning at least this long gets a checkpoint
STATE_CHUNK = 256       # native/src/model/state.c: the caches grow in chunks of this many tokens
GDN_CHUNK = 64          # native/src/model/gdn.c: the chunked form's chunk (STRATA_EVAL_CONTINUED needs n_ubatch a multiple)
GDN_CHUNK_MIN = 32      # gdn.c GDN_CHUNK_MIN_TOKENS: a step this long runs the chunked form
MIN_PIECE = 16          # prefill tokens a step gives the first prompt even when decode tokens fill the budget
DECODE_WINDOW = 16      # itl_factor: decode-only steps whose median native time is a decode step's cost
DECODE_PROBE = 16       # itl_factor: beside a prompt's prefill, every this many steps one is decode-only
PROBE_STALE = 0.67      # a probe under this fraction of the decode cost: the window was learned in a slow spell


class QueueFull(Exception):
    """submit() found max_seqs requests running and max_queue waiting; retry after `retry_after` s."""

    def __init__(self, message: str, retry_after: float):
        super().__init__(message)
        self.retry_after = retry_after


class Cancelled(Exception):
    """Raised inside a cancelled request's evaluation (its worker ends the request)."""


class EngineStopped(RuntimeError):
    """The engine's thread stopped on an error of its own (a bug, not a request's): every request in flight
    ends with it (finish_reason "error") instead of waiting forever, and submit() raises it."""


@dataclass
class TokenLogprob:
    token: int
    text: str
    logprob: float
    top: list = field(default_factory=list)   # [(token, text, logprob)], most likely first


@dataclass
class Piece:
    text: str
    tokens: list
    logprobs: list | None = None


class _LogprobSampler(Sampler):
    """A Sampler that also records the log-probability of every token it draws, under the model's
    distribution (log-softmax of the raw logits, as OpenAI and vLLM report), with the `n_top` most
    likely alternatives."""

    def __init__(self, params: SamplingParams, n_top: int, tokenizer):
        super().__init__(params)
        self.n_top = n_top
        self.tok = tokenizer
        self.records: collections.deque = collections.deque()

    def _text(self, t: int) -> str:
        return self.tok.token_bytes(t).decode("utf-8", "replace")

    def sample(self, logits, history=()):
        t = super().sample(logits, history)
        x = np.asarray(logits)
        # the normaliser in float64 with one buffer (its exp is most of the cost: 151,936 logits took 7.3 ms a
        # token with the vocabulary-sized log-probabilities and the partition of their negation, 3.9 ms so);
        # the log-probabilities of the drawn and the top tokens only. The top are the largest logits (x - lse
        # in float64 keeps the order of distinct float32 logits); every logit tied with the n-th joins them, and
        # ties go to the lower id (the partition alone kept an arbitrary few of a tie at the cut)
        m = float(x.max())
        e = x.astype(np.float64)
        e -= m
        np.exp(e, out=e)
        lse = m + float(np.log(e.sum()))
        top = []
        if self.n_top > 0:
            k = min(self.n_top, x.size)
            idx = np.flatnonzero(x >= np.partition(x, x.size - k)[x.size - k])     # the n-th largest and above
            lp = x[idx].astype(np.float64) - lse
            order = np.lexsort((idx, -lp))[:k]
            top = [(int(idx[i]), self._text(int(idx[i])), float(lp[i])) for i in order]
        self.records.append(TokenLogprob(int(t), self._text(int(t)), float(np.float64(x[t]) - lse), top))
        return t


class Request:
    """One request in an Engine: iterate it (or `async for` over astream()) for Pieces; result()
    waits for the Completion."""

    def __init__(self, engine: "Engine", rid: str, ids: list, params: SamplingParams, logprobs, mtp,
                 checkpoint_at=()):
        self.engine = engine
        self.id = rid
        self.prompt_ids = ids
        self.prompt_tokens = len(ids)
        self.params = params
        self.n_logprobs = logprobs
        self.mtp = mtp
        self.checkpoint_at = tuple(checkpoint_at)
        self.t_submit = time.perf_counter()
        self.halt = threading.Event()
        self.cancelled = False
        self._lock = threading.Lock()
        self._items: collections.deque = collections.deque()   # Pieces, then the Completion
        self._cv = threading.Condition(self._lock)
        self._async: list = []                                  # (loop, asyncio.Queue) of astream()s
        self._completion: Completion | None = None
        self._done = threading.Event()
        self._iterated = False

    # ------------------------------------------------------------------ the worker's side
    def _put(self, item) -> None:
        with self._cv:
            self._items.append(item)
            self._cv.notify_all()
            for loop, q in self._async:
                try:
                    loop.call_soon_threadsafe(q.put_nowait, item)
                except RuntimeError:          # that event loop is closed: its client is gone
                    pass

    def _finish(self, c: Completion) -> None:
        self._completion = c
        self._put(c)
        self._done.set()

    # ------------------------------------------------------------------ the consumer's side
    @property
    def done(self) -> bool:
        return self._done.is_set()

    def cancel(self) -> None:
        """Ends the request at the engine's next step (finish_reason "cancelled"); the other requests
        are not disturbed. No-op once it ended."""
        self.cancelled = True
        self.halt.set()
        self.engine._wake()

    def __iter__(self):
        with self._cv:
            if self._iterated:
                raise RuntimeError("a Request's pieces can be iterated once")
            self._iterated = True
        while True:
            with self._cv:
                while not self._items:
                    self._cv.wait()
                item = self._items.popleft()
            if isinstance(item, Completion):
                return
            yield item

    async def astream(self):
        """The Pieces, for asyncio code (the engine's threads hand them to this event loop)."""
        loop = asyncio.get_running_loop()
        q: asyncio.Queue = asyncio.Queue()
        with self._cv:
            if self._iterated:
                raise RuntimeError("a Request's pieces can be iterated once")
            self._iterated = True
            for item in self._items:
                q.put_nowait(item)
            self._items.clear()
            self._async.append((loop, q))
        while True:
            item = await q.get()
            if isinstance(item, Completion):
                return
            yield item

    def wait(self, timeout: float | None = None) -> bool:
        """True once the request ended (waits at most timeout s)."""
        return self._done.wait(timeout)

    def result(self, timeout: float | None = None) -> Completion:
        if not self._done.wait(timeout):
            raise TimeoutError(f"request {self.id} did not finish in {timeout} s")
        return self._completion


class _Pending:
    """An evaluation a worker waits on: its tokens, where the next chunk starts, its outputs, and the
    worker's greenlet, which the engine switches back into once the evaluation ran (or failed: error)."""

    __slots__ = ("sess", "req", "ids", "flags", "out", "hid", "pos", "error", "g")

    def __init__(self, sess, req, ids, flags, out, hid):
        self.sess, self.req, self.ids, self.flags, self.out, self.hid = sess, req, ids, flags, out, hid
        self.pos = 0
        self.error = None
        self.g = greenlet.getcurrent()


class _Batcher:
    """Session.batcher of a request's session: eval() parks the worker's greenlet (back to the engine's
    loop, on the same thread) until a step ran its tokens."""

    def __init__(self, engine: "Engine", req: Request):
        self.engine, self.req = engine, req

    def sharing(self) -> int:
        """Decoding sequences in the engine's last step, this one's included (--mtp auto weighs a window's
        time against every sequence's tokens: mtp.DraftPolicy.shared_tokens)."""
        return max(1, self.engine._decoders)

    def eval(self, sess, ids32, flags, out, hid) -> None:
        if self.req.cancelled:
            raise Cancelled(f"request {self.req.id} was cancelled")
        p = _Pending(sess, self.req, ids32, flags, out, hid)
        eng = self.engine
        if p.g is eng._root or p.g.parent is not eng._root:
            raise RuntimeError("a session of the engine was evaluated outside the engine's worker")
        eng._pending.append(p)          # only the engine's thread touches _pending: no lock
        eng._root.switch()
        if p.error is not None:
            raise p.error


def next_chunk(n: int, pos: int, want: int, cap: int) -> tuple[int, bool]:
    """(tokens, continued): the piece of an n-token evaluation to run from pos in this step, at most
    `want` tokens, and whether to evaluate it with STRATA_EVAL_CONTINUED, so that the pieces give the
    bits of one strata_session_eval of all n. That call cuts them into steps of `cap` (the model's
    n_ubatch, a multiple of 64); a step of >= 32 tokens runs the GDN's chunked form over 64-token chunks
    from its start, a shorter one the recurrence (gdn.c). Pieces of the chunked part are continued
    (each leaves its partial chunk open for the next; the last closes it); when the call's last step is
    shorter than 32 tokens, the piece before it ends on that step's start (a chunk boundary) without the
    flag, and the last step's tokens run as pieces of their own, the recurrence split anywhere."""
    last = n - cap * ((n - 1) // cap)          # the one call's last step
    chunked_end = n - last if last < GDN_CHUNK_MIN else n
    if pos < chunked_end:
        take = min(want, chunked_end - pos)
        return take, pos + take < chunked_end
    return min(want, n - pos), False


def _mem_available() -> int | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


class Engine:
    """Continuous batching of requests on one Model (module docstring)."""

    def __init__(self, model, max_seqs: int | None = None, max_queue: int | None = None, mtp: int | None = None,
                 watchdog_s: float | None = None, prefill_chunk: int | None = None,
                 token_budget: int | None = None, memory_bytes: int | None = None,
                 itl_factor: float | None = None):
        """max_seqs: sequences run at once (None: 16), and fewer while their state would not fit in
        memory_bytes (default: half of MemAvailable at the first request): each running request counts
        the state its prompt + max_tokens grows to (state_need), so many short requests run where few
        long ones would, and the rest wait in the queue. max_queue: requests waiting beyond them at
        most (None: no bound). mtp: MTP drafts per window (None: the model's). prefill_chunk: tokens of a
        prompt evaluated per step at most (default the model's step, 512; any count, as pieces of one
        evaluation keep its bits: next_chunk). token_budget: tokens per step, decode tokens and verify
        windows first, prefill pieces from the rest (default prefill_chunk). itl_factor: while requests
        decode, size the prefill pieces so a step takes about this many times a decode-only step (live
        costs, module docstring; > 1; None: the budget alone)."""
        self.model = model
        self.mtp = parse_mtp(getattr(model, "mtp", 0) if mtp is None else mtp)
        # the longest decode evaluation: a verify window of the most drafts (what _learn_costs counts as decode)
        self._window_max = 1 + (getattr(model, "mtp_max", MTP_MAX_DEFAULT) if self.mtp == AUTO else self.mtp)
        self.watchdog_s = trace.watchdog_seconds(watchdog_s)
        self.step_cap = min(512, int(getattr(model, "prefill_chunk", 512)))   # Model's n_ubatch
        chunk = self.step_cap if prefill_chunk is None else int(prefill_chunk)
        if chunk <= 0 or chunk > self.step_cap:
            raise ValueError(f"prefill_chunk {chunk}: give 1 to {self.step_cap} tokens (the model's step)")
        if self.step_cap % GDN_CHUNK:
            chunk = self.step_cap     # STRATA_EVAL_CONTINUED needs whole GDN chunks per step: evaluate prompts whole
        self.prefill_chunk = chunk
        self.token_budget = chunk if token_budget is None else max(1, int(token_budget))
        if itl_factor is not None and not 1 < itl_factor < math.inf:    # inf: int() of the piece size overflowed
            raise ValueError(f"itl_factor {itl_factor}: give a finite factor > 1 (a step's time over a decode-only "
                             f"step's)")
        self.itl_factor = itl_factor
        self._t_decode = None      # s: the median native time of the last DECODE_WINDOW steps without prefill
        self._decode_times: collections.deque = collections.deque(maxlen=DECODE_WINDOW)
        self._t_token = None       # s: moving average of the time a prefill token adds to a step
        self._since_probe = 0      # mixed steps planned since the last probe (a decode-only step during a prefill)
        self._probing = False      # the step planned last is a probe
        self._mixed_last = False   # the step planned last had decoders beside a prompt
        self.memory_bytes = memory_bytes
        self.max_seqs = self._fit_seqs(max_seqs)
        if max_queue is not None and max_queue < 0:
            raise ValueError(f"max_queue must be >= 0 (got {max_queue})")
        self.max_queue = max_queue
        self._eog = end_of_generation_ids(model)
        self._cv = threading.Condition()
        self._queue: collections.deque = collections.deque()    # submitted, not running
        self._running: dict = {}                                # Request -> its worker's greenlet
        self._pending: list = []                                # _Pending evaluations (the engine thread's alone)
        self._free: list = []                                   # idle sessions (prefix reuse), newest last
        self._sess_of: dict = {}                                # running Request -> its session
        self._held: dict = {}                                   # session -> its state bytes after its last step
        self._decoders = 0                                      # short evaluations (decoders) in the last step
        self._n_sessions = 0
        self._closing = False
        self._stopped: EngineStopped | None = None             # set when the engine's thread failed (_fail)
        self._ids = itertools.count(1)
        self.counters = collections.Counter()
        self._tps_window: collections.deque = collections.deque()   # (time, generated tokens) per step
        self._recent: collections.deque = collections.deque(maxlen=RECENT_PROMPTS)
        self._thread = threading.Thread(target=self._run, name="strata-engine", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ sizing
    def _fit_seqs(self, max_seqs: int | None) -> int:
        if max_seqs is not None:
            if max_seqs < 1:
                raise ValueError(f"max_seqs must be >= 1 (got {max_seqs})")
            return int(max_seqs)
        return MAX_SEQS_DEFAULT

    def _budget(self) -> int | None:
        if self.memory_bytes is None:
            avail = _mem_available()
            self.memory_bytes = avail // 2 if avail else 0
        return self.memory_bytes or None

    def state_need(self, req: "Request") -> int:
        """Bytes of state a request's session grows to at most: its prompt and max_tokens (the context
        when unbounded), in the chunks the caches grow by (state.c: doubled, whole 256-token chunks)."""
        m = self.model
        fixed = int(getattr(m, "state_fixed_bytes", 0) or 0)
        per = int(getattr(m, "state_token_bytes", 0) or 0)
        n_ctx = int(getattr(m, "n_ctx", 1 << 30))
        mt = req.params.max_tokens
        want = min(n_ctx, req.prompt_tokens + (mt if mt is not None and mt >= 0 else n_ctx))
        cap = STATE_CHUNK
        while cap < want:
            cap *= 2
        cap = min(n_ctx, -(-cap // STATE_CHUNK) * STATE_CHUNK)
        return fixed + per * cap

    def _fits(self, req: "Request") -> bool:
        """The memory bound on live sequences: the running requests' state (at its most), the free
        sessions' (as they are) and this one's stay within the budget; free sessions go first (least
        recently used), and a request that fits nowhere still runs alone."""
        budget = self._budget()
        if budget is None:
            return True
        need = self.state_need(req) + sum(self.state_need(r) for r in self._running)
        while self._free and need + sum(s.state_bytes for s in self._free) > budget:
            gone = self._free.pop(0)
            self._held.pop(gone, None)
            gone.close()
            self._n_sessions -= 1
        return not self._running or need <= budget

    # ------------------------------------------------------------------ the API
    @property
    def stopped(self) -> "EngineStopped | None":
        """The error the engine's thread stopped on (_fail), or None while it runs."""
        return self._stopped

    def submit(self, prompt, params: SamplingParams | None = None, *, add_special: bool = True,
               logprobs: int | None = None, mtp: int | None = None, checkpoint_at=()) -> Request:
        """Queues a request (prompt: text or token ids). checkpoint_at: prompt positions to keep a
        prefix-reuse checkpoint at (e.g. where a chat's system prompt ends); the engine adds the longest
        beginning the prompt shares with a recent request's, so from then on a free session holds it.
        Raises ValueError (a prompt that does not fit the context, bad logprobs) and QueueFull
        (max_seqs running and max_queue waiting)."""
        params = params if params is not None else SamplingParams()
        if params.max_tokens is not None and params.max_tokens < -2:
            raise ValueError(f"max_tokens {params.max_tokens}: give a count >= 0 or -1 (no limit)")
        if logprobs is not None and not 0 <= int(logprobs) <= 20:
            raise ValueError(f"logprobs {logprobs}: give 0..20 alternatives")
        ids = prompt_ids(self.model, prompt, add_special)
        _check_fits(self.model, ids)
        k = self.mtp if mtp is None else parse_mtp(mtp)
        if logprobs is not None:
            k = 0            # one sampled token per logits row: what the logprobs report
        with self._cv:
            if self._stopped is not None:
                raise self._stopped
            if self._closing:
                raise RuntimeError("the engine is shutting down")
            if self.max_queue is not None and len(self._running) + len(self._queue) >= self.max_seqs + self.max_queue:
                raise QueueFull(f"{len(self._running)} requests are running and {len(self._queue)} waiting "
                                f"(max_queue {self.max_queue}); retry later", self._retry_after())
            cuts = set(int(c) for c in checkpoint_at if 0 < int(c) < len(ids))
            shared = self._shared_prefix(ids)
            if shared >= SHARED_MIN:
                cuts.add(shared)
            req = Request(self, f"req-{next(self._ids)}", ids, params, logprobs, k, sorted(cuts))
            self._queue.append(req)
            self.counters["requests_total"] += 1
            self.counters["prompt_tokens_total"] += len(ids)
            self._cv.notify_all()
        return req

    def _shared_prefix(self, ids) -> int:
        """The longest beginning ids shares with one of the recent prompts (below its own length)."""
        best = 0
        a = np.asarray(ids)
        for prev in self._recent:
            n = min(len(prev), len(a) - 1)
            if n <= best:
                continue
            diff = np.flatnonzero(prev[:n] != a[:n])
            k = int(diff[0]) if diff.size else n
            best = max(best, k)
        self._recent.append(a)
        return best

    def _retry_after(self) -> float:
        tps = self._tps()
        return 1.0 if tps <= 0 else max(1.0, min(60.0, 64 * max(1, len(self._queue)) / tps))

    def _tps(self) -> float:
        w = self._tps_window
        if len(w) < 2 or w[-1][0] <= w[0][0]:
            return 0.0
        return sum(n for _, n in itertools.islice(w, 1, None)) / (w[-1][0] - w[0][0])

    def _count_tokens(self, n: int) -> None:
        with self._cv:
            now = time.perf_counter()
            self._tps_window.append((now, n))
            while len(self._tps_window) > 2 and now - self._tps_window[0][0] > 10.0:
                self._tps_window.popleft()

    def metrics(self) -> dict:
        with self._cv:
            out = {"requests_total": self.counters["requests_total"],
                   "requests_running": len(self._running), "requests_queued": len(self._queue),
                   "requests_finished": self.counters["requests_finished"],
                   "requests_cancelled": self.counters["requests_cancelled"],
                   "requests_failed": self.counters["requests_failed"],
                   "prompt_tokens_total": self.counters["prompt_tokens_total"],
                   "reused_prompt_tokens_total": self.counters["reused_prompt_tokens_total"],
                   "generated_tokens_total": self.counters["generated_tokens_total"],
                   "generated_tps": self._tps(), "steps_total": self.counters["steps_total"],
                   "step_tokens_total": self.counters["step_tokens_total"],
                   "max_seqs": self.max_seqs, "sessions": self._n_sessions,
                   "state_bytes": sum(self._held.values()),
                   "drafts_proposed": self.counters["drafts_proposed"],
                   "drafts_accepted": self.counters["drafts_accepted"]}
        off = self.model.offload_stats() if hasattr(self.model, "offload_stats") else {}
        for k in ("cache_hits", "cache_lookups", "pcie_bytes", "cpu_bytes"):
            out[k] = int(off.get(k, 0))
        return out

    def close(self, cancel: bool = True, timeout: float | None = None) -> dict:
        """Stops taking requests; with cancel, cancels the running and queued ones (else lets them
        finish, waiting at most `timeout` s before cancelling the rest). Returns {"finished": [ids],
        "cancelled": [ids]} of the requests in flight when it was called."""
        with self._cv:
            self._closing = True
            inflight = list(self._running) + list(self._queue)
            self._cv.notify_all()
        if not cancel:
            deadline = None if timeout is None else time.monotonic() + timeout
            for r in inflight:
                left = None if deadline is None else max(0.0, deadline - time.monotonic())
                r._done.wait(left)
        for r in inflight:
            if not r.done:
                r.cancel()
        for r in inflight:
            r._done.wait(30)
        with self._cv:
            self._stop = True
            self._cv.notify_all()
        self._thread.join(30)
        gone = {r.id for r in inflight if r.done and r.result(0).finish_reason == "cancelled"}
        return {"finished": [r.id for r in inflight if r.id not in gone], "cancelled": [r.id for r in inflight if r.id in gone]}

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _wake(self) -> None:
        with self._cv:
            self._cv.notify_all()

    # ------------------------------------------------------------------ sessions
    def _take_session(self, ids):
        """The free session that shares the longest prefix with ids (a new one while fewer than
        max_seqs exist; else the least recently used free one)."""
        best, best_n = None, 0
        for s in self._free:
            n = s.reusable(ids)
            if n > best_n:
                best, best_n = s, n
        if best is None:
            if self._n_sessions < self.max_seqs:
                self._n_sessions += 1
                return self.model.session()
            best = self._free[0]
        self._free.remove(best)
        return best

    # ------------------------------------------------------------------ the engine thread
    _stop = False
    _root = None         # the engine thread's own greenlet, the workers' parent (set by _run)
    step_log = None      # a list: every step appends {"short": evaluations taken whole, "prefill_tokens"}

    def _run(self) -> None:
        trace.watchdog(self.watchdog_s)
        self._root = greenlet.getcurrent()
        try:
            self._loop()
        except BaseException as e:   # noqa: BLE001 (a bug of the engine's own: end the requests, do not hang them)
            self._fail(e)

    def _fail(self, e: BaseException) -> None:
        """The engine's loop raised (its planning or bookkeeping, not an evaluation: _step hands those to the
        requests): with `--itl-factor inf`, int() of a piece size once did, and every request in flight then
        waited forever. Now each worker waiting on an evaluation gets the error (its request ends with
        finish_reason "error" and the partial output), queued and unstarted requests end with it too, and
        submit() raises it."""
        traceback.print_exception(type(e), e, e.__traceback__, file=sys.stderr)
        err = EngineStopped(f"the engine stopped on an error of its own ({type(e).__name__}: {e}); "
                            f"start a new engine (or restart the server)")
        with self._cv:
            self._stopped = err
            self._closing = True
            queued = list(self._queue)
            self._queue.clear()
        for _ in range(10000):       # each switch ends a worker (or it evaluates again: then once more)
            with self._cv:
                pending, self._pending = self._pending, []
            if not pending:
                break
            for p in pending:
                p.error = err
                try:
                    p.g.switch()
                except BaseException:   # noqa: BLE001 (the worker ends its own request; nothing else to do)
                    pass
        with self._cv:
            left = [r for r in list(self._running) + queued if not r.done]
            self._cv.notify_all()
        for r in left:               # admitted but not started, or queued
            r._finish(Completion("", [], "error", {"prompt_tokens": r.prompt_tokens}, str(err)))

    def _loop(self) -> None:
        while True:
            with self._cv:
                while True:
                    if self._stop:
                        return
                    start = self._admit()
                    ready = self._drop_cancelled()
                    if start or ready or self._pending:
                        break           # a worker runs until it waits on an evaluation: these all wait
                    self._cv.wait(0.5)
                batch = None if start or ready else self._plan()
            for g, req, sess in start:
                g.switch(req, sess)
            if batch:
                ready = self._step(batch)
            for p in ready:
                p.g.switch()

    def _admit(self) -> list:
        """Requests that take a sequence now: (greenlet, request, session) to start."""
        start = []
        while self._queue and len(self._running) < self.max_seqs:
            if not self._queue[0].cancelled and not self._fits(self._queue[0]):
                break               # waits for memory: a running request ends first
            req = self._queue.popleft()
            if req.cancelled:
                req._finish(Completion("", [], "cancelled", {"prompt_tokens": req.prompt_tokens}))
                self.counters["requests_cancelled"] += 1
                continue
            sess = self._take_session(req.prompt_ids)
            sess.batcher = _Batcher(self, req)
            self._sess_of[req] = sess
            g = greenlet.greenlet(self._work, parent=self._root)
            self._running[req] = g
            start.append((g, req, sess))
        return start

    def _drop_cancelled(self) -> list:
        """The evaluations of cancelled requests, taken out with Cancelled as their error."""
        keep, gone = [], []
        for p in self._pending:
            if p.req.cancelled:
                p.error = Cancelled(f"request {p.req.id} was cancelled")
                gone.append(p)
            else:
                keep.append(p)
        self._pending = keep
        return gone

    def _plan(self) -> list:
        return self._plan_for(self._pending)

    def _plan_for(self, pending) -> list:
        """This step's (pending, start, end, short, continued) pieces: every short evaluation, then prefill
        pieces in arrival order from what is left of the budget (at least one piece)."""
        short, long_ = [], []
        for p in pending:
            # a verify window (KEEP_STATES) is one native call whatever its length
            whole = p.pos == 0 and (len(p.ids) <= GDN_CHUNK or p.flags & KEEP_STATES)
            (short if whole else long_).append(p)
        batch = [(p, 0, len(p.ids), True, False) for p in short]
        left = self.token_budget - sum(len(p.ids) for p in short)
        floor = MIN_PIECE
        mixed = bool(short and long_)
        begins, self._mixed_last = mixed and not self._mixed_last, mixed
        self._probing = False
        if mixed and self.itl_factor:
            # a probe (the decode tokens alone): a prefill's second step, then every DECODE_PROBE-th
            self._since_probe = DECODE_PROBE - 1 if begins else self._since_probe + 1
            if self._since_probe >= DECODE_PROBE and self._t_decode:
                self._since_probe = 0
                self._probing = True
                return batch
            # before the costs are known, a small piece: it is what teaches them
            fit = int((self.itl_factor - 1.0) * self._t_decode / self._t_token) \
                if self._t_decode and self._t_token else MIN_PIECE
            left, floor = min(left, max(1, fit)), 1
        for i, p in enumerate(long_):
            want = min(self.prefill_chunk, left if i or left >= floor else floor)
            if want <= 0:
                break
            c, cont = next_chunk(len(p.ids), p.pos, want, self.step_cap)
            batch.append((p, p.pos, p.pos + c, False, cont))
            left -= c
        return batch

    def _step(self, batch) -> list:
        """Runs one step of the planned pieces; returns the evaluations it ended (their last piece ran, or
        the step failed: their error), for the engine's loop to switch back into their workers."""
        m = self.model
        items = []
        self._decoders = sum(1 for *_, sh, _ in batch if sh)
        if self.step_log is not None:
            self.step_log.append({"short": self._decoders,
                                  "prefill_tokens": sum(b - a for _, a, b, sh, _ in batch if not sh)})
        for p, a, b, _, cont in batch:
            all_rows = bool(p.flags & 1)
            last = b == len(p.ids)
            out = p.out[a:b] if all_rows else (p.out if last else None)
            hid = p.hid[a:b] if p.hid is not None else None
            items.append((p.sess, p.ids[a:b], p.flags | (CONTINUED if cont else 0), out, hid))
        err = None
        # the watchdog's stage name for the step (the requests' loops leave labelling to the engine)
        n_tok = sum(b - a for _, a, b, *_ in batch)
        trace.label(f"engine step {self.counters['steps_total'] + 1}: {len(items)} sequences, {n_tok} tokens")
        t0 = time.perf_counter()
        try:
            m.eval_batch(items)
        except StrataError as e:
            err = trace.as_watchdog(e)
        except BaseException as e:   # noqa: BLE001 (handed to the workers, which end their requests)
            err = e
        dt = time.perf_counter() - t0
        if err is None:
            self._learn_costs(dt, batch)
        if self.step_log is not None:
            self.step_log[-1]["s"] = dt
        held = {p.sess: p.sess.state_bytes for p, *_ in batch}   # this thread ran their evals: no race
        with self._cv:
            self._held.update(held)
            self.counters["steps_total"] += 1
            self.counters["step_tokens_total"] += n_tok
            ready = []
            for p, a, b, *_ in batch:
                p.pos = b
                if err is not None or b == len(p.ids):
                    self._pending.remove(p)
                    p.error = err
                    ready.append(p)
        return ready

    def _learn_costs(self, dt: float, batch) -> None:
        """The live costs itl_factor plans with: a decode-only step's native time (the median of the last
        DECODE_WINDOW), and what each prefill token adds to it (a moving average, a fifth of each new step)."""
        pre = sum(b - a for _, a, b, sh, _ in batch if not sh)
        short = [b - a for _, a, b, sh, _ in batch if sh]
        if not short or max(short) > self._window_max:
            return              # no decoders, or a short prompt among them: not what a decode step costs
        if pre == 0:       # the median of the recent ones: a cold first step or a noisy one does not count
            if self._probing and self._t_decode and dt < PROBE_STALE * self._t_decode:
                # learned in a slow spell: start again from this step. The per-token cost, measured against
                # the stale figure, is kept: it is low, so the next pieces are a little large, not a whole
                # MIN_PIECE, and the next mixed steps measure it afresh
                self._decode_times.clear()
                self.counters["decode_cost_resets"] += 1
            self._decode_times.append(dt)
            self._t_decode = statistics.median(self._decode_times)   # numpy's costs ~20 us on 16 values
        elif self._t_decode is not None:
            per = max(dt - self._t_decode, 0.0) / pre
            self._t_token = per if self._t_token is None else 0.8 * self._t_token + 0.2 * per

    # ------------------------------------------------------------------ a request's worker
    def _work(self, req: Request, sess) -> None:
        model = self.model
        sampler = _LogprobSampler(req.params, req.n_logprobs, model.tokenizer) if req.n_logprobs is not None \
            else Sampler(req.params)
        got: list = []

        def on_token(tok):
            got.append(tok)

        def emit(text: str) -> None:
            """The text released since the last piece, with the tokens sampled since (and their logprobs)."""
            toks = list(got)
            got.clear()
            lps = [sampler.records.popleft() for _ in toks] if req.n_logprobs is not None else None
            self._count_tokens(len(toks))
            req._put(Piece(text, toks, lps))

        c = None
        try:
            gen = _loop(model, sess, req.prompt_ids, req.params, self._eog, req.t_submit, req.mtp, req.checkpoint_at, None,
                        self.watchdog_s, req.halt, sampler, on_token)
            try:
                while True:
                    emit(next(gen))
            except StopIteration as stop_it:
                c = stop_it.value
            if got:                  # tokens whose text the stop rules held back or dropped: still sampled
                emit("")
        except Cancelled:
            c = None
        except BaseException as e:   # noqa: BLE001 (the request ends with the error; the engine goes on)
            c = Completion("", [], "error", {"prompt_tokens": req.prompt_tokens}, f"{type(e).__name__}: {e}")
        if req.cancelled and (c is None or c.finish_reason in ("interrupted", "error")):
            c = Completion(c.text if c else "", c.tokens if c else [], "cancelled",
                           c.stats if c else {"prompt_tokens": req.prompt_tokens})
        sess.batcher = None
        with self._cv:
            del self._running[req]
            self._sess_of.pop(req, None)
            self._free.append(sess)
            key = "requests_cancelled" if c.finish_reason == "cancelled" else \
                "requests_failed" if c.finish_reason == "error" else "requests_finished"
            self.counters[key] += 1
            self.counters["generated_tokens_total"] += int(c.stats.get("generated_tokens", len(c.tokens)))
            self.counters["reused_prompt_tokens_total"] += int(c.stats.get("reused_prompt_tokens", 0))
            self.counters["drafts_proposed"] += int(c.stats.get("drafts_proposed", 0))
            self.counters["drafts_accepted"] += int(c.stats.get("drafts_accepted", 0))
            self._cv.notify_all()
        req._finish(c)
