"""pyrunner.generate on the tiny preset (tools/make_model.py tiny, f32 KV): the decode loop against a
hand-written greedy loop over Session.eval, streaming, seeds, stop strings, EOS, max_tokens, a full
context, prefix reuse (what is evaluated, and that the result equals a fresh session's), and the
llama-cpp-python response shapes of create_completion / create_chat_completion."""
from __future__ import annotations

import threading
import typing

import numpy as np
import pytest

from pyrunner.chat import render_chat
from pyrunner.generate import (STATS_KEYS, STOP, ChatTurn, Completion, CompletionStream, StepsEnd, chat_prompt_ids,
                               create_chat_completion, create_completion, end_of_generation_ids, generate,
                               generate_step)
from pyrunner.model import Model
from pyrunner.sampling import Sampler, SamplingParams
from pyrunner.models import make_model

PROMPT = "hello world, the quick brown fox"


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("generate") / "tiny.gguf"
    make_model("tiny", str(path), "f32", 0)
    return str(path)


@pytest.fixture(scope="module")
def model(tiny_path):
    with Model(tiny_path, threads=2, n_ctx=512, kv_type="f32") as m:
        yield m


@pytest.fixture(scope="module")
def eos(model):
    return model.metadata["tokenizer.ggml.eos_token_id"]


@pytest.fixture(scope="module")
def ban(model):
    """logit_bias that keeps every end-of-generation token from being sampled."""
    return {t: -np.inf for t in end_of_generation_ids(model)}


class Counting:
    """A session that counts the tokens evaluated through it and its resets (the session's own
    methods are wrapped, so its prefill and reuse count too)."""

    def __init__(self, sess):
        self.sess, self.evaluated, self.resets = sess, 0, 0
        ev, rs = sess.eval, sess.reset

        def eval(ids, *a, **kw):
            self.evaluated += len(ids)
            return ev(ids, *a, **kw)

        def reset():
            self.resets += 1
            rs()
        sess.eval, sess.reset = eval, reset

    def __getattr__(self, name):
        return getattr(self.sess, name)


def manual_greedy(model, ids, n, eog):
    """The reference: prompt in one eval, then argmax / eval one token at a time."""
    sess = model.session()
    logits = sess.eval(ids)
    out = []
    for _ in range(n):
        t = int(np.argmax(logits))
        if t in eog:
            return out, "stop"
        out.append(t)
        if len(out) == n:
            break
        logits = sess.eval([t])
    return out, "length"


def test_greedy_matches_a_plain_loop_over_session_eval(model):
    ids = model.tokenize(PROMPT)
    eog = end_of_generation_ids(model)
    want, reason = manual_greedy(model, ids, 40, eog)
    c = generate(model, PROMPT, max_tokens=40, temperature=0, session=model.session())
    assert isinstance(c, Completion)
    assert c.tokens == want and c.finish_reason == reason
    assert c.text == model.detokenize(want)
    assert set(c.to_dict()) == {"text", "tokens", "finish_reason", "stats"}
    assert set(c.stats) <= set(STATS_KEYS)
    s = c.stats
    assert s["prompt_tokens"] == len(ids) and s["reused_prompt_tokens"] == 0
    assert s["generated_tokens"] == len(want) + (reason == "stop")
    assert s["prefill_s"] > 0 and s["prefill_tps"] == pytest.approx(len(ids) / s["prefill_s"])
    assert 0 < s["ttft_s"]
    if s["generated_tokens"] > 1:
        assert s["decode_tps"] == pytest.approx((s["generated_tokens"] - 1) / s["decode_s"])


def test_the_model_method_is_this_function(model):
    a = model.generate(PROMPT, max_tokens=8, temperature=0, session=model.session())
    b = generate(model, PROMPT, max_tokens=8, temperature=0, session=model.session())
    assert a.tokens == b.tokens and a.text == b.text


def test_eog_ids_are_the_files_eos_and_the_chat_end_tokens(model, eos):
    eog = end_of_generation_ids(model)
    assert eos in eog
    assert model.tokenize("<|endoftext|>", add_special=False)[0] in eog
    assert all(t >= 300 for t in eog)       # the tiny vocabulary's 300 ordinary tokens end nothing


