"""Several sequences in one forward (strata_batch_eval) and the continuous-batching engine (issue 18,
points 1-3): batched logits are bit-identical to each sequence run alone, on the cpu and sim devices
(the offload path: resident, streamed and CPU expert groups), with verify windows, rollback and prefix
reuse; the engine's greedy output equals generate() alone; cancellation, budget and queue bounds."""
from __future__ import annotations

import math
import time

import numpy as np
import pytest

from pyrunner import Model, models
from pyrunner._native import StrataError
from pyrunner.engine import Engine, QueueFull
from pyrunner.generate import generate
from pyrunner.sampling import SamplingParams


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> str:
    out = tmp_path_factory.mktemp("engine") / "tiny-mtp.gguf"
    models.make_model("tiny", str(out), recipe="f32", seed=3, mtp=True)
    return str(out)


# device settings: the plain CPU pool, and the simulated device with a small cache (some groups
# resident, some copied over the link, some on the CPU); tail skip off: it is an approximation whose
# choices depend on what the cache holds, so no run of it is comparable with another
DEVICES = {"cpu": {}, "sim": {"device": "sim", "cache_gib": 0.0005, "pcie_frac": 0.5, "tail_skip": 0}}


def _model(path, dev, **kw):
    return Model(path, threads=2, n_ctx=1024, kv_type="f32", **DEVICES[dev], **kw)


def _ids(rng, m, n):
    return rng.integers(0, m.n_vocab, n).astype(np.int32)


@pytest.mark.parametrize("dev", list(DEVICES))
def test_batched_logits_are_bit_identical_to_alone(tiny, dev):
    """Sequences of very different lengths (a 700-token prompt: two native steps; a 1-token decode; a
    70-token prompt after an earlier one) in one batch: every logits and hidden row is the alone run's."""
    m = _model(tiny, dev)
    rng = np.random.default_rng(1)
    V, H = m.n_vocab, m.n_hidden
    pre = [_ids(rng, m, n) for n in (0, 5, 40)]
    new = [_ids(rng, m, n) for n in (700, 1, 70)]

    def run(batched):
        ss = [m.session() for _ in new]
        for s, p in zip(ss, pre):
            if p.size:
                s.eval(p)
        outs = [np.empty((n.size, V), np.float32) for n in new]
        hids = [np.empty((n.size, H), np.float32) for n in new]
        items = [(s, n, 1, o, h) for s, n, o, h in zip(ss, new, outs, hids)]
        if batched:
            m.eval_batch(items)
        else:
            for it in items:
                m.eval_batch([it])
        # then a decode step of all three together (or alone)
        last = [np.empty(V, np.float32) for _ in new]
        step = [(s, np.array([7], np.int32), 0, o, None) for s, o in zip(ss, last)]
        if batched:
            m.eval_batch(step)
        else:
            for it in step:
                m.eval_batch([it])
        return outs, hids, last, [s.n_past for s in ss]

    a, b = run(False), run(True)
    for x, y in zip(a[:3], b[:3]):
        for u, v in zip(x, y):
            assert np.array_equal(u, v)
    assert a[3] == b[3] == [p.size + n.size + 1 for p, n in zip(pre, new)]
    # and alone means the plain session call too
    s = m.session()
    s.eval(pre[1])
    ref = s.eval(new[1], all_logits=True)
    assert np.array_equal(ref, a[0][1])


def test_verify_windows_and_rollback_in_a_batch(tiny):
    """KEEP_STATES windows of two sessions in one batch, each rolled back to a different token: the
    states continue exactly as the same windows run alone."""
    m = _model(tiny, "cpu")
    rng = np.random.default_rng(2)
    p1, p2 = _ids(rng, m, 30), _ids(rng, m, 9)
    w1, w2 = _ids(rng, m, 4), _ids(rng, m, 3)

    def run(batched):
        s1, s2 = m.session(), m.session()
        s1.eval(p1)
        s2.eval(p2)
        for s in (s1, s2):
            s.set_spec_max(4)
        o1, o2 = (np.empty((w.size, m.n_vocab), np.float32) for w in (w1, w2))
        items = [(s1, w1, 3, o1, None), (s2, w2, 3, o2, None)]
        if batched:
            m.eval_batch(items)
        else:
            for it in items:
                m.eval_batch([it])
        s1.rollback(30 + 2)
        s2.rollback(9 + 1)
        return o1, o2, s1.eval([3]), s2.eval([4])

    for x, y in zip(run(False), run(True)):
        assert np.array_equal(x, y)


