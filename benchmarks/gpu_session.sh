#!/usr/bin/env bash
# One GPU session in one command (issue 21): build pyckpt, run the GPU tests and the
# CPU-side device tests, then benchmarks/bench_gpu.py. Every step's full log goes to
# $OUT (default ./gpu-out). Run from the repository root on a machine with CUDA, torch,
# safetensors, pytest, scikit-build-core, pybind11, cmake and ninja installed:
#     BUDGET=540 bash benchmarks/gpu_session.sh
# BUDGET (seconds) bounds the whole script; the benchmark gets what the build and the
# tests left. BENCH_ARGS replaces the benchmark's arguments; TESTS the test paths;
# BUDGET_ARGS, when set, runs benchmarks/bench_pinned_budget.py with them last, in
# the RESERVE seconds (default 150) that bench_gpu.py leaves it. DOORS_ARGS replaces the
# arguments of benchmarks/bench_doors.py (door parity on CUDA tensors, run before
# bench_gpu.py, at most 150 s); DOORS_ARGS= (empty) skips it.
set -u
REPO=$(pwd)
OUT=${OUT:-$REPO/gpu-out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PIP_BREAK_SYSTEM_PACKAGES=1
BUDGET=${BUDGET:-540}
RESERVE=${RESERVE:-150}; [ -n "${BUDGET_ARGS:-}" ] || RESERVE=0
TESTS=${TESTS:-"tests/gpu tests/device"}
BENCH_ARGS=${BENCH_ARGS:-"--size-gb 4 --rounds 3 --limit-threads 2,4,8 --ballast-gb 0.5 --memory pyckpt --skip =torch"}
DOORS_ARGS=${DOORS_ARGS-"--device cuda --size 512MiB --rounds 4"}
left() { echo $(( BUDGET - SECONDS )); }
{ nvidia-smi; echo "cores: $(nproc)"; free -g; df -h /tmp; python3 -c \
  "import torch, numpy; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'numpy', numpy.__version__)"
} > "$OUT/machine.txt" 2>&1
echo "== build ($(left) s left)"
if ! python3 -m pip install --no-build-isolation --no-deps . > "$OUT/build.log" 2>&1; then
  tail -40 "$OUT/build.log"; exit 1
fi
echo "== tests: $TESTS ($(left) s left)"
paths=""; for t in $TESTS; do paths="$paths $REPO/$t"; done
(cd /tmp && timeout $(( $(left) / 3 )) python3 -m pytest -p no:cacheprovider --rootdir="$REPO" \
  -c "$REPO/pyproject.toml" --timeout 120 -ra $paths) > "$OUT/tests.log" 2>&1
echo "tests exit $?"; grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/tests.log" | tail -30
if [ -n "$DOORS_ARGS" ]; then
  echo "== bench_doors $DOORS_ARGS ($(left) s left)"
  (cd /tmp && timeout 150 python3 "$REPO/benchmarks/bench_doors.py" $DOORS_ARGS \
    --json "$OUT/bench_doors.json") > "$OUT/bench_doors.log" 2>&1
  echo "doors exit $?"
  if grep -q '^== SAVE' "$OUT/bench_doors.log"; then sed -n '/^== SAVE/,$p' "$OUT/bench_doors.log"
  else tail -20 "$OUT/bench_doors.log"; fi
fi
echo "== bench_gpu $BENCH_ARGS ($(left) s left)"
(cd /tmp && timeout $(( $(left) - RESERVE - 10 )) python3 "$REPO/benchmarks/bench_gpu.py" $BENCH_ARGS \
  --json "$OUT/bench_gpu.json") > "$OUT/bench_gpu.log" 2>&1
echo "bench exit $?"; tail -c 6000 "$OUT/bench_gpu.log"
if [ -n "${BUDGET_ARGS:-}" ]; then
  echo "== bench_pinned_budget $BUDGET_ARGS ($(left) s left)"
  (cd /tmp && timeout $(( $(left) - 5 )) python3 "$REPO/benchmarks/bench_pinned_budget.py" \
    $BUDGET_ARGS --json "$OUT/bench_pinned_budget.json") > "$OUT/bench_pinned_budget.log" 2>&1
  echo "budget bench exit $?"; cat "$OUT/bench_pinned_budget.log"
fi
