# One H100 lease (~45 min held): the judge split on the GPU and timing under load with the fixed gate and
# a JAX sampler on the same GPU (docs/LOG.md, "the trust boundary").
# The first call runs `source device/setup.sh` (the native build) before `plan`; .carry/old_main is the
# evaluator before the judge split (git archive 92350c6), .whl the ml_collections wheel.
# 1. Throughput, after and before, one after the other on the same machine.
timeout 420 python3 benchmarks/eval_throughput.py --baseline-n 0 --out $OUT/et_new.json
cd .carry/old_main && python3 setup.py build_ext --inplace > $OUT/old_build.log 2>&1 && timeout 420 python3 benchmarks/eval_throughput.py --baseline-n 0 --out $OUT/et_old.json
# 2. The whole corpus on the GPU through the judge.
timeout 900 python3 -m pytest -q -m gpu -rfE -p no:cacheprovider tests/cuda_eval/test_worker_gpu.py tests/cuda_eval/test_hack_corpus.py
# 3. Timing under load (~23 min with scenario 4).
timeout 1800 python3 benchmarks/timing_under_load.py --with-sampler --out $OUT/tul.json
