"""What ``lowbw.study`` returns: its points and their tables."""

import dataclasses
import math
from typing import Any

import numpy as np

from lowbw.config import Config

# Final figures of a point (its summary's keys) in the final table, each as
# mean and std over seeds.
FINAL = ("final_eval_loss", "final_train_loss", "payload_bytes",
         "wire_bytes", "sim_time_s", "wall_time_s")
# With the paired DDP lane (``shadow="ddp"``): the lane's loss and the gap
# to it, which is paired by seed within each point; the gap also gets its
# one-sided 95 % t-bounds over seeds (``paired_interval``).
SHADOW = ("final_shadow_eval_loss", "final_shadow_gap", "token_efficiency")
# With counterfactual lanes (``lanes``): each cause's cost, the run's final
# loss and simulated time minus its lane's, paired by seed like the gap
# (its ``paired_interval`` too).
LANE_COSTS = ("/loss_cost", "/time_cost_s", "/goodput_cost")
# Fields that make a point another method (a comparison across them is a
# comparison of methods), and the rates such a comparison should tune.
METHOD_FIELDS = ("strategy", "inner", "outer")
RATES = ("inner_lr", "outer_lr")


@dataclasses.dataclass
class PointResult:
  """One finished point of a study.

  Attributes:
    index: its place in the study (its folder ``points/NNNN``).
    values: the grid's values at this point.
    seed: its seed.
    summary: the run's summary (``error`` holds a failed run's message).
    history: metric -> numpy array over logged rows.
    log_dir: its folder, or None.
    config: the run's whole ``Config``.
  """

  index: int
  values: dict[str, Any]
  seed: int
  summary: dict[str, Any]
  history: dict[str, np.ndarray]
  log_dir: str | None
  config: Config


def paired_interval(diffs, confidence: float = 0.95) -> tuple[float, float]:
  """The one-sided ``confidence`` t-bounds of the mean of paired
  differences (e.g. a run's gap to its own seed's DDP lane): mean -/+
  t_confidence(n - 1) x std (ddof 1) / sqrt(n); the pair is the two-sided
  interval at 2 x confidence - 1. Fewer than two values: (nan, nan)."""
  diffs = np.asarray(diffs, float)
  diffs = diffs[np.isfinite(diffs)]
  n = diffs.size
  if n < 2:
    return math.nan, math.nan
  from scipy import stats  # a dependency of jax; imported when used
  half = (stats.t.ppf(confidence, n - 1) * diffs.std(ddof=1)
          / math.sqrt(n))
  return float(diffs.mean() - half), float(diffs.mean() + half)


def shared_rates(names, points) -> str | None:
  """A note when a study compares methods (sweeps ``METHOD_FIELDS``) and
  leaves a learning rate (``RATES``) unswept: that rate, given once for
  all or each method's default, is then not tuned per method, and the
  comparison favours the method it suits. None otherwise."""
  unswept = [rate for rate in RATES if rate not in names]
  if not set(names) & set(METHOD_FIELDS) or not unswept:
    return None
  from lowbw import strategies as strategies_lib
  from lowbw.config import _strategy_fields
  rates: dict[str, set] = {}
  for p in points:
    name = getattr(p.config, "strategy", None)
    if not isinstance(name, str):  # a strategy object holds its own rates
      continue
    default = _strategy_fields.defaults(strategies_lib.spec(name))
    for rate in unswept:
      value = getattr(p.config, rate, None)
      value = default.get(rate) if value is None else value
      if value is not None:
        rates.setdefault(rate, set()).add(float(value))
  if not rates:
    return None
  said = ", ".join(
      f"{rate} {next(iter(v)):g}" if len(v) == 1 else
      f"{rate} {'/'.join(f'{x:g}' for x in sorted(v))} (the methods' defaults)"
      for rate, v in rates.items())
  return (f"methods compared at one setting of their rates ({said}), not "
          "tuned per method: the comparison favours the method these rates "
          "suit; lowbw.studies.tune compares each at its best")


def _frame(columns: dict):
  """A pandas DataFrame when pandas is installed, else a ``Table``: the
  dict of numpy arrays, printed as a table."""
  try:
    import pandas as pd
  except ImportError:
    return Table({k: np.asarray(v) for k, v in columns.items()})
  return pd.DataFrame(columns)


class Table(dict):
  """Column name -> numpy array (every column as long), printed as an
  aligned table of rows (what a study's tables are without pandas)."""

  MAX_ROWS = 40  # printed: the first and last half of these, and a count

  def __repr__(self) -> str:
    names = list(self)
    rows = len(next(iter(self.values()), ()))
    shown = list(range(rows))
    if rows > self.MAX_ROWS:
      half = self.MAX_ROWS // 2
      shown = shown[:half] + [None] + shown[-half:]
    cells = [[_cell(self[n][i]) if i is not None else "..." for n in names]
             for i in shown]
    widths = [max([len(n)] + [len(r[j]) for r in cells])
              for j, n in enumerate(names)]
    lines = ["  ".join(n.rjust(w) for n, w in zip(names, widths))]
    lines += ["  ".join(c.rjust(w) for c, w in zip(r, widths)) for r in cells]
    lines.append(f"[{rows} rows x {len(names)} columns; "
                 "pip install pandas for a DataFrame]")
    return "\n".join(lines)

  __str__ = __repr__


