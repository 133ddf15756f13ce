# configs/one_gpu.py's step time on one GPU and 16 cores (~20 min held; docs/LOG.md, "step time on one H100"):
# 1. its 400-step warm start as an HF checkpoint (launch/sft.py, timed: the first part of the README command);
# 2. one RL step's rollout from it with the sequential and the overlapped runner, each with a cold build cache
#    (benchmarks/rl_step_overlap.py, 2 turns instead of 4 to fit the lease);
# 3. the README command's RL part from that checkpoint until its first RL step completes, cold build cache
#    (benchmarks/time_to_first_step.py): time to the first RL step = stage 1's wall + this one's.
# Run as a plan on one GPU (`bash device/background.sh plan <this file>`) or as one job of a two-GPU plan
# (device/plans/speed_seed0_and_step_time_x2.sh runs it as a script). Needs carry [".whl"].
rm -rf /tmp/one_gpu_sft /tmp/one_gpu_rl /var/tmp/cuda_eval_cache_first_step; nproc; python3 -c "import os; print(len(os.sched_getaffinity(0)), 'usable cores')"
python3 benchmarks/time_to_first_step.py --keep-running --limit-s 540 --milestone 'warm_start_done=step (\d+)/\1: answer NLL' --milestone 'checkpoint_written=SFT checkpoint in' --log $OUT/sft.log --out $OUT/sft_time.json -- python3 launch/sft.py --config=configs/one_gpu.py --workdir=/tmp/one_gpu_sft
timeout 720 python3 benchmarks/rl_step_overlap.py --config configs/one_gpu.py --warm-checkpoint /tmp/one_gpu_sft --steps 1 --variants sequential,overlapped --set env.num_turns=2 --out $OUT/rl_step_overlap.json
CUDA_EVAL_CACHE_DIR=/var/tmp/cuda_eval_cache_first_step python3 benchmarks/time_to_first_step.py --limit-s 600 --milestone 'first_round=\bround 0\b.*\blive, generate ' --milestone 'first_rl_step=\bstep 1/\d+: score ' --log $OUT/first_step.log --out $OUT/first_step.json -- python3 launch/train.py --config=configs/one_gpu.py --workdir=/tmp/one_gpu_rl --config.model.shape= --config.model.hf_checkpoint=/tmp/one_gpu_sft --config.warm_start.steps=0
