"""setup.py — drives CMake for native/ and places libstrata.so (and strata.h, which the
binding reads, the models/ presets, from which pyrunner.models builds the demo model, and the shipped
trained model of models/flash-small/) inside the pyrunner package. Everything else is in pyproject.toml.

Extra CMake arguments: STRATA_CMAKE_ARGS="-DSTRATA_CUDA=OFF ..." in the environment. STRATA_BUILD_DIR: the
CMake build folder (default build/cmake-pyXY), so that a second build of the same checkout (the non-editable
install of tests/test_install.py) never runs make in the folder an editable install is building in.
"""
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent


class CMakeBuild(build_ext):
    def get_ext_filename(self, ext_name):
        return os.path.join(*ext_name.split(".")[:-1], "libstrata.so")

    def run(self):
        if shutil.which("cmake") is None:
            sys.exit("strata: cmake (>= 3.21) is needed to build libstrata; install it (apt-get install cmake)")
        build_dir = Path(os.environ.get("STRATA_BUILD_DIR")
                         or ROOT / "build" / f"cmake-py{sys.version_info[0]}{sys.version_info[1]}")
        args = [
            "cmake", "-S", str(ROOT / "native"), "-B", str(build_dir),
            "-DCMAKE_BUILD_TYPE=Release", f"-DPython3_EXECUTABLE={sys.executable}",
        ]
        args += shlex.split(os.environ.get("STRATA_CMAKE_ARGS", ""))
        subprocess.check_call(args)
        jobs = str(os.cpu_count() or 2)
        subprocess.check_call(["cmake", "--build", str(build_dir), "--target", "strata", "-j", jobs])
        for ext in self.extensions:
            dest = Path(self.get_ext_fullpath(ext.name))
            dest.parent.mkdir(parents=True, exist_ok=True)
            # a new file renamed over the old one, not a copy into it: a process that has the library
            # mapped (a test run during a rebuild) keeps the old inode instead of crashing on a truncated one
            tmp = dest.with_name(dest.name + ".tmp")
            shutil.copyfile(build_dir / "libstrata.so", tmp)
            os.replace(tmp, dest)
            shutil.copyfile(ROOT / "native" / "include" / "strata.h", dest.parent / "strata.h")
            # the model presets, so that an installed strata can build its default demo model
            (dest.parent / "presets").mkdir(exist_ok=True)
            for preset in (ROOT / "models").glob("*.json"):
                shutil.copyfile(preset, dest.parent / "presets" / preset.name)
            # the shipped trained model (the default of generate / chat); an editable install reads the
            # checkout's models/flash-small/ instead of a copy in the source tree
            if dest.parent.resolve() != (ROOT / "pyrunner").resolve():
                (dest.parent / "flash-small").mkdir(exist_ok=True)
                for f in (ROOT / "models" / "flash-small").glob("*.gguf"):
                    shutil.copyfile(f, dest.parent / "flash-small" / f.name)


setup(ext_modules=[Extension("pyrunner.libstrata", sources=[])], cmdclass={"build_ext": CMakeBuild})
