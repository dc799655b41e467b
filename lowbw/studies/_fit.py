"""Fitting a study's results into a law: ``lowbw.fit``.

A study measures a figure (the final evaluation loss, the simulated time) at
a few small points; a law fitted to them carries it to points not run (a
larger model, more workers, a longer run). The forms, each from the paper
that uses it:

* ``"power"``: y = E + sum_i A_i x_i^(-alpha_i), a power law with an
  irreducible term in each input (in model size N and tokens D it is
  *Training Compute-Optimal Large Language Models*, Hoffmann et al., arXiv
  2203.15556: L = E + A / N^alpha + B / D^beta). Non-linear least squares.
* ``"joint"``: y = A prod_i x_i^beta_i, the joint power law in model size N
  and replicas M of *Communication-Efficient Language Model Training Scales
  Reliably and Robustly: Scaling Laws for DiLoCo* (Charles et al., arXiv
  2503.09799); linear least squares in logarithms.
* ``"log"``: y = a + sum_i b_i log x_i, the logarithmic trend of a figure in
  H (token efficiency falling with log H, as the planner's heuristic has
  it); linear least squares.

Intervals come from a bootstrap: with several seeds, every combination's
seeds are drawn with replacement and the means over them fitted again;
with one seed, the fitted values times one plus relative residuals drawn
with replacement. The interval of a parameter or of a prediction is the
central ``confidence`` share of its bootstrap values.
"""

import dataclasses
import json
import math
import os
from typing import Any, NamedTuple

import numpy as np

from lowbw import _validate

# Inputs named for what they are: the summary's or the config's name.
ALIASES = {"params": "num_params", "N": "num_params", "M": "workers",
           "W": "workers"}
BOOTSTRAP = 200


class Form(NamedTuple):
  """A law: its parameters' names for inputs ``x``, its value, its fit."""
  names: Any      # x -> list of parameter names
  value: Any      # (theta, X (n, k)) -> y (n,)
  solve: Any      # (X, y) -> theta
  paper: str


def _power_names(x):
  return ["E"] + [f"A_{n}" for n in x] + [f"alpha_{n}" for n in x]


def _power_value(theta, X):
  k = X.shape[1]
  e, a, alpha = theta[0], theta[1:1 + k], theta[1 + k:]
  return e + np.sum(a * X ** (-alpha), axis=1)


def _power_solve(X, y, start=None):
  """Least squares from a few starts (the exponents' landscape is not
  convex), or from ``start`` alone (a bootstrap's refit starts at the fit
  it resamples); A is fitted in logarithms so that it stays positive."""
  from scipy.optimize import least_squares
  k = X.shape[1]

  def unpack(z):
    return np.concatenate([[z[0]], np.exp(z[1:1 + k]), z[1 + k:]])

  def residual(z):
    return _power_value(unpack(z), X) - y
  if start is not None:
    z0 = np.concatenate([[start[0]], np.log(np.maximum(start[1:1 + k],
                                                       1e-300)),
                         start[1 + k:]])
    starts, budget = [z0], 300
  else:
    e = float(np.min(y)) - 0.1 * float(np.ptp(y) or abs(np.min(y)) or 1.0)
    scale = max(float(np.mean(y)) - e, 1e-12) / k
    starts = [np.array([e] + [math.log(scale) + alpha * float(
        np.mean(np.log(X[:, i]))) for i in range(k)] + [alpha] * k)
              for alpha in (0.1, 0.3, 0.7)]
    budget = 20000
  best = None
  for z0 in starts:
    r = least_squares(residual, z0, method="lm", max_nfev=budget)
    if best is None or r.cost < best.cost:
      best = r
  return unpack(best.x)


def _joint_value(theta, X):
  return theta[0] * np.prod(X ** theta[1:], axis=1)


def _joint_solve(X, y):
  design = np.column_stack([np.ones(len(y)), np.log(X)])
  coef = np.linalg.lstsq(design, np.log(y), rcond=None)[0]
  return np.concatenate([[math.exp(coef[0])], coef[1:]])


def _log_value(theta, X):
  return theta[0] + np.log(X) @ theta[1:]


def _log_solve(X, y):
  design = np.column_stack([np.ones(len(y)), np.log(X)])
  return np.linalg.lstsq(design, y, rcond=None)[0]


