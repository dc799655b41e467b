"""A strategy's message path, as an optax-style chain users can replace.

Every communication event runs three stages:

1. pre-process, per worker: ``message.update(x, state, key=..., worker=...)``
   turns the worker's tensor into what every receiver decodes (by default the
   codec's round trip, with error feedback when asked: ``error_feedback`` or
   ``compress`` from this package, the same transformations a notebook
   chains);
2. aggregate over workers: the strategy's mean (or, for DeMo, sign of sum) of
   the decoded tensors, over the active workers (``aggregate``: with
   ``aggregation="reduce_scatter"`` the mean is quantized a second time, as
   a quantized all-reduce sends it back);
3. post-process: the strategy's optimizer (DiLoCo's outer step, DDP's inner
   step) treats the aggregate as it would the raw mean.

``compression(codec, error_feedback)`` builds the common chain;
``compression(codec, message=tx)`` takes the user's own (an optax
transformation, chained with ``optax.chain``). The ``codec`` fixes the bytes
on the wire and the collective, so a custom chain must end in that codec's
round trip (``compress(codec)`` or ``error_feedback(codec, beta)``).
"""

from typing import NamedTuple

import jax
import optax

from lowbw import _validate
from lowbw._types import Array, PRNGKey, PyTree
from lowbw.network import Channel, channel
from lowbw.transforms._codec import (Codec, collective, compress,
                                     payload_nbytes, roundtrip)
from lowbw.transforms._codec_spec import as_codec
from lowbw.transforms import _error_feedback
from lowbw.transforms._error_feedback import check_beta
from lowbw.transforms._reductions import (num_workers, participants,
                                          where_workers, worker_ids,
                                          worker_mean)

# How compressed messages are combined: every worker all-gathers the others'
# payloads ((W-1) x payload each), or a quantized all-reduce: a
# reduce-scatter of the payloads' shards, each shard's mean encoded again and
# all-gathered (2(W-1)/W x payload each).
AGGREGATIONS = ("all_gather", "reduce_scatter")


class Compression(NamedTuple):
  """A strategy's message path.

  Attributes:
    codec: the wire format, or None to send float tensors as they are.
    beta: the error-feedback coefficient of the default chain, or None
      (None too for a custom ``message``).
    message: the per-worker pre-processing chain (an optax transformation
      whose ``update`` accepts ``key=`` and ``worker=``), or None to send
      tensors as they are.
  """

  codec: Codec | None
  beta: float | None
  message: optax.GradientTransformationExtraArgs | None = None
  custom: bool = False
  aggregation: str = "all_gather"
  robust: tuple = ("mean", 0.0)

  @property
  def config(self):
    out = {"codec": None if self.codec is None else self.codec.name,
           "error_feedback": self.beta}
    if self.custom:
      out["message"] = "custom chain"
    if self.aggregation != "all_gather":
      out["aggregation"] = self.aggregation
    if self.robust[0] != "mean":
      out["robust"] = self.robust[0] + (
          f":{self.robust[1]:g}" if self.robust[0] == "trimmed_mean" else "")
    return out


def compression(codec: Codec | str | None, error_feedback: float | None,
                message: optax.GradientTransformation | None = None,
                aggregation: str = "all_gather",
                robust: str = "mean") -> Compression:
  """Validates a strategy's ``codec=`` (a codec, a spec string or None),
  ``error_feedback=``, ``message=``, ``aggregation=`` and ``robust=``
  (``_robust.check_robust``) arguments into its message path.

  Example:
    >>> comp = compression("quant:4", None, message=optax.chain(
    ...     optax.clip_by_global_norm(1.0), error_feedback(quantize(4), 0.9)))
  """
  codec = as_codec("codec", codec)
  aggregation = _validate.one_of("aggregation", aggregation, AGGREGATIONS)
  if aggregation != "all_gather" and (codec is None or codec.summable):
    raise _validate.fail(
        "aggregation", aggregation, "is for payloads that cannot be summed "
        "(quantized, top-k); " + (
            "without a codec the tensors" if codec is None else
            f"codec {codec.name!r}'s payloads") +
        " are summed in a ring all-reduce already")
  comp = _message_path(codec, error_feedback, message)
  from lowbw.transforms._robust import check_robust
  robust = check_robust(robust)
  if robust[0] != "mean" and aggregation == "reduce_scatter":
    raise _validate.fail("aggregation", aggregation, f"robust={robust[0]!r} "
                         "combines every worker's own message, so they are "
                         "all-gathered, not reduced")
  return comp._replace(aggregation=aggregation, robust=robust)


