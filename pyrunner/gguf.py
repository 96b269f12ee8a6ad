"""gguf.py — GGUF files through the native reader (mapped read-only, validated)."""
from __future__ import annotations

import contextlib
import os

import gguf as gguf_py
import numpy as np
from gguf import GGMLQuantizationType

from ._native import check, ffi, lib

# GGUF metadata value types (strata_gguf_type) -> numpy dtypes for arrays of scalars.
_NP = {
    lib.STRATA_GGUF_UINT8: np.uint8, lib.STRATA_GGUF_INT8: np.int8,
    lib.STRATA_GGUF_UINT16: np.uint16, lib.STRATA_GGUF_INT16: np.int16,
    lib.STRATA_GGUF_UINT32: np.uint32, lib.STRATA_GGUF_INT32: np.int32,
    lib.STRATA_GGUF_FLOAT32: np.float32, lib.STRATA_GGUF_BOOL: np.bool_,
    lib.STRATA_GGUF_UINT64: np.uint64, lib.STRATA_GGUF_INT64: np.int64,
    lib.STRATA_GGUF_FLOAT64: np.float64,
}


def _type_name(t: int) -> str:
    info = ffi.new("strata_type_info *")
    if lib.strata_type_info_get(t, info) == lib.STRATA_OK:
        return ffi.string(info.name).decode()
    # element types the reader accepts without kernels (I8..I64, F64): gguf's own names
    try:
        return GGMLQuantizationType(t).name
    except ValueError:
        return f"type{t}"


class _MappedBytes(np.ndarray):
    """Bytes of a mapped tensor; holds the GGUFFile whose mapping they are in."""


def _value(g, v):
    """A strata_gguf_value of open file g as Python: str, int, float, bool, or a list."""
    t = v.type
    if t == lib.STRATA_GGUF_STRING:
        return ffi.unpack(ffi.cast("const char *", v.data), v.count).decode("utf-8", "replace")
    if t == lib.STRATA_GGUF_ARRAY:
        et = v.elem_type
        if et in _NP:
            buf = ffi.buffer(v.data, v.count * np.dtype(_NP[et]).itemsize) if v.count else b""
            return np.frombuffer(bytes(buf), dtype=np.dtype(_NP[et]).newbyteorder("<")).tolist()
        if et == lib.STRATA_GGUF_STRING and v.count:
            return _strings(g, v)
        out = []
        e = ffi.new("strata_gguf_value *")
        for i in range(v.count):
            check(lib.strata_gguf_array_get(g, ffi.addressof(v), i, e))
            out.append(_value(g, e[0]))
        return out
    dt = np.dtype(_NP[t]).newbyteorder("<")
    return np.frombuffer(bytes(ffi.buffer(v.data, dt.itemsize)), dtype=dt)[0].item()


def _strings(g, v) -> list[str]:
    """An array of strings in one read: its elements lie back to back in the file
    (u64 length, bytes), from element 0 to the end of the last one."""
    first = ffi.new("strata_gguf_value *")
    last = ffi.new("strata_gguf_value *")
    check(lib.strata_gguf_array_get(g, ffi.addressof(v), 0, first))
    check(lib.strata_gguf_array_get(g, ffi.addressof(v), v.count - 1, last))
    start = ffi.cast("const char *", first.data) - 8
    span = (last.offset + 8 + last.count) - first.offset
    raw = ffi.buffer(start, span)[:]
    out, pos = [], 0
    for _ in range(v.count):
        n = int.from_bytes(raw[pos:pos + 8], "little")
        out.append(raw[pos + 8:pos + 8 + n].decode("utf-8", "replace"))
        pos += 8 + n
    return out


def value_of(g, key: str, default=None):
    """One key of an open strata_gguf (a GGUFFile's, or strata_model_gguf's), or default if absent."""
    idx = ffi.new("int64_t *")
    if lib.strata_gguf_find_kv(g, key.encode(), idx) != lib.STRATA_OK:
        return default
    k, kl, v = ffi.new("const char **"), ffi.new("uint64_t *"), ffi.new("strata_gguf_value *")
    check(lib.strata_gguf_kv(g, idx[0], k, kl, v))
    return _value(g, v[0])


