# The rest of the lease after stage 2 of trust_and_timing_h100.sh (the full timing_under_load does not fit the
# device time left). The evaluator before the judge split runs with lock dirs of its own (the new code keeps
# /tmp/cuda_eval_device_locks private, which the old workers, opening it by path, cannot use).
timeout 600 python3 -m pytest -q -m gpu -rfE -p no:cacheprovider tests/cuda_eval/test_worker_gpu.py tests/cuda_eval/test_hack_corpus.py
cd .carry/old_main && CUDA_EVAL_DEVICE_LOCK_DIR=/tmp/old_device_locks CUDA_EVAL_SANDBOX_LOCK_DIR=/tmp/old_uid_locks timeout 420 python3 benchmarks/eval_throughput.py --baseline-n 0 --out $OUT/et_old.json
timeout 480 python3 benchmarks/timing_under_load.py --limit 12 --quick --with-sampler --out $OUT/tul_quick.json
