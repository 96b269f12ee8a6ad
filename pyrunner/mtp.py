"""mtp.py — speculative decoding with the model's MTP head (DESIGN §5; spec/qwen4exp-mtp.md §3).

One round, for the token x just sampled at position p (the session holds positions < p):

    draft     d1 from the MTP row of position p-1 (already run: the last draft-extend), then
              d2..dk by chaining the head on its own state g at positions p, p+1, ...
    verify    one trunk window [x, d1..dk] at positions p..p+k, keeping the state after each token
    accept    greedy: the longest prefix of drafts equal to the target's choice, plus the target's
              token after it (the bonus); temperature > 0: each draft with probability
              min(1, p/q), a rejected one replaced by a draw from max(p - q, 0) (Leviathan et al.),
              which leaves the output distributed exactly as without drafts
    rollback  the session back to x, d1..da (the state after that token was kept by the window)
    extend    the MTP over the verified rows (H_j, next token) at positions p..p+a, rewriting its
              cache with target-conditioned rows; its last row drafts the next round's d1

The caller samples x from the prefill's logits and emits tokens; round() returns the new tokens
(a accepted drafts and the bonus) and leaves the session holding all but the last of them, as the
one-token loop does. `draft_hook(position, token) -> token` replaces a draft (tests and benchmarks
force drafts right or wrong with it; a replaced draft counts as drawn from a point distribution, so
the sampling rule stays exact).
"""
from __future__ import annotations

import collections
import math
import statistics
import time
from typing import Callable, Sequence

import numpy as np

from . import trace
from .sampling import Sampler, draw, greedy

DraftHook = Callable[[int, int], int]

AUTO = "auto"            # --mtp auto: drafts per window chosen from live costs (DraftPolicy)
MTP_MAX_DEFAULT = 3      # --mtp-max: the most drafts --mtp auto tries
REFRESH_ROWS = 8         # --mtp auto: plain steps' rows the next drafting window extends (MTPDecoder.plain)


def parse_mtp(value, name: str = "mtp"):
    """An --mtp setting: "auto", or a draft count >= 0 (0: off)."""
    if isinstance(value, str):
        if value.strip().lower() == AUTO:
            return AUTO
        try:
            value = int(value)
        except ValueError:
            raise ValueError(f"{name} {value!r}: give a number of drafts per window (0: off) or 'auto'") from None
    if value is None or isinstance(value, bool) or int(value) < 0:
        raise ValueError(f"{name} must be >= 0 or 'auto' (got {value!r})")
    return int(value)


def _at(ids: np.ndarray, pr: np.ndarray, tok):
    """The probabilities of token(s) tok under a support (ids ascending, pr): 0 where ids lacks one."""
    j = np.searchsorted(ids, tok)
    jc = np.minimum(j, len(ids) - 1)
    return np.where(ids[jc] == tok, pr[jc], 0.0)


