"""Multi-turn RL: returns and advantages of the scored turns (advantages.py), the loss, the train state and update,
the step's task draw and rollout statistics."""
