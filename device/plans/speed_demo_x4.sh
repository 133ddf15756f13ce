# The speed demo's criterion runs and its single-turn comparison on one four-GPU machine (nvidia-h100-x4, ~27 min
# held at the full count), each job on its own GPU and its own 16 of the 64 cores (device/gpus.sh with CPUS), so
# that each sees what one H100 with 16 cores sees:
#   GPU 0, 1: device/plans/speed_demo_x1.sh, seeds 0 and 1, multi-turn (2 trajectories x 4 turns x 15 tasks);
#   GPU 2:    the same with single-turn RL at the same 120 kernels per step (8 trajectories x 1 turn), seed 0;
#   GPU 3:    the evaluator's GPU suite, then the README's main command timed to its first RL step
#             (benchmarks/time_to_first_step.py, cold build cache).
# Each RL run stops DEADLINE_S (1350) seconds after its job's start (~6-7 RL steps: the first ~4.6 min after it,
# then ~2.6 min each; docs/LOG.md, "the speed demo's first seed"); its trajectories and TensorBoard files come back
# in jobs/NAME/traj.tgz, for `python analysis/warm_start_demo_summary.py <runs> --speedups
# kevin_jax/data/builtin_speedups.json --out ...` over the unpacked runs.
# First call: `source device/setup.sh && export KEVIN_SKIP_BUILD=1 && bash device/background.sh plan <this file>`,
# carry [".whl"], kind nvidia-h100-x4; then `bash device/background.sh wait 560` until "all done"; fetch each job's
# files as its own archive (`tar czf $OUT/NAME.tgz --exclude='*corpus.jsonl' jobs/NAME` in $BG): all of them in one
# archive are over the tool's size limit.
# Result (4 x H200, 1426 s held; docs/LOG.md, "the speed demo passes its criterion in both seeds"): both seeds passed
# (7 and 6 RL steps); single-turn ran 25 steps, +0.15 in 4 minutes, then stalled at 0.44 mean speedup; the GPU
# suite 31 passed.
nvidia-smi --query-gpu=index,name,memory.total --format=csv; nproc; git rev-parse HEAD
CPUS=0-15 bash device/gpus.sh start speed_seed0 0 "SEED=0 DEADLINE_S=1350 SPEEDUPS=kevin_jax/data/builtin_speedups.json bash device/plans/speed_demo_x1.sh; (cd workdirs/speed_demo_seed0 && tar czf \$OUT/traj.tgz speed_seed0/trajectories speed_seed0/tensorboard)"
CPUS=16-31 bash device/gpus.sh start speed_seed1 1 "SEED=1 DEADLINE_S=1350 SPEEDUPS=kevin_jax/data/builtin_speedups.json bash device/plans/speed_demo_x1.sh; (cd workdirs/speed_demo_seed1 && tar czf \$OUT/traj.tgz speed_seed1/trajectories speed_seed1/tensorboard)"
CPUS=32-47 bash device/gpus.sh start speed_single0 2 "RUN=single_seed0 SEED=0 DEADLINE_S=1350 SPEEDUPS=kevin_jax/data/builtin_speedups.json RL_EXTRA='--config.env.num_turns=1 --config.env.num_trajectories=8 --config.reward.aggregation=single_turn' bash device/plans/speed_demo_x1.sh; (cd workdirs/speed_demo_single_seed0 && tar czf \$OUT/traj.tgz speed_single_seed0/trajectories speed_single_seed0/tensorboard)"
CPUS=48-63 bash device/gpus.sh start gpu_suite 3 "timeout 560 python3 -m pytest -q -m gpu -rfE -p no:cacheprovider --durations=10 tests/cuda_eval tests/kevin_jax/tasks/test_builtin_solutions_gpu.py"
CPUS=48-63 bash device/gpus.sh start first_step 3 "while [ ! -f \$JOBS/gpu_suite.rc ]; do sleep 3; done; rm -rf /tmp/one_gpu_cmd; CUDA_EVAL_CACHE_DIR=/var/tmp/cuda_eval_cache_cmd timeout 700 python3 benchmarks/time_to_first_step.py --limit-s 660 --milestone 'warm_start_done=step (\d+)/\1: answer NLL' --milestone 'first_round=\bround 0\b.*\blive, generate ' --milestone 'first_rl_step=\bstep 1/\d+: score ' --log \$OUT/first_step.log --out \$OUT/first_step.json -- python3 launch/train.py --config=configs/one_gpu.py --workdir=/tmp/one_gpu_cmd"
WAIT_S=1550 bash device/gpus.sh wait gpu_suite first_step speed_seed0 speed_seed1 speed_single0
