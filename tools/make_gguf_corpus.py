#!/usr/bin/env python3
"""make_gguf_corpus.py — writes small valid GGUF files (with gguf-py's GGUFWriter) as the seed
corpus of the GGUF fuzzer (native/fuzz/fuzz_gguf.c).

    python tools/make_gguf_corpus.py OUT_DIR

Each seed stays under 64 KiB (the fuzzer runs with -max_len=65536) and together they cover
every metadata value type, arrays of strings, nested arrays, tensors of several types and
1..4 dims, a custom alignment, version 2, a file without tensors and split keys.
"""
from __future__ import annotations

import argparse
import struct
import sys
import tempfile
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType as QT
from gguf import GGUFValueType as VT
from gguf import GGUFWriter

MAX_SEED = 65536


def _write(path: Path, fill, alignment: int | None = None, arch: str = "test") -> bytes:
    w = GGUFWriter(str(path), arch)
    if alignment is not None:
        w.add_custom_alignment(alignment)
    fill(w)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path.read_bytes()


def _every_type(w):
    w.add_key_value("t.u8", 7, VT.UINT8)
    w.add_key_value("t.i8", -7, VT.INT8)
    w.add_key_value("t.u16", 700, VT.UINT16)
    w.add_key_value("t.i16", -700, VT.INT16)
    w.add_key_value("t.u32", 70000, VT.UINT32)
    w.add_key_value("t.i32", -70000, VT.INT32)
    w.add_key_value("t.f32", 0.5, VT.FLOAT32)
    w.add_key_value("t.bool", True, VT.BOOL)
    w.add_key_value("t.str", "hello", VT.STRING)
    w.add_key_value("t.u64", 2**40, VT.UINT64)
    w.add_key_value("t.i64", -(2**40), VT.INT64)
    w.add_key_value("t.f64", 0.25, VT.FLOAT64)
    for vt, v in [(VT.UINT8, [1, 2]), (VT.INT16, [-1, 1]), (VT.UINT32, [5]), (VT.FLOAT32, [1.0, 2.0]),
                  (VT.BOOL, [True, False]), (VT.UINT64, [1, 2, 3]), (VT.FLOAT64, [0.5])]:
        w.add_key_value(f"t.arr.{vt.name.lower()}", v, VT.ARRAY, sub_type=vt)
    w.add_key_value("t.strs", ["a", "", "bc"], VT.ARRAY, sub_type=VT.STRING)
    w.add_key_value("t.nested", [[1, 2], [3]], VT.ARRAY)
    w.add_key_value("t.nested_strs", [["x"], ["y", "z"]], VT.ARRAY)
    w.add_key_value("t.deep", [[[0.5]], [[1.5, 2.5]]], VT.ARRAY)


def _tensors(w, rng):
    w.add_tensor("f32", rng.standard_normal((2, 8)).astype(np.float32))
    w.add_tensor("f16", rng.standard_normal((3,)).astype(np.float16))
    w.add_tensor("i32", np.arange(5, dtype=np.int32))
    w.add_tensor("q8_0", rng.integers(0, 256, (2, 34), dtype=np.uint8), raw_dtype=QT.Q8_0)
    w.add_tensor("q4_k", rng.integers(0, 256, (1, 144), dtype=np.uint8), raw_dtype=QT.Q4_K)
    w.add_tensor("q6_k.3d", rng.integers(0, 256, (2, 1, 210), dtype=np.uint8), raw_dtype=QT.Q6_K)
    w.add_tensor("f32.4d", rng.standard_normal((1, 2, 1, 4)).astype(np.float32))


def make(out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    seeds: dict[str, bytes] = {}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        seeds["every_type"] = _write(tmp / "a.gguf", _every_type)
        seeds["tensors"] = _write(tmp / "b.gguf", lambda w: _tensors(w, rng))
        seeds["mixed"] = _write(tmp / "c.gguf", lambda w: (_every_type(w), _tensors(w, rng)))
        seeds["align64"] = _write(tmp / "d.gguf", lambda w: _tensors(w, rng), alignment=64)
        seeds["align1"] = _write(tmp / "e.gguf", lambda w: _tensors(w, rng), alignment=1)
        seeds["tokenizer"] = _write(tmp / "f.gguf", lambda w: (
            w.add_key_value("tokenizer.ggml.model", "gpt2", VT.STRING),
            w.add_key_value("tokenizer.ggml.tokens", [f"t{i}" for i in range(200)], VT.ARRAY, sub_type=VT.STRING),
            w.add_key_value("tokenizer.ggml.token_type", [1] * 200, VT.ARRAY, sub_type=VT.INT32),
            w.add_key_value("tokenizer.ggml.merges", [f"t{i} t{i + 1}" for i in range(50)], VT.ARRAY,
                            sub_type=VT.STRING)), arch="qwen4exp")
        seeds["split_shard"] = _write(tmp / "g.gguf", lambda w: (
            w.add_key_value("split.no", 0, VT.UINT16), w.add_key_value("split.count", 1, VT.UINT16),
            w.add_key_value("split.tensors.count", 1, VT.INT32),
            w.add_tensor("x", np.ones(8, np.float32))))
    v2 = bytearray(seeds["mixed"])
    v2[4:8] = struct.pack("<I", 2)
    seeds["mixed_v2"] = bytes(v2)
    paths = []
    for name, data in seeds.items():
        assert len(data) <= MAX_SEED, (name, len(data))
        p = out / f"seed_{name}.gguf"
        p.write_bytes(data)
        paths.append(p)
    return paths


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path, help="directory for the seed files")
    args = ap.parse_args(argv)
    paths = make(args.out)
    print(f"wrote {len(paths)} seeds to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