class MTPDecoder:
    """Drafts with the MTP head of `sess`'s model and verifies in windows of k + 1 tokens.

    `sampler` is the request's own (generate.generate_step passes it in): drafts, acceptance tests and
    bonus tokens take their random numbers from its one stream (Sampler.uniform), the same stream the
    one-token loop samples from, so a seeded request replays exactly."""

    def __init__(self, sess, sampler: Sampler, k: int = 3, draft_hook: DraftHook | None = None):
        if k < 1:
            raise ValueError(f"mtp: {k} drafts per window; use 1 or more (0 turns MTP off)")
        if getattr(sess.model, "n_mtp", 0) < 1:
            raise ValueError(f"mtp: {sess.model.path} has no MTP block; convert the checkpoint with its "
                             f"mtp.* tensors (strata convert without --no-mtp) or run with --mtp 0")
        self.sess, self.sampler, self.k, self.hook = sess, sampler, int(k), draft_hook
        sess.set_spec_max(self.k + 1)
        self.draft_logits: np.ndarray | None = None   # the MTP row of position p-1 (drafts d1)
        self.chain: np.ndarray | None = None          # its chain state
        # rows waiting for the head: (list of row arrays, the token after each but the last, first position,
        # whether they are the prompt's); None: none wait
        self._rows: tuple | None = None
        self._last: tuple | None = None                # the last window: (p, logits, hidden) for truncate()
        self.proposed = self.accepted = self.windows = self.full = 0
        self.plain_steps = 0
        self.prompt_extend_s = 0.0    # the head over the prompt's rows (--mtp auto leaves it out of a window's time)
        self.draft_s = self.verify_s = self.rollback_s = self.extend_s = 0.0

    # ------------------------------------------------------------------ setup
    def begin(self, ids: Sequence[int], reused: int, rows: np.ndarray | None, prev: np.ndarray | None) -> None:
        """After the prefill of ids: reused of them were held already, rows are the pre-mixer rows
        of the evaluated rest and prev the row of position reused - 1 when known (the session's or
        a checkpoint's). The MTP rows over them run with the first round: each pairs a row with the
        next token, and the last one's is the token sampled first."""
        if rows is None:
            rows = np.empty((0, self.sess.model.n_hidden), np.float32)
        p0 = reused
        if prev is not None and reused > 0:
            rows = np.concatenate([np.asarray(prev, np.float32)[None, :], rows])
            p0 = reused - 1
        self._rows = ([rows], [int(t) for t in ids[p0 + 1:]], p0, True) if len(rows) else None

    def _flush(self, x: int) -> None:
        """The head over the waiting rows, x being the token after the last (the prompt's extend is timed
        apart: --mtp auto leaves it out of a window's time)."""
        rows, nxt, p0, prompt = self._rows
        self._rows = None
        t = time.perf_counter()
        self._extend(np.concatenate(rows), nxt + [x], p0)
        if prompt:
            self.prompt_extend_s += time.perf_counter() - t

    def _extend(self, rows: np.ndarray, next_ids: list[int], p0: int) -> None:
        if len(rows) == 0:
            self.draft_logits = self.chain = None
            return
        t = time.perf_counter()
        self.draft_logits, self.chain = self.sess.mtp(rows, next_ids, p0)
        self.extend_s += time.perf_counter() - t
        trace.since("mtp extend", "mtp", t, rows=len(rows))

    # ------------------------------------------------------------------ one round
    def _draft(self, logits: np.ndarray, history: list[int], pos: int) -> tuple[int, tuple | None]:
        """A draft token for position pos and the distribution it was drawn from, as Sampler.support's
        (ids, probabilities) (None: greedy)."""
        if self.sampler.is_greedy:
            d, q = greedy(self.sampler.filtered_logits(logits, history)), None
        else:
            q = self.sampler.support(logits, history)
            d = int(q[0][draw(q[1], self.sampler.uniform())])
        if self.hook is not None:
            forced = int(self.hook(pos, d))
            if forced != d and q is not None:
                q = (np.array([forced]), np.ones(1))
            d = forced
        return d, q

    def round(self, x: int, history: list[int], k: int | None = None) -> list[int]:
        """Runs one window for x (the last token of history, not yet evaluated) with up to k drafts
        (default self.k; fewer near the end of the context or of max_tokens). Returns the new tokens."""
        sess = self.sess
        p = sess.n_past
        k = self.k if k is None else max(0, min(int(k), self.k))
        if k > 0:                                     # x's PLE rows read ahead while the head drafts
            sess.ple_prefetch([x])
        if self._rows is not None:                    # the prompt's (or plain steps') rows, now that x is known
            self._flush(x)
        # draft
        t0 = time.perf_counter()
        drafts: list[int] = []
        qs: list = []
        if self.draft_logits is not None and k > 0:
            h = list(history)
            logits, g = self.draft_logits, self.chain
            for i in range(k):
                d, q = self._draft(logits, h, p + 1 + i)
                drafts.append(d)
                qs.append(q)
                h.append(d)
                sess.ple_prefetch([x] + drafts)       # the window's rows so far (skipped while the worker is busy)
                if i + 1 < k:
                    logits, g = sess.mtp(g[None, :], [d], p + i)
        self.draft_s += time.perf_counter() - t0
        trace.since("mtp draft", "mtp", t0, drafts=len(drafts))
        # verify
        t0 = time.perf_counter()
        window = [x] + drafts
        L, H = sess.eval(window, all_logits=True, hidden=True, keep_states=True)
        self.verify_s += time.perf_counter() - t0
        trace.since("mtp verify", "mtp", t0, tokens=len(window))
        # accept
        new: list[int] = []
        h = list(history)
        for i, d in enumerate(drafts):
            if self.sampler.is_greedy:
                t = greedy(self.sampler.filtered_logits(L[i], h))
                if t != d:
                    new.append(t)
                    break
            else:
                # the rule on the supports (Sampler.support): q's and p's entries where they are not 0, the
                # residual max(p - q, 0) on p's (0 elsewhere), each drawn over in id order: the tokens and
                # the random numbers the whole vocabulary-sized vectors gave
                p_ids, p_pr = self.sampler.support(L[i], h)
                q_ids, q_pr = qs[i]
                if self.sampler.uniform() * _at(q_ids, q_pr, d) >= _at(p_ids, p_pr, d):   # reject: 1 - min(1, p/q)
                    resid = np.maximum(p_pr - _at(q_ids, q_pr, p_ids), 0.0)
                    w = resid if resid.sum() > 0 else p_pr
                    new.append(int(p_ids[draw(w, self.sampler.uniform())]))
                    break
            new.append(d)
            h.append(d)
        else:
            new.append(self.sampler.sample(L[len(drafts)], h))     # every draft taken: the bonus
        a = len(new) - 1                                            # drafts accepted
        self.windows += 1
        self.proposed += len(drafts)
        self.accepted += a
        self.full += a == len(drafts) and len(drafts) > 0
        if a < len(drafts):
            t0 = time.perf_counter()
            sess.rollback(p + 1 + a, logits=L[a], hidden=H[a])
            self.rollback_s += time.perf_counter() - t0
            trace.since("mtp rollback", "mtp", t0, rejected=len(drafts) - a)
        self._last = (p, L, H)
        # the next round's first draft is the MTP over the verified rows, each with its next token: they wait
        # for the next window that drafts, which extends them first (so a plain step next, --mtp auto's k = 0,
        # does not pay for the head, nor does the request's last window)
        self._rows = ([H[i:i + 1] for i in range(a + 1)], new[:a], p, False)
        self.draft_logits = self.chain = None
        return new

    def truncate(self, n_new: int) -> None:
        """The caller stopped after the first n_new + 1 tokens of the last round's output: the
        session keeps x and the first n_new of them (the last emitted token is not evaluated)."""
        p, L, H = self._last
        if p + 1 + n_new < self.sess.n_past:
            t0 = time.perf_counter()
            self.sess.rollback(p + 1 + n_new, logits=L[n_new], hidden=H[n_new])
            self.rollback_s += time.perf_counter() - t0

    def plain(self, x: int, history: list[int], keep_row: bool = True) -> list[int]:
        """A step without drafts (--mtp auto chose none): x alone, as the one-token loop evaluates it, with
        its pre-mixer row kept. The head does not run on plain steps (it would cost a good share of a
        step): only the last REFRESH_ROWS rows are kept, the prompt's included, which the next drafting
        window extends before it drafts (so a request that never drafts never runs the head over its
        prompt: on flash-small that extend cost ~4 % of a 512-token decode after a 512-token prompt). The
        head's cache holds nothing for the positions in between (zeros, or an earlier text's rows): its
        drafts may be worse for it, never wrong, since the verify window decides (on flash-small's
        held-out text, k = 2 took 0.55 of its drafts after the prompt's last 8 rows, 0.48 after all 256).
        keep_row False (DraftPolicy.rows_wanted: no window can draft before REFRESH_ROWS more plain ones):
        the step is exactly the one-token loop's, no row is kept and the rows kept so far go (the next
        drafting window's would not follow them); on flash-small keeping a row cost ~4 us of a ~0.5 ms step."""
        sess = self.sess
        if not keep_row:
            self._rows = None
            self.draft_logits = self.chain = None
            self.plain_steps += 1
            return [self.sampler.sample(sess.eval([x]), history)]
        if self._rows is not None and self._rows[3]:  # the prompt's: its last rows wait like plain steps'
            rows, nxt, p0, _ = self._rows
            rows = np.concatenate(rows)
            cut = max(0, len(rows) - REFRESH_ROWS + 1)
            self._rows = ([r[None, :] for r in rows[cut:]], nxt[cut:], p0 + cut, False)
        if self._rows is not None:                    # complete the waiting rows with x, keep the last few
            rows, nxt, p0, _ = self._rows
            nxt.append(x)
            if len(rows) >= REFRESH_ROWS:
                del rows[0], nxt[0]
                self._rows = (rows, nxt, p0 + 1, False)
        logits, row = sess.eval([x], hidden=True)     # row: (1, n_hidden)
        if self._rows is None:
            self._rows = ([row], [], sess.n_past - 1, False)
        else:
            self._rows[0].append(row)
        self.draft_logits = self.chain = None         # stale now: the next round extends first
        self.plain_steps += 1
        return [self.sampler.sample(logits, history)]

    # ------------------------------------------------------------------ stats
    def stats(self) -> dict:
        """DESIGN §9 keys (drafts_proposed, drafts_accepted, acceptance_rate, mean_accepted_len) and
        the mechanism's costs: verify windows, windows that took every draft, seconds drafting,
        verifying, rolling back and extending."""
        out = {"drafts_proposed": self.proposed, "drafts_accepted": self.accepted,
               "mtp_windows": self.windows, "mtp_full_windows": self.full,
               "mtp_draft_s": self.draft_s, "mtp_verify_s": self.verify_s,
               "mtp_rollback_s": self.rollback_s, "mtp_extend_s": self.extend_s}
        if self.proposed:
            out["acceptance_rate"] = self.accepted / self.proposed
        if self.windows:
            out["mean_accepted_len"] = (self.accepted + self.windows) / self.windows
        return out


