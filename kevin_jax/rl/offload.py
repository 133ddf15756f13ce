"""The optimiser state in host memory (optim.offload="pinned_host"), as Kevin-32B did with DeepSpeed ZeRO-3's CPU
offload: the float32 master weights and AdamW's two moments live in the hosts' RAM (JAX's "pinned_host" memory
kind, each GPU's shard in the RAM of the host that drives it); the GPUs hold the policy's weights in the compute
dtype (bf16), the gradients and the activations.

Train state of an offloaded run (same keys as the on-device state, plus "master"):
    {"params":    compute-dtype weights on the GPUs (what the sampler and the gradient step read),
     "master":    float32 weights in host memory,
     "opt_state": the optax state of the run's optimiser, its moments in host memory, its step counts on the GPUs,
     "updates":   int32 update counter}
Invariant: params == master.astype(compute dtype), exactly (the update writes both; a restore recomputes params).

One optimiser step (`HostOffloadedAdamW.apply`, traced inside the Updater's jit, the state donated):
  1. the global gradient norm on the GPUs (float32), the clip factor;
  2. the parameters that are not stacked by layer (embeddings, LM head, final norm): their master weights and
     moments copied to the GPU, AdamW there, copied back;
  3. the stacked layer parameters ([num_layers, ...] leaves), one layer at a time in a fori_loop: layer i's master
     slice and moments are copied in (dynamic slice of the host buffer), updated on the GPU with layer i's
     gradients, and written back in place (dynamic update slice of the donated host buffer), and layer i of the
     compute-dtype weights is rewritten on the GPU. The GPU never holds more than one layer's float32 state, and
     host RAM holds one copy of the state (the loop carries the donated buffers).
The AdamW arithmetic is optax's own (the run's `adamw` transformation applied to each group of leaves), so the
result equals the on-device update (tests/kevin_jax/rl/test_offload.py compares them at float32 tolerance).

Why this mechanism (docs/ARCHITECTURE.md, "Optimiser state in host memory"): each GPU moves its own shard over its
own host link, in parallel, with no host-CPU arithmetic; the state stays a sharded jax.Array that orbax saves and
restores straight into host memory; multi-host runs need nothing more. benchmarks/optimizer_offload.py measures it
against the state resident on the GPU, the whole tree streamed in one piece, and the update on the host CPU.

Checkpoints of an offloaded state leave out "params" (the exact cast of "master"): `checkpoint_view` /
`restore_params`.
"""
from __future__ import annotations

import logging
import math
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import optax
from optax import tree_utils as otu

from kevin_jax import parallel

log = logging.getLogger(__name__)

HOST = "pinned_host"
DEVICE = "device"
# The model's layer parameters are stacked along a leading [num_layers] axis under this top-level name
# (kevin_jax.model.qwen2: the decoder layers are built with nnx.vmap and run with lax.scan).
STACKED = "layers"


def host_kind_available() -> bool:
    """Whether this backend's devices have a pinned_host memory (GPUs and the CPU backend do)."""
    try:
        return any(m.kind == HOST for m in jax.devices()[0].addressable_memories())
    except Exception:  # backends without memory spaces
        return False


def _require_host_memory() -> None:
    if not host_kind_available():
        raise RuntimeError(f"optim.offload='pinned_host' needs devices with a pinned_host memory; "
                           f"{jax.devices()[0].device_kind} ({jax.default_backend()}) has none: use optim.offload=none")


def _host(sharding):
    return sharding.with_memory_kind(HOST)


def _device(sharding):
    return sharding.with_memory_kind(DEVICE)


def _without_layer_axis(sharding, ndim: int, name: str):
    """The sharding of one layer's slice of a stacked [num_layers, ...] leaf (the layer axis must be unsharded)."""
    spec = tuple(sharding.spec) + (None,) * (ndim - len(sharding.spec))
    if spec[0] is not None:
        raise ValueError(f"{name}: the layer axis is sharded ({sharding.spec}); the offloaded update streams one "
                         f"layer at a time and needs it unsharded")
    return jax.sharding.NamedSharding(sharding.mesh, jax.sharding.PartitionSpec(*spec[1:]),
                                      memory_kind=sharding.memory_kind)


def _names(tree) -> list[str]:
    return [parallel.path_name(path) for path, _ in jax.tree_util.tree_flatten_with_path(tree)[0]]


def _is_stacked(name: str) -> bool:
    return name.split("/")[0] == STACKED


