"""Error feedback: what compression dropped is kept and sent later.

MuLoCo's Algorithm 1, lines 14-17 (arXiv 2505.23725), after Karimireddy et
al. (2019, arXiv 1901.09847): each worker keeps a residual E,

  E <- beta * E + delta      (accumulate the new update)
  c  = C(E)                  (compress the accumulator; c is sent)
  E <- E - decode(c)         (keep what did not get through)

With beta = 1 nothing is lost: everything sent plus the residual equals
everything fed in. MuLoCo's tuned values: beta = 0.9 (Muon inner), 0.7 (AdamW).
"""

from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax

from lowbw import _validate
from lowbw._types import Array, PRNGKey, PyTree
from lowbw.transforms._codec import (Codec, _base_key, current_worker,
                                     roundtrip)


def check_beta(beta, field: str = "error_feedback") -> float:
  """A feedback coefficient in [0, 1]; errors name ``field``."""
  return _validate.fraction(field, beta, low_open=False)


def feedback_step(codec: Codec, beta: float, residual: PyTree, delta: PyTree,
                  key: PRNGKey | None = None, worker=0
                  ) -> tuple[PyTree, PyTree]:
  """One worker's step: returns (decoded message, new residual)."""
  accumulated = jax.tree.map(lambda e, d: beta * e + d, residual, delta)
  sent = roundtrip(codec, accumulated, key, worker)
  return sent, jax.tree.map(jnp.subtract, accumulated, sent)


class ErrorFeedbackState(NamedTuple):
  """State of ``error_feedback``: the residual and an update counter."""
  residual: PyTree
  count: Array


def error_feedback(codec: Codec, beta: float = 0.9,
                   key: PRNGKey | None = None) -> optax.GradientTransformation:
  """Compression with error feedback as an optax transformation.

  ``update`` returns what the receivers decode; the residual lives in the
  state. Lift it with ``per_worker`` for worker-stacked trees. The codec's
  shared key for update t is ``fold_in(key, t)``.

  Args:
    codec: the lossy codec C.
    beta: decay of the residual, in [0, 1]; MuLoCo uses 0.9 with Muon.
    key: shared key for codecs that need one (random-k, stochastic rounding);
      defaults to ``jax.random.key(0)`` for those.

  Example:
    >>> tx = optax.chain(error_feedback(quantize(2), beta=0.9), optax.sgd(1.0))
  """
  beta = check_beta(beta, "beta")
  base = _base_key(codec, key)

  def init(params):
    return ErrorFeedbackState(jax.tree.map(jnp.zeros_like, params),
                              jnp.zeros((), jnp.int32))

  def update(updates, state, params=None):
    del params
    step_key = None if base is None else jax.random.fold_in(base, state.count)
    sent, residual = feedback_step(codec, beta, state.residual, updates,
                                   step_key, current_worker())
    return sent, ErrorFeedbackState(residual, state.count + 1)

  return optax.GradientTransformation(init, update)
