"""Throughput and memory of the simulator against a single-replica baseline.

``measure`` times the compiled round program of a real run (every worker's H
inner steps with per-worker sampling, loss and byte bookkeeping, the
strategy's sync) and, in the same process and interleaved with it, a plain
jitted optax loop training ONE model on batch W·b: the machine's best case for
the same FLOPs. The figures are medians over repeats, after warm-up calls;
compilation is timed separately. ``lowbw bench`` runs one ``measure`` per
worker count, each in a fresh process so that peak memory is that
configuration's own. ``measure_lanes`` times a run with 0, 1, ... of its
counterfactual lanes against each other, interleaved, and reads the
state's bytes from the tuple of states (``lowbw bench --lane``).
"""

import os
import resource
import statistics
import time
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import PartitionSpec

from lowbw import _validate
from lowbw.simulation import build
from lowbw.simulation import _backward, _engine, _mesh, _precision


def _proc_status(field: str) -> int | None:
  """A /proc/self/status size in bytes (VmRSS, VmHWM), None off Linux."""
  try:
    with open("/proc/self/status") as f:
      for line in f:
        if line.startswith(field + ":"):
          return int(line.split()[1]) * 1024
  except OSError:
    return None
  return None


def _reset_peak() -> bool:
  """Starts a new peak-RSS window (Linux ``clear_refs``)."""
  try:
    with open("/proc/self/clear_refs", "w") as f:
      f.write("5")
    return True
  except OSError:
    return False


class _Memory:
  """Peak memory of what runs after ``start``: the device's allocator
  statistics where it keeps them (GPU), else the process's resident set."""

  def __init__(self):
    stats = jax.local_devices()[0].memory_stats()
    self.device = bool(stats and "peak_bytes_in_use" in stats)
    if self.device:
      self.source = f"{jax.local_devices()[0].device_kind} allocator"
      self.base = stats["bytes_in_use"]
    else:
      self.source = "process RSS"
      self.base = _proc_status("VmRSS") or 0
      if not _reset_peak():
        self.source = "process RSS (peak since start)"

  def built(self) -> None:
    """The run's state and data are allocated."""
    self.after_build = self.base if self.device else _proc_status("VmRSS") or 0

  def after_compile(self) -> None:
    """Leaves the compiler's memory out: the run's memory is what building
    it allocated plus how far running it rises above the compiled state."""
    if not self.device:
      self.compiled = _proc_status("VmRSS") or 0
      _reset_peak()

  def used(self, peak: int) -> int:
    if self.device:
      return peak - self.base
    return (self.after_build - self.base) + (peak - self.compiled)

  def peak(self) -> int:
    if self.device:
      return jax.local_devices()[0].memory_stats()["peak_bytes_in_use"]
    peak = _proc_status("VmHWM")
    if peak is None:
      peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return peak


def uniform_sample(sampler, batch: int):
  """``sample(key) -> batch`` of ``batch`` examples (or windows) drawn
  uniformly inside jit from the arrays ``sampler`` samples: the data of the
  plain loops that the simulator is measured against."""
  arrays = sampler.arrays
  if sampler.task == "lm":
    tokens = arrays["tokens"]
    windows = (tokens.shape[0] - 1) // sampler.seq_len

    def sample(key):
      starts = jax.random.randint(key, (batch,), 0, windows) * sampler.seq_len
      rows = jax.vmap(lambda s: jax.lax.dynamic_slice(
          tokens, (s,), (sampler.seq_len + 1,)))(starts)
      return {"tokens": rows.astype(jnp.int32)}
    return sample
  n = arrays["y"].shape[0]

  def sample(key):
    idx = jax.random.randint(key, (batch,), 0, n)
    return {"x": arrays["x"][idx], "y": arrays["y"][idx]}
  return sample


