"""`strata serve` (pyrunner/server.py, pyrunner/toolcalls.py) through the official openai client on
loopback ports, on the shipped flash-small model: greedy completions and chat equal generate() (and the
CLI's `strata generate --temp 0`), streaming with usage, logprobs, concurrent streaming clients equal
sequential greedy runs, auth, 400 / 404 / 405 bodies, 503 + Retry-After under overload, a client that
disconnects frees its sequence, tool calls and reasoning (parser on crafted text, the server's stream on a
fake piece source, the real model with tools), /metrics parsed, a bounded load test with nothing lost, and
SIGTERM on the real CLI. No speed assertions."""
from __future__ import annotations

import collections
import http.client
import json
import os
import re
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import openai
import pytest

from pyrunner import Model
from pyrunner.engine import Engine, Piece
from pyrunner.generate import Completion, end_of_generation_ids, generate, prompt_ids, render_messages
from pyrunner.models import shipped_model_path
from pyrunner.server import BackgroundServer, create_app
from pyrunner.toolcalls import AnswerParser, parse_tool_call, prompt_ends_in_think, split_answer

MODEL = shipped_model_path()
pytestmark = pytest.mark.skipif(MODEL is None, reason="the shipped flash-small model is not here")

PROMPTS = ["def read_config(path):", "import os\n\n\ndef main():", "class Stack:\n    def push(self, x):",
           "# Parse the command line\n", "for i in range(10):", 'if __name__ == "__main__":']
N = 12           # max_tokens of the greedy comparisons
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                   "required": ["city"]}}}]


# ------------------------------------------------------------------------------------ fixtures


@pytest.fixture(scope="module")
def model():
    with Model(MODEL, threads=2, n_ctx=1024) as m:
        yield m


@pytest.fixture(scope="module")
def greedy(model):
    """generate()'s greedy text of each prompt (the reference every server answer is held to)."""
    return {p: generate(model, p, max_tokens=N, temperature=0).text for p in PROMPTS}


@pytest.fixture(scope="module")
def engine(model):
    eng = Engine(model, max_seqs=4)
    yield eng
    eng.close()


@pytest.fixture(scope="module")
def server(engine, model):
    with BackgroundServer(create_app(engine, model), grace_s=2) as s:
        yield s


def client(s, key="none", **kw) -> openai.OpenAI:
    return openai.OpenAI(base_url=s.url + "/v1", api_key=key, max_retries=0, timeout=60, **kw)


def raw(s, method, path, body=None, headers=None):
    """(status, headers, parsed JSON or text) of one plain HTTP request."""
    c = http.client.HTTPConnection("127.0.0.1", s.port, timeout=60)
    if isinstance(body, (dict, list)):
        body = json.dumps(body)
        headers = {"Content-Type": "application/json", **(headers or {})}
    c.request(method, path, body=body, headers=headers or {})
    r = c.getresponse()
    data = r.read()
    c.close()
    try:
        data = json.loads(data)
    except ValueError:
        data = data.decode()
    return r.status, {k.lower(): v for k, v in r.getheaders()}, data


def metrics(s, headers=None) -> dict:
    """/metrics as {name or name{labels}: value}, every line checked against the exposition format."""
    status, _, text = raw(s, "GET", "/metrics", headers=headers)
    assert status == 200, text
    out, typed = {}, set()
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ")
            assert kind in ("counter", "gauge")
            typed.add(name)
        elif line.startswith("# HELP "):
            continue
        else:
            m = re.fullmatch(r'([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[a-z_]+="[^"]*"(,[a-z_]+="[^"]*")*\})? (\S+)', line)
            assert m, f"not a Prometheus sample line: {line!r}"
            assert m.group(1) in typed, f"{m.group(1)} has no # TYPE line before it"
            out[m.group(1) + (m.group(2) or "")] = float(m.group(4))
    return out


