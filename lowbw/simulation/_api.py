"""``lowbw.simulate`` and ``lowbw.build`` taking a ``Config`` as well as
keywords."""

import functools

from lowbw import _validate
from lowbw.config import Config
from lowbw.config._config import FIELDS
from lowbw.config._resolve import build_data, build_model
from lowbw.simulation import _run, _simulator
from lowbw.simulation._build import build_checked

# Arguments of a run that are not settings (what to do with the folder,
# hooks, values for one run of a build).
RUN_ONLY = ("overwrite", "callback", "metadata", "hparams", "resume_from",
            "compile_cache")


def build_config(config: Config, compile: bool = True,
                 compile_cache=True) -> _simulator.Simulator:
  """The simulator of ``config`` (its shape fields; seed and log folder are
  ``run_config``'s): the data and the model made, the strategy, the network
  and the settings as the config checked them when it was made."""
  s = {name: getattr(config, name) for name in FIELDS}
  source = build_data(s)
  built = config.built()
  return build_checked(build_model(s, source), source, built.strategy,
                       built.checked, compile=compile,
                       compile_cache=compile_cache)


def yaml_or_none(config: Config) -> str | None:
  """``config`` as YAML, or None when it holds a Python object (a model,
  dataset or strategy given as an object: such a run writes config.json
  only)."""
  try:
    return config.to_yaml()
  except _validate.ConfigError:
    return None


def run_config(sim: _simulator.Simulator, config: Config, **kwargs):
  """Runs ``sim`` (built from ``config``) with the config's run fields,
  writing ``config.yaml`` to the log folder when the config can be;
  ``kwargs`` are further ``Simulator.run`` arguments (or override one, such
  as ``progress``)."""
  text = yaml_or_none(config)
  args = dict(seed=config.seed, log_dir=config.out,
              checkpoint_every=config.checkpoint_every,
              progress=config.progress, wandb_project=config.wandb_project,
              fail_on_divergence=config.fail_on_divergence,
              config_yaml=text, init_from=config.init_from)
  return sim.run(**{**args, **kwargs})


def _config_of(what: str, args: tuple, kwargs: dict, allowed) -> Config | None:
  """The ``Config`` a call was given first, its keywords checked; None for
  the keyword style."""
  if not (args and isinstance(args[0], Config)):
    return None
  if len(args) > 1:
    raise _validate.fail(what, args[1:], "takes one lowbw.Config and "
                         "keywords")
  for name in kwargs:
    if name not in allowed:
      raise _validate.fail(
          name, kwargs[name], f"with a lowbw.Config, {what} takes only "
          + ", ".join(allowed) + "; set the run's settings in the config "
          f"(config.replace({name}=...))")
  return args[0]


@functools.wraps(_run.simulate)
def simulate(*args, **kwargs):
  config = _config_of("simulate", args, kwargs, RUN_ONLY)
  if config is None:
    return _run.simulate(*args, **kwargs)
  cache = kwargs.pop("compile_cache", True)
  sim = build_config(config, compile=False, compile_cache=cache)
  return run_config(sim, config, **kwargs)


@functools.wraps(_simulator.build)
def build(*args, **kwargs):
  config = _config_of("build", args, kwargs, ("compile", "compile_cache"))
  if config is None:
    return _simulator.build(*args, **kwargs)
  return build_config(config, **kwargs)


_CONFIG_NOTE = """
  ``lowbw.simulate(config)`` runs a ``lowbw.Config`` (the keywords above
  are then its fields; ``overwrite``, ``callback``, ``metadata``,
  ``hparams``, ``resume_from`` and ``compile_cache`` may still be given) and
  writes it to ``log_dir/config.yaml``.
"""
simulate.__doc__ = (_run.simulate.__doc__ or "") + _CONFIG_NOTE
build.__doc__ = (_simulator.build.__doc__ or "") + _CONFIG_NOTE.replace(
    "simulate", "build").replace("runs", "builds").replace(
    " and\n  writes it to ``log_dir/config.yaml``", "")
