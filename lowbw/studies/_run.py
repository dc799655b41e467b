"""``lowbw.study``: every point of a grid over any ``Config`` field, one
compiled program per shape, resumable."""

import json
import os
import shutil
import sys
import time
from collections.abc import Callable

import numpy as np
from tqdm.auto import tqdm

from lowbw import _validate
from lowbw.telemetry import _cost, _progress
from lowbw.config import Config, _fields
from lowbw.simulation import _ledger, _logdir, _sweep, retime
from lowbw.simulation._api import (build_config, engine_config, run_config,
                                  yaml_or_none)
from lowbw.simulation import DivergenceError, NonFiniteLossError
from lowbw.studies import _claims, _exec, _files, _grid
from lowbw.studies._result import PointResult, Study, shared_rates


def study(base, grid, seeds=(0,), out: str | None = None,
          progress: bool | None = None, overwrite: bool = False,
          on_point: Callable[[PointResult], None] | None = None,
          plots: bool = True,
          points_per_batch: int | None = None,
          executor: str | None = None,
          executor_options: dict | None = None) -> Study:
  """Runs ``base`` at every point of ``grid`` with every seed.

  Any ``Config`` field may be swept, the strategy itself included. Points
  that compile to the same program (they differ only in traced values
  such as learning rates or bandwidth, and in seeds) share one build;
  compiled programs are also kept in the persistent compilation cache, so
  a study run again in another process compiles nothing it compiled
  before.

  Args:
    base: a ``lowbw.Config`` (or a dict of its fields): what every point
      shares. As a dict it need not be a valid run alone, only with each
      point's values (``{"steps": 20}`` with ``H`` swept over 10 and 20).
    grid: field -> list of values, e.g. ``{"H": [10, 50, 100], "codec":
      ["float32", "quant:4"]}`` (the product of the lists), or a list of
      such dicts for an irregular grid, e.g. ``[{"strategy": ["ddp"]},
      {"strategy": ["diloco"], "H": [10, 100]}]``. A base setting that a
      point's strategy does not use (the base's ``H`` at a DDP point) is
      left out; a grid value it does not use is an error naming the point.
    seeds: the seeds every combination runs with.
    out: the study's folder: ``points/NNNN/`` per point (a run's logs,
      ``config.yaml`` and ``point.json``), ``study.json``, the tables
      (``study.csv``: one row per point and logged step; ``final.csv``:
      mean ± std over seeds per combination) and plots. Started again with
      the same ``out``, grid and seeds, a study skips the points that
      finished and runs the rest.
    progress: a progress bar over points (default: on a terminal).
    overwrite: clear what another study or run wrote in ``out``.
    on_point: called with each ``PointResult`` as it finishes (or is found
      finished).
    plots: draw the plots into ``out`` when matplotlib is installed
      (``Study.plot()`` draws them later).
    points_per_batch: points of one build computed at once, as one more
      vmapped axis (S x W workers in one program; memory grows with it).
      Default: as many as fit the build's memory budget on an accelerator,
      1 on a CPU, where vmapping points was measured to be no faster than
      running them one after another on the single-run program (the same
      rule as ``lowbw.sweep``).
    executor: where the points run: None (this process), ``"local:N"``
      (N worker processes; ``"local"``: one per GPU, or per core on a
      CPU), ``"ray"`` (Ray tasks, one per GPU or CPU of the Ray
      instance; ``pip install 'lowbw[ray]'``) or ``"slurm"`` (Slurm jobs
      through submitit, one per compiled shape; ``pip install
      'lowbw[slurm]'``); ``"ray:N"``, ``"slurm:N"``: each compiled
      shape's points in N tasks or jobs. Each worker runs some points of
      one compiled shape and writes them to ``out`` (needed); each point
      is claimed by the process that runs it (``out/claims``), so
      processes sharing ``out`` run it once. The tables are made here,
      once every point is in, from the points' folders: they are the
      same whichever way the points ran.
    executor_options: submitit's parameters for ``"slurm"`` (e.g.
      ``{"slurm_partition": "gpu", "gpus_per_node": 1, "timeout_min":
      60}``; ``"cluster": "local"`` runs the jobs on this machine).

  Returns:
    A ``Study``: its points, ``table()``, ``final()`` and ``plot()``.

  Raises:
    ConfigError: a bad name, value or point, before anything compiles.
  """
  seeds = _grid.check_seeds(seeds)
  base = _grid.base_values(base)
  chosen = _exec.check(executor, out, executor_options)
  _exec.spare_gpus(chosen)
  points = _grid.expand(base, grid, seeds)
  points_per_batch = _validate.optional_positive_int("points_per_batch",
                                                     points_per_batch)
  names = _files.names(grid)
  groups = _grid.groups(points)
  for group in groups:  # what a build checks with the data, before any runs
    _check_build(group[0])
  done = _files.prepare(out, base, grid, seeds, overwrite)
  _files.check_finished(out, points, done)
  show = _progress.is_terminal() if progress is None else progress
  bar = _bar(len(points), len(done)) if show else None
  # Off a terminal (a log, a notebook) with no progress setting: a line per
  # finished point instead of a bar, so that a long study is not silent.
  lines = (_PointLines(len(points), len(done))
           if progress is None and not show else None)
  results: dict[int, PointResult] = {}
  start = time.perf_counter()

  def emit(result: PointResult, ran: bool) -> None:
    results[result.index] = result
    _report(on_point, result)
    if ran and bar:
      bar.update(1)
    if ran and lines:
      lines.point(result)

  try:
    remote = None if chosen is None else (
        lambda parts: _exec.run(chosen, work, (base, grid, list(seeds), out),
                                parts, points_per_batch, executor_options))
    builds = _run_groups(groups, done, out, points_per_batch, emit, remote)
  finally:
    if bar:
      bar.close()
  # With a folder, each point as its folder holds it, however it ran.
  ordered = [_files.read_point(out, p) if out else results[p.index]
             for p in points]
  summary = {"points": len(points), "groups": len(groups), "builds": builds,
             "resumed": len(done),
             "retimed": sum(1 for r in ordered if r.index not in done
                            and r.summary.get("retimed_from")),
             "wall_time_s": time.perf_counter() - start,
             "compile_s": sum(r.summary.get("compile_s") or 0.0
                              for r in ordered
                              if r.index not in done),
             "out": out}
  note = shared_rates(names, ordered)
  if note:
    summary["shared_rates"] = note
  result = Study(ordered, names, list(_grid.check_seeds(seeds)), base,
                 summary)
  if out:
    _write(result, out, plots)
  return result


