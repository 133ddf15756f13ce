#!/usr/bin/env bash
# The speed demo: does the speed part of the reward reach the gradient? One seed on one GPU (~25 minutes on one
# H100; docs/LOG.md, "speed variants" for the plan and criterion written before any run, "the speed demo passes its
# criterion in both seeds" for the result):
#  1. the speed of every correct built-in solution (benchmarks/builtin_speed_variants.py, one repeat, ~4 min), or the
#     measurements in SPEEDUPS=<json> (kevin_jax/data/builtin_speedups.json: the shipped H100 measurements);
#  2. a warm-start corpus from them (scripts/make_warm_start_corpus.py --speedups: the fast variant of each measured
#     pair in 20% of the correct first answers and of the answers after a correct slow kernel), in the run's folder;
#  3. the demo's warm start on it (300 steps), then multi-turn RL as runs/demo.sh's recipe
#     (advantage.baseline=turn_mean, rl.kl_coef=0.1, 15 tasks x 2 trajectories x 4 turns per step, lr 2e-5);
#  4. the summary with the speed tables and the speed criterion (analysis/warm_start_demo_summary.py --speedups).
#
#   SEED=0 SPEEDUPS=kevin_jax/data/builtin_speedups.json bash runs/speed_demo.sh
#   SEED=1 SPEEDUPS=kevin_jax/data/builtin_speedups.json bash runs/speed_demo.sh
#   RUN=single_seed0 SEED=0 SPEEDUPS=kevin_jax/data/builtin_speedups.json RL_EXTRA="--config.env.num_turns=1 \
#       --config.env.num_trajectories=8 --config.reward.return_aggregation=single_turn" bash runs/speed_demo.sh
# The last is the single-turn comparison at the same 120 kernels per step. Side by side on a machine with several
# GPUs: one per GPU (CUDA_VISIBLE_DEVICES=k), each with a RUN of its own; start them under nohup or in tmux. Then all
# runs in one summary: `python analysis/warm_start_demo_summary.py workdirs/speed_demo_seed0/speed_seed0
# workdirs/speed_demo_seed1/speed_seed1 --speedups kevin_jax/data/builtin_speedups.json --out workdirs/speed_summary`.
#
# Knobs: SEED (0), RUN (seed$SEED: names the run's folder workdirs/speed_demo_$RUN), SPEEDUPS, RL_STEPS (7), RL_EXTRA.
# Expected (4 x H200, one run per GPU, RL cut at 1350 s after each run's start: 7 and 6 RL steps; first RL step ~5
# min, then 2.4-3.2 min): mean speedup of correct kernels 0.317 -> 0.640 (seed 0) and 0.269 -> 0.504 (seed 1), the
# fast-variant share 0.20 -> 0.69 and 0.08 -> 0.58, correct 0.975 -> 0.942 and 0.908 -> 0.900: both pass. Single-turn
# rises faster per minute and stalls at ~0.44 mean speedup.
set -u
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}
SEED=${SEED:-0}
RUN=${RUN:-seed$SEED}
export RUNS=workdirs/speed_demo_$RUN
export OUT=$RUNS/out
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv; nproc; git rev-parse HEAD
speedups=$RUNS/speedups.json
if [ -n "${SPEEDUPS:-}" ]; then
  cp "$SPEEDUPS" "$speedups"
elif [ ! -f "$speedups" ]; then
  $PY benchmarks/builtin_speed_variants.py --repeats 1 --out "$speedups" > "$OUT/speed_variants.log" 2>&1 ||
    { tail -30 "$OUT/speed_variants.log"; exit 1; }
fi
$PY scripts/make_warm_start_corpus.py --speedups "$speedups" --fast-share 0.2 --out "$RUNS/corpus.jsonl" || exit 1
SFT_STEPS=300 bash runs/demo.sh sft --config.warm_start.corpus="$RUNS/corpus.jsonl" || exit $?
RL_STEPS=${RL_STEPS:-7} bash runs/demo.sh rl "speed_$RUN" "$SEED" --config.advantage.baseline=turn_mean \
  --config.rl.kl_coef=0.1 ${RL_EXTRA:-} || exit $?
$PY analysis/warm_start_demo_summary.py "$RUNS/speed_$RUN" --speedups "$speedups" --out "$OUT"
