"""The shipped trained model (issue 8; models/flash-small/, made by tools/flash_small.py): the default of
`strata generate` / `strata chat`, held-out perplexity that only a trained model has, and an MTP head whose
drafts the trunk accepts. models/flash-small/heldout-sample.txt is the start of the held-out split (text
the model never trained on)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from pyrunner import Model
from pyrunner.cli import main
from pyrunner.generate import generate
from pyrunner.models import shipped_model_path

ROOT = Path(__file__).resolve().parent.parent
SHIPPED = ROOT / "models" / "flash-small"
REPORT = json.loads((SHIPPED / "report.json").read_text())
SEQ = 256                                   # the training context


@pytest.fixture(scope="module")
def q8():
    with Model(SHIPPED / "flash-small-q8_0.gguf", threads=2, n_ctx=1024) as m:
        yield m


@pytest.fixture(scope="module")
def sample_ids(q8):
    return q8.tokenize((SHIPPED / "heldout-sample.txt").read_text(encoding="utf-8"), add_special=False)


def test_the_default_model_is_the_shipped_one():
    assert Path(shipped_model_path()) == SHIPPED / "flash-small-q8_0.gguf"
    env = {"STRATA_MODEL": None, "XDG_CACHE_HOME": os.devnull}       # nothing may be built: no cache needed
    r = CliRunner().invoke(main, ["generate", "import os\nimport sys\n\n\ndef main(", "-n", "24", "--temp", "0",
                                  "--json", "--n-ctx", "512"], env=env)
    assert r.exit_code == 0, r.output
    assert "built-in model" in r.stderr and "RANDOM weights" not in r.stderr and "building" not in r.stderr
    out = json.loads(r.stdout)
    assert len(out["tokens"]) == 24 and out["text"].strip()
    r = subprocess.run([sys.executable, "-m", "pyrunner.cli", "chat", "-n", "8", "--temp", "0", "--n-ctx", "512"],
                       input="def add(a, b):\n/exit\n", capture_output=True, text=True, cwd=ROOT, timeout=120,
                       env={k: v for k, v in os.environ.items() if k != "STRATA_MODEL"})
    assert r.returncode == 0 and "flash-small" in r.stderr, r.stderr
    assert r.stdout.strip()


def test_report_records_a_model_ten_times_better_than_unigram():
    assert REPORT["heldout_ppl"] < REPORT["unigram_ppl"] / 10
    assert REPORT["tokens_seen"] > 0 and REPORT["train_hours"] <= 3.0
    assert (SHIPPED / "loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    src = json.loads((SHIPPED / "sources.json").read_text())
    assert {g["licence"] for g in src["groups"]} <= {"PSF-2.0", "Vim licence (charityware)"}


@pytest.mark.parametrize("kind", ["q8_0", "iq2_xs"])
def test_heldout_perplexity_is_a_trained_models(sample_ids, kind):
    """A random model scores about the vocabulary size (8192); the trained one below a tenth of the unigram
    model's perplexity on the held-out text, in both shipped formats (tools/flash_small.py's measure)."""
    sys.path.insert(0, str(ROOT / "tools"))
    from flash_small import strata_ppl

    n = min(8, len(sample_ids) // SEQ)
    assert n >= 4
    windows = np.array([sample_ids[w * SEQ:(w + 1) * SEQ] for w in range(n)])
    ppl = strata_ppl(str(SHIPPED / f"flash-small-{kind}.gguf"), windows, 2)["ppl"]
    assert ppl < REPORT["unigram_ppl"] / 10, ppl


def test_mtp_drafts_are_accepted(q8, sample_ids):
    """The trained MTP head drafts what the trunk then says (a random head is accepted ~1/8192 of the time);
    greedy output is the same with drafts as without."""
    assert q8.n_mtp == 1
    prop = acc = 0
    for start in (0, 700, 1400):
        prompt = sample_ids[start:start + 40]
        ref = generate(q8, prompt, max_tokens=32, temperature=0.0, add_special=False, mtp=0, session=q8.session())
        got = generate(q8, prompt, max_tokens=32, temperature=0.0, add_special=False, mtp=2, session=q8.session())
        assert got.tokens == ref.tokens
        prop += got.stats["drafts_proposed"]
        acc += got.stats["drafts_accepted"]
    assert prop > 0 and acc / prop > 0.3, (acc, prop)


# Strata vs llama.cpp on the trained model's quantized files (16 held-out prompts of 64 tokens; QSA does not bind):
# issue 3's top-1 >= 99 %. On the same weights dequantized to F32 the two engines agree at every position; what is
# left is int8 activation rounding: Strata's act_q8_32 blocks store their scale rounded to fp16 as ggml's q8_0
# does (quant.h strata_act_d_q8_32), so with IQ4_NL / Q8_0 / ... weights both engines multiply the same integers.
# Measured (pytest -s; tools/flash_small.py's other prompts): q8_0 0.9980 (0.9961), iq2_xs 1.0000 (0.9980), nvfp4
# (0.9971); with fp32 scales it was 0.9941 (0.9932), 0.9922 (0.9883), (0.9980): iq2_xs missed the 99 %. Each
# engine's own rounding moves its logits from the exact result by the same median (iq2_xs 0.0121 / 0.0120).
LLAMA_TOP1_MIN = 0.99
EXACT_TOP1_MIN = 0.985       # Strata(quantized) vs Strata(dequantized): measured 0.9932 (q8_0), 0.9932 (iq2_xs)
NOISE_RATIO_MAX = 1.2        # median|Strata(q) - exact| / median|llama.cpp(q) - exact|: measured 1.00, 1.01


@pytest.mark.parametrize("kind", ["q8_0", "iq2_xs"])
def test_quantized_files_agree_with_llama_cpp(sample_ids, tmp_path, kind):
    from model_oracles import dequantized_copy, llama_logits

    from pyrunner.gguf import trunk_only

    q = Path(trunk_only(SHIPPED / f"flash-small-{kind}.gguf", tmp_path / f"trunk-{kind}.gguf"))
    d = dequantized_copy(q, tmp_path / f"trunk-{kind}-deq.gguf")
    prompts = [sample_ids[i:i + 64] for i in range(0, 16 * 250, 250)]

    def strata(path):
        with Model(path, threads=2, n_ctx=128, kv_type="f32") as m:
            assert m.n_mtp == 0
            return np.concatenate([m.session().eval(p, all_logits=True) for p in prompts])

    sq, sd = strata(q), strata(d)
    lq, ld = (np.concatenate(llama_logits(p, prompts, n_ctx=128)) for p in (q, d))
    top1 = lambda a, b: float(np.mean(a.argmax(-1) == b.argmax(-1)))  # noqa: E731
    noise = float(np.median(np.abs(sq - sd)) / np.median(np.abs(lq - sd)))
    print(f"\n{kind}: top-1 with llama.cpp {top1(sq, lq):.4f} over {len(sq)} positions; dequantized: max|dlogit| "
          f"{np.abs(sd - ld).max():.2e}; vs exact: Strata {top1(sq, sd):.4f}, llama.cpp {top1(lq, sd):.4f}, "
          f"median noise ratio {noise:.2f}")
    assert np.abs(sd - ld).max() <= 1e-3 and top1(sd, ld) == 1.0
    assert top1(sq, sd) >= EXACT_TOP1_MIN and noise <= NOISE_RATIO_MAX
    assert top1(sq, lq) >= LLAMA_TOP1_MIN
