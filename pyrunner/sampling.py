"""sampling.py — choosing the next token: small pure filters on a logits vector, composed.

The chain (llama.cpp's default order; each step sees the previous step's output):

    logit bias -> penalties (repetition, then presence/frequency) -> top-k -> top-p -> min-p
               -> temperature -> draw

    step               parameter(s)                         neutral value (the step is skipped)
    logit bias         logit_bias {id: bias}, -inf bans    None / {}
    repetition         repeat_penalty, over the last       repeat_penalty == 1.0
                       repeat_last_n tokens of history     (repeat_last_n == 0 turns all penalties off)
    presence/frequency presence_penalty, frequency_penalty 0.0, 0.0
    top-k              top_k                               top_k <= 0 or >= vocabulary size
    top-p (nucleus)    top_p                               top_p >= 1.0
    min-p              min_p                               min_p <= 0.0
    temperature        temperature                         1.0 (<= 0 means greedy, see below)
    draw               seed                                (None / -1: a fresh random seed)

Every filter is a pure function `f(logits, ...) -> logits` on a 1-D float32 vector: it returns a
new array (or the input itself when its parameter is neutral, so neutral values are exact no-ops)
and removes a token by setting its logit to -inf. Probabilities are computed in float64.

Semantics, where tools differ:
- Penalties follow llama.cpp: the counts come from the last `repeat_last_n` tokens of the history
  the caller passes (prompt and generated tokens; -1 = the whole history). For a token seen c > 0
  times, a positive logit is divided by repeat_penalty and a negative one multiplied by it (so both
  move down for a penalty > 1); then presence_penalty * 1 + frequency_penalty * c is subtracted
  (OpenAI's formula).
- top-k keeps exactly k tokens; ties at the k-th value go to the lowest token ids.
- top-p sorts by probability (ties: lower id first) and keeps the shortest prefix whose mass is
  >= top_p, at least one token. Like llama.cpp, and unlike transformers, top-p and min-p see the
  distribution *before* temperature.
- min-p keeps tokens with p >= min_p * p_max, i.e. logit >= max_logit + log(min_p).
- Greedy (temperature <= 0): the argmax of the biased and penalised logits, ties to the lowest
  id; top-k/top-p/min-p cannot change it (each keeps the maximum) and no random number is drawn.
- The draw inverts the cumulative distribution with one uniform number from a numpy Generator
  (PCG64) seeded with `seed`; exactly one number per sampled token, so the same seed and the same
  logits and history give the same tokens on every machine.
tests/test_sampling.py runs the chain against llama.cpp's own samplers (through llama-cpp-python):
same survivors, same distribution. `Sampler.sample` runs the same chain in the library
(strata_sampler_draw, one call instead of ~50 numpy calls on the survivors) with this module's
random numbers: the token the filters here and `draw` give (test_sampling checks it draw by draw).

Stopping: `StopStream` holds back streamed text that may be the start of a stop string and cuts
the output before a completed one (the stop string itself is not emitted, as in llama.cpp and the
OpenAI API); `StopCriteria` adds end-of-sequence ids (finish reason "stop") and max_tokens
("length").
"""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field, fields, replace
from typing import Iterable, Mapping, Sequence

import numpy as np

from ._native import check, ffi, lib

_NEG_INF = np.float32(-np.inf)

# ------------------------------------------------------------------------------------ filters


def apply_logit_bias(logits: np.ndarray, bias: Mapping[int, float] | None) -> np.ndarray:
    """Add bias[id] to logits[id]; a bias of -inf bans the token."""
    if not bias:
        return logits
    out = logits.copy()
    n = out.shape[0]
    for tok, b in bias.items():
        if not 0 <= tok < n:
            raise ValueError(f"logit_bias names token {tok}, but the vocabulary has {n} tokens "
                             f"(ids 0..{n - 1}); remove it or fix the id")
        out[tok] += np.float32(b)
    return out


def token_counts(history: Sequence[int] | np.ndarray, last_n: int) -> tuple[np.ndarray, np.ndarray]:
    """(ids, counts) of the distinct tokens among the last `last_n` of history (-1: all, 0: none)."""
    if last_n == 0 or len(history) == 0:
        return np.empty(0, np.int64), np.empty(0, np.int64)
    h = np.asarray(history, dtype=np.int64)
    if last_n > 0:
        h = h[-last_n:]
    return np.unique(h, return_counts=True)