def test_stream_pieces_join_to_the_completion_and_match_non_streaming(model):
    kw = dict(max_tokens=30, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=1234)
    s = generate(model, PROMPT, stream=True, session=model.session(), **kw)
    assert isinstance(s, CompletionStream) and s.completion is None
    pieces = list(s)
    c = generate(model, PROMPT, session=model.session(), **kw)
    assert "".join(pieces) == s.completion.text == c.text
    assert s.completion.tokens == c.tokens and s.completion.finish_reason == c.finish_reason
    assert all(p for p in pieces)
    with pytest.raises(RuntimeError, match="once"):
        list(s)


def test_seed_reproduces_and_other_seeds_differ(model, ban):
    kw = dict(max_tokens=24, temperature=1.5, top_k=0, top_p=1.0, min_p=0.0, logit_bias=ban)
    a = generate(model, PROMPT, seed=7, session=model.session(), **kw)
    b = generate(model, PROMPT, seed=7, session=model.session(), **kw)
    c = generate(model, PROMPT, seed=8, session=model.session(), **kw)
    assert a.tokens == b.tokens and len(a.tokens) == 24
    assert a.tokens != c.tokens


def test_stop_string_cuts_before_it_streaming_or_not(model, ban):
    kw = dict(max_tokens=60, temperature=0, logit_bias=ban)
    full = generate(model, PROMPT, session=model.session(), **kw)
    assert len(full.text) > 12
    stop = full.text[8:11]
    want = full.text[:full.text.find(stop)]
    c = generate(model, PROMPT, stop=[stop, "\x00never\x00"], session=model.session(), **kw)
    assert c.text == want and c.finish_reason == "stop"
    assert len(c.tokens) < len(full.tokens) and c.tokens == full.tokens[:len(c.tokens)]
    s = generate(model, PROMPT, stop=stop, stream=True, session=model.session(), **kw)
    assert "".join(s) == want and s.completion.finish_reason == "stop"


def test_max_tokens_and_eos(model, eos, ban):
    c = generate(model, PROMPT, max_tokens=5, temperature=0, logit_bias=ban, session=model.session())
    assert len(c.tokens) == 5 and c.finish_reason == "length" and c.stats["generated_tokens"] == 5
    c = generate(model, PROMPT, max_tokens=5, temperature=0, logit_bias={eos: 100.0}, session=model.session())
    assert c.tokens == [] and c.text == "" and c.finish_reason == "stop"
    assert c.stats["generated_tokens"] == 1 and "decode_s" not in c.stats
    c = generate(model, PROMPT, max_tokens=0, session=model.session())
    assert c.tokens == [] and c.finish_reason == "length" and "ttft_s" not in c.stats


def test_full_context_ends_with_length_and_long_prompt_is_refused(tiny_path, ban):
    with Model(tiny_path, threads=2, n_ctx=16, kv_type="f32") as m:
        ids = list(range(40, 50))
        c = generate(m, ids, max_tokens=-1, temperature=0, logit_bias=ban)
        # 6 sampled tokens are evaluated (n_past 10 -> 16); the 7th cannot be, and ends the request
        assert c.finish_reason == "length" and len(c.tokens) == 7
        with pytest.raises(ValueError, match="17 tokens but the context holds 16"):
            generate(m, list(range(40, 57)), max_tokens=1)
        with pytest.raises(ValueError, match="context holds 16"):      # at the call, not at the first piece
            generate(m, list(range(40, 57)), max_tokens=1, stream=True)


def test_prefix_reuse_evaluates_only_new_tokens_and_matches_a_fresh_session(model, ban):
    sess = Counting(model.session())
    ids = model.tokenize(PROMPT)
    c1 = generate(model, ids, max_tokens=6, temperature=0, logit_bias=ban, session=sess)
    assert sess.evaluated == len(ids) + 5          # the last sampled token is never evaluated
    # continuing the whole history: only the tail is evaluated
    nxt = ids + c1.tokens + [42, 43]
    before = sess.evaluated
    c2 = generate(model, nxt, max_tokens=6, temperature=0, logit_bias=ban, session=sess)
    assert c2.stats["reused_prompt_tokens"] == len(ids) + 5
    assert sess.evaluated - before == 3 + 5 and sess.resets == 0
    fresh = generate(model, nxt, max_tokens=6, temperature=0, logit_bias=ban, session=model.session())
    assert c2.tokens == fresh.tokens
    # a prompt that is a prefix of the history resumes from the checkpoint at the end of the first prompt
    before = sess.evaluated
    c3 = generate(model, ids, max_tokens=6, temperature=0, logit_bias=ban, session=sess)
    assert c3.stats["reused_prompt_tokens"] == len(ids) and sess.resets == 0 and c3.tokens == c1.tokens
    assert sess.evaluated - before == 5
    # one that shares nothing starts over
    c5 = generate(model, [7] + ids, max_tokens=2, temperature=0, logit_bias=ban, session=sess)
    assert c5.stats["reused_prompt_tokens"] == 0 and sess.resets == 1
    # exactly the history (after max_tokens=0): nothing is evaluated, the kept logits are used
    sess2 = Counting(model.session())
    generate(model, ids, max_tokens=0, session=sess2)
    c4 = generate(model, ids, max_tokens=6, temperature=0, logit_bias=ban, session=sess2)
    assert c4.stats["reused_prompt_tokens"] == len(ids) and "prefill_s" not in c4.stats
    assert c4.tokens == c1.tokens and sess2.evaluated == len(ids) + 5


