"""``lowbw.simulate``: build a simulator, run it once."""

from lowbw.config import _options, _settings
from lowbw.simulation._result import Result
from lowbw.simulation._simulator import Simulator, build

__all__ = ["Result", "simulate"]


def simulate(model, data, strategy, **options) -> Result:
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
    {build_settings}
    seed: seeds initialisation, sharding, sampling and the strategy's keys.
      Same seed, same bits.
    network: a ``lowbw.network.Network`` (links, topology, hardware,
      stragglers, faults) for the simulated clock (``sim_time_s``) and the
      fault and straggler masks; None: no clock.
    log_dir: write metrics.csv, TensorBoard events, config.json and
      summary.json here. A folder holding another run is refused (its
      TensorBoard events would mix with this run's) unless ``overwrite``.
    checkpoint_every: save an orbax checkpoint every this many steps (a
      multiple of H) under ``log_dir/checkpoints``.
    resume_from: a log_dir or checkpoint directory to continue from; the run
      must have the same configuration; it continues bit-identically.
    rounds_per_chunk: rounds per compiled call (default: about 1/25 of the run).
    progress: show a progress bar (default: when stderr is a terminal).
    callback: called with each logged row (a dict), on the host.
    metadata: JSON-able notes stored under "metadata" in config.json (the CLI
      keeps its settings there, for ``lowbw train --resume``).
    overwrite: clear what another run wrote in ``log_dir`` (its metrics,
      events, checkpoints and summaries; nothing else) before this one.
    wandb_project: also log to this Weights & Biases project (optional
      dependency: ``pip install 'lowbw[wandb]'``; a clear error before
      compiling without it): the same metrics as the CSV at each row's step
      and config.json's configuration, run named after ``log_dir``.
      ``WANDB_MODE=offline`` needs no network.
    fail_on_divergence: raise ``DivergenceError`` (after writing the
      logs) when the loss ended far above its start or the accuracy at or
      below chance; False (default): a ``RunWarning`` and the summary's
      ``warnings`` say so.
    hparams: traced values replacing the strategy's or network's, e.g.
      ``{"inner_lr": 3e-3}`` (see ``lowbw.build`` to run many without
      recompiling, ``lowbw.sweep`` to run a grid at once).
    compile_cache: JAX's persistent compilation cache: True (default) in
      ``$LOWBW_COMPILE_CACHE`` or ``~/.cache/lowbw/xla``, a folder, or False
      to leave JAX's settings alone (``LOWBW_COMPILE_CACHE=0`` turns it off
      everywhere). A configuration compiled before, in any process, loads
      instead of compiling.

  This is ``lowbw.build(...).run(...)`` in one call.

  Returns:
    A ``Result``.

  Raises:
    ValueError: a bad argument, naming it.
    NonFiniteLossError: a worker's loss became NaN/inf; logs are kept.
    DivergenceError: with ``fail_on_divergence``, the loss ended far above
      its start or accuracy at or below chance (the run finished and its logs
      are kept); without it, a ``RunWarning`` says so.
  """
  _options.check("simulate", options, _NAMES)
  run, settings = _options.split(options, _RUN)
  sim = build(model, data, strategy, compile=False, **settings)
  return sim.run(**run)


# simulate's options: Simulator.run's, then build's (one list each, where
# they are checked).
_RUN = _options.keywords(Simulator.run, skip=("config_yaml",))
_BUILD = _options.keywords(build, skip=("compile",))
_NAMES = (*_RUN, *_BUILD)
_options.compose(simulate, _BUILD, _RUN)

# The build settings' lines are their fields' help, written once there.
simulate.__doc__ = simulate.__doc__.replace("    {build_settings}",
                                            _settings.settings_doc())
