# Session 4, second lease (what the first one cut): the reference solutions through launch/eval.py (issue 8), the
# compile benchmark's per-phase table with CPU seconds (its first run hit the 240 s stage limit inside the ablations),
# and the sampler's 7B rows (skipped by the first run's budget), with the blocking the first run found best.
EVAL_PARTS=A EVAL_S=200 bash device/stages.sh eval
timeout 120 python3 benchmarks/compile.py --skip baseline,nvcc,ablations --reps 3 --out "$OUT/compile.json"
timeout 330 python3 benchmarks/sampler.py --configs qwen2.5_7b --sweep 64:512:4:1 --budget-s 300 --out "$OUT/sampler_7b.json"