def wait_for(cond, timeout=15.0, what="the condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.05)
    raise AssertionError(f"{what} did not hold within {timeout} s")


def no_eos(model) -> dict:
    """logit_bias (JSON form) that keeps the model from ending on its own."""
    return {str(t): -100 for t in end_of_generation_ids(model)}


# ------------------------------------------------------------------------------------ completions


def test_completion_equals_generate(server, greedy):
    c = client(server)
    for p in PROMPTS[:3]:
        r = c.completions.create(model="anything", prompt=p, max_tokens=N, temperature=0)
        assert r.object == "text_completion" and r.model == "anything"
        assert r.choices[0].text == greedy[p]
        assert r.choices[0].finish_reason in ("stop", "length")
        assert r.usage.completion_tokens <= N and r.usage.prompt_tokens > 0
        assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens


def test_completion_stream_with_usage(server, greedy):
    p = PROMPTS[1]
    chunks = list(client(server).completions.create(model="m", prompt=p, max_tokens=N, temperature=0, stream=True,
                                                    stream_options={"include_usage": True}))
    assert all(ch.object == "text_completion" for ch in chunks)
    assert "".join(ch.choices[0].text for ch in chunks if ch.choices) == greedy[p]
    assert chunks[-2].choices[0].finish_reason in ("stop", "length")
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens <= N
    assert all(ch.usage is None for ch in chunks[:-1])


def test_completion_logprobs_and_echo(server, greedy):
    c = client(server)
    r = c.completions.create(model="m", prompt=PROMPTS[0], max_tokens=6, temperature=0, logprobs=2)
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == r.usage.completion_tokens
    assert "".join(lp.tokens) == r.choices[0].text
    assert all(x <= 0 for x in lp.token_logprobs) and all(len(t) <= 2 for t in lp.top_logprobs)
    assert lp.text_offset[0] == 0 and lp.text_offset[1] == len(lp.tokens[0])
    # greedy: the chosen token is the most likely one
    assert all(max(t.values()) == pytest.approx(x) for t, x in zip(lp.top_logprobs, lp.token_logprobs))
    r = c.completions.create(model="m", prompt=PROMPTS[0], max_tokens=N, temperature=0, echo=True)
    assert r.choices[0].text == PROMPTS[0] + greedy[PROMPTS[0]]


def test_token_id_prompt(server, model, greedy):
    ids = prompt_ids(model, PROMPTS[2])          # what the text prompt tokenizes to (specials included)
    r = client(server).completions.create(model="m", prompt=ids, max_tokens=N, temperature=0)
    assert r.choices[0].text == greedy[PROMPTS[2]]


# ------------------------------------------------------------------------------------ chat


def chat_reference(model, messages, n, tools=None):
    text = render_messages(model, messages, tools=tools)
    return generate(model, prompt_ids(model, text, add_special=False), max_tokens=n, temperature=0).text


def test_chat_equals_generate_on_the_template(server, model):
    messages = [{"role": "system", "content": "You write Python."}, {"role": "user", "content": "A stack class"}]
    want = chat_reference(model, messages, N)
    c = client(server)
    r = c.chat.completions.create(model="gpt-4o", messages=messages, max_tokens=N, temperature=0)
    assert r.object == "chat.completion" and r.model == "gpt-4o"
    msg = r.choices[0].message
    assert msg.role == "assistant" and msg.content == want and not msg.tool_calls
    chunks = list(c.chat.completions.create(model="m", messages=messages, max_completion_tokens=N, temperature=0,
                                            stream=True, stream_options={"include_usage": True}))
    assert all(ch.object == "chat.completion.chunk" for ch in chunks)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices) == want
    assert chunks[-2].choices[0].finish_reason in ("stop", "length")
    assert chunks[-1].choices == [] and chunks[-1].usage.prompt_tokens == r.usage.prompt_tokens


def test_chat_logprobs(server):
    r = client(server).chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}],
                                               max_tokens=5, temperature=0, logprobs=True, top_logprobs=3)
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens
    assert "".join(t.token for t in content) == r.choices[0].message.content
    for t in content:
        assert bytes(t.bytes).decode("utf-8", "replace") == t.token and len(t.top_logprobs) == 3
        assert t.top_logprobs[0].logprob == pytest.approx(t.logprob)


