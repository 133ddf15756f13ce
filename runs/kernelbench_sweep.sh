#!/usr/bin/env bash
# Every KernelBench task through the full judge with a candidate made from the task (benchmarks/kernelbench_sweep.py,
# kernelbench profile): 250 honest candidates, which must come out correct, and wrong ones for 60 tasks, which must
# come out incorrect; then the GPU tests of the largest outputs and of the card's own arch.
#   KB_DIR=/data/KernelBench bash runs/kernelbench_sweep.sh
# One judge per GPU on every GPU the machine has. Estimated from the reference sweep (docs/LOG.md, "every KernelBench
# task evaluable ..."): ~1700 s of one H100 in all; measured on 4 x H100 (docs/LOG.md, "4 x H100: Kevin-32B at full
# size ..."): 107 verdicts of levels 1-2 in ~520 s, largest outputs first. BUDGET_S stops it cleanly; the same command
# again goes on where it stopped (--resume).
# Knobs: KB_DIR (required: a KernelBench checkout), OUT (workdirs/kernelbench_sweep), BUDGET_S (3600),
# WORKERS (compile workers, default: the machine's cores).
set -u
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}
OUT=${OUT:-workdirs/kernelbench_sweep}
[ -d "${KB_DIR:-}" ] || { echo "KB_DIR must name a KernelBench checkout (its root or its KernelBench/ folder)"; exit 2; }
mkdir -p "$OUT"
$PY -c "import cuda_eval._native" 2>/dev/null || $PY setup.py build_ext --inplace > "$OUT/build.log" 2>&1 ||
  { tail -30 "$OUT/build.log"; exit 1; }
nvidia-smi --query-gpu=name,memory.total --format=csv; git rev-parse HEAD
$PY benchmarks/kernelbench_sweep.py --root "$KB_DIR" --devices all --compile-workers "${WORKERS:-$(nproc)}" \
  --order largest-first --budget-s "${BUDGET_S:-3600}" --resume --out "$OUT/kernelbench_sweep.json"
rc=$?
$PY -m pytest -q -rfE -p no:cacheprovider tests/cuda_eval/test_large_outputs_gpu.py tests/cuda_eval/test_target_gpu.py \
  || rc=1
exit $rc
