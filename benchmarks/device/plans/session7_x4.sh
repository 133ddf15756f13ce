# Next lease, nvidia-h200-x4, ~27 min held (start 1.5, build 1, warm start 4.5, RL 14.5, summary and slack 5 min):
# issue 9's demo again, after session 6 showed that RL at lr 5e-5 flattened the memorised policy (docs/LOG.md).
# Overrides of configs/warm_start_demo.py: every training task at every step (clean per-step curves: 15 tasks x 2
# trajectories x 4 turns, or x 8 x 1 single-turn, 120 kernels per step) at lr 1e-5 and 2e-5, against single-turn's
# collapse at 5e-5. Eight RL runs, two per GPU (XLA_PYTHON_CLIENT_MEM_FRACTION: two JAX processes share a GPU; cuda_eval's timing lock is
# machine-wide per GPU, so their measurements never overlap): {multi, single} x {seed 0, 1} at lr 1e-5, and the same
# four at 2e-5 (at 5e-5 both single-turn seeds rose over the first ~5 steps, then collapsed).
# While the warm start runs on GPU 0: cuda_eval's GPU tests on GPU 1 (the machine-wide timing lock is new).
# The first call runs `source benchmarks/device/setup.sh` and exports KEVIN_SKIP_BUILD=1 before `plan`.
bash benchmarks/device/gpus.sh start cuda_eval_gpu 1 "timeout 250 python3 -m pytest -q -m gpu -rfE -p no:cacheprovider tests/cuda_eval"
CUDA_VISIBLE_DEVICES=0 SFT_STEPS=200 LIMIT_S=600 bash benchmarks/device/warm_start_demo.sh sft
WAIT_S=30 bash benchmarks/device/gpus.sh wait cuda_eval_gpu
bash benchmarks/device/gpus.sh kill cuda_eval_gpu
bash benchmarks/device/gpus.sh start multi_seed0 0 "XLA_PYTHON_CLIENT_MEM_FRACTION=0.4 LIMIT_S=840 RL_STEPS=60 bash benchmarks/device/warm_start_demo.sh rl multi_seed0 0 --config.env.num_trajectories=2 --config.rl.tasks_per_step=15 --config.optim.learning_rate=1e-5 --config.eval.compile_workers=8"
bash benchmarks/device/gpus.sh start multi_lr2_seed0 0 "XLA_PYTHON_CLIENT_MEM_FRACTION=0.4 LIMIT_S=840 RL_STEPS=60 bash benchmarks/device/warm_start_demo.sh rl multi_lr2_seed0 0 --config.optim.learning_rate=2e-5 --config.env.num_trajectories=2 --config.rl.tasks_per_step=15 --config.eval.compile_workers=8"
bash benchmarks/device/gpus.sh start multi_seed1 1 "XLA_PYTHON_CLIENT_MEM_FRACTION=0.4 LIMIT_S=840 RL_STEPS=60 bash benchmarks/device/warm_start_demo.sh rl multi_seed1 1 --config.env.num_trajectories=2 --config.rl.tasks_per_step=15 --config.optim.learning_rate=1e-5 --config.eval.compile_workers=8"
bash benchmarks/device/gpus.sh start multi_lr2_seed1 1 "XLA_PYTHON_CLIENT_MEM_FRACTION=0.4 LIMIT_S=840 RL_STEPS=60 bash benchmarks/device/warm_start_demo.sh rl multi_lr2_seed1 1 --config.optim.learning_rate=2e-5 --config.env.num_trajectories=2 --config.rl.tasks_per_step=15 --config.eval.compile_workers=8"
bash benchmarks/device/gpus.sh start single_seed0 2 "XLA_PYTHON_CLIENT_MEM_FRACTION=0.4 LIMIT_S=840 RL_STEPS=60 bash benchmarks/device/warm_start_demo.sh rl single_seed0 0 --config.env.num_turns=1 --config.env.num_trajectories=8 --config.reward.aggregation=single_turn --config.rl.tasks_per_step=15 --config.optim.learning_rate=1e-5 --config.eval.compile_workers=8"
bash benchmarks/device/gpus.sh start single_lr2_seed0 2 "XLA_PYTHON_CLIENT_MEM_FRACTION=0.4 LIMIT_S=840 RL_STEPS=60 bash benchmarks/device/warm_start_demo.sh rl single_lr2_seed0 0 --config.env.num_turns=1 --config.env.num_trajectories=8 --config.reward.aggregation=single_turn --config.rl.tasks_per_step=15 --config.optim.learning_rate=2e-5 --config.eval.compile_workers=8"
bash benchmarks/device/gpus.sh start single_seed1 3 "XLA_PYTHON_CLIENT_MEM_FRACTION=0.4 LIMIT_S=840 RL_STEPS=60 bash benchmarks/device/warm_start_demo.sh rl single_seed1 1 --config.env.num_turns=1 --config.env.num_trajectories=8 --config.reward.aggregation=single_turn --config.rl.tasks_per_step=15 --config.optim.learning_rate=1e-5 --config.eval.compile_workers=8"
bash benchmarks/device/gpus.sh start single_lr2_seed1 3 "XLA_PYTHON_CLIENT_MEM_FRACTION=0.4 LIMIT_S=840 RL_STEPS=60 bash benchmarks/device/warm_start_demo.sh rl single_lr2_seed1 1 --config.env.num_turns=1 --config.env.num_trajectories=8 --config.reward.aggregation=single_turn --config.rl.tasks_per_step=15 --config.optim.learning_rate=2e-5 --config.eval.compile_workers=8"
bash benchmarks/device/gpus.sh wait multi_seed0 multi_lr2_seed0 multi_seed1 multi_lr2_seed1 single_seed0 single_lr2_seed0 single_seed1 single_lr2_seed1
bash benchmarks/device/warm_start_demo.sh summary
