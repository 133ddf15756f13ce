# Kevin's advantage baseline (one mean over all of a task's turn-samples) in the demo, on 4 GPUs: a 180-step warm
# start on GPU 0 (tests/kevin_jax/test_sft.py on GPU 1 meanwhile; should the cuDNN warm start fail at once, it is
# redone with --config.model.attention=chunked), then both multi-turn seeds, each on two GPUs (JAX on the first,
# cuda_eval on both), until 1540 s after the plan's start; then the summary. nvidia-h200-x4, ~27 minutes held.
# Result (docs/LOG.md, "Kevin's one baseline for all turns pushes the last turn down at every step"): warm start
# 0.16 s/step; 16 RL steps per seed; seed 0 passes the criterion, seed 1 does not; the last turn's samples get
# -0.3 to -0.6 std of advantage on average at every step.
# Run from the repo root, after `source device/setup.sh; export KEVIN_SKIP_BUILD=1` (parallel jobs must not rebuild
# the extension): `bash device/background.sh plan device/plans/demo_kevin_baseline_x4.sh`, then
# `bash device/background.sh wait 565` until it prints "all done".
date +%s > /tmp/kevin_plan_t0
bash device/gpus.sh start sft_tests 1 'timeout 400 python3 -m pytest -q -rfE -p no:cacheprovider tests/kevin_jax/test_sft.py'
T=$SECONDS; CUDA_VISIBLE_DEVICES=0 SFT_STEPS=180 LIMIT_S=600 bash device/warm_start_demo.sh sft || { [ $((SECONDS - T)) -lt 200 ] && cp $OUT/sft.log $OUT/sft_cudnn.log && echo "cuDNN warm start failed: blockwise attention" && CUDA_VISIBLE_DEVICES=0 SFT_STEPS=180 LIMIT_S=600 bash device/warm_start_demo.sh sft --config.model.attention=chunked; }
WAIT_S=10 bash device/gpus.sh wait sft_tests
bash device/gpus.sh kill sft_tests
bash device/gpus.sh start multi_seed0 0,1 'LIMIT_S=$(( $(cat /tmp/kevin_plan_t0) + 1540 - $(date +%s) )) RL_STEPS=60 bash device/warm_start_demo.sh rl multi_seed0 0 --config.gpu.jax_devices=0 --config.eval.devices=0,1 --config.eval.compile_workers=30'
bash device/gpus.sh start multi_seed1 2,3 'LIMIT_S=$(( $(cat /tmp/kevin_plan_t0) + 1540 - $(date +%s) )) RL_STEPS=60 bash device/warm_start_demo.sh rl multi_seed1 1 --config.gpu.jax_devices=0 --config.eval.devices=0,1 --config.eval.compile_workers=30'
WAIT_S=1600 bash device/gpus.sh wait multi_seed0 multi_seed1
bash device/warm_start_demo.sh summary
