"""The PPO-clip / Dr. GRPO objective (kevin_jax.rl.loss) and the packing of samples (kevin_jax.rl.batch).

Gradients are checked against hand-derived policy gradients of a categorical policy; clipping against the formula
at and around its boundaries; masking by corrupting everything outside the model's own tokens.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kevin_jax.env.trajectory import Trajectory, Turn
from kevin_jax.rl import batch as rl_batch
from kevin_jax.rl import loss as rl_loss

jax.config.update("jax_enable_x64", False)


def _flat_batch(actions, advantages, weights, sampler_logprobs, trainer_old=None, mask=None):
    n = len(actions)
    return {
        "loss_mask": jnp.ones((1, n), bool) if mask is None else jnp.asarray(mask)[None],
        "loss_weights": jnp.asarray(weights, jnp.float32)[None],
        "advantages": jnp.asarray(advantages, jnp.float32)[None],
        "sampler_logprobs": jnp.asarray(sampler_logprobs, jnp.float32)[None],
        "trainer_old_logprobs": jnp.zeros((1, n)) if trainer_old is None else jnp.asarray(trainer_old)[None],
        "ref_logprobs": jnp.zeros((1, n)),
    }


def _categorical_logp(theta, actions):
    return jax.nn.log_softmax(theta)[jnp.asarray(actions)][None]


def test_on_policy_gradient_equals_hand_derived_policy_gradient():
    rng = np.random.default_rng(0)
    theta = jnp.asarray(rng.normal(size=6), jnp.float32)
    actions = rng.integers(0, 6, size=12)
    adv = rng.normal(size=12)
    weights = rng.uniform(0.1, 1.0, size=12)
    old = np.asarray(_categorical_logp(theta, actions))[0]
    cfg = rl_loss.RLConfig()

    def loss(t):
        return rl_loss.batch_loss(_categorical_logp(t, actions), None, _flat_batch(actions, adv, weights, old), cfg,
                                  old_from_current=False)[0]

    grad = np.asarray(jax.grad(loss)(theta))
    probs = np.asarray(jax.nn.softmax(theta))
    expected = np.zeros(6)
    for a, A, w in zip(actions, adv, weights):   # -sum w A grad log pi(a) ; grad log pi(a) = e_a - pi
        expected -= w * A * (np.eye(6)[a] - probs)
    np.testing.assert_allclose(grad, expected, rtol=1e-5, atol=1e-6)
    # ratio 1 everywhere: nothing clipped, loss = -sum w A
    value, stats = rl_loss.batch_loss(_categorical_logp(theta, actions), None,
                                      _flat_batch(actions, adv, weights, old), cfg, old_from_current=False)
    np.testing.assert_allclose(float(value), -np.sum(weights * adv), rtol=1e-5)
    assert float(stats["clipped"]) == 0


@pytest.mark.parametrize("advantage,ratio,expect_clipped,expect_zero_grad", [
    (1.0, 1.28 * 1.01, True, True),       # A > 0, above 1 + eps_high: clipped, no gradient
    (1.0, 1.28 * 0.99, False, False),     # just inside
    (1.0, 0.5, False, False),             # A > 0 never clipped from below
    (-1.0, 0.8 * 0.99, True, True),       # A < 0, below 1 - eps_low: clipped
    (-1.0, 0.8 * 1.01, False, False),
    (-1.0, 3.0, False, False),            # A < 0 never clipped from above
])
def test_clipping_matches_formula_around_the_boundaries(advantage, ratio, expect_clipped, expect_zero_grad):
    cfg = rl_loss.RLConfig(clip_eps_low=0.2, clip_eps_high=0.28)
    logp0 = jnp.asarray([np.log(0.3)], jnp.float32)
    old = float(logp0[0] - np.log(ratio))

    def f(lp):
        return rl_loss.batch_loss(lp[None], None, _flat_batch([0], [advantage], [1.0], [old]), cfg,
                                  old_from_current=False)

    (value, stats), grad = jax.value_and_grad(f, has_aux=True)(logp0)
    clipped_ratio = min(max(ratio, 0.8), 1.28)
    expected = max(-advantage * ratio, -advantage * clipped_ratio)
    np.testing.assert_allclose(float(value), expected, rtol=1e-5)
    assert bool(stats["clipped"]) is expect_clipped
    if expect_zero_grad:
        assert float(grad[0]) == 0.0
    else:   # d(-A r)/dlogp = -A r
        np.testing.assert_allclose(float(grad[0]), -advantage * ratio, rtol=1e-5)


def test_clip_at_exact_boundary_value():
    cfg = rl_loss.RLConfig()
    for advantage, ratio in ((1.0, 1.28), (-1.0, 0.8)):
        loss, r, clipped = rl_loss.ppo_token_loss(jnp.log(jnp.float32(ratio)), jnp.float32(0.0),
                                                  jnp.float32(advantage), cfg.clip_eps_low, cfg.clip_eps_high)
        np.testing.assert_allclose(float(loss), -advantage * ratio, rtol=1e-6)
        assert not bool(clipped)


def test_trainer_old_logprobs_with_truncated_importance_sampling():
    cfg = rl_loss.RLConfig(old_logprobs="trainer", tis_cap=2.0)
    logp = jnp.log(jnp.asarray([[0.5, 0.5, 0.5]], jnp.float32))
    sampler = np.log([0.5, 0.1, 0.4])     # trainer/sampler = 1, 5 (capped to 2), 1.25
    batch = _flat_batch([0, 0, 0], [1.0, 1.0, 1.0], [1.0, 1.0, 1.0], sampler)
    value, stats = rl_loss.batch_loss(logp, None, batch, cfg, old_from_current=True)
    # first update: ratio against the trainer's own (current) log-probs is 1; the loss is -sum w A tis
    np.testing.assert_allclose(float(value), -(1.0 + 2.0 + 1.25), rtol=1e-5)
    np.testing.assert_allclose(float(stats["tis_sum"]), 4.25, rtol=1e-5)
    with pytest.raises(ValueError, match="old_logprobs='trainer'"):
        rl_loss.RLConfig(tis_cap=2.0)


def test_kl_k3_is_zero_at_reference_and_positive_elsewhere():
    lp = jnp.log(jnp.asarray([0.2, 0.5]))
    assert np.allclose(rl_loss.kl_k3(lp, lp), 0.0)
    assert np.all(np.asarray(rl_loss.kl_k3(lp, jnp.log(jnp.asarray([0.4, 0.1])))) > 0)


def test_aggregation_weights():
    lengths = np.array([2, 4, 0, 10])
    np.testing.assert_allclose(rl_loss.aggregation_weights(lengths, "token_mean"), 1 / 16)
    np.testing.assert_allclose(rl_loss.aggregation_weights(lengths, "constant_length", 100), 1 / 400)
    np.testing.assert_allclose(rl_loss.aggregation_weights(lengths, "sequence_mean"), [1 / 8, 1 / 16, 0, 1 / 40])
    # token mean of a per-token quantity: sum(w * x) over all tokens = plain mean
    x = [np.full(n, v) for n, v in zip(lengths, (1.0, 2.0, 3.0, 4.0))]
    w = rl_loss.aggregation_weights(lengths, "token_mean")
    assert np.isclose(sum((wi * xi).sum() for wi, xi in zip(w, x)), np.concatenate(x).mean())
    with pytest.raises(ValueError, match="constant_length"):
        rl_loss.aggregation_weights(lengths, "constant_length", 0)


# ----------------------------------------------------------------------------------------------------- packing
def _samples(rng, n, max_prompt=20, max_resp=15):
    out = []
    for _ in range(n):
        p, r = int(rng.integers(1, max_prompt)), int(rng.integers(0, max_resp))
        out.append(rl_batch.Sample(rng.integers(5, 100, size=p).tolist(), rng.integers(5, 100, size=r).tolist(),
                                   (-rng.uniform(0, 3, size=r)).tolist(), float(rng.normal())))
    return out


def test_packing_masks_exactly_the_response_tokens():
    rng = np.random.default_rng(1)
    samples = _samples(rng, 9)
    for s, w in zip(samples, rl_loss.aggregation_weights([len(s.response_tokens) for s in samples], "token_mean")):
        s.weight = float(w)
    cfg = rl_loss.RLConfig(micro_batch_tokens=128, min_row_len=16, pack=True)
    mbs, layout = rl_batch.micro_batches(samples, cfg)
    assert all(mb["tokens"].shape == (layout.rows_per_micro, layout.row_len) for mb in mbs)
    total_resp = sum(len(s.response_tokens) for s in samples)
    assert sum(int(mb["loss_mask"].sum()) for mb in mbs) == total_resp
    np.testing.assert_allclose(sum(float(mb["loss_weights"].sum()) for mb in mbs), 1.0, rtol=1e-6)
    # every masked position's target is a response token with the sampler's log-prob; every response token once
    seen = []
    for mb in mbs:
        for r in range(mb["tokens"].shape[0]):
            for i in np.flatnonzero(mb["loss_mask"][r]):
                seg = mb["segment_ids"][r, i]
                assert seg > 0 and mb["segment_ids"][r, i + 1] == seg   # the target is in the same segment
                seen.append((int(mb["targets"][r, i]), round(float(mb["sampler_logprobs"][r, i]), 5)))
    expected = [(t, round(lp, 5)) for s in samples for t, lp in zip(s.response_tokens, s.response_logprobs)]
    assert sorted(seen) == sorted(expected)
    # positions restart per segment
    mb = mbs[0]
    starts = (mb["positions"] == 0) & (mb["segment_ids"] > 0)
    assert starts.sum() == sum(len(set(row[row > 0])) for row in mb["segment_ids"])


def test_loss_ignores_everything_outside_the_mask():
    rng = np.random.default_rng(2)
    samples = _samples(rng, 5)
    for s in samples:
        s.weight = 0.1
    cfg = rl_loss.RLConfig(micro_batch_tokens=4096, min_row_len=16)
    (mb,), _ = rl_batch.micro_batches(samples, cfg)
    logp = jnp.asarray(-rng.uniform(0, 2, size=mb["tokens"].shape), jnp.float32)
    base = rl_loss.batch_loss(logp, None, {k: jnp.asarray(v) for k, v in mb.items()}, cfg, old_from_current=False)[0]
    corrupted = dict(mb)
    off = ~mb["loss_mask"]
    for key in ("loss_weights", "advantages", "sampler_logprobs"):
        arr = mb[key].copy()
        arr[off] = rng.normal(size=off.sum()) * 100
        corrupted[key] = arr
    logp2 = jnp.where(jnp.asarray(off), 50.0, logp)
    again = rl_loss.batch_loss(logp2, None, {k: jnp.asarray(v) for k, v in corrupted.items()}, cfg,
                               old_from_current=False)[0]
    assert float(base) == float(again)


def test_make_samples_weights_count_skipped_samples():
    turns = [Turn(0, [1, 2], [3] * n, [-1.0] * n, "eos", "", {}, {}, advantage=a)
             for n, a in ((4, 0.0), (6, 1.0), (10, -1.0))]
    trajectories = [Trajectory("L1/x", 0, 0, 0, turns)]
    cfg = rl_loss.RLConfig(loss_aggregation="token_mean")
    s = rl_batch.make_samples(trajectories, cfg, constant_length=0)
    assert s.total == 3 and s.skipped_zero_advantage == 1 and len(s.samples) == 2
    assert all(np.isclose(x.weight, 1 / 20) for x in s.samples)
    s = rl_batch.make_samples(trajectories, rl_loss.RLConfig(kl_coef=0.1, loss_aggregation="token_mean"), 0)
    assert len(s.samples) == 3            # with a KL term every sample matters


def test_pack_rows_first_fit_decreasing_and_errors():
    rows = rl_batch.pack_rows([5, 3, 8, 2, 6], 8, pack=True)
    assert sorted(i for r in rows for i in r) == [0, 1, 2, 3, 4]
    assert all(sum([5, 3, 8, 2, 6][i] for i in r) <= 8 for r in rows)
    assert len(rows) == 3
    assert rl_batch.pack_rows([5, 3], 8, pack=False) == [[0], [1]]
    with pytest.raises(ValueError, match="does not fit"):
        rl_batch.pack_rows([9], 8, pack=True)


def test_row_length_buckets():
    cfg = rl_loss.RLConfig(min_row_len=256, micro_batch_tokens=1 << 20)
    assert rl_batch.plan_layout([100, 30], cfg)[0].row_len == 256
    assert rl_batch.plan_layout([1000, 3000], cfg)[0].row_len == 4096
    # capped at the context: a 39k sample gets a 40k row, not a 64k one
    assert rl_batch.plan_layout([38912], cfg, max_row_len=40960)[0].row_len == 40960
    assert rl_batch.plan_layout([38912], rl_loss.RLConfig(row_len=40960))[0].row_len == 40960
    with pytest.raises(ValueError, match="longer than rl.row_len"):
        rl_batch.plan_layout([5000], rl_loss.RLConfig(row_len=4096))
    layout = rl_batch.plan_layout([1000] * 5, rl_loss.RLConfig(min_row_len=1024, micro_batch_tokens=4096,
                                                                pack=False), row_divisor=2)[0]
    assert (layout.rows_per_micro, layout.num_micro) == (4, 2)      # power of two fitting 4096 tokens, even


def _kevin_mix(n=512, seed=0):
    """Sample lengths of a Kevin step: prompts 1-4k tokens, responses 2-16k."""
    rng = np.random.default_rng(seed)
    return (rng.integers(1024, 4097, n) + rng.integers(2048, 16385, n)).tolist()


def test_bucketed_rows_drop_the_padding_of_a_kevin_batch():
    """512 samples of the length mix, 4 data-parallel devices, 64k tokens per micro-batch (configs/kevin32b.py): one
    row length for the batch pads every row to 32k (~64% padding); a row length per micro-batch pads little."""
    lengths = _kevin_mix()
    uniform = rl_loss.RLConfig(pack=False, micro_batch_tokens=65536)
    bucketed = rl_loss.RLConfig(pack=False, micro_batch_tokens=65536, row_len_step=1024)
    old, _ = rl_batch.plan_layout(lengths, uniform, row_divisor=4, max_row_len=40960)
    new, rows = rl_batch.plan_layout(lengths, bucketed, row_divisor=4, max_row_len=40960)
    old_padding = 1 - sum(lengths) / old.padded_tokens
    new_padding = 1 - sum(lengths) / new.padded_tokens
    assert old.row_len == 32768 and old_padding > 0.5
    assert new_padding < 0.08, new_padding
    # every sample in exactly one row, each row one sample that fits it, rows a multiple of the devices
    assert sorted(i for row in rows for i in row) == list(range(len(lengths)))
    assert all(len(row) <= 1 for row in rows)
    first = 0
    for count, length in new.shapes:
        assert count % 4 == 0 and count * length <= max(65536, 4 * length)
        assert all(lengths[i] <= length for row in rows[first:first + count] for i in row)
        first += count
    assert len({length for _, length in new.shapes}) <= 40960 // 1024        # one shape per multiple of the step


def test_bucketed_micro_batches_hold_every_response_token_once():
    rng = np.random.default_rng(3)
    samples = _samples(rng, 11, max_prompt=40, max_resp=60)
    for s in samples:
        s.weight = 0.1
    cfg = rl_loss.RLConfig(pack=False, micro_batch_tokens=128, min_row_len=16, row_len_step=16)
    mbs, layout = rl_batch.micro_batches(samples, cfg, row_divisor=2)
    assert [mb["tokens"].shape for mb in mbs] == layout.shapes
    assert len({shape[1] for shape in layout.shapes}) > 1          # micro-batches of different row lengths
    assert layout.padded_tokens == sum(r * n for r, n in layout.shapes)
    seen = []
    for mb in mbs:
        for r in range(mb["tokens"].shape[0]):
            segments = set(mb["segment_ids"][r].tolist()) - {0}
            assert segments <= {1}                                    # one right-padded sample per row
            n = int((mb["segment_ids"][r] > 0).sum())
            assert (mb["segment_ids"][r, :n] == 1).all()
            seen += [int(t) for t in mb["targets"][r][mb["loss_mask"][r]]]
    assert sorted(seen) == sorted(t for s in samples for t in s.response_tokens)


def test_bucketed_rows_need_unpacked_rows_of_free_length():
    with pytest.raises(ValueError, match="row_len_step"):
        rl_loss.RLConfig(pack=True, row_len_step=1024)
    with pytest.raises(ValueError, match="row_len_step"):
        rl_loss.RLConfig(pack=False, row_len=4096, row_len_step=1024)
    # the context caps a bucketed row that rounding would take past it
    layout, _ = rl_batch.plan_layout([40000], rl_loss.RLConfig(pack=False, row_len_step=3000), max_row_len=40960)
    assert layout.row_len == 40960


def test_a_small_bucketed_batch_is_not_mostly_padding_rows():
    cfg = rl_loss.RLConfig(pack=False, row_len_step=64, micro_batch_tokens=4096, min_row_len=64)
    layout, rows = rl_batch.plan_layout([100, 90, 120], cfg, row_divisor=2)
    assert layout.shapes == [(4, 128)]          # not the 32 rows that fill 4096 tokens
    assert sorted(i for row in rows for i in row) == [0, 1, 2]
