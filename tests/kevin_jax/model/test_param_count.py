"""qwq_32b has exactly the real checkpoint's parameters; every named config's count is consistent."""
import jax
import numpy as np
import pytest
from flax import nnx

from kevin_jax.model import hf, qwen2
from kevin_jax.model.shapes import NAMED_CONFIGS, named_config

# QwQ-32B's model.safetensors.index.json: "total_size": 65527752704 bytes of bf16 = 2 bytes per parameter,
# in 771 tensors (64 layers x 12 + embed + norm + lm_head).
QWQ_32B_TOTAL_SIZE_BYTES = 65_527_752_704
QWQ_32B_TENSORS = 771


def test_qwq_32b_parameter_count_matches_checkpoint():
    config = named_config("qwq_32b")
    assert config.param_count() == QWQ_32B_TOTAL_SIZE_BYTES // 2 == 32_763_876_352
    assert len([1 for m in hf.tensor_maps(config) for _ in range(config.num_hidden_layers if m.per_layer else 1)]) \
        == QWQ_32B_TENSORS
    # The model as built (shapes only, nothing allocated) has exactly that many parameters.
    state = nnx.state(qwen2.abstract_model(config))
    assert sum(int(np.prod(leaf.shape)) for leaf in jax.tree_util.tree_leaves(state)) == config.param_count()


@pytest.mark.parametrize("name", sorted(NAMED_CONFIGS))
def test_built_model_matches_config_count(name):
    config = named_config(name)
    state = nnx.state(qwen2.abstract_model(config))
    assert sum(int(np.prod(leaf.shape)) for leaf in jax.tree_util.tree_leaves(state)) == config.param_count()


@pytest.mark.parametrize("name, published", [("qwen2.5_0.5b", "0.49"), ("qwen2.5_1.5b", "1.54"), ("qwen2.5_7b", "7.61"),
                                             ("qwen2.5_14b", "14.7")])
def test_qwen25_counts_match_model_cards(name, published):
    # Model cards truncate ("Number of Parameters: 7.61B"); 32B's card says 32.5B, the files say 32.76B (see above).
    decimals = len(published.split(".")[1])
    count = named_config(name).param_count() / 1e9
    assert f"{int(count * 10**decimals) / 10**decimals:.{decimals}f}" == published
