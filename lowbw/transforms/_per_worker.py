"""Lifting one-worker optax transformations to the worker axis."""

import jax
import optax

from lowbw.transforms._codec import WORKER_AXIS


def per_worker(tx: optax.GradientTransformation) -> optax.GradientTransformation:
  """Applies ``tx`` independently to every worker's slice of axis 0.

  The result takes and returns worker-stacked trees (``updates_W``,
  ``params_W``) and keeps a worker-stacked state. Transforms that inspect
  ``ndim`` or global norms (muon, ``clip_by_global_norm``) then see one
  worker's tree, as they would on a real worker. The vmap axis is named ``"workers"``, so
  a transform can ask for its worker index (``jax.lax.axis_index``); lowbw's
  ``compress`` and ``error_feedback`` do, for per-worker rounding noise.

  Example:
    >>> inner_W = per_worker(optax.adamw(1e-3))
    >>> state_W = inner_W.init(params_W)
    >>> updates_W, state_W = inner_W.update(grads_W, state_W, params_W)
  """

  def init(params_W):
    return jax.vmap(tx.init, axis_name=WORKER_AXIS)(params_W)

  def update(updates_W, state_W, params_W=None):
    if params_W is None:
      return jax.vmap(lambda u, s: tx.update(u, s),
                      axis_name=WORKER_AXIS)(updates_W, state_W)
    return jax.vmap(tx.update, axis_name=WORKER_AXIS)(updates_W, state_W,
                                                  params_W)

  return optax.GradientTransformation(init, update)
