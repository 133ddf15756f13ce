#!/usr/bin/env bash
# Evaluation on a Ray cluster, on one machine with 4 GPUs: GPU 0 is the trainer's, GPUs 1-3 evaluation nodes.
#  scaling_a  the build cache warmed once, the local backend on GPU 1, then a Ray pool of 1 GPU
#             (benchmarks/ray_scaling.py; ~6 min on 4 x H200 with 64 cores)
#  scaling_b  Ray pools of 2 and 3 GPUs, then the table: candidates/hour against GPUs in the pool, the ratio to the
#             local backend (target >= 2.7x at 3 GPUs), verdicts agreeing with the local backend's, the p95 of
#             |speedup ratio - 1| over paired kernels of >= 50 us (~4 min)
#  train      configs/one_gpu.py on GPU 0 for one RL step, its kernels built and timed on GPUs 1-3 through Ray
#             (runs/ray_cluster.py; ~8 min: the 400-step warm start, then the first step)
#   bash runs/ray_eval.sh                     # all three
#   bash runs/ray_eval.sh scaling_a           # some of them (scaling_b reads scaling_a's JSON files)
# Knobs: WORK (/tmp/ray_eval: JSON files, logs, the workdir), CORES (compile cores per GPU: nproc / 4).
# Ray must be importable (README, "Evaluation on a cluster"); Ray's servers bind this machine's address.
set -u
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}
WORK=${WORK:-/tmp/ray_eval}
CORES=${CORES:-$(( $(nproc) / 4 ))}
mkdir -p "$WORK"
export RAY_DISABLE_USAGE_STATS=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
$PY -c "import cuda_eval._native" 2>/dev/null || $PY setup.py build_ext --inplace > "$WORK/build.log" 2>&1 ||
  { tail -30 "$WORK/build.log"; exit 1; }
stages=("$@")
[ ${#stages[@]} -eq 0 ] && stages=(scaling_a scaling_b train)
for stage in "${stages[@]}"; do
  echo "=== $stage $(date -u +%H:%M:%S)"
  case $stage in
    scaling_a)
      $PY benchmarks/ray_scaling.py --step local --out "$WORK/scaling" --cores-per-gpu "$CORES" &&
      $PY benchmarks/ray_scaling.py --step ray --gpus 1 --out "$WORK/scaling" --cores-per-gpu "$CORES" ;;
    scaling_b)
      $PY benchmarks/ray_scaling.py --step ray --gpus 2,3 --out "$WORK/scaling" --cores-per-gpu "$CORES" ;;
    train)
      $PY runs/ray_cluster.py --gpus 1,2,3 --cores-per-gpu "$CORES" -- \
        env CUDA_VISIBLE_DEVICES=0 $PY launch/train.py --config=configs/one_gpu.py --workdir="$WORK/train" \
        --config.total_steps=1 --config.eval.backend=ray 2>&1 | tee "$WORK/train.log" |
        grep -E "round|episode of step|step 1/|evaluate|Error|error" ;;
    *) echo "unknown stage $stage"; exit 2 ;;
  esac
done
