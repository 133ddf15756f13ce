"""Correctness beyond one input distribution (cuda_eval/judge/affine.py): which input leaves an affine trial changes,
the changes it draws, and the same arithmetic on both sides (protocol/harness.affine_inputs)."""
import random

import pytest
import torch

from cuda_eval.judge import affine
from cuda_eval.protocol.harness import affine_inputs


def test_which_leaves_change_and_why_not():
    torch.manual_seed(0)
    randn, rand = torch.randn(64, 256), torch.rand(64, 256)
    labels = torch.randint(0, 10, (64,))
    signs = torch.randint(0, 2, (64,)).float() * 2 - 1
    tril = torch.tril(torch.rand(128, 128))
    probs = torch.rand(64, 256).softmax(dim=-1)
    mask = torch.randint(0, 2, (64, 256)).bool()
    leaves, why = affine.plan([randn, rand, labels, signs, tril, probs, mask, 3], "source")
    assert [(i, kind) for i, kind, _ in leaves] == [(0, "signed"), (1, "nonnegative")]
    assert set(why) == {"2", "3", "4", "5", "6", "7"}
    assert "distinct" in why["3"] and "structured zeros" in why["4"] and "probabilities" in why["5"]


def test_draws_keep_non_negative_leaves_non_negative_and_stay_away_from_the_identity():
    rng = random.Random(1)
    leaves = [(0, "signed", 1.0), (1, "nonnegative", 0.29)]
    signs = set()
    for _ in range(200):
        change = affine.draw(leaves, rng)
        assert abs(change["scale"] - 1.0) >= 0.2 and 0.5 <= change["scale"] <= 2.0
        (i0, m0), (i1, m1) = change["leaves"]
        assert 0.25 <= abs(m0) <= 1.0 and 0.25 * 0.29 <= m1 <= 0.29
        signs.add(m0 > 0)
    assert signs == {True, False}


def test_the_change_is_the_same_arithmetic_on_both_sides():
    x, idx = torch.randn(8, 16), torch.arange(8)
    change = {"scale": 1.5, "leaves": [[0, -0.75], [1, 3.0]]}
    out = affine_inputs([x, idx], change)
    assert torch.equal(out[0], x * 1.5 + (-0.75)) and out[1] is idx       # integer leaves never change
    assert affine_inputs([x], None)[0] is x
    half = torch.randn(8).half()
    assert affine_inputs([half], {"scale": 2.0, "leaves": [[0, 1.0]]})[0].dtype == torch.float16


def test_a_task_on_the_exception_list_changes_nothing(monkeypatch):
    source = "import torch\n\nclass Model:  pass\n"
    monkeypatch.setitem(affine.EXCEPTIONS, affine.source_key("  import torch\nclass Model:  pass"), ("L1/x", "why"))
    leaves, why = affine.plan([torch.randn(4, 32)], source)
    assert leaves == [] and why == {"task": "L1/x: why"}


@pytest.mark.parametrize("out,ok", [(torch.ones(3), True), (torch.tensor([1.0, float("inf")]), False),
                                    ((torch.ones(2), torch.tensor([float("nan")])), False),
                                    (torch.tensor([1, 2]), True)])
def test_finite(out, ok):
    assert affine.finite(out) is ok
