"""generate.py — one request: prompt -> tokens -> sampled continuation -> text, with stats.

    c = generate(model, "Once upon a time", max_tokens=64, temperature=0.7, seed=1)
    c.text, c.tokens, c.finish_reason, c.stats          # finish_reason "stop" | "length" | "error"

    s = generate(model, prompt, stream=True)             # a CompletionStream
    for piece in s: print(piece, end="")
    s.completion                                         # the same Completion, once iterated

    create_completion(model, prompt, ...)                # llama-cpp-python's dict shapes (OpenAI)
    create_chat_completion(model, messages, ...)         # rendered with the model's chat template

    steps = generate_step(sess, ids, Sampler(params), max_tokens=64)     # the token level
    for st in steps: ...                                 # a Step per token; steps.send(STOP) ends it

Two layers, as mlx-lm's generate_step under stream_generate (DESIGN §5):
  the step loop, generate_step(): prefill the part of the prompt the session does not already hold,
    then sample -> yield the token -> evaluate it, one token at a time (or a verify window at a time
    with MTP drafts, rolled back to what was accepted), feeding each window's counters to the PCIe
    share controller and labelling each evaluation for the watchdog and the trace. It knows no text;
    its consumer tells it where the request ends (its docstring says how). The server and the batch
    scheduler drive it as the text layer does.
  the text layer (generate() through _stream_text): each token through the detokeniser and the stop
    criteria, the text streamed, the Completion and its stats.
Text is decoded through
the tokenizer's StreamDecoder (a character split across tokens is emitted whole) and through
sampling.StopStream (text that may be the start of a stop string is held back; the stop string itself is
never emitted). An end-of-generation token (EOS, EOT, or a control token such as <|im_end|>) ends the
request with "stop" and is neither emitted nor part of `tokens`; max_tokens, or a full context, end it
with "length".

Prefix reuse (model.Session): a session remembers the tokens its state holds (the prompt and every
generated token but the last), the logits after them, and checkpoints of its recurrent state (at the
end of every prompt's prefill, at `checkpoint_at` positions, every Session.checkpoint_every tokens of
a long prefill, and where each request ends). A request resumes from the longest of these that its
prompt starts with and evaluates only the rest (`reused_prompt_tokens` counts what it did not
evaluate); a request equal to what the session holds evaluates nothing. A failure or an interrupt
(Ctrl-C) inside an evaluation leaves the state unknown: the next request starts over.

With mtp > 0 (or "auto": mtp.DraftPolicy picks the drafts of each window, 0 included) the decode runs in
verify windows (pyrunner.mtp): drafts from the model's MTP head,
one trunk pass over the window, the longest agreeing prefix kept and the rest rolled back. Greedy
output is the same token for token; sampled output has the same distribution.

Watchdog (DESIGN §7, pyrunner.trace): a request that makes no progress for `watchdog_s` seconds (default:
STRATA_WATCHDOG_S, else 600; <= 0 off) is aborted inside libstrata; generate() then returns what was
generated so far as a Completion with finish_reason "error" and `error` set to the message, which names the
stage ("decode step 12, layer 40 MoE: waiting for the device's copies ..."). The session starts over at
its next request (the state of an aborted eval is unknown); the model stays usable. With --trace
(pyrunner.trace.Tracer active) the text layer adds the request's span and the step loop the prefill and
decode-step spans and counters.

Stats (DESIGN §9 keys; seconds and tokens; a key is absent when it does not apply):
    prompt_tokens          tokens of the prompt
    reused_prompt_tokens   of those, held by the session already (not evaluated again)
    generated_tokens       tokens sampled, an ending EOS included (it cost a step too)
    prefill_s, prefill_tps the evaluation of the prompt's new tokens (absent when there were none)
    ttft_s                 request start (tokenizing included) to the first sampled token
    decode_s, decode_tps   first sampled token to the end; tps = decode steps / decode_s
                           (absent with fewer than two sampled tokens)
    drafts_proposed, drafts_accepted, acceptance_rate, mean_accepted_len (tokens per verify window,
                           the bonus token included), mtp_windows, mtp_full_windows (every draft taken),
                           mtp_draft_s, mtp_verify_s, mtp_rollback_s, mtp_extend_s   with mtp > 0
"""
from __future__ import annotations

import sys
import threading
import time
import uuid
import weakref
from dataclasses import dataclass, field
from typing import Generator, Iterator, Sequence

import numpy as np

from . import trace
from ._native import StrataError
from .mtp import AUTO, MTP_MAX_DEFAULT, DraftPolicy, MTPDecoder, parse_mtp
from .sampling import Sampler, SamplingParams, StopCriteria

# Control tokens that end a turn in the chat formats Strata meets (ChatML/Qwen first); a file's own
# eos/eot/eom ids are added to these.
_EOG_TEXTS = ("<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<|end|>", "<end_of_turn>", "<|return|>")