def _run_groups(groups: list, done, out: str | None,
                points_per_batch: int | None, emit, remote=None) -> int:
  """Every group's points, one build per group unless a traced value
  cannot be set on it; each result, read back when ``done`` or run, goes
  to ``emit(result, ran)``. A point that differs from another only in
  settings of the clock (``CLOCK_ONLY``) is re-timed from that one's
  ledger instead of trained (``_retimed``). ``remote(parts)`` runs lists
  of points of one group elsewhere (an executor's workers); without it
  they run here. Returns the builds made."""
  finished = {}
  for group in groups:
    for p in group:
      if p.index in done:
        finished[p.index] = _files.read_point(out, p)
        emit(finished[p.index], False)
  points = [p for group in groups for p in group]
  leaders, followers = _leaders(
      points, [p for p in points if p.index not in done], out)
  builds = _phase([[p for p in group if p.index in leaders]
                   for group in groups], points_per_batch, out, finished,
                  emit, remote)
  rest = set()
  for p, leader in followers:
    if out is not None and not _claims.take(
        out, [p.index], lambda i: _done(out, i)):
      continue  # finished, or another process re-times it: ``_settle``
    try:
      r = _retimed(p, finished.get(leader.index), out)
    finally:
      if out is not None:
        _claims.release(out, [p.index])
    if r is None:  # its leader's run cannot be re-timed: train it
      rest.add(p.index)
    else:
      finished[p.index] = r
      emit(r, True)
  builds += _settle([p for p, _ in followers if p.index not in rest], out,
                    points_per_batch, finished, emit)
  return builds + _phase([[p for p in group if p.index in rest]
                          for group in groups], points_per_batch, out,
                         finished, emit, remote)


