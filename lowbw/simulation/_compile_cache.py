"""JAX's persistent compilation cache, on by default.

Every ``lowbw.simulate``/``lowbw.build`` (and so every ``lowbw train``,
``bench`` and ``sweep``) turns on JAX's on-disk cache of compiled programs
before it compiles, so that a configuration compiled once, in any process,
loads in a fraction of its compile time the next time. The folder is
``$LOWBW_COMPILE_CACHE`` if set, else ``$XDG_CACHE_HOME/lowbw/xla`` or
``~/.cache/lowbw/xla``; ``LOWBW_COMPILE_CACHE=0`` (or ``compile_cache=False``,
``--no-compile-cache``) leaves JAX's settings alone.

The cache has a size limit (``MAX_BYTES``, least recently used entries go
first), which makes JAX guard every read and write with a file lock: runs in
parallel processes share the folder safely. A folder the user already gave
JAX (``jax_compilation_cache_dir``) is kept as it is.
"""

import os
import pathlib

import jax
from jax.experimental.compilation_cache import compilation_cache

from lowbw import _validate

MAX_BYTES = 4 << 30
# Programs that compile faster than this are not kept (JAX's default is 1 s,
# which would leave out the digits MLP's 0.5-1 s programs). Not 0: keeping
# the ~70 single operations of an eager initial state too made a cold start
# of the digits MLP 1.7-2 s slower (a locked file each) and a warm one only
# about 1 s faster (benchmarks/startup.py).
MIN_COMPILE_S = 0.2
_OFF = ("0", "false", "off", "no", "")


def default_dir() -> str | None:
  """The cache folder lowbw uses, or None when ``LOWBW_COMPILE_CACHE`` turns
  it off."""
  env = os.environ.get("LOWBW_COMPILE_CACHE")
  if env is not None:
    return None if env.strip().lower() in _OFF else env
  root = os.environ.get("XDG_CACHE_HOME") or os.path.join(
      pathlib.Path.home(), ".cache")
  return os.path.join(root, "lowbw", "xla")


def check(value) -> bool | str:
  """``compile_cache``: True (the default folder), False, or a folder."""
  if isinstance(value, bool) or (isinstance(value, (str, os.PathLike)) and
                                 str(value)):
    return value if isinstance(value, bool) else os.fspath(value)
  raise _validate.fail("compile_cache", value,
                       "expected True, False or a folder path")


def enable(setting: bool | str = True) -> str | None:
  """Turns the persistent cache on for what this process compiles next.

  Returns the folder in use, or None when off. Idempotent; a folder that
  JAX was already given wins over ``setting=True``.
  """
  current = jax.config.jax_compilation_cache_dir
  if setting is False:
    return current
  folder = default_dir() if setting is True else setting
  if current or folder is None:
    return current
  try:
    os.makedirs(folder, exist_ok=True)
  except OSError:   # a read-only home: run without the cache
    return None
  jax.config.update("jax_compilation_cache_max_size", MAX_BYTES)
  jax.config.update("jax_persistent_cache_min_compile_time_secs",
                    MIN_COMPILE_S)
  compilation_cache.set_cache_dir(folder)
  # A compilation before this one may have found the cache off: look again.
  compilation_cache.reset_cache()
  return folder
