#!/usr/bin/env python3
"""train.py — train Strata's small Flash-Next (issue 8): transformers' Qwen4ExpForCausalLM at toy widths with
every part of the architecture, plus the MTP head of spec/qwen4exp-mtp.md trained jointly on the t+2 target.

    python tools/train.py CORPUS_DIR RUN_DIR [--seed 0] [--hours 3] [--threads 2]    # trains / resumes
    python tools/train.py CORPUS_DIR RUN_DIR --export HF_DIR                           # a checkpoint for convert
    python tools/train.py CORPUS_DIR RUN_DIR --probe 20                                # tokens/s of 20 steps

CORPUS_DIR is tools/make_corpus.py's output (train.bin, heldout.bin, tokenizer files). RUN_DIR holds the
checkpoint (ckpt.pt: weights, optimizer, RNG states, data position, step, loss log), written atomically every
--save-every seconds and at the end, so a killed run resumes where it was: running the same command again
continues it. The data order is a seeded permutation of fixed-length windows, so a run is reproducible from
its seed (up to the order of float reductions in torch's CPU kernels across thread counts).

The MTP head (spec §2.2): ĥ = RMS over the whole hc·H pre-mixer state of position j (one norm, not grouped),
û = fc_embedding · RMS(embed(x_{j+1})), r_s = fc_hidden · ĥ_s + û per stream, one QSA + MoE decoder layer
(transformers' own layer class, at layer index L, its own weights), its own hyper-connection mixer, the
trunk's LM head; loss CE(logits_j, x_{j+2}) weighted by --mtp-weight. Exported as the checkpoint's
top-level `mtp.*` tensors (spec §1), which `strata convert` writes as block blk.{L}.
"""
from __future__ import annotations

import argparse
import copy
import json
import math
import os
import random
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from hfkit import mark_mtp  # noqa: E402

CONFIG = dict(
    hidden_size=256, num_hidden_layers=4,
    layer_types=["linear_attention"] * 3 + ["full_attention"],
    num_attention_heads=4, num_key_value_heads=2, head_dim=64,
    linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=32, linear_value_head_dim=32,
    linear_conv_kernel_dim=4,
    num_experts=32, num_experts_per_tok=4, moe_intermediate_size=128, shared_expert_intermediate_size=256,
    hc_count=4, hc_lowrank=32,
    ple_layer_ids=[2], ngram_size=3, heads_per_ngram=2, ple_conv_kernel_size=4,
    ngram_vocab_size_base=20000, split_ngram_parts=1,
    indexer_n_heads=2, indexer_kv_heads=1, indexer_head_dim=32, indexer_budget=64, indexer_compress_ratio=4,
    rope_parameters={"rope_type": "default", "rope_theta": 1e6, "partial_rotary_factor": 0.25,
                     "mrope_section": [4, 2, 2]},
    rms_norm_eps=1e-6, max_position_embeddings=4096, initializer_range=0.02,
    output_gate_type="sigmoid", tie_word_embeddings=False, router_aux_loss_coef=0.01,
    mtp_num_hidden_layers=1,
)


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# ------------------------------------------------------------------------------------------------ model

def build(vocab: int, eos: list[int], pad: int, seed: int):
    import torch
    import transformers
    from transformers.models.qwen4_exp import modeling_qwen4_exp as mq

    fast_indexer(mq)
    torch.manual_seed(seed)
    cfg = transformers.Qwen4ExpTextConfig(**CONFIG, vocab_size=vocab, eos_token_id=eos, pad_token_id=pad)
    # the per-expert loop: torch's CPU grouped_mm (transformers' default here) is ~50x slower at these sizes
    cfg._experts_implementation = "eager"
    model = transformers.Qwen4ExpForCausalLM(cfg)
    model.config._experts_implementation = "eager"
    mtp = MTPHead(cfg, mq)
    return model, mtp