def _phase(parts: list, points_per_batch: int | None, out: str | None,
           finished: dict, emit, remote) -> int:
  """``parts``' points trained, here or by ``remote``, then each read back
  or, where nobody holds it, run here (``_settle``); returns the builds."""
  parts = [part for part in parts if part]
  if remote is None:
    builds = sum(_train(part, points_per_batch, out, finished, emit)
                 for part in parts)
  else:
    builds = remote(parts)
  return builds + _settle([p for part in parts for p in part], out,
                          points_per_batch, finished, emit)


# Seconds between looks at points that another process is running.
POLL_S = 0.5


def _settle(points: list, out: str | None, points_per_batch: int | None,
            finished: dict, emit) -> int:
  """Waits until each of ``points`` has finished: one that another process
  finished is read back, one that nobody holds (its holder died) runs
  here. Returns the builds made here."""
  builds = 0
  todo = [p for p in points if p.index not in finished]
  while out is not None and todo:
    for p in [p for p in todo if _done(out, p.index)]:
      finished[p.index] = _files.read_point(out, p)
      emit(finished[p.index], True)
    todo = [p for p in todo if p.index not in finished]
    free = [p for p in todo if _claims.holder(out, p.index) is None]
    for group in _grid.groups(free):
      builds += _train(group, points_per_batch, out, finished, emit)
    todo = [p for p in todo if p.index not in finished]
    if todo and not free:
      time.sleep(POLL_S)
  return builds


def _done(out: str, index: int) -> bool:
  return os.path.isfile(os.path.join(_files.point_dir(out, index),
                                     _files.DONE))


def _train(todo: list, points_per_batch: int | None, out: str | None,
           finished: dict, emit) -> int:
  """``todo``'s points run on as few builds as their traced values allow;
  returns the builds made. With ``out``, each batch's points are claimed
  first: those finished or held by another process are left to it."""
  builds = 0
  while todo:
    sim, rep, traced = _build(todo)
    builds += 1
    key = _grid.traced_key(rep.config, traced)
    now = [p for p in todo
           if _grid.traced_key(p.config, traced) == key
           and _settable(sim, _diff(p, rep, traced))]
    todo = [p for p in todo if p not in now]
    size = points_per_batch or _sweep.default_points_per_batch(
        len(now), sim.memory)
    if sim.lanes:  # the lanes' tracks are a single run's (``Simulator.run``)
      size = 1
    for view, part in _by_view(sim, now, traced):
      for first in range(0, len(part), size):
        batch = _claimed(part[first:first + size], out)
        if not batch:
          continue
        try:
          # The view runs its H, density and width: the points' hparams
          # are the others.
          for r in _run_batch(view, batch, rep, out, size):
            finished[r.index] = r
            emit(r, True)
        finally:
          if out is not None:
            _claims.release(out, [p.index for p in batch])
  return builds


def _build(todo: list) -> tuple:
  """``(simulator, the point it was built from, the fields it traces)``:
  one build with a traced H, top-k density and/or quantizer width for
  points of several that ``_grid.groups`` put together (built from the
  largest of each), else the first point's build."""
  fields = ()
  if len(_grid.periods(todo)) > 1 and all(
      _grid.period_traceable(p.config) for p in todo):
    fields += ("H",)
  for name, values in (("density", _grid.densities),
                       ("bits", _grid.bit_widths)):
    if len(values(todo)) > 1 and all(
        name in _grid.traceable(p.config) for p in todo):
      fields += (name,)
  rep = max(todo, key=lambda p: p.config.H) if "H" in fields else todo[0]
  # A refused build (e.g. workers in groups) falls back to fewer traced
  # fields, then to one build per value.
  for traced in dict.fromkeys((fields, *((f,) for f in fields))):
    try:
      return build_config(_largest(rep, todo, traced), compile=False,
                          traced=traced), rep, traced
    except _validate.ConfigError:
      pass
  return build_config(todo[0].config, compile=False), todo[0], ()


