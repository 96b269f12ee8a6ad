"""server.py — `strata serve`: OpenAI's HTTP API over the batching engine (pyrunner.engine).

    POST /v1/completions        text in, text out (prompt tokenized with specials, as `strata generate`)
    POST /v1/chat/completions   messages rendered with the model's chat template; tools, tool calls,
                                reasoning (pyrunner.toolcalls)
    GET  /v1/models             the loaded model, under its file name (and GET /v1/models/{id})
    GET  /health                {"status": "ok"} (never needs the API key)
    GET  /metrics               Prometheus text: the engine's counters (eng.metrics()) and HTTP responses

    app = create_app(engine, model, api_key=None)    # a Starlette app; run it with any ASGI server
    serve(model, host="127.0.0.1", port=8080, ...)   # what `strata serve` runs: engine + uvicorn + SIGTERM
    with BackgroundServer(app) as s: s.url           # uvicorn on a thread and a free loopback port (tests)

Who does what. The engine owns generation: its threads batch every live sequence's steps and run, per
request, what `strata generate` runs (the same code: sampling, stop strings, max_tokens), handing text
pieces to the request (Request.astream()). This module only translates: it validates a request
against OpenAI's field list for the route, builds the prompt and SamplingParams, submits, and turns pieces
into OpenAI's JSON or server-sent-event chunks. Everything that could block (the chat template, the
tokenizer, submit, metrics) runs on the thread pool, never on the event loop.

Lifetimes. A request is submitted once the body validated; from then on exactly one of these ends it:
the engine finishes it (astream ends), or its client goes away (a task watching `receive()` for
http.disconnect, and a failed send, both call req.cancel(): the engine frees the sequence at its next
step), or shutdown cancels it (what still runs grace_s after the signal: the engine ends it at its next
step, so even then the client gets a whole answer, finish_reason "cancelled"). `_Live` keeps every
submitted request until it ends, so that a SIGTERM can report which of those in flight were finished and
which cancelled.

Errors. A request's own mistakes are 400s with OpenAI's body {"error": {"message", "type":
"invalid_request_error", "param", "code"}}: malformed JSON, a field OpenAI does not define for the route
(the few llama.cpp extensions top_k, min_p, repeat_penalty, repeat_last_n, chat_template_kwargs aside),
wrong types, bad values, n != 1, a prompt longer than the context. 401 without the API key, 404 / 405 for
routes, 503 + Retry-After when the engine's queue is full, 500 (logged) for our own bugs; the same body
shape everywhere. A failure after a stream started is sent as an `error` event, then [DONE].

Sampling defaults for fields a request leaves out are those of `strata generate` (llama.cpp's:
temperature 0.8, top_k 40, top_p 0.95, min_p 0.05), so a request and the command line agree;
max_tokens defaults to 16 for completions (OpenAI's) and to "until the turn ends" for chat.
"""
from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import math
import os
import signal
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from .sampling import SamplingParams
from .toolcalls import AnswerParser, prompt_ends_in_think

log = logging.getLogger("uvicorn.error")

MAX_BODY_BYTES = 32 << 20       # a request body larger than this is refused (413)
MAX_LOGPROBS = 20               # alternatives per token at most (OpenAI: 5 for completions, 20 for chat)
DEFAULT_GRACE_S = 10.0          # SIGTERM: how long in-flight requests may run on before they are cancelled
DEFAULT_ITL_FACTOR = 2.0        # strata serve --itl-factor: decoders wait about 2 decode steps while a prompt prefills
_MIN_LOGPROB = -9999.0          # a -inf logprob (a banned token) as JSON can carry it, as vLLM sends it


# ------------------------------------------------------------------------------------ errors


def _dumps(obj) -> bytes:
    try:
        return json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode()
    except UnicodeEncodeError:          # a lone surrogate a client sent (echoed back): escaped instead
        return json.dumps(obj, separators=(",", ":")).encode()


class _JSON(JSONResponse):
    def render(self, content) -> bytes:
        return _dumps(content)


class APIError(Exception):
    """An error answered with OpenAI's body; status 400 unless said otherwise."""

    def __init__(self, message: str, param: str | None = None, code: str | None = None, status: int = 400,
                 type: str = "invalid_request_error", headers: dict | None = None):
        super().__init__(message)
        self.message, self.param, self.code, self.status, self.type = message, param, code, status, type
        self.headers = headers or {}

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def response(self) -> JSONResponse:
        return _JSON(self.body(), status_code=self.status, headers=self.headers)


def _server_error(message: str, code: str = "internal_error") -> APIError:
    return APIError(message, None, code, 500, "server_error")


# ------------------------------------------------------------------------------------ the fields


# The request fields OpenAI's API defines for each route (its openai-python client's CompletionCreateParams
# and chat CompletionCreateParams), plus the llama.cpp-style extensions Strata applies.
_EXTENSIONS = {"top_k", "min_p", "repeat_penalty", "repeat_last_n"}
COMPLETION_FIELDS = {"model", "prompt", "best_of", "echo", "frequency_penalty", "logit_bias", "logprobs",
                     "max_tokens", "n", "presence_penalty", "seed", "stop", "stream", "stream_options", "suffix",
                     "temperature", "top_p", "user"} | _EXTENSIONS
CHAT_FIELDS = {"model", "messages", "audio", "frequency_penalty", "function_call", "functions", "logit_bias",
               "logprobs", "max_completion_tokens", "max_tokens", "metadata", "modalities", "moderation", "n",
               "parallel_tool_calls", "prediction", "presence_penalty", "prompt_cache_key", "prompt_cache_options",
               "prompt_cache_retention", "reasoning_effort", "response_format", "safety_identifier", "seed",
               "service_tier", "stop", "store", "stream", "stream_options", "temperature", "tool_choice", "tools",
               "top_logprobs", "top_p", "user", "verbosity", "web_search_options"} | _EXTENSIONS | {
                   "chat_template_kwargs"}
_MESSAGE_FIELDS = {"role", "content", "name", "tool_calls", "tool_call_id", "refusal", "audio", "function_call",
                   "annotations", "reasoning_content", "reasoning", "thinking"}
_ROLES = {"system", "developer", "user", "assistant", "tool", "function"}
_TEMPLATE_RESERVED = {"llm", "messages", "tools", "documents", "chat_template", "add_generation_prompt",
                      "continue_final_message", "bos_token", "eos_token"}


def _type_name(v) -> str:
    return {type(None): "null", bool: "boolean", int: "integer", float: "number", str: "string", list: "array",
            dict: "object"}.get(type(v), type(v).__name__)


def _wrong_type(param: str, v, want: str) -> APIError:
    return APIError(f"{param}: expected {want}, got {_type_name(v)} ({json.dumps(v)[:60]})", param, "invalid_type")


def _bad_value(param: str, v, why: str) -> APIError:
    return APIError(f"{param}: {json.dumps(v)[:60]} {why}", param, "invalid_value")


