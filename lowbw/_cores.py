"""One JAX CPU device per core, so that workers run on every core.

XLA's CPU backend runs a batched matmul (W workers' small matmuls, as
``vmap`` makes them) on one thread, and runs the operations of one program
one after another. One replica's large matmul uses every core, so W workers
on one device reach only about half of one replica's speed on a 2-core
machine (the digits MLP under DiLoCo). Spread over one device per core, the
devices run their slices of the workers at the same time.

``configure()`` runs when ``lowbw`` is imported. On CPU, before JAX has
started its backends, it asks JAX for one CPU device per core (up to
``MAX_DEVICES``) unless the user chose a count already:
``XLA_FLAGS=--xla_force_host_platform_device_count=N``, the
``jax_num_cpu_devices`` option, or ``LOWBW_CPU_DEVICES=N`` (``1`` keeps one
device). A run with ``devices=None`` then spreads its workers over these
devices when that helps (``lowbw.config._settings.default_devices``); a
process that only uses JAX's default device sees no difference.
"""

import os

from lowbw import _validate

ENV = "LOWBW_CPU_DEVICES"
# Measured on 2 cores; more devices than this would each get a small slice.
MAX_DEVICES = 8


def cores() -> int:
  """The cores this process may run on."""
  try:
    return len(os.sched_getaffinity(0))
  except AttributeError:  # not Linux
    return os.cpu_count() or 1


def wanted() -> int:
  """The number of CPU devices to ask for: ``LOWBW_CPU_DEVICES`` if set,
  else the cores (at most ``MAX_DEVICES``)."""
  value = os.environ.get(ENV)
  if value is None:
    return min(cores(), MAX_DEVICES)
  try:
    count = int(value)
  except ValueError:
    count = 0
  if count < 1:
    raise _validate.fail(ENV, value, "expected an integer >= 1 (1 keeps "
                         "JAX's single CPU device)")
  return count


def configure() -> None:
  """Asks JAX for ``wanted()`` CPU devices if nothing chose a count and
  the backends have not started (after that the count cannot change)."""
  count = wanted()
  if count <= 1 or "xla_force_host_platform_device_count" in os.environ.get(
      "XLA_FLAGS", ""):
    return
  import jax
  from jax._src import xla_bridge
  if jax.config.jax_num_cpu_devices != -1:
    return
  if xla_bridge.backends_are_initialized():
    return
  jax.config.update("jax_num_cpu_devices", count)