def _moment_leaves(opt_state, name: str, treedef) -> list:
    tree = otu.tree_get(opt_state, name)
    if tree is None or jax.tree.structure(tree) != treedef:
        raise ValueError(f"the optimiser state has no params-shaped {name!r} (offload supports optax's Adam family: "
                         f"moments mu and nu, and step counts)")
    return jax.tree.leaves(tree)


def _count(opt_state) -> jax.Array:
    counts = otu.tree_get_all_with_path(opt_state, "count")
    if not counts:
        raise ValueError("the optimiser state has no step count")
    # Adam's count and the learning-rate schedule's count start at 0 and step together: they are one number.
    return counts[0][1]


# ---------------------------------------------------------------------------------------------- the state
def _zeros(abstract, sharding):
    # One leaf at a time: the zeros are made on the device and leave it as one leaf's shard at most.
    return jax.jit(lambda: jnp.zeros(abstract.shape, abstract.dtype), out_shardings=sharding)()


def _to_host(x, sharding):
    """x (on the devices) as float32 in host memory, one leaf: cast and copy out in one program on every GPU, the
    moments' path (_zeros), instead of an eager cast then a device_put per leaf. benchmarks/optimizer_offload.py
    prints the build's rate; at full size the host's memory grew at 1.4-4.2 GiB/s while the state was built."""
    return jax.jit(lambda a: a.astype(jnp.float32), out_shardings=sharding)(x)


def _cast(x, dtype, sharding):
    """x (host or device) as `dtype` on the device, one leaf."""
    return jax.jit(lambda a: jax.device_put(a, sharding).astype(dtype), out_shardings=sharding)(x)


def _shard_bytes(abstract, sharding) -> int:
    return math.prod(sharding.shard_shape(abstract.shape)) * jnp.dtype(abstract.dtype).itemsize


class _Slot:
    """A host leaf of the state not made yet (init_state makes them in its own order)."""

    def __init__(self, index: int):
        self.index = index


def init_state(params: Any, tx: optax.GradientTransformation, compute_dtype, replicated) -> dict[str, Any]:
    """The offloaded train state of freshly initialised/imported parameters (any dtype, on the devices): the master
    copy is `params` moved to host memory, the moments zeros in host memory, the devices keep `params` cast to the
    compute dtype. The caller drops its `params` afterwards (float32 QwQ-32B on 4 GPUs: 33 GB each).

    The host buffers (master weights and moments) are made largest first: XLA's pinned-host pool grows by regions of
    doubling size and a buffer never spans two, so this order leaves the least of the regions empty (QwQ-32B on 4
    GPUs, by the allocator model of tests/kevin_jax/test_host_pool.py: 98 GiB of pool per GPU, against 103 in the
    tree's order), which leaves the pool's cap more room for the update."""
    _require_host_memory()
    host = jax.tree.map(lambda p: _host(p.sharding), params)
    makers: list[tuple[int, Callable[[], jax.Array]]] = []     # (bytes per device, make), in the trees' order

    def later(size: int, make: Callable[[], jax.Array]) -> _Slot:
        makers.append((size, make))
        return _Slot(len(makers) - 1)

    master = jax.tree.map(lambda p, s: later(_shard_bytes(jax.ShapeDtypeStruct(p.shape, jnp.float32), s),
                                             lambda: _to_host(p, s)), params, host)
    abstract_master = jax.tree.map(lambda p, s: jax.ShapeDtypeStruct(p.shape, jnp.float32, sharding=s), params, host)

    def scalar(abstract):
        if abstract.shape != () or not jnp.issubdtype(abstract.dtype, jnp.integer):
            raise ValueError(f"offload supports optimiser states made of params-shaped moments and integer step "
                             f"counts; found a {abstract.dtype}{list(abstract.shape)} leaf")
        return _zeros(abstract, replicated)

    opt_state = otu.tree_map_params(
        tx, lambda a, s: later(_shard_bytes(a, s), lambda: _zeros(a, s)), jax.eval_shape(tx.init, abstract_master),
        host, transform_non_params=scalar)
    made: list[jax.Array | None] = [None] * len(makers)
    for i in sorted(range(len(makers)), key=lambda i: -makers[i][0]):      # stable: ties in the trees' order
        made[i] = makers[i][1]()
    fill = lambda tree: jax.tree.map(lambda x: made[x.index] if isinstance(x, _Slot) else x, tree)
    device_params = jax.tree.map(lambda p: _cast(p, compute_dtype, _device(p.sharding)), params)
    return {"params": device_params, "master": fill(master), "opt_state": fill(opt_state),
            "updates": _zeros(jax.ShapeDtypeStruct((), jnp.int32), replicated)}


