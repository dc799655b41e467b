"""What a run may use of the machine: its memory budget and its devices,
checked when its settings are (``_settings.check_settings``).
"""

import os
import re
from typing import NamedTuple

import jax

from lowbw import _validate
from lowbw import network as net_lib

# ---------------------------------------------------------------- memory
DEFAULT_FRACTION = 0.8
# In-flight bytes above which the workers compute in groups, on a CPU: there
# smaller groups are faster, not slower (their working set stays near the
# caches; docs/performance.md, "Memory that follows the state": the default
# GPT at W=64 takes 4.1 s a round in groups of 2-4, 5.3 s all at once; the
# digits MLP at W=2000, 1.3 s in groups of 10, 1.75 s all at once).
CPU_ACTIVATION_CAP = 128 * 2 ** 20

class Budget(NamedTuple):
  bytes: float
  source: str      # how it was set, for messages
  given: bool      # the user set it (a size or a share); else the default


def free_bytes() -> tuple[float | None, str]:
  """Memory free now: the first device's (bytes_limit - bytes_in_use) where
  its allocator says, else the host's MemAvailable; None where neither is
  known."""
  stats = jax.local_devices()[0].memory_stats() or {}
  if "bytes_limit" in stats:
    return (float(stats["bytes_limit"] - stats.get("bytes_in_use", 0)),
            f"{jax.local_devices()[0].device_kind} memory")
  try:
    with open("/proc/meminfo") as f:
      for line in f:
        if line.startswith("MemAvailable:"):
          return float(line.split()[1]) * 1024, "host memory"
  except OSError:
    pass
  try:
    return (float(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")),
            "host memory")
  except (ValueError, OSError, AttributeError):
    return None, "unknown"


def check_budget(value) -> Budget | None:
  """``memory_budget``: None (``DEFAULT_FRACTION`` of free memory), bytes
  (a number, or a string with its unit: "8GB", "512MiB"), or a percentage
  of free memory ("60%"). None when free memory is unknown and no size was
  given (no limit then)."""
  field = "memory_budget"
  if isinstance(value, str) and value.strip().endswith("%"):
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*%\s*", value)
    share = float(match.group(1)) / 100 if match else 0.0
    if not 0 < share <= 1:
      raise _validate.fail(field, value,
                           "expected a percentage of free memory in (0, 100]")
    return _share_of_free(share, given=True)
  if value is None:
    return _share_of_free(DEFAULT_FRACTION, given=False)
  size = net_lib.memory(value, field)
  return Budget(size, f"memory_budget={net_lib.format_bytes(size)}", True)


def _share_of_free(share: float, given: bool) -> Budget | None:
  free, where = free_bytes()
  if free is None:
    return None
  return Budget(share * free, f"{share:.0%} of the {net_lib.format_bytes(free)}"
                f" of {where} free at build", given)


# --------------------------------------------------------------- devices
def default_devices(num_workers: int, spread: bool) -> int:
  """The devices of a run that names none: every device of every process in
  a multi-process run; on CPU, when ``spread`` (the workers are kept apart:
  not DDP's one replica), the most of this process's CPU devices (one per
  core, ``lowbw._cores``) that divides ``num_workers``; else one.

  XLA's CPU backend runs a vmapped batched matmul on one thread and one
  program's operations one after another, so W workers on one device use
  one core at a time in their matmuls; on one device per core the devices
  run their slices of the workers at once (the digits MLP under DiLoCo at
  W = 8 on 2 cores: 0.53 of one replica's speed on one device, 0.71 on
  two, ``benchmarks/limit.py``)."""
  if jax.process_count() > 1:
    return jax.device_count()
  if not spread or jax.default_backend() != "cpu":
    return 1
  available = jax.local_device_count()
  return max(d for d in range(1, min(available, num_workers) + 1)
             if num_workers % d == 0)


def check_devices(devices, num_workers: int, spread: bool = False) -> int:
  """The number of devices to spread ``num_workers`` workers over.

  None: ``default_devices(num_workers, spread)``.
  """
  available = jax.device_count()
  if devices is None:
    return default_devices(num_workers, spread)
  devices = _validate.positive_int("devices", devices)
  if devices > available:
    raise _validate.fail("devices", devices,
                         f"only {available} {jax.default_backend()} device(s) "
                         "are visible (on CPU, set XLA_FLAGS="
                         "--xla_force_host_platform_device_count=N before "
                         "JAX starts)")
  if jax.process_count() > 1 and devices != available:
    raise _validate.fail("devices", devices,
                         f"a run over {jax.process_count()} processes uses all "
                         f"{available} devices")
  if num_workers % devices:
    raise _validate.fail("devices", devices,
                         f"must divide workers={num_workers} (each device "
                         "holds the same number of workers)")
  return devices
