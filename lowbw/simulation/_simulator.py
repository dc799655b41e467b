"""``lowbw.build``: a validated, compiled simulator that runs many times.

Flow: ``configure`` (validation, no device work) -> ``Simulator`` (static
facts: abstract parameters, channels and their bytes, evaluation data, the
engine's functions, compiled executables) -> ``Simulator.run`` (an initial
state for a seed and traced hyperparameters, the host loop, a ``Result``).

Executables are cached by the shapes of their arguments, so a second run with
another seed, learning rate or bandwidth reuses them; only a seed that changes
a shape (Dirichlet shards of another size) compiles again.
"""

import dataclasses
import math
import os
import shutil
import time
import warnings

import jax
import jax.numpy as jnp

from lowbw import _validate, telemetry
from lowbw import strategies as strategies_lib
from lowbw import transforms as transforms_lib
from lowbw import models as models_lib
from lowbw.models import check_contract
from lowbw import network as net_lib
from lowbw.network import tiers_of
from lowbw.simulation import (_compile_cache, _config, _engine, _hparams, _pace,
                              _logdir, _memory, _mesh, _options, _precision,
                              _resume, _shadow)
from lowbw.simulation._loop import Executables, drive
from lowbw.simulation._divergence import DivergenceError
from lowbw.simulation._result import Result
from lowbw.simulation._track import RunWarning, Track, clock_overlap
from lowbw.telemetry import names