STATS_KEYS = ("prompt_tokens", "reused_prompt_tokens", "generated_tokens", "prefill_s", "prefill_tps",
              "ttft_s", "decode_s", "decode_tps",
              # the offload engine (DESIGN §4, §9): present when experts run on a device or are skipped
              "cache_hits", "cache_lookups", "hit_rate", "cache_swaps", "pcie_groups", "pcie_bytes",
              "cpu_groups", "cpu_s", "skipped_experts", "pcie_frac",
              # the PLE table (DESIGN §6, §9): present when the model has one
              "ple_rows", "ple_read_bytes", "ple_major_faults", "ple_wait_s",
              # its row cache (issue 21.3): rows looked up and found (0 / 0 with --ple-cache-mib 0)
              "ple_cache_hits", "ple_cache_lookups",
              # MTP drafts (DESIGN §5, §9; pyrunner.mtp): present with mtp > 0
              "drafts_proposed", "drafts_accepted", "acceptance_rate", "mean_accepted_len", "mtp_windows",
              "mtp_full_windows", "mtp_draft_s", "mtp_verify_s", "mtp_rollback_s", "mtp_extend_s",
              # mtp "auto" (mtp.DraftPolicy): the drafts per window chosen, averaged over the request's
              # windows and plain steps, how many windows ran each k, and the windows where the choice changed
              "mtp_k", "mtp_k_windows", "mtp_k_changes",
              # the expert store's RAM slots (issue 20): present with direct expert reads
              "ram_hits", "ram_lookups", "ram_hit_rate", "ram_miss_bytes", "storage_read_bytes", "expert_read_s",
              "prefetch_bytes", "prefetch_unused_bytes", "prefetch_recall")
_PLE_KEYS = ("ple_rows", "ple_read_bytes", "ple_major_faults", "ple_wait_s", "ple_cache_hits", "ple_cache_lookups")
_OFFLOAD_DELTAS = ("cache_hits", "cache_lookups", "cache_swaps", "pcie_groups", "pcie_bytes", "cpu_groups",
                   "cpu_s", "skipped_experts")


@dataclass
class Completion:
    """The result of one request."""
    text: str
    tokens: list[int]
    finish_reason: str                       # "stop" (EOS or a stop string), "length", "error", or
                                             # "interrupted" (CompletionStream.stop())
    stats: dict = field(default_factory=dict)
    error: str | None = None                 # finish_reason "error": what went wrong (the watchdog's message)

    def to_dict(self) -> dict:
        """The `--json` form: {"text", "tokens", "finish_reason", "stats"}, plus "error" when the
        request was aborted (finish_reason "error")."""
        d = {"text": self.text, "tokens": list(self.tokens), "finish_reason": self.finish_reason,
             "stats": dict(self.stats)}
        if self.error is not None:
            d["error"] = self.error
        return d


class CompletionStream:
    """What generate(stream=True) returns: iterate it for text pieces (joined, they are the
    completion's text); afterwards `.completion` holds the Completion. Iterate it once."""

    def __init__(self, gen: Iterator[str], halt: threading.Event):
        self._gen = gen
        self._halt = halt
        self._used = False
        self.completion: Completion | None = None

    def __iter__(self):
        if self._used:
            raise RuntimeError("a CompletionStream can be iterated only once")
        self._used = True
        self.completion = yield from self._gen

    def close(self) -> None:
        """Stop early (the session keeps every token evaluated so far)."""
        self._gen.close()

    def stop(self) -> None:
        """Ask the loop to end after the token it is on, as max_tokens would end it: the evaluation in
        flight completes, the session keeps (and checkpoints) every token but the last one sampled, and
        `.completion` gets finish_reason "interrupted" with its stats. It only sets a flag, so a signal
        handler may call it (chat's Ctrl-C)."""
        self._halt.set()


# ------------------------------------------------------------------------------------ sessions


_eog_cache: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def default_session(model):
    """The model's own session: the one generate() uses when no session is given and no other call
    holds it (one per model, so that consecutive requests reuse what they share)."""
    return model.own_session


def _on_a_free_session(model, body):
    """Generator: runs body(session) on the model's own session when no other call holds it, else on
    a session made for this call alone and freed when it ends.

    Why not a lock that makes a second call wait: a stream holds its session until it is exhausted
    or closed, so a thread that opens a stream and makes another call before finishing it would wait
    on itself, and an abandoned stream would stall every later call. Why not a session per call
    always: consecutive calls would lose prefix reuse. libstrata runs sessions of one model on
    several threads at once (strata.h), so calls that overlap only cost one session state each
    (Model.state_bytes at most) while they overlap. The session is taken when the generator starts,
    so a stream that is never iterated holds nothing."""
    lock = model._generate_lock
    if lock.acquire(blocking=False):
        try:
            return (yield from body(default_session(model)))
        finally:
            lock.release()
    sess = model.session()
    try:
        return (yield from body(sess))
    finally:
        if sess in model._sessions:      # (model.close() may have emptied the list meanwhile)
            model._sessions.remove(sess)
        sess.close()


def forget(sess) -> None:
    """Reset a session and drop its checkpoints (what chat's /reset does)."""
    sess.forget()


# ------------------------------------------------------------------------------------ prompt, EOS


def end_of_generation_ids(model) -> frozenset[int]:
    """Ids that end a generation: the file's EOS / EOT / EOM ids and the chat control tokens of
    _EOG_TEXTS that the vocabulary has as single special tokens."""
    cached = _eog_cache.get(model)
    if cached is not None:
        return cached
    ids = set()
    for key in ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"):
        v = model.metadata_value(key)
        if isinstance(v, (int, np.integer)) and 0 <= int(v) < model.n_vocab:
            ids.add(int(v))
    for text in _EOG_TEXTS:
        special = model.tokenize(text, add_special=False, parse_special=True)
        if len(special) == 1 and model.tokenize(text, add_special=False, parse_special=False) != special:
            ids.add(special[0])
    out = frozenset(ids)
    try:
        _eog_cache[model] = out
    except TypeError:
        pass
    return out