def test_chat_accepts_openai_fields_that_do_not_apply(server):
    r = client(server).chat.completions.create(
        model="m", max_tokens=4, temperature=0.7, seed=3, top_p=0.9, stop=["\n\n\n", "zzz"], user="u1",
        response_format={"type": "text"}, metadata={"k": "v"}, store=False, parallel_tool_calls=True,
        service_tier="auto", presence_penalty=0.1, frequency_penalty=0.1, logit_bias={"0": -1},
        extra_body={"top_k": 20, "min_p": 0.1, "repeat_penalty": 1.1},
        messages=[{"role": "developer", "content": [{"type": "text", "text": "Be terse."}]},
                  {"role": "user", "content": "hi", "name": "ann"},
                  {"role": "assistant", "content": None, "tool_calls": [
                      {"id": "call_1", "type": "function",
                       "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
                  {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}])
    assert r.choices[0].finish_reason in ("stop", "length")


def test_seeded_sampling_is_reproducible(server):
    c = client(server)
    a, b = (c.completions.create(model="m", prompt=PROMPTS[3], max_tokens=N, temperature=0.9, seed=7)
            for _ in range(2))
    assert a.choices[0].text == b.choices[0].text


# ------------------------------------------------------------------------------------ many clients


def test_concurrent_streaming_clients_equal_sequential_greedy_runs(server, greedy):
    c = client(server)

    def run(p):
        s = c.completions.create(model="m", prompt=p, max_tokens=N, temperature=0, stream=True)
        return "".join(ch.choices[0].text for ch in s)
    with ThreadPoolExecutor(len(PROMPTS)) as pool:
        got = list(pool.map(run, PROMPTS))
    assert got == [greedy[p] for p in PROMPTS]


def test_load_nothing_lost(model, greedy):
    """32 clients x 4 requests (streaming and not) on a server that queues at most 8: every request is
    answered 200 (its text the greedy one, complete) or 503 with Retry-After; none hangs or is lost."""
    eng = Engine(model, max_seqs=4, max_queue=8)
    results = []
    try:
        with BackgroundServer(create_app(eng, model), grace_s=2) as s:
            def one_client(i):
                c = client(s)
                out = []
                for j in range(4):
                    p = PROMPTS[(i + j) % len(PROMPTS)]
                    try:
                        if (i + j) % 2:
                            chunks = list(c.completions.create(model="m", prompt=p, max_tokens=6, temperature=0,
                                                               stream=True))
                            out.append((p, 200, "".join(ch.choices[0].text for ch in chunks),
                                        chunks[-1].choices[0].finish_reason))
                        else:
                            r = c.completions.create(model="m", prompt=p, max_tokens=6, temperature=0)
                            out.append((p, 200, r.choices[0].text, r.choices[0].finish_reason))
                    except openai.APIStatusError as e:
                        out.append((p, e.status_code, e.response.headers.get("retry-after"), None))
                return out
            with ThreadPoolExecutor(32) as pool:
                futs = [pool.submit(one_client, i) for i in range(32)]
                for f in futs:
                    results.extend(f.result(timeout=90))
            m = metrics(s)
    finally:
        eng.close()
    assert len(results) == 128
    short = {p: generate(model, p, max_tokens=6, temperature=0).text for p in PROMPTS}
    for p, status, text, finish in results:
        assert status in (200, 503), (status, text)
        if status == 200:
            assert text == short[p] and finish in ("stop", "length")
        else:
            assert text is not None and int(text) >= 1          # Retry-After
    ok = sum(r[1] == 200 for r in results)
    assert ok >= 1
    assert m["strata_requests_finished_total"] == ok and m["strata_requests_running"] == 0


# ------------------------------------------------------------------------------------ auth


def test_api_key(engine, model):
    with BackgroundServer(create_app(engine, model, api_key="sekret"), grace_s=1) as s:
        for key in ("wrong", None):
            headers = {"Authorization": f"Bearer {key}"} if key else {}
            status, _, body = raw(s, "GET", "/v1/models", headers=headers)
            assert status == 401 and body["error"]["code"] == "invalid_api_key"
            assert body["error"]["type"] == "invalid_request_error"
            assert raw(s, "POST", "/v1/completions", {"prompt": "x"}, headers)[0] == 401
            assert raw(s, "GET", "/metrics", headers=headers)[0] == 401
            assert raw(s, "GET", "/nowhere", headers=headers)[0] == 401
        status, _, body = raw(s, "GET", "/health")
        assert (status, body) == (200, {"status": "ok"})
        with pytest.raises(openai.AuthenticationError):
            client(s, "wrong").models.list()
        assert client(s, "sekret").models.list().data[0].id == os.path.basename(MODEL)
        r = client(s, "sekret").completions.create(model="m", prompt="x = 1", max_tokens=2, temperature=0)
        assert r.choices[0].finish_reason in ("stop", "length")
        assert "strata_requests_total" in metrics(s, {"Authorization": "Bearer sekret"})


# ------------------------------------------------------------------------------------ 400s, 404, 405


BAD = [  # (route, body, param named in the error)
    ("/v1/completions", b"{not json", None),
    ("/v1/completions", b"[1, 2]", None),
    ("/v1/completions", b'{"prompt": "x", "temperature": NaN}', None),
    ("/v1/completions", {"prompt": "x", "frobnicate": 1}, "frobnicate"),
    ("/v1/completions", {"prompt": "x", "temperature": -0.5}, "temperature"),
    ("/v1/completions", {"prompt": "x", "temperature": "hot"}, "temperature"),
    ("/v1/completions", {"prompt": "x", "top_p": 1.5}, "top_p"),
    ("/v1/completions", {"prompt": "x", "n": 2}, "n"),
    ("/v1/completions", {"prompt": "x", "max_tokens": -1}, "max_tokens"),
    ("/v1/completions", {"prompt": "x", "max_tokens": 1.5}, "max_tokens"),
    ("/v1/completions", {"prompt": "x", "stop": [""]}, "stop"),
    ("/v1/completions", {"prompt": "x", "logprobs": 99}, "logprobs"),
    ("/v1/completions", {"prompt": "x", "stream": "yes"}, "stream"),
    ("/v1/completions", {"prompt": "x", "logit_bias": {"99999999": 1}}, "logit_bias"),
    ("/v1/completions", {"prompt": [1, 10 ** 9]}, "prompt"),
    ("/v1/completions", {"prompt": ["a", "b"]}, "prompt"),
    ("/v1/completions", {"max_tokens": 3}, "prompt"),
    ("/v1/completions", {"prompt": "", "max_tokens": 3}, "prompt"),
    ("/v1/completions", {"prompt": "x", "stream_options": {"bogus": True}}, "stream_options.bogus"),
    ("/v1/chat/completions", {"messages": []}, "messages"),
    ("/v1/chat/completions", {"messages": "hi"}, "messages"),
    ("/v1/chat/completions", {"messages": [{"role": "wizard", "content": "x"}]}, "messages[0].role"),
    # a role that is an array or an object (unhashable) once answered 500: found by a long offline fuzz
    ("/v1/chat/completions", {"messages": [{"role": ["user"], "content": "x"}]}, "messages[0].role"),
    ("/v1/chat/completions", {"messages": [{"role": {"a": 1}, "content": "x"}]}, "messages[0].role"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x", "mood": 1}]}, "messages[0].mood"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
     "messages[0].content[0]"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "response_format":
                              {"type": "json_object"}}, "response_format"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2}, "top_logprobs"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]},
     "tools[0]"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "prompt": "x"}, "prompt"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "n": 3}, "n"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}],
                              "chat_template_kwargs": {"messages": []}}, "chat_template_kwargs"),
]


@pytest.mark.parametrize("route,body,param", BAD, ids=[f"{r.split('/')[-1]}-{i}" for i, (r, _, _) in enumerate(BAD)])
def test_bad_requests_get_400_with_openai_error_body(server, route, body, param):
    status, headers, out = raw(server, "POST", route, body)
    assert status == 400, out
    assert headers["content-type"].startswith("application/json")
    assert set(out) == {"error"} and set(out["error"]) == {"message", "type", "param", "code"}
    assert out["error"]["type"] == "invalid_request_error" and out["error"]["message"]
    if param is not None:
        assert out["error"]["param"] == param


