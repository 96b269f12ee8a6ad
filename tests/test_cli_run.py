"""`strata generate` and `strata chat` on the tiny preset, and the default demo model: --json keys and
values against the Python API, STRATA_* variables, errors as messages, chat driven through a real pipe
(multi-line input, /stats, /reset, /exit) and Ctrl-C (SIGINT) stopping an answer but not the program."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from pyrunner.cli import main
from pyrunner.generate import STATS_KEYS, ChatTurn, chat_prompt_ids, end_of_generation_ids, generate
from pyrunner.model import Model
from pyrunner.models import demo_model_path, make_model

ROOT = Path(__file__).resolve().parents[1]
ENV = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("cli_run") / "tiny.gguf"
    make_model("tiny", str(path), "f32", 0)
    return str(path)


@pytest.fixture(scope="module")
def model(tiny_path):
    with Model(tiny_path, threads=2, n_ctx=1024) as m:
        yield m


def test_generate_json_is_exactly_the_completion(tiny_path, model):
    r = CliRunner().invoke(main, ["generate", "hello world", "-m", tiny_path, "-n", "12", "--temp", "0",
                                  "--json", "--threads", "2", "--n-ctx", "1024"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert set(out) == {"text", "tokens", "finish_reason", "stats"}
    ref = generate(model, "hello world", max_tokens=12, temperature=0, session=model.session())
    assert out["tokens"] == ref.tokens and out["text"] == ref.text and out["finish_reason"] == ref.finish_reason
    assert set(out["stats"]) <= set(STATS_KEYS) and out["stats"]["prompt_tokens"] == ref.stats["prompt_tokens"]


def test_generate_streams_text_and_reads_settings_from_the_environment(tiny_path, model):
    eos = model.metadata["tokenizer.ggml.eos_token_id"]
    env = {"STRATA_MODEL": tiny_path, "STRATA_N_PREDICT": "9", "STRATA_TEMP": "0", "STRATA_LOGIT_BIAS": f"{eos}-inf",
           "STRATA_N_CTX": "1024"}
    r = CliRunner().invoke(main, ["generate", "once upon"], env=env)
    assert r.exit_code == 0, r.output
    ref = generate(model, "once upon", max_tokens=9, temperature=0, logit_bias={eos: -np.inf},
                   session=model.session())
    assert len(ref.tokens) == 9
    assert r.stdout == ref.text + "\n"
    assert "generated 9 tokens" in r.stderr and "finish: length" in r.stderr
    # the prompt may come from standard input
    r = CliRunner().invoke(main, ["generate", "--json"], input="once upon", env=env)
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["tokens"] == ref.tokens


def test_generate_errors_are_messages(tiny_path):
    r = CliRunner().invoke(main, ["generate", "hi", "-m", tiny_path, "--top-p", "2"])
    assert r.exit_code == 1 and "--top-p" in r.output and "Traceback" not in r.output
    r = CliRunner().invoke(main, ["generate", "word " * 40, "-m", tiny_path, "--n-ctx", "16"])
    assert r.exit_code == 1 and "--n-ctx" in r.output and "context holds 16" in r.output
    r = CliRunner().invoke(main, ["generate", "hi", "-m", tiny_path, "--kv-type", "f8"])
    assert r.exit_code == 2 and "f8" in r.output


def _chat_reference(model, turns, n):
    """Greedy answers of the chat REPL: each turn continues the previous one's tokens."""
    msgs, answers, turn = [], [], None
    for t in turns:
        msgs.append({"role": "user", "content": t})
        ids, text = chat_prompt_ids(model, msgs, turn)
        c = generate(model, ids, max_tokens=n, temperature=0, session=model.session())
        turn = ChatTurn(ids, text, c.tokens, c.text)
        msgs.append({"role": "assistant", "content": c.text})
        answers.append(c.text)
    return answers


