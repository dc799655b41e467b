"""A run's validated, immutable build settings: what sets the compiled programs.

``configure`` checks every argument of ``lowbw.build`` and returns a frozen
``RunConfig``; nothing is traced or compiled here. What a ``RunConfig`` holds is
what a compiled ``Simulator`` is specialised to: changing any of it needs a new
build. What may change between runs of one build (seed, learning rates,
network numbers, log folders) is an argument of ``Simulator.run``.
"""

import dataclasses
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from lowbw import _validate
from lowbw import data as data_lib
from lowbw import models as models_lib
from lowbw import strategies as strategies_lib
from lowbw import network as net_lib
from lowbw.config import _defaults, _options
from lowbw.config._resources import Budget, check_budget, check_devices

AUTOCAST = {"float32": None, "bfloat16": jnp.bfloat16}
# The paired DDP lane's choices (``shadow``).
SHADOWS = ("ddp",)
_TARGET_CHUNKS = 25
WORKER_DTYPES = ("float32", "bfloat16")

# Build settings, named in the error a run gives when one would need a new
# build (they fix shapes or the compiled program's structure).
SHAPE_SETTINGS = ("model", "data", "strategy (H, codec sizes, p, ...)",
                  "num_workers", "batch_size", "steps", "devices",
                  "worker_dtype", "worker_batch", "memory_budget",
                  "minibatch_size", "autocast", "rounds_per_chunk",
                  "network structure (topology, faults or mitigation on/off)")


