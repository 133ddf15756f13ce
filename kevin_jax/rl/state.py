"""Train state, the optax optimiser, and the jitted update: gradient accumulation over micro-batches.

State is a plain dict pytree {"params": nnx.State, "opt_state": optax state, "updates": int32} (orbax saves it as
is); with optim.offload="pinned_host" it also holds "master" (float32 weights in host memory, the moments there too,
"params" the compute-dtype copy on the GPUs: kevin_jax.rl.offload). One optimiser update = sum of the micro-batch
gradients (the loss is a weighted sum, kevin_jax.rl.loss), then clip by global norm and AdamW. Gradients of a
micro-batch are computed under the mesh's activation-sharding rules with the batch sharded over the data-parallel
axes, so more devices = the same sums computed in parallel. The supervised fine-tuning (kevin_jax.sft) runs the same
`Updater` and `optimizer` with its own loss and learning-rate schedule.
"""
from __future__ import annotations

import time
from typing import Any, Callable, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from kevin_jax import parallel
from kevin_jax.multihost import put_global, to_host
from kevin_jax.rl import loss as rl_loss
from kevin_jax.rl import offload as offload_lib
from kevin_jax.rl.config import OptimConfig

# optim.grad_dtype (rl.config.GRAD_DTYPE_NAMES) -> the dtype of the gradient sum
GRAD_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}
# optim.mu_dtype (rl.config.MU_DTYPE_NAMES) -> the dtype AdamW stores its first moment in
MU_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}


def learning_rate_schedule(config: OptimConfig, total_updates: int) -> optax.Schedule:
    warmup = int(round(config.warmup_fraction * total_updates))
    if warmup <= 0:
        return optax.constant_schedule(config.learning_rate)
    return optax.join_schedules([optax.linear_schedule(0.0, config.learning_rate, warmup),
                                 optax.constant_schedule(config.learning_rate)], [warmup])


_NO_DECAY = ("bias", "scale")           # biases and norm scales


def decay_mask(params):
    """Weight decay on weight matrices only: not on biases and norm scales. By name, not by rank: the layer
    parameters are stacked ([num_layers, ...]), so a stacked norm scale is 2-D."""
    return jax.tree_util.tree_map_with_path(
        lambda path, p: parallel.path_name(path).split("/")[-1] not in _NO_DECAY and p.ndim >= 2, params)


def _adamw(schedule: optax.Schedule, mask, *, b1: float, b2: float, eps: float,
           weight_decay: float, mu_dtype=None) -> optax.GradientTransformation:
    return optax.adamw(schedule, b1=b1, b2=b2, eps=eps, weight_decay=weight_decay, mask=mask, mu_dtype=mu_dtype)


def optimizer(schedule: optax.Schedule, *, grad_clip_norm: float, weight_decay: float = 0.0, b1: float = 0.9,
              b2: float = 0.999, eps: float = 1e-8, mu_dtype=None) -> optax.GradientTransformation:
    """The one optimiser of kevin_jax: gradients clipped to a global norm (0 = not clipped), then AdamW on `schedule`
    with decoupled weight decay on weight matrices only (decay_mask), its first moment stored in `mu_dtype` (None:
    the parameters' dtype). The RL update builds it from the optim section (make_optimizer), the warm start from
    the warm_start section (kevin_jax.sft: no weight decay, a cosine schedule)."""
    parts = [optax.clip_by_global_norm(grad_clip_norm)] if grad_clip_norm > 0 else []
    return optax.chain(*parts, _adamw(schedule, decay_mask, b1=b1, b2=b2, eps=eps, weight_decay=weight_decay,
                                      mu_dtype=mu_dtype))


def make_optimizer(config: OptimConfig, total_updates: int) -> optax.GradientTransformation:
    """The RL update's optimiser (section optim): `optimizer` on learning_rate_schedule(config, total_updates)."""
    return optimizer(learning_rate_schedule(config, total_updates), grad_clip_norm=config.grad_clip_norm,
                     weight_decay=config.weight_decay, b1=config.b1, b2=config.b2, eps=config.eps,
                     mu_dtype=MU_DTYPES[config.mu_dtype])


def host_offload(config: OptimConfig, total_updates: int, compute_dtype) -> offload_lib.HostOffloadedAdamW | None:
    """The offloaded form of make_optimizer's update (None where optim.offload="none")."""
    if config.offload == "none":
        return None
    schedule = learning_rate_schedule(config, total_updates)
    return offload_lib.HostOffloadedAdamW(
        lambda mask: _adamw(schedule, mask, b1=config.b1, b2=config.b2, eps=config.eps,
                            weight_decay=config.weight_decay, mu_dtype=MU_DTYPES[config.mu_dtype]), decay_mask, config.grad_clip_norm, compute_dtype)


