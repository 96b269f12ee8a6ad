"""toolcalls.py — what a chat answer's text holds besides its content: Qwen's `<think>…</think>`
reasoning and `<tool_call>…</tool_call>` calls, parsed out of the text as it streams.

    p = AnswerParser(tools=request_tools, thinking=prompt_ends_in_think(prompt_text))
    for piece in pieces:
        for ev in p.feed(piece): ...        # Event("content" | "reasoning", text) or Event("tool_call", call=ToolCall)
    for ev in p.close(): ...                # what was held back, at the end of the answer
    p.tool_calls                            # every ToolCall parsed, in order

The formats (the Qwen chat templates' own instructions to the model):
  reasoning   `<think>\\nTEXT\\n</think>\\n\\n` at the start of the answer; a template that opens the
              block itself (Qwen 3.5 with thinking on ends the prompt in `<think>\\n`) makes the answer
              start inside it, so `thinking=True` starts the parser there.
  a tool call JSON (Qwen 2.5 / Qwen 3 / QwQ):
                `<tool_call>\\n{"name": "get_weather", "arguments": {"city": "Paris"}}\\n</tool_call>`
              XML (Qwen3-Coder / Qwen 3.5):
                `<tool_call>\\n<function=get_weather>\\n<parameter=city>\\nParis\\n</parameter>\\n`
                `</function>\\n</tool_call>`
              (a parameter's value is text; it becomes a JSON value unless the tool's schema says it is a
              string). Several calls follow one another, whitespace between them.
Streaming rule: text that may be the start of a tag is held back until the next piece says whether it is
one, so no event ever carries part of a tag; a tool call is one event, when its closing tag arrives. A
block that does not parse as a call (bad JSON, no name) is given back as content, tags included, as is an
unclosed one at the end unless its body is a complete call (the answer was cut right after it). With
`tools=None` only reasoning is parsed, and the content is the text exactly (joined events == the text
minus the reasoning block); with tools, whitespace around calls is dropped from the content.
"""
from __future__ import annotations

import json
import re
import secrets
import string
from dataclasses import dataclass, field

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"

_ALNUM = string.ascii_letters + string.digits


def new_call_id() -> str:
    """An OpenAI-style tool call id: call_ and 24 letters or digits."""
    return "call_" + "".join(secrets.choice(_ALNUM) for _ in range(24))


@dataclass
class ToolCall:
    name: str
    arguments: str                    # a JSON object, as text (OpenAI's `function.arguments`)
    id: str = field(default_factory=new_call_id)

    def to_openai(self) -> dict:
        """The `message.tool_calls[i]` shape."""
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


@dataclass
class Event:
    kind: str                         # "content" | "reasoning" | "tool_call"
    text: str = ""
    call: ToolCall | None = None


def prompt_ends_in_think(prompt_text: str) -> bool:
    """Whether a rendered chat prompt leaves the answer inside an open reasoning block (Qwen 3.5's
    template with thinking on ends the prompt in `<think>\\n`; with thinking off, in an empty closed one)."""
    tail = prompt_text.rstrip()
    return tail.endswith(THINK_OPEN)


# ------------------------------------------------------------------------------------ one call


_XML_FUNCTION = re.compile(r"<function=([^>\n]+)>(.*?)(?:</function>|$)", re.S)
_XML_PARAMETER = re.compile(r"<parameter=([^>\n]+)>\n?(.*?)\n?(?:</parameter>|(?=<parameter=)|$)", re.S)


def _schema_types(tools: list[dict] | None, name: str) -> dict[str, object]:
    """{parameter: its JSON-schema "type"} of the tool called `name` (empty when unknown)."""
    for t in tools or ():
        fn = t.get("function") if isinstance(t, dict) else None
        if isinstance(fn, dict) and fn.get("name") == name:
            props = (fn.get("parameters") or {}).get("properties") if isinstance(fn.get("parameters"), dict) else None
            if isinstance(props, dict):
                return {k: v.get("type") for k, v in props.items() if isinstance(v, dict)}
    return {}


def _xml_value(raw: str, declared) -> object:
    if declared == "string" or (isinstance(declared, list) and "string" in declared and len(declared) == 1):
        return raw
    try:
        return json.loads(raw)
    except ValueError:
        return raw


def parse_tool_call(body: str, tools: list[dict] | None = None) -> ToolCall | None:
    """The call in the text between `<tool_call>` and `</tool_call>`, or None when it is none."""
    text = body.strip()
    if text.startswith("{"):
        try:
            obj = json.loads(text)
        except ValueError:
            return None
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
            return None
        args = obj.get("arguments", obj.get("parameters", {}))
        if isinstance(args, str):            # a model that writes the arguments as a JSON string
            try:
                args = json.loads(args)
            except ValueError:
                return None
        if args is None:
            args = {}
        if not isinstance(args, dict):
            return None
        return ToolCall(obj["name"], json.dumps(args, ensure_ascii=False))
    m = _XML_FUNCTION.search(text)
    if m is None or text[:m.start()].strip():
        return None
    name = m.group(1).strip()
    if not name:
        return None
    types = _schema_types(tools, name)
    args = {}
    for p in _XML_PARAMETER.finditer(m.group(2)):
        key = p.group(1).strip()
        args[key] = _xml_value(p.group(2), types.get(key))
    return ToolCall(name, json.dumps(args, ensure_ascii=False))


# ------------------------------------------------------------------------------------ the stream


