"""llama_child.py — runs llama.cpp (llama-cpp-python) in a child process, so that its crash is an error here.

Why: llama.cpp is an oracle (the tests) and a yardstick (`strata bench model --vs-llama-cpp`), not part of
Strata, and some builds of it die on qwen4exp files (its AMX path: DESIGN §8). In-process, such a crash kills
pytest or the CLI with it. Here every use of llama.cpp is a picklable module-level function run by call() in a
fresh Python interpreter:

    parent                                         child (python -c _BOOT IN OUT)
    pickle [sys.path], (fn, args, kwargs) -> IN    sys.path = the parent's; fn(*args, **kwargs)
    wait (timeout)                                 pickle ("ok", result) or ("raised", exc, type, text, tb) -> OUT
    rc < 0: LlamaCrash (the signal, the file)      exits 0 (or dies of a signal: no OUT)
    else: the result, or the child's exception re-raised here with the child's traceback as its cause

The child's stderr is the parent's (llama.cpp's own messages stay visible); its stdout goes there too, so that
a `--json` result on the parent's stdout stays clean. Each call starts an interpreter and imports llama_cpp
(about a second): make one call per fixture or measurement, not one per assertion.
"""
from __future__ import annotations

import importlib.util
import os
import pickle
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

# The child's entry: the parent's sys.path first (so fn's module — pyrunner or a test module — imports the same
# way), then _serve. No core files: a crash is reported by message, a core dump in the user's folder is litter.
_BOOT = """\
import os, pickle, resource, sys
if len(sys.argv) > 3:    # join a memory cgroup before anything is loaded (strata bench model --mem-limit-gib)
    with open(os.path.join(sys.argv[3], "cgroup.procs"), "w") as f:
        f.write(str(os.getpid()))
resource.setrlimit(resource.RLIMIT_CORE, (0, resource.getrlimit(resource.RLIMIT_CORE)[1]))
with open(sys.argv[1], "rb") as f:
    sys.path[:] = pickle.load(f)
    from pyrunner.llama_child import _serve
    _serve(f, sys.argv[2])
"""

REBUILD = "rebuild it with `python tools/llama_oracle.py install`"


class LlamaCrash(RuntimeError):
    """llama.cpp's child process died from a signal (SIGSEGV, SIGABRT, SIGILL, ...)."""

    def __init__(self, message: str, signum: int, gguf: str | None):
        super().__init__(message)
        self.signum, self.gguf = signum, gguf


class LlamaTimeout(RuntimeError):
    """llama.cpp's child process ran past its timeout and was killed."""


class LlamaChildError(RuntimeError):
    """The child failed in a way that cannot be re-raised as itself (an exception that does not pickle, an exit
    without a result)."""


class ChildTraceback(Exception):
    """The child's traceback text, attached as the __cause__ of the exception re-raised in the parent."""

    def __str__(self):
        return "\n" + self.args[0]


def _installed_flags() -> str | None:
    """The CMAKE_ARGS tools/llama_oracle.py recorded in the installed llama_cpp package (found without loading
    it), or None."""
    spec = importlib.util.find_spec("llama_cpp")
    if spec is None or not spec.origin:
        return None
    marker = Path(spec.origin).parent / "STRATA_ORACLE_FLAGS"
    return marker.read_text().strip() if marker.is_file() else None


def crash_message(signum: int, gguf: str | None) -> str:
    try:
        name = signal.Signals(signum).name
    except ValueError:
        name = "an unknown signal"
    where = f" on {gguf}" if gguf else ""
    head = f"llama.cpp crashed with signal {signum} ({name}){where}"
    if signum == signal.SIGKILL:
        return f"{head}: killed from outside, most often by the kernel when memory ran out (see `dmesg`)"
    if signum == signal.SIGILL:
        return (f"{head}: an instruction this CPU lacks, so llama-cpp-python was built for another CPU; "
                f"{REBUILD} (flags from this host's /proc/cpuinfo)")
    flags = _installed_flags()
    if flags and "-DGGML_AMX_INT8=OFF" in flags:
        # the known cause is ruled out: say so rather than send the user to a rebuild that changes nothing
        return (f"{head}; the installed llama-cpp-python is tools/llama_oracle.py's build with AMX off, so this "
                f"is not the known AMX crash (DESIGN §8) but a llama.cpp failure on this file (its messages, if "
                f"any, are above)")
    return (f"{head}; its AMX path is known to crash on qwen4exp files (DESIGN §8); "
            f"{REBUILD} (GGML_NATIVE=OFF, AMX off)")


