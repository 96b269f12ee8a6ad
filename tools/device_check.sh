#!/usr/bin/env bash
# tools/device_check.sh — what only a GPU can show (issues 5 and 19), in one run of at most 5 minutes on a lent
# machine: run from the repository root, `bash tools/device_check.sh`.
#
#   0. Python: the machine has Python 3.12 with PyTorch (numpy) but not this project's dependencies; when cffi,
#      gguf, pytest or click are missing they are installed from the wheels in DEVICE_CHECK_WHEELS (default
#      ./.device_wheels, made here beforehand by tools/device_wheels.sh and brought along with the run tool's
#      `carry`), never from the network.
#   Smoke stage (about 2 minutes; the run stops after it when anything in it failed):
#   1. the GPU and its compute capability (nvidia-smi) -> CMAKE_CUDA_ARCHITECTURES (that one only)
#   2. configure + build libstrata and the op runner with CUDA
#   3. the ops: on the host against the C path (tools/cuda_ops.py), and on the GPU against their host
#      emulation (strata_dense_ops: every launcher of kernels/cuda/)
#   4. one tiny model end to end: the GPU forward (--device cuda) against the C forward, greedy tokens
#   Full stage:
#   5. models: tiny in every recipe, expert-cache budgets 0 / 50 / 100 % x pcie_frac 0 / 0.5 / 1, and the MTP
#      head (tools/dense_check.py: logits within 1e-2 of their spread, the same greedy tokens); two recipes again
#      with --prefill-f16 (rows marked "prefill_f16": true)
#   6. tests/test_cuda.py and tests/test_dense_device.py (their GPU cases run)
#   7. bench: the bench preset made here (DEVICE_CHECK_BENCH_PRESET, default bench; small when that cannot be
#      made in time): prefill and decode tok/s, --device cpu, then cuda with --vram-gib 24 and 50 % of the
#      experts resident, then 0 % / 100 % and --vram-gib 12 while the 5 minutes allow
#   8. summary.json (to $OUT when set, else DEVICE_CHECK_DIR): {"gpu", "arch", "ops": {NAME: {"types", "host",
#      "device"}}, "models": [{"recipe", "budget", "pcie_frac", "max_rel_logit_diff", "same_tokens", ...}],
#      "bench": [{"device", "vram_gib", "cache_share", "prefill_tps", "decode_tps", ...}]}; exit 1 if a step failed.
#
# DEVICE_CHECK_DRY=1 runs everything that needs no GPU and writes the same file with the device fields
# "skipped" (the models step then runs the GPU forward's host emulation, --dense emu on the sim device, marked
# "dense": "emu"); DEVICE_CHECK_DIR (default /tmp/device_check) holds the build and the models;
# DEVICE_CHECK_ARCH overrides the architecture.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
DRY=${DEVICE_CHECK_DRY:-0}
DIR=${DEVICE_CHECK_DIR:-/tmp/device_check}
BUILD=$DIR/build
MODELS=$DIR/models
mkdir -p "$DIR" "$MODELS"
rm -f "$DIR/bench.jsonl" "$DIR/ops.json" "$DIR/ops_device.txt" "$DIR/models.json" "$DIR/models_f16.json"
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

# ------------------------------------------------------------------ 0. Python dependencies
WHEELS=${DEVICE_CHECK_WHEELS:-$ROOT/.device_wheels}
if ! python3 -c "import numpy, cffi, gguf, pytest, click" 2>/dev/null; then
  if [ -d "$WHEELS" ]; then
    step wheels 120 python3 -m pip install -q --no-index --find-links "$WHEELS" cffi gguf pytest click
  fi
  python3 -c "import numpy, cffi, gguf, pytest, click" || {
    echo "python deps missing (numpy cffi gguf pytest click) and no wheels in $WHEELS: make them with" \
         "tools/device_wheels.sh $WHEELS and carry that folder" >&2; exit 2; }
fi

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

# ------------------------------------------------------------------ 2. build
step configure 120 cmake -S native -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DSTRATA_CUDA=ON \
  -DCMAKE_CUDA_ARCHITECTURES="$ARCH" -DSTRATA_BUILD_TESTS=ON -DPython3_EXECUTABLE="$(command -v python3)"
step build 240 cmake --build "$BUILD" -j"$JOBS" --target strata strata_dense_ops
export STRATA_LIB=$BUILD/libstrata.so PYTHONPATH=$ROOT${PYTHONPATH:+:$PYTHONPATH}
if [ ! -f "$STRATA_LIB" ]; then
  echo "no $STRATA_LIB: the build failed" >&2
  printf '%s\n' "${SUMMARY[@]}"
  exit 1
