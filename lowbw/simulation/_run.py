"""``lowbw.simulate``: build a run, then drive its compiled chunks from the host."""

import dataclasses
import json
import math
import os
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from lowbw import _validate
from lowbw import data as data_lib
from lowbw import models as models_lib
from lowbw import strategies as strategies_lib
from lowbw import telemetry
from lowbw.simulation import _engine, _mesh
from lowbw.network import _clock, _faults
from lowbw.simulation._history import History, NonFiniteLossError
from lowbw.telemetry import names

_TARGET_CHUNKS = 25
WORKER_DTYPES = ("float32", "bfloat16")


@dataclasses.dataclass
class Result:
  """What a run returns.

  Attributes:
    history: metric name -> numpy array over logged rows (see DESIGN.md names);
      NaN where a metric was not measured at that row (e.g. eval_loss between
      evaluations).
    params: the global parameters (what evaluation uses).
    state: the final simulation state (every worker's parameters, optimizer
      states, strategy state, counters).
    summary: final figures (eval loss, bytes, throughput, compile time).
    config: the run's configuration as written to config.json.
    log_dir: where logs were written, or None.
  """

  history: dict[str, np.ndarray]
  params: Any
  state: _engine.SimState
  summary: dict[str, Any]
  config: dict[str, Any]
  log_dir: str | None


def simulate(
    model,
    data,
    strategy,
    num_workers: int = 8,
    batch_size: int = 32,
    steps: int = 1000,
    seed: int = 0,
    network=None,
    eval_every: int | None = None,
    log_every: int | None = None,
    log_dir: str | None = None,
    checkpoint_every: int | None = None,
    resume_from: str | None = None,
    eval_examples: int | None = None,
    rounds_per_chunk: int | None = None,
    progress: bool | None = None,
    callback: Callable[[dict], None] | None = None,
    metadata: dict | None = None,
    devices: int | None = None,
    worker_dtype: str | None = None,
    worker_batch: int | None = None,
) -> Result:
  """Simulates ``num_workers`` workers training ``model`` with ``strategy``.

  All workers run in one compiled JAX program: their parameters are stacked on
  axis 0, a round (H inner steps and one sync) is a ``lax.scan``, and chunks of
  rounds run without the host waiting on the device. Every bad argument raises
  a ValueError here, before anything is compiled.

  Args:
    model: a ``lowbw.models.Model``, a flax module, an ``(init, loss)`` pair, or
      a registry name ("mlp", "cnn", "gpt").
    data: a ``lowbw.data.DataSource`` or a registry name ("digits", "text").
    strategy: a ``lowbw.strategies.Strategy`` or a registry name.
    num_workers: W, the number of simulated workers.
    batch_size: examples per worker and inner step.
    steps: inner steps per worker; a sync happens right after steps H, 2H, ...
      Steps past the last multiple of H run without a final sync.
    seed: seeds initialisation, sharding, sampling and the strategy's keys.
      Same seed, same bits.
    network: a ``lowbw.network.Network`` (links, topology, hardware,
      stragglers, faults) for the simulated clock (``sim_time_s``) and the
      fault and straggler masks; None: no clock.
    eval_every: evaluate the global parameters every this many steps (a
      multiple of the strategy's period H); always at the last step.
    log_every: log a row every this many steps (default: about 200 rows).
    log_dir: write metrics.csv, TensorBoard events, config.json and
      summary.json here.
    checkpoint_every: save an orbax checkpoint every this many steps (a
      multiple of H) under ``log_dir/checkpoints``.
    resume_from: a log_dir or checkpoint directory to continue from; the run
      must have the same configuration; it continues bit-identically.
    eval_examples: held-out examples per evaluation (default: the dataset's
      default, 256 sequences for text).
    rounds_per_chunk: rounds per compiled call (default: about 1/25 of the run).
    progress: show a progress bar (default: when stderr is a terminal).
    callback: called with each logged row (a dict), on the host.
    metadata: JSON-able notes stored under "metadata" in config.json (the CLI
      keeps its settings there, for ``lowbw train --resume``).
    devices: spread the workers over this many devices (``shard_map`` over a
      ``"workers"`` mesh axis; must divide ``num_workers``); the trajectory is
      the same as on one device up to float rounding. Default: 1, or every
      device of a multi-process run (``lowbw.simulation.initialize``).
    worker_dtype: "bfloat16" keeps every worker's parameters and inner
      optimizer state in bf16 between steps (half their memory); steps, syncs
      and the global parameters stay float32. Updates smaller than bf16's
      resolution (about 0.4% of a weight) are rounded away, so use it with
      strategies that restart workers from float32 global parameters
      (DiLoCo, MuLoCo, FedAvg). Default float32.
    worker_batch: compute the inner steps of this many workers at a time
      (a loop over groups, updating the state in place) instead of all at
      once, so that activations and gradients are held for one group only:
      memory then grows by little more than the workers' state per worker.
      Same results. Needs a strategy whose inner steps do not communicate
      (DiLoCo, MuLoCo, FedAvg) and must divide the workers per device.

  Returns:
    A ``Result``.

  Raises:
    ValueError: a bad argument, naming it.
    NonFiniteLossError: a worker's loss became NaN/inf; logs are kept.
  """
  run = _Run(model, data, strategy, num_workers, batch_size, steps, seed,
             network, eval_every, log_every, log_dir, checkpoint_every,
             resume_from, eval_examples, rounds_per_chunk, progress, callback,
             metadata, devices, worker_dtype, worker_batch)
  return run.execute()


