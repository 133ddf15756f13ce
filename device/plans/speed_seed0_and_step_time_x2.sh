# Two jobs side by side on a two-GPU machine (nvidia-h100-x2: ~25 min held), each on its own GPU and its own 16 of
# the 32 cores (device/gpus.sh with CPUS: taskset), so that each sees what one H100 with 16 cores would:
#   GPU 0, cores 0-15:  the speed demo, seed 0 (device/plans/speed_demo_x1.sh with the shipped H100 measurements,
#                       RL until 1320 s after its start);
#   GPU 1, cores 16-31: configs/one_gpu.py's step time (device/plans/step_time_one_gpu.sh).
# First call: `source device/setup.sh && export KEVIN_SKIP_BUILD=1 && bash device/background.sh plan <this file>`,
# carry [".whl"]; then `bash device/background.sh wait 560` until "all done" (each job's files under jobs/NAME).
nvidia-smi --query-gpu=index,name,memory.total --format=csv; nproc; git rev-parse HEAD
CPUS=0-15 bash device/gpus.sh start speed_seed0 0 "SEED=0 SPEEDUPS=kevin_jax/data/builtin_speedups.json DEADLINE_S=1320 bash device/plans/speed_demo_x1.sh"
CPUS=16-31 bash device/gpus.sh start step_time 1 "timeout 1380 bash device/plans/step_time_one_gpu.sh"
WAIT_S=1560 bash device/gpus.sh wait speed_seed0 step_time
