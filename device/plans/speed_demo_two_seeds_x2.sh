# The speed demo's two seeds side by side on a two-GPU machine (nvidia-h100-x2, ~27 min held at the full count),
# each on its own GPU and its own 16 of the 32 cores (device/gpus.sh with CPUS: taskset), so that each sees what one
# H100 with 16 cores sees: device/plans/speed_demo_x1.sh with the shipped H100 measurements, RL until 1440 s after
# each job's start (~7 RL steps: the first ~4.6 min, then ~2.6 min each; docs/LOG.md, "the speed demo's first seed").
# The single-turn comparison the same way: a third run on a later lease, RUN=single_seed0 RL_EXTRA="..." (see
# speed_demo_x1.sh).
# First call: `source device/setup.sh && export KEVIN_SKIP_BUILD=1 && bash device/background.sh plan <this file>`,
# carry [".whl"]; then `bash device/background.sh wait 560` until "all done" (each job's files under jobs/NAME, with
# its trajectories in jobs/NAME/traj.tgz for the two-seed summary: `python analysis/warm_start_demo_summary.py
# speed_seed0 speed_seed1 --speedups kevin_jax/data/builtin_speedups.json --out ...` over the unpacked runs).
nvidia-smi --query-gpu=index,name,memory.total --format=csv; nproc; git rev-parse HEAD
CPUS=0-15 bash device/gpus.sh start speed_seed0 0 "SEED=0 SPEEDUPS=kevin_jax/data/builtin_speedups.json bash device/plans/speed_demo_x1.sh; (cd workdirs/speed_demo_seed0 && tar czf \$OUT/traj.tgz speed_seed0/trajectories speed_seed0/tensorboard)"
CPUS=16-31 bash device/gpus.sh start speed_seed1 1 "SEED=1 SPEEDUPS=kevin_jax/data/builtin_speedups.json bash device/plans/speed_demo_x1.sh; (cd workdirs/speed_demo_seed1 && tar czf \$OUT/traj.tgz speed_seed1/trajectories speed_seed1/tensorboard)"
WAIT_S=1600 bash device/gpus.sh wait speed_seed0 speed_seed1