def test_a_session_evaluated_directly_is_reset_first(model):
    sess = model.session()
    sess.eval([5, 6, 7])
    c = generate(model, PROMPT, max_tokens=8, temperature=0, session=sess)
    ref = generate(model, PROMPT, max_tokens=8, temperature=0, session=model.session())
    assert c.tokens == ref.tokens and c.stats["reused_prompt_tokens"] == 0


def test_bad_requests_say_what_is_wrong(model):
    with pytest.raises(ValueError, match="empty"):
        generate(model, "", session=model.session())
    with pytest.raises(ValueError, match="outside the vocabulary"):
        generate(model, [1, model.n_vocab], session=model.session())
    with pytest.raises(ValueError, match="--top-p"):
        generate(model, PROMPT, top_p=2.0, session=model.session())
    with pytest.raises(ValueError, match="logprobs is not supported"):
        create_completion(model, PROMPT, logprobs=2)


def _keys(typed_dict) -> set:
    return set(typing.get_type_hints(typed_dict))


def test_create_completion_has_llama_cpp_pythons_shape(model, tiny_path):
    from llama_cpp import llama_types as lt

    r = create_completion(model, PROMPT, max_tokens=10, temperature=0, session=model.session())
    assert set(r) == _keys(lt.CreateCompletionResponse)
    assert r["object"] == "text_completion" and r["id"].startswith("cmpl-") and r["model"] == tiny_path
    (ch,) = r["choices"]
    assert set(ch) == _keys(lt.CompletionChoice) and ch["index"] == 0 and ch["logprobs"] is None
    ref = generate(model, PROMPT, max_tokens=10, temperature=0, session=model.session())
    assert ch["text"] == ref.text and ch["finish_reason"] == ref.finish_reason
    n = len(model.tokenize(PROMPT))
    assert r["usage"] == {"prompt_tokens": n, "completion_tokens": len(ref.tokens),
                          "total_tokens": n + len(ref.tokens)}
    chunks = list(create_completion(model, PROMPT, max_tokens=10, temperature=0, stream=True,
                                    session=model.session()))
    assert all(c["object"] == "text_completion" and c["id"] == chunks[0]["id"] for c in chunks)
    assert [c["choices"][0]["finish_reason"] for c in chunks] == [None] * (len(chunks) - 1) + [ref.finish_reason]
    assert "".join(c["choices"][0]["text"] for c in chunks) == ref.text
    echo = create_completion(model, PROMPT, max_tokens=10, temperature=0, echo=True, session=model.session())
    assert echo["choices"][0]["text"] == PROMPT + ref.text


def test_create_chat_completion_renders_the_template_and_has_llama_cpp_pythons_shape(model, tiny_path):
    from llama_cpp import llama_types as lt

    msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi there"}]
    r = create_chat_completion(model, msgs, max_tokens=12, temperature=0, session=model.session())
    assert set(r) == _keys(lt.CreateChatCompletionResponse)
    assert r["object"] == "chat.completion" and r["id"].startswith("chatcmpl-") and r["model"] == tiny_path
    (ch,) = r["choices"]
    assert set(ch) == _keys(lt.ChatCompletionResponseChoice)
    text = render_chat(model.metadata["tokenizer.chat_template"], msgs, add_generation_prompt=True)
    assert text.endswith("<|im_start|>assistant\n")
    ids = model.tokenize(text, add_special=False)
    ref = generate(model, ids, max_tokens=12, temperature=0, session=model.session())
    assert ch["message"] == {"role": "assistant", "content": ref.text}
    assert ch["finish_reason"] == ref.finish_reason and r["usage"]["prompt_tokens"] == len(ids)
    chunks = list(create_chat_completion(model, msgs, max_tokens=12, temperature=0, stream=True,
                                         session=model.session()))
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant"}
    assert chunks[-1]["choices"][0]["delta"] == {} and chunks[-1]["choices"][0]["finish_reason"] == ref.finish_reason
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks) == ref.text
    assert model.create_chat_completion(msgs, max_tokens=12, temperature=0,
                                        session=model.session())["choices"][0]["message"]["content"] == ref.text


