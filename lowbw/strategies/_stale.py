"""Staleness-aware outer transforms: an outer step that knows how old its
pseudo-gradient is.

An asynchronous server (``async_diloco``) applies a pseudo-gradient computed
from a model several outer steps old; its *age* tau is the number of outer
steps applied since the worker pulled. The transforms here take that age as
an extra argument of ``update`` (``age=``), as ``delayed_nesterov`` takes
``arrivals=``, and compose with optax like any other.
"""

import math

import jax
import jax.numpy as jnp
import optax

from lowbw import _validate
from lowbw._types import Array
from lowbw.strategies import _optim


def cgad_scale(age, alpha: float, cutoff: float) -> Array:
  """CGAD's age gate sigma(tau) = gamma(tau) x exp(-alpha x tau).

  gamma is the cosine gate 0.5 x (1 + cos(pi x tau / cutoff)) for tau below
  ``cutoff`` and 0 from it on: it goes from 1 at tau = 0 smoothly to 0 at
  the cutoff (``cutoff`` 0: no gate, gamma = 1, the paper's Adam-Decay).
  sigma(0) = 1 for every alpha and cutoff; alpha = 0 and no cutoff give
  sigma = 1 at every age.
  """
  age = jnp.asarray(age, jnp.float32)
  decay = jnp.exp(-alpha * age)
  if not cutoff:
    return decay
  gate = 0.5 * (1.0 + jnp.cos(math.pi * jnp.minimum(age, cutoff) / cutoff))
  return jnp.where(age < cutoff, gate, 0.0) * decay


def _check(alpha, cutoff) -> tuple[float, float]:
  alpha = _validate.non_negative("alpha", alpha)
  cutoff = _validate.non_negative("cutoff", cutoff)
  return alpha, cutoff


def scale_by_age(alpha: float, cutoff: float
                 ) -> optax.GradientTransformationExtraArgs:
  """Scales the update by CGAD's gate sigma(age) (``cgad_scale``).

  ``update(updates, state, params, age=tau)``: ``age`` is one number for
  the whole update, or a tree that is a prefix of the updates' (one age per
  fragment or tensor: the paper's per-fragment form, PA-CGAD, for a server
  whose fragments were synchronised at different outer steps). Without
  ``age`` the update is taken as fresh (tau = 0, sigma = 1). Stateless.

  Args:
    alpha: the exponential's rate, >= 0.
    cutoff: the age at which the cosine gate reaches 0, >= 0 (0: no gate).
  """
  alpha, cutoff = _check(alpha, cutoff)

  def update(updates, state, params=None, *, age=0.0, **extra):
    del params, extra
    scaled = jax.tree.map(
        lambda tau, sub: jax.tree.map(lambda u: u * cgad_scale(
            tau, alpha, cutoff).astype(u.dtype), sub), age, updates)
    return scaled, state

  return optax.GradientTransformationExtraArgs(
      lambda params: optax.EmptyState(), update)


def cgad(alpha: float, cutoff: float,
         learning_rate: float = 1e-2, *, b1: float = 0.9, b2: float = 0.99,
         eps: float = 1e-3) -> optax.GradientTransformationExtraArgs:
  """Cosine-Gated Adam-Decay (CGAD): Adam on the age-gated pseudo-gradient.

  Shah and Sun 2026, "Cosine-Gated Adam-Decay: Drop-In Staleness-Aware
  Outer Optimization for Decoupled DiLoCo" (arXiv 2605.09126): each
  pseudo-gradient is scaled by sigma(tau) = gamma(tau) exp(-alpha tau)
  (``cgad_scale``) before it enters Adam's first- and second-moment
  buffers; at tau = 0 it is plain Adam. Here it is ``scale_by_age``
  chained before lowbw's outer Adam (``outer_optimizer(kind="adam")``,
  whose learning rate and betas are state leaves, swept as ``outer_lr``,
  ``outer_b1``, ...). ``async_diloco`` passes each outer step's age.

  The paper says its two hyperparameters' defaults transfer across scales;
  their values are not in the abstract we could read, so ``alpha`` and
  ``cutoff`` have no default here. The Adam defaults are FedAdam's server
  optimizer (arXiv 2003.00295: lr 1e-2, b1 0.9, b2 0.99, eps 1e-3), lowbw's
  outer Adam elsewhere, not the paper's.

  Args:
    alpha: the exponential's rate (information decay per outer step).
    cutoff: the age at which the cosine gate reaches 0 (0: no gate, the
      paper's Adam-Decay baseline).
    learning_rate, b1, b2, eps: the outer Adam's.

  Example:
    >>> outer = lowbw.strategies.cgad(alpha=0.1, cutoff=8.0)
    >>> strategy = lowbw.strategies.async_diloco(H=20, outer=outer)
  """
  alpha, cutoff = _check(alpha, cutoff)
  adam = _optim.outer_optimizer(learning_rate, kind="adam", b1=b1, b2=b2,
                                eps=eps)
  return optax.chain(scale_by_age(alpha, cutoff), adam)

