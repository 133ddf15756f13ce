"""Multi-turn RL: scores, returns and advantages (scores.py), the loss and the train state."""
