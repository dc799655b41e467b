"""SPARTA combined with DiLoCo (Beton et al., 2025)."""

import optax

from lowbw import _validate
from lowbw.strategies import _base, _optim, _spec
from lowbw.strategies._diloco import (default_outer, diloco_channels,
                                      diloco_init, diloco_sync, global_of)
from lowbw.strategies._sparta import (check_sparta, sparta_channels,
                                      sparta_local)
from lowbw.transforms import Codec, compression


def sparta_diloco(
    inner: optax.GradientTransformation | None = None,
    outer: optax.GradientTransformation | None = None,
    H: int = 100,
    p: float = 0.005,
    selector: str = "random",
    codec: Codec | str | None = None,
    error_feedback: float | None = None,
    sparse_codec: Codec | str | None = None,
    message: optax.GradientTransformation | None = None,
    sparta_interval: int = 1,
) -> _base.Strategy:
  """SPARTA's sparse averaging every step plus a DiLoCo outer step every H.

  The sparse averaging acts as a regulariser that keeps workers close between
  outer steps, which lets H grow (the SPARTA paper pairs it with H up to
  10,000). Defaults: p = 0.005, H = 100, DiLoCo's inner and outer optimizers.

  Bytes per worker: SPARTA's k values per tensor every step plus DiLoCo's full
  pseudo-gradient every H steps, each under a ring all-reduce (or an
  all-gather for codecs whose payloads cannot be summed).

  Args:
    inner: per-worker optimizer.
    outer: optimizer of the global parameters.
    H: inner steps per outer step.
    p: fraction of each tensor averaged per step, in (0, 1].
    selector: "random" | "shuffled" | "partitioned".
    codec: codec of DiLoCo's pseudo-gradients, or None.
    error_feedback: residual decay beta for the pseudo-gradients, or None.
    sparse_codec: codec of SPARTA's selected values, or None.
    message: the per-worker message chain replacing codec's default one (an
      optax transformation ending in ``codec``'s round trip; see
      docs/codecs/custom.md), or None.
    sparta_interval: average the sparse subset every this many steps
      (EXO Gym's ``sparta_interval``); default 1, every step.
  """
  inner = _base.optimizer("inner", inner, _base.default_inner)
  outer = _base.optimizer("outer", outer, default_outer)
  H = _validate.positive_int("H", H)
  p, selector, sparse_codec, interval = check_sparta(
      p, selector, sparse_codec, "sparse_codec", sparta_interval)
  comp = compression(codec, error_feedback, message)
  sparse_channels = sparta_channels(p, sparse_codec)
  outer_channels = diloco_channels(comp)

  def channels(params, num_workers_):
    return {**sparse_channels(params, num_workers_),
            **outer_channels(params, num_workers_)}

  return _base.make(
      "sparta_diloco", H, _base.Parts(
          diloco_init(inner, outer, comp),
          sparta_local(inner, p, selector, sparse_codec, interval),
          diloco_sync(outer, comp), global_of, channels),
      {"name": "sparta_diloco", "inner": _base.describe(inner),
       "outer": _base.describe(outer), "H": H, "p": p, "selector": selector,
       **({"sparta_interval": interval} if interval != 1 else {}),
       **comp.config,
       "sparse_codec": None if sparse_codec is None else sparse_codec.name},
      outer_places={"outer": "outer_state"},
      inner=inner)


SPEC = _spec.spec(
    sparta_diloco, inner=_optim.DILOCO_INNER, outer=_optim.DILOCO_OUTER,
    paper="Beton et al. 2025 + Douillard et al. 2023",
    help={"codec": "codec of DiLoCo's pseudo-gradients",
          "sparse_codec": "codec of SPARTA's selected values"})
