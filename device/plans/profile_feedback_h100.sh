# Profile feedback on one H100 (~10 min held): the GPU tests of the profile (honest corpus kernels and their
# references profiled after the verdict, cuobjdump's resources, occupancy, the feedback text; verdicts unchanged),
# their profiles and texts kept in $OUT/dump (docs/EVALUATOR.md's examples), then benchmarks/profile_overhead.py (the
# GPU slot's wall per correct candidate with and without a profile, and the reference's and candidate's medians
# before and after the profiler ran in the judge). First call (setup.sh builds the native extension once):
# `source device/setup.sh && export KEVIN_SKIP_BUILD=1 && bash device/background.sh plan <this file>`, carry [".whl"];
# then keep one `bash device/background.sh wait 560` call in flight until "all done". Afterwards: three of
# $OUT/dump/*.txt into docs/EVALUATOR.md's marked "Examples" place, the overhead table into docs/LOG.md.
which cuobjdump nvcc; nvidia-smi -L; python3 -c "import torch; print(torch.__version__, torch.version.cuda)"
KERNEL_PROFILE_DUMP=$OUT/dump timeout 420 python3 -m pytest -q -m gpu -rfE -p no:cacheprovider --durations=5 tests/cuda_eval/test_profile_gpu.py
timeout 540 python3 benchmarks/profile_overhead.py --rounds 2 --out $OUT/profile_overhead.json
