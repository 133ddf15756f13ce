"""The multi-turn kernel environment: prompts, response parsing, the policy contract, the round loop (episode.py)
with its evaluations in flight (submissions.py) and their replay, and trajectories as plain data (trajectory.py)."""
