# Session 4 (2026-11-21), one H200 lease, in priority order (what a lost machine cuts is the tail):
# the evaluator fixes' confirmation, issue 9's demo (warm start, 2 multi-turn seeds, single-turn), the trained policy
# through launch/eval.py, the policy/sampler/episode GPU tests, the scripted environment, the compile and sampler
# benchmarks, the reference solutions through launch/eval.py. Run: bash device/background.sh plan <this>.
bash device/stages.sh probe tests
LIMIT_S=360 bash device/warm_start_demo.sh sft
LIMIT_S=300 bash device/warm_start_demo.sh rl multi_seed0 0
LIMIT_S=300 bash device/warm_start_demo.sh rl single_seed0 0 --config.env.num_turns=1 --config.env.num_trajectories=32 --config.reward.aggregation=single_turn
LIMIT_S=300 bash device/warm_start_demo.sh rl multi_seed1 1
bash device/warm_start_demo.sh summary
timeout 240 python3 launch/eval.py --config=configs/warm_start_demo.py --config.model.shape= --config.model.hf_checkpoint=workdirs/demo/sft --config.warm_start.steps=0 --checkpoint=workdirs/demo/multi_seed0 --part=all --config.env.num_trajectories=4 --out="$OUT/eval_demo_rl"
bash device/stages.sh model_tests env
COMPILE_S=240 SAMPLER_S=330 bash device/stages.sh compile sampler
EVAL_PARTS=A EVAL_S=200 bash device/stages.sh eval
