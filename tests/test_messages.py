"""What a careless user finds (issue 15, point 5), end to end through the Python API and the
`strata` command: a prompt that is not UTF-8 (from argv, stdin, bytes or a str holding
surrogates) names the byte; a GGUF cut short says so with both sizes; --threads above the cores
this process may use warns once. The byte-level checks themselves are in test_tokenizer.py,
test_gguf.py and tests/native/test_api.c."""
from __future__ import annotations

import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
from click.testing import CliRunner

from pyrunner import gguf_info
from pyrunner._native import FormatError
from pyrunner.cli import main
from pyrunner.model import Model
from pyrunner.models import make_model

ROOT = Path(__file__).resolve().parents[1]
CLI = [sys.executable, "-c", "from pyrunner.cli import main; main()"]
ENV = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
CORES = len(os.sched_getaffinity(0))


@pytest.fixture(scope="module")
def micro(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("messages") / "micro.gguf"
    make_model("micro", str(path), "f32", 0)
    return path


@pytest.fixture(scope="module")
def model(micro):
    with Model(micro, threads=1) as m:
        yield m


# ---------------------------------------------------------------------------- prompts not in UTF-8

def test_model_refuses_text_that_is_not_utf8(model):
    assert model.tokenize(b"caf\xc3\xa9", add_special=False) == model.tokenize("café", add_special=False)
    for prompt, at in [(b"ab\xff", 2), ("ab\udcff", 2), ("caf\u00e9\ud800", 5), (b"\xe2\x82", 0)]:
        with pytest.raises(ValueError, match=f"^the prompt is not valid UTF-8 at byte {at} "):
            model.tokenize(prompt)
    with pytest.raises(ValueError, match="^the prompt is not valid UTF-8 at byte 3 "):
        model.generate("abc\udcfe", max_tokens=2, temperature=0)


@pytest.mark.parametrize("via", ["argv", "stdin"])
def test_cli_names_the_byte_of_a_prompt_that_is_not_utf8(micro, via):
    """Real argv bytes (not a str click was handed) and a pipe: both reach the tokenizer as the
    surrogate escapes Python makes of them."""
    cmd = [*CLI, "generate", "-m", str(micro), "-n", "2", "--threads", "1"]
    if via == "argv":
        r = subprocess.run([os.fsencode(c) for c in cmd] + [b"hi \xff there"], capture_output=True, env=ENV,
                           timeout=120)
    else:
        r = subprocess.run(cmd + ["-"], input=b"hi \xff there", capture_output=True, env=ENV, timeout=120)
    err = r.stderr.decode(errors="replace")
    assert r.returncode == 1, err
    assert "Error: the prompt is not valid UTF-8 at byte 3 (0xff)" in err
    assert "Traceback" not in err


# ---------------------------------------------------------------------------- a GGUF cut short

def test_truncated_model_says_it_is_incomplete(micro, tmp_path):
    data = micro.read_bytes()
    tensors = gguf_info(micro)["tensors"]
    need = max(t["offset"] + t["size"] for t in tensors)
    first = min(t["offset"] for t in tensors)
    cut = tmp_path / "micro-partial.gguf"
    for n in (first, first + 1, (first + need) // 2, need - 1):   # inside the tensor data
        cut.write_bytes(data[:n])
        want = f"{cut}: the file has {n} bytes, its tensors need {need}: the copy is incomplete (download it again)"
        with pytest.raises(FormatError) as e:
            gguf_info(cut)
        assert str(e.value).startswith(want), str(e.value)
        with pytest.raises(FormatError, match="the copy is incomplete"):
            Model(cut)
        r = CliRunner().invoke(main, ["inspect", str(cut)])
        assert r.exit_code == 1 and f"Error: {want}" in r.output, r.output
    for n in (30, 200, first // 2):                                 # inside the header / metadata
        cut.write_bytes(data[:n])
        r = CliRunner().invoke(main, ["inspect", str(cut)])
        assert r.exit_code == 1 and str(cut) in r.output and "cut short" in r.output, (n, r.output)


# ---------------------------------------------------------------------------- --threads

def test_threads_above_the_cores_warn_once(micro):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        Model(micro, threads=CORES, n_ctx=64).close()
        assert caught == []
        Model(micro, threads=CORES + 2, n_ctx=64).close()
    msg = (f"--threads {CORES + 2}: this machine has {CORES} core{'s' if CORES != 1 else ''}; more threads than "
           "cores slow every step")
    assert [str(w.message) for w in caught] == [msg]
    assert caught[0].filename == __file__          # points at the caller's line, not at pyrunner
    r = CliRunner().invoke(main, ["generate", "hi", "-m", str(micro), "-n", "1", "--threads", str(CORES + 2),
                                  "--n-ctx", "64"])
    assert r.exit_code == 0, r.output
    assert r.stderr.count("warning: ") == 1 and f"warning: {msg}\n" in r.stderr, r.stderr
    assert "UserWarning" not in r.stderr
