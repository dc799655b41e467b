"""Partial parameter updates (Filippova et al., 2025, "Partial Parameter
Updates for Efficient Distributed Training", arXiv 2509.22418): a DiLoCo-
family strategy where each worker trains a fixed slice of the parameters.

Every worker runs the full forward pass on the whole model but updates only
the tensors it owns; the others stay frozen on it, bit for bit, until the
sync (its inner updates are zero there). At the sync each worker sends the
pseudo-gradient of its slice (through the codec, with error feedback if
asked); the syncer takes, per coordinate, the mean over the participating
workers that own it, and applies DiLoCo's outer step (Nesterov by default).

The slices here are lowbw's documented simple assignment: the model's
tensors, in ``jax.tree.leaves`` order, dealt round-robin to the workers,
tensor i owned by workers i, i+1, ..., i+owners-1 (mod W). With
``owners >= W`` every worker owns every tensor, and the strategy is DiLoCo.
"""

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from lowbw import _validate
from lowbw._types import Params, PyTree
from lowbw.network import channel
from lowbw.strategies import _base, _optim, _spec
from lowbw.strategies._diloco import (DiLoCoComm, default_outer,
                                      diloco_channels, diloco_init,
                                      global_of)
from lowbw.transforms import (Codec, Compression, broadcast_to_workers,
                              compression, num_workers,
                              per_worker, transmit, worker_sum)
from lowbw.transforms._compression import message_bytes


class PartialInner(NamedTuple):
  """A worker's own state.

  Attributes:
    opt: the inner optimizer's state (its moments stay zero on frozen
      tensors: their gradients are zeroed).
    own_W: per parameter tensor, float32 (W,): 1 where the worker owns it.
  """

  opt: PyTree
  own_W: PyTree


def owners_of(num_leaves: int, W: int, owners: int) -> np.ndarray:
  """bool (W, num_leaves): tensor i is owned by workers i, ..., i+r-1
  (mod W), r = min(owners, W)."""
  r = min(owners, W)
  table = np.zeros((W, num_leaves), bool)
  for i in range(num_leaves):
    for j in range(r):
      table[(i + j) % W, i] = True
  return table


def own_mask(params: Params, W: int, owners: int) -> PyTree:
  """Per tensor of ``params``, float32 (W,): which workers own it."""
  leaves, treedef = jax.tree.flatten(params)
  table = owners_of(len(leaves), W, owners)
  return jax.tree.unflatten(
      treedef, [jnp.asarray(table[:, i], jnp.float32)
                for i in range(len(leaves))])


def slices(params: Params, W: int, owners: int) -> list[list]:
  """Per worker, the list of the tensors (leaves) it owns."""
  leaves = jax.tree.leaves(params)
  table = owners_of(len(leaves), W, owners)
  return [[x for i, x in enumerate(leaves) if table[w, i]] for w in range(W)]


def slice_bytes(params: Params, W: int, owners: int = 1,
                codec: Codec | str | None = None) -> list[int]:
  """Exact payload bytes each worker sends per sync: its slice's message."""
  comp = compression(codec, None)
  return [message_bytes(comp, s) for s in slices(params, W, owners)]


def _masked(tree_W: PyTree, own_W: PyTree) -> PyTree:
  return jax.tree.map(
      lambda x, m: x * m.reshape((-1,) + (1,) * (x.ndim - 1)).astype(x.dtype),
      tree_W, own_W)


def _channels(comp: Compression, owners: int):
  """One message per sync. Every worker owning everything (owners >= W):
  DiLoCo's. Otherwise each worker's slice is all-gathered (every worker
  needs every slice to rebuild the global model); the payload is the
  largest worker's slice (the others' are at most that)."""
  def channels(params, num_workers_):
    if owners >= num_workers_:
      return diloco_channels(comp)(params, num_workers_)
    largest = max(message_bytes(comp, s)
                  for s in slices(params, num_workers_, owners))
    return {"pseudo_gradients": channel("all_gather", largest, num_workers_)}
  return channels


def _init(inner, outer, comp: Compression, owners: int):
  """DiLoCo's state, each worker's inner state with its ownership."""
  diloco = diloco_init(inner, outer, comp)

  def init(params, num_workers_, key):
    state = diloco(params, num_workers_, key)
    return state._replace(inner_W=PartialInner(
        state.inner_W, own_mask(params, num_workers_, owners)))
  return init


def _local(inner):
  def local(state, grads_W):
    own_W = state.inner_W.own_W
    updates_W, opt_W = per_worker(inner).update(
        _masked(grads_W, own_W), state.inner_W.opt, state.params_W)
    return state._replace(
        step=state.step + 1,
        params_W=optax.apply_updates(state.params_W,
                                     _masked(updates_W, own_W)),
        inner_W=PartialInner(opt_W, own_W)), {}
  return local