# A traced field of the codec -> the point's value of it.
_CODEC_VALUES = {"density": _grid.density, "bits": _grid.bits}


def _largest(rep: _grid.Point, todo: list, traced: tuple):
  """``rep``'s config with the codec of ``todo``'s largest top-k density
  or quantizer width when that is traced (the build's k, or its codes'
  width, is the largest a run takes; a codec has one of the two)."""
  for name, value in _CODEC_VALUES.items():
    if name in traced:
      top = max(todo, key=lambda p: value(p.config))
      return rep.config.replace(codec=top.config.codec)
  return rep.config


def _by_view(sim, points: list, traced: tuple) -> list:
  """``[(simulator, points)]``: with a traced H, density or width, the
  points of each (H, density, bits) on the build as a run of those sees
  it (a vmapped batch shares its host loop, so its points share them)."""
  if not traced:
    return [(sim, points)]

  def own(p):
    return (p.config.H if "H" in traced else None,
            *(value(p.config) if name in traced else None
              for name, value in _CODEC_VALUES.items()))

  return [(sim.at(*v), [p for p in points if own(p) == v])
          for v in dict.fromkeys(map(own, points))]


_POINTS: dict[str, list] = {}


def work(job: tuple) -> int:
  """An executor's unit of work, in a worker (``_exec.run``): the points
  ``job`` names, run as the study's own process runs them (claims, builds,
  vmapped batches); returns the builds made. The study's points are
  expanded once per process."""
  base, grid, seeds, out, indices, points_per_batch = job
  key = repr((base, grid, seeds))
  if key not in _POINTS:
    _POINTS.clear()
    _POINTS[key] = _grid.expand(base, grid, seeds)
  points = {p.index: p for p in _POINTS[key]}
  return _train([points[i] for i in indices], points_per_batch, out, {},
                lambda result, ran: None)


def _claimed(batch: list, out: str | None) -> list:
  """The points of ``batch`` this process now holds (all without
  ``out``)."""
  if out is None:
    return batch
  got = set(_claims.take(out, [p.index for p in batch],
                         lambda i: _done(out, i)))
  return [p for p in batch if p.index in got]


# The settings that change only a run's clock, never its training nor its
# bytes (the fields say which): a point differing from another only in
# these is re-timed.
CLOCK_ONLY = frozenset(f.name for f in _fields.RUN_FIELDS if f.clock_only)


def _leaders(points: list, todo: list, out: str | None) -> tuple:
  """(the indices of ``todo``'s points to train, [(point, the point whose
  run it is re-timed from)]): the first point of every training (the same
  seed and values but ``CLOCK_ONLY``'s) leads it. Without ``out`` (no
  ledgers) every point trains."""
  if out is None:
    return {p.index for p in todo}, []

  def training(p):
    return p.seed, _grid.describe({k: v for k, v in p.values.items()
                                   if k not in CLOCK_ONLY})
  first: dict = {}
  for p in points:
    first.setdefault(training(p), p)
  lead = [(p, first[training(p)]) for p in todo]
  return ({p.index for p, q in lead if q is p},
          [(p, q) for p, q in lead if q is not p])


def _stage_links(pipeline) -> dict:
  """A point's stage links for ``retime`` (free ones as ``math.inf``);
  none for a point without stages, or whose links follow a trace (then
  ``retime`` refuses a source whose links did, and the point trains)."""
  if pipeline is None or pipeline.bandwidth_trace:
    return {}
  return {"stage_bandwidth": pipeline.bandwidth,
          "stage_latency": pipeline.latency}


