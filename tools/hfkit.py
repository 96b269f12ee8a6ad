"""hfkit.py — pieces the tools share for writing transformers checkpoints (make_tiny_hf.py, make_corpus.py,
train.py): the byte-level BPE set-up of Qwen tokenizers and the config field that announces an MTP head."""
from __future__ import annotations

import json
import os


# ChatML control tokens, after the byte/merge vocabulary as in Qwen's vocabularies.
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def train_bpe(texts, n_merged: int, split_regex: str, out_dir: str):
    """A byte-level BPE as Qwen's are built (NFC, the pre-tokenizer split, byte-level bytes without a prefix
    space, byte-level decoding) trained on texts to at most n_merged tokens, then SPECIALS; saves
    tokenizer.json and tokenizer_config.json (ChatML template) in out_dir. Returns (tokenizer, special ids)."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(split_regex), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=n_merged, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(texts, trainer=trainer)
    if tok.get_vocab_size() > n_merged:
        raise RuntimeError(f"BPE training produced {tok.get_vocab_size()} tokens, more than {n_merged}")
    tok.add_special_tokens(SPECIALS)
    ids = {s: tok.token_to_id(s) for s in SPECIALS}
    tok.save(os.path.join(out_dir, "tokenizer.json"))
    cfg = {"tokenizer_class": "Qwen2Tokenizer", "model_max_length": 4096, "bos_token": None,
           "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "add_bos_token": False,
           "chat_template": CHAT_TEMPLATE,
           "added_tokens_decoder": {str(i): {"content": s, "special": True, "lstrip": False, "rstrip": False,
                                             "normalized": False, "single_word": False} for s, i in ids.items()}}
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    return tok, ids


def mark_mtp(out_dir: str, layers: int = 1) -> None:
    """config.json of a saved checkpoint gets mtp_num_hidden_layers (its mtp.* tensors are beside the model's)."""
    path = os.path.join(out_dir, "config.json")
    with open(path) as f:
        cfg = json.load(f)
    cfg["mtp_num_hidden_layers"] = layers
    with open(path, "w") as f:
        json.dump(cfg, f, indent=2)
