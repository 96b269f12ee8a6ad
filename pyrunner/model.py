"""model.py — a qwen4exp model and its sessions (DESIGN §9 names).

    model = Model("m.gguf", threads=2, n_ctx=4096, kv_type="f32")
    sess = model.session()
    last = sess.eval(model.tokenize("Hello"))          # (n_vocab,) float32
    more = sess.eval([42, 7], all_logits=True)         # (2, n_vocab), continues the sequence

The weights and every FLOP live in libstrata (native/src/model); this module owns the handles,
the tokenizer and metadata a user touches, and the generation entry points (pyrunner.generate).
"""
from __future__ import annotations

import os

import numpy as np

from ._native import check, ffi, lib

KV_TYPES = {"f32": lib.STRATA_KV_F32, "f16": lib.STRATA_KV_F16, "int8": lib.STRATA_KV_INT8}
DEVICES = {"cpu": lib.STRATA_DEVICE_CPU, "sim": lib.STRATA_DEVICE_SIM, "cuda": lib.STRATA_DEVICE_CUDA}
# Offload counters (strata_offload_stats) -> the DESIGN §9 stats keys where one exists.
_OFFLOAD_KEYS = {"cache_hits": "cache_hits", "cache_lookups": "cache_lookups", "cache_swaps": "cache_swaps",
                 "pcie_groups": "pcie_groups", "pcie_bytes": "pcie_bytes", "cpu_groups": "cpu_groups",
                 "cpu_s": "cpu_s", "skipped_experts": "skipped_experts", "cpu_bytes": "cpu_bytes",
                 "copy_s": "copy_s", "device_s": "device_s", "cache_admits": "cache_admits", "windows": "windows",
                 "prefill_chunks": "prefill_chunks", "borrowed_slots": "borrowed_slots",
                 "copy_bytes": "copy_bytes"}


def _env_float(name: str):
    v = os.environ.get(name)
    if v in (None, ""):
        return None
    try:
        return float(v)
    except ValueError:
        raise ValueError(f"{name}={v!r} is not a number") from None


PLE_MODES = {"auto": lib.STRATA_PLE_AUTO, "mmap": lib.STRATA_PLE_MMAP, "direct": lib.STRATA_PLE_DIRECT}


def _ple_mode(name: str) -> int:
    try:
        return PLE_MODES[name]
    except KeyError:
        raise ValueError(f"ple_mode {name!r}: choose one of {', '.join(PLE_MODES)}") from None


def _kv_type(name: str) -> int:
    try:
        return KV_TYPES[name]
    except KeyError:
        raise ValueError(f"kv_type {name!r}: choose one of {', '.join(KV_TYPES)}") from None


