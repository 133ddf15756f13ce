#!/usr/bin/env bash
# configs/one_gpu.py's step time on one GPU (~25 minutes on one H100 with 16 cores), every stage with a cold build
# cache and a fresh workdir:
#  1. the README's main command as one process, timed to its first completed RL step
#     (benchmarks/time_to_first_step.py); docs/LOG.md, "length-bucketed warm-start batches: measured": 7.85 minutes
#     on one H100 (warm start done at 205.5 s, first RL step's episode 233.1 s = 1.10 x max(sampling, evaluation));
#  2. its warm start alone as an HF checkpoint (launch/sft.py, timed), for stage 3;
#  3. one RL step's rollout from that checkpoint with the sequential runner and with the overlapped one (2 pipeline
#     groups), 2 turns (benchmarks/rl_step_overlap.py); docs/LOG.md, "configs/one_gpu.py's step time": 78.3 s vs
#     76.9 s wall, 1.29 vs 1.04 x max(sampling, evaluation).
#   bash runs/step_time.sh            # all three;  bash runs/step_time.sh first_step | sft | overlap   # one
# Knobs: WORK (workdirs/step_time: workdirs, caches, logs, JSON). Timings are only comparable on an otherwise idle
# machine: the evaluator's compile workers use every core the process may run on (taskset -c to give it fewer).
set -u
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}
WORK=${WORK:-workdirs/step_time}
OUT=$WORK/out
mkdir -p "$OUT"
$PY -c "import cuda_eval._native" 2>/dev/null || $PY setup.py build_ext --inplace > "$OUT/build.log" 2>&1 ||
  { tail -30 "$OUT/build.log"; exit 1; }
# The build caches must be readable by the sandbox uids (not under a 0700 folder such as /root): /var/tmp.
CACHES=${CACHES:-/var/tmp/kevin_step_time_caches}
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv; git rev-parse HEAD
$PY -c "import os; print(len(os.sched_getaffinity(0)), 'usable cores')"
rc=0
for stage in ${*:-first_step sft overlap}; do
  echo "=== $(date +%T) $stage"
  case "$stage" in
    first_step)
      rm -rf "$WORK/one_process" "$CACHES/first_step"
      CUDA_EVAL_CACHE_DIR=$CACHES/first_step $PY benchmarks/time_to_first_step.py --limit-s 1200 \
        --log "$OUT/first_step.log" --out "$OUT/first_step.json" -- \
        $PY launch/train.py --config=configs/one_gpu.py --workdir="$WORK/one_process" || rc=1 ;;
    sft)
      rm -rf "$WORK/sft"
      $PY benchmarks/time_to_first_step.py --keep-running --limit-s 1200 \
        --milestone 'warm_start_done=step (\d+)/\1: answer NLL' --milestone 'checkpoint_written=SFT checkpoint in' \
        --log "$OUT/sft.log" --out "$OUT/sft_time.json" -- \
        $PY launch/sft.py --config=configs/one_gpu.py --workdir="$WORK/sft" || rc=1 ;;
    overlap)
      [ -f "$WORK/sft/config.json" ] || { echo "no warm-start checkpoint in $WORK/sft: run the sft stage first"; exit 1; }
      rm -rf "$CACHES/overlap"; mkdir -p "$CACHES/overlap"
      $PY benchmarks/rl_step_overlap.py --config configs/one_gpu.py --warm-checkpoint "$WORK/sft" --steps 1 \
        --variants sequential,overlapped --set env.num_turns=2 --cache-root "$CACHES/overlap" \
        --out "$OUT/rl_step_overlap.json" || rc=1 ;;
    *) echo "unknown stage $stage (first_step | sft | overlap)"; exit 2 ;;
  esac
done
exit $rc