def penalties_neutral(repeat_penalty: float, presence_penalty: float, frequency_penalty: float) -> bool:
    """The penalties change nothing (llama.cpp's and OpenAI's defaults)."""
    return repeat_penalty == 1.0 and presence_penalty == 0.0 and frequency_penalty == 0.0


def apply_penalties(logits: np.ndarray, ids: np.ndarray, counts: np.ndarray,
                    repeat_penalty: float = 1.0, presence_penalty: float = 0.0,
                    frequency_penalty: float = 0.0) -> np.ndarray:
    """Penalise the tokens `ids` seen `counts` (> 0) times: repetition (llama.cpp: positive logits
    divided by repeat_penalty, negative ones multiplied), then subtract
    presence_penalty + frequency_penalty * count (OpenAI)."""
    if len(ids) == 0 or penalties_neutral(repeat_penalty, presence_penalty, frequency_penalty):
        return logits
    n = logits.shape[0]
    if ids[0] < 0 or ids[-1] >= n:  # ids come sorted from np.unique
        bad = int(ids[0] if ids[0] < 0 else ids[-1])
        raise ValueError(f"history holds token {bad}, outside the vocabulary of {n} tokens")
    out = logits.copy()
    v = out[ids]
    if repeat_penalty != 1.0:
        rp = np.float32(repeat_penalty)
        v = np.where(v > 0, v / rp, v * rp)
    v = v - (np.float32(presence_penalty) + np.float32(frequency_penalty) * counts.astype(np.float32))
    out[ids] = v.astype(np.float32)
    return out


def _top_set(logits: np.ndarray, k: int) -> np.ndarray:
    """The ids of the k largest entries (0 < k < n), ties at the k-th value resolved to the lowest ids,
    ascending. O(n): one selection and one pass over the vector."""
    n = logits.shape[0]
    kth = np.partition(logits, n - k)[n - k]           # the k-th largest value
    idx = np.flatnonzero(logits >= kth)                 # k of them, or more when the k-th value is tied
    if len(idx) > k:
        v = logits[idx]
        tied = np.flatnonzero(v == kth)
        idx = np.delete(idx, tied[k - (len(idx) - len(tied)):])   # the ties beyond k, the highest ids
    return idx


def _top_indices(logits: np.ndarray, k: int) -> np.ndarray:
    """The k largest entries' indices, ties at the k-th value resolved to the lowest ids,
    returned sorted by (logit descending, id ascending). O(n) selection, then a sort of k."""
    n = logits.shape[0]
    if k >= n:
        return np.argsort(-logits, kind="stable")
    idx = _top_set(logits, k)
    return idx[np.argsort(-logits[idx], kind="stable")]


def apply_top_k(logits: np.ndarray, k: int) -> np.ndarray:
    """Keep exactly the k highest logits (ties to the lowest ids); k <= 0 or k >= n: no-op."""
    n = logits.shape[0]
    if k <= 0 or k >= n:
        return logits
    keep = _top_set(logits, k)
    out = np.full_like(logits, _NEG_INF)
    out[keep] = logits[keep]
    return out


def _log_softmax64(logits: np.ndarray) -> np.ndarray:
    x = logits.astype(np.float64)
    m = x.max()
    if not np.isfinite(m):
        raise ValueError("no token is left to sample: every logit is -inf "
                         "(check logit_bias bans and the filters)")
    z = x - m
    return z - math.log(np.exp(z).sum())


def _nucleus(v: np.ndarray, p: float) -> np.ndarray:
    """Top-p over v, the finite logits of the candidates in id order: the positions in v of the shortest
    prefix, by probability descending (ties: lower position first), whose total probability is >= p; at
    least one."""
    lp = _log_softmax64(v)
    probs = np.exp(lp)
    # Usually a few hundred tokens hold the mass: select and sort only the best 1024 (O(n), then
    # a small sort), and widen (16x, then all) while they do not reach p.
    m, k = len(v), 1024
    while True:
        cand = _top_indices(lp, min(m, k))
        cum = np.cumsum(probs[cand])
        if cum[-1] >= p or len(cand) == m:
            break
        k *= 16
    n_keep = int(np.searchsorted(cum, p, side="left")) + 1   # first i with cum[i] >= p
    return cand[:min(max(n_keep, 1), len(cand))]


