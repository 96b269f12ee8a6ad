"""Sampling: each filter exactly on hand-made logits, neutral values as exact no-ops, the whole
chain against an independent reference (plain sorts and loops), empirical frequencies of seeded
draws against the exact post-filter distribution, seed reproducibility, and stop strings."""
from __future__ import annotations

import math
import random
from dataclasses import replace

import click
import numpy as np
import pytest
from click.testing import CliRunner

from model_oracles import llama_sampler_chains
from pyrunner.sampling import (
    SamplingParams, StopCriteria, StopStream, apply_logit_bias, apply_min_p, apply_penalties,
    apply_temperature, apply_top_k, apply_top_p, click_options, draw, make_sampler, params_from_cli,
    parse_logit_bias, probabilities, token_counts,
)

NEG = -np.inf


def f32(*v):
    return np.array(v, dtype=np.float32)


def kept(x):
    return set(np.flatnonzero(np.isfinite(x)).tolist())


# ------------------------------------------------------------------ independent reference chain


def ref_distribution(logits, history, p: SamplingParams) -> np.ndarray:
    """The chain written plainly: Python loops, full sorts, float64 probabilities."""
    x = [float(v) for v in np.asarray(logits, np.float32)]
    n = len(x)
    for t, b in (p.logit_bias or {}).items():
        x[t] = float(np.float32(x[t]) + np.float32(b))
    h = list(history)
    window = h if p.repeat_last_n < 0 else h[-p.repeat_last_n:] if p.repeat_last_n > 0 else []
    for t in set(window):
        c = window.count(t)
        v = np.float32(x[t])
        v = v / np.float32(p.repeat_penalty) if v > 0 else v * np.float32(p.repeat_penalty)
        x[t] = float(v - (np.float32(p.presence_penalty) + np.float32(p.frequency_penalty) * np.float32(c)))
    if p.temperature <= 0:
        d = np.zeros(n)
        d[max(range(n), key=lambda i: (x[i], -i))] = 1.0
        return d
    order = sorted(range(n), key=lambda i: (-x[i], i))          # best first, ties: lower id
    alive = [i for i in order if x[i] > -math.inf]
    if 0 < p.top_k < n:
        alive = alive[: p.top_k]

    def probs(ids):
        m = max(x[i] for i in ids)
        e = [math.exp(x[i] - m) for i in ids]
        s = sum(e)
        return [v / s for v in e]

    if p.top_p < 1.0:
        pr, c, cut = probs(alive), 0.0, len(alive)
        for j, q in enumerate(pr):
            c += q
            if c >= p.top_p:
                cut = j + 1
                break
        alive = alive[:cut]
    if p.min_p > 0:
        pr = probs(alive)
        alive = [i for i, q in zip(alive, pr) if q >= p.min_p * max(pr) * (1 - 1e-12)]
    m = max(x[i] for i in alive)
    e = {i: math.exp((x[i] - m) / p.temperature) for i in alive}
    s = sum(e.values())
    d = np.zeros(n)
    for i, v in e.items():
        d[i] = v / s
    return d


def tv(a, b):
    return 0.5 * float(np.abs(np.asarray(a) - np.asarray(b)).sum())


# ------------------------------------------------------------------ filters, exactly


def test_logit_bias_adds_and_bans():
    x = f32(1, 2, 3, 4)
    y = apply_logit_bias(x, {0: 2.5, 3: -np.inf})
    assert y.tolist() == [3.5, 2, 3, NEG] and x.tolist() == [1, 2, 3, 4]  # input untouched
    with pytest.raises(ValueError, match="token 4.*4 tokens"):
        apply_logit_bias(x, {4: 1.0})


def test_logit_bias_banned_token_never_sampled():
    x = f32(5.0, 0.0, 0.0, 0.0)          # token 0 would be ~95 % of the mass
    s = make_sampler(SamplingParams.neutral(seed=3, logit_bias={0: -np.inf}))
    draws = [s.sample(x) for _ in range(5000)]
    assert 0 not in draws and set(draws) == {1, 2, 3}
    g = make_sampler(SamplingParams.greedy(logit_bias={"0": -np.inf}))   # JSON-style string key
    assert g.sample(x) == 1
    with pytest.raises(ValueError, match="bans every token"):
        make_sampler(SamplingParams.neutral(logit_bias={i: -np.inf for i in range(4)})).sample(x)