def _retimed(point: _grid.Point, source: PointResult | None,
             out: str) -> PointResult | None:
  """``point`` as ``source``'s run re-timed on ``point``'s network (its
  folder: the run's metrics with the re-timed ``sim_time_s``, its summary
  with the clock's and prices' figures replaced and ``retimed_from``); None
  when ``source`` failed or its run cannot be re-timed (its training
  followed its clock), or when the point has counterfactual lanes (their
  clocks, costs and goodput are not re-timed: the point trains)."""
  if (source is None or source.summary.get("error") or not source.log_dir
      or point.config.lanes):
    return None
  c, start = point.config, time.perf_counter()
  try:
    built = engine_config(c)
    r = retime(source.log_dir, built.network, **_stage_links(built.pipeline))
  except _validate.ConfigError:
    return None
  folder = _files.point_dir(out, point.index)
  _logdir.prepare(folder, overwrite=True)
  history = {k: np.array(v) for k, v in source.history.items()}
  if "sim_time_s" in history:
    at = dict(zip(r["history"]["step"].tolist(),
                  r["history"]["sim_time_s"].tolist()))
    history["sim_time_s"] = np.asarray([at.get(int(s), np.nan)
                                        for s in history["step"]])
  total = r["compute_s"] + r["comm_s"]
  summary = {**source.summary, "sim_time_s": r["sim_time_s"],
             "compute_s": r["compute_s"], "comm_s": r["comm_s"],
             "comm_share": r["comm_s"] / total if total > 0 else None,
             "retimed_from": os.path.relpath(source.log_dir, folder),
             "log_dir": folder,
             # What this point cost: re-timing, not training.
             "wall_time_s": time.perf_counter() - start, "compile_s": 0.0,
             "steps_per_s": None, "examples_per_s": None}
  summary.update(_cost.of_summary(summary, c.gpu_price, c.egress_price))
  for name in (_ledger.FILE, "params.npz"):
    src = os.path.join(source.log_dir, name)
    if os.path.isfile(src):
      shutil.copyfile(src, os.path.join(folder, name))
  with open(os.path.join(source.log_dir, "config.json")) as f:
    record = json.load(f)
  _files.write_json(os.path.join(folder, "config.json"),
                    {**record, "network": r["network"]})
  _files.write_history(os.path.join(folder, "metrics.csv"), history)
  _files.write_json(os.path.join(folder, "summary.json"), summary)
  text = yaml_or_none(c.replace(out=folder))
  if text:
    with open(os.path.join(folder, "config.yaml"), "w") as f:
      f.write(text)
  result = PointResult(point.index, dict(point.values), point.seed, summary,
                       history, folder, c)
  _files.write_point(result)
  return result


def _write(result: Study, out: str, plots: bool) -> None:
  """The study's tables, and its plots when asked and matplotlib is
  installed (their paths in the summary)."""
  _files.write_tables(result, out)
  if plots:
    try:
      result.summary["plots"] = result.plot()
    except ModuleNotFoundError:  # matplotlib is optional
      result.summary["plots"] = []


def _check_build(point: _grid.Point) -> None:
  """The build's checks of ``point`` that need its data and model (enough
  examples for the workers, a model for the data's task), without tracing
  or compiling; an error names the grid point."""
  try:
    engine_config(point.config)
  except _validate.ConfigError as e:
    raise _validate.fail(e.field, e.value, f"{e.allowed} (at grid point "
                         f"{_grid.describe(point.values)})") from None


def _bar(total: int, done: int):
  return tqdm(total=total, initial=done, desc="study", unit="point",
              file=sys.stderr, dynamic_ncols=True)


class _PointLines:
  """A line on stdout per finished point: how many are done, the point's
  values and seed, its final loss and the seconds since the study began."""

  def __init__(self, total: int, done: int):
    self.total, self.done = total, done
    self.start = time.perf_counter()

  def point(self, result: PointResult) -> None:
    self.done += 1
    s = result.summary
    loss = s.get("final_eval_loss", s.get("final_train_loss"))
    said = (f"error: {s['error']}" if s.get("error") else
            "" if loss is None else f"final loss {loss:.4f}")
    print(f"study: point {self.done}/{self.total} done "
          f"({_grid.describe(result.values)}, seed {result.seed}) "
          f"{said}, {time.perf_counter() - self.start:.0f} s".rstrip(),
          flush=True)


def _report(on_point, result: PointResult) -> None:
  if on_point is not None:
    on_point(result)


