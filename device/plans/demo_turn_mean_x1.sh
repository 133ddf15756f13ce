# The control of demo_turn_mean_kl_x1.sh: the same plan without the KL penalty (180-step warm start, multi-turn RL
# with reward.baseline=turn_mean, policy and evaluator on one GPU, until DEADLINE_S (1330) seconds after the plan's
# start, then the summary). One seed per machine (SEED=0, SEED=1): one H100 or H200, ~23 minutes per seed.
# Result (docs/LOG.md, "reward.baseline=turn_mean, both seeds"): 10-12 RL steps; seed 1 passes the criterion, seed 0
# fails (its later turns un-sharpen: sampled NLL per token roughly doubles).
# Run from the repo root: `SEED=0 bash device/background.sh plan device/plans/demo_turn_mean_x1.sh`, then
# `bash device/background.sh wait 565` until it prints "all done".
date +%s > /tmp/kevin_plan_t0
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv; nproc
SFT_STEPS=180 LIMIT_S=600 bash device/warm_start_demo.sh sft
LIMIT_S=$(( $(cat /tmp/kevin_plan_t0) + ${DEADLINE_S:-1330} - $(date +%s) )) RL_STEPS=60 bash device/warm_start_demo.sh rl turn_mean_seed${SEED:-0} ${SEED:-0} --config.reward.baseline=turn_mean
bash device/warm_start_demo.sh summary
