"""The GPU a prompt names: the card the evaluator runs the kernels on (env.gpu_name="auto"), or the configured name.
How cuda_eval finds the card is tested in tests/cuda_eval/test_target_gpu.py."""
from cuda_eval.api import EvalConfig
from kevin_jax.env import episode
from kevin_jax.env.episode import EnvConfig, resolve_gpu_name


class EvaluatorFake:
    gpu_name = "NVIDIA B200"


def test_auto_names_the_evaluators_card(monkeypatch):
    asked = []

    def target_gpu_name_fake(config):
        asked.append(config)
        return "NVIDIA A100-SXM4-80GB"
    monkeypatch.setattr(episode, "target_gpu_name", target_gpu_name_fake)
    config = EvalConfig(devices="1")
    assert EnvConfig().gpu_name == "auto"
    assert resolve_gpu_name("auto", config, EvaluatorFake()) == "NVIDIA B200"     # the judge's device, when known
    assert resolve_gpu_name("auto", config) == "NVIDIA A100-SXM4-80GB" and asked == [config]
    assert resolve_gpu_name("NVIDIA H100", config, EvaluatorFake()) == "NVIDIA H100"   # the config overrides
