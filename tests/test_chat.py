"""Chat templates: pyrunner.chat renders exactly what transformers' apply_chat_template renders.

The oracle is a real transformers tokenizer (a tiny word-level one carrying the template and the
special tokens) and its apply_chat_template(tokenize=False). The templates are the real Qwen ones
that llama.cpp keeps for its own tests, read from the llama-cpp-python 0.3.36 source archive (a
declared test resource: downloaded once with pip into build/test-cache/, never committed).
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

import pytest

from pyrunner.chat import (CHATML_TEMPLATE, ChatTemplateError, chat_template_from_metadata,
                           render_chat)

REPO = Path(__file__).resolve().parents[1]
CACHE = REPO / "build" / "test-cache"
SDIST_VERSION = "0.3.36"
SDIST = CACHE / f"llama_cpp_python-{SDIST_VERSION}.tar.gz"
TEMPLATE_DIR = CACHE / f"llama-cpp-python-{SDIST_VERSION}-qwen-templates"
TEMPLATE_PREFIX = "vendor/llama.cpp/models/templates/"
# Every Qwen template in that archive: Qwen 3.5, Qwen 3 (thinking, coder), QwQ, Qwen 2.5.
TEMPLATES = ["Qwen3.5-4B", "Qwen-Qwen3-0.6B", "Qwen3-Coder", "Qwen-QwQ-32B",
             "Qwen-Qwen2.5-7B-Instruct"]


# --------------------------------------------------------------------------- resources

def _download_sdist() -> None:
    CACHE.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="download-", dir=CACHE))
    try:
        cmd = [sys.executable, "-m", "pip", "download", "--no-binary", ":all:", "--no-deps",
               f"llama-cpp-python=={SDIST_VERSION}", "-d", str(tmp)]
        try:
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
        except (OSError, subprocess.TimeoutExpired) as e:
            pytest.fail(f"could not download the llama-cpp-python {SDIST_VERSION} source archive "
                        f"(the Qwen chat templates come from it): {' '.join(cmd)} -> {e}")
        got = tmp / SDIST.name
        if r.returncode != 0 or not got.exists():
            tail = (r.stdout + r.stderr).strip().splitlines()[-15:]
            pytest.fail(f"could not download the llama-cpp-python {SDIST_VERSION} source archive "
                        f"(the Qwen chat templates come from it; it needs the package index): "
                        f"`{' '.join(cmd)}` exited {r.returncode}:\n" + "\n".join(tail))
        os.replace(got, SDIST)  # atomic: a half-written archive is never seen as the cache
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


@pytest.fixture(scope="session")
def qwen_templates() -> dict[str, str]:
    if not all((TEMPLATE_DIR / f"{n}.jinja").exists() for n in TEMPLATES):
        if not SDIST.exists():
            _download_sdist()
        tmp = Path(tempfile.mkdtemp(prefix="extract-", dir=CACHE))
        try:
            with tarfile.open(SDIST) as tar:
                for m in tar.getmembers():
                    _, _, rel = m.name.partition("/")
                    if m.isfile() and rel.startswith(TEMPLATE_PREFIX) and \
                            rel[len(TEMPLATE_PREFIX):].removesuffix(".jinja") in TEMPLATES:
                        (tmp / Path(rel).name).write_bytes(tar.extractfile(m).read())
            missing = [n for n in TEMPLATES if not (tmp / f"{n}.jinja").exists()]
            if missing:
                pytest.fail(f"{SDIST} has no {', '.join(missing)} template under "
                            f"<root>/{TEMPLATE_PREFIX}; delete it so that the test downloads it again")
            shutil.rmtree(TEMPLATE_DIR, ignore_errors=True)
            os.replace(tmp, TEMPLATE_DIR)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return {n: (TEMPLATE_DIR / f"{n}.jinja").read_text(encoding="utf-8") for n in TEMPLATES}


def _oracle(template: str, **special):
    """A transformers tokenizer that carries `template` and the given special tokens."""
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, **{t: i + 1 for i, t in enumerate(special.values())}}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    return PreTrainedTokenizerFast(tokenizer_object=backend, chat_template=template, **special)


def _hf_render(tok, messages, **kw):
    """(text, None) from apply_chat_template, or (None, exception) when it raises."""
    try:
        return tok.apply_chat_template(messages, tokenize=False, **kw), None
    except Exception as e:  # the template's raise_exception, jinja errors, TypeErrors
        return None, e


# --------------------------------------------------------------------------- conversations

NON_ASCII = ("你好，世界！日本語のテキスト。🙂👍🏽 café (e\u0301) ¿Qué tal? Привет "
             "שָׁלוֹם <tag> & \"quotes\" \\ back\tslash\n\n  indented")

TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather",
        "description": "Current weather for a city — returns °C.",
        "parameters": {"type": "object", "required": ["city"], "properties": {
            "city": {"type": "string", "description": "City name, e.g. 東京"},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
        }},
    }},
    {"type": "function", "function": {
        "name": "search",
        "description": "Search the web.",
        "parameters": {"type": "object", "properties": {
            "query": {"type": "string"},
            "filters": {"type": "object", "properties": {"site": {"type": "string"}}},
            "limit": {"type": "integer", "minimum": 1},
        }},
    }},
]

TOOL_TURNS = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "Weather in Tokyo and Paris? Also search for news."},
    {"role": "assistant", "content": None, "tool_calls": [
        {"type": "function", "function": {"name": "get_weather",
                                          "arguments": {"city": "東京", "unit": "celsius"}}},
        {"type": "function", "function": {"name": "search",
                                          "arguments": {"query": "news <today>", "limit": 3,
                                                        "filters": {"site": "example.org"}}}},
    ]},
    {"role": "tool", "content": '{"temp": 21, "sky": "晴れ"}'},
    {"role": "tool", "content": "[\"headline one\", \"headline two\"]"},
    {"role": "assistant", "content": "Tokyo is 21 °C and sunny. Headlines: one, two."},
    {"role": "user", "content": "Thanks! And Paris?"},
    {"role": "assistant", "content": "Let me check.", "tool_calls": [
        {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}},
    ]},
    {"role": "tool", "content": "{\"temp\": 14}"},
]

# (id, messages, tools, must_render): must_render=True means transformers renders it with every
# template, so the comparison is of text, never just of two failures.
CASES = [
    ("system_user", [
        {"role": "system", "content": "You are Qwen."},
        {"role": "user", "content": "Hello!"}], None, True),
    ("user_non_ascii", [{"role": "user", "content": NON_ASCII}], None, True),
    ("multi_turn", [
        {"role": "system", "content": "Answer briefly."},
        {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "content": "4"},
        {"role": "user", "content": "And 3+3?"},
        {"role": "assistant", "content": "<think>\nAdd three to three.\n</think>\n\n6"},
        {"role": "user", "content": "Say it in Chinese: " + NON_ASCII[:6]}], None, True),
    ("ends_with_assistant", [
        {"role": "user", "content": "Name a colour."},
        {"role": "assistant", "content": "<think>\nPick one.\n</think>\n\nBlue."}], None, True),
    ("reasoning_field", [
        {"role": "user", "content": "Why is the sky blue?"},
        {"role": "assistant", "content": "Rayleigh scattering.",
         "reasoning_content": "Short wavelengths scatter more."},
        {"role": "user", "content": "And sunsets?"},
        {"role": "assistant", "content": "Longer path, red light.", "reasoning": "Path length."}],
     None, True),
    ("tools_and_calls", TOOL_TURNS, TOOLS, False),  # Qwen 3 and QwQ need content on every message
    ("tools_and_calls_empty_content",
     [{**m, "content": ""} if m["content"] is None else m for m in TOOL_TURNS], TOOLS, True),
    ("tools_no_system", [{"role": "user", "content": "Weather in Oslo?"}], TOOLS, True),
    ("tool_call_json_string_args", [
        {"role": "user", "content": "Weather in Rome?"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "get_weather", "arguments": "{\"city\": \"Roma\"}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "{\"temp\": 25}"}], TOOLS, False),
    ("content_parts", [
        {"role": "system", "content": [{"type": "text", "text": "Be terse."}]},
        {"role": "user", "content": [{"type": "text", "text": "Part one. "},
                                     {"type": "text", "text": "Part two ✓"}]}], None, False),
    ("no_user_message", [{"role": "system", "content": "Only a system prompt."}], None, False),
]

THINKING = [{}, {"enable_thinking": True}, {"enable_thinking": False}]


@pytest.mark.parametrize("name", TEMPLATES)
def test_qwen_templates_match_transformers(qwen_templates, name):
    template = qwen_templates[name]
    tok = _oracle(template, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    rendered = failures = 0
    for case_id, messages, tools, must_render in CASES:
        for agp in (False, True):
            for extra in THINKING:
                what = f"{name} / {case_id} / add_generation_prompt={agp} / {extra or 'default'}"
                want, err = _hf_render(tok, messages, tools=tools, add_generation_prompt=agp, **extra)
                if err is not None:
                    assert not must_render, f"{what}: transformers failed: {err!r}"
                    with pytest.raises(ChatTemplateError):
                        render_chat(template, messages, tools=tools, add_generation_prompt=agp,
                                    eos_token="<|im_end|>", pad_token="<|endoftext|>", **extra)
                    failures += 1
                    continue
                got = render_chat(template, messages, tools=tools, add_generation_prompt=agp,
                                  eos_token="<|im_end|>", pad_token="<|endoftext|>", **extra)
                assert got == want, what
                rendered += 1
    # most of the matrix is text compared with text, not failure compared with failure
    assert rendered >= 6 * len(THINKING) * 2 and rendered > 2 * failures


def test_qwen35_features_are_exercised(qwen_templates):
    """The matrix above would pass vacuously if a variable never reached the template; check that
    the ones it varies change the Qwen 3.5 prompt the way the template says."""
    t = qwen_templates["Qwen3.5-4B"]
    msgs = [{"role": "user", "content": "Hi"}]
    assert render_chat(t, msgs).endswith("<|im_start|>assistant\n<think>\n")
    assert render_chat(t, msgs, enable_thinking=False).endswith(
        "<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert render_chat(t, msgs, add_generation_prompt=False) == "<|im_start|>user\nHi<|im_end|>\n"
    with_tools = render_chat(t, TOOL_TURNS, tools=TOOLS)
    assert '"description": "City name, e.g. 東京"' in with_tools  # tojson without ASCII escapes
    assert "<parameter=filters>\n{\"site\": \"example.org\"}\n</parameter>" in with_tools
    assert "<|im_start|>user\n<tool_response>\n{\"temp\": 21, \"sky\": \"晴れ\"}\n</tool_response>" \
           "\n<tool_response>\n" in with_tools
    with pytest.raises(ChatTemplateError, match="No user query found in messages"):
        render_chat(t, [{"role": "system", "content": "alone"}])


# --------------------------------------------------------------------------- environment

# Exercises what transformers adds to jinja: bos/eos variables, tojson and its arguments,
# strftime_now, dict, namespace, loop controls, the generation tag, trim/lstrip of block tags,
# tools/documents passed as None, None-valued keys dropped, reasoning aliases.
ENV_TEMPLATE = """{{ bos_token }}
{% set ns = namespace(n=0, seen=[]) %}
{% for m in messages %}
    {% if m.role == 'skip' %}{% continue %}{% endif %}
    {% if m.role == 'stop' %}{% break %}{% endif %}
    {% set ns.n = ns.n + 1 %}
