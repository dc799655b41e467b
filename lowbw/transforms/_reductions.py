"""Reductions over the worker axis: the only code that sees axis 0 as workers.

Everything that combines workers goes through these functions, so spreading the
worker axis over devices needs to change them alone. Inside the engine's
``shard_map`` (``sharded_workers``), each device holds a contiguous slice of
the workers: a reduction is the local reduction over the device's slice
followed by a ``psum`` over the mesh axis, and the functions that need a
worker's global index (``worker_ids``) add the device's offset.

Under a fault or straggler model the engine traces each communication inside
``participating(active_W)``: the reductions that combine workers' messages
(``worker_mean``, ``worker_sum``, ``replace_with_mean``, ``group_mean``, and
through them ``sparse_average`` and ``transmit``) then count only the
participating workers unless given a mask of their own. A strategy honours
faults by using them; it never sees the mask otherwise.
"""

import contextlib
import threading
import dataclasses

import jax
import jax.numpy as jnp

from lowbw._types import Array, PyTree
from lowbw.transforms._leading_sum import leading_sum


@dataclasses.dataclass(frozen=True)
class _Sharded:
  axis: str          # the mesh axis the workers are split over
  shards: int        # devices along it
  num_workers: int   # W, all devices together


class _TraceContext(threading.local):
  """What the trace in progress on this thread has set: a trace never sees
  another thread's (runs built or traced from several threads at once, a
  notebook's or a server's, do not mix their masks)."""

  def __init__(self):
    super().__init__()
    self.sharded: list[_Sharded] = []
    self.participants: list = []
    self.adversaries: list = []   # _robust.adversaries
    self.corrupt_calls: list = []  # _robust.corrupts
    self.weights: list = []        # _robust.weighting
    self.fragments: list = []      # fragment


_TRACE = _TraceContext()


@contextlib.contextmanager
def sharded_workers(axis: str, shards: int, num_workers_: int):
  """While tracing a ``shard_map`` body whose per-worker leaves are split over
  mesh axis ``axis`` (``shards`` devices, ``num_workers_ // shards`` workers
  each), makes every reduction here span all devices."""
  _TRACE.sharded.append(_Sharded(axis, shards, num_workers_))
  try:
    yield
  finally:
    _TRACE.sharded.pop()


def _sharded() -> _Sharded | None:
  return _TRACE.sharded[-1] if _TRACE.sharded else None


@contextlib.contextmanager
def pushed(stack: list, value):
  """``value`` on top of one of the trace context's stacks while the block
  runs (what ``participating``, ``_robust.adversaries`` and
  ``_robust.weighting`` set)."""
  stack.append(value)
  try:
    yield
  finally:
    stack.pop()


def top(stack: list):
  """The innermost value of a trace context's stack, or None."""
  return stack[-1] if stack else None


def participating(active_W: Array | None):
  """While tracing a communication, the workers whose messages it combines:
  bool (W,) over this device's workers, or None for all of them.

  Every reduction of this module that averages or sums messages uses it when
  it is not given a mask; ``participants()`` reads it. The engine sets it
  around a strategy's ``local``/``sync``/``global_params`` under a fault or
  straggler model; a notebook can set it around ``Strategy.step``.
  """
  return pushed(_TRACE.participants, active_W)


def call_participating(active_W: Array | None, fn, *args):
  """``fn(*args)`` traced inside ``participating(active_W)``.

  Under ``lax.cond``/``switch``/``scan`` pass the mask as an operand and call
  this inside the branch: the mask is then this trace's own value, never one
  closed over from an enclosing trace (JAX caches what it traces by the
  function, so a closed-over mask could outlive its trace).
  """
  with participating(active_W):
    return fn(*args)


def fragment(p: int | None):
  """While tracing an asynchronous strategy's sync, send or pull, the
  fragment of the parameters it moves (a static index), or None: all of
  them (``Strategy.fragments``; the engine's schedule sets it)."""
  return pushed(_TRACE.fragments, p)


def current_fragment() -> int | None:
  return top(_TRACE.fragments)


def participants() -> Array | None:
  """The workers taking part in the communication being traced (bool (W,)
  of this device's workers), or None: all."""
  return top(_TRACE.participants)


def _mask(active_W: Array | None) -> Array | None:
  return participants() if active_W is None else active_W


def num_workers(tree_W: PyTree) -> int:
  """The workers this device holds (axis 0 of ``tree_W``)."""
  return jax.tree.leaves(tree_W)[0].shape[0]


def total_workers(tree_W: PyTree) -> int:
  """W: the workers of all devices together."""
  s = _sharded()
  return num_workers(tree_W) if s is None else s.num_workers


