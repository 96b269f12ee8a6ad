"""safetensors_io.py — reads the tensors of a save_pretrained checkpoint directory (*.safetensors).

A safetensors file is an 8-byte little-endian header length n, n bytes of JSON mapping each
tensor name to {"dtype", "shape", "data_offsets": [start, end]} (offsets relative to the end of
the header; an optional "__metadata__" entry is skipped), then the data. Checkpoint indexes every
file of a directory by tensor name and reads data lazily through a read-only memmap.

Its own module so that both users depend on it and not on each other: pyrunner.convert (the GGUF
converter) and pyrunner.ple (pack-ple, which streams the PLE table's shards) import it; neither
imports the other for it.
"""
from __future__ import annotations

import json
import os
import struct
from dataclasses import dataclass

import numpy as np


class CheckpointError(Exception):
    """A problem with the input checkpoint or the arguments; the message says what to do.
    pyrunner.convert.ConvertError is this class (one kind of user error for reading and converting)."""


ST_DTYPES = {"F64": np.float64, "F32": np.float32, "F16": np.float16, "BF16": np.uint16,
             "I64": np.int64, "I32": np.int32, "I16": np.int16, "I8": np.int8, "U8": np.uint8,
             "BOOL": np.bool_, "F8_E4M3": np.uint8}
# stored bytes that are not numbers by themselves: read only as parts of a ModelOpt NVFP4 weight
PACKED_DTYPES = ("U8", "F8_E4M3")


@dataclass
class Entry:
    path: str
    dtype: str
    shape: tuple
    offset: int     # absolute byte offset of the data in the file


class Checkpoint:
    """The tensors of every *.safetensors file of a directory, by name; data read lazily via memmap."""

    def __init__(self, hf_dir: str):
        files = sorted(f for f in os.listdir(hf_dir) if f.endswith(".safetensors"))
        if not files:
            raise CheckpointError(f"{hf_dir}: no *.safetensors files (convert needs a save_pretrained "
                               f"checkpoint in safetensors format)")
        self.entries: dict[str, Entry] = {}
        self._maps: dict[str, np.memmap] = {}
        for f in files:
            path = os.path.join(hf_dir, f)
            with open(path, "rb") as fh:
                raw = fh.read(8)
                if len(raw) != 8:
                    raise CheckpointError(f"{path}: truncated safetensors file (no header length)")
                (n,) = struct.unpack("<Q", raw)
                if n > 1 << 30 or n > os.path.getsize(path) - 8:
                    raise CheckpointError(f"{path}: not a safetensors file (header length {n})")
                try:
                    header = json.loads(fh.read(n))
                except ValueError as e:
                    raise CheckpointError(f"{path}: corrupt safetensors header ({e})") from None
            base = 8 + n
            for name, info in header.items():
                if name == "__metadata__":
                    continue
                if info["dtype"] not in ST_DTYPES:
                    raise CheckpointError(f"{path}: tensor {name} has dtype {info['dtype']}, which this converter "
                                       f"does not read (F32/F16/BF16/integers, and U8/F8_E4M3 of ModelOpt NVFP4 only)")
                start, end = info["data_offsets"]
                e = Entry(path, info["dtype"], tuple(info["shape"]), base + start)
                nbytes = int(np.prod(e.shape, dtype=np.int64)) * np.dtype(ST_DTYPES[e.dtype]).itemsize
                if end - start != nbytes or base + end > os.path.getsize(path):
                    raise CheckpointError(f"{path}: tensor {name} has inconsistent offsets")
                self.entries[name] = e

    def __contains__(self, name: str) -> bool:
        return name in self.entries

    def shape(self, name: str) -> tuple:
        return self.entries[name].shape

    def raw(self, name: str) -> np.ndarray:
        """The stored array (memmap view), in its stored dtype (BF16 as uint16)."""
        e = self.entries[name]
        m = self._maps.get(e.path)
        if m is None:
            m = self._maps[e.path] = np.memmap(e.path, dtype=np.uint8, mode="r")
        dt = np.dtype(ST_DTYPES[e.dtype]).newbyteorder("<")
        count = int(np.prod(e.shape, dtype=np.int64))
        return np.frombuffer(m, dtype=dt, count=count, offset=e.offset).reshape(e.shape)

    def f32(self, name: str, index=None) -> np.ndarray:
        """The tensor (or raw(name)[index], converting only that part) as float32."""
        a = self.raw(name)
        if self.entries[name].dtype in PACKED_DTYPES:
            raise CheckpointError(f"tensor {name} is stored as {self.entries[name].dtype} (packed quantized bytes) but "
                               f"is not part of a ModelOpt NVFP4 weight (X.weight U8 + X.weight_scale F8_E4M3 + "
                               f"X.weight_scale_2 F32); this converter cannot read it")
        if index is not None:
            a = a[index]
        if self.entries[name].dtype == "BF16":
            return (a.astype(np.uint32) << 16).view(np.float32)
        return np.asarray(a, dtype=np.float32)

    def ints(self, name: str) -> list[int]:
        a = self.raw(name)
        if a.dtype.kind not in "iu":
            raise CheckpointError(f"PLE buffer {name} is stored as {self.entries[name].dtype}; expected an integer "
                               f"type (int64), or its values would already be rounded")
        return [int(x) for x in a.reshape(-1)]
