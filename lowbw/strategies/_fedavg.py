"""Federated averaging (McMahan et al., 2017, arXiv 1602.05629), with islands."""

import jax
import optax

from lowbw import _validate
from lowbw.network import ring_allreduce
from lowbw.strategies import _base
from lowbw.transforms import group_mean, num_workers, replace_with_mean


def fedavg(
    inner: optax.GradientTransformation | None = None,
    H: int = 100,
    island_size: int | None = None,
) -> _base.Strategy:
  """Parameters averaged every H inner steps.

  Workers train independently for H steps, then replace their parameters by the
  mean. With ``island_size`` s, each sync splits the workers into W/s random
  islands (drawn from a key shared by all workers, fresh every round) and
  averages only within each island, as in EXO Gym's FedAvg. Inner optimizer
  state is kept across syncs.

  Bytes per worker and sync: payload = the parameters (4 bytes x P in float32);
  wire = 2(s-1)/s x payload (ring all-reduce inside an island of s workers,
  s = W without islands).

  Args:
    inner: per-worker optimizer; default AdamW (lr 4e-4, weight decay 0.1).
    H: inner steps between syncs (>= 1).
    island_size: workers per island; must divide W. None averages all workers.

  Example:
    >>> strategy = lowbw.strategies.fedavg(optax.sgd(0.1), H=10, island_size=2)
  """
  inner = _base.optimizer("inner", inner, _base.default_inner)
  H = _validate.positive_int("H", H)
  island_size = _validate.optional_positive_int("island_size", island_size)

  def init(params, num_workers_, key):
    check_island_size(island_size, num_workers_)
    return _base.inner_init(inner, params, num_workers_, key, ())

  def local(state, grads_W):
    return _base.inner_update(inner, state, grads_W), {}

  def sync(state):
    w = num_workers(state.params_W)
    if island_size is None or island_size == w:
      params_W = replace_with_mean(state.params_W)
    else:
      round_key = jax.random.fold_in(state.key, state.step // H)
      perm = jax.random.permutation(round_key, w)
      params_W = group_mean(state.params_W, perm, island_size)
    return state._replace(params_W=params_W), _base.events(parameters=1)

  def channels(params, num_workers_):
    group = num_workers_ if island_size is None else island_size
    return {"parameters": ring_allreduce(_base.payload_bytes(params), group)}

  return _base.make(
      "fedavg", H, init, local, sync, _base.mean_of_workers, channels,
      {"name": "fedavg", "inner": _base.describe(inner), "H": H,
       "island_size": island_size})


def check_island_size(island_size, num_workers_):
  if island_size is not None and num_workers_ % island_size:
    raise _validate.fail("island_size", island_size,
                         f"must divide num_workers={num_workers_}")