def test_a_bad_entry_is_refused_before_anything_runs(tiny):
    m = _model(tiny, "cpu")
    a, b = m.session(), m.session()
    a.eval([1, 2])
    ok = (a, np.array([3], np.int32), 0, np.empty(m.n_vocab, np.float32), None)
    bad = (b, np.array([m.n_vocab + 5], np.int32), 0, np.empty(m.n_vocab, np.float32), None)
    with pytest.raises(StrataError, match="batch entry 1: .*outside the vocabulary"):
        m.eval_batch([ok, bad])
    assert a.n_past == 2 and b.n_past == 0           # nothing ran
    with pytest.raises(StrataError, match="batch entries 0 and 1 name the same session"):
        m.eval_batch([ok, ok])
    small = (b, np.array([1, 2], np.int32), 1, np.empty(m.n_vocab, np.float32), None)
    with pytest.raises(StrataError, match="batch entry 1: .*logits buffer holds"):
        m.eval_batch([ok, small])
    assert a.n_past == 2 and b.n_past == 0
    m.eval_batch([])                                   # nothing to do
    m.eval_batch([ok])
    assert a.n_past == 3


PROMPTS = ["def read_config(path):", "import os\n", "class Foo:\n    def __init__(self):",
           "for i in range(10):\n", "x = [", "# a comment about things that\n"]


@pytest.mark.parametrize("dev", list(DEVICES))
def test_engine_greedy_equals_generate_alone(tiny, dev):
    """Requests of very different lengths at once (one of them a 600-token prompt, prefilled in chunks
    while the others decode), with MTP drafts on half of them: each text and token list is what
    generate() gives for it alone."""
    m = _model(tiny, dev)
    long_prompt = list(np.random.default_rng(3).integers(0, m.n_vocab, 600))
    prompts = PROMPTS + [long_prompt]
    limits = [24, 9, 31, 2, 17, 40, 12]
    mtps = [0, 3, 0, 2, 0, 3, 0]
    ref = [generate(m, p, max_tokens=n, temperature=0, mtp=k, session=m.session())
           for p, n, k in zip(prompts, limits, mtps)]
    with Engine(m, max_seqs=8, prefill_chunk=128) as eng:
        reqs = [eng.submit(p, SamplingParams(max_tokens=n, temperature=0), mtp=k)
                for p, n, k in zip(prompts, limits, mtps)]
        got = [r.result(120) for r in reqs]
        met = eng.metrics()
    for r, g in zip(ref, got):
        assert g.tokens == r.tokens and g.text == r.text and g.finish_reason == r.finish_reason
    assert met["requests_finished"] == len(prompts)
    assert met["drafts_proposed"] > 0
    # steps ran several sequences at once: fewer steps than tokens evaluated one sequence at a time
    assert met["steps_total"] < sum(limits)


def test_sampled_requests_replay_with_their_seed(tiny):
    m = _model(tiny, "cpu")
    params = [SamplingParams(max_tokens=20, temperature=0.9, seed=s) for s in (1, 2, 3)]
    ref = [generate(m, PROMPTS[i], session=m.session(), **{k: getattr(p, k) for k in
           ("max_tokens", "temperature", "seed")}) for i, p in enumerate(params)]
    with Engine(m, max_seqs=3) as eng:
        got = [eng.submit(PROMPTS[i], p) for i, p in enumerate(params)]
        got = [g.result(60) for g in got]
    assert [g.tokens for g in got] == [r.tokens for r in ref]


