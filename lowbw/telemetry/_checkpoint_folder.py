"""Where a run's checkpoints live and whether a finished one is there.

Read by the checkpoints themselves and by the writers (the error of a failed
write says to resume when the run's folder holds a checkpoint); a plain look
at the folder, without orbax, so the writers need not import the checkpoint
module.
"""

import os

CHECKPOINTS = "checkpoints"  # a run's checkpoints: <log folder>/checkpoints


def has_checkpoint(run_dir: str) -> bool:
  """``run_dir`` (a log folder) holds a finished checkpoint to resume from
  (orbax names each by its step; partial ones carry a suffix)."""
  folder = os.path.join(run_dir, CHECKPOINTS)
  try:
    return any(name.isdigit() for name in os.listdir(folder))
  except OSError:
    return False
