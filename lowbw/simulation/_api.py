"""``lowbw.simulate`` and ``lowbw.build``: a ``lowbw.Config``, given or made
of the keywords, built into a ``Simulator`` (and run)."""

import functools
import time

from lowbw import _validate
from lowbw.config import Config, _settings
from lowbw.config._config import FIELDS
from lowbw.config._resolve import build_data, build_model, pipeline
from lowbw.simulation import (_bits, _codec_views, _compile_cache, _density,
                              _exe_store, _periods, _startup)
from lowbw.simulation._result import Result
from lowbw.simulation._simulator import Simulator

# What a call may give besides the config's fields: what to do with the log
# folder, hooks, values for one run of a build, the compilation cache.
RUN_OPTIONS = {"overwrite": False, "callback": None, "metadata": None,
               "hparams": None, "resume_from": None, "compile_cache": True,
               "compile_effort": "auto"}
BUILD_OPTIONS = {"compile": True, "compile_cache": True, "traced": (),
                 "compile_effort": "auto"}
# The parts a call may give by position, in this order.
POSITIONAL = ("model", "data", "strategy")


def engine_config(config: Config, parts=None) -> _settings.RunConfig:
  """The engine's record of ``config``: the data and the model made, the
  strategy, the network and the settings as the config checked them when
  it was made (nothing is checked or built twice). ``parts``: the
  ``(model, data)`` of the run a lane belongs to, shared with it."""
  s = {name: getattr(config, name) for name in FIELDS}
  built = config.built()
  checked = dict(built.checked)
  if config.lanes or parts is not None:
    # Lanes share one device (``_lanes.check``): lowbw's own choice of
    # devices gives way; a given one is refused there.
    if checked["auto_devices"]:
      checked.update(devices=1, auto_devices=False)
  if parts is None:
    source = build_data(s)
    parts = (build_model(s, source), source)
  checked["pipeline"] = pipeline(s, parts[0])
  return _settings.engine_config(*parts, built.strategy, checked)


def lane_configs(config: Config, record: _settings.RunConfig) -> tuple:
  """``(name, RunConfig, reset)`` of each of ``config``'s counterfactual
  lanes, on the run's model and data; ``reset``: the settings the lane
  drops or sets, and their traced values' names (``Field.knob``), which
  the run's traced values never reach."""
  def knobs(reset):
    return tuple(sorted({*reset, *(FIELDS[k].knob for k in reset
                                   if k in FIELDS and FIELDS[k].knob)}))
  return tuple(
      (name, engine_config(lane, (record.model, record.data)), knobs(reset))
      for name, lane, reset in config.built().lanes)


def build_config(config: Config, compile: bool = True,
                 compile_cache=True, traced=(),
                 compile_effort="auto") -> Simulator:
  """The simulator of ``config`` (``engine_config``), with its lanes;
  ``traced=("H",)``: H a traced value (``_periods``), ``("density",)``
  top-k's fraction (``_density``), ``("bits",)`` a linear quantizer's
  width (``_bits``); ``compile_effort``:
  ``_startup.compiler_options``."""
  started = time.perf_counter()
  _startup.check_effort(compile_effort)
  traced = _periods.check(config, traced)
  record = engine_config(config)
  if traced:
    if config.lanes:
      raise _validate.fail("traced", traced, "not supported with lanes")
    if "H" in traced:
      record = _periods.record(record)
    if "density" in traced:
      record = _density.record(record)
    if "bits" in traced:
      record = _bits.record(record)
  cache = _compile_cache.check(compile_cache)
  _compile_cache.enable(cache)
  sim = Simulator(record, compile=compile, started=started,
                  lanes=lane_configs(config, record),
                  compile_effort=compile_effort,
                  recipe=None if cache is False or {"density", "bits"} &
                  set(traced) else _exe_store.recipe(config, traced))
  if "H" in traced:
    sim.strategy_at = functools.partial(_periods.strategy_at, config)
  if {"density", "bits"} & set(traced):
    sim.codec_at = functools.partial(_codec_views.strategy_at, config)
  if "density" in traced:
    sim.density_max = _density.fraction_of(record.strategy)
  if "bits" in traced:
    sim.bits_max = _bits.bits_of(record.strategy)
  return sim


