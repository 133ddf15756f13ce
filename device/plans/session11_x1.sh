# Session 11, one single-GPU lease per seed (only nvidia-h100-x1 / nvidia-h200 were lent; a machine goes back after
# 30 min held). Issue 9 as the issue words it: the one-GPU demo, warm start and multi-turn RL, policy and evaluator on
# the same GPU, within one lease. The change under test is session 10's: reward.baseline=turn_mean (each turn-sample
# compared with the same task's samples at that turn; the std stays the task's). Session 10's runs (Kevin's one
# baseline, same 180-step warm start, same seeds, same 120 kernels per step, 2 GPUs per run) are the control, read at
# the same step count as these runs reach.
# Criterion, written in docs/LOG.md before the run (session 9's, unchanged): per seed, mean of the last 3 steps vs
# step 1, all-kernel correct fraction and mean score each higher by >= 0.05; both seeds.
# Use (SEED=0 on the first lease, SEED=1 on the second); the first call runs `source device/setup.sh` and
# exports KEVIN_SKIP_BUILD=1 before `SEED=N bash device/background.sh plan <this file>`. RL stops
# DEADLINE_S (1330) after the plan's start, so that the summary is in before the machine's 30 minutes are up.
date +%s > /tmp/kevin_plan_t0
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv; nproc
SFT_STEPS=180 LIMIT_S=600 bash device/warm_start_demo.sh sft
LIMIT_S=$(( $(cat /tmp/kevin_plan_t0) + ${DEADLINE_S:-1330} - $(date +%s) )) RL_STEPS=60 bash device/warm_start_demo.sh rl turn_mean_seed${SEED:-0} ${SEED:-0} --config.reward.baseline=turn_mean
bash device/warm_start_demo.sh summary