def prompt_ids(model, prompt: str | Sequence[int], add_special: bool = True) -> list[int]:
    """Token ids of a prompt given as text or as ids (checked against the vocabulary)."""
    if isinstance(prompt, str):
        ids = model.tokenize(prompt, add_special=add_special, parse_special=True)
    else:
        try:
            ids = [int(t) for t in prompt]
        except (TypeError, ValueError):
            raise ValueError("prompt must be a string or a list of token ids") from None
        bad = [t for t in ids if not 0 <= t < model.n_vocab]
        if bad:
            raise ValueError(f"prompt token {bad[0]} is outside the vocabulary (0..{model.n_vocab - 1})")
    if not ids:
        raise ValueError("the prompt is empty (it has no tokens); give some text")
    return ids


# ------------------------------------------------------------------------------------ the step loop
#
# Two layers, as mlx-lm's generate_step under stream_generate: generate_step() below is the token
# level (prefill, sample, verify windows with MTP drafts and their rollback, the PCIe share
# controller's feedback, the watchdog's labels and trace spans, the counters of the mechanism) and
# knows nothing of text; _stream_text() further down is the text level (detokenise, stop strings,
# end-of-generation ids, streaming, the request's stats) and never evaluates anything. The server and
# batch scheduler drive generate_step() the same way _stream_text() does.


def _check_fits(model, ids: list[int]) -> None:
    if len(ids) > model.n_ctx:
        raise ValueError(f"the prompt has {len(ids)} tokens but the context holds {model.n_ctx}; "
                         f"shorten the prompt or raise n_ctx (--n-ctx)")


def _offload_stats(model, before: dict | None) -> dict:
    """This request's share of the model's cumulative offload counters (libstrata owns their
    definitions; this only takes differences)."""
    if before is None:
        return {}
    now = model.offload_stats()
    if model.device == "cpu" and now["skipped_experts"] == 0:
        return {}
    out = {k: now[k] - before[k] for k in _OFFLOAD_DELTAS}
    out["hit_rate"] = out["cache_hits"] / out["cache_lookups"] if out["cache_lookups"] else 0.0
    out["pcie_frac"] = now["pcie_frac"]
    return out