def test_a_shared_system_prompt_is_evaluated_once(tiny):
    """Requests that share a long beginning: the second one's prefill keeps a checkpoint where its
    prompt stops matching the first's (the engine compares it with recent prompts), so from the
    third on a free session holds the system prompt and only the rest is evaluated; a caller that
    knows the boundary (a chat's system message) names it with checkpoint_at and the second reuses it
    already. The output is the same as without reuse."""
    m = _model(tiny, "cpu")
    system = "You are a careful assistant. " * 12
    asks = ["Say hi.", "Count to three.", "Name a color.", "Add two and two."]
    n_sys = len(m.tokenize(system))
    ref = [generate(m, system + a, max_tokens=8, temperature=0, session=m.session()) for a in asks]
    p = SamplingParams(max_tokens=8, temperature=0)
    with Engine(m, max_seqs=2) as eng:
        got = [eng.submit(system + a, p).result(60) for a in asks[:3]]
        met = eng.metrics()
    assert [c.tokens for c in got] == [c.tokens for c in ref[:3]]
    assert got[0].stats["reused_prompt_tokens"] == got[1].stats["reused_prompt_tokens"] == 0
    assert got[2].stats["reused_prompt_tokens"] >= n_sys - 1
    assert met["reused_prompt_tokens_total"] >= n_sys - 1
    with Engine(m, max_seqs=2) as eng:
        first = eng.submit(system + asks[0], p, checkpoint_at=[n_sys - 1]).result(60)
        rest = [eng.submit(system + a, p) for a in asks[1:]]
        rest = [r.result(60) for r in rest]
    assert [c.tokens for c in [first] + rest] == [c.tokens for c in ref]
    assert rest[0].stats["reused_prompt_tokens"] >= n_sys - 1


def test_cancel_one_request_midway(tiny):
    """A request cancelled while the others decode ends "cancelled" within a step or two; the others'
    output is unchanged and its session goes back to the pool."""
    m = _model(tiny, "cpu")
    ref = [generate(m, p, max_tokens=40, temperature=0, session=m.session()) for p in PROMPTS[:3]]
    with Engine(m, max_seqs=3) as eng:
        reqs = [eng.submit(p, SamplingParams(max_tokens=40, temperature=0)) for p in PROMPTS[:3]]
        it = iter(reqs[1])
        next(it)                                 # it has started decoding
        reqs[1].cancel()
        got = [r.result(60) for r in reqs]
        met = eng.metrics()
    assert got[1].finish_reason == "cancelled" and len(got[1].tokens) < 40
    assert got[0].tokens == ref[0].tokens and got[2].tokens == ref[2].tokens
    assert met["requests_cancelled"] == 1 and met["requests_running"] == 0


def test_requests_run_on_the_engine_thread(tiny, monkeypatch):
    """Each request's generate loop (sampling, MTP drafts and windows, its session's evals) runs as a
    greenlet on the engine's one thread, not a thread of its own: no hand-off between threads per
    token. A running request's session evaluated from elsewhere is refused, not run beside the step."""
    import threading

    from pyrunner.model import Session
    m = _model(tiny, "cpu")
    where = set()
    plain = Session.eval

    def eval_(self, *a, **kw):
        where.add(threading.get_ident())
        return plain(self, *a, **kw)

    monkeypatch.setattr(Session, "eval", eval_)
    threads0 = threading.active_count()
    with Engine(m, max_seqs=5) as eng:
        # held runs for 900 tokens: still running while the test evaluates its session from outside
        held = eng.submit(PROMPTS[4], SamplingParams(max_tokens=900, temperature=0))
        reqs = [eng.submit(p, SamplingParams(max_tokens=12, temperature=0), mtp=k)
                for p, k in zip(PROMPTS[:4], (0, 2, 0, 3))]
        next(iter(held))
        assert threading.active_count() <= threads0 + 1           # the engine's thread, nothing per request
        sess = eng._sess_of.get(held)
        assert sess is not None, "the 900-token request ended before the check"
        with pytest.raises(RuntimeError, match="outside the engine"):
            plain(sess, [5])
        got = [r.result(60) for r in reqs]
        held.cancel()
        assert held.result(60).finish_reason == "cancelled"
        ident = eng._thread.ident
    assert where == {ident}
    assert all(g.finish_reason == "length" and len(g.tokens) == 12 for g in got)


