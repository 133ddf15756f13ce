# Next lease, nvidia-h200-x4, ~27 min held. Issue 9's deciding run, with its criterion fixed beforehand (docs/LOG.md,
# session 9; printed by the summary stage): per multi-turn seed, all-kernel correct fraction and mean score, mean of
# the last 3 steps against step 1, each higher by >= 0.05.
# 1. Warm start, 180 steps: session 9's 220-step warm start left later turns 0.87-0.97 correct at step 1 (little
#    headroom for the all-kernel mean); session 8's 180 steps started at 0.48-0.58. It is also the first warm start
#    with cuDNN flash attention (session 9's fix): its log lines give s/step and MFU (before: ~2.6 s/step on an H200,
#    0.3-0.6% MFU). Should cuDNN fail at once, it is redone with the blockwise attention of sessions 5-9.
#    Meanwhile GPU 1 runs tests/kevin_jax/test_sft.py on the GPU (the right-padded promise, the speed report).
# 2. Both multi-turn seeds, two GPUs each (session 9's placement), until a fixed deadline 1540 s after the plan's
#    start, so that a faster warm start leaves more steps; then the summary (criterion table).
# The first call runs `source device/setup.sh` and exports KEVIN_SKIP_BUILD=1 before `plan`.
date +%s > /tmp/kevin_plan_t0
bash device/gpus.sh start sft_tests 1 'timeout 400 python3 -m pytest -q -rfE -p no:cacheprovider tests/kevin_jax/test_sft.py'
T=$SECONDS; CUDA_VISIBLE_DEVICES=0 SFT_STEPS=180 LIMIT_S=600 bash device/warm_start_demo.sh sft || { [ $((SECONDS - T)) -lt 200 ] && cp $OUT/sft.log $OUT/sft_cudnn.log && echo "cuDNN warm start failed: blockwise attention" && CUDA_VISIBLE_DEVICES=0 SFT_STEPS=180 LIMIT_S=600 bash device/warm_start_demo.sh sft --config.model.attention=chunked; }
WAIT_S=10 bash device/gpus.sh wait sft_tests
bash device/gpus.sh kill sft_tests
bash device/gpus.sh start multi_seed0 0,1 'LIMIT_S=$(( $(cat /tmp/kevin_plan_t0) + 1540 - $(date +%s) )) RL_STEPS=60 bash device/warm_start_demo.sh rl multi_seed0 0 --config.gpu.jax_devices=0 --config.eval.devices=0,1 --config.eval.compile_workers=30'
bash device/gpus.sh start multi_seed1 2,3 'LIMIT_S=$(( $(cat /tmp/kevin_plan_t0) + 1540 - $(date +%s) )) RL_STEPS=60 bash device/warm_start_demo.sh rl multi_seed1 1 --config.gpu.jax_devices=0 --config.eval.devices=0,1 --config.eval.compile_workers=30'
WAIT_S=1600 bash device/gpus.sh wait multi_seed0 multi_seed1
bash device/warm_start_demo.sh summary