def test_chat_turns_continue_the_generated_tokens_exactly(model):
    im_end, eot = (model.tokenize(t, add_special=False)[0] for t in ("<|im_end|>", "<|endoftext|>"))
    msgs = [{"role": "user", "content": "hi there"}]
    ids1, text1 = chat_prompt_ids(model, msgs)
    assert ids1 == model.tokenize(text1, add_special=False) and text1.endswith("<|im_start|>assistant\n")
    sess = Counting(model.session())
    c1 = generate(model, ids1, max_tokens=30, temperature=0, logit_bias={im_end: 1.0, eot: -np.inf}, session=sess)
    assert c1.finish_reason == "stop" and c1.tokens          # a short answer ended by <|im_end|>
    msgs += [{"role": "assistant", "content": c1.text}, {"role": "user", "content": "and then?"}]
    ids2, text2 = chat_prompt_ids(model, msgs, ChatTurn(ids1, text1, c1.tokens, c1.text))
    n = len(ids1) + len(c1.tokens)
    assert ids2[:n] == ids1 + c1.tokens and ids2[n] == im_end      # the template's turn end, then the new turn
    assert model.detokenize(ids2) == text2 and text2.endswith("and then?<|im_end|>\n<|im_start|>assistant\n")
    c2 = generate(model, ids2, max_tokens=4, temperature=0, session=sess)
    assert c2.stats["reused_prompt_tokens"] == n and sess.resets == 0
    # an answer that is not its tokens' text (cut by a stop string) cannot be continued token for token
    cut = [dict(m) for m in msgs]
    cut[1]["content"] = c1.text[:-1]
    ids3, text3 = chat_prompt_ids(model, cut, ChatTurn(ids1, text1, c1.tokens, c1.text[:-1]))
    assert ids3 == model.tokenize(text3, add_special=False)
    # ... but the checkpoint kept at the end of the first turn's prompt still serves it
    assert ids3[:len(ids1)] == ids1 and ids3[:n] != ids2[:n]
    before = sess.evaluated
    c3 = generate(model, ids3, max_tokens=2, temperature=0, session=sess)
    assert c3.stats["reused_prompt_tokens"] >= len(ids1) and sess.resets == 0
    assert sess.evaluated - before == len(ids3) - c3.stats["reused_prompt_tokens"] + c3.stats["generated_tokens"] - 1
    assert c3.tokens == generate(model, ids3, max_tokens=2, temperature=0, session=model.session()).tokens


# ------------------------------------------------------------------ one model, many threads

_NAMES = ("apple", "berry", "cedar", "delta")


def _thread_calls(i, ban):
    """Thread i's three requests on the model's own session (no session= argument): the three entry
    points, greedy and seeded, one of them streamed. No prompt is a prefix of another, so the
    sequential run's answers do not depend on the order the calls come in."""
    kw = dict(max_tokens=8, logit_bias=ban)
    name = _NAMES[i]
    return [
        lambda m: m.generate(f"{name} 0 {PROMPT}", temperature=0, **kw).tokens,
        lambda m: m.create_completion(f"{name} 1 {PROMPT}", temperature=1.0, top_k=0, seed=100 + i,
                                      **kw)["choices"][0]["text"],
        lambda m: "".join(c["choices"][0]["delta"].get("content", "") for c in m.create_chat_completion(
            [{"role": "user", "content": f"{name} 2 tell me"}], temperature=0.7, seed=7 + i, stream=True, **kw)),
    ]