class _Body:
    """A request's JSON object, read field by field with OpenAI's types (a null is as if absent)."""

    def __init__(self, data: dict, allowed: set[str]):
        unknown = sorted(k for k in data if k not in allowed)
        if unknown:
            raise APIError(f"Unrecognized request argument supplied: {unknown[0]}", unknown[0], "unknown_parameter")
        self.data = data

    def get(self, key: str):
        return self.data.get(key)

    def number(self, key: str, default=None, lo=None, hi=None):
        v = self.data.get(key)
        if v is None:
            return default
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise _wrong_type(key, v, "a number")
        self._range(key, v, lo, hi)
        return v

    def integer(self, key: str, default=None, lo=None, hi=None):
        v = self.data.get(key)
        if v is None:
            return default
        if isinstance(v, float) and v.is_integer():
            v = int(v)
        if isinstance(v, bool) or not isinstance(v, int):
            raise _wrong_type(key, v, "an integer")
        self._range(key, v, lo, hi)
        return v

    @staticmethod
    def _range(key, v, lo, hi) -> None:
        if lo is not None and hi is not None and not lo <= v <= hi:
            raise _bad_value(key, v, f"is out of range: it must lie in [{lo}, {hi}]")
        if lo is not None and v < lo:
            raise _bad_value(key, v, f"must be >= {lo}")
        if hi is not None and v > hi:
            raise _bad_value(key, v, f"must be <= {hi}")

    def boolean(self, key: str, default=None):
        v = self.data.get(key)
        if v is None:
            return default
        if not isinstance(v, bool):
            raise _wrong_type(key, v, "a boolean")
        return v

    def string(self, key: str, default=None):
        v = self.data.get(key)
        if v is None:
            return default
        if not isinstance(v, str):
            raise _wrong_type(key, v, "a string")
        return v

    def obj(self, key: str, default=None):
        v = self.data.get(key)
        if v is None:
            return default
        if not isinstance(v, dict):
            raise _wrong_type(key, v, "an object")
        return v

    def absent(self, key: str, why: str, ok=()) -> None:
        """A field Strata cannot apply: only null (or one of `ok`) is accepted."""
        v = self.data.get(key)
        if v is not None and v not in ok:
            raise APIError(f"{key}: {why}", key, "unsupported_value")


def _stop(b: _Body) -> list[str]:
    v = b.get("stop")
    if v is None:
        return []
    if isinstance(v, str):
        v = [v]
    if not isinstance(v, list) or not all(isinstance(s, str) for s in v):
        raise _wrong_type("stop", v, "a string or an array of strings")
    if any(s == "" for s in v):
        raise _bad_value("stop", v, "holds an empty string; give non-empty stop strings")
    if len(v) > 16:
        raise _bad_value("stop", v, "has more than 16 strings")
    return v


def _logit_bias(b: _Body, n_vocab: int) -> dict[int, float] | None:
    v = b.obj("logit_bias")
    if not v:
        return None
    out = {}
    for k, bias in v.items():
        try:
            tok = int(k)
        except ValueError:
            raise _bad_value("logit_bias", {k: bias}, "has a key that is not a token id") from None
        if not 0 <= tok < n_vocab:
            raise _bad_value("logit_bias", {k: bias}, f"names a token outside the vocabulary (0..{n_vocab - 1})")
        if isinstance(bias, bool) or not isinstance(bias, (int, float)) or not math.isfinite(bias):
            raise _wrong_type("logit_bias", {k: bias}, "a number per token")
        if not -100 <= bias <= 100:
            raise _bad_value("logit_bias", {k: bias}, "has a bias outside [-100, 100]")
        out[tok] = float(bias)
    return out


def _seed(b: _Body) -> int | None:
    v = b.integer("seed")
    if v is None or v == -1:
        return None                      # a fresh random seed (llama.cpp's -1 too)
    if not -2**63 <= v < 2**64:
        raise _bad_value("seed", v, "must fit in 64 bits")
    return v % 2**64


def _sampling(b: _Body, n_vocab: int, max_tokens) -> SamplingParams:
    d = SamplingParams()
    top_k = b.integer("top_k", d.top_k, lo=-1)
    kw = dict(temperature=b.number("temperature", d.temperature, 0, 2),
              top_p=b.number("top_p", d.top_p, 0, 1), top_k=max(top_k, 0),
              min_p=b.number("min_p", d.min_p, 0, 1),
              repeat_penalty=b.number("repeat_penalty", d.repeat_penalty, lo=0),
              repeat_last_n=b.integer("repeat_last_n", d.repeat_last_n, lo=-1),
              presence_penalty=b.number("presence_penalty", d.presence_penalty, -2, 2),
              frequency_penalty=b.number("frequency_penalty", d.frequency_penalty, -2, 2),
              seed=_seed(b), stop=_stop(b), logit_bias=_logit_bias(b, n_vocab), max_tokens=max_tokens)
    if kw["repeat_penalty"] == 0:
        raise _bad_value("repeat_penalty", 0, "must be > 0 (1 turns it off)")
    try:
        return SamplingParams(**kw)
    except ValueError as e:
        raise APIError(str(e), None, "invalid_value") from None


def _common(b: _Body) -> tuple[bool, bool]:
    """n, best_of and the stream fields every route shares: (stream, include_usage)."""
    n = b.integer("n", 1)
    if n != 1:
        raise _bad_value("n", n, "is not supported: Strata returns one choice per request (n = 1)")
    stream = b.boolean("stream", False)
    opts = b.obj("stream_options", {})
    unknown = sorted(set(opts) - {"include_usage", "include_obfuscation"})
    if unknown:
        raise APIError(f"Unrecognized request argument supplied: stream_options.{unknown[0]}",
                       f"stream_options.{unknown[0]}", "unknown_parameter")
    usage = opts.get("include_usage", False)
    if not isinstance(usage, bool):
        raise _wrong_type("stream_options.include_usage", usage, "a boolean")
    for key in ("user", "model"):
        b.string(key)
    return stream, usage


@dataclass
class Job:
    """A validated request, ready to submit."""
    kind: str                          # "completion" | "chat"
    prompt: Any                        # text or token ids
    add_special: bool
    params: SamplingParams
    stream: bool
    include_usage: bool
    model: str | None                  # the request's "model" (echoed back)
    logprobs: int | None = None        # alternatives per token, None: no logprobs
    echo: str = ""                     # completions' echo: the prompt text, before the answer
    tools: list | None = None          # chat: parse tool calls (None: not)
    thinking: bool = False             # chat: the answer starts inside <think>
    prompt_param: str = "prompt"
    checkpoint_at: tuple = ()          # chat: where the system prompt and the earlier turns end (prefix reuse)


