"""The data of workers that left the fleet for good, given to those that
stay (``Faults(leave_shards="redistribute")``).

From a worker's failure on, each remaining worker draws each example of its
batch from a departed worker's shard (one chosen at random per worker and
step) with probability departed / W, and from its own shard otherwise: the
fleet keeps seeing every shard at its share of the data, as if the departed
workers' data had been split among the others.
"""

import dataclasses

import jax
import jax.numpy as jnp

from lowbw.transforms import all_workers, local_workers
from lowbw.transforms._reductions import worker_offset


def redistributed(sampler, key, step, batch_W, net):
  """``batch_W`` (this device's workers' batches at ``step``) with the
  departed workers' examples mixed in (``net``: the run's ``NetParams``,
  whose ``fail_step_W`` says who left when)."""
  left_W = step >= net.fail_step_W                      # all W workers
  w = left_W.shape[0]
  share = jnp.sum(left_W.astype(jnp.float32)) / w
  key = jax.random.fold_in(jax.random.fold_in(key, 0x1EF7), step)
  pick_key, mix_key = jax.random.split(key)
  local = sampler.num_workers
  # For each of this device's workers, one departed worker's shard.
  logits = jnp.where(left_W, 0.0, -jnp.inf)
  donor = local_workers(jax.random.categorical(pick_key, logits, shape=(w,)))
  idx_all, len_all = all_workers((sampler.shard_idx_W, sampler.shard_len_W))
  donors = dataclasses.replace(sampler, shard_idx_W=idx_all[donor],
                               shard_len_W=len_all[donor])
  theirs = donors.sample(jax.random.fold_in(key, 1), step, worker_offset())
  stays = ~local_workers(left_W)
  u = jax.random.uniform(jax.random.fold_in(mix_key, worker_offset()),
                         (local, sampler.batch_size))
  take = (u < share) & stays[:, None] & jnp.any(left_W)
  return jax.tree.map(
      lambda own, other: jnp.where(
          take.reshape(take.shape + (1,) * (own.ndim - 2)), other, own),
      batch_W, theirs)
