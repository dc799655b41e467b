"""SNOO: the Step-K Nesterov Outer Optimizer (*SNOO: Step-K Nesterov Outer
Optimizer - The Surprising Effectiveness of Nesterov Momentum Applied to
Pseudo-Gradients*, Kallusky et al., arXiv 2510.15830), as one optax
transformation (``snoo_optimizer``) and as a strategy (``snoo``).

One model, no averaging of models: the inner optimizer takes K steps from
the slow weights w (the fast weights), their displacement s = w - w_K is a
pseudo-gradient, and the outer optimizer (Nesterov SGD, as DiLoCo's: lr
0.7, momentum 0.9) steps w with it; the fast weights restart from the new
w. It is DiLoCo with one worker, and the paper's argument is that most of
DiLoCo's gain over AdamW comes from this outer step alone: the control a
DiLoCo comparison needs (``shadow="snoo"``: a paired SNOO lane; the
strategy ``snoo``: a run of its own, data parallel over W workers).
"""

from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax

from lowbw import _validate
from lowbw._types import Params, PyTree
from lowbw.strategies import _base, _optim, _spec
from lowbw.strategies._diloco import DiLoCoComm, default_outer
from lowbw.strategies._pseudo_gradient import mean_pseudo_gradient
from lowbw.transforms import (broadcast_to_workers, comm_channel,
                              compression, num_workers, replace_with_mean)


class SnooState(NamedTuple):
  """The inner optimizer's state, the outer's, the slow weights and the
  inner steps taken."""

  inner: PyTree
  outer: PyTree
  slow: Params
  count: jax.Array


def snoo_optimizer(inner: optax.GradientTransformation | None = None,
                   outer: optax.GradientTransformation | None = None,
                   K: int = 30) -> optax.GradientTransformation:
  """SNOO (see the module): ``inner`` steps, and every ``K`` of them an
  ``outer`` step on the slow weights with their displacement.

  Args:
    inner: the inner optimizer (default DiLoCo's AdamW, lr 4e-4).
    outer: the outer optimizer on the pseudo-gradient (default Nesterov SGD,
      lr 0.7, momentum 0.9, as DiLoCo's; a plain optax one, so that a run's
      traced inner learning rate does not reach it).
    K: inner steps per outer step (>= 1).

  Returns:
    An optax transformation whose ``update`` needs ``params``.

  Example:
    >>> tx = lowbw.strategies.snoo_optimizer(optax.adamw(1e-3), K=10)
  """
  K = _validate.positive_int("K", K)
  inner = inner if inner is not None else _optim.inner(_optim.DILOCO_INNER)
  if outer is None:
    outer = optax.sgd(_optim.DILOCO_OUTER.lr,
                      momentum=_optim.DILOCO_OUTER.momentum, nesterov=True)

  def init(params):
    return SnooState(inner.init(params), outer.init(params),
                     jax.tree.map(jnp.copy, params), jnp.zeros((), jnp.int32))

  def update(grads, state, params=None):
    if params is None:
      raise ValueError("snoo needs params in update()")
    steps, inner_state = inner.update(grads, state.inner, params)
    fast = optax.apply_updates(params, steps)
    count = state.count + 1
    pseudo = jax.tree.map(lambda w, f: (w - f).astype(w.dtype), state.slow,
                          fast)
    moved, outer_state = outer.update(pseudo, state.outer, state.slow)
    slow = optax.apply_updates(state.slow, moved)
    at = count % K == 0  # the K-th inner step: the outer step, a restart

    def pick(new, old):
      return jax.tree.map(lambda a, b: jnp.where(at, a, b), new, old)
    slow, outer_state = pick(slow, state.slow), pick(outer_state, state.outer)
    fast = pick(slow, fast)
    updates = jax.tree.map(lambda f, p: (f - p).astype(p.dtype), fast,
                           params)
    return updates, SnooState(inner_state, outer_state, slow, count)

  return optax.GradientTransformation(init, update)


def snoo(inner: optax.GradientTransformation | None = None,
         outer: optax.GradientTransformation | None = None,
         H: int = 30) -> _base.Strategy:
  """SNOO: data parallelism with an outer Nesterov step every H steps.

  The workers average their gradients every step (DDP's all-reduce, so
  they hold one model), the inner optimizer steps it, and every H steps
  the outer optimizer steps the slow weights with the inner steps'
  displacement, from which the inner steps restart (SNOO, arXiv
  2510.15830; the module's docstring). With W workers it trains as one
  model at batch W x b; with one worker it sends nothing. Against DiLoCo
  at the same H it separates the outer step's gain from the averaging's.

  Bytes per worker and step: DDP's (the gradients' all-reduce); the outer
  step sends nothing.

  Args:
    inner: the optimizer of the inner steps; default AdamW (lr 4e-4,
      weight decay 0.1), as DiLoCo's.
    outer: the optimizer of the slow weights, fed their displacement;
      default Nesterov SGD (lr 0.7, momentum 0.9), as DiLoCo's.
    H: inner steps per outer step (the paper's K, >= 1).

  Example:
    >>> strategy = lowbw.strategies.snoo(H=20)
  """
  inner = _base.optimizer("inner", inner, _base.default_inner)
  outer = _base.optimizer("outer", outer, default_outer)
  H = _validate.positive_int("H", H)
  plain = compression(None, None, None)

  def init(params, num_workers_, key):
    state = _base.inner_init(inner, params, num_workers_, key, ())
    return state._replace(comm=DiLoCoComm(params, outer.init(params), ()))

  def local(state, grads_W):
    state = _base.inner_update(inner, state, replace_with_mean(grads_W))
    return state, _base.events(gradients=1)

  def sync(state):
    c = state.comm
    # The workers hold one model (up to a fault's mask): their mean's
    # displacement, as DiLoCo's, with nothing sent.
    pseudo, _ = mean_pseudo_gradient(plain, c.global_params, state.params_W,
                                     (), None)
    moved, outer_state = outer.update(pseudo, c.outer_state, c.global_params)
    slow = optax.apply_updates(c.global_params, moved)
    return state._replace(
        params_W=broadcast_to_workers(slow, num_workers(state.params_W)),
        comm=DiLoCoComm(slow, outer_state, ())), _base.metrics(
            pseudo_grad_norm=optax.tree.norm(pseudo))

  def channels(params, num_workers_):
    gradients = comm_channel(plain, params, num_workers_)
    return {"gradients": gradients._replace(bucketed=True)}

  return _base.make(
      "snoo", H, _base.Parts(init, local, sync,
                             lambda state: state.comm.global_params,
                             channels),
      {"name": "snoo", "inner": _base.describe(inner),
       "outer": _base.describe(outer), "H": H},
      replicated=True, outer_places={"outer": "outer_state"}, inner=inner)


SPEC = _spec.spec(
    snoo, inner=_optim.DILOCO_INNER, outer=_optim.DILOCO_OUTER,
    paper="Kallusky et al. 2025, arXiv 2510.15830",
    where="the outer Nesterov step on the K-step pseudo-gradient, with "
          "DiLoCo's optimizers (arXiv 2311.08105, §3), over DDP's all-reduce",
    help={"H": "inner steps per outer step (the paper's K)"})
