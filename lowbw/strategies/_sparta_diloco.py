"""SPARTA combined with DiLoCo (Beton et al., 2025)."""

import optax

from lowbw import _validate
from lowbw.strategies import _base
from lowbw.strategies._diloco import default_outer, diloco_channels, diloco_sync
from lowbw.strategies._sparta import check_sparta, sparta_channels, sparta_local


def sparta_diloco(
    inner: optax.GradientTransformation | None = None,
    outer: optax.GradientTransformation | None = None,
    H: int = 100,
    p: float = 0.005,
    selector: str = "random",
) -> _base.Strategy:
  """SPARTA's sparse averaging every step plus a DiLoCo outer step every H.

  The sparse averaging acts as a regulariser that keeps workers close between
  outer steps, which lets H grow (the SPARTA paper pairs it with H up to
  10,000). Defaults: p = 0.005, H = 100, DiLoCo's inner and outer optimizers.

  Bytes per worker: SPARTA's k values per tensor every step plus DiLoCo's full
  pseudo-gradient every H steps, each under a ring all-reduce.

  Args:
    inner: per-worker optimizer.
    outer: optimizer of the global parameters.
    H: inner steps per outer step.
    p: fraction of each tensor averaged per step, in (0, 1].
    selector: "random" | "shuffled" | "partitioned".
  """
  inner = _base.optimizer("inner", inner, _base.default_inner)
  outer = _base.optimizer("outer", outer, default_outer)
  H = _validate.positive_int("H", H)
  p, selector = check_sparta(p, selector)
  sparse_channels = sparta_channels(p)

  def init(params, num_workers_, key):
    return _base.inner_init(inner, params, num_workers_, key,
                            (params, outer.init(params)))

  def channels(params, num_workers_):
    return {**sparse_channels(params, num_workers_),
            **diloco_channels(params, num_workers_)}

  return _base.make(
      "sparta_diloco", H, init, sparta_local(inner, p, selector),
      diloco_sync(outer), lambda s: s.comm[0], channels,
      {"name": "sparta_diloco", "inner": _base.describe(inner),
       "outer": _base.describe(outer), "H": H, "p": p, "selector": selector})
