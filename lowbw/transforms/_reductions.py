"""Reductions over the worker axis: the only code that sees axis 0 as workers.

Everything that combines workers goes through these functions, so spreading the
worker axis over devices (shard_map) needs to change them alone.
"""

import jax
import jax.numpy as jnp

from lowbw._types import Array, PyTree


def num_workers(tree_W: PyTree) -> int:
  return jax.tree.leaves(tree_W)[0].shape[0]


def worker_mean(tree_W: PyTree) -> PyTree:
  """The mean over workers of every leaf: (W, ...) -> (...)."""
  return jax.tree.map(lambda x: jnp.mean(x, axis=0), tree_W)


def broadcast_to_workers(tree: PyTree, num_workers: int) -> PyTree:
  """One copy per worker: (...) -> (W, ...)."""
  return jax.tree.map(
      lambda x: jnp.broadcast_to(x[None], (num_workers,) + x.shape), tree)


def replace_with_mean(tree_W: PyTree) -> PyTree:
  """Every worker gets the mean over workers (an all-reduce of the average)."""
  return broadcast_to_workers(worker_mean(tree_W), num_workers(tree_W))


def group_mean(tree_W: PyTree, perm: Array, group_size: int) -> PyTree:
  """Averages within groups: workers ``perm[g*s:(g+1)*s]`` form group g.

  Args:
    tree_W: worker-stacked tree.
    perm: int (W,) permutation of the workers.
    group_size: static group size s; must divide W.
  """

  def one(x):
    w = x.shape[0]
    grouped = x[perm].reshape((w // group_size, group_size) + x.shape[1:])
    mean = jnp.broadcast_to(jnp.mean(grouped, axis=1, keepdims=True),
                            grouped.shape)
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
