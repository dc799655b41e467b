"""A run's ledger (``ledger.npz`` in its log folder): what re-timing the
finished run on another network needs (``_retime``).

metrics.csv keeps cumulative figures at the logged steps and config.json
the channels as the run's topology priced them, so neither says which step
sent what, nor which collective a channel needs on another topology. The
ledger keeps, per inner step and per round, each channel's events, and once
the channels themselves (payload, collective, group size, tier), the
model's parameter and tensor counts, its FLOPs per step, H and the
strategy's overlap: a few bytes per step, compressed.

It also records why a run cannot be re-timed: whatever made its training
depend on the simulated clock (``timing_dependence``).
"""

import io
import json
import math
import os
import time

import jax
import numpy as np

from lowbw.telemetry import _writers

FILE = "ledger.npz"
VERSION = 1


def timing_dependence(config, network) -> list[str]:
  """What made a run's training follow its simulated clock (so another
  network would have trained differently): empty when nothing did."""
  s, out = config.strategy, []
  if s.asynchronous:
    out.append(f"its strategy {s.name!r} is asynchronous (updates arrive in "
               "the order of the simulated clock)")
  if s.time_budget:
    out.append("it has a time budget (each worker's steps per round follow "
               "its speed)")
  if network is None:
    return out
  st = network.stragglers
  if st is not None and st.mitigation != "none":
    out.append(f"its straggler mitigation {st.mitigation!r} leaves out the "
               "workers the clock finds late")
  if network.faults is not None:
    out.append("it has faults (down workers, lost messages and returns "
               "follow the network's draws)")
  return out


class Ledger:
  """The ledger of one run, written to ``log_dir/ledger.npz`` as chunks
  come back (a resumed run keeps the rows before its checkpoint)."""

  def __init__(self, sim, network, log_dir: str | None):
    c = sim.config
    self.path = (os.path.join(log_dir, FILE)
                 if log_dir and sim.main_process else None)
    self.period = c.period
    self.meta = {
        "version": VERSION, "workers": c.workers, "steps": c.steps,
        "period": c.period, "strategy": c.strategy.name,
        "overlap_steps": c.strategy.overlap_steps,
        "num_params": sim.num_params,
        # The profile's calls per event count them (``Prices``' count).
        "num_tensors": len(jax.tree.leaves(sim.abstract_params)),
        "flops_per_step": sim.flops_per_step,
        **({"pipeline": c.pipeline._asdict()} if c.pipeline else {}),
        "channels": {k: ch._asdict()
                     for k, ch in sim.priced_channels.items()},
        "timing_dependence": timing_dependence(c, network),
        "first_step": None}
    self.names = list(sim.priced_channels)
    self.step_counts: list[np.ndarray] = []   # (n, C) per chunk
    self.sync_counts: list[np.ndarray] = []   # (rounds, C) per chunk
    self.participants: list[np.ndarray] = []  # (n,) per chunk, with a clock
    self.written, self.write_s = -math.inf, 0.0  # when, and its seconds

  def add(self, first_step: int, kind: str, n: int, out) -> None:
    """Records a chunk's ``n`` rounds (``kind == "rounds"``, a
    ``RoundOut``) or tail steps (a ``StepOut``) that start after
    ``first_step`` steps; rewrites the file after the run's last step and
    when ``_due``."""
    if self.path is None:
      return
    if self.meta["first_step"] is None:
      self._continue(first_step)
    steps = out.steps if kind == "rounds" else out
    per_step = n * self.period if kind == "rounds" else n
    self.step_counts.append(self._table(steps.counts, per_step))
    if kind == "rounds":
      self.sync_counts.append(self._table(out.sync_counts, n))
    if steps.clock is not None:
      taken = np.asarray(steps.clock.participants)
      taken = taken[:n].reshape(-1) if kind == "rounds" else taken[:n]
      if kind == "rounds":
        taken = taken.copy()
        taken[self.period - 1::self.period] = np.asarray(
            out.clock.participants)[:n]
      self.participants.append(taken.astype(np.int16))
    if first_step + per_step >= self.meta["steps"] or self._due():
      self.write()

  def _due(self) -> bool:
    """Rewriting the whole file after every chunk would grow with the run
    (steps x chunks): between the first and the last chunk it is rewritten
    only once 20 times its last write's seconds have passed, so it costs
    the host loop under 5 %."""
    return time.perf_counter() - self.written >= 20 * self.write_s

  def _table(self, counts: dict, n: int) -> np.ndarray:
    """(n, C) int32 events of every channel (0 where a channel is not in
    ``counts``) in the first ``n`` rows of a chunk's (rounds, period),
    (rounds,) or (steps,) counts (a chunk may be padded)."""
    table = np.zeros((n, len(self.names)), np.int32)
    for i, name in enumerate(self.names):
      if name in counts:
        table[:, i] = np.asarray(counts[name]).reshape(-1)[:n]
    return table

  def _continue(self, first_step: int) -> None:
    """The first chunk of this process: a resumed run (``first_step`` > 0)
    keeps what the folder's ledger holds before its checkpoint; without it
    the ledger starts at ``first_step`` (and cannot re-time the run)."""
    self.meta["first_step"] = first_step
    if not first_step or not os.path.exists(self.path):
      return
    old = read(self.path)
    rounds = first_step // self.period
    if (old["meta"]["first_step"] == 0 and
        old["step_counts"].shape[0] >= first_step and
        old["step_counts"].shape[1] == len(self.names)):
      self.meta["first_step"] = 0
      self.step_counts = [old["step_counts"][:first_step]]
      self.sync_counts = [old["sync_counts"][:rounds]]
      if "participants" in old:
        self.participants = [old["participants"][:first_step]]

  def write(self) -> None:
    start, c = time.perf_counter(), len(self.names)
    arrays = {
        "meta": np.asarray(json.dumps({**self.meta, "names": self.names})),
        "step_counts": np.concatenate(self.step_counts or
                                      [np.zeros((0, c), np.int32)]),
        "sync_counts": np.concatenate(self.sync_counts or
                                      [np.zeros((0, c), np.int32)])}
    if self.participants:
      arrays["participants"] = np.concatenate(self.participants)
    data = io.BytesIO()
    np.savez_compressed(data, **arrays)
    # A folder gone or turned into a file: a WriteError naming it.
    _writers.check_writable(os.path.dirname(self.path))
    _writers.write_bytes(self.path, data.getvalue())
    now = time.perf_counter()
    self.written, self.write_s = now, now - start


def read(path: str) -> dict:
  """A ledger file's arrays, with ``meta`` decoded (a dict)."""
  with np.load(path) as z:
    out = {k: z[k] for k in z.files}
  out["meta"] = json.loads(str(out["meta"]))
  return out


__all__ = ["FILE", "Ledger", "read", "timing_dependence"]