def test_too_long_prompt(server, model):
    status, _, out = raw(server, "POST", "/v1/completions", {"prompt": " x" * (model.n_ctx + 10), "max_tokens": 1})
    assert status == 400 and out["error"]["code"] == "context_length_exceeded"
    with pytest.raises(openai.BadRequestError) as e:
        client(server).chat.completions.create(model="m", messages=[{"role": "user", "content": " y" * 2000}])
    assert e.value.code == "context_length_exceeded"


def test_routes_and_methods(server):
    for method, path, status in (("GET", "/v2/nothing", 404), ("POST", "/v1/embeddings", 404),
                                 ("GET", "/v1/completions", 405), ("DELETE", "/v1/models", 405),
                                 ("GET", "/v1/models/no-such-model", 404)):
        got, headers, out = raw(server, method, path)
        assert got == status and set(out["error"]) == {"message", "type", "param", "code"}
    assert raw(server, "GET", "/v1/completions")[1]["allow"] == "POST"
    assert raw(server, "GET", "/health")[:1] == (200,) and raw(server, "GET", "/health")[2] == {"status": "ok"}
    models = client(server).models.list()
    assert [m.id for m in models.data] == [os.path.basename(MODEL)] and models.data[0].object == "model"
    assert client(server).models.retrieve(os.path.basename(MODEL)).id == os.path.basename(MODEL)


def test_server_survives_garbage(server):
    for body in (b"\xff\xfe", b"{" * 100000, b'{"prompt": "' + b"x" * 100 + b'"}' * 3, b"null", b""):
        assert raw(server, "POST", "/v1/chat/completions", body)[0] == 400
    assert raw(server, "GET", "/health")[0] == 200


# ------------------------------------------------------------------------------------ overload, disconnect


def open_stream(s, body, path="/v1/completions"):
    """A streaming request on a raw connection, read up to its first event: (connection, response)."""
    c = http.client.HTTPConnection("127.0.0.1", s.port, timeout=60)
    c.request("POST", path, json.dumps({**body, "stream": True}), {"Content-Type": "application/json"})
    r = c.getresponse()
    assert r.status == 200
    first = r.readline()
    assert first.startswith(b"data: "), first
    return c, r


def test_overload_gets_503_with_retry_after(model):
    eng = Engine(model, max_seqs=1, max_queue=1)
    endless = {"prompt": PROMPTS[0], "max_tokens": 100000, "logit_bias": no_eos(model)}
    try:
        with BackgroundServer(create_app(eng, model), grace_s=1) as s:
            held, _ = open_stream(s, endless)
            # one running, nothing queued: of five at once, one waits in the queue and four get 503
            with ThreadPoolExecutor(5) as pool:
                futs = [pool.submit(raw, s, "POST", "/v1/completions",
                                    {"prompt": p, "max_tokens": 4, "temperature": 0}) for p in PROMPTS[:5]]
                wait_for(lambda: sum(f.done() for f in futs) >= 4, 30, "four answers")
                held.close()                                  # the running one goes: the queued one runs
                got = [f.result(timeout=60) for f in futs]
            assert sorted(g[0] for g in got) == [200, 503, 503, 503, 503]
            for status, headers, body in got:
                if status == 503:
                    assert int(headers["retry-after"]) >= 1
                    assert body["error"]["code"] == "overloaded" and body["error"]["type"] == "server_error"
            # the openai client sees the 503 as such (max_retries=0: it would otherwise honour Retry-After)
            held, _ = open_stream(s, endless)
            with ThreadPoolExecutor(1) as pool:
                queued = pool.submit(raw, s, "POST", "/v1/completions", {"prompt": "x", "max_tokens": 1})
                wait_for(lambda: eng.metrics()["requests_queued"] == 1, what="a queued request")
                with pytest.raises(openai.APIStatusError) as e:
                    client(s).completions.create(model="m", prompt="x", max_tokens=1)
                assert e.value.status_code == 503 and int(e.value.response.headers["retry-after"]) >= 1
                held.close()
                assert queued.result(timeout=60)[0] == 200
    finally:
        eng.close()


def test_disconnect_frees_the_sequence(model):
    eng = Engine(model, max_seqs=2)
    try:
        with BackgroundServer(create_app(eng, model), grace_s=1) as s:
            for path, body in (("/v1/completions", {"prompt": PROMPTS[0]}),
                               ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]})):
                before = eng.metrics()["requests_cancelled"]
                conn, _ = open_stream(s, {**body, "max_tokens": 100000, "logit_bias": no_eos(model)}, path)
                wait_for(lambda: eng.metrics()["requests_running"] == 1, what="the stream's start")
                conn.close()
                wait_for(lambda: eng.metrics()["requests_running"] == 0 and
                         eng.metrics()["requests_cancelled"] == before + 1, what="the stream's cancellation")
            # a non-streaming client that goes away is cancelled too
            c = http.client.HTTPConnection("127.0.0.1", s.port, timeout=60)
            c.request("POST", "/v1/completions", json.dumps({"prompt": "x", "max_tokens": 100000,
                                                             "logit_bias": no_eos(model)}))
            wait_for(lambda: eng.metrics()["requests_running"] == 1, what="the request's start")
            c.close()
            wait_for(lambda: eng.metrics()["requests_running"] == 0, what="the cancellation")
            m = metrics(s)
            assert m["strata_requests_cancelled_total"] == 3 and m["strata_requests_running"] == 0
    finally:
        eng.close()