def test_a_long_prompt_is_prefilled_in_chunks_beside_decoding(tiny):
    """The budget: while a 900-token prompt is prefilled in pieces, every step also carries the decoding
    request's token, and no step holds more than the budget of 64 tokens: 63 of prefill beside the
    decode token; the output is still generate()'s (pieces of one eval keep its bits)."""
    m = _model(tiny, "cpu")
    with Engine(m, max_seqs=2, prefill_chunk=64, token_budget=64, mtp=0) as eng:   # one token per decode step
        eng.step_log = []
        dec = eng.submit(PROMPTS[0], SamplingParams(max_tokens=60, temperature=0))
        next(iter(dec))
        long_ids = list(np.random.default_rng(4).integers(0, m.n_vocab, 900))
        big = eng.submit(long_ids, SamplingParams(max_tokens=4, temperature=0))
        got = big.result(60)
        dec.result(60)
        log = eng.step_log
    chunks = [s for s in log if s["prefill_tokens"] > 0]
    assert len(chunks) >= 900 // 64
    assert all(s["prefill_tokens"] + s["short"] <= 64 for s in log)
    both = [s for s in chunks if s["short"] > 0]
    assert len(both) >= len(chunks) - 2      # the decode ran beside (nearly) every piece
    assert sum(1 for s in both if s["prefill_tokens"] == 63) >= 10    # pieces that end inside GDN chunks
    assert got.tokens == generate(m, long_ids, max_tokens=4, temperature=0).tokens


def test_queue_bound_and_errors(tiny):
    m = _model(tiny, "cpu")
    with Engine(m, max_seqs=1, max_queue=1) as eng:
        a = eng.submit(PROMPTS[0], SamplingParams(max_tokens=30, temperature=0))
        b = eng.submit(PROMPTS[1], SamplingParams(max_tokens=3, temperature=0))
        with pytest.raises(QueueFull) as e:
            eng.submit(PROMPTS[2], SamplingParams(max_tokens=3, temperature=0))
        assert e.value.retry_after > 0
        with pytest.raises(ValueError, match="context"):
            eng.submit(list(range(5)) * 300, SamplingParams(max_tokens=3))
        assert a.result(60).finish_reason == "length" and b.result(60).finish_reason == "length"
    with pytest.raises(ValueError, match="give 1 to 512 tokens"):
        Engine(m, prefill_chunk=1000)


def test_close_cancels_what_is_in_flight(tiny):
    m = _model(tiny, "cpu")
    eng = Engine(m, max_seqs=1)
    a = eng.submit(PROMPTS[0], SamplingParams(max_tokens=-1, temperature=0))
    b = eng.submit(PROMPTS[1], SamplingParams(max_tokens=-1, temperature=0))
    next(iter(a))
    t0 = time.monotonic()
    res = eng.close(cancel=True)
    assert time.monotonic() - t0 < 30
    assert sorted(res["cancelled"]) == sorted([a.id, b.id])
    assert a.result(0).finish_reason == b.result(0).finish_reason == "cancelled"


def test_logprobs_are_the_model_distribution(tiny):
    m = _model(tiny, "cpu")
    with Engine(m, max_seqs=2) as eng:
        r = eng.submit(PROMPTS[0], SamplingParams(max_tokens=5, temperature=0), logprobs=3)
        pieces = list(r)
    toks = [t for p in pieces for t in p.tokens]
    lps = [x for p in pieces for x in p.logprobs]
    assert len(toks) == len(lps) == 5 and [x.token for x in lps] == toks
    s = m.session()
    logits = s.eval(m.tokenize(PROMPTS[0]))
    x = logits.astype(np.float64)
    ref = x - (x.max() + np.log(np.exp(x - x.max()).sum()))
    assert lps[0].logprob == pytest.approx(ref[toks[0]], abs=1e-9)
    assert [t for t, _, _ in lps[0].top] == list(np.argsort(-ref, kind="stable")[:3])
    assert lps[0].top[0][0] == toks[0]                 # greedy picks the most likely


