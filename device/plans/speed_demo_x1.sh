# The speed demo (docs/LOG.md, "speed variants": plan and criterion, written before the run): does the speed part of
# the reward reach the gradient? One seed per machine (SEED=0, SEED=1), one H100 or H200, ~25 minutes held per seed:
# 1. measure every correct built-in solution (benchmarks/builtin_speed_variants.py, one repeat, ~4 min), or take the
#    measurements from SPEEDUPS=<json> (e.g. kevin_jax/data/builtin_speedups.json from speed_variants_h100.sh: saves
#    the 4 minutes for RL steps);
# 2. write the warm-start corpus from them (scripts/make_warm_start_corpus.py --speedups: the fast variant of each
#    measured pair in 20% of correct first answers and of the answers after a correct slow kernel) to
#    /tmp/kevin_speed_<RUN>_corpus.jsonl (the checkout's shipped corpus is left alone);
# 3. the demo's warm start on it (300 steps: the speed mix has ~1.6x the distinct records of the plain corpus), then
#    multi-turn RL exactly as device/plans/demo_turn_mean_kl_x1.sh (reward.baseline=turn_mean, rl.kl_coef=0.1, 15
#    tasks x 2 trajectories x 4 turns per step, lr 2e-5), until DEADLINE_S (1440) seconds after the plan's start;
# 4. the summary (analysis/warm_start_demo_summary.py --speedups: the speed tables, the speed criterion with the
#    fast-variant share, speed.png).
# Needs: the device budget for ~25 min of one H100 per seed (two leases for the criterion's two seeds), carry [".whl"].
# First call: `source device/setup.sh && export KEVIN_SKIP_BUILD=1 && SEED=0 bash device/background.sh plan <this
# file>`, then `bash device/background.sh wait 565` until "all done" (everything in $OUT/background.tgz: the
# measurements in stage 3, the corpus and its description in stage 4); to rerun the summary elsewhere over both seeds:
# `(cd workdirs/speed_demo_seedN && tar czf $OUT/traj_seedN.tgz speed_seedN/trajectories)`. Every path is the
# run's own (RUN, default seed<SEED>), so that runs can go side by side (device/plans/speed_demo_two_seeds_x2.sh);
# RL_EXTRA adds overrides, e.g. single-turn at the same 120 kernels per step: RUN=single_seed0 RL_EXTRA="
# --config.env.num_turns=1 --config.env.num_trajectories=8 --config.reward.aggregation=single_turn".
date +%s > /tmp/kevin_speed_${RUN:-seed${SEED:-0}}_t0
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv; nproc; git rev-parse HEAD
if [ -n "${SPEEDUPS:-}" ]; then cp "$SPEEDUPS" /tmp/kevin_speed_${RUN:-seed${SEED:-0}}_speedups.json; else timeout 420 python3 benchmarks/builtin_speed_variants.py --repeats 1 --out /tmp/kevin_speed_${RUN:-seed${SEED:-0}}_speedups.json; fi; cp /tmp/kevin_speed_${RUN:-seed${SEED:-0}}_speedups.json $OUT/
python3 scripts/make_warm_start_corpus.py --speedups /tmp/kevin_speed_${RUN:-seed${SEED:-0}}_speedups.json --fast-share 0.2 --out /tmp/kevin_speed_${RUN:-seed${SEED:-0}}_corpus.jsonl && cp /tmp/kevin_speed_${RUN:-seed${SEED:-0}}_corpus.jsonl $OUT/
RUNS=workdirs/speed_demo_${RUN:-seed${SEED:-0}} SFT_STEPS=300 LIMIT_S=600 bash device/warm_start_demo.sh sft --config.warm_start.corpus=/tmp/kevin_speed_${RUN:-seed${SEED:-0}}_corpus.jsonl
RUNS=workdirs/speed_demo_${RUN:-seed${SEED:-0}} LIMIT_S=$(( $(cat /tmp/kevin_speed_${RUN:-seed${SEED:-0}}_t0) + ${DEADLINE_S:-1440} - $(date +%s) )) RL_STEPS=60 bash device/warm_start_demo.sh rl speed_${RUN:-seed${SEED:-0}} ${SEED:-0} --config.reward.baseline=turn_mean --config.rl.kl_coef=0.1 ${RL_EXTRA:-}
python3 analysis/warm_start_demo_summary.py workdirs/speed_demo_${RUN:-seed${SEED:-0}}/speed_${RUN:-seed${SEED:-0}} --speedups /tmp/kevin_speed_${RUN:-seed${SEED:-0}}_speedups.json --out $OUT
