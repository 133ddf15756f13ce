# As run in session 5 (docs/LOG.md): GPU 2's one_gpu_train was stopped at warm-start step ~80 (3.6 s/step: 400
# steps would not fit) and single_seed1 started there by hand; a `pkill -f` of that job also killed this plan's
# runner (its command line holds every line), so the last four lines were run by hand (gpus.sh kill exists now).
# Session 5, one nvidia-h200-x4 lease (~25 min held): issue 9's demo with the three RL runs side by side, one GPU
# each, plus the leftovers of issues 6, 7 and 8 on the other GPUs. Before `plan`, the first call runs
# `source device/setup.sh` (wheel + build) and exports KEVIN_SKIP_BUILD=1, so that no job rebuilds the
# extension another has loaded. Timeline (GPU: job):
#   0: SFT (250 steps, ~7 min) -> multi_seed0 -> eval of its checkpoint
#   1: sampler GPU tests (1-stage Pallas default) -> multi_seed1 -> eval of the SFT policy
#   2: the README's main command, configs/one_gpu.py (0.5B, its own 400-step warm start, 3 RL steps)
#   3: eval_builtin parts A and B (reference solutions, torch.compile baseline) -> single_seed0
bash device/gpus.sh start one_gpu_train 2 "timeout 1260 python3 launch/train.py --config=configs/one_gpu.py --workdir=workdirs/one_gpu --config.total_steps=3 --config.log.progress=False --config.holdout.every_steps=0 --config.holdout.at_end=False --config.eval.compile_workers=16; cp -r workdirs/one_gpu/tensorboard \$OUT/"
bash device/gpus.sh start sampler_tests 1 "timeout 240 python3 -m pytest -q -m gpu -rfE -p no:cacheprovider --durations=8 tests/kevin_jax/test_sampler_gpu.py"
bash device/gpus.sh start eval_ref 3 "EVAL_S=560 bash device/stages.sh eval"
CUDA_VISIBLE_DEVICES=0 SFT_STEPS=250 LIMIT_S=600 bash device/warm_start_demo.sh sft
bash device/gpus.sh wait sampler_tests
bash device/gpus.sh start multi_seed0 0 "LIMIT_S=570 RL_STEPS=16 bash device/warm_start_demo.sh rl multi_seed0 0 --config.eval.compile_workers=16"
bash device/gpus.sh start multi_seed1 1 "LIMIT_S=570 RL_STEPS=16 bash device/warm_start_demo.sh rl multi_seed1 1 --config.eval.compile_workers=16"
bash device/gpus.sh wait eval_ref
bash device/gpus.sh start single_seed0 3 "LIMIT_S=570 RL_STEPS=16 bash device/warm_start_demo.sh rl single_seed0 0 --config.env.num_turns=1 --config.env.num_trajectories=32 --config.reward.aggregation=single_turn --config.eval.compile_workers=16"
bash device/gpus.sh wait multi_seed0 multi_seed1
bash device/gpus.sh start eval_rl 0 "timeout 300 python3 launch/eval.py --config=configs/warm_start_demo.py --config.model.shape= --config.model.hf_checkpoint=workdirs/demo/sft --config.warm_start.steps=0 --checkpoint=workdirs/demo/multi_seed0 --part=all --config.env.num_trajectories=4 --config.eval.compile_workers=16 --out=\$OUT/eval_demo_rl"
bash device/gpus.sh start eval_sft 1 "timeout 300 python3 launch/eval.py --config=configs/warm_start_demo.py --config.model.shape= --config.model.hf_checkpoint=workdirs/demo/sft --config.warm_start.steps=0 --part=all --config.env.num_trajectories=4 --config.eval.compile_workers=16 --out=\$OUT/eval_demo_sft"
bash device/gpus.sh wait single_seed0 eval_rl eval_sft one_gpu_train
bash device/warm_start_demo.sh summary
