# Next lease, nvidia-h200-x4, ~27 min held. Issue 9: session 10's runs with one change, the advantage baseline.
# Session 10 (docs/LOG.md): with Kevin's one baseline over all of a task's turn-samples, the last turn's samples got
# -0.3 to -0.6 std of advantage on average at every step (an early turn's return sums more discounted scores), and
# last-turn kernels got worse while first turns rose; seed 1 missed the criterion (all-kernel correct +0.014).
# Here reward.baseline=turn_mean (each turn compared with the same task's samples at that turn; std unchanged), same
# 180-step warm start, same seeds, placement and deadline, so session 10's runs are the control.
# Criterion, written before the run (as in session 9): per seed, mean of the last 3 steps vs step 1, all-kernel
# correct fraction and mean score each higher by >= 0.05, both seeds.
# The first call runs `source device/setup.sh` and exports KEVIN_SKIP_BUILD=1 before `plan`.
date +%s > /tmp/kevin_plan_t0
CUDA_VISIBLE_DEVICES=0 SFT_STEPS=180 LIMIT_S=600 bash device/warm_start_demo.sh sft
bash device/gpus.sh start turn_mean_seed0 0,1 'LIMIT_S=$(( $(cat /tmp/kevin_plan_t0) + 1540 - $(date +%s) )) RL_STEPS=60 bash device/warm_start_demo.sh rl turn_mean_seed0 0 --config.reward.baseline=turn_mean --config.gpu.jax_devices=0 --config.eval.devices=0,1 --config.eval.compile_workers=30'
bash device/gpus.sh start turn_mean_seed1 2,3 'LIMIT_S=$(( $(cat /tmp/kevin_plan_t0) + 1540 - $(date +%s) )) RL_STEPS=60 bash device/warm_start_demo.sh rl turn_mean_seed1 1 --config.reward.baseline=turn_mean --config.gpu.jax_devices=0 --config.eval.devices=0,1 --config.eval.compile_workers=30'
WAIT_S=1600 bash device/gpus.sh wait turn_mean_seed0 turn_mean_seed1
bash device/warm_start_demo.sh summary
