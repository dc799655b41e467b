"""A study's folder: what it is (``study.json``), one folder per point
(each finished point's ``point.json`` written last, atomically), and the
tables.

    OUT/study.json          base config, grid, seeds; summary when finished
    OUT/points/NNNN/        the point's run: metrics.csv, config.yaml, ...
    OUT/points/NNNN/point.json   written when the point has finished
    OUT/claims/NNNN.json    who runs the point now (``_claims``)
    OUT/study.csv           one row per point and logged step
    OUT/final.csv           one row per combination: mean, std over seeds
    OUT/points.csv          one row per point: its values, seed, finals

The tables are rewritten whole each time the study runs, each to a
temporary file renamed over the old one (``write_csv``).
"""

import csv
import io
import json
import math
import os
import shutil

import numpy as np

from lowbw import _validate, telemetry
from lowbw.telemetry._writers import write_bytes, write_csv, write_json
from lowbw.config._config import FIELDS
from lowbw.config._fields import RUN
from lowbw.simulation._logdir import prepare as prepare_log_dir
from lowbw.studies import _grid
from lowbw.studies._result import PointResult

STUDY = "study.json"
POINTS = "points"
DONE = "point.json"
CLAIMS = "claims"  # who runs which point (``_claims``)
TABLES = ("study.csv", "final.csv", "points.csv", "study.parquet",
          "final.parquet")


def _jsonable(value):
  if isinstance(value, (str, int, float, bool, type(None))):
    return value
  if isinstance(value, dict):
    return {str(k): _jsonable(v) for k, v in value.items()}
  if isinstance(value, (list, tuple)):
    return [_jsonable(v) for v in value]
  return f"<{type(value).__name__}>"


def spec(base, grid, seeds) -> dict:
  """What makes a study itself: equal specs resume each other (how it is
  shown or logged does not count)."""
  settings = {k: v for k, v in base.items()
              if FIELDS[k].kind != RUN or k == "fail_on_divergence"}
  return {"base": _jsonable(settings), "grid": _jsonable(
      _grid.check_grid(grid)), "seeds": list(seeds)}


def names(grid) -> list[str]:
  """The swept fields, in the order the grid gives them (``study.json``
  keeps them as a list: its dicts are written with sorted keys)."""
  return list(dict.fromkeys(n for sub in _grid.check_grid(grid) for n in sub))


def point_dir(out: str | None, index: int) -> str | None:
  return None if out is None else os.path.join(out, POINTS, f"{index:04d}")


def prepare(out, base, grid, seeds, overwrite: bool) -> set[int]:
  """Creates or reopens ``out``; returns the finished points' indices.

  A folder holding this same study (its ``study.json``) resumes; one
  holding another study or a run is refused unless ``overwrite``.
  """
  if out is None:
    return set()
  if not isinstance(out, (str, os.PathLike)):
    raise _validate.fail("out", out, "expected a folder path or None")
  out = os.fspath(out)
  mine = spec(base, grid, seeds)
  path = os.path.join(out, STUDY)
  if os.path.isfile(path) and not overwrite:
    with open(path) as f:
      theirs = json.load(f).get("spec")
    if theirs != mine:
      raise _validate.fail("out", out, "holds another study (its base, "
                           "grid or seeds differ); give another folder or "
                           "overwrite=True")
    return finished(out)
  if overwrite:
    for name in (STUDY, POINTS, CLAIMS, *TABLES, *_plot_names(out)):
      target = os.path.join(out, name)
      if os.path.isdir(target):
        shutil.rmtree(target)
      elif os.path.exists(target):
        os.remove(target)
  prepare_log_dir(out, overwrite=overwrite, field="out")
  write_json(path, {"spec": mine, "names": names(grid)})
  return set()


def _plot_names(out: str) -> list[str]:
  if not os.path.isdir(out):
    return []
  return [n for n in os.listdir(out) if n.startswith("loss_vs_") and
          n.endswith(".png")]


def finished(out: str) -> set[int]:
  folder = os.path.join(out, POINTS)
  if not os.path.isdir(folder):
    return set()
  return {int(name) for name in os.listdir(folder) if name.isdigit() and
          os.path.isfile(os.path.join(folder, name, DONE))}


def read_record(out: str) -> dict:
  """``study.json`` of the study in ``out``."""
  path = os.path.join(out, STUDY)
  if not os.path.isfile(path):
    raise _validate.fail("study", out, "no study.json there (a lowbw sweep "
                         "--out or lowbw.study(out=...) folder)")
  with open(path) as f:
    return json.load(f)


def write_point(result: PointResult) -> None:
  write_json(os.path.join(result.log_dir, DONE), {
      "index": result.index, "values": _jsonable(result.values),
      "seed": result.seed, "summary": result.summary})


def write_history(path: str, history: dict) -> None:
  """``history`` (metric -> array) as a ``metrics.csv`` (NaN: an empty
  cell), as ``read_history`` reads it."""
  names = list(history)
  rows = len(next(iter(history.values()), []))
  write_csv(path, names, [{k: _plain(history[k][r]) for k in names}
                          for r in range(rows)])


