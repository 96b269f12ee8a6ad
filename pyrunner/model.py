"""model.py — a qwen4exp model and its sessions (DESIGN §9 names).

    model = Model("m.gguf", threads=2, n_ctx=4096, kv_type="f32")
    sess = model.session()
    last = sess.eval(model.tokenize("Hello"))          # (n_vocab,) float32
    more = sess.eval([42, 7], all_logits=True)         # (2, n_vocab), continues the sequence

The weights and every FLOP live in libstrata (native/src/model); this module owns the handles,
the tokenizer and metadata a user touches, and the generation entry points (pyrunner.generate).
"""
from __future__ import annotations

import functools
import inspect
import math
import numbers
import os
import threading
import warnings

import numpy as np

from . import generate as _generate
from . import settings
from ._native import StrataError, check, check_settings, ffi, lib

KV_TYPES = {"f32": lib.STRATA_KV_F32, "f16": lib.STRATA_KV_F16, "int8": lib.STRATA_KV_INT8}
DEVICES = {"cpu": lib.STRATA_DEVICE_CPU, "sim": lib.STRATA_DEVICE_SIM, "cuda": lib.STRATA_DEVICE_CUDA}
# Offload counters (strata_offload_stats) -> the DESIGN §9 stats keys where one exists.
_OFFLOAD_KEYS = {"cache_hits": "cache_hits", "cache_lookups": "cache_lookups", "cache_swaps": "cache_swaps",
                 "pcie_groups": "pcie_groups", "pcie_bytes": "pcie_bytes", "cpu_groups": "cpu_groups",
                 "cpu_s": "cpu_s", "skipped_experts": "skipped_experts", "cpu_bytes": "cpu_bytes",
                 "copy_s": "copy_s", "device_s": "device_s", "cache_admits": "cache_admits", "windows": "windows",
                 "prefill_chunks": "prefill_chunks", "borrowed_slots": "borrowed_slots",
                 "copy_bytes": "copy_bytes", "cache_group_hits": "cache_group_hits",
                 "cache_group_lookups": "cache_group_lookups", "act_bytes": "act_bytes",
                 "dense_weight_bytes": "dense_weight_bytes", "dense_h2d_bytes": "dense_h2d_bytes",
                 "dense_d2h_bytes": "dense_d2h_bytes"}


EXPERT_IO = {"auto": lib.STRATA_EXPERT_IO_AUTO, "mmap": lib.STRATA_EXPERT_IO_MMAP, "direct": lib.STRATA_EXPERT_IO_DIRECT}
EXPERT_IO_BACKENDS = {"auto": 0, "io_uring": 1, "pread": 2}
SPLITS = {"seed": lib.STRATA_SPLIT_SEED, "online": lib.STRATA_SPLIT_ONLINE}
# where the dense forward runs (strata.h strata_dense); "emu": the GPU forward emulated on the host (tests)
DENSE = {"auto": lib.STRATA_DENSE_AUTO, "cpu": lib.STRATA_DENSE_CPU, "device": lib.STRATA_DENSE_DEVICE,
         "emu": lib.STRATA_DENSE_EMU}
CACHE_AUTO = 2**64 - 1   # strata.h STRATA_CACHE_AUTO: fit the expert cache into what the GPU has left
_STORE_KEYS = ("active", "ram_slots", "ram_bytes", "ram_lookups", "ram_hits", "ram_groups", "ram_group_hits",
               "ram_miss_bytes", "read_bytes", "reads", "evictions", "bypassed", "read_s", "prefetch_experts",
               "prefetch_bytes", "prefetch_unused_experts", "prefetch_unused_bytes", "predicted", "predicted_right")


def _buf(ctype: str, a: np.ndarray):
    """A pointer to a contiguous array's data for a C call (ffi.from_buffer: a quarter of the cost of
    a.ctypes.data, which a small model's decode step pays several times a token)."""
    return ffi.from_buffer(ctype, a)


def cache_policies() -> list[str]:
    """The replacement policies of the expert store's RAM slots (--cache-policy), the default first."""
    return ffi.string(lib.strata_cache_policies()).decode().split(",")


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


def _amount(name: str, v, unit: str, zero_ok: bool = True, shift: int = 0) -> float:
    """A size or rate argument checked: a finite number, >= 0 (> 0 unless zero_ok), and, as bytes
    (v * 2**shift), within what the library's 64-bit fields hold. NaN compares false with every bound, so
    without this it passed the range checks and failed later with a message that named no argument."""
    ok = isinstance(v, numbers.Real) and not isinstance(v, bool) and math.isfinite(v) and (v >= 0 if zero_ok else v > 0)
    if not ok:
        raise ValueError(f"{name} must be a number of {unit} {'>= 0' if zero_ok else '> 0'} (got {v!r})")
    if shift and v * 2.0 ** shift >= 2.0 ** 63:
        raise ValueError(f"{name} = {v} {unit} is more than any machine holds (the limit is 2**63 bytes)")
    return float(v)


