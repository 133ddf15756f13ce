# Next lease, nvidia-h200-x4, ~29 min held (start 1, build 1, warm start ~10, RL 15, summary and slack 2 min).
# 1. During the warm start (GPU 0): session 8's evaluator changes on the GPU. Workers die with their evaluator
#    (test_sandbox.py runs as root there: the dedicated-uid sandbox), the cached reference time checked next to each
#    candidate (test_worker_gpu.py: the second candidate of a task must still use the cache on an idle GPU), the hack
#    corpus, and throughput with the check in place (eval_throughput; `timing_contended` should be 0 on an idle GPU).
# 2. Issue 9: only the two multi-turn seeds (single-turn was shown twice), two GPUs each: JAX on the first, cuda_eval
#    on both (a GPU evaluates one candidate at a time, ~1 s each, so session 8's rounds of 30 kernels took 25-29 s on
#    one GPU), 30 compile workers each. Evaluation on two GPUs was never tried in a run before: a run that fails
#    resumes with evaluation on one GPU.
# The first call runs `source device/setup.sh` and exports KEVIN_SKIP_BUILD=1 before `plan`.
bash device/gpus.sh start gpu_tests 1 'timeout 560 python3 -m pytest -q -m gpu -rfE -p no:cacheprovider tests/cuda_eval/test_worker_gpu.py tests/cuda_eval/test_gpu_pool_locks.py tests/cuda_eval/test_hack_corpus.py'
bash device/gpus.sh start sandbox_tests 2 'timeout 300 python3 -m pytest -q -rfE -p no:cacheprovider tests/cuda_eval/test_sandbox.py'
bash device/gpus.sh start eval_throughput 3 'timeout 360 python3 benchmarks/eval_throughput.py --baseline-n 0 --compile-workers 8 --out $OUT/eval_throughput.json'
CUDA_VISIBLE_DEVICES=0 LIMIT_S=720 bash device/warm_start_demo.sh sft
WAIT_S=30 bash device/gpus.sh wait gpu_tests sandbox_tests eval_throughput
bash device/gpus.sh kill gpu_tests
bash device/gpus.sh kill sandbox_tests
bash device/gpus.sh kill eval_throughput
bash device/gpus.sh start multi_seed0 0,1 'T0=$SECONDS; LIMIT_S=880 RL_STEPS=60 bash device/warm_start_demo.sh rl multi_seed0 0 --config.gpu.jax_devices=0 --config.eval.devices=0,1 --config.eval.compile_workers=30; rc=$?; left=$((880 - SECONDS + T0)); if [ $rc -ne 0 ] && [ $rc -ne 124 ] && [ $left -gt 150 ]; then echo "two-GPU evaluation failed (rc=$rc): resuming on one"; LIMIT_S=$left RL_STEPS=60 bash device/warm_start_demo.sh rl multi_seed0 0 --config.gpu.jax_devices=0 --config.eval.devices=0 --config.eval.compile_workers=30; fi'
bash device/gpus.sh start multi_seed1 2,3 'T0=$SECONDS; LIMIT_S=880 RL_STEPS=60 bash device/warm_start_demo.sh rl multi_seed1 1 --config.gpu.jax_devices=0 --config.eval.devices=0,1 --config.eval.compile_workers=30; rc=$?; left=$((880 - SECONDS + T0)); if [ $rc -ne 0 ] && [ $rc -ne 124 ] && [ $left -gt 150 ]; then echo "two-GPU evaluation failed (rc=$rc): resuming on one"; LIMIT_S=$left RL_STEPS=60 bash device/warm_start_demo.sh rl multi_seed1 1 --config.gpu.jax_devices=0 --config.eval.devices=0 --config.eval.compile_workers=30; fi'
WAIT_S=930 bash device/gpus.sh wait multi_seed0 multi_seed1
bash device/warm_start_demo.sh summary
