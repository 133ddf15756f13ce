# The overlapped episode runner on one H100 with 16 cores (~20-25 min held): configs/one_gpu.py's 400-step warm start
# (~5 min), then the rollout of one RL step (4 tasks x 8 trajectories x 4 turns) with the sequential runner (one
# policy call and one evaluation per round) and with the overlapped one (2 pipeline groups: one group's kernels
# compiled and timed while the other samples; the sampler holds the evaluator's DeviceShare around each device call),
# each with its own cold build cache (docs/LOG.md, "the overlapped episode runner").
# First call: `source device/setup.sh && export KEVIN_SKIP_BUILD=1 && bash device/background.sh plan <this file>`,
# carry [".whl"]; then keep one `bash device/background.sh wait 560` call in flight until "all done".
# Shorter (~15 min): add `--set env.num_turns=2`. Also the grouped control (same trajectories as overlapped, run
# sequentially): `--variants sequential,grouped,overlapped` (~8 min more).
timeout 1700 python3 benchmarks/rl_step_overlap.py --config configs/one_gpu.py --steps 1 --variants sequential,overlapped --out $OUT/rl_step_overlap.json