def _mtp_class():
    import torch.nn as nn

    class MTPHead(nn.Module):
        """spec/qwen4exp-mtp.md §1-2; parameter names are the checkpoint's `mtp.*` names."""

        def __init__(self, cfg, mq):
            super().__init__()
            e, hc = cfg.hidden_size, cfg.hc_count
            self.hc, self.e = hc, e
            self.pre_fc_norm_embedding = mq.Qwen4ExpTextRMSNorm(e, eps=cfg.rms_norm_eps)
            self.pre_fc_norm_hidden = mq.Qwen4ExpTextRMSNorm(hc * e, eps=cfg.rms_norm_eps)   # one RMS over hc·H
            self.fc_embedding = nn.Linear(e, e, bias=False)
            self.fc_hidden = nn.Linear(e, e, bias=False)
            lcfg = copy.deepcopy(cfg)
            lcfg.layer_types = list(cfg.layer_types) + ["full_attention"]
            lcfg.num_hidden_layers = cfg.num_hidden_layers + 1
            self.layers = nn.ModuleList([mq.Qwen4ExpTextDecoderLayer(lcfg, cfg.num_hidden_layers)])
            self.hyper_connection_mixer = mq.Qwen4ExpTextGatedResidual(cfg, use_combine=False)
            for m in self.modules():             # transformers' own init, minus the pretrained-model plumbing
                if isinstance(m, nn.Linear):
                    nn.init.normal_(m.weight, std=cfg.initializer_range)
            exp = self.layers[0].mlp.experts
            nn.init.normal_(exp.gate_up_proj, std=cfg.initializer_range)
            nn.init.normal_(exp.down_proj, std=cfg.initializer_range)

        def forward(self, hidden, next_emb, position_embeddings, attention_mask):
            """hidden [B, T, hc·H] (pre-mixer), next_emb [B, T, H] (embedding of x_{j+1}) -> y [B, T, H]."""
            u = self.fc_embedding(self.pre_fc_norm_embedding(next_emb))
            hn = self.pre_fc_norm_hidden(hidden).unflatten(-1, (self.hc, self.e))
            r = (self.fc_hidden(hn) + u.unsqueeze(-2)).flatten(-2)
            r = self.layers[0](r, position_embeddings=position_embeddings, attention_mask=attention_mask)
            return self.hyper_connection_mixer(r)
    return MTPHead


class _Lazy:
    def __call__(self, *a, **kw):
        return _mtp_class()(*a, **kw)


MTPHead = _Lazy()


def fast_indexer(mq):
    """transformers' QSA indexer selects blocks in a Python loop over (batch, query) — seconds per layer at
    training sizes. This is the same selection for a plain causal mask (no padding, no cache), vectorised:
    the pooled, normed, roped key of every complete block once; scores relu(q·K_b) summed over heads / sqrt(d)
    for the blocks each query sees; its top budget/r blocks (all of them while they fit) plus its incomplete
    tail block; of blocks with equal scores the lower ones. The selection mask carries no gradient in either form (the indexer is not trained by the LM
    loss). Inputs it does not cover (a cache, a non-causal mask) go to the original."""
    import torch

    original = mq.Qwen4ExpTextQSAIndexer.forward

    def forward(self, hidden_states, position_embeddings, attention_mask, past_key_values):
        B, T, _ = hidden_states.shape
        vis = attention_mask if attention_mask.dtype == torch.bool else attention_mask == 0
        causal = torch.ones(T, T, dtype=torch.bool, device=vis.device).tril()
        if past_key_values is not None or vis.shape[-1] != T or not bool((vis == causal).all()):
            return original(self, hidden_states, position_embeddings, attention_mask, past_key_values)
        r, d = self.compress_ratio, self.index_head_dim
        cos, sin = position_embeddings
        qk = self.index_qk_proj(hidden_states)
        q, kraw = torch.split(qk, [self.index_n_heads * d, self.index_kv_heads * d], dim=-1)
        q = self.q_layernorm(q.reshape(B, T, -1, d))
        q = mq.apply_rotary_pos_emb(q, cos=cos[:, -T:], sin=sin[:, -T:], unsqueeze_dim=2)
        nb_all = T // r
        sel = causal.unsqueeze(0).expand(B, T, T).clone()
        if nb_all > 0:
            kb = kraw.reshape(B, T, d)[:, :nb_all * r].reshape(B, nb_all, r, d).float().mean(dim=2).to(kraw.dtype)
            kb = self.k_layernorm(kb)
            starts = torch.arange(nb_all, device=kb.device) * r
            kb = mq.apply_rotary_pos_emb(kb.unsqueeze(1), cos=cos[:, starts], sin=sin[:, starts]).squeeze(1)
            scores = torch.relu(torch.einsum("bthd,bnd->btnh", q.float(), kb.float())).sum(-1) / math.sqrt(d)
            nb = (torch.arange(T, device=kb.device) + 1) // r                   # complete blocks query t sees
            seen = torch.arange(nb_all, device=kb.device)[None, :] < nb[:, None]  # [T, NB]
            scores = scores.masked_fill(~seen, float("-inf"))
            k = min(self.block_topk, nb_all)
            # ties (relu makes exact zeros common) go to the lower block, Strata's rule; torch.topk's order is
            # undefined there, so the original may pick another block of equal score
            top = scores.sort(dim=-1, descending=True, stable=True).indices[..., :k]   # [B, T, k]
            chosen = torch.zeros(B, T, nb_all, dtype=torch.bool, device=kb.device)
            chosen.scatter_(-1, top, True)
            chosen &= seen
            blocks = chosen.repeat_interleave(r, dim=-1)                         # [B, T, NB*r]
            tail = torch.arange(T, device=kb.device)[None, :] >= (nb * r)[:, None]   # the incomplete block
            sel[:, :, :nb_all * r] = blocks & causal[:, :nb_all * r]
            sel |= (tail & causal).unsqueeze(0)
        return sel.unsqueeze(1)

    mq.Qwen4ExpTextQSAIndexer.forward = forward
    return original


