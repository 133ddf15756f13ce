# The GPU test suite and the judge's throughput, one H100 (~20 min held): every GPU test of the evaluator (the whole
# honest + adversarial corpus through judge and worker, pinned output buffers, the shared-output channel, GPU builds),
# evaluator throughput after and before the judge split on the same machine (docs/LOG.md, "the trust boundary: a
# judge outside the candidate's reach"), then the GPU tests of the policy, sampler and environment.
# First call: `source device/setup.sh && export KEVIN_SKIP_BUILD=1 && bash device/background.sh plan <this file>`,
# carry [".carry/old_main", ".whl"] (.carry/old_main = `git archive 92350c6`, the evaluator before the split); then
# keep one `bash device/background.sh wait 560` call in flight until "all done" (an idle machine is given back after
# 30 s, and a new call re-copies the tree: carried build products are lost, so the old build runs in its stage).
timeout 600 python3 -m pytest -q -m gpu -rfE -p no:cacheprovider --durations=10 tests/cuda_eval
timeout 420 python3 benchmarks/eval_throughput.py --baseline-n 0 --out $OUT/et_new.json
# the old evaluator opens its device lock by path: lock dirs of its own (ours keeps /tmp/cuda_eval_device_locks private)
cd .carry/old_main && python3 setup.py build_ext --inplace > $OUT/old_build.log 2>&1 && CUDA_EVAL_DEVICE_LOCK_DIR=/tmp/old_device_locks CUDA_EVAL_SANDBOX_LOCK_DIR=/tmp/old_uid_locks timeout 420 python3 benchmarks/eval_throughput.py --baseline-n 0 --out $OUT/et_old.json
timeout 480 python3 -m pytest -q -m gpu -rfE -p no:cacheprovider --durations=10 tests/kevin_jax