class Model:
    """A loaded qwen4exp GGUF. Weights stay mapped from the file; sessions hold sequence state."""

    def __init__(self, path, threads: int | None = None, n_ctx: int = 32768, device: str = "cpu",
                 cache_gib: float | None = None, pcie_frac: float | None = None, kv_type: str = "f16",
                 mtp: int = 0, ple_mode: str = "auto", prefill_chunk: int = 8192,
                 sim_link_gbps: float | None = None, tail_skip: int | None = None,
                 prefill_stream_min: int | None = None, expert_pack: str | None = "auto"):
        """device: "cpu" (every expert on the CPU pool), "sim" (a simulated GPU: host memory, a
        copy engine of sim_link_gbps GB/s, default 16) or "cuda"; cache_gib: device memory for
        resident experts; pcie_frac: share of missing experts sent over the link (None: from the
        link probe, then adapted by pyrunner.controller during generation); tail_skip: rank K from
        which a non-resident expert is skipped (None: STRATA_ROUTE_TAIL_SKIP, else DESIGN §4's
        default: 7 on the offload path while the cache holds < 90 % of expert bytes, off on cpu);
        prefill_stream_min: a forward step of at least this many tokens streams every missing expert
        through the device's staging ring, borrowing cache slots (default 1024); expert_pack: the
        expert pack copies read from ("auto": built next to the model on first use with a device, see
        pyrunner.expert_pack; None: copy each expert's pieces from the GGUF)."""
        path = os.fspath(path)
        if device not in DEVICES:
            raise ValueError(f"device {device!r}: choose one of {', '.join(DEVICES)}")
        if n_ctx <= 0:
            raise ValueError(f"n_ctx must be positive (got {n_ctx})")
        if prefill_chunk <= 0:
            raise ValueError(f"prefill_chunk must be positive (got {prefill_chunk})")
        if cache_gib is not None and cache_gib < 0:
            raise ValueError(f"cache_gib must be >= 0 (got {cache_gib})")
        if pcie_frac is not None and not 0.0 <= pcie_frac <= 1.0:
            raise ValueError(f"pcie_frac must be in [0, 1] (got {pcie_frac})")
        if not os.path.exists(path):
            raise FileNotFoundError(f"model file {path!r} does not exist")
        if tail_skip is None:
            env = os.environ.get("STRATA_ROUTE_TAIL_SKIP")
            tail_skip = int(env) if env not in (None, "") else -1
        if sim_link_gbps is None:
            sim_link_gbps = _env_float("STRATA_SIM_LINK_GBPS") or 16.0
        self.path = path
        self.device = device
        self.kv_type = kv_type
        self.prefill_chunk = int(prefill_chunk)
        self.pcie_frac_fixed = pcie_frac is not None
        p = ffi.new("strata_model_params *", lib.strata_model_default_params())
        p.n_threads = int(threads or 0)
        p.n_ctx = int(n_ctx)
        p.kv_type = _kv_type(kv_type)
        p.ple_mode = _ple_mode(ple_mode)
        p.n_ubatch = min(512, self.prefill_chunk)
        p.device = DEVICES[device]
        p.cache_bytes = int((cache_gib or 0) * (1 << 30))
        p.pcie_frac = -1.0 if pcie_frac is None else float(pcie_frac)
        p.sim_link_gbps = float(sim_link_gbps)
        p.tail_skip = int(tail_skip)
        if prefill_stream_min is not None:
            p.prefill_stream_min = int(prefill_stream_min)
        self.expert_pack = None
        if expert_pack is not None and device != "cpu":
            from . import expert_pack as xp
            self.expert_pack = xp.ensure(path) if expert_pack == "auto" else os.fspath(expert_pack)
            self._pack_arg = ffi.new("char[]", self.expert_pack.encode())   # lives as long as the load
            p.expert_pack = self._pack_arg
        out = ffi.new("strata_model **")
        check(lib.strata_model_load(path.encode(), p, out))
        self._ptr = ffi.gc(out[0], lib.strata_model_free)
        info = ffi.new("strata_model_info *")
        check(lib.strata_model_get_info(self._ptr, info))
        self.n_vocab = int(info.n_vocab)
        self.n_embd = int(info.n_embd)
        self.n_layer = int(info.n_layer)
        self.n_ctx = int(info.n_ctx)
        self.n_ctx_train = int(info.n_ctx_train)
        self.n_threads = int(info.n_threads)
        self.weight_bytes = int(info.weight_bytes)
        self.state_bytes = int(info.state_bytes)
        self.ple_layer = int(info.ple_layer)
        self.has_ple = self.ple_layer >= 0
        self._metadata = None
        self._tokenizer = None
        self._sessions = []

    # ------------------------------------------------------------------ metadata and tokens
    @property
    def metadata(self) -> dict:
        if self._metadata is None:
            from .gguf import GGUFFile
            self._metadata = GGUFFile(self.path).metadata()
        return self._metadata

    @property
    def tokenizer(self):
        if self._tokenizer is None:
            from .tokenizer import Tokenizer
            self._tokenizer = Tokenizer.from_metadata(self.metadata, source=self.path)
        return self._tokenizer

    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = True) -> list[int]:
        return self.tokenizer.tokenize(text, add_special=add_special, parse_special=parse_special)

    def detokenize(self, ids) -> str:
        return self.tokenizer.detokenize(ids)

    # ------------------------------------------------------------------ offload engine
    @property
    def offload_log(self) -> str:
        """How the offload engine was set up: device, slots, link probe, pcie_frac, tail skip and why."""
        return ffi.string(lib.strata_model_offload_log(self._ptr)).decode()

    def offload_stats(self) -> dict:
        """Cumulative offload counters since load (take differences per request)."""
        st = ffi.new("strata_offload_stats *")
        check(lib.strata_model_offload_stats(self._ptr, st))
        out = {k: getattr(st, f) for f, k in _OFFLOAD_KEYS.items()}
        out["pcie_frac"] = float(st.pcie_frac)
        out["tail_skip"] = int(st.tail_skip)
        out["cache_slots"] = int(st.cache_slots)
        out["staging_slots"] = int(st.staging_slots)
        out["slot_bytes"] = int(st.slot_bytes)
        out["probe_gbps"] = float(st.probe_gbps)
        return out

    def trace_routing(self, path) -> None:
        """Write every MoE layer's routing per window to `path` as JSON lines (None stops); the
        format is pyrunner.cachesim's, so `strata cache-sim` can replay it."""
        check(lib.strata_model_trace_routing(self._ptr, os.fspath(path).encode() if path is not None else ffi.NULL))

    def device_events(self, path=None) -> None:
        """Device event log (sim): device_events() starts recording; device_events(path) writes the
        copies and computations recorded since (JSON lines) and stops."""
        check(lib.strata_model_device_events(self._ptr, os.fspath(path).encode() if path is not None else ffi.NULL))

    def set_pcie_frac(self, frac: float) -> None:
        check(lib.strata_model_set_pcie_frac(self._ptr, float(frac)))

    # ------------------------------------------------------------------ sessions
    def session(self) -> "Session":
        s = Session(self)
        self._sessions.append(s)
        return s

    # ------------------------------------------------------------------ generation (pyrunner.generate)
    def generate(self, prompt, **kw):
        from . import generate
        return generate.generate(self, prompt, **kw)

    def create_completion(self, prompt, **kw):
        from . import generate
        return generate.create_completion(self, prompt, **kw)

    def create_chat_completion(self, messages, **kw):
        from . import generate
        return generate.create_chat_completion(self, messages, **kw)

    # ------------------------------------------------------------------ lifetime
    def close(self) -> None:
        """Frees the sessions and the model now (otherwise the garbage collector does)."""
        for s in self._sessions:
            s.close()
        self._sessions = []
        if getattr(self, "_ptr", None) is not None:
            ptr, self._ptr = self._ptr, None
            ffi.release(ptr)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        return (f"Model({self.path!r}, n_vocab={self.n_vocab}, n_layer={self.n_layer}, n_ctx={self.n_ctx}, "
                f"kv_type={self.kv_type!r}, threads={self.n_threads})")


