#!/usr/bin/env bash
# tools/device_check.sh — the checks of the `cuda` expert device that need a GPU (issue 5), for a
# session with a lent GPU: run from the repository root, `bash tools/device_check.sh` (< 5 minutes).
#
#   1. the GPU and its compute capability (nvidia-smi) -> CMAKE_CUDA_ARCHITECTURES
#   2. configure + build libstrata with CUDA for that architecture only (own build dir)
#   3. small models: tiny in every recipe, small in q4_k_m / iq2_xs / nvfp4 (tools/make_model.py)
#   4. the forward's kernels on the host against the C path, op by op (tools/cuda_ops.py), and
#      tests/test_cuda.py (host block checks + the GPU tests: device decoders, cuda == cpu numbers,
#      cache hits, event order, link probe)
#   5. a short benchmark: --device cuda vs --device cpu on small q4_k_m (prefill + decode tokens/s)
#   6. a summary (summary.txt, and summary.json in $OUT or DEVICE_CHECK_DIR); exit status 1 if any step failed.
#
# Environment: $OUT (the `run` tool's result folder), when set, receives the step logs and the summary.
# DEVICE_CHECK_DRY=1 skips the GPU steps (nvidia-smi, the GPU tests, the benchmark's cuda
# run) so the build and model steps can be tried on a machine without a GPU; DEVICE_CHECK_DIR (default
# /tmp/device_check) holds the build and the models; DEVICE_CHECK_ARCH overrides the architecture.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
DRY=${DEVICE_CHECK_DRY:-0}
DIR=${DEVICE_CHECK_DIR:-/tmp/device_check}
BUILD=$DIR/build
MODELS=$DIR/models
mkdir -p "$DIR" "$MODELS"
rm -f "$DIR/bench.jsonl" "$DIR/ops.json"
export DIR MODELS
JOBS=$(nproc 2>/dev/null || echo 2)
T_START=$(date +%s)
declare -a SUMMARY=()
FAILED=0

# step NAME TIMEOUT_S CMD... : runs CMD with a timeout, logs to $DIR/NAME.log, records the result
step() {
  local name=$1 limit=$2
  shift 2
  local t0 rc
  t0=$(date +%s)
  echo "=== [$name] (limit ${limit}s): $*"
  set +e
  # through bash -c, so that exported shell functions (make_models, bench) run under timeout too
  timeout --kill-after=10 "$limit" bash -c '"$@"' bash "$@" > >(tee "$DIR/$name.log") 2>&1
  rc=$?
  set -e
  local dt=$(( $(date +%s) - t0 ))
  if [ $rc -eq 0 ]; then
    SUMMARY+=("PASS  $name (${dt}s)")
  else
    [ $rc -eq 124 ] && echo "=== [$name] TIMED OUT after ${limit}s"
    SUMMARY+=("FAIL  $name (rc $rc, ${dt}s, log $DIR/$name.log)")
    FAILED=1
  fi
  return 0
}
skip() { SUMMARY+=("SKIP  $1 ($2)"); echo "=== [$1] skipped: $2"; }

# ------------------------------------------------------------------ 1. the GPU
ARCH=${DEVICE_CHECK_ARCH:-}
if [ "$DRY" = 1 ]; then
  skip gpu "DEVICE_CHECK_DRY=1"
  ARCH=${ARCH:-86}
else
  if ! command -v nvidia-smi >/dev/null; then
    echo "nvidia-smi not found: is this the GPU machine? (DEVICE_CHECK_DRY=1 for a dry run)" >&2
    exit 2
  fi
  step gpu 30 nvidia-smi --query-gpu=name,compute_cap,memory.total,driver_version --format=csv
  if [ -z "$ARCH" ]; then
    ARCH=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -1 | tr -d ' .')
  fi
fi
echo "CUDA architecture: $ARCH"
command -v nvcc >/dev/null || { echo "nvcc not found on PATH" >&2; exit 2; }
python3 -c "import numpy, cffi, gguf, pytest, click" || { echo "python deps missing (numpy cffi gguf pytest click)" >&2; exit 2; }

# ------------------------------------------------------------------ 2. build
step configure 120 cmake -S native -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DSTRATA_CUDA=ON \
  -DCMAKE_CUDA_ARCHITECTURES="$ARCH"
step build 300 cmake --build "$BUILD" -j"$JOBS"
export STRATA_LIB=$BUILD/libstrata.so PYTHONPATH=$ROOT${PYTHONPATH:+:$PYTHONPATH}
if [ ! -f "$STRATA_LIB" ]; then
  echo "no $STRATA_LIB: the build failed" >&2
  printf '%s\n' "${SUMMARY[@]}"
  exit 1
fi
step build_info 30 python3 -c "from pyrunner import _native; print(_native.build_info())"

