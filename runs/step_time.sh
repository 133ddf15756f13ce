#!/usr/bin/env bash
# configs/one_gpu.py's step time on one GPU (~35 minutes on one H100 with 16 cores), every stage with a cold build
# cache and a fresh workdir:
#  first_step  the README's main command as one process, timed to its first completed RL step
#              (benchmarks/time_to_first_step.py). docs/LOG.md, "length-bucketed warm-start batches: measured": 7.85
#              minutes on one H100 (warm start done at 205.5 s; the first RL step's episode 233.1 s, 1.10 x
#              max(sampling, evaluation)).
#  sft         its warm start alone, as an HF checkpoint (launch/sft.py, timed), for the two stages below.
#  overlap     one RL step's rollout from that checkpoint, 2 turns, sequential runner vs overlapped (2 pipeline
#              groups; benchmarks/rl_step_overlap.py). docs/LOG.md, "configs/one_gpu.py's step time": 78.3 vs 76.9 s
#              wall, 1.29 vs 1.04 x max(sampling, evaluation).
#  rl_step     the README command's RL part from that checkpoint to its first RL step, 4 turns as configured, with
#              the overlapped runner, then with the sequential one (--config.env.overlap=False
#              --config.env.pipeline_groups=1). Same entry: episode 181.6 s (1.20 x max) vs 208.0 s; sft + this =
#              8.9 minutes to the first RL step (random warm-start batches then).
#   bash runs/step_time.sh                       # all four, in this order
#   bash runs/step_time.sh sft rl_step           # some of them (overlap and rl_step need sft's checkpoint)
# Knobs: WORK (workdirs/step_time: workdirs, logs, JSON), CACHES (/var/tmp/kevin_step_time_caches: the build caches,
# which the sandbox uids must be able to read, so not under a private folder such as /root). Timings are only
# comparable on an otherwise idle machine: the evaluator's compile workers use every core the process may run on
# (`taskset -c 0-15 bash runs/step_time.sh` gives it 16).
set -u
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}
WORK=${WORK:-workdirs/step_time}
CACHES=${CACHES:-/var/tmp/kevin_step_time_caches}
OUT=$WORK/out
mkdir -p "$OUT" "$CACHES"
$PY -c "import cuda_eval._native" 2>/dev/null || $PY setup.py build_ext --inplace > "$OUT/build.log" 2>&1 ||
  { tail -30 "$OUT/build.log"; exit 1; }
STAGES=${*:-first_step sft overlap rl_step}
for stage in $STAGES; do
  case "$stage" in
    first_step|sft|overlap|rl_step) ;;
    *) echo "unknown stage $stage (first_step | sft | overlap | rl_step)"; exit 2 ;;
  esac
done
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv; git rev-parse HEAD
$PY -c "import os; print(len(os.sched_getaffinity(0)), 'usable cores')"
FIRST_STEP=(--milestone 'first_round=\bround 0\b.*\blive, generate ' --milestone 'first_rl_step=\bstep 1/\d+: score ')
FROM_SFT=(--config.model.shape= --config.model.hf_checkpoint="$WORK/sft" --config.warm_start.steps=0)
need_sft() {
  [ -f "$WORK/sft/config.json" ] || { echo "no warm-start checkpoint in $WORK/sft: run the sft stage first"; exit 1; }
}
rc=0
for stage in $STAGES; do
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
      need_sft
      rm -rf "$CACHES/overlap"; mkdir -p "$CACHES/overlap"
      $PY benchmarks/rl_step_overlap.py --config configs/one_gpu.py --warm-checkpoint "$WORK/sft" --steps 1 \
        --variants sequential,overlapped --set env.num_turns=2 --cache-root "$CACHES/overlap" \
        --out "$OUT/rl_step_overlap.json" || rc=1 ;;
    rl_step)
      need_sft
      for runner in overlapped sequential; do
        extra=(); [ $runner = sequential ] && extra=(--config.env.overlap=False --config.env.pipeline_groups=1)
        rm -rf "$WORK/rl_$runner" "$CACHES/rl_$runner"
        CUDA_EVAL_CACHE_DIR=$CACHES/rl_$runner $PY benchmarks/time_to_first_step.py --limit-s 900 "${FIRST_STEP[@]}" \
          --log "$OUT/rl_step_$runner.log" --out "$OUT/rl_step_$runner.json" -- \
          $PY launch/train.py --config=configs/one_gpu.py --workdir="$WORK/rl_$runner" "${FROM_SFT[@]}" "${extra[@]}" ||
          rc=1
      done ;;
  esac
done
exit $rc