# ------------------------------------------------------------------------------------ tool calls, reasoning


QWEN_ANSWER = ('<think>\nThe user wants the weather.\n</think>\n\nLet me check.\n<tool_call>\n'
               '{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}\n</tool_call>\n<tool_call>\n'
               '<function=get_weather>\n<parameter=city>\n42\n</parameter>\n<parameter=days>\n3\n</parameter>\n'
               '</function>\n</tool_call>')


def test_tool_call_parser_on_crafted_text():
    content, reasoning, calls = split_answer(QWEN_ANSWER, TOOLS)
    assert (content, reasoning) == ("Let me check.", "The user wants the weather.")
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [
        ("get_weather", {"city": "Paris", "days": 2}), ("get_weather", {"city": "42", "days": 3})]  # schema: string
    assert all(c.id.startswith("call_") for c in calls) and calls[0].id != calls[1].id
    # any split of the text into pieces gives the same events, no tag ever leaks into content
    for step in range(1, 30):
        p = AnswerParser(TOOLS)
        events = [e for i in range(0, len(QWEN_ANSWER), step) for e in p.feed(QWEN_ANSWER[i:i + step])] + p.close()
        assert "".join(e.text for e in events if e.kind == "content") == "Let me check."
        assert "".join(e.text for e in events if e.kind == "reasoning") == "The user wants the weather."
        assert [e.call.name for e in events if e.kind == "tool_call"] == ["get_weather"] * 2
    # without tools only reasoning is taken out; plain text passes exactly
    assert split_answer("def f(x):\n    return x <tool_call>\n\n", None) == (
        "def f(x):\n    return x <tool_call>\n\n", None, [])
    # a block that is no call stays content, tags and spacing included; a cut one with a whole call counts
    assert split_answer("ok\n<tool_call>{not json}</tool_call>", TOOLS)[:2] == (
        "ok\n<tool_call>{not json}</tool_call>", None)
    cut = split_answer('<tool_call>\n{"name": "f", "arguments": "{\\"a\\": 1}"}\n', TOOLS)
    assert cut[2][0].arguments == '{"a": 1}'
    assert parse_tool_call('{"arguments": {}}') is None and parse_tool_call("<function=>") is None
    # a template that opens the reasoning block itself (Qwen 3.5, thinking on)
    assert prompt_ends_in_think("<|im_start|>assistant\n<think>\n")
    assert not prompt_ends_in_think("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert split_answer("plan\n</think>\n\nanswer", None, thinking=True) == ("answer", "plan", [])
    assert split_answer("a <think>b</think>", None) == ("a <think>b</think>", None, [])   # not at the start


QWEN_TEMPLATES = (os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "build", "test-cache",
                               "llama-cpp-python-0.3.36-qwen-templates"))


