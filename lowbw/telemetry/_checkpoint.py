"""Checkpoints of the whole simulation state with orbax.

A checkpoint holds the device state (every worker's parameters and optimizer
state, the strategy's state, counters, keys) and a JSON blob of host-side
bookkeeping (logged rows, cumulative byte counters), so that resuming continues
bit-identically.
"""

import os
from typing import Any

import orbax.checkpoint as ocp


def _manager(directory: str, max_to_keep: int | None = None) -> ocp.CheckpointManager:
  options = ocp.CheckpointManagerOptions(max_to_keep=max_to_keep, create=True)
  return ocp.CheckpointManager(os.path.abspath(directory), options=options)


def save(directory: str, step: int, state: Any, meta: dict,
         max_to_keep: int | None = None) -> None:
  """Saves ``state`` (a pytree of arrays) and ``meta`` (JSON) at ``step``."""
  with _manager(directory, max_to_keep) as manager:
    manager.save(step, args=ocp.args.Composite(
        state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta)))
    manager.wait_until_finished()


def latest_step(directory: str) -> int | None:
  if not os.path.isdir(directory):
    return None
  with _manager(directory) as manager:
    return manager.latest_step()


def read_meta(directory: str, step: int | None = None) -> tuple[int, dict]:
  """The JSON part of a checkpoint alone (cheap; checks before a restore)."""
  with _manager(directory) as manager:
    step = manager.latest_step() if step is None else step
    restored = manager.restore(step, args=ocp.args.Composite(
        meta=ocp.args.JsonRestore()))
  return step, restored["meta"]


def restore(directory: str, abstract_state: Any, step: int | None = None
            ) -> tuple[int, Any, dict]:
  """Restores (step, state, meta); ``abstract_state`` gives the structure."""
  with _manager(directory) as manager:
    step = manager.latest_step() if step is None else step
    restored = manager.restore(step, args=ocp.args.Composite(
        state=ocp.args.StandardRestore(abstract_state),
        meta=ocp.args.JsonRestore()))
  return step, restored["state"], restored["meta"]
