# Fallback when no x4 is lent: one nvidia-h200 lease (~28 min held) for issue 9's demo alone, one run after the other
# (warm start, multi-turn seeds 0 and 1, single-turn seed 0: ~6-7 min each). The checks of session6_x4.sh's GPUs 1-3
# (torch.compile fix, spare-worker throughput) then go to a second, shorter lease: session6_h200_b.sh. The checkpoint
# evaluations do not fit (checkpoints do not outlive a lease). First call: `source benchmarks/device/setup.sh`,
# export KEVIN_SKIP_BUILD=1, then `plan`.
SFT_STEPS=250 LIMIT_S=600 bash benchmarks/device/warm_start_demo.sh sft
LIMIT_S=400 RL_STEPS=40 bash benchmarks/device/warm_start_demo.sh rl multi_seed0 0
LIMIT_S=400 RL_STEPS=40 bash benchmarks/device/warm_start_demo.sh rl single_seed0 0 --config.env.num_turns=1 --config.env.num_trajectories=32 --config.reward.aggregation=single_turn
LIMIT_S=400 RL_STEPS=40 bash benchmarks/device/warm_start_demo.sh rl multi_seed1 1
bash benchmarks/device/warm_start_demo.sh summary
