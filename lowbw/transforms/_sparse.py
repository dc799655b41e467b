"""SPARTA's sparse parameter averaging (Beton et al., 2025).

Every step, the same k = max(1, round(p * n)) entries of each n-entry tensor are
averaged across workers. The indices derive from a key shared by all workers, so
every worker picks the same ones and they cost no bytes; only the k values of
each tensor cross the wire.

Selectors (the names follow EXO Gym's index selectors):
  random:       a fresh random subset every step.
  shuffled:     a random partition of the tensor into ceil(n/k) parts, visited
                in order, re-drawn after each full cycle.
  partitioned:  one random partition drawn at the start and cycled forever.
The last part of a partition wraps around to the start of the permutation, so
every part has exactly k entries and the bytes per step are constant.
"""

import math
from collections.abc import Callable

import jax
import jax.numpy as jnp

from lowbw._random import random_bijection
from lowbw._types import Array, PRNGKey, PyTree
from lowbw.transforms._codec import Codec, payload_nbytes
from lowbw.transforms._reductions import worker_mean

SELECTORS = ("random", "shuffled", "partitioned")


def sparse_count(size: int, fraction: float) -> int:
  """k: how many of a tensor's ``size`` entries are averaged each step."""
  return min(size, max(1, round(fraction * size)))


def sparse_indices(
    key: PRNGKey, step: Array, size: int, k: int, selector: str
) -> Array:
  """The k flat indices of a ``size``-entry tensor averaged at ``step``."""
  offsets = jnp.arange(k, dtype=jnp.int32)
  if selector == "random":
    return random_bijection(jax.random.fold_in(key, step), offsets, size, size)
  parts = math.ceil(size / k)
  cycle = step // parts if selector == "shuffled" else jnp.zeros_like(step)
  positions = ((step % parts) * k + offsets) % size
  return random_bijection(jax.random.fold_in(key, cycle), positions, size, size)


def sparse_average(
    key: PRNGKey, step: Array, params_W: PyTree, fraction: float, selector: str,
    transform: Callable[[Array, int], Array] | None = None,
    active_W: Array | None = None,
) -> PyTree:
  """Replaces the selected entries of every worker's tensors by their mean.

  Args:
    key: shared by all workers; each tensor folds in its own leaf index.
    step: traced int32 step counter.
    params_W: worker-stacked parameters.
    fraction: p in (0, 1].
    selector: one of ``SELECTORS``.
    transform: ``(values_W, leaf_index) -> values_W``, applied to the selected
      values (shape (W, k)) before they are averaged: what the receivers
      decode when the values are compressed. None sends them as they are.
    active_W: bool (W,): average only these workers' values (every worker
      still receives the mean); None: the participating workers
      (``participating``), or all.
  """
  leaves, treedef = jax.tree.flatten(params_W)
  out = []
  for i, x in enumerate(leaves):
    w, size = x.shape[0], math.prod(x.shape[1:])
    if size == 0:  # nothing to average (and no bytes: sparse_count is 0)
      out.append(x)
      continue
    k = sparse_count(size, fraction)
    idx = sparse_indices(jax.random.fold_in(key, i), step, size, k, selector)
    flat = x.reshape(w, size)
    values_W = flat[:, idx]
    if transform is not None:
      values_W = transform(values_W, i)
    mean = worker_mean(values_W, active_W)[None]
    flat = flat.at[:, idx].set(jnp.broadcast_to(mean, (w, k)))
    out.append(flat.reshape(x.shape))
  return jax.tree.unflatten(treedef, out)


def sparse_payload_bytes(params: PyTree, fraction: float,
                         codec: Codec | None = None) -> int:
  """Bytes of the k values of every tensor (one worker, one step), as they are
  or as ``codec`` encodes each tensor's k-vector."""
  return sum(
      payload_nbytes(codec, jax.ShapeDtypeStruct(
          (sparse_count(math.prod(x.shape), fraction),), x.dtype))
      for x in jax.tree.leaves(params) if math.prod(x.shape))