[{{ loop.index }}:{{ m.role }}] content_defined={{ m.content is defined }}
    {% if m.thinking is defined %}thinking={{ m.thinking }} rc={{ m.reasoning_content }}{% endif %}
    {% generation %}{{ m.content | default('') }}{% endgeneration %}
{% endfor %}
n={{ ns.n }} tools={{ tools is defined }}/{{ tools is none }} documents={{ documents }}
{{ {"b": "<&>'", "a": [1, 2.5, none, true], "é": "ü"} | tojson }}
{{ {"b": 1, "a": [1, 2]} | tojson(indent=2, sort_keys=true) }}
{{ {"b": "é", "a": 1} | tojson(ensure_ascii=true, separators=(",", ":")) }}
{{ dict(x=1, y=[2]) | tojson }} {{ dict.fromkeys(["k1", "k2"], 0) | tojson }}
year={{ strftime_now("%Y") }} extra={{ extra | tojson }} think={{ enable_thinking }}
{%- if add_generation_prompt %}
<gen>{{ eos_token }}
{%- endif %}
"""


def test_environment_matches_transformers():
    import numpy as np

    messages = [
        {"role": "user", "content": "a <b> & c", "name": None},
        {"role": "skip", "content": "never shown"},
        {"role": "assistant", "content": None, "reasoning": "why"},
        {"role": "assistant", "content": "x", "thinking": "own", "reasoning_content": "rc"},
        {"role": "stop", "content": "end"},
        {"role": "user", "content": "after stop"},
    ]
    extra = {"n": np.int64(3), "f": np.float32(0.5), "nested": ({"t": (1, 2)},)}
    for agp in (False, True):
        for special in ({"bos_token": "<s>", "eos_token": "</s>"}, {}):
            tok = _oracle(ENV_TEMPLATE, **special)
            want, err = _hf_render(tok, messages, add_generation_prompt=agp, extra=extra,
                                   enable_thinking=False)
            assert err is None, err
            got = render_chat(ENV_TEMPLATE, messages, add_generation_prompt=agp, extra=extra,
                              enable_thinking=False, **special)
            assert got == want, (agp, special)
    assert "thinking=why rc=why" in got and "thinking=own rc=rc" in got
    assert '"<&>\'"' in got and "[1, 2.5, null, true]" in got and '"é": "ü"' in got
    assert '{"b":"\\u00e9","a":1}' in got and "content_defined=False" in got


@pytest.mark.parametrize("template,match", [
    ("{% for m in messages %}{{ m.content }", "does not parse.*line 1"),
    ("ok\n{{ raise_exception('Only user and assistant roles are supported!') }}",
     "rejected this conversation: Only user and assistant roles are supported!"),
    ("line one\n{{ messages[0].content.nope() }}", "line 2.*UndefinedError"),
    ("{{ messages.append(1) }}", "SecurityError"),          # the sandbox is immutable
    ("{{ ''.__class__.__mro__ }}", "SecurityError"),        # and keeps templates inside
    ("{% set ns = namespace(_x=1) %}", "underscore-prefixed"),
    ("{{ {1: 2, 'a': 3} | tojson(sort_keys=true) }}", "TypeError"),
])
def test_template_errors_are_clear_and_match_transformers(template, match):
    messages = [{"role": "user", "content": "hi"}]
    _, err = _hf_render(_oracle(template), messages)
    assert err is not None, "transformers accepted a template that should fail"
    with pytest.raises(ChatTemplateError, match=match):
        render_chat(template, messages)


def test_bad_inputs_say_what_is_wrong():
    with pytest.raises(ChatTemplateError, match="empty conversation"):
        render_chat(CHATML_TEMPLATE, [])
    with pytest.raises(ChatTemplateError, match="message 1 is a str"):
        render_chat(CHATML_TEMPLATE, [{"role": "user", "content": "a"}, "b"])
    with pytest.raises(ChatTemplateError, match="list of JSON-schema dicts"):
        render_chat(CHATML_TEMPLATE, [{"role": "user", "content": "a"}], tools=[len])
    with pytest.raises(ChatTemplateError, match="no chat template.*tools"):
        render_chat(None, [{"role": "user", "content": "a"}], tools=TOOLS)


# --------------------------------------------------------------------------- ChatML fallback

CHATML_MESSAGES = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": NON_ASCII},
    {"role": "assistant", "content": "OK"},
    {"role": "user", "content": [{"type": "text", "text": "one "}, {"type": "image"},
                                 {"type": "text", "text": "two"}]},
]


@pytest.mark.parametrize("template", [None, ""])
def test_chatml_fallback(template):
    body = ("<|im_start|>system\nBe brief.<|im_end|>\n"
            f"<|im_start|>user\n{NON_ASCII}<|im_end|>\n"
            "<|im_start|>assistant\nOK<|im_end|>\n"
            "<|im_start|>user\none two<|im_end|>\n")
    assert render_chat(template, CHATML_MESSAGES, add_generation_prompt=False) == body
    assert render_chat(template, CHATML_MESSAGES) == body + "<|im_start|>assistant\n"
    # the fallback is rendered by the same machinery transformers would use for it
    tok = _oracle(CHATML_TEMPLATE, eos_token="<|im_end|>")
    for agp in (False, True):
        assert render_chat(template, CHATML_MESSAGES, add_generation_prompt=agp) == \
            tok.apply_chat_template(CHATML_MESSAGES, tokenize=False, add_generation_prompt=agp)
    with pytest.raises(ChatTemplateError, match="message 0 has no role"):
        render_chat(template, [{"content": "who am I"}])


# --------------------------------------------------------------------------- GGUF metadata

def test_template_from_metadata():
    meta = {"tokenizer.chat_template": "DEFAULT", "tokenizer.chat_template.tool_use": "TOOLS",
            "tokenizer.chat_template.rag": "RAG", "general.name": "x"}
    assert chat_template_from_metadata(meta) == "DEFAULT"
    assert chat_template_from_metadata(meta, tools=TOOLS) == "TOOLS"
    assert chat_template_from_metadata(meta, name="rag") == "RAG"
    assert chat_template_from_metadata(meta, name="default", tools=TOOLS) == "DEFAULT"
    with pytest.raises(ChatTemplateError, match="no chat template named 'nope'.*'default', 'rag', 'tool_use'"):
        chat_template_from_metadata(meta, name="nope")
    assert chat_template_from_metadata({"general.name": "x"}) is None
    assert chat_template_from_metadata({"tokenizer.chat_template": ""}) is None
    # the selection agrees with transformers' among a tokenizer's named templates
    tok = _oracle("unused")
    tok.chat_template = {"default": "DEFAULT", "tool_use": "TOOLS", "rag": "RAG"}
    assert tok.get_chat_template(tools=TOOLS) == chat_template_from_metadata(meta, tools=TOOLS)
    assert tok.get_chat_template() == chat_template_from_metadata(meta)
    assert tok.get_chat_template("default", tools=TOOLS) == \
        chat_template_from_metadata(meta, name="default", tools=TOOLS)


# --------------------------------------------------------------------------- continuing a reply

@pytest.mark.parametrize("name", ["Qwen3.5-4B", "Qwen-Qwen2.5-7B-Instruct", "Qwen3-Coder"])
@pytest.mark.parametrize("partial", [
    "The answer is", "The answer is ", "答えは：", [{"type": "text", "text": "Part "},
                                                  {"type": "text", "text": "one, and"}]])
def test_continue_final_message_matches_transformers(qwen_templates, name, partial):
    template = qwen_templates[name]
    messages = [{"role": "user", "content": "What is 6×7?"},
                {"role": "assistant", "content": partial}]
    tok = _oracle(template, eos_token="<|im_end|>")
    want, err = _hf_render(tok, messages, continue_final_message=True)
    if err is not None:  # list content with a template that only takes strings
        assert isinstance(partial, list) and name != "Qwen3.5-4B", err
        with pytest.raises(ChatTemplateError):
            render_chat(template, messages, continue_final_message=True, eos_token="<|im_end|>")
        return
    got = render_chat(template, messages, continue_final_message=True, eos_token="<|im_end|>")
    assert got == want
    assert not got.endswith("<|im_end|>\n") and "CONTINUE_FINAL_MESSAGE_TAG" not in got


def test_continue_final_message_errors(qwen_templates):
    t = qwen_templates["Qwen3.5-4B"]
    msgs = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hel"}]
    assert render_chat(t, msgs, continue_final_message=True).endswith("<think>\n\n</think>\n\nHel")
    with pytest.raises(ChatTemplateError, match="exclude each other"):
        render_chat(t, msgs, continue_final_message=True, add_generation_prompt=True)
    with pytest.raises(ChatTemplateError, match="no 'reasoning_content' to continue"):
        render_chat(t, msgs, continue_final_message="reasoning_content")
    with pytest.raises(ChatTemplateError, match="never reads 'summary'"):
        render_chat(t, msgs + [{"role": "user", "content": "x", "summary": "s"}],
                    continue_final_message="summary")
    # reasoning continued through its alias: the template reads reasoning_content
    thinking = [*msgs[:1], {"role": "assistant", "content": "", "reasoning": "Let me"}]
    cont = render_chat(t, thinking, continue_final_message="reasoning")
    assert cont.endswith("<|im_start|>assistant\n<think>\nLet me")
    assert cont == _oracle(t).apply_chat_template(thinking, tokenize=False,
                                                  continue_final_message="reasoning")
