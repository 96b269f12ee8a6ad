"""ple.py — the PLE n-gram table outside the engine's hot path (DESIGN §6, seed 003): the packed NVFP4
table (`strata pack-ple`), the table's state and counters as Python values, and page-cache eviction.

Packed table. A ModelOpt NVFP4 checkpoint stores the table as row shards
`<prefix>.ngram_embedding.shard_{i}.weight` (U8: two E2M1 codes per byte, value 2j in the low nibble of
byte j), `…shard_{i}.weight_scale` (F8 E4M3, one per 16 values) and `…shard_{i}.weight_scale_2` (F32, one
value). pack_ple() streams the shards in index order into one file of fixed rows — the codes, then the
block scales (160 values: 80 + 10 = 90 bytes) — so row r of the table is at byte r x row_width. Beside it,
`<table>.json` (the sidecar) records the layout and where it came from:

    {"format": "strata-ple-nvfp4-v1", "table": "ple_nvfp4.bin", "source": "<dir> sha256:<16 hex>",
     "checkpoint": "/abs/dir", "prefix": "...ple_embedding", "total_rows": R, "num_shards": S,
     "rows_per_shard": N, "shard_rows": [...], "row_dim": 160, "code_bytes": 80, "scale_bytes": 10,
     "row_width": 90, "global_scales": [weight_scale_2 of each shard], "file_bytes": R x 90}

Every shard but the last holds rows_per_shard rows. The shards are read with plain reads, CHUNK_ROWS rows
at a time (peak memory: one chunk, ~6 MB for 90-byte rows; nothing is memory-mapped, so the process's
resident set does not grow with the table), written to a temporary name, checked for size, then renamed
(the sidecar last), so an interrupted run never leaves a table that looks valid.

A GGUF converted with `strata convert --ple-external DIR` carries no table tensor; its key
`strata.ple_external` names the table (relative to the GGUF), `strata.ple_external.rows` and
`strata.ple_external.source` identify it. The engine (native/src/model/ple_layer.c) reads the sidecar and
refuses a table whose size, row width, row count or source do not match.
"""
from __future__ import annotations

import hashlib
import json
import os
import re

import numpy as np

from .safetensors_io import Checkpoint, CheckpointError

FORMAT = "strata-ple-nvfp4-v1"
TABLE_NAME = "ple_nvfp4.bin"
CHUNK_ROWS = 1 << 16
_SHARD = re.compile(r"^(.*)\.ngram_embedding\.shard_(\d+)\.weight$")


class PleError(Exception):
    """A checkpoint or packed table that cannot be used; the message says what to do."""


def sidecar_path(table: str) -> str:
    return table + ".json"


# ---------------------------------------------------------------------------------------------- packing

def find_shards(ck) -> tuple[str, list[str]]:
    """(prefix, [shard weight names in index order]) of the NVFP4 PLE table in a safetensors_io.Checkpoint."""
    found: dict[str, dict[int, str]] = {}
    for name in ck.entries:
        m = _SHARD.match(name)
        if m:
            found.setdefault(m.group(1), {})[int(m.group(2))] = name
    if not found:
        raise PleError("the checkpoint has no PLE table shards (*.ngram_embedding.shard_{i}.weight)")
    if len(found) > 1:
        raise PleError(f"the checkpoint has PLE tables under several prefixes ({sorted(found)[:3]}); one is supported")
    prefix, shards = next(iter(found.items()))
    if sorted(shards) != list(range(len(shards))):
        raise PleError(f"PLE shards of {prefix} are not numbered 0..{len(shards) - 1} (found {sorted(shards)[:8]} ...)")
    names = [shards[i] for i in range(len(shards))]
    for n in names:
        e = ck.entries[n]
        if e.dtype != "U8":
            raise PleError(f"{n} is {e.dtype}, not ModelOpt NVFP4 codes (U8): pack-ple packs NVFP4 tables only; a float "
                           f"table stays in the GGUF (convert without --ple-external)")
        for suffix, dtype in (("_scale", "F8_E4M3"), ("_scale_2", "F32")):
            s = n + suffix
            if s not in ck.entries:
                raise PleError(f"NVFP4 shard {n} has no {s}; the checkpoint is incomplete")
            if ck.entries[s].dtype != dtype:
                raise PleError(f"{s} is {ck.entries[s].dtype}; ModelOpt NVFP4 stores it as {dtype}")
    return prefix, names


