"""Counterfactual lanes (``lanes``): copies of the run, each with one cause
removed or changed, stepped in the run's own compiled program.

Each lane is a ``Simulator`` of its own ``RunConfig`` (the run's config with
the lane's change, resolved the normal way: ``config._lanes``), built
without compiling: its engine, its inputs, its clock, its output schema.
This module composes them with the run's:

- ``combine``: one set of programs over the tuple of the run's and the
  lanes' states (the run first). A chunk runs the run's rounds and then
  each lane's, on its own state, sampler and network numbers, in one
  compiled call; nothing in the engine knows about lanes.
- ``initial``: each lane's initial state from the same seed and traced
  values, so every lane starts from the same parameters, draws the same
  batches (the same data key, shards and steps) and the same loss and
  strategy keys as the run.
- ``Laned``: the run's ``Track`` with a ``Track`` per lane: each lane's
  rows (its own simulated clock) are read first, and its ``eval_loss``,
  ``train_loss`` and ``sim_time_s`` are copied into the run's row of the
  same step as ``lane/<name>/<metric>``; the summary adds each lane's
  final figures and the cause's cost (the run's minus the lane's).
"""

import functools
import math

from lowbw import _validate
from lowbw.simulation._engine import Programs
from lowbw.simulation._history import NonFiniteLossError
from lowbw.simulation._track import Track
from lowbw.telemetry import _metrics as names

FIELD = "lanes"
# The run's columns each lane logs under its own name.
COLUMNS = (names.TRAIN_LOSS, names.EVAL_LOSS, names.SIM_TIME_S)


# -------------------------------------------------------------- programs
def ratio(config, lane) -> int:
  """The lane's rounds per round of the run: 1, or H for a lane of
  one-step rounds (DDP beside a run of H steps per round)."""
  return config.period // lane.period


def combine(programs: list, ratios: list, tail_steps: int):
  """The run's ``Programs`` and its lanes' as one ``Programs`` over tuples
  (states, samplers, network numbers; the run first). A lane of one-step
  rounds runs ``ratio`` rounds per round of the run, and the run's tail
  as rounds."""
  steps = tuple(functools.partial(_rounds, p.chunk, r) for p, r in
                zip(programs, ratios))
  tails = tuple(p.tail if r == 1 else functools.partial(
      _as_tail, p.chunk, tail_steps) for p, r in zip(programs, ratios))
  return Programs(
      chunk=functools.partial(_chunk, steps),
      tail=None if not tail_steps else functools.partial(_tail, tails),
      evaluate=functools.partial(_evaluate,
                                 tuple(p.evaluate for p in programs)),
      global_params=functools.partial(_global_params,
                                      programs[0].global_params))


def _rounds(chunk, ratio, sim, sampler, n_rounds, net):
  return chunk(sim, sampler, n_rounds * ratio, net)


def _as_tail(chunk, tail_steps, sim, sampler, net):
  return chunk(sim, sampler, tail_steps, net)


def _chunk(chunks, sims, samplers, n_rounds, nets):
  outs = [chunk(sim, sampler, n_rounds, net) for chunk, sim, sampler, net
          in zip(chunks, sims, samplers, nets)]
  return tuple(o[0] for o in outs), tuple(o[1] for o in outs)


def _tail(tails, sims, samplers, nets):
  outs = [tail(sim, sampler, net) for tail, sim, sampler, net
          in zip(tails, sims, samplers, nets)]
  return tuple(o[0] for o in outs), tuple(o[1] for o in outs)


def _evaluate(evaluations, sims, eval_batches):
  return tuple(ev(sim, eval_batches) for ev, sim in zip(evaluations, sims))


def _global_params(global_params, sims):
  return global_params(sims[0])


# ---------------------------------------------------------------- inputs
def check(config, lanes) -> None:
  """Lanes run on one device of one process, each with the run's period
  (or rounds of one step: DDP) and chunks of as many steps (one chunk
  program steps them all)."""
  if not lanes:
    return
  lane_names = [name for name, _, _ in lanes]
  if config.devices > 1:
    raise _validate.fail(FIELD, lane_names, f"lanes run on one device; the "
                         f"run asks for devices={config.devices} (give "
                         "devices=1)")
  for name, lane, _ in lanes:
    r = ratio(config, lane)
    if lane.period not in (1, config.period) or (
        lane.rounds_per_chunk != config.rounds_per_chunk * r):
      raise _validate.fail(FIELD, name, f"its rounds of {lane.period} steps "
                           f"({lane.rounds_per_chunk} per chunk) do not "
                           f"run beside the run's of {config.period} "
                           f"({config.rounds_per_chunk} per chunk)")


def lane_hparams(hparams: dict | None, changed: tuple) -> dict:
  """The run's traced values a lane takes: all but those of the settings
  the lane changed (a no_faults lane keeps no drop_prob)."""
  return {k: v for k, v in (hparams or {}).items() if k not in changed}