fi
step build_info 30 python3 -c "from pyrunner import _native; print(_native.build_info())"

# ------------------------------------------------------------------ 3. ops
step ops_host 300 python3 tools/cuda_ops.py --build "$DIR/ops_build" --json --out "$DIR/ops.json"
OPS_EXE=$(find "$BUILD" -name strata_dense_ops -type f -perm -u+x | head -1)
if [ "$DRY" = 1 ]; then
  step ops_emu 120 bash -c "'$OPS_EXE' --device emu | tee '$DIR/ops_device.txt'"
else
  step ops_device 120 bash -c "'$OPS_EXE' | tee '$DIR/ops_device.txt'"
fi

# ------------------------------------------------------------------ 4. one tiny model end to end
make_one() {  # preset recipe [mtp]
  local out=$MODELS/$1-$2${3:+-mtp}.gguf
  [ -s "$out" ] && { echo "have $out"; return 0; }
  python3 tools/make_model.py "$1" --recipe "$2" --seed 11 -q ${3:+--mtp} -o "$out.tmp" && mv "$out.tmp" "$out"
}
export -f make_one
SMOKE_DENSE=device; SMOKE_DEV=cuda
[ "$DRY" = 1 ] && { SMOKE_DENSE=emu; SMOKE_DEV=sim; }
export SMOKE_DENSE SMOKE_DEV
smoke_model() {
  make_one tiny q8_0 && python3 - "$MODELS/tiny-q8_0.gguf" <<'PY'
import os, sys
import numpy as np
from pyrunner.model import Model
path = sys.argv[1]
ids = np.random.default_rng(0).integers(0, 300, 40).tolist()
out = []
for kw in ({}, {"device": os.environ["SMOKE_DEV"], "dense": os.environ["SMOKE_DENSE"]}):
    with Model(path, threads=2, **kw) as m:
        if kw:
            print(m.device_log)
        s = m.session(); lg = s.eval(ids); toks = []
        for _ in range(32):
            toks.append(int(np.argmax(lg))); lg = s.eval([toks[-1]])
        out.append(toks)
print("cpu ", out[0]); print(kw["dense"], out[1])
sys.exit(0 if out[0][:16] == out[1][:16] else 1)
PY
}
export -f smoke_model
step smoke_model 90 smoke_model
if [ $FAILED = 1 ]; then
  echo "=== the smoke stage failed: stopping here (see the logs in $DIR)"
fi

# ------------------------------------------------------------------ 5.-7. the full stage
if [ $FAILED = 0 ]; then
  make_models() {
    for r in f32 q8_0 q4_k_m iq2_xs nvfp4; do make_one tiny "$r"; done
    make_one tiny q8_0 mtp
    ls -la "$MODELS"
  }
  export -f make_models
  step models 120 make_models
  export STRATA_CUDA_MODEL_DIR=$MODELS
  tiny=$(for r in f32 q8_0 q4_k_m iq2_xs nvfp4; do echo "$MODELS/tiny-$r.gguf"; done)
  step models_check 150 python3 tools/dense_check.py $tiny "$MODELS/tiny-q8_0-mtp.gguf" --dense "$SMOKE_DENSE" \
    --json "$DIR/models.json"
  # --prefill-f16 (cuBLAS on f16 tiles, where the build has cuBLAS): the same judgement, one budget
  step models_f16 60 python3 tools/dense_check.py "$MODELS/tiny-q8_0.gguf" "$MODELS/tiny-q4_k_m.gguf" \
    --dense "$SMOKE_DENSE" --budgets 0.5 --pcie 0.5 --prefill-f16 --json "$DIR/models_f16.json"
  if [ "$DRY" = 1 ]; then
    step test_cuda_host 120 python3 -m pytest -q -x tests/test_cuda.py -k "host or refuses"
    skip test_gpu "DEVICE_CHECK_DRY=1"
  else
    step test_gpu 200 python3 -m pytest -q tests/test_cuda.py tests/test_dense_device.py
  fi

  bench_make() {
    local preset=${DEVICE_CHECK_BENCH_PRESET:-bench}
    make_one "$preset" iq2_xs && ln -sf "$MODELS/$preset-iq2_xs.gguf" "$MODELS/bench-model.gguf" && return 0
    echo "could not make $preset: the bench runs on small"
    make_one small q4_k_m && ln -sf "$MODELS/small-q4_k_m.gguf" "$MODELS/bench-model.gguf"
  }
  bench() {  # device dense vram_gib cache_share
    python3 - "$MODELS/bench-model.gguf" "$@" <<'PY'
import json, os, sys, time
import numpy as np
from pyrunner.model import Model
path, dev, dense, vram, share = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5]
kw = {"threads": os.cpu_count()}
if dev != "cpu":
    with Model(path, threads=1, device="sim", cache_gib=0, tail_skip=0, expert_pack=None) as m:
        arch = m.metadata_value("general.architecture")
        routed = m.offload_stats()["slot_bytes"] * int(m.metadata_value(f"{arch}.expert_count")) * m.n_layer / 2**30
    kw.update(device=dev, dense=dense, cache_gib=float(share) * routed, vram_gib=float(vram) if vram != "-" else None)
