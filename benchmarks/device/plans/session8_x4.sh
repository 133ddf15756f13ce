# Next lease, nvidia-h200-x4, ~27 min held (start 1.5, build 1, warm start ~8, RL 14, summary and slack 2 min):
# issue 9's multi-turn runs at the demo config's lr 2e-5, one run per GPU (session 7 ran two per GPU and the
# multi-turn runs reached only 2-5 steps: evaluation ~50 s per round of 30 kernels under that load), against
# single-turn at the same 120 kernels per step and the same wall clock. configs/warm_start_demo.py's defaults:
# 15 tasks per step, multi 2 trajectories x 4 turns, warm start 180 steps.
# The first call runs `source benchmarks/device/setup.sh` and exports KEVIN_SKIP_BUILD=1 before `plan`.
CUDA_VISIBLE_DEVICES=0 LIMIT_S=600 bash benchmarks/device/warm_start_demo.sh sft
bash benchmarks/device/gpus.sh start multi_seed0 0 "LIMIT_S=840 RL_STEPS=60 bash benchmarks/device/warm_start_demo.sh rl multi_seed0 0 --config.eval.compile_workers=16"
bash benchmarks/device/gpus.sh start multi_seed1 1 "LIMIT_S=840 RL_STEPS=60 bash benchmarks/device/warm_start_demo.sh rl multi_seed1 1 --config.eval.compile_workers=16"
bash benchmarks/device/gpus.sh start single_seed0 2 "LIMIT_S=840 RL_STEPS=60 bash benchmarks/device/warm_start_demo.sh rl single_seed0 0 --config.env.num_turns=1 --config.env.num_trajectories=8 --config.reward.aggregation=single_turn --config.eval.compile_workers=16"
bash benchmarks/device/gpus.sh start single_seed1 3 "LIMIT_S=840 RL_STEPS=60 bash benchmarks/device/warm_start_demo.sh rl single_seed1 1 --config.env.num_turns=1 --config.env.num_trajectories=8 --config.reward.aggregation=single_turn --config.eval.compile_workers=16"
WAIT_S=900 bash benchmarks/device/gpus.sh wait multi_seed0 multi_seed1 single_seed0 single_seed1
bash benchmarks/device/warm_start_demo.sh summary