def forward(model, mtp, ids, mtp_weight: float):
    """(total loss, trunk CE, MTP CE, aux) on a [B, T] batch."""
    import torch
    import torch.nn.functional as F

    cap = {}

    def pre_mixer(_mod, args):
        cap["h"] = args[0]

    def layer_kw(_mod, args, kwargs):
        cap["pe"] = kwargs["position_embeddings"]
        cap["mask"] = kwargs["attention_mask"]
    qsa_idx = next(i for i, t in enumerate(model.config.layer_types) if t != "linear_attention")
    h1 = model.model.hyper_connection_mixer.register_forward_pre_hook(pre_mixer)
    h2 = model.model.layers[qsa_idx].register_forward_pre_hook(layer_kw, with_kwargs=True)
    try:
        out = model(input_ids=ids, output_router_logits=True, use_cache=False)
    finally:
        h1.remove()
        h2.remove()
    V = model.config.vocab_size
    ce = F.cross_entropy(out.logits[:, :-1].reshape(-1, V), ids[:, 1:].reshape(-1))
    aux = out.aux_loss if out.aux_loss is not None else torch.zeros(())
    loss = ce + model.config.router_aux_loss_coef * aux
    mce = torch.zeros(())
    if mtp is not None:
        nxt = torch.cat([ids[:, 1:], ids[:, -1:]], dim=1)         # x_{j+1}; the last row has none (no loss)
        y = mtp(cap["h"], model.model.embed_tokens(nxt), cap["pe"], cap["mask"])
        logits = model.lm_head(y[:, :-2])
        mce = F.cross_entropy(logits.reshape(-1, V), ids[:, 2:].reshape(-1))
        loss = loss + mtp_weight * mce
    return loss, ce, mce, aux


# ------------------------------------------------------------------------------------------------ data

class Data:
    """Fixed-length windows of the token stream in a seeded order; `pos` counts windows served."""

    def __init__(self, path: str, seq: int, seed: int):
        self.tokens = np.fromfile(path, dtype=np.uint16)
        self.seq = seq
        self.n = (len(self.tokens) - 1) // seq
        self.seed = seed
        self.pos = 0
        self._epoch, self._perm = -1, None

    def batch(self, b: int) -> np.ndarray:
        out = np.empty((b, self.seq), dtype=np.int64)
        for i in range(b):
            ep, k = divmod(self.pos, self.n)
            if ep != self._epoch:
                self._epoch = ep
                self._perm = np.random.default_rng([self.seed, ep]).permutation(self.n)
            w = int(self._perm[k])
            out[i] = self.tokens[w * self.seq:(w + 1) * self.seq]
            self.pos += 1
        return out