def owned_mean(sent_W: PyTree, own_W: PyTree) -> PyTree:
  """Per coordinate, the mean of the decoded messages over the
  participating workers that own it (zero where none of them took part)."""
  total = worker_sum(_masked(sent_W, own_W))
  count = worker_sum(own_W)
  return jax.tree.map(lambda t, c: t / jnp.maximum(c, 1.0).astype(t.dtype),
                      total, count)


def _sync(outer, comp: Compression):
  def sync(state):
    c = state.comm
    own_W = state.inner_W.own_W
    W = num_workers(state.params_W)
    delta_W = optax.tree.sub(broadcast_to_workers(c.global_params, W),
                             state.params_W)
    sent_W, residual_W = transmit(comp, _masked(delta_W, own_W),
                                  c.residual_W, _base.comm_key(state))
    pseudo_grad = owned_mean(sent_W, own_W)
    updates, outer_state = outer.update(pseudo_grad, c.outer_state,
                                        c.global_params)
    new = optax.apply_updates(c.global_params, updates)
    return state._replace(
        params_W=broadcast_to_workers(new, W),
        comm=DiLoCoComm(new, outer_state, residual_W)), {
            **_base.events(pseudo_gradients=1),
            **_base.metrics(pseudo_grad_norm=optax.tree.norm(pseudo_grad))}
  return sync


def partial_updates(
    inner: optax.GradientTransformation | None = None,
    outer: optax.GradientTransformation | None = None,
    H: int = 100,
    owners: int = 1,
    codec: Codec | str | None = None,
    error_feedback: float | None = None,
) -> _base.Strategy:
  """Partial parameter updates: each worker trains a fixed slice of the
  tensors for H steps; the syncer averages each coordinate's pseudo-gradient
  over the workers that own it and takes DiLoCo's outer step.

  Filippova et al. 2025, arXiv 2509.22418. The update rule: worker k's
  gradient and inner update are zero outside its slice I_k (full forward
  pass, frozen elsewhere); its pseudo-gradient Delta_k = theta - theta_k is
  zero there too; the outer optimizer steps on Delta[i] = sum_k Delta_k[i]
  / m[i], m[i] the number of (participating) workers owning coordinate i.
  A coordinate none of whose owners took part gets a zero pseudo-gradient
  (the outer momentum still moves it, as DiLoCo's does when nobody takes
  part). Slices: the model's tensors dealt round-robin (tensor i to workers
  i..i+owners-1 mod W), lowbw's simple assignment, not the paper's.
  Defaults are DiLoCo's (inner AdamW lr 4e-4, weight decay 0.1; outer
  Nesterov lr 0.7, momentum 0.9); the inner optimizer's state exists for
  every tensor but stays zero on frozen ones (zero gradients, and updates
  masked, so weight decay does not move them either).

  Bytes per worker and sync (``slice_bytes``): each worker's slice, 4 bytes
  per float32 parameter it owns (or the codec's payload of its tensors),
  all-gathered: (W-1) x the largest slice on the wire. With owners >= W
  every worker owns the whole model and the channel is DiLoCo's.

  Args:
    inner: per-worker optimizer, state kept across rounds.
    outer: optimizer of the global parameters fed the per-coordinate mean.
    H: inner steps per round (>= 1).
    owners: how many workers own (train) each tensor (>= 1; W or more:
      every worker owns everything, DiLoCo).
    codec, error_feedback: compression of the pseudo-gradients, as DiLoCo.

  Example:
    >>> strategy = lowbw.strategies.partial_updates(H=20, owners=2)
  """
  inner = _base.optimizer("inner", inner, _base.default_inner)
  outer = _base.optimizer("outer", outer, default_outer)
  H = _validate.positive_int("H", H)
  owners = _validate.positive_int("owners", owners)
  comp = compression(codec, error_feedback)
  return _base.make(
      "partial_updates", H, _base.Parts(
          _init(inner, outer, comp, owners), _local(inner),
          _sync(outer, comp), global_of,
          _channels(comp, owners)),
      {"name": "partial_updates", "inner": _base.describe(inner),
       "outer": _base.describe(outer), "H": H, "owners": owners,
       **comp.config},
      outer_places={"outer": "outer_state"}, inner=inner)


SPEC = _spec.spec(
    partial_updates, inner=_optim.DILOCO_INNER, outer=_optim.DILOCO_OUTER,
    paper="Filippova et al. 2025, arXiv 2509.22418",
    where="the update rule of its method section (per-coordinate mean over the workers owning it, then the outer step); optimizers, H=100 and the round-robin tensor slices are lowbw's (DiLoCo's defaults), the paper's own slice assignment not reproduced",
    help={"owners": "workers that own (train) each parameter tensor; W or "
                    "more: every worker owns everything (DiLoCo)",
          "codec": "codec of the pseudo-gradients"})
