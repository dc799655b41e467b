"""A study's points: a grid over any ``Config`` field, expanded, checked and
grouped by the program they compile to."""

import itertools
import json
from typing import Any, NamedTuple

from lowbw import _validate
from lowbw import strategies as strategies_lib
from lowbw.config import Config
from lowbw.config._checks import has_masks
from lowbw.simulation._periods import HOST_SETTINGS
from lowbw.config._config import FIELDS, canonical, check_value, natural
from lowbw.config._fields import RUN, TRACED
from lowbw.config._strategy_fields import TRACED as strategy_traced
from lowbw.simulation import _bits, _density


class Point(NamedTuple):
  """One run of a study.

  Attributes:
    index: its place in the study (its folder ``points/NNNN``).
    values: the grid's values for it, e.g. ``{"H": 50, "codec": "quant:4"}``.
    seed: its seed.
    config: the whole run's ``Config`` (the base with the values and seed).
  """

  index: int
  values: dict[str, Any]
  seed: int
  config: Config


def check_grid(grid) -> list[dict[str, list]]:
  """``grid`` as a list of sub-grids (a dict is one), names canonical and
  each value a non-empty list."""
  subgrids = grid if isinstance(grid, (list, tuple)) else [grid]
  if not subgrids:
    raise _validate.fail("grid", grid, "expected a dict of name -> values "
                         "or a list of such dicts")
  out = []
  for sub in subgrids:
    if not isinstance(sub, dict):
      raise _validate.fail("grid", sub, "expected a dict of name -> list "
                           "of values")
    clean = {}
    for name, values in sub.items():
      try:
        key = canonical(name)
      except _validate.ConfigError as e:  # a grid's key, not a config's
        raise _validate.fail("grid", name, e.allowed) from None
      _check_sweepable(name, key)
      clean[key] = _values(key, values)
    out.append(clean)
  return out


def _check_sweepable(name: str, key: str) -> None:
  """Seeds and the run's own settings (where and how a point logs) are not
  grid fields."""
  if key == "seed":
    raise _validate.fail("grid", name, "seeds are not a grid field: give "
                         "them as seeds=[...] (lowbw sweep --seeds); every "
                         "point runs with each")
  if FIELDS[key].kind == RUN:
    raise _validate.fail("grid", name, "a setting of how the study runs "
                         "and logs, not of a point: give it once, for the "
                         "whole study (each point logs to its own folder "
                         "under the study's)")


def _values(key: str, values) -> list:
  """A grid field's values: a list (one value alone is a list of one),
  non-empty, none twice, each in the form its field keeps (``(64, 64)`` for
  ``hidden`` is ``"64,64"``), so that tables show one form."""
  if isinstance(values, dict):
    raise _validate.fail(key, values, "expected a list of values, not a "
                         "table")
  if isinstance(values, (str, bytes)) or not hasattr(values, "__iter__"):
    values = [values]
  values = [natural(FIELDS[key], v) for v in values]
  if not values:
    raise _validate.fail(key, values, "expected at least one value")
  seen = []
  for v in values:
    if any(v == w and type(v) is type(w) for w in seen):
      raise _validate.fail(key, v, "given twice in the grid (each value "
                           "runs once)")
    seen.append(v)
  return values


def check_seeds(seeds) -> list[int]:
  if isinstance(seeds, (str, bytes)) or not (
      isinstance(seeds, int) or hasattr(seeds, "__iter__")):
    raise _validate.fail("seeds", seeds, "expected a list of integers, or "
                         "one integer")
  if isinstance(seeds, int):
    seeds = [seeds]
  seeds = list(seeds)
  if not seeds:
    raise _validate.fail("seeds", seeds, "expected at least one seed")
  if len(set(seeds)) != len(seeds):
    raise _validate.fail("seeds", seeds, "has a seed twice")
  for s in seeds:
    if isinstance(s, bool) or not isinstance(s, int) or not 0 <= s < 2 ** 32:
      raise _validate.fail("seeds", s, "expected integers in [0, 2**32)")
  return seeds


def describe(values: dict) -> str:
  return ", ".join(f"{k}={v!r}" for k, v in values.items()) or "the base"


def base_values(base) -> dict:
  """The settings every point starts from: a ``Config``'s given fields, or
  a dict's (checked by name and type; only each point, with its grid values,
  has to be a valid run: ``--steps 20`` with ``H`` swept over 10 and 20)."""
  if isinstance(base, Config):
    values = base.values()
  elif isinstance(base, dict):
    values = {canonical(k): check_value(k, v) for k, v in base.items()}
  else:
    raise _validate.fail("base", type(base).__name__, "expected a "
                         "lowbw.Config or a dict of its settings")
  values.pop("out", None)  # the study's folder holds the points' own
  return values


def point_config(base: dict, values: dict, seed: int) -> Config:
  """The base settings with ``values`` and ``seed``. A base setting that
  the point's choices do not use (the base's H at a DDP point) is left
  out; a grid value they do not use is an error naming the point."""
  given = {**base, **values, "seed": seed}
  while True:
    try:
      return Config(**given)
    except _validate.ConfigError as e:
      unused = e.field in base and e.field not in values and (
          "not used by" in e.allowed)
      if not unused:
        raise _validate.fail(e.field, e.value, f"{e.allowed} (at grid point "
                             f"{describe(values)})") from None
      del given[e.field]


