"""``lowbw.build``: a validated, compiled simulator that runs many times.

Flow: ``configure`` (validation, no device work) -> ``Simulator`` (static
facts: abstract parameters, channels and their bytes, evaluation data, the
engine's functions, compiled executables) -> ``Simulator.run`` (an initial
state for a seed and traced hyperparameters, the host loop, a ``Result``).

The simulator compiles and runs; the rest is in named parts, each in its own
module: the build's facts (``_facts``), the memory plan (``_plan``), what
networks charge (``_prices``), the compiled programs and start-up seconds
(``_startup``), a run's inputs (``_inputs``) and its output schema
(``_schema``).

Executables are cached by the shapes of their arguments, so a second run with
another seed, learning rate or bandwidth reuses them; only a seed that changes
a shape (Dirichlet shards of another size) compiles again.
"""

import dataclasses
import os
import time
import warnings

import jax
import jax.numpy as jnp

from lowbw import _validate
from lowbw.telemetry import _cost, _params, _progress, _writers
from lowbw.config import _settings as _config
from lowbw.simulation import (_bits, _density, _engine, _facts,
                              _hparams, _inputs, _lanes, _logdir, _memory,
                              _mesh, _periods, _plan, _prices, _resume,
                              _schema, _startup)
from lowbw.simulation._loop import Drive, drive
from lowbw.simulation import _divergence
from lowbw.simulation._divergence import DivergenceError
from lowbw.simulation._history import NonFiniteLossError
from lowbw.simulation._result import Result
from lowbw.simulation._track import RunWarning, Track


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
    facts, memory, prices, compiled, inputs, schema: its named parts.
    lanes: the counterfactual lanes, ``(name, Simulator, changed
      settings)`` each (``_lanes``): stepped in this simulator's programs;
      a lane whose data are the run's (``_lanes.shares_data``) holds the
      run's evaluation batches and, in a run, takes its sampler.
  """

  hparam_names = tuple(_hparams.KNOBS)
  # The build a view was made from (``at``), None for a build; a build's
  # views by (H, density, bits).
  _view_of = None
  _views: dict | None = None
  # With a traced H (``_periods``): the config's strategy at another H.
  strategy_at = None
  # With a traced top-k density (``_density``) or quantizer width
  # (``_bits``): the config's strategy at an H and a codec spec, and the
  # build's density and width (the largest a run takes).
  codec_at = None
  density_max = None
  bits_max = None

  def __init__(self, config: _config.RunConfig, compile: bool = True,
               started: float | None = None, lanes: tuple = (),
               eval_batches=None, compile_effort: str = "auto",
               recipe: str | None = None):
    # ``compile_effort``: how hard XLA optimises, for one run's work
    # (``_startup.compiler_options``).
    started = time.perf_counter() if started is None else started
    _lanes.check(config, lanes)
    # ``eval_batches``: a lane's, its run's own arrays (``_lanes``).
    self.eval_batches = eval_batches if eval_batches is not None else (
        jax.tree.map(jnp.asarray,
                     config.data.eval_batches(config.eval_examples)))
    shared = [_lanes.shares_data(config, lane) for _, lane, _ in lanes]
    self._views = {}
    self.lanes = tuple(
        (name, Simulator(lane, compile=False, eval_batches=(
            self.eval_batches if share else None)), changed)
        for (name, lane, changed), share in zip(lanes, shared))
    self.processes = jax.process_count()
    self.main_process = jax.process_index() == 0
    facts = self.facts = _facts.learn(config)
    self.example, self.abstract_params = facts.example, facts.abstract_params
    self.metric_names, self.num_params = facts.metric_names, facts.num_params
    self.abstract_state = facts.abstract_state
    self.strategy_channels = facts.strategy_channels
    self.strategy_metric_names = facts.strategy_metric_names
    self.memory = _memory.with_lanes(
        _plan.memory_plan(config, facts, self.eval_batches),
        [sim.memory for _, sim, _ in self.lanes], shared)
    c = self.config = dataclasses.replace(
        config, worker_batch=self.memory.worker_batch)
    _periods.check_grouping(c)
    self.slots = c.period  # step slots of a round (a traced H's largest)
    self.prices = _prices.Prices(c, facts)
    self.priced_channels = self.prices.priced_channels
    self.flops_per_token = self.prices.flops_per_token
    self.flops_per_step = self.prices.flops_per_step
    self.channels = self.prices.channels(c.network)
    self.mesh = self.specs = None
    if c.devices > 1 or self.processes > 1:
      self.mesh, self.specs = _inputs.place_mesh(c, facts,
                                                 jax.random.PRNGKey(0))
      self.eval_batches = _mesh.place(
          self.eval_batches, _mesh.replicated(self.eval_batches), self.mesh)
    self.programs = _engine.build(c, _engine.Parts(
        tuple(self.strategy_channels), self.mesh, self.specs))
    if self.lanes:
      self.programs = _lanes.combine(
          [self.programs] + [sim.programs for _, sim, _ in self.lanes],
          [1] + [_lanes.ratio(c, sim.config) for _, sim, _ in self.lanes],
          c.tail_steps)
    work = self.flops_per_step * c.workers * c.steps
    # ``recipe``: the build's configuration as plain values, which keys its
    # executables on disk (``_exe_store``); None keeps none.
    self.compiled = _startup.Compiled(
        self.programs, self.eval_batches, time.perf_counter() - started,
        _startup.compiler_options(compile_effort, work),
        None if self.lanes else recipe)
    self.inputs = _inputs.Inputs(c, facts, self.mesh, self.specs,
                                 self.compiled, self.prices)
    self.schema = _schema.Schema(c, facts, self.channels, self.memory,
                                 self.prices)
    if compile and self.mesh is None:
      self.executables(*self.initial(0)[:3])

  # ------------------------------------------------- compiled programs
  def executables(self, state, sampler, net, jitted=None, key="run"):
    """``(compiled programs, state)`` for these arguments' shapes (cached;
    ``_startup.Compiled.executables``)."""
    return self.compiled.executables(state, sampler, net, jitted, key)

  def jit_points(self, sampler_axes, net_axes):
    """The programs vmapped over a leading axis of sweep points."""
    return self.compiled.jit_points(sampler_axes, net_axes)

  def take_compile_s(self) -> float:
    """Seconds compiled since the last run reported it."""
    return self.compiled.take_compile_s()

  @property
  def compilations(self) -> int:
    """How many argument signatures have been compiled (for tests)."""
    return self.compiled.compilations

  # ------------------------------------------------------------ inputs
  def initial(self, seed: int = 0, hparams: dict | None = None,
              init_from: str | None = None):
    """``(state, sampler, net, network)`` of a run from ``seed`` with
    ``hparams``, placed on the run's devices.

    ``state`` is the ``SimState`` every worker starts from (the parameters
    of the run folder ``init_from`` when given); ``net`` the traced network
    numbers (None without a network).
    """
    traced, hparams = self._traced(hparams)
    if traced != (None, None, None):
      return self.at(*traced).initial(seed, hparams, init_from)
    if self.lanes:
      return _lanes.initial(self.inputs, self.lanes, seed, hparams,
                            init_from)
    state, sampler, net, network = self.inputs.initial(seed, hparams,
                                                       init_from)
    state = _periods.with_period(state, self.config)
    state = _density.with_counts(state, self.config)
    return _bits.with_levels(state, self.config), sampler, net, network

  def _traced(self, hparams) -> tuple:
    """``((H, density, bits), the other hparams)``: a run's values of the
    fields this build traces (None where not given or not traced)."""
    H, hparams = _periods.split(hparams, self.config)
    D, hparams = _density.split(hparams, self.config)
    B, hparams = _bits.split(hparams, self.config)
    return (H, D, B), hparams

  def at_period(self, H: int) -> "Simulator":
    """This build as a run with sync period ``H`` sees it, on the same
    programs (a build with a traced H, ``_periods``)."""
    return self.at(H)

  def at(self, H: int | None = None, density: float | None = None,
         bits: int | None = None) -> "Simulator":
    """This build as a run with sync period ``H``, top-k ``density`` and
    quantizer ``bits`` sees it (None: as this simulator has it), on the
    same programs (a build with that value traced: ``_periods``,
    ``_density``, ``_bits``). A view at another H keeps this one's
    density and width."""
    if H is not None and density is None and self.config.traced_density:
      density = _density.fraction_of(self.config.strategy)
    if H is not None and bits is None and self.config.traced_bits:
      bits = _bits.bits_of(self.config.strategy)
    # A study asks for the same few views once or twice per point (its
    # check of the point's values, its run): the build keeps them; a view
    # of a view is made afresh.
    views = self._views if self._view_of is None else {}
    if (H, density, bits) not in views:
      view = self if H is None else _periods.view(self, H)
      view = view if density is None else _density.view(view, density)
      view = view if bits is None else _bits.view(view, bits)
      if view is not self:
        view._view_of, view._views = self, None
      views[H, density, bits] = view
    return views[H, density, bits]

  def check_hparams(self, hparams, field: str = "hparams"):
    """(state values, network) for ``hparams``; one-line errors."""
    (H, D, B), hparams = self._traced(hparams)
    view = self if H is None else self.at_period(H)
    if D is not None:  # checked, without pricing its view
      _density.check_density(view, D)
    if B is not None:
      _bits.check_bits(view, B)
    return self.inputs.check_hparams(hparams, field)

  def pricing(self, network):
    """What ``network`` charges for this run (``_prices.Prices``)."""
    return self.prices.pricing(network)

  def net_params(self, network, seed: int):
    return self.prices.net_params(network, seed)

  def fetch(self, tree):
    """Device outputs (replicated) as numpy, whichever process holds them."""
    return jax.device_get(tree) if self.mesh is None else _mesh.to_host(tree)

  # ------------------------------------------------------------ schema
  def describe(self, seed: int, network, hparams=None, metadata=None) -> dict:
    """The run's configuration as written to config.json."""
    return self.schema.describe(seed, network, hparams, metadata)

  def columns(self) -> list[str]:
    cols = self.schema.columns()
    return cols + _lanes.columns(self.lanes, cols)

  # ------------------------------------------------------------------ runs
  def run(self, seed: int = 0, hparams: dict | None = None,
          out: str | None = None, checkpoint_every: int | None = None,
          resume_from: str | None = None, progress: bool | None = None,
          callback=None, metadata: dict | None = None,
          overwrite: bool = False,
          wandb_project: str | None = None,
          fail_on_divergence: bool = False,
          config_yaml: str | None = None,
          init_from: str | None = None,
          gpu_price: float | None = None,
          egress_price: float | None = None,
          allow_non_finite: bool = False) -> Result:
    """Runs the simulation once; see ``lowbw.simulate`` for the arguments.

    Args:
      seed: seeds initialisation, sharding, sampling and the strategy's keys.
      out: the log folder (none when None).
      hparams: traced values for this run, e.g. ``{"inner_lr": 3e-3,
        "bandwidth": "100Mbps"}`` (names: ``Simulator.hparam_names``); they
        replace the strategy's and the network's values without compiling.

    Raises:
      ValueError: a bad argument, naming it.
      NonFiniteLossError: a worker's loss became NaN/inf; logs are kept.
      NonFiniteModelError: the final model, evaluation or simulated time
        is not finite (unless ``allow_non_finite``); logs are kept.
      DivergenceError: with ``fail_on_divergence``, the loss ended far above
        its start or accuracy at or below chance; logs are kept.

    ``config_yaml``: the run's ``lowbw.Config`` as YAML, written to
    ``out/config.yaml`` before the first step (``lowbw train --config``
    repeats the run from it).

    ``init_from``: a finished run's folder; every worker (and the DDP lane)
    starts from its final parameters (``params.npz``) instead of the
    model's initialisation, e.g. DiLoCo from a DDP warm-up as the DiLoCo
    paper does. Optimizer states start fresh; the seed still sets the data
    order and the keys.

    ``gpu_price``, ``egress_price``: dollars per GPU-hour and per GB sent;
    the summary's ``compute_cost_usd``, ``traffic_cost_usd`` and
    ``cost_usd`` (``lowbw.telemetry._cost``).
    """
    _validate.boolean("allow_non_finite", allow_non_finite)
    _periods.check_run(self.config, checkpoint_every, resume_from)
    traced, rest = self._traced(hparams)
    if traced != (None, None, None):
      return self.at(*traced).run(
          seed, rest, out, checkpoint_every, resume_from, progress, callback,
          metadata, overwrite, wandb_project, fail_on_divergence,
          config_yaml, init_from, gpu_price, egress_price, allow_non_finite)
    seed, checkpoint_every, lock = self._check_run(
        seed, out, checkpoint_every, resume_from, overwrite,
        wandb_project, fail_on_divergence)
    try:
      prices = _cost.check_prices(gpu_price, egress_price,
                                  clock=self.config.network is not None)
      start = time.perf_counter()
      state, sampler, net, network = self.initial(seed, hparams, init_from)
      initial_s = time.perf_counter() - start
      if config_yaml is not None and out and self.main_process:
        _writers.write_text(os.path.join(out, "config.yaml"), config_yaml)
      config = self.describe(seed, network, hparams, metadata)
      if init_from is not None:
        config["init_from"] = os.path.abspath(init_from)
      track = _lanes.track(Track(self, self.config.default_log_every,
                                 network, out, callback, config),
                           self.lanes, hparams)
      track.prices = prices
      wall_offset = 0.0
      if resume_from is not None:
        state, wall_offset = _resume.restore(self, resume_from, track, state,
                                             self.config.log_every is not None)
      exe, state = self.executables(state, sampler, net)
      compile_s = self.take_compile_s()
      track.startup = self.compiled.take_startup(compile_s, initial_s)
      how = Drive(checkpoint_every=checkpoint_every,
                  save=_resume.saver(out, track) if checkpoint_every
                  else None,
                  bar=self._bar(progress, track), wall_offset=wall_offset)
      track.open_writers(resume_from is not None, wandb_project)
      state, elapsed = self._drive(exe, state, sampler, net, track, how,
                                   compile_s)
      summary = self._summary(track, compile_s, elapsed, fail_on_divergence)
      params = self._final_params(exe, state, out)
      self._check_end(track, summary, params, allow_non_finite)
      return Result(track.history.as_arrays(), params, state, summary, config,
                    out)
    finally:
      if lock is not None:  # one writer per folder, until this one stops
        lock.release()

  def _check_run(self, seed, out, checkpoint_every, resume_from,
                 overwrite, wandb_project, fail_on_divergence):
    """``run``'s own arguments checked, before any device work; returns
    the seed, ``checkpoint_every`` and the folder's lock (None without
    ``out``). Prepares ``out``, whose lock it takes first."""
    if not isinstance(fail_on_divergence, bool):
      raise _validate.fail("fail_on_divergence", fail_on_divergence,
                           "expected True or False")
    seed = _config.check_seed(seed)
    checkpoint_every = _config.multiple_of_period(
        "checkpoint_every", checkpoint_every, self.config.period)
    _resume.check_paths(out, checkpoint_every, resume_from)
    if self.lanes and (checkpoint_every or resume_from):
      raise _validate.fail(
          "checkpoint_every" if checkpoint_every else "resume_from",
          checkpoint_every or resume_from, "a run with lanes is not "
          "checkpointed yet; run it without checkpoints")
    if wandb_project is not None:
      _validate.non_empty_str("wandb_project", wandb_project)
      _writers.import_wandb("wandb_project", wandb_project)
    # Process 0 alone holds and checks the folder: the others write
    # nothing there but their part of each checkpoint, and would take
    # process 0's first files for another run's.
    lock = _logdir.prepare(out, resuming=_resume.continues(out, resume_from),
                           overwrite=overwrite, lock=True) if (
                               self.main_process) else None
    return seed, checkpoint_every, lock

  def _bar(self, progress, track):
    show = _progress.is_terminal() if progress is None else progress
    return (_progress.ProgressBar(self.config.steps,
                                  initial=track.history.step)
            if show and self.main_process else None)

  def _drive(self, exe, state, sampler, net, track, how, compile_s):
    """The host loop; on Ctrl-C, the summary of what ran next to the rows
    already written."""
    started = time.perf_counter() - how.wall_offset
    track.training_started = time.perf_counter()
    try:
      return drive(self, exe, state, sampler, net, [track], how)
    except KeyboardInterrupt:
      summary = track.summary(compile_s, time.perf_counter() - started)
      summary["interrupted_at_step"] = track.history.step
      summary["ended"] = "interrupted"
      track.write_summary(summary)
      raise
    except NonFiniteLossError as e:
      summary = track.summary(compile_s, time.perf_counter() - started)
      summary.update(ended="non_finite_loss", stopped_at_step=e.stopped_at,
                     non_finite_worker=e.worker, non_finite_step=e.step,
                     non_finite_quantity=e.quantity)
      track.write_summary(summary)
      raise
    finally:
      track.close()
      if how.bar:
        how.bar.close()

  def _summary(self, track, compile_s, elapsed, fail_on_divergence) -> dict:
    """The run's summary, written (``ended``: how the run ended); its
    warnings warned, or a ``DivergenceError`` with ``fail_on_divergence``."""
    summary = track.summary(compile_s, elapsed)
    diverged = track.divergence()
    failing = fail_on_divergence and diverged is not None
    summary["ended"] = "diverged" if failing else "completed"
    track.write_summary(summary)
    if failing:
      raise DivergenceError(diverged.text, diverged.step, summary)
    for text in summary["warnings"]:
      # Attributed to the caller of ``run``, as before this helper.
      warnings.warn(text, RunWarning, stacklevel=3)
    return summary

  @staticmethod
  def _check_end(track, summary: dict, params, allow: bool) -> None:
    """A non-finite final model, evaluation or simulated time: a
    ``NonFiniteModelError`` (the summary rewritten saying so), or with
    ``allow`` a warning."""
    text = _divergence.non_finite_end(summary, params, track.history.rows)
    if text is None:
      return
    summary["warnings"].append(f"the run ended with {text}")
    summary["ended"] = "completed" if allow else "non_finite_model"
    track.write_summary(summary)
    if not allow:
      raise _divergence.NonFiniteModelError(text, summary)
    warnings.warn(summary["warnings"][-1], RunWarning, stacklevel=3)

  def _final_params(self, exe, state, log_dir):
    """The final global parameters, saved in ``log_dir`` with the
    tokenizer the data was made with (``params.npz``, ``tokenizer.json``),
    so that ``lowbw.load`` and ``lowbw generate`` need nothing else."""
    params = exe.global_params(state)
    if self.processes > 1:  # a copy this process can read
      params = jax.tree.map(lambda x: x.addressable_data(0), params)
    if log_dir and self.main_process:
      _params.save_params(log_dir, params)
      tokenizer = getattr(self.config.data, "tokenizer", None)
      if tokenizer is not None:  # atomic, a full disk named (WriteError)
        with open(tokenizer, "rb") as f:
          _writers.write_bytes(os.path.join(log_dir, "tokenizer.json"),
                               f.read(), log_dir)
    return params
