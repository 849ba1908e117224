#!/usr/bin/env bash
# The CPU suite N times at once (default 20), each run with its own fresh seeds, on a many-core machine with the
# GPU hidden: every randomized test must hold for every seed. Prints each run's summary line; exit 1 if any failed.
#   OUT=folder bash tools/cpu_repeat.sh 20
set -u
export PYTHONPATH=. CUDA_VISIBLE_DEVICES= NUMBA_ENABLE_CUDASIM=1
OUT=${OUT:-cpu_repeat}; mkdir -p "$OUT"
runs=${1:-20}
for i in $(seq "$runs"); do
  FP8LADDER_CACHE_DIR=/tmp/fp8ladder-cpu-$i python3 -m pytest -q -p no:cacheprovider -m "not gpu" tests \
    > "$OUT/run_$i.log" 2>&1 &
done
wait
failed=0
for i in $(seq "$runs"); do
  echo "run $i: $(tail -1 "$OUT/run_$i.log")"
  grep -q "failed\|error" <(tail -1 "$OUT/run_$i.log") && failed=1
done
exit $failed