def _message_path(codec, error_feedback, message) -> Compression:
  if error_feedback is not None:
    error_feedback = check_beta(error_feedback)
    if codec is None:
      raise _validate.fail("error_feedback", error_feedback,
                           "needs a codec: without compression there is "
                           "nothing to feed back")
  if message is not None:
    return _custom(codec, error_feedback, message)
  if codec is None:
    return Compression(None, None, None)
  if error_feedback is None:
    return Compression(codec, None, compress(codec))
  return Compression(codec, error_feedback,
                     _error_feedback.error_feedback(codec, error_feedback))


def _custom(codec, beta, message) -> Compression:
  if not isinstance(message, optax.GradientTransformation):
    raise _validate.fail("message", message, "expected an optax "
                         "transformation, e.g. optax.chain(..., lowbw."
                         "transforms.error_feedback(codec, 0.9))")
  if codec is None:
    raise _validate.fail("message", "custom", "needs codec=, the wire format "
                         "the chain ends in (it fixes the bytes)")
  if beta is not None:
    raise _validate.fail("error_feedback", beta, "put error_feedback(codec, "
                         "beta) in your message chain instead")
  return Compression(codec, None, optax.with_extra_args_support(message),
                     custom=True)


def init_residual(comp: Compression, tree_W: PyTree) -> PyTree:
  """Every worker's message state (error-feedback residuals, counters)
  shaped like ``tree_W``; ``()`` when tensors are sent as they are."""
  if comp.message is None:
    return ()
  return jax.vmap(comp.message.init)(tree_W)


def transmit(comp: Compression, x_W: PyTree, state_W: PyTree,
             key: PRNGKey, active_W: Array | None = None,
             senders_W: Array | None = None) -> tuple[PyTree, PyTree]:
  """Every worker's decoded message and new message state.

  ``key`` is shared by all workers; worker w's index is passed to the chain
  for private noise (``senders_W``: the index each worker encodes as
  instead, e.g. its region's, when several workers send one message). Only
  the participating workers' states change (the others sent nothing this
  time): ``active_W``, else the engine's ``participating`` mask, else all.
  """
  active_W = participants() if active_W is None else active_W
  if comp.message is None:
    return x_W, state_W
  if senders_W is None:
    senders_W = worker_ids(num_workers(x_W))
  sent_W, new_W = jax.vmap(
      lambda x, s, w: comp.message.update(x, s, None, key=key, worker=w))(
          x_W, state_W, senders_W)
  if active_W is not None:
    new_W = where_workers(active_W, new_W, state_W)
  return sent_W, new_W


def roundtrip_workers(codec: Codec | None, x_W: PyTree,
                      key: PRNGKey) -> PyTree:
  """Every worker's tensor through ``codec`` with no state (SPARTA's
  selected values, FedAvg's parameters): what the receivers decode."""
  if codec is None:
    return x_W
  workers = worker_ids(num_workers(x_W))
  return jax.vmap(lambda x, w: roundtrip(codec, x, key, w))(x_W, workers)


def aggregate(comp: Compression, sent_W: PyTree, key: PRNGKey,
              active_W: Array | None = None) -> PyTree:
  """The mean of the workers' decoded messages (over ``active_W`` or the
  participants); under ``reduce_scatter`` encoded and decoded once more,
  what a quantized all-reduce hands back. The second encoding quantizes the
  whole mean tensor with the codec's own groups (a real reduce-scatter
  quantizes each worker's 1/W shard with its own scales), as the MuLoCo
  authors' code simulates the quantization after the reduce."""
  mean = worker_mean(sent_W, active_W)
  if comp.aggregation != "reduce_scatter":
    return mean
  return roundtrip(comp.codec, mean, jax.random.fold_in(key, 0x2ED))


def message_bytes(comp: Compression, tree: PyTree) -> int:
  """Exact payload bytes of one worker's message for ``tree``."""
  return payload_nbytes(comp.codec, tree)


def comm_channel(comp: Compression, tree: PyTree, group_size: int,
                 tier: str | None = None, shards: int = 1) -> Channel:
  """The channel of one message of ``tree`` under ``comp``: payload bytes and
  the collective the codec implies (all-reduce or all-gather); ``tier`` and
  ``shards`` as in ``Channel``."""
  kind = ("ring_allreduce" if comp.aggregation == "reduce_scatter"
          else collective(comp.codec))
  if comp.robust[0] != "mean":  # a median needs every worker's message
    kind = "all_gather"
  return channel(kind, message_bytes(comp, tree), group_size, tier, shards)
