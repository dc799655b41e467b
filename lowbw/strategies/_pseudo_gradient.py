"""The DiLoCo family's pseudo-gradient: each worker's round start minus its
parameters, through the message chain, averaged over the participants.
Shared by DiLoCo's outer step and its delayed variant (``_delayed``)."""

import jax
import jax.numpy as jnp
import optax

from lowbw._types import PyTree
from lowbw.transforms import (Compression, broadcast_to_workers, corrupt,
                              num_workers, robust_mean, transmit, worker_ids,
                              worker_mean)
from lowbw.transforms._compression import aggregate
from lowbw.transforms._robust import (current as current_adversaries,
                                      current_weights, weighted_mean)


def mean_pseudo_gradient(comp: Compression, global_params: PyTree,
                         params_W: PyTree, message_W: PyTree, key,
                         active_W=None, senders_W=None) -> tuple:
  """The participants' mean (or ``comp.robust`` aggregate) of what the
  receivers decode of each worker's global - theta_w (through the message
  chain; a Byzantine worker's corrupted first; weighted by DyLU's steps
  taken when the engine says so), and the message states."""
  weights = current_weights()
  plain = (comp.robust[0] == "mean" and current_adversaries() is None and
           weights is None)
  if comp.message is None and plain:  # the same mean, no (W, ...) deltas
    return _mean_delta(global_params, params_W, active_W), message_W
  w = num_workers(params_W)
  delta_W = corrupt(optax.tree.sub(broadcast_to_workers(global_params, w),
                                   params_W), worker_ids(w))
  sent_W, message_W = transmit(comp, delta_W, message_W, key, active_W,
                               senders_W)
  if weights is not None:
    return weighted_mean(sent_W, weights, active_W), message_W
  if comp.robust[0] == "mean":
    return aggregate(comp, sent_W, key, active_W), message_W
  return robust_mean(sent_W, *comp.robust, active_W), message_W


def _mean_delta(global_params, params_W, active_W) -> PyTree:
  """The participants' mean of global - theta_w, as global - their mean of
  theta_w (zeros when none takes part): one pass over the workers'
  parameters, without materializing every worker's delta."""
  some = worker_mean(jnp.ones(num_workers(params_W)), active_W)
  return jax.tree.map(lambda g, m: (g * some.astype(g.dtype) - m),
                      global_params, worker_mean(params_W, active_W))