@pytest.mark.parametrize("name", ["Qwen-Qwen3-0.6B", "Qwen3.5-4B"])
def test_openai_messages_render_with_qwen_templates(name):
    """The server's form of OpenAI messages (tool_calls' JSON-string arguments as objects, null content as
    "") renders under the real Qwen templates (cached by tests/test_chat.py), tools included."""
    from pyrunner.chat import render_chat
    from pyrunner.server import _messages

    path = os.path.join(QWEN_TEMPLATES, f"{name}.jinja")
    if not os.path.exists(path):
        pytest.skip("the Qwen templates are not cached (tests/test_chat.py fetches them)")
    template = open(path, encoding="utf-8").read()
    messages = _messages([
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather",
                                                              "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}])
    text = render_chat(template, messages, tools=TOOLS, add_generation_prompt=True)
    assert '"get_weather"' in text and "<tool_call>" in text and "Paris" in text and "sunny" in text
    assert prompt_ends_in_think(text) == (name == "Qwen3.5-4B")      # 3.5 opens the reasoning block itself


class FakeRequest:
    """A request that replays crafted pieces (the model never writes <tool_call>)."""

    def __init__(self, pieces, prompt_tokens):
        self.id, self.prompt_tokens, self.pieces, self.cancelled = "fake-1", prompt_tokens, pieces, False

    async def astream(self):
        for text in self.pieces:
            yield Piece(text, [1])

    def result(self, timeout=None):
        text = "".join(self.pieces)
        return Completion(text, [1] * len(self.pieces), "stop", {"prompt_tokens": self.prompt_tokens})

    def cancel(self):
        self.cancelled = True


class FakeEngine:
    stopped = None                       # Engine.stopped: this stand-in never fails on its own

    def __init__(self, pieces):
        self.pieces, self.submitted = pieces, []

    def submit(self, prompt, params, *, add_special=True, logprobs=None, checkpoint_at=()):
        self.submitted.append(prompt)
        return FakeRequest(self.pieces, len(prompt))

    def metrics(self):
        return {"requests_total": len(self.submitted)}

    def close(self, cancel=True):
        return {"finished": [], "cancelled": []}


def test_tool_calls_and_reasoning_through_the_server(model):
    cut = [QWEN_ANSWER[i:i + 7] for i in range(0, len(QWEN_ANSWER), 7)]
    eng = FakeEngine(cut)
    messages = [{"role": "user", "content": "Weather in Paris?"}]
    with BackgroundServer(create_app(eng, model), grace_s=1) as s:
        c = client(s)
        r = c.chat.completions.create(model="m", messages=messages, tools=TOOLS)
        choice = r.choices[0]
        assert choice.finish_reason == "tool_calls"
        assert choice.message.content == "Let me check."
        assert choice.message.model_extra["reasoning_content"] == "The user wants the weather."
        calls = choice.message.tool_calls
        assert [(t.type, t.function.name, json.loads(t.function.arguments)) for t in calls] == [
            ("function", "get_weather", {"city": "Paris", "days": 2}),
            ("function", "get_weather", {"city": "42", "days": 3})]
        # streamed: deltas with index, id and name first, then the arguments
        calls, content, reasoning, finish = {}, [], [], None
        for ch in c.chat.completions.create(model="m", messages=messages, tools=TOOLS, stream=True):
            d = ch.choices[0].delta
            content.append(d.content or "")
            reasoning.append((d.model_extra or {}).get("reasoning_content") or "")
            for tc in d.tool_calls or ():
                slot = calls.setdefault(tc.index, {"id": None, "name": None, "arguments": ""})
                slot["id"] = tc.id or slot["id"]
                slot["name"] = (tc.function.name if tc.function else None) or slot["name"]
                slot["arguments"] += (tc.function.arguments or "") if tc.function else ""
            finish = ch.choices[0].finish_reason or finish
        assert finish == "tool_calls" and "".join(content) == "Let me check."
        assert "".join(reasoning) == "The user wants the weather."
        assert [(v["name"], json.loads(v["arguments"])) for _, v in sorted(calls.items())] == [
            ("get_weather", {"city": "Paris", "days": 2}), ("get_weather", {"city": "42", "days": 3})]
        assert all(v["id"].startswith("call_") for v in calls.values())
        # tool_choice "none": the calls are left as text
        r = c.chat.completions.create(model="m", messages=messages, tools=TOOLS, tool_choice="none")
        assert r.choices[0].finish_reason == "stop" and "<tool_call>" in r.choices[0].message.content
    # the submitted prompt is the template's rendering, tokenized without specials
    assert eng.submitted[0] == prompt_ids(model, render_messages(model, messages, tools=TOOLS), add_special=False)


class BrokenEngine(FakeEngine):
    """submit() fails as a bug would, or a request fails in the engine, or its stream breaks midway."""

    def __init__(self, how):
        super().__init__(["a", "b"])
        self.how = how

    def submit(self, prompt, params, *, add_special=True, logprobs=None, checkpoint_at=()):
        if self.how == "submit":
            raise KeyError("a bug")
        req = FakeRequest(self.pieces, 3)
        if self.how == "engine":
            req.result = lambda timeout=None: Completion("a", [1], "error", {}, "watchdog: no progress")
        if self.how == "stream":
            async def astream():
                yield Piece("a", [1])
                raise ZeroDivisionError("midway")
            req.astream = astream
        return req


@pytest.mark.parametrize("how", ["submit", "engine", "stream"])
def test_our_failures_are_500s_and_the_server_goes_on(model, how):
    with BackgroundServer(create_app(BrokenEngine(how), model), grace_s=1) as s:
        status, _, body = raw(s, "POST", "/v1/completions", {"prompt": "x"})
        assert status == 500 and body["error"]["type"] == "server_error" and body["error"]["message"]
        # streamed: after the start, the failure is an error event, then [DONE]
        status, _, body = raw(s, "POST", "/v1/chat/completions",
                              {"messages": [{"role": "user", "content": "x"}], "stream": True})
        assert status == (500 if how == "submit" else 200)
        if how != "submit":
            events = [json.loads(line[6:]) for line in body.splitlines() if line.startswith("data: {")]
            assert "error" in events[-1] and events[-1]["error"]["type"] == "server_error"
            assert body.rstrip().endswith("data: [DONE]")
            with pytest.raises(openai.APIError):     # the openai client raises on the error event
                list(client(s).chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}],
                                                       stream=True))
        assert raw(s, "GET", "/health")[0] == 200


def test_a_lone_surrogate_is_answered(server):
    """JSON may carry a lone surrogate (\\udc00): echoed back in "model", it is escaped; in a prompt, a 400."""
    status, _, body = raw(server, "POST", "/v1/completions",
                          rb'{"prompt": "x = 1", "model": "\udc00", "max_tokens": 2}')
    assert status == 200 and body["model"] == "\udc00", body
    status, _, body = raw(server, "POST", "/v1/completions", rb'{"prompt": "x = \ud800", "max_tokens": 2}')
    assert status == 400 and body["error"]["param"] == "prompt"


def test_chat_with_tools_on_the_model(server, model):
    messages = [{"role": "user", "content": "What is the weather in Oslo?"}]
    r = client(server).chat.completions.create(model="m", messages=messages, tools=TOOLS, max_tokens=N,
                                               temperature=0, tool_choice="auto")
    choice = r.choices[0]
    assert choice.finish_reason in ("stop", "length", "tool_calls")
    if choice.finish_reason != "tool_calls":
        content, _, _ = split_answer(chat_reference(model, messages, N, TOOLS), TOOLS)
        assert choice.message.content == (content or "")


# ------------------------------------------------------------------------------------ /metrics


