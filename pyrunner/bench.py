"""bench.py — `strata bench kernels`: matrix x vector/batch speed of every block format at the
real model's shapes on one kernel path, next to the two yardsticks measured in the same run: the
memory read bandwidth and that path's int8 multiply-accumulate peak. Each row's share of both says
which bound holds. And `strata bench model`: prefill and decode tokens/s of a model file,
optionally against llama.cpp (see bench_model()).

Batch-1 numbers read each weight matrix cold, as in decode, where every expert matrix is read once
per token: the benchmark rotates through copies of the matrix totalling max(8 x the last-level
cache, 256 MiB) or more, so a copy has left the cache before its turn comes again (on a CPU with a
large L3 a 1 MB expert matrix takes hundreds of copies). Larger batches reuse one copy (they are
compute-bound)."""
from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np

from . import quant
from ._native import Context, check, ffi, isa_best, isa_id, lib

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
# The batch-1 rotation: at least LLC_FACTOR last-level caches (a cache keeps some lines of a buffer
# a few times its size: replacement is not strict LRU), and never less than COLD_BYTES.
COLD_BYTES = 256 << 20
LLC_FACTOR = 8
CACHE_SYSFS = "/sys/devices/system/cpu/cpu0/cache"


def probe_bandwidth(ctx: Context, nbytes: int = 1 << 30, reps: int = 5) -> float:
    g = ffi.new("double *")
    check(lib.strata_probe_read_bandwidth(ctx.ptr, nbytes, reps, g))
    return g[0]


def probe_int8_peak(ctx: Context, isa: str) -> float:
    """G int8 MACs per second of kernel path `isa` on every thread of ctx (strata.h
    strata_probe_int8_peak says which instructions); raises for a path this CPU cannot run."""
    g = ffi.new("double *")
    check(lib.strata_probe_int8_peak(ctx.ptr, isa_id(isa), g))
    return g[0]


def llc_bytes() -> int | None:
    """Bytes of cpu0's last-level cache: level 3 from sysconf, else the highest data or unified level
    sysfs lists; None if neither says."""
    try:
        n = os.sysconf("SC_LEVEL3_CACHE_SIZE")
        if n > 0:
            return n
    except (ValueError, OSError):
        pass  # a libc or Python without the name (CPython knows it only where the headers define it)
    return sysfs_llc_bytes(CACHE_SYSFS)


def sysfs_llc_bytes(root: str | Path) -> int | None:
    """The highest-level data or unified cache under root (sysfs cpuN/cache: index*/{level,type,size},
    sizes like "49152K")."""
    best = None
    for d in Path(root).glob("index*"):
        try:
            level = int((d / "level").read_text())
            kind = (d / "type").read_text().strip()
            size = (d / "size").read_text().strip()
            nbytes = int(size[:-1]) << {"K": 10, "M": 20, "G": 30}[size[-1]] if size[-1] in "KMG" else int(size)
        except (OSError, ValueError, IndexError):
            continue
        if kind != "Instruction" and (best is None or level > best[0]):
            best = (level, nbytes)
    return best[1] if best else None


def rotation_target(llc: int | None) -> int:
    """Bytes of copies a batch-1 row rotates through."""
    return max(LLC_FACTOR * (llc or 0), COLD_BYTES)