def _layout(ck, names: list[str]) -> dict:
    rows = [ck.shape(n)[0] for n in names]
    cws = {ck.shape(n)[1] for n in names}
    sws = {ck.shape(n + "_scale")[1] for n in names}
    if len(cws) != 1 or len(sws) != 1:
        raise PleError(f"PLE shards have different row widths (codes {sorted(cws)}, scales {sorted(sws)})")
    cw, sw = cws.pop(), sws.pop()
    if sw * 16 != cw * 2 or any(ck.shape(n + "_scale")[0] != r for n, r in zip(names, rows)):
        raise PleError(f"PLE shards: {cw} code bytes ({2 * cw} values) need {cw * 2 // 16} block scales per row, "
                       f"the checkpoint has {sw}")
    if any(r != rows[0] for r in rows[:-1]) or rows[-1] > rows[0]:
        raise PleError(f"PLE shards hold {sorted(set(rows))} rows; every shard but a shorter last one must be equal")
    scales = []
    for n in names:
        s2 = np.asarray(ck.raw(n + "_scale_2"), dtype=np.float32).reshape(-1)
        if s2.size != 1 or not (np.isfinite(s2[0]) and s2[0] > 0):
            raise PleError(f"{n}_scale_2 must be one positive number (got {s2[:4]})")
        scales.append(float(s2[0]))
    return {"total_rows": int(sum(rows)), "num_shards": len(names), "rows_per_shard": int(rows[0]),
            "shard_rows": [int(r) for r in rows], "row_dim": 2 * cw, "code_bytes": cw, "scale_bytes": sw,
            "row_width": cw + sw, "global_scales": scales}


def source_identity(ck, names: list[str], hf_dir: str) -> str:
    """A short fingerprint of the table in a checkpoint: names, shapes, global scales and the first and last
    4 KiB of every shard's codes and scales (cheap; different checkpoints differ in their bytes)."""
    h = hashlib.sha256()
    for n in names:
        for t in (n, n + "_scale", n + "_scale_2"):
            a = np.ascontiguousarray(ck.raw(t)).reshape(-1).view(np.uint8)
            h.update(f"{t}{ck.shape(t)}".encode())
            h.update(a[:4096].tobytes())
            h.update(a[-4096:].tobytes())
    return f"{os.path.basename(os.path.normpath(hf_dir))} sha256:{h.hexdigest()[:16]}"


def _read(f, offset: int, n: int, name: str) -> np.ndarray:
    f.seek(offset)
    b = f.read(n)
    if len(b) != n:
        raise PleError(f"{name}: the safetensors file ends before the tensor does (truncated checkpoint)")
    return np.frombuffer(b, dtype=np.uint8)


def pack_ple(hf_dir: str, out_dir: str, log=None) -> dict:
    """Pack the ModelOpt NVFP4 PLE table of the checkpoint in hf_dir into out_dir/ple_nvfp4.bin (+ .json).
    Returns the sidecar dict (plus "path": the table file)."""
    if not os.path.isdir(hf_dir):
        raise PleError(f"{hf_dir}: not a directory (pack-ple reads a ModelOpt NVFP4 checkpoint directory)")
    try:
        ck = Checkpoint(hf_dir)
    except CheckpointError as e:
        raise PleError(str(e)) from None
    prefix, names = find_shards(ck)
    meta = _layout(ck, names)
    os.makedirs(out_dir, exist_ok=True)
    table = os.path.join(out_dir, TABLE_NAME)
    side = sidecar_path(table)
    tmp, tmp_side = table + ".tmp", side + ".tmp"
    cw, sw = meta["code_bytes"], meta["scale_bytes"]
    try:
        with open(tmp, "wb") as f:
            for k, n in enumerate(names):
                we, se = ck.entries[n], ck.entries[n + "_scale"]
                rows = we.shape[0]
                # plain reads of CHUNK_ROWS rows (not a memory map): the process holds one chunk at a time
                with open(we.path, "rb") as fw, open(se.path, "rb") as fs:
                    for c in range(0, rows, CHUNK_ROWS):
                        k_rows = min(CHUNK_ROWS, rows - c)
                        chunk = np.empty((k_rows, cw + sw), dtype=np.uint8)
                        chunk[:, :cw] = _read(fw, we.offset + c * cw, k_rows * cw, n).reshape(k_rows, cw)
                        chunk[:, cw:] = _read(fs, se.offset + c * sw, k_rows * sw, n + "_scale").reshape(k_rows, sw)
                        chunk.tofile(f)
                if log:
                    log(f"[{k + 1}/{len(names)}] {n}: {rows} rows")
            f.flush()
            os.fsync(f.fileno())
        size = os.path.getsize(tmp)
        want = meta["total_rows"] * meta["row_width"]
        if size != want:
            raise PleError(f"{tmp}: wrote {size} bytes, expected {want}; the disk may be full")
        meta = {"format": FORMAT, "table": TABLE_NAME, "source": source_identity(ck, names, hf_dir),
                "checkpoint": os.path.abspath(hf_dir), "prefix": prefix, **meta, "file_bytes": want}
        with open(tmp_side, "w") as f:
            json.dump(meta, f, indent=1)
        os.replace(tmp, table)
        os.replace(tmp_side, side)
    finally:
        for p in (tmp, tmp_side):
            if os.path.exists(p):
                os.unlink(p)
    return {**meta, "path": table}