def test_greedy_with_a_bias_is_the_argmax_of_the_biased_logits():
    """The greedy sampler's shortcut (only biased tokens can beat the unbiased argmax, so the vocabulary
    is not copied) against np.argmax of apply_logit_bias's vector: ties on both sides of the top, the top
    itself biased, bans, positive biases, -inf logits."""
    rng = np.random.default_rng(7)
    for _ in range(3000):
        n = int(rng.integers(1, 40))
        x = rng.integers(-3, 4, n).astype(np.float32)          # small integers: many ties
        if rng.random() < 0.2:
            x[rng.integers(0, n)] = NEG
        toks = rng.choice(n, int(rng.integers(1, min(n, 5) + 1)), replace=False)
        bias = {int(t): float(rng.choice([NEG, -2.0, -1.0, 0.0, 0.5, 1.0, 3.0])) for t in toks}
        s = make_sampler(SamplingParams.greedy(logit_bias=bias))
        xb = apply_logit_bias(x, bias)
        if np.isfinite(xb.max()):
            assert s.sample(x) == int(np.argmax(xb)), (x.tolist(), bias)
        else:
            with pytest.raises(ValueError, match="bans every token"):
                s.sample(x)
    with pytest.raises(ValueError, match="token 9.*4 tokens"):       # a bad id: apply_logit_bias's error
        make_sampler(SamplingParams.greedy(logit_bias={9: 1.0})).sample(f32(1, 2, 3, 4))


def test_repetition_penalty_llama_semantics():
    x = f32(2.0, -2.0, 0.0, 3.0, -1.0)
    ids, counts = token_counts([0, 1, 2, 0, 0], -1)
    y = apply_penalties(x, ids, counts, repeat_penalty=2.0)
    # seen positive: divided; seen negative: multiplied; seen zero stays; unseen untouched
    assert y.tolist() == [1.0, -4.0, 0.0, 3.0, -1.0]
    y = apply_penalties(x, ids, counts, repeat_penalty=0.5)      # < 1 rewards repeats
    assert y.tolist() == [4.0, -1.0, 0.0, 3.0, -1.0]


def test_penalty_window_last_n():
    hist = [3, 3, 1, 0, 0]
    assert dict(zip(*[a.tolist() for a in token_counts(hist, 2)])) == {0: 2}
    assert dict(zip(*[a.tolist() for a in token_counts(hist, 3)])) == {0: 2, 1: 1}
    assert dict(zip(*[a.tolist() for a in token_counts(hist, -1)])) == {0: 2, 1: 1, 3: 2}
    assert len(token_counts(hist, 0)[0]) == 0
    assert dict(zip(*[a.tolist() for a in token_counts(hist, 100)])) == {0: 2, 1: 1, 3: 2}
    x = f32(1, 1, 1, 1)
    s = make_sampler(SamplingParams.greedy(repeat_penalty=4.0, repeat_last_n=2))
    assert s.filtered_logits(x, hist).tolist() == [0.25, 1, 1, 1]


def test_presence_and_frequency_counts():
    x = f32(1.0, 1.0, 1.0, -1.0)
    ids, counts = token_counts([0, 0, 0, 1, 3, 3], -1)
    y = apply_penalties(x, ids, counts, presence_penalty=0.5, frequency_penalty=0.25)
    assert y.tolist() == [1 - 0.5 - 0.75, 1 - 0.5 - 0.25, 1.0, -1 - 0.5 - 0.5]
    # repetition first, then presence/frequency (llama.cpp's order within its penalties step)
    y = apply_penalties(x, ids, counts, repeat_penalty=2.0, presence_penalty=1.0, frequency_penalty=1.0)
    assert y.tolist() == [0.5 - 1 - 3, 0.5 - 1 - 1, 1.0, -2 - 1 - 2]
    with pytest.raises(ValueError, match="token 9"):
        apply_penalties(x, *token_counts([9], -1), repeat_penalty=1.1)


def test_top_k_keeps_exactly_k_with_ties_to_lowest_ids():
    x = f32(1, 5, 3, 5, 3, 3, 0)
    assert kept(apply_top_k(x, 1)) == {1}
    assert kept(apply_top_k(x, 2)) == {1, 3}
    assert kept(apply_top_k(x, 3)) == {1, 3, 2}
    assert kept(apply_top_k(x, 4)) == {1, 3, 2, 4}
    y = apply_top_k(x, 4)
    assert y[[1, 3, 2, 4]].tolist() == [5, 5, 3, 3]                  # values unchanged
    rng = np.random.default_rng(0)
    for k in (1, 7, 50, 199):
        z = rng.integers(-3, 3, 200).astype(np.float32)               # many ties
        keep = kept(apply_top_k(z, k))
        assert len(keep) == k
        assert keep == set(sorted(range(200), key=lambda i: (-z[i], i))[:k])


