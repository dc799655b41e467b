"""Federated averaging (McMahan et al., 2017, arXiv 1602.05629), with islands
and compressed messages."""

from typing import NamedTuple

import jax
import optax

from lowbw import _validate
from lowbw.strategies import _base, _optim, _spec
from lowbw.transforms import (Codec, Compression, broadcast_to_workers,
                              comm_channel, compression, group_mean,
                              num_workers, replace_with_mean, roundtrip_workers,
                              transmit, worker_mean)
from lowbw.transforms._compression import init_residual
from lowbw.transforms._reductions import total_workers

PAYLOADS = ("deltas", "parameters")


class _FedAvg(NamedTuple):
  """FedAvg's validated settings, which its pieces share."""

  inner: optax.GradientTransformation
  comp: Compression
  H: int
  island_size: int | None
  send_deltas: bool  # a codec encodes the changes since the last average


def _check_payload(compress: str, comp: Compression, message,
                   error_feedback) -> None:
  """Parameters go through the codec alone: no message chain, no error
  feedback."""
  if message is not None and compress == "parameters":
    raise _validate.fail("message", "custom", "needs compress='deltas' (the "
                         "parameters are sent through the codec alone)")
  if comp.beta is not None and compress == "parameters":
    raise _validate.fail("error_feedback", error_feedback,
                         "needs compress='deltas' (a residual of parameters "
                         "has no meaning)")


def _init(t: _FedAvg):
  def init(params, num_workers_, key):
    check_island_size(t.island_size, num_workers_)
    if t.send_deltas and t.island_size not in (None, num_workers_):
      raise _validate.fail(
          "island_size", t.island_size,
          "compressed deltas need all workers in one group (island_size=None);"
          " use compress='parameters' with islands")
    state = _base.inner_init(t.inner, params, num_workers_, key, ())
    base = params if t.send_deltas else ()
    message_W = init_residual(t.comp, state.params_W) if t.send_deltas else ()
    return state._replace(comm=(base, message_W))

  return init


def _average_parameters(t: _FedAvg, state, key):
  """The workers' decoded parameters averaged over all of them, or within
  this round's random islands."""
  sent_W = roundtrip_workers(t.comp.codec, state.params_W, key)
  if t.island_size is None or t.island_size == total_workers(sent_W):
    return replace_with_mean(sent_W)
  round_key = jax.random.fold_in(state.key, state.step // t.H)
  perm = jax.random.permutation(round_key, total_workers(state.params_W))
  return group_mean(sent_W, perm, t.island_size)


def _sync(t: _FedAvg):
  def sync(state):
    w = num_workers(state.params_W)
    base, residual_W = state.comm
    key = _base.comm_key(state)
    if t.send_deltas:
      delta_W = optax.tree.sub(state.params_W, broadcast_to_workers(base, w))
      sent_W, residual_W = transmit(t.comp, delta_W, residual_W, key)
      base = optax.apply_updates(base, worker_mean(sent_W))
      params_W = broadcast_to_workers(base, w)
    else:
      params_W = _average_parameters(t, state, key)
    return (state._replace(params_W=params_W, comm=(base, residual_W)),
            _base.events(parameters=1))

  return sync


def _channels(t: _FedAvg):
  def channels(params, num_workers_):
    group = num_workers_ if t.island_size is None else t.island_size
    return {"parameters": comm_channel(t.comp, params, group)}

  return channels


def fedavg(
    inner: optax.GradientTransformation | None = None,
    H: int = 100,
    island_size: int | None = None,
    codec: Codec | str | None = None,
    error_feedback: float | None = None,
    compress: str = "deltas",
    message: optax.GradientTransformation | None = None,
) -> _base.Strategy:
  """Parameters averaged every H inner steps.

  Workers train independently for H steps, then replace their parameters by the
  mean. With ``island_size`` s, each sync splits the workers into W/s random
  islands (drawn from a key shared by all workers, fresh every round) and
  averages only within each island, as in EXO Gym's FedAvg. Inner optimizer
  state is kept across syncs.

  With a ``codec``, ``compress`` says what is encoded:

  * ``"deltas"`` (default): each worker sends theta_w - theta, its change since
    the last average; everyone applies the mean decoded change to theta (DiLoCo
    with outer SGD at lr 1 encodes theta - theta_w instead, which is the same
    for codecs that commute with negation, such as top-k and casts). ``error_feedback`` may be added. Needs
    every worker in one group (no islands), since a receiver must know the
    sender's starting point.
  * ``"parameters"``: each worker sends its encoded parameters and the islands
    average what they decode. No error feedback (a residual of parameters has
    no meaning).

  Bytes per worker and sync: payload = the parameters (4 bytes x P in float32)
  or the codec's payload; wire = 2(s-1)/s x payload (ring all-reduce inside an
  island of s workers, s = W without islands), or (s-1) x payload for codecs
  that must be all-gathered.

  Args:
    inner: per-worker optimizer; default AdamW (lr 4e-4, weight decay 0.1).
    H: inner steps between syncs (>= 1).
    island_size: workers per island; must divide W. None averages all workers.
    codec: a ``lowbw.transforms`` codec (or spec string), or None.
    error_feedback: residual decay beta in [0, 1] (deltas only), or None.
    compress: "deltas" or "parameters"; what the codec encodes.
    message: the per-worker message chain replacing codec's default one (an
      optax transformation ending in ``codec``'s round trip; see
      docs/codecs/custom.md), or None.

  Example:
    >>> strategy = lowbw.strategies.fedavg(optax.sgd(0.1), H=10, island_size=2)
  """
  inner = _base.optimizer("inner", inner, _base.default_inner)
  H = _validate.positive_int("H", H)
  island_size = _validate.optional_positive_int("island_size", island_size)
  compress = _validate.one_of("compress", compress, PAYLOADS)
  comp = compression(codec, error_feedback, message)
  _check_payload(compress, comp, message, error_feedback)
  t = _FedAvg(inner, comp, H, island_size,
              comp.codec is not None and compress == "deltas")
  return _base.make(
      "fedavg", H, _base.Parts(
          _init(t), lambda state, grads_W: (
              _base.inner_update(inner, state, grads_W), {}),
          _sync(t), _base.mean_of_workers, _channels(t)),
      {"name": "fedavg", "inner": _base.describe(inner), "H": H,
       "island_size": island_size, **comp.config,
       "compress": compress if comp.codec is not None else None},
      inner=inner, clients=True)


def check_island_size(island_size, num_workers_):
  if island_size is not None and num_workers_ % island_size:
    raise _validate.fail("island_size", island_size,
                         f"must divide workers={num_workers_}")


SPEC = _spec.spec(
    fedavg, inner=_optim.DILOCO_INNER, outer=None,
    paper="McMahan et al. 2017, arXiv 1602.05629",
    help={"island_size": "workers per island, averaged together (must "
                         "divide W; none: all workers)",
          "codec": "codec of the deltas or parameters (see compress)",
          "compress": "what the codec encodes (error feedback needs "
                      "deltas)"},
    choices={"compress": PAYLOADS})