def apply_top_p(logits: np.ndarray, p: float) -> np.ndarray:
    """Nucleus: keep the shortest prefix of tokens, by probability descending (ties: lower id
    first), whose total probability is >= p; at least one token. p >= 1: no-op."""
    if p >= 1.0:
        return logits
    finite = np.flatnonzero(np.isfinite(logits))
    keep = finite[_nucleus(logits[finite], p)]
    out = np.full_like(logits, _NEG_INF)
    out[keep] = logits[keep]
    return out


def _min_p_cut(logits: np.ndarray, min_p: float) -> np.ndarray:
    """Where min-p removes a token: logit < max logit + log(min_p), compared in float64."""
    x = logits.astype(np.float64)
    return x < x.max() + math.log(min_p)


def apply_min_p(logits: np.ndarray, min_p: float) -> np.ndarray:
    """Keep tokens whose probability is >= min_p times the largest one; min_p <= 0: no-op."""
    if min_p <= 0.0:
        return logits
    out = logits.copy()
    out[_min_p_cut(logits, min_p)] = _NEG_INF
    return out


def _candidates(logits: np.ndarray, top_k: int, top_p: float, min_p: float) -> tuple[np.ndarray | None, np.ndarray]:
    """top-k, top-p and min-p as apply_top_k, apply_top_p and apply_min_p in turn, on the survivors only:
    (their ids ascending, their logits), ids None for every token. Each filter reads its input's finite
    entries in id order, so it sees here the very array it sees in the whole vector (which holds -inf
    elsewhere), and the survivors and their logits are the same bits; past top-k the work is on k
    tokens, not the vocabulary (the default chain, new / whole vectors, same process, 2-core Zen 3:
    flash-small's logits, 8192 tokens, 0.69-0.93x; 151,936 tokens 0.43-0.53x)."""
    ids, v = None, logits
    n = logits.shape[0]
    if 0 < top_k < n:
        ids = _top_set(logits, top_k)
        v = logits[ids]
    if top_p < 1.0:
        fin = np.flatnonzero(np.isfinite(v))
        sel = np.sort(fin[_nucleus(v[fin], top_p)])
        ids, v = (sel if ids is None else ids[sel]), v[sel]
    if min_p > 0.0:
        sel = np.flatnonzero(~_min_p_cut(v, min_p))
        ids, v = (sel if ids is None else ids[sel]), v[sel]
    return ids, v


def apply_temperature(logits: np.ndarray, temperature: float) -> np.ndarray:
    """Divide by the temperature (> 0); 1.0: no-op. The result is shifted so that its maximum is 0
    (the same distribution), which keeps tiny temperatures from overflowing float32."""
    if temperature == 1.0:
        return logits
    if temperature <= 0:
        raise ValueError("apply_temperature needs a temperature > 0 (<= 0 means greedy: use argmax)")
    x = logits.astype(np.float64)
    return ((x - x.max()) / temperature).astype(np.float32)


def _biased_argmax(x: np.ndarray, i: int, bias: Mapping[int, float]) -> tuple[int, float]:
    """argmax(apply_logit_bias(x, bias)) and its value, given i = argmax(x) (x without NaN or +inf):
    when i is not biased, its value is the largest of every unbiased token's and i the first index
    holding it, so only the biased tokens can win (in float32, as apply_logit_bias adds; ties to the
    lower id) and the copy of the vocabulary is not needed. Otherwise, a bad id (apply_logit_bias's
    error) or a NaN (-inf + inf): the biased copy decides."""
    if i not in bias:
        n = x.shape[0]
        best, best_v = i, x[i]
        for tok, b in bias.items():
            if not 0 <= tok < n:
                break
            v = x[tok] + np.float32(b)
            if v != v:
                break
            if v > best_v or (v == best_v and tok < best):
                best, best_v = tok, v
        else:
            return best, float(best_v)
    xb = apply_logit_bias(x, bias)
    j = int(xb.argmax())
    return j, float(xb[j])