# ------------------------------------------------------------------ 3. models
make_one() {  # preset recipe
  local out=$MODELS/$1-$2.gguf
  [ -s "$out" ] && { echo "have $out"; return 0; }
  python3 tools/make_model.py "$1" --recipe "$2" --seed 11 -q -o "$out.tmp" && mv "$out.tmp" "$out"
}
make_models() {
  for r in q8_0 q4_k_m iq2_xs nvfp4; do make_one tiny "$r"; done
  for r in q4_k_m iq2_xs nvfp4; do make_one small "$r"; done
  ls -la "$MODELS"
}
export -f make_one make_models
step models 150 make_models
export STRATA_CUDA_MODEL_DIR=$MODELS

# ------------------------------------------------------------------ 4. tests
# the forward's kernels on the host against the C path, op by op (tests/test_cuda_ops.py; tools/cuda_ops.py)
step ops_host 300 python3 tools/cuda_ops.py --build "$DIR/ops_build" --json --out "$DIR/ops.json"
if [ "$DRY" = 1 ]; then
  step test_cuda_host 120 python3 -m pytest -q -x tests/test_cuda.py -k "host or refuses"
  skip test_cuda_gpu "DEVICE_CHECK_DRY=1"
else
  step test_cuda 240 python3 -m pytest -v tests/test_cuda.py
fi

# ------------------------------------------------------------------ 5. benchmark
bench() {  # device...
  python3 - "$MODELS/small-q4_k_m.gguf" "$@" <<'PY'
import json, os, sys, time
import numpy as np
from pyrunner.model import Model
path, devices = sys.argv[1], sys.argv[2:]
prompt = list(np.random.default_rng(0).integers(0, 4000, 128))
for dev in devices:
    kw = dict(device=dev, cache_gib=1.0, tail_skip=0) if dev != "cpu" else {}
    m = Model(path, threads=2, n_ctx=512, **kw)
    s = m.session()
    t0 = time.perf_counter(); logits = s.eval(prompt); t1 = time.perf_counter()
    for _ in range(32):
        logits = s.eval([int(np.argmax(logits))])
    t2 = time.perf_counter()
    print(f"{dev:5s} prefill {len(prompt) / (t1 - t0):8.1f} tok/s   decode {32 / (t2 - t1):7.1f} tok/s   "
          f"{m.offload_log if dev != 'cpu' else ''}")
    with open(os.environ["DIR"] + "/bench.jsonl", "a") as f:   # summary.json's "bench" rows
        f.write(json.dumps({"device": dev, "vram_gib": None, "cache_share": None if dev == "cpu" else "cache_gib 1.0",
                            "prefill_tps": len(prompt) / (t1 - t0), "decode_tps": 32 / (t2 - t1)}) + "\n")
    if dev != "cpu":
        st = m.offload_stats()
        print("      ", {k: st[k] for k in ("cache_hits", "probe_gbps", "slot_bytes") if k in st})
PY
}
export -f bench
if [ "$DRY" = 1 ]; then
  step bench_cpu 120 bench cpu
  skip bench_cuda "DEVICE_CHECK_DRY=1"
else
  step bench 150 bench cpu cuda
fi

# ------------------------------------------------------------------ 6. summary
# summary.json: {"gpu", "arch", "ops": {NAME: {"types", "host", "device"}}, "models": [...], "bench": [...]}
# (issue 19 point 5). "device" is "skipped" for every op until the device op runner exists: the kernels are
# compiled into the CUDA build, but no step launches them against the host's numbers yet.
python3 - "$DIR" "$ARCH" "$DRY" <<'PY' || FAILED=1
import json, os, subprocess, sys
d, arch, dry = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
gpu = None
if not dry:
    try:
        gpu = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=30).stdout.strip().splitlines()[0]
    except Exception:
        gpu = None
ops = {}
if os.path.exists(f"{d}/ops.json"):
    for name, e in json.load(open(f"{d}/ops.json")).items():
        ops[name] = {"types": e["types"], "host": e["host"], "device": "skipped"}
bench = [json.loads(l) for l in open(f"{d}/bench.jsonl")] if os.path.exists(f"{d}/bench.jsonl") else []
summary = {"gpu": gpu, "arch": arch, "ops": ops, "models": [], "bench": bench}
out = os.environ.get("OUT") or d
json.dump(summary, open(f"{out}/summary.json", "w"), indent=1)
print(f"summary.json: {len(ops)} ops ({sum(e['host'] == 'pass' for e in ops.values())} pass on the host), "
      f"{len(bench)} bench rows -> {out}/summary.json")
PY
{
  echo
  echo "=== device_check summary (arch $ARCH, $(( $(date +%s) - T_START ))s, logs in $DIR)"
  printf '  %s\n' "${SUMMARY[@]}"
} | tee "$DIR/summary.txt"
if [ -n "${OUT:-}" ] && [ -d "$OUT" ]; then
  cp "$DIR"/*.log "$DIR/summary.txt" "$OUT"/ 2>/dev/null || true
fi
exit $FAILED
