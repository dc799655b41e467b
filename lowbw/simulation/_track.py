"""One run's host-side bookkeeping: rows, clock, writers, summary.

A single run has one ``Track``; a sweep has one per point. Tracks only see
numpy copies of the device outputs (one point's slice of them in a sweep).
"""

import os
import time
from typing import Any

import jax
import numpy as np

from lowbw import telemetry
from lowbw.telemetry import _cost, _writers
from lowbw.telemetry._startup import process_age_s
from lowbw import network as net_lib
from lowbw.network import _clock
from lowbw.simulation import _divergence, _ledger
from lowbw.simulation._history import (History, NonFiniteLossError, Span,
                                      worker_events, worker_events_W)
from lowbw.telemetry import _metrics as names


class RunWarning(UserWarning):
  """A run finished but its numbers mean less than they seem (also in its
  summary's ``warnings``; ``degenerate`` when the shared model hardly
  trained)."""


class Track:
  """Rows, simulated clock and writers of one run (or one sweep point).

  Attributes:
    history: the rows logged so far.
    clock: the host's float64 simulated clock (with a network).
    error: the ``NonFiniteLossError`` that stopped this point, or None.
    prices: ``(gpu_price, egress_price)`` the summary prices the run at
      (``_cost.figures``; None: not priced).
  """

  prices: tuple = (None, None)

  def __init__(self, sim, log_every: int, network, log_dir: str | None,
               callback=None, config: dict | None = None):
    c = sim.config
    self.sim = sim
    self.network = network
    self.history = History(sim.schema.layout(network), log_every,
                           spacing_given=c.log_every is not None)
    self.clock = net_lib.Clock(
        clock_overlap(sim.config.strategy, network),
        0.0 if network is None else network.profile.startup_s)
    self.log_dir = log_dir
    # What re-timing the run on another network needs (``_retime``).
    self.ledger = _ledger.Ledger(sim, network, log_dir)
    self.callback = callback
    self.config = config or {}
    self.writers: list = []
    self.error: NonFiniteLossError | None = None
    # Start-up figures (``_startup.Compiled.take_startup``), the moment training
    # began in this process and the moment its first row was logged.
    self.startup: dict | None = None
    self.training_started: float | None = None
    self.first_row: tuple[float, float | None] | None = None
    # Functions that add columns to each row before it is written (the
    # counterfactual lanes' values, ``_lanes.Laned``).
    self.adders: list = []

  # ----------------------------------------------------------------- rows
  def emit(self, rows: list[dict]) -> None:
    if rows and self.first_row is None and self.training_started is not None:
      self.first_row = (time.perf_counter(), process_age_s())
    for row in rows:
      for add in self.adders:
        add(row)
      for i, w in enumerate(self.writers):
        w.write(row)
        if i == 0:  # in metrics.csv, not yet in TensorBoard
          telemetry.kill_point("row")
      if self.callback:
        self.callback(row)

  def consume(self, kind: str, n: int, out, ev, end_step: int, wall: float,
              last_step: int) -> list[dict]:
    """Logs a chunk's outputs (numpy); returns its rows (those at
    ``last_step`` are left to ``finalize``). Records a non-finite loss in
    ``error`` and re-raises it."""
    if self.error is not None:
      return []
    try:
      rows = self._rows(kind, n, out, ev, end_step, wall)
    except NonFiniteLossError as e:
      self.error = e
      self.emit(e.new_rows)
      raise
    rows = [r for r in rows if r[names.STEP] != last_step]
    self.emit(rows)
    return rows

  def _rows(self, kind, n, out, ev, end_step, wall):
    self.ledger.add(self.history.step, kind, n, out)
    span = (self._round_span(n, out) if kind == "rounds"
            else self._tail_span(n, out))
    rows = self.history.add(span, wall)
    if ev is not None:
      row = self.add_eval(end_step, ev, wall)
      if not rows or rows[-1] is not row:
        rows.append(row)
    return rows

  def _round_span(self, n: int, out) -> Span:
    """The ``Span`` of ``n`` rounds' outputs (a ``RoundOut``, numpy)."""
    period = self.sim.config.period
    per_step = _flatten_rounds(out.steps, n)
    round_end = np.zeros(n * period, bool)
    round_end[period - 1::period] = True
    counts = dict(per_step.counts)
    for name, c in out.sync_counts.items():
      full = np.zeros(n * period, np.int64)
      full[period - 1::period] = c[:n]
      counts[name] = counts.get(name, 0) + full
    span = Span(per_step.loss, per_step.metrics, per_step.first_bad_worker,
                counts, round_end, out.divergence[:n], out.lr[:n],
                strategy=_strategy_metrics(per_step.strategy,
                                           out.sync_metrics, n, period),
                correlation=(None if out.correlation is None
                             else out.correlation[:n]),
                step_lr=_step_lr(per_step),
                bad_grad=per_step.first_bad_grad)
    if out.clock is None:
      return span
    sim_time = self.clock.rounds(out.steps.clock.time_s[:n],
                                 out.clock.compute_s[:n], out.clock.sync_s[:n],
                                 _communicating(per_step.counts, n, period))
    sync_counts = {c: v[:n] for c, v in out.sync_counts.items()}
    taken = worker_events(
        per_step.counts, per_step.clock.participants, sync_counts,
        out.clock.participants[:n], period)
    taken_W = worker_events_W(
        per_step.counts, per_step.clock.active_W, sync_counts,
        out.clock.active_W[:n], period)
    participants = per_step.clock.participants.copy()
    participants[period - 1::period] = out.clock.participants[:n]
    # int worker-steps, or float32 shares of them (fragments' merges).
    merged = np.asarray(out.clock.useful[:n])
    useful = np.asarray(per_step.clock.useful, np.result_type(
        np.int64, merged.dtype)).copy()
    useful[period - 1::period] += merged
    self._catch_ups(per_step.clock, counts, taken, taken_W)
    return span._replace(sim_time=sim_time, participants=participants,
                         taken=taken, taken_W=taken_W,
                         members=per_step.clock.members, useful=useful)

  def _tail_span(self, n: int, per_step) -> Span:
    """The ``Span`` of the tail's ``n`` steps (a ``StepOut``, numpy)."""
    counts = dict(per_step.counts)
    span = Span(per_step.loss, per_step.metrics, per_step.first_bad_worker,
                counts, np.zeros(n, bool), np.zeros(0), np.zeros(0),
                strategy=_strategy_metrics(per_step.strategy, {}, n, 1),
                step_lr=_step_lr(per_step, n),
                bad_grad=per_step.first_bad_grad)
    if per_step.clock is None:
      return span
    participants = per_step.clock.participants
    taken = worker_events(per_step.counts, participants)
    taken_W = worker_events_W(per_step.counts, per_step.clock.active_W)
    self._catch_ups(per_step.clock, counts, taken, taken_W)
    comm_steps = _communicating(per_step.counts, 1, n)
    return span._replace(sim_time=self.clock.steps(
                             per_step.clock.time_s,
                             None if comm_steps is None else comm_steps[0]),
                         participants=participants, taken=taken,
                         taken_W=taken_W, members=per_step.clock.members,
                         useful=per_step.clock.useful)

  def _catch_ups(self, step_clock, counts, taken, taken_W) -> None:
    """Adds the workers' returns to the fleet (their downloads of the
    global state, ``network._clock.CATCH_UP``) to the steps' events: one
    worker-event per returning worker, at its round's first step."""
    if _clock.CATCH_UP not in self.sim.channels:
      return
    back = np.asarray(step_clock.rejoined_W, np.int64)
    counts[_clock.CATCH_UP] = taken[_clock.CATCH_UP] = back.sum(axis=1)
    taken_W[_clock.CATCH_UP] = back

  def add_eval(self, step: int, ev: dict, wall: float) -> dict:
    ev = {k: float(v) for k, v in ev.items()}
    return self.history.add_eval(step, ev, self.sim.config.is_lm, wall)

  def finalize(self, steps: int, wall: float, final_eval) -> None:
    """The last row, with a final evaluation (``final_eval()`` -> dict) when
    the last chunk had none."""
    if self.error is not None:
      return
    row = self.history.finalize(
        steps, wall, self.clock.elapsed if self.network is not None else None)
    if names.EVAL_LOSS not in row:
      self.add_eval(steps, final_eval(), wall)
    self.emit([row])

  # ---------------------------------------------------------------- files
  def open_writers(self, resumed: bool = False,
                   wandb_project: str | None = None) -> None:
    """The run's writers; a resumed run rewrites what it logged (its rows
    may have been re-spaced), and TensorBoard drops the interrupted run's
    events."""
    if not self.sim.main_process:
      return
    if self.log_dir:
      _writers.check_writable(self.log_dir)  # a WriteError naming it
      _writers.write_json(os.path.join(self.log_dir, "config.json"),
                           self.config)
      self.writers += [
          _writers.CSVWriter(os.path.join(self.log_dir, "metrics.csv"),
                              self.sim.columns()),
          _writers.TensorBoardWriter(
              os.path.join(self.log_dir, "tensorboard"),
              purge_step=0 if resumed else None)]
    if wandb_project is not None:
      name = self.log_dir and os.path.basename(os.path.normpath(self.log_dir))
      self.writers.append(_writers.WandbWriter(
          wandb_project, self.config, name=name, directory=self.log_dir))
    # A checkpoint at the last step holds that step's row before
    # ``finalize`` completes it; finalize writes it (once), as in the
    # uninterrupted run.
    last = self.sim.config.steps
    self._rewrite([r for r in self.history.rows if r[names.STEP] < last])

  def _rewrite(self, rows: list[dict]) -> None:
    """Writes ``rows`` to the files again, without the user's callback (a
    resumed run's rows from before its checkpoint)."""
    for row in rows:
      for w in self.writers:
        w.write(row)

  def close(self) -> None:
    for w in self.writers:
      w.close()
    self.writers = []

  def summary(self, compile_s: float, elapsed: float) -> dict[str, Any]:
    c, hist = self.sim.config, self.history.as_arrays()

    def last(name):
      if name not in hist:
        return None
      values = hist[name][~np.isnan(hist[name])]
      return float(values[-1]) if values.size else None

    examples = c.steps * c.workers * c.batch_size
    rate = (lambda n: n / elapsed if elapsed > 0 else None)  # noqa: E731
    summary = {
        "steps": c.steps, "num_workers": c.workers,
        "num_params": self.sim.num_params,
        "final_train_loss": last(names.TRAIN_LOSS),
        "final_eval_loss": last(names.EVAL_LOSS),
        "payload_bytes": self.history.payload_bytes,
        "wire_bytes": self.history.wire_bytes,
        "sent_bytes": self.history.sent_bytes,
        "received_bytes": self.history.received_bytes,
        **dict(zip(("sent_bytes_per_worker", "received_bytes_per_worker"),
                   self.history.per_worker())),
        **{names.tier_wire_bytes(t): b
           for t, b in self.history.tier_wire_bytes.items()},
        "peak_step_bytes": self.history.peak,
        "collectives": {name: ch.collective for name, ch in
                        self.sim.channels.items()},
        "sim_time_s": (self.clock.elapsed if self.network is not None
                       else None),
        names.GOODPUT: self.goodput(),
        "compile_s": compile_s, "wall_time_s": elapsed,
        "steps_per_s": rate(c.steps), "examples_per_s": rate(examples),
        "log_dir": self.log_dir,
    }
    summary.update(self.pipeline_figures())
    summary.update(_cost.of_summary(summary, *self.prices))
    for m in self.sim.metric_names:
      summary["final_eval_" + m] = last(names.eval_metric(m))
    if c.shadow is not None:
      summary["final_" + names.SHADOW_EVAL_LOSS] = last(names.SHADOW_EVAL_LOSS)
      summary["final_" + names.SHADOW_GAP] = last(names.SHADOW_GAP)
      h = self.history.as_arrays()
      summary[names.TOKEN_EFFICIENCY] = token_efficiency(
          h.get("step"), h.get(names.EVAL_LOSS),
          h.get(names.SHADOW_EVAL_LOSS))
    if c.is_lm:
      summary["final_eval_perplexity"] = last(names.EVAL_PERPLEXITY)
      summary["tokens_per_s"] = rate(examples * c.data.tokens_per_example)
    if self.error is not None:
      summary["error"] = str(self.error)
    summary.update(self.time_split())
    if self.startup is not None:
      summary["startup"] = self.startup_figures()
    summary["warnings"] = self.warnings()
    summary["degenerate"] = self.degenerate()
    diverged = self.divergence()
    summary["diverged_at_step"] = None if diverged is None else diverged.step
    return summary

  def pipeline_figures(self) -> dict:
    """A pipeline's summary entries: its boundary bytes per worker
    (``stage_bytes``) and, with a clock and a hardware, the share of each
    step its busiest stage is idle (``pipeline_bubble``); in a mixed fleet,
    which workers are pipelines (``pipeline_workers``: ``stage_bytes`` is
    each of theirs, the others send none)."""
    pipeline = self.sim.config.pipeline
    if pipeline is None:
      return {}
    out = {names.STAGE_BYTES: self.history.step *
           pipeline.bytes_per_step()}
    if pipeline.workers is not None:
      out["pipeline_workers"] = list(pipeline.workers)
    if self.network is not None:
      timeline = self.sim.prices.pricing(self.network).timeline
      out[names.PIPELINE_BUBBLE] = (None if timeline is None
                                    else timeline.bubble)
    return out

  def goodput(self) -> float | None:
    """Useful tokens over the tokens the fleet could have processed: the
    worker-steps whose work a communication took in (a sync's round, or a
    step's all-reduce for a strategy without a sync), over the steps every
    worker could have taken at its own speed in the simulated time (None
    without a clock or a hardware). Waiting at barriers, rounds lost to
    faults or dropped by a mitigation, and steps past the last sync lower
    it; every worker's batch holds the same tokens, so steps stand for
    tokens."""
    if (self.network is None or self.history.useful is None
        or not self.clock.elapsed > 0):
      return None
    pricing = self.sim.prices.pricing(self.network)
    if not pricing.step_s:
      return None
    if pricing.segment_step_s:  # the stage links follow a trace
      capacity = _clock.segment_capacity(self.network, pricing,
                                         self.sim.config.workers,
                                         self.clock.elapsed)
    else:
      capacity = _clock.capacity_steps(
          self.network, self.sim.config.workers,
          pricing.step_s_of_workers(self.sim.config.workers),
          self.clock.elapsed)
    return self.history.useful / capacity if capacity > 0 else None

  def startup_figures(self) -> dict:
    """The start-up breakdown, and when the first row was logged: seconds
    of training before it (the first chunk, and its evaluation if any) and
    the process's age then and when training started (None off Linux, or
    before any row)."""
    at, age = self.first_row or (None, None)
    first = (None if at is None or self.training_started is None
             else at - self.training_started)
    return {**self.startup, "first_row_s": first,
            "first_row_after_start_s": age,
            "first_step_after_start_s": (
                None if age is None or first is None else age - first)}

  def time_split(self) -> dict:
    """Nominal compute and communication seconds of the run (per worker,
    before stragglers, faults and overlap): what a round spends where."""
    net = self.config.get("network")
    if not net or net.get("compute_s_per_step") is None:
      return {}
    compute = self.history.step * net["compute_s_per_step"]
    comm = sum(n * net["comm_s_per_event"].get(c, 0.0)
               for c, n in self.history.events.items())
    total = compute + comm
    return {"compute_s": compute, "comm_s": comm,
            "comm_share": comm / total if total > 0 else None,
            **self._waiting(net, total, comm)}

  def _waiting(self, net: dict, nominal: float, comm: float) -> dict:
    """``wait_s``: simulated seconds beyond the nominal time and the first
    contact's set-up, spent waiting for the slowest workers (speeds,
    jitter, faults; less what overlap hid), and its share of the run's
    simulated time; {} when there is none."""
    elapsed = self.clock.elapsed if self.clock is not None else None
    if not elapsed or not elapsed > 0:
      return {}
    setup = (net.get("profile") or {}).get("startup_s") or 0.0
    wait = elapsed - nominal - (setup if comm > 0 else 0.0)
    if not wait > 1e-6 * elapsed:  # float sums of the clock, not waiting
      return {}
    return {"wait_s": wait, "wait_share": wait / elapsed}

  def divergence(self) -> _divergence.Divergence | None:
    """The loss ended far above its start, or accuracy at or below chance
    (``_divergence.check``); None otherwise."""
    return _divergence.check(self.history.as_arrays(),
                             self.sim.config.data.num_classes)

  def degenerate(self) -> bool:
    """No worker took part in most of the run's communications (faults):
    the shared model hardly trained."""
    h = self.history
    return h.syncs > 0 and h.empty_syncs * 2 > h.syncs

  def warnings(self) -> list[str]:
    """What makes this run's numbers mean less than they seem."""
    h, out = self.history, list(self.sim.config.data.notes)
    split = self.time_split()
    stragglers = (self.network is not None and
                  self.network.stragglers is not None)
    if stragglers and split.get("comm_share") is not None and (
        split["comm_share"] > 0.99):
      larger = ("; clock_params (--clock-params) times the run as a "
                "larger model's" if self.network.clock_params is None else "")
      out.append(
          f"compute is {100 * (1 - split['comm_share']):.2g}% of the nominal "
          "time, so stragglers and jitter, which slow compute, barely change "
          f"sim_time_s{larger}")
    diverged = self.divergence()
    if diverged is not None:
      out.append(f"the run diverged: {diverged.text} (a learning rate too "
                 "high for this model and batch?)")
    if h.empty_syncs:
      out.append(
          f"{h.empty_syncs} of {h.syncs} communications had no participating "
          "worker (faults: every worker down or its message lost)"
          + ("; the shared model hardly trained: this run is degenerate"
             if self.degenerate() else ""))
    out += self._late_faults()
    out += self._assumed_mfu(split)
    out += self._non_finite()
    return out

  def _assumed_mfu(self, split: dict) -> list[str]:
    """The clock priced compute at the default MFU for a model far below
    the size that reaches it, and compute is a fair share of the time."""
    priced = (None if self.network is None else
              _clock.assumed_mfu(self.network, self.sim.num_params))
    share = split.get("comm_share")
    if priced is None or share is None or 1 - share < 0.1:
      return []
    return [f"compute is {100 * (1 - share):.0f}% of the nominal time, "
            f"priced at MFU {self.network.hardware.mfu:g} (the default, what "
            f"models of billions of parameters reach); a model of "
            f"{priced:,} parameters reaches less (a 30.8M-parameter one "
            "reached 0.16 of an L40S's peak), so sim_time_s is optimistic: "
            "give mfu (--mfu) or hardware as a measured time per step "
            "('25ms')"]

  def _non_finite(self) -> list[str]:
    """Figures that came out infinite or NaN although the run went on: the
    simulated clock (it overflowed) and the evaluation losses (a training
    loss that turns non-finite stops the run instead)."""
    out = []
    if self.network is not None and not np.isfinite(self.clock.elapsed):
      out.append(f"the simulated time is {self.clock.elapsed} s: the clock "
                 "overflowed (a network or hardware too slow to time), so "
                 "sim_time_s means nothing")
    # An evaluation's row holds its columns; other rows leave them out, so
    # a NaN here is a NaN result, not a step without an evaluation.
    for name in [names.EVAL_LOSS] + [names.eval_metric(m)
                                     for m in self.sim.metric_names]:
      bad = next((r for r in self.history.rows if name in r and
                  not np.isfinite(r[name])), None)
      if bad is not None:
        out.append(f"{name} is {bad[name]} from step {bad[names.STEP]}")
    return out

  def _late_faults(self) -> list[str]:
    """Scheduled failures and windows that start after the last step: they
    change nothing in this run (a longer run resumed from it meets them)."""
    faults = self.network and self.network.faults
    if not faults:
      return []
    steps = self.sim.config.steps
    late = [f"worker {w}'s failure at step {s}" for w, s in faults.failures
            if s >= steps]
    late += [f"worker {w}'s window from step {a}" for w, a, _ in
             faults.windows if a >= steps]
    return [f"{', '.join(late)} start{'s' if len(late) == 1 else ''} after "
            f"the run's last step ({steps - 1}): no effect in this run"] \
        if late else []

  def write_summary(self, summary: dict) -> None:
    if self.log_dir and self.sim.main_process:
      # The folder may have gone (or become a file) while the run wrote:
      # a WriteError naming it, not a bare FileExistsError.
      _writers.check_writable(self.log_dir)
      _writers.write_json(os.path.join(self.log_dir, "summary.json"), summary)


