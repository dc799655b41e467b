"""A ``Simulator`` from settings ``lowbw.Config`` has already checked."""

import time

from lowbw.config import _settings as _config
from lowbw.simulation import _compile_cache
from lowbw.simulation._simulator import Simulator


def build_checked(model, data, strategy, settings: dict, *,
                  compile: bool = True,
                  compile_cache: bool | str = True) -> Simulator:
  """``lowbw.build`` for ``settings`` that ``check_settings`` returned (a
  ``Config`` keeps them from when it was made): they are not checked again,
  and ``strategy`` (with the network in ``settings``) is the one built
  then."""
  started = time.perf_counter()
  config = _config.configure_checked(model, data, strategy, settings)
  _compile_cache.enable(_compile_cache.check(compile_cache))
  return Simulator(config, compile=compile, started=started)