m = Model(path, n_ctx=1024, **kw)
print(m.device_log)
prompt = list(np.random.default_rng(0).integers(0, 4000, 128))
s = m.session()
t0 = time.perf_counter(); lg = s.eval(prompt); t1 = time.perf_counter()
for _ in range(32):
    lg = s.eval([int(np.argmax(lg))])
t2 = time.perf_counter()
row = {"device": dev, "dense": dense if dev != "cpu" else "cpu", "vram_gib": None if vram == "-" else float(vram),
       "cache_share": None if dev == "cpu" else float(share), "model": os.path.realpath(path).rsplit("/", 1)[-1],
       "prefill_tps": len(prompt) / (t1 - t0), "decode_tps": 32 / (t2 - t1)}
if dev != "cpu":
    st = m.offload_stats()
    row.update({k: st[k] for k in ("cache_hits", "cache_lookups", "pcie_bytes", "copy_bytes", "probe_gbps") if k in st})
print(json.dumps(row))
with open(os.environ["DIR"] + "/bench.jsonl", "a") as f:
    f.write(json.dumps(row) + "\n")
PY
  }
  export -f bench_make bench
  step bench_model 120 bench_make
  step bench_cpu 60 bench cpu cpu - 0
  if [ "$DRY" = 1 ]; then
    skip bench_cuda "DEVICE_CHECK_DRY=1"
  else
    step bench_cuda_24_50 60 bench cuda device 24 0.5
    for row in "24 0" "24 1" "12 0.5"; do
      set -- $row
      if [ $(( $(date +%s) - T_START )) -lt 250 ]; then step "bench_cuda_$1_$2" 45 bench cuda device "$1" "$2"
      else skip "bench_cuda_$1_$2" "the 5 minutes are spent"; fi
    done
  fi
fi

# ------------------------------------------------------------------ 8. summary
python3 - "$DIR" "$ARCH" "$DRY" <<'PY' || FAILED=1
import json, os, subprocess, sys
sys.path.insert(0, "tools")
from cuda_ops import parse
d, arch, dry = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
gpu = None
if not dry:
    try:
        gpu = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=30).stdout.strip().splitlines()[0]
    except Exception:
        gpu = None
dev_ops = parse(open(f"{d}/ops_device.txt").read()) if os.path.exists(f"{d}/ops_device.txt") and not dry else {}
ops = {}
if os.path.exists(f"{d}/ops.json"):
    for name, e in json.load(open(f"{d}/ops.json")).items():
        ops[name] = {"types": e["types"], "host": e["host"],
                     "device": dev_ops[name]["host"] if name in dev_ops else "skipped"}
models = [r for f in ("models.json", "models_f16.json") if os.path.exists(f"{d}/{f}") for r in json.load(open(f"{d}/{f}"))]
bench = [json.loads(l) for l in open(f"{d}/bench.jsonl")] if os.path.exists(f"{d}/bench.jsonl") else []
summary = {"gpu": gpu, "arch": arch, "ops": ops, "models": models, "bench": bench}
out = os.environ.get("OUT") or d
json.dump(summary, open(f"{out}/summary.json", "w"), indent=1)
print(f"summary.json: {len(ops)} ops ({sum(e['host'] == 'pass' for e in ops.values())} pass on the host, "
      f"{sum(e['device'] == 'pass' for e in ops.values())} on the device), {len(models)} model rows "
      f"({sum(bool(r.get('pass')) for r in models)} pass), {len(bench)} bench rows -> {out}/summary.json")
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