def baseline(model, sampler, inner, batch: int, steps: int, seed: int = 0,
             backward=None):
  """A plain single-replica loop: ``inner`` on one model with batch ``batch``.

  Data are drawn inside jit from the same arrays the simulator samples
  (``uniform_sample``). ``backward`` (the run's ``Backward``): the same
  compute precision (``autocast``) and the same number of micro-batches as
  the simulated workers, so that both sides do the same arithmetic. Returns
  ``run() -> seconds`` for ``steps`` steps (one compiled ``lax.scan``),
  already compiled and warm.
  """
  sample = uniform_sample(sampler, batch)
  key = jax.random.PRNGKey(seed)
  params = model.init(key, jax.tree.map(lambda x: x[:1], sample(key)))
  backward = backward or _backward.Backward()
  loss_fn = backward.loss(model)

  def grad_fn(params, batch, key):
    (loss, metrics), g = jax.value_and_grad(loss_fn, has_aux=True)(
        params, batch, key)
    return loss, metrics, g

  grads = backward.accumulated(grad_fn)

  def step(carry, key):
    params, opt_state = carry
    loss, _, g = grads(params, sample(key), key)
    updates, opt_state = inner.update(g, opt_state, params)
    return (optax.apply_updates(params, updates), opt_state), loss

  loop = jax.jit(lambda carry, key: jax.lax.scan(
      step, carry, jax.random.split(key, steps)), donate_argnums=0)
  state = {"carry": (params, inner.init(params)), "calls": 0}

  def run() -> float:
    state["calls"] += 1
    start = time.perf_counter()
    state["carry"], losses = loop(state["carry"],
                                  jax.random.PRNGKey(seed + state["calls"]))
    jax.block_until_ready(losses)
    return time.perf_counter() - start

  run()  # compile and warm
  return run


def _time_sync(sim, state, repeats: int):
  """``(seconds, state)``: seconds of one sync (the outer step with its
  codec and reductions), compiled on its own, None for strategies that
  communicate every step; and the run's state to go on with.

  The sync is applied to its own output, its input donated, as it runs
  inside a round: state it leaves alone (the inner optimizer states) is not
  copied, which an undonated call would add to its time. It runs on the
  run's own state (float32 workers' arrays are donated, not copied: a copy
  of the whole state would double the memory of a run that fills the
  device); the state it leaves, cast back to the stored types, is the
  run's from then on (the timed calls' speed does not depend on the values).
  Over several devices it runs under the run's ``shard_map``, as in the
  round."""
  strategy = sim.config.strategy
  if strategy.sync is None:
    return None, state

  def one(st):
    return strategy.sync(_precision.cast_workers(st, jnp.float32))[0]

  if sim.mesh is not None:
    specs = sim.specs[0].strategy
    one = _engine.map_workers(one, sim.mesh, (specs,), specs,
                              sim.config.workers)
  sync = jax.jit(one, donate_argnums=0)
  stored = state.strategy
  dtypes = jax.tree.map(lambda x: x.dtype, stored)
  st = _precision.cast_workers(stored, jnp.float32)
  sync = sync.lower(st).compile()
  st = jax.block_until_ready(sync(st))
  times = []
  for _ in range(max(repeats, 5)):
    start = time.perf_counter()
    st = jax.block_until_ready(sync(st))
    times.append(time.perf_counter() - start)
  back = jax.tree.map(lambda x, d: x.astype(d), st, dtypes)
  return statistics.median(times), state._replace(strategy=back)


def _nbytes(tree) -> int:
  return sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(tree))


def _per_worker_bytes(sim, state) -> int:
  """Bytes of the per-worker leaves of the state (params, optimizer states,
  residuals), all workers."""
  return sum(state_bytes(sim, state.strategy).values()) * sim.config.workers


def state_bytes(sim, strategy_state=None) -> dict[str, float]:
  """What one worker keeps between steps, in bytes: ``params`` (its copy of
  the model), ``optimizer`` (its inner optimizer state) and ``messages``
  (its error-feedback residuals and other per-worker communication state).
  From the simulator's abstract state when ``strategy_state`` is None:
  nothing is computed. Gradients are not state: they exist within a step
  (see the chunk's XLA temp bytes)."""
  c = sim.config
  st = (sim.abstract_state.strategy if strategy_state is None
        else strategy_state)
  specs = _mesh.strategy_specs(c.strategy, sim.abstract_params, c.workers,
                               jax.random.PRNGKey(0))
  per_worker = PartitionSpec(_engine.MESH_AXIS)

  def part(spec_tree, tree):
    sizes = jax.tree.map(lambda spec, sub: _nbytes(sub) if spec == per_worker
                         else 0, spec_tree, tree, is_leaf=_mesh.is_spec)
    return sum(jax.tree.leaves(sizes)) / c.workers

  return {"params": part(specs.params_W, st.params_W),
          "optimizer": part(specs.inner_W, st.inner_W),
          "messages": part(specs.comm, st.comm)}


