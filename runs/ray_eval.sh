#!/usr/bin/env bash
# Evaluation on a Ray cluster, on one machine with 4 GPUs: GPU 0 is the trainer's, GPUs 1-3 evaluation nodes.
#  local   the build cache warmed once (compile_only), then the local backend on GPU 1 (benchmarks/ray_scaling.py;
#          ~4 min on 4 x H200 with 64 cores)
#  ray1    a Ray pool of 1 GPU: a head with no evaluation resources + one node (~3 min)
#  ray23   Ray pools of 2 and 3 GPUs, then the table: candidates/hour against GPUs in the pool, the ratio to the
#          local backend (target >= 2.7x at 3 GPUs), verdicts agreeing with the local backend's, the p95 of
#          |speedup ratio - 1| over paired kernels of >= 50 us (~4 min)
#  train   configs/one_gpu.py on GPU 0 for one RL step, its kernels built and timed on GPUs 1-3 through Ray
#          (runs/ray_cluster.py; ~8 min: the 400-step warm start, then the first step)
#   bash runs/ray_eval.sh                     # all four, in this order
#   bash runs/ray_eval.sh local ray1          # some of them (ray1 and ray23 print the table once local's is there)
# Knobs: WORK (/tmp/ray_eval: JSON files and logs, kept between stages; copied into $OUT when that is set), CORES
# (compile cores per GPU: nproc / 4). Ray must be importable (README, "Evaluation on a cluster").
set -u
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
WORK=${WORK:-/tmp/ray_eval}
CORES=${CORES:-$(( $(nproc) / 4 ))}
mkdir -p "$WORK"
export RAY_DISABLE_USAGE_STATS=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
$PY -c "import cuda_eval._native" 2>/dev/null || $PY setup.py build_ext --inplace > "$WORK/build.log" 2>&1 ||
  { tail -30 "$WORK/build.log"; exit 1; }
stages=("$@")
[ ${#stages[@]} -eq 0 ] && stages=(local ray1 ray23 train)
for stage in "${stages[@]}"; do
  echo "=== $stage $(date -u +%H:%M:%S)"
  case $stage in
    local) $PY benchmarks/ray_scaling.py --step local --out "$WORK/scaling" --cores-per-gpu "$CORES" ;;
    ray1) $PY benchmarks/ray_scaling.py --step ray --gpus 1 --out "$WORK/scaling" --cores-per-gpu "$CORES" ;;
    ray23) $PY benchmarks/ray_scaling.py --step ray --gpus 2,3 --out "$WORK/scaling" --cores-per-gpu "$CORES" ;;
    train)
      $PY runs/ray_cluster.py --gpus 1,2,3 --cores-per-gpu "$CORES" -- \
        env CUDA_VISIBLE_DEVICES=0 $PY launch/train.py --config=configs/one_gpu.py --workdir="$WORK/train" \
        --config.total_steps=1 --config.eval.backend=ray > "$WORK/train.log" 2>&1
      echo "exit $?"; grep -E "round|episode of step|step 1/|Error" "$WORK/train.log" | tail -40 ;;
    *) echo "unknown stage $stage"; exit 2 ;;
  esac
  if [ -n "${OUT:-}" ]; then mkdir -p "$OUT/scaling"; cp "$WORK"/scaling/*.json "$OUT/scaling/" 2>/dev/null
    cp "$WORK"/*.log "$OUT/" 2>/dev/null; fi
done
