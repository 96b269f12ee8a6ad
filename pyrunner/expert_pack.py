"""expert_pack.py — the expert pack (DESIGN §2): every routed expert of a GGUF as one contiguous blob,
so that one copy (one DMA, one sequential read) moves one expert to the device.

Layout of `<name>.experts.bin` (little-endian):

    0     8   magic b"STRXPACK"
    8     4   version (1)
    12    4   n_layer
    16    4   n_expert
    20    4   reserved (0)
    24    8   size of the model file (bytes)
    32    8   model identity: FNV-1a 64 over (offset, size, type) of every expert tensor, layer by layer,
              in the order gate|gate_up, up (absent when fused), down — u64 each, little-endian
    40    8   payload bytes
    48 .. 4096  zero
    4096      blobs, layer-major then expert-major; blob (l, e) = gate rows | up rows | down rows of
              expert e of layer l, still quantized, exactly the bytes of the GGUF tensors

The library (native/src/moe/offload.c) maps the file read-only and checks all of it against the
model it loaded (the identity, counts, and every layer's blob size) before any copy reads it; a
mismatch is refused with a message naming the file. A JSON sidecar `<name>.experts.json` repeats the
header and lists each layer's blob size and offset for people and tools. Built streaming (one blob
in flight), written under a temporary name, size-checked, then renamed.
"""
from __future__ import annotations

import json
import os
import struct
import sys

from .gguf import GGUFFile

MAGIC = b"STRXPACK"
VERSION = 1
HEADER = 4096
_FNV_OFFSET, _FNV_PRIME, _M64 = 0xCBF29CE484222325, 0x100000001B3, (1 << 64) - 1


class ExpertPackError(ValueError):
    pass


def _fnv(h: int, value: int) -> int:
    for b in struct.pack("<Q", value & _M64):
        h = ((h ^ b) * _FNV_PRIME) & _M64
    return h


def _expert_tensors(g: GGUFFile) -> tuple[list[list[dict]], int, int]:
    """Per layer [gate|gate_up, (up), down] tensor infos; n_layer; n_expert."""
    by = {t["name"]: t for t in g.tensors()}
    md = g.metadata()
    n_layer = int(md["qwen4exp.block_count"]) - int(md.get("qwen4exp.nextn_predict_layers", 0))
    n_expert = int(md["qwen4exp.expert_count"])
    layers = []
    for il in range(n_layer):
        p = f"blk.{il}."
        names = ([p + "ffn_gate_up_exps.weight"] if p + "ffn_gate_up_exps.weight" in by
                 else [p + "ffn_gate_exps.weight", p + "ffn_up_exps.weight"]) + [p + "ffn_down_exps.weight"]
        missing = [n for n in names if n not in by]
        if missing:
            raise ExpertPackError(f"{g.path}: no tensor {missing[0]}; is this a qwen4exp model?")
        layers.append([by[n] for n in names])
    return layers, n_layer, n_expert


def identity(layers: list[list[dict]]) -> int:
    from .quant import type_id

    h = _FNV_OFFSET
    for ts in layers:
        for t in ts:
            for v in (t["offset"], t["size"], type_id(t["type"])):
                h = _fnv(h, v)
    return h


def default_path(model_path: str) -> str:
    """Next to the model (`m.gguf` -> `m.experts.bin`) when that directory is writable, else in the
    user's cache ($XDG_CACHE_HOME/strata)."""
    base = os.path.basename(model_path)
    stem = base[:-5] if base.endswith(".gguf") else base
    here = os.path.dirname(os.path.abspath(model_path))
    if os.access(here, os.W_OK):
        return os.path.join(here, stem + ".experts.bin")
    cache = os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "strata")
    os.makedirs(cache, exist_ok=True)
    return os.path.join(cache, stem + ".experts.bin")


def build(model_path: str, out_path: str | None = None, log=None) -> dict:
    """Writes the pack of model_path (default: default_path) and its sidecar; returns the sidecar."""
    out_path = out_path or default_path(model_path)
    g = GGUFFile(model_path)
    layers, n_layer, n_expert = _expert_tensors(g)
    ident = identity(layers)
    blob = [sum(t["size"] for t in ts) // n_expert for ts in layers]
    for il, ts in enumerate(layers):
        for t in ts:
            if t["size"] % n_expert:
                raise ExpertPackError(f"{model_path}: {t['name']} ({t['size']} bytes) is not {n_expert} equal experts")
    payload = sum(blob) * n_expert
    head = struct.pack("<8sIIII QQQ", MAGIC, VERSION, n_layer, n_expert, 0,
                       os.path.getsize(model_path), ident, payload).ljust(HEADER, b"\0")
    tmp = out_path + f".tmp{os.getpid()}"
    if log:
        log(f"expert pack: writing {payload / 1e9:.2f} GB of expert blobs to {out_path} (one time)")
    try:
        with open(tmp, "wb") as f:
            f.write(head)
            for il, ts in enumerate(layers):
                views = [g.tensor_data(t["name"]) for t in ts]
                per = [t["size"] // n_expert for t in ts]
                for e in range(n_expert):
                    for v, n in zip(views, per):
                        f.write(v[e * n:(e + 1) * n])
        if os.path.getsize(tmp) != HEADER + payload:
            raise ExpertPackError(f"{tmp}: wrote {os.path.getsize(tmp)} bytes, expected {HEADER + payload}")
        os.replace(tmp, out_path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    side = {"format": "strata-expert-pack", "version": VERSION, "model": os.path.abspath(model_path),
            "model_size": os.path.getsize(model_path), "model_identity": f"{ident:016x}",
            "n_layer": n_layer, "n_expert": n_expert, "header_bytes": HEADER, "payload_bytes": payload,
            "layers": []}
    off = HEADER
    for il in range(n_layer):
        side["layers"].append({"layer": il, "blob_bytes": blob[il], "offset": off,
                               "pieces": [{"tensor": t["name"], "bytes": t["size"] // n_expert} for t in layers[il]]})
        off += blob[il] * n_expert
    sidecar = out_path[:-4] + ".json" if out_path.endswith(".bin") else out_path + ".json"
    with open(sidecar + ".tmp", "w") as f:
        json.dump(side, f, indent=1)
    os.replace(sidecar + ".tmp", sidecar)
    return side


def ensure(model_path: str, path: str | None = None, log=None) -> str:
    """The pack for model_path, built if it is missing or does not match the model (its header is
    checked here the way the library checks it)."""
    path = path or default_path(model_path)
    if not _matches(model_path, path):
        build(model_path, path, log=log or (lambda s: print(s, file=sys.stderr)))
    return path


def _matches(model_path: str, path: str) -> bool:
    try:
        with open(path, "rb") as f:
            head = f.read(48)
        magic, ver, n_layer, n_expert, _, msize, ident, payload = struct.unpack("<8sIIII QQQ", head)
    except (OSError, struct.error):
        return False
    if magic != MAGIC or ver != VERSION or msize != os.path.getsize(model_path):
        return False
    layers, nl, ne = _expert_tensors(GGUFFile(model_path))
    return (nl, ne, identity(layers)) == (n_layer, n_expert, ident) and \
        os.path.getsize(path) == HEADER + payload