class Timing(NamedTuple):
  """How ``measure`` takes its figures.

  Attributes:
    rounds: rounds (of H steps) per timed call.
    repeats: timed calls of each program; figures are medians.
    warmup: untimed calls before timing.
    sync_cost: also time the strategy's sync alone (median of ``repeats``
      calls on the run's state) and report its share of a round.
    seed: the run's seed (the baseline's too).
  """

  rounds: int = 2
  repeats: int = 3
  warmup: int = 1
  sync_cost: bool = True
  seed: int = 0


def _check_timing(timing, options: dict) -> None:
  """``timing`` is a ``Timing``, and none of its fields came as a build
  setting (``rounds=2`` where ``timing=Timing(rounds=2)`` was meant)."""
  if not isinstance(timing, Timing):
    raise _validate.fail("timing", timing, "expected a lowbw.bench.Timing")
  for name in Timing._fields:
    if name in options:
      raise _validate.fail(name, options[name], "a Timing field, not a "
                           f"build setting: pass timing=Timing({name}=...)")


def measure(model, data, strategy, inner, workers: int, batch_size: int,
            timing: Timing = Timing(), **options) -> dict:
  """Figures for one configuration (see the module docstring).

  Args:
    model, data, strategy: as for ``lowbw.simulate``.
    inner: the optax optimizer of the baseline (the strategy's inner one).
    workers, batch_size: W and b; the baseline's batch is W·b.
    timing: how the figures are taken (``Timing``: rounds per timed call,
      repeats, warm-up calls, the sync timed alone, the seed).
    **options: further ``lowbw.build`` settings that say how the workers
      compute (``devices``, ``worker_dtype``, ``worker_batch``,
      ``memory_budget``, ``minibatch_size``, ``autocast``, ...).

  Returns:
    A JSON-able dict of figures.
  """
  _check_timing(timing, options)
  rounds, repeats, warmup, sync_cost, seed = timing
  memory = _Memory()
  # Throughput is measured on XLA's optimised programs, whatever the size.
  simulator = build(model, data, strategy, workers=workers,
                    batch_size=batch_size, steps=rounds * strategy.period,
                    rounds_per_chunk=rounds, compile=False,
                    **{"compile_effort": "full", **options})
  state, sampler, _, _ = simulator.initial(seed)
  memory.built()
  start = time.perf_counter()
  exe, state = simulator.executables(state, sampler, None)
  compile_s = time.perf_counter() - start
  memory.after_compile()
  for _ in range(max(warmup, 1)):
    state, out = exe.chunk(state, sampler, rounds, None)
  jax.block_until_ready(state)
  # The simulator's own peak: before the sync is timed on its own and the
  # baseline exists.
  peak = memory.peak()
  sync_s, state = (_time_sync(simulator, state, repeats) if sync_cost
                   else (None, state))
  base = baseline(simulator.config.model, sampler, inner,
                  workers * batch_size, rounds * strategy.period, seed,
                  _backward.of(simulator.config))
  for _ in range(warmup - 1):
    base()
  sim_s, base_s = [], []
  for _ in range(repeats):  # alternate, so that load changes hit both alike
    start = time.perf_counter()
    state, out = exe.chunk(state, sampler, rounds, None)
    jax.block_until_ready(out)
    sim_s.append(time.perf_counter() - start)
    base_s.append(base())
  figures = {"compile_s": compile_s, "sync_s": sync_s,
             "sync_share": None if sync_s is None
             else sync_s * rounds / statistics.median(sim_s)}
  return {**_settings(simulator, rounds), **figures,
          **_speed(simulator, sim_s, base_s, rounds),
          **_memory_figures(simulator, memory, peak, state, exe),
          **_bytes(simulator, simulator.fetch(out))}


def _settings(sim, rounds: int) -> dict:
  """What was measured: the run's shape and how its workers computed."""
  c = sim.config
  return {
      "workers": c.workers, "batch_size": c.batch_size,
      "H": c.period, "rounds": rounds, "steps": rounds * c.period,
      "devices": c.devices, "processes": sim.processes,
      "worker_dtype": c.worker_dtype, "worker_batch": c.worker_batch,
      "minibatch_size": c.minibatch_size, "autocast": c.autocast,
      "shadow": None if c.shadow is None else "ddp",
      "num_params": sim.num_params,
      "flops_per_token": sim.flops_per_token,
      "device": f"{jax.device_count()} x {jax.devices()[0].device_kind}",
  }