class Session:
    """One sequence's state: eval() appends tokens and returns logits."""

    def __init__(self, model: Model):
        if model._ptr is None:
            raise RuntimeError("the model is closed")
        self.model = model
        out = ffi.new("strata_session **")
        check(lib.strata_session_init(model._ptr, out))
        self._ptr = ffi.gc(out[0], lib.strata_session_free)

    @property
    def n_past(self) -> int:
        return int(lib.strata_session_n_past(self._live()))

    def _live(self):
        if self._ptr is None or self.model._ptr is None:
            raise RuntimeError("this session (or its model) is closed")
        return self._ptr

    def reset(self) -> None:
        lib.strata_session_reset(self._live())

    def stats(self) -> dict:
        """PLE counters since the session was created (DESIGN §9 keys ple_rows, ple_read_bytes,
        ple_major_faults, ple_wait_s for prefill + decode, then the same and more per phase as
        ple_prefill_* / ple_decode_*; a one-token step is decode; see pyrunner.ple), and, when experts
        run on a device or are skipped, the model's offload counters since load (cache_hits,
        cache_lookups, hit_rate, cache_swaps, pcie_groups, pcie_bytes, cpu_groups, cpu_s,
        skipped_experts, pcie_frac, ...; the device and its cache are shared by the model's sessions)."""
        from . import ple
        out = ple.session_stats(self)
        off = self.model.offload_stats()
        if self.model.device != "cpu" or off["skipped_experts"]:
            off["hit_rate"] = off["cache_hits"] / off["cache_lookups"] if off["cache_lookups"] else 0.0
            out.update(off)
        return out

    def eval(self, token_ids, all_logits: bool = False) -> np.ndarray:
        """Runs token_ids after the tokens already seen. Returns the last position's logits
        (n_vocab,) float32, or (len(token_ids), n_vocab) with all_logits=True."""
        ptr = self._live()
        ids = np.ascontiguousarray(np.asarray(token_ids, dtype=np.int64).reshape(-1))
        if ids.size == 0:
            raise ValueError("eval needs at least one token id")
        if ids.min() < 0 or ids.max() >= self.model.n_vocab:
            bad = int(ids[(ids < 0) | (ids >= self.model.n_vocab)][0])
            raise ValueError(f"token id {bad} is outside the vocabulary (0..{self.model.n_vocab - 1})")
        ids32 = ids.astype(np.int32)
        V = self.model.n_vocab
        out = np.empty((ids.size, V) if all_logits else (V,), dtype=np.float32)
        check(lib.strata_session_eval(ptr, ffi.cast("const int32_t *", ids32.ctypes.data), ids.size,
                                      1 if all_logits else 0, ffi.cast("float *", out.ctypes.data), out.size))
        return out

    def close(self) -> None:
        if self._ptr is not None:
            ptr, self._ptr = self._ptr, None
            ffi.release(ptr)