def expand(base, grid, seeds) -> list[Point]:
  """Every point: each sub-grid's product of values, each with every seed,
  in order; a combination given twice runs once."""
  points, seen, base = [], set(), base_values(base)
  for sub in check_grid(grid):
    for combo in itertools.product(*sub.values()):
      values = dict(zip(sub, combo))
      key = json.dumps(values, sort_keys=True, default=repr)
      if key in seen:
        continue
      seen.add(key)
      for seed in check_seeds(seeds):
        points.append(Point(len(points), values, seed,
                            point_config(base, values, seed)))
  return points


def traced(config: Config) -> dict[str, str]:
  """field -> hyperparameter name of the config's settings that one build
  runs with other values (``Simulator.run(hparams=...)``)."""
  settings = config.to_dict()
  strategy = config.strategy
  own = set()
  if isinstance(strategy, str):
    spec = strategies_lib.spec(strategy)
    own = {p.flag for p in spec.params} - set(strategy_traced)
  out = {}
  for name, field in FIELDS.items():
    if field.kind != TRACED or settings.get(name) is None or name in own:
      continue
    if not config.clock and field.group.startswith("network"):
      continue
    out[name] = field.knob
  return out


def shape_key(config: Config, skip: tuple = (), density: bool = False,
              bits: bool = False) -> str:
  """Equal for configs that compile to the same programs: every setting
  but the traced ones (whose presence still counts), ``skip`` and the
  run's own; ``density``: the codec by its top-k layout alone (its
  fraction a traced value); ``bits``: the codec without its linear
  quantizer's width (a traced value)."""
  skip = {*traced(config), *skip}
  key = {name: value for name, value in config.to_dict().items()
         if name not in skip and FIELDS[name].kind != RUN}
  if density:  # no codec spec reads so
    key["codec"] = f"<top-k, traced density, {density_layout(config)}>"
  if bits:
    key["codec"] = f"<linear quantizer, traced bits, {bits_layout(config)}>"
  return json.dumps(key, sort_keys=True,
                    default=lambda o: f"<{type(o).__name__} {id(o)}>")


def traced_key(config: Config, fields: tuple = ()) -> str:
  """``shape_key`` of a build that traces ``fields`` (H: a run's own H
  and its host settings; density: top-k's fraction; bits: a linear
  quantizer's width)."""
  return shape_key(config, ("H", *HOST_SETTINGS) if "H" in fields else (),
                   density="density" in fields, bits="bits" in fields)


def groups(points: list[Point]) -> list[list[Point]]:
  """The points by compiled shape, in order of their first point; shapes
  that differ only in H, top-k's density and a linear quantizer's width
  join one group, built with those traced, where the strategy and codec
  allow it (``traceable``)."""
  out: dict[str, list[Point]] = {}
  for p in points:
    out.setdefault(shape_key(p.config), []).append(p)
  merged: dict[str, list[Point]] = {}
  for key, group in out.items():
    fields = traceable(group[0].config)
    if fields:
      key = traced_key(group[0].config, fields)
    merged.setdefault(key, []).extend(group)
  return [sorted(g, key=lambda p: p.index) for g in merged.values()]


def traceable(config: Config) -> tuple:
  """The fields a build of ``config`` may trace: H where
  ``period_traceable``, and top-k's density too where its codec is top-k
  alone (``lowbw.build(config, traced=("H", "density"))``), or the bit
  width where its codec ends in a linear quantizer (``traced=("H",
  "bits")``)."""
  if not period_traceable(config):
    return ()
  return (("H",) + (("density",) if density_layout(config) else ())
          + (("bits",) if bits_layout(config) else ()))


def density_layout(config: Config) -> str | None:
  """The layout of the config's codec when it is top-k alone (whole,
  flat:N or blocks:N), else None."""
  return _density.layout_of(config.built().strategy)


def density(config: Config) -> float:
  """The fraction of the config's top-k codec."""
  return _density.fraction_of(config.built().strategy)


def densities(points: list[Point]) -> list[float]:
  """The distinct top-k densities of ``points`` (of traceable ones)."""
  return list(dict.fromkeys(density(p.config) for p in points
                            if "density" in traceable(p.config)))


def bits_layout(config: Config) -> str | None:
  """The config's codec without its linear quantizer's width when it ends
  in one, else None."""
  return _bits.layout_of(config.built().strategy)


def bits(config: Config) -> int:
  """The bit width of the config's linear quantizer."""
  return _bits.bits_of(config.built().strategy)


def bit_widths(points: list[Point]) -> list[int]:
  """The distinct quantizer widths of ``points`` (of traceable ones)."""
  return list(dict.fromkeys(bits(p.config) for p in points
                            if "bits" in traceable(p.config)))


def period_traceable(config: Config) -> bool:
  """Whether a build of ``config`` may make H a traced value
  (``lowbw.build(config, traced=("H",))``): a strategy by name whose round
  is H local steps then one sync, without fault or straggler masks,
  lanes, a paired DDP lane or checkpoints."""
  if not isinstance(config.strategy, str) or config.lanes:
    return False
  built = config.built()
  checked = built.checked
  return (built.strategy.traceable_period and checked["shadow"] is None
          and not has_masks(checked["network"])
          and config.checkpoint_every is None)


def periods(points: list[Point]) -> list[int]:
  """The distinct H of ``points`` (of traceable strategies), in order."""
  return list(dict.fromkeys(p.config.H for p in points
                            if period_traceable(p.config)))


def hparams(point: Point) -> dict[str, Any]:
  """The point's traced values, as ``Simulator.run`` takes them."""
  return {knob: getattr(point.config, name)
          for name, knob in traced(point.config).items()}
