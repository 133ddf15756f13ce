# Every KernelBench task through the full judge with a candidate made from the task (benchmarks/kernelbench_sweep.py),
# under the kernelbench profile, on 4 H100s (one judge per GPU, ~12 min held): 250 honest candidates and 60 wrong
# ones (24 / 24 / 12 over the levels). Estimated (from the LOG's reference sweep, 1678 s of one H100): ~7-8 min on
# four, plus ~1 min of start-up; --budget-s keeps it inside one call, and the last line again with --resume finishes
# what is left. Then the GPU test of the largest outputs on GPU 0. KB_ROOT: the KernelBench folder (default
# ../shared/kernelbench). First call: `source device/setup.sh && export KEVIN_SKIP_BUILD=1 && bash
# device/background.sh plan <this file>`; keep a `bash device/background.sh wait 560` in flight until "all done".
mkdir -p /tmp/kb_sweep && timeout 590 python3 benchmarks/kernelbench_sweep.py --root ${KB_ROOT:-../shared/kernelbench} --devices all --compile-workers 48 --budget-s 500 --out /tmp/kb_sweep/kb_sweep.json; cp /tmp/kb_sweep/* $OUT/
CUDA_VISIBLE_DEVICES=0 timeout 420 python3 -m pytest -q -rfE -p no:cacheprovider tests/cuda_eval/test_large_outputs_gpu.py tests/cuda_eval/test_target_gpu.py
