# Second, short nvidia-h200 lease after session6_h200.sh (~12 min held): the torch.compile-baseline fix and the
# spare-worker throughput comparison (session6_x4.sh's GPUs 1-3, one after the other).
timeout 300 python3 -m pytest -q -m gpu -rfE -p no:cacheprovider tests/cuda_eval/test_worker_gpu.py -k torch_compile
EVAL_PARTS=B EVAL_S=240 bash benchmarks/device/stages.sh eval
timeout 200 python3 benchmarks/eval_throughput.py --spares 2 --baseline-n 0 --out $OUT/eval_throughput_spares2.json
timeout 200 python3 benchmarks/eval_throughput.py --spares 0 --baseline-n 0 --out $OUT/eval_throughput_auto.json