def _proc_read_bytes() -> int:
    """Bytes this process caused to be read from storage (read_bytes of /proc/self/io: O_DIRECT reads and
    page-cache misses alike); 0 where the file is missing."""
    try:
        with open("/proc/self/io") as f:
            for line in f:
                if line.startswith("read_bytes:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def _store_begin(model) -> dict | None:
    st = model.store_stats() if hasattr(model, "store_stats") else None
    if not st or not st["active"]:
        return None
    st["storage_read_bytes"] = _proc_read_bytes()
    return st


def _store_stats(model, before: dict | None) -> dict:
    """This request's share of the expert store's counters (DESIGN §9: ram_hits, ram_miss_bytes,
    storage_read_bytes), with ram_lookups and ram_hit_rate; {} with expert_io mmap."""
    if before is None:
        return {}
    now = model.store_stats()
    out = {k: now[k] - before[k] for k in ("ram_hits", "ram_lookups", "ram_miss_bytes", "prefetch_bytes",
                                           "prefetch_unused_bytes")}
    out["ram_hit_rate"] = out["ram_hits"] / out["ram_lookups"] if out["ram_lookups"] else 0.0
    predicted = now["predicted"] - before["predicted"]
    if predicted:
        out["prefetch_recall"] = (now["predicted_right"] - before["predicted_right"]) / predicted
    out["storage_read_bytes"] = _proc_read_bytes() - before["storage_read_bytes"]
    out["expert_read_s"] = now["read_s"] - before["read_s"]
    return out


def _controller(model):
    """The model's PCIe-share controller (Model.controller), or None where there is none (cpu device, a
    fixed pcie_frac, or a stand-in model without one)."""
    return getattr(model, "controller", None)


def _observe(model, ctl, before: dict) -> dict:
    """Feeds one decode window's CPU and link work to the controller; applies a new share."""
    now = model.offload_stats()
    new = ctl.observe_window(cpu_bytes=now["cpu_bytes"] - before["cpu_bytes"],
                             cpu_busy_s=now["cpu_s"] - before["cpu_s"],
                             # the link's rate: every byte it moved (admits and swaps too) over its busy time
                             pcie_bytes=now["copy_bytes"] - before["copy_bytes"],
                             pcie_s=now["copy_s"] - before["copy_s"],
                             missing_groups=(now["cpu_groups"] - before["cpu_groups"])
                             + (now["pcie_groups"] - before["pcie_groups"]))
    if new is not None:
        model.set_pcie_frac(new)
        for line in ctl.log[-1:]:
            print(line, file=sys.stderr)
    return now


STOP = "stop"
"""What a consumer sends into generate_step (`steps.send(STOP)`) to end the request at the step it
just received."""


@dataclass(frozen=True)
class Step:
    """One sampled token, as generate_step yields it."""
    token: int        # the token id (an end-of-generation id included: the step loop knows no text)
    last: bool        # no step follows: it is the max_tokens-th token, or it sits at position n_ctx
                      # (the context is full: it cannot be evaluated)


@dataclass
class StepsEnd:
    """What generate_step returns (the StopIteration's value) when it ends."""
    reason: str       # "stopped" (the consumer sent STOP), "length" / "context" (resumed after a last
                      # step), "halted" (halt was set), "error" (the watchdog aborted an evaluation)
    stats: dict       # DESIGN §9 keys it measured: prompt_tokens, reused_prompt_tokens, prefill_s,
                      # prefill_tps, the MTP, offload and PLE keys (never the text layer's ttft / decode)
    error: str | None = None    # reason "error": the watchdog's message (it names the stage)


def generate_step(sess, ids: Sequence[int], sampler: Sampler, *, max_tokens: int | None = None, mtp: int = 0,
                  draft_hook=None, checkpoint_at=(), watchdog_s: float = trace.DEFAULT_WATCHDOG_S,
                  halt: threading.Event | None = None) -> Generator[Step, object, StepsEnd]:
    """The token-level loop of one request on `sess`: brings the session to hold `ids` (prefix reuse,
    then a prefill of the rest), samples with `sampler` (the request's own: its random stream is
    the only randomness, MTP's acceptance draws included), and yields one Step per sampled token.
    Between two steps that need an evaluation it runs one: a decode step of the last token, or with
    mtp > 0 a verify window of it and up to mtp MTP drafts (pyrunner.mtp: several steps per window;
    drafts shrink to fit the context and max_tokens), then feeds the window's counters to the PCIe
    share controller.

    Invariant: when a step is yielded, the session holds every token before it, and with MTP perhaps
    some tokens after it that the window already evaluated; the yielded token itself is never
    evaluated before the consumer asks for the next step.

    How it is told to stop (the consumer owns end-of-generation ids, stop strings, max_tokens it
    counts itself):
      steps.send(STOP)   the request ends at the step just received: the session is cut back to hold
                         exactly the tokens before it (an MTP window's later tokens are rolled back),
                         a prefix-reuse checkpoint is saved, and the StopIteration carries a StepsEnd.
      halt.set()         (from any thread or a signal handler) ends the loop before its next
                         evaluation, as STOP at the step last yielded would; reason "halted".
      steps.close()      abandons it: the session keeps whatever it evaluated, no checkpoint, no
                         StepsEnd (what CompletionStream.close() does).
    Resuming it with next() after a `last` step ends it as STOP would (reason "length" or "context").
    A watchdog abort (trace.WatchdogError) ends it with reason "error" and the message; before the
    first step (the prefill) no checkpoint is saved, since the state is unknown. Other errors
    propagate. The watchdog is armed for `watchdog_s` (<= 0: off) on the calling thread while the
    generator runs, so drive it from one thread."""
    model = sess.model
    trace.watchdog(watchdog_s)
    try:
        return (yield from _steps(model, sess, ids, sampler, max_tokens, mtp, draft_hook, checkpoint_at, halt))
    finally:
        trace.watchdog(0)


def _steps(model, sess, ids, sampler, max_tokens, mtp, draft_hook, checkpoint_at, halt):
    n_ctx = model.n_ctx
    _check_fits(model, ids)
    limit = None if max_tokens is None or max_tokens < 0 else int(max_tokens)
    off0 = model.offload_stats() if hasattr(model, "offload_stats") else None
    xs0 = _store_begin(model)
    ple0 = sess.stats() if getattr(model, "has_ple", False) and hasattr(sess, "stats") else None
    ctl = _controller(model) if off0 is not None else None
    policy = None
    if mtp == AUTO:
        # drafts per window from live costs (mtp.DraftPolicy); none without a head, and none for a seeded
        # sampling request: how many drafts a window takes changes which random numbers become which
        # token, and a choice made from timings would make the seed's output differ run to run (greedy
        # output is the same whatever the choice; a seeded request's is then the output without drafts)
        seeded = not sampler.is_greedy and sampler.params.seed not in (None, -1)
        if getattr(model, "n_mtp", 0) >= 1 and not seeded:
            policy = DraftPolicy(getattr(model, "mtp_max", MTP_MAX_DEFAULT), getattr(model, "mtp_ratios", None))
        mtp = policy.k_max if policy is not None else 0
    drafter = MTPDecoder(sess, sampler, mtp, draft_hook) if mtp > 0 else None

    reused = sess.reuse(ids)
    prev_row = sess.hidden
    stats: dict = {"prompt_tokens": len(ids), "reused_prompt_tokens": reused}
    t0 = time.perf_counter()
    # the watchdog's stage names: under pyrunner.engine the step that runs this request's evals with the
    # others' is labelled by the engine (a label here would name whichever request queued last)
    own_labels = getattr(sess, "batcher", None) is None
    sharing = None if own_labels else getattr(sess.batcher, "sharing", None)
    if own_labels:
        trace.label(f"prefill of {len(ids) - reused} prompt tokens")
    try:
        with trace.span("prefill", "prefill", tokens=len(ids) - reused, reused=reused):
            logits, rows, _ = sess.prefill(ids, hidden=drafter is not None, checkpoint_at=checkpoint_at)
    except StrataError as e:
        e = trace.as_watchdog(e)
        if not isinstance(e, trace.WatchdogError):
            raise
        stats.update(_offload_stats(model, off0))      # nothing was sampled; the state is unknown
        stats.update(_store_stats(model, xs0))
        return StepsEnd("error", stats, str(e))
    if reused < len(ids):
        dt = time.perf_counter() - t0
        stats["prefill_s"] = dt
        if dt > 0:
            stats["prefill_tps"] = (len(ids) - reused) / dt
    if drafter is not None:
        drafter.begin(ids, reused, rows, prev_row)
    win = model.offload_stats() if ctl is not None else None   # decode windows start after the prefill

    history = list(ids)            # what the penalties look at: prompt + sampled tokens
    n_sampled = 0
    step = 0
    quiet = 0                                   # --mtp auto: plain windows left that skip the policy
    reason = error = None
    new = [] if limit == 0 else [sampler.sample(logits, history)]
    if limit == 0:
        reason = "length"
    while new:
        for i, tok in enumerate(new):
            history.append(tok)
            n_sampled += 1
            full = len(history) > n_ctx          # tok sits at position n_ctx: it cannot be evaluated
            last = full or (limit is not None and n_sampled >= limit)
            reply = yield Step(tok, last)
            if reply is not None or last:
                reason = "stopped" if reply is not None else "context" if full else "length"
                if drafter is not None and i + 1 < len(new):
                    drafter.truncate(i)           # the state holds the tokens before this one only
                break
        if reason is not None:
            break
        if halt is not None and halt.is_set():   # tok stays unevaluated, as at max_tokens
            reason = "halted"
            break
        tok = new[-1]
        step += 1
        try:
            if drafter is None or quiet:
                if quiet:                        # DraftPolicy.quiet_windows(): plain for sure, no row kept
                    quiet -= 1
                    policy.count_plain()
                    drafter.plain_steps += 1
                if own_labels:
                    trace.label(f"decode step {step}")
                with trace.span("decode step", "decode", step=step):
                    new = [sampler.sample(sess.eval([tok]), history)]
            else:
                # drafts that fit the context and the tokens still wanted; the window evaluates tok too
                k = n_ctx - sess.n_past - 1
                if limit is not None:
                    k = min(k, limit - n_sampled - 1)
                if policy is not None:
                    if sharing is not None:              # the engine's step is shared (DraftPolicy.shared_tokens)
                        policy.shared_tokens = sharing() - 1
                    k = policy.choose(k)
                    p0, a0, t_w, e_w = drafter.proposed, drafter.accepted, time.perf_counter(), drafter.prompt_extend_s
                if own_labels:
                    trace.label(f"decode window {step} (MTP, up to {k} drafts)")
                with trace.span("decode window", "decode", step=step, drafts=k):
                    new = drafter.round(tok, history, k) if k > 0 or policy is None else \
                        drafter.plain(tok, history, policy.rows_wanted())
                if policy is not None:
                    dt = time.perf_counter() - t_w - (drafter.prompt_extend_s - e_w)
                    proposed = drafter.proposed - p0
                    if proposed > 0 and not getattr(model, "mtp_warm", True):
                        # the process's first window with drafts reads the head's weights for the first
                        # time: it counts for acceptance only (DraftPolicy.observe)
                        model.mtp_warm, dt = True, None
                    policy.observe(k, proposed, drafter.accepted - a0, dt)
                    quiet = policy.quiet_windows() if k == 0 else 0
        except StrataError as e:
            e = trace.as_watchdog(e)
            if not isinstance(e, trace.WatchdogError):
                raise
            reason, error = "error", str(e)   # the session starts over at its next request
            break
        trace.sample(model, sess, generated=n_sampled)
        if ctl is not None:
            win = _observe(model, ctl, win)     # this window's counters start where the last one's end

    sess.save()                                 # a checkpoint where this request ends (prefix reuse)
    if drafter is not None:
        if drafter.proposed and hasattr(model, "mtp_warm"):
            model.mtp_warm = True               # fixed-k requests read the head's weights too
        stats.update(drafter.stats())
    if policy is not None:
        stats.update(policy.stats())
        if hasattr(model, "mtp_ratios"):
            model.mtp_ratios = policy.ratios() or model.mtp_ratios   # the next request starts from them
    stats.update(_offload_stats(model, off0))
    stats.update(_store_stats(model, xs0))
    if ple0 is not None:
        ple1 = sess.stats()
        stats.update({k: ple1[k] - ple0[k] for k in _PLE_KEYS})
    return StepsEnd(reason, stats, error)


# ------------------------------------------------------------------------------------ the text layer


def _loop(model, sess, ids: list[int], params: SamplingParams, eog: frozenset[int], t_start: float,
          mtp: int = 0, checkpoint_at=(), draft_hook=None, watchdog_s: float = trace.DEFAULT_WATCHDOG_S,
          halt: threading.Event | None = None, sampler: Sampler | None = None, on_token=None):
    """Generator: yields text pieces, returns the Completion; the request's span on the trace.
    sampler: the request's Sampler (None: Sampler(params)); on_token(token): called for every sampled
    token that becomes part of the text (not an end-of-generation id), before its text is yielded
    (pyrunner.engine uses both for logprobs and per-piece tokens)."""
    tr = trace.current()
    if tr is not None:
        tr.request_begin(model, sess, prompt_tokens=len(ids))
    c = None
    try:
        c = yield from _stream_text(model, sess, ids, params, eog, t_start, mtp, checkpoint_at, draft_hook,
                                    watchdog_s, halt, sampler, on_token)
    finally:
        if tr is not None:
            tr.request_end(model, sess, c)
    return c


def _stream_text(model, sess, ids, params, eog, t_start, mtp, checkpoint_at, draft_hook, watchdog_s, halt,
                 sampler=None, on_token=None):
    """The text layer over generate_step: each step's token through the tokenizer's StreamDecoder
    and StopCriteria (end-of-generation ids, stop strings, max_tokens), the safe text yielded as it
    comes; STOP sent at the step that ends the request; then the Completion with its stats (the step
    loop's, plus generated_tokens, ttft_s, decode_s, decode_tps, which are the request's view)."""
    if sampler is None:
        sampler = Sampler(params)
    crit = StopCriteria(params.stop, eog, params.max_tokens)
    steps = generate_step(sess, ids, sampler, max_tokens=params.max_tokens, mtp=mtp, draft_hook=draft_hook,
                          checkpoint_at=checkpoint_at, watchdog_s=watchdog_s, halt=halt)
    dec = model.tokenizer.stream()
    out_tokens: list[int] = []
    parts: list[str] = []
    n_sampled = 0
    t_first = None
    reply = None
    try:
        while True:
            try:
                st = next(steps) if reply is None else steps.send(reply)
            except StopIteration as stop_it:
                end: StepsEnd = stop_it.value
                break
            n_sampled += 1
            if t_first is None:
                t_first = time.perf_counter()
            tok = st.token
            if tok in eog:
                tail = dec.flush()                # an unfinished character before the end (U+FFFD)
                emit = crit.text.push(tail) if tail else ""
                emit += crit.feed(tok, "")
            else:
                out_tokens.append(tok)
                if on_token is not None:
                    on_token(tok)
                piece = dec.push(tok)
                if crit.max_tokens is not None and crit.n_tokens + 1 >= crit.max_tokens:
                    piece += dec.flush()          # the last token: release an unfinished character
                emit = crit.feed(tok, piece)
            if not crit.done and st.last:         # the context is full: the token cannot be evaluated
                emit += crit.text.push(dec.flush())
                emit += crit.finish("length")
            if emit:
                parts.append(emit)
                yield emit
            reply = STOP if crit.done else None
    finally:
        steps.close()                             # abandoned (this generator closed): nothing more
    if end.reason in ("halted", "error") and not crit.done:
        # CompletionStream.stop() or a watchdog abort: the text held back for a possible stop string
        # is output too
        emit = crit.text.push(dec.flush())
        emit += crit.finish("interrupted" if end.reason == "halted" else "error")
        if emit:
            parts.append(emit)
            yield emit
    stats = dict(end.stats)
    stats["generated_tokens"] = n_sampled
    if t_first is not None:
        stats["ttft_s"] = t_first - t_start
        if n_sampled > 1:
            dt = time.perf_counter() - t_first
            stats["decode_s"] = dt
            if dt > 0:
                stats["decode_tps"] = (n_sampled - 1) / dt
    stats = {k: stats[k] for k in STATS_KEYS if k in stats}
    if end.error is not None:
        return Completion("".join(parts), out_tokens, "error", stats, end.error)
    return Completion("".join(parts), out_tokens, crit.finish_reason, stats)


def _params(max_tokens, temperature, top_k, top_p, min_p, repeat_penalty, repeat_last_n, presence_penalty,
            frequency_penalty, seed, stop, logit_bias) -> SamplingParams:
    return SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
                          repeat_penalty=repeat_penalty, repeat_last_n=repeat_last_n,
                          presence_penalty=presence_penalty, frequency_penalty=frequency_penalty,
                          seed=seed, stop=[] if stop is None else stop, logit_bias=logit_bias,
                          max_tokens=max_tokens)


