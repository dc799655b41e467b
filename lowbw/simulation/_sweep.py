"""``lowbw.sweep``: a grid of traced values and seeds as one more vmapped axis.

S points (the product of the grid's values, times the seeds) run as a leading
axis over the whole simulator state: the compiled chunk is ``vmap``-ped over
points, so S x W workers train in one program. Points differ only in traced
values (learning rates, momentum, network numbers) and seeds; what sets a
shape is the ``Simulator``'s. ``points_per_batch`` says how many points one
program computes (the last batch padded, so one program serves all); with 1,
points run one after another on the single-run program (the CPU default).
"""

import dataclasses
import itertools
import math
import os
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from lowbw import _validate
from lowbw.telemetry import _progress, _writers
from lowbw.config import _settings as _config
from lowbw.simulation import _hparams, _logdir
from lowbw.simulation._loop import Drive, drive
from lowbw.simulation._simulator import Simulator
from lowbw.simulation._track import Track
from lowbw.telemetry import _metrics as names


@dataclasses.dataclass
class SweepPoint:
  """One point of a sweep, like a ``Result``.

  Attributes:
    values: the swept names and this point's values, e.g.
      ``{"inner_lr": 3e-3}``.
    seed: this point's seed.
    history: metric name -> numpy array over logged rows.
    params: the point's global parameters.
    summary: final figures (``error`` holds a non-finite loss's message).
    log_dir: this point's log folder, or None.
  """

  values: dict[str, Any]
  seed: int
  history: dict[str, np.ndarray]
  params: Any
  summary: dict[str, Any]
  log_dir: str | None = None


@dataclasses.dataclass
class SweepResult:
  """What ``lowbw.sweep`` returns.

  Attributes:
    points: one ``SweepPoint`` per (values, seed), values-major.
    names: the swept hyperparameter names.
    seeds: the seeds.
    summary: compile and wall seconds of the whole sweep, points per batch.
  """

  points: list[SweepPoint]
  names: list[str]
  seeds: list[int]
  summary: dict[str, Any]

  def table(self) -> dict[str, np.ndarray]:
    """The tidy table: one row per point and logged step, with columns
    ``point``, ``seed``, the swept names, then every logged metric."""
    keys: list[str] = []
    for p in self.points:
      keys += [k for k in p.history if k not in keys]
    cols: dict[str, list] = {"point": [], "seed": [],
                             **{n: [] for n in self.names},
                             **{k: [] for k in keys}}
    for i, p in enumerate(self.points):
      rows = len(next(iter(p.history.values()), []))
      cols["point"] += [i] * rows
      cols["seed"] += [p.seed] * rows
      for n in self.names:
        cols[n] += [p.values[n]] * rows
      for k in keys:
        cols[k] += list(p.history.get(k, np.full(rows, np.nan)))
    return {k: np.asarray(v) for k, v in cols.items()}

  def aggregate(self, metric: str = "final_eval_loss") -> list[dict]:
    """Mean and standard deviation of a summary figure over seeds, one entry
    per combination of swept values (std with ddof=0; NaN for failed
    points, which are counted in ``failed``)."""
    groups: dict[tuple, list] = {}
    for p in self.points:
      key = tuple(p.values[n] for n in self.names)
      groups.setdefault(key, []).append(p)
    out = []
    for key, pts in groups.items():
      vals = np.asarray([_num(p.summary.get(metric)) for p in pts])
      ok = vals[np.isfinite(vals)]
      out.append({**dict(zip(self.names, key)), "metric": metric,
                  "mean": float(ok.mean()) if ok.size else math.nan,
                  "std": float(ok.std()) if ok.size else math.nan,
                  "n": int(ok.size), "failed": int(vals.size - ok.size),
                  "seeds": [p.seed for p in pts]})
    return out


def _num(v):
  return math.nan if v is None else float(v)


