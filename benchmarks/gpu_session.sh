#!/usr/bin/env bash
# One GPU session in one command (issues 21 and 40): build pyckpt, run tests/gpu and
# tests/device, measure every row of issue 40's table (benchmarks/bench_gpu_table.py;
# the JAX row by benchmarks/bench_jax_restore.py), then print one summary table: row,
# measured, limit / peer, ratio, target, met / missed. Run from the repository root on a
# machine with CUDA, torch, safetensors, pytest, scikit-build-core, pybind11, cmake and
# ninja installed:
#     bash benchmarks/gpu_session.sh            # about 5 minutes on one H200, 16 cores
# Every step's full log goes to $OUT (default ./gpu-out); the table's rows to
# $OUT/rows.jsonl as they are measured, so a step killed by its time limit loses only
# the rows it had not measured yet.
#
# BUDGET (seconds, default 350) bounds the whole script; each step gets at most its own
# cap and what the later steps leave it: BUILD_S (150), TEST_S (100), TABLE_S (150),
# JAX_S (75). TESTS: the test paths (TEST_WORKERS pytest-xdist workers, default 8). TABLE_ARGS: bench_gpu_table.py's arguments (sizes,
# rounds, sections; default: the issue's sizes). JAX_ARGS: bench_jax_restore.py's (JAX_ARGS= skips it; it runs only
# where jax imports). DOORS_ARGS: bench_doors.py's door parity, run last when at least 60 s
# are left (DOORS_ARGS= skips it). BENCH_ARGS: when set, bench_gpu.py (every peer) runs
# with them in what is left. BUILD=0: pyckpt is installed already. DRY_RUN=1: no build, no
# tests, no JAX or doors: the table's --dry-run on host tensors with tiny sizes (checks
# this script on a machine without CUDA; tests/test_gpu_session_script.py runs it).
set -u
REPO=$(pwd)
OUT=${OUT:-$REPO/gpu-out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PIP_BREAK_SYSTEM_PACKAGES=1
DRY_RUN=${DRY_RUN:-0}
BUDGET=${BUDGET:-350}
BUILD=${BUILD:-1}
BUILD_S=${BUILD_S:-150}; TEST_S=${TEST_S:-100}; TABLE_S=${TABLE_S:-150}; JAX_S=${JAX_S:-75}
TESTS=${TESTS:-"tests/gpu tests/device"}
TABLE_ARGS=${TABLE_ARGS:-}  # its defaults are the issue's sizes (4.25 GB in 1,162 tensors...)
JAX_ARGS=${JAX_ARGS-"--mib 2150 --processes 2 --restores 3 --contenders restore,orbax"}
DOORS_ARGS=${DOORS_ARGS-"--device cuda --size 256MiB --rounds 2"}
BENCH_ARGS=${BENCH_ARGS:-}
PY=${PYTHON:-python3}
left() { echo $(( BUDGET - SECONDS )); }
# cap WANT RESERVE: WANT seconds, or less so that RESERVE seconds stay for later steps (>= 10)
cap() { local c=$1 l=$(( BUDGET - SECONDS - $2 )); [ "$l" -lt "$c" ] && c=$l; [ "$c" -lt 10 ] && c=10; echo "$c"; }
rm -f "$OUT/rows.jsonl" "$OUT/jax.json"
notes=""

{ nvidia-smi; echo "cores: $(nproc)"; free -g; df -h /tmp; $PY -c \
  "import torch, numpy; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'numpy', numpy.__version__)"
} > "$OUT/machine.txt" 2>&1
grep -E "NVIDIA|cores|torch" "$OUT/machine.txt" | head -5

if [ "$DRY_RUN" = 1 ]; then
  echo "== dry run: no build, no tests; the table on host tensors"
elif [ "$BUILD" = 1 ]; then
  echo "== build ($(left) s left)"
  if ! CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) timeout "$(cap "$BUILD_S" 220)" \
      $PY -m pip install --no-build-isolation --no-deps . > "$OUT/build.log" 2>&1; then
    tail -40 "$OUT/build.log"; echo "build failed: nothing measured"; exit 1
  fi
fi

