#!/usr/bin/env bash
# One device call: worker start-up probe, evaluator GPU tests, then a short one_gpu training run.
#   bash benchmarks/device/evaluator_and_train.sh      (results under $OUT)
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
if ls .whl/ml_collections*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    .whl/ml_collections*.whl && export PYTHONPATH=/tmp/site
fi
stage() { echo "=== $(date +%T) $*"; }
stage build
python3 setup.py build_ext --inplace > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
stage probe
timeout 170 python3 benchmarks/device/worker_probe.py --timeout 50 > "$OUT/probe.log" 2>&1
rc=$?; tail -c 5000 "$OUT/probe.log"; [ $rc -eq 0 ] || { echo "probe failed rc=$rc"; exit 1; }
stage gpu-tests
export CUDA_EVAL_RESULTS_DIR=$OUT
timeout ${TESTS_S:-240} python3 -m pytest -q -m gpu -rfE --timeout 230 -p no:cacheprovider --durations=8 \
  tests/cuda_eval/test_worker_gpu.py tests/cuda_eval/test_hack_corpus.py > "$OUT/gpu_tests.log" 2>&1
tail -c 6000 "$OUT/gpu_tests.log"
stage train
timeout ${TRAIN_S:-300} python3 launch/train.py --config=configs/one_gpu.py --workdir=/tmp/kevin_one_gpu \
  --config.total_steps=2 --config.log.progress=False --config.holdout.every_steps=0 --config.holdout.at_end=False \
  > "$OUT/train.log" 2>&1
echo "train rc=$?"; grep -v "^\s*$" "$OUT/train.log" | tail -40
mkdir -p "$OUT/train_workdir"; cp -r /tmp/kevin_one_gpu/tensorboard "$OUT/train_workdir/" 2>/dev/null
ls /tmp/kevin_one_gpu 2>/dev/null
stage done