def grid_points(sim: Simulator, grid: dict | None, seeds) -> list[tuple]:
  """``[(values, seed), ...]``, values-major, each validated."""
  grid = _hparams.check_names("grid", grid or {})
  for name, values in grid.items():
    if isinstance(values, (str, bytes)) or not hasattr(values, "__iter__"):
      raise _validate.fail(name, values, "expected a list of values")
    if not list(values):
      raise _validate.fail(name, values, "expected at least one value")
  if isinstance(seeds, (int, np.integer)):
    seeds = [seeds]
  seeds = [_config.check_seed(s) for s in seeds]
  if not seeds:
    raise _validate.fail("seeds", seeds, "expected at least one seed")
  if len(set(seeds)) != len(seeds):
    raise _validate.fail("seeds", seeds, "has a seed twice")
  combos = [dict(zip(grid, vals)) for vals in
            itertools.product(*(list(v) for v in grid.values()))]
  for values in combos:
    sim.check_hparams(values, "grid")
  return [(values, seed) for values in combos for seed in seeds]


def _stack_samplers(samplers: list, seeds: list):
  """The points' shards stacked on a new axis 0; leaves identical for every
  point (the dataset itself) are kept once. Returns (stacked, in_axes)."""
  columns, treedef = zip(*(jax.tree.flatten(t) for t in samplers))
  out, axes = [], []
  for column in zip(*columns):
    first = column[0]
    if any(np.shape(x) != np.shape(first) for x in column):
      raise _validate.fail(
          "seeds", sorted(set(seeds)), "the seeds' data shards have "
          "different shapes (a Dirichlet split differs per seed); sweep "
          "seeds with iid or contiguous sharding, or run each seed on its own")
    if all(x is first for x in column) or all(
        np.array_equal(np.asarray(x), np.asarray(first)) for x in column[1:]):
      out.append(first)
      axes.append(None)
    else:
      out.append(jnp.stack([jnp.asarray(x) for x in column]))
      axes.append(0)
  return treedef[0].unflatten(out), treedef[0].unflatten(axes)


class _Batch:
  """The stacked initial states, data and network numbers of some points."""

  def __init__(self, sim: Simulator, points: list[tuple]):
    runs = [sim.initial(seed, values) for values, seed in points]
    self.networks = [network for *_, network in runs]
    self.state = jax.tree.map(lambda *xs: jnp.stack(xs),
                              *(state for state, *_ in runs))
    self.sampler, self.sampler_axes = _stack_samplers(
        [r[1] for r in runs], [seed for _, seed in points])
    self.net = self.net_axes = None
    if sim.config.network is not None:  # every number per point (small)
      self.net = jax.tree.map(lambda *xs: jnp.stack(xs), *(r[2] for r in runs))
      self.net_axes = jax.tree.map(lambda _: 0, self.net)


def sweep(build_args, grid: dict | None = None, seeds=(0,),
          points_per_batch: int | None = None, out: str | None = None,
          progress: bool | None = None, overwrite: bool = False) -> SweepResult:
  """Runs every point of ``grid`` x ``seeds`` as one vmapped program.

  Args:
    build_args: a ``Simulator`` (``lowbw.build``) or a dict of
      ``lowbw.build`` arguments.
    grid: swept name -> list of values, e.g. ``{"inner_lr": [1e-3, 3e-3],
      "bandwidth": ["100Mbps", "1Gbps"]}``; names are the traced
      hyperparameters (``Simulator.hparam_names``).
    seeds: the seeds every combination runs with.
    points_per_batch: points computed at once, as one vmapped program of
      S x W workers (memory grows with it). Default: all of them that fit
      the build's memory budget on an accelerator, 1 on a CPU, where vmapping points was measured to be no
      faster than running them one after another on one compiled program
      (see ``default_points_per_batch``).
    out: ``out/point_000/...`` per point (metrics.csv, TensorBoard,
      config.json, summary.json), plus ``sweep.csv`` (the tidy table) and
      ``sweep.json`` (points, summaries, mean and std over seeds). The
      sweep holds ``out/.lowbw.lock`` while it writes there: another
      process writing ``out`` is refused, naming it.
    progress: a progress bar (default: on a terminal).
    overwrite: clear what another run or sweep wrote in ``out`` (else
      a folder holding one is refused).

  Point i equals ``Simulator.run(seed=..., hparams=points[i].values)`` to
  float tolerance.

  Raises:
    ValueError: an unknown name, a bad value or seed, naming it.

  Example:
    >>> result = lowbw.sweep(dict(model="mlp", data="digits",
    ...                           strategy=strategies.diloco(H=10), steps=200),
    ...                      grid={"inner_lr": [1e-3, 3e-3]}, seeds=[0, 1, 2])
    >>> result.aggregate("final_eval_loss")
  """
  _hparams.check_names("grid", grid or {})  # before anything compiles
  # One writer per folder (``OUT/.lowbw.lock``), until this sweep stops.
  lock = _logdir.prepare(out, overwrite=overwrite,
                         create=jax.process_index() == 0, lock=True)
  try:
    return _swept(build_args, grid, seeds, points_per_batch, out, progress)
  finally:
    if lock is not None:
      lock.release()