class Simulator:
  """A compiled simulation: ``run`` it for any seed and traced values.

  Built by ``lowbw.build(...)``. What the build fixes (its ``config``: model,
  data, strategy, W, batch size, steps, devices, ...) needs a new build to
  change; what ``run`` takes (seed, ``hparams`` such as ``inner_lr``,
  ``outer_lr``, ``bandwidth``; see ``hparam_names``) does not recompile.

  Attributes:
    config: the validated ``RunConfig``.
    num_params: parameters of the model.
    channels: name -> ``Channel``: exact bytes of one event of each channel
      (wire bytes under the network's topology).
    metric_names: the model's own metrics.
    strategy_metric_names: the strategy's own metrics (logged as
      ``strategy_<name>``).
  """

  hparam_names = tuple(_hparams.KNOBS)

  def __init__(self, config: _config.RunConfig, compile: bool = True,
               started: float | None = None):
    started = time.perf_counter() if started is None else started
    c = self.config = config
    self.processes = jax.process_count()
    self.main_process = jax.process_index() == 0
    self.example = c.data.example_batch(c.batch_size)
    key = jax.random.PRNGKey(0)
    self.abstract_params, self.metric_names = check_contract(
        c.model, self.example, key)
    self.num_params = sum(x.size for x in jax.tree.leaves(
        self.abstract_params))
    self.abstract_state = jax.eval_shape(self._initial_state, key)
    self.strategy_channels = c.strategy.channels(self.abstract_params,
                                                 c.num_workers)
    reports = self._reports()
    self.strategy_metric_names = self._check_reports(reports)
    self._check_worker_batch(reports["local"])
    self._check_byzantine()
    self.eval_batches = jax.tree.map(
        jnp.asarray, c.data.eval_batches(c.eval_examples))
    self.memory = self._plan_memory(reports["local"])
    c = self.config = dataclasses.replace(
        c, worker_batch=self.memory.worker_batch)
    # What the network prices: the strategy's messages and, with faults,
    # the engine's catch-up downloads (``channels``: the same as logged).
    self.priced_channels = {**self.strategy_channels, **self._catch_up()}
    self.channels = dict(self.priced_channels)
    self._pricings: dict = {}  # id(network) -> (network, Pricing)
    tokens = c.batch_size * (c.data.tokens_per_example or 1)
    self.flops_per_token = models_lib.flops_per_token(
        c.model, self.num_params, c.data.tokens_per_example)
    self.flops_per_step = net_lib.flops_per_step(self.num_params, tokens,
                                                 self.flops_per_token)
    if c.network is not None:  # what each worker sends under the topology
      costs = self.pricing(c.network).costs
      self.channels = {
          name: ch._replace(wire_bytes=costs[name].wire_bytes,
                            collective=costs[name].algorithm,
                            received_bytes=costs[name].received_bytes)
          for name, ch in self.channels.items()}
    self.mesh = self.specs = None
    if c.devices > 1 or self.processes > 1:
      self._make_mesh(key)
    self.programs = _engine.build(c, _engine.Parts(
        tuple(self.strategy_channels), self.mesh, self.specs))
    self._init = self._initial_state_program()
    self._init_compiled = None
    self._point_programs: dict = {}
    self._jitted = self._jit_single()
    self._cache: dict = {}
    self._samplers: dict = {}
    self._unreported_compile_s = 0.0
    # Start-up seconds not yet in a run's summary (``take_startup``).
    self._unreported_startup = _no_startup(time.perf_counter() - started)
    if compile and self.mesh is None:
      self.executables(*self.initial(0)[:3])

  # ------------------------------------------------------------- building
  def _initial_state_program(self):
    """How this run makes its initial state: ``_initial_state`` op by op,
    or compiled as one program.

    On one CPU device, a small model's state is made op by op: that keeps
    the bits of ``model.init`` called on its own (a compiled program may
    fuse its math differently, by an ulp), and a process that builds many
    runs (a notebook, the test suite) compiles each operation once; as one
    program per run it cost the suite minutes of compiling. A model of many
    parameter arrays (a GPT), or any model on an accelerator, is one
    compiled program: op by op the default GPT's ~170 arrays took 6.3 s in
    every fresh process on a CPU (2.3-3.0 s compiled, 0.5 s loaded from the
    persistent cache; benchmarks/startup.py), and an accelerator compiles
    each eager operation too. Over several devices of one process, one
    program that writes each worker's state straight to its device: placing
    an eager state cost 0.4 s, and the compiled program comes from the
    persistent cache in a fresh process, where the ~70 eager operations
    compile again every time (2.5 s on the digits MLP). Making the first
    state on another thread while the programs compile was measured too: no
    faster on a 2-core CPU, the threads contend.
    """
    if self.mesh is not None and self.processes == 1:
      return jax.jit(self._initial_state, out_shardings=_mesh.shardings(
          self.abstract_state, self.specs[0], self.mesh))
    if self.mesh is None and _compiled_init(self.abstract_params):
      return jax.jit(self._initial_state)
    return self._initial_state

  def _seeded_state(self, key) -> _engine.SimState:
    """The initial state from ``key``. A compiled initial state is
    compiled ahead, once, and counted as compiling (``compile_s``, traced
    and compiled or loaded), not as making the state."""
    if not hasattr(self._init, "lower"):  # op by op
      return self._init(key)
    if self._init_compiled is None:
      (self._init_compiled,), seconds = self._compile(
          lambda: (self._init.lower(key),))
      self._unreported_startup["init_compile_s"] += seconds
    return self._init_compiled(key)

  def _compile(self, lower) -> tuple[tuple, float]:
    """``(compiled programs, seconds)`` of the programs ``lower()``
    returns (None stays None), their tracing and compiling (or loading)
    counted in the next run's ``compile_s`` and start-up breakdown."""
    start = time.perf_counter()
    lowered = lower()
    traced = time.perf_counter()
    compiled = tuple(None if program is None else program.compile()
                     for program in lowered)
    seconds = time.perf_counter() - start
    self._unreported_compile_s += seconds
    self._unreported_startup["trace_s"] += traced - start
    return compiled, seconds

  def _initial_state(self, key, params=None) -> _engine.SimState:
    """The state of a run from ``key``; every worker (and the DDP lane)
    starts from ``params`` when given (``init_from``), else from the model's
    initialisation."""
    c = self.config
    init_key, data_key, strategy_key, loss_key = jax.random.split(key, 4)
    if params is None:
      params = c.model.init(init_key, self.example)
    st = c.strategy.init(params, 1 if c.one_replica else c.num_workers,
                         strategy_key)
    if _narrow(c) is not None:
      st = _precision.cast_workers(st, _narrow(c))
    active = jnp.ones(c.num_workers, bool) if c.masks else None
    fleet = _pace.start(c.num_workers) if c.strategy.asynchronous else None
    traced = c.network is not None and (
        c.network.speed_trace is not None or
        c.network.bandwidth_trace is not None)
    time_s = jnp.zeros(2, jnp.float32) if traced else None
    shadow = None if c.shadow is None else _shadow.init(c.shadow, params)
    return _engine.SimState(st, data_key, loss_key, active, fleet, time_s,
                            shadow)

  def _reports(self) -> dict:
    """The shapes of what ``local`` and ``sync`` report (gradients have the
    parameters' shapes)."""
    strategy, st = self.config.strategy, self.abstract_state.strategy
    # On the state the engine computes with: stored worker state widened.
    wide = _precision.Precision(_narrow(self.config)).widen
    local = jax.eval_shape(lambda s: strategy.local(
        wide(s), wide(s).params_W), st)[1]
    sync = {} if strategy.sync is None else jax.eval_shape(
        lambda s: strategy.sync(wide(s)), st)[1]
    return {"local": local, "sync": sync}

  def _check_reports(self, reports: dict) -> list[str]:
    """The strategy's own metrics: its report entries that are not
    channels, each a float scalar (an integer one is a channel that
    ``channels()`` forgot to price)."""
    c, metrics = self.config, set()
    for fn, report in reports.items():
      for name, leaf in report.items():
        if name in self.strategy_channels:
          continue
        if not (getattr(leaf, "shape", None) == () and
                jnp.issubdtype(leaf.dtype, jnp.floating)):
          raise _validate.fail(
              "report", name,
              f"strategy {c.strategy.name!r}'s {fn} step reports it, but it "
              f"is not one of its channels "
              f"({', '.join(self.strategy_channels) or 'none'}); other "
              "entries are its own metrics and must be float scalars")
        metrics.add(name)
    return sorted(metrics)

  def _catch_up(self) -> dict:
    """With faults, the channel of a worker's return to the fleet: it
    downloads the global model and the outer optimizer's state (one
    worker's share of per-worker outer states)."""
    c = self.config
    if not c.masks or c.network.faults is None:
      return {}
    comm = self.abstract_state.strategy.comm
    outer = 0
    for field in (c.strategy.outer_places or {}).values():
      size = _strategy_bytes(getattr(comm, field, ()))
      outer += size // c.num_workers if field.endswith("_W") else size
    state = 4 * self.num_params + outer  # the global model in float32
    return {net_lib.CATCH_UP: net_lib.exchange(0, state, c.num_workers)}

  def _check_byzantine(self) -> None:
    """Byzantine workers need a strategy whose sync sends pseudo-gradients
    they can corrupt (the DiLoCo family); refused otherwise, not ignored."""
    c = self.config
    faults = None if c.network is None else c.network.faults
    if faults is None or not faults.byzantine:
      return
    strategy, st = c.strategy, self.abstract_state.strategy
    if strategy.sync is None or not transforms_lib.corrupts(
        strategy.sync, c.num_workers, st):
      raise _validate.fail(
          "byzantine", list(faults.byzantine), f"strategy {strategy.name!r} "
          "sends no pseudo-gradients a Byzantine worker could corrupt; "
          "Byzantine workers are modelled for the DiLoCo family (diloco, "
          "muloco, streaming_diloco, hierarchical_diloco)")

  def _plan_memory(self, local_report: dict) -> _memory.Plan:
    """The run's memory estimate and ``worker_batch`` (``_memory``)."""
    c = self.config
    can_group = not c.one_replica and self._why_not_groups(local_report) is None
    data_bytes = _memory.nbytes(self.eval_batches) + sum(
        4.0 * math.prod(x.shape) for x in c.data.train.values())
    return _memory.plan(c, self.abstract_state, self.abstract_params,
                        self.example, can_group, data_bytes,
                        _memory.per_step_bytes(c, self.metric_names,
                                               local_report),
                        len(self.strategy_channels) + 1)

  def _check_worker_batch(self, local_report: dict) -> None:
    c = self.config
    if c.worker_batch in (None, "auto"):
      return
    why = self._why_not_groups(local_report)
    if why is not None:
      raise _validate.fail(
          "worker_batch", c.worker_batch,
          f"strategy {c.strategy.name!r} {why}; worker_batch needs one whose "
          "inner steps are local and silent (diloco, muloco, fedavg, "
          "streaming_diloco, hierarchical_diloco, spes)")

  def _why_not_groups(self, local_report: dict) -> str | None:
    """Why the workers' steps cannot run in groups (each group runs a whole
    round on its own, ``_grouping.steps_in_groups``), or None."""
    if any(k in self.strategy_channels for k in local_report):
      return "communicates at every inner step"
    if self.config.strategy.asynchronous:
      return "runs each worker's steps on its own schedule"
    if self.config.redistributes:
      return "redistributes departed workers' data step by step"
    if self.config.strategy.time_budget:
      return "takes as many inner steps on each worker as its speed allows"
    if local_report:
      return ("reports metrics from its inner step, which groups would not "
              "log")
    return None

  def _make_mesh(self, key) -> None:
    c = self.config
    self.mesh = _mesh.make_mesh(c.devices)
    strategy_key = jax.random.split(key, 4)[2]
    sim_specs = _engine.SimState(
        _mesh.strategy_specs(c.strategy, self.abstract_params, c.num_workers,
                             strategy_key),
        _mesh.replicated(self.abstract_state.data_key),
        _mesh.replicated(self.abstract_state.loss_key),
        _mesh.active_specs(c.masks),
        _mesh.fleet_specs(c.strategy.asynchronous),
        _mesh.replicated(self.abstract_state.time_s),
        _mesh.replicated(self.abstract_state.shadow))
    sampler = c.data.build(c.num_workers, c.batch_size, 0)
    self.specs = (sim_specs, _mesh.sampler_specs(sampler))
    self.eval_batches = _mesh.place(
        self.eval_batches, _mesh.replicated(self.eval_batches), self.mesh)

  def _jit_single(self) -> Executables:
    p = self.programs
    return Executables(
        jax.jit(p.chunk, donate_argnums=0),
        None if p.tail is None else jax.jit(p.tail, donate_argnums=0),
        jax.jit(p.evaluate), jax.jit(p.global_params))

  def executables(self, state, sampler, net, jitted=None, key="run"):
    """``(compiled programs, state)`` for these arguments' shapes (cached).

    A new compilation also loads the executables with a chunk of zero rounds
    (one-off buffer and thread-pool set-up belongs with compiling, not with
    the run's throughput); it donates and returns ``state`` unchanged. The
    evaluation is compiled, not run: a run of it is a real evaluation (1.1 s
    of the default GPT's start on a CPU), whose one-off set-up (0.1 s) the
    first evaluation pays.
    """
    jitted = jitted or self._jitted
    sig = (key, _signature((state, sampler, net)))
    if sig not in self._cache:
      compiled, _ = self._compile(lambda: (
          jitted.chunk.lower(state, sampler, 1, net),
          None if jitted.tail is None
          else jitted.tail.lower(state, sampler, net),
          jitted.evaluate.lower(state, self.eval_batches),
          jitted.global_params.lower(state)))
      exe = Executables(*compiled)
      start = time.perf_counter()
      state, _ = exe.chunk(state, sampler, 0, net)
      jax.block_until_ready(state)
      self._cache[sig] = exe
      self._unreported_compile_s += time.perf_counter() - start
    return self._cache[sig], state

  def take_compile_s(self) -> float:
    """Seconds compiled since the last run reported it (the build's
    compilation is reported by the first run)."""
    seconds, self._unreported_compile_s = self._unreported_compile_s, 0.0
    return seconds

  def take_startup(self, compile_s: float, initial_s: float) -> dict:
    """Where a run's start-up went, in seconds: building the simulator
    (validation, data, memory plan; reported by its first run, 0 after),
    the initial state, tracing the programs and compiling or loading them
    (``compile_s`` less the tracing; 0 when they were compiled before), and
    the process's age when ``import lowbw`` finished (None off Linux)."""
    spent, self._unreported_startup = self._unreported_startup, _no_startup()
    return {"import_s": telemetry.import_s(), "build_s": spent["build_s"],
            "initial_state_s": max(initial_s - spent["init_compile_s"], 0.0),
            "trace_s": spent["trace_s"],
            "compile_load_s": max(compile_s - spent["trace_s"], 0.0)}

  def jit_points(self, sampler_axes, net_axes) -> Executables:
    """The programs vmapped over a leading axis of sweep points (state
    always; data and network leaves where ``*_axes`` say 0)."""
    p, single = self.programs, self._jitted
    key = (str(sampler_axes), str(net_axes))
    if key not in self._point_programs:
      tail = None if p.tail is None else jax.jit(jax.vmap(
          p.tail, in_axes=(0, sampler_axes, net_axes)), donate_argnums=0)
      self._point_programs[key] = Executables(
          jax.jit(jax.vmap(p.chunk, in_axes=(0, sampler_axes, None, net_axes)),
                  donate_argnums=0),
          tail,
          jax.jit(jax.vmap(p.evaluate, in_axes=(0, None))),
          jax.jit(jax.vmap(single.global_params)))
    return self._point_programs[key]

  @property
  def compilations(self) -> int:
    """How many argument signatures have been compiled (for tests)."""
    return len(self._cache)

  # ------------------------------------------------------- initial states
  def check_hparams(self, hparams, field: str = "hparams"):
    """(state values, network) for ``hparams``; one-line errors."""
    values = _hparams.check_names(field, hparams or {})
    state_values, net_values = _hparams.split(values)
    _hparams.check_state_knobs(self.abstract_state, self.config.strategy,
                               state_values)
    network = _hparams.set_network(self.config.network, net_values)
    if net_values:
      network = net_lib.check_network(network, self.config.num_workers)
    return state_values, network

  def sampler(self, seed: int):
    """The workers' shards for ``seed`` (the last few are kept)."""
    if seed not in self._samplers:
      c = self.config
      if len(self._samplers) >= 4:
        self._samplers.pop(next(iter(self._samplers)))
      self._samplers[seed] = c.data.build(c.num_workers, c.batch_size, seed)
    return self._samplers[seed]

  def pricing(self, network) -> net_lib.Pricing:
    """What ``network`` charges for this run, in one call
    (``network.price``): the logged wire bytes, the clock's seconds per
    message and per step. The one place a run's messages are priced (the
    bytes logged, the clock and config.json all read it)."""
    key = id(network)
    if key not in self._pricings:  # keyed by identity: networks are values
      if len(self._pricings) >= 8:
        self._pricings.pop(next(iter(self._pricings)))
      self._pricings[key] = (network, net_lib.price(
          network, self.priced_channels, self.config.num_workers,
          self.num_params, self.flops_per_step, steps=self.config.steps))
    return self._pricings[key][1]

  def net_params(self, network, seed: int):
    if network is None:
      return None
    return net_lib.net_params(network, self.config.num_workers,
                              self.pricing(network), seed)

  def initial(self, seed: int = 0, hparams: dict | None = None,
              init_from: str | None = None):
    """``(state, sampler, net, network)`` of a run from ``seed`` with
    ``hparams``, placed on the run's devices.

    ``state`` is the ``SimState`` every worker starts from (the parameters
    of the run folder ``init_from`` when given); ``net`` the traced network
    numbers (None without a network).
    """
    seed = _config.check_seed(seed)
    state_values, network = self.check_hparams(hparams)
    state = self._state(seed, state_values, self.start_params(init_from))
    sampler, net = self.sampler(seed), self.net_params(network, seed)
    if self.mesh is not None:
      sim_specs, sampler_specs = self.specs
      state = _mesh.place(state, sim_specs, self.mesh)
      sampler = _mesh.place(sampler, sampler_specs, self.mesh)
      if net is not None:
        net = _mesh.place(net, _mesh.replicated(net), self.mesh)
    return state, sampler, net, network

  def start_params(self, init_from: str | None):
    """The parameters in run folder ``init_from`` (its ``params.npz``), in
    the model's structure and types, or None; a folder written by another
    model is an error naming ``init_from``."""
    if init_from is None:
      return None
    if not isinstance(init_from, (str, os.PathLike)) or not str(init_from):
      raise _validate.fail("init_from", init_from, "expected the path of a "
                           "finished run's folder (holding params.npz)")
    try:
      return telemetry.load_params(init_from, like=self.abstract_params)
    except _validate.ConfigError as e:
      raise _validate.fail("init_from", init_from, e.allowed) from None

  def _state(self, seed: int, state_values: dict, params=None):
    """The initial ``SimState`` of ``seed`` with traced ``state_values``
    set (on one device), from ``params`` when given."""
    key = jax.random.PRNGKey(seed)
    state = (self._seeded_state(key) if params is None
             else self._initial_state(key, params))
    if state_values:  # a few small arrays: not worth compiling a program
      state = _hparams.set_state(state, state_values, self.config.strategy)
    return state

  def fetch(self, tree):
    """Device outputs (replicated) as numpy, whichever process holds them."""
    return jax.device_get(tree) if self.mesh is None else _mesh.to_host(tree)

  # ------------------------------------------------------------------ runs
  def run(self, seed: int = 0, hparams: dict | None = None,
          log_dir: str | None = None, checkpoint_every: int | None = None,
          resume_from: str | None = None, progress: bool | None = None,
          callback=None, metadata: dict | None = None,
          overwrite: bool = False,
          wandb_project: str | None = None,
          fail_on_divergence: bool = False,
          config_yaml: str | None = None,
          init_from: str | None = None) -> Result:
    """Runs the simulation once; see ``lowbw.simulate`` for the arguments.

    Args:
      seed: seeds initialisation, sharding, sampling and the strategy's keys.
      hparams: traced values for this run, e.g. ``{"inner_lr": 3e-3,
        "bandwidth": "100Mbps"}`` (names: ``Simulator.hparam_names``); they
        replace the strategy's and the network's values without compiling.

    Raises:
      ValueError: a bad argument, naming it.
      NonFiniteLossError: a worker's loss became NaN/inf; logs are kept.
      DivergenceError: with ``fail_on_divergence``, the loss ended far above
        its start or accuracy at or below chance; logs are kept.

    ``config_yaml``: the run's ``lowbw.Config`` as YAML, written to
    ``log_dir/config.yaml`` before the first step (``lowbw train --config``
    repeats the run from it).

    ``init_from``: a finished run's folder; every worker (and the DDP lane)
    starts from its final parameters (``params.npz``) instead of the
    model's initialisation, e.g. DiLoCo from a DDP warm-up as the DiLoCo
    paper does. Optimizer states start fresh; the seed still sets the data
    order and the keys.
    """
    c = self.config
    if not isinstance(fail_on_divergence, bool):
      raise _validate.fail("fail_on_divergence", fail_on_divergence,
                           "expected True or False")
    seed = _config.check_seed(seed)
    checkpoint_every = _config.multiple_of_period(
        "checkpoint_every", checkpoint_every, c.period)
    _resume.check_paths(log_dir, checkpoint_every, resume_from)
    _config.check_processes(checkpoint_every, resume_from)
    _logdir.prepare(log_dir, resuming=_resume.continues(log_dir, resume_from),
                    overwrite=overwrite, create=self.main_process)
    if wandb_project is not None:
      _validate.non_empty_str("wandb_project", wandb_project)
      telemetry.import_wandb("wandb_project", wandb_project)
    start = time.perf_counter()
    state, sampler, net, network = self.initial(seed, hparams, init_from)
    initial_s = time.perf_counter() - start
    if config_yaml is not None and log_dir and self.main_process:
      telemetry.write_text(os.path.join(log_dir, "config.yaml"), config_yaml)
    config = self.describe(seed, network, hparams, metadata)
    if init_from is not None:
      config["init_from"] = os.path.abspath(init_from)
    track = Track(self, c.default_log_every, network, log_dir, callback,
                  config)
    wall_offset = 0.0
    if resume_from is not None:
      state, wall_offset = _resume.restore(self, resume_from, track, state,
                                           c.log_every is not None)
    exe, state = self.executables(state, sampler, net)
    compile_s = self.take_compile_s()
    track.startup = self.take_startup(compile_s, initial_s)
    show = telemetry.is_terminal() if progress is None else progress
    bar = (telemetry.ProgressBar(c.steps, initial=track.history.step)
           if show and self.main_process else None)
    save = _resume.saver(log_dir, track) if checkpoint_every else None
    track.open_writers(resume_from is not None, wandb_project)
    started = time.perf_counter() - wall_offset
    track.training_started = time.perf_counter()
    try:
      state, elapsed = drive(self, exe, state, sampler, net, [track],
                             track.history.step, self.fetch,
                             checkpoint_every=checkpoint_every, save=save,
                             bar=bar, wall_offset=wall_offset)
    except KeyboardInterrupt:
      # Ctrl-C: the summary of what ran, next to the rows already written.
      summary = track.summary(compile_s, time.perf_counter() - started)
      summary["interrupted_at_step"] = track.history.step
      track.write_summary(summary)
      raise
    finally:
      track.close()
      if bar:
        bar.close()
    summary = track.summary(compile_s, elapsed)
    track.write_summary(summary)
    diverged = track.divergence()
    if fail_on_divergence and diverged is not None:
      raise DivergenceError(diverged.text, diverged.step, summary)
    for text in summary["warnings"]:
      warnings.warn(text, RunWarning, stacklevel=2)
    params = exe.global_params(state)
    if self.processes > 1:  # a copy this process can read
      params = jax.tree.map(lambda x: x.addressable_data(0), params)
    if log_dir and self.main_process:
      self._save_model(log_dir, params)
    return Result(track.history.as_arrays(), params, state, summary, config,
                  log_dir)

  def _save_model(self, log_dir: str, params) -> None:
    """The final global parameters (``params.npz``) and the tokenizer the
    data was made with, so that ``lowbw.load`` and ``lowbw generate`` need
    nothing else."""
    telemetry.save_params(log_dir, params)
    tokenizer = getattr(self.config.data, "tokenizer", None)
    if tokenizer is not None:
      shutil.copyfile(tokenizer, os.path.join(log_dir, "tokenizer.json"))

  # ------------------------------------------------------------ description
  def describe(self, seed: int, network, hparams=None, metadata=None) -> dict:
    """The run's configuration as written to config.json."""
    c = self.config
    return {
        "model": c.model.config, "data": c.data.config,
        "strategy": c.strategy.config, "num_workers": c.num_workers,
        "batch_size": c.batch_size, "steps": c.steps, "seed": seed,
        "hparams": _hparams.jsonable(hparams or {}),
        "eval_every": c.eval_every, "log_every": c.default_log_every,
        "eval_examples": c.eval_examples, "num_params": self.num_params,
        "channels": {k: ch._asdict() for k, ch in self.channels.items()},
        "network": None if network is None else {
            **network.describe(),
            "compute_s_per_step": self.pricing(network).step_s,
            "comm_s_per_event": {
                name: cost.seconds
                for name, cost in self.pricing(network).clock_costs.items()}},
        "jax_version": jax.__version__, "backend": jax.default_backend(),
        "worker_dtype": c.worker_dtype, "worker_batch": c.worker_batch,
        # only when set: configurations (and checkpoints) from before match
        **({"minibatch_size": c.minibatch_size} if c.minibatch_size else {}),
        **({"autocast": c.autocast} if c.autocast != "float32" else {}),
        **({"correlation_every": c.correlation_every}
           if c.correlation_every else {}),
        **({"eval_local": True} if c.eval_local else {}),
        **({"shadow": {"name": "ddp",
                       "inner": strategies_lib.describe(c.shadow)}}
           if c.shadow is not None else {}),
        "memory": self.memory.describe(),
        "devices": c.devices, "processes": self.processes,
        "metadata": dict(metadata or {}),
    }

  def columns(self) -> list[str]:
    c = self.config
    lm = c.is_lm
    cols = [names.STEP, names.EXAMPLES] + ([names.TOKENS] if lm else [])
    cols += [names.TRAIN_LOSS] + [names.train_metric(m)
                                  for m in self.metric_names]
    cols += [names.TRAIN_PERPLEXITY] if lm else []
    cols += [names.EVAL_LOSS] + [names.eval_metric(m)
                                 for m in self.metric_names]
    cols += [names.EVAL_PERPLEXITY] if lm else []
    if c.shadow is not None:
      cols += [names.SHADOW_EVAL_LOSS, names.SHADOW_GAP]
    if c.eval_local:
      cols += [names.EVAL_LOCAL_LOSS, names.EVAL_LOCAL_LOSS_STD] + [
          names.eval_metric("local_" + m) for m in self.metric_names]
    cols += [names.PAYLOAD_BYTES, names.WIRE_BYTES, names.SENT_BYTES,
             names.RECEIVED_BYTES]
    cols += [names.tier_wire_bytes(t) for t in tiers_of(self.channels)]
    cols += [names.PEAK_STEP_BYTES,
             names.WORKER_DIVERGENCE,
             names.LR]
    cols += [names.WORKER_CORRELATION] if c.correlation_every else []
    if c.network is not None:
      cols += [names.SIM_TIME_S, names.SYNC_WORKERS]
      cols += [names.WORKERS_UP] if c.masks else []
    cols += [names.strategy_metric(m) for m in self.strategy_metric_names]
    cols += [names.WALL_TIME_S]
    return cols