def device_peak_flops() -> float | None:
  """The first device's dense bf16 peak FLOP/s when its name matches one of
  the clock's hardware presets ("NVIDIA H100 80GB HBM3" -> h100), else None
  (a CPU, an unknown accelerator)."""
  from lowbw.network import PRESETS
  name = jax.devices()[0].device_kind.lower().replace(" ", "")
  if jax.devices()[0].platform == "cpu":
    return None
  hits = [k for k in PRESETS if k in name]
  return PRESETS[max(hits, key=len)] if hits else None


def _mfu(tokens_per_s, flops_per_token: float) -> float | None:
  peak = device_peak_flops()
  if tokens_per_s is None or peak is None:
    return None
  return tokens_per_s * flops_per_token / peak


def _speed(sim, sim_s: list, base_s: list, rounds: int) -> dict:
  """Throughput of the simulator and of the baseline, from the timed calls
  (medians; the efficiency is the median of each pair's ratio)."""
  c = sim.config
  tokens = c.data.tokens_per_example
  examples = c.workers * rounds * c.period * c.batch_size
  run, base = statistics.median(sim_s), statistics.median(base_s)
  rate = examples * tokens / run if tokens else None
  base_rate = examples * tokens / base if tokens else None
  return {
      "worker_steps_per_s": c.workers * rounds * c.period / run,
      "examples_per_s": examples / run,
      "tokens_per_s": rate,
      "baseline_examples_per_s": examples / base,
      "baseline_tokens_per_s": base_rate,
      "mfu": _mfu(rate, sim.flops_per_token),
      "baseline_mfu": _mfu(base_rate, sim.flops_per_token),
      "efficiency": statistics.median(b / s for s, b in zip(sim_s, base_s)),
      "efficiencies": [b / s for s, b in zip(sim_s, base_s)],
      "round_s": run / rounds,
  }


def _memory_figures(sim, memory, peak: int, state, exe) -> dict:
  """The process's memory against the state it holds, and XLA's analysis
  of the chunk program."""
  W = sim.config.workers
  total_state = _per_worker_bytes(sim, state)
  analysis = exe.chunk.memory_analysis()
  return {
      "memory_source": memory.source,
      "peak_bytes": peak,
      "base_bytes": memory.base,
      "run_bytes": memory.used(peak),
      "memory_per_worker": memory.used(peak) / W,
      "theoretical_per_worker": total_state / W,
      "state_per_worker": state_bytes(sim, state.strategy),
      "memory_ratio": memory.used(peak) / total_state,
      "memory_estimate_bytes": sim.memory.estimate_bytes,
      **_estimate_against_peak(sim, memory, peak),
      "xla_argument_bytes": getattr(analysis, "argument_size_in_bytes", None),
      "xla_temp_bytes": getattr(analysis, "temp_size_in_bytes", None),
  }


def _estimate_against_peak(sim, memory, peak: int) -> dict:
  """The plan's estimate against the device allocator's measured peak
  (``peak_bytes_in_use``, less what was in use before the run was built),
  where the backend keeps one (a GPU); both None where it does not (a
  CPU, whose process RSS also counts the runtime and the host's copies)."""
  if not memory.device:
    return {"device_peak_bytes": None, "estimate_over_device_peak": None}
  measured = memory.used(peak)
  return {"device_peak_bytes": measured,
          "estimate_over_device_peak":
              sim.memory.estimate_bytes / measured if measured > 0 else None}


def _bytes(sim, out) -> dict:
  """Wire bytes one worker sends in a timed call, per channel: the events
  the call reported times each channel's exact size. None for an
  asynchronous strategy, whose rounds are ticks that rarely hold an
  arrival (its bytes follow the arrivals: a run's sent_bytes)."""
  if sim.config.strategy.asynchronous:
    return {"wire_bytes_per_round": None,
            "wire_bytes_per_round_by_channel": None}
  per_round = {}
  for name, channel in sim.channels.items():
    events = int(np.sum(out.steps.counts.get(name, np.zeros(1))[0]))
    events += int(out.sync_counts.get(name, np.zeros(1))[0])
    per_round[name] = events * channel.wire_bytes
  return {"wire_bytes_per_round": sum(per_round.values()),
          "wire_bytes_per_round_by_channel": per_round}


