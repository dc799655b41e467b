"""``lowbw.simulate``: build a simulator, run it once."""

from lowbw.config import _options
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
    log_every: log a row every this many steps (default: the power of two
      that gives 200 to 400 rows).
    log_dir: write metrics.csv, TensorBoard events, config.json and
      summary.json here. A folder holding another run is refused (its
      TensorBoard events would mix with this run's) unless ``overwrite``.
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
    devices: spread the workers over this many devices (``shard_map`` over a
      ``"workers"`` mesh axis; must divide ``num_workers``); the trajectory is
      the same as on one device up to float rounding. Default: on CPU, as
      many of the CPU devices lowbw asks JAX for (one per core,
      ``LOWBW_CPU_DEVICES``) as divide ``num_workers``, unless the strategy
      keeps one replica (DDP without a codec or masks) or ``worker_batch``
      is given: XLA runs a batched matmul on one core, so the devices are
      what puts every core to work. Else 1; every device of a multi-process
      run (``lowbw.simulation.initialize``).
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
      "auto" (default): all at once while their activations and gradients
      fit 128 MiB on a CPU (where smaller groups run faster; a quarter of
      the budget on an accelerator) and the memory budget, else the largest
      group that does (the choice is in config.json); "all" or None: all at
      once.
    memory_budget: the bytes the run may use: a number of bytes, "8GB",
      "512MiB", or a percentage of free memory, "60%". Default 80% of the
      memory free at build (the device's; the host's on a CPU). A run
      estimated (before compiling) to need more is refused, naming the
      estimate and the budget.
    minibatch_size: gradient accumulation: each worker's batch is computed
      in micro-batches of this size (it must divide ``batch_size``) inside
      the compiled step, their gradients summed and averaged: the full
      batch's gradient to float rounding, with one micro-batch's
      activations in memory. Default: the whole batch at once.
    autocast: "bfloat16" runs each forward and backward pass in bf16 while
      parameters, gradients and optimizer state stay float32 (mixed
      precision; ``worker_dtype`` is about storage instead). Default
      "float32".
    correlation_every: log ``worker_correlation``, the mean pairwise
      Pearson correlation of the workers' parameter vectors (EXO Gym's
      metric), at the end of every round whose last step is a multiple of
      this (a multiple of H), before its sync. Computed in the compiled
      program. Default: not logged.
    eval_local: at each evaluation, also evaluate every worker's own
      parameters: ``eval_local_loss`` (their mean), ``eval_local_loss_std``
      (the spread over workers) and ``eval_local_<metric>``, next to the
      global model's. Default False.
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
