"""lowbw: simulate low-bandwidth distributed training on one machine.

W virtual workers are axis 0 of stacked parameter pytrees; one compiled JAX
program runs every worker's inner steps and the communication between them, and
counts the bytes exactly.

Example:
  >>> import optax, lowbw
  >>> from lowbw import data, models, strategies
  >>> result = lowbw.simulate(
  ...     model=models.mlp(hidden=(64,), num_classes=10), data=data.digits(),
  ...     strategy=strategies.diloco(inner=optax.adamw(1e-3), H=20),
  ...     workers=8, batch_size=32, steps=200)
  >>> result.history["eval_loss"], result.history["payload_bytes"]
"""

from lowbw import _cores

_cores.configure()  # before anything starts JAX's backends

# pylint: disable=wrong-import-position
from lowbw import data, models, network, strategies, telemetry, transforms  # noqa: E402
from lowbw import _plugins  # noqa: E402

_plugins.load()  # a user's codecs, models, strategies: before the settings
from lowbw._validate import ConfigError
from lowbw.telemetry._startup import mark_imported
from lowbw.config import Config
from lowbw.simulation import (DivergenceError, NonFiniteLossError,
                              NonFiniteModelError, Result,
                              RunWarning, SavedRun, Simulator, SweepResult,
                              build, initialize, load, retime, simulate,
                              sweep)
from lowbw.studies import Study, advise, fit, study

__version__ = "0.1.0"

mark_imported()  # the process's age now: the summary's import_s

__all__ = ["Config", "ConfigError", "SavedRun", "load", "Study", "study", "DivergenceError", "NonFiniteLossError", "NonFiniteModelError", "Result", "RunWarning", "Simulator", "SweepResult", "build",
           "advise", "data", "fit", "initialize", "models", "network", "retime", "simulate",
           "strategies", "sweep", "telemetry", "transforms"]
