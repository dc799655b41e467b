"""Reductions over the worker axis: the only code that sees axis 0 as workers.

Everything that combines workers goes through these functions, so spreading the
worker axis over devices (shard_map) needs to change them alone.
"""

import jax
import jax.numpy as jnp

from lowbw._types import Array, PyTree


def num_workers(tree_W: PyTree) -> int:
  return jax.tree.leaves(tree_W)[0].shape[0]


def worker_mean(tree_W: PyTree, active_W: Array | None = None) -> PyTree:
  """The mean over workers of every leaf: (W, ...) -> (...).

  With ``active_W`` (bool (W,)), the mean over the active workers only (zeros
  when none is): what an average computes when the others' messages are
  missing.
  """
  if active_W is None:
    return jax.tree.map(lambda x: jnp.mean(x, axis=0), tree_W)
  weight = active_W.astype(jnp.float32)
  count = jnp.maximum(jnp.sum(weight), 1.0)

  def one(x):
    total = jnp.tensordot(weight.astype(x.dtype), x, axes=1)
    return (total / count.astype(x.dtype)).astype(x.dtype)

  return jax.tree.map(one, tree_W)


def broadcast_to_workers(tree: PyTree, num_workers: int) -> PyTree:
  """One copy per worker: (...) -> (W, ...)."""
  return jax.tree.map(
      lambda x: jnp.broadcast_to(x[None], (num_workers,) + x.shape), tree)


def replace_with_mean(tree_W: PyTree, active_W: Array | None = None) -> PyTree:
  """Every worker gets the mean over (active) workers (an all-reduce of the
  average)."""
  return broadcast_to_workers(worker_mean(tree_W, active_W),
                              num_workers(tree_W))


def group_mean(tree_W: PyTree, perm: Array, group_size: int,
               active_W: Array | None = None) -> PyTree:
  """Averages within groups: workers ``perm[g*s:(g+1)*s]`` form group g.

  Args:
    tree_W: worker-stacked tree.
    perm: int (W,) permutation of the workers.
    group_size: static group size s; must divide W.
    active_W: bool (W,): average only the active members of each group (a
      group without any keeps its values); None: all.
  """

  def one(x):
    w = x.shape[0]
    shape = (w // group_size, group_size) + x.shape[1:]
    grouped = x[perm].reshape(shape)
    if active_W is None:
      mean = jnp.mean(grouped, axis=1, keepdims=True)
    else:
      a = active_W[perm].reshape(shape[:2] + (1,) * (x.ndim - 1))
      count = jnp.sum(a, axis=1, keepdims=True)
      mean = (jnp.sum(jnp.where(a, grouped, 0), axis=1, keepdims=True) /
              jnp.maximum(count, 1).astype(x.dtype))
      mean = jnp.where(count > 0, mean, grouped)
    mean = jnp.broadcast_to(mean, grouped.shape)
    return jnp.zeros_like(x).at[perm].set(mean.reshape(x.shape))

  return jax.tree.map(one, tree_W)


def worker_divergence(params_W: PyTree) -> Array:
  """Mean over workers of ||theta_w - theta_bar|| / ||theta_bar||.

  Norms are over the whole parameter tree. 0 when all workers agree.
  """
  mean = worker_mean(params_W)
  sq_dev_W = sum(
      jnp.sum(jnp.square(x - m[None]).reshape(x.shape[0], -1), axis=1)
      for x, m in zip(jax.tree.leaves(params_W), jax.tree.leaves(mean)))
  sq_mean = sum(jnp.sum(jnp.square(m)) for m in jax.tree.leaves(mean))
  return jnp.mean(jnp.sqrt(sq_dev_W)) / jnp.maximum(jnp.sqrt(sq_mean), 1e-30)
