"""A strategy's communication pipeline: codec plus optional error feedback,
applied to every worker's tensor at once.

Strategies hold a ``Compression`` built (and validated) in their factory. At a
communication event each worker's tensor goes through the codec (after adding
its residual when error feedback is on); every receiver reconstructs the
decoded tensors, so the strategy then reduces ``decoded_W`` exactly as it would
the raw tensors.
"""

from typing import NamedTuple

import jax
import jax.numpy as jnp

from lowbw import _validate
from lowbw._types import Array, PRNGKey, PyTree
from lowbw.network import Channel, channel
from lowbw.transforms._codec import (Codec, collective,
                                     payload_nbytes, roundtrip)
from lowbw.transforms._codec_spec import as_codec
from lowbw.transforms._error_feedback import check_beta, feedback_step
from lowbw.transforms._reductions import num_workers, worker_ids


class Compression(NamedTuple):
  """What a strategy does to a tensor before it leaves a worker.

  Attributes:
    codec: the codec, or None to send float tensors as they are.
    beta: error-feedback coefficient, or None for no residual.
  """

  codec: Codec | None
  beta: float | None

  @property
  def config(self):
    return {"codec": None if self.codec is None else self.codec.name,
            "error_feedback": self.beta}


def compression(codec: Codec | str | None, error_feedback: float | None
                ) -> Compression:
  """Validates a strategy's ``codec=`` (a codec, a spec string or None) and
  ``error_feedback=`` arguments."""
  codec = as_codec("codec", codec)
  if error_feedback is not None:
    error_feedback = check_beta(error_feedback)
    if codec is None:
      raise _validate.fail("error_feedback", error_feedback,
                           "needs a codec: without compression there is "
                           "nothing to feed back")
  return Compression(codec, error_feedback)


def init_residual(comp: Compression, tree_W: PyTree) -> PyTree:
  """Zero residuals shaped like ``tree_W``, or ``()`` without feedback."""
  if comp.beta is None:
    return ()
  return jax.tree.map(jnp.zeros_like, tree_W)


def transmit(comp: Compression, x_W: PyTree, residual_W: PyTree,
             key: PRNGKey, active_W: Array | None = None
             ) -> tuple[PyTree, PyTree]:
  """Every worker's decoded message and new residual.

  ``key`` is shared by all workers; worker w folds in w for private noise.
  With ``active_W``, only active workers' residuals change (the others sent
  nothing this time).
  """
  if comp.codec is None:
    return x_W, residual_W
  workers = worker_ids(num_workers(x_W))
  if comp.beta is None:
    return jax.vmap(lambda x, w: roundtrip(comp.codec, x, key, w))(
        x_W, workers), residual_W
  sent_W, new_W = jax.vmap(
      lambda e, x, w: feedback_step(comp.codec, comp.beta, e, x, key, w))(
          residual_W, x_W, workers)
  if active_W is not None:
    new_W = jax.tree.map(
        lambda n, o: jnp.where(
            active_W.reshape((-1,) + (1,) * (n.ndim - 1)), n, o),
        new_W, residual_W)
  return sent_W, new_W


def message_bytes(comp: Compression, tree: PyTree) -> int:
  """Exact payload bytes of one worker's message for ``tree``."""
  return payload_nbytes(comp.codec, tree)


def comm_channel(comp: Compression, tree: PyTree, group_size: int) -> Channel:
  """The channel of one message of ``tree`` under ``comp``: payload bytes and
  the collective the codec implies (all-reduce or all-gather)."""
  return channel(collective(comp.codec), message_bytes(comp, tree), group_size)
