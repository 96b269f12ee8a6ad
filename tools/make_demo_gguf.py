"""Writes a small GGUF to look at with `strata inspect` until a model runs: qwen4exp-style
metadata and a few tensors in several block formats (quantized with gguf.quants).

usage: python tools/make_demo_gguf.py OUT.gguf
"""
import sys

import numpy as np
from gguf import GGMLQuantizationType, GGUFValueType, GGUFWriter, quants


def main(out: str) -> None:
    rng = np.random.default_rng(0)
    w = GGUFWriter(out, "qwen4exp")
    w.add_name("strata-demo")
    w.add_context_length(4096)
    w.add_embedding_length(256)
    w.add_block_count(1)
    w.add_key_value("qwen4exp.ple.layer_multipliers", [15411308609579, 2523213358983, 11275943025685],
                    GGUFValueType.ARRAY, sub_type=GGUFValueType.UINT64)
    w.add_string("tokenizer.ggml.model", "gpt2")
    w.add_array("tokenizer.ggml.tokens", ["a", "b", "<|endoftext|>"])
    w.add_tensor("token_embd.weight", rng.standard_normal((3, 256), dtype=np.float32))
    for name, qt in (("blk.0.ffn_gate_exps.weight", GGMLQuantizationType.Q8_0),
                     ("blk.0.ffn_down_exps.weight", GGMLQuantizationType.Q5_1),
                     ("blk.0.attn_q.weight", GGMLQuantizationType.BF16)):
        data = rng.standard_normal((64, 256), dtype=np.float32)
        q = quants.quantize(data, qt)
        w.add_tensor(name, q, raw_shape=q.shape, raw_dtype=qt)
    w.add_tensor("blk.0.attn_q_norm.weight", np.ones(256, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "demo.gguf")
