# Next lease, nvidia-h200-x4, ~27 min held (start 1.5, build 1, warm start ~8, RL 14, summary and slack 2 min):
# issue 9's multi-turn runs at the demo config's lr 2e-5, one run per GPU (session 7 ran two per GPU and the
# multi-turn runs reached only 2-5 steps: evaluation ~50 s per round of 30 kernels under that load), against
# single-turn at the same 120 kernels per step and the same wall clock. configs/warm_start_demo.py's defaults:
# 15 tasks per step, multi 2 trajectories x 4 turns, warm start 180 steps.
# While the warm start runs on GPU 0: evaluator throughput on GPU 1 with the fork check (session 7) in place, and
# what the kernel_trace phase (fork check + pile-up pass) costs per candidate (session 7 did not measure it).
# (Run as written in session 8, when the demo config's warm start was 180 steps; now explicit here.)
# The first call runs `source device/setup.sh` and exports KEVIN_SKIP_BUILD=1 before `plan`.
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