def completion_job(data: dict, model) -> Job:
    """POST /v1/completions's body as a Job (APIError when it is not a valid request)."""
    b = _Body(data, COMPLETION_FIELDS)
    stream, usage = _common(b)
    prompt = data.get("prompt")
    if prompt is None:
        raise APIError("prompt: a required field is missing", "prompt", "missing_required_parameter")
    if isinstance(prompt, list):
        if len(prompt) == 1 and isinstance(prompt[0], (str, list)):
            prompt = prompt[0]                   # ["text"] or [[ids]]: one prompt
        elif prompt and all(isinstance(x, str) or isinstance(x, list) for x in prompt):
            raise _bad_value("prompt", prompt, "holds several prompts; send one per request")
    if isinstance(prompt, list):
        if not prompt or not all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            raise _wrong_type("prompt", prompt, "a string, or a non-empty array of token ids")
        bad = [t for t in prompt if not 0 <= t < model.n_vocab]
        if bad:
            raise _bad_value("prompt", bad[0], f"is not a token id of this model (0..{model.n_vocab - 1})")
    elif not isinstance(prompt, str):
        raise _wrong_type("prompt", prompt, "a string or an array of token ids")
    max_tokens = b.integer("max_tokens", 16, lo=0)
    best_of = b.integer("best_of", 1)
    if best_of != 1:
        raise _bad_value("best_of", best_of, "is not supported: Strata returns one choice per request (best_of = 1)")
    lp = b.integer("logprobs", None, 0, MAX_LOGPROBS)
    echo = b.boolean("echo", False)
    if echo and lp is not None:
        raise APIError("echo with logprobs: the prompt's own logprobs are not computed; drop one of them",
                       "echo", "unsupported_value")
    if b.string("suffix"):
        raise APIError("suffix: inserting text (fill-in-the-middle) is not supported; leave it out", "suffix",
                       "unsupported_value")
    params = _sampling(b, model.n_vocab, max_tokens)
    text = "" if not echo else prompt if isinstance(prompt, str) else model.detokenize(prompt)
    return Job("completion", prompt, True, params, stream, usage, b.string("model"), lp, text)


def _text_of(content, param: str) -> str:
    """A message's content as the template gets it: a string (text parts joined)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise _wrong_type(param, content, "a string or an array of content parts")
    parts = []
    for j, part in enumerate(content):
        where = f"{param}[{j}]"
        if not isinstance(part, dict) or not isinstance(part.get("type"), str):
            raise _wrong_type(where, part, 'a content part like {"type": "text", "text": "..."}')
        if part["type"] == "text":
            if not isinstance(part.get("text"), str):
                raise _wrong_type(f"{where}.text", part.get("text"), "a string")
            parts.append(part["text"])
        elif part["type"] == "refusal":
            continue
        else:
            raise APIError(f"{where}: content parts of type {part['type']!r} are not supported: this model reads "
                           "text only", where, "unsupported_value")
    return "".join(parts)


def _tool_calls_in(calls, param: str) -> list[dict]:
    """An assistant message's tool_calls, their JSON-string arguments as objects (what the Qwen
    templates iterate over)."""
    if not isinstance(calls, list):
        raise _wrong_type(param, calls, "an array")
    out = []
    for j, c in enumerate(calls):
        where = f"{param}[{j}]"
        fn = c.get("function") if isinstance(c, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise _wrong_type(where, c, 'a tool call like {"type": "function", "function": {"name", "arguments"}}')
        args = fn.get("arguments", {})
        if isinstance(args, str):
            try:
                args = json.loads(args) if args.strip() else {}
            except ValueError:
                raise _bad_value(f"{where}.function.arguments", args, "is not valid JSON") from None
        out.append({**c, "type": c.get("type", "function"), "function": {**fn, "arguments": args}})
    return out


def _messages(v) -> list[dict]:
    if v is None:
        raise APIError("messages: a required field is missing", "messages", "missing_required_parameter")
    if not isinstance(v, list):
        raise _wrong_type("messages", v, "an array of messages")
    if not v:
        raise _bad_value("messages", v, "is empty; send at least one message")
    out = []
    for i, m in enumerate(v):
        where = f"messages[{i}]"
        if not isinstance(m, dict):
            raise _wrong_type(where, m, 'a message like {"role": "user", "content": "..."}')
        unknown = sorted(k for k in m if k not in _MESSAGE_FIELDS)
        if unknown:
            raise APIError(f"Unrecognized request argument supplied: {where}.{unknown[0]}", f"{where}.{unknown[0]}",
                           "unknown_parameter")
        role = m.get("role")
        if not isinstance(role, str) or role not in _ROLES:       # a list or object is not hashable
            raise _bad_value(f"{where}.role", role, f"is not a role; use one of {', '.join(sorted(_ROLES))}")
        msg = {"role": "system" if role == "developer" else role,
               "content": _text_of(m.get("content"), f"{where}.content")}
        for key in ("name", "tool_call_id", "reasoning_content", "reasoning", "thinking"):
            if m.get(key) is not None:
                if not isinstance(m[key], str):
                    raise _wrong_type(f"{where}.{key}", m[key], "a string")
                msg[key] = m[key]
        if m.get("tool_calls"):
            msg["tool_calls"] = _tool_calls_in(m["tool_calls"], f"{where}.tool_calls")
        out.append(msg)
    return out


def _tools(b: _Body) -> list[dict] | None:
    v = b.get("tools")
    if v is None:
        return None
    if not isinstance(v, list):
        raise _wrong_type("tools", v, "an array of tools")
    for i, t in enumerate(v):
        fn = t.get("function") if isinstance(t, dict) else None
        if not isinstance(t, dict) or t.get("type", "function") != "function" or not isinstance(fn, dict):
            raise _wrong_type(f"tools[{i}]", t, 'a tool like {"type": "function", "function": {"name": ...}}')
        if not isinstance(fn.get("name"), str) or not fn["name"]:
            raise _wrong_type(f"tools[{i}].function.name", fn.get("name"), "a non-empty string")
        if fn.get("parameters") is not None and not isinstance(fn["parameters"], dict):
            raise _wrong_type(f"tools[{i}].function.parameters", fn["parameters"], "a JSON schema object")
    return v or None


def _tool_choice(b: _Body, tools: list | None) -> list | None:
    """The tools the template shows (None: none, and no tool calls are parsed). "required" and a named
    function are honoured as far as a template can: the model is shown only those tools, not forced."""
    v = b.get("tool_choice")
    if v is None or v in ("auto", "required"):
        return tools
    if v == "none":
        return None
    if isinstance(v, dict) and v.get("type") == "function" and isinstance(v.get("function"), dict):
        name = v["function"].get("name")
        chosen = [t for t in tools or () if t["function"]["name"] == name]
        if not chosen:
            raise _bad_value("tool_choice", v, "names a function that is not among the tools")
        return chosen
    raise _bad_value("tool_choice", v, 'must be "none", "auto", "required" or {"type": "function", "function": '
                                       '{"name": ...}}')


def chat_job(data: dict, model) -> Job:
    """POST /v1/chat/completions's body as a Job: the conversation rendered with the model's chat template
    and tokenized as create_chat_completion does (the template writes any BOS itself)."""
    from .chat import ChatTemplateError
    from .generate import prompt_ids, render_messages

    b = _Body(data, CHAT_FIELDS)
    stream, usage = _common(b)
    messages = _messages(data.get("messages"))
    tools = _tools(b)
    shown = _tool_choice(b, tools)
    b.boolean("parallel_tool_calls")
    b.boolean("store")
    b.obj("metadata")
    fmt = b.obj("response_format")
    if fmt is not None and fmt.get("type") != "text":
        raise _bad_value("response_format", fmt, 'is not supported: only {"type": "text"} (no JSON mode or schema)')
    b.absent("audio", "audio output is not supported; leave it out")
    b.absent("functions", "the deprecated functions API is not supported; use tools")
    b.absent("function_call", "the deprecated functions API is not supported; use tool_choice")
    b.absent("web_search_options", "web search is not supported; leave it out")
    mods = b.get("modalities")
    if mods is not None and mods != ["text"]:
        raise _bad_value("modalities", mods, 'is not supported: only ["text"]')
    for key in ("reasoning_effort", "verbosity", "service_tier", "prompt_cache_key", "safety_identifier"):
        b.string(key)
    mt = b.integer("max_completion_tokens", None, lo=0)
    if mt is None:
        mt = b.integer("max_tokens", None, lo=0)
    lp = b.boolean("logprobs", False)
    top = b.integer("top_logprobs", None, 0, MAX_LOGPROBS)
    if top is not None and not lp:
        raise APIError("top_logprobs: set logprobs to true to use it", "top_logprobs", "invalid_value")
    variables = b.obj("chat_template_kwargs", {})
    taken = sorted(set(variables) & _TEMPLATE_RESERVED)
    if taken:
        raise _bad_value("chat_template_kwargs", variables, f"sets {taken[0]!r}, which the server sets itself")
    params = _sampling(b, model.n_vocab, mt)
    try:
        text = render_messages(model, messages, tools=shown, **variables)
        ids = prompt_ids(model, text, add_special=False)
    except ChatTemplateError as e:
        raise APIError(str(e), "messages", "invalid_value") from None
    except ValueError as e:
        raise APIError(str(e), "messages", "invalid_value") from None
    return Job("chat", ids, False, params, stream, usage, b.string("model"), (top or 0) if lp else None,
               tools=shown, thinking=prompt_ends_in_think(text), prompt_param="messages",
               checkpoint_at=_turn_ends(model, messages, shown, variables, text, ids))


def _turn_ends(model, messages, tools, variables, text: str, ids: list) -> tuple:
    """Prompt positions where the system message and the turns before the last end, when the template
    renders them as a prefix of the whole and they tokenize as its beginning: checkpoints there let the
    next request with the same system prompt, or the conversation's next turn, reuse the state."""
    from .generate import render_messages

    cuts = []
    heads = [messages[:1]] if messages and messages[0].get("role") == "system" and len(messages) > 1 else []
    if len(messages) > 2:
        heads.append(messages[:-1])
    for head in heads:
        try:
            t = render_messages(model, head, tools=tools, add_generation_prompt=False, **variables)
        except Exception:   # noqa: BLE001 (a template that cannot render a part: no checkpoint there)
            continue
        if t and text.startswith(t):
            k = model.tokenize(t, add_special=False, parse_special=True)
            if 0 < len(k) < len(ids) and ids[:len(k)] == k:
                cuts.append(len(k))
    return tuple(cuts)


