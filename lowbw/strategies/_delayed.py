"""DiLoCo with its outer step one round late, so that a round's
communication overlaps the next round's inner steps: the delayed and eager
outer updates of Kale, Douillard and Donchev 2025, "Eager Updates For
Overlapped Communication and Computation in DiLoCo", arXiv 2502.12996
(Algorithms 2 and 3); the delayed one is also DiLoCoX's one-step delay
(arXiv 2506.21263)."""

from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax

from lowbw._types import Params, PyTree
from lowbw.strategies import _base
from lowbw.strategies._pseudo_gradient import mean_pseudo_gradient
from lowbw.transforms import (Compression, broadcast_to_workers, num_workers,
                              transmit, worker_mean)
from lowbw.transforms._compression import aggregate, init_residual
from lowbw.transforms._reductions import total_workers


class DelayedComm(NamedTuple):
  """DiLoCo's communication state with its outer step one round late.

  Attributes:
    global_params: the shared model theta (what workers start a round from,
      and what evaluation uses).
    outer_state: the outer optimizer's state.
    residual_W: per-worker error-feedback residuals, ``()`` without feedback.
    in_flight: the previous round's mean pseudo-gradient, still being
      communicated while the next round runs (zeros before the first sync,
      which therefore applies nothing: the step counter says so).
  """

  global_params: Params
  outer_state: PyTree
  residual_W: PyTree
  in_flight: Params


class EagerComm(NamedTuple):
  """The eager variant's state: every worker its own outer model.

  Attributes:
    outer_params_W: each worker's outer parameters theta_m (what it starts
      a round from); evaluation uses their mean.
    outer_state_W: each worker's outer optimizer state (the workers feed
      their optimizers different gradients).
    residual_W: per-worker error-feedback residuals, ``()`` without feedback.
    in_flight: the previous round's mean of what the workers sent.
    sent_W: what each worker sent in the previous round (decoded), which
      its own fresh pseudo-gradient replaces in the mix.
  """

  outer_params_W: Params
  outer_state_W: PyTree
  residual_W: PyTree
  in_flight: Params
  sent_W: Params


def delayed_init(inner, outer, comp: Compression):
  def init(params, num_workers_, key):
    state = _base.inner_init(inner, params, num_workers_, key, ())
    return state._replace(comm=DelayedComm(
        params, outer.init(params), init_residual(comp, state.params_W),
        jax.tree.map(jnp.zeros_like, params)))
  return init


def eager_init(inner, outer, comp: Compression):
  def init(params, num_workers_, key):
    state = _base.inner_init(inner, params, num_workers_, key, ())
    params_W = broadcast_to_workers(params, num_workers_)
    zeros = jax.tree.map(jnp.zeros_like, params)
    return state._replace(comm=EagerComm(
        params_W, jax.vmap(outer.init)(params_W),
        init_residual(comp, state.params_W), zeros,
        broadcast_to_workers(zeros, num_workers_)))
  return init


def _sent(comp: Compression, start_W: PyTree, params_W: PyTree,
          residual_W: PyTree, key) -> tuple:
  """Each worker's pseudo-gradient from its own round start (eager: every
  worker has its own) through the message chain: (what the receivers
  decode, their mean over the participants, the message states)."""
  delta_W = optax.tree.sub(start_W, params_W)
  sent_W, residual_W = transmit(comp, delta_W, residual_W, key)
  return sent_W, aggregate(comp, sent_W, key), residual_W


def delayed_sync(outer: optax.GradientTransformation, comp: Compression,
                 period: int):
  """This round's mean pseudo-gradient starts its communication, and the
  outer step applies the previous round's, which arrived while this round
  ran (Algorithm 2); every worker restarts from the result. At the first
  sync (step ``period``) nothing has arrived yet."""

  def sync(state):
    c = state.comm
    W = num_workers(state.params_W)
    mean, residual_W = mean_pseudo_gradient(
        comp, c.global_params, state.params_W, c.residual_W,
        _base.comm_key(state))

    def step(args):
      params, outer_state, grad = args
      updates, outer_state = outer.update(grad, outer_state, params)
      return optax.apply_updates(params, updates), outer_state

    global_params, outer_state = jax.lax.cond(
        state.step > period, step, lambda args: args[:2],
        (c.global_params, c.outer_state, c.in_flight))
    return state._replace(
        params_W=broadcast_to_workers(global_params, W),
        comm=DelayedComm(global_params, outer_state, residual_W, mean),
    ), {**_base.events(pseudo_gradients=1),
        **_base.metrics(pseudo_grad_norm=optax.tree.norm(mean))}

  return sync


def eager_sync(outer: optax.GradientTransformation, comp: Compression):
  """Each worker's outer step on the previous round's mean with its own
  stale contribution replaced by its fresh one (Algorithm 3):
  mean(t-1) + (sent_m(t) - sent_m(t-1)) / W, so every worker's message
  enters each worker's model once, its own at once and the others' one
  round late; each worker restarts from its own outer parameters. With one
  worker it is DiLoCo. At the first sync the mean and the previous messages
  are zeros: each worker steps on its own message / W."""

  def sync(state):
    c = state.comm
    W = total_workers(state.params_W)  # all devices' (a device holds some)
    sent_W, mean, residual_W = _sent(comp, c.outer_params_W, state.params_W,
                                     c.residual_W, _base.comm_key(state))
    mixed_W = jax.tree.map(lambda m, new, old: m[None] + (new - old) / W,
                           c.in_flight, sent_W, c.sent_W)
    updates_W, outer_state_W = jax.vmap(outer.update)(
        mixed_W, c.outer_state_W, c.outer_params_W)
    outer_params_W = optax.apply_updates(c.outer_params_W, updates_W)
    return state._replace(
        params_W=outer_params_W,
        comm=EagerComm(outer_params_W, outer_state_W, residual_W, mean,
                       sent_W),
    ), {**_base.events(pseudo_gradients=1),
        **_base.metrics(pseudo_grad_norm=optax.tree.norm(mean))}

  return sync


def eager_global(state):
  """The workers' mean outer parameters (the participants')."""
  return worker_mean(state.comm.outer_params_W)
