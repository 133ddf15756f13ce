# Learning rate 5e-5 vs 2e-5 in the demo, multi- and single-turn, seeds 0 and 1: eight RL runs from one 220-step warm
# start, two per GPU (XLA_PYTHON_CLIENT_MEM_FRACTION 0.4 each), 800 s each, every training task at every step (120
# kernels); the hack corpus and the worker GPU tests run on GPUs 1-2 during the warm start. nvidia-h200-x4, ~25 min.
# Result (docs/LOG.md, "single-turn RL learns and stays stable at lr 2e-5"): single-turn at 2e-5 goes 0.55-0.65 ->
# 0.95 correct in 4 steps with flat entropy; at 5e-5 the entropy jumps ~10x after step 3 (the start of a collapse).
# Run from the repo root, after `source device/setup.sh; export KEVIN_SKIP_BUILD=1` (parallel jobs must not rebuild
# the extension): `bash device/background.sh plan device/plans/demo_lr_sweep_x4.sh`, then
# `bash device/background.sh wait 565` until it prints "all done".
bash device/gpus.sh start hack_corpus 1 'CUDA_EVAL_RESULTS_DIR=$OUT timeout 420 python3 -m pytest -q -m gpu -rfE -p no:cacheprovider tests/cuda_eval/test_hack_corpus.py'
bash device/gpus.sh start worker_gpu 2 'timeout 420 python3 -m pytest -q -m gpu -rfE -p no:cacheprovider tests/cuda_eval/test_worker_gpu.py tests/cuda_eval/test_gpu_pool_locks.py'
CUDA_VISIBLE_DEVICES=0 SFT_STEPS=220 LIMIT_S=600 bash device/warm_start_demo.sh sft
WAIT_S=20 bash device/gpus.sh wait hack_corpus worker_gpu
bash device/gpus.sh kill hack_corpus
bash device/gpus.sh kill worker_gpu
bash device/gpus.sh start multi_seed0 0 "XLA_PYTHON_CLIENT_MEM_FRACTION=0.4 LIMIT_S=800 RL_STEPS=60 bash device/warm_start_demo.sh rl multi_seed0 0 --config.optim.learning_rate=5e-5 --config.env.num_trajectories=2 --config.rl.tasks_per_step=15 --config.eval.compile_workers=8"
bash device/gpus.sh start multi_seed1 0 "XLA_PYTHON_CLIENT_MEM_FRACTION=0.4 LIMIT_S=800 RL_STEPS=60 bash device/warm_start_demo.sh rl multi_seed1 1 --config.optim.learning_rate=5e-5 --config.env.num_trajectories=2 --config.rl.tasks_per_step=15 --config.eval.compile_workers=8"
bash device/gpus.sh start multi_lr2_seed0 1 "XLA_PYTHON_CLIENT_MEM_FRACTION=0.4 LIMIT_S=800 RL_STEPS=60 bash device/warm_start_demo.sh rl multi_lr2_seed0 0 --config.optim.learning_rate=2e-5 --config.env.num_trajectories=2 --config.rl.tasks_per_step=15 --config.eval.compile_workers=8"
bash device/gpus.sh start multi_lr2_seed1 1 "XLA_PYTHON_CLIENT_MEM_FRACTION=0.4 LIMIT_S=800 RL_STEPS=60 bash device/warm_start_demo.sh rl multi_lr2_seed1 1 --config.optim.learning_rate=2e-5 --config.env.num_trajectories=2 --config.rl.tasks_per_step=15 --config.eval.compile_workers=8"
bash device/gpus.sh start single_seed0 2 "XLA_PYTHON_CLIENT_MEM_FRACTION=0.4 LIMIT_S=800 RL_STEPS=60 bash device/warm_start_demo.sh rl single_seed0 0 --config.optim.learning_rate=5e-5 --config.env.num_turns=1 --config.env.num_trajectories=8 --config.reward.aggregation=single_turn --config.rl.tasks_per_step=15 --config.eval.compile_workers=8"
bash device/gpus.sh start single_seed1 2 "XLA_PYTHON_CLIENT_MEM_FRACTION=0.4 LIMIT_S=800 RL_STEPS=60 bash device/warm_start_demo.sh rl single_seed1 1 --config.optim.learning_rate=5e-5 --config.env.num_turns=1 --config.env.num_trajectories=8 --config.reward.aggregation=single_turn --config.rl.tasks_per_step=15 --config.eval.compile_workers=8"
bash device/gpus.sh start single_lr2_seed0 3 "XLA_PYTHON_CLIENT_MEM_FRACTION=0.4 LIMIT_S=800 RL_STEPS=60 bash device/warm_start_demo.sh rl single_lr2_seed0 0 --config.env.num_turns=1 --config.env.num_trajectories=8 --config.reward.aggregation=single_turn --config.rl.tasks_per_step=15 --config.optim.learning_rate=2e-5 --config.eval.compile_workers=8"
bash device/gpus.sh start single_lr2_seed1 3 "XLA_PYTHON_CLIENT_MEM_FRACTION=0.4 LIMIT_S=800 RL_STEPS=60 bash device/warm_start_demo.sh rl single_lr2_seed1 1 --config.env.num_turns=1 --config.env.num_trajectories=8 --config.reward.aggregation=single_turn --config.rl.tasks_per_step=15 --config.optim.learning_rate=2e-5 --config.eval.compile_workers=8"
WAIT_S=900 bash device/gpus.sh wait multi_seed0 multi_seed1 multi_lr2_seed0 multi_lr2_seed1 single_seed0 single_seed1 single_lr2_seed0 single_lr2_seed1
bash device/warm_start_demo.sh summary