def greedy(logits: np.ndarray) -> int:
    """The highest logit's id; ties go to the lowest id."""
    return int(np.argmax(logits))


def probabilities(logits: np.ndarray, temperature: float = 1.0) -> np.ndarray:
    """softmax(logits / temperature) in float64 (-inf -> probability 0). Same distribution as
    probabilities(apply_temperature(logits, t)), without rounding the scaled logits to float32."""
    if temperature <= 0:
        raise ValueError("probabilities needs a temperature > 0 (<= 0 means greedy: use argmax)")
    x = logits.astype(np.float64)
    m = x.max()
    if not np.isfinite(m):
        raise ValueError("no token is left to sample: every logit is -inf "
                         "(check logit_bias bans and the filters)")
    e = np.exp((x - m) / temperature)
    return e / e.sum()


def draw(probs: np.ndarray, u: float) -> int:
    """The token whose cumulative-probability interval holds u in [0, 1); tokens of probability 0
    are never chosen."""
    cum = np.cumsum(probs)
    i = int(np.searchsorted(cum, u * cum[-1], side="right"))
    return min(i, len(probs) - 1)


# ------------------------------------------------------------------------------------ parameters

_FLAGS = {  # parameter -> the CLI flag (DESIGN §9, llama.cpp spelling), for error messages
    "temperature": "--temp", "top_k": "--top-k", "top_p": "--top-p", "min_p": "--min-p",
    "repeat_penalty": "--repeat-penalty", "repeat_last_n": "--repeat-last-n",
    "presence_penalty": "--presence-penalty", "frequency_penalty": "--frequency-penalty",
    "seed": "--seed", "stop": "--stop", "max_tokens": "-n", "logit_bias": "--logit-bias",
}


def _bad(name: str, value, want: str) -> ValueError:
    return ValueError(f"{name} ({_FLAGS.get(name, name)}) = {value!r}: {want}")


