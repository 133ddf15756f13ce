# Every KernelBench task through the full judge with a candidate made from the task (benchmarks/kernelbench_sweep.py),
# one H100 (~12 min held per call): the GPU test of the largest outputs (~3 min), then the sweep in --quick mode, the
# tasks with the largest outputs first (the 47 the old 4 GiB output channel could never judge), submitting nothing
# new after 480 s. Estimated (from the LOG's reference sweep): the 47 large-output tasks ~6 min, all 310 jobs ~22 min,
# so the rest runs in two more calls of the last line (--resume reads /tmp/kb_sweep/kb_sweep.jsonl; the machine must
# still be held, or copy the .jsonl back first). KB_ROOT: the KernelBench folder (default ../shared/kernelbench).
# First call: `source device/setup.sh && export KEVIN_SKIP_BUILD=1 && bash device/background.sh plan <this file>`;
# keep a `bash device/background.sh wait 560` in flight until "all done".
timeout 420 python3 -m pytest -q -rfE -p no:cacheprovider tests/cuda_eval/test_large_outputs_gpu.py tests/cuda_eval/test_target_gpu.py
mkdir -p /tmp/kb_sweep && timeout 590 python3 benchmarks/kernelbench_sweep.py --root ${KB_ROOT:-../shared/kernelbench} --quick --order largest-first --budget-s 480 --out /tmp/kb_sweep/kb_sweep.json; cp /tmp/kb_sweep/* $OUT/