def _diff(point: _grid.Point, rep: _grid.Point, traced: tuple = ()
          ) -> dict:
  """The point's traced values that differ from those ``rep``'s build
  holds: the ``hparams`` that make one into the other (and its H, top-k
  density or quantizer width, on a build with those traced)."""
  mine, built = _grid.hparams(point), _grid.hparams(rep)
  out = {k: v for k, v in mine.items() if built.get(k) != v}
  if "H" in traced:
    out["H"] = point.config.H
  for name, value in _CODEC_VALUES.items():
    if name in traced:
      out[name] = value(point.config)
  return out


def _settable(sim, values: dict) -> bool:
  """Whether ``sim`` takes ``values`` as traced values (an SGD inner
  optimizer without momentum has none to set, for one)."""
  try:
    sim.check_hparams(values)
  except _validate.ConfigError:
    return False
  return True


def _run_batch(sim, batch: list, rep: _grid.Point, out: str | None,
               size: int) -> list[PointResult]:
  """Points of one build: one at a time on the single-run program, or
  ``size`` at once (the last batch padded with repeats) as one vmapped
  program."""
  if size == 1:
    return [_run_point(sim, p, out, _diff(p, rep)) for p in batch]
  padded = batch + [batch[-1]] * (size - len(batch))
  dirs = [_files.point_dir(out, p.index) for p in batch]
  for folder in filter(None, dirs):
    _logdir.prepare(folder, overwrite=True)
  texts = [yaml_or_none(p.config.replace(out=d)) for p, d in zip(batch, dirs)]
  pad = [None] * (size - len(batch))
  # The batch's program is shared; each point's prices are its own.
  prices = [(p.config.gpu_price, p.config.egress_price) for p in padded]
  swept = _sweep.run_batch(
      sim, [(_diff(p, rep), p.seed) for p in padded], dirs + pad,
      texts + pad, prices=prices)
  results = []
  for p, folder, point in zip(batch, dirs, swept):
    summary = dict(point.summary)
    error = _batch_error(summary, p.config)
    if error:
      summary["error"] = error
    results.append(PointResult(p.index, dict(p.values), p.seed, summary,
                               {} if error else point.history, folder,
                               p.config))
    if out:
      _files.write_point(results[-1])
  return results


def _batch_error(summary: dict, config: Config) -> str | None:
  """What a single run would have raised: a non-finite loss, or a
  divergence under ``fail_on_divergence`` (first line)."""
  if summary.get("error"):
    return str(summary["error"]).splitlines()[0]
  if config.fail_on_divergence and summary.get("diverged_at_step") is not None:
    return next(w for w in summary["warnings"] if "diverged" in w)
  return None


def _run_point(sim, point: _grid.Point, out: str | None,
               hparams: dict) -> PointResult:
  """One point on its group's build, its own traced values as
  ``hparams``."""
  folder = _files.point_dir(out, point.index)
  config = point.config.replace(out=folder)
  error = None
  try:
    result = run_config(sim, config, hparams=hparams, overwrite=True,
                        progress=False)
    history, summary = result.history, result.summary
  except (NonFiniteLossError, DivergenceError) as e:
    error = str(e).splitlines()[0]
    history, summary = {}, dict(getattr(e, "summary", None) or {})
  summary = {**summary, "error": error} if error else summary
  res = PointResult(point.index, dict(point.values), point.seed, summary,
                    history, folder, point.config)
  if out:
    _files.write_point(res)
  return res



def load(out: str) -> Study:
  """The study in folder ``out`` as it stands: its finished points (a
  study still running, or killed, has fewer than its grid), each with the
  values and seed its own record stores (not the grid enumerated again:
  ``study.json`` keeps the grid with its fields sorted)."""
  record = _files.read_record(out)
  spec = record["spec"]
  base = spec["base"]
  points = _grid.expand(base, spec["grid"], spec["seeds"])
  names = record.get("names") or _files.names(spec["grid"])
  results = [_files.read_point(out, _files.recorded_point(out, base, i, names))
             for i in sorted(_files.finished(out))]
  summary = {"points": len(points), "groups": len(_grid.groups(points)),
             "builds": 0, "resumed": len(results), "wall_time_s": 0.0,
             "compile_s": 0.0, **record.get("summary", {}), "out": out}
  return Study(results, names, list(spec["seeds"]), base, summary)