def _swept(build_args, grid, seeds, points_per_batch, out,
           progress) -> SweepResult:
  """``sweep`` once its folder is checked and held."""
  sim = build_args if isinstance(build_args, Simulator) else (
      _build(build_args))
  _no_lanes(sim)
  sim = _on_one_device(sim)
  c = sim.config
  if c.devices > 1 or sim.processes > 1:
    raise _validate.fail("devices", c.devices, "a sweep runs on one device "
                         "for now (its points are the vmapped axis)")
  points = grid_points(sim, grid, seeds)
  size = _validate.optional_positive_int("points_per_batch",
                                         points_per_batch)
  if size is None:
    size = default_points_per_batch(len(points), sim.memory)
  size = min(size, len(points))
  show = _progress.is_terminal() if progress is None else progress
  compile_before = sim.take_compile_s()
  start = time.perf_counter()
  results: list[SweepPoint] = []
  batches = math.ceil(len(points) / size)
  for b in range(batches):
    chunk = points[b * size:(b + 1) * size]
    padded = chunk + [chunk[-1]] * (size - len(chunk))
    bar = (_progress.ProgressBar(c.steps, desc=f"sweep {b + 1}/{batches}")
           if show else None)
    try:
      dirs = [os.path.join(out, f"point_{b * size + i:03d}")
              if out and i < len(chunk) else None
              for i in range(len(padded))]
      results += run_batch(sim, padded, dirs, bar=bar)[:len(chunk)]
    finally:
      if bar:
        bar.close()
  wall = time.perf_counter() - start
  grid_names = list((grid or {}).keys())
  result = SweepResult(results, grid_names,
                       sorted({s for _, s in points}, key=list(
                           dict.fromkeys(s for _, s in points)).index),
                       {"points": len(points), "points_per_batch": size,
                        "compile_s": compile_before + sim.take_compile_s(),
                        "wall_time_s": wall, "log_dir": out})
  if out:
    _write(result, out)
  return result