def _cell(value) -> str:
  if isinstance(value, (float, np.floating)):
    return "nan" if value != value else f"{float(value):.6g}"
  return str(value)


def _num(value) -> float:
  return math.nan if value is None else float(value)


@dataclasses.dataclass
class Study:
  """A finished study (``lowbw.study``).

  Attributes:
    points: one ``PointResult`` per point, in the grid's order.
    names: the swept fields.
    seeds: the seeds.
    base: the settings every point starts from (the given fields of the
      base config).
    summary: points, groups (compiled shapes), builds, resumed points,
      compile and wall seconds, the folder; ``shared_rates``: the note of
      a study that compares methods at a learning rate it does not tune
      per method (``shared_rates()``).
  """

  points: list[PointResult]
  names: list[str]
  seeds: list[int]
  base: dict[str, Any]
  summary: dict[str, Any]

  def table(self, frame: bool = True):
    """The tidy table: one row per point and logged step, with columns
    ``point``, ``seed``, the swept fields, then every logged metric
    (pandas DataFrame; ``frame=False`` or no pandas: a dict of arrays)."""
    keys: list[str] = []
    for p in self.points:
      keys += [k for k in p.history if k not in keys]
    cols: dict[str, list] = {"point": [], "seed": [],
                             **{n: [] for n in self.names},
                             **{k: [] for k in keys}}
    for p in self.points:
      rows = len(next(iter(p.history.values()), []))
      cols["point"] += [p.index] * rows
      cols["seed"] += [p.seed] * rows
      for n in self.names:
        cols[n] += [p.values.get(n)] * rows
      for k in keys:
        cols[k] += list(p.history.get(k, np.full(rows, np.nan)))
    return _frame(cols) if frame else {k: np.asarray(v)
                                       for k, v in cols.items()}

  def combinations(self) -> list[tuple[dict, list[PointResult]]]:
    """(values, the points of every seed) per combination, in order."""
    groups: dict[str, tuple[dict, list]] = {}
    for p in self.points:
      key = repr(sorted(p.values.items()))
      groups.setdefault(key, (p.values, []))[1].append(p)
    return list(groups.values())

  def final(self, frame: bool = True):
    """One row per combination of swept values: for each final figure
    (``final_keys``) its mean and std over seeds (ddof 0; failed points are
    left out and counted in ``failed``); the figures paired by seed (the
    DDP lane's gap, the lanes' costs) also their ``paired_interval``
    (``_low``, ``_high``)."""
    rows = []
    for values, points in self.combinations():
      row = {n: values.get(n) for n in self.names}
      ok = [p for p in points if not p.summary.get("error")]
      row["seeds"] = len(ok)
      row["failed"] = len(points) - len(ok)
      for key in self.final_keys():
        vals = np.asarray([_num(p.summary.get(key)) for p in ok])
        vals = vals[np.isfinite(vals)]
        row[f"{key}_mean"] = float(vals.mean()) if vals.size else math.nan
        row[f"{key}_std"] = float(vals.std()) if vals.size else math.nan
        if key == "final_shadow_gap" or key.endswith(LANE_COSTS):
          row[f"{key}_low"], row[f"{key}_high"] = paired_interval(vals)
      rows.append(row)
    columns = {k: [r[k] for r in rows] for k in (rows[0] if rows else {})}
    return _frame(columns) if frame else columns

  def final_keys(self) -> tuple[str, ...]:
    """The summary figures of the final tables: ``FINAL``, ``SHADOW``
    when a point ran the paired DDP lane, and each counterfactual lane's
    costs (``lane/<name>/loss_cost``, ``lane/<name>/time_cost_s``)."""
    lane = any("final_shadow_gap" in p.summary for p in self.points)
    costs = []
    for p in self.points:
      costs += [k for k in p.summary if k.startswith("lane/")
                and k.endswith(LANE_COSTS) and k not in costs]
    return FINAL + (SHADOW if lane else ()) + tuple(costs)

  def plot(self, folder: str | None = None) -> list[str]:
    """Draws the study's plots (final loss against bytes with the Pareto
    front marked, against simulated time, and against each swept field)
    into ``folder`` (default: the study's); returns their paths. Needs
    matplotlib."""
    from lowbw.studies import _plots
    return _plots.draw(self, folder or self.summary["out"])

  def __repr__(self):
    s = self.summary
    return (f"Study({len(self.points)} points over {self.names or 'seeds'}, "
            f"{len(self.seeds)} seeds, {s['groups']} compiled shapes, "
            f"{s['resumed']} resumed, out={s['out']!r})")