def read_sidecar(path: str) -> tuple[str, dict]:
    """(table path, sidecar) for a pack-ple output directory or table file; checks format and size."""
    table = os.path.join(path, TABLE_NAME) if os.path.isdir(path) else path
    side = sidecar_path(table)
    if not os.path.isfile(table) or not os.path.isfile(side):
        raise PleError(f"{path}: no packed PLE table ({TABLE_NAME} and its .json sidecar); make one with "
                       f"`strata pack-ple CHECKPOINT_DIR -o OUT_DIR`")
    try:
        with open(side) as f:
            meta = json.load(f)
    except ValueError as e:
        raise PleError(f"{side}: not valid JSON ({e})") from None
    if meta.get("format") != FORMAT:
        raise PleError(f"{side}: format {meta.get('format')!r} is not {FORMAT}; rebuild with `strata pack-ple`")
    if os.path.getsize(table) != meta.get("file_bytes"):
        raise PleError(f"{table} is {os.path.getsize(table)} bytes, its sidecar says {meta.get('file_bytes')}: "
                       f"truncated or replaced; rebuild with `strata pack-ple`")
    return table, meta


# ---------------------------------------------------------------------------------------------- engine state

def model_info(model) -> dict:
    """The model's PLE table: mode in force and why, file, rows, row bytes ({} without PLE)."""
    from ._native import check, ffi, lib

    info = ffi.new("strata_ple_info *")
    check(lib.strata_model_ple_info(model._ptr, info))
    if not info.present:
        return {}
    return {"mode": {1: "mmap", 2: "direct"}[info.mode], "why": ffi.string(info.why).decode(),
            "external": bool(info.external), "madv_random": bool(info.madv_random), "prefetch": bool(info.prefetch),
            "rows": int(info.n_rows), "row_bytes": int(info.row_bytes), "table_bytes": int(info.table_bytes),
            "path": ffi.string(info.path).decode(), "file_offset": int(info.file_offset),
            "cache_capacity": int(info.cache_capacity), "cache_used": int(info.cache_used),
            "cache_bytes": int(info.cache_capacity) * int(info.row_bytes),
            "cache_index_bytes": int(info.cache_index_bytes), "odirect": bool(info.odirect),
            "dio_align": int(info.dio_align), "heads": int(info.n_heads), "ngram": int(info.ngram)}


def describe(model) -> str:
    """One start-up log line: where the table is read from, its size, the access mode and why."""
    i = model_info(model)
    if not i:
        return "PLE: none"
    where = i["path"] or "memory"
    kind = "packed NVFP4" if i["external"] else "in the GGUF"
    cache = (f"row cache {i['cache_bytes'] / 2**20:.1f} MiB ({i['cache_capacity']:,} rows)" if i["cache_capacity"]
             else "row cache off")
    return (f"PLE table {kind} ({where}, {i['table_bytes'] / 2**30:.2f} GiB, {i['rows']:,} rows x {i['row_bytes']} B): "
            f"{i['why']}; prefetch {'on' if i['prefetch'] else 'off'}; {cache}")