def test_top_p_boundary_and_minimum():
    pr = np.array([0.5, 0.25, 0.125, 0.0625, 0.0625])
    x = np.log(pr).astype(np.float32)[[2, 0, 4, 1, 3]]    # shuffled: ids 1,3,0,2,4 by probability
    q = probabilities(x)
    assert kept(apply_top_p(x, 0.5 - 1e-6)) == {1}
    assert kept(apply_top_p(x, 0.5 + 1e-6)) == {1, 3}
    assert kept(apply_top_p(x, 0.75 - 1e-6)) == {1, 3}
    assert kept(apply_top_p(x, 0.75 + 1e-6)) == {1, 3, 0}
    assert kept(apply_top_p(x, 0.0)) == {1}                              # at least one token
    assert kept(apply_top_p(x, 0.999)) == {0, 1, 2, 3, 4}
    assert abs(q[1] - 0.5) < 1e-6
    # equal probabilities: the lower id comes first
    assert kept(apply_top_p(f32(0, 0, 0, 0), 0.5)) == {0, 1}
    assert kept(apply_top_p(f32(0, 0, 0, 0), 0.5 + 1e-6)) == {0, 1, 2}


@pytest.mark.parametrize("n,scale", [(300_000, 8.0), (60_000, 2.0), (20_000, 0.01)])
def test_top_p_large_vocab_fast_path_and_fallback(n, scale):
    # scale 8: the mass sits in a few tokens (the best-1024 shortcut); scale 2: 1,198 and 13,789
    # tokens (the 16x wider pass); 0.01: nearly flat (9,921 and 17,966: wider pass, then the full
    # sort). Every path must equal a full stable sort.
    x = (np.random.default_rng(1).standard_normal(n) * scale).astype(np.float32)
    x[:50] = x[50]                                                       # ties, too
    for p in (0.5, 0.9):
        got = kept(apply_top_p(x, p))
        pr = probabilities(x)
        order = np.lexsort((np.arange(n), -x.astype(np.float64)))
        k = int(np.searchsorted(np.cumsum(pr[order]), p)) + 1
        assert got == set(order[:k].tolist())


def test_min_p():
    pr = np.array([0.4, 0.2, 0.1, 0.3])
    x = np.log(pr).astype(np.float32)
    assert kept(apply_min_p(x, 0.5 - 1e-6)) == {0, 1, 3}       # 0.2 >= 0.5 * 0.4
    assert kept(apply_min_p(x, 0.5 + 1e-6)) == {0, 3}
    assert kept(apply_min_p(x, 1.0)) == {0}
    assert kept(apply_min_p(f32(2, 2, 1), 1.0)) == {0, 1}      # ties with the maximum survive


def test_temperature():
    x = f32(1.0, 2.0, 0.5, NEG)
    for t in (0.3, 0.7, 2.0):
        want = np.exp(np.array([1.0, 2.0, 0.5]) / t)
        want /= want.sum()
        assert np.allclose(probabilities(apply_temperature(x, t))[:3], want, rtol=1e-6)
        assert probabilities(apply_temperature(x, t))[3] == 0.0
    tiny = probabilities(apply_temperature(f32(1.0, 1.0 - 1e-3, 0.0), 1e-30))   # no overflow
    assert tiny.tolist() == [1.0, 0.0, 0.0]
    with pytest.raises(ValueError):
        apply_temperature(x, 0.0)


def test_greedy_ties_to_lowest_id_and_no_randomness():
    x = f32(1.0, 3.0, 3.0, 2.0)
    s = make_sampler(SamplingParams.greedy(seed=1))
    assert [s.sample(x) for _ in range(5)] == [1] * 5
    assert s._rng.bit_generator.state == np.random.Generator(np.random.PCG64(1)).bit_generator.state
    assert make_sampler(SamplingParams.greedy(temperature=-1.0)).sample(x) == 1
    # penalties do act under greedy
    assert make_sampler(SamplingParams.greedy(repeat_penalty=2.0)).sample(x, [1, 2]) == 3
    d = s.distribution(x)
    assert d.tolist() == [0.0, 1.0, 0.0, 0.0]


def test_draw_inverts_the_cdf_and_skips_zero_probabilities():
    pr = np.array([0.0, 0.25, 0.0, 0.75, 0.0])
    assert [draw(pr, u) for u in (0.0, 0.2499, 0.25, 0.6, 0.999999)] == [1, 1, 3, 3, 3]
    assert draw(np.array([0.0, 0.0, 1.0]), 0.0) == 2