@dataclass
class SamplingParams:
    """Sampling settings with the OpenAI / llama.cpp names. The defaults are llama.cpp's
    (temperature 0.8, top_k 40, top_p 0.95, min_p 0.05, no penalties); `neutral()` turns every
    filter off and `greedy()` picks the argmax."""
    temperature: float = 0.8
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    repeat_penalty: float = 1.0
    repeat_last_n: int = 64
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int | None = None            # None or -1: a fresh random seed (Sampler.seed tells which)
    logit_bias: dict[int, float] | None = None
    stop: list[str] = field(default_factory=list)
    max_tokens: int | None = None      # None or < 0: no limit

    def __post_init__(self):
        for name in ("temperature", "top_p", "min_p", "repeat_penalty", "presence_penalty",
                     "frequency_penalty"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, numbers.Real) or not math.isfinite(v):
                raise _bad(name, v, "must be a finite number")
            setattr(self, name, float(v))
        for name in ("top_k", "repeat_last_n"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, numbers.Integral):
                raise _bad(name, v, "must be an integer")
            setattr(self, name, int(v))
        for name in ("seed", "max_tokens"):
            v = getattr(self, name)
            if v is not None:
                if isinstance(v, bool) or not isinstance(v, numbers.Integral):
                    raise _bad(name, v, "must be an integer")
                setattr(self, name, int(v))
        if not 0.0 <= self.top_p <= 1.0:
            raise _bad("top_p", self.top_p, "must lie in [0, 1] (1 turns top-p off)")
        if not 0.0 <= self.min_p <= 1.0:
            raise _bad("min_p", self.min_p, "must lie in [0, 1] (0 turns min-p off)")
        if self.repeat_penalty <= 0.0:
            raise _bad("repeat_penalty", self.repeat_penalty, "must be > 0 (1 turns it off)")
        if self.repeat_last_n < -1:
            raise _bad("repeat_last_n", self.repeat_last_n, "must be >= -1 (-1: whole history, 0: off)")
        if self.seed is not None and self.seed != -1 and not 0 <= self.seed < 2**64:
            raise _bad("seed", self.seed, "must be in [0, 2**64) or -1 for a random seed")
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        elif self.stop is None:
            self.stop = []
        elif isinstance(self.stop, Sequence):
            self.stop = list(self.stop)
        else:               # a number or an object from a batch line: "not iterable" would not say which field
            raise _bad("stop", self.stop, "must be a string or a list of strings")
        for s in self.stop:
            if not isinstance(s, str) or s == "":
                raise _bad("stop", s, "stop strings must be non-empty strings")
        if self.logit_bias is not None and not isinstance(self.logit_bias, Mapping):
            raise _bad("logit_bias", self.logit_bias, "must be an object of token id -> bias, e.g. {\"15043\": -100}")
        if self.logit_bias:
            clean = {}
            for k, b in self.logit_bias.items():
                try:   # JSON objects have string keys: {"15043": -100}
                    tok = int(k)
                except (TypeError, ValueError):
                    raise _bad("logit_bias", k, "keys must be token ids (integers)") from None
                if isinstance(b, bool) or not isinstance(b, numbers.Real) or math.isnan(b) or b == math.inf:
                    raise _bad("logit_bias", {k: b}, "biases must be numbers or -inf "
                               "(to force a token use a large finite bias such as 100)")
                if tok < 0:
                    raise _bad("logit_bias", k, "token ids are >= 0")
                clean[tok] = clean.get(tok, 0.0) + float(b)
            self.logit_bias = clean
        else:
            self.logit_bias = None

    @classmethod
    def neutral(cls, **kw) -> "SamplingParams":
        """Every filter off: plain softmax sampling at temperature 1."""
        base = dict(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, repeat_penalty=1.0,
                    presence_penalty=0.0, frequency_penalty=0.0)
        base.update(kw)
        return cls(**base)

    @classmethod
    def greedy(cls, **kw) -> "SamplingParams":
        return cls(**{"temperature": 0.0, **kw})

    @classmethod
    def from_dict(cls, d: Mapping) -> "SamplingParams":
        """From OpenAI-named fields (a batch line, a request body); unknown names are an error."""
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - names)
        if unknown:
            raise ValueError(f"unknown sampling field(s) {', '.join(unknown)}; "
                             f"known: {', '.join(sorted(names))}")
        kw = dict(d)
        for name in ("top_k", "repeat_last_n", "seed", "max_tokens"):   # JSON 40.0 -> 40
            v = kw.get(name)
            if isinstance(v, float) and v.is_integer():
                kw[name] = int(v)
        return cls(**kw)


# ------------------------------------------------------------------------------------ sampler


