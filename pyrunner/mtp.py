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

import time
from typing import Callable, Sequence

import numpy as np

from . import trace
from .sampling import Sampler, draw, greedy

DraftHook = Callable[[int, int], int]


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
        self._rows: tuple | None = None                # prompt rows waiting for the first extend
        self._last: tuple | None = None                # the last window: (p, logits, hidden) for truncate()
        self.proposed = self.accepted = self.windows = self.full = 0
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
        self._rows = (rows, [int(t) for t in ids[p0 + 1:]], p0)

    def _extend(self, rows: np.ndarray, next_ids: list[int], p0: int) -> None:
        if len(rows) == 0:
            self.draft_logits = self.chain = None
            return
        t = time.perf_counter()
        self.draft_logits, self.chain = self.sess.mtp(rows, next_ids, p0)
        self.extend_s += time.perf_counter() - t
        trace.since("mtp extend", "mtp", t, rows=len(rows))

    # ------------------------------------------------------------------ one round
    def _draft(self, logits: np.ndarray, history: list[int], pos: int) -> tuple[int, np.ndarray | None]:
        """A draft token for position pos and the distribution it was drawn from (None: greedy)."""
        if self.sampler.is_greedy:
            d, q = greedy(self.sampler.filtered_logits(logits, history)), None
        else:
            q = self.sampler.distribution(logits, history)
            d = draw(q, self.sampler.uniform())
        if self.hook is not None:
            forced = int(self.hook(pos, d))
            if forced != d and q is not None:
                q = np.zeros_like(q)
                q[forced] = 1.0
            d = forced
        return d, q

    def round(self, x: int, history: list[int], k: int | None = None) -> list[int]:
        """Runs one window for x (the last token of history, not yet evaluated) with up to k drafts
        (default self.k; fewer near the end of the context or of max_tokens). Returns the new tokens."""
        sess = self.sess
        p = sess.n_past
        if self._rows is not None:                    # the prompt's MTP rows, now that x is known
            rows, nxt, p0 = self._rows
            self._rows = None
            self._extend(rows, nxt + [x], p0)
        k = self.k if k is None else max(0, min(int(k), self.k))
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
                pdist = self.sampler.distribution(L[i], h)
                q = qs[i]
                if self.sampler.uniform() * q[d] >= pdist[d]:     # reject with 1 - min(1, p/q)
                    resid = np.maximum(pdist - q, 0.0)
                    new.append(draw(resid if resid.sum() > 0 else pdist, self.sampler.uniform()))
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
        # the next round's first draft: the MTP over the verified rows, each with its next token
        self._extend(H[:a + 1], new, p)
        return new

    def truncate(self, n_new: int) -> None:
        """The caller stopped after the first n_new + 1 tokens of the last round's output: the
        session keeps x and the first n_new of them (the last emitted token is not evaluated)."""
        p, L, H = self._last
        if p + 1 + n_new < self.sess.n_past:
            t0 = time.perf_counter()
            self.sess.rollback(p + 1 + n_new, logits=L[n_new], hidden=H[n_new])
            self.rollback_s += time.perf_counter() - t0

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
