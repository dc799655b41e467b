"""SNOO: the Step-K Nesterov Outer Optimizer (*SNOO: Step-K Nesterov Outer
Optimizer - The Surprising Effectiveness of Nesterov Momentum Applied to
Pseudo-Gradients*, Kallusky et al., arXiv 2510.15830), as one optax
transformation.

One model, no communication: the inner optimizer takes K steps from the
slow weights w (the fast weights), their displacement s = w - w_K is a
pseudo-gradient, and the outer optimizer (Nesterov SGD, as DiLoCo's: lr
0.7, momentum 0.9) steps w with it; the fast weights restart from the new
w. It is DiLoCo with one worker, and the paper's argument is that most of
DiLoCo's gain over AdamW comes from this outer step alone: the control a
DiLoCo comparison needs (``shadow="snoo"``: a paired SNOO lane).
"""

from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax

from lowbw import _validate
from lowbw._types import Params, PyTree
from lowbw.strategies import _optim


class SnooState(NamedTuple):
  """The inner optimizer's state, the outer's, the slow weights and the
  inner steps taken."""

  inner: PyTree
  outer: PyTree
  slow: Params
  count: jax.Array


def snoo(inner: optax.GradientTransformation | None = None,
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
    >>> tx = lowbw.strategies.snoo(optax.adamw(1e-3), K=10)
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