def call(fn, args: tuple = (), kwargs: dict | None = None, *, gguf=None, timeout: float | None = None,
         cgroup: str | None = None):
    """fn(*args, **kwargs) in a fresh child process; its result (anything that pickles: numpy arrays too).
    gguf: the model file the call works on, named in a crash message. A Python exception of the child is raised
    here as itself (or as LlamaChildError when it does not pickle), its cause holding the child's traceback; a
    child killed by a signal raises LlamaCrash; past timeout seconds the child is killed and LlamaTimeout raised.
    cgroup: a cgroup directory the child joins first thing (its cgroup.procs), so that it runs under that
    group's memory limit."""
    gguf = None if gguf is None else str(gguf)
    with tempfile.TemporaryDirectory(prefix="strata-llama-") as tmp:
        inp, out = os.path.join(tmp, "in.pkl"), os.path.join(tmp, "out.pkl")
        with open(inp, "wb") as f:
            pickle.dump(list(sys.path), f)
            pickle.dump((fn, tuple(args), dict(kwargs or {})), f)
        # stdout=2: whatever the child prints lands on the parent's stderr, never in its stdout
        proc = subprocess.Popen([sys.executable, "-c", _BOOT, inp, out] + ([cgroup] if cgroup else []),
                                stdin=subprocess.DEVNULL, stdout=2)
        try:
            rc = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            raise LlamaTimeout(f"llama.cpp did not finish within {timeout:g} s{f' on {gguf}' if gguf else ''}; "
                               f"the child process was killed") from None
        except BaseException:          # Ctrl-C in the parent: do not leave the child running
            proc.kill()
            proc.wait()
            raise
        if rc < 0:
            raise LlamaCrash(crash_message(-rc, gguf), -rc, gguf)
        try:
            with open(out, "rb") as f:
                reply = pickle.load(f)
        except (OSError, EOFError, pickle.UnpicklingError) as e:
            raise LlamaChildError(f"llama.cpp's child process{f' on {gguf}' if gguf else ''} exited with status "
                                  f"{rc} and no result ({e})") from None
    if reply[0] == "ok":
        return reply[1]
    _, exc, type_name, text, tb = reply
    if exc is None:
        exc = LlamaChildError(f"llama.cpp's child process{f' on {gguf}' if gguf else ''} raised {type_name}: {text}")
    raise exc from ChildTraceback(tb)


def _serve(f, out_path: str) -> None:
    """The child side of call(): runs the call pickled in f and writes its reply to out_path."""
    import traceback

    try:
        fn, args, kwargs = pickle.load(f)
        reply = ("ok", fn(*args, **kwargs))
    except BaseException as e:
        tb = traceback.format_exc()
        exc = None   # SystemExit, KeyboardInterrupt: reported as LlamaChildError, never re-raised as themselves
        if isinstance(e, Exception):
            try:
                pickle.loads(pickle.dumps(e))
                exc = e
            except Exception:
                pass
        reply = ("raised", exc, type(e).__qualname__, str(e), tb)
    with open(out_path + ".tmp", "wb") as g:
        pickle.dump(reply, g)
    os.replace(out_path + ".tmp", out_path)   # a child killed mid-write leaves no half reply


# ------------------------------------------------------------------------------------------ llama.cpp calls
#
# The one llama.cpp setup for parity: per-position logits (logits_all), f32 KV (type 0: F16 KV adds ~2e-3,
# DESIGN §8), no flash attention. Used by the tests (tests/model_oracles.py) and tools/flash_small.py.

def open_llama(path, n_ctx: int, n_threads: int = 2):
    """A llama_cpp.Llama on path with the parity settings (child side only)."""
    import llama_cpp

    return llama_cpp.Llama(str(path), logits_all=True, flash_attn=False, type_k=0, type_v=0, n_threads=n_threads,
                           n_ctx=n_ctx, n_batch=n_ctx, verbose=False)


def _per_position_logits(path: str, prompts: list, n_ctx: int, n_threads: int) -> list:
    llm = open_llama(path, n_ctx, n_threads)
    try:
        out = []
        for ids in prompts:
            llm.reset()
            llm.eval(list(ids))
            out.append(np.array(llm.scores[: len(ids)], dtype=np.float32))
        return out
    finally:
        llm.close()


def logits(path, prompts: list, n_ctx: int = 512, n_threads: int = 2, timeout: float | None = None) -> list:
    """llama.cpp's per-position logits (len(ids), n_vocab) for each prompt, one context reset between, in one
    child process."""
    return call(_per_position_logits, (str(path), [list(map(int, p)) for p in prompts], n_ctx, n_threads),
                gguf=path, timeout=timeout)

