"""The multi-turn kernel environment: prompts, response parsing, the policy contract and the episode runner."""