def _replicated(params):
    leaf_sharding = jax.tree.leaves(params)[0].sharding
    if isinstance(leaf_sharding, jax.sharding.NamedSharding):
        # Scalars (Adam's count, the update counter) must live on the params' mesh, not on one device: a
        # multi-process jit refuses arguments on different device sets.
        return jax.sharding.NamedSharding(leaf_sharding.mesh, jax.sharding.PartitionSpec())
    return leaf_sharding


def init_state(params: nnx.State, tx: optax.GradientTransformation,
               offload: offload_lib.HostOffloadedAdamW | None = None) -> dict[str, Any]:
    """The train state of freshly initialised/imported parameters (optimiser moments sharded like the params; with
    `offload`, the master copy and the moments in host memory: kevin_jax.rl.offload)."""
    replicated = _replicated(params)
    if offload is not None:
        return offload_lib.init_state(params, tx, offload.compute_dtype, replicated)
    # Moments take their param's sharding (optax finds the params-shaped subtrees); counts are replicated.
    opt_shardings = optax.tree_utils.tree_map_params(
        tx, lambda _, sharding: sharding, jax.eval_shape(tx.init, params), jax.tree.map(lambda x: x.sharding, params),
        transform_non_params=lambda _: replicated)
    opt_state = jax.jit(tx.init, out_shardings=opt_shardings)(params)
    return {"params": params, "opt_state": opt_state,
            "updates": put_global(np.zeros((), np.int32), replicated)}


def state_shardings(state: Any) -> Any:
    return jax.tree.map(lambda x: x.sharding, state)