FORMS = {
    "power": Form(_power_names, _power_value, _power_solve,
                  "Hoffmann et al. 2022, arXiv 2203.15556"),
    "joint": Form(lambda x: ["A"] + [f"beta_{n}" for n in x], _joint_value,
                  _joint_solve, "Charles et al. 2025, arXiv 2503.09799"),
    "log": Form(lambda x: ["a"] + [f"b_{n}" for n in x], _log_value,
                _log_solve, "the planner's log-H efficiency"),
}


@dataclasses.dataclass
class Fit:
  """A law fitted to a study (``lowbw.fit``).

  Attributes:
    form: "power", "joint" or "log" (the module says each one's law).
    x: the inputs' names; y: the fitted figure's.
    params: parameter name -> value fitted to every seed's mean.
    intervals: parameter name -> (low, high), the bootstrap's central
      ``confidence`` share.
    rows: per combination of inputs: its inputs, the mean measured ``y``
      over seeds, the seeds, the fitted value and the relative residual.
    samples: (bootstrap draws, parameters) of the refitted parameters.
    confidence: the intervals' share (0.9 by default).
  """

  form: str
  x: list[str]
  y: str
  params: dict[str, float]
  intervals: dict[str, tuple[float, float]]
  rows: list[dict]
  samples: np.ndarray
  confidence: float

  @property
  def inputs(self) -> list[str]:
    """``x`` by the names the runs have them (``params`` is
    ``num_params``, ``M`` and ``W`` are ``workers``)."""
    return [ALIASES.get(n, n) for n in self.x]

  def __repr__(self) -> str:
    return (f"Fit({self.form} law of {self.y} in {', '.join(self.x)}: "
            + ", ".join(f"{k}={v:.4g}" for k, v in self.params.items())
            + ")")

  def predict(self, points) -> list[dict]:
    """The law's value at ``points`` (a dict of the inputs, or a list of
    them), with the bootstrap interval of each: [{**inputs, y, low,
    high}]."""
    points = [points] if isinstance(points, dict) else list(points)
    X = _inputs_of(points, self.x, "predict")
    form = FORMS[self.form]
    theta = np.array(list(self.params.values()))
    central = form.value(theta, X)
    drawn = np.stack([form.value(s, X) for s in self.samples]) if len(
        self.samples) else central[None]
    low, high = _band(drawn, self.confidence)
    return [{**p, self.y: float(c), "low": float(lo), "high": float(hi)}
            for p, c, lo, hi in zip(points, central, low, high)]

  def quality(self) -> dict:
    """The fit's R^2 and median and max |relative residual| over its
    rows."""
    y = np.array([r[self.y] for r in self.rows])
    fitted = np.array([r["fitted"] for r in self.rows])
    total = float(np.sum((y - y.mean()) ** 2))
    rel = np.abs(fitted / y - 1)
    return {"r2": 1 - float(np.sum((y - fitted) ** 2)) / total
            if total > 0 else None,
            "median_rel_residual": float(np.median(rel)),
            "max_rel_residual": float(np.max(rel))}

  def describe(self) -> dict:
    return {"form": self.form, "paper": FORMS[self.form].paper,
            "x": self.x, "y": self.y, "params": self.params,
            "intervals": {k: list(v) for k, v in self.intervals.items()},
            "confidence": self.confidence, "quality": self.quality(),
            "rows": self.rows, "samples": self.samples.tolist()}

  def save(self, path: str) -> str:
    """Writes the fit as JSON (``load_fit`` reads it back)."""
    with open(path, "w") as f:
      json.dump(self.describe(), f, indent=1)
    return path

  def plot(self, path: str) -> str:
    """Measured against fitted, with the bootstrap band, per row."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    y = np.array([r[self.y] for r in self.rows])
    fitted = np.array([r["fitted"] for r in self.rows])
    fig, ax = plt.subplots(figsize=(5, 4))
    ax.scatter(fitted, y, s=20)
    lo, hi = float(min(y.min(), fitted.min())), float(max(y.max(),
                                                           fitted.max()))
    ax.plot([lo, hi], [lo, hi], color="k", lw=0.8)
    ax.set(xlabel=f"fitted {self.y} ({self.form} law)",
           ylabel=f"measured {self.y} (mean over seeds)",
           title=" · ".join(f"{k}={v:.3g}" for k, v in self.params.items()))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def load_fit(path: str) -> Fit:
  """A fit saved by ``Fit.save``."""
  with open(path) as f:
    d = json.load(f)
  return Fit(d["form"], d["x"], d["y"], d["params"],
             {k: tuple(v) for k, v in d["intervals"].items()}, d["rows"],
             np.asarray(d["samples"], float), d["confidence"])


def fit(study, x, y: str = "final_eval_loss", form: str = "power",
        bootstrap: int = BOOTSTRAP, confidence: float = 0.9,
        seed: int = 0, where=None) -> Fit:
  """A ``form`` law of ``y`` in the inputs ``x``, fitted to ``study``.

  Args:
    study: a ``lowbw.Study`` or its folder.
    x: the inputs: a name or a list of names, each a grid field (``H``,
      ``workers``), a config field or a summary figure (``num_params``,
      ``tokens``); ``params``/``N`` stand for ``num_params``, ``M``/``W``
      for ``workers``.
    y: the summary figure fitted (``final_eval_loss``, ``sim_time_s``, ...).
    form: "power", "joint" or "log" (the module says each one's law).
    bootstrap: draws of the bootstrap (0: no intervals).
    confidence: the intervals' central share.
    seed: the bootstrap's seed (the same seed, the same intervals).
    where: the points fitted: a dict of field -> value (or a list of
      values) each point must have (its grid value or config field, as
      ``x`` reads them), or a function of a ``PointResult`` returning
      True for the points to keep; None: every finished point.

  Returns:
    A ``Fit``: ``params``, ``intervals``, ``predict(...)``, ``quality()``,
    ``plot(path)``, ``save(path)``.

  Raises:
    ConfigError: an unknown form or input, an input not > 0, or fewer
      combinations than the law has parameters.
  """
  if form not in FORMS:
    raise _validate.fail("form", form, "expected one of " + ", ".join(FORMS)
                         + _validate.suggest(str(form), list(FORMS)))
  x = [x] if isinstance(x, str) else list(x)
  if not x:
    raise _validate.fail("x", x, "expected at least one input")
  bootstrap = _validate.non_negative_int("bootstrap", bootstrap)
  if not 0 < confidence < 1:
    raise _validate.fail("confidence", confidence, "expected a share in "
                         "(0, 1)")
  study = _study_of(study)
  combos, seeds = _measured(_kept(study.points, where), x, y)
  names = FORMS[form].names(x)
  if len(combos) <= len(names):
    raise _validate.fail("x", x, f"the {form} law has {len(names)} "
                         f"parameters ({', '.join(names)}) but the study "
                         f"has {len(combos)} combinations of them; give "
                         "more points (or a simpler form)")
  theta = _solve(form, combos, seeds)
  samples = _bootstrap(form, combos, seeds, bootstrap, seed)
  low, high = _band(samples, confidence) if len(samples) else (theta, theta)
  X = np.array([c["x"] for c in combos])
  fitted = FORMS[form].value(theta, X)
  rows = [{**dict(zip(x, map(float, c["x"]))), y: _mean(c, seeds),
           "seeds": len(c["by_seed"]), "fitted": float(f),
           "rel_residual": float(f / _mean(c, seeds) - 1)}
          for c, f in zip(combos, fitted)]
  return Fit(form, x, y, dict(zip(names, map(float, theta))),
             {n: (float(a), float(b)) for n, a, b in zip(names, low, high)},
             rows, samples, confidence)


def _study_of(study):
  if isinstance(study, (str, os.PathLike)):
    from lowbw.studies._run import load
    return load(os.fspath(study))
  if not hasattr(study, "points"):
    raise _validate.fail("study", type(study).__name__, "expected a "
                         "lowbw.Study or a study's folder")
  return study


def _value(point, name: str):
  """Input ``name`` of a point: its grid value, summary figure or config
  field (None when it has none)."""
  key = ALIASES.get(name, name)
  for source in (point.values, point.summary):
    if key in source:
      return source[key]
  return getattr(point.config, key, None) if point.config is not None else None


def _kept(points: list, where) -> list:
  """The points ``where`` keeps (``fit``'s argument); one error when it
  names no field of theirs or keeps none."""
  if where is None:
    return list(points)
  if callable(where):
    kept = [p for p in points if where(p)]
  elif isinstance(where, dict):
    def wanted(p):
      return all(_value(p, k) in (v if isinstance(v, (list, tuple, set))
                                  else [v]) for k, v in where.items())
    kept = [p for p in points if wanted(p)]
  else:
    raise _validate.fail("where", where, "expected a dict of field -> value "
                         "or a function of a point")
  if not kept:
    raise _validate.fail("where", where, "keeps none of the study's "
                         f"{len(points)} points")
  return kept


def _measured(points: list, x: list[str], y: str) -> tuple[list[dict], list]:
  """Per combination of the inputs: its inputs and ``y`` per seed (failed
  points left out); and the seeds."""
  combos: dict[tuple, dict] = {}
  for p in points:
    if p.summary.get("error"):
      continue
    xs = tuple(_number(p, n, "x") for n in x)
    got = p.summary.get(y)
    if not isinstance(got, (int, float)) or not math.isfinite(got):
      raise _validate.fail("y", y, f"point {p.index} has {y}={got!r}; "
                           "expected a finite summary figure such as "
                           "final_eval_loss or sim_time_s")
    combos.setdefault(xs, {"x": xs, "by_seed": {}})["by_seed"][p.seed] = (
        float(got))
  if not combos:
    raise _validate.fail("study", "no finished points", "expected a study "
                         "with points that finished")
  seeds = sorted({s for c in combos.values() for s in c["by_seed"]})
  return list(combos.values()), seeds


def _number(point, name: str, field: str) -> float:
  value = _value(point, name)
  try:
    number = float(value)
  except (TypeError, ValueError):
    number = math.nan
  if not number > 0 or not math.isfinite(number):
    raise _validate.fail(field, name, f"point {point.index} has {name}="
                         f"{value!r}; expected a number > 0 there (a grid "
                         "field, a config field or a summary figure such "
                         "as num_params)")
  return number


def _inputs_of(points: list[dict], x: list[str], field: str) -> np.ndarray:
  out = []
  for p in points:
    missing = [n for n in x if n not in p]
    if missing:
      raise _validate.fail(field, p, f"expected the inputs {', '.join(x)}")
    out.append([float(p[n]) for n in x])
  X = np.array(out, float)
  if not np.all(X > 0):
    raise _validate.fail(field, points, "expected inputs > 0")
  return X


def _mean(combo: dict, seeds) -> float:
  values = [combo["by_seed"][s] for s in seeds if s in combo["by_seed"]]
  return float(np.mean(values))


def _solve(form: str, combos: list[dict], seeds, start=None) -> np.ndarray:
  X = np.array([c["x"] for c in combos])
  y = np.array([_mean(c, seeds) for c in combos])
  if form in ("power", "joint") and not np.all(y > 0):
    raise _validate.fail("y", "values <= 0", f"the {form} law needs a "
                         "figure > 0")
  if start is not None and form == "power":
    return _power_solve(X, y, start)
  return FORMS[form].solve(X, y)


def _bootstrap(form: str, combos: list[dict], seeds, draws: int,
               seed: int) -> np.ndarray:
  """The parameters refitted ``draws`` times: on every combination's seeds
  drawn with replacement (several seeds), else on the fitted values times
  one plus relative residuals drawn with replacement (one seed)."""
  rng = np.random.default_rng(seed)
  theta = _solve(form, combos, seeds)
  X = np.array([c["x"] for c in combos])
  fitted = FORMS[form].value(theta, X)
  rel = np.array([_mean(c, seeds) for c in combos]) / fitted - 1
  several = max(len(c["by_seed"]) for c in combos) > 1
  out = []
  for _ in range(draws):
    if several:
      use = []
      for c in combos:
        values = np.array(list(c["by_seed"].values()))
        # Deviations widened by sqrt(n / (n - 1)): drawn from n values, a
        # mean's spread is otherwise (n - 1) / n of its variance.
        n = len(values)
        spread = values.mean() + (values - values.mean()) * (
            math.sqrt(n / (n - 1)) if n > 1 else 1.0)
        drawn = rng.choice(spread, size=n)
        use.append(dict(c, by_seed=dict(enumerate(drawn))))
    else:
      noise = rng.choice(rel, size=len(combos))
      use = [dict(c, by_seed={0: float(f * (1 + e))})
             for c, f, e in zip(combos, fitted, noise)]
    try:
      out.append(_solve(form, use, range(max(len(c["by_seed"])
                                             for c in use)), start=theta))
    except (ValueError, np.linalg.LinAlgError, _validate.ConfigError):
      continue
  return np.array(out)


def _band(samples: np.ndarray, confidence: float) -> tuple:
  tail = 100 * (1 - confidence) / 2
  return (np.percentile(samples, tail, axis=0),
          np.percentile(samples, 100 - tail, axis=0))


__all__ = ["Fit", "fit", "load_fit", "FORMS"]