def yaml_or_none(config: Config) -> str | None:
  """``config`` as YAML, or None when it holds a Python object (a model,
  dataset, strategy or network given as an object: such a run writes
  config.json only)."""
  try:
    return config.to_yaml()
  except _validate.ConfigError:
    return None


def run_config(sim: Simulator, config: Config, **options) -> Result:
  """Runs ``sim`` (built from ``config``) with the config's run fields,
  writing ``config.yaml`` to the log folder when the config can be;
  ``options`` are further ``Simulator.run`` arguments (or override one, such
  as ``progress``)."""
  out = options.get("out", config.out)
  # Rendered only for a folder to write it to (a study's points without
  # one spent 4 ms each on it).
  args = dict(seed=config.seed, out=config.out,
              checkpoint_every=config.checkpoint_every,
              progress=config.progress, wandb_project=config.wandb_project,
              fail_on_divergence=config.fail_on_divergence,
              allow_non_finite=config.allow_non_finite,
              gpu_price=config.gpu_price, egress_price=config.egress_price,
              config_yaml=yaml_or_none(config) if out else None,
              init_from=config.init_from)
  return sim.run(**{**args, **options})


def config_of(what: str, args: tuple, fields: dict) -> Config:
  """The ``Config`` a call describes: the one given first, or one made of
  the parts given by position (model, data, strategy) and the keywords."""
  if args and isinstance(args[0], Config):
    if len(args) > 1 or fields:
      name, value = (("config", args[1:]) if len(args) > 1 else
                     next(iter(fields.items())))
      raise _validate.fail(name, value, f"{what} takes one lowbw.Config and "
                           "no settings beside it; set them in the config "
                           f"(config.replace({name}=...))")
    return args[0]
  if len(args) > len(POSITIONAL):
    raise _validate.fail("arguments", args, f"{what} takes the model, the "
                         "data and the strategy by position; the other "
                         "settings by name")
  for name, value in zip(POSITIONAL, args):
    if name in fields:
      raise TypeError(f"{what}() got multiple values for argument {name!r}")
    fields[name] = value
  return Config(**fields)


def _split(kwargs: dict, options: dict) -> tuple[dict, dict]:
  mine = {k: kwargs.pop(k) for k in list(kwargs) if k in options}
  return {**options, **mine}, kwargs


def simulate(*parts, **kwargs) -> Result:
  options, fields = _split(kwargs, RUN_OPTIONS)
  config = config_of("simulate", parts, fields)
  sim = build_config(config, compile=False,
                     compile_cache=options.pop("compile_cache"),
                     compile_effort=options.pop("compile_effort"))
  return run_config(sim, config, **options)


def build(*parts, **kwargs) -> Simulator:
  options, fields = _split(kwargs, BUILD_OPTIONS)
  return build_config(config_of("build", parts, fields), **options)


_PARTS_DOC = """
  The run is a ``lowbw.Config``: give one, or give its fields here
  (``lowbw.simulate(**fields)`` is ``lowbw.simulate(lowbw.Config(
  **fields))``). The model, the data and the strategy may come by position;
  each takes a registry name or the object (a ``lowbw.models.Model``, a flax
  module or an ``(init, loss)`` pair; a ``lowbw.data.DataSource``; a
  ``lowbw.strategies.Strategy``), and ``network`` a
  ``lowbw.network.Network``. Every field is checked when the config is made,
  before anything is compiled; ``lowbw.Config.help()`` lists them all (the
  same as ``lowbw train --help``). Those that fix the compiled program:

{settings}
"""