def abstract_state(abstract_params: Any, tx: optax.GradientTransformation, compute_dtype, replicated,
                   ) -> dict[str, Any]:
    """ShapeDtypeStructs (with shardings and memory kinds) of the offloaded train state, from the parameters'
    abstract values with their device shardings."""
    host = jax.tree.map(lambda a: _host(a.sharding), abstract_params)
    master = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, jnp.float32, sharding=s), abstract_params, host)
    params = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, compute_dtype, sharding=_device(a.sharding)),
                          abstract_params)
    opt_state = otu.tree_map_params(
        tx, lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), jax.eval_shape(tx.init, master), host,
        transform_non_params=lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=replicated))
    return {"params": params, "master": master, "opt_state": opt_state,
            "updates": jax.ShapeDtypeStruct((), jnp.int32, sharding=replicated)}


def is_offloaded(state: Any) -> bool:
    return isinstance(state, dict) and "master" in state


def checkpoint_view(state: dict) -> dict:
    """What a checkpoint of an offloaded state holds: everything but the device copy of the weights (the exact
    cast of the master copy: 14% of the bytes, and no device-to-host copy at save time)."""
    return {k: v for k, v in state.items() if k != "params"}


def restore_params(restored: dict, compute_dtype) -> dict:
    """The full offloaded state from a restored `checkpoint_view`: the device weights recomputed from the master."""
    params = jax.tree.map(lambda m: _cast(m, compute_dtype, _device(m.sharding)), restored["master"])
    return {"params": params, **restored}


def state_bytes(state: Any) -> dict[str, int]:
    """Bytes of a state's arrays by memory kind, over all devices of all processes: {"device": n, "pinned_host": m}."""
    out: dict[str, int] = {}
    for leaf in jax.tree.leaves(state):
        kind = getattr(leaf.sharding, "memory_kind", None) or DEVICE
        out[kind] = out.get(kind, 0) + leaf.size * leaf.dtype.itemsize
    return out