def clock_overlap(strategy, network) -> bool | int:
  """How the clock overlaps a sync's communication: the strategy's own
  ``overlap_steps`` when it declares one (its result is needed then), else
  the network's ``overlap`` (the whole next round, or none)."""
  if network is None:
    return False
  if strategy.overlap_steps is not None:
    return strategy.overlap_steps
  return network.overlap


def _step_lr(per_step, n: int | None = None):
  """The steps' inner learning rates as float64 (None when not measured)."""
  if getattr(per_step, "lr", None) is None:
    return None
  lr = np.asarray(per_step.lr, np.float64)
  return lr if n is None else lr[:n]


def _flatten_rounds(steps, n: int):
  """(rounds, period, ...) per-step outputs of ``n`` rounds -> (n*period, ...)."""
  return jax.tree.map(lambda x: x[:n].reshape((-1,) + x.shape[2:]), steps)


def _strategy_metrics(local: dict, sync: dict, n: int, period: int) -> dict:
  """The strategy's own metrics over ``n`` rounds of ``period`` steps as
  (n*period,) float arrays: its local step's at every step, its sync's at
  the rounds' last steps (nan elsewhere; the sync's value wins there)."""
  out = {m: np.asarray(v[:n * period], np.float64) for m, v in local.items()}
  for m, v in sync.items():
    full = out.get(m, np.full(n * period, np.nan)).copy()
    full[period - 1::period] = np.asarray(v[:n], np.float64)
    out[m] = full
  return out