def _warn_threads_over_cores(threads) -> None:
    """Warns when threads asks for more workers than the cores this process may run on (its CPU
    affinity, which taskset and cgroup cpusets narrow, not os.cpu_count()): the pool's threads then
    take turns on a core and every barrier of every step waits for the one descheduled."""
    cores = len(os.sched_getaffinity(0))
    if threads and int(threads) > cores:
        # the default filter shows this once per call site, as the n_ctx warning below
        warnings.warn(f"--threads {int(threads)}: this machine has {cores} core{'s' if cores != 1 else ''}; "
                      f"more threads than cores slow every step", UserWarning, stacklevel=3)


# The longest default context: libstrata's default n_ctx (32768), so both sides agree on one number.
N_CTX_DEFAULT_MAX = int(lib.strata_model_default_params().n_ctx)


def trained_context(metadata) -> int | None:
    """The context the model was trained on: `<arch>.context_length` (None when the file has none).
    metadata: a dict, or anything with .get(key, default) (a GGUFFile reads just those two keys)."""
    v = metadata.get(f"{metadata.get('general.architecture', 'qwen4exp')}.context_length", None)
    return int(v) if isinstance(v, (int, np.integer)) and v > 0 else None


def _model_method(fn):
    """A Model method that is pyrunner.generate's `fn` with the model as its first argument: the
    same parameters, defaults and docstring, so help() and inspect.signature() show them."""
    @functools.wraps(fn)
    def method(self, *args, **kwargs):
        return fn(self, *args, **kwargs)
    sig = inspect.signature(fn)
    first, *rest = sig.parameters.values()
    method.__signature__ = sig.replace(parameters=[first.replace(name="self"), *rest])
    return method


