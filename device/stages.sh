#!/usr/bin/env bash
# The device checks and benchmarks, as named stages: build, then the stages asked for, each with its own time limit,
# its full log written to $OUT before its tail is printed (a pipe into `tail` loses everything when a stage hits its
# limit: docs/LOG.md, "evaluator on the H200: a start-up bug found"). Run from the repo root on the GPU machine:
#   bash device/stages.sh probe tests train             # the default when no stage is named
#   bash device/stages.sh model_tests env compile        # one call, several stages
# Stages: probe (worker start-up), tests (evaluator GPU tests), model_tests (policy, sampler and episode GPU tests),
# env (scripted policy through the environment), compile, repeatability, throughput, sampler, eval (benchmarks/*.py),
# train (2 RL steps of configs/one_gpu.py). A stage's limit is <STAGE>_S seconds (e.g. SAMPLER_S=400); EVAL_PARTS
# picks eval_builtin's parts (A,B by default).
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
STAGES=${*:-"probe tests train"}
stage() { echo "=== $(date +%T) $*"; }
limit() { local v="${1^^}_S"; echo "${!v:-$2}"; }
# run NAME DEFAULT_LIMIT_S CMD...: the command's output to $OUT/NAME.log, then its tail
run() {
  local name=$1 lim; lim=$(limit "$1" "$2"); shift 2
  stage "$name (limit ${lim}s): $*"
  timeout "$lim" "$@" > "$OUT/$name.log" 2>&1
  local rc=$?; echo "$name rc=$rc"; grep -v "^\s*$" "$OUT/$name.log" | tail -${TAIL_LINES:-40}
  return $rc
}
stage build
source device/setup.sh
export CUDA_EVAL_RESULTS_DIR=$OUT
PYTEST="python3 -m pytest -q -m gpu -rfE -p no:cacheprovider --durations=8"
for s in $STAGES; do
  case "$s" in
    probe) run probe 170 python3 device/worker_probe.py --timeout 50 || exit 1 ;;
    tests) run tests 240 $PYTEST --timeout 230 tests/cuda_eval/test_worker_gpu.py tests/cuda_eval/test_hack_corpus.py ;;
    model_tests) run model_tests 300 $PYTEST --timeout 280 tests/kevin_jax/model/test_model_gpu.py \
                   tests/kevin_jax/sampler/test_sampler_gpu.py tests/kevin_jax/env/test_episode.py ;;
    env) run env 240 python3 benchmarks/env_scripted.py --out "$OUT/env_scripted.json" ;;
    compile) run compile 300 python3 benchmarks/compile.py --baseline-reps 1 --out "$OUT/compile.json" ;;
    repeatability) run repeatability 230 python3 benchmarks/timing_repeatability.py --runs 5 \
                     --out "$OUT/timing_repeatability.json" ;;
    throughput) run throughput 300 python3 benchmarks/eval_throughput.py --out "$OUT/eval_throughput.json" ;;
    sampler) run sampler 420 python3 benchmarks/sampler.py --budget-s $(( $(limit sampler 420) - 40 )) \
               --out "$OUT/sampler.json" ;;
    eval) run eval 560 python3 benchmarks/eval_builtin.py --timeout-s $(( $(limit eval 560) - 20 )) \
            ${EVAL_PARTS:+--parts=$EVAL_PARTS} --out "$OUT/eval" ;;
    train)
      run train 300 python3 launch/train.py --config=configs/one_gpu.py --workdir=/tmp/kevin_one_gpu \
        --config.total_steps=2 --config.log.progress=False --config.holdout.every_steps=0 \
        --config.holdout.at_end=False
      mkdir -p "$OUT/train_workdir"; cp -r /tmp/kevin_one_gpu/tensorboard "$OUT/train_workdir/" 2>/dev/null ;;
    *) echo "unknown stage $s"; exit 2 ;;
  esac
done
stage done