def _communicating(counts: dict, n: int, period: int):
  """(n, period) bool: the steps whose own channels sent something (for
  the clock's start-up), or None when no step channel exists."""
  if not counts:
    return None
  total = sum(np.asarray(c).reshape(-1)[:n * period] for c in counts.values())
  return (np.asarray(total) > 0).reshape(n, period)


def token_efficiency(step, loss, shadow_loss) -> float | None:
  """The run's token efficiency against its paired DDP lane, from their
  evaluations: when the run ends above the lane's final loss, the share of
  its steps the lane needed to reach the run's final loss (< 1); when it
  ends below, its steps over those it needed to reach the lane's final
  loss (> 1). Between evaluations the losses are interpolated linearly in
  steps. None without evaluations of both, or when the level was reached
  at the first evaluation already (evaluate more often to measure it)."""
  if step is None or loss is None or shadow_loss is None:
    return None
  ok = np.isfinite(loss) & np.isfinite(shadow_loss)
  t = np.asarray(step, float)[ok]
  run, lane = np.asarray(loss)[ok], np.asarray(shadow_loss)[ok]
  if not t.size:
    return None
  if run[-1] >= lane[-1]:
    at = _first_reach(t, lane, run[-1])
    return None if at is None else at / t[-1]
  at = _first_reach(t, run, lane[-1])
  return None if at is None else t[-1] / at