class Model:
    """A loaded qwen4exp GGUF. Weights stay mapped from the file; sessions hold sequence state."""

    def __init__(self, path=None, threads: int | None = None, n_ctx: int | None = None, device: str = "cpu",
                 cache_gib: float | None = None, pcie_frac: float | None = None, kv_type: str = "f16",
                 mtp: int | str = "auto", ple_mode: str = "auto", prefill_chunk: int = 8192,
                 sim_link_gbps: float | None = None, tail_skip: int | None = None,
                 prefill_stream_min: int | None = None, expert_pack: str | None = "auto", *,
                 max_swaps: int | None = None,
                 model_path=None, ple_madv_random: bool | None = None, ple_prefetch: bool | None = None,
                 ple_step_timeout_s: float | None = None, repack: bool | None = None, mtp_max: int = 3,
                 expert_io: str = "auto", ram_gib: float | None = None, cache_policy: str | None = None,
                 expert_io_depth: int | None = None, expert_io_backend: str = "auto", expert_prefetch: bool | int = True,
                 split: str | None = None, ple_cache_mib: float | None = None, dense: str | None = None,
                 vram_gib: float | None = None, prefill_f16: bool = False):
        """path (or model_path=, llama-cpp-python's name for it): the GGUF, or the first file of a
        split set. n_ctx: tokens a session holds; None: the model's trained context (the file's
        `<arch>.context_length`), at most 32768; more than the trained context warns (the model never
        saw such positions). device: "cpu" (every expert on the CPU pool), "sim" (a simulated GPU:
        host memory, a copy engine of sim_link_gbps GB/s, default 16) or "cuda"; cache_gib: device
        memory for resident experts; pcie_frac: share of missing experts sent over the link (None: from the
        link probe, then adapted by pyrunner.controller during generation); tail_skip: rank K from
        which a non-resident expert is skipped (None: STRATA_ROUTE_TAIL_SKIP, else DESIGN §4's
        default: 7 on the offload path while the cache holds < 90 % of expert bytes, off on cpu);
        prefill_stream_min: a forward step of at least this many tokens streams every missing expert
        through the device's staging ring, borrowing cache slots (default 1024); expert_pack: the
        expert pack copies read from ("auto": built next to the model on first use with a device, see
        pyrunner.expert_pack; None: copy each expert's pieces from the GGUF); max_swaps: expert-cache swaps per
        adjustment round at most (default 96). ple_madv_random (default
        True: MADV_RANDOM on the mapped PLE table; False: the kernel's readahead), ple_prefetch (default
        True: WILLNEED a prefill step's table pages first), ple_step_timeout_s (default 300: an eval
        fails when the PLE gather worker takes longer), ple_cache_mib (default 64; 0 = off: the PLE row
        cache, RAM for table rows kept by row id, so gathers read only the rows it misses). repack (default True; STRATA_REPACK, --no-repack):
        prefill products of IQ2_XXS / IQ2_XS / IQ3_XXS weights on the avx512 path decode 16 rows at a
        time into a per-thread int16 scratch first (repack_bytes, reported at start; results bit-identical,
        strata.h strata_set_repack). It is process-wide: the last Model to set it decides. mtp: the drafts
        per verify window generate() uses with the model's MTP head ("auto", the default: chosen window by
        window, 0 to mtp_max, from the costs and acceptance the request measures, pyrunner.mtp.DraftPolicy;
        a count; 0: off); a model without a head decodes without drafts whatever it says.
        expert_io: how routed experts are read ("mmap": in place through the page cache; "direct": O_DIRECT
        reads into RAM slots the engine owns, a replacement policy keeping the hot ones; "auto", the
        default: direct when the experts do not fit in the RAM the process may use — Model.store_log says
        what was chosen and why); ram_gib: the RAM slots' budget (None: what the process may use, minus
        dense weights, state and a margin); cache_policy: their replacement policy (None: the default;
        pyrunner.model.cache_policies() lists them); expert_io_depth: reads in flight (default 32);
        expert_io_backend: "auto" (io_uring, else a pool of pread threads), "io_uring" or "pread";
        expert_prefetch (default True: the library's 2 ranks; an int: that many; False or 0: off): with direct
        reads, while layer l computes, read ahead the experts layer l+1's router ranks best for each token of
        layer l's MoE input. split: how the share of missing experts sent over the link is chosen on a
        device ("online", the default: one share per MoE layer, moved by what that layer's decode windows
        cost, strata.h strata_split; "seed": one share, from the probe and pyrunner.controller's three
        updates; None: "seed" when pcie_frac is given, which then stays fixed, else "online"). dense: where the
        dense forward runs ("auto", the default: on the GPU with device "cuda", else the CPU; "cpu";
        "device"; "emu": the GPU forward with every kernel emulated on the host, for tests — strata.h
        strata_dense; the CLI's --dense, STRATA_DENSE); vram_gib: GPU memory Strata may use in all (None: what is free); with the dense forward
        on a GPU and cache_gib None the expert cache takes what is left (Model.device_log says how much).
        prefill_f16: the device forward's prefill products on cuBLAS's f16 tensor-core path (faster; a row's
        sums then depend on its step's other rows; strata.h prefill_f16); False keeps them batch-invariant.

        Every argument left None comes from the environment through pyrunner.settings (threads:
        STRATA_THREADS, tail_skip: STRATA_ROUTE_TAIL_SKIP, sim_link_gbps: STRATA_SIM_LINK_GBPS, the
        ple_* ones: STRATA_PLE_*), and when that is unset from libstrata's
        strata_model_default_params(): the defaults have one owner."""
        check_settings()   # a bad STRATA_ISA / STRATA_GEMM (settings.py), said before anything loads
        if path is not None and model_path is not None:
            raise TypeError("Model(): give the GGUF as path or as model_path, not both")
        if path is None and model_path is None:
            raise TypeError("Model(): give the GGUF's path, e.g. Model('m.gguf')")
        path = os.fspath(path if path is not None else model_path)
        if device not in DEVICES:
            raise ValueError(f"device {device!r}: choose one of {', '.join(DEVICES)}")
        if n_ctx is not None and n_ctx <= 0:
            raise ValueError(f"n_ctx must be positive (got {n_ctx})")
        if prefill_chunk <= 0:
            raise ValueError(f"prefill_chunk must be positive (got {prefill_chunk})")
        if cache_gib is not None:
            cache_gib = _amount("cache_gib", cache_gib, "GiB", shift=30)
        if dense is None:
            dense = "auto"
        if dense not in DENSE:
            raise ValueError(f"dense {dense!r}: choose one of {', '.join(DENSE)}")
        if vram_gib is not None:
            vram_gib = _amount("vram_gib", vram_gib, "GiB", zero_ok=False, shift=30)
        if pcie_frac is not None and not 0.0 <= pcie_frac <= 1.0:
            raise ValueError(f"pcie_frac must be in [0, 1] (got {pcie_frac})")
        if split is None:
            split = "seed" if pcie_frac is not None else "online"
        if split not in SPLITS:
            raise ValueError(f"split {split!r}: choose one of {', '.join(SPLITS)}")
        if expert_io not in EXPERT_IO:
            raise ValueError(f"expert_io {expert_io!r}: choose one of {', '.join(EXPERT_IO)}")
        if expert_io_backend not in EXPERT_IO_BACKENDS:
            raise ValueError(f"expert_io_backend {expert_io_backend!r}: choose one of {', '.join(EXPERT_IO_BACKENDS)}")
        if ram_gib is not None:
            ram_gib = _amount("ram_gib", ram_gib, "GiB", zero_ok=False, shift=30)
        if ram_gib is not None and expert_io == "mmap":
            raise ValueError("ram_gib sizes the RAM slots of expert_io 'direct' (or 'auto'); with 'mmap' the page "
                             "cache holds the experts")
        if cache_policy is not None and cache_policy not in cache_policies():
            raise ValueError(f"cache_policy {cache_policy!r}: choose one of {', '.join(cache_policies())}")
        if not os.path.exists(path):
            raise FileNotFoundError(f"model file {path!r} does not exist")
        self.path = path
        self._metadata = None
        from .gguf import GGUFFile
        trained = trained_context(GGUFFile(path))   # two keys, not the whole metadata (750k tokenizer strings)
        if n_ctx is None:
            n_ctx = min(trained or N_CTX_DEFAULT_MAX, N_CTX_DEFAULT_MAX)
        if threads is None:
            threads = settings.threads()
        if tail_skip is None:
            tail_skip = settings.tail_skip()
        if sim_link_gbps is None:
            sim_link_gbps = settings.sim_link_gbps()
        if sim_link_gbps is not None:          # 0: the library's default (16), as STRATA_SIM_LINK_GBPS=0 reads
            sim_link_gbps = _amount("sim_link_gbps", sim_link_gbps, "GB/s (0: the default, 16)")
        if ple_madv_random is None:
            ple_madv_random = settings.ple_madv_random()
        if ple_prefetch is None:
            ple_prefetch = settings.ple_prefetch()
        if ple_step_timeout_s is None:
            ple_step_timeout_s = settings.ple_step_timeout_s()
        if ple_cache_mib is None:
            ple_cache_mib = settings.ple_cache_mib()
        if ple_cache_mib is not None:
            ple_cache_mib = _amount("ple_cache_mib", ple_cache_mib, "MiB (0 = off)", shift=20)
        stall_ms, stall_at = settings.ple_test_stall()
        sync_swaps = settings.sync_swaps()
        self.device = device
        self.kv_type = kv_type
        self.prefill_chunk = int(prefill_chunk)
        from .mtp import parse_mtp
        self.mtp = parse_mtp(mtp)              # drafts per verify window generate() uses (0: off; "auto")
        if int(mtp_max) < 1:
            raise ValueError(f"mtp_max must be >= 1 (got {mtp_max})")
        self.mtp_max = int(mtp_max)            # the most drafts mtp="auto" tries
        self.mtp_warm = False                  # a window with drafts has run (generate(): the first is cold)
        self.mtp_ratios: dict = {}             # --mtp auto: the last request's window costs (DraftPolicy.ratios)
        self.pcie_frac_fixed = pcie_frac is not None
        _warn_threads_over_cores(threads)
        p = ffi.new("strata_model_params *", lib.strata_model_default_params())
        p.n_threads = int(threads or 0)
        p.n_ctx = int(n_ctx)
        p.kv_type = _kv_type(kv_type)
        p.ple_mode = _ple_mode(ple_mode)
        p.n_ubatch = min(512, self.prefill_chunk)
        p.device = DEVICES[device]
        # no cache_gib with the dense forward on a GPU: the cache is fitted to what the GPU has left
        dense_on_gpu = dense in ("device", "emu") or (dense == "auto" and device == "cuda")
        p.cache_bytes = CACHE_AUTO if cache_gib is None and dense_on_gpu else int((cache_gib or 0) * (1 << 30))
        p.dense = DENSE[dense]
        if vram_gib is not None:
            p.vram_bytes = int(vram_gib * (1 << 30))
        p.prefill_f16 = int(bool(prefill_f16))
        p.pcie_frac = -1.0 if pcie_frac is None else float(pcie_frac)
        # None (argument and environment unset): the field keeps strata_model_default_params()'s value
        if sim_link_gbps is not None:
            p.sim_link_gbps = float(sim_link_gbps)
        if tail_skip is not None:
            p.tail_skip = int(tail_skip)
        if ple_madv_random is not None:
            p.ple_madv_random = int(bool(ple_madv_random))
        if ple_prefetch is not None:
            p.ple_prefetch = int(bool(ple_prefetch))
        if ple_step_timeout_s is not None:
            p.ple_step_timeout_s = float(ple_step_timeout_s)
        if ple_cache_mib is not None:
            p.ple_cache_bytes = int(float(ple_cache_mib) * (1 << 20))
        if sync_swaps is not None:
            p.sync_swaps = int(sync_swaps)
        if stall_ms is not None:
            p.ple_test_stall_ms = int(stall_ms)
        if stall_at is not None:
            p.ple_test_stall_at = int(stall_at)
        if prefill_stream_min is not None:
            p.prefill_stream_min = int(prefill_stream_min)
        if max_swaps is not None:                 # expert-cache swaps per adjustment round (default 96, DESIGN §4)
            if max_swaps < 0:
                raise ValueError(f"max_swaps must be >= 0 (got {max_swaps})")
            p.max_swaps = int(max_swaps)
        self.expert_pack = None
        if expert_pack is not None and device != "cpu" and expert_io != "direct":   # direct reads the GGUF
            from . import expert_pack as xp
            self.expert_pack = xp.ensure(path) if expert_pack == "auto" else os.fspath(expert_pack)
            self._pack_arg = ffi.new("char[]", self.expert_pack.encode())   # lives as long as the load
            p.expert_pack = self._pack_arg
        p.expert_io = EXPERT_IO[expert_io]
        p.expert_io_backend = EXPERT_IO_BACKENDS[expert_io_backend]
        if expert_prefetch is not True:          # True: the library's default ranks; False / 0: off
            if int(expert_prefetch) < 0:
                raise ValueError(f"expert_prefetch must be a count of ranks >= 0 or a bool (got {expert_prefetch})")
            p.expert_prefetch = int(expert_prefetch)
        p.split = SPLITS[split]
        self.split = split
        if ram_gib is not None:
            p.ram_bytes = int(ram_gib * (1 << 30))
        if cache_policy is not None:
            self._policy_arg = ffi.new("char[]", cache_policy.encode())   # read during the load only
            p.cache_policy = self._policy_arg
        if expert_io_depth is not None:
            if expert_io_depth < 1:
                raise ValueError(f"expert_io_depth must be >= 1 (got {expert_io_depth})")
            p.expert_io_depth = int(expert_io_depth)
        short_at = settings.expert_io_test_short_read_at()
        if short_at is not None:
            p.expert_io_test_short_read_at = int(short_at)
        if repack is not None:
            lib.strata_set_repack(int(bool(repack)))
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
        self.state_bytes = int(info.state_bytes)        # one session at n_ctx: the most it grows to
        self.state_fixed_bytes = int(info.state_fixed_bytes)   # a session holding no token
        self.state_token_bytes = int(info.state_token_bytes)   # and per token it holds
        self.ple_layer = int(info.ple_layer)
        self.has_ple = self.ple_layer >= 0
        self.n_mtp = int(info.n_mtp)            # MTP blocks in the file (0: no draft head)
        self.n_hidden = int(info.n_hidden)
        self.repack_bytes = int(info.repack_bytes)   # the prefill conversion's scratch, all threads (0: none)
        self._tokenizer = None
        self._sessions = []
        self._generate_lock = threading.Lock()   # held by the call running on the model's own session
        self._own_session = None                 # own_session, made on first use
        self._controller = None                  # controller, made on first use
        if trained is not None and self.n_ctx > trained:
            # the default filter shows this once per call site: a loop that loads models warns once
            warnings.warn(f"n_ctx {self.n_ctx} is more than {path} was trained on ({trained} tokens, its "
                          f"context_length): output past {trained} tokens may degrade; leave n_ctx (--n-ctx) "
                          f"unset for the trained context", UserWarning, stacklevel=2)

    # ------------------------------------------------------------------ metadata and tokens
    @property
    def metadata(self) -> dict:
        if self._metadata is None:
            from .gguf import GGUFFile
            self._metadata = GGUFFile(self.path).metadata()
        return self._metadata

    def metadata_value(self, key: str, default=None):
        """One metadata key, read from the loaded file without unpacking the others (metadata
        turns every key into Python objects: 0.6 s for the Qwen 3.6 vocabulary's arrays)."""
        if self._metadata is not None:
            return self._metadata.get(key, default)
        from .gguf import value_of
        return value_of(lib.strata_model_gguf(self._ptr), key, default)

    @property
    def tokenizer(self):
        if self._tokenizer is None:
            from .tokenizer import Tokenizer
            # built natively from the mapped arrays (issue 17.5: load + first tokenize <= 0.2 s)
            self._tokenizer = Tokenizer.from_gguf_handle(lib.strata_model_gguf(self._ptr), self.path)
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
        out["split"] = "online" if st.split == lib.STRATA_SPLIT_ONLINE else "seed"
        out["split_updates"] = int(st.split_updates)
        out["pcie_frac_min"] = float(st.pcie_frac_min)
        out["pcie_frac_max"] = float(st.pcie_frac_max)
        return out

    @property
    def device_log(self) -> str:
        """Where the dense forward runs and, on a device, the size of every part in its memory ("" on the CPU)."""
        return ffi.string(lib.strata_model_device_log(self._ptr)).decode()

    @property
    def store_log(self) -> str:
        """How routed experts are read (mmap or direct, and why), and the expert store's RAM slots."""
        return ffi.string(lib.strata_model_store_log(self._ptr)).decode()

    def store_stats(self) -> dict:
        """Cumulative counters of the expert store's RAM slots since load (zeros with expert_io mmap): DESIGN
        §9's ram_hits, ram_miss_bytes, prefetch_bytes and prefetch_unused_bytes, with ram_lookups, ram_groups,
        ram_group_hits, read_bytes (asked of storage), reads, evictions, bypassed, read_s, prefetch_experts,
        prefetch_unused_experts, predicted and predicted_right (the prefetch's recall), ram_slots, ram_bytes and
        active."""
        st = ffi.new("strata_store_stats *")
        check(lib.strata_model_store_stats(self._ptr, st))
        return {k: (float(getattr(st, k)) if k == "read_s" else int(getattr(st, k))) for k in _STORE_KEYS}

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
    def eval_batch(self, items) -> None:
        """One forward over several sessions' tokens (strata_batch_eval): items are (session, ids int32
        array, flags, logits out array or None, hidden out array or None), each as Session.eval hands
        them to its batcher; the sessions must differ. Each sequence's results are bit-identical to
        its own strata_session_eval_ex (strata.h)."""
        seqs = ffi.new("strata_batch_seq[]", max(1, len(items)))
        for e, (sess, ids32, flags, out, hid) in zip(seqs, items):
            e.session = sess._live()
            e.ids = _buf("int32_t[]", ids32)        # the arrays outlive the call: items holds them
            e.n_ids = ids32.size
            e.flags = flags
            if out is not None:
                e.logits = _buf("float[]", out)
                e.logits_capacity = out.size
            if hid is not None:
                e.hidden = _buf("float[]", hid)
                e.hidden_capacity = hid.size
        check(lib.strata_batch_eval(seqs, len(items)))

    def session(self) -> "Session":
        s = Session(self)
        self._sessions.append(s)
        return s

    @property
    def own_session(self) -> "Session":
        """The model's own session: the one generate() runs on when no session is given and no other call
        holds it (pyrunner.generate), so that consecutive requests reuse what they share. Made on first
        use; lives as long as the model."""
        if self._own_session is None:
            self._own_session = self.session()
        return self._own_session

    @property
    def controller(self):
        """The PCIe-share controller (pyrunner.controller) generate() feeds, made on first use; None on the
        cpu device, when pcie_frac was fixed, and with split="online" (the library then sets a share per layer
        itself). It starts from the share libstrata set at load (the start
        formula's one owner is native/src/moe/offload.c); the library is told a share only when the
        controller's own clamp (ControllerSettings.lo/hi) moves it."""
        if self.device == "cpu" or self.pcie_frac_fixed or self.split == "online":   # online: libstrata's, per layer
            return None
        if self._controller is None:
            from .controller import Controller
            st = self.offload_stats()
            self._controller = Controller(st["pcie_frac"], st["probe_gbps"])
            if self._controller.pcie_frac != st["pcie_frac"]:
                self.set_pcie_frac(self._controller.pcie_frac)
        return self._controller

    # ------------------------------------------------------------------ generation (pyrunner.generate)
    # Safe from several threads at once: a call without session= that finds the model's own session
    # taken runs on a session of its own (pyrunner.generate._on_a_free_session says why).
    generate = _model_method(_generate.generate)
    create_completion = _model_method(_generate.create_completion)
    create_chat_completion = _model_method(_generate.create_chat_completion)

    # ------------------------------------------------------------------ lifetime
    def close(self) -> None:
        """Frees the sessions and the model now (otherwise the garbage collector does)."""
        for s in self._sessions:
            s.close()
        self._sessions = []
        self._own_session = None
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


