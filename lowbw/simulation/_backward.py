"""How one worker's gradient is computed: in micro-batches, and in which
precision.

* ``micro`` > 1 (``minibatch_size``): the worker's batch is split into
  ``micro`` equal micro-batches along its leading axis; a ``lax.scan``
  computes each one's loss and gradient and sums them, then divides by
  ``micro``. Only one micro-batch's activations exist at a time. For a loss
  that is a mean over examples this is the full batch's gradient, to float
  rounding (EXO Gym's gradient accumulation).
* ``autocast`` (bfloat16): the forward and backward passes run in that type
  (floating parameters and inputs are cast inside the differentiated
  function), while the parameters, their gradients and the optimizer state
  stay float32 ("master weights"). Unlike ``worker_dtype``, which *stores*
  the workers' state in bfloat16, nothing stored changes. In micro-batches
  the parameters are cast once per step, before the micro-batch scan: each
  micro-batch differentiates with respect to that cast copy, and its
  gradient is widened back to the parameters' type before it is summed, in
  float32. The cast's derivative is that same widening, so the gradients
  are those of casting inside every micro-batch, without a cast of every
  weight per micro-batch.
"""

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from lowbw.config._settings import AUTOCAST



class Backward(NamedTuple):
  """``micro``: micro-batches per worker batch; ``autocast``: the compute
  dtype of the forward/backward pass, or None for the stored one."""

  micro: int = 1
  autocast: Any = None

  def loss(self, model):
    """``model.loss`` computed in ``autocast``; loss and metrics float32."""
    if self.autocast is None:
      return model.loss
    low = self.autocast

    def loss(params, batch, key):
      out = model.loss(_cast(params, low), _cast(batch, low), key)
      return jax.tree.map(lambda x: x.astype(jnp.float32), out)

    return loss

  def accumulated(self, grad_fn, axis: int = 0, fold=None):
    """``grad_fn(params, batch, key) -> (loss, metrics, grads)`` over
    ``micro`` micro-batches of ``batch`` (split along ``axis`` of every
    leaf), averaged. ``fold(key, i)``: micro-batch i's key (default
    ``jax.random.fold_in``)."""
    micro = self.micro
    if micro == 1:
      return grad_fn
    fold = fold or jax.random.fold_in

    def split(x):
      size = x.shape[axis] // micro
      parts = x.reshape(x.shape[:axis] + (micro, size) + x.shape[axis + 1:])
      return jnp.moveaxis(parts, axis, 0)

    def fn(params, batch, key):
      parts = jax.tree.map(split, batch)
      one = self._on_cast(grad_fn, params)

      def body(total, i):
        part = jax.tree.map(lambda x: x[i], parts)
        out = one(part, fold(key, i))
        return jax.tree.map(jnp.add, total, out), None

      first = jax.tree.map(lambda x: x[0], parts)
      zeros = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype),
                           jax.eval_shape(one, first, key))
      total, _ = jax.lax.scan(body, zeros, jnp.arange(micro))
      return jax.tree.map(lambda x: x / micro, total)

    return fn

  def _on_cast(self, grad_fn, params):
    """``(batch, key) -> (loss, metrics, grads)`` of one micro-batch: with
    ``autocast``, ``grad_fn`` at ``params`` cast once (here, outside the
    scan), its gradients widened to each parameter's own type."""
    if self.autocast is None:
      return lambda batch, key: grad_fn(params, batch, key)
    low = _cast(params, self.autocast)

    def one(batch, key):
      *rest, grads = grad_fn(low, batch, key)
      return (*rest, jax.tree.map(lambda g, p: g.astype(p.dtype), grads,
                                  params))
    return one


def _cast(tree, dtype):
  return jax.tree.map(
      lambda x: x.astype(dtype) if jnp.issubdtype(x.dtype, jnp.floating)
      else x, tree)


def of(config) -> Backward:
  """How the workers of ``config`` (a ``RunConfig``) compute their
  gradients: its micro-batches and its ``autocast`` type."""
  return Backward(config.micro, AUTOCAST[config.autocast])
