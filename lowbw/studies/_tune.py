"""Comparing methods at each one's best: ``lowbw.studies.tune``.

A comparison of methods at one shared learning rate favours whichever
method that rate suits. ``tune`` gives each method its own grid, runs it
(``lowbw.study``), and takes the combination with the best mean over seeds;
when that best lies at the end of a numeric axis of three or more values,
the optimum may lie beyond, so the axis is extended one step further
(geometrically: past ``a < b`` comes ``b * b / a``) and the new points run,
up to ``extend`` times. Then the methods are compared at their best with
paired seeds: every method runs the same seeds, so the difference to the
reference method is taken seed by seed, with its paired interval
(``paired_interval``).
"""

import dataclasses
import math
import os
from typing import Any

import numpy as np

from lowbw import _validate
from lowbw.studies import _grid
from lowbw.studies._result import paired_interval
from lowbw.studies._run import study


@dataclasses.dataclass
class Tuned:
  """Every method at its best (``tune``).

  Attributes:
    metric: the figure compared; ``lower``: whether lower is better.
    reference: the method the others are compared with.
    methods: per method: ``best`` (its grid values there), ``mean``,
      ``std`` (ddof 0) and ``by_seed`` (seed -> value) at the best,
      ``grid`` (its final grid, extensions included), ``extended`` (the
      values added), ``at_edge`` (the axes whose best is still at an end
      after the extensions: the optimum may lie beyond), ``points`` (the
      points run).
  """

  metric: str
  lower: bool
  reference: str
  methods: dict[str, dict]

  def table(self) -> list[dict]:
    """One row per method: its best settings, mean and std over seeds, the
    mean paired difference to the reference and its 95 % one-sided bounds
    (``low``, ``high``), and whether the best is at a grid's edge."""
    ref = self.methods[self.reference]["by_seed"]
    rows = []
    for name, m in self.methods.items():
      diffs = [m["by_seed"][s] - ref[s] for s in m["by_seed"] if s in ref]
      low, high = paired_interval(diffs)
      rows.append({"method": name, **{f"best_{k}": v for k, v in
                                      m["best"].items()},
                   f"{self.metric}_mean": m["mean"],
                   f"{self.metric}_std": m["std"],
                   "diff_mean": float(np.mean(diffs)) if diffs else math.nan,
                   "diff_low": low, "diff_high": high,
                   "seeds": len(m["by_seed"]),
                   "at_edge": ",".join(m["at_edge"]) or None})
    return rows


def tune(base, methods: dict, seeds=(0, 1, 2),
         metric: str = "final_eval_loss", lower: bool = True,
         extend: int = 2, reference: str | None = None,
         out: str | None = None, progress: bool | None = None) -> Tuned:
  """Tunes each method on its own grid, then compares them at their best.

  Args:
    base: what every run shares (a ``lowbw.Config`` or a dict of fields).
    methods: name -> ``(settings, grid)``: the method's own settings over
      ``base`` (``{"strategy": "diloco", "H": 10}``) and the grid it is
      tuned on (``{"inner_lr": [1e-3, 3e-3, 1e-2]}``, any ``lowbw.study``
      grid dict).
    seeds: every method runs every seed (the comparison pairs them).
    metric: the summary figure compared (default ``final_eval_loss``).
    lower: whether lower is better.
    extend: how many times a numeric axis whose best is at an end may be
      extended one step (0: never).
    reference: the method the others are compared with (default the
      first).
    out: a folder: each method's studies go to ``out/<name>/round<k>``
      (resumable, as ``lowbw.study``'s).
    progress: a progress bar per study (default: on a terminal).

  Returns:
    A ``Tuned``: ``methods`` and ``table()``.
  """
  if not isinstance(methods, dict) or not methods:
    raise _validate.fail("methods", methods, "expected name -> (settings, "
                         "grid), at least one")
  reference = next(iter(methods)) if reference is None else reference
  if reference not in methods:
    raise _validate.fail("reference", reference, "expected one of "
                         + ", ".join(methods))
  extend = _validate.non_negative_int("extend", extend)
  base = _grid.base_values(base)
  seeds = _grid.check_seeds(seeds)
  tuned = {}
  for name, spec in methods.items():
    settings, grid = _spec(name, spec)
    tuned[name] = _tune_one(name, {**base, **settings}, grid, seeds, metric,
                            lower, extend, out, progress)
  return Tuned(metric, lower, reference, tuned)


def _spec(name: str, spec) -> tuple[dict, dict]:
  if not (isinstance(spec, (tuple, list)) and len(spec) == 2
          and all(isinstance(part, dict) for part in spec)):
    raise _validate.fail(f"methods[{name!r}]", spec, "expected (settings, "
                         "grid): two dicts")
  return spec[0], {k: list(v) for k, v in spec[1].items()}


def _tune_one(name: str, base: dict, grid: dict, seeds, metric: str,
              lower: bool, extend: int, out, progress) -> dict:
  """One method: its grid run, extended while its best is at an end."""
  results: dict[tuple, dict] = {}  # values -> {seed: metric}
  todo, added, points = dict(grid), {}, 0
  for round_ in range(extend + 1):
    folder = None if out is None else os.path.join(out, name,
                                                   f"round{round_}")
    s = study(base, todo, seeds, out=folder, progress=progress, plots=False)
    points += len(s.points)
    for p in s.points:
      key = tuple(sorted(p.values.items()))
      value = p.summary.get(metric)
      if not p.summary.get("error") and isinstance(value, (int, float)):
        results.setdefault(key, {})[p.seed] = float(value)
    best = _best(results, lower)
    edges = _at_edge(grid, dict(best))
    if not edges or round_ == extend:
      break
    axis, beyond = edges[0]
    added.setdefault(axis, []).append(beyond)
    grid[axis] = sorted(grid[axis] + [beyond])
    todo = {**grid, axis: [beyond]}
  by_seed = results[best]
  values = list(by_seed.values())
  return {"best": dict(best), "mean": float(np.mean(values)),
          "std": float(np.std(values)), "by_seed": by_seed, "grid": grid,
          "extended": added, "points": points,
          "at_edge": [axis for axis, _ in _at_edge(grid, dict(best))]}


def _best(results: dict, lower: bool) -> tuple:
  if not results:
    raise _validate.fail("methods", "no finished points", "every run of "
                         "the method failed")
  sign = 1.0 if lower else -1.0
  return min(results, key=lambda k: sign * float(np.mean(list(
      results[k].values()))))


def _at_edge(grid: dict, best: dict) -> list[tuple[str, Any]]:
  """The numeric axes (three or more values > 0) whose best value is an
  end, and the value one geometric step beyond it."""
  out = []
  for axis, values in grid.items():
    if len(values) < 3 or not all(
        isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0
        for v in values):
      continue
    ordered = sorted(values)
    at = best.get(axis)
    if at == ordered[-1]:
      beyond = ordered[-1] * ordered[-1] / ordered[-2]
    elif at == ordered[0]:
      beyond = ordered[0] * ordered[0] / ordered[1]
    else:
      continue
    if all(isinstance(v, int) for v in values):
      beyond = int(round(beyond))
    out.append((axis, beyond))
  return out


__all__ = ["Tuned", "tune"]
