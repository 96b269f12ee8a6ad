"""A non-editable install, as a user without the source checkout has it: `pip install --prefix TMP .`, then,
from a folder outside the checkout and with only TMP's site-packages and bin on the paths, `strata config`
(and pkg-config with the strata.pc it writes) gives the flags that build tools/examples/generate.c against
the installed strata.h and libstrata.so; the program runs without LD_LIBRARY_PATH and its greedy tokens equal
pyrunner's. `strata inspect` with no FILE inspects the installed default model.

The install builds in folders of its own under build/install-test/ (STRATA_BUILD_DIR for CMake,
DIST_EXTRA_CONFIG for setuptools), never in build/cmake-pyXY, where the editable install builds: the two can
run at once. After the first run the native build there is incremental."""
from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import numpy as np
import pytest

from pyrunner.model import Model
from pyrunner.models import make_model

ROOT = Path(__file__).resolve().parents[1]
WORK = ROOT / "build" / "install-test"
PROMPT = "The quick brown fox"

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> dict:
    """The prefix of a fresh non-editable install and the environment that sees it and not the checkout."""
    prefix = tmp_path_factory.mktemp("prefix")
    setuptools_dir = WORK / "setuptools"
    setuptools_dir.mkdir(parents=True, exist_ok=True)
    cfg = WORK / "setup.cfg"
    cfg.write_text(f"[build]\nbuild_base = {setuptools_dir}\n[egg_info]\negg_base = {setuptools_dir}\n")
    env = dict(os.environ, STRATA_BUILD_DIR=str(WORK / f"cmake-py{sys.version_info[0]}{sys.version_info[1]}"),
               DIST_EXTRA_CONFIG=str(cfg))
    # --ignore-installed: without it pip uninstalls the strata this interpreter already has (the editable
    # install of the checkout) before installing into the prefix
    r = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                        "--ignore-installed", "--no-warn-script-location", "--prefix", str(prefix), str(ROOT)],
                       capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, f"pip install --prefix failed:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    left = subprocess.run([sys.executable, "-c", "import importlib.metadata as m; print(m.version('strata'))"],
                          capture_output=True, text=True, cwd=prefix, env={"PATH": os.environ.get("PATH", "")})
    assert left.returncode == 0, "the install into the prefix removed the interpreter's own strata"
    site = Path(sysconfig.get_path("purelib", vars={"base": str(prefix), "platbase": str(prefix)}))
    assert (site / "pyrunner" / "libstrata.so").is_file(), sorted(p.name for p in site.iterdir())
    run_env = {k: v for k, v in os.environ.items() if k not in ("LD_LIBRARY_PATH", "STRATA_LIB", "STRATA_MODEL")}
    run_env.update(PYTHONPATH=str(site), PATH=f"{prefix / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}",
                   XDG_CACHE_HOME=str(tmp_path_factory.mktemp("cache")))
    return {"prefix": prefix, "pkg": site / "pyrunner", "env": run_env}


@pytest.fixture(scope="module")
def outside(tmp_path_factory) -> Path:
    """A folder outside the checkout holding a copy of the example and a tiny model."""
    d = tmp_path_factory.mktemp("outside")
    shutil.copyfile(ROOT / "tools" / "examples" / "generate.c", d / "generate.c")
    make_model("tiny", str(d / "tiny.gguf"), "f32", 3)
    return d


def _strata(installed, outside, *args) -> str:
    r = subprocess.run([str(installed["prefix"] / "bin" / "strata"), *args], capture_output=True, text=True,
                       cwd=outside, env=installed["env"], timeout=120)
    assert r.returncode == 0, r.stderr
    return r.stdout


def _build_and_run(installed, outside, flags: str, name: str) -> list[int]:
    cc = shutil.which("cc") or shutil.which("gcc")
    assert cc, "a C compiler is needed to build the example"
    assert str(ROOT) not in flags, flags               # nothing of the checkout
    r = subprocess.run([cc, "-O2", "generate.c", *shlex.split(flags), "-o", name], capture_output=True, text=True,
                       cwd=outside, env=installed["env"], timeout=120)
    assert r.returncode == 0, r.stderr
    ldd = subprocess.run(["ldd", name], capture_output=True, text=True, cwd=outside, env=installed["env"])
    assert f"libstrata.so => {installed['pkg'] / 'libstrata.so'}" in ldd.stdout, ldd.stdout
    r = subprocess.run([f"./{name}", "tiny.gguf", PROMPT, "-n", "4", "--temp", "0"], capture_output=True, text=True,
                       errors="replace", cwd=outside, env=installed["env"], timeout=120)
    assert r.returncode == 0, r.stderr
    (line,) = [ln for ln in r.stdout.splitlines() if ln.startswith("tokens:")]
    return [int(t) for t in line.split()[1:]]


def _greedy(path: str, n: int) -> list[int]:
    """pyrunner's greedy tokens (generate.c's loop: argmax, stopping after an EOS)."""
    with Model(path, threads=2, n_ctx=4096) as m:
        s = m.session()
        logits = s.eval(m.tokenize(PROMPT))
        eos = m.metadata.get("tokenizer.ggml.eos_token_id")
        out = []
        for _ in range(n):
            out.append(int(np.argmax(logits)))
            if out[-1] == eos:
                break
            logits = s.eval([out[-1]])
        return out


def test_installed_strata_config_builds_the_c_example(installed, outside):
    assert _strata(installed, outside, "config", "--prefix").strip() == str(installed["pkg"])
    flags = _strata(installed, outside, "config", "--cflags", "--libs").strip()
    assert flags == _strata(installed, outside, "config").strip()
    tokens = _build_and_run(installed, outside, flags, "generate")
    assert len(tokens) == 4 and tokens == _greedy(str(outside / "tiny.gguf"), 4)


def test_installed_pkg_config_file_builds_the_c_example(installed, outside):
    if shutil.which("pkg-config") is None:
        pytest.skip("pkg-config is not installed here (apt-get install pkg-config); strata config is checked above")
    pc_dir = outside / "pkgconfig"
    _strata(installed, outside, "config", "--pkg-config-dir", str(pc_dir))
    assert (pc_dir / "strata.pc").read_text() == _strata(installed, outside, "config", "--pkg-config")
    env = dict(installed["env"], PKG_CONFIG_PATH=str(pc_dir))
    r = subprocess.run(["pkg-config", "--cflags", "--libs", "strata"], capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr
    tokens = _build_and_run(installed, outside, r.stdout.strip(), "generate-pc")
    assert tokens == _greedy(str(outside / "tiny.gguf"), 4)


def test_installed_inspect_without_file_inspects_the_default_model(installed, outside):
    info = json.loads(_strata(installed, outside, "inspect", "--json"))
    assert info["metadata"]["general.architecture"] == "qwen4exp" and info["tensors"]
    # the model inspected is the one generate runs with no -m: the flash-small copy inside the install
    r = subprocess.run([str(installed["prefix"] / "bin" / "strata"), "inspect"], capture_output=True, text=True,
                       cwd=outside, env=installed["env"], timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(str(installed["pkg"] / "flash-small")), r.stdout[:300]
