#!/usr/bin/env bash
# One entry point for a session's GPU runs (the lent H100 has no installs: run from the repo root with
# PYTHONPATH=.). Each part writes its log under $OUT (default ./gpu_out) and goes on if a part fails; the exit
# status is non-zero when any part failed (the failed parts are named last).
#   bash tools/gpu_run.sh smoke tests ladder bench      (any subset, in that order)
#   parts: env smoke quick tests devices multigpu ladder bench grouped overhead sweep sanitize grade notebooks
set -u -o pipefail  # a part's status is its command's, not tee's
export PYTHONPATH=. PYTHONUNBUFFERED=1
OUT=${OUT:-gpu_out}; mkdir -p "$OUT"
export FP8LADDER_CACHE_DIR=${FP8LADDER_CACHE_DIR:-/tmp/fp8ladder-cache}
PY=${PY:-python3}
# Kernels with setmaxnreg are assembled by the standalone ptxas (ptx/compile.py): use the toolkit's, or take it
# out of a carried nvidia-cuda-nvcc wheel (.whl/) when the machine has none.
if ! command -v ptxas >/dev/null && [ ! -x /usr/local/cuda/bin/ptxas ] && ls .whl/nvidia_cuda_nvcc-*.whl >/dev/null 2>&1; then
  mkdir -p /tmp/ptxas_bin && $PY -c "import zipfile,glob,os; z=zipfile.ZipFile(glob.glob('.whl/nvidia_cuda_nvcc-*.whl')[0]); open('/tmp/ptxas_bin/ptxas','wb').write(z.read('nvidia/cu13/bin/ptxas')); os.chmod('/tmp/ptxas_bin/ptxas', 0o755)"
  export PATH=/tmp/ptxas_bin:$PATH
fi
run_part() {  # every command of a part counts: st is 1 if any failed
  local part=$1 st=0
  case "$part" in
    env)    echo "ptxas: $(command -v ptxas || echo /usr/local/cuda/bin/ptxas) $(ptxas --version 2>/dev/null | tail -1)"
            nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,clocks.mem,driver_version --format=csv || st=1
            $PY -c "import numba_cuda, cuda.core, cuda.bindings, torch; print('numba-cuda', numba_cuda.__version__, 'cuda-core', cuda.core.__version__, 'cuda-bindings', cuda.bindings.__version__, 'torch', torch.__version__)" || st=1 ;;
    smoke)  $PY -m ptx smoke 2>&1 | tee "$OUT/smoke.log" || st=1 ;;
    quick)  $PY -m pytest -q -m "gpu and not slow" -p no:cacheprovider --timeout=240 --maxfail=30 \
              ${TESTS:-tests} 2>&1 | tee "$OUT/pytest_quick.log" | tail -60 || st=1 ;;
    tests)  $PY -m pytest -q -m gpu -p no:cacheprovider --timeout=300 --junitxml="$OUT/junit.xml" \
              ${TESTS:-tests} 2>&1 | tee "$OUT/pytest.log" | tail -80 || st=1 ;;
    devices) # one GPU: calls follow their tensors (foreign context, threads, side-stream graph, facts), and the
             # tensor-parallel example with two gloo ranks sharing GPU 0 (NCCL refuses two ranks one GPU)
            $PY -m pytest -q -p no:cacheprovider --timeout=300 -rs --junitxml="$OUT/devices.xml" \
              tests/test_devices_gpu.py tests/test_multi_device.py \
              2>&1 | tee "$OUT/devices.log" | tail -30 || st=1
            NCCL_NVLS_ENABLE=0 $PY -m torch.distributed.run --nproc_per_node=2 examples/tensor_parallel_linear.py \
              --backend gloo --one-gpu --json "$OUT/tensor_parallel_one_gpu.json" 2>&1 | tee "$OUT/tp_one_gpu.log" | tail -20 || st=1
            $PY tools/device_report.py "$OUT/devices.xml" "$OUT/tensor_parallel_one_gpu.json" > "$OUT/devices.json" || st=1 ;;
    multigpu) # two GPUs or more (issue 18): the multigpu-marked tests, then the example with one NCCL rank per GPU
            export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
            nvidia-smi --query-gpu=index,name,driver_version --format=csv | tee "$OUT/multigpu_devices.csv" || st=1
            $PY -m pytest -q -p no:cacheprovider --timeout=300 -rs -m "multigpu or gpu" --junitxml="$OUT/multigpu.xml" \
              tests/test_devices_gpu.py tests/test_multi_device.py 2>&1 | tee "$OUT/multigpu.log" | tail -30 || st=1
            $PY -m torch.distributed.run --nproc_per_node=${NPROC:-2} examples/tensor_parallel_linear.py \
              --json "$OUT/tensor_parallel.json" 2>&1 | tee "$OUT/tp.log" | tail -20 || st=1
            $PY tools/device_report.py "$OUT/multigpu.xml" "$OUT/tensor_parallel.json" > "$OUT/multigpu.json" || st=1 ;;
    ladder) $PY -m lessons ladder --out "$OUT" ${LADDER_ARGS:-} 2>&1 | tee "$OUT/ladder.log" | tail -30 || st=1 ;;
    bench)  $PY -m gemm bench dense --out "$OUT" ${BENCH_ARGS:-} 2>&1 | tee "$OUT/bench.log" | tail -30 || st=1 ;;
    grouped) $PY -m gemm bench grouped --out "$OUT" 2>&1 | tee "$OUT/grouped.log" | tail -30 || st=1 ;;
    overhead) $PY -m gemm bench host 2>&1 | tee "$OUT/host.log" || st=1 ;;
    sweep)  # SWEEPS="shapes configs... | shapes configs..." (python -m gemm bench configs arguments, one sweep per |)
            i=0; IFS='|' read -ra jobs <<< "${SWEEPS:-}"
            for job in "${jobs[@]}"; do
              i=$((i+1)); eval "$PY -m gemm bench configs $job --json $OUT/sweep_$i.json" 2>&1 | tee "$OUT/sweep_$i.log" | tail -40 || st=1
            done ;;
    sanitize) # SANITIZE="M,N,K[@overrides] ..." (python -m gemm sanitize jobs; default: its own)
            $PY -m gemm sanitize ${SANITIZE:-} 2>&1 | tee "$OUT/sanitizer.txt" || st=1 ;;
    grade)  # the grader's calibration: every stage's own code graded on the GPU, thresholds into results/grading.json
            timeout ${GRADE_TIMEOUT:-540} $PY -m lessons calibrate ${CALIBRATE_ARGS:-} 2>&1 | tee "$OUT/calibrate.log" | tail -60 || st=1
            tar czf "$OUT/grading.tgz" results/grading.json results/grading || st=1 ;;
    notebooks) # execute notebooks in place (NOTEBOOKS="00 07 ..." or all), bring them back as one archive
            $PY -m lessons notebooks --execute ${NOTEBOOKS:-} 2>&1 | tee "$OUT/notebooks.log" | tail -40 || st=1
            tar czf "$OUT/notebooks.tgz" notebooks/*.ipynb || st=1 ;;
    *) echo "unknown part $part"; return 2 ;;
  esac
  return $st
}

failed=()
for part in "$@"; do
  echo "=== $part ($(date -u +%T))"
  run_part "$part" || failed+=("$part")
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "=== failed: ${failed[*]}"
  exit 1
fi