def crossing(curve, level: float) -> tuple[int, float] | None:
  """Where the evaluations ``curve`` first come down to ``level``: (k,
  share), the first evaluation k at or below it and the share of the way
  from evaluation k - 1 to k at which a line between them crosses it (1.0
  when k is the first evaluation); None when it never does. An axis read
  at k - 1 + share (steps, simulated seconds) is the crossing's."""
  curve = np.asarray(curve, float)
  below = curve <= level
  if not below.any():
    return None
  k = int(np.argmax(below))
  if k == 0:
    return 0, 1.0
  above, at = curve[k - 1], curve[k]
  return k, float((above - level) / (above - at)) if above > at else 1.0


def at_crossing(axis, k: int, share: float) -> float:
  """``axis`` (one value per evaluation) read at a ``crossing``."""
  axis = np.asarray(axis, float)
  if k == 0:
    return float(axis[0])
  return float(axis[k - 1] + share * (axis[k] - axis[k - 1]))


def _first_reach(t: np.ndarray, curve: np.ndarray, level: float):
  """The first step at which ``curve`` (evaluated at steps ``t``) comes
  down to ``level``, interpolated; None if never, or at its first
  evaluation already."""
  found = crossing(curve, level)
  if found is None or found[0] == 0:
    return None
  return at_crossing(t, *found)
