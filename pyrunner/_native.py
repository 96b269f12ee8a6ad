"""_native.py — loads libstrata and binds it with cffi (ABI mode).

The declarations are not retyped here: the block between STRATA_CDEF_BEGIN and
STRATA_CDEF_END of strata.h is macro-free and goes to cffi as is. STRATA_LIB overrides the
library path (tests point it at a sanitizer build). The ABI version is checked at load, and
every failing status becomes a StrataError carrying the library's message.
"""
from __future__ import annotations

import os
import re
from pathlib import Path

from cffi import FFI

from . import settings

_PKG = Path(__file__).resolve().parent
_SRC_HEADER = _PKG.parent / "native" / "include" / "strata.h"


class StrataError(RuntimeError):
    """A libstrata call failed; .status is the strata_status value, str() the message."""

    def __init__(self, status: int, message: str):
        self.status = status
        super().__init__(message)


class FormatError(StrataError, ValueError):
    """A file is malformed (the message names the file, field and byte offset)."""


class UnsupportedError(StrataError):
    pass


class NotFoundError(StrataError, KeyError):
    def __str__(self):  # KeyError would quote the message
        return RuntimeError.__str__(self)


class BufferTooSmallError(StrataError):
    pass


def _header_text() -> str:
    # The header must be the one the library was built from. An installed package carries its own
    # copy next to libstrata.so (setup.py puts it there); a library named by STRATA_LIB is a build of
    # this source tree (tests point it at build/<dir>), so the tree's header comes first then, and a
    # header change does not need a reinstall to be tested against a fresh build.
    order = (_SRC_HEADER, _PKG / "strata.h") if settings.lib_path() else (_PKG / "strata.h", _SRC_HEADER)
    for p in order:
        if p.is_file():
            return p.read_text()
    raise ImportError("strata.h not found next to pyrunner or in native/include; reinstall strata")


def _cdef_block(text: str) -> str:
    m = re.search(r"/\* STRATA_CDEF_BEGIN \*/(.*)/\* STRATA_CDEF_END \*/", text, re.S)
    if not m:
        raise ImportError("strata.h has no STRATA_CDEF_BEGIN/END block")
    return m.group(1)


def _abi_version(text: str) -> int:
    return int(re.search(r"#define STRATA_ABI_VERSION (\d+)", text).group(1))


def _lib_path() -> str:
    env = settings.lib_path()
    if env:
        return os.path.abspath(env)
    p = _PKG / "libstrata.so"
    if not p.is_file():
        raise ImportError(f"{p} is missing: build the package with `pip install -e .` (or set STRATA_LIB)")
    return str(p)


_text = _header_text()
ffi = FFI()
ffi.cdef(_cdef_block(_text))
LIB_PATH = _lib_path()
lib = ffi.dlopen(LIB_PATH)
ABI_VERSION = _abi_version(_text)
if lib.strata_abi_version() != ABI_VERSION:
    raise ImportError(
        f"{LIB_PATH} has ABI version {lib.strata_abi_version()} but pyrunner expects {ABI_VERSION}; "
        "rebuild with `pip install -e .`")

_ERRORS = {
    lib.STRATA_ERR_FORMAT: FormatError,
    lib.STRATA_ERR_UNSUPPORTED: UnsupportedError,
    lib.STRATA_ERR_NOT_FOUND: NotFoundError,
    lib.STRATA_ERR_BUFFER_TOO_SMALL: BufferTooSmallError,
}


def last_error() -> str:
    return ffi.string(lib.strata_last_error()).decode("utf-8", "replace")


def check(status: int) -> None:
    """Raises the StrataError for a failing status, with the library's message."""
    if status != lib.STRATA_OK:
        name = ffi.string(lib.strata_status_str(status)).decode()
        msg = last_error() or name
        raise _ERRORS.get(status, StrataError)(status, msg)


def build_info() -> str:
    return ffi.string(lib.strata_build_info()).decode()


_ISA = {"auto": lib.STRATA_ISA_AUTO, "scalar": lib.STRATA_ISA_SCALAR, "avx2": lib.STRATA_ISA_AVX2,
        "avx_vnni": lib.STRATA_ISA_AVX_VNNI, "avx512": lib.STRATA_ISA_AVX512, "amx": lib.STRATA_ISA_AMX}
ISA_NAMES = tuple(n for n in _ISA if n != "auto")   # from the floor up (strata.h strata_isa)


def isa_id(name: str) -> int:
    try:
        return _ISA[name]
    except KeyError:
        raise ValueError(f"unknown isa {name!r}; expected one of {sorted(_ISA)}") from None


def isa_supported(name: str) -> bool:
    return bool(lib.strata_isa_supported(isa_id(name)))


def isa_paths() -> list[str]:
    """The kernel paths this CPU and this build can run, from the floor up."""
    return [n for n in ISA_NAMES if isa_supported(n)]


def isa_best() -> str:
    """The path STRATA_ISA_AUTO takes (the best here, or the one STRATA_ISA forces)."""
    return ffi.string(lib.strata_isa_name(lib.strata_isa_best())).decode()


def _check_process_settings() -> None:
    """The process-wide STRATA_* values read at import (settings.py): STRATA_GEMM is handed to the
    library; STRATA_ISA, which the library reads itself (and would quietly ignore if this machine cannot
    run it), is checked here. Raises ValueError naming the variable."""
    gemm = settings.gemm_from()
    if gemm is not None:                  # a process-wide measuring knob
        lib.strata_set_gemm_from(gemm)
    if settings.repack() is False:        # process-wide too (strata.h strata_set_repack)
        lib.strata_set_repack(0)
    forced = settings.isa()
    if forced is None:
        return
    if forced not in ISA_NAMES:
        raise ValueError(f"{settings.ISA}={forced!r} is not a kernel path; give one of {', '.join(ISA_NAMES)} "
                         f"(this machine runs {', '.join(isa_paths())}) or unset it")
    if not isa_supported(forced):
        raise ValueError(f"{settings.ISA}={forced}: this CPU, its OS or this build cannot run that path; "
                         f"this machine runs {', '.join(isa_paths())} ({build_info()})")


# A bad value does not fail the import (the `strata` command could then only print a traceback): it is
# kept, and raised by check_settings(), which every Context and Model calls, and the CLI before any command.
try:
    _check_process_settings()
    _SETTINGS_ERROR: ValueError | None = None
except ValueError as _e:
    _SETTINGS_ERROR = _e


def check_settings() -> None:
    """Raises the ValueError of a bad process-wide STRATA_* value (STRATA_GEMM, STRATA_ISA), if any."""
    if _SETTINGS_ERROR is not None:
        raise ValueError(str(_SETTINGS_ERROR))


class Context:
    """A libstrata context: owns the persistent worker pool."""

    def __init__(self, threads: int | None = None):
        check_settings()
        p = ffi.new("strata_context_params *", lib.strata_context_default_params())
        p.n_threads = threads or 0
        out = ffi.new("strata_context **")
        check(lib.strata_context_init(p, out))
        self._ptr = ffi.gc(out[0], lib.strata_context_free)

    @property
    def ptr(self):
        return self._ptr

    @property
    def n_threads(self) -> int:
        return lib.strata_context_n_threads(self._ptr)


_default_ctx: Context | None = None


def default_context() -> Context:
    global _default_ctx
    if _default_ctx is None:
        _default_ctx = Context(settings.threads())
    return _default_ctx