def generate(model, prompt: str | Sequence[int], max_tokens: int | None = 256, temperature: float = 0.8,
             top_k: int = 40, top_p: float = 0.95, min_p: float = 0.05, repeat_penalty: float = 1.0,
             repeat_last_n: int = 64, presence_penalty: float = 0.0, frequency_penalty: float = 0.0,
             seed: int | None = None, stop: str | Sequence[str] | None = None,
             logit_bias: dict[int, float] | None = None, stream: bool = False, session=None,
             add_special: bool = True, mtp: int | None = None, checkpoint_at=(),
             draft_hook=None, watchdog_s: float | None = None) -> Completion | CompletionStream:
    """Continue `prompt` (text, or token ids) on `model`. Sampling arguments and defaults are
    llama.cpp's (sampling.py documents each). max_tokens: at most this many tokens; None or -1: until
    an end-of-generation token or a full context; -2 (llama.cpp's "until the context is filled"): the
    same, since Strata never shifts the context. `session`: a model.session() whose state to continue
    from (prefix reuse, see the module docstring). Without one, the call runs on the model's own
    session, which consecutive calls share (and reuse prefixes through); a call made while another
    holds it (from another thread, or while a stream is still open) runs on a session of its own, so
    calls from many threads give what the same calls give one after another. Calls on one given
    `session` must not overlap. stream=False returns a Completion; stream=True a CompletionStream of
    text pieces. mtp: drafts per verify window (None: the model's `mtp`; 0: off; "auto": chosen window by
    window from live costs, mtp.DraftPolicy; pyrunner.mtp);
    checkpoint_at: prompt positions to keep a prefix-reuse checkpoint at (e.g. where the next
    request's prompt will differ); draft_hook: pyrunner.mtp's test hook; watchdog_s: abort the request
    after this many seconds without progress (None: STRATA_WATCHDOG_S, else 600; <= 0: off), returning
    the partial output with finish_reason "error" (module docstring)."""
    t_start = time.perf_counter()
    params = _params(max_tokens, temperature, top_k, top_p, min_p, repeat_penalty, repeat_last_n,
                     presence_penalty, frequency_penalty, seed, stop, logit_bias)
    if params.max_tokens is not None and params.max_tokens < -2:
        raise ValueError(f"max_tokens (-n) {params.max_tokens}: give a count >= 0, -1 (until the model ends or "
                         f"the context is full) or -2 (until the context is filled)")
    ids = prompt_ids(model, prompt, add_special)
    _check_fits(model, ids)                  # now, not at the first piece of a stream
    k = parse_mtp(getattr(model, "mtp", 0) if mtp is None else mtp)
    eog = end_of_generation_ids(model)
    wd = trace.watchdog_seconds(watchdog_s)
    halt = threading.Event()         # CompletionStream.stop()

    def body(sess):
        return _loop(model, sess, ids, params, eog, t_start, k, checkpoint_at, draft_hook, wd, halt)
    gen = body(session) if session is not None else _on_a_free_session(model, body)
    if stream:
        return CompletionStream(gen, halt)
    try:
        while True:
            next(gen)
    except StopIteration as stop_it:
        return stop_it.value