class Updater:
    """The jitted pieces of one optimiser update for a model graph, an optimiser, a mesh and a loss.

    loss: the objective of one micro-batch, `loss(params, micro_batch, first) -> (scalar, stats)` with stats a dict of
      device arrays (sums over the micro-batch). Gradients are summed over micro-batches, so a loss that is a weighted
      sum gives the gradient of the whole batch. Default: the policy-gradient loss (kevin_jax.rl.loss) of the
      model's log-probs at `temperature`; kevin_jax.sft passes the response NLL.
    temperature: the sampling temperature: log-probs are recomputed under the same distribution the sampler drew
      from (logits / T), so that ratios compare like with like.
    donate_state: an optimiser step may reuse the buffers of the state it is given; False where the caller still
      needs the parameters it passed in.
    offload: the offloaded optimiser step (host_offload(...)) for states made by init_state(..., offload); None =
      the state is on the devices and `tx` updates it.
    grad_dtype: dtype of the gradient sum over micro-batches (OptimConfig.grad_dtype).
    """

    def __init__(self, graphdef, tx: optax.GradientTransformation, schedule: optax.Schedule, config: rl_loss.RLConfig,
                 mesh, temperature: float = 1.0, loss: Callable | None = None, donate_state: bool = True,
                 offload: offload_lib.HostOffloadedAdamW | None = None, grad_dtype=jnp.float32):
        self.graphdef = graphdef
        self.offload = offload
        self.grad_dtype = grad_dtype
        self.last_times: dict[str, float] = {}
        self.tx = tx
        self.schedule = schedule
        self.config = config
        self.mesh = mesh
        self.temperature = float(temperature) if temperature > 0 else 1.0
        self.loss = self._policy_gradient_loss if loss is None else loss
        self.donate_state = donate_state
        self.batch_sharding = parallel.batch_sharding(mesh, 2)
        self._grads = jax.jit(self._grads_impl, static_argnames=("first",), donate_argnums=(1,))
        self._forward = jax.jit(self._forward_impl)
        self._apply = None          # built on first use with the state's shardings
        self._state_shardings = None
        self._zeros = None

    # ------------------------------------------------------------------ pieces
    def _logprobs(self, params, mb, return_entropy: bool):
        model = nnx.merge(self.graphdef, params)
        return model.token_logprobs(mb["tokens"], mb["positions"], mb["segment_ids"], mb["targets"],
                                    chunk_size=self.config.logprob_chunk, temperature=self.temperature,
                                    return_entropy=return_entropy, right_padded=not self.config.pack)

    def _policy_gradient_loss(self, params, mb, first: bool):
        with parallel.activation_sharding(self.mesh):
            logp, entropy = self._logprobs(params, mb, True)
        return rl_loss.batch_loss(logp, entropy, mb, self.config, old_from_current=first)

    def _grads_impl(self, params, grads, mb, first: bool):
        (_, stats), g = jax.value_and_grad(lambda p: self.loss(p, mb, first), has_aux=True)(params)
        grads = jax.tree.map(lambda a, b: a + b.astype(a.dtype), grads, g)
        return grads, stats

    def _forward_impl(self, params, mb):
        with parallel.activation_sharding(self.mesh):
            return self._logprobs(params, mb, False)

    def _apply_impl(self, state, grads, scale):
        if offload_lib.is_offloaded(state):
            if self.offload is None:
                raise ValueError("an offloaded train state (with a host 'master' copy) needs Updater(offload=...)")
            return self.offload.apply(state, grads, scale, self.schedule, self._state_shardings)
        if scale is not None:
            grads = jax.tree.map(lambda g: g * scale, grads)
        grad_norm = optax.global_norm(grads)
        updates, opt_state = self.tx.update(grads, state["opt_state"], state["params"])
        params = optax.apply_updates(state["params"], updates)
        lr = self.schedule(state["updates"])
        new_state = {"params": params, "opt_state": opt_state, "updates": state["updates"] + 1}
        return new_state, {"grad_norm": grad_norm, "learning_rate": lr,
                           "update_norm": optax.global_norm(updates)}

    # ------------------------------------------------------------------ API
    def device_batch(self, mb: Mapping[str, np.ndarray]) -> dict[str, jax.Array]:
        return {k: put_global(v, self.batch_sharding) for k, v in mb.items()}

    def logprobs(self, params, mb: Mapping[str, jax.Array]) -> jax.Array:
        """[R, L] log-probs of the targets under `params` (no gradient): the reference policy's, for the KL."""
        return self._forward(params, mb)

    def zero_grads(self, params):
        if self._zeros is None:
            self._zeros = jax.jit(lambda p: jax.tree.map(lambda x: jnp.zeros(x.shape, self.grad_dtype), p),
                                  out_shardings=jax.tree.map(lambda x: x.sharding, params))
        return self._zeros(params)

    def accumulate(self, params, batches: Sequence[dict[str, jax.Array]], first: bool = True):
        """(gradients of the loss summed over the micro-batches (grad_dtype), each micro-batch's stats as device
        arrays: nothing here waits for the device)."""
        grads = self.zero_grads(params)
        parts = []
        for mb in batches:
            grads, stats = self._grads(params, grads, mb, first=first)
            parts.append(stats)
        return grads, parts

    def apply(self, state: dict, grads, scale: float | None = None):
        """One optimiser step on `grads` (times `scale`, if given): (new state, {grad_norm, learning_rate,
        update_norm} as device scalars)."""
        if self._apply is None:
            shardings = self._state_shardings = state_shardings(state)
            self._apply = jax.jit(self._apply_impl, donate_argnums=(0,) if self.donate_state else (),
                                  out_shardings=(shardings, None))
        return self._apply(state, grads, None if scale is None else jnp.float32(scale))

    def gradients(self, params, batches: Sequence[dict[str, jax.Array]], first: bool):
        """The policy-gradient loss's (summed float32 gradients, stats dict of floats, per-micro-batch trainer
        log-probs)."""
        grads, parts = self.accumulate(params, batches, first)
        trainer_logprobs = [stats.pop("trainer_logprobs") for stats in parts]
        total = rl_loss.combine_stats([jax.tree.map(to_host, p) for p in parts])
        return grads, rl_loss.finish_stats(total), trainer_logprobs

    def update(self, state: dict, batches: Sequence[dict[str, jax.Array]], first: bool):
        """One policy-gradient update over all micro-batches. Returns (new state, stats dict of floats, the trainer's
        log-probs of each micro-batch (device arrays, stop-gradient, under the parameters before the update)).
        `last_times` then holds the wall seconds of its two parts: "gradients" (forward and backward over the
        micro-batches) and "optimizer" (clip + AdamW, streamed through host memory when offloaded)."""
        t0 = time.perf_counter()
        grads, out, trainer_logprobs = self.gradients(state["params"], batches, first)
        jax.block_until_ready(grads)
        t1 = time.perf_counter()
        state, opt_stats = self.apply(state, grads)
        out.update({k: float(to_host(v)) for k, v in opt_stats.items()})
        self.last_times = {"gradients": t1 - t0, "optimizer": time.perf_counter() - t1}
        return state, out, trainer_logprobs