class GGUFFile:
    """An open GGUF (or a split set opened through its first file)."""

    def __init__(self, path):
        self.path = str(path)
        out = ffi.new("strata_gguf **")
        check(lib.strata_gguf_open(self.path.encode(), out))
        self._g = ffi.gc(out[0], lib.strata_gguf_close)

    @property
    def version(self) -> int:
        return lib.strata_gguf_version(self._g)

    @property
    def n_splits(self) -> int:
        return lib.strata_gguf_n_splits(self._g)

    @property
    def alignment(self) -> int:
        return lib.strata_gguf_alignment(self._g)

    def get(self, key: str, default=None):
        """One key's value (as metadata() gives it), or default when the file has no such key:
        without unpacking the other keys (the tokenizer's arrays are 750k strings)."""
        return value_of(self._g, key, default)

    def metadata(self) -> dict:
        md = {}
        key = ffi.new("const char **")
        klen = ffi.new("uint64_t *")
        val = ffi.new("strata_gguf_value *")
        for i in range(lib.strata_gguf_n_kv(self._g)):
            check(lib.strata_gguf_kv(self._g, i, key, klen, val))
            md[ffi.unpack(key[0], klen[0]).decode("utf-8", "replace")] = _value(self._g, val[0])
        return md

    def tensors(self) -> list[dict]:
        out = []
        t = ffi.new("strata_gguf_tensor *")
        for i in range(lib.strata_gguf_n_tensors(self._g)):
            check(lib.strata_gguf_tensor_info(self._g, i, t))
            out.append({
                "name": ffi.unpack(t.name, t.name_len).decode("utf-8", "replace"),
                "type": _type_name(t.type),
                "shape": [t.ne[d] for d in range(t.n_dims)],
                "offset": t.offset,
                "size": t.size,
                "split": t.split,
            })
        return out

    def tensor_data(self, name: str) -> memoryview:
        """The raw bytes of a tensor, straight from the mapping (read-only, no copy)."""
        idx = ffi.new("int64_t *")
        check(lib.strata_gguf_find_tensor(self._g, name.encode(), idx))
        t = ffi.new("strata_gguf_tensor *")
        check(lib.strata_gguf_tensor_info(self._g, idx[0], t))
        if t.size == 0:
            return memoryview(b"")
        view = np.frombuffer(ffi.buffer(t.data, t.size), dtype=np.uint8).view(_MappedBytes)
        view._owner = self  # the mapping lives as long as any view of it
        return memoryview(view).toreadonly()


def gguf_info(path) -> dict:
    """{"metadata": {key: value}, "tensors": [{"name", "type", "shape", "offset", "size"}]}
    (shape in ggml ne order; offset absolute in its file). Raises FormatError on a bad file."""
    f = GGUFFile(path)
    tensors = f.tensors()
    if f.n_splits <= 1:
        for t in tensors:
            t.pop("split")
    return {"metadata": f.metadata(), "tensors": tensors}


@contextlib.contextmanager
def writing(path: str, arch: str):
    """A gguf.GGUFWriter on PATH.tmp that becomes PATH only when the block completes: on any
    error (or Ctrl-C) the partial file is removed, so a reader never sees half a GGUF. The
    block adds metadata and tensor infos and writes; closing and renaming happen here."""
    tmp = f"{path}.tmp"
    w = gguf_py.GGUFWriter(tmp, arch, use_temp_file=False)
    try:
        yield w
    except BaseException:
        w.close()
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
    w.close()
    os.replace(tmp, path)


def trunk_only(src: str, dst: str, arch: str = "qwen4exp") -> str:
    """Copy the GGUF src to dst without its MTP block (blk.{L}.*, spec/qwen4exp-mtp.md): block_count L, no
    nextn_predict_layers, per-layer metadata arrays cut to L entries, every other tensor byte for byte
    (llama-cpp-python 0.3.36 loads no qwen4exp MTP block). Written as `writing` writes: all or nothing."""
    r = gguf_py.GGUFReader(os.fspath(src))
    fields = r.fields
    n_all = int(fields[f"{arch}.block_count"].contents())
    nextn = f"{arch}.nextn_predict_layers"
    L = n_all - (int(fields[nextn].contents()) if nextn in fields else 0)
    with writing(os.fspath(dst), arch) as w:
        for k, f in fields.items():
            if k.startswith("GGUF.") or k in ("general.architecture", nextn):
                continue
            vt, v = f.types[0], f.contents()
            if k == f"{arch}.block_count":
                v = L
            elif vt == gguf_py.GGUFValueType.ARRAY and k.startswith(arch + ".") and len(v) == n_all:
                v = v[:L]
            w.add_key_value(k, v, vt, sub_type=f.types[1] if vt == gguf_py.GGUFValueType.ARRAY else None)
        for t in r.tensors:
            if not any(t.name.startswith(f"blk.{i}.") for i in range(L, n_all)):
                w.add_tensor(t.name, t.data, raw_shape=t.data.shape, raw_dtype=t.tensor_type)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
    return os.fspath(dst)