# ------------------------------------------------------------------------------------ responses


def _lp(x: float) -> float:
    return float(x) if math.isfinite(x) else _MIN_LOGPROB


def _sse(obj) -> bytes:
    return b"data: " + _dumps(obj) + b"\n\n"


_DONE = b"data: [DONE]\n\n"


def _usage(prompt_tokens: int, completion) -> dict:
    n = len(completion.tokens)
    return {"prompt_tokens": prompt_tokens, "completion_tokens": n, "total_tokens": prompt_tokens + n}


class _Logprobs:
    """Piece.logprobs in OpenAI's two shapes; `offset` is where the next token's text starts (completions)."""

    def __init__(self, model, offset: int = 0):
        self.tok = getattr(model, "tokenizer", None)
        self.offset = offset

    def _bytes(self, token: int, text: str) -> list[int]:
        try:
            return list(self.tok.token_bytes(token))
        except Exception:
            return list(text.encode("utf-8"))

    def completion(self, items) -> dict:
        out = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
        for t in items:
            out["tokens"].append(t.text)
            out["token_logprobs"].append(_lp(t.logprob))
            out["top_logprobs"].append({alt_text: _lp(alt_lp) for _, alt_text, alt_lp in t.top})
            out["text_offset"].append(self.offset)
            self.offset += len(t.text)
        return out

    def chat(self, items) -> list[dict]:
        return [{"token": t.text, "logprob": _lp(t.logprob), "bytes": self._bytes(t.token, t.text),
                 "top_logprobs": [{"token": alt_text, "logprob": _lp(alt_lp), "bytes": self._bytes(alt, alt_text)}
                                  for alt, alt_text, alt_lp in t.top]} for t in items]


def _finish(completion, calls: bool) -> str:
    reason = completion.finish_reason
    return "tool_calls" if calls and reason == "stop" else reason


def _delta(ev, calls_so_far: int) -> list[dict]:
    """An AnswerParser event as chat chunk deltas (a tool call: its id and name, then its arguments)."""
    if ev.kind == "content":
        return [{"content": ev.text}]
    if ev.kind == "reasoning":
        return [{"reasoning_content": ev.text}]
    c = ev.call
    return [{"tool_calls": [{"index": calls_so_far, "id": c.id, "type": "function",
                             "function": {"name": c.name, "arguments": ""}}]},
            {"tool_calls": [{"index": calls_so_far, "function": {"arguments": c.arguments}}]}]


