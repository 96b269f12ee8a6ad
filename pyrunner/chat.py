"""chat.py — turn a conversation into the prompt text a model was trained on.

A GGUF carries its chat template as a jinja2 string (`tokenizer.chat_template`, plus named ones as
`tokenizer.chat_template.<name>`). Templates are written for, and tested by their authors with,
transformers' `apply_chat_template`, so "correct" means "what transformers renders". Everything
below reproduces the environment that function builds (checked against transformers 5.23.0 by
tests/test_chat.py on the real Qwen templates):

- a sandboxed, immutable jinja2 environment with `trim_blocks` and `lstrip_blocks` on, the
  `loopcontrols` extension (`{% break %}`, `{% continue %}`) and a `{% generation %}` block tag
  that renders its body unchanged (transformers uses it to find assistant tokens);
- a `tojson` filter that does *not* HTML-escape (jinja's own does) and takes `ensure_ascii`,
  `indent`, `separators` and `sort_keys`;
- globals `raise_exception(msg)`, `strftime_now(fmt)` (local time), a `dict` constructor and a
  `namespace` that refuses underscore-prefixed attribute names;
- variables `messages`, `tools` and `documents` (always passed, `None` when absent, so
  `tools is defined` holds even without tools), `add_generation_prompt`, the special-token strings
  that are set (`bos_token`, `eos_token`, ...) and any extra keyword such as `enable_thinking`;
- inputs cleaned the same way: keys whose value is `None` dropped from each message (OpenAI-style
  `"content": None` next to `tool_calls`), everything reduced to plain JSON-like data, and a
  message's reasoning copied under both `reasoning_content` and `thinking`.

A model without a template gets ChatML, the format of the Qwen family.
"""
from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from datetime import datetime
from functools import lru_cache

import jinja2
import jinja2.ext
import jinja2.nodes
import jinja2.utils
import numpy as np
from jinja2.sandbox import ImmutableSandboxedEnvironment