# ------------------------------------------------------------------ lanes
def measure_lanes(config, timing: Timing = Timing()) -> dict:
  """What a run's counterfactual lanes cost: ``config`` (a
  ``lowbw.Config`` with ``lanes``) built with 0, 1, ... of its lanes (the
  first k, in order), each one device (lanes run on one), and their
  compiled chunk programs timed interleaved in this process: one call of
  each per repeat, the order reversed every other repeat, so that load on
  a shared machine falls on all of them alike.

  Args:
    config: the run, lanes included; its ``steps`` and
      ``rounds_per_chunk`` are set from ``timing`` (``rounds`` rounds of
      H steps per timed call).
    timing: as for ``measure`` (``sync_cost`` is not used).

  Returns:
    A JSON-able dict: the run's shape and ``lanes``, one row per lane count
    (``lane_rows``: its wall seconds per call, its ratios to the run
    without lanes, pair by pair, and their median, the bytes of its state,
    which with lanes is the tuple of the run's state and each lane's, the
    state its last lane adds, the distinct data arrays held and the memory
    plan's bytes for the lanes), and the machine's load average (one
    minute) before and after.
  """
  from lowbw.config import Config
  if not isinstance(config, Config) or not config.lanes:
    raise _validate.fail("lanes", getattr(config, "lanes", config),
                         "expected a lowbw.Config with at least one lane")
  _check_timing(timing, {})
  rounds, repeats, warmup, _, seed = timing
  period = config.built().strategy.period
  config = config.replace(steps=rounds * period, rounds_per_chunk=rounds,
                          devices=config.devices or 1, progress=False)
  names = list(config.lanes)
  load = [os.getloadavg()[0] if hasattr(os, "getloadavg") else None]
  runs = [_LaneRun(config.replace(lanes=names[:k] or None), seed, rounds)
          for k in range(len(names) + 1)]
  for _ in range(max(warmup, 1)):
    for run in runs:
      run.call()
  seconds = [[] for _ in runs]
  for r in range(repeats):
    order = range(len(runs)) if r % 2 == 0 else reversed(range(len(runs)))
    for k in order:
      seconds[k].append(runs[k].call())
  load.append(os.getloadavg()[0] if hasattr(os, "getloadavg") else None)
  return {**_settings(runs[0].sim, rounds), "lanes": names,
          "repeats": repeats, "load_average": load,
          "lane_rows": _lane_rows(runs, seconds, names)}


class _LaneRun:
  """One lane count's simulator, compiled, with its inputs: ``call`` runs
  one chunk of ``rounds`` rounds and returns its seconds."""

  def __init__(self, config, seed: int, rounds: int):
    self.sim = build(config, compile=False, compile_effort="full")
    self.rounds = rounds
    self.state, self.sampler, self.net, _ = self.sim.initial(seed)
    start = time.perf_counter()
    self.exe, self.state = self.sim.executables(self.state, self.sampler,
                                                self.net)
    self.compile_s = time.perf_counter() - start

  def call(self) -> float:
    start = time.perf_counter()
    self.state, out = self.exe.chunk(self.state, self.sampler, self.rounds,
                                     self.net)
    jax.block_until_ready((self.state, out))
    return time.perf_counter() - start


def _distinct_bytes(*trees) -> int:
  """Bytes of the distinct arrays of ``trees`` (an array that several
  hold, as lanes hold the run's data, counted once)."""
  seen = {id(x): x for t in trees for x in jax.tree.leaves(t)}
  return sum(x.size * x.dtype.itemsize for x in seen.values())


def _lane_rows(runs, seconds, names) -> list[dict]:
  """A row per lane count: wall time against the run without lanes (the
  median of the interleaved pairs' ratios, and each ratio), the state's
  bytes (every state of the tuple) and the data arrays held."""
  rows, before = [], None
  for k, (run, secs) in enumerate(zip(runs, seconds)):
    ratios = [s / b for s, b in zip(secs, seconds[0])]
    state = _nbytes(run.state)
    sim = run.sim
    rows.append({
        "lanes": names[:k], "compile_s": run.compile_s,
        "median_s": statistics.median(secs), "seconds": secs,
        "wall_ratio": statistics.median(ratios), "wall_ratios": ratios,
        "state_bytes": state,
        # The state the row's last lane adds: its own, all of it.
        "lane_state_bytes": None if before is None else state - before,
        "data_bytes": _distinct_bytes(run.sampler, sim.eval_batches, *(
            lane.eval_batches for _, lane, _ in sim.lanes)),
        "plan_lane_bytes": sim.memory.lane_bytes,
        "plan_estimate_bytes": sim.memory.estimate_bytes})
    before = state
  return rows