def shares_data(config, lane) -> bool:
  """The lane's training shards and evaluation batches are the run's own
  arrays: the same dataset object, sharded over as many workers with the
  same batch size (``DataSource.build`` is a function of the dataset, W,
  b and the seed), evaluated on as many examples. Every lane of a config
  is (``config._lanes`` changes none of these); a lane that were not would
  keep copies of its own, counted by the memory plan."""
  return (lane.data is config.data and lane.workers == config.workers
          and lane.batch_size == config.batch_size
          and lane.eval_examples == config.eval_examples)


def initial(run_inputs, lanes, seed, hparams, init_from):
  """``(states, samplers, nets, network)``: the run's inputs and every
  lane's, from the same seed (``network``: the run's). A lane whose data
  are the run's (``shares_data``) takes the run's sampler, not a device
  copy of the same arrays."""
  run = run_inputs.initial(seed, hparams, init_from)
  parts = [run] + [
      sim.inputs.initial(seed, lane_hparams(hparams, changed), init_from,
                         run[1] if shares_data(run_inputs.config, sim.config)
                         else None)
      for _, sim, changed in lanes]
  states, samplers, nets, networks = zip(*parts)
  return states, samplers, nets, networks[0]


# ------------------------------------------------------------------ rows
def metric(lane: str, name: str) -> str:
  """A lane's column: ``lane/<lane>/<name>``."""
  return f"lane/{lane}/{name}"


def columns(lanes, run_columns: list) -> list[str]:
  """The lanes' columns of metrics.csv (those the run logs)."""
  return [metric(name, col) for name, _, _ in lanes for col in COLUMNS
          if col in run_columns]


def track(run_track: Track, lanes, hparams) -> "Laned | Track":
  """``run_track`` with a ``Track`` per lane (no files of their own)."""
  if not lanes:
    return run_track
  log_every = run_track.history.log_every
  config = run_track.sim.config
  return Laned(run_track, tuple(
      (name, Track(sim, log_every,
                   sim.check_hparams(lane_hparams(hparams, changed))[1],
                   None), ratio(config, sim.config))
      for name, sim, changed in lanes))


class Laned:
  """The run's ``Track`` and its lanes': ``consume`` and ``finalize`` read
  a chunk's tuple of outputs (the run's first), the lanes' before the
  run's, whose rows then carry the lanes' values; everything else is the
  run's track's."""

  def __init__(self, run: Track, lanes: tuple):
    object.__setattr__(self, "run", run)
    object.__setattr__(self, "lanes", lanes)
    run.adders.append(self._add_columns)

  def __getattr__(self, name):
    return getattr(self.run, name)

  def __setattr__(self, name, value):
    setattr(self.run, name, value)

  def consume(self, kind, n, out, ev, end_step, wall, last_step):
    for k, (_, lane, r) in enumerate(self.lanes, 1):
      # A lane of one-step rounds ran r rounds per round, and the tail's
      # steps as rounds.
      mine = (kind, n) if r == 1 else (
          "rounds", n * r if kind == "rounds" else n)
      try:
        lane.consume(*mine, out[k], None if ev is None else ev[k],
                     end_step, wall, last_step)
      except NonFiniteLossError:
        pass  # kept in the lane's ``error``; its columns stop there
    return self.run.consume(kind, n, out[0], None if ev is None else ev[0],
                            end_step, wall, last_step)

  def finalize(self, steps, wall, final_eval) -> None:
    for k, (_, lane, _) in enumerate(self.lanes, 1):
      lane.finalize(steps, wall, lambda k=k: final_eval()[k])
    self.run.finalize(steps, wall, lambda: final_eval()[0])

  def _add_columns(self, row: dict) -> None:
    step = row[names.STEP]
    for name, lane, _ in self.lanes:
      mine = next((r for r in reversed(lane.history.rows)
                   if r[names.STEP] == step), None)
      for col in COLUMNS:
        if mine is not None and col in mine:
          row[metric(name, col)] = mine[col]

  def summary(self, compile_s: float, elapsed: float) -> dict:
    out = self.run.summary(compile_s, elapsed)
    for name, lane, _ in self.lanes:
      out.update(costs(name, out, lane.summary(compile_s, elapsed)))
    return out


def costs(name: str, run: dict, lane: dict) -> dict:
  """A lane's summary figures: its final eval loss, simulated time and
  goodput, and the cause's cost: the run's minus the lane's (positive: the
  cause made the run worse or slower; a goodput cost is negative when the
  cause wasted the fleet's time)."""
  if lane.get("error"):  # its figures stop where it failed: no costs
    return {metric(name, "error"): lane["error"]}

  def diff(key):
    a, b = run.get(key), lane.get(key)
    return None if a is None or b is None else a - b

  out = {metric(name, "final_eval_loss"): lane.get("final_eval_loss"),
         metric(name, "sim_time_s"): lane.get("sim_time_s"),
         metric(name, "goodput"): lane.get("goodput"),
         metric(name, "loss_cost"): diff("final_eval_loss"),
         metric(name, "time_cost_s"): diff("sim_time_s"),
         metric(name, "goodput_cost"): diff("goodput")}
  # Without a clock a lane has no time.
  return {k: v for k, v in out.items()
          if v is not None and not (isinstance(v, float) and math.isnan(v))}
