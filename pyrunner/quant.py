"""quant.py — block formats from Python: dequantize, quantize, matmul (used by tests and
tools; the model code calls the library directly). Type names are those of
gguf.GGMLQuantizationType ("Q4_K", "IQ2_XS", ...)."""
from __future__ import annotations

import numpy as np

from ._native import Context, check, default_context, ffi, isa_id, lib


def type_id(type_name: str) -> int:
    out = ffi.new("int32_t *")
    check(lib.strata_type_from_name(type_name.encode(), out))
    return out[0]


def type_info(type_name: str) -> dict:
    info = ffi.new("strata_type_info *")
    check(lib.strata_type_info_get(type_id(type_name), info))
    return {"type": info.type, "name": ffi.string(info.name).decode(), "block_size": info.block_size,
            "type_size": info.type_size, "act_block": info.act_block,
            "has_kernels": bool(info.has_kernels), "has_quantize": bool(info.has_quantize)}


def supported_types() -> list[str]:
    """Names of every type Strata can read (dequantize and multiply)."""
    names = []
    info = ffi.new("strata_type_info *")
    for t in range(64):
        if lib.strata_type_info_get(t, info) == lib.STRATA_OK and info.has_kernels:
            names.append(ffi.string(info.name).decode())
    return names


def row_size(type_name: str, n_values: int) -> int:
    out = ffi.new("uint64_t *")
    check(lib.strata_type_row_size(type_id(type_name), n_values, out))
    return out[0]


def dequantize(type_name: str, data: bytes, n_values: int, isa: str = "auto") -> np.ndarray:
    dst = np.empty(n_values, dtype=np.float32)
    src = ffi.from_buffer(data)
    check(lib.strata_dequantize(type_id(type_name), src, len(src), ffi.from_buffer("float[]", dst),
                                n_values, isa_id(isa)))
    return dst


def quantize(type_name: str, values: np.ndarray, imatrix: np.ndarray | None = None) -> bytes:
    """values: (n,) or (rows, n_per_row) float32 -> the blocks, row after row."""
    v = np.ascontiguousarray(values, dtype=np.float32)
    rows, n_per_row = (1, v.shape[0]) if v.ndim == 1 else v.shape
    t = type_id(type_name)
    dst = bytearray(row_size(type_name, n_per_row) * rows)
    written = ffi.new("uint64_t *")
    im = ffi.NULL
    if imatrix is not None:
        imatrix = np.ascontiguousarray(imatrix, dtype=np.float32)
        if imatrix.shape != (n_per_row,):
            raise ValueError(f"imatrix must have shape ({n_per_row},), got {imatrix.shape}")
        im = ffi.from_buffer("float[]", imatrix)
    check(lib.strata_quantize(t, ffi.from_buffer("float[]", v), rows, n_per_row, im,
                              ffi.from_buffer(dst), len(dst), written))
    return bytes(dst[:written[0]])


def set_repack(on: bool) -> bool:
    """Turns the prefill conversion of weight rows on or off for the whole process (strata.h
    strata_set_repack; what --no-repack and Model(repack=False) do); returns the previous setting."""
    return bool(lib.strata_set_repack(int(bool(on))))


def repack_scratch_bytes(type_name: str, cols: int, isa: str = "auto") -> int:
    """Scratch bytes one thread's prefill conversion needs for rows of cols values of this type on this
    path; 0 where the conversion does not apply (no converted layout there, or off)."""
    out = ffi.new("uint64_t *")
    check(lib.strata_repack_scratch_bytes(type_id(type_name), cols, isa_id(isa), out))
    return int(out[0])


def matmul(type_name: str, data: bytes, rows: int, cols: int, x: np.ndarray, isa: str = "auto",
           ctx: Context | None = None) -> np.ndarray:
    """W (rows x cols, in type_name blocks) times x: (cols,) -> (rows,), (n, cols) -> (n, rows)."""
    xv = np.ascontiguousarray(x, dtype=np.float32)
    single = xv.ndim == 1
    if single:
        xv = xv.reshape(1, -1)
    if xv.ndim != 2 or xv.shape[1] != cols:
        raise ValueError(f"x must have shape ({cols},) or (n, {cols}), got {np.shape(x)}")
    n = xv.shape[0]
    y = np.empty((n, rows), dtype=np.float32)
    src = ffi.from_buffer(data)
    ctx = ctx or default_context()
    check(lib.strata_matmul(ctx.ptr, type_id(type_name), src, len(src), rows, cols,
                            ffi.from_buffer("float[]", xv), n, ffi.from_buffer("float[]", y), isa_id(isa)))
    return y[0] if single else y