def _narrow(c: _config.RunConfig):
  return None if c.worker_dtype == "float32" else jnp.bfloat16


def _no_startup(build_s: float = 0.0) -> dict:
  """Start-up seconds not yet reported: building, tracing, and compiling
  the initial state (inside ``initial_s``, reported as compiling)."""
  return {"build_s": build_s, "trace_s": 0.0, "init_compile_s": 0.0}


def _signature(tree):
  leaves, treedef = jax.tree.flatten(tree)
  return treedef, tuple((tuple(x.shape), str(x.dtype)) for x in leaves)


# Parameter arrays past which a one-device CPU run makes its initial state
# as one compiled program rather than op by op (see
# ``Simulator._initial_state_program``):
# the built-in MLP and CNN have 4 to 8, a GPT 17 or more.
EAGER_INIT_MAX_ARRAYS = 16


def _compiled_init(abstract_params) -> bool:
  return (jax.default_backend() != "cpu"
          or len(jax.tree.leaves(abstract_params)) > EAGER_INIT_MAX_ARRAYS)


def _strategy_bytes(tree) -> int:
  return sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(tree))


def build(model, data, strategy, *, compile: bool = True,
          compile_cache: bool | str = True, **settings) -> Simulator:
  """Validates a run configuration and compiles its programs, once.

  The arguments are ``lowbw.simulate``'s that fix the compiled program
  (shapes and structure). Run it with ``Simulator.run(seed=...,
  hparams=...)`` as often as needed, or sweep it with ``lowbw.sweep``.

  Args:
    compile: compile now (default); False compiles at the first run.
    compile_cache: JAX's persistent compilation cache (``_compile_cache``):
      True (default) in ``$LOWBW_COMPILE_CACHE`` or ``~/.cache/lowbw/xla``,
      a folder, or False to leave JAX's settings alone. An identical
      configuration built again, in any process, then loads its programs
      instead of compiling them.

  Raises:
    ValueError: a bad argument, naming it, before anything is compiled.

  Example:
    >>> sim = lowbw.build(model=models.mlp(hidden=(64,)), data=data.digits(),
    ...                   strategy=strategies.diloco(H=20), num_workers=8,
    ...                   steps=400)
    >>> a = sim.run(seed=0, hparams={"inner_lr": 1e-3})
    >>> b = sim.run(seed=1, hparams={"inner_lr": 3e-3})   # no compilation
  """
  started = time.perf_counter()
  config = _config.configure(model, data, strategy, **settings)
  _compile_cache.enable(_compile_cache.check(compile_cache))
  return Simulator(config, compile=compile, started=started)


# The settings (``check_settings``'s, one list) show in build's signature.
_options.compose(build, _options.keywords(_config.check_settings,
                                          skip=("strategy",)))