# ------------------------------------------------------------------------------------ OpenAI shapes


def _usage(c: Completion) -> dict:
    n_prompt = c.stats.get("prompt_tokens", 0)
    return {"prompt_tokens": n_prompt, "completion_tokens": len(c.tokens),
            "total_tokens": n_prompt + len(c.tokens)}


def _unsupported(**given) -> None:
    for name, value in given.items():
        if value not in (None, False, [], {}):
            raise ValueError(f"{name} is not supported by Strata yet; leave it out")


def create_completion(llm, prompt: str | Sequence[int], /, suffix: str | None = None,
                      max_tokens: int | None = 16, temperature: float = 0.8, top_p: float = 0.95,
                      min_p: float = 0.05, logprobs: int | None = None, echo: bool = False,
                      stop: str | Sequence[str] | None = None, frequency_penalty: float = 0.0,
                      presence_penalty: float = 0.0, repeat_penalty: float = 1.0, top_k: int = 40,
                      stream: bool = False, seed: int | None = None, model: str | None = None,
                      logit_bias: dict[int, float] | None = None, session=None):
    """llama-cpp-python's Llama.create_completion: returns {"id", "object": "text_completion",
    "created", "model", "choices": [{"text", "index", "logprobs", "finish_reason"}], "usage"}, or with
    stream=True an iterator of such chunks (one per piece of text, then one with the finish reason).
    Same defaults (max_tokens 16). Not supported: suffix, logprobs. Safe to call from several threads
    at once on one model: without `session`, as generate() (a call that finds the model's own session
    taken runs on one of its own)."""
    _unsupported(suffix=suffix, logprobs=logprobs)
    cid = f"cmpl-{uuid.uuid4()}"
    created = int(time.time())
    name = model if model is not None else llm.path
    prefix = (prompt if isinstance(prompt, str) else llm.detokenize(prompt)) if echo else ""
    res = generate(llm, prompt, max_tokens=max_tokens, temperature=temperature, top_k=top_k, top_p=top_p,
                   min_p=min_p, repeat_penalty=repeat_penalty, presence_penalty=presence_penalty,
                   frequency_penalty=frequency_penalty, seed=seed, stop=stop, logit_bias=logit_bias,
                   stream=stream, session=session)

    def chunk(text, finish):
        return {"id": cid, "object": "text_completion", "created": created, "model": name,
                "choices": [{"text": text, "index": 0, "logprobs": None, "finish_reason": finish}]}

    if not stream:
        out = chunk(prefix + res.text, res.finish_reason)
        out["usage"] = _usage(res)
        return out

    def chunks():
        if prefix:
            yield chunk(prefix, None)
        for piece in res:
            yield chunk(piece, None)
        yield chunk("", res.completion.finish_reason)
    return chunks()