def test_metrics_parse(server):
    client(server).completions.create(model="m", prompt="x", max_tokens=2)
    m = metrics(server)
    for name in ("strata_requests_total", "strata_requests_running", "strata_requests_queued",
                 "strata_requests_finished_total", "strata_requests_cancelled_total",
                 "strata_generated_tokens_total", "strata_generated_tokens_per_second", "strata_cache_hit_rate",
                 "strata_cache_hits_total", "strata_cache_lookups_total", "strata_pcie_bytes_total",
                 "strata_draft_acceptance_rate", "strata_drafts_proposed_total", "strata_steps_total"):
        assert name in m, name
    assert m["strata_requests_total"] >= 1 and m["strata_generated_tokens_total"] >= 1
    assert m['strata_http_responses_total{route="/v1/completions",code="200"}'] >= 1


# ------------------------------------------------------------------------------------ the CLI


class Addr:
    def __init__(self, port):
        self.port, self.url = port, f"http://127.0.0.1:{port}"


def strata(*args, **kw):
    return subprocess.run([sys.executable, "-m", "pyrunner.cli", *args], capture_output=True, text=True,
                          timeout=120, **kw)


def test_cli_serve_equals_generate_and_shuts_down_on_sigterm(model):
    """The real `strata serve` subprocess: its greedy completion is what `strata generate --temp 0` prints;
    at SIGTERM a short request in flight finishes, a long one is cancelled after the grace period, and the
    process says which, then exits 0."""
    prompt, n = PROMPTS[0], 10
    gen = strata("generate", "-m", MODEL, "--temp", "0", "-n", str(n), prompt)
    assert gen.returncode == 0, gen.stderr
    env = {**os.environ, "STRATA_API_KEY": "k3y"}
    p = subprocess.Popen([sys.executable, "-m", "pyrunner.cli", "serve", "-m", MODEL, "--port", "0",
                          "--max-concurrent", "2", "--grace-s", "2", "-t", "2",
                          # the long request must outlast the grace period: at 4,096 tokens of context a fast
                          # host (AVX-512 + AVX-VNNI, ~1,600 tok/s) filled it in under 3 s and ended it "length"
                          "-c", "16384"], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, env=env)
    try:
        line = p.stdout.readline()
        m = re.fullmatch(r"strata serve: http://127\.0\.0\.1:(\d+)/v1 \(model (\S+), up to 2 concurrent, auth on\)\n",
                         line)
        assert m, (line, p.stderr.read() if p.poll() is not None else "")
        assert m.group(2) == os.path.basename(MODEL)
        s = Addr(int(m.group(1)))
        c = client(s, "k3y")
        r = c.completions.create(model="m", prompt=prompt, max_tokens=n, temperature=0)
        assert r.choices[0].text + "\n" == gen.stdout
        assert raw(s, "GET", "/health")[0] == 200 and raw(s, "GET", "/v1/models")[0] == 401

        auth = {"Authorization": "Bearer k3y", "Content-Type": "application/json"}

        def stream(body):
            conn = http.client.HTTPConnection("127.0.0.1", s.port, timeout=60)
            conn.request("POST", "/v1/completions", json.dumps({**body, "stream": True}), auth)
            resp = conn.getresponse()
            first = json.loads(resp.readline()[6:])
            return conn, resp, first["id"]
        ban = no_eos(model)
        long_conn, long_resp, long_id = stream({"prompt": "x", "max_tokens": 100000, "logit_bias": ban})
        short_conn, short_resp, short_id = stream({"prompt": "y", "max_tokens": 60, "logit_bias": ban})
        p.send_signal(signal.SIGTERM)
        short_body = short_resp.read().decode()              # finishes within the grace period
        assert short_body.rstrip().endswith("data: [DONE]") and '"finish_reason":"length"' in short_body
        long_body = long_resp.read().decode()                # cancelled after it, but answered in full
        assert long_body.rstrip().endswith("data: [DONE]") and '"finish_reason":"cancelled"' in long_body
        out, err = p.communicate(timeout=60)
        assert p.returncode == 0, err
        assert "SIGTERM: not accepting new requests; 2 in flight" in out
        tail = out.strip().splitlines()[-1]
        assert tail == f"strata serve: stopped; finished 1 ({short_id}), cancelled 1 ({long_id})", out
        long_conn.close()
        short_conn.close()
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


def test_an_engine_that_stopped_answers_500_and_fails_health(model):
    """When the engine's own loop fails (a bug; test_engine's test of the same), the request in flight
    gets a 500 naming the error, later ones a 500 "engine_stopped" (not the 503 of a shutdown, which
    clients retry), and /health answers 503 so that a load balancer takes the server out."""
    from faults import planner_failing_at

    eng = Engine(model, max_seqs=2)
    eng._plan_for = planner_failing_at(eng._plan_for, 3)
    with BackgroundServer(create_app(eng, model, close_engine=True), grace_s=1) as s:
        assert raw(s, "GET", "/health")[0] == 200
        status, _, out = raw(s, "POST", "/v1/completions", {"prompt": PROMPTS[0], "max_tokens": 20, "temperature": 0})
        assert status == 500 and "OverflowError" in out["error"]["message"], (status, out)
        status, _, out = raw(s, "POST", "/v1/completions", {"prompt": PROMPTS[1], "max_tokens": 2})
        assert status == 500 and out["error"]["code"] == "engine_stopped", (status, out)
        status, _, out = raw(s, "GET", "/health")
        assert status == 503 and out["status"] == "error" and "OverflowError" in out["error"], out


