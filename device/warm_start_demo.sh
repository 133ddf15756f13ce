#!/usr/bin/env bash
# The one-GPU demo (configs/warm_start_demo.py), one stage per call; every stage resumes or skips what an
# earlier call finished, so a stage cut by its time limit is simply called again. Stages can also run back to back in
# one background plan (device/background.sh).
#   bash device/warm_start_demo.sh sft                   # SFT on the shipped corpus -> workdirs/demo/sft
#   bash device/warm_start_demo.sh rl multi_seed0 0      # multi-turn RL from the SFT checkpoint
#   bash device/warm_start_demo.sh rl multi_seed1 1
#   bash device/warm_start_demo.sh rl single_seed0 0 --config.env.num_turns=1 \
#        --config.env.num_trajectories=8 --config.reward.aggregation=single_turn    # same 120 kernels per step
#   bash device/warm_start_demo.sh summary               # table + summary.json + PNG curves in $OUT
#   bash device/warm_start_demo.sh eval multi_seed0      # launch/eval.py on a run's newest checkpoint
#   bash device/warm_start_demo.sh eval sft              # ... or on the warm start itself
# Knobs: CONFIG (configs/warm_start_demo.py), RUNS (workdirs/demo: git-ignored, kept between calls on a warm
# machine), SFT_STEPS and RL_STEPS (default: the config's), LIMIT_S (560: the stage's own time limit, under the
# call's). Logs go to $OUT before their tail is printed.
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
RUNS=${RUNS:-workdirs/demo}; mkdir -p "$RUNS"
LIMIT_S=${LIMIT_S:-560}
CONFIG=${CONFIG:-configs/warm_start_demo.py}
source device/setup.sh
stage=${1:?stage: sft | rl NAME SEED [overrides...] | summary | eval NAME [overrides...]}; shift
echo "=== $(date +%T) $stage $*"
case "$stage" in
  sft)
    if [ -f "$RUNS/sft/config.json" ]; then echo "SFT checkpoint already in $RUNS/sft"; exit 0; fi
    rm -rf "$RUNS/sft" "$RUNS/sft.tmp"
    timeout "$LIMIT_S" python3 launch/sft.py --config="$CONFIG" --workdir="$RUNS/sft" \
      ${SFT_STEPS:+--config.warm_start.steps=$SFT_STEPS} "$@" > "$OUT/sft.log" 2>&1
    rc=$?; echo "sft: rc=$rc after ${SECONDS}s"; grep -E "answer NLL|SFT checkpoint|Error" "$OUT/sft.log" | tail -20
    tail -c 1500 "$OUT/sft.log"
    cp "$RUNS/sft/sft_stats.json" "$OUT/" 2>/dev/null; exit $rc ;;
  rl)
    name=${1:?run name}; seed=${2:?seed}; shift 2
    [ -f "$RUNS/sft/config.json" ] || { echo "no SFT checkpoint in $RUNS/sft: run the sft stage first"; exit 1; }
    timeout "$LIMIT_S" python3 launch/train.py --config="$CONFIG" --workdir="$RUNS/$name" \
      --config.seed="$seed" --config.model.shape= --config.model.hf_checkpoint="$RUNS/sft" \
      --config.warm_start.steps=0 ${RL_STEPS:+--config.total_steps=$RL_STEPS} --config.log.progress=False "$@" \
      >> "$OUT/rl_$name.log" 2>&1
    rc=$?; echo "rl $name: rc=$rc after ${SECONDS}s"
    grep -E "step [0-9]+/|resuming|fresh run" "$OUT/rl_$name.log" | tail -20
    tail -c 1500 "$OUT/rl_$name.log"
    mkdir -p "$OUT/tensorboard_$name"; cp -r "$RUNS/$name/tensorboard/." "$OUT/tensorboard_$name/" 2>/dev/null
    [ $rc -eq 124 ] && echo "cut at ${LIMIT_S}s: call the same stage again to resume"
    exit $rc ;;
  eval)
    name=${1:?run name, or sft}; shift
    [ -f "$RUNS/sft/config.json" ] || { echo "no SFT checkpoint in $RUNS/sft: run the sft stage first"; exit 1; }
    checkpoint=(); [ "$name" = sft ] || checkpoint=(--checkpoint="$RUNS/$name")
    timeout "$LIMIT_S" python3 launch/eval.py --config="$CONFIG" --config.model.shape= \
      --config.model.hf_checkpoint="$RUNS/sft" --config.warm_start.steps=0 "${checkpoint[@]}" --part=all \
      --config.env.num_trajectories=4 --out="$OUT/eval_demo_$name" "$@" > "$OUT/eval_$name.log" 2>&1
    rc=$?; echo "eval $name: rc=$rc after ${SECONDS}s"; tail -c 4000 "$OUT/eval_$name.log"; exit $rc ;;
  summary)
    dirs=$(for d in "$RUNS"/*/; do [ -d "$d/trajectories" ] && echo "${d%/}"; done)
    python3 analysis/warm_start_demo_summary.py $dirs --out "$OUT" ;;
  *) echo "unknown stage $stage"; exit 2 ;;
esac
