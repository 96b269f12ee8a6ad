"""bench.py — `strata bench kernels`: matrix x vector/batch speed of every block format at the
real model's shapes, next to a memory read-bandwidth probe measured in the same run.

Batch-1 numbers read each weight matrix cold: the benchmark rotates through enough copies of
the matrix (>= 256 MiB in all) that none is in cache, as in decode, where every expert matrix
is read once per token. Larger batches reuse one copy (they are compute-bound)."""
from __future__ import annotations

import time

import numpy as np

from . import quant
from ._native import Context, check, ffi, lib

# (label, rows, cols): rows x row length of the real model's matrices.
SHAPES = [
    ("expert gate/up", 640, 2560),
    ("expert down", 2560, 640),
    ("attn/hidden", 2560, 2560),
    ("lm head", 248320, 2560),
]
BATCHES = (1, 4, 512)
# Batch 512 on the LM head would take minutes per format: it runs on a row slice.
LM_HEAD_BATCH_ROWS = 8192
COLD_BYTES = 256 << 20


def probe_bandwidth(ctx: Context, nbytes: int = 1 << 30, reps: int = 5) -> float:
    g = ffi.new("double *")
    check(lib.strata_probe_read_bandwidth(ctx.ptr, nbytes, reps, g))
    return g[0]


def random_weights(type_name: str, rows: int, cols: int, rng: np.random.Generator) -> bytes:
    """Valid blocks for speed measurements (the speed does not depend on the values): random
    rows of a 64-row pattern, tiled to the full matrix."""
    nbytes = quant.row_size(type_name, cols) * rows
    if type_name in ("F32", "F16", "BF16"):
        v = rng.standard_normal(min(rows, 64) * cols, dtype=np.float32)
        if type_name == "F16":
            v = v.astype(np.float16)
        elif type_name == "BF16":
            v = (v.view(np.uint32) >> 16).astype(np.uint16)
        base = v.tobytes()
    else:
        base = _sane_blocks(type_name, min(rows, 64) * cols, rng)
    return (base * -(-nbytes // len(base)))[:nbytes]


def _sane_blocks(type_name: str, n_values: int, rng) -> bytes:
    """Random blocks whose decoded values are finite and moderate (no NaN/Inf/huge scales,
    which could change the speed of float code): draw random bytes, keep the good blocks."""
    info = quant.type_info(type_name)
    bs, ts = info["block_size"], info["type_size"]
    nb = n_values // bs
    out = bytearray()
    while len(out) < nb * ts:
        cand = rng.integers(0, 256, (4096, ts), dtype=np.uint8)
        vals = quant.dequantize(type_name, cand.tobytes(), 4096 * bs).reshape(4096, bs)
        ok = np.all(np.isfinite(vals) & (np.abs(vals) < 1e4), axis=1)
        out += cand[ok].tobytes()
    return bytes(out[:nb * ts])


def time_matmul(type_name, copies, rows, cols, x, ctx, min_time=0.3):
    """Best seconds per strata_matmul call over three rounds of >= min_time/3 each, rotating
    through the copies. Buffers are prepared once: the loop is one C call per matmul."""
    t = quant.type_id(type_name)
    ws = [ffi.from_buffer(c) for c in copies]
    xp = ffi.from_buffer("float[]", x)
    y = np.empty((x.shape[0], rows), dtype=np.float32)
    yp = ffi.from_buffer("float[]", y)
    n = x.shape[0]
    isa = lib.STRATA_ISA_AUTO
    check(lib.strata_matmul(ctx.ptr, t, ws[0], len(ws[0]), rows, cols, xp, n, yp, isa))  # warm-up
    best = float("inf")
    for _ in range(3):
        k = 0
        t0 = time.perf_counter()
        while True:
            w = ws[k % len(ws)]
            lib.strata_matmul(ctx.ptr, t, w, len(w), rows, cols, xp, n, yp, isa)
            k += 1
            dt = time.perf_counter() - t0
            if dt >= min_time / 3 or k >= 100000:
                break
        best = min(best, dt / k)
    return best


def run(types=None, threads=None, batches=BATCHES, shapes=SHAPES, log=print) -> dict:
    rng = np.random.default_rng(0)
    ctx_all = Context(threads)
    ctx_one = Context(1)
    nthreads = ctx_all.n_threads
    # The probe runs at the start and again at the end; the better of the two is the yardstick (a
    # shared host can slow one of them down; a slow probe would flatter every kernel).
    probe = {1: probe_bandwidth(ctx_one), nthreads: probe_bandwidth(ctx_all)}
    log(f"memory read bandwidth: {probe[1]:.1f} GB/s (1 thread), {probe[nthreads]:.1f} GB/s ({nthreads} threads)")
    probe_start = dict(probe)
    results = []
    for type_name in types or quant.supported_types():
        bs = quant.type_info(type_name)["block_size"]
        for label, rows, cols in shapes:
            if cols % bs:
                continue
            for batch in batches:
                r = rows if not (label == "lm head" and batch > 4) else min(rows, LM_HEAD_BATCH_ROWS)
                w = random_weights(type_name, r, cols, rng)
                ncopies = max(1, min(64, COLD_BYTES // len(w))) if batch == 1 else 1
                # distinct buffers (bytes(w) would return w itself): batch 1 must read cold memory
                copies = [w] + [bytearray(w) for _ in range(ncopies - 1)]
                x = rng.standard_normal((batch, cols), dtype=np.float32)
                for ctx, nt in ((ctx_one, 1), (ctx_all, nthreads)):
                    s = time_matmul(type_name, copies, r, cols, x, ctx)
                    row = {"type": type_name, "shape": label, "rows": r, "cols": cols, "batch": batch,
                           "threads": nt, "seconds": s, "weight_gbps": len(w) / s / 1e9,
                           "gflops": 2.0 * r * cols * batch / s / 1e9}
                    results.append(row)
                    log(f"{type_name:8s} {label:15s} {r:6d}x{cols:<5d} b={batch:<3d} t={nt} "
                        f"{row['weight_gbps']:7.2f} GB/s {row['gflops']:8.2f} GFLOP/s "
                        f"({100.0 * row['weight_gbps'] / probe[nt]:5.1f}% of the first probe)")
                del copies
    probe_end = {1: probe_bandwidth(ctx_one), nthreads: probe_bandwidth(ctx_all)}
    probe = {k: max(probe_start[k], probe_end[k]) for k in probe_start}
    log(f"memory read bandwidth at the end: {probe_end[1]:.1f} GB/s (1 thread), {probe_end[nthreads]:.1f} GB/s "
        f"({nthreads} threads); percentages use the better of the two")
    for row in results:
        row["probe_gbps"] = probe[row["threads"]]
        row["pct_of_probe"] = 100.0 * row["weight_gbps"] / row["probe_gbps"]
    return {"probe_gbps": {str(k): v for k, v in probe.items()},
            "probe_gbps_start": {str(k): v for k, v in probe_start.items()},
            "probe_gbps_end": {str(k): v for k, v in probe_end.items()},
            "threads": nthreads, "results": results}