def worker_offset() -> Array | int:
  """The global index of this device's first worker (0 unsharded)."""
  s = _sharded()
  if s is None:
    return 0
  return jax.lax.axis_index(s.axis) * (s.num_workers // s.shards)


def worker_ids(local_workers: int) -> Array:
  """Global indices of this device's workers: int32 (local_workers,)."""
  return jnp.arange(local_workers, dtype=jnp.int32) + worker_offset()


def all_workers(x_W: PyTree) -> PyTree:
  """Every device's rows, in worker order: (W_local, ...) -> (W, ...)."""
  s = _sharded()
  if s is None:
    return x_W
  return jax.tree.map(
      lambda x: jax.lax.all_gather(x, s.axis, axis=0, tiled=True), x_W)


def local_workers(x_all: PyTree) -> PyTree:
  """This device's rows of a tree over all W workers: (W, ...) -> (W_local, ...)."""
  s = _sharded()
  if s is None:
    return x_all
  size = s.num_workers // s.shards
  return jax.tree.map(
      lambda x: jax.lax.dynamic_slice_in_dim(x, worker_offset(), size, axis=0),
      x_all)


def _psum(x):
  s = _sharded()
  return x if s is None else jax.lax.psum(x, s.axis)


def device_mean(tree: PyTree) -> PyTree:
  """The mean over devices of a tree every device computes for its own
  workers (equally many on each), e.g. the gradient of their mean loss:
  the same tree over all workers. Unsharded, ``tree`` itself."""
  s = _sharded()
  if s is None:
    return tree
  return jax.tree.map(lambda x: jax.lax.psum(x, s.axis) / s.shards, tree)


def worker_sum(tree_W: PyTree, active_W: Array | None = None) -> PyTree:
  """The sum over workers of every leaf: (W, ...) -> (...); over the
  participating (or ``active_W``) workers only when there is a mask."""
  active_W = _mask(active_W)
  return jax.tree.map(
      lambda x: _psum(leading_sum(x, active_W)).astype(x.dtype), tree_W)


def where_workers(mask_W: Array, new_W: PyTree, old_W: PyTree) -> PyTree:
  """Per worker, ``new_W`` where ``mask_W`` (bool, one per worker) else
  ``old_W``."""
  return jax.tree.map(
      lambda n, o: jnp.where(mask_W.reshape((-1,) + (1,) * (n.ndim - 1)), n,
                             o), new_W, old_W)


def worker_mean(tree_W: PyTree, active_W: Array | None = None) -> PyTree:
  """The mean over workers of every leaf: (W, ...) -> (...).

  With ``active_W`` (bool (W,)) or inside ``participating``, the mean over
  those workers only (zeros when none is): what an average computes when the
  others' messages are missing.
  """
  if not jax.tree.leaves(tree_W):  # a model with no metrics: {}
    return tree_W
  active_W = _mask(active_W)
  if active_W is None:
    count = jnp.asarray(total_workers(tree_W), jnp.float32)
  else:
    count = jnp.maximum(_psum(jnp.sum(active_W.astype(jnp.float32))), 1.0)

  def one(x):
    total = _psum(leading_sum(x, active_W))
    if not jnp.issubdtype(total.dtype, jnp.floating):
      return total / count
    return (total / count.astype(total.dtype)).astype(x.dtype)

  return jax.tree.map(one, tree_W)


def any_worker(mask_W: Array) -> Array:
  """Whether any worker's flag is set (all devices)."""
  return _psum(jnp.sum(mask_W.astype(jnp.int32))) > 0


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
      group without any keeps its values); None: the participating workers
      (``participating``), or all.

  Sharded, groups span devices: every device gathers all W rows, averages
  and keeps its own (W x the tree per device for the moment of the sync).
  """
  active_W = _mask(active_W)
  if _sharded() is not None:
    return local_workers(_group_mean(
        all_workers(tree_W), perm, group_size,
        None if active_W is None else all_workers(active_W)))
  return _group_mean(tree_W, perm, group_size, active_W)


def _group_mean(tree_W, perm, group_size, active_W):
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
  return (worker_mean(jnp.sqrt(sq_dev_W)) /
          jnp.maximum(jnp.sqrt(sq_mean), 1e-30))


def worker_correlation(params_W: PyTree) -> Array:
  """Mean over pairs of workers i != j of the Pearson correlation of their
  whole parameter vectors (EXO Gym's correlation metric); 1 when they all
  agree, nan with one worker.

  With u_w worker w's centred vector scaled to unit norm, the pairs' sum is
  ||sum_w u_w||^2 - sum_w ||u_w||^2: O(W P), and its only reduction over
  workers is a sum (device-safe), not a W x W matrix.
  """
  leaves = [x.reshape(x.shape[0], -1).astype(jnp.float32)
            for x in jax.tree.leaves(params_W)]
  size = sum(x.shape[1] for x in leaves)
  mean_W = sum(jnp.sum(x, axis=1) for x in leaves) / size
  sq_W = sum(jnp.sum(jnp.square(x - mean_W[:, None]), axis=1) for x in leaves)
  scale_W = jnp.where(sq_W > 0, jax.lax.rsqrt(jnp.maximum(sq_W, 1e-30)), 0.0)
  units = [(x - mean_W[:, None]) * scale_W[:, None] for x in leaves]
  total = worker_sum(units)
  pairs = sum(jnp.sum(jnp.square(t)) for t in total) - worker_sum(
      sq_W * jnp.square(scale_W))
  w = total_workers(params_W)
  return pairs / (w * (w - 1)) if w > 1 else jnp.float32(jnp.nan)