def test_chat_through_a_pipe(tiny_path, model):
    script = "hello there\n/stats\nsecond \\\nline\n/stats\n/reset\n/stats\n/nonsense\nagain\n/exit\nnever answered\n"
    r = subprocess.run([sys.executable, "-m", "pyrunner.cli", "chat", "-m", tiny_path, "-n", "10", "--temp", "0",
                        "--n-ctx", "1024"], input=script, capture_output=True, text=True, cwd=ROOT, env=ENV,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    a1, a2 = _chat_reference(model, ["hello there", "second \nline"], 10)
    (a3,) = _chat_reference(model, ["again"], 10)
    stats = r"\(prompt \d+ tokens, .*generated \d+ tokens.*context \d+/1024 tokens\)\n"
    reused = r"\(prompt \d+ tokens \([1-9]\d* reused\), .*generated \d+ tokens.*context \d+/1024 tokens\)\n"
    pattern = (re.escape(a1 + "\n") + stats + re.escape(a2 + "\n") + reused
               + re.escape("(conversation cleared)\n(no answer yet)\n")
               + r"\(unknown command /nonsense; .*\)\n" + re.escape(a3 + "\n"))
    assert re.fullmatch(pattern, r.stdout, re.S), r.stdout
    assert "Traceback" not in r.stderr


def test_chat_ctrl_c_stops_the_answer_not_the_program(tiny_path, model):
    bans = [a for t in sorted(end_of_generation_ids(model)) for a in ("--logit-bias", f"{t}-inf")]
    proc = subprocess.Popen([sys.executable, "-m", "pyrunner.cli", "chat", "-m", tiny_path, "-n", "-1", *bans,
                             "--n-ctx", "32768", "--threads", "1"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT, env=ENV)
    got = bytearray()

    def pump():
        while chunk := proc.stdout.read1(4096):
            got.extend(chunk)
    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    proc.stdin.write(b"tell me everything\n")
    proc.stdin.flush()
    deadline = time.time() + 30
    while len(got) < 20 and time.time() < deadline:
        time.sleep(0.01)
    assert len(got) >= 20, "no answer is streaming"
    proc.send_signal(signal.SIGINT)
    deadline = time.time() + 30
    while b"(stopped)" not in got and time.time() < deadline:
        time.sleep(0.01)
    proc.stdin.write(b"/stats\n/exit\n")
    proc.stdin.close()
    assert proc.wait(timeout=30) == 0, proc.stderr.read().decode()
    reader.join(5)
    text = got.decode("utf-8", "replace")
    # /stats shows the stopped answer's figures (tests/test_chat_repl.py checks them, and the next turn)
    assert " (stopped)\n" in text and "finish: interrupted" in text.rstrip("\n").splitlines()[-1]


def test_demo_model_is_built_once_into_the_cache_and_says_what_it_is(tmp_path, monkeypatch):
    # without the shipped trained model (tests/test_flash_small.py), the default is the random demo model
    monkeypatch.setattr("pyrunner.models.shipped_model_path", lambda name=None: None)
    env = {"XDG_CACHE_HOME": str(tmp_path), "STRATA_MODEL": None}
    r = CliRunner().invoke(main, ["generate", "hello", "-n", "3", "--temp", "0", "--json", "--n-ctx", "256"], env=env)
    assert r.exit_code == 0, r.output
    assert "building the demo model" in r.stderr and "RANDOM weights" in r.stderr
    os.environ["XDG_CACHE_HOME"] = str(tmp_path)
    try:
        path = Path(demo_model_path())
    finally:
        del os.environ["XDG_CACHE_HOME"]
    assert path.parent == tmp_path / "strata" and path.is_file()
    assert [p.name for p in path.parent.iterdir()] == [path.name]     # no temp file left behind
    first = json.loads(r.stdout)
    assert len(first["tokens"]) == 3
    r = CliRunner().invoke(main, ["generate", "hello", "-n", "3", "--temp", "0", "--json", "--n-ctx", "256"], env=env)
    assert r.exit_code == 0, r.output
    assert "building" not in r.stderr and "RANDOM weights" in r.stderr
    assert json.loads(r.stdout)["tokens"] == first["tokens"]


def test_chat_template_kwargs_must_be_a_json_object(tiny_path):
    for bad, msg in (("[1]", "must be a JSON object"), ("{oops", "not valid JSON")):
        r = CliRunner().invoke(main, ["chat", "-m", tiny_path, "--chat-template-kwargs", bad], input="hi\n")
        assert r.exit_code == 1 and msg in r.output and "Traceback" not in r.output


# ------------------------------------------------------------------ llama.cpp habits, the context

def test_llama_cpp_spellings_prompt_ctx_size_threads(tiny_path, model):
    ref = generate(model, "hello world", max_tokens=12, temperature=0, session=model.session())
    r = CliRunner().invoke(main, ["generate", "-p", "hello world", "-m", tiny_path, "-n", "12", "--temp", "0",
                                  "--json", "-t", "2", "-c", "1024"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["tokens"] == ref.tokens
    r = CliRunner().invoke(main, ["generate", "--prompt", "word " * 40, "-m", tiny_path, "--ctx-size", "16"])
    assert r.exit_code == 1 and "context holds 16" in r.output       # -c/--ctx-size is --n-ctx
    r = CliRunner().invoke(main, ["generate", "hello", "-p", "world", "-m", tiny_path])
    assert r.exit_code == 1 and "given twice" in r.output and "Traceback" not in r.output


@pytest.mark.parametrize("args", [["-ngl", "99"], ["--n-gpu-layers=99"], ["-ot", "exps=CPU"],
                                  ["--n-cpu-moe", "8"], ["-cmoe"]])
def test_llama_cpp_flags_strata_lacks_name_what_to_use(tiny_path, tmp_path, args):
    jobs = tmp_path / "in.jsonl"
    jobs.write_text('{"id": 1, "prompt": "hi"}\n')
    for cmd in (["generate", "hi"], ["chat"], ["batch", str(jobs), "-o", str(tmp_path / "out.jsonl")]):
        r = CliRunner().invoke(main, [*cmd, "-m", tiny_path, *args], input="hi\n")
        assert r.exit_code == 2, (cmd, r.output)
        assert "is llama.cpp's" in r.output and "--device c" in r.output, r.output
        assert "No such option" not in r.output and "not a valid integer" not in r.output
    assert not (tmp_path / "out.jsonl").exists()                       # refused before anything ran


def test_n_predict_minus_2_fills_the_context_and_other_negatives_are_refused(tiny_path, model):
    bans = [a for t in sorted(end_of_generation_ids(model)) for a in ("--logit-bias", f"{t}-inf")]
    n_prompt = len(model.tokenize("hello world"))
    for n in ("-1", "-2"):
        r = CliRunner().invoke(main, ["generate", "hello world", "-m", tiny_path, "-n", n, "--temp", "0", "--json",
                                      "--n-ctx", "16", *bans])
        assert r.exit_code == 0, r.output
        out = json.loads(r.stdout)
        # every position up to n_ctx is evaluated; the token sampled after the last one ends the request
        assert out["finish_reason"] == "length" and len(out["tokens"]) == 16 - n_prompt + 1
    r = CliRunner().invoke(main, ["generate", "hello world", "-m", tiny_path, "-n", "-3"])
    assert r.exit_code == 1 and "-n" in r.output and "-2 (until the context is filled)" in r.output


def test_more_context_than_trained_warns_on_stderr(tiny_path):
    r = CliRunner().invoke(main, ["generate", "hi", "-m", tiny_path, "-n", "2", "--temp", "0", "--n-ctx", "8192"])
    assert r.exit_code == 0, r.output
    assert r.stderr.count("warning: n_ctx 8192 is more than") == 1 and "(4096 tokens" in r.stderr
    r = CliRunner().invoke(main, ["generate", "hi", "-m", tiny_path, "-n", "2", "--temp", "0"])
    assert r.exit_code == 0 and "warning" not in r.stderr              # the default is the trained context
    r = CliRunner().invoke(main, ["generate", "--help"])
    assert "trained context" in r.output and "-c, --n-ctx, --ctx-size" in r.output