def default_points_per_batch(points: int, memory=None) -> int:
  """Every point at once on an accelerator, as many as fit the run's memory
  budget (``memory``: the simulator's ``_memory.Plan``; each point holds a
  state, in-flight workers and the evaluation of its own); one at a time
  on a CPU.

  Measured on a 2-core CPU (benchmarks/sweep_throughput.py, docs/
  performance.md): vmapping 8 points ran no faster than running them one
  after another (digits MLP: 1.15x; default GPT: slower) and compiled for
  longer, while one at a time reuses the single-run program.
  """
  if jax.default_backend() == "cpu":
    return 1
  if memory is None or memory.budget is None:
    return points
  per_point = memory.estimate_bytes - memory.data_bytes
  room = memory.budget.bytes - memory.data_bytes
  return max(1, min(points, int(room // max(per_point, 1.0))))


def _on_one_device(sim: Simulator) -> Simulator:
  """``sim`` on one device, if lowbw spread its workers over CPU devices by
  default (``devices`` not given): a sweep's points are its vmapped axis."""
  c = sim.config
  if not c.auto_devices:
    return sim
  worker_batch = c.worker_batch
  if worker_batch in (None, c.workers // c.devices):
    worker_batch = "auto"
  return Simulator(dataclasses.replace(c, devices=1, auto_devices=False,
                                       worker_batch=worker_batch),
                   compile=False)


def _build(args) -> Simulator:
  if not isinstance(args, dict):
    raise _validate.fail("build_args", type(args).__name__,
                         "expected a lowbw.Simulator or a dict of "
                         "lowbw.build arguments")
  # The sweep compiles its own (vmapped) programs; the single-run ones are
  # compiled only if the simulator is also run on its own.
  from lowbw.simulation._api import build  # _api imports the engine
  return build(**{"compile": False, **args})


def _no_lanes(sim) -> None:
  """Counterfactual lanes are a single run's (``Simulator.run``)."""
  if sim.lanes:
    raise _validate.fail("lanes", [name for name, _, _ in sim.lanes],
                         "a sweep's points share one program of one run; "
                         "run each point with lanes on its own "
                         "(Simulator.run, or lowbw.study)")


def run_batch(sim, points: list, dirs: list, texts: list | None = None,
              bar=None, prices: list | None = None) -> list[SweepPoint]:
  """``points`` (``(hparams, seed)`` pairs) run as one program: vmapped over
  the points, or the single-run program for one point.

  Args:
    sim: the build every point runs on.
    points: each point's traced values and seed (a batch padded with
      repeats, so that one program serves every batch, gives the repeats
      ``None`` folders).
    dirs: each point's log folder, or None.
    texts: each point's ``config.yaml`` text (a ``lowbw.Config``), or None.
    bar: a progress bar over steps.
    prices: each point's ``(gpu_price, egress_price)`` (``Track.prices``),
      or None: not priced.

  Returns:
    One ``SweepPoint`` per point (a point whose loss became non-finite has
    its error in ``summary["error"]``).
  """
  _no_lanes(sim)
  if len(points) == 1:  # the single-run program, shared with Simulator.run
    (values, seed), = points
    state, sampler, net, network = sim.initial(seed, values)
    exe, state = sim.executables(state, sampler, net)
    networks, batched = [network], False
  else:
    batch = _Batch(sim, points)
    state, sampler, net, networks = (batch.state, batch.sampler, batch.net,
                                     batch.networks)
    exe, state = sim.executables(
        state, sampler, net,
        jitted=sim.jit_points(batch.sampler_axes, batch.net_axes),
        key=("sweep", str(batch.sampler_axes), str(batch.net_axes)))
    batched = True
  tracks = _tracks(sim, points, networks, dirs, texts or [None] * len(dirs))
  for track, priced in zip(tracks, prices or ()):
    track.prices = priced
  try:
    state, elapsed = drive(sim, exe, state, sampler, net, tracks,
                           Drive(batched=batched, raise_errors=False,
                                 bar=bar))
  finally:
    for t in tracks:
      t.close()
  params_S = exe.global_params(state)
  if not batched:
    params_S = jax.tree.map(lambda x: x[None], params_S)
  # The batch's compiling goes to its first point (as a build's first run
  # reports it); its loop's wall time is shared by its points (each
  # point's ``wall_time_s`` a 1/S share, so that the points' sum is the
  # loop's time; a padded batch's repeats take their shares).
  compile_s, share = sim.take_compile_s(), elapsed / len(points)
  out = []
  for i, ((values, seed), track) in enumerate(zip(points, tracks)):
    summary = track.summary(0.0 if i else compile_s, share)
    if batched:
      summary["batch"] = {"points": len(points), "wall_time_s": elapsed}
    summary["seed"], summary["values"] = seed, _hparams.jsonable(values)
    track.write_summary(summary)
    out.append(SweepPoint(dict(values), seed, track.history.as_arrays(),
                          jax.tree.map(lambda x, i=i: x[i], params_S),
                          summary, track.log_dir))
  return out


def _tracks(sim, points, networks, dirs, texts) -> list[Track]:
  """One open ``Track`` per point, its folder holding its ``config.yaml``
  when given."""
  tracks = []
  for (values, seed), network, folder, text in zip(points, networks, dirs,
                                                   texts):
    if folder and text is not None:
      os.makedirs(folder, exist_ok=True)
      _writers.write_text(os.path.join(folder, "config.yaml"), text)
    track = Track(sim, sim.config.default_log_every, network, folder,
                  config=sim.describe(seed, network, values))
    track.open_writers()
    tracks.append(track)
  return tracks


def _write(result: SweepResult, log_dir: str) -> None:
  os.makedirs(log_dir, exist_ok=True)
  table = result.table()
  columns = list(table)
  writer = _writers.CSVWriter(os.path.join(log_dir, "sweep.csv"), columns)
  for r in range(len(table["point"])):
    writer.write({k: table[k][r].item() for k in columns})
  writer.close()
  metric = names.EVAL_LOSS
  _writers.write_json(os.path.join(log_dir, "sweep.json"), {
      "names": result.names, "seeds": result.seeds,
      "summary": result.summary,
      "points": [{"values": _hparams.jsonable(p.values), "seed": p.seed,
                  "summary": p.summary} for p in result.points],
      "aggregate": result.aggregate("final_" + metric)})
