# Fallback when no x4 is lent: one nvidia-h200 lease (~28 min held), session7_x4.sh's lr-1e-5 arm only, one run after
# the other (warm start, then single-turn seeds 0 and 1, multi-turn seeds 0 and 1: 5 min each), every training task
# at every step.
# First call: `source benchmarks/device/setup.sh`, export KEVIN_SKIP_BUILD=1, then `plan`.
SFT_STEPS=200 LIMIT_S=600 bash benchmarks/device/warm_start_demo.sh sft
LIMIT_S=300 RL_STEPS=60 bash benchmarks/device/warm_start_demo.sh rl single_seed0 0 --config.env.num_turns=1 --config.env.num_trajectories=8 --config.reward.aggregation=single_turn --config.optim.learning_rate=1e-5 --config.rl.tasks_per_step=15
LIMIT_S=300 RL_STEPS=60 bash benchmarks/device/warm_start_demo.sh rl single_seed1 1 --config.env.num_turns=1 --config.env.num_trajectories=8 --config.reward.aggregation=single_turn --config.optim.learning_rate=1e-5 --config.rl.tasks_per_step=15
LIMIT_S=300 RL_STEPS=60 bash benchmarks/device/warm_start_demo.sh rl multi_seed0 0 --config.optim.learning_rate=1e-5 --config.rl.tasks_per_step=15 --config.env.num_trajectories=2
LIMIT_S=300 RL_STEPS=60 bash benchmarks/device/warm_start_demo.sh rl multi_seed1 1 --config.optim.learning_rate=1e-5 --config.rl.tasks_per_step=15 --config.env.num_trajectories=2
bash benchmarks/device/warm_start_demo.sh summary