def test_neutral_values_are_exact_noops():
    x = np.random.default_rng(2).standard_normal(1000).astype(np.float32)
    ids, counts = token_counts([1, 2, 2, 3], -1)
    assert apply_logit_bias(x, None) is x and apply_logit_bias(x, {}) is x
    assert apply_penalties(x, ids, counts, 1.0, 0.0, 0.0) is x
    assert apply_top_k(x, 0) is x and apply_top_k(x, -1) is x and apply_top_k(x, 1000) is x
    assert apply_top_p(x, 1.0) is x
    assert apply_min_p(x, 0.0) is x
    assert apply_temperature(x, 1.0) is x
    s = make_sampler(SamplingParams.neutral(repeat_last_n=-1))
    y = s.filtered_logits(x, [1, 2, 2, 3])
    assert y.dtype == np.float32 and np.array_equal(y, x)
    assert np.array_equal(s.distribution(x), probabilities(x))
    # a non-neutral setting changes them (the comparison above can fail)
    assert not np.array_equal(make_sampler(SamplingParams.neutral(top_k=999)).filtered_logits(x), x)


# ------------------------------------------------------------------ the chain

CONFIGS = [
    SamplingParams.neutral(),
    SamplingParams(),                                                  # llama.cpp defaults
    SamplingParams(temperature=0.7, top_k=12, top_p=0.8, min_p=0.0),
    SamplingParams(temperature=1.3, top_k=0, top_p=0.9, min_p=0.02, repeat_penalty=1.3,
                   presence_penalty=0.4, frequency_penalty=0.3, repeat_last_n=6,
                   logit_bias={4: -np.inf, 7: 1.5}),
    SamplingParams(temperature=0.5, top_k=5, top_p=1.0, min_p=0.3),
    SamplingParams.greedy(repeat_penalty=1.5, logit_bias={0: 2.0}),
]


def _logits(n=40, seed=0):
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(n) * 1.5).astype(np.float32)
    x[5] = x[6]                                                        # a tie
    x[9] = -0.75                                                       # a negative, penalised
    return x


@pytest.mark.parametrize("i", range(len(CONFIGS)))
def test_chain_matches_reference(i):
    p = CONFIGS[i]
    hist = [9, 3, 3, 1, 9, 9, 20, 5, 0]
    for seed in range(5):
        x = _logits(seed=seed)
        d = make_sampler(p).distribution(x, hist)
        r = ref_distribution(x, hist, p)
        assert np.array_equal(d > 0, r > 0), (seed, np.flatnonzero(d > 0), np.flatnonzero(r > 0))
        assert np.allclose(d, r, atol=1e-12, rtol=1e-9)


@pytest.mark.parametrize("i", [0, 2, 3, 4])
def test_empirical_frequencies(i):
    """30k seeded draws against the exact distribution: total variation < 0.03 (0.006-0.015
    seen, ~0.015 expected for 40 live tokens; deterministic under the fixed seed) and a
    chi-square below dof + 6 sigma, while plausible mistakes (top-k wrong, penalties or bias
    dropped, temperature off by 1.5x) move the distribution by twice the bound or more."""
    p = CONFIGS[i]
    hist = [9, 3, 3, 1, 9, 9, 20, 5, 0]
    x = _logits(seed=11)
    s = make_sampler(p, seed=1234)
    want = ref_distribution(x, hist, p)
    n = 30_000
    freq = np.bincount([s.sample(x, hist) for _ in range(n)], minlength=len(x)) / n
    assert set(np.flatnonzero(freq)) <= set(np.flatnonzero(want))
    assert tv(freq, want) < 0.03
    live = want > 0
    chi2 = float((((freq - want)[live]) ** 2 / want[live]).sum() * n)
    dof = int(live.sum()) - 1
    assert chi2 < dof + 6 * math.sqrt(2 * max(dof, 1)) + 10
    # the bound separates the right distribution from wrong ones
    wrong = [SamplingParams(**{**p.__dict__, "top_k": 3}),
             SamplingParams(**{**p.__dict__, "repeat_penalty": 1.0, "presence_penalty": 0.0,
                               "frequency_penalty": 0.0, "logit_bias": None}),
             SamplingParams(**{**p.__dict__, "temperature": p.temperature * 1.5})]
    for w in wrong:
        alt = ref_distribution(x, hist, w)
        if not np.array_equal(alt, want):
            assert tv(alt, want) > 0.06, w