def _line(known: list, k: int) -> float:
    """A window's cost at k drafts from the (k, cost) measured, k ascending: between its nearest measured
    neighbours on the line through them, beyond them on the line through the last two (so an unmeasured
    k never looks cheaper than a measured smaller one); y (1 + k / 4) / (1 + j / 4) from one point."""
    if len(known) == 1:
        j, y = known[0]
        return y * (1.0 + k / 4.0) / (1.0 + j / 4.0)
    lo = [p for p in known if p[0] < k]
    hi = [p for p in known if p[0] > k]
    (j0, y0), (j1, y1) = (lo[-1], hi[0]) if lo and hi else (known[-2], known[-1]) if lo else (known[0], known[1])
    return y0 + (y1 - y0) * (k - j0) / (j1 - j0)


class DraftPolicy:
    """--mtp auto: the drafts per window k in 0..k_max that maximise the expected tokens per second,
    from what this request measures as it decodes:

      - acceptance by draft position: a_j / n_j, the share of windows that reached draft j and took it
        (a prior of one in two; both counts of draft j decay by DECAY per window that reached it, so the
        estimate rests on the last ~20 of them: a draft past the current k, which only probes reach, keeps
        their evidence between them instead of sliding back to the prior, which held the policy at k = 2
        where every draft was taken and k = 3 was better; a surprise (below) keeps only FORGET of every
        draft's old evidence and is followed by
        another probe at once, so a change of the text is followed within a few windows, even while the
        current k drafts little or nothing; not while k = 0 runs and no k > 0 could beat it even with every
        draft taken, as on flash-small: acceptance cannot change that choice);
      - the time of a window by its k, its drafting, verify, rollback and extend all included (so on the
        offload paths, the missed experts its extra tokens touch): the current k's is the median of its
        last TIMES windows (one slow window does not move it; k = 0 is a plain step), and every other k's
        is its measured ratio to that one (cost()): each probe is timed against the current k's median of
        the moment, so the comparison holds while the host's speed drifts; a k not measured yet is
        estimated on a line through the measured ratios (1 + k / 4 when only k = 0 is);
      - expected tokens of a window: 1 + sum over j <= k of the product of the first j acceptances;
        where the window is one step of several sequences (pyrunner.engine: shared_tokens, the step's other
        decoding sequences, one token each), those too: the rate maximised is the step's, (shared_tokens +
        expected tokens) / the window's time, since this request's drafts and its head's calls lengthen
        the step every sequence waits on. Alone (0) it is the request's own rate. Weighing its own tokens
        only, a request whose drafts are often taken drafts as soon as its window, timed beside plain
        ones, costs less than its tokens are worth, while the others' plain windows take longer for it;
        then they draft too, each window timed beside others that wait on drafts: `strata serve` on
        flash-small, 8 clients, proposed 2,232-3,315 drafts a run and made 0.50-0.68x the tokens/s of
        --mtp 0 (test_mtp's simulation of such a step: every request at k ~2.8, a quarter of plain
        steps' tokens/s).

    The current k changes only for a rate HYSTERESIS times better (no flapping between near ties). One
    window in so many probes another k (k_max, which measures every position's acceptance, and the least
    recently measured in turn). The first FIRST_PROBE windows are plain and the next probes k_max; the
    first one's time does not count (it follows the prefill: on flash-small, 512-token prompts on a Zen 4,
    it took 1.1-3.9 ms where later plain steps took ~0.45-0.6, and timed as t_0 it made a k = 3 probe look
    1.1-3x a plain step where it is ~5x, so the request drafted at mean k up to 1.3 at half the tokens per
    second), the other plain ones are t_0 when the probe runs. How many windows lie between probes:

      - EXPLORE_MAX while no other k could beat the current one even with every draft taken (its window's
        k + 1 tokens short of HYSTERESIS times the current rate; k = 0 always could): such probes only
        refresh a cost;
      - while the text moves (within CALM windows of a surprise or a change of k, and the request's first
        CALM_START): EXPLORE, or EXPLORE_FAR while every other k looks worse than FAR of the current one;
      - once it is calm, the exploration budget: a probe's expected loss (its time less the time its
        expected tokens take at the current rate) is at most BUDGET of the windows' time between probes;
        at least EXPLORE_FAR or EXPLORE, as above, and at most EXPLORE_MAX (a change of costs is still
        found within that many windows).

    A window is a surprise when its accepted drafts are SURPRISE or more from what the estimate expects: a
    probe's at once, the current k's when its window before (probes in between are not its) lay out on
    the same side too, and then, while the run lasts, at SURPRISE_RUN (each surprise leaves FORGET of the
    old evidence, which may still hold the estimate within SURPRISE of the new text). A probe's surprise
    makes the text count as moving only if lying that far out (or farther) has at most P_SURPRISE chance
    under the estimate (every draft of a k = 3 probe taken at acceptance ~0.6, one probe in five, does
    not)."""

    DECAY = 0.95
    SURPRISE = 1.5
    SURPRISE_RUN = 1.15
    P_SURPRISE = 0.1
    FORGET = 0.3
    HYSTERESIS = 1.03
    EXPLORE = 16
    TIMES = 9
    EXPLORE_FAR = 48
    FAR = 0.8
    CALM = 256
    CALM_START = 128
    BUDGET = 0.01
    EXPLORE_MAX = 256
    FIRST_PROBE = 3

    def __init__(self, k_max: int = MTP_MAX_DEFAULT, ratios: dict | None = None):
        """ratios: an earlier request's ratios() on the same model ({k: a window of k drafts over a plain
        step}), each taken as one measurement of its k: when none of them could beat a plain step even with
        every draft taken, the request skips its first probe (on flash-small, a k = 3 window costs ~5.7
        plain steps: ~0.7 % of a 512-token decode), and the probes every EXPLORE_MAX windows refresh them."""
        if k_max < 1:
            raise ValueError(f"mtp-max {k_max}: give at least 1 draft")
        self.k_max = int(k_max)
        self.n = np.zeros(self.k_max + 1)       # [j]: windows that reached draft j (j >= 1)
        self.a = np.zeros(self.k_max + 1)       # [j]: of them, windows that took it
        self.t: list = [None] * (self.k_max + 1)     # [k]: the median of its last TIMES windows
        self._times = [collections.deque(maxlen=self.TIMES) for _ in range(self.k_max + 1)]
        self._ratio = [collections.deque(maxlen=self.TIMES) for _ in range(self.k_max + 1)]
        self._ratio_med: list = [None] * (self.k_max + 1)    # ratio(): the median of each deque
        self.seen = [-1] * (self.k_max + 1)     # window index each k was last measured at
        self.cur = 0
        self.windows = 0
        self._probe_again = False
        self._left = None                       # the k left at the last change, until the new k's first window
        self._probes_in_row = 0
        self._last_side = 0
        self._run = False                       # the current k's last window was a surprise
        self._last_probe = 0
        self._n_probes = 0
        self._rates = None
        self._rates_inputs: tuple = ()         # _inputs() when the rates were computed
        self._switch_to = None                  # the k the rates say to change to (HYSTERESIS), if any
        self._gap = self.EXPLORE                # _interval(), refreshed with the rates
        self._stale = 0
        self._moved = self.CALM_START - self.CALM  # window of the last surprise or change of k
        self.shared_tokens = 0                  # tokens each step gives the other sequences it runs (class docstring)
        self.k_sum = 0
        self.k_count = [0] * (self.k_max + 1)
        self.history: list = []                 # (window, k) whenever the current k changes
        self._carried = False
        for j, r in (ratios or {}).items():
            if 1 <= int(j) <= self.k_max and r and r > 0:
                self._ratio[int(j)].append(float(r))
                self._ratio_med[int(j)] = float(r)
                self._carried = True

    def ratios(self) -> dict:
        """{k: the median ratio of a window of k drafts to a plain step} for every k > 0 measured (the next
        request's DraftPolicy(ratios=...))."""
        return {j: r for j, r in enumerate(self._ratio_med) if j > 0 and r is not None}

    def _cached_rates(self) -> list:
        """rates(), recomputed when a window drafted or every few plain ones (a plain step of a small model
        takes about a millisecond: the policy's own arithmetic should not be a share of it). While k = 0
        runs, the plain windows between two drafting ones change only t_0, which scales every k's cost
        alike (each is t_0 times its ratio): no decision moves with it (the rates' order, HYSTERESIS and
        FAR compare ratios of rates, the probe gap's loss and budget both scale with t_0), so then the
        rates are recomputed only when what else the decisions read has moved (_inputs())."""
        if self._rates is None or self._stale >= 8:
            inputs = self._inputs()
            if self._rates is None or self.cur != 0 or inputs != self._rates_inputs:
                self._rates = self.rates()
                self._gap = self._interval(self._rates)
                best = max(range(len(self._rates)), key=self._rates.__getitem__)
                better = best != self.cur and self._rates[best] > self.HYSTERESIS * self._rates[self.cur]
                self._switch_to = best if better else None
                self._rates_inputs = inputs
            self._stale = 0
        return self._rates

    def _inputs(self) -> tuple:
        """What the rates and the probe gap read besides the times and the acceptance (a drafting window
        recomputes them anyway): the current k, the probes made, the first-windows and calm flags, whether
        the current k was timed, when each other k was measured, the tokens the step shares."""
        return (self.cur, self._n_probes, self.windows > self.FIRST_PROBE, self.windows - self._moved < self.CALM,
                self.t[self.cur] is None, tuple(s for j, s in enumerate(self.seen) if j != self.cur),
                self.shared_tokens)

    def _probe_gap(self) -> int:
        """_interval() of the cached rates (both refreshed together)."""
        self._cached_rates()
        return self._gap

    def _interval(self, rates: list) -> int:
        """Windows between probes (the class docstring): EXPLORE or EXPLORE_FAR while the text moves; once
        calm, as many as keep the next probe's expected loss within BUDGET of their time."""
        if self.windows > self.FIRST_PROBE and not self._hopeful(rates):
            return self.EXPLORE_MAX
        others = max((r for j, r in enumerate(rates) if j != self.cur), default=0.0)
        far = rates[self.cur] > 0 and others < self.FAR * rates[self.cur]
        base = self.EXPLORE_FAR if far else self.EXPLORE
        if self.windows - self._moved < self.CALM or rates[self.cur] <= 0:
            return base
        k = self._next_probe()
        c, c_cur = self.cost(k), self.cost(self.cur)
        loss = c - (self.shared_tokens + self.expected_tokens(k)) / rates[self.cur]
        if loss <= 0 or not c_cur:
            return base
        return int(min(max(base, math.ceil(loss / (self.BUDGET * c_cur))), self.EXPLORE_MAX))

    def _hopeful(self, rates: list) -> list:
        """The other k that could beat the current one: those whose window (as timed, or estimated from
        the k that were), every draft taken, would yield tokens HYSTERESIS times faster than the current
        rate (enough to be switched to), and k = 0 (a plain step needs no acceptance, and one slow plain
        window, e.g. the first after a prefill, must not rule it out). On flash-small a window of k drafts
        costs more than k + 1 plain steps (a 2-core AVX2 host: ~3.4 at k = 1, ~5 at k = 3, the head's extend
        over the waiting rows included), so no k > 0 can beat a plain step: probing them for acceptance
        would only cost."""
        out = []
        for j in range(self.k_max + 1):
            c = self.cost(j)
            if j != self.cur and (j == 0 or c is None or
                                  (self.shared_tokens + j + 1) / c > self.HYSTERESIS * rates[self.cur]):
                out.append(j)
        return out

    def quiet_windows(self) -> int:
        """After choose() gave k = 0: how many windows from this one on are plain for sure and keep no row
        (rows_wanted() False for each): generate() runs them as the one-token loop does, without choose()
        or observe() (count_plain() counts them), so a request that never drafts pays the policy's ~5 us a
        window (flash-small: ~1 % of a step) only within REFRESH_ROWS windows of a probe."""
        if self.cur != 0 or self._probe_again or self._rates is None or self.windows <= self.FIRST_PROBE:
            return 0
        return max(0, self._last_probe + self._gap - REFRESH_ROWS - self.windows)

    def count_plain(self) -> None:
        """One of quiet_windows(): counted, not timed (the times of the plain windows just before the
        next probe are its reference)."""
        self.windows += 1
        self.k_count[0] += 1

    def rows_wanted(self) -> bool:
        """Whether the window choose() just gave k = 0 should keep its pre-mixer row (MTPDecoder.plain): a
        drafting window extends the rows of the REFRESH_ROWS windows before it. False only while k = 0 is
        current, no decision is pending and the next probe is more than REFRESH_ROWS windows away. While
        k = 0 runs, plain windows move only t_0, which moves no decision (_cached_rates), and the gap
        between probes can then only grow (calm comes: EXPLORE / EXPLORE_FAR become the budgeted gap, at
        least as long), so a probe never comes sooner than this reckons."""
        return self.quiet_windows() == 0

    def _drafts_could_pay(self) -> bool:
        """Some k > 0 is among _hopeful(): its window, every draft taken, could beat the current k."""
        return any(j > 0 for j in self._hopeful(self.rates()))

    def _next_probe(self) -> int:
        """The k the next probe runs: k_max and the least recently measured other k in turn."""
        if self.cur != self.k_max and (self.windows <= self.FIRST_PROBE or (self._n_probes + 1) % 2):
            return self.k_max
        return min((j for j in range(self.k_max + 1) if j != self.cur), key=lambda j: self.seen[j])

    def _surprise_side(self, proposed: int, accepted: int, bar: float) -> tuple[int, float]:
        """(+1 / -1, p): `accepted` of `proposed` drafts lies `bar` or more above / below what the estimate
        expects, and p is the chance under it of lying that far out or farther; (0, 1) otherwise."""
        alpha = self.acceptance()[:proposed]
        reach = np.concatenate([[1.0], np.cumprod(alpha)])       # [j]: chance of taking drafts 1..j
        p = reach.copy()
        p[:-1] -= reach[1:]                                      # [j]: chance of taking exactly j
        off = accepted - float(reach[1:].sum())
        if off >= bar:
            return 1, float(p[accepted:].sum())
        if off <= -bar:
            return -1, float(p[:accepted + 1].sum())
        return 0, 1.0

    def acceptance(self) -> np.ndarray:
        """[j] for j in 1..k_max: the estimated chance that draft j is taken when drafts 1..j-1 were."""
        return (self.a[1:] + 0.5) / (self.n[1:] + 1.0)

    def expected_tokens(self, k: int) -> float:
        return 1.0 + float(np.cumprod(self.acceptance()[:k]).sum()) if k > 0 else 1.0

    def ratio(self, k: int) -> float | None:
        """A window of k drafts over a plain step, as measured side by side (the median of its last TIMES
        probes, each over the current k's median of the moment); 1 for k = 0; None: not measured."""
        return 1.0 if k == 0 else self._ratio_med[k]

    def cost(self, k: int) -> float | None:
        """Seconds of a window of k drafts now: the current k's median time, and any other k at its ratio
        to that one (so a probe's cost moves with the machine's speed as the current k's does: on a busy
        host, a cost timed minutes ago in a quiet spell must not look cheap next to one timed in a slow
        one), once the current k's own ratio is known (always for k = 0); a k not measured yet on a line
        through the measured ratios (1 + k / 4 when only k = 0 is)."""
        cur = self.t[self.cur]
        rc = self.ratio(self.cur)
        if cur is None or rc is None or (self.cur and len(self._ratio[self.cur]) < self.TIMES):
            # not yet side by side: a current k > 0 is timed against plain steps only by k = 0's probes, and
            # its ratio is trusted once TIMES of them made it (fewer would carry one probe's noise into
            # every other k's cost); until then, the times as taken
            return self._absolute(k)
        if k == self.cur:
            return cur
        rk = self.ratio(k)
        if rk is None:
            rk = _line([(j, r) for j in range(self.k_max + 1) if (r := self.ratio(j)) is not None], k)
        return cur * rk / rc

    def _absolute(self, k: int) -> float | None:
        if self.t[k] is not None:
            return self.t[k]
        known = [(j, t) for j, t in enumerate(self.t) if t is not None]
        return _line(known, k) if known else None

    def rates(self) -> list:
        """The expected tokens per second of a window of k drafts, for every k (the step's: shared_tokens +
        expected tokens, over cost(k)), from one pass over the estimates."""
        e = np.concatenate([[1.0], 1.0 + np.cumsum(np.cumprod(self.acceptance()))])
        out = []
        for k in range(self.k_max + 1):
            c = self.cost(k)
            out.append((self.shared_tokens + e[k]) / c if c else 0.0)
        return out

    def choose(self, k_cap: int | None = None) -> int:
        """k for the next window (at most k_cap: the context or max_tokens may leave room for fewer)."""
        cap = self.k_max if k_cap is None else max(0, min(int(k_cap), self.k_max))
        w = self.windows
        if w == 0:
            k = 0
        elif self._probe_again and self.cur != self.k_max:
            k = self.k_max
        elif w == self.FIRST_PROBE and self._carried and not self._drafts_could_pay():
            self._last_probe = w                      # the carried ratios stand for this probe (__init__)
            k = self.cur
        elif w == self.FIRST_PROBE or (w > self.FIRST_PROBE and w - self._last_probe >= self._probe_gap()):
            k = self._next_probe()
            self._last_probe = w
            self._n_probes += 1
        else:
            self._cached_rates()
            best = self._switch_to
            if best is not None:
                self._left = self.cur                 # observe(): the new k's first window, against the old k
                self.cur = best
                self._moved = w
                self._rates = None                    # costs and the probe gap are the new k's now
                self.history.append((w, best))
            k = self.cur
        self._probes_in_row = self._probes_in_row + 1 if k != self.cur else 0
        return min(k, cap)

    def observe(self, k: int, proposed: int, accepted: int, seconds: float | None) -> None:
        """A window ran with k chosen: `proposed` drafts made, `accepted` of them taken, in `seconds`.
        seconds None: its time is not one of k's and counts for nothing, its acceptance does, and k_max is
        probed again at once (generate() passes None for the first window of a process that drafts: it
        is the first to read the draft head's weights and experts, and on the bench preset it took 3.7-3.9
        plain steps where later ones took 2.95; one such time ruled drafting out for EXPLORE_MAX windows).
        The first window's time is not taken either (the class docstring)."""
        if self.windows == 0:
            seconds = None
        self.windows += 1
        self.k_sum += k
        self.k_count[min(k, self.k_max)] += 1
        self._probe_again = False
        if proposed > 0:
            # a window far from what the estimate expects says the text changed: the old evidence mostly
            # goes, and a probe follows at once to confirm (the class docstring: surprises)
            probe = self._probes_in_row > 0
            side, p = self._surprise_side(proposed, accepted,
                                          self.SURPRISE_RUN if self._run and not probe else self.SURPRISE)
            if probe:
                surprise = side != 0
            else:
                surprise = side != 0 and side == self._last_side
                self._last_side = side
                self._run = surprise
            if surprise and (not probe or p <= self.P_SURPRISE):
                self._moved = self.windows
            reached = min(accepted + 1, proposed)
            if surprise:                              # the text changed: every draft's evidence goes
                self.n *= self.FORGET
                self.a *= self.FORGET
            else:                                     # only what this window measured ages (class docstring)
                self.n[1:reached + 1] *= self.DECAY
                self.a[1:reached + 1] *= self.DECAY
            self._probe_again = surprise and self._probes_in_row < 3
            self.n[1:reached + 1] += 1.0
            self.a[1:accepted + 1] += 1.0
            if seconds is None:
                self._probe_again = True
                self._rates = None
                return
        if seconds is None:
            return
        self._record(proposed, seconds)
        if self._probe_again and self.cur == 0 and not self._drafts_could_pay():
            # a surprise says the acceptance moved; with no window able to beat a plain step even with
            # every draft taken (flash-small: k = 3 costs ~5.7 plain steps), acceptance cannot change the
            # choice, and probing again at once would only cost
            self._probe_again = False

    def _record(self, proposed: int, seconds: float) -> None:
        """A timed window's seconds: its ratio to the k it is compared with, and its k's median."""
        kk = proposed if proposed > 0 else 0
        # side by side: a probe with the current k, and the first window after a change of k with the k it
        # left (each against that k's median of the moment). Without the latter a change made on one lucky
        # probe flaps: back at k = 0 that probe's ratio says the k left is better, while that k is current its
        # own times against the plain steps' say it is not, and neither kind of window adds a ratio to settle it
        ref = self.cur if kk != self.cur else self._left
        self._left = None
        t_ref = None if ref is None else self.t[ref]
        if kk != ref and t_ref:
            r = seconds / t_ref
            base = self.ratio(ref)
            j, rc = (ref, 1.0 / r) if kk == 0 else (kk, None if base is None else r * base)
            if rc is not None:
                self._ratio[j].append(rc)
                self._ratio_med[j] = statistics.median(self._ratio[j])
                self._rates = None
        self._times[kk].append(seconds)
        self.seen[kk] = self.windows
        self._stale += 1
        if proposed > 0 or self._stale >= 8 or self.t[kk] is None:
            self.t[kk] = statistics.median(self._times[kk])
            if proposed > 0:
                self._rates = None

    def stats(self) -> dict:
        return {"mtp_k": self.k_sum / self.windows if self.windows else 0.0,
                "mtp_k_windows": list(self.k_count),
                "mtp_k_changes": [{"window": w, "k": k} for w, k in self.history]}
