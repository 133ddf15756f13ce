# After the timed-output fix (docs/LOG.md, "timing under load on one H100"), one H100 (~25 min held): the evaluator's
# GPU suite (the whole honest + adversarial corpus through judge and worker, the profile GPU tests with their profiles
# and texts kept in $OUT/dump for docs/EVALUATOR.md's examples) and the slow naive GEMMs' timed-output check, then
# profile feedback's overhead (benchmarks/profile_overhead.py), then the measured speed of every correct built-in
# solution (benchmarks/builtin_speed_variants.py: its JSON becomes kevin_jax/data/builtin_speedups.json).
# First call: `source device/setup.sh && export KEVIN_SKIP_BUILD=1 && bash device/background.sh plan <this file>`,
# carry [".whl"]; then keep one `bash device/background.sh wait 560` call in flight until "all done".
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv; nproc
KERNEL_PROFILE_DUMP=$OUT/dump timeout 560 python3 -m pytest -q -m gpu -rfE -p no:cacheprovider --durations=10 tests/cuda_eval tests/kevin_jax/tasks/test_builtin_solutions_gpu.py
timeout 480 python3 benchmarks/profile_overhead.py --rounds 2 --out $OUT/profile_overhead.json
timeout 420 python3 benchmarks/builtin_speed_variants.py --repeats 3 --out $OUT/builtin_speedups.json