def heldout_ppl(model, path: str, seq: int, max_windows: int, batch: int = 8) -> float:
    import torch
    import torch.nn.functional as F

    toks = np.fromfile(path, dtype=np.uint16).astype(np.int64)
    n = min((len(toks) - 1) // seq, max_windows)
    nll, cnt = 0.0, 0
    model.eval()
    with torch.no_grad():
        for i in range(0, n, batch):
            rows = [toks[w * seq:(w + 1) * seq] for w in range(i, min(n, i + batch))]
            ids = torch.from_numpy(np.stack(rows))
            logits = model(input_ids=ids, use_cache=False).logits
            nll += F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1),
                                   reduction="sum").item()
            cnt += ids[:, 1:].numel()
    model.train()
    return math.exp(nll / cnt)


# ------------------------------------------------------------------------------------------------ checkpoints

def save(path: str, state: dict) -> None:
    import torch

    tmp = path + ".tmp"
    torch.save(state, tmp)
    os.replace(tmp, path)


def rng_state() -> dict:
    import torch
    return {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}


def set_rng_state(s: dict) -> None:
    import torch
    torch.set_rng_state(s["torch"])
    np.random.set_state(s["numpy"])
    random.setstate(s["python"])


def export(corpus: str, model, mtp, out_dir: str) -> None:
    """save_pretrained + the tokenizer files + the MTP head as top-level mtp.* tensors in the same safetensors."""
    import shutil

    import torch
    from safetensors.torch import load_file, save_file

    os.makedirs(out_dir, exist_ok=True)
    model.save_pretrained(out_dir, safe_serialization=True)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(corpus, f), os.path.join(out_dir, f))
    st = os.path.join(out_dir, "model.safetensors")
    tensors = load_file(st)
    for k, v in mtp.state_dict().items():
        tensors[f"mtp.{k}"] = v.detach().contiguous().to(torch.float32)
    save_file(tensors, st, metadata={"format": "pt"})
    mark_mtp(out_dir)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("corpus")
    ap.add_argument("run_dir")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seq", type=int, default=256, help="training context (QSA's 64-token budget binds beyond 67)")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--warmup", type=int, default=200)
    ap.add_argument("--hours", type=float, default=3.0, help="total training time over all sessions (cosine schedule)")
    ap.add_argument("--tokens-per-s", type=float, default=None,
                    help="planned throughput for the schedule's length (default: measured over the first steps)")
    ap.add_argument("--mtp-weight", type=float, default=0.3)
    ap.add_argument("--save-every", type=float, default=300.0, help="seconds between checkpoints")
    ap.add_argument("--eval-every", type=int, default=500, help="steps between held-out evaluations")
    ap.add_argument("--final-eval-windows", type=int, default=10 ** 9, help="held-out windows of the final evaluation")
    ap.add_argument("--stop-after", type=float, default=None, help="stop this session after this many seconds")
    ap.add_argument("--stop-at-step", type=int, default=None, help="stop this session at this step (tests)")
    ap.add_argument("--probe", type=int, default=0, help="time this many steps from scratch, write nothing")
    ap.add_argument("--export", default=None, help="write the checkpoint as a transformers directory and stop")
    ap.add_argument("--config", default=None, help="JSON object of config fields that replace CONFIG's (tests)")
    a = ap.parse_args(argv)
    if a.config:
        CONFIG.update(json.loads(a.config))

    import torch
    torch.set_num_threads(a.threads)
    with open(os.path.join(a.corpus, "tokenizer.json")) as f:
        tj = json.load(f)
    specials = {t["content"]: t["id"] for t in tj["added_tokens"]}
    vocab = max(specials.values()) + 1
    vocab = (vocab + 63) // 64 * 64
    eos = [specials["<|endoftext|>"], specials["<|im_end|>"]]
    model, mtp = build(vocab, eos, specials["<|endoftext|>"], a.seed)
    params = list(model.parameters()) + list(mtp.parameters())
    opt = torch.optim.AdamW(params, lr=a.lr, betas=(0.9, 0.95), weight_decay=0.1)
    data = Data(os.path.join(a.corpus, "train.bin"), a.seq, a.seed)
    os.makedirs(a.run_dir, exist_ok=True)
    ck = os.path.join(a.run_dir, "ckpt.pt")
    st = {"step": 0, "tokens": 0, "elapsed_s": 0.0, "log": [], "evals": [], "total_steps": None, "seed": a.seed}
    if os.path.exists(ck) and not a.probe:
        c = torch.load(ck, weights_only=False)
        model.load_state_dict(c["model"])
        mtp.load_state_dict(c["mtp"])
        opt.load_state_dict(c["opt"])
        data.pos = c["data_pos"]
        set_rng_state(c["rng"])
        st = c["state"]
        log(f"resumed at step {st['step']} ({st['tokens'] / 1e6:.2f} M tokens, {st['elapsed_s'] / 3600:.2f} h)")
    if a.export:
        export(a.corpus, model, mtp, a.export)
        log(f"exported step {st['step']} to {a.export}")
        return 0
    n_params = sum(p.numel() for p in model.parameters())
    log(f"trunk {n_params / 1e6:.2f} M parameters, MTP {sum(p.numel() for p in mtp.parameters()) / 1e6:.2f} M; "
        f"vocab {vocab}, {data.n} windows of {a.seq}")
    model.train()
    mtp.train()
    per_step = a.batch * a.seq

    def checkpoint():
        save(ck, {"model": model.state_dict(), "mtp": mtp.state_dict(), "opt": opt.state_dict(),
                  "data_pos": data.pos, "rng": rng_state(), "state": st})
        with open(os.path.join(a.run_dir, "log.json"), "w") as f:
            json.dump({k: st[k] for k in ("step", "tokens", "elapsed_s", "log", "evals", "total_steps", "seed")}, f)

    t_session = time.time()
    t_save = time.time()
    while True:
        if st["total_steps"] is None and (st["step"] >= 30 or a.probe or a.tokens_per_s):
            tps = a.tokens_per_s or (st["tokens"] / st["elapsed_s"] if st["elapsed_s"] else 1000.0)
            st["total_steps"] = int(a.hours * 3600 * tps / per_step)
            log(f"schedule: {st['total_steps']} steps ({tps:.0f} tokens/s x {a.hours} h)")
        total = st["total_steps"] or 10 ** 9
        if st["step"] >= total or (a.probe and st["step"] >= a.probe):
            break
        if a.stop_after is not None and time.time() - t_session > a.stop_after:
            break
        if a.stop_at_step is not None and st["step"] >= a.stop_at_step:
            break
        s = st["step"]
        lr = a.lr * min(1.0, (s + 1) / a.warmup) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, s / total))))
        for g in opt.param_groups:
            g["lr"] = lr
        t0 = time.time()
        ids = torch.from_numpy(data.batch(a.batch))
        loss, ce, mce, aux = forward(model, mtp, ids, a.mtp_weight)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        dt = time.time() - t0
        st["step"] += 1
        st["tokens"] += per_step
        st["elapsed_s"] += dt
        st["log"].append([st["step"], st["tokens"], round(ce.item(), 4), round(mce.item(), 4), round(st["elapsed_s"], 1)])
        if st["step"] % 10 == 0 or a.probe:
            log(f"step {st['step']}  ce {ce.item():.3f}  mtp {mce.item():.3f}  aux {aux.item():.3f}  lr {lr:.2e}  "
                f"{per_step / dt:.0f} tok/s")
        if not a.probe and st["step"] % a.eval_every == 0:
            ppl = heldout_ppl(model, os.path.join(a.corpus, "heldout.bin"), a.seq, 64)
            st["evals"].append([st["step"], st["tokens"], ppl])
            log(f"held-out perplexity {ppl:.2f}")
        if not a.probe and time.time() - t_save > a.save_every:
            checkpoint()
            t_save = time.time()
    if a.probe:
        log(f"probe: {st['tokens'] / st['elapsed_s']:.0f} tokens/s over {st['step']} steps")
        return 0
    ppl = heldout_ppl(model, os.path.join(a.corpus, "heldout.bin"), a.seq, a.final_eval_windows)
    st["evals"].append([st["step"], st["tokens"], ppl])
    checkpoint()
    log(f"stopped at step {st['step']}: held-out perplexity {ppl:.2f} (whole split)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
