# Session 7, nvidia-h200-x4, ~25 min held (start 1.5, build 1, warm start ~7, RL 13.5, summary and slack 2 min).
# 1. The evaluator's new fork check (cuda_eval/worker.py, JobRunner._gated_trace), on GPUs 1 and 2 while the warm
#    start runs on GPU 0: the hack corpus (side_stream_cpp/python must be caught by it, every honest candidate must
#    pass with the gate held) and the worker GPU tests; verdicts as JSON in the job's folder.
# 2. Issue 9's demo with the warm-start corpus that now also shows refinements after a correct kernel (turns 2-4
#    keep it; session 6's refinement turns derailed without them). Every training task at every step (15 tasks,
#    120 kernels: multi 2 trajectories x 4 turns, single 8 x 1), seeds 0 and 1, lr 5e-5 (session 6's) and 2e-5,
#    two runs per GPU (XLA_PYTHON_CLIENT_MEM_FRACTION 0.4 each; cuda_eval's timing lock is machine-wide per GPU).
# (Run as written in session 7, when the demo config's lr was 5e-5; that lr is now explicit on its runs.)
# The first call runs `source device/setup.sh` and exports KEVIN_SKIP_BUILD=1 before `plan`.
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