def test_calls_from_many_threads_equal_the_same_calls_one_after_another(tiny_path, ban):
    import threading

    with Model(tiny_path, threads=2, n_ctx=512, kv_type="f32") as m:
        want = [[call(m) for call in _thread_calls(i, ban)] for i in range(4)]
    got = [None] * 4
    errors = []
    with Model(tiny_path, threads=2, n_ctx=512, kv_type="f32") as m:
        start = threading.Barrier(4)

        def run(i):
            try:
                start.wait()
                got[i] = [call(m) for call in _thread_calls(i, ban)]
            except Exception as e:      # reported below: an exception in a thread would go unseen
                errors.append(repr(e))
        ts = [threading.Thread(target=run, args=(i,)) for i in range(4)]
        for t in ts:
            t.start()
        for t in ts:
            t.join(120)
        assert m._sessions == [m.own_session]     # the calls' own sessions were freed
    assert not errors, errors
    assert got == want


def test_a_stream_left_open_does_not_block_or_disturb_other_calls(model, ban):
    kw = dict(max_tokens=10, temperature=0, logit_bias=ban)
    whole = generate(model, "stream " + PROMPT, session=model.session(), **kw)
    other = generate(model, "other " + PROMPT, session=model.session(), **kw)
    s = model.generate("stream " + PROMPT, stream=True, **kw)      # holds the model's own session ...
    it = iter(s)
    first = next(it)
    mid = model.generate("other " + PROMPT, **kw)                  # ... so this call runs on a session of its own
    assert mid.tokens == other.tokens
    assert first + "".join(it) == whole.text and s.completion.tokens == whole.tokens


# ------------------------------------------------------------------------------------ the step loop


def steps_of(sess, ids, ban, **kw):
    return generate_step(sess, ids, Sampler(SamplingParams.greedy(logit_bias=ban)), **kw)


def finish(steps, reply=None) -> StepsEnd:
    with pytest.raises(StopIteration) as e:
        next(steps) if reply is None else steps.send(reply)
    assert isinstance(e.value.value, StepsEnd)
    return e.value.value


def test_the_step_loop_yields_generates_tokens_and_stop_keeps_the_tokens_before(model, ban):
    """generate_step is the loop under generate(): the same tokens; STOP at a step leaves the session
    holding exactly the tokens before it, with a checkpoint there (the next request reuses all of it)."""
    ids = model.tokenize(PROMPT)
    c = generate(model, ids, max_tokens=12, temperature=0, logit_bias=ban, session=model.session())
    sess = model.session()
    steps = steps_of(sess, ids, ban, max_tokens=12)
    got = [next(steps) for _ in range(5)]
    assert [st.token for st in got] == c.tokens[:5] and not any(st.last for st in got)
    assert sess.n_past == len(ids) + 4            # the yielded token is not evaluated yet
    end = finish(steps, STOP)
    assert end.reason == "stopped" and end.error is None
    assert sess.tokens == ids + c.tokens[:4]
    assert end.stats["prompt_tokens"] == len(ids) and end.stats["reused_prompt_tokens"] == 0
    assert end.stats["prefill_s"] > 0 and "ttft_s" not in end.stats and "generated_tokens" not in end.stats
    again = generate(model, ids + c.tokens[:4], max_tokens=1, temperature=0, logit_bias=ban, session=sess)
    assert again.stats["reused_prompt_tokens"] == len(ids) + 4 and again.tokens == c.tokens[4:5]


def test_the_step_loop_marks_its_last_step_and_ends_on_halt(tiny_path, model, ban):
    ids = model.tokenize(PROMPT)
    # max_tokens: the 6th step is the last; resuming after it ends the loop ("length")
    steps = steps_of(model.session(), ids, ban, max_tokens=6)
    got = [next(steps) for _ in range(6)]
    assert [st.last for st in got] == [False] * 5 + [True]
    assert finish(steps).reason == "length"
    assert list(steps_of(model.session(), ids, ban, max_tokens=0)) == []
    # a full context: the token at position n_ctx is the last (it cannot be evaluated)
    with Model(tiny_path, threads=2, n_ctx=len(ids) + 3, kv_type="f32") as small:
        sess = small.session()
        steps = steps_of(sess, ids, ban)
        got = [next(steps) for _ in range(4)]
        assert [st.last for st in got] == [False] * 3 + [True]
        assert finish(steps).reason == "context" and sess.n_past == small.n_ctx
    # halt: the loop ends before its next evaluation, the state holding the tokens before the last step
    halt = threading.Event()
    sess = model.session()
    steps = steps_of(sess, ids, ban, halt=halt)
    got = [next(steps) for _ in range(3)]
    halt.set()
    end = finish(steps)
    assert end.reason == "halted" and sess.tokens == ids + [st.token for st in got[:2]]