# ---------------------------------------------------------------------------------------------- the update
class HostOffloadedAdamW:
    """One optimiser step of an offloaded state (see the module docstring).

    make_adamw: decay mask (a list of bools, one per leaf of a group) -> the run's AdamW transformation (without
      clipping) for that group; the on-device optimiser is `chain(clip_by_global_norm(clip_norm), make_adamw(mask
      of the whole tree))`.
    decay_mask: the params tree -> a same-structure tree of bools (which leaves get weight decay).
    clip_norm: global-norm clip (0 = none), applied as optax.clip_by_global_norm does, in float32.
    compute_dtype: dtype of the device copy of the weights.
    """

    def __init__(self, make_adamw: Callable[[Sequence[bool]], optax.GradientTransformation],
                 decay_mask: Callable[[Any], Any], clip_norm: float, compute_dtype):
        self.make_adamw = make_adamw
        self.decay_mask = decay_mask
        self.clip_norm = float(clip_norm)
        self.compute_dtype = compute_dtype

    def _group(self, grads, master, mu, nu, decay, count):
        """AdamW (optax's) on one group of leaves (lists), all on the device: (new master, mu, nu, count, sum of
        squared updates)."""
        tx = self.make_adamw(list(decay))
        state = otu.tree_set(jax.eval_shape(tx.init, master), mu=list(mu), nu=list(nu), count=count)
        updates, new_state = tx.update(list(grads), state, list(master))
        new_master = optax.apply_updates(list(master), updates)
        update_sq = sum((jnp.sum(jnp.square(u)) for u in updates), jnp.float32(0))
        return (new_master, otu.tree_get(new_state, "mu"), otu.tree_get(new_state, "nu"), _count(new_state),
                update_sq)

    def apply(self, state: dict, grads: Any, scale, schedule: optax.Schedule, shardings: dict):
        """(new state, {grad_norm, learning_rate, update_norm}) — traced inside a jit with `state` donated;
        `shardings`: the state's shardings (jax.tree.map(lambda x: x.sharding, state), taken outside the jit)."""
        if scale is not None:
            grads = jax.tree.map(lambda g: g * scale, grads)
        f32 = jnp.float32
        grad_norm = optax.tree.norm(jax.tree.map(lambda g: g.astype(f32), grads))
        if self.clip_norm > 0:
            trigger = jnp.squeeze(grad_norm < self.clip_norm)

            def clip(g):        # optax.clip_by_global_norm's formula, in float32
                g = g.astype(f32)
                return jax.lax.select(trigger, g, (g / grad_norm.astype(f32)) * self.clip_norm)
        else:
            def clip(g):
                return g.astype(f32)

        master_tree, opt_state = state["master"], state["opt_state"]
        treedef = jax.tree.structure(master_tree)
        names = _names(master_tree)
        master = jax.tree.leaves(master_tree)
        host_sharding = treedef.flatten_up_to(shardings["master"])
        params = treedef.flatten_up_to(state["params"])
        grad = treedef.flatten_up_to(grads)
        mu, nu = _moment_leaves(opt_state, "mu", treedef), _moment_leaves(opt_state, "nu", treedef)
        decay = [bool(d) for d in treedef.flatten_up_to(self.decay_mask(master_tree))]
        count = _count(opt_state)
        stacked = [k for k, n in enumerate(names) if _is_stacked(n)]
        rest = [k for k, n in enumerate(names) if not _is_stacked(n)]
        if not rest:
            raise ValueError("the offloaded update expects parameters outside the layer stack (embeddings)")
        new = {"master": list(master), "mu": list(mu), "nu": list(nu), "params": list(params)}

        # 1. the unstacked parameters, whole
        dev = [_device(host_sharding[k]) for k in rest]
        out = self._group([clip(grad[k]) for k in rest], [jax.device_put(master[k], d) for k, d in zip(rest, dev)],
                          [jax.device_put(mu[k], d) for k, d in zip(rest, dev)],
                          [jax.device_put(nu[k], d) for k, d in zip(rest, dev)], [decay[k] for k in rest], count)
        new_master, new_mu, new_nu, new_count, update_sq = out
        for j, k in enumerate(rest):
            host = host_sharding[k]
            new["master"][k] = jax.device_put(new_master[j], host)
            new["mu"][k] = jax.device_put(new_mu[j], host)
            new["nu"][k] = jax.device_put(new_nu[j], host)
            new["params"][k] = new_master[j].astype(params[k].dtype)

        # 2. the layer stack, one layer at a time
        if stacked:
            layers = {master[k].shape[0] for k in stacked}
            if len(layers) != 1:
                raise ValueError(f"stacked parameters disagree on the number of layers: {sorted(layers)}")
            host_slice = [_without_layer_axis(host_sharding[k], master[k].ndim, names[k]) for k in stacked]
            dev_slice = [_device(s) for s in host_slice]

            def layer(i, carry):
                m, u, v, p, sq = carry
                take = lambda x, d: jax.device_put(jax.lax.dynamic_index_in_dim(x, i, keepdims=False), d)
                g_i = [clip(jax.lax.dynamic_index_in_dim(grad[k], i, keepdims=False)) for k in stacked]
                nm, nu_, nv, _, layer_sq = self._group(
                    g_i, [take(x, d) for x, d in zip(m, dev_slice)], [take(x, d) for x, d in zip(u, dev_slice)],
                    [take(x, d) for x, d in zip(v, dev_slice)], [decay[k] for k in stacked], count)
                put = lambda xs, ys: [jax.lax.dynamic_update_index_in_dim(x, jax.device_put(y, h), i, 0)
                                      for x, y, h in zip(xs, ys, host_slice)]
                p = [jax.lax.dynamic_update_index_in_dim(x, y.astype(x.dtype), i, 0) for x, y in zip(p, nm)]
                return put(m, nm), put(u, nu_), put(v, nv), p, sq + layer_sq

            carry = ([master[k] for k in stacked], [mu[k] for k in stacked], [nu[k] for k in stacked],
                     [params[k] for k in stacked], update_sq)
            m, u, v, p, update_sq = jax.lax.fori_loop(0, layers.pop(), layer, carry)
            for j, k in enumerate(stacked):
                new["master"][k], new["mu"][k], new["nu"][k], new["params"][k] = m[j], u[j], v[j], p[j]

        unflatten = lambda leaves: jax.tree.unflatten(treedef, leaves)
        opt_state = otu.tree_set(opt_state, mu=unflatten(new["mu"]), nu=unflatten(new["nu"]), count=new_count)
        new_state = {"params": unflatten(new["params"]), "master": unflatten(new["master"]), "opt_state": opt_state,
                     "updates": state["updates"] + 1}
        return new_state, {"grad_norm": grad_norm, "learning_rate": schedule(state["updates"]),
                           "update_norm": jnp.sqrt(update_sq)}