def resident(model) -> tuple[int, int]:
    """(pages of the table in the page cache, pages of the table)."""
    from ._native import check, ffi, lib

    r, t = ffi.new("uint64_t *"), ffi.new("uint64_t *")
    check(lib.strata_model_ple_resident(model._ptr, r, t))
    return int(r[0]), int(t[0])


_FIELDS = ("steps", "tokens", "rows", "read_bytes", "major_faults", "minor_faults", "prefetch_pages",
           "hash_s", "prefetch_s", "gather_s", "copy_s", "wait_s", "dequant_s",
           "cache_lookups", "cache_hits", "cache_hit_bytes", "floor_pages", "floor_sectors", "miss_pages",
           "miss_sectors", "warm_rows")


def session_stats(sess) -> dict:
    """Session.stats(): DESIGN §9's ple_rows / ple_read_bytes / ple_major_faults / ple_wait_s (prefill +
    decode), the row cache's ple_cache_hits / ple_cache_lookups / ple_cache_hit_bytes (prefill + decode),
    then every counter per phase as ple_prefill_<field> / ple_decode_<field>."""
    from ._native import check, ffi, lib

    pre, dec = ffi.new("strata_ple_stats *"), ffi.new("strata_ple_stats *")
    check(lib.strata_session_ple_stats(sess._live(), pre, dec))
    out = {"ple_rows": pre.rows + dec.rows, "ple_read_bytes": pre.read_bytes + dec.read_bytes,
           "ple_major_faults": pre.major_faults + dec.major_faults, "ple_wait_s": pre.wait_s + dec.wait_s,
           "ple_cache_hits": pre.cache_hits + dec.cache_hits, "ple_cache_lookups": pre.cache_lookups + dec.cache_lookups,
           "ple_cache_hit_bytes": pre.cache_hit_bytes + dec.cache_hit_bytes}
    for phase, st in (("prefill", pre), ("decode", dec)):
        out.update(_as_dict(st, f"ple_{phase}_"))
    return out


def _as_dict(st, prefix: str = "") -> dict:
    return {prefix + f: float(getattr(st, f)) if f.endswith("_s") else int(getattr(st, f)) for f in _FIELDS}


def gather(model, ids, ctx=None, one_token_steps: bool = False, rows: bool = True) -> tuple:
    """(row ids [n, heads] uint64, packed rows [n, heads, row_bytes] uint8, counters of this call) the PLE
    step of an eval gathers for ids after the n-gram context ctx (None: a sequence start), through the
    worker and the row cache, without running the model (strata_model_ple_gather). one_token_steps: decode
    steps (one token each) instead of n_ubatch-sized ones; rows=False returns no packed bytes (faster)."""
    from ._native import check, ffi, lib

    info = model_info(model)
    ids = np.ascontiguousarray(ids, dtype=np.int32)
    n, heads = len(ids), info["heads"]
    rid = np.zeros((n, heads), dtype=np.uint64)
    packed = np.zeros((n, heads, info["row_bytes"]), dtype=np.uint8) if rows else None
    st = ffi.new("strata_ple_stats *")
    c = ffi.NULL if ctx is None else ffi.from_buffer("int32_t[]", np.ascontiguousarray(ctx, dtype=np.int32))
    check(lib.strata_model_ple_gather(model._ptr, c, ffi.from_buffer("int32_t[]", ids), n, int(bool(one_token_steps)),
                                      ffi.cast("uint64_t *", ffi.from_buffer(rid)),
                                      ffi.NULL if packed is None else ffi.cast("uint8_t *", ffi.from_buffer(packed)),
                                      0 if packed is None else packed.nbytes, st))
    return rid, packed, _as_dict(st)


def evict(path: str, offset: int = 0, length: int = 0) -> None:
    """Drops the file's pages (bytes [offset, offset + length), 0 = to the end) from the page cache
    (POSIX_FADV_DONTNEED; clean pages only): "cold" in DESIGN §8's sense."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, offset, length, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def readahead_kb(path: str) -> int | None:
    """read_ahead_kb of the block device holding path (None if it cannot be found)."""
    st = os.stat(path)
    dev = f"/sys/dev/block/{os.major(st.st_dev)}:{os.minor(st.st_dev)}"
    for q in (f"{dev}/queue/read_ahead_kb", f"{dev}/../queue/read_ahead_kb"):
        try:
            with open(q) as f:
                return int(f.read())
        except (OSError, ValueError):
            continue
    return None