def test_an_error_of_the_engines_own_ends_every_request_instead_of_hanging(tiny):
    """A bug in the engine's loop (here: its planner raising at the fifth step; `--itl-factor inf` once did
    so with OverflowError) ends the running, the waiting and the queued requests with finish_reason
    "error" naming it, within seconds; submit() then raises EngineStopped and close() returns. Before,
    the engine's thread died and every request waited forever."""
    from faults import planner_failing_at
    from pyrunner.engine import EngineStopped

    m = _model(tiny, "cpu")
    eng = Engine(m, max_seqs=2)
    eng._plan_for = planner_failing_at(eng._plan_for, 5)
    reqs = [eng.submit(p, SamplingParams(max_tokens=40, temperature=0)) for p in PROMPTS[:3]]
    for r in reqs:
        assert r.wait(30), "a request hung after the engine's loop failed"
        c = r.result(0)
        assert c.finish_reason == "error" and "OverflowError" in c.error, c
    with pytest.raises(EngineStopped, match="the engine stopped on an error of its own"):
        eng.submit(PROMPTS[0], SamplingParams(max_tokens=2))
    t0 = time.monotonic()
    eng.close()
    assert time.monotonic() - t0 < 30


def test_logprob_records_on_ties_and_large_vocabularies():
    """_LogprobSampler's records against their definition: log-softmax in float64, the top n by
    log-probability, ties to the lower id. Vectors with many ties at the cut (the partition alone kept an
    arbitrary few of them: 70 of these 300 cases differed) and of 151,936 logits."""
    from pyrunner.engine import _LogprobSampler

    class Tok:
        def token_bytes(self, t):
            return b"x"

    rng = np.random.default_rng(3)
    for trial in range(300):
        V = int(rng.choice([5, 16, 8192, 151936]))
        x = (rng.standard_normal(V) * rng.uniform(0.1, 8)).astype(np.float32)
        if trial % 3 == 0:
            x[rng.integers(V, size=V // 4)] = x.max()
        if trial % 5 == 0:
            x = np.round(x)
        n_top = min(int(rng.integers(1, 21)), V)
        s = _LogprobSampler(SamplingParams(temperature=0), n_top, Tok())
        t = s.sample(x)
        r = s.records[0]
        x64 = x.astype(np.float64)
        lp = x64 - (x64.max() + np.log(np.exp(x64 - x64.max()).sum()))
        want = np.argsort(-lp, kind="stable")[:n_top]
        assert r.token == t and abs(r.logprob - lp[t]) < 1e-9
        assert [i for i, _, _ in r.top] == [int(i) for i in want]
        assert all(abs(v - lp[i]) < 1e-9 for i, _, v in r.top)


def test_state_grows_with_use(tiny):
    """A session's caches start at one chunk and grow as it fills (strata_session_state_bytes), not
    at n_ctx; growing through several chunks changes no bit, and rollback / checkpoints still work."""
    m = Model(tiny, threads=2, n_ctx=4096, kv_type="f16")
    rng = np.random.default_rng(5)
    ids = _ids(rng, m, 1100)
    a, b = m.session(), m.session()
    small = a.state_bytes
    assert m.state_fixed_bytes < small < m.state_bytes / 8
    b.eval(ids)                                # b grows to 1100 tokens at once, then starts over
    b.reset()
    for s in (a, b):                           # a grows chunk by chunk, b is already grown
        for i in range(0, 1088, 64):
            s.eval(ids[i:i + 64])
            if s is a:
                assert a.state_bytes <= m.state_fixed_bytes + m.state_token_bytes * max(256, 2 * (i + 64))
    la, lb = a.eval(ids[1088:]), b.eval(ids[1088:])
    assert np.array_equal(la, lb)
    assert small < a.state_bytes <= m.state_bytes
    ck = a.checkpoint()
    a.eval(ids[:40])
    a.restore(ck)
    assert np.array_equal(a.eval([5]), b.eval([5]))


@pytest.mark.parametrize("chunk", [1, 16, 50, 64, 192, 512, "random"])
def test_prefill_chunks_give_the_bits_of_one_eval(tiny, chunk):
    """The engine's prefill pieces (next_chunk, STRATA_EVAL_CONTINUED) give the logits of every row of
    one eval of the whole prompt, bit for bit, at lengths whose last native step is short (the
    recurrence), long, or whole chunks, and pieces of any size: those that end inside a GDN chunk
    leave it open for the next."""
    from pyrunner.engine import next_chunk
    m = Model(tiny, threads=2, n_ctx=2048, kv_type="f32")
    rng = np.random.default_rng(6)
    for n in (40, 100, 520, 600, 700, 1100, 1030, 1024):
        ids = _ids(rng, m, n)
        one = m.session()
        ref = one.eval(ids, all_logits=True)
        s, pos, outs = m.session(), 0, []
        while pos < n:
            want = int(rng.integers(1, 200)) if chunk == "random" else chunk
            c, cont = next_chunk(n, pos, want, 512)
            assert 1 <= c <= want
            outs.append(s.eval(ids[pos:pos + c], all_logits=True, continued=cont))
            pos += c
        assert np.array_equal(np.concatenate(outs), ref), (n, chunk)
        assert np.array_equal(s.eval([3]), one.eval([3]))   # and the state after them


def test_pieces_without_the_flag_differ_and_an_open_chunk_is_guarded(tiny):
    """Without STRATA_EVAL_CONTINUED, pieces that end inside a GDN chunk give other bits (what the flag
    is for); while a chunk is open, a checkpoint and a verify window are refused with a message, and
    reset or restore drop it."""
    m = Model(tiny, threads=2, n_ctx=1024, kv_type="f32")
    ids = _ids(np.random.default_rng(8), m, 100)
    ref = m.session().eval(ids)
    s = m.session()
    s.eval(ids[:40])
    assert not np.array_equal(s.eval(ids[40:]), ref)
    s = m.session()
    ck0 = s.checkpoint()
    s.eval(ids[:40], continued=True)
    with pytest.raises(StrataError, match="left a GDN chunk open"):
        s.checkpoint()
    s.set_spec_max(4)
    with pytest.raises(StrataError, match="left a GDN chunk open"):
        s.eval(ids[40:42], keep_states=True)
    with pytest.raises(StrataError, match="KEEP_STATES"):
        m.session().eval(ids[:4], keep_states=True, continued=True)
    assert np.array_equal(s.eval(ids[40:]), ref)      # the refusals left the open chunk as it was
    s.eval(ids[:50], continued=True)
    s.restore(ck0)
    assert np.array_equal(s.eval(ids), ref)
    s.eval(ids[:50], continued=True)
    s.reset()
    assert np.array_equal(s.eval(ids), ref)


def test_many_short_sequences_fit_where_long_ones_queue(tiny):
    """The live-sequence bound comes from the state each request grows to: with room for about one
    2000-token request, two such run one after the other, while eight short ones run at once."""
    m = Model(tiny, threads=2, n_ctx=4096, kv_type="f32")
    eog = {t: -np.inf for t in __import__("pyrunner.generate", fromlist=["x"]).end_of_generation_ids(m)}
    long_p = SamplingParams(max_tokens=1500, temperature=0, logit_bias=eog)
    with Engine(m, max_seqs=16) as probe:
        one = probe.state_need(probe.submit("a", long_p))
        probe.close()
    budget = int(one * 1.5)
    with Engine(m, max_seqs=16, memory_bytes=budget) as eng:
        a = eng.submit("first long one", long_p)
        b = eng.submit("second long one", long_p)
        next(iter(a))
        met = eng.metrics()
        assert met["requests_running"] == 1 and met["requests_queued"] == 1
        a.cancel()
        b.cancel()
        a.result(60), b.result(60)
        short = [eng.submit(p, SamplingParams(max_tokens=30, temperature=0, logit_bias=eog)) for p in PROMPTS + ["z"] * 2]
        seen = 0
        while not all(r.done for r in short):
            seen = max(seen, eng.metrics()["requests_running"])
            time.sleep(0.002)
        assert seen == 8
        assert 0 < eng.metrics()["state_bytes"] <= budget


def test_bench_serve_measures_every_row(tiny):
    """strata bench serve's rows on a tiny model (what it measures, not how fast): every concurrency
    has a decode and a mixed row, the expert bytes read per token come from the routing trace (a step
    of more sequences reads each picked expert once, so per token it never reads more), and the batch
    run's tokens are the same at --parallel 1 and N."""
    from click.testing import CliRunner
    from pyrunner.cli import main
    import json
    r = CliRunner().invoke(main, ["bench", "serve", "-m", tiny, "--concurrency", "1,4", "--gen-tokens", "6",
                                  "--long-prompt", "200", "--batch-requests", "6", "--batch-tokens", "5",
                                  "--batch-parallel", "3", "--batch-rounds", "2", "--json"])
    assert r.exit_code == 0, r.output
    res = json.loads(r.output[r.output.index("{"):])
    rows = {(x["concurrency"], x["mode"]): x for x in res["rows"]}
    assert set(rows) == {(1, "decode"), (1, "mixed"), (4, "decode"), (4, "mixed")}
    d1, d4 = rows[(1, "decode")], rows[(4, "decode")]
    assert d1["generated_tokens"] == 6 and d4["generated_tokens"] == 24
    assert 0 < d4["expert_bytes_per_token"] <= d1["expert_bytes_per_token"]
    assert rows[(4, "mixed")]["itl_ms_p99_during_prefill"] >= 0 and d4["vs_single"] > 0
    assert res["batch"]["same_tokens"] is True and res["batch"]["ratio"] > 0
    # two rounds, each with both runs; the ratio is their median (the mean of two)
    rounds = res["batch"]["rounds"]
    assert len(rounds) == 2 and all(x["tps_parallel_1"] > 0 and x["tps_parallel_3"] > 0 for x in rounds)
    assert abs(res["batch"]["ratio"] - (rounds[0]["ratio"] + rounds[1]["ratio"]) / 2) < 1e-9


def test_itl_factor_sizes_prefill_pieces_from_live_costs(tiny):
    """itl_factor: the planner gives a long prompt (X - 1) x decode-step / per-token-cost tokens while a
    request decodes (the costs as _learn_costs measured them), the whole budget when none decodes, and
    learns the costs from the steps it runs: decode-only steps set the decode cost, mixed ones the
    per-token cost; a step holding a short prompt teaches nothing. The output stays generate()'s."""
    from pyrunner.engine import _Pending

    m = _model(tiny, "cpu")
    with Engine(m, max_seqs=2, itl_factor=3.0) as eng:
        dec = _Pending(None, None, np.zeros(1, np.int32), 0, None, None)
        big = _Pending(None, None, np.zeros(900, np.int32), 0, None, None)
        eng._t_decode, eng._t_token = None, None
        assert [b - a for _, a, b, *_ in eng._plan_for([dec, big])] == [1, 16]    # costs unknown: a small piece
        eng._t_decode, eng._t_token = 0.010, 0.001
        assert [b - a for _, a, b, *_ in eng._plan_for([dec, big])] == [1]        # the prefill's 2nd step: a probe
        assert [b - a for _, a, b, *_ in eng._plan_for([dec, big])] == [1, 20]    # (3 - 1) x 10 ms / 1 ms
        assert [b - a for _, a, b, *_ in eng._plan_for([big])] == [512]           # nobody decodes: whole steps
        eng._t_decode, eng._t_token = None, None
        eng._decode_times.clear()
        for dt in (0.004, 0.006, 0.005):
            eng._learn_costs(dt, [(dec, 0, 1, True, False)])
        assert eng._t_decode == pytest.approx(0.005)
        eng._learn_costs(0.025, [(dec, 0, 1, True, False), (big, 0, 10, False, True)])
        assert eng._t_token == pytest.approx(0.002)
        eng._learn_costs(0.5, [(_Pending(None, None, np.zeros(16, np.int32), 0, None, None), 0, 16, True, False)])
        assert eng._t_decode == pytest.approx(0.005)                             # a short prompt: not a decode step
        eng._t_decode = eng._t_token = None
        eng._decode_times.clear()
        eng.step_log = []
        d = eng.submit(PROMPTS[0], SamplingParams(max_tokens=80, temperature=0))
        it = iter(d)
        for _ in range(20):
            next(it)
        long_ids = list(np.random.default_rng(9).integers(0, m.n_vocab, 700))
        got = eng.submit(long_ids, SamplingParams(max_tokens=3, temperature=0)).result(60)
        d.result(60)
        assert eng._t_decode > 0 and eng._t_token > 0
        mixed = [s for s in eng.step_log if s["prefill_tokens"] and s["short"]]
        assert mixed and max(s["prefill_tokens"] for s in mixed) < 512
    assert got.tokens == generate(m, long_ids, max_tokens=3, temperature=0).tokens
    for bad in (1.0, math.inf, math.nan):
        with pytest.raises(ValueError, match="factor > 1"):
            Engine(m, itl_factor=bad)


def test_itl_factor_probes_the_decode_cost_during_a_long_prefill(tiny):
    """A decode cost learned in a slow spell of the host (every decode-only step 3x its usual time, just
    before a long prompt came) cannot be corrected by the prefill's own steps, which all carry prompt
    tokens: pieces sized from it made steps ~5x a decode step (flash-small's bench serve: ITL p99 7.2x
    and 7.5x the decode-only median, in 2 runs of 12). The second step of a prefill beside decoders, then
    every DECODE_PROBE-th, is decode-only; a probe well under the learned cost starts the window afresh,
    one merely noisy does not."""
    from pyrunner.engine import DECODE_PROBE, _Pending

    m = _model(tiny, "cpu")
    with Engine(m, max_seqs=2, itl_factor=3.0) as eng:
        dec = _Pending(None, None, np.zeros(1, np.int32), 0, None, None)
        big = _Pending(None, None, np.zeros(5000, np.int32), 0, None, None)

        def step(dt_decode, dt_token):
            """Plan a step, 'run' it at these costs, learn from it; the prefill tokens it carried."""
            batch = eng._plan_for([dec, big])
            pre = sum(b - a for _, a, b, sh, _ in batch if not sh)
            eng._learn_costs(dt_decode + dt_token * pre, batch)
            return pre

        for _ in range(16):                        # the slow spell: decode steps at 30 ms
            eng._learn_costs(0.030, [(dec, 0, 1, True, False)])
        eng._t_token = 0.001 / 3                   # as the mixed steps measured it against the stale 30 ms
        # the host is back to 10 ms a decode step: 2 x 30 / (1/3) = 180 tokens (a 190 ms step), then the
        # prefill's first probe, which starts the window again
        assert [step(0.010, 0.001) for _ in range(2)] == [180, 0]
        assert eng._t_decode == pytest.approx(0.010) and eng.counters["decode_cost_resets"] == 1
        # the per-token cost measured against the stale figure is kept (low): a few large pieces, then
        # 2 x 10 ms / 1 ms (without the probe the pieces settle at 80: 2 x 30 / t = f and t = 1 - 20 / f ms)
        pieces = [step(0.010, 0.001) for _ in range(14)]
        assert 40 <= pieces[0] <= 46 and pieces == sorted(pieces, reverse=True) and pieces[-1] == 20
        # steady costs: one probe every DECODE_PROBE steps, and a probe at 0.8x the cost (noise) keeps the window
        pieces = [step(0.010, 0.001) for _ in range(3 * DECODE_PROBE)]
        assert pieces.count(0) == 3 and set(pieces) == {0, 20}
        eng._since_probe = DECODE_PROBE - 1
        n = len(eng._decode_times)
        assert step(0.008, 0.001) == 0 and len(eng._decode_times) == n + 1
        assert eng.counters["decode_cost_resets"] == 1
        # nobody decodes: no probes, whole steps; the next prefill beside a decoder probes at its 2nd step
        assert all(b - a == 512 for _ in range(2 * DECODE_PROBE) for _, a, b, *_ in eng._plan_for([big]))
        assert [step(0.010, 0.001) for _ in range(3)] == [20, 0, 20]
