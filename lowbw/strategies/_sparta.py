"""SPARTA: sparse parameter averaging (Beton et al., 2025, ICLR workshop
MCDC, openreview stFPf3gzq1)."""

import jax
import jax.numpy as jnp
import optax

from lowbw import _validate
from lowbw.network import channel
from lowbw.strategies import _base, _optim, _spec
from lowbw.transforms import (Codec, as_codec, collective, roundtrip_workers,
                              sparse_average)
from lowbw.transforms._sparse import SELECTORS, sparse_payload_bytes


def sparta_local(inner, p: float, selector: str, codec: Codec | None = None,
                 interval: int = 1):
  """An inner step on every worker, then, every ``interval`` steps, the
  shared sparse averaging of the (optionally encoded) selected values."""
  def average(state):
    key = jax.random.fold_in(state.key, 0x5BA7)
    transform = None
    if codec is not None:
      codec_key = _base.comm_key(state)
      transform = lambda v_W, i: roundtrip_workers(  # noqa: E731
          codec, v_W, jax.random.fold_in(codec_key, i))
    # The selectors cycle over averagings, not steps ("shuffled" covers
    # each tensor once per 1/p averagings).
    params_W = sparse_average(key, state.step // interval, state.params_W, p,
                              selector, transform)
    return state._replace(params_W=params_W)

  def local(state, grads_W):
    state = _base.inner_update(inner, state, grads_W)
    if interval == 1:
      return average(state), _base.events(sparse_parameters=1)
    due = state.step % interval == 0
    state = jax.lax.cond(due, average, lambda s: s, state)
    return state, _base.events(sparse_parameters=due.astype(jnp.int32))

  return local


def sparta_channels(p: float, codec: Codec | None = None):
  def channels(params, num_workers_):
    return {"sparse_parameters": channel(
        collective(codec), sparse_payload_bytes(params, p, codec),
        num_workers_)}
  return channels


def check_sparta(p, selector, codec=None, field="codec", interval=1):
  """Validated ``(p, selector, codec, interval)``; ``codec`` may be a spec
  string."""
  return (_validate.fraction("p", p),
          _validate.one_of("selector", selector, SELECTORS),
          as_codec(field, codec),
          _validate.positive_int("sparta_interval", interval))


def sparta(
    inner: optax.GradientTransformation | None = None,
    p: float = 0.005,
    selector: str = "random",
    codec: Codec | str | None = None,
    sparta_interval: int = 1,
) -> _base.Strategy:
  """Every step, the same fraction p of each tensor is averaged across workers.

  After each worker's inner step, k = max(1, round(p * n)) entries of every
  n-entry tensor are replaced by their mean over workers. The indices come from
  a key shared by all workers (no bytes for them); see
  ``lowbw.transforms.sparse_average`` for the selectors. p = 1 averages every
  parameter every step (FedAvg with H = 1). Default p = 0.005 (0.5% of each
  tensor per step); the EXO Gym paper cites fractions as small as 0.05%.
  Inner AdamW.

  With a ``codec`` each worker encodes the k-vector of each tensor and the
  workers average what they decode (e.g. ``cast("bfloat16")`` halves the bytes).
  There is no error feedback: the selected entries change every step.

  ``sparta_interval`` = k averages every k steps instead (EXO Gym's
  ``sparta_interval``): k times fewer bytes, the workers drifting apart for
  k - 1 steps in between.

  Bytes per worker and step: payload = sum over tensors of k x 4 bytes
  (float32 values, no indices) or the codec's payload of each k-vector;
  wire = 2(W-1)/W x payload (ring all-reduce), or (W-1) x payload for codecs
  that must be all-gathered.

  Args:
    inner: per-worker optimizer; default AdamW (lr 4e-4, weight decay 0.1).
    p: fraction of each tensor averaged per step, in (0, 1].
    selector: "random" | "shuffled" | "partitioned".
    codec: a ``lowbw.transforms`` codec (or spec string) for the selected
      values, or None.
    sparta_interval: average every this many steps; default 1.

  Example:
    >>> strategy = lowbw.strategies.sparta(optax.adamw(1e-3), p=0.01)
  """
  inner = _base.optimizer("inner", inner, _base.default_inner)
  p, selector, codec, interval = check_sparta(p, selector, codec,
                                              interval=sparta_interval)

  def init(params, num_workers_, key):
    return _base.inner_init(inner, params, num_workers_, key, ())

  return _base.make(
      "sparta", 1, _base.Parts(
          init, sparta_local(inner, p, selector, codec, interval), None,
          _base.mean_of_workers, sparta_channels(p, codec)),
      {"name": "sparta", "inner": _base.describe(inner), "p": p,
       "selector": selector,
       "codec": None if codec is None else codec.name,
       # only when set: configurations (and checkpoints) from before it match
       **({"sparta_interval": interval} if interval != 1 else {})},
      inner=inner)


SPEC = _spec.spec(
    sparta, inner=_optim.DILOCO_INNER, outer=None,
    paper="Beton et al. 2025, ICLR 2025 workshop MCDC",
    help={"codec": "codec of the selected values"})
