# The speed of every correct built-in solution on one H100 (~10 min held): every correct_*.py of the 17 built-in tasks
# through cuda_eval.api (kevin profile: correctness trials, gated timing against PyTorch eager, hack checks), three
# repeats in separate batches; a table of speedups per (task, solution) and the tasks whose slowest and fastest
# measured-correct solutions are not 1.5x apart (benchmarks/builtin_speed_variants.py). Its JSON is what
# scripts/make_warm_start_corpus.py reads: commit it as kevin_jax/data/builtin_speedups.json (then regenerate the
# corpus: `python scripts/make_warm_start_corpus.py`) only from a run on the GPU the demo uses.
# First call: `source device/setup.sh && export KEVIN_SKIP_BUILD=1 && bash device/background.sh plan <this file>`,
# carry [".whl"]; keep a `bash device/background.sh wait 560` in flight until "all done" (JSON and table in
# $OUT/background.tgz, stage 2). Expected: ~1 min start-up, ~38 solutions x 3 repeats at ~1-2 s of GPU each.
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv; nproc; git rev-parse HEAD
timeout 570 python3 benchmarks/builtin_speed_variants.py --repeats 3 --out $OUT/builtin_speedups.json