class _Saved:
    """A prefix-reuse checkpoint: the state after tokens[:n], the logits (and pre-mixer row) there."""

    __slots__ = ("tokens", "ckpt", "logits", "hidden")

    def __init__(self, tokens, ckpt, logits, hidden):
        self.tokens, self.ckpt, self.logits, self.hidden = tokens, ckpt, logits, hidden


def _outside_vocab(tok: int, n_vocab: int) -> ValueError:
    return ValueError(f"token id {tok} is outside the vocabulary (0..{n_vocab - 1})")


class Session:
    """One sequence's state: eval() appends tokens and returns logits.

    The session also remembers what its state holds (`tokens`, and the `logits` / `hidden` row after
    the last of them) and keeps prefix-reuse checkpoints (DESIGN §5): prefill(ids) brings the state to
    hold ids by evaluating only what neither the state nor a checkpoint already covers. Checkpoints
    are taken at the end of every prefill, every `checkpoint_every` tokens of a long one (0: off), at
    positions a caller names, and by save() (generate calls it when a request ends); the newest
    `max_checkpoints` are kept. A checkpoint copies only the recurrent state (GDN, PLE), so it costs
    what the model's state_bytes minus its K/V would."""

    checkpoint_every = 4096
    max_checkpoints = 4

    def __init__(self, model: Model):
        if model._ptr is None:
            raise RuntimeError("the model is closed")
        self.model = model
        out = ffi.new("strata_session **")
        check(lib.strata_session_init(model._ptr, out))
        self._ptr = ffi.gc(out[0], lib.strata_session_free)
        self.tokens: list[int] = []          # the ids the state holds, in order (len == n_past)
        self.logits: np.ndarray | None = None   # logits after the last of them (None: not known)
        self.hidden: np.ndarray | None = None   # its pre-mixer stream row, when asked for
        self._saved: list[_Saved] = []
        self._unknown = False                # an eval failed or was interrupted: the state is unknown
        self.batcher = None                  # pyrunner.engine's batcher while the engine runs a request here

    # ------------------------------------------------------------------ prefix reuse
    def reuse(self, ids) -> int:
        """Brings the state to the longest prefix of ids it can hold without evaluating (its own
        tokens, or a checkpoint's) and returns that length; len(ids) only when the logits there are
        known. Resets the session when nothing is shared."""
        ids = list(ids)
        if self._unknown:
            self.reset()
        n = len(self.tokens)
        if n <= len(ids) and self.tokens == ids[:n] and (n < len(ids) or self.logits is not None):
            return n
        for rec in sorted(self._saved, key=lambda r: -len(r.tokens)):
            k = len(rec.tokens)
            if k <= len(ids) and rec.tokens == ids[:k] and k > 0:
                try:
                    self.restore(rec.ckpt)
                except StrataError:            # its rows were rewritten since: it is of no use any more
                    self._saved.remove(rec)
                    continue
                self.tokens = list(rec.tokens)
                self.logits, self.hidden = rec.logits, rec.hidden
                return k
        self.reset()
        return 0

    def reusable(self, ids) -> int:
        """How many leading tokens of ids reuse() would give back now, changing nothing (the engine
        picks the session a request shares most with)."""
        if self._unknown:
            return 0
        n = len(self.tokens)
        if n <= len(ids) and self.tokens == list(ids[:n]) and (n < len(ids) or self.logits is not None):
            best = n
        else:
            best = 0
        valid = self.n_valid
        for rec in self._saved:
            k = len(rec.tokens)
            if best < k <= len(ids) and k <= valid and rec.tokens == list(ids[:k]):
                best = k
        return best

    def prefill(self, ids, hidden: bool = False, checkpoint_at=()) -> tuple:
        """Makes the state hold exactly ids, evaluating only what reuse() cannot give back, with
        checkpoints at the end, every checkpoint_every tokens and at the positions in checkpoint_at.
        Returns (logits after the last id, pre-mixer rows of the evaluated tokens (n, n_hidden) or
        None, tokens reused)."""
        ids = [int(t) for t in ids]
        r = self.reuse(ids)
        if r == len(ids):
            return self.logits, (np.empty((0, self.model.n_hidden), np.float32) if hidden else None), r
        cuts = {c for c in checkpoint_at if r < c < len(ids)}
        if self.checkpoint_every > 0:
            cuts.update(range((r // self.checkpoint_every + 1) * self.checkpoint_every, len(ids),
                              self.checkpoint_every))
        pos, rows, logits = r, [], None
        for c in sorted(cuts) + [len(ids)]:
            out = self.eval(ids[pos:c], hidden=hidden)
            logits = out[0] if hidden else out
            if hidden:
                rows.append(out[1])
            pos = c
            self.save()
        return logits, (np.concatenate(rows) if hidden else None), r

    def save(self) -> None:
        """A checkpoint of the state as it is now (nothing if one exists for these tokens)."""
        n = len(self.tokens)
        if n == 0 or self._unknown or self.logits is None:
            return
        if any(len(rec.tokens) == n for rec in self._saved):   # tokens[:n] are ours: it is the same one
            return
        self._saved.append(_Saved(list(self.tokens), self.checkpoint(), self.logits, self.hidden))
        del self._saved[:-self.max_checkpoints or None]

    def forget(self) -> None:
        """reset() and drop every checkpoint."""
        self.reset()
        self._saved = []

    @property
    def checkpoints(self) -> list[int]:
        """Positions of the checkpoints kept."""
        return sorted(len(r.tokens) for r in self._saved)

    @property
    def n_past(self) -> int:
        return int(lib.strata_session_n_past(self._live()))

    @property
    def state_bytes(self) -> int:
        """Bytes of state this session holds now (its caches grow as it fills; strata.h)."""
        return int(lib.strata_session_state_bytes(self._live()))

    def _live(self):
        if self._ptr is None or self.model._ptr is None:
            raise RuntimeError("this session (or its model) is closed")
        return self._ptr

    def reset(self) -> None:
        """Forgets the sequence (n_past = 0). Checkpoints stay usable: the K/V rows they need are
        kept until an eval rewrites them."""
        lib.strata_session_reset(self._live())
        self.tokens, self.logits, self.hidden, self._unknown = [], None, None, False

    def ple_prefetch(self, ids) -> None:
        """Reads ahead, into the PLE row cache, the rows of the ids the next eval starts with (a verify
        window's token and drafts), while the caller goes on; advisory (strata_session_ple_prefetch)."""
        if self.model.has_ple and len(ids):
            a = np.ascontiguousarray(ids, dtype=np.int32)
            check(lib.strata_session_ple_prefetch(self._live(), ffi.from_buffer("int32_t[]", a), len(a)))

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

    def eval(self, token_ids, all_logits: bool = False, hidden: bool = False, keep_states: bool = False,
             continued: bool = False):
        """Runs token_ids after the tokens already seen. Returns the last position's logits
        (n_vocab,) float32, or (len(token_ids), n_vocab) with all_logits=True. hidden=True also
        returns the pre-mixer stream state of every token, (len(token_ids), n_hidden), as a second
        value (what the MTP head reads). keep_states=True makes this a verify window that
        rollback() can cut short (at most set_spec_max() tokens). continued=True: more tokens of
        this evaluation follow in the next eval, which completes the GDN chunk this one leaves open,
        so a prompt fed in pieces of any length gets the bits of one eval (STRATA_EVAL_CONTINUED)."""
        ptr = self._live()
        V = self.model.n_vocab
        if type(token_ids) is list and len(token_ids) == 1 and type(token_ids[0]) is int:
            # a decode step's one id (generate's loops): checked and converted without the general path's
            # three numpy conversions and list, ~3 us of a token's Python under the engine
            vals = token_ids
            if not 0 <= vals[0] < V:
                raise _outside_vocab(vals[0], V)
            ids32 = np.array(vals, dtype=np.int32)
        else:
            ids = np.ascontiguousarray(np.asarray(token_ids, dtype=np.int64).reshape(-1))
            if ids.size == 0:
                raise ValueError("eval needs at least one token id")
            vals = ids.tolist()
            # a few ids are checked in Python (numpy's min and max cost more there)
            if (min(vals) < 0 or max(vals) >= V) if ids.size <= 64 else (ids.min() < 0 or ids.max() >= V):
                raise _outside_vocab(int(ids[(ids < 0) | (ids >= V)][0]), V)
            ids32 = ids.astype(np.int32)
        n = ids32.size
        out = np.empty((n, V) if all_logits else (V,), dtype=np.float32)
        hid = np.empty((n, self.model.n_hidden), dtype=np.float32) if hidden else None
        flags = (lib.STRATA_EVAL_ALL_LOGITS if all_logits else 0) | (lib.STRATA_EVAL_KEEP_STATES if keep_states else 0) \
            | (lib.STRATA_EVAL_CONTINUED if continued else 0)
        n0 = len(self.tokens)
        self._saved = [r for r in self._saved if len(r.tokens) <= n0]   # rows past n0 are rewritten
        try:
            if self.batcher is not None:       # pyrunner.engine: one forward with the other sequences' tokens
                self.batcher.eval(self, ids32, flags, out, hid)
            else:
                check(lib.strata_session_eval_ex(ptr, _buf("int32_t[]", ids32), n, flags,
                                                 _buf("float[]", out), out.size,
                                                 _buf("float[]", hid) if hidden else ffi.NULL,
                                                 hid.size if hidden else 0))
        except StrataError as e:
            if e.status not in (lib.STRATA_ERR_INVALID_ARG, lib.STRATA_ERR_BUFFER_TOO_SMALL):
                self._unknown = True   # refused arguments leave the state as it was; anything else does not:
            raise                      # reuse() starts over
        except BaseException:          # an interrupt inside the call
            self._unknown = True
            raise
        self.tokens.extend(vals)
        self.logits = out[-1] if all_logits else out
        self.hidden = hid[-1] if hidden else None
        return (out, hid) if hidden else out

    # ------------------------------------------------------------------ rollback and checkpoints
    def set_spec_max(self, n: int) -> None:
        """Per-token state slots for verify windows of up to n tokens (0 frees them)."""
        check(lib.strata_session_set_spec_max(self._live(), int(n)))

    def rollback(self, n_past: int, logits=None, hidden=None) -> None:
        """Back to n_past tokens inside the last keep_states window, without running the model
        (logits / hidden: the window's rows for that position, if the caller wants them remembered)."""
        check(lib.strata_session_rollback(self._live(), int(n_past)))
        del self.tokens[int(n_past):]
        self.logits, self.hidden = logits, hidden

    @property
    def n_valid(self) -> int:
        """Tokens whose K/V rows the session still holds (>= n_past): a checkpoint up to here restores."""
        return int(lib.strata_session_n_valid(self._live()))

    def checkpoint(self) -> "Checkpoint":
        """A copy of the recurrent state at n_past (the K/V rows stay in the session)."""
        out = ffi.new("strata_checkpoint **")
        check(lib.strata_session_checkpoint(self._live(), out))
        return Checkpoint(ffi.gc(out[0], lib.strata_checkpoint_free))

    def restore(self, ckpt: "Checkpoint") -> None:
        """Back to the checkpoint's n_past; raises StrataError if the session rewrote its tokens since."""
        check(lib.strata_session_restore(self._live(), ckpt._ptr))

    def close(self) -> None:
        if self._ptr is not None:
            ptr, self._ptr = self._ptr, None
            ffi.release(ptr)

    # ------------------------------------------------------------------ MTP head
    def mtp(self, hidden, ids, pos0: int, all_rows: bool = False):
        """One pass of the MTP head (strata_session_mtp; spec/qwen4exp-mtp.md §2.2): row i fuses hidden[i] (a
        pre-mixer row, n_hidden floats: the trunk's from eval(hidden=True), or the chain of the previous step)
        with token ids[i] at position pos0 + i, through the MTP block's own cache (rows from pos0 on are
        replaced). Returns (logits, chain): (n_vocab,) and (n_hidden,) for the last row, or (n, n_vocab) and
        (n, n_hidden) with all_rows=True. Raises UnsupportedError on a file without an MTP block."""
        ptr = self._live()
        m = self.model
        ids32 = np.ascontiguousarray(np.asarray(ids, dtype=np.int64).reshape(-1))
        if ids32.size == 0:
            raise ValueError("mtp needs at least one row")
        if ids32.min() < 0 or ids32.max() >= m.n_vocab:
            raise ValueError(f"token ids must lie in 0..{m.n_vocab - 1}")
        ids32 = ids32.astype(np.int32)
        n = ids32.size
        hid = np.ascontiguousarray(np.asarray(hidden, dtype=np.float32).reshape(-1))
        if hid.size != n * m.n_hidden:
            raise ValueError(f"hidden has {hid.size} values; {n} rows of n_hidden = {m.n_hidden} expected")
        rows = n if all_rows else 1
        logits = np.empty((rows, m.n_vocab), dtype=np.float32)
        chain = np.empty((rows, m.n_hidden), dtype=np.float32)
        check(lib.strata_session_mtp(ptr, _buf("float[]", hid), _buf("int32_t[]", ids32), n, int(pos0),
                                     lib.STRATA_EVAL_ALL_LOGITS if all_rows else 0,
                                     _buf("float[]", logits), logits.size, _buf("float[]", chain), chain.size))
        return (logits, chain) if all_rows else (logits[0], chain[0])


class Checkpoint:
    """A session's recurrent state at one position (strata_session_checkpoint)."""

    __slots__ = ("_ptr",)

    def __init__(self, ptr):
        self._ptr = ptr

    @property
    def n_past(self) -> int:
        return int(lib.strata_checkpoint_n_past(self._ptr))

    @property
    def nbytes(self) -> int:
        return int(lib.strata_checkpoint_bytes(self._ptr))