class Sampler:
    """The chain for one request: `sample(logits, history) -> token id`. Holds the random state,
    so one Sampler serves one sequence; build another (same seed) to replay it."""

    def __init__(self, params: SamplingParams):
        self.params = params
        seed = params.seed
        if seed is None or seed == -1:
            seed = int(np.random.SeedSequence().entropy % 2**64)
        self.seed = seed
        self._rng = np.random.Generator(np.random.PCG64(seed))
        self._native = self._token = None   # the library's sampler (its buffers for the chain) and its output

    @property
    def is_greedy(self) -> bool:
        return self.params.temperature <= 0.0

    def uniform(self) -> float:
        """The next draw in [0, 1) from this sampler's random stream. `sample` takes its draws from it,
        and so does speculative decoding's acceptance rule (pyrunner.mtp): one stream per sequence, so a
        seeded request replays exactly whatever mixes the two."""
        return float(self._rng.random())

    def _check(self, logits) -> tuple[np.ndarray, np.float32]:
        """(the logits as float32, their maximum), or an error for NaN / +inf."""
        x = np.asarray(logits, dtype=np.float32)
        if x.ndim != 1 or x.shape[0] == 0:
            raise ValueError(f"logits must be one non-empty vector, got shape {x.shape}")
        top = x.max()                      # NaN anywhere makes the maximum NaN; +inf makes it +inf
        if np.isnan(top) or top == np.inf:
            raise ValueError("logits contain NaN or +inf: the model produced invalid numbers")
        return x, top

    def _biased(self, logits, history: Sequence[int]) -> np.ndarray:
        """The logits after bias and penalties (checked: NaN, +inf, every token banned)."""
        p = self.params
        x0, top = self._check(logits)
        x = apply_logit_bias(x0, p.logit_bias)
        if not penalties_neutral(p.repeat_penalty, p.presence_penalty, p.frequency_penalty):
            # (the history's counts only when a penalty uses them: a unique over the last 64 tokens is
            # ~60 us, a twentieth of a small model's decode step)
            ids, counts = token_counts(history, p.repeat_last_n)
            x = apply_penalties(x, ids, counts, p.repeat_penalty, p.presence_penalty, p.frequency_penalty)
        if x is not x0:                    # the filters return their input when they change nothing
            top = x.max()
        if not np.isfinite(top):
            raise ValueError("no token is left to sample: logit_bias bans every token")
        return x

    def filtered_logits(self, logits, history: Sequence[int] = ()) -> np.ndarray:
        """Logits after bias, penalties, top-k, top-p and min-p (before temperature): -inf for every
        token a filter removed."""
        p = self.params
        x = self._biased(logits, history)
        if self.is_greedy:
            return x
        ids, v = _candidates(x, p.top_k, p.top_p, p.min_p)
        if ids is None:
            return v
        out = np.full_like(x, _NEG_INF)
        out[ids] = v
        return out

    def distribution(self, logits, history: Sequence[int] = ()) -> np.ndarray:
        """The exact float64 distribution `sample` draws from (one-hot when greedy); what
        speculative decoding's acceptance rule needs."""
        x = self.filtered_logits(logits, history)
        if self.is_greedy:
            d = np.zeros(x.shape[0])
            d[greedy(x)] = 1.0
            return d
        return probabilities(x, self.params.temperature)

    def support(self, logits, history: Sequence[int] = ()) -> tuple[np.ndarray, np.ndarray]:
        """distribution() where it is not 0: (ids ascending, their probabilities), the same float64 bits,
        from the survivors of top-k on (speculative decoding's rule reads a few entries and draws over
        them: drawing over these in id order gives distribution()'s token, as its zeros add nothing to
        the running sum). The normaliser is summed over the whole vocabulary with its zeros, as
        probabilities() sums it (numpy's pairwise order), the one vocabulary-sized step left."""
        p = self.params
        x = self._biased(logits, history)
        if self.is_greedy:
            return np.array([greedy(x)]), np.ones(1)
        ids, v = _candidates(x, p.top_k, p.top_p, p.min_p)
        keep = np.flatnonzero(np.isfinite(v))
        ids = keep if ids is None else ids[keep]
        v = v[keep].astype(np.float64)
        e = np.exp((v - v.max()) / p.temperature)
        whole = np.zeros(x.shape[0])
        whole[ids] = e
        return ids, e / whole.sum()

    def sample(self, logits, history: Sequence[int] = ()) -> int:
        p = self.params
        if self.is_greedy and penalties_neutral(p.repeat_penalty, p.presence_penalty, p.frequency_penalty):
            # filtered_logits' checks and pick with one argmax per vector where it takes a maximum and an
            # argmax (argmax returns the first NaN when there is one, so x[i] is NaN then, and +inf when
            # that is the top): each numpy reduction of a vocabulary releases the GIL, which a server's
            # request threads then queue for
            x = np.asarray(logits, dtype=np.float32)
            if x.ndim != 1 or x.shape[0] == 0:
                raise ValueError(f"logits must be one non-empty vector, got shape {x.shape}")
            i = int(x.argmax())
            top = float(x[i])
            if top != top or top == math.inf:
                raise ValueError("logits contain NaN or +inf: the model produced invalid numbers")
            if p.logit_bias:
                i, top = _biased_argmax(x, i, p.logit_bias)
            if not -math.inf < top < math.inf:
                raise ValueError("no token is left to sample: logit_bias bans every token")
            return i
        x = self._biased(logits, history)
        if self.is_greedy:
            return greedy(x)
        # the chain in the library (strata_sampler_draw: top-k, top-p, min-p, temperature, then the
        # survivors' cumulative distribution in id order inverted at this stream's next number), as the
        # filters above define it, in float64 with sums in order where numpy's are pairwise (the same
        # token as filtered_logits -> probabilities -> draw in every one of 6,000 draws of
        # test_sampling's random cases). The default chain on 8,192 logits: ~20 us a call, where the
        # filters' ~50 numpy calls took 150-220 (a third of flash-small's decode step); on 151,936:
        # ~110 us, where they took 0.9-1.2 ms.
        if self._native is None:
            out = ffi.new("strata_sampler **")
            check(lib.strata_sampler_init(ffi.NULL, out))
            self._native = ffi.gc(out[0], lib.strata_sampler_free)
            self._token = ffi.new("int32_t *")
        x = np.ascontiguousarray(x)
        k = p.top_k if 0 < p.top_k < x.shape[0] else 0
        check(lib.strata_sampler_draw(self._native, ffi.from_buffer("float[]", x), x.shape[0], k, p.top_p, p.min_p,
                                      p.temperature, self.uniform(), self._token))
        return int(self._token[0])