def check_worker_dtype(value) -> str:
  """``worker_dtype`` as "float32" or "bfloat16" (None, "fp32" and "bf16"
  accepted); anything else is a ValueError naming the field."""
  value = {None: "float32", "bf16": "bfloat16", "fp32": "float32"}.get(
      value, value)
  return _validate.one_of("worker_dtype", value, WORKER_DTYPES)


def _resolve(field, value, registry_get, cls):
  if isinstance(value, str):
    return registry_get(value)
  if not isinstance(value, cls):
    raise _validate.fail(field, value,
                         f"expected a {cls.__module__}.{cls.__name__} or a name")
  return value


def _multiple_of_period(field, value, period):
  value = _validate.optional_positive_int(field, value)
  if value is not None and value % period:
    raise _validate.fail(
        field, value,
        f"must be a multiple of the strategy's period H={period} (global "
        "parameters only change at syncs)")
  return value


class _Run:
  """One run: validated configuration, compiled programs, host loop."""

  def __init__(self, model, data, strategy, num_workers, batch_size, steps,
               seed, network, eval_every, log_every, log_dir, checkpoint_every,
               resume_from, eval_examples, rounds_per_chunk, progress,
               callback, metadata, devices=None, worker_dtype=None,
               worker_batch=None):
    # --- validation: everything fails here, before compiling.
    self.num_workers = _validate.positive_int("num_workers", num_workers)
    self.batch_size = _validate.positive_int("batch_size", batch_size)
    self.steps = _validate.positive_int("steps", steps)
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
      raise _validate.fail("seed", seed, "expected an integer")
    self.seed = int(seed)
    self.devices = _mesh.check_devices(devices, self.num_workers)
    self.worker_dtype = check_worker_dtype(worker_dtype)
    self.processes = jax.process_count()
    self.main_process = jax.process_index() == 0
    if self.processes > 1 and (checkpoint_every or resume_from):
      raise _validate.fail(
          "checkpoint_every" if checkpoint_every else "resume_from",
          checkpoint_every or resume_from,
          "checkpoints are not supported in multi-process runs yet")
    self.network = (None if network is None
                    else _clock.check_network(network, self.num_workers))
    # Jitter alone moves the clock but drops nobody: no masks, same training.
    self.masks = self.network is not None and (
        self.network.faults is not None or (
            self.network.stragglers is not None and
            self.network.stragglers.mitigation != "none"))
    self.model = (models_lib.get(model) if isinstance(model, str)
                  else models_lib.as_model(model))
    self.data = _resolve("data", data, data_lib.get, data_lib.DataSource)
    self.strategy = _resolve("strategy", strategy, strategies_lib.get,
                             strategies_lib.Strategy)
    period = self.strategy.period
    if self.network is not None and self.network.faults is not None:
      _faults.check_windows(self.network.faults, period)
    self.eval_every = _multiple_of_period("eval_every", eval_every, period)
    self.checkpoint_every = _multiple_of_period("checkpoint_every",
                                                checkpoint_every, period)
    if self.checkpoint_every and log_dir is None:
      raise _validate.fail("checkpoint_every", checkpoint_every,
                           "needs log_dir (checkpoints go to log_dir/checkpoints)")
    self.log_every_given = log_every is not None
    self.log_every = (_validate.positive_int("log_every", log_every)
                      if log_every is not None else max(1, self.steps // 200))
    self.eval_examples = _validate.optional_positive_int("eval_examples",
                                                         eval_examples)
    self.worker_batch = _validate.optional_positive_int("worker_batch",
                                                        worker_batch)
    if self.worker_batch is not None:
      per_device = self.num_workers // self.devices
      if per_device % self.worker_batch:
        raise _validate.fail("worker_batch", worker_batch,
                             f"must divide the {per_device} workers of each "
                             "device")
    rounds = self.steps // period
    default_rpc = max(1, math.ceil(rounds / _TARGET_CHUNKS))
    self.rounds_per_chunk = (
        _validate.positive_int("rounds_per_chunk", rounds_per_chunk)
        if rounds_per_chunk is not None else default_rpc)
    self.log_dir = log_dir
    self.resume_from = resume_from
    if resume_from is not None and not os.path.isdir(resume_from):
      raise _validate.fail("resume_from", resume_from, "no such directory")
    if (resume_from is None and log_dir is not None and
        os.path.isdir(os.path.join(log_dir, "checkpoints"))):
      raise _validate.fail(
          "log_dir", log_dir, "already holds another run's checkpoints; resume "
          "it (resume_from) or choose a new folder")
    self.progress = telemetry.is_terminal() if progress is None else progress
    self.progress = self.progress and self.main_process
    self.callback = callback
    self.metadata = dict(metadata or {})
    if self.model.task not in ("custom", self.data.task):
      raise _validate.fail(
          "model", self.model.name,
          f"is a model for {self.model.task} but data {self.data.name!r} is "
          f"{self.data.task} data")
    model_vocab = self.model.config.get("vocab")
    if (self.data.vocab_size and model_vocab and
        self.data.vocab_size > model_vocab):
      raise _validate.fail("vocab", model_vocab,
                           f"data {self.data.name!r} has tokens up to "
                           f"{self.data.vocab_size - 1}; needs vocab >= "
                           f"{self.data.vocab_size}")

    model_classes = self.model.config.get("num_classes")
    data_classes = getattr(self.data, "num_classes", None)
    if model_classes and data_classes and data_classes > model_classes:
      raise _validate.fail("num_classes", model_classes,
                           f"data {self.data.name!r} has labels up to "
                           f"{data_classes - 1}; needs num_classes >= "
                           f"{data_classes}")

    # --- build: data on device, initial state, compiled programs.
    key = jax.random.PRNGKey(self.seed)
    init_key, data_key, strategy_key, loss_key = jax.random.split(key, 4)
    self.sampler = self.data.build(self.num_workers, self.batch_size, self.seed)
    example = self.data.example_batch(self.batch_size)
    params = self.model.init(init_key, example)
    self.num_params = sum(x.size for x in jax.tree.leaves(params))
    self.channels = self.strategy.channels(params, self.num_workers)
    strategy_state = self.strategy.init(params, self.num_workers, strategy_key)
    self.abstract_params = jax.eval_shape(lambda: params)
    if self.worker_batch is not None:
      # Gradients have the parameters' shapes: does the local step report
      # any communication?
      if jax.eval_shape(self.strategy.local, strategy_state,
                        strategy_state.params_W)[1]:
        raise _validate.fail(
            "worker_batch", self.worker_batch,
            f"strategy {self.strategy.name!r} communicates at every inner "
            "step; worker_batch needs one whose inner steps are local "
            "(diloco, muloco, fedavg)")
    self.strategy_key = strategy_key
    self.net = None
    if self.network is not None:
      strategy_channels = self.channels
      costs = _clock.channel_costs(self.network, strategy_channels,
                                   self.num_workers)
      # What each worker sends under the topology's algorithms.
      self.channels = {
          name: c._replace(wire_bytes=costs[name].wire_bytes,
                           collective=costs[name].algorithm)
          for name, c in self.channels.items()}
      self.comm_seconds = {name: c.seconds for name, c in costs.items()}
      tokens = self.batch_size * (self.data.tokens_per_example or 1)
      self.flops_per_step = _clock.flops_per_step(self.num_params, tokens)
      self.net = _clock.net_params(self.network, self.num_workers,
                                   self.flops_per_step, strategy_channels,
                                   self.seed)
      if self.masks:
        strategy_state = strategy_state._replace(
            active=jnp.ones(self.num_workers, bool))
    if self.worker_dtype != "float32":
      strategy_state = _engine.cast_workers(strategy_state, self._narrow)
    self.state = _engine.SimState(strategy_state, data_key, loss_key)
    eval_batches = self.data.eval_batches(self.eval_examples)
    self.eval_batches = jax.tree.map(jnp.asarray, eval_batches)
    self.mesh = self.specs = None
    if self.devices > 1 or self.processes > 1:
      self._spread(params, strategy_key)
    self.tail_steps = self.steps % period
    self.metric_names = sorted(
        jax.eval_shape(self.model.loss, params, example, loss_key)[1])

  def _grouping(self):
    """``worker_batch`` for the engine: None when it is every worker."""
    if self.worker_batch in (None, self.num_workers // self.devices):
      return None
    return self.worker_batch

  @property
  def _narrow(self):
    return None if self.worker_dtype == "float32" else jnp.bfloat16

  def _spread(self, params, strategy_key):
    """Splits the workers' leaves over the mesh, replicates the rest."""
    self.mesh = _mesh.make_mesh(self.devices)
    sim_specs = _engine.SimState(
        _mesh.strategy_specs(self.strategy, params, self.num_workers,
                             strategy_key, self.masks),
        _mesh.replicated(self.state.data_key),
        _mesh.replicated(self.state.loss_key))
    self.specs = (sim_specs, _mesh.sampler_specs(self.sampler))
    self.state = _mesh.place(self.state, sim_specs, self.mesh)
    self.sampler = _mesh.place(self.sampler, self.specs[1], self.mesh)
    self.eval_batches = _mesh.place(
        self.eval_batches, _mesh.replicated(self.eval_batches), self.mesh)
    if self.net is not None:
      self.net = _mesh.place(self.net, _mesh.replicated(self.net), self.mesh)

  def _fetch(self, tree):
    """Device outputs (replicated) as numpy, whichever process holds them."""
    return jax.device_get(tree) if self.mesh is None else _mesh.to_host(tree)

  # ------------------------------------------------------------ description
  def config(self) -> dict:
    return {
        "model": self.model.config,
        "data": self.data.config,
        "strategy": self.strategy.config,
        "num_workers": self.num_workers,
        "batch_size": self.batch_size,
        "steps": self.steps,
        "seed": self.seed,
        "eval_every": self.eval_every,
        "log_every": self.log_every,
        "checkpoint_every": self.checkpoint_every,
        "eval_examples": self.eval_examples,
        "num_params": self.num_params,
        "channels": {k: c._asdict() for k, c in self.channels.items()},
        "network": None if self.network is None else {
            **self.network.describe(),
            "compute_s_per_step": None if self.network.hardware is None
            else self.network.hardware.step_seconds(self.flops_per_step),
            "comm_s_per_event": self.comm_seconds},
        "jax_version": jax.__version__,
        "backend": jax.default_backend(),
        "worker_dtype": self.worker_dtype,
        "worker_batch": self.worker_batch,
        "devices": self.devices,
        "processes": self.processes,
        "metadata": self.metadata,
    }

  def _columns(self) -> list[str]:
    lm = self.data.tokens_per_example is not None
    cols = [names.STEP, names.EXAMPLES] + ([names.TOKENS] if lm else [])
    cols += [names.TRAIN_LOSS] + [names.train_metric(m) for m in self.metric_names]
    cols += [names.EVAL_LOSS] + [names.eval_metric(m) for m in self.metric_names]
    cols += [names.EVAL_PERPLEXITY] if lm else []
    cols += [names.PAYLOAD_BYTES, names.WIRE_BYTES, names.WORKER_DIVERGENCE,
             names.LR]
    if self.network is not None:
      cols += [names.SIM_TIME_S, names.SYNC_WORKERS]
    cols += [names.WALL_TIME_S]
    return cols

  # ------------------------------------------------------------- execution
  def execute(self) -> Result:
    history = History(self.channels, self.log_every,
                      self.num_workers * self.batch_size,
                      self.data.tokens_per_example, self.metric_names,
                      clock=self.network is not None)
    self.clock = _clock.Clock(bool(self.network and self.network.overlap))
    state, self.state = self.state, None  # the run owns it now (donated)
    wall_offset = 0.0
    if self.resume_from is not None:
      state, wall_offset = self._restore(history, state)

    self.programs = _engine.build(self.model, self.strategy, self.num_workers,
                                  self.rounds_per_chunk, self.tail_steps,
                                  self.masks, self.mesh, self.specs,
                                  self._narrow, self._grouping())
    net = self.net
    compile_start = time.perf_counter()
    chunk = self.programs.chunk.lower(state, self.sampler, 1, net).compile()
    tail = (self.programs.tail.lower(state, self.sampler, net).compile()
            if self.programs.tail else None)
    evaluate = self.programs.evaluate.lower(state, self.eval_batches).compile()
    global_params = jax.jit(lambda s: self.strategy.global_params(
        _engine.cast_workers(s.strategy, jnp.float32))).lower(state).compile()
    # Load the executables: a first execution pays one-off costs (buffer and
    # thread-pool set-up) that belong with compilation, not with the run's
    # throughput. A chunk of zero rounds leaves the state unchanged.
    state, _ = chunk(state, self.sampler, 0, net)
    jax.block_until_ready(evaluate(state, self.eval_batches))
    compile_s = time.perf_counter() - compile_start

    writers = self._open_writers(history)
    bar = (telemetry.ProgressBar(self.steps, initial=history.step)
           if self.progress else None)
    start = time.perf_counter() - wall_offset
    step = history.step
    pending = None

    def emit(rows):
      for row in rows:
        for w in writers:
          w.write(row)
        if self.callback:
          self.callback(row)
      if bar and rows:
        bar.update(history.step, rows[-1])

    def finish(p):
      try:
        rows = self._consume(history, p, time.perf_counter() - start)
      except NonFiniteLossError as e:
        emit(e.new_rows)
        raise
      # The row at the last step is written by finalize, with the final eval.
      emit([r for r in rows if r[names.STEP] != self.steps])

    try:
      period = self.strategy.period
      while step + period <= self.steps:
        n = min(self.rounds_per_chunk, (self.steps - step) // period,
                *(self._rounds_to(step, every) for every in
                  (self.eval_every, self.checkpoint_every) if every))
        state, out = chunk(state, self.sampler, n, net)
        step += n * period
        ev = evaluate(state, self.eval_batches) if self._eval_due(step) else None
        if pending is not None:
          finish(pending)
        pending = ("rounds", n, out, ev, step)
        if self.checkpoint_every and step % self.checkpoint_every == 0:
          finish(pending)
          pending = None
          self._save(step, state, history, time.perf_counter() - start)
      if tail is not None:
        state, out = tail(state, self.sampler, net)
        step += self.tail_steps
        if pending is not None:
          finish(pending)
        pending = ("tail", self.tail_steps, out, None, step)
      if pending is not None:
        finish(pending)
      wall = time.perf_counter() - start
      row = history.finalize(
          self.steps, wall,
          self.clock.elapsed if self.network is not None else None)
      if names.EVAL_LOSS not in row:
        ev = {k: float(v) for k, v in
              self._fetch(evaluate(state, self.eval_batches)).items()}
        history.add_eval(self.steps, ev, self._is_lm(), wall)
      emit([row])
    finally:
      for w in writers:
        w.close()
      if bar:
        bar.close()

    elapsed = time.perf_counter() - start
    hist = history.as_arrays()
    summary = self._summary(hist, compile_s, elapsed, history)
    if self.log_dir and self.main_process:
      telemetry.write_json(os.path.join(self.log_dir, "summary.json"), summary)
    params = global_params(state)
    if self.processes > 1:  # a copy this process can read
      params = jax.tree.map(lambda x: x.addressable_data(0), params)
    return Result(hist, params, state, summary, self.config(), self.log_dir)

  def _rounds_to(self, step, every):
    return (every - step % every) // self.strategy.period

  def _eval_due(self, step):
    return bool(self.eval_every and step % self.eval_every == 0)

  def _is_lm(self):
    return self.data.tokens_per_example is not None

  def _consume(self, history, pending, wall):
    kind, n, out, ev, end_step = pending
    out = self._fetch(out)
    if kind == "rounds":
      per_step = jax.tree.map(lambda x: x[:n].reshape((-1,) + x.shape[2:]),
                              out.steps)
      period = self.strategy.period
      round_end = np.zeros(n * period, bool)
      round_end[period - 1::period] = True
      counts = dict(per_step.counts)
      for name, c in out.sync_counts.items():
        full = np.zeros(n * period, np.int64)
        full[period - 1::period] = c[:n]
        counts[name] = counts.get(name, 0) + full
      divergence, lr = out.divergence[:n], out.lr[:n]
      if out.clock is not None:
        sim_time = self.clock.rounds(
            out.steps.clock.time_s[:n], out.clock.compute_s[:n],
            out.clock.sync_s[:n])
        participants = per_step.clock.participants.copy()
        participants[period - 1::period] = out.clock.participants[:n]
    else:
      per_step = out
      round_end = np.zeros(n, bool)
      counts = dict(per_step.counts)
      divergence = lr = np.zeros(0)
      if per_step.clock is not None:
        sim_time = self.clock.steps(per_step.clock.time_s)
        participants = per_step.clock.participants
    if per_step.clock is None:
      sim_time = participants = None
    rows = history.add(loss=per_step.loss, metrics=per_step.metrics,
                       bad_worker=per_step.first_bad_worker, counts=counts,
                       round_end=round_end, divergence=divergence, lr=lr,
                       wall_time_s=wall, sim_time=sim_time,
                       participants=participants)
    if ev is not None:
      ev = {k: float(v) for k, v in self._fetch(ev).items()}
      row = history.add_eval(end_step, ev, self._is_lm(), wall)
      if not rows or rows[-1] is not row:
        rows.append(row)
    return rows

  # ------------------------------------------------------------ files
  def _open_writers(self, history):
    if not self.log_dir or not self.main_process:
      return []
    os.makedirs(self.log_dir, exist_ok=True)
    telemetry.write_json(os.path.join(self.log_dir, "config.json"),
                         self.config())
    csv_writer = telemetry.CSVWriter(os.path.join(self.log_dir, "metrics.csv"),
                                     self._columns())
    for row in history.rows:  # a resumed run rewrites what was logged so far
      csv_writer.write(row)
    resumed_at = history.step if self.resume_from is not None else None
    return [csv_writer, telemetry.TensorBoardWriter(
        os.path.join(self.log_dir, "tensorboard"),
        purge_step=None if resumed_at is None else resumed_at + 1)]

  def _checkpoint_dir(self, root):
    sub = os.path.join(root, "checkpoints")
    return sub if os.path.isdir(sub) else root

  def _save(self, step, state, history, wall):
    meta = {"history": history.state_dict(), "wall_time_s": wall,
            "clock": self.clock.state_dict(), "config": self.config()}
    telemetry.save(os.path.join(self.log_dir, "checkpoints"), step, state, meta)

  # What a resumed run may change; everything else must match the checkpoint.
  _MAY_CHANGE = ("steps", "eval_every", "log_every", "checkpoint_every",
                 "eval_examples", "metadata", "jax_version", "backend",
                 "devices", "processes", "worker_batch")

  def _restore(self, history, initial_state):
    directory = self._checkpoint_dir(self.resume_from)
    if telemetry.latest_step(directory) is None:
      raise _validate.fail("resume_from", self.resume_from,
                           "holds no checkpoint")
    step, meta = telemetry.read_meta(directory)
    saved = meta["config"]
    current = json.loads(json.dumps(self.config(), default=repr))
    for key in sorted(set(saved) | set(current)):
      if key not in self._MAY_CHANGE and saved.get(key) != current.get(key):
        raise _validate.fail(
            "resume_from", self.resume_from,
            f"the checkpoint was made with {key}={saved.get(key)!r} but this "
            f"run has {key}={current.get(key)!r}; only "
            f"{', '.join(self._MAY_CHANGE[:4])} may change on resume")
    abstract = jax.eval_shape(lambda: initial_state)
    if self.mesh is not None:  # restore straight into the devices' slices
      abstract = jax.tree.map(
          lambda a, x: jax.ShapeDtypeStruct(a.shape, a.dtype,
                                            sharding=x.sharding),
          abstract, initial_state)
    del initial_state
    try:
      step, state, meta = telemetry.restore(directory, abstract, step)
    except Exception as e:  # same configuration, yet a different structure
      raise _validate.fail(
          "resume_from", self.resume_from,
          f"its checkpoint does not match this run's state ({e})") from e
    if step > self.steps:
      raise _validate.fail("steps", self.steps,
                           f"the checkpoint is already at step {step}")
    if step % self.strategy.period:
      raise _validate.fail("resume_from", self.resume_from,
                           f"checkpoint step {step} is not a round boundary")
    history.load_state_dict(meta["history"])
    if "clock" in meta:
      self.clock.load_state_dict(meta["clock"])
    if not self.log_every_given:  # keep the rows' spacing of the first run
      self.log_every = history.log_every = int(meta["history"]["log_every"])
    return state, float(meta.get("wall_time_s", 0.0))

  def _summary(self, hist, compile_s, elapsed, history):
    def last(name):
      if name not in hist:
        return None
      values = hist[name][~np.isnan(hist[name])]
      return float(values[-1]) if values.size else None

    steps_run = self.steps
    examples = steps_run * self.num_workers * self.batch_size
    summary = {
        "steps": self.steps,
        "num_workers": self.num_workers,
        "num_params": self.num_params,
        "final_train_loss": last(names.TRAIN_LOSS),
        "final_eval_loss": last(names.EVAL_LOSS),
        "payload_bytes": history.payload_bytes,
        "wire_bytes": history.wire_bytes,
        "collectives": {name: c.collective for name, c in
                        self.channels.items()},
        "sim_time_s": (self.clock.elapsed if self.network is not None
                       else None),
        "compile_s": compile_s,
        "wall_time_s": elapsed,
        "steps_per_s": steps_run / elapsed if elapsed > 0 else None,
        "examples_per_s": examples / elapsed if elapsed > 0 else None,
        "log_dir": self.log_dir,
    }
    for m in self.metric_names:
      summary["final_eval_" + m] = last(names.eval_metric(m))
    if self.data.tokens_per_example:
      summary["final_eval_perplexity"] = last(names.EVAL_PERPLEXITY)
      summary["tokens_per_s"] = (examples * self.data.tokens_per_example /
                                 elapsed if elapsed > 0 else None)
    return summary
