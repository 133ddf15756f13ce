# For the next lease (written in session 4; see docs/LOG.md "session 4"): issue 9's demo with a warm start long
# enough to memorise the corpus (session 4: 110 steps left answer NLL 0.34 and no answer ever reached the compiler;
# the 400-step schedule was at NLL 0.0041 by step 160 but was cut by its stage limit), then launch/eval.py on the
# device (issue 8: the reference solutions, whose first try hit a 180 s limit while still compiling, and the
# trained policy). First the sampler GPU tests, with the 1-stage Pallas default set after session 4's tests ran.
# ~39 min of held time: run it as the lease's only plan, with `background.sh wait` calls back to back.
timeout 200 python3 -m pytest -q -m gpu -rfE -p no:cacheprovider tests/kevin_jax/test_sampler_gpu.py
SFT_STEPS=250 LIMIT_S=600 bash benchmarks/device/warm_start_demo.sh sft
LIMIT_S=300 bash benchmarks/device/warm_start_demo.sh rl multi_seed0 0
LIMIT_S=300 bash benchmarks/device/warm_start_demo.sh rl single_seed0 0 --config.env.num_turns=1 --config.env.num_trajectories=32 --config.reward.aggregation=single_turn
LIMIT_S=300 bash benchmarks/device/warm_start_demo.sh rl multi_seed1 1
bash benchmarks/device/warm_start_demo.sh summary
EVAL_PARTS=A EVAL_S=420 bash benchmarks/device/stages.sh eval
timeout 300 python3 launch/eval.py --config=configs/warm_start_demo.py --config.model.shape= --config.model.hf_checkpoint=workdirs/demo/sft --config.warm_start.steps=0 --checkpoint=workdirs/demo/multi_seed0 --part=all --config.env.num_trajectories=4 --out="$OUT/eval_demo_rl"