def make_sampler(params: SamplingParams | None = None, **kw) -> Sampler:
    """A Sampler for `params` (default SamplingParams()), with fields overridden by keywords."""
    if params is None:
        params = SamplingParams(**kw)
    elif kw:
        params = replace(params, **kw)
    return Sampler(params)


# ------------------------------------------------------------------------------------ stopping


class StopStream:
    """Streams text through stop strings. `push(piece)` returns the text that is safe to emit now:
    everything except a suffix that could still grow into a stop string. When a stop string
    completes, the text before it is returned, `stopped` becomes True and `matched` names it;
    later pushes return "". `flush()` releases the held-back text when generation ends otherwise.
    The cut is where the first stop string completes reading the text character by character
    (of two that complete together, the longer), so the output does not depend on how the text
    was split into pieces."""

    def __init__(self, stop: Iterable[str] = ()):
        self.stops = [stop] if isinstance(stop, str) else list(stop)
        for s in self.stops:
            if not isinstance(s, str) or s == "":
                raise ValueError(f"stop string {s!r}: stop strings must be non-empty strings")
        self._held = ""
        self.stopped = False
        self.matched: str | None = None

    def _holdback(self, text: str) -> int:
        """Length of the longest suffix of text that is a proper prefix of some stop string."""
        best = 0
        for s in self.stops:
            for n in range(min(len(s) - 1, len(text)), best, -1):
                if text.endswith(s[:n]):
                    best = n
                    break
        return best

    def push(self, piece: str) -> str:
        if self.stopped:
            return ""
        text = self._held + piece
        end, which = -1, None      # the stop string that completes first, reading char by char
        for s in self.stops:
            i = text.find(s)
            if i >= 0 and (which is None or i + len(s) < end
                           or (i + len(s) == end and len(s) > len(which))):
                end, which = i + len(s), s
        if which is not None:
            self.stopped, self.matched, self._held = True, which, ""
            return text[: end - len(which)]
        h = self._holdback(text)
        self._held = text[len(text) - h:] if h else ""
        return text[: len(text) - h]

    def flush(self) -> str:
        out, self._held = self._held, ""
        return "" if self.stopped else out


class StopCriteria:
    """One request's end: an end-of-sequence id (finish reason "stop", the token's text is not
    emitted), a stop string ("stop"), or max_tokens generated tokens ("length").

        crit = StopCriteria(params.stop, eos_ids, params.max_tokens)
        while not crit.done:
            tok = sampler.sample(logits, history)
            emit(crit.feed(tok, detokenize_piece(tok)))
    """

    def __init__(self, stop: Iterable[str] = (), eos_ids: Iterable[int] = (), max_tokens: int | None = None):
        self.text = StopStream(stop)
        self.eos_ids = frozenset(int(t) for t in eos_ids)
        self.max_tokens = None if max_tokens is None or max_tokens < 0 else int(max_tokens)
        self.n_tokens = 0
        self.finish_reason: str | None = "length" if self.max_tokens == 0 else None

    @property
    def done(self) -> bool:
        return self.finish_reason is not None

    @property
    def matched(self) -> str | None:
        """The stop string that ended the output, if one did."""
        return self.text.matched

    def feed(self, token: int, piece: str) -> str:
        """Account for one generated token and its text; return the text to emit now."""
        if self.done:
            raise RuntimeError(f"generation already finished ({self.finish_reason}); "
                               "no more tokens may be fed")
        self.n_tokens += 1
        if int(token) in self.eos_ids:
            self.finish_reason = "stop"
            return self.text.flush()
        out = self.text.push(piece)
        if self.text.stopped:
            self.finish_reason = "stop"
        elif self.max_tokens is not None and self.n_tokens >= self.max_tokens:
            self.finish_reason = "length"
            out += self.text.flush()
        return out

    def finish(self, reason: str = "length") -> str:
        """End for a reason of the caller's (e.g. the context is full); returns held-back text."""
        if self.finish_reason is None:
            self.finish_reason = reason
        return self.text.flush()


