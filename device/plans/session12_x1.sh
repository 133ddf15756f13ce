# Issue 9's deciding run (ran in session 12, both seeds passed the criterion: docs/LOG.md, "session 12"; README's
# "Does it learn?" gives it as the command that reproduces the demo). One single-GPU lease per seed, as session 11
# (nvidia-h100-x1 / nvidia-h200; ~23 min held each).
# Session 11 (docs/LOG.md): with reward.baseline=turn_mean the per-turn advantage offset is gone, yet seed 0 failed
# the criterion and seed 1 passed. What told them apart: the failed seed's later turns un-sharpened (sampled NLL per
# token, turns 1-3: 0.026-0.056 -> 0.056-0.076; responses with a token drawn at p < 0.05: 0.27-0.37 -> 0.40-0.49)
# and derailed more often (format ok 0.67-0.83 -> 0.54-0.69), while the passing seed's fell (0.034-0.063 ->
# 0.030-0.048). The change under test: a k3 KL penalty to the warm-start policy, rl.kl_coef=0.1, which pushes down
# exactly the sampled tokens that the warm start found unlikely. Everything else is session 11's (turn_mean, 180-step
# warm start, 120 kernels per step, policy and evaluator on one GPU, same deadline); session 11's runs are the control.
# Written before the run (docs/LOG.md, session 11): the criterion unchanged (per seed, last 3 steps vs step 1,
# all-kernel correct fraction and mean score each >= +0.05; both seeds), and the mechanism's prediction: in both
# seeds, rollout/turn{1,2,3}/sampled_nll over the last 3 steps no higher than at step 1 (the summary's per-turn table).
# Use: first call `source device/setup.sh; export KEVIN_SKIP_BUILD=1; SEED=N bash
# device/background.sh plan device/plans/session12_x1.sh`, then `background.sh wait 565` calls;
# the last also runs `(cd workdirs/demo && tar czf $OUT/traj_seedN.tgz kl_seedN/trajectories)` (~10 MB) so that the
# summary can be rerun on the dev box over both leases' runs.
date +%s > /tmp/kevin_plan_t0
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv; nproc
SFT_STEPS=180 LIMIT_S=600 bash device/warm_start_demo.sh sft
LIMIT_S=$(( $(cat /tmp/kevin_plan_t0) + ${DEADLINE_S:-1330} - $(date +%s) )) RL_STEPS=60 bash device/warm_start_demo.sh rl kl_seed${SEED:-0} ${SEED:-0} --config.reward.baseline=turn_mean --config.rl.kl_coef=0.1
bash device/warm_start_demo.sh summary