def _held_prefix(text: str, tags: tuple[str, ...]) -> int:
    """Length of the longest suffix of text that is a proper prefix of one of tags."""
    best = 0
    for tag in tags:
        for n in range(min(len(tag) - 1, len(text)), best, -1):
            if text.endswith(tag[:n]):
                best = n
                break
    return best


class AnswerParser:
    """Splits a chat answer's text, as it streams, into content, reasoning and tool calls (the module
    docstring gives the formats and the streaming rule). tools: the request's tools (None: tool calls
    are not parsed); thinking: the answer starts inside a reasoning block."""

    def __init__(self, tools: list[dict] | None = None, thinking: bool = False):
        self.tools = tools
        self.parse_calls = tools is not None
        self.mode = "think" if thinking else "content"
        self.tool_calls: list[ToolCall] = []
        self._buf = ""
        self._seen_content = False      # a <think> is taken only before any content
        self._after_think = False       # drop the blank lines that follow </think>
        self._think_start = thinking    # and the line break that follows <think>
        self._ws = ""                   # the whitespace dropped before the open call block

    def _open_tags(self) -> tuple[str, ...]:
        tags = []
        if not self._seen_content and not self.tool_calls:
            tags.append(THINK_OPEN)
        if self.parse_calls:
            tags.append(CALL_OPEN)
        return tuple(tags)

    def _content(self, text: str, out: list[Event]) -> None:
        if self._after_think:
            text = text.lstrip("\n")
            if not text:
                return
            self._after_think = False
        if text:
            if text.strip():
                self._seen_content = True
            out.append(Event("content", text))

    def feed(self, text: str) -> list[Event]:
        out: list[Event] = []
        self._buf += text
        while self._buf:
            if self.mode == "content":
                tags = self._open_tags()
                hits = sorted((self._buf.find(t), t) for t in tags if t in self._buf)
                if hits:
                    at, tag = hits[0]
                    before = self._buf[:at]
                    if tag == THINK_OPEN and before.strip():
                        self._seen_content = True      # content came first: no reasoning block now
                        continue
                    if tag == CALL_OPEN:
                        # whitespace before a call is dropped, unless the block is no call after all
                        self._ws = before[len(before.rstrip()):]
                        if before.strip():
                            self._content(before.rstrip(), out)
                    self._buf = self._buf[at + len(tag):]
                    self.mode = "think" if tag == THINK_OPEN else "call"
                    self._think_start = tag == THINK_OPEN
                    continue
                keep = _held_prefix(self._buf, tags)
                body = self._buf[:len(self._buf) - keep]
                if self.parse_calls or (THINK_OPEN in tags and not body.strip()):
                    keep += len(body) - len(body.rstrip())     # whitespace may precede a tag: hold it
                self._content(self._buf[:len(self._buf) - keep], out)
                self._buf = self._buf[len(self._buf) - keep:]
                break
            if self.mode == "think":
                if self._think_start:                 # the block's first line break is the format's
                    self._buf = self._buf.lstrip("\n")
                    if not self._buf:
                        break
                    self._think_start = False
                at = self._buf.find(THINK_CLOSE)
                if at >= 0:
                    reasoning = self._buf[:at].rstrip("\n")
                    if reasoning:
                        out.append(Event("reasoning", reasoning))
                    self._buf = self._buf[at + len(THINK_CLOSE):]
                    self.mode = "content"
                    self._after_think = True
                    continue
                keep = _held_prefix(self._buf, (THINK_CLOSE,))
                body = self._buf[:len(self._buf) - keep]
                keep += len(body) - len(body.rstrip("\n"))    # line breaks that may precede </think>
                emit, self._buf = self._buf[:len(self._buf) - keep], self._buf[len(self._buf) - keep:]
                if emit:
                    out.append(Event("reasoning", emit))
                break
            # mode "call": everything up to the closing tag is the call
            at = self._buf.find(CALL_CLOSE)
            if at < 0:
                break
            self._end_call(self._buf[:at], True, out)
            self._buf = self._buf[at + len(CALL_CLOSE):]
            self.mode = "content"
        return out

    def _end_call(self, body: str, closed: bool, out: list[Event]) -> None:
        call = parse_tool_call(body, self.tools)
        if call is None:
            self._content(self._ws + CALL_OPEN + body + (CALL_CLOSE if closed else ""), out)
            return
        self.tool_calls.append(call)
        out.append(Event("tool_call", call=call))

    def close(self) -> list[Event]:
        """The end of the answer: what was held back."""
        out: list[Event] = []
        buf, self._buf = self._buf, ""
        if self.mode == "call":
            self._end_call(buf, False, out)
        elif self.mode == "think":
            text = buf.lstrip("\n") if self._think_start else buf
            if text.rstrip("\n"):
                out.append(Event("reasoning", text.rstrip("\n")))
        elif buf and not (self.tool_calls and not buf.strip()):
            self._content(buf, out)
        self.mode = "content"
        return out


def split_answer(text: str, tools: list[dict] | None = None, thinking: bool = False):
    """(content, reasoning, tool_calls) of a whole answer: what the stream's events add up to;
    content and reasoning are None when empty."""
    p = AnswerParser(tools, thinking)
    events = p.feed(text) + p.close()
    content = "".join(e.text for e in events if e.kind == "content")
    reasoning = "".join(e.text for e in events if e.kind == "reasoning")
    return content or None, reasoning or None, p.tool_calls
