"""Kevin's single-turn baseline: the kevin32b recipe with one turn per trajectory and each sample its own return.

64 trajectories per task keep the 64 samples per task of the multi-turn run (16 trajectories x 4 turns).

Command (one node, laid out as configs/kevin32b.py does: detected, or named after the file name, e.g.
configs/single_turn.py:h200x8):
  python launch/train.py --config=configs/single_turn.py --workdir=/ckpt/kevin32b_single \\
      --config.model.hf_checkpoint=/ckpt/QwQ-32B --config.tasks.kernelbench_dir=/data/KernelBench

What to expect: not measured yet at this scale; only rollout/turn0/*. Kevin reports single-turn training improving
correctness less and plateauing lower than multi-turn at the same number of samples.
"""
from configs import common  # noqa: F401  (the repo root on sys.path, as for every config)
from configs import kevin32b


def get_config(layout: str = "auto"):
    c = kevin32b.get_config(layout)
    c.env.num_turns = 1
    c.env.num_trajectories = 64
    c.reward.return_aggregation = "single_turn"
    return c
