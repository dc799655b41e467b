"""Per-worker batch sampling inside jit.

Each worker walks its own shard epoch after epoch, each epoch in a fresh random
order. The order is never materialised: ``random_bijection`` gives the position
of any stream element in O(1), so a step costs O(W * batch) whatever the shard
sizes are.
"""

import dataclasses

import jax
import jax.numpy as jnp

from lowbw._random import random_bijection
from lowbw._types import Array, ArrayLike, Batch, PRNGKey


@dataclasses.dataclass(frozen=True)
class WorkerSampler:
  """Every worker's shard, on device, and how to draw its batches.

  A pytree: the arrays are leaves, so the dataset is an argument of the jitted
  round rather than a constant compiled into it; ``batch_size``, ``task``,
  ``seq_len`` and ``max_shard`` are static.

  Attributes:
    arrays: the training arrays on device: ``{"x", "y"}`` for classification,
      ``{"tokens"}`` for language modelling.
    shard_idx_W: int32 (W, max_shard); row w lists worker w's example indices,
      padded past ``shard_len_W[w]``.
    shard_len_W: int32 (W,), the number of examples each worker owns.
    batch_size: examples per worker per step (static).
    task: ``"classification"`` or ``"lm"`` (static).
    seq_len: tokens per lm example, None for classification (static).
    max_shard: the largest shard size (static; fixes the bijection's width).

  Example:
    >>> import jax
    >>> from lowbw import data
    >>> sampler = data.digits().build(num_workers=4, batch_size=8, seed=0)
    >>> batch_W = jax.jit(lambda s, k, t: s.sample(k, t))(
    ...     sampler, jax.random.key(0), 3)
    >>> batch_W["x"].shape, batch_W["y"].shape
    ((4, 8, 8, 8, 1), (4, 8))
  """

  arrays: dict[str, Array]
  shard_idx_W: Array
  shard_len_W: Array
  batch_size: int
  task: str
  seq_len: int | None
  max_shard: int

  @property
  def num_workers(self) -> int:
    return self.shard_len_W.shape[0]

  def sample(
      self, key: PRNGKey, step: ArrayLike, worker_offset: ArrayLike = 0,
      streams: Array | None = None
  ) -> Batch:
    """Draws step ``step``'s batch for every worker.

    Worker w's stream is its shard in the order of a keyed bijection drawn
    from ``fold_in(fold_in(key, w), epoch)``, one epoch after another; step s
    takes stream positions ``s*b .. s*b + b - 1``. Within an epoch no example
    repeats, and with ``b`` equal to the shard size every step is the whole
    shard.

    Args:
      key: the data key; pass the same key every step (the step, not the key,
        moves the stream forward).
      step: int scalar >= 0, may be traced.
      worker_offset: global index of this sampler's worker 0, for a sampler
        whose rows are a slice of the workers (e.g. inside ``shard_map``), so
        that worker w draws the same batches wherever it runs.
      streams: int (W,), the id each row's stream is keyed by instead of its
        worker index (a sampled client's id, ``ClientSampler``), or None.

    Returns:
      The batch with leading axes (W, b): ``{"x": float32, "y": int32}`` for
      classification, ``{"tokens": int32 (W, b, seq_len + 1)}`` for lm.
    """
    step = jnp.asarray(step, jnp.uint32)
    if streams is None:
      workers = jnp.arange(self.num_workers, dtype=jnp.uint32) + jnp.asarray(
          worker_offset, jnp.uint32)
    else:
      workers = jnp.asarray(streams, jnp.uint32)

    def one_worker(worker, shard_idx, shard_len):
      epoch, offset = _epoch_and_offset(
          step, shard_len, self.batch_size, self.max_shard)
      position = offset + jnp.arange(self.batch_size, dtype=jnp.uint32)
      n = shard_len.astype(jnp.uint32)
      # b <= n, so a batch spans at most two epochs: compute both orders for
      # the batch's b positions and select, rather than one key per element.
      wrapped = position >= n
      local = jnp.where(wrapped, position - n, position)
      worker_key = jax.random.fold_in(key, worker)
      this_epoch = random_bijection(
          jax.random.fold_in(worker_key, epoch), local, n, self.max_shard)
      next_epoch = random_bijection(
          jax.random.fold_in(worker_key, epoch + 1), local, n, self.max_shard)
      return shard_idx[jnp.where(wrapped, next_epoch, this_epoch)]

    example_W = jax.vmap(one_worker)(
        workers, self.shard_idx_W, self.shard_len_W)
    return self.gather(example_W)

  def gather(self, example_W: Array) -> Batch:
    """Looks up examples by index; ``example_W`` int (W, b) -> batch_W."""
    if self.task == "classification":
      return {
          "x": jnp.take(self.arrays["x"], example_W, axis=0),
          "y": jnp.take(self.arrays["y"], example_W, axis=0),
      }
    tokens = self.arrays["tokens"]
    window = self.seq_len + 1

    def one_window(example):
      start = example * self.seq_len
      return jax.lax.dynamic_slice(tokens, (start,), (window,))

    windows = jax.vmap(jax.vmap(one_window))(example_W)
    return {"tokens": windows.astype(jnp.int32)}


jax.tree_util.register_dataclass(
    WorkerSampler,
    data_fields=["arrays", "shard_idx_W", "shard_len_W"],
    meta_fields=["batch_size", "task", "seq_len", "max_shard"],
)


def _epoch_and_offset(
    step: Array, shard_len: Array, batch_size: int, max_shard: int
) -> tuple[Array, Array]:
  """``divmod(step * batch_size, shard_len)`` in uint32 without overflow.

  ``step * b`` overflows after 2**32 examples per worker; writing
  ``step = q*n + c`` only multiplies ``c * b < n * b``, which is exact for any
  step whenever ``max_shard * b < 2**32`` (a static check).
  """
  n = shard_len.astype(jnp.uint32)
  b = jnp.uint32(batch_size)
  if max_shard * batch_size < 2**32:
    laps, rest = step // n, step % n
    partial = rest * b
    return laps * b + partial // n, partial % n
  start = step * b  # exact while a worker has drawn fewer than 2**32 examples
  return start // n, start % n
