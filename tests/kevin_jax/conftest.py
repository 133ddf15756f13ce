"""The shared test helpers (kevin_env_fakes, qwen2_hf_fixtures, trainer_fakes) live here, beside the test folders
that mirror kevin_jax's packages (model/, sampler/, env/, rl/, tasks/, evaluation/); they are imported as top-level
modules from every folder."""
import sys
from pathlib import Path

HELPERS = str(Path(__file__).resolve().parent)
if HELPERS not in sys.path:
    sys.path.insert(0, HELPERS)