# ChatML, written as a template so that it goes through the same renderer as a model's own.
# Content may be a string or a list of parts ({"type": "text", "text": ...}); other parts
# (images) have no ChatML form and are left out.
CHATML_TEMPLATE = (
    "{%- for message in messages %}"
    "{%- if message['role'] is not defined %}"
    "{{- raise_exception('message ' ~ loop.index0 ~ ' has no role') }}"
    "{%- endif %}"
    "{{- '<|im_start|>' ~ message['role'] ~ '\\n' }}"
    "{%- if message['content'] is string %}"
    "{{- message['content'] }}"
    "{%- elif message['content'] is defined and message['content'] is iterable"
    " and message['content'] is not mapping %}"
    "{%- for part in message['content'] %}"
    "{%- if part is mapping and part['text'] is defined %}{{- part['text'] }}{%- endif %}"
    "{%- endfor %}"
    "{%- endif %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

# Names under which callers hand over an assistant message's reasoning; templates read the first
# (Qwen) or `thinking` (gpt-oss), so a message that has any of them gets both.
_REASONING_KEYS = ("reasoning_content", "thinking", "reasoning")

# Metadata keys (gguf-py's Keys.Tokenizer.CHAT_TEMPLATE and CHAT_TEMPLATE_N).
_KEY = "tokenizer.chat_template"


class ChatTemplateError(ValueError):
    """The template could not be parsed or rendered for this conversation (the message says why)."""


class _Raised(jinja2.TemplateError):
    """What a template's own raise_exception() throws, kept apart from jinja's errors."""


class _GenerationTag(jinja2.ext.Extension):
    """`{% generation %}...{% endgeneration %}`: renders the body as is."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    def _body(self, caller):
        return caller()


class _Namespace(jinja2.utils.Namespace):
    """jinja's namespace() minus underscore-prefixed names (a way out of the sandbox)."""

    def __init__(*args, **kwargs):  # noqa: N805 — first positional is self, as in jinja's own
        self, rest = args[0], args[1:]
        attrs = dict(*rest, **kwargs)
        for name in attrs:
            _Namespace._check(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name, value):
        _Namespace._check(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check(name):
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(
                f"a chat template may not set the underscore-prefixed attribute {name!r} on a namespace")


class _DictMaker:
    """The template's `dict`: builds dicts, exposes nothing of the dict type itself."""

    def __call__(self, *args, **kwargs):
        return dict(*args, **kwargs)

    def fromkeys(self, *args, **kwargs):
        return dict.fromkeys(*args, **kwargs)


def _raise_exception(message):
    raise _Raised(message)


def _tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def _strftime_now(fmt):
    return datetime.now().strftime(fmt)


@lru_cache(maxsize=1)
def _environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[_GenerationTag, jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.globals["dict"] = _DictMaker()
    env.globals["namespace"] = _Namespace
    return env


@lru_cache(maxsize=16)
def _compile(template: str) -> jinja2.Template:
    try:
        return _environment().from_string(template)
    except jinja2.TemplateSyntaxError as e:
        raise ChatTemplateError(
            f"the chat template does not parse: {e.message} (template line {e.lineno}: "
            f"{_line(template, e.lineno)!r}); fix the template or pass another one") from e


def _line(template: str, lineno: int | None) -> str:
    lines = template.splitlines()
    if lineno and 1 <= lineno <= len(lines):
        text = lines[lineno - 1].strip()
        return text if len(text) <= 120 else text[:117] + "..."
    return ""


def _template_lineno(exc: BaseException) -> int | None:
    """Line of the template being executed when exc was raised (jinja rewrites the traceback so
    that template frames carry template line numbers under the file name '<template>')."""
    tb, lineno = exc.__traceback__, None
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == "<template>":
            lineno = tb.tb_lineno
        tb = tb.tb_next
    return lineno


def _plain(value):
    """value rebuilt from plain JSON-like types, so the sandbox never sees a caller's objects
    (numpy scalars, pydantic models, dataclasses; anything else becomes '<TypeName>')."""
    if value is None or type(value) in (str, int, float, bool):
        return value
    if isinstance(value, str):  # subclasses such as enums: back to the base type
        return str.__str__(value)
    if isinstance(value, int):
        return int.__int__(value)
    if isinstance(value, float):
        return float.__float__(value)
    if isinstance(value, Mapping):
        return {_plain(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, tuple):
        return tuple(_plain(v) for v in value)
    if isinstance(value, np.generic):  # np.bool_(False) must not become a truthy placeholder
        return _plain(value.item())
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    dump = getattr(value, "model_dump", None)
    if callable(dump):
        return _plain(dump())
    return f"<{type(value).__name__}>"


def _prepare_messages(messages) -> list[dict]:
    if not isinstance(messages, (list, tuple)):
        raise ChatTemplateError(
            f"messages must be a list of dicts like {{'role': 'user', 'content': '...'}}, "
            f"not {type(messages).__name__}")
    if not messages:
        raise ChatTemplateError("cannot render an empty conversation: pass at least one message")
    out = []
    for i, message in enumerate(messages):
        if not isinstance(message, Mapping):
            raise ChatTemplateError(
                f"message {i} is a {type(message).__name__}, not a dict with 'role' and 'content'")
        message = _plain({k: v for k, v in message.items() if v is not None})
        reasoning = next((message[k] for k in _REASONING_KEYS if message.get(k) is not None), None)
        if reasoning is not None:
            message = {"thinking": reasoning, **message, "reasoning_content": reasoning}
        out.append(message)
    return out


def render_chat(template: str | None, messages: list[dict], *,
                add_generation_prompt: bool | None = None, continue_final_message: bool | str = False,
                tools: list[dict] | None = None, documents: list[dict] | None = None,
                bos_token: str | None = None, eos_token: str | None = None, **kwargs) -> str:
    """The prompt text for `messages` under `template`, as transformers' apply_chat_template
    (tokenize=False) renders it.

    template: the model's `tokenizer.chat_template`; None or "" selects ChatML.
    add_generation_prompt: open an assistant turn at the end (default: yes, unless
        continuing the final message).
    continue_final_message: end the text inside the last message, so that the model carries it
        on (an assistant reply started by the caller); True continues its "content", a string
        names another field (e.g. "reasoning_content").
    messages: dicts with "role" and "content" (a string or a list of parts), and optionally
        "tool_calls", "reasoning_content", ...; a key whose value is None counts as absent.
    tools: JSON schemas of the functions the model may call (OpenAI form
        {"type": "function", "function": {...}}); documents: for templates that take them.
    bos_token, eos_token: the model's special-token strings; None leaves them undefined in the
        template, as transformers does for a tokenizer without that token.
    kwargs: further template variables, e.g. enable_thinking=False for Qwen 3/3.5.

    Raises ChatTemplateError when the template does not parse, refuses the conversation
    (its raise_exception), or fails while rendering.
    """
    chatml = not template
    if chatml and tools:
        raise ChatTemplateError(
            "this model has no chat template, and the ChatML fallback has no way to describe tools; "
            "pass a chat template that supports tools (e.g. the model's original one)")
    if tools is not None:
        if not isinstance(tools, (list, tuple)) or not all(isinstance(t, Mapping) for t in tools):
            raise ChatTemplateError(
                "tools must be a list of JSON-schema dicts, e.g. {'type': 'function', 'function': "
                "{'name': ..., 'description': ..., 'parameters': {...}}}")
    if documents is not None and not all(isinstance(d, Mapping) for d in documents):
        raise ChatTemplateError("documents must be a list of dicts with 'title' and 'text' keys")

    variables = {}
    if bos_token is not None:
        variables["bos_token"] = bos_token
    if eos_token is not None:
        variables["eos_token"] = eos_token
    variables.update(kwargs)
    variables = _plain(variables)

    source = CHATML_TEMPLATE if chatml else template
    compiled = _compile(source)
    prepared = _prepare_messages(messages)
    if add_generation_prompt is None:
        add_generation_prompt = not continue_final_message
    if continue_final_message:
        if add_generation_prompt:
            raise ChatTemplateError(
                "continue_final_message and add_generation_prompt exclude each other: the first "
                "ends inside the last message, the second opens a new assistant turn; pick one")
        field = continue_final_message if isinstance(continue_final_message, str) else "content"
        final = _mark_final(source, prepared, field)
    text = _render(compiled, source, prepared, tools, documents, add_generation_prompt, variables)
    if continue_final_message:
        text = _cut_after_final(text, final)
    return text


# Appended to the text being continued; the rendering is cut where it lands. The trailing space
# tells whether the template kept the text as is or trimmed its end.
_CONTINUE_MARK = "CONTINUE_FINAL_MESSAGE_TAG "


def _mark_final(source: str, prepared: list[dict], field: str) -> str:
    """Append _CONTINUE_MARK to the last message's `field` (every reasoning alias of it, or the
    last text part of a list); returns the text being continued."""
    last = prepared[-1]
    final = last.get(field)
    if final is None:
        raise ChatTemplateError(
            f"continue_final_message: the last message has no {field!r} to continue")
    fields = [field]
    if field in _REASONING_KEYS:  # copied under several names: mark whichever the template reads
        fields = [k for k in _REASONING_KEYS if last.get(k) == final]
    if not any(f in source for f in fields):
        raise ChatTemplateError(
            f"continue_final_message: this chat template never reads {field!r}, so that text "
            f"cannot be continued")
    if isinstance(final, (list, tuple)):
        for part in reversed(final):
            if isinstance(part, dict) and "text" in part:
                text = part["text"]
                part["text"] = text + _CONTINUE_MARK
                return text
        raise ChatTemplateError(
            "continue_final_message: the last message has no text part to continue")
    for f in fields:
        last[f] = last[f] + _CONTINUE_MARK
    return final


def _cut_after_final(text: str, final: str) -> str:
    mark = _CONTINUE_MARK.strip()
    if final.strip() not in text or mark not in text:
        raise ChatTemplateError(
            "continue_final_message: the chat template dropped or changed the last message, so "
            "its text cannot be continued; render without continue_final_message")
    at = text.rindex(mark)
    if text.startswith(_CONTINUE_MARK, at):
        return text[:at]
    return text[:at].rstrip()  # the template trimmed the end of the message: so do we


def _render(compiled, source, prepared, tools, documents, add_generation_prompt, variables) -> str:
    try:
        return compiled.render(messages=prepared, tools=_plain(tools), documents=_plain(documents),
                               add_generation_prompt=bool(add_generation_prompt), **variables)
    except _Raised as e:
        raise ChatTemplateError(f"the chat template rejected this conversation: {e.message}") from e
    except ChatTemplateError:
        raise
    except Exception as e:  # jinja's UndefinedError, SecurityError, and TypeError etc. from filters
        lineno = _template_lineno(e)
        where = f" at template line {lineno} ({_line(source, lineno)!r})" if lineno else ""
        hint = ("the template tried something the sandbox forbids; use another template"
                if isinstance(e, jinja2.exceptions.SecurityError)
                else "check that the messages have the fields this template expects")
        raise ChatTemplateError(
            f"the chat template failed while rendering{where}: {type(e).__name__}: {e}; {hint}") from e


def chat_template_from_metadata(metadata: Mapping, name: str | None = None,
                                tools: list | None = None) -> str | None:
    """The template string to use from a GGUF's metadata, chosen as transformers chooses among a
    tokenizer's named templates: `name` if given; else the "tool_use" template when tools are
    passed and the file has one; else the default `tokenizer.chat_template`; None if absent."""
    if name is not None:
        key = _KEY if name == "default" else f"{_KEY}.{name}"
        if key not in metadata:
            have = (["default"] if _KEY in metadata else []) + sorted(
                k[len(_KEY) + 1:] for k in metadata if k.startswith(_KEY + "."))
            raise ChatTemplateError(
                f"this model has no chat template named {name!r}; it has "
                f"{', '.join(map(repr, have)) if have else 'none'}")
        return metadata[key] or None
    if tools and metadata.get(f"{_KEY}.tool_use"):
        return metadata[f"{_KEY}.tool_use"]
    return metadata.get(_KEY) or None
