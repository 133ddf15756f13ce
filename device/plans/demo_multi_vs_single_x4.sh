# Multi-turn vs single-turn RL in the demo at the same 120 kernels per step (lr 2e-5): a 180-step warm start on GPU 0
# (benchmarks/eval_throughput.py on GPU 1 meanwhile), then four runs, one per GPU, 840 s each: multi-turn (2
# trajectories x 4 turns) and single-turn (8 x 1) with seeds 0 and 1; then the summary. nvidia-h200-x4, ~27 minutes.
# Result (docs/LOG.md, "multi-turn RL at lr 2e-5"): single-turn correct 0.62 -> 0.88-0.94 in 15-16 steps, stable;
# multi-turn reaches 3-7 steps (~2 min each), seed 1 all-kernel correct 0.475 -> 0.683; single-turn improves ~3x
# faster per minute.
# Run from the repo root, after `source device/setup.sh; export KEVIN_SKIP_BUILD=1` (parallel jobs must not rebuild
# the extension): `bash device/background.sh plan device/plans/demo_multi_vs_single_x4.sh`, then
# `bash device/background.sh wait 565` until it prints "all done".
bash device/gpus.sh start eval_throughput 1 'timeout 360 python3 benchmarks/eval_throughput.py --baseline-n 0 --compile-workers 8 --out $OUT/eval_throughput.json'
CUDA_VISIBLE_DEVICES=0 SFT_STEPS=180 LIMIT_S=600 bash device/warm_start_demo.sh sft
WAIT_S=30 bash device/gpus.sh wait eval_throughput
bash device/gpus.sh kill eval_throughput
bash device/gpus.sh start multi_seed0 0 "LIMIT_S=840 RL_STEPS=60 bash device/warm_start_demo.sh rl multi_seed0 0 --config.eval.compile_workers=16"
bash device/gpus.sh start multi_seed1 1 "LIMIT_S=840 RL_STEPS=60 bash device/warm_start_demo.sh rl multi_seed1 1 --config.eval.compile_workers=16"
bash device/gpus.sh start single_seed0 2 "LIMIT_S=840 RL_STEPS=60 bash device/warm_start_demo.sh rl single_seed0 0 --config.env.num_turns=1 --config.env.num_trajectories=8 --config.reward.aggregation=single_turn --config.eval.compile_workers=16"
bash device/gpus.sh start single_seed1 3 "LIMIT_S=840 RL_STEPS=60 bash device/warm_start_demo.sh rl single_seed1 1 --config.env.num_turns=1 --config.env.num_trajectories=8 --config.reward.aggregation=single_turn --config.eval.compile_workers=16"
WAIT_S=900 bash device/gpus.sh wait multi_seed0 multi_seed1 single_seed0 single_seed1
bash device/warm_start_demo.sh summary
