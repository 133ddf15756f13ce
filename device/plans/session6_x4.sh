# Next lease, nvidia-h200-x4, ~27 min held (start 1.5, build 1, warm start 4.5, RL 14.5, summary and evaluations 4):
# issue 9's demo with four RL runs side by side (multi-turn and single-turn, seeds 0 and 1), each pinned to one GPU,
# with enough time for ~10+ steps each; while the warm start runs, the checks left from session 5 on the other GPUs:
#   1: the torch.compile-baseline fix (worker GPU test + eval_builtin part B, which now checks its verdicts)
#   2, 3: eval_throughput with 2 spare workers (the old default) and with the automatic count (8 here), 16 compile
#         workers each (an H200 lease's cores), side by side
# The first call runs `source device/setup.sh` and exports KEVIN_SKIP_BUILD=1 before `plan`.
bash device/gpus.sh start compile_fix 1 "timeout 300 python3 -m pytest -q -m gpu -rfE -p no:cacheprovider tests/cuda_eval/test_worker_gpu.py -k torch_compile; EVAL_PARTS=B EVAL_S=300 bash device/stages.sh eval"
bash device/gpus.sh start throughput_spares2 2 "timeout 330 python3 benchmarks/eval_throughput.py --spares 2 --compile-workers 16 --baseline-n 0 --out \$OUT/eval_throughput.json"
bash device/gpus.sh start throughput_auto 3 "timeout 330 python3 benchmarks/eval_throughput.py --spares 0 --compile-workers 16 --baseline-n 0 --out \$OUT/eval_throughput.json"
CUDA_VISIBLE_DEVICES=0 SFT_STEPS=200 LIMIT_S=600 bash device/warm_start_demo.sh sft
WAIT_S=90 bash device/gpus.sh wait compile_fix throughput_spares2 throughput_auto
for j in compile_fix throughput_spares2 throughput_auto; do bash device/gpus.sh kill $j; done
bash device/gpus.sh start multi_seed0 0 "LIMIT_S=870 RL_STEPS=60 bash device/warm_start_demo.sh rl multi_seed0 0 --config.eval.compile_workers=16"
bash device/gpus.sh start multi_seed1 1 "LIMIT_S=870 RL_STEPS=60 bash device/warm_start_demo.sh rl multi_seed1 1 --config.eval.compile_workers=16"
bash device/gpus.sh start single_seed0 2 "LIMIT_S=870 RL_STEPS=60 bash device/warm_start_demo.sh rl single_seed0 0 --config.env.num_turns=1 --config.env.num_trajectories=32 --config.reward.aggregation=single_turn --config.eval.compile_workers=16"
bash device/gpus.sh start single_seed1 3 "LIMIT_S=870 RL_STEPS=60 bash device/warm_start_demo.sh rl single_seed1 1 --config.env.num_turns=1 --config.env.num_trajectories=32 --config.reward.aggregation=single_turn --config.eval.compile_workers=16"
bash device/gpus.sh wait multi_seed0 multi_seed1 single_seed0 single_seed1
bash device/warm_start_demo.sh summary
bash device/gpus.sh start eval_rl 0 "LIMIT_S=200 bash device/warm_start_demo.sh eval multi_seed0 --config.eval.compile_workers=32"
bash device/gpus.sh start eval_sft 1 "LIMIT_S=200 bash device/warm_start_demo.sh eval sft --config.eval.compile_workers=32"
bash device/gpus.sh wait eval_rl eval_sft
