# KernelBench's rules on the GPU, one H100 (~15 min held): every level 1-3 reference through the judge (outcome,
# time, peak memory per task) and the candidate set under the kevin and kernelbench profiles (cuda_eval/profiles.py).
# ../shared/kernelbench does not travel: copy it first (`cp -r ../shared/kernelbench .carry/kernelbench`). First call:
# `source device/setup.sh && export KEVIN_SKIP_BUILD=1 && bash device/background.sh plan <this file>`, carry
# [".whl", ".carry/kernelbench"]; keep a `bash device/background.sh wait 560` in flight until "all done".
timeout 900 python3 benchmarks/kernelbench_references.py --root .carry/kernelbench --out $OUT/kernelbench_references.json
timeout 600 python3 benchmarks/profiles_compare.py --out $OUT/profiles_compare.json
