# The one-GPU demo as the README gives it: a 180-step warm start of configs/warm_start_demo.py, then multi-turn RL
# from it with reward.baseline=turn_mean and a k3 KL penalty to the warm start (rl.kl_coef=0.1), policy and evaluator
# on the same GPU, until DEADLINE_S (1330) seconds after the plan's start; then the summary (criterion table, per-turn
# table, PNG curves). One seed per machine (SEED=0, SEED=1): one H100 or H200, ~23 minutes per seed.
# Result (docs/LOG.md, "turn_mean plus a KL penalty to the warm start"): 9-10 RL steps per seed; both seeds pass the
# criterion (mean of the last 3 steps vs step 1, all-kernel correct fraction and mean score each >= +0.05).
# Run from the repo root: `SEED=0 bash device/background.sh plan device/plans/demo_turn_mean_kl_x1.sh`, then
# `bash device/background.sh wait 565` until it prints "all done" (everything in $OUT/background.tgz). To rerun the
# summary elsewhere over both seeds: `(cd workdirs/demo && tar czf $OUT/traj_seedN.tgz kl_seedN/trajectories)`.
date +%s > /tmp/kevin_plan_t0
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv; nproc
SFT_STEPS=180 LIMIT_S=600 bash device/warm_start_demo.sh sft
LIMIT_S=$(( $(cat /tmp/kevin_plan_t0) + ${DEADLINE_S:-1330} - $(date +%s) )) RL_STEPS=60 bash device/warm_start_demo.sh rl kl_seed${SEED:-0} ${SEED:-0} --config.reward.baseline=turn_mean --config.rl.kl_coef=0.1
bash device/warm_start_demo.sh summary
