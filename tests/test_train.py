"""The small trained model's pipeline (issue 8): corpus and tokenizer (tools/make_corpus.py), training with
checkpoints that resume exactly (tools/train.py), and the export -> strata convert -> Strata path, checked
against transformers for the trunk and against the training code's own MTP head (built from transformers'
decoder layer, so the MTP layer's QSA runs through transformers' indexer) for the MTP step."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import numpy as np
import pytest

from model_oracles import HFReference

ROOT = Path(__file__).resolve().parent.parent
TINY = {"hidden_size": 64, "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 32,
        "linear_num_key_heads": 1, "linear_num_value_heads": 2, "linear_key_head_dim": 16,
        "linear_value_head_dim": 16, "num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
        "shared_expert_intermediate_size": 32, "hc_lowrank": 8, "ngram_vocab_size_base": 500,
        "indexer_head_dim": 16, "indexer_budget": 16, "rope_parameters": {"rope_type": "default", "rope_theta": 1e6,
        "partial_rotary_factor": 0.25, "mrope_section": [2, 1, 1]}}


def run(*args):
    r = subprocess.run([sys.executable, *map(str, args)], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return r


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    out = tmp_path_factory.mktemp("corpus")
    # the interpreter's asyncio sources (~490 KB): text that does not change with this tree's code, so the
    # tiny model trained below (and where its QSA cuts fall) is the same from one commit to the next
    stdlib = sysconfig.get_paths()["stdlib"]
    run(ROOT / "tools" / "make_corpus.py", out, "--vocab", "512", "--heldout", "0.2",
        "--sources", os.path.join(stdlib, "asyncio", "*.py"))
    return out


def train(corpus, run_dir, *extra):
    return run(ROOT / "tools" / "train.py", corpus, run_dir, "--threads", "1", "--seq", "48", "--batch", "2",
               "--tokens-per-s", "100", "--hours", "0.01", "--eval-every", "3", "--final-eval-windows", "4",
               "--config", json.dumps(TINY), *extra)


def test_corpus_and_tokenizer(corpus):
    stats = json.loads((corpus / "stats.json").read_text())
    src = json.loads((corpus / "sources.json").read_text())
    assert stats["vocab"] == 512 and stats["heldout_documents"] >= 1 and stats["train_tokens"] > 10000
    assert len({f["sha256"] for f in src["files"]}) == len(src["files"])          # deduplicated
    assert {f["split"] for f in src["files"]} == {"train", "heldout"}
    assert 50 < stats["unigram_ppl_heldout"] < 512
    tj = json.loads((corpus / "tokenizer.json").read_text())
    assert [t["content"] for t in tj["added_tokens"]] == ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    toks = np.fromfile(corpus / "train.bin", dtype=np.uint16)
    assert toks.max() < 512 and (toks == tj["added_tokens"][0]["id"]).sum() == stats["train_documents"]


def test_training_resumes_exactly_and_exports_what_strata_runs(corpus, tmp_path):
    import torch

    a, b = tmp_path / "a", tmp_path / "b"
    train(corpus, a, "--stop-at-step", "6")
    train(corpus, b, "--stop-at-step", "3")            # a session that ends early ...
    train(corpus, b, "--stop-at-step", "6")            # ... and the next one, resuming
    ca, cb = (torch.load(d / "ckpt.pt", weights_only=False) for d in (a, b))
    assert ca["state"]["step"] == cb["state"]["step"] == 6 and ca["data_pos"] == cb["data_pos"] == 12
    for k, v in ca["model"].items():
        assert torch.equal(v, cb["model"][k]), k
    for k, v in ca["mtp"].items():
        assert torch.equal(v, cb["mtp"][k]), k
    log = json.loads((a / "log.json").read_text())
    assert len(log["log"]) == 6 and log["evals"] and log["log"][-1][2] < log["log"][0][2] + 1.0

    hf = tmp_path / "hf"
    run(ROOT / "tools" / "train.py", corpus, a, "--export", hf, "--config", json.dumps(TINY))
    gguf = tmp_path / "m.gguf"
    run("-m", "pyrunner.cli", "convert", hf, "-o", gguf)

    sys.path.insert(0, str(ROOT / "tools"))
    import train as tr
    tr.CONFIG.update(TINY)
    from pyrunner.model import Model

    m = Model(str(gguf), threads=1, n_ctx=256, kv_type="f32")
    assert m.n_mtp == 1
    ids = m.tokenize("def main(argv):\n    for a in argv:\n        print(a)\n" * 4, add_special=False)[:70]
    hf_ref = HFReference(hf)
    ref, ties, counts = hf_ref.logits_and_ties(ids)
    s = m.session()
    logits, hidden = s.eval(ids, all_logits=True, hidden=True)
    # rows where transformers' torch.topk met a tie at the QSA cut may pick another block (DESIGN §8)
    assert counts["binding"] > 0 and ties.sum() < len(ids) // 2
    assert np.abs(logits - ref)[~ties].max() <= 1e-4
    # the MTP head as trained (transformers' decoder layer; the QSA budget of 16 binds at 70 tokens); build()
    # swaps in train.py's vectorised indexer (Strata's tie rule): put transformers' own back afterwards
    cfg = hf_ref.config
    from transformers.models.qwen4_exp import modeling_qwen4_exp as mq
    original = mq.Qwen4ExpTextQSAIndexer.forward
    try:
        model, mtp = tr.build(cfg.vocab_size, list(cfg.eos_token_id), cfg.pad_token_id, 0)
        want, h_ref = _trained_mtp(model, mtp, ca, ids)
    finally:
        mq.Qwen4ExpTextQSAIndexer.forward = original
    assert np.abs(hidden - h_ref).max() <= 1e-4
    got, _ = s.mtp(hidden[:-1], ids[1:], 0, all_rows=True)
    assert np.abs(got - want).max() <= 1e-4
    m.close()


def _trained_mtp(model, mtp, ck, ids):
    """The training code's MTP logits for rows 0..n-2 and the trunk's pre-mixer rows."""
    import torch
    model.load_state_dict(ck["model"])
    mtp.load_state_dict(ck["mtp"])
    model.eval()
    mtp.eval()
    cap = {}
    h1 = model.model.hyper_connection_mixer.register_forward_pre_hook(lambda mod, x: cap.__setitem__("h", x[0]))
    qi = next(i for i, t in enumerate(model.config.layer_types) if t != "linear_attention")

    def kw(mod, x, k):
        cap["pe"], cap["mask"] = k["position_embeddings"], k["attention_mask"]
    h2 = model.model.layers[qi].register_forward_pre_hook(kw, with_kwargs=True)
    t = torch.tensor([ids])
    with torch.no_grad():
        model(input_ids=t, use_cache=False)
        y = mtp(cap["h"], model.model.embed_tokens(torch.cat([t[:, 1:], t[:, -1:]], 1)), cap["pe"], cap["mask"])
        want = model.lm_head(y)[0, :-1].numpy()
    h1.remove()
    h2.remove()
    return want, cap["h"][0].numpy()


def test_ship_and_measure_on_a_trained_run(corpus, tmp_path):
    """tools/flash_small.py end to end on a few steps of the tiny config: export -> convert (MTP kept) ->
    q8_0 / iq2_xs / nvfp4, the report, and every measurement of issue 8's point 5."""
    run_dir, work, shipped = tmp_path / "run", tmp_path / "work", tmp_path / "shipped"
    train(corpus, run_dir, "--stop-at-step", "4")
    tool = ROOT / "tools" / "flash_small.py"
    # ship runs train.py --export, which builds the model from its CONFIG: --train-config passes the tiny one
    run(tool, "ship", corpus, run_dir, work, "--models", shipped, "--train-config", json.dumps(TINY))
    for kind in ("f32", "q8_0", "iq2_xs", "nvfp4"):
        assert (work / f"flash-small-{kind}.gguf").stat().st_size > 0
    assert sorted(p.name for p in shipped.iterdir()) == ["flash-small-iq2_xs.gguf", "flash-small-q8_0.gguf",
                                                         "heldout-sample.txt", "loss.png", "report.json",
                                                         "sources.json"]
    rep = json.loads((shipped / "report.json").read_text())
    log = json.loads((run_dir / "log.json").read_text())
    assert rep["steps"] == 4 and rep["tokens_seen"] == log["tokens"] and rep["heldout_ppl"] == round(log["evals"][-1][2], 3)
    assert (shipped / "loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    out = tmp_path / "measure.json"
    run(tool, "measure", corpus, work, "--json", out, "--seq", "48", "--windows", "3", "--threads", "1",
        "--mtp-prompts", "2", "--mtp-prompt-len", "16", "--mtp-gen", "12", "--decode-len", "32",
        "--decode-rows", "2", "--skip-ranks", "7,1", "--llama-prompts", "2", "--llama-tokens", "16")
    res = json.loads(out.read_text())
    ppl = res["perplexity"]
    assert ppl["f32"]["tokens_scored"] == 3 * 47
    # Strata's f32 is transformers' with the tie rule the model was trained with (to float rounding)
    assert abs(ppl["f32"]["ppl"] / ppl["f32_transformers_tie_rule"]["ppl"] - 1) < 1e-4
    assert abs(ppl["q8_0"]["ppl"] / ppl["f32"]["ppl"] - 1) < 0.02
    lc = res["llama_cpp"]
    crashed = {k: v["error"] for k, v in lc.items() if isinstance(v, dict) and "error" in v}
    assert not crashed, crashed                        # llama.cpp's crash message per file (pyrunner/llama_child.py)
    assert lc["f32"]["max_abs_dlogit"] <= 1e-3 and lc["f32"]["top1_agreement"] == 1.0     # QSA does not bind
    assert all(lc[k]["positions"] == 32 for k in ("q8_0", "iq2_xs", "nvfp4"))
    for k in ("1", "2", "3"):
        m = res["mtp"][k]
        assert m["same_tokens_as_without"] and m["drafts_proposed"] > 0
        assert 1.0 <= m["mean_accepted_len"] <= int(k) + 1
    cache = res["cache"]
    for pct in ("25%", "50%", "75%"):
        row = cache[pct]
        assert row["belady"] >= max(row["lru"], row["hotness"]) - 1e-12
    assert cache["25%"]["belady"] <= cache["50%"]["belady"] <= cache["75%"]["belady"]
    tail = res["tail_skip"]
    assert tail["off_equals_cpu"]                      # the sim device with skip off is the CPU's output
    assert tail["runs"]["7"]["skipped_experts"] == 0 and tail["runs"]["7"]["top1_agreement_vs_off"] == 1.0
    assert tail["runs"]["1"]["skipped_experts"] > 0