# ------------------------------------------------------------------------------------ CLI flags


def parse_logit_bias(items: Iterable[str]) -> dict[int, float]:
    """llama.cpp's --logit-bias spelling: `ID+BIAS` or `ID-BIAS` (e.g. `15043+1`, `2-inf`)."""
    out: dict[int, float] = {}
    for item in items:
        s = item.strip()
        j = max(s.find("+", 1), s.find("-", 1))
        try:
            if j <= 0:
                raise ValueError
            tok, b = int(s[:j]), float(s[j:])
        except ValueError:
            raise ValueError(f"--logit-bias {item!r}: write TOKEN_ID+BIAS or TOKEN_ID-BIAS, "
                             "e.g. 15043+1.5 or 15043-inf") from None
        out[tok] = out.get(tok, 0.0) + b
    return out


def click_options(f):
    """Decorate a click command with the sampling flags (DESIGN §9 names, llama.cpp spelling);
    turn the parsed values into SamplingParams with `params_from_cli(kwargs)`."""
    import click

    d = SamplingParams()
    opts = [
        click.option("--temp", "temperature", type=float, default=d.temperature, show_default=True,
                     help="Temperature; <= 0 picks the most likely token (greedy)."),
        click.option("--top-k", "top_k", type=int, default=d.top_k, show_default=True,
                     help="Keep the K most likely tokens (0 = off)."),
        click.option("--top-p", "top_p", type=float, default=d.top_p, show_default=True,
                     help="Nucleus: keep the smallest set with this much probability (1 = off)."),
        click.option("--min-p", "min_p", type=float, default=d.min_p, show_default=True,
                     help="Drop tokens less likely than this fraction of the best one (0 = off)."),
        click.option("--repeat-penalty", "repeat_penalty", type=float, default=d.repeat_penalty,
                     show_default=True, help="Penalise repeated tokens (1 = off)."),
        click.option("--repeat-last-n", "repeat_last_n", type=int, default=d.repeat_last_n,
                     show_default=True, help="Tokens of history the penalties look at (-1 = all, 0 = off)."),
        click.option("--presence-penalty", "presence_penalty", type=float, default=d.presence_penalty,
                     show_default=True, help="Subtract this from every token already present (0 = off)."),
        click.option("--frequency-penalty", "frequency_penalty", type=float,
                     default=d.frequency_penalty, show_default=True,
                     help="Subtract this times a token's count so far (0 = off)."),
        click.option("--seed", type=int, default=-1, show_default=True,
                     help="Random seed (-1 = random); the same seed gives the same text."),
        click.option("--stop", multiple=True, help="Stop before this text (repeatable)."),
        click.option("--logit-bias", "logit_bias", multiple=True,
                     help="TOKEN_ID+BIAS or TOKEN_ID-BIAS, e.g. 15043-inf bans a token (repeatable)."),
    ]
    for o in reversed(opts):
        f = o(f)
    return f


def params_from_cli(kwargs: dict, max_tokens: int | None = None) -> SamplingParams:
    """Pop the flags `click_options` added from a command's kwargs; errors as ValueError
    (the caller wraps them in click.ClickException)."""
    names = ("temperature", "top_k", "top_p", "min_p", "repeat_penalty", "repeat_last_n",
             "presence_penalty", "frequency_penalty", "seed", "stop", "logit_bias")
    kw = {n: kwargs.pop(n) for n in names if n in kwargs}
    if "logit_bias" in kw:
        kw["logit_bias"] = parse_logit_bias(kw["logit_bias"]) or None
    if "stop" in kw:
        kw["stop"] = list(kw["stop"])
    return SamplingParams(max_tokens=max_tokens, **kw)
