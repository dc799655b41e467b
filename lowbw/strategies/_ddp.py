"""Distributed data parallel: gradients averaged over all workers every step."""

import optax

from lowbw.strategies import _base, _optim, _spec
from lowbw.transforms import (Codec, comm_channel, compression,
                              replace_with_mean, transmit)
from lowbw.transforms._compression import init_residual


def ddp(inner: optax.GradientTransformation | None = None,
        codec: Codec | str | None = None,
        error_feedback: float | None = None,
        message: optax.GradientTransformation | None = None) -> _base.Strategy:
  """Synchronous data parallelism (an all-reduce of gradients every step).

  Every worker computes gradients on its own batch; their mean is applied by
  every worker's inner optimizer, so all workers stay identical. With W workers
  of batch b this equals one model trained with batch W*b, and that is how
  the engine runs it when nothing needs the workers apart (no codec, no
  fault or straggler mask, one device): one replica of the parameters and
  optimizer state, and the gradient of the mean loss over the W*b examples
  computed directly (``Strategy.replicated``).

  With a ``codec`` each worker sends its encoded gradients (plus its residual
  when ``error_feedback`` is set) and every worker applies the mean of the
  decoded gradients.

  Bytes per worker and step: payload = the gradients (4 bytes x P in float32,
  or the codec's payload); wire = 2(W-1)/W x payload (ring all-reduce), or
  (W-1) x payload when the codec's payloads must be all-gathered.

  Args:
    inner: the optimizer each worker applies; default AdamW (lr 4e-4, weight
      decay 0.1).
    codec: a ``lowbw.transforms`` codec (or spec string) for the gradients,
      or None.
    error_feedback: residual decay beta in [0, 1] (needs a codec), or None.
    message: the per-worker message chain replacing codec's default one (an
      optax transformation ending in ``codec``'s round trip; see
      docs/codecs/custom.md), or None.

  Example:
    >>> strategy = lowbw.strategies.ddp(optax.sgd(0.1))
  """
  inner = _base.optimizer("inner", inner, _base.default_inner)
  comp = compression(codec, error_feedback, message)

  def init(params, num_workers, key):
    state = _base.inner_init(inner, params, num_workers, key, ())
    return state._replace(comm=init_residual(comp, state.params_W))

  def local(state, grads_W):
    sent_W, residual_W = transmit(comp, grads_W, state.comm,
                                  _base.comm_key(state))
    state = _base.inner_update(inner, state._replace(comm=residual_W),
                               replace_with_mean(sent_W))
    return state, _base.events(gradients=1)

  def channels(params, num_workers):
    # A gradient all-reduce in buckets during the backward pass (PyTorch
    # DDP's reducer): the network profile says how a real cluster times it.
    gradients = comm_channel(comp, params, num_workers)
    return {"gradients": gradients._replace(
        bucketed=gradients.collective == "ring_allreduce")}

  return _base.make("ddp", 1, _base.Parts(init, local, None,
                                          _base.mean_of_workers, channels),
                    {"name": "ddp", "inner": _base.describe(inner),
                     **comp.config},
                    replicated=comp.codec is None and comp.message is None,
                    inner=inner)


SPEC = _spec.spec(
    ddp, inner=_optim.DILOCO_INNER, outer=None,
    paper="Li et al. 2020, arXiv 2006.15704",
    where="the gradient all-reduce of §3; the inner AdamW is DiLoCo's (arXiv 2311.08105, §3)",
    help={"codec": "codec of the gradients"})
