"""Gossip over the worker axis: who a worker talks to in a round, and the
mix of its peers' messages. Shared by NoLoCo (one random peer) and GASLoC
(a random matching, a random cycle, a ring or the complete graph).

A round's graph is an int array ``peers_WK``: row i lists the K peers of
worker i (global indices). Random graphs are drawn from the strategy's key
and the round (``step // H``), the same on every worker and device, so a
graph costs no bytes. The mix gathers the peers' rows with ``take``: under
the engine's ``shard_map`` every device gathers all W rows first
(``all_workers``), as ``group_mean`` does, and keeps its own.
"""

import jax
import jax.numpy as jnp

from lowbw import _validate
from lowbw._types import Array, PyTree
from lowbw.transforms import all_workers, num_workers, where_workers
from lowbw.transforms._reductions import worker_ids

GRAPHS = ("one_peer", "two_peer", "ring", "complete")


def round_key(key, step, H: int, salt: int):
  """The key of the round holding ``step``: fresh every H steps."""
  return jax.random.fold_in(jax.random.fold_in(key, salt), step // H)


def pairs(key, step, H: int, num_workers_: int):
  """The round's random matching: a permutation whose consecutive entries
  (2g, 2g + 1) are pair g, fresh every round, the same on every worker."""
  return jax.random.permutation(round_key(key, step, H, 0x9A1F),
                                num_workers_)


def degree(graph: str, num_workers_: int) -> int:
  """K: the peers of every worker in ``graph`` over W workers."""
  return {"one_peer": 1, "two_peer": 2, "ring": 2}.get(graph,
                                                       num_workers_ - 1)


def check(graph: str, num_workers_: int) -> None:
  """Refuses a fleet ``graph`` cannot be drawn over."""
  if graph == "one_peer" and (num_workers_ < 2 or num_workers_ % 2):
    raise _validate.fail("workers", num_workers_, "graph 'one_peer' pairs "
                         "the workers every round: give an even number, >= 2")
  least = 2 if graph in ("one_peer", "complete") else 3
  if num_workers_ < least:
    raise _validate.fail("workers", num_workers_, f"graph {graph!r} needs "
                         f">= {least} workers (every worker has distinct "
                         "peers)")


def peers(graph: str, key, step, H: int, num_workers_: int) -> Array:
  """int32 (W, K): the round's peers of every worker.

  one_peer: its partner in the round's matching (``pairs``, NoLoCo's).
  two_peer: its two neighbours in a fresh random cycle through all the
    workers; for an even W, the union of two disjoint random matchings.
  ring: workers i - 1 and i + 1 (mod W), every round.
  complete: all the others.
  """
  W = num_workers_
  if graph == "one_peer":
    perm = pairs(key, step, H, W)
    return perm[jnp.argsort(perm) ^ 1][:, None].astype(jnp.int32)
  if graph == "two_peer":
    perm = jax.random.permutation(round_key(key, step, H, 0x6C7C), W)
    at = jnp.argsort(perm)
    return jnp.stack([perm[(at - 1) % W], perm[(at + 1) % W]],
                     axis=1).astype(jnp.int32)
  shifts = (jnp.array([W - 1, 1], jnp.int32) if graph == "ring"
            else jnp.arange(1, W, dtype=jnp.int32))
  i = jnp.arange(W, dtype=jnp.int32)
  return (i[:, None] + shifts[None, :]) % W


def mix(tree_W: PyTree, peers_WK: Array, rate: float,
        active_W: Array | None = None) -> PyTree:
  """z_i + rate * sum_j (z_j - z_i) over worker i's peers j: one gossip
  step, (I - rate * L) z with L the round graph's Laplacian.

  With ``active_W`` (bool, this device's workers) only the peers that take
  part send: a worker mixes with its active peers alone.
  """
  ids = worker_ids(num_workers(tree_W))
  nbr_LK = peers_WK[ids]
  if active_W is None:
    sent_LK = jnp.ones(nbr_LK.shape, bool)
  else:
    sent_LK = all_workers(active_W)[nbr_LK]

  def one(z, z_all):
    got = jnp.take(z_all, nbr_LK, axis=0) - z[:, None]
    w = sent_LK.reshape(sent_LK.shape + (1,) * (z.ndim - 1))
    return z + jnp.asarray(rate, z.dtype) * jnp.sum(
        jnp.where(w, got, jnp.zeros((), z.dtype)), axis=1)

  return jax.tree.map(one, tree_W, all_workers(tree_W))


def kept(active_W: Array | None, new_W: PyTree, old_W: PyTree) -> PyTree:
  """``new_W``, except that a worker that sat the round out keeps
  ``old_W``."""
  return new_W if active_W is None else where_workers(active_W, new_W, old_W)
