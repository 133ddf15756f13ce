#!/usr/bin/env bash
# One device call: build, worker start-up probe, evaluator GPU tests, a short one_gpu training run, and optionally the
# evaluator benchmarks. Run from the repo root on the GPU machine; results under $OUT.
#   bash benchmarks/device/evaluator_and_train.sh
#   STAGES="probe repeatability throughput" bash benchmarks/device/evaluator_and_train.sh
# Each stage writes its full log to $OUT first and prints the tail after (a pipe into `tail` loses everything when a
# stage hits its time limit: learned the hard way, docs/LOG.md 2026-11-21 session 3).
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
STAGES=${STAGES:-"probe tests train"}
if ls .whl/ml_collections*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    .whl/ml_collections*.whl && export PYTHONPATH=/tmp/site
fi
stage() { echo "=== $(date +%T) $*"; }
wants() { [[ " $STAGES " == *" $1 "* ]]; }
stage build
python3 setup.py build_ext --inplace > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
if wants probe; then
  stage probe
  timeout 170 python3 benchmarks/device/worker_probe.py --timeout 50 > "$OUT/probe.log" 2>&1
  rc=$?; tail -c 3000 "$OUT/probe.log"; [ $rc -eq 0 ] || { echo "probe failed rc=$rc"; exit 1; }
fi
export CUDA_EVAL_RESULTS_DIR=$OUT
if wants tests; then
  stage gpu-tests
  timeout ${TESTS_S:-240} python3 -m pytest -q -m gpu -rfE --timeout 230 -p no:cacheprovider --durations=8 \
    tests/cuda_eval/test_worker_gpu.py tests/cuda_eval/test_hack_corpus.py > "$OUT/gpu_tests.log" 2>&1
  tail -c 6000 "$OUT/gpu_tests.log"
fi
if wants train; then
  stage train
  timeout ${TRAIN_S:-300} python3 launch/train.py --config=configs/one_gpu.py --workdir=/tmp/kevin_one_gpu \
    --config.total_steps=2 --config.log.progress=False --config.holdout.every_steps=0 \
    --config.holdout.at_end=False > "$OUT/train.log" 2>&1
  echo "train rc=$?"; grep -v "^\s*$" "$OUT/train.log" | tail -40
  mkdir -p "$OUT/train_workdir"; cp -r /tmp/kevin_one_gpu/tensorboard "$OUT/train_workdir/" 2>/dev/null
fi
if wants repeatability; then
  stage repeatability
  timeout ${REPEAT_S:-230} python3 benchmarks/timing_repeatability.py --runs 5 \
    --out "$OUT/timing_repeatability.json" > "$OUT/repeatability.log" 2>&1
  tail -30 "$OUT/repeatability.log"
fi
if wants throughput; then
  stage throughput
  timeout ${THROUGHPUT_S:-300} python3 benchmarks/eval_throughput.py --out "$OUT/eval_throughput.json" \
    > "$OUT/throughput.log" 2>&1
  tail -50 "$OUT/throughput.log"
fi
stage done