def render_messages(llm, messages: list[dict], tools: list[dict] | None = None,
                    chat_template: str | None = None, add_generation_prompt: bool = True,
                    **template_kwargs) -> str:
    """The prompt text for a conversation under the model's chat template (ChatML if it has none),
    ending with an open assistant turn (unless add_generation_prompt is False). chat_template names
    one of the file's templates."""
    from .chat import chat_template_from_metadata, render_chat

    md = llm.metadata
    template = chat_template_from_metadata(md, chat_template, tools)
    special = {}
    tok = llm.tokenizer
    for name, tid in (("bos_token", getattr(tok, "bos_id", None)), ("eos_token", getattr(tok, "eos_id", None))):
        if tid is not None:
            special[name] = tok.token_bytes(tid).decode("utf-8", "replace")
    return render_chat(template, messages, add_generation_prompt=add_generation_prompt, tools=tools, **special,
                       **template_kwargs)


@dataclass
class ChatTurn:
    """One finished turn of a conversation, as the next turn continues it token for token."""
    prompt_ids: list[int]        # what the turn's prompt was
    prompt_text: str
    answer_tokens: list[int]     # the answer as generated (Completion.tokens)
    answer_text: str             # the answer as it went into the conversation


def chat_prompt_ids(llm, messages: list[dict], previous: ChatTurn | None = None,
                    **render_kw) -> tuple[list[int], str]:
    """(ids, text) of the prompt for `messages` (the conversation, its last message new).

    With `previous`, the turn before (whose answer is messages[-2]), the ids continue that turn's
    tokens exactly: its prompt ids, then the answer tokens the model generated, then only the text
    the template adds after them, tokenized. Re-tokenizing the whole rendered conversation instead
    can split the earlier answer differently from how it was generated, which both changes what the
    model sees and defeats prefix reuse (the session would start over every turn), as llama.cpp's
    chat does not. Falls back to tokenizing the whole text when the template does not render the
    conversation as an extension of the previous prompt (e.g. it rewrites earlier turns) or the
    answer text is not exactly its tokens' text (cut by a stop string)."""
    text = render_messages(llm, messages, **render_kw)
    if previous is not None and len(messages) >= 2:
        past = render_messages(llm, messages[:-1], add_generation_prompt=False, **render_kw)
        head = previous.prompt_text + previous.answer_text
        if (past.startswith(head) and text.startswith(past)
                and llm.detokenize(previous.answer_tokens) == previous.answer_text):
            rest = llm.tokenize(text[len(head):], add_special=False, parse_special=True)
            return list(previous.prompt_ids) + list(previous.answer_tokens) + rest, text
    return prompt_ids(llm, text, add_special=False), text


