"""`strata chat` on a terminal (a pty), as a user types at it: Ctrl-C (the tty's ^C, so the kernel sends
SIGINT) stops an answer; /stats then shows that partial answer's figures, the answer stays in the
conversation, and the next turn continues from the session's state, evaluating only the new message.

Every read has a deadline and the child is killed at the end whatever happens."""
from __future__ import annotations

import fcntl
import os
import pty
import re
import select
import subprocess
import sys
import termios
import time
from pathlib import Path

import pytest

from pyrunner.generate import end_of_generation_ids
from pyrunner.model import Model
from pyrunner.models import make_model

ROOT = Path(__file__).resolve().parents[1]
N_CTX = 32768


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("chat_repl") / "tiny.gguf"
    make_model("tiny", str(path), "f32", 0)
    return str(path)


def test_a_stopped_stream_returns_its_completion_and_the_session_continues_from_it(tiny_path):
    """What chat's Ctrl-C relies on: CompletionStream.stop() ends the request after the token it is on, with
    the partial completion and its stats, and the session keeps every token but the last sampled one."""
    from pyrunner.generate import generate

    with Model(tiny_path, threads=1, n_ctx=1024) as m:
        bias = {t: float("-inf") for t in end_of_generation_ids(m)}
        sess = m.session()
        ids = m.tokenize("tell me everything")
        stream = generate(m, ids, max_tokens=None, temperature=0, logit_bias=bias, session=sess, stream=True)
        for i, _ in enumerate(stream):
            if i == 2:
                stream.stop()
        c = stream.completion
        assert c.finish_reason == "interrupted" and 3 <= len(c.tokens) < 50, (c.finish_reason, len(c.tokens))
        assert c.stats["generated_tokens"] == len(c.tokens) and c.stats["decode_tps"] > 0
        assert sess.tokens == ids + c.tokens[:-1]
        more = ids + c.tokens + m.tokenize(" and then?", add_special=False)
        c2 = generate(m, more, max_tokens=3, temperature=0, session=sess)
        assert c2.stats["reused_prompt_tokens"] == len(ids) + len(c.tokens) - 1
        # and the same tokens as a fresh session evaluating it all
        assert c2.tokens == generate(m, more, max_tokens=3, temperature=0, session=m.session()).tokens


class Terminal:
    """The master side of a pty whose slave is a child's stdin, stdout, stderr and controlling terminal."""

    def __init__(self, argv: list[str], env: dict):
        self.fd, slave = pty.openpty()
        # a new session that takes the pty as its controlling terminal, so ^C written here is a SIGINT
        self.proc = subprocess.Popen(argv, stdin=slave, stdout=slave, stderr=slave, cwd=ROOT, env=env,
                                     start_new_session=True,
                                     preexec_fn=lambda: fcntl.ioctl(0, termios.TIOCSCTTY, 0))
        os.close(slave)
        self.out = ""          # everything the child wrote
        self.mark = 0          # expect() looks at out[mark:]

    def write(self, text: str) -> None:
        os.write(self.fd, text.encode())

    def expect(self, pattern: str, timeout: float) -> re.Match:
        """Reads until pattern matches what came after the last match; fails after `timeout` seconds."""
        rx = re.compile(pattern, re.S)
        deadline = time.monotonic() + timeout
        while True:
            m = rx.search(self.out, self.mark)
            if m:
                self.mark = m.end()
                return m
            left = deadline - time.monotonic()
            if left <= 0:
                pytest.fail(f"no {pattern!r} within {timeout} s; the terminal shows:\n{self.out[self.mark:][-3000:]}")
            ready, _, _ = select.select([self.fd], [], [], min(left, 0.5))
            if ready:
                try:
                    chunk = os.read(self.fd, 65536)
                except OSError:        # EIO: the child closed its side
                    chunk = b""
                if not chunk:
                    pytest.fail(f"the chat exited (status {self.proc.poll()}) before {pattern!r}:\n"
                                f"{self.out[self.mark:][-3000:]}")
                self.out += chunk.decode("utf-8", "replace")

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=10)
        os.close(self.fd)


def test_ctrl_c_keeps_the_partial_answer_and_the_next_turn_reuses_the_conversation(tiny_path):
    with Model(tiny_path, threads=1, n_ctx=256) as m:
        eog = sorted(end_of_generation_ids(m))
    # end-of-turn tokens banned and no -n limit: an answer runs until Ctrl-C stops it
    bans = [a for t in eog for a in ("--logit-bias", f"{t}-inf")]
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""), TERM="dumb")
    term = Terminal([sys.executable, "-m", "pyrunner.cli", "chat", "-m", tiny_path, "-n", "-1", "--temp", "0",
                     *bans, "--n-ctx", str(N_CTX), "--threads", "1"], env)
    stats_rx = (r"\(prompt (\d+) tokens(?: \((\d+) reused\))?, prefill [\d.]+ s \([\d.]+ tok/s\), "
                r"first token [\d.]+ s, generated (\d+) tokens, decode [\d.]+ s \([\d.]+ tok/s\), "
                r"finish: interrupted; conversation: [\d.]+ tok/s; context (\d+)/" + str(N_CTX) + r" tokens\)")
    try:
        figures = []
        for message in ("tell me everything", "and then?"):
            term.expect(r"> ", 30)
            term.write(message + "\r")
            term.expect(re.escape(message) + r"\r?\n.{20}", 30)     # the answer is streaming
            term.write("\x03")                                       # Ctrl-C
            term.expect(r" \(stopped\)\r?\n", 30)
            term.expect(r"> ", 30)
            term.write("/stats\r")
            m = term.expect(r"\(no answer yet\)|" + stats_rx, 30)
            assert m.group(1) is not None, f"after Ctrl-C, /stats shows {m.group(0)!r}, not the partial answer's figures"
            prompt, reused, generated, context = (int(g or 0) for g in m.groups())
            figures.append((prompt, reused, generated, context))
        term.write("/exit\r")
        deadline = time.monotonic() + 20
        while term.proc.poll() is None and time.monotonic() < deadline:
            select.select([term.fd], [], [], 0.2)
            try:
                os.read(term.fd, 65536)
            except OSError:
                break
        assert term.proc.wait(timeout=max(1.0, deadline - time.monotonic())) == 0, term.out[-3000:]
    finally:
        term.close()
    (p1, r1, g1, c1), (p2, r2, g2, c2) = figures
    assert r1 == 0 and g1 >= 2
    # the session holds the first prompt and every answer token but the last sampled one (never evaluated)
    assert c1 == p1 + g1 - 1
    # the second prompt continues the first turn token for token (the partial answer is in it), and the
    # session resumes there: only the new message (and that last answer token) is evaluated
    assert p2 > p1 + g1 and r2 == c1, figures
    assert c2 == p2 + g2 - 1
    assert "Traceback" not in term.out