def _chain_cases(n_cases: int, seed: int):
    """(logits, params, history): random vectors with ties, banned tokens and flat stretches, at random
    settings of every filter, a few at a full vocabulary."""
    rng = np.random.default_rng(seed)
    for case in range(n_cases):
        n = int(rng.choice([5, 17, 64, 1000, 8192])) if case % 25 else 151_936
        kind = case % 5
        if kind == 0:
            x = rng.standard_normal(n) * rng.uniform(0.1, 8)
        elif kind == 1:
            x = rng.integers(-3, 3, n).astype(np.float64)               # ties everywhere
        elif kind == 2:
            x = np.round(rng.standard_normal(n) * 2, 1)
        elif kind == 3:
            x = np.zeros(n)
        else:
            x = rng.standard_normal(n) * 3
            x[rng.integers(0, n, max(1, n // 3))] = -np.inf                  # banned
        kw = dict(temperature=float(rng.choice([0.3, 0.8, 1.0, 1.7])),
                  top_k=int(rng.choice([0, 1, 2, 3, 40, n - 1, n, n + 5])),
                  top_p=float(rng.choice([1.0, 0.95, 0.5, 0.0, 0.999])), min_p=float(rng.choice([0.0, 0.05, 0.5, 1.0])),
                  seed=int(rng.integers(0, 2**32)))
        if case % 7 == 0:
            kw.update(repeat_penalty=1.3, presence_penalty=0.5)
        if case % 11 == 0:
            kw.update(logit_bias={int(rng.integers(0, n)): 2.5})
        yield x.astype(np.float32), SamplingParams(**kw), [int(t) for t in rng.integers(0, n, 20)]


def test_sample_draws_from_the_public_filters_survivors_bit_for_bit():
    """filtered_logits works on the survivors of top-k only (not the vocabulary), yet it is the
    composition of apply_top_k, apply_top_p and apply_min_p bit for bit; and sample(), which runs the
    chain in the library (strata_sampler_draw, float64 with libm and sums in order), draws the token that
    inverting the cumulative distribution of filtered_logits' finite entries, in id order, at the
    stream's next number gives, so a seed draws the tokens it drew when every filter wrote the whole
    vector; rounding may split them only where a cut lies within 1e-9 of its float64 value (none of the
    1,200 draws on a host whose numpy takes libm's exp and log)."""
    checked = split = 0
    for x, p, hist in _chain_cases(400, 17):
        s, twin = make_sampler(p), make_sampler(p)
        y = apply_logit_bias(x, p.logit_bias)
        ids, counts = token_counts(hist, p.repeat_last_n)
        y = apply_penalties(y, ids, counts, p.repeat_penalty, p.presence_penalty, p.frequency_penalty)
        if 0 < p.top_k < len(y):   # top-k against its definition: by logit descending, then id
            order = np.lexsort((np.arange(len(y)), -y.astype(np.float64)))
            assert kept(apply_top_k(y, p.top_k)) == set(order[:p.top_k].tolist()) - set(np.flatnonzero(y == NEG))
        want = apply_min_p(apply_top_p(apply_top_k(y, p.top_k), p.top_p), p.min_p)
        got = s.filtered_logits(x, hist)
        assert got.dtype == np.float32 and np.array_equal(got.view(np.uint32), want.view(np.uint32)), p
        keep = np.flatnonzero(np.isfinite(want))
        probs = probabilities(want[keep], p.temperature)
        for _ in range(3):
            u = twin.uniform()
            tok = int(keep[draw(probs, u)])
            got_tok = s.sample(x, hist)
            if got_tok != tok:   # only where float64 rounding decides (numpy's exp and log are libm's
                # on AVX2 hosts, its own SIMD ones on AVX-512 hosts; the library's are libm's)
                assert _rounding_decides(apply_top_k(y, p.top_k), p, probs, u), (p, tok, got_tok)
                split += 1
            checked += 1
    assert checked == 1200 and split <= 12, split


def test_support_is_the_distribution_where_it_is_not_zero_bit_for_bit():
    """Sampler.support (speculative decoding's distributions) computes from top-k's survivors only, yet
    gives distribution()'s probabilities bit for bit on its ids, and every id distribution() gives a
    probability (a survivor may have 0 where its exp underflows: it is in both, at 0)."""
    for x, p, hist in _chain_cases(300, 23):
        s = make_sampler(p)
        d = s.distribution(x, hist)
        ids, pr = s.support(x, hist)
        assert np.all(np.diff(ids) > 0) and np.array_equal(d[ids], pr), p
        assert set(np.flatnonzero(d).tolist()) <= set(ids.tolist()), p
    g = make_sampler(SamplingParams.greedy())
    ids, pr = g.support(f32(0.5, 3, 3, -1))
    assert ids.tolist() == [1] and pr.tolist() == [1.0]


def _rounding_decides(y, p, probs, u, eps=1e-9) -> bool:
    """Whether a cut of the chain lies within eps of where its float64 sums and logs put it: top-p's
    cumulative probability at top_p, a logit at min-p's cut, or the draw's number at an interval's end."""
    fin = y[np.isfinite(y)].astype(np.float64)
    if p.top_p < 1.0:
        lp = fin - fin.max() - math.log(np.exp(fin - fin.max()).sum())
        cum = np.cumsum(np.exp(np.sort(lp)[::-1]))
        if np.any(np.abs(cum - p.top_p) < eps):
            return True
    if p.min_p > 0.0 and np.any(np.abs(fin - (fin.max() + math.log(p.min_p))) < eps):
        return True
    cum = np.cumsum(probs)
    return bool(np.any(np.abs(cum - u * cum[-1]) < eps))


def test_top_p_before_temperature():
    # llama.cpp's order: the nucleus is cut on the untempered distribution
    x = np.log(np.array([0.6, 0.3, 0.1])).astype(np.float32)
    d = make_sampler(SamplingParams.neutral(top_p=0.85, temperature=0.25)).distribution(x)
    assert np.flatnonzero(d).tolist() == [0, 1]                     # 0.6 + 0.3 >= 0.85
    assert abs(d[0] - 2.0**4 / (2.0**4 + 1)) < 1e-6                # (0.6/0.3)^(1/0.25)


def test_seed_reproducibility():
    x = _logits(n=64, seed=3)
    p = SamplingParams(temperature=1.0, top_k=0, top_p=0.98, min_p=0.0, seed=42)

    def run(sampler, n=300):
        hist = []
        for _ in range(n):
            hist.append(sampler.sample(x + np.float32(0.01) * len(hist), hist))
        return hist

    a, b = run(make_sampler(p)), run(make_sampler(p))
    assert a == b and len(set(a)) > 10
    assert run(make_sampler(p, seed=43)) != a
    r = make_sampler(p, seed=None)
    assert 0 <= r.seed < 2**64
    assert run(make_sampler(p, seed=r.seed)) == run(r)
    assert make_sampler(p, seed=-1).seed != make_sampler(p, seed=-1).seed


def test_full_vocabulary_default_params():
    n = 248_320
    x = (np.random.default_rng(5).standard_normal(n) * 3).astype(np.float32)
    s = make_sampler(SamplingParams(seed=0, repeat_penalty=1.1))
    hist = list(range(0, 640, 10))
    d = s.distribution(x, hist)
    assert 1 <= np.count_nonzero(d) <= 40 and abs(d.sum() - 1) < 1e-12
    toks = [s.sample(x, hist) for _ in range(50)]
    assert all(d[t] > 0 for t in toks)


def test_invalid_logits_and_params():
    s = make_sampler(SamplingParams.neutral())
    with pytest.raises(ValueError, match="NaN"):
        s.sample(f32(0.0, np.nan))
    with pytest.raises(ValueError, match="one non-empty vector"):
        s.sample(np.zeros((2, 3), np.float32))
    for kw, msg in [({"top_p": 1.5}, "--top-p"), ({"min_p": -0.1}, "--min-p"),
                    ({"repeat_penalty": 0.0}, "--repeat-penalty"), ({"temperature": math.nan}, "--temp"),
                    ({"top_k": 2.5}, "--top-k"), ({"stop": ["ok", ""]}, "--stop"),
                    ({"logit_bias": {1: math.inf}}, "large finite bias"),
                    ({"logit_bias": {"x": 1}}, "token ids"), ({"seed": -5}, "--seed"),
                    ({"repeat_last_n": -2}, "--repeat-last-n"),
                    # types a batch line can hold (they raised AttributeError / "not iterable" before)
                    ({"stop": True}, "--stop.*a string or a list"), ({"stop": 0.5}, "--stop"),
                    ({"logit_bias": 3.5}, "--logit-bias.*an object"), ({"logit_bias": ["1"]}, "--logit-bias"),
                    ({"logit_bias": "x"}, "--logit-bias")]:
        with pytest.raises(ValueError, match=msg):
            SamplingParams(**kw)


def test_from_dict_openai_fields():
    p = SamplingParams.from_dict({"temperature": 0.2, "top_k": 10.0, "stop": "\n",
                                  "logit_bias": {"15": -100, "16": 2}, "max_tokens": 5, "seed": 7})
    assert (p.top_k, p.stop, p.logit_bias, p.max_tokens) == (10, ["\n"], {15: -100.0, 16: 2.0}, 5)
    with pytest.raises(ValueError, match="unknown sampling field.*nucleus"):
        SamplingParams.from_dict({"nucleus": 0.9})
    q = SamplingParams(seed=np.int64(3), top_k=np.int32(4), temperature=np.float32(0.5))
    assert (q.seed, q.top_k, q.temperature) == (3, 4, 0.5) and type(q.seed) is int


def test_click_flags():
    seen = {}

    @click.command()
    @click_options
    def cmd(**kw):
        seen["p"] = params_from_cli(kw, max_tokens=9)
        seen["rest"] = kw

    r = CliRunner().invoke(cmd, ["--temp", "0", "--top-k", "5", "--top-p", "0.5", "--min-p", "0.1",
                                 "--repeat-penalty", "1.2", "--presence-penalty", "0.3",
                                 "--frequency-penalty", "0.4", "--seed", "11", "--stop", "END",
                                 "--stop", "\n\n", "--logit-bias", "15+1.5", "--logit-bias", "2-inf"])
    assert r.exit_code == 0, r.output
    p = seen["p"]
    assert (p.temperature, p.top_k, p.top_p, p.min_p, p.repeat_penalty, p.presence_penalty,
            p.frequency_penalty, p.seed, p.stop, p.max_tokens) == \
        (0.0, 5, 0.5, 0.1, 1.2, 0.3, 0.4, 11, ["END", "\n\n"], 9)
    assert p.logit_bias == {15: 1.5, 2: -np.inf} and seen["rest"] == {}
    r = CliRunner().invoke(cmd, [])
    assert r.exit_code == 0 and seen["p"] == SamplingParams(seed=-1, max_tokens=9)
    with pytest.raises(ValueError, match="TOKEN_ID"):
        parse_logit_bias(["15:2"])


# ------------------------------------------------------------------ stop strings


def stream(stops, pieces):
    s = StopStream(stops)
    out = [s.push(p) for p in pieces]
    return out, s.flush(), s


def ref_cut(text, stops):
    """Reading char by char: where the first stop string completes (longest of ties)."""
    for e in range(1, len(text) + 1):
        done = [s for s in stops if text[:e].endswith(s)]
        if done:
            s = max(done, key=len)
            return text[: e - len(s)], s
    return text, None


def test_stop_split_across_pieces():
    out, rest, s = stream(["</end>"], ["Hello </", "en", "d> world"])
    assert out == ["Hello ", "", ""] and rest == "" and s.stopped and s.matched == "</end>"
    assert s.push("more") == ""


def test_stop_holdback_released():
    out, rest, s = stream(["STOP"], ["ab S", "T", "x", "yS"])
    assert out == ["ab ", "", "STx", "y"] and rest == "S" and not s.stopped


def test_stop_overlapping_prefixes():
    # "aab": after "aa" both a's may begin it; "aaab" must cut after the first 'a'
    out, rest, s = stream(["aab"], ["a", "a", "a", "b", "c"])
    assert "".join(out) == "a" and s.matched == "aab"
    out, rest, s = stream(["abab"], ["ab", "ab", "ab"])            # completes inside the 2nd piece
    assert "".join(out) == "" and s.stopped
    out, rest, s = stream(["abac"], ["ab", "ab", "ac"])
    assert "".join(out) == "ab" and s.matched == "abac"


def test_multiple_stop_strings():
    out, rest, s = stream(["\n\n", "User:", "###"], ["Sure.", "\n", "Us", "er: hi"])
    assert "".join(out) == "Sure.\n" and s.matched == "User:"
    # the one that completes first wins, whatever the pieces
    for pieces in (["abcd"], ["a", "b", "c", "d"], ["ab", "cd"]):
        out, _, s = stream(["abcd", "bc"], pieces)
        assert "".join(out) == "a" and s.matched == "bc"
    out, _, s = stream(["bc", "abc"], ["xabc"])                    # same end: the longer
    assert "".join(out) == "x" and s.matched == "abc"
    out, rest, s = stream("ab", ["xa", "by"])                         # one string, not its chars
    assert out == ["x", ""] and s.matched == "ab"


def test_stop_random_splits_match_reference():
    rnd = random.Random(7)
    for _ in range(400):
        alphabet = "abc" if rnd.random() < 0.7 else "ab\n"
        stops = ["".join(rnd.choice(alphabet) for _ in range(rnd.randint(1, 4)))
                 for _ in range(rnd.randint(1, 3))]
        text = "".join(rnd.choice(alphabet + "xy") for _ in range(rnd.randint(0, 30)))
        cuts = sorted(rnd.sample(range(len(text) + 1), min(len(text) + 1, rnd.randint(0, 8))))
        pieces = [text[a:b] for a, b in zip([0] + cuts, cuts + [len(text)])]
        out, rest, s = stream(stops, pieces)
        want, which = ref_cut(text, stops)
        assert "".join(out) + rest == want, (stops, pieces)
        assert s.matched == which
        # nothing emitted early could be un-emitted: every prefix emitted is a prefix of want
        acc = ""
        for o in out:
            acc += o
            assert want.startswith(acc)


def test_stop_criteria_eos_length_and_stop():
    c = StopCriteria(["END"], eos_ids=[2], max_tokens=10)
    assert c.feed(5, "hi E") == "hi " and not c.done
    assert c.feed(2, "<eos>") == "E" and c.finish_reason == "stop" and c.matched is None
    with pytest.raises(RuntimeError, match="already finished"):
        c.feed(5, "x")

    c = StopCriteria(["END"], eos_ids=[2], max_tokens=3)
    assert [c.feed(t, p) for t, p in [(5, "a"), (6, "b"), (7, "cE")]] == ["a", "b", "cE"]
    assert c.finish_reason == "length" and c.n_tokens == 3

    c = StopCriteria(["END"], max_tokens=2)
    assert c.feed(5, "xE") == "x" and c.feed(6, "ND!") == "" and c.finish_reason == "stop"
    assert c.matched == "END"                                       # stop beats length

    assert StopCriteria(max_tokens=0).done and StopCriteria(max_tokens=0).finish_reason == "length"
    c = StopCriteria(["zz"], max_tokens=None)
    for i in range(1000):
        c.feed(i, "z" if i == 999 else "a")
    assert not c.done and c.finish("length") == "z" and c.finish_reason == "length"
    with pytest.raises(ValueError, match="non-empty"):
        StopCriteria([""])


# ------------------------------------------------------------------ llama.cpp's samplers as oracle


def test_chain_matches_llama_cpp_samplers():
    """Same survivors and, after temperature, the same distribution as llama.cpp's logit-bias,
    penalties, top-k, top-p, min-p and temp samplers in that order (continuous random logits, so
    that llama.cpp's unspecified order among ties does not matter). llama.cpp runs every case in one
    child process (tests/model_oracles.py)."""
    rng = np.random.default_rng(21)
    n = 600
    cases = []
    for case in range(40):
        x = (rng.standard_normal(n) * rng.uniform(0.5, 4)).astype(np.float32)
        hist = rng.integers(0, 60, int(rng.integers(0, 120))).tolist()
        pick = lambda *v: rng.choice(v).item()                           # noqa: E731
        p = SamplingParams(
            temperature=pick(0.0, 0.4, 1.0, 1.7), top_k=pick(0, 5, 40, 300), top_p=pick(1.0, 0.5, 0.9, 0.99),
            min_p=pick(0.0, 0.02, 0.2), repeat_penalty=pick(1.0, 1.1, 1.5, 0.8),
            repeat_last_n=pick(-1, 0, 8, 64), presence_penalty=pick(0.0, 0.5, -0.3),
            frequency_penalty=pick(0.0, 0.25),
            logit_bias={int(t): pick(-np.inf, 2.0, -1.0) for t in rng.integers(0, n, 3)})
        cases.append((x, hist, p))
    last_n = lambda p: n if p.repeat_last_n < 0 else p.repeat_last_n     # noqa: E731  (llama.cpp: -1 = context)
    llama = llama_sampler_chains(n, [(x, hist, replace(p, repeat_last_n=last_n(p))) for x, hist, p in cases])
    for case, ((x, hist, p), theirs) in enumerate(zip(cases, llama)):
        s = make_sampler(p)
        if p.temperature <= 0:
            assert theirs == s.sample(x, hist), case
        else:
            d = s.distribution(x, hist)
            assert set(theirs) == set(np.flatnonzero(d).tolist()), case
            ids = np.array(sorted(theirs))
            q = probabilities(np.array([theirs[i] for i in ids], np.float32))
            assert np.allclose(d[ids], q, rtol=2e-5, atol=1e-9), case


def test_invalid_logits_are_refused_and_banned_ones_are_not():
    """NaN or +inf anywhere in the logits is the model's fault and an error, wherever it sits (the check is one
    maximum over the vector); -inf is a banned token and is sampled around. Greedy and sampling alike."""
    for params in (SamplingParams.greedy(), SamplingParams.neutral(seed=1)):
        for bad in (np.nan, np.inf):
            for at in (0, 5, 9):
                x = np.zeros(10, np.float32)
                x[at] = bad
                with pytest.raises(ValueError, match="NaN or \\+inf"):
                    make_sampler(params).sample(x)
        x = np.full(10, -np.inf, np.float32)
        x[7] = 0.5
        assert make_sampler(params).sample(x) == 7
