# Profile feedback on one H100 (~10 min held): the GPU tests of the profile (honest corpus kernels and their
# references profiled after the verdict, cuobjdump's resources, occupancy, the feedback text; verdicts unchanged),
# their profiles and texts kept in $OUT/dump (docs/EVALUATOR.md's examples), then benchmarks/profile_overhead.py (the
# GPU slot's wall per correct candidate with and without a profile, and the reference's and candidate's medians
# before and after the profiler ran in the judge). First call:
# `source device/setup.sh && export KEVIN_SKIP_BUILD=1 && bash device/background.sh plan <this file>` after one
# `source device/setup.sh` that builds, carry [".whl"]; keep a `bash device/background.sh wait 560` call in flight
# until "all done".
which cuobjdump nvcc; nvidia-smi -L; python3 -c "import torch; print(torch.__version__, torch.version.cuda)"
KERNEL_PROFILE_DUMP=$OUT/dump timeout 420 python3 -m pytest -q -m gpu -rfE -p no:cacheprovider --durations=5 tests/cuda_eval/test_profile_gpu.py
timeout 540 python3 benchmarks/profile_overhead.py --rounds 2 --out $OUT/profile_overhead.json