simulate.__doc__ = """Simulates W workers training a model with a strategy.

  All workers run in one compiled JAX program: their parameters are stacked
  on axis 0, a round (H inner steps and one sync) is a ``lax.scan``, and
  chunks of rounds run without the host waiting on the device. A run with a
  log folder (``out``) writes metrics.csv, TensorBoard events, config.json,
  summary.json and, when the config can be written, config.yaml.
""" + _PARTS_DOC + """
  Besides the config, ``simulate`` takes:
    overwrite: clear what another run wrote in ``out`` (its metrics, events,
      checkpoints and summaries; nothing else) before this one.
    callback: called with each logged row (a dict), on the host.
    metadata: JSON-able notes stored under "metadata" in config.json.
    hparams: traced values replacing the config's, e.g. ``{"inner_lr":
      3e-3}`` (``lowbw.build`` runs many without recompiling).
    resume_from: a log folder or checkpoint directory to continue from; the
      run must have the same configuration; it continues bit-identically.
    compile_cache: JAX's persistent compilation cache: True (default) in
      ``$LOWBW_COMPILE_CACHE`` or ``~/.cache/lowbw/xla``, a folder, or False
      to leave JAX's settings alone (``LOWBW_COMPILE_CACHE=0`` turns it off
      everywhere).
    compile_effort: how hard XLA optimises the programs: "auto" (default:
      on a CPU, XLA's quickest settings for a run under 1e11 FLOPs of all
      workers' compute, whose programs then compile 4-5x faster and run
      about 2x slower; else XLA's defaults), "fast" or "full". Programs
      compiled with different efforts agree to float rounding, not bit for
      bit; the same config always gets the same effort (a study's point
      the same as its single run).

  This is ``lowbw.build(...).run(...)`` in one call.

  Returns:
    A ``Result``.

  Raises:
    ValueError: a bad setting, naming its field, its value and what is
      allowed.
    NonFiniteLossError: a worker's loss became NaN/inf; logs are kept.
    DivergenceError: with ``fail_on_divergence``, the loss ended far above
      its start or accuracy at or below chance (the run finished and its logs
      are kept); without it, a ``RunWarning`` says so.

  Example:
    >>> lowbw.simulate(model="mlp", data="digits", strategy="diloco", H=20,
    ...                workers=8, steps=400)
    >>> lowbw.simulate(lowbw.Config(strategy="sparta", data="digits"))
"""

build.__doc__ = """Checks a run and compiles its programs, once.

  Run the ``Simulator`` with ``Simulator.run(seed=..., hparams=...)`` as
  often as needed (traced values such as ``inner_lr``, ``outer_lr`` or
  ``bandwidth`` change without compiling), or sweep it with ``lowbw.sweep``.
""" + _PARTS_DOC + """
  Besides the config, ``build`` takes:
    compile: compile now (default); False compiles at the first run.
    compile_cache: JAX's persistent compilation cache, as for
      ``lowbw.simulate``: a configuration compiled before, in any process,
      loads instead of compiling.
    compile_effort: as for ``lowbw.simulate`` ("auto" weighs one run's
      work: give "full" for a build that will run many times).
    traced: ``("H",)`` makes the sync period a traced value: the rounds
      have the config's H step slots and ``run(hparams={"H": h})`` runs
      the first h of each (any h up to the config's), on one program;
      DiLoCo, SparseLoCo, MuLoCo and FedAdam on one device, without fault
      or straggler masks (``lowbw.study`` turns it on for a grid over H).
      ``("density",)`` (alone or with "H") makes a top-k codec's fraction
      one: the codec keeps the config's k (the largest a run may take) and
      ``run(hparams={"density": d})`` sends the first k(d) =
      max(1, round(d x n)) of each n-entry tensor or chunk, the others as
      zeros, so every run equals the one built with ``topk:d``; a top-k
      codec alone (``chunk=``/``block=`` too), with or without error
      feedback, on the strategies H can be traced on (``lowbw.study``
      turns it on for a grid over ``topk:D`` densities).
      ``("bits",)`` (alone or with "H") makes a linear quantizer's bit
      width one: the codec packs codes of the config's width (the largest
      a run may take) and ``run(hparams={"bits": b})`` quantizes to
      2**b - 1 steps between each tensor's (or chunk's) minimum and
      maximum, so every run equals the one built with ``quant:b`` (its
      bytes those of b-bit codes); ``quant:B`` with or without
      ``:stochastic`` or ``:chunk=N``, alone or as the last stage of a
      chain (``topk:D,quant:B``), with or without error feedback, on the
      same strategies (``lowbw.study`` turns it on for a grid over
      ``quant:B`` widths). The statistical scheme, ``int8``, ``e3m0`` and
      ``sign`` are refused: their codebooks or formats depend on the
      width.

  Raises:
    ValueError: a bad setting, naming its field, before anything is compiled.

  Example:
    >>> sim = lowbw.build(model="mlp", data="digits", strategy="diloco",
    ...                   H=20, workers=8, steps=400)
    >>> a = sim.run(seed=0, hparams={"inner_lr": 1e-3})
    >>> b = sim.run(seed=1, hparams={"inner_lr": 3e-3})   # no compilation
"""
for _f in (simulate, build):
  _f.__doc__ = _f.__doc__.replace("{settings}", _settings.settings_doc())