def read_history(path: str) -> dict[str, np.ndarray]:
  """``metrics.csv`` as metric -> float array (empty cells are NaN)."""
  if not os.path.isfile(path):
    return {}
  with open(path, newline="") as f:
    rows = list(csv.reader(f))
  if not rows:
    return {}
  head, body = rows[0], rows[1:]
  return {name: np.asarray([float(r[i]) if r[i] != "" else math.nan
                            for r in body]) for i, name in enumerate(head)}


def read_done(out: str, index: int) -> dict:
  """The record of finished point ``index`` (its ``point.json``)."""
  with open(os.path.join(point_dir(out, index), DONE)) as f:
    return json.load(f)


def check_finished(out: str | None, points: list, done: set[int]) -> None:
  """Each finished point of ``out`` ran the settings and seed that ``points``
  (this study's expansion) gives its index: the same grid with its fields
  or values in another order is another order of points, whose folders
  would be read as the wrong points.

  Raises:
    ConfigError: naming ``out`` and the first point that differs.
  """
  for p in points:
    if p.index not in done:
      continue
    saved = read_done(out, p.index)
    mine = _jsonable(p.values)
    if saved["values"] == mine and saved["seed"] == p.seed:
      continue
    ran = _grid.describe(dict(sorted(saved["values"].items())))
    here = _grid.describe(dict(sorted(mine.items())))
    raise _validate.fail(
        "out", out, f"its point {p.index} ran {ran} (seed {saved['seed']}) "
        f"but this grid puts {here} (seed {p.seed}) there; give the grid's "
        "fields, values and seeds in the order the study was started with, "
        "or another folder")


def recorded_point(out: str, base: dict, index: int,
                   order: list[str]) -> _grid.Point:
  """Finished point ``index`` as its own record stores it: its values (in
  the grid's field ``order``) and seed, its config rebuilt from ``base``."""
  saved = read_done(out, index)
  values = {n: saved["values"][n] for n in order if n in saved["values"]}
  values.update(saved["values"])  # fields ``order`` lacks (an old record)
  return _grid.Point(index, values, saved["seed"],
                     _grid.point_config(base, values, saved["seed"]))


def read_point(out: str, point: _grid.Point) -> PointResult:
  folder = point_dir(out, point.index)
  saved = read_done(out, point.index)
  # A failed point's rows are not the study's (as when it fails in memory).
  history = ({} if saved["summary"].get("error") else
             read_history(os.path.join(folder, "metrics.csv")))
  if "step" in history:
    history["step"] = history["step"].astype(np.int64)
  return PointResult(point.index, dict(point.values), point.seed,
                     saved["summary"], history, folder, point.config)


def _write_csv(path: str, columns: dict) -> None:
  # Whole, then renamed over the old table: a study killed while it writes
  # its tables (they are rewritten each time it runs) leaves each one as it
  # was or complete, never cut short.
  telemetry.kill_point("table")
  names = list(columns)
  rows = len(next(iter(columns.values()), []))
  write_csv(path, names, [{k: _plain(columns[k][r]) for k in names}
                                    for r in range(rows)])


def _plain(value):
  if isinstance(value, np.generic):
    return value.item()
  if isinstance(value, float) and math.isnan(value):
    return None
  return value


def points_table(study) -> dict[str, list]:
  cols = {"point": [], "seed": [], **{n: [] for n in study.names},
          **{k: [] for k in study.final_keys()}, "error": []}
  for p in study.points:
    cols["point"].append(p.index)
    cols["seed"].append(p.seed)
    for n in study.names:
      cols[n].append(p.values.get(n))
    for k in study.final_keys():
      cols[k].append(p.summary.get(k))
    cols["error"].append(p.summary.get("error"))
  return cols


def write_tables(study, out: str) -> None:
  """study.csv, final.csv and points.csv (and Parquet copies of the first
  two when pyarrow is installed); the summary into study.json."""
  tidy, final = study.table(frame=False), study.final(frame=False)
  _write_csv(os.path.join(out, "study.csv"), tidy)
  _write_csv(os.path.join(out, "final.csv"), final)
  _write_csv(os.path.join(out, "points.csv"), points_table(study))
  _parquet(out, {"study": tidy, "final": final})
  path = os.path.join(out, STUDY)
  with open(path) as f:
    record = json.load(f)
  record["summary"] = _jsonable(study.summary)
  record["names"] = list(study.names)
  write_json(path, record)


def _parquet(out: str, tables: dict) -> None:
  try:
    import pandas as pd
    import pyarrow  # noqa: F401  (pandas' Parquet engine)
  except ImportError:
    return
  for name, columns in tables.items():
    telemetry.kill_point("table")
    data = io.BytesIO()
    pd.DataFrame({k: list(v) for k, v in columns.items()}).to_parquet(
        data, index=False)
    write_bytes(os.path.join(out, f"{name}.parquet"),
                          data.getvalue())