@dataclasses.dataclass(frozen=True)
class RunConfig:
  """Everything a compiled simulator is specialised to (see ``lowbw.build``).

  ``log_every`` is None when it was not given (``default_spacing``: 200 to
  400 rows; a resume re-spaces the first run's rows to it).
  """

  model: models_lib.Model
  data: data_lib.DataSource
  strategy: strategies_lib.Strategy
  num_workers: int
  batch_size: int
  steps: int
  network: Any
  eval_every: int | None
  log_every: int | None
  eval_examples: int | None
  rounds_per_chunk: int
  devices: int
  worker_dtype: str
  worker_batch: int | str | None   # "auto" until the Simulator chooses
  memory_budget: "Budget | None"
  minibatch_size: int | None = None  # None: the whole batch at once
  autocast: str = "float32"
  correlation_every: int | None = None
  eval_local: bool = False
  shadow: Any = None  # the paired DDP lane's optimizer (``_shadow``)
  # ``devices`` was not given: lowbw chose it (``default_devices``).
  auto_devices: bool = False

  @property
  def micro(self) -> int:
    """Micro-batches per worker batch (``minibatch_size``)."""
    return self.batch_size // (self.minibatch_size or self.batch_size)

  @property
  def period(self) -> int:
    return self.strategy.period

  @property
  def tail_steps(self) -> int:
    return self.steps % self.period

  @property
  def masks(self) -> bool:
    """Fault or straggler masks are compiled in (jitter alone drops nobody)."""
    return has_masks(self.network)

  @property
  def redistributes(self) -> bool:
    """Departed workers' data goes to the others (``_leavers``)."""
    f = None if self.network is None else self.network.faults
    return f is not None and f.leave_shards == "redistribute"

  @property
  def one_replica(self) -> bool:
    """The engine keeps one replica of a ``replicated`` strategy's workers
    (DDP without a codec): nothing needs them apart (no masks, one device,
    one process)."""
    return (self.strategy.replicated and not self.masks and
            self.devices == 1 and jax.process_count() == 1)

  @property
  def default_log_every(self) -> int:
    return self.log_every or default_spacing(self.steps)

  @property
  def grouping(self) -> int | None:
    """``worker_batch`` for the engine: None when it is every worker."""
    if self.worker_batch in (None, "auto", self.num_workers // self.devices):
      return None
    return self.worker_batch

  @property
  def is_lm(self) -> bool:
    return self.data.tokens_per_example is not None


def has_masks(network) -> bool:
  """Fault or straggler masks are compiled in (jitter alone drops nobody)."""
  return network is not None and (network.faults is not None or (
      network.stragglers is not None and
      network.stragglers.mitigation != "none"))


def _spreads(strategy, network, worker_batch) -> bool:
  """Whether a run that names no devices spreads its workers over CPU
  devices: not DDP's one replica (one large matmul already uses every core)
  and not a ``worker_batch`` the user chose (it counts a device's workers)."""
  one_replica = strategy.replicated and not has_masks(network)
  return not one_replica and worker_batch in (None, "auto")


def _precision(field: str, value, allowed) -> str:
  """``value`` as "float32" or "bfloat16" (None, "fp32" and "bf16"
  accepted); anything else is a ValueError naming ``field``."""
  value = {None: "float32", "bf16": "bfloat16", "fp32": "float32"}.get(
      value, value)
  return _validate.one_of(field, value, allowed)


def check_worker_dtype(value) -> str:
  """``worker_dtype``: the type the workers' state is stored in."""
  return _precision("worker_dtype", value, WORKER_DTYPES)


def default_spacing(steps: int) -> int:
  """Rows every this many steps when ``log_every`` is not given: the power
  of two that makes 200 to 400 rows (every step below 400 steps). Powers of
  two nest, so a resume that extends a run re-spaces its rows exactly."""
  return 1 << max(0, (steps // 200).bit_length() - 1)


def check_minibatch_size(value, batch_size: int) -> int | None:
  """None (the whole batch at once) or a size dividing ``batch_size``
  (equal micro-batches, so their mean gradient is the batch's)."""
  value = _validate.optional_positive_int("minibatch_size", value)
  if value is None or value == batch_size:
    return None
  if batch_size % value:
    raise _validate.fail(
        "minibatch_size", value, f"must divide batch_size={batch_size} "
        "(equal micro-batches)")
  return value


def check_autocast(value) -> str:
  """``autocast``: the forward and backward passes' compute type."""
  return _precision("autocast", value, AUTOCAST)


SEED_LIMIT = 2 ** 32  # PRNGKey keeps 32 bits: 2**32 would replay seed 0


def check_seed(seed) -> int:
  if (isinstance(seed, bool) or not isinstance(seed, (int, np.integer))
      or not 0 <= seed < SEED_LIMIT):
    raise _validate.fail("seed", seed, "expected an integer in [0, 2**32)")
  return int(seed)


def multiple_of_period(field, value, period):
  value = _validate.optional_positive_int(field, value)
  if value is not None and value % period:
    raise _validate.fail(
        field, value,
        f"must be a multiple of the strategy's period, H = {period} (global "
        "parameters only change at syncs)")
  return value


def _resolve(field, value, registry_get, cls):
  if isinstance(value, str):
    return registry_get(value)
  if not isinstance(value, cls):
    raise _validate.fail(field, value,
                         f"expected a {cls.__module__}.{cls.__name__} or a name")
  return value


def configure(model, data, strategy, **settings) -> RunConfig:
  """Validates the build arguments (see ``lowbw.build``) into a ``RunConfig``:
  the model, the data, the strategy and ``check_settings``'s settings.

  Raises:
    ValueError: a bad argument, naming it, before anything is compiled.
  """
  _options.check("build", settings, SETTINGS)
  strategy = _resolve("strategy", strategy, strategies_lib.get,
                      strategies_lib.Strategy)
  return configure_checked(model, data, strategy,
                           check_settings(strategy, **settings))


def configure_checked(model, data, strategy, settings: dict) -> RunConfig:
  """``configure`` with ``settings`` already checked (``check_settings``'s
  return; ``lowbw.Config`` checks them once, when it is made): the model
  and the data, and what needs both."""
  model = (models_lib.get(model) if isinstance(model, str)
           else models_lib.as_model(model))
  data = _resolve("data", data, data_lib.get, data_lib.DataSource)
  settings = dict(settings)
  if settings["auto_devices"] and type(data).build is not data_lib.DataSource.build:
    # A data source of its own may not give a WorkerSampler, which
    # spreading needs: one device, as before the default spread.
    settings.update(devices=1, auto_devices=False)
  _check_model_fits_data(model, data)
  data.check_workers(settings["num_workers"])
  return RunConfig(model, data, strategy, **settings)


# The one list of build settings (with their defaults): ``lowbw.build`` and
# ``lowbw.simulate`` take and show these (``_options``).
def check_settings(strategy, *, num_workers: int = _defaults.NUM_WORKERS,
                   batch_size: int = _defaults.BATCH_SIZE,
                   steps: int = _defaults.STEPS, network=_defaults.NETWORK,
                   eval_every=None, log_every=None, eval_examples=None,
                   rounds_per_chunk=None, devices=None, worker_dtype=None,
                   worker_batch="auto", memory_budget=None,
                   minibatch_size=None, autocast=None, correlation_every=None,
                   eval_local=False, shadow=None) -> dict:
  """Every build setting but the model and the data, checked against the
  strategy (its period H): ``RunConfig``'s other fields. Needs no data, so
  ``lowbw.Config`` runs it when it is made."""
  num_workers = _validate.positive_int("num_workers", num_workers)
  batch_size = _validate.positive_int("batch_size", batch_size)
  steps = _validate.positive_int("steps", steps)
  worker_dtype = check_worker_dtype(worker_dtype)
  minibatch_size = check_minibatch_size(minibatch_size, batch_size)
  autocast = check_autocast(autocast)
  if network is not None:
    network = net_lib.check_network(network, num_workers)
  auto_devices = devices is None
  devices = check_devices(devices, num_workers,
                                _spreads(strategy, network, worker_batch))
  period = strategy.period
  if steps < period:
    raise _validate.fail(
        "steps", steps, f"the strategy syncs every {period} steps (its "
        "period, H), so with fewer steps no sync happens and the shared "
        f"model never changes; give steps >= {period} or a smaller H")
  if network is not None and network.faults is not None:
    net_lib.check_windows(network.faults, period)
  if strategy.asynchronous:
    _check_asynchronous(strategy, network)
  if not isinstance(eval_local, bool):
    raise _validate.fail("eval_local", eval_local, "expected True or False")
  default_rpc = max(1, math.ceil(steps // period / _TARGET_CHUNKS))
  return dict(
      num_workers=num_workers, batch_size=batch_size, steps=steps,
      network=network,
      eval_every=multiple_of_period("eval_every", eval_every, period),
      log_every=_validate.optional_positive_int("log_every", log_every),
      eval_examples=_validate.optional_positive_int("eval_examples",
                                                    eval_examples),
      rounds_per_chunk=(
          _validate.positive_int("rounds_per_chunk", rounds_per_chunk)
          if rounds_per_chunk is not None else default_rpc),
      devices=devices, worker_dtype=worker_dtype,
      worker_batch=check_worker_batch(worker_batch, num_workers // devices),
      memory_budget=check_budget(memory_budget),
      minibatch_size=minibatch_size, autocast=autocast,
      correlation_every=multiple_of_period("correlation_every",
                                           correlation_every, period),
      eval_local=eval_local, shadow=check_shadow(shadow, strategy),
      auto_devices=auto_devices and devices > 1)


def _check_asynchronous(strategy, network) -> None:
  """An asynchronous strategy orders its events by the workers' compute
  times; faults and straggler mitigations (which drop workers from a
  barrier it does not have) are not part of its schedule."""
  if network is None:
    return
  if network.hardware is None:
    raise _validate.fail(
        "hardware", None, f"strategy {strategy.name!r} orders its arrivals "
        "by the workers' compute times: give the network a hardware "
        "(e.g. 'h100' or a time per step, '0.5s'), or run without a network")
  if network.faults is not None:
    raise _validate.fail(
        "faults", "given", f"strategy {strategy.name!r} has no barrier to "
        "drop workers from; faults are not modelled for it (speeds and "
        "jitter are)")
  if network.stragglers is not None and network.stragglers.mitigation != "none":
    raise _validate.fail(
        "mitigation", network.stragglers.mitigation,
        f"strategy {strategy.name!r} waits for nobody, so there is nothing "
        "to mitigate: give mitigation 'none' (jitter still slows workers)")


def check_worker_batch(worker_batch, per_device: int) -> int | str | None:
  """"auto" (chosen from the memory budget, ``_memory``), None or "all"
  (every worker at once), or a group size dividing the workers per device
  (an int, or its digits from a flag)."""
  if isinstance(worker_batch, str) and worker_batch.strip().isdigit():
    worker_batch = int(worker_batch)
  if worker_batch in ("auto", "all"):
    return None if worker_batch == "all" else worker_batch
  if isinstance(worker_batch, str):
    raise _validate.fail("worker_batch", worker_batch,
                         "expected 'auto', 'all' or an integer >= 1")
  worker_batch = _validate.optional_positive_int("worker_batch", worker_batch)
  if worker_batch is not None and per_device % worker_batch:
    raise _validate.fail("worker_batch", worker_batch,
                         f"must divide the {per_device} workers of each device")
  return worker_batch


def _check_model_fits_data(model, data) -> None:
  if model.task not in ("custom", data.task):
    raise _validate.fail(
        "model", model.name, f"is a model for {model.task} but data "
        f"{data.name!r} is {data.task} data")
  model_vocab = model.config.get("vocab")
  if data.vocab_size and model_vocab and data.vocab_size > model_vocab:
    raise _validate.fail("vocab", model_vocab,
                         f"data {data.name!r} has tokens up to "
                         f"{data.vocab_size - 1}; needs vocab >= "
                         f"{data.vocab_size}")
  model_classes = model.config.get("num_classes")
  data_classes = getattr(data, "num_classes", None)
  if model_classes and data_classes and data_classes > model_classes:
    raise _validate.fail("num_classes", model_classes,
                         f"data {data.name!r} has labels up to "
                         f"{data_classes - 1}; needs num_classes >= "
                         f"{data_classes}")


def check_processes(checkpoint_every, resume_from) -> None:
  if jax.process_count() > 1 and (checkpoint_every or resume_from):
    raise _validate.fail(
        "checkpoint_every" if checkpoint_every else "resume_from",
        checkpoint_every or resume_from,
        "checkpoints are not supported in multi-process runs yet")


# The build settings' names, in check_settings' order.
SETTINGS = tuple(_options.keywords(check_settings, skip=("strategy",)))


# ----------------------------------------------------- the paired DDP lane
def check_shadow(shadow, strategy) -> optax.GradientTransformation | None:
  """The lane's optimizer, or None for no lane.

  ``shadow``: None; ``"ddp"``: the strategy's own inner optimizer
  (``Strategy.inner``; DiLoCo's default AdamW for a strategy without one,
  such as DeMo); or an optax transformation, the lane's optimizer.
  """
  if shadow is None:
    return None
  if isinstance(shadow, optax.GradientTransformation):
    return shadow
  if shadow in SHADOWS:
    return strategy.inner or strategies_lib.default_inner()
  raise _validate.fail(
      "shadow", shadow, "expected None, 'ddp' (a DDP replica with the "
      "strategy's inner optimizer, trained on the union of the workers' "
      "batches) or an optax.GradientTransformation (the replica's optimizer)")
