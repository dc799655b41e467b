"""The engine's record of a run: what sets the compiled programs.

``lowbw.Config`` is the one description of a run. When it is made,
``check_settings`` applies its build fields' rules (``Field.check``) once;
``engine_config`` adds the model and the data and returns the frozen
``RunConfig`` a compiled ``Simulator`` is specialised to, whose settings are
those fields, by the same names. What may change between runs of one build
(seed, learning rates, network numbers, log folders) is an argument of
``Simulator.run``.
"""

import dataclasses
import textwrap
from typing import Any

import jax

from lowbw import _validate
from lowbw import data as data_lib
from lowbw import models as models_lib
from lowbw import strategies as strategies_lib
from lowbw.config import _fields
# The rules the engine reads too (by this module's name).
from lowbw.config._checks import (AUTOCAST, WORKER_DTYPES, check_seed,
                                  has_masks, multiple_of_period)


class _RunConfig:
  """Everything a compiled simulator is specialised to (see ``lowbw.build``):
  the model, the data, the strategy and the build settings (``SETTINGS``:
  the ``lowbw.Config`` fields with a ``check``, by their names).

  ``log_every`` is None when it was not given (``default_spacing``: 200 to
  400 rows; a resume re-spaces the first run's rows to it).
  ``worker_batch`` is "auto" until the Simulator chooses; ``shadow`` is the
  paired DDP lane's optimizer; ``auto_devices``: lowbw chose ``devices``.
  """

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
  def tail_slots(self) -> int:
    """Steps the tail program has room for: ``tail_steps``, or with a
    traced H any run's tail (at most ``period`` - 1 steps; those past the
    run's steps do not run)."""
    return self.period - 1 if self.traced_period else self.tail_steps

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
    if self.worker_batch in (None, "auto", self.workers // self.devices):
      return None
    return self.worker_batch

  @property
  def is_lm(self) -> bool:
    return self.data.tokens_per_example is not None


def default_spacing(steps: int) -> int:
  """Rows every this many steps when ``log_every`` is not given: the power
  of two that makes 200 to 400 rows (every step below 400 steps). Powers of
  two nest, so a resume that extends a run re-spaces its rows exactly."""
  return 1 << max(0, (steps // 200).bit_length() - 1)


def engine_config(model, data, strategy, settings: dict) -> "RunConfig":
  """The engine's record of a run: the model and the data made from a
  ``lowbw.Config``, its strategy and its checked settings (``Built``), and
  what needs both (enough data for the workers, a model for the data)."""
  model = models_lib.as_model(model)  # a flax module, an (init, loss) pair
  settings = dict(settings)
  if settings["auto_devices"] and type(data).build is not data_lib.DataSource.build:
    # A data source of its own may not give a WorkerSampler, which
    # spreading needs: one device, as before the default spread.
    settings.update(devices=1, auto_devices=False)
  _check_model_fits_data(model, data)
  data.check_workers(settings["workers"])
  if settings["clients"] is not None:
    # Data that cannot give every client a batch is refused before
    # compiling (seed 0's shards; a run's own seed shards again).
    data_lib.client_shards(data, settings["clients"], settings["batch_size"],
                           0)
    # The workers are other clients every round: fresh inner state at syncs.
    strategy = strategies_lib.sampled_clients(strategy)
  return RunConfig(model, data, strategy, **settings)


# The build settings: every field with a rule, in the table's order.
BUILD_FIELDS = tuple(f for f in _fields.RUN_FIELDS if f.check is not None)
SETTINGS = tuple(f.name for f in BUILD_FIELDS)


def settings_doc(indent: str = "    ") -> str:
  """The build settings' entries of ``lowbw.simulate``'s docstring, from
  their fields' help (what ``lowbw train --help`` shows too)."""
  out = []
  for f in BUILD_FIELDS:
    default = ("" if f.default is None or "default" in f.help else
               f" (default {f.default!r})")
    out.append(textwrap.fill(f"{f.name}: {f.help}{default}.", 79,
                             initial_indent=indent,
                             subsequent_indent=indent + "  "))
  return "\n".join(out)


def check_settings(strategy, **given) -> dict:
  """Every build setting (``SETTINGS``; those not given take their
  defaults), checked against the strategy (its period H) by each field's
  rule, in the fields' order: ``RunConfig``'s other fields. Needs no data,
  so ``lowbw.Config`` runs it when it is made (the ``network`` it gives is
  the object its settings describe)."""
  for name in given:
    if name not in SETTINGS:
      raise TypeError(f"check_settings() got an unexpected keyword argument "
                      f"{name!r}{_validate.suggest(name, list(SETTINGS))}")
  s = {f.name: f.default for f in BUILD_FIELDS}
  s.update(given)
  auto_devices = s["devices"] is None
  for field in BUILD_FIELDS:
    s[field.name] = field.check(field.name, s[field.name], s, strategy)
  s["auto_devices"] = auto_devices and s["devices"] > 1
  return s


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


RunConfig = dataclasses.make_dataclass(
    "RunConfig", [("model", Any), ("data", Any), ("strategy", Any),
                  *((name, Any) for name in SETTINGS),
                  ("auto_devices", Any, dataclasses.field(default=False)),
                  # each worker's pipeline (``network.Pipeline``) or None
                  ("pipeline", Any, dataclasses.field(default=None)),
                  # H is a traced value (``lowbw.build(traced=("H",))``):
                  # the programs' rounds have ``period`` step slots, of
                  # which the state's ``SimState.period`` run
                  ("traced_period", Any, dataclasses.field(default=False)),
                  # top-k's fraction is a traced value (``lowbw.build(
                  # traced=("density",))``): the programs keep the codec's
                  # k, of which the state's ``SimState.keep`` are sent
                  ("traced_density", Any, dataclasses.field(default=False)),
                  # a linear quantizer's bit width is a traced value
                  # (``lowbw.build(traced=("bits",))``): the programs pack
                  # the codec's width, quantizing to the state's
                  # ``SimState.levels``
                  ("traced_bits", Any, dataclasses.field(default=False))],
    bases=(_RunConfig,), frozen=True)
RunConfig.__module__ = __name__
RunConfig.__doc__ = _RunConfig.__doc__
