#!/usr/bin/env bash
# One device call for the evaluator (issues 2-3): build the extension, GPU tests, timing repeatability, throughput.
# Run from the repo root on the GPU machine:  bash benchmarks/device/evaluator.sh   (results under $OUT)
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
if ls .whl/ml_collections*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    .whl/ml_collections*.whl && export PYTHONPATH=/tmp/site
fi
stage() { echo "=== $(date +%T) $*"; }
stage build; t0=$SECONDS
python3 setup.py build_ext --inplace > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
echo "build_s=$((SECONDS - t0))"
export CUDA_EVAL_RESULTS_DIR=$OUT
stage gpu-tests; t0=$SECONDS
timeout 300 python3 -m pytest -q -m gpu -rfE --timeout 280 -p no:cacheprovider \
  tests/cuda_eval/test_gpu_compile.py tests/cuda_eval/test_worker_gpu.py tests/cuda_eval/test_hack_corpus.py \
  2>&1 | tail -60 | tee "$OUT/gpu_tests.log"
echo "gpu_tests_s=$((SECONDS - t0))"
stage repeatability; t0=$SECONDS
timeout 150 python3 benchmarks/timing_repeatability.py --runs 5 --out "$OUT/timing_repeatability.json" 2>&1 | tail -25
echo "repeatability_s=$((SECONDS - t0))"
stage throughput; t0=$SECONDS
timeout ${THROUGHPUT_S:-100} python3 benchmarks/eval_throughput.py --baseline-n 2 --out "$OUT/eval_throughput.json" 2>&1 | tail -25
echo "throughput_s=$((SECONDS - t0))"
stage done
