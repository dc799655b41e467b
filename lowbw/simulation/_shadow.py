"""The paired DDP lane (``shadow="ddp"``): one DDP replica trained in the same
compiled program as the run, on the union of the workers' batches.

At every step the lane draws the batch each worker draws (the same data key,
step and worker indices), with the same loss keys, computes the gradient of
the mean loss over all of them (``_grouping.replica_grads``: one replica at
batch W*b) and applies its optimizer. It starts from the run's initial
parameters. That is exactly a DDP run with the same seed, workers and batch
size, so each evaluation compares the run with DDP at equal tokens and equal
data, paired by seed: ``shadow_eval_loss`` and ``shadow_gap`` (the run's
``eval_loss`` over it, minus 1).

It costs one more model's compute at batch W*b per step, and one model's
parameters and optimizer state (kept in float32 whatever ``worker_dtype``).
It sees no faults, stragglers or codecs: it is the ideal DDP the run is
measured against.
"""

from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax

from lowbw._types import Array, Params, PyTree
from lowbw.simulation._backward import Backward
from lowbw.simulation._grouping import after_backward, replica_grads
from lowbw.transforms._reductions import device_mean



class ShadowState(NamedTuple):
  """The DDP lane's replica: its parameters and optimizer state (its step
  is the run's, ``StrategyState.step``)."""

  params: Params
  inner: PyTree


def init(inner: optax.GradientTransformation, params: Params) -> ShadowState:
  """The lane at step 0 from the run's initial ``params``, copied: the
  strategy's state may hold the same arrays, and the chunk program donates
  both."""
  params = jax.tree.map(jnp.copy, params)
  return ShadowState(params, inner.init(params))


def lane(model, inner: optax.GradientTransformation,
         backward: Backward = Backward()):
  """``run(shadow, sample, keys_at, start, length) -> shadow``: the DDP
  steps ``start`` .. ``start + length - 1``.

  ``sample(step)`` draws this device's workers' batches of that step and
  ``keys_at(step)`` their loss keys, as the workers' own steps do; sharded,
  each device computes the gradient over its own workers and the devices
  average them (``device_mean``).
  """
  grads_of = replica_grads(model, backward)

  def step(st: ShadowState, at: Array, sample, keys_at) -> ShadowState:
    _, _, grads = grads_of(st.params, sample(at), keys_at(at))
    grads = after_backward(device_mean(grads))
    updates, inner_state = inner.update(grads, st.inner, st.params)
    return ShadowState(optax.apply_updates(st.params, updates), inner_state)

  def run(shadow: ShadowState, sample, keys_at, start: Array,
          length: int) -> ShadowState:
    steps = start + jnp.arange(length, dtype=jnp.asarray(start).dtype)
    return jax.lax.scan(lambda st, at: (step(st, at, sample, keys_at), None),
                        shadow, steps)[0]

  return run
