# Session 4, second plan on the same lease: the first plan's SFT stage (400 steps) hit its 360 s limit at ~1.3 s/step
# (NLL 0.0041 at step 160 already), so the demo is re-planned to fit what is left of the lease: 110 SFT steps, then
# multi-turn and single-turn RL runs of ~170 s each (cut by time; the summary reads whatever steps finished).
SFT_STEPS=110 LIMIT_S=200 bash device/warm_start_demo.sh sft
LIMIT_S=170 bash device/warm_start_demo.sh rl multi_seed0 0
LIMIT_S=170 bash device/warm_start_demo.sh rl single_seed0 0 --config.env.num_turns=1 --config.env.num_trajectories=32 --config.reward.aggregation=single_turn
bash device/warm_start_demo.sh summary