class _EventStream(Response):
    """A server-sent-event response that cancels its request when the client goes away: a task watches
    receive() for http.disconnect, and a failed send stops the stream; either way the generator is closed
    (its finally cancels the engine request), and on_end() runs (for a generator that never started)."""

    media_type = "text/event-stream"

    def __init__(self, gen, on_disconnect: Callable[[], None], on_end: Callable[[], None] = lambda: None):
        self.status_code = 200
        self.background = None
        self.init_headers({"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})   # no body: no length
        self.gen = gen
        self.on_disconnect = on_disconnect
        self.on_end = on_end

    async def __call__(self, scope, receive, send):
        gone = asyncio.Event()

        async def watch():
            while True:
                msg = await receive()
                if msg["type"] == "http.disconnect":
                    gone.set()
                    self.on_disconnect()
                    return

        watcher = asyncio.create_task(watch())
        try:
            await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
            async for chunk in self.gen:
                if gone.is_set():
                    break
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            if not gone.is_set():
                await send({"type": "http.response.body", "body": b"", "more_body": False})
        except OSError:                       # the client went away mid-send (uvicorn's ClientDisconnected)
            self.on_disconnect()
        finally:
            watcher.cancel()
            await self.gen.aclose()
            self.on_end()


# ------------------------------------------------------------------------------------ the app


@dataclass
class _Live:
    """Requests submitted and not yet ended, and how the ones in flight at shutdown ended."""
    reqs: dict = field(default_factory=dict)          # response id -> engine request
    draining: set | None = None                       # ids in flight when shutdown began
    ended: dict = field(default_factory=dict)         # id (of those) -> finish reason
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, rid: str, req) -> None:
        with self.lock:
            self.reqs[rid] = req

    def end(self, rid: str, reason: str) -> bool:
        """Records how request rid ended; False if that was recorded already."""
        with self.lock:
            if self.reqs.pop(rid, None) is None:
                return False
            if self.draining is not None and rid in self.draining:
                self.ended[rid] = reason
            return True

    def drain(self) -> list[str]:
        with self.lock:
            self.draining = set(self.reqs)
            return sorted(self.draining)


class StrataAPI:
    """The routes, over one engine and its model."""

    def __init__(self, engine, model, *, model_name: str | None = None, api_key: str | None = None,
                 close_engine: bool = True):
        self.engine = engine
        self.model = model
        self.model_name = model_name or os.path.basename(str(getattr(model, "path", "model")))
        self.created = int(_mtime(getattr(model, "path", None)))
        self.api_key = api_key or None
        self.close_engine = close_engine
        self.live = _Live()
        self.responses: dict[tuple[str, int], int] = {}
        self.report: dict | None = None            # after shutdown: {"finished": [...], "cancelled": [...]}
        self._grace: threading.Timer | None = None  # cancels what still runs grace_s after the signal

    # ---------------------------------------------------------------- helpers

    async def _json(self, request: Request) -> dict:
        length = request.headers.get("content-length", "")
        if length.isdigit() and int(length) > MAX_BODY_BYTES:
            raise APIError(f"the request body is larger than {MAX_BODY_BYTES >> 20} MiB", None, "request_too_large",
                           413)
        chunks, size = [], 0
        try:
            async for chunk in request.stream():
                size += len(chunk)
                if size > MAX_BODY_BYTES:
                    raise APIError(f"the request body is larger than {MAX_BODY_BYTES >> 20} MiB", None,
                                   "request_too_large", 413)
                chunks.append(chunk)
        except ClientDisconnect:
            raise APIError("the client went away before its request body arrived", None, "client_disconnected") \
                from None
        raw = b"".join(chunks)

        def no_constant(name):
            raise ValueError(f"{name} is not JSON")
        try:
            data = json.loads(raw, parse_constant=no_constant)
        except (ValueError, RecursionError) as e:
            raise APIError(f"the request body is not valid JSON ({str(e)[:200]}); send a JSON object", None,
                           "invalid_json") from None
        if not isinstance(data, dict):
            raise APIError(f"the request body must be a JSON object, not {_type_name(data)}", None, "invalid_json")
        return data

    async def _submit(self, job: Job):
        from .engine import EngineStopped, QueueFull

        try:
            return await run_in_threadpool(self.engine.submit, job.prompt, job.params, add_special=job.add_special,
                                           logprobs=job.logprobs, checkpoint_at=job.checkpoint_at)
        except QueueFull as e:
            wait = getattr(e, "retry_after", None) or 1.0
            raise APIError(f"the server is busy (every sequence is taken and the queue is full); retry after "
                           f"{wait:.1f} s", None, "overloaded", 503, "server_error",
                           {"Retry-After": str(max(1, math.ceil(wait)))}) from None
        except ValueError as e:
            msg = str(e)
            code = "context_length_exceeded" if "context" in msg else "invalid_value"
            raise APIError(msg, job.prompt_param, code) from None
        except EngineStopped as e:            # its thread failed (a bug, logged): no request can run any more
            raise _server_error(str(e), "engine_stopped") from None
        except RuntimeError as e:             # the engine is closing (shutdown)
            raise APIError(f"the server is shutting down ({e})", None, "shutting_down", 503, "server_error",
                           {"Retry-After": "1"}) from None

    def _cancel(self, req) -> None:
        """req.cancel() off the event loop (it may wait for the engine's lock)."""
        try:
            asyncio.get_running_loop().run_in_executor(None, req.cancel)
        except RuntimeError:
            req.cancel()

    async def _result(self, req):
        return await run_in_threadpool(req.result)

    def _name(self, job: Job) -> str:
        return job.model if job.model else self.model_name

    # ---------------------------------------------------------------- generation routes

    async def completions(self, request: Request):
        return await self._generate(request, completion_job)

    async def chat_completions(self, request: Request):
        return await self._generate(request, chat_job)

    async def _generate(self, request: Request, make_job):
        data = await self._json(request)
        job = await run_in_threadpool(make_job, data, self.model)
        req = await self._submit(job)
        rid = ("cmpl-" if job.kind == "completion" else "chatcmpl-") + uuid.uuid4().hex
        self.live.add(rid, req)
        created = int(time.time())
        if job.stream:
            gen = (self._stream_completion if job.kind == "completion" else self._stream_chat)(job, req, rid, created)

            def never_started():         # the stream's own frame (_stream) ends the request once it ran
                if self.live.end(rid, "cancelled"):
                    self._cancel(req)
            return _EventStream(gen, lambda: self._cancel(req), never_started)
        watcher = asyncio.create_task(_watch_disconnect(request.receive, lambda: self._cancel(req)))
        reason = "cancelled"
        try:
            out = await (self._complete if job.kind == "completion" else self._chat)(job, req, rid, created)
            reason = out.pop("_reason")
            return _JSON(out)
        except Exception:
            reason = "error"
            raise
        finally:
            watcher.cancel()
            if reason in ("cancelled", "error"):      # (a no-op on a request that ended)
                self._cancel(req)
            self.live.end(rid, reason)

    async def _collect(self, req):
        tokens_lp, parts = [], []
        async for piece in req.astream():
            parts.append(piece.text)
            if piece.logprobs:
                tokens_lp.extend(piece.logprobs)
        return "".join(parts), tokens_lp, await self._result(req)

    def _engine_error(self, c):
        raise _server_error(f"the request failed in the engine: {c.error or c.finish_reason}", "engine_error")

    async def _complete(self, job: Job, req, rid: str, created: int) -> dict:
        text, lps, c = await self._collect(req)
        if c.finish_reason == "error":
            self._engine_error(c)
        logprobs = _Logprobs(self.model, len(job.echo)).completion(lps) if job.logprobs is not None else None
        return {"id": rid, "object": "text_completion", "created": created, "model": self._name(job),
                "system_fingerprint": None,
                "choices": [{"index": 0, "text": job.echo + text, "logprobs": logprobs,
                             "finish_reason": c.finish_reason}],
                "usage": _usage(req.prompt_tokens, c), "_reason": c.finish_reason}

    async def _chat(self, job: Job, req, rid: str, created: int) -> dict:
        text, lps, c = await self._collect(req)
        if c.finish_reason == "error":
            self._engine_error(c)
        parser = AnswerParser(job.tools, job.thinking)
        events = parser.feed(text) + parser.close()
        content = "".join(e.text for e in events if e.kind == "content")
        reasoning = "".join(e.text for e in events if e.kind == "reasoning")
        calls = parser.tool_calls
        message = {"role": "assistant", "content": content if content or not calls else None, "refusal": None}
        if reasoning:
            message["reasoning_content"] = reasoning
        if calls:
            message["tool_calls"] = [call.to_openai() for call in calls]
        logprobs = ({"content": _Logprobs(self.model).chat(lps), "refusal": None}
                    if job.logprobs is not None else None)
        return {"id": rid, "object": "chat.completion", "created": created, "model": self._name(job),
                "system_fingerprint": None,
                "choices": [{"index": 0, "message": message, "logprobs": logprobs,
                             "finish_reason": _finish(c, bool(calls))}],
                "usage": _usage(req.prompt_tokens, c), "_reason": c.finish_reason}

    async def _stream(self, job: Job, req, rid: str, body):
        """The stream's frame: body(pieces) yields chunks; then the usage chunk, [DONE]; errors as an
        error event; the request ended (or cancelled when the stream is abandoned)."""
        reason = "cancelled"
        try:
            try:
                async for chunk in body():
                    if isinstance(chunk, str):        # the finish reason: the end
                        reason = chunk
                        continue
                    yield _sse(chunk)
            except APIError as e:
                reason = "error"
                yield _sse(e.body())
            except Exception as e:  # noqa: BLE001 — our bug: log it, tell the client, keep serving
                reason = "error"
                log.exception("strata serve: request %s failed", rid)
                yield _sse(_server_error(f"internal error: {type(e).__name__}: {e}").body())
            yield _DONE
        finally:
            if reason in ("cancelled", "error"):
                self._cancel(req)
            self.live.end(rid, reason)

    def _stream_completion(self, job: Job, req, rid: str, created: int):
        name = self._name(job)
        lpx = _Logprobs(self.model, len(job.echo))

        def chunk(text, finish, logprobs=None):
            out = {"id": rid, "object": "text_completion", "created": created, "model": name,
                   "system_fingerprint": None,
                   "choices": [{"index": 0, "text": text, "logprobs": logprobs, "finish_reason": finish}]}
            if job.include_usage:
                out["usage"] = None
            return out

        async def body():
            if job.echo:
                yield chunk(job.echo, None)
            async for piece in req.astream():
                lp = lpx.completion(piece.logprobs) if job.logprobs is not None and piece.logprobs else None
                if piece.text or lp:
                    yield chunk(piece.text, None, lp)
            c = await self._result(req)
            if c.finish_reason == "error":
                self._engine_error(c)
            yield chunk("", c.finish_reason)
            if job.include_usage:
                yield {"id": rid, "object": "text_completion", "created": created, "model": name,
                       "system_fingerprint": None, "choices": [], "usage": _usage(req.prompt_tokens, c)}
            yield c.finish_reason
        return self._stream(job, req, rid, body)

    def _stream_chat(self, job: Job, req, rid: str, created: int):
        name = self._name(job)
        lpx = _Logprobs(self.model)
        parser = AnswerParser(job.tools, job.thinking)

        def chunk(delta, finish=None, logprobs=None):
            out = {"id": rid, "object": "chat.completion.chunk", "created": created, "model": name,
                   "system_fingerprint": None,
                   "choices": [{"index": 0, "delta": delta,
                                "logprobs": {"content": logprobs, "refusal": None} if logprobs else None,
                                "finish_reason": finish}]}
            if job.include_usage:
                out["usage"] = None
            return out

        async def body():
            yield chunk({"role": "assistant", "content": ""})
            pending = []                       # logprobs of tokens whose text no chunk has carried yet
            n_calls = 0
            async for piece in req.astream():
                if job.logprobs is not None and piece.logprobs:
                    pending.extend(lpx.chat(piece.logprobs))
                for ev in parser.feed(piece.text):
                    for d in _delta(ev, n_calls):
                        yield chunk(d, None, pending)
                        pending = []
                    n_calls += ev.kind == "tool_call"
            c = await self._result(req)
            if c.finish_reason == "error":
                self._engine_error(c)
            for ev in parser.close():
                for d in _delta(ev, n_calls):
                    yield chunk(d, None, pending)
                    pending = []
                n_calls += ev.kind == "tool_call"
            yield chunk({}, _finish(c, n_calls > 0), pending)
            if job.include_usage:
                yield {"id": rid, "object": "chat.completion.chunk", "created": created, "model": name,
                       "system_fingerprint": None, "choices": [], "usage": _usage(req.prompt_tokens, c)}
            yield c.finish_reason
        return self._stream(job, req, rid, body)

    # ---------------------------------------------------------------- the other routes

    def _model_card(self) -> dict:
        return {"id": self.model_name, "object": "model", "created": self.created, "owned_by": "strata"}

    async def models(self, request: Request):
        return _JSON({"object": "list", "data": [self._model_card()]})

    async def model_info(self, request: Request):
        name = request.path_params["model"]
        if name != self.model_name:
            raise APIError(f"The model {name!r} does not exist; this server has {self.model_name!r}", "model",
                           "model_not_found", 404)
        return _JSON(self._model_card())

    async def health(self, request: Request):
        if self.engine.stopped is not None:   # a load balancer should take this server out
            return _JSON({"status": "error", "error": str(self.engine.stopped)}, status_code=503)
        return _JSON({"status": "ok"})

    async def metrics(self, request: Request):
        m = await run_in_threadpool(self.engine.metrics)
        return Response(prometheus_text(m, self.responses), media_type="text/plain; version=0.0.4; charset=utf-8")

    # ---------------------------------------------------------------- shutdown

    def begin_shutdown(self, grace_s: float | None = None) -> list[str]:
        """Shutdown began (SIGTERM): the ids of the requests in flight now, which it reports on. With
        grace_s, those still running grace_s seconds later are cancelled: the engine ends them at its next
        step, so each client still gets a complete answer (finish_reason "cancelled", then [DONE])."""
        ids = self.live.drain()
        if grace_s is not None and self._grace is None:
            self._grace = threading.Timer(grace_s, self.cancel_in_flight)
            self._grace.daemon = True
            self._grace.start()
        return ids

    def cancel_in_flight(self) -> None:
        with self.live.lock:
            reqs = list(self.live.reqs.values())
        for req in reqs:
            req.cancel()

    def finish_shutdown(self) -> dict:
        """After the server stopped: the engine closed (what is still live is cancelled) and
        {"finished": [ids], "cancelled": [ids]} of the requests in flight when shutdown began."""
        closed = {"finished": [], "cancelled": []}
        if self._grace is not None:
            self._grace.cancel()
        if self.close_engine:
            closed = self.engine.close(cancel=True) or closed
        with self.live.lock:
            draining = self.live.draining or set()
            live = dict(self.live.reqs)
            ended = dict(self.live.ended)
        by_engine = {getattr(r, "id", None): rid for rid, r in live.items()}
        cancelled_ids = {by_engine.get(i, i) for i in closed.get("cancelled", ())}
        finished = sorted(rid for rid in draining if ended.get(rid) not in (None, "cancelled")
                          and rid not in cancelled_ids)
        cancelled = sorted((draining - set(finished)) | {i for i in cancelled_ids if i in draining or i in live})
        self.report = {"finished": finished, "cancelled": cancelled}
        return self.report


async def _watch_disconnect(receive, on_disconnect) -> None:
    """Calls on_disconnect() when the client goes away (the body is already read)."""
    while True:
        msg = await receive()
        if msg["type"] == "http.disconnect":
            on_disconnect()
            return


def _mtime(path) -> float:
    try:
        return os.path.getmtime(path)
    except (OSError, TypeError):
        return time.time()


# ------------------------------------------------------------------------------------ /metrics


# (engine metrics key, Prometheus name, type, help): the engine owns every number; this only names them
_METRICS = (
    ("requests_total", "strata_requests_total", "counter", "Requests submitted to the engine."),
    ("requests_running", "strata_requests_running", "gauge", "Requests holding a sequence now."),
    ("requests_queued", "strata_requests_queued", "gauge", "Requests waiting for a sequence (queue depth)."),
    ("requests_finished", "strata_requests_finished_total", "counter", "Requests that ran to their end."),
    ("requests_cancelled", "strata_requests_cancelled_total", "counter",
     "Requests cancelled (client gone, shutdown)."),
    ("requests_failed", "strata_requests_failed_total", "counter", "Requests that ended in an engine error."),
    ("max_seqs", "strata_max_concurrent", "gauge", "Sequences the engine runs at once at most."),
    ("prompt_tokens_total", "strata_prompt_tokens_total", "counter", "Prompt tokens of submitted requests."),
    ("reused_prompt_tokens_total", "strata_reused_prompt_tokens_total", "counter",
     "Prompt tokens taken from a cached prefix instead of evaluated."),
    ("generated_tokens_total", "strata_generated_tokens_total", "counter", "Tokens generated."),
    ("generated_tps", "strata_generated_tokens_per_second", "gauge", "Generated tokens per second, recently."),
    ("cache_hits", "strata_cache_hits_total", "counter", "Expert cache hits."),
    ("cache_lookups", "strata_cache_lookups_total", "counter", "Expert cache lookups."),
    ("pcie_bytes", "strata_pcie_bytes_total", "counter", "Bytes of experts copied over PCIe."),
    ("drafts_proposed", "strata_drafts_proposed_total", "counter", "MTP draft tokens proposed."),
    ("drafts_accepted", "strata_drafts_accepted_total", "counter", "MTP draft tokens accepted."),
    ("steps_total", "strata_steps_total", "counter", "Engine steps (batched forwards)."),
)
# (name, numerator key, denominator key, help): ratios of two engine counters
_RATIOS = (
    ("strata_cache_hit_rate", "cache_hits", "cache_lookups", "Expert cache hits / lookups since start."),
    ("strata_draft_acceptance_rate", "drafts_accepted", "drafts_proposed",
     "MTP drafts accepted / proposed since start."),
)


def _prom_value(v) -> str:
    if isinstance(v, bool):
        return "1" if v else "0"
    if isinstance(v, int):
        return str(v)
    v = float(v)
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    return repr(v)


def prometheus_text(metrics: dict, responses: dict | None = None) -> str:
    """eng.metrics() (and the HTTP response counts {(route, status): n}) in Prometheus' text exposition
    format: `# HELP` and `# TYPE` lines, then `name value` or `name{labels} value`."""
    lines = []

    def one(name, kind, help_, samples):
        lines.append(f"# HELP {name} {help_}")
        lines.append(f"# TYPE {name} {kind}")
        for labels, v in samples:
            lines.append(f"{name}{labels} {_prom_value(v)}")

    known = set()
    for key, name, kind, help_ in _METRICS:
        known.add(key)
        v = metrics.get(key)
        if isinstance(v, (int, float)):
            one(name, kind, help_, [("", v)])
    for name, num, den, help_ in _RATIOS:
        n, d = metrics.get(num), metrics.get(den)
        if isinstance(n, (int, float)) and isinstance(d, (int, float)):
            one(name, "gauge", help_, [("", n / d if d else 0.0)])
    for key in sorted(metrics):                      # whatever else the engine reports
        v = metrics[key]
        if key not in known and isinstance(v, (int, float)) and key.replace("_", "").isalnum():
            one(f"strata_{key}", "counter" if key.endswith("_total") else "gauge", f"Engine metric {key}.",
                [("", v)])
    if responses:
        one("strata_http_responses_total", "counter", "HTTP responses by route and status code.",
            [(f'{{route="{route}",code="{code}"}}', n) for (route, code), n in sorted(responses.items())])
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------------ the ASGI app


_ROUTES = ("/v1/completions", "/v1/chat/completions", "/v1/models", "/health", "/metrics")


class _Gate:
    """Pure ASGI middleware (so streaming and disconnects pass through untouched): the API key on
    every route but /health, and the response count per route and status for /metrics."""

    def __init__(self, app, api: StrataAPI):
        self.app, self.api = app, api
        self.key = api.api_key.encode() if api.api_key else None

    def _authorized(self, scope) -> bool:
        for name, value in scope.get("headers", ()):
            if name == b"authorization":
                scheme, _, token = value.partition(b" ")
                return scheme.lower() == b"bearer" and hmac.compare_digest(token.strip(), self.key)
        return False

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path = scope.get("path", "")
        route = path if path in _ROUTES else "/v1/models/{model}" if path.startswith("/v1/models/") else "other"
        status = []

        async def counted(msg):
            if msg["type"] == "http.response.start":
                status.append(msg["status"])
            await send(msg)
        try:
            if self.key is not None and path != "/health" and not self._authorized(scope):
                err = APIError("Incorrect or missing API key: send the header 'Authorization: Bearer KEY' with the "
                               "key this server was started with (--api-key / STRATA_API_KEY)", None,
                               "invalid_api_key", 401)
                await err.response()(scope, receive, counted)
                return
            await self.app(scope, receive, counted)
        finally:
            if status:
                k = (route, status[0])
                self.api.responses[k] = self.api.responses.get(k, 0) + 1


def _guard(handler):
    """A route that answers APIError with its body and any other exception with a logged 500: nothing a
    request sends can take the server down."""
    async def route(request: Request):
        try:
            return await handler(request)
        except APIError as e:
            return e.response()
        except Exception as e:  # noqa: BLE001
            log.exception("strata serve: %s %s failed", request.method, request.url.path)
            return _server_error(f"internal error: {type(e).__name__}: {e}").response()
    return route


async def _http_error(request: Request, exc: HTTPException):
    if exc.status_code == 404:
        err = APIError(f"Unknown route: {request.method} {request.url.path} (the API is under /v1: completions, "
                       "chat/completions, models; also /health, /metrics)", None, "not_found", 404)
    elif exc.status_code == 405:
        err = APIError(f"Method {request.method} is not allowed on {request.url.path}", None,
                       "method_not_allowed", 405)
    else:
        err = APIError(str(exc.detail), None, None, exc.status_code)
    err.headers.update(exc.headers or {})
    return err.response()


async def _crash(request: Request, exc: Exception):
    return _server_error(f"internal error: {type(exc).__name__}").response()


def create_app(engine, model, *, model_name: str | None = None, api_key: str | None = None,
               close_engine: bool = False) -> Starlette:
    """The OpenAI-compatible app over `engine` (a pyrunner.engine.Engine, or anything with its submit /
    metrics / close) for `model` (its chat template, tokenizer and vocabulary). model_name: what
    /v1/models lists (default: the model's file name). api_key: required as a Bearer token on every route
    but /health. close_engine: close the engine when the app shuts down (lifespan). The app's
    `state.api` is the StrataAPI (its begin_shutdown / finish_shutdown report on requests in flight)."""
    api = StrataAPI(engine, model, model_name=model_name, api_key=api_key, close_engine=close_engine)
    routes = [Route("/v1/completions", _guard(api.completions), methods=["POST"]),
              Route("/v1/chat/completions", _guard(api.chat_completions), methods=["POST"]),
              Route("/v1/models", _guard(api.models), methods=["GET"]),
              Route("/v1/models/{model:path}", _guard(api.model_info), methods=["GET"]),
              Route("/health", _guard(api.health), methods=["GET"]),
              Route("/metrics", _guard(api.metrics), methods=["GET"])]

    @contextlib.asynccontextmanager
    async def lifespan(app):
        yield
        if api.report is None:
            await run_in_threadpool(api.finish_shutdown)

    app = Starlette(routes=routes, exception_handlers={HTTPException: _http_error, Exception: _crash},
                    lifespan=lifespan)
    app.state.api = api
    app.add_middleware(_Gate, api=api)
    return app


# ------------------------------------------------------------------------------------ running it


def _log_config() -> dict:
    """uvicorn's logging: its own messages from warnings up (serve() prints the start line), the access
    log on, both on stderr."""
    from uvicorn.config import LOGGING_CONFIG

    cfg = json.loads(json.dumps(LOGGING_CONFIG))
    cfg["loggers"]["uvicorn"]["level"] = "WARNING"
    cfg["loggers"]["uvicorn.error"] = {"level": "WARNING"}
    cfg["loggers"]["uvicorn.access"]["level"] = "INFO"
    cfg["handlers"]["access"]["stream"] = "ext://sys.stderr"      # stdout is serve()'s own lines
    return cfg


def _uvicorn_server(app, host: str, port: int, grace_s: float, on_started=None, on_signal=None):
    import uvicorn

    class Server(uvicorn.Server):
        """uvicorn.Server that says where it listens once bound (port 0: the port the OS chose), hears
        the shutdown signal first, and exits normally afterwards (uvicorn re-raises the signal)."""

        async def startup(self, sockets=None):
            await super().startup(sockets)
            if self.started and on_started is not None:
                socks = [s for srv in self.servers for s in srv.sockets]
                on_started(socks[0].getsockname()[1] if socks else port)

        def handle_exit(self, sig, frame):
            if not self.should_exit and on_signal is not None:
                on_signal(sig)
            super().handle_exit(sig, frame)

        @contextlib.contextmanager
        def capture_signals(self):
            if threading.current_thread() is not threading.main_thread():
                yield
                return
            old = {s: signal.signal(s, self.handle_exit) for s in (signal.SIGINT, signal.SIGTERM)}
            try:
                yield
            finally:
                for s, h in old.items():
                    signal.signal(s, h)

    # the app cancels what runs grace_s after the signal (StrataAPI.begin_shutdown); uvicorn's own timeout,
    # which abandons the connections, only backs that up
    config = uvicorn.Config(app, host=host, port=port, log_config=_log_config(),
                            timeout_graceful_shutdown=grace_s + 10, lifespan="on", access_log=True)
    return Server(config)


def _url(host: str, port: int) -> str:
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def serve(model, *, host: str = "127.0.0.1", port: int = 8080, api_key: str | None = None,
          max_concurrent: int | None = None, max_queue: int | None = None, mtp=None, watchdog_s=None,
          grace_s: float = DEFAULT_GRACE_S, itl_factor: float | None = DEFAULT_ITL_FACTOR,
          echo: Callable[[str], None] = print) -> dict:
    """`strata serve`: an Engine over `model`, the app, uvicorn on host:port until SIGTERM / SIGINT. Prints
    the start line (`strata serve: http://HOST:PORT/v1 (model FILE, up to N concurrent, auth on|off)`), at
    the signal the requests in flight, and at the end which of them finished and which were cancelled
    (those still running grace_s after the signal). itl_factor: the engine's (while requests decode, a
    prompt's prefill pieces are sized so a step takes about that many decode-only steps; None: not).
    Returns that {"finished", "cancelled"}."""
    from .engine import Engine

    engine = Engine(model, max_seqs=max_concurrent, max_queue=max_queue, mtp=mtp, watchdog_s=watchdog_s,
                    itl_factor=itl_factor)
    app = create_app(engine, model, api_key=api_key, close_engine=True)
    api: StrataAPI = app.state.api
    slots = max_concurrent or getattr(engine, "max_seqs", None)

    def started(bound: int) -> None:
        echo(f"strata serve: {_url(host, bound)}/v1 (model {api.model_name}, up to {slots or '?'} concurrent, "
             f"auth {'on' if api_key else 'off'})")

    def signalled(sig) -> None:
        ids = api.begin_shutdown(grace_s)
        try:
            name = signal.Signals(sig).name
        except ValueError:
            name = f"signal {sig}"
        echo(f"strata serve: {name}: not accepting new requests; {len(ids)} in flight"
             + (f" ({', '.join(ids)}), up to {grace_s:g} s to finish" if ids else ""))

    server = _uvicorn_server(app, host, port, grace_s, started, signalled)
    try:
        server.run()
    except SystemExit:                  # uvicorn's way to say it could not start (it logged why)
        pass
    finally:
        if api.report is None:          # stopped without the lifespan's shutdown
            if api.live.draining is None:
                api.begin_shutdown()
            api.finish_shutdown()
    if not server.started:
        raise OSError(f"could not listen on {_url(host, port)} (the message above says why; if the port is taken, "
                      f"pick another with --port, or --port 0 for any free one)")
    report = api.report
    echo(f"strata serve: stopped; finished {len(report['finished'])}"
         + (f" ({', '.join(report['finished'])})" if report["finished"] else "")
         + f", cancelled {len(report['cancelled'])}"
         + (f" ({', '.join(report['cancelled'])})" if report["cancelled"] else ""))
    return report


class BackgroundServer:
    """uvicorn serving `app` on a thread (tests, benchmarks): `with BackgroundServer(app) as s:` gives
    s.url ("http://127.0.0.1:PORT") and s.port, on a free port unless one is given; stop() (or leaving the
    block) shuts it down as a signal would, within grace_s."""

    def __init__(self, app, host: str = "127.0.0.1", port: int = 0, grace_s: float = DEFAULT_GRACE_S,
                 timeout_s: float = 30.0):
        self.app, self.host, self.port = app, host, port
        self._bound = threading.Event()
        self.grace_s = grace_s
        self.server = _uvicorn_server(app, host, port, grace_s, self._on_started)
        self.timeout_s = timeout_s
        self.thread = threading.Thread(target=self.server.run, name="strata-serve", daemon=True)

    def _on_started(self, port: int) -> None:
        self.port = port
        self._bound.set()

    @property
    def url(self) -> str:
        return _url(self.host, self.port)

    def start(self) -> "BackgroundServer":
        self.thread.start()
        deadline = time.monotonic() + self.timeout_s
        while not self._bound.wait(0.05):
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the server did not start on {self.host}:{self.port}")
        return self

    def stop(self) -> None:
        api = getattr(getattr(self.app, "state", None), "api", None)
        if api is not None and api.live.draining is None:
            api.begin_shutdown(self.grace_s)
        self.server.should_exit = True
        self.thread.join(self.timeout_s + self.server.config.timeout_graceful_shutdown)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()