if [ "$DRY_RUN" != 1 ]; then
  echo "== tests: $TESTS ($(left) s left)"
  paths=""; for t in $TESTS; do paths="$paths $REPO/$t"; done
  (cd /tmp && timeout "$(cap "$TEST_S" 170)" $PY -m pytest -p no:cacheprovider --rootdir="$REPO" \
    -c "$REPO/pyproject.toml" --timeout 60 -n "${TEST_WORKERS:-8}" -q -ra $paths) > "$OUT/tests.log" 2>&1
  rc=$?
  tests=$(grep -E "[0-9]+ (passed|failed)" "$OUT/tests.log" | tail -1)
  [ "$rc" = 124 ] && tests="$tests (stopped at its time limit)"
  echo "tests exit $rc: $tests"; grep -E "^(FAILED|ERROR)" "$OUT/tests.log" | head -20
fi

table_s=$(cap "$TABLE_S" $([ -n "$JAX_ARGS" ] && [ "$DRY_RUN" != 1 ] && echo 65 || echo 10))
echo "== table ($(left) s left; at most $table_s s)"
dry=""; [ "$DRY_RUN" = 1 ] && dry="--dry-run"
(cd /tmp && timeout "$table_s" $PY "$REPO/benchmarks/bench_gpu_table.py" $TABLE_ARGS $dry \
  --rows "$OUT/rows.jsonl" --deadline $(( table_s * 3 / 4 )) --dir "${TABLE_DIR:-/tmp}") \
  > "$OUT/table.log" 2>&1
rc=$?
grep -E "^(ROW|== |state:|pinned D2H)" "$OUT/table.log"
echo "table exit $rc"; [ "$rc" != 0 ] && grep -E "Error|error" "$OUT/table.log" | tail -8

if [ "$DRY_RUN" = 1 ]; then
  notes="skipped (dry run)"
elif [ -z "$JAX_ARGS" ]; then
  notes="skipped (JAX_ARGS empty)"
elif [ ! -f "$REPO/benchmarks/bench_jax_restore.py" ]; then
  notes="skipped (no benchmarks/bench_jax_restore.py)"
elif ! $PY -c "import jax" > /dev/null 2>&1; then
  notes="skipped (jax does not import)"
else
  jax_s=$(cap "$JAX_S" 8)
  echo "== JAX restore $JAX_ARGS ($(left) s left; at most $jax_s s)"
  (cd /tmp && timeout "$jax_s" $PY "$REPO/benchmarks/bench_jax_restore.py" $JAX_ARGS \
    --json "$OUT/jax.json") > "$OUT/jax.log" 2>&1
  rc=$?; echo "jax exit $rc"; tail -8 "$OUT/jax.log"
  [ "$rc" = 124 ] && notes="not measured: stopped at its time limit ($jax_s s)"
  [ "$rc" != 0 ] && [ "$rc" != 124 ] && notes="not measured: bench_jax_restore.py exit $rc"
fi

if [ "$DRY_RUN" != 1 ] && [ -n "$DOORS_ARGS" ] && [ "$(left)" -ge 60 ]; then
  echo "== bench_doors $DOORS_ARGS ($(left) s left)"
  (cd /tmp && timeout "$(cap 150 8)" $PY "$REPO/benchmarks/bench_doors.py" $DOORS_ARGS \
    --json "$OUT/bench_doors.json") > "$OUT/bench_doors.log" 2>&1
  echo "doors exit $?"
  if grep -q '^== SAVE' "$OUT/bench_doors.log"; then sed -n '/^== SAVE/,$p' "$OUT/bench_doors.log"
  else tail -20 "$OUT/bench_doors.log"; fi
fi

if [ "$DRY_RUN" != 1 ] && [ -n "$BENCH_ARGS" ] && [ "$(left)" -ge 60 ]; then
  echo "== bench_gpu $BENCH_ARGS ($(left) s left)"
  (cd /tmp && timeout "$(cap 600 5)" $PY "$REPO/benchmarks/bench_gpu.py" $BENCH_ARGS \
    --json "$OUT/bench_gpu.json") > "$OUT/bench_gpu.log" 2>&1
  echo "bench_gpu exit $?"; tail -c 6000 "$OUT/bench_gpu.log"
fi

$PY "$REPO/benchmarks/bench_gpu_table.py" --summarize "$OUT/rows.jsonl" --jax-json "$OUT/jax.json" \
  ${notes:+--note "jax_restore=$notes"}
[ -n "${tests:-}" ] && echo "tests: $tests"
echo "== done in $SECONDS s (budget $BUDGET s); logs in $OUT"