def create_chat_completion(llm, messages: list[dict], /, functions=None, function_call=None,
                           tools: list[dict] | None = None, tool_choice=None, temperature: float = 0.2,
                           top_p: float = 0.95, top_k: int = 40, min_p: float = 0.05, stream: bool = False,
                           stop: str | Sequence[str] | None = None, seed: int | None = None,
                           response_format=None, max_tokens: int | None = None, presence_penalty: float = 0.0,
                           frequency_penalty: float = 0.0, repeat_penalty: float = 1.0, model: str | None = None,
                           logit_bias: dict[int, float] | None = None, logprobs: bool | None = None,
                           top_logprobs: int | None = None, session=None, chat_template: str | None = None,
                           **template_kwargs):
    """llama-cpp-python's Llama.create_chat_completion: returns {"id": "chatcmpl-…", "object":
    "chat.completion", "created", "model", "choices": [{"index", "message": {"role": "assistant",
    "content"}, "logprobs", "finish_reason"}], "usage"}, or with stream=True an iterator of
    "chat.completion.chunk" dicts (a first delta {"role": "assistant"}, then {"content": piece}, then
    an empty delta with the finish reason). Same defaults (temperature 0.2, max_tokens None: until the
    turn ends or the context is full). The prompt is the conversation rendered by the model's chat
    template (template_kwargs such as enable_thinking=False go to the template); `tools` are shown to
    the model through it, but tool calls are returned as text. Not supported: functions,
    function_call, tool_choice, response_format, logprobs, top_logprobs. Safe to call from several
    threads at once on one model: without `session`, as generate() (a call that finds the model's own
    session taken runs on one of its own)."""
    _unsupported(functions=functions, function_call=function_call, tool_choice=tool_choice,
                 response_format=response_format, logprobs=logprobs, top_logprobs=top_logprobs)
    text = render_messages(llm, messages, tools=tools, chat_template=chat_template, **template_kwargs)
    ids = prompt_ids(llm, text, add_special=False)     # the template writes any BOS itself
    cid = f"chatcmpl-{uuid.uuid4()}"
    created = int(time.time())
    name = model if model is not None else llm.path
    res = generate(llm, ids, max_tokens=max_tokens, temperature=temperature, top_k=top_k, top_p=top_p,
                   min_p=min_p, repeat_penalty=repeat_penalty, presence_penalty=presence_penalty,
                   frequency_penalty=frequency_penalty, seed=seed, stop=stop, logit_bias=logit_bias,
                   stream=stream, session=session)
    if not stream:
        return {"id": cid, "object": "chat.completion", "created": created, "model": name,
                "choices": [{"index": 0, "message": {"role": "assistant", "content": res.text},
                             "logprobs": None, "finish_reason": res.finish_reason}],
                "usage": _usage(res)}

    def chunk(delta, finish):
        return {"id": cid, "model": name, "created": created, "object": "chat.completion.chunk",
                "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]}

    def chunks():
        yield chunk({"role": "assistant"}, None)
        for piece in res:
            yield chunk({"content": piece}, None)
        yield chunk({}, res.completion.finish_reason)
    return chunks()
