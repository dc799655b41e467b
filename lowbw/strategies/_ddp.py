"""Distributed data parallel: gradients averaged over all workers every step."""

import optax

from lowbw.network import ring_allreduce
from lowbw.strategies import _base
from lowbw.transforms import replace_with_mean


def ddp(inner: optax.GradientTransformation | None = None) -> _base.Strategy:
  """Synchronous data parallelism (an all-reduce of gradients every step).

  Every worker computes gradients on its own batch; their mean is applied by
  every worker's inner optimizer, so all workers stay identical. With W workers
  of batch b this equals one model trained with batch W*b.

  Bytes per worker and step: payload = the gradients (4 bytes x P in float32);
  wire = 2(W-1)/W x payload (ring all-reduce).

  Args:
    inner: the optimizer each worker applies; default AdamW (lr 4e-4, weight
      decay 0.1).

  Example:
    >>> strategy = lowbw.strategies.ddp(optax.sgd(0.1))
  """
  inner = _base.optimizer("inner", inner, _base.default_inner)

  def init(params, num_workers, key):
    return _base.inner_init(inner, params, num_workers, key, ())

  def local(state, grads_W):
    state = _base.inner_update(inner, state, replace_with_mean(grads_W))
    return state, _base.events(gradients=1)

  def channels(params, num_workers):
    return {"gradients": ring_allreduce(_base.payload_bytes(params), num_workers)}

  return _base.make("ddp", 1, init, local, None, _base.mean_of_workers,
                    channels, {"name": "ddp", "inner": _base.describe(inner)})

