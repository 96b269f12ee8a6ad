#!/usr/bin/env bash
# tools/device_wheels.sh DIR — the wheels tools/device_check.sh installs on a lent GPU machine (Python 3.12 with
# PyTorch, hence numpy, and no network): this project's Python dependencies but numpy, with theirs, for CPython 3.12
# on x86-64 Linux, downloaded here (where the package registry is reachable) into DIR. A few MiB: carry DIR with the
# run tool (`carry: [".device_wheels"]`, the default DIR) and device_check.sh finds it.
set -euo pipefail
DIR=${1:-.device_wheels}
mkdir -p "$DIR"
python3 -m pip download -q -d "$DIR" --only-binary=:all: --python-version 3.12 --implementation cp --abi cp312 \
  --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 \
  --platform any --no-deps \
  cffi pycparser gguf pyyaml tqdm requests urllib3 idna charset-normalizer certifi pytest iniconfig pluggy \
  packaging pygments click
du -sh "$DIR"