def rotation_copies(matrix_bytes: int, llc: int | None) -> int:
    """Copies of a matrix of matrix_bytes that together reach rotation_target(llc) (no upper cap:
    a small matrix needs many)."""
    return max(1, -(-rotation_target(llc) // matrix_bytes))


def cold_copies(w: bytes, ncopies: int) -> np.ndarray:
    """ncopies of w as the rows of one buffer (one allocation, not ncopies objects), each at a
    64-byte aligned offset as GGUF tensors are, every page written before timing."""
    stride = -(-len(w) // 64) * 64
    raw = np.empty(ncopies * stride + 64, dtype=np.uint8)
    start = -raw.ctypes.data % 64
    copies = raw[start:start + ncopies * stride].reshape(ncopies, stride)
    copies[:, :len(w)] = np.frombuffer(w, dtype=np.uint8)
    return copies


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


def time_matmul(type_name, copies, rows, cols, x, ctx, isa="auto", min_time=0.3):
    """Best seconds per strata_matmul call on kernel path isa over three rounds of >= min_time/3
    each, rotating through the copies (the rows of cold_copies()). Pointers are prepared once: the
    loop is one C call per matmul."""
    t = quant.type_id(type_name)
    nbytes = quant.row_size(type_name, cols) * rows
    base = ffi.from_buffer(copies)
    ws = [base + k * copies.strides[0] for k in range(copies.shape[0])]
    xp = ffi.from_buffer("float[]", x)
    y = np.empty((x.shape[0], rows), dtype=np.float32)
    yp = ffi.from_buffer("float[]", y)
    n = x.shape[0]
    isa = isa_id(isa)
    check(lib.strata_matmul(ctx.ptr, t, ws[0], nbytes, rows, cols, xp, n, yp, isa))  # warm-up
    best = float("inf")
    for _ in range(3):
        k = 0
        t0 = time.perf_counter()
        while True:
            lib.strata_matmul(ctx.ptr, t, ws[k % len(ws)], nbytes, rows, cols, xp, n, yp, isa)
            k += 1
            dt = time.perf_counter() - t0
            if dt >= min_time / 3 or k >= 100000:
                break
        best = min(best, dt / k)
    return best


def _yardsticks(ctx_one: Context, ctx_all: Context, isa: str) -> tuple[dict, dict]:
    """Read bandwidth (GB/s) and int8 peak (G MAC/s) by thread count."""
    n = ctx_all.n_threads
    return ({1: probe_bandwidth(ctx_one), n: probe_bandwidth(ctx_all)},
            {1: probe_int8_peak(ctx_one, isa), n: probe_int8_peak(ctx_all, isa)})


def run(types=None, threads=None, batches=BATCHES, shapes=SHAPES, isa=None, min_time=0.3, log=print) -> dict:
    """Every (type, shape, batch) on one and on all threads, on kernel path isa (None: isa_best()).
    Rows give pct_of_probe (weight bytes per second over the read bandwidth) and pct_of_int8_peak
    (MACs per second, rows x cols x batch / seconds, over the path's int8 peak), each against the
    better of the yardsticks measured at the start and at the end, and bound: the larger share.
    Float weights (F32, F16, BF16) multiply with float FMAs, which the int8 peak does not bound: their
    pct_of_int8_peak and bound are None."""
    isa = isa or isa_best()
    rng = np.random.default_rng(0)
    ctx_all = Context(threads)
    ctx_one = Context(1)
    nthreads = ctx_all.n_threads
    llc = llc_bytes()
    rotation = rotation_target(llc)
    llc_text = f"{llc / 2**20:.1f} MiB" if llc else "unknown (neither sysconf nor sysfs says)"
    log(f"kernel path {isa}; last-level cache {llc_text}; batch-1 rows rotate through >= {rotation / 2**20:.0f} MiB "
        f"of copies")
    # The yardsticks are measured at the start and again at the end; the better of the two counts (a shared
    # host can slow one of them down, and a slow yardstick would flatter every kernel).
    probe_start, peak_start = _yardsticks(ctx_one, ctx_all, isa)
    log(f"memory read bandwidth: {probe_start[1]:.1f} GB/s (1 thread), {probe_start[nthreads]:.1f} GB/s "
        f"({nthreads} threads); int8 peak ({isa}): {peak_start[1]:.1f} G MAC/s (1 thread), "
        f"{peak_start[nthreads]:.1f} G MAC/s ({nthreads} threads)")
    results = []
    for type_name in types or quant.supported_types():
        for label, rows, cols in shapes:
            if cols % quant.type_info(type_name)["block_size"]:
                continue
            for batch in batches:
                r = rows if not (label == "lm head" and batch > 4) else min(rows, LM_HEAD_BATCH_ROWS)
                w = random_weights(type_name, r, cols, rng)
                nbytes = len(w)
                ncopies = rotation_copies(nbytes, llc) if batch == 1 else 1
                copies = cold_copies(w, ncopies)
                del w  # the copies hold it (an LM head in F32 is 2.5 GB)
                x = rng.standard_normal((batch, cols), dtype=np.float32)
                for ctx, nt in ((ctx_one, 1), (ctx_all, nthreads)):
                    s = time_matmul(type_name, copies, r, cols, x, ctx, isa, min_time)
                    row = {"type": type_name, "shape": label, "rows": r, "cols": cols, "batch": batch,
                           "threads": nt, "isa": isa, "seconds": s, "weight_gbps": nbytes / s / 1e9,
                           "gflops": 2.0 * r * cols * batch / s / 1e9, "gmacs": r * cols * batch / s / 1e9,
                           "rotation_bytes": ncopies * nbytes}
                    _shares(row, probe_start[nt], peak_start[nt])
                    results.append(row)
                    peak_text = (f"{row['pct_of_int8_peak']:5.1f}% of int8 peak" if row["bound"]
                                 else "float FMAs (no int8 peak)")
                    log(f"{type_name:8s} {label:15s} {r:6d}x{cols:<5d} b={batch:<3d} t={nt} "
                        f"{row['weight_gbps']:7.2f} GB/s {row['gflops']:8.2f} GFLOP/s "
                        f"{row['pct_of_probe']:5.1f}% of bandwidth {peak_text} {row['bound'] or ''}")
                del copies
    probe_end, peak_end = _yardsticks(ctx_one, ctx_all, isa)
    probe = {k: max(probe_start[k], probe_end[k]) for k in probe_start}
    peak = {k: max(peak_start[k], peak_end[k]) for k in peak_start}
    log(f"at the end: {probe_end[1]:.1f} GB/s (1 thread), {probe_end[nthreads]:.1f} GB/s ({nthreads} threads); "
        f"int8 peak {peak_end[1]:.1f} G MAC/s (1 thread), {peak_end[nthreads]:.1f} G MAC/s ({nthreads} threads). "
        f"The lines above used the first yardsticks; the results use the better of the two")
    for row in results:
        _shares(row, probe[row["threads"]], peak[row["threads"]])

    def by_threads(d):
        return {str(k): v for k, v in d.items()}
    return {"isa": isa, "llc_bytes": llc, "rotation_bytes": rotation,
            "probe_gbps": by_threads(probe), "probe_gbps_start": by_threads(probe_start),
            "probe_gbps_end": by_threads(probe_end), "int8_peak_gmacs": by_threads(peak),
            "int8_peak_gmacs_start": by_threads(peak_start), "int8_peak_gmacs_end": by_threads(peak_end),
            "threads": nthreads, "results": results}


def _shares(row: dict, probe_gbps: float, peak_gmacs: float) -> None:
    """A row's share of each yardstick and the bound that holds (the larger share)."""
    row["probe_gbps"] = probe_gbps
    row["pct_of_probe"] = 100.0 * row["weight_gbps"] / probe_gbps
    row["int8_peak_gmacs"] = peak_gmacs
    if quant.type_info(row["type"])["act_block"] > 1:  # int8 dot products (float activations: act_block 1)
        row["pct_of_int8_peak"] = 100.0 * row["gmacs"] / peak_gmacs
        row["bound"] = "memory" if row["pct_of_probe"] >= row["pct_of_int8_peak"] else "compute"
    else:
        row["pct_of_int8_peak"] = row["bound"] = None


# ------------------------------------------------------------------------------------------ bench model
#
# `strata bench model`: prefill tokens/s over a prompt of fixed random ids (seeded, < n_vocab) in one call,
# then decode tokens/s over gen_tokens single-token calls, each feeding the greedy argmax of the previous
# logits. With vs_llama_cpp the same file, ids and loop run through llama-cpp-python in a child process, and the
# ratios Strata / llama.cpp are reported; a llama.cpp that crashes on the file (pyrunner/llama_child.py) is
# reported, not fatal: Strata's figures stand, "llama_cpp" holds {"error": the message}, there are no ratios.
# Load time is measured apart and not part of either rate.
# Strata runs first: on a file larger than the free page cache, whichever engine runs first pays for cold reads in
# its prefill, so measure a file that is already cached (read it once, e.g. with an earlier run), on an idle machine.

# The llama.cpp KV cache (type_k, type_v as ggml type ids, flash attention) used against each Strata --kv-type.
# int8: llama.cpp's nearest is Q8_0, but llama-cpp-python 0.3.36 aborts the process (a GGML_ASSERT in
# ggml_view_2d while building the qwen4exp cache) with a Q8_0 K cache, so K stays F16 and V is Q8_0, which
# llama.cpp allows only with flash attention.
_LLAMA_KV = {"f32": (0, 0, False), "f16": (1, 1, False), "int8": (1, 8, True)}
_GGML_NAME = {0: "f32", 1: "f16", 8: "q8_0"}
KV_TYPES = tuple(_LLAMA_KV)


class BenchError(Exception):
    """A user error in `strata bench model` (bad file, bad setting); the message says what to do."""


def bench_prompt(n_vocab: int, n: int, seed: int = 0) -> list[int]:
    """The benchmark prompt: n ids drawn uniformly below n_vocab by a seeded generator."""
    return [int(x) for x in np.random.default_rng(seed).integers(0, n_vocab, n)]


def _rates(load_s: float, prefill_s: float, decode_s: float, prompt_tokens: int, generated: int) -> dict:
    return {"load_s": load_s, "prefill_s": prefill_s, "decode_s": decode_s, "prompt_tokens": prompt_tokens,
            "generated_tokens": generated, "prefill_tps": prompt_tokens / prefill_s if prefill_s > 0 else 0.0,
            "decode_tps": generated / decode_s if decode_s > 0 else 0.0}


# A one-shot `strata generate` pays the load and then the first tokenize (which builds the tokenizer's tables)
# before its first token (issue 17.5): the bench times that call on the model's own vocabulary.
TOKENIZE_PROBE = "Hello, world! It's 2026; 自然语言处理 — こんにちは"


def _strata_run(path: str, prompt_tokens: int, seed: int, gen_tokens: int, threads: int, kv_type: str,
                n_ctx: int, repack: bool | None = None, expert_io: str = "auto", ram_gib: float | None = None,
                io_figures: bool = False) -> tuple:
    """Load, the first tokenize (of TOKENIZE_PROBE), prefill, decode; returns (rates + tokenize_first_s, prompt
    ids, generated ids). The prompt is sized by the model's n_vocab. With io_figures the rates also hold how
    experts were read (store_log) and, per decode token, the bytes read from storage (/proc/self/io) and, with
    direct reads, the bytes of experts missed in RAM, the RAM hit rate and the prefetch's figures."""
    from ._native import StrataError
    from .generate import _proc_read_bytes
    from .model import Model

    t0 = time.perf_counter()
    try:
        model = Model(path, threads=threads, n_ctx=n_ctx, kv_type=kv_type, repack=repack, expert_io=expert_io,
                      ram_gib=ram_gib)
    except (StrataError, ValueError, OSError) as e:
        raise BenchError(f"Strata could not load {path}: {e}") from None
    try:
        load_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        model.tokenize(TOKENIZE_PROBE)
        tokenize_first_s = time.perf_counter() - t0
        ids = bench_prompt(model.n_vocab, prompt_tokens, seed)
        sess = model.session()
        t0 = time.perf_counter()
        logits = sess.eval(ids)
        prefill_s = time.perf_counter() - t0
        out = []
        st0, io0 = model.store_stats(), _proc_read_bytes()
        t0 = time.perf_counter()
        for _ in range(gen_tokens):
            tok = int(np.argmax(logits))
            out.append(tok)
            logits = sess.eval([tok])
        decode_s = time.perf_counter() - t0
        st1, io1 = model.store_stats(), _proc_read_bytes()
        rates = {**_rates(load_s, prefill_s, decode_s, len(ids), gen_tokens), "tokenize_first_s": tokenize_first_s,
                 "repack_bytes": model.repack_bytes}
        if not io_figures:
            return rates, ids, out
        rates["store_log"] = model.store_log
        n = max(gen_tokens, 1)
        rates["storage_read_bytes_per_token"] = (io1 - io0) / n
        if st1["active"]:
            looked = st1["ram_lookups"] - st0["ram_lookups"]
            rates["ram_hit_rate"] = (st1["ram_hits"] - st0["ram_hits"]) / looked if looked else 0.0
            rates["ram_miss_bytes_per_token"] = (st1["ram_miss_bytes"] - st0["ram_miss_bytes"]) / n
            rates["expert_read_s_per_token"] = (st1["read_s"] - st0["read_s"]) / n
            rates["ram_gib"] = st1["ram_bytes"] / (1 << 30)
            rates["prefetch_bytes_per_token"] = (st1["prefetch_bytes"] - st0["prefetch_bytes"]) / n
            rates["prefetch_unused_bytes_per_token"] = (st1["prefetch_unused_bytes"] - st0["prefetch_unused_bytes"]) / n
            pred = st1["predicted"] - st0["predicted"]
            rates["prefetch_recall"] = (st1["predicted_right"] - st0["predicted_right"]) / pred if pred else None
        return rates, ids, out
    finally:
        model.close()


def _llama_run(path: str, ids: list[int], gen_tokens: int, threads: int, kv_type: str, n_ctx: int) -> tuple:
    """llama.cpp's side of bench_model, the same measurement as _strata_run; runs in llama_child's child process
    (its own timers, so the child's start-up is not measured)."""
    try:
        import llama_cpp
    except ImportError:
        raise BenchError("--vs-llama-cpp needs llama-cpp-python (pip install llama-cpp-python==0.3.36)") from None
    n_batch = max(len(ids), 1)
    type_k, type_v, flash = _LLAMA_KV[kv_type]
    t0 = time.perf_counter()
    try:
        llm = llama_cpp.Llama(path, n_ctx=n_ctx, n_batch=n_batch, n_ubatch=n_batch, n_threads=threads,
                              n_threads_batch=threads, type_k=type_k, type_v=type_v, flash_attn=flash,
                              logits_all=False, verbose=False)
    except (ValueError, RuntimeError) as e:
        raise BenchError(f"llama.cpp could not load {path}: {e}") from None
    try:
        load_s = time.perf_counter() - t0
        n_vocab = llm.n_vocab()

        def last_logits():
            return np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llm._ctx.ctx, -1), shape=(n_vocab,))

        t0 = time.perf_counter()
        llm.eval(ids)
        logits = last_logits()
        prefill_s = time.perf_counter() - t0
        out = []
        t0 = time.perf_counter()
        for _ in range(gen_tokens):
            tok = int(np.argmax(logits))
            out.append(tok)
            llm.eval([tok])
            logits = last_logits()
        decode_s = time.perf_counter() - t0
        # the ISA features this llama.cpp build runs with ("AVX2 = 1 | AVX512 = 1 | ..."), for the report
        info = llama_cpp.llama_print_system_info().decode("utf-8", "replace")
        return _rates(load_s, prefill_s, decode_s, len(ids), gen_tokens), out, info
    finally:
        llm.close()


def bench_model(path: str, threads: int = 2, prompt_tokens: int = 512, gen_tokens: int = 128, kv_type: str = "f16",
                vs_llama_cpp: bool = False, seed: int = 0, log=print, repack: bool | None = None,
                expert_io: str = "auto", ram_gib: float | None = None) -> dict:
    """Returns {"settings": {...}, "strata": RATES, and with vs_llama_cpp "llama_cpp": RATES, "ratios":
    {"prefill_tps", "decode_tps"} (Strata / llama.cpp), "same_tokens" (whether both decoded the same greedy
    tokens)}, RATES = {prefill_tps, decode_tps, prefill_s, decode_s, prompt_tokens, generated_tokens, load_s}
    and for Strata also tokenize_first_s (the session's first tokenize, after the load) and repack_bytes (the
    prefill conversion's scratch, 0 when off or unused; repack=False: --no-repack).
    When llama.cpp crashes (or times out, or exits), "llama_cpp" is {"error": its message}, and there are no
    ratios and no same_tokens."""
    import os

    if not os.path.isfile(path):
        raise BenchError(f"{path}: no such model file")
    if prompt_tokens < 1 or gen_tokens < 0:
        raise BenchError(f"--prompt-tokens must be >= 1 and --gen-tokens >= 0 (got {prompt_tokens}, {gen_tokens})")
    if kv_type not in KV_TYPES:
        raise BenchError(f"--kv-type {kv_type!r}: choose one of {', '.join(KV_TYPES)}")
    n_ctx = prompt_tokens + gen_tokens + 16
    from ._native import isa_best

    settings = {"model": path, "threads": threads, "prompt_tokens": prompt_tokens,
                "gen_tokens": gen_tokens, "kv_type": kv_type, "seed": seed, "strata_isa": isa_best()}
    log(f"strata: {prompt_tokens}-token prefill, {gen_tokens} decode steps, {threads} threads, kv {kv_type}")
    strata, ids, strata_tokens = _strata_run(path, prompt_tokens, seed, gen_tokens, threads, kv_type, n_ctx, repack,
                                             expert_io, ram_gib, expert_io != "auto" or ram_gib is not None)
    res = {"settings": settings, "strata": strata}
    if vs_llama_cpp:
        from .llama_child import LlamaChildError, LlamaCrash, LlamaTimeout, call

        log("llama.cpp: the same file, ids and loop (in a child process)")
        k, v, flash = _LLAMA_KV[kv_type]
        settings["llama_cpp_kv"] = f"K {_GGML_NAME[k]}, V {_GGML_NAME[v]}, flash attention {'on' if flash else 'off'}"
        try:
            llama, llama_tokens, info = call(_llama_run, (path, ids, gen_tokens, threads, kv_type, n_ctx), gguf=path)
        except (LlamaCrash, LlamaTimeout, LlamaChildError) as e:
            res["llama_cpp"] = {"error": str(e)}       # the caller reports it (the CLI: on stderr, exit 1)
            return res
        res["llama_cpp"] = llama
        settings["llama_cpp_cpu"] = " ".join(f.split(" = ")[0].strip() for f in info.replace("CPU :", "|").split("|")
                                             if f.strip().endswith("= 1"))
        res["ratios"] = {k: (strata[k] / llama[k] if llama[k] > 0 else None) for k in ("prefill_tps", "decode_tps")}
        res["same_tokens"] = strata_tokens == llama_tokens
    return res


class _MemCgroup:
    """A memory cgroup of `limit` bytes for one child process (v1 memory.limit_in_bytes as on this project's
    machines, v2 memory.max otherwise); removed on exit. Page cache is charged to it, so a memory-mapped reader
    is held to the limit too. Needs root (or a delegated subtree)."""

    def __init__(self, limit: int, tag: str):
        v1 = "/sys/fs/cgroup/memory"
        if os.path.isfile(os.path.join(v1, "memory.limit_in_bytes")):
            self.dir, self.knob = os.path.join(v1, f"strata-bench-{os.getpid()}-{tag}"), "memory.limit_in_bytes"
        elif os.path.isfile("/sys/fs/cgroup/cgroup.controllers"):
            self.dir, self.knob = f"/sys/fs/cgroup/strata-bench-{os.getpid()}-{tag}", "memory.max"
        else:
            raise BenchError("--mem-limit-gib needs a cgroup memory controller (/sys/fs/cgroup/memory or cgroup v2)")
        self.limit = limit

    def __enter__(self) -> str:
        try:
            os.mkdir(self.dir)
            with open(os.path.join(self.dir, self.knob), "w") as f:
                f.write(str(self.limit))
        except OSError as e:
            raise BenchError(f"--mem-limit-gib: cannot make the memory cgroup {self.dir} ({e.strerror}); it needs "
                             f"root, or a cgroup subtree delegated to this user") from None
        return self.dir

    def __exit__(self, *exc):
        try:
            os.rmdir(self.dir)
        except OSError:
            pass


def bench_model_limited(path: str, mem_limit_gib: float, threads: int = 2, prompt_tokens: int = 32,
                        gen_tokens: int = 16, kv_type: str = "f16", vs_llama_cpp: bool = False, seed: int = 0,
                        expert_io: str = "direct", ram_gib: float | None = None, log=print) -> dict:
    """A model larger than the memory allowed (issue 20 point 5): each engine in its own child process, each in
    its own memory cgroup of mem_limit_gib (llama.cpp never shares one with Strata's RAM slots), the file
    evicted from the page cache before every limited run (pages cached outside a cgroup are not charged to it)
    and read into it before the unlimited one (warm, as a model that fits in memory is used). Runs:
    "strata" without a limit (mmap: today's path), "strata_limited" (expert_io, default direct; ram_gib: its
    budget, default what the limit leaves), "strata_mmap_limited", and with vs_llama_cpp "llama_cpp_limited".
    Returns {"settings", "runs": {name: RATES or {"error"}}, "ratios": {"direct_limited_over_llama_limited",
    "direct_limited_over_strata", "mmap_limited_over_strata", ...}}."""
    from .llama_child import LlamaChildError, LlamaCrash, LlamaTimeout, call
    from .ple import evict

    if not os.path.isfile(path):
        raise BenchError(f"{path}: no such model file")
    if mem_limit_gib <= 0:
        raise BenchError(f"--mem-limit-gib {mem_limit_gib}: give a limit in GiB > 0")
    n_ctx = prompt_tokens + gen_tokens + 16
    limit = int(mem_limit_gib * (1 << 30))
    settings = {"model": path, "threads": threads, "prompt_tokens": prompt_tokens, "gen_tokens": gen_tokens,
                "kv_type": kv_type, "seed": seed, "mem_limit_gib": mem_limit_gib, "expert_io": expert_io,
                "ram_gib": ram_gib, "file_gib": os.path.getsize(path) / (1 << 30)}
    runs: dict = {}
    ids = None

    def warm():
        """The unlimited run reads a warm page cache (as a model that fits is used): the file read once."""
        with open(path, "rb", buffering=0) as f:
            while f.readinto(chunk):
                pass

    chunk = bytearray(16 << 20)

    def one(name, fn, args, limited):
        if limited:
            evict(path)
        else:
            warm()
        log(f"{name}: {'under ' + format(mem_limit_gib, 'g') + ' GiB' if limited else 'no limit'}")
        try:
            if limited:
                with _MemCgroup(limit, name) as cg:
                    return call(fn, args, gguf=path, cgroup=cg)
            return call(fn, args, gguf=path)
        except (LlamaCrash, LlamaTimeout, LlamaChildError, BenchError, OSError, RuntimeError, ValueError) as e:
            # the child's crash, kill (the kernel's OOM killer under the limit) or error: this run's figures only
            runs[name] = {"error": str(e).replace("llama.cpp", "the engine") if name.startswith("strata") else str(e)}
            return None

    r = one("strata", _strata_run, (path, prompt_tokens, seed, gen_tokens, threads, kv_type, n_ctx, None, "mmap", None,
                                    True), False)
    if r:
        runs["strata"], ids, _ = r
    for name, io in (("strata_limited", expert_io), ("strata_mmap_limited", "mmap")):
        if name == "strata_mmap_limited" and expert_io == "mmap":
            continue
        r = one(name, _strata_run, (path, prompt_tokens, seed, gen_tokens, threads, kv_type, n_ctx, None, io,
                                    ram_gib if io != "mmap" else None, True), True)
        if r:
            runs[name] = r[0]
            ids = ids or r[1]
    if vs_llama_cpp and ids is not None:
        r = one("llama_cpp_limited", _llama_run, (path, ids, gen_tokens, threads, kv_type, n_ctx), True)
        if r:
            runs["llama_cpp_limited"] = r[0]
    ratios = {}

    def ratio(a, b, key="decode_tps"):
        ra, rb = runs.get(a, {}), runs.get(b, {})
        if key in ra and rb.get(key):
            return ra[key] / rb[key]
        return None

    ratios["limited_over_llama_limited"] = ratio("strata_limited", "llama_cpp_limited")
    ratios["limited_over_strata"] = ratio("strata_limited", "strata")
    ratios["mmap_limited_over_strata"] = ratio("strata_mmap_limited", "strata")
    ratios["mmap_limited_over_llama_limited"] = ratio("strata_mmap_limited", "llama_cpp_limited")
    lim = runs.get("strata_limited", {})
    if lim.get("ram_miss_bytes_per_token"):
        ratios["storage_over_ram_miss_bytes"] = lim["storage_read_bytes_per_token"] / lim["ram_miss_bytes_per_token"]
        # what was fetched from storage for experts: demand misses and reads ahead
        fetched = lim["ram_miss_bytes_per_token"] + lim.get("prefetch_bytes_per_token", 0)
        ratios["storage_over_expert_fetch_bytes"] = lim["storage_read_bytes_per_token"] / fetched
    return {"settings": settings, "runs": runs, "ratios": {k: v for k, v in ratios.items() if v is not None}}


def bench_split(path: str, device: str = "sim", cache_gib: float | None = None, threads: int = 2,
                prompt_tokens: int = 32, gen_tokens: int = 128, rounds: int = 2, seed: int = 0, log=print) -> dict:
    """The per-layer online split against the seed's controller (issue 21 point 2), side by side: `rounds`
    rounds of (seed, online), each a fresh model on `device` with cache_gib of device memory (default: an eighth
    of the routed experts), tail skip off, greedy decode of gen_tokens after a random prompt through
    Model.generate (so the seed's controller gets its windows, as in use). Returns {"settings", "runs": [{"split",
    "decode_tps", "pcie_frac", "pcie_frac_min", "pcie_frac_max", "split_updates", "tokens"}], "ratio_per_round":
    [online / seed decode tok/s], "same_tokens"}: every run must decode the same tokens (the split never
    changes results)."""
    from .model import Model

    if not os.path.isfile(path):
        raise BenchError(f"{path}: no such model file")
    if rounds < 1 or gen_tokens < 1:
        raise BenchError("bench split: --rounds and --gen-tokens must be >= 1")
    runs, ratios = [], []
    for r in range(rounds):
        tps = {}
        for split in ("seed", "online"):
            with Model(path, threads=threads, device=device, cache_gib=cache_gib, tail_skip=0, split=split, mtp=0,
                       n_ctx=prompt_tokens + gen_tokens + 16, expert_pack=None) as m:
                if cache_gib is None and r == 0 and split == "seed":
                    log(m.offload_log)
                ids = bench_prompt(m.n_vocab, prompt_tokens, seed)
                c = m.generate(ids, max_tokens=gen_tokens, temperature=0)
                st = m.offload_stats()
                run = {"split": split, "round": r, "decode_tps": c.stats.get("decode_tps", 0.0), "tokens": c.tokens,
                       "pcie_frac": st["pcie_frac"], "pcie_frac_min": st["pcie_frac_min"],
                       "pcie_frac_max": st["pcie_frac_max"], "split_updates": st["split_updates"]}
                runs.append(run)
                tps[split] = run["decode_tps"]
                log(f"round {r} {split}: {run['decode_tps']:.2f} tok/s, pcie_frac {run['pcie_frac']:.2f} "
                    f"[{run['pcie_frac_min']:.2f}, {run['pcie_frac_max']:.2f}]")
        ratios.append(tps["online"] / tps["seed"] if tps["seed"] > 0 else None)
    same = all(x["tokens"] == runs[0]["tokens"] for x in runs)
    for x in runs:
        x["tokens"] = len(x["tokens"])
    return {"settings": {"model": path, "device": device, "cache_gib": cache_gib, "threads": threads,
                         "prompt_tokens": prompt_tokens, "gen_tokens": gen_tokens, "rounds": rounds},
            "runs": runs, "ratio_per_round": ratios, "same_tokens": same}


def format_split_table(res: dict) -> str:
    s = res["settings"]
    lines = [f"{s['model']}: device {s['device']}, {s['gen_tokens']} greedy tokens, {s['rounds']} rounds of seed / online",
             f"{'round':>5s} {'split':8s} {'decode tok/s':>12s} {'pcie_frac':>9s} {'min':>5s} {'max':>5s} {'updates':>8s}"]
    for x in res["runs"]:
        lines.append(f"{x['round']:5d} {x['split']:8s} {x['decode_tps']:12.2f} {x['pcie_frac']:9.2f} "
                     f"{x['pcie_frac_min']:5.2f} {x['pcie_frac_max']:5.2f} {x['split_updates']:8d}")
    lines.append("online / seed per round: " + ", ".join(f"{r:.3f}" if r else "-" for r in res["ratio_per_round"]))
    lines.append(f"same tokens in every run: {res['same_tokens']}")
    return "\n".join(lines)


def format_limited_table(res: dict) -> str:
    s = res["settings"]
    lines = [f"{s['model']} ({s['file_gib']:.2f} GiB): {s['prompt_tokens']}-token prompt, {s['gen_tokens']} decode "
             f"steps, {s['threads']} threads, memory limit {s['mem_limit_gib']:g} GiB per engine",
             f"{'run':22s} {'prefill tok/s':>13s} {'decode tok/s':>12s} {'storage MB/tok':>14s} {'RAM miss MB/tok':>15s} "
             f"{'RAM hits':>8s}"]
    for name, r in res["runs"].items():
        if "error" in r:
            lines.append(f"{name:22s} failed: {r['error'][:120]}")
            continue
        miss = f"{r['ram_miss_bytes_per_token'] / 1e6:15.2f}" if "ram_miss_bytes_per_token" in r else f"{'-':>15s}"
        hits = f"{r['ram_hit_rate']:8.3f}" if "ram_hit_rate" in r else f"{'-':>8s}"
        io = f"{r['storage_read_bytes_per_token'] / 1e6:14.2f}" if "storage_read_bytes_per_token" in r else f"{'-':>14s}"
        lines.append(f"{name:22s} {r['prefill_tps']:13.2f} {r['decode_tps']:12.3f} {io} {miss} {hits}")
    for k, v in res["ratios"].items():
        lines.append(f"{k}: {v:.2f}")
    for name, r in res["runs"].items():
        if "store_log" in r:
            lines.append(f"{name}: {r['store_log']}")
    return "\n".join(lines)


def format_model_table(res: dict) -> str:
    """The small table `strata bench model` prints."""
    llama = res.get("llama_cpp")
    rows = [("strata", res["strata"])] + ([("llama.cpp", llama)] if llama and "error" not in llama else [])
    s = res["settings"]
    lines = [f"{s['model']}: {s['prompt_tokens']}-token prompt, {s['gen_tokens']} generated, {s['threads']} threads, "
             f"kv {s['kv_type']}",
             f"{'engine':10s} {'prefill tok/s':>14s} {'decode tok/s':>13s} {'prefill s':>10s} {'decode s':>9s} "
             f"{'load s':>7s} {'1st tokenize s':>14s}"]
    for name, r in rows:
        first = f"{r['tokenize_first_s']:14.4f}" if "tokenize_first_s" in r else f"{'-':>14s}"
        lines.append(f"{name:10s} {r['prefill_tps']:14.2f} {r['decode_tps']:13.2f} {r['prefill_s']:10.3f} "
                     f"{r['decode_s']:9.3f} {r['load_s']:7.2f} {first}")
    if llama and "error" in llama:
        lines.append(f"{'llama.cpp':10s} no figures ({llama['error'].split(';')[0]})")
    if "llama_cpp_kv" in s:
        lines[0] += f" (llama.cpp KV: {s['llama_cpp_kv']})"
    isa = f"kernel paths: strata {s['strata_isa']}" if "strata_isa" in s else ""
    if isa and "repack_bytes" in res["strata"]:
        rb = res["strata"]["repack_bytes"]
        isa += f" (prefill repack scratch {rb / 2**10:.0f} KiB)" if rb else " (no prefill repack)"
    if "llama_cpp_cpu" in s:
        isa += f"; llama.cpp built with {s['llama_cpp_cpu']}"
    if isa:
        lines.insert(1, isa)
    if "ratios" in res:
        rt = res["ratios"]

        def fmt(v):
            return f"{v:.2f}x" if v is not None else "n/a"
        lines.append(f"{'ratio':10s} {fmt(rt['prefill_tps']):>14s} {fmt(rt['decode_tps']):>13s}   "
                     f"(Strata / llama.cpp; same greedy tokens: {'yes' if res['same_tokens'] else 'no'})")
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------ bench model --mtp
#
# `strata bench model --mtp K`: decode with K drafts per verify window next to decode without drafts, in one
# run on one loaded model. Random weights make the head's own acceptance meaningless, so the mechanism is also
# timed at forced acceptance rates: a hook makes each draft right (the token the greedy decode without drafts
# produced there) with probability r and wrong otherwise. Every run decodes the same greedy tokens (checked).
# From the rates the break-even acceptance follows: the lowest r at which drafting beats plain decode.

MTP_RATES = (0.0, 0.25, 0.5, 0.75, 0.9, 1.0)


class _MTPBench:
    """What bench_mtp and bench_mtp_auto share: the model loaded once with room for the prompt, the drafts
    and the tokens; the prompt prefilled once outside every timed decode; the greedy decode without drafts
    (the reference every run's tokens are checked against); one RUN record per generate(); forced hooks."""

    def __init__(self, path: str, k: int, threads: int, prompt_tokens: int, gen_tokens: int, kv_type: str,
                 seed: int, log, what: str, **model_kw):
        import os

        from ._native import StrataError
        from .generate import end_of_generation_ids, generate
        from .model import Model

        if not os.path.isfile(path):
            raise BenchError(f"{path}: no such model file")
        try:
            self.model = Model(path, threads=threads, n_ctx=prompt_tokens + gen_tokens + k + 16, kv_type=kv_type,
                               **model_kw)
        except (StrataError, ValueError, OSError) as e:
            raise BenchError(f"Strata could not load {path}: {e}") from None
        try:
            if self.model.n_mtp < 1:
                raise BenchError(f"{path} has no MTP block: make one with `tools/make_model.py PRESET --mtp` or "
                                 f"convert a checkpoint with its mtp.* tensors")
            self.generate, self.seed, self.log = generate, seed, log
            self.ids = bench_prompt(self.model.n_vocab, prompt_tokens, seed)
            sess = self.model.session()
            self.common = dict(max_tokens=gen_tokens, temperature=0, session=sess,
                               logit_bias={t: -np.inf for t in end_of_generation_ids(self.model)})
            log(f"strata: {prompt_tokens}-token prompt (prefilled once, then reused), {gen_tokens} greedy tokens, "
                f"{what}, {threads} threads, kv {kv_type}")
            generate(self.model, self.ids, max_tokens=1, session=sess)   # the prefill, outside every timed decode
            self.plain = generate(self.model, self.ids, mtp=0, **self.common)
            self.ref = self.ids + self.plain.tokens
        except BaseException:
            self.model.close()
            raise

    def run(self, label: str, mtp, hook) -> dict:
        """RUN: one greedy decode with `mtp` and the draft hook, its rates and per-window costs."""
        c = self.generate(self.model, self.ids, mtp=mtp, draft_hook=hook, **self.common)
        st = c.stats
        w = max(st.get("mtp_windows", 0), 1)
        out = {"decode_tps": st.get("decode_tps", 0.0), "same_tokens": c.tokens == self.plain.tokens,
               "drafts_proposed": st.get("drafts_proposed", 0), "drafts_accepted": st.get("drafts_accepted", 0),
               "acceptance_rate": st.get("acceptance_rate", 0.0),
               "mean_accepted_len": st.get("mean_accepted_len", 0.0), "windows": st.get("mtp_windows", 0),
               **{f"{n}_ms": 1e3 * st.get(f"mtp_{n}_s", 0.0) / w for n in ("draft", "verify", "rollback", "extend")}}
        if mtp == "auto":
            out["mtp_k"] = st.get("mtp_k", 0.0)
        return out

    def forced(self, rate_at, tag: int):
        """A draft hook (fresh at each call) making the draft for position p right (the reference decode's
        token) with probability rate_at(p), else wrong."""
        g = np.random.default_rng([self.seed, tag])
        ref, V = self.ref, self.model.n_vocab

        def hook(pos, draft):
            if pos >= len(ref):
                return draft
            return ref[pos] if g.random() < rate_at(pos) else (ref[pos] + 1) % V
        return hook


def bench_mtp(path: str, k: int, threads: int = 2, prompt_tokens: int = 128, gen_tokens: int = 64,
              kv_type: str = "f16", seed: int = 0, rates=MTP_RATES, log=print) -> dict:
    """{"settings", "plain": RUN, "natural": RUN (the head's own drafts), "forced": [RUN + {"rate"}],
    "break_even": the interpolated forced rate where speedup reaches 1 (None: never / always)}; RUN =
    {decode_tps, speedup, drafts_proposed, drafts_accepted, acceptance_rate, mean_accepted_len, windows,
    draft_ms, verify_ms, rollback_ms, extend_ms (per window), same_tokens}."""
    if k < 1 or prompt_tokens < 1 or gen_tokens < 2:
        raise BenchError(f"--mtp must be >= 1, --prompt-tokens >= 1 and --gen-tokens >= 2 (got {k}, {prompt_tokens}, "
                         f"{gen_tokens})")
    b = _MTPBench(path, k, threads, prompt_tokens, gen_tokens, kv_type, seed, log, f"mtp {k}")
    try:
        plain_tps = b.plain.stats.get("decode_tps")

        def run(label, hook):
            out = b.run(label, k, hook)
            out["speedup"] = out["decode_tps"] / plain_tps if plain_tps else None
            log(f"  {label:14s} {out['decode_tps']:8.2f} tok/s  x{out['speedup'] or 0:.2f}  accepted "
                f"{out['drafts_accepted']}/{out['drafts_proposed']}  mean length {out['mean_accepted_len']:.2f}")
            return out

        res = {"settings": {"model": path, "mtp": k, "threads": threads, "prompt_tokens": prompt_tokens,
                            "gen_tokens": gen_tokens, "kv_type": kv_type, "seed": seed},
               "plain": {"decode_tps": plain_tps or 0.0, "speedup": 1.0, "same_tokens": True}}
        log(f"  {'mtp 0':14s} {res['plain']['decode_tps']:8.2f} tok/s")
        res["natural"] = run("mtp head", None)
        res["forced"] = [{"rate": r, **run(f"forced {r:.2f}", b.forced(lambda pos, r=r: r, int(r * 1000)))}
                         for r in rates]
        res["break_even"] = _break_even([(f["rate"], f["speedup"]) for f in res["forced"]])
        return res
    finally:
        b.model.close()


SWITCH_RATES = (0.2, 0.95)    # bench model --mtp auto: the switching schedule's two acceptance rates
SWITCH_EVERY = 64             # ... and its phase length in generated tokens
MTP_AUTO_ROWS = ("natural", "forced", "switching")   # bench model --mtp auto --mtp-rows: the rows it can run


def bench_mtp_auto(path: str, k_max: int = 3, threads: int = 2, prompt_tokens: int = 128, gen_tokens: int = 512,
                   kv_type: str = "f16", seed: int = 0, rates=MTP_RATES, log=print, rounds: int = 1,
                   rows=MTP_AUTO_ROWS) -> dict:
    """`strata bench model --mtp auto`: --mtp auto next to every fixed k in 0..k_max, one loaded model, side
    by side: with the head's own drafts ("natural"), at each forced acceptance rate, and on a schedule that
    switches the forced rate between SWITCH_RATES every SWITCH_EVERY generated tokens.
    {"settings", "natural": {"auto": RUN, "fixed": {"0": RUN, ...}}, "forced": [{"rate", "auto", "fixed"}],
    "switching": {"auto", "fixed"}}; RUN as bench_mtp's, plus mtp_k (auto's mean k) and vs_best_fixed / vs_each
    (auto's tokens/s over the best fixed k's, and over each). With rounds > 1 every row runs that many times,
    auto first in odd rounds and last in even ones (a host whose speed drifts then favours neither); "auto" and
    "fixed" are the first round's RUNs, "rounds" every round's tokens/s and ratios, and vs_best_fixed / vs_each
    the medians of the rounds' ratios. `rows`: which of MTP_AUTO_ROWS to run (the others are left out of the
    result), e.g. only the switching schedule on a slow model."""
    if not rows or any(r not in MTP_AUTO_ROWS for r in rows):
        raise BenchError(f"--mtp-rows {','.join(rows)}: give some of {', '.join(MTP_AUTO_ROWS)}")
    if k_max < 1 or prompt_tokens < 1 or gen_tokens < 2 or rounds < 1:
        raise BenchError(f"--mtp-max must be >= 1, --prompt-tokens >= 1, --gen-tokens >= 2 and --rounds >= 1 (got "
                         f"{k_max}, {prompt_tokens}, {gen_tokens}, {rounds})")
    b = _MTPBench(path, k_max, threads, prompt_tokens, gen_tokens, kv_type, seed, log,
                  f"--mtp auto (max {k_max}) next to fixed k 0..{k_max}", mtp_max=k_max)
    try:
        def run(label, mtp, make_hook):
            out = b.run(label, mtp, make_hook() if make_hook else None)
            log(f"  {label:22s} {out['decode_tps']:8.2f} tok/s  accepted {out['drafts_accepted']}/"
                f"{out['drafts_proposed']}" + (f"  mean k {out['mtp_k']:.2f}" if mtp == "auto" else ""))
            return out

        def one_round(name, make_hook, auto_first):
            fixed = {}
            auto = run(f"{name} auto", "auto", make_hook) if auto_first else None
            for k in range(k_max + 1):
                fixed[str(k)] = run(f"{name} k={k}", k, make_hook)
            if not auto_first:
                auto = run(f"{name} auto", "auto", make_hook)
            best = max(r["decode_tps"] for r in fixed.values())
            a = auto["decode_tps"]
            return {"auto": auto, "fixed": fixed, "vs_best_fixed": a / best if best else None,
                    "vs_each": {k: (a / r["decode_tps"] if r["decode_tps"] else None) for k, r in fixed.items()}}

        def side_by_side(name, make_hook):
            done = [one_round(name if rounds == 1 else f"{name} r{i + 1}", make_hook, i % 2 == 0)
                    for i in range(rounds)]
            row = dict(done[0])
            row["same_tokens"] = all(d["auto"]["same_tokens"] and all(f["same_tokens"] for f in d["fixed"].values())
                                     for d in done)
            if rounds > 1:
                row["rounds"] = [_mtp_round(d) for d in done]
                med = lambda xs: float(np.median(xs)) if all(x is not None for x in xs) else None  # noqa: E731
                row["vs_best_fixed"] = med([d["vs_best_fixed"] for d in done])
                row["vs_each"] = {k: med([d["vs_each"][k] for d in done]) for k in row["vs_each"]}
            return row

        res = {"settings": {"model": path, "mtp": "auto", "mtp_max": k_max, "threads": threads,
                            "prompt_tokens": prompt_tokens, "gen_tokens": gen_tokens, "kv_type": kv_type, "seed": seed,
                            "switch_rates": list(SWITCH_RATES), "switch_every": SWITCH_EVERY, "rounds": rounds,
                            "rates": list(rates), "rows": list(rows)}}
        if "natural" in rows:
            res["natural"] = side_by_side("head's own", None)
        if "forced" in rows:
            res["forced"] = [{"rate": r, **side_by_side(f"forced {r:.2f}",
                                                        lambda r=r: b.forced(lambda pos: r, int(r * 1000)))}
                             for r in rates]
        if "switching" in rows:
            start = len(b.ids)
            res["switching"] = side_by_side("switching", lambda: b.forced(
                lambda pos: SWITCH_RATES[((pos - start) // SWITCH_EVERY) % 2], 7777))
        return res
    finally:
        b.model.close()


def _mtp_round(d: dict) -> dict:
    """One round of a bench_mtp_auto row as the JSON's "rounds" keep it: tokens/s and ratios."""
    return {"auto": d["auto"]["decode_tps"], "mtp_k": d["auto"].get("mtp_k"),
            "fixed": {k: r["decode_tps"] for k, r in d["fixed"].items()},
            "vs_best_fixed": d["vs_best_fixed"], "vs_each": d["vs_each"]}


def format_mtp_auto_table(res: dict) -> str:
    s = res["settings"]
    ks = [str(k) for k in range(s["mtp_max"] + 1)]
    lines = [f"{s['model']}: --mtp auto (max {s['mtp_max']}) vs fixed k, {s['prompt_tokens']}-token prompt, "
             f"{s['gen_tokens']} greedy tokens, {s['threads']} threads, kv {s['kv_type']}; decode tok/s, one run each",
             f"{'drafts':16s} {'auto':>8s} {'mean k':>7s} " + " ".join(f"{'k=' + k:>8s}" for k in ks)
             + f" {'auto/best':>10s} {'auto/worst':>11s}"]
    rows = ([("head's own", res["natural"])] if "natural" in res else []) \
        + [(f"forced {f['rate']:.2f}", f) for f in res.get("forced", [])] \
        + ([(f"switch {s['switch_rates'][0]}/{s['switch_rates'][1]}", res["switching"])] if "switching" in res else [])
    if s.get("rounds", 1) > 1:
        lines[0] = lines[0].replace("one run each", f"{s['rounds']} rounds (auto first, then last, in turn); "
                                    "each round's row, then the medians of its ratios")
    for name, r in rows:
        each = [v for v in r["vs_each"].values() if v is not None]
        flag = "" if r["same_tokens"] else "  OUTPUT DIFFERS"
        for i, rd in enumerate(r.get("rounds") or [_mtp_round(r)]):
            worst = [v for v in rd["vs_each"].values() if v is not None]
            label = f"{name} r{i + 1}" if r.get("rounds") else name
            lines.append(f"{label:16s} {rd['auto']:8.2f} {rd['mtp_k'] or 0:7.2f} "
                         + " ".join(f"{rd['fixed'][k]:8.2f}" for k in ks)
                         + f" {rd['vs_best_fixed'] or 0:10.2f} {max(worst) if worst else 0:11.2f}" + flag)
        if r.get("rounds"):
            lines.append(f"{name + ' median':24s} {'':7s} " + " ".join(f"{'':8s}" for _ in ks)
                         + f"  {r['vs_best_fixed'] or 0:10.2f} {max(each) if each else 0:11.2f}")
    return "\n".join(lines)


def _break_even(points) -> float | None:
    """The rate where speedup crosses 1, linearly interpolated (0.0 if drafting wins even at rate 0, None if it
    never wins)."""
    pts = [(r, s) for r, s in points if s is not None]
    if pts and pts[0][1] >= 1:
        return 0.0
    for (r0, s0), (r1, s1) in zip(pts, pts[1:]):
        if s0 < 1 <= s1:
            return r0 + (r1 - r0) * (1 - s0) / (s1 - s0)
    return None


def format_mtp_table(res: dict) -> str:
    s = res["settings"]
    lines = [f"{s['model']}: mtp {s['mtp']}, {s['prompt_tokens']}-token prompt, {s['gen_tokens']} greedy tokens, "
             f"{s['threads']} threads, kv {s['kv_type']}",
             f"{'drafts':16s} {'tok/s':>8s} {'speedup':>8s} {'accepted':>10s} {'mean len':>9s} {'draft ms':>9s} "
             f"{'verify ms':>10s} {'rollback ms':>12s} {'extend ms':>10s}  (per window)"]
    p = res["plain"]
    lines.append(f"{'none (mtp 0)':16s} {p['decode_tps']:8.2f} {1.0:8.2f}")
    rows = [("head's own", res["natural"])] + [(f"forced {f['rate']:.2f}", f) for f in res["forced"]]
    for name, r in rows:
        lines.append(f"{name:16s} {r['decode_tps']:8.2f} {r['speedup'] or 0:8.2f} "
                     f"{r['drafts_accepted']:>4d}/{r['drafts_proposed']:<5d} {r['mean_accepted_len']:9.2f} "
                     f"{r['draft_ms']:9.2f} {r['verify_ms']:10.2f} {r['rollback_ms']:12.3f} {r['extend_ms']:10.2f}"
                     + ("" if r["same_tokens"] else "  OUTPUT DIFFERS"))
    be = res["break_even"]
    lines.append("break-even acceptance: " + ("never reached" if be is None else f"{be:.2f}"))
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------- bench ple

def _delta(a: dict, b: dict, phase: str) -> dict:
    return {k[len(f"ple_{phase}_"):]: b[k] - a[k] for k in b if k.startswith(f"ple_{phase}_")}


def _ple_model(path: str, threads: int, mode: str, n_ctx: int, madv_random: bool = True, prefetch: bool = True,
               cache_mib: float = 0):
    """The model under test with the PLE access knobs given explicitly (strata_model_params'
    ple_madv_random / ple_prefetch / ple_cache_bytes), so a STRATA_PLE_* in the environment cannot change a
    row. The row cache is off unless cache_mib says (the sections of issue 6 measure the table's reads)."""
    from ._native import StrataError
    from .model import Model
    from . import ple

    try:
        m = Model(path, threads=threads, n_ctx=n_ctx, ple_mode=mode, ple_madv_random=madv_random,
                  ple_prefetch=prefetch, ple_cache_mib=cache_mib)
    except (StrataError, ValueError, OSError) as e:
        raise BenchError(f"Strata could not load {path}: {e}") from None
    info = ple.model_info(m)
    if not info:
        m.close()
        raise BenchError(f"{path} has no PLE table; bench ple needs a model with one (e.g. models/ple-5g.json)")
    return m, info


def _cold(info: dict) -> None:
    from . import ple
    ple.evict(info["path"], info["file_offset"], info["table_bytes"])


def bench_ple(path: str, threads: int = 2, decode_tokens: int = 32, prompt_tokens: int = 2048,
              gather_tokens: int = 18, seed: int = 0, log=print, cache_mib: float = 64.0, corpus: str | None = None,
              corpus_budgets=(1.0, 8.0, 64.0)) -> dict:
    """`strata bench ple` (issue 6; DESIGN §6, §8). Every measurement starts cold: the table's pages are
    evicted (POSIX_FADV_DONTNEED on its byte range) after a short warm-up that brings the trunk's weights
    in, so what is counted is the table's I/O. Counters come from the gather worker itself
    (Session.stats(): its /proc/thread-self/io read_bytes and getrusage faults).

      decode    `decode_tokens` single-token steps per access setting: mmap with the kernel's default
                readahead (ple_madv_random off), mmap with MADV_RANDOM, direct pread: KiB read and
                major faults per token, tokens/s, wait for the worker per token.
      prefill   one `prompt_tokens` eval (the engine runs it in steps of 512 tokens) with and without the
                WILLNEED prefetch, mmap and direct: gather (+ prefetch) seconds, bytes, faults, tokens/s.
      gather    a `gather_tokens`-token prefill (16 rows a token: 18 -> 288 rows, the seed's cold
                ~280-row gather) with and without prefetch: gather seconds.
      floor     (issue 21.3) storage bytes per decode token, cold then warm, for mmap and direct, with the
                row cache off and at `cache_mib`, against the floor of the access mode (distinct 4 KiB pages /
                512-byte sectors holding each token's rows, counted by the worker from the row ids) and the
                seed's 57 KiB; the decoded ids are the corpus's first tokens when there is one. Cold: table
                evicted, new model (empty row cache); warm: the same tokens again after a reset, nothing evicted.
      corpus    (issue 21.3) the row cache's hit rate on a text (`corpus`: .txt tokenized by the model, special
                tokens parsed, or .npy of ids) in decode steps, per budget in `corpus_budgets` MiB, with the
                storage it saves: rows x row bytes, and at the floors (pages / sectors not needed).
    Sections of issue 6 run with the row cache off (they measure the table's own reads).
    """
    from . import ple

    m, info = _ple_model(path, threads, "mmap", 4096)
    n_vocab = m.n_vocab
    m.close()
    res = {"model": path, "table_bytes": info["table_bytes"], "table_rows": info["rows"],
           "row_bytes": info["row_bytes"], "readahead_kb": ple.readahead_kb(info["path"]), "threads": threads,
           "decode": [], "prefill": [], "gather": []}
    warm = bench_prompt(n_vocab, 8, seed + 1)

    for label, mode, madv in (("mmap, default readahead", "mmap", 0), ("mmap, MADV_RANDOM", "mmap", 1),
                              ("direct pread", "direct", 1)):
        m, info = _ple_model(path, threads, mode, 4096, madv_random=bool(madv), prefetch=True)
        try:
            s = m.session()
            s.eval(warm)
            _cold(info)
            ids = bench_prompt(n_vocab, decode_tokens, seed + 2)
            a = s.stats()
            t0 = time.perf_counter()
            for t in ids:
                s.eval([t])
            dt = time.perf_counter() - t0
            d = _delta(a, s.stats(), "decode")
            n = d["tokens"]
            row = {"setting": label, "why": info["why"], "tokens": n,
                   "read_kib_per_token": d["read_bytes"] / 1024 / n, "major_faults_per_token": d["major_faults"] / n,
                   "rows_per_token": d["rows"] / n, "tok_s": n / dt, "wait_ms_per_token": 1e3 * d["wait_s"] / n,
                   "gather_ms_per_token": 1e3 * d["gather_s"] / n, "resident_pages": ple.resident(m)[0]}
            res["decode"].append(row)
            log(f"decode  {label:24s} {row['read_kib_per_token']:10.1f} KiB/token  {row['major_faults_per_token']:6.1f} "
                f"major faults/token  {row['tok_s']:6.2f} tok/s  wait {row['wait_ms_per_token']:.2f} ms/token")
        finally:
            m.close()

    for mode in ("mmap", "direct"):
        for prefetch in (0, 1):
            for key, n_tok in (("prefill", prompt_tokens), ("gather", gather_tokens)):
                m, info = _ple_model(path, threads, mode, max(4096, n_tok + 16), madv_random=True,
                                     prefetch=bool(prefetch))
                try:
                    s = m.session()
                    s.eval(warm)
                    s.reset()
                    _cold(info)
                    ids = bench_prompt(n_vocab, n_tok, seed + 3)
                    a = s.stats()
                    t0 = time.perf_counter()
                    s.eval(ids)
                    dt = time.perf_counter() - t0
                    d = _delta(a, s.stats(), "prefill")
                    row = {"mode": mode, "prefetch": bool(prefetch), "tokens": d["tokens"], "rows": d["rows"],
                           "steps": d["steps"], "gather_s": d["gather_s"], "prefetch_s": d["prefetch_s"],
                           "gather_total_s": d["gather_s"] + d["prefetch_s"], "read_bytes": d["read_bytes"],
                           "major_faults": d["major_faults"], "prefetch_pages": d["prefetch_pages"],
                           "wait_s": d["wait_s"], "tok_s": d["tokens"] / dt}
                    res[key].append(row)
                    log(f"{key:7s} {mode:6s} prefetch {'on ' if prefetch else 'off'} {row['rows']:7d} rows  gather "
                        f"{1e3 * row['gather_total_s']:9.2f} ms  {row['read_bytes'] / 2**20:8.2f} MiB read  "
                        f"{row['major_faults']:6d} major faults  {row['tok_s']:7.1f} tok/s")
                finally:
                    m.close()
    text = _corpus_ids(path, corpus, n_vocab) if corpus else None
    dec_ids = ([int(x) for x in text[:decode_tokens]] if text is not None and len(text) >= decode_tokens
               else bench_prompt(n_vocab, decode_tokens, seed + 2))
    res["seed_kib_per_token"] = SEED_MADV_RANDOM_KIB
    res["cache_mib"] = cache_mib
    res["floor"] = _ple_floor(path, threads, warm, dec_ids, cache_mib, log)
    res["decode_ids"] = "corpus" if text is not None and len(text) >= decode_tokens else "random"
    if text is not None:
        res["corpus"] = {"path": corpus, "tokens": int(len(text)),
                         "runs": [_ple_corpus_run(path, threads, text, b, log) for b in corpus_budgets]}
    return res


SEED_MADV_RANDOM_KIB = 57.0   # seed 003: cold decode KiB read per token with MADV_RANDOM (DESIGN §6)


def _corpus_ids(path: str, corpus: str, n_vocab: int) -> np.ndarray:
    """Token ids of a corpus: a .npy of ids, or a text tokenized with the model's tokenizer (special tokens
    parsed, so <|endoftext|> separates documents as in training)."""
    if corpus.endswith(".npy"):
        ids = np.load(corpus).astype(np.int64).reshape(-1)
    else:
        from .model import Model
        with open(corpus, encoding="utf-8") as f:
            text = f.read()
        with Model(path, threads=1, n_ctx=64) as m:
            ids = np.asarray(m.tokenize(text, add_special=False, parse_special=True), dtype=np.int64)
    if len(ids) == 0 or ids.min() < 0 or ids.max() >= n_vocab:
        raise BenchError(f"{corpus}: token ids must lie in [0, {n_vocab}) for this model (a .npy from another "
                         f"vocabulary?)")
    return ids.astype(np.int32)


def _floor_row(d: dict, mode: str, row_bytes: int) -> dict:
    """Per decode token: bytes read against the access mode's floor (pages for mmap, sectors for direct)."""
    n = max(d["tokens"], 1)
    unit, fk, mk = (4096, "floor_pages", "miss_pages") if mode == "mmap" else (512, "floor_sectors", "miss_sectors")
    read = d["read_bytes"] / n
    floor = d[fk] * unit / n
    miss_floor = d[mk] * unit / n
    return {"tokens": d["tokens"], "read_kib_per_token": read / 1024, "floor_kib_per_token": floor / 1024,
            "miss_floor_kib_per_token": miss_floor / 1024,
            "ratio_to_floor": read / floor if floor else None,
            "ratio_to_miss_floor": read / miss_floor if miss_floor else None,
            "vs_seed": read / 1024 / SEED_MADV_RANDOM_KIB,
            "page_floor_kib_per_token": d["floor_pages"] * 4096 / n / 1024,
            "sector_floor_kib_per_token": d["floor_sectors"] * 512 / n / 1024,
            "hit_rate": d["cache_hits"] / d["cache_lookups"] if d["cache_lookups"] else None,
            "hit_kib_per_token": d["cache_hits"] * row_bytes / n / 1024,
            "saved_floor_kib_per_token": (d[fk] - d[mk]) * unit / n / 1024,
            "major_faults_per_token": d["major_faults"] / n, "wait_ms_per_token": 1e3 * d["wait_s"] / n}


def _ple_floor(path: str, threads: int, warm: list, ids: list, cache_mib: float, log) -> list:
    out = []
    for mode in ("mmap", "direct"):
        for mib in sorted({0.0, float(cache_mib)}):
            m, info = _ple_model(path, threads, mode, 4096, cache_mib=mib)
            try:
                s = m.session()
                s.eval(warm)
                _cold(info)
                for phase in ("cold", "warm"):
                    if phase == "warm":
                        s.reset()
                        s.eval(warm)       # the same n-gram context as the cold pass
                    a = s.stats()
                    t0 = time.perf_counter()
                    for t in ids:
                        s.eval([t])
                    dt = time.perf_counter() - t0
                    row = {"mode": mode, "cache_mib": mib, "phase": phase, "why": info["why"],
                           "odirect": info["odirect"],
                           **_floor_row(_delta(a, s.stats(), "decode"), mode, info["row_bytes"]),
                           "tok_s": len(ids) / dt}
                    out.append(row)
                    log(f"floor   {mode:6s} cache {mib:6.1f} MiB {phase}  {row['read_kib_per_token']:8.2f} KiB/token read, "
                        f"floor {row['floor_kib_per_token']:6.2f} KiB ({(row['ratio_to_floor'] or 0):5.2f}x), "
                        f"{row['vs_seed']:5.2f}x the seed's {SEED_MADV_RANDOM_KIB:.0f} KiB, hit rate "
                        f"{(row['hit_rate'] or 0):.3f}")
            finally:
                m.close()
    return out


def _warm_file(path: str, offset: int, length: int) -> bool:
    """Reads the table once (sequentially) so the hit-rate runs are not timed by storage; only when it
    fits comfortably in the page cache (half of MemAvailable)."""
    try:
        with open("/proc/meminfo") as f:
            avail = next(int(l.split()[1]) * 1024 for l in f if l.startswith("MemAvailable:"))
    except (OSError, StopIteration, ValueError):
        return False
    if length > avail // 2:
        return False
    with open(path, "rb", buffering=0) as f:
        f.seek(offset)
        left = length
        while left > 0:
            b = f.read(min(left, 8 << 20))
            if not b:
                break
            left -= len(b)
    return True


def _ple_corpus_run(path: str, threads: int, ids: np.ndarray, mib: float, log) -> dict:
    from . import ple

    m, info = _ple_model(path, threads, "mmap", 256, cache_mib=mib)
    try:
        warmed = _warm_file(info["path"], info["file_offset"], info["table_bytes"])
        t0 = time.perf_counter()
        _, _, st = ple.gather(m, ids, one_token_steps=True, rows=False)
        dt = time.perf_counter() - t0
        info = ple.model_info(m)
    finally:
        m.close()
    n = len(ids)
    rb = info["row_bytes"]
    row = {"cache_mib": mib, "cache_rows": info["cache_capacity"], "cache_used": info["cache_used"],
           "cache_share_of_table": info["cache_capacity"] / info["rows"], "table_rows": info["rows"],
           "table_warmed": warmed, "tokens": n, "lookups": st["cache_lookups"], "hits": st["cache_hits"],
           "hit_rate": st["cache_hits"] / st["cache_lookups"] if st["cache_lookups"] else 0.0,
           "distinct_rows_read": st["cache_lookups"] - st["cache_hits"],
           "saved_row_bytes": st["cache_hits"] * rb, "saved_row_bytes_per_token": st["cache_hits"] * rb / n,
           "saved_page_bytes_per_token": (st["floor_pages"] - st["miss_pages"]) * 4096 / n,
           "saved_sector_bytes_per_token": (st["floor_sectors"] - st["miss_sectors"]) * 512 / n,
           "page_floor_bytes_per_token": st["floor_pages"] * 4096 / n,
           "sector_floor_bytes_per_token": st["floor_sectors"] * 512 / n,
           "page_floor_with_cache_bytes_per_token": st["miss_pages"] * 4096 / n,
           "sector_floor_with_cache_bytes_per_token": st["miss_sectors"] * 512 / n, "seconds": dt}
    log(f"corpus  {n:,} tokens, cache {mib:g} MiB ({row['cache_rows']:,} rows, {100 * row['cache_share_of_table']:.2f} % "
        f"of the table): hit rate {row['hit_rate']:.4f}, saves {row['saved_row_bytes_per_token']:.0f} B of rows, "
        f"{row['saved_page_bytes_per_token'] / 1024:.2f} KiB of pages, {row['saved_sector_bytes_per_token'] / 1024:.2f} "
        f"KiB of sectors per token")
    return row


def format_ple_table(res: dict) -> str:
    out = [f"{res['model']}: PLE table {res['table_bytes'] / 1e9:.2f} GB, {res['table_rows']:,} rows x "
           f"{res['row_bytes']} bytes; read_ahead_kb {res['readahead_kb']}; cold = table pages evicted first"]
    out.append("decode (per token)          KiB read  major faults   tok/s  wait ms")
    for r in res["decode"]:
        out.append(f"  {r['setting']:24s} {r['read_kib_per_token']:10.1f} {r['major_faults_per_token']:13.1f} "
                   f"{r['tok_s']:7.2f} {r['wait_ms_per_token']:8.2f}")
    for key in ("prefill", "gather"):
        rows = res[key]
        out.append(f"{key} ({rows[0]['tokens']} tokens, {rows[0]['rows']} rows)   gather ms   MiB read  major faults  tok/s")
        for r in rows:
            out.append(f"  {r['mode']:6s} prefetch {'on ' if r['prefetch'] else 'off'}  {1e3 * r['gather_total_s']:11.2f} "
                       f"{r['read_bytes'] / 2**20:10.2f} {r['major_faults']:13d} {r['tok_s']:6.1f}")
        by = {(r["mode"], r["prefetch"]): r["gather_total_s"] for r in rows}
        for mode in ("mmap", "direct"):
            if by.get((mode, True)):
                out.append(f"  {mode}: WILLNEED speeds the cold gather up {by[(mode, False)] / by[(mode, True)]:.1f}x")
    if res.get("floor"):
        out.append(f"decode storage per token vs the floor ({res['decode_ids']} ids; floor: distinct 4 KiB pages for mmap, "
                   f"512-byte sectors for direct; seed {res['seed_kib_per_token']:.0f} KiB)")
        out.append("  mode   cache MiB  phase   KiB read  floor KiB  x floor  x seed  hit rate  saved KiB (floor)")
        for r in res["floor"]:
            out.append(f"  {r['mode']:6s} {r['cache_mib']:9.1f}  {r['phase']:5s} {r['read_kib_per_token']:10.2f} "
                       f"{r['floor_kib_per_token']:10.2f} {(r['ratio_to_floor'] or 0):8.2f} {r['vs_seed']:7.2f} "
                       f"{'-' if r['hit_rate'] is None else format(r['hit_rate'], '8.3f'):>9s} "
                       f"{r['saved_floor_kib_per_token']:10.2f}")
    if res.get("corpus"):
        c = res["corpus"]
        out.append(f"row cache on {c['path']} ({c['tokens']:,} tokens, decode steps)")
        out.append("  cache MiB    rows  % table  hit rate  saved B rows/token  saved KiB pages/token  saved KiB sectors/token")
        for r in c["runs"]:
            out.append(f"  {r['cache_mib']:9g} {r['cache_rows']:7d} {100 * r['cache_share_of_table']:8.2f} {r['hit_rate']:9.4f} "
                       f"{r['saved_row_bytes_per_token']:19.0f} {r['saved_page_bytes_per_token'] / 1024:22.2f} "
                       f"{r['saved_sector_bytes_per_token'] / 1024:24.2f}")
    return "\n".join(out)