def test_cli_serve_refuses_bad_settings_and_a_taken_port():
    import socket

    from click.testing import CliRunner

    from pyrunner.cli import main

    for args, says in ((["--max-concurrent", "0"], "--max-concurrent 0"), (["--max-queue", "-1"], "--max-queue -1"),
                       (["--port", "70000"], "--port 70000"), (["--grace-s", "-1"], "--grace-s -1"),
                       # NaN passed the old checks; an infinite factor overflowed int() in the engine's planner
                       (["--grace-s", "nan"], "--grace-s nan"), (["--itl-factor", "inf"], "--itl-factor inf")):
        r = CliRunner().invoke(main, ["serve", "-m", MODEL, *args])
        assert r.exit_code == 1 and says in r.output, r.output
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        r = CliRunner().invoke(main, ["serve", "-m", MODEL, "--port", str(port), "-t", "2"])
    assert r.exit_code == 1 and f"could not listen on http://127.0.0.1:{port}" in r.output, r.output


def test_chat_keeps_checkpoints_where_the_system_prompt_and_earlier_turns_end(model):
    """The chat route names the prompt positions where the system message and the turns before the
    last end, so the next request with the same system prompt (or the next turn) reuses the state."""
    from pyrunner.generate import prompt_ids, render_messages
    from pyrunner.server import chat_job

    msgs = [{"role": "system", "content": "You write short Python. " * 5},
            {"role": "user", "content": "a loop"}, {"role": "assistant", "content": "for i in x: pass"},
            {"role": "user", "content": "a class"}]
    job = chat_job({"messages": msgs, "max_tokens": 4}, model)
    sys_ids = prompt_ids(model, render_messages(model, msgs[:1], add_generation_prompt=False), add_special=False)
    past = prompt_ids(model, render_messages(model, msgs[:-1], add_generation_prompt=False), add_special=False)
    assert job.checkpoint_at == (len(sys_ids), len(past))
    assert job.prompt[:len(past)] == past


def _mutants(rng, seed_bodies, n):
    """Bodies a fuzzer would send: valid requests with values swapped for odd ones, keys dropped or
    added, types changed (a message's fields too), nested garbage, and raw bytes flipped in their JSON text."""
    odd = [None, True, -1, 0, 2**63, -2**63, 1e308, -0.0, "", "x" * 5000, "\ud800", [], {}, [None], {"a": []},
           [[[[]]]], "NaN", 3.5, -7, [1, "a"], {"type": "json_object"}, "\x00"]
    for _ in range(n):
        body = json.loads(json.dumps(seed_bodies[rng.integers(len(seed_bodies))]))
        for _ in range(int(rng.integers(1, 4))):
            keys = list(body)
            op = rng.integers(4)
            if op == 0 and keys:
                body[keys[rng.integers(len(keys))]] = odd[rng.integers(len(odd))]
            elif op == 1 and keys:
                del body[keys[rng.integers(len(keys))]]
            elif op == 2:
                body[["n", "stop", "logprobs", "top_logprobs", "stream_options", "tools", "messages", "prompt",
                      "seed", "max_tokens", "temperature", "bogus"][rng.integers(12)]] = odd[rng.integers(len(odd))]
            elif "messages" in body and isinstance(body["messages"], list) and body["messages"]:
                m = body["messages"][0]
                if isinstance(m, dict) and rng.random() < 0.5:     # one field of a message (its role: a 500 once)
                    m[["role", "content", "name", "tool_calls", "tool_call_id"][rng.integers(5)]] = \
                        json.loads(json.dumps(odd[rng.integers(len(odd))]))
                else:
                    body["messages"][0] = odd[rng.integers(len(odd))]
        text = json.dumps(body).encode("utf-8", "surrogatepass")
        if rng.random() < 0.25:                      # flip bytes of the JSON text itself
            b = bytearray(text)
            for _ in range(int(rng.integers(1, 4))):
                b[rng.integers(len(b))] = int(rng.integers(256))
            text = bytes(b)
        yield text


def test_fuzzed_bodies_never_crash_the_server(server, model):
    """240 mutated request bodies on both POST routes (bounded: max_tokens kept small): every answer is
    a 200 or an OpenAI error body with a 4xx status, never a 500 or a dropped connection, and the
    server still answers correctly afterwards."""
    import numpy as np
    rng = np.random.default_rng(18)
    seeds = {"/v1/completions": [{"prompt": "def f(", "max_tokens": 2, "temperature": 0},
                                 {"prompt": [1, 2, 3], "max_tokens": 1, "logprobs": 2, "stop": ["\n"]}],
             "/v1/chat/completions": [{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
                                      {"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}],
                                       "max_tokens": 1, "tools": [{"type": "function", "function": {"name": "f"}}]}]}
    seen = collections.Counter()
    for path, bodies in seeds.items():
        for text in _mutants(rng, bodies, 120):
            try:
                data = json.loads(text)
                if isinstance(data, dict) and isinstance(data.get("max_tokens"), int) and data["max_tokens"] > 4:
                    continue                         # bounded: no long generations
            except ValueError:
                pass
            status, _, out = raw(server, "POST", path, text, {"Content-Type": "application/json"})
            seen[status] += 1
            assert status == 200 or 400 <= status < 500, (status, text[:300], out)
            if status != 200:
                assert isinstance(out, dict) and set(out["error"]) >= {"message", "type", "param", "code"}, out
    assert seen[200] > 0 and sum(v for k, v in seen.items() if k >= 400) > 0, seen
    assert raw(server, "GET", "/health")[0] == 200
    r = client(server).completions.create(model="m", prompt=PROMPTS[0], max_tokens=N, temperature=0)
    assert r.choices[0].text == generate(model, PROMPTS[0], max_tokens=N, temperature=0).text
