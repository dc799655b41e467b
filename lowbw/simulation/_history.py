"""Host-side bookkeeping: per-step device outputs -> logged rows.

Runs once per chunk on numpy arrays (cumulative sums; Python loops only over
the rows to log, never over steps). Its whole state is JSON-able so a checkpoint can carry it and a resumed
run logs exactly what an uninterrupted one would have.
"""

import math
from fractions import Fraction
from typing import Any, NamedTuple

import numpy as np

from lowbw.network._collectives import received_wire, tiers_of
from lowbw.simulation import _sums
from lowbw.telemetry import _metrics as names


class NonFiniteLossError(FloatingPointError):
  """A worker's training loss became NaN or infinite.

  The error names where the non-finite value started: the first step at
  which a worker's own loss, or its own gradient (before any reduction
  over workers), was non-finite. Under a strategy that averages gradients
  every step, a NaN in one worker's gradient reaches every worker through
  that step's all-reduce, and every loss of the next step is NaN; the
  gradient's worker is the one named.

  Attributes:
    step: the inner step (1-based) at which ``quantity`` was first
      non-finite.
    worker: the first worker whose own ``quantity`` was non-finite then.
    quantity: ``"loss"`` or ``"gradient"``.
    stopped_at: the step whose training loss was non-finite (the run
      stopped there; ``step`` itself for a loss).
    history: what was logged before it (metric name -> numpy array).
    new_rows: the rows of the failing chunk that precede the bad step (the
      runner writes them before re-raising).
  """

  def __init__(self, step: int, worker: int, history: dict,
               new_rows: list | None = None, quantity: str = "loss",
               stopped_at: int | None = None, spread: bool = False):
    stopped_at = step if stopped_at is None else stopped_at
    if quantity == "loss":
      what = f"non-finite training loss at step {step} on worker {worker}"
    else:
      what = (f"non-finite gradient of worker {worker} at step {step} (its "
              "loss was finite)" + ("; it reached the other workers through "
                                    "that step's communication" if spread
                                    else "") +
              f"; the training loss was non-finite at step {stopped_at}")
    super().__init__(
        f"{what}; the rows logged before it were kept. Likely cause: "
        f"{_cause(step, quantity)}")
    self.step, self.worker, self.history = step, worker, history
    self.quantity, self.stopped_at = quantity, stopped_at
    self.new_rows = new_rows or []


def _cause(step: int, quantity: str) -> str:
  if quantity == "gradient":
    return ("a function whose derivative is not finite where that worker's "
            "data puts it (a square root or a logarithm at 0, a division by "
            "0), or a learning rate too high for the model")
  if step == 1:
    return ("at the first step, so the data or the model rather than the "
            "learning rate: labels beyond the model's classes, features "
            "with NaN or infinite values, or a loss that is not finite at "
            "initialisation")
  return ("a learning rate too high for the model, or data with NaN or "
          "infinite values")


class Layout(NamedTuple):
  """What a run's rows hold (``History``'s columns beyond the fixed ones).

  Attributes:
    channels: name -> ``Channel`` (the bytes of one event of each).
    metric_names: the model's own metrics.
    examples_per_step: examples all workers take per step (W x batch).
    tokens_per_example: tokens per example (language models), or None.
    num_workers: W; who took part when ``add`` is not told: every worker.
    strategy_metrics: the strategy's own metrics.
    clock: the run has a simulated clock (a network).
    correlation: the workers' correlation is logged (correlation_every).
    members: the workers up are logged (under faults).
    perplexity: language models: train_perplexity from the mean
      cross-entropy.
    stage_bytes_per_step: a pipeline's boundary bytes per step per worker
      (``stage_bytes``); 0: no pipeline, no column.
  """

  channels: dict
  metric_names: list
  examples_per_step: int = 1
  tokens_per_example: int | None = None
  num_workers: int = 1
  strategy_metrics: list = ()
  clock: bool = False
  correlation: bool = False
  members: bool = False
  perplexity: bool = False
  stage_bytes_per_step: int = 0


class Span(NamedTuple):
  """n consecutive steps' outputs as numpy arrays (``History.add``).

  Attributes:
    loss: (n,) mean training loss over workers per step.
    metrics: name -> (n,) model metrics, mean over workers.
    bad_worker: (n,) int: first worker with a non-finite loss, or -1.
    counts: channel -> (n,) int events per step (sync events included at
      the last step of their round).
    round_end: (n,) bool, True where a round (and its sync) ended.
    divergence, lr: (number of round ends,) values at those round ends.
    sim_time: (n,) simulated seconds after each step (with a clock).
    participants: (n,) workers averaged by each step's communication, -1
      where it had none (with a clock).
    strategy: name -> (n,) the strategy's own metrics, nan at the steps
      that did not report them.
    correlation: (number of round ends,) the workers' correlation, nan
      where it was not due (with correlation_every).
    taken: channel -> (n,) int worker-events per step: each event of
      ``counts`` times the workers that took part in it; None: every
      worker took part.
    taken_W: channel -> (n, W) int, the same per worker; None: every
      worker took part in every event.
    members: (n,) int, the workers up at each step (under faults).
    useful: (n,) worker-steps whose work a communication took in at
      each step (with a clock; a sync's at its round's last step).
    step_lr: (n,) the inner learning rate after each step (nan where it
      is not known: then a row shows the last round end's ``lr``).
    bad_grad: (n,) int: first worker whose own gradient was non-finite,
      or -1; None: not measured.
  """

  loss: Any
  metrics: dict
  bad_worker: Any
  counts: dict
  round_end: Any
  divergence: Any
  lr: Any
  sim_time: Any = None
  participants: Any = None
  strategy: dict | None = None
  correlation: Any = None
  taken: dict | None = None
  taken_W: dict | None = None
  members: Any = None
  useful: Any = None
  step_lr: Any = None
  bad_grad: Any = None


class History:
  """Accumulates rows of metrics at every ``log_every`` steps and eval points."""

  def __init__(self, layout: Layout, log_every: int,
               spacing_given: bool = True):
    self.channels = layout.channels
    self.num_workers = layout.num_workers
    self.tiers = tiers_of(layout.channels)
    self._last_bytes = None  # ``_row_bytes``' last answer
    self.log_every = log_every
    # A default spacing may be re-spaced by a resume that extends the run.
    self.spacing_given = spacing_given
    self.examples_per_step = layout.examples_per_step
    self.stage_bytes_per_step = layout.stage_bytes_per_step
    self.tokens_per_example = layout.tokens_per_example
    self.metric_names = list(layout.metric_names)
    self.rows: list[dict[str, Any]] = []
    # The exact sums behind each log row's training means (its step -> the
    # carry at that row), so rows can be merged exactly when re-spaced.
    self.windows: dict[int, dict] = {}
    self.step = 0
    self.events = {name: 0 for name in self.channels}  # cumulative, per worker
    # Cumulative worker-events: each event times the workers that took part.
    self.taken = {name: 0 for name in self.channels}
    # The same per worker: channel -> int64 (W,).
    self.taken_W = {name: np.zeros(self.num_workers, np.int64)
                    for name in self.channels}
    self._reset_carry()
    self.divergence = math.nan
    self.lr = math.nan
    # The workers' correlation (with correlation_every): the latest value.
    self.track_correlation = layout.correlation
    self.correlation = math.nan
    self.perplexity = layout.perplexity
    # The simulated clock (a run with a network): seconds after the last
    # step, and how many workers the last communication averaged.
    self.sim_time = 0.0 if layout.clock else None
    self.participants = math.nan
    # Under faults: the workers in the fleet (up) in the latest round.
    self.track_members = layout.members
    self.members = math.nan
    # Communications the clock saw, and those no worker took part in.
    self.syncs = 0
    self.empty_syncs = 0
    # Worker-steps whose work a communication took in (goodput's numerator;
    # None: a checkpoint from before they were counted).
    self.useful = 0
    # The most wire bytes one step has put on the wire so far (per worker).
    self.peak = 0.0
    # The strategy's own metrics: the latest value reported.
    self.strategy = {m: math.nan for m in layout.strategy_metrics}
    # The first non-finite own gradient of a step whose losses were all
    # finite: [step, worker, whether that step communicated], or None.
    self.bad_grad: list | None = None

  # ------------------------------------------------------------- checkpoints
  def state_dict(self) -> dict:
    return {"rows": self.rows, "step": self.step, "events": self.events,
            "taken": self.taken,
            "taken_W": {c: v.tolist() for c, v in self.taken_W.items()},
            "log_every": self.log_every, "spacing_given": self.spacing_given,
            "carry": _carry_json(self.carry),
            "windows": [[s, _carry_json(w)] for s, w in self.windows.items()],
            "divergence": self.divergence, "lr": self.lr,
            "correlation": self.correlation,
            "sim_time": self.sim_time, "participants": self.participants,
            "members": self.members,
            "strategy": self.strategy, "peak": self.peak,
            "syncs": self.syncs, "empty_syncs": self.empty_syncs,
            "useful": self.useful, "bad_grad": self.bad_grad}

  def load_state_dict(self, d: dict) -> None:
    self.rows = [dict(r) for r in d["rows"]]
    self.step = int(d["step"])
    self.events = {k: int(v) for k, v in d["events"].items()}
    # A checkpoint from before "taken" was kept: every worker took part.
    self.taken = {k: int(v) for k, v in d.get("taken", {
        c: n * self.num_workers for c, n in self.events.items()}).items()}
    # From before per-worker counts were kept: every worker took part.
    self.taken_W = {c: np.asarray(v, np.int64) for c, v in d.get(
        "taken_W", {c: [n] * self.num_workers
                    for c, n in self.events.items()}).items()}
    self.carry = _carry_from_json(d["carry"])
    self.windows = {int(s): _carry_from_json(w)
                    for s, w in d.get("windows", [])}
    self.divergence = float(d["divergence"])
    self.lr = float(d["lr"])
    self.correlation = float(d.get("correlation", math.nan))
    self.sim_time = d.get("sim_time")
    self.participants = float(d.get("participants", math.nan))
    self.members = float(d.get("members", math.nan))
    self.strategy.update({k: float(v) for k, v in
                          d.get("strategy", {}).items()})
    self.peak = float(d.get("peak", 0.0))
    self.useful = d.get("useful")
    self.syncs = int(d.get("syncs", 0))
    self.empty_syncs = int(d.get("empty_syncs", 0))
    self.bad_grad = d.get("bad_grad")

  def respace(self, log_every: int) -> None:
    """Re-spaces the rows so far to ``log_every`` (a multiple of the current
    spacing), exactly as if the run had logged at it from the start: how a
    resume that extends a run with the default spacing logs what one
    uninterrupted run does."""
    if log_every % self.log_every:
      raise ValueError(f"log_every={log_every} is not a multiple of "
                       f"{self.log_every}")
    train = {names.TRAIN_LOSS, names.LR, names.TRAIN_PERPLEXITY,
             *map(names.train_metric, self.metric_names)}
    rows, windows, pending = [], {}, []
    for row in self.rows:
      s = row[names.STEP]
      if s in self.windows:
        pending.append(self.windows[s])
        if s % log_every == 0:
          windows[s] = _merge(pending)
          pending = []
          row = dict(row)
          self._train_means(row, windows[s])
        elif names.EVAL_LOSS in row:  # now an evaluation's row alone
          row = {k: v for k, v in row.items() if k not in train}
        else:
          continue
      rows.append(row)
    self.rows, self.windows, self.log_every = rows, windows, log_every
    self.carry = _merge(pending + [self.carry])

  # ------------------------------------------------------------------ bytes
  def _wire(self, events: dict[str, int], tier: str | None = None) -> float:
    """Wire bytes of ``events`` (of one ``tier``'s channels only, if given),
    summed exactly and rounded once."""
    return float(sum((n * Fraction(self.channels[c].wire_bytes)
                      for c, n in events.items()
                      if tier is None or self.channels[c].tier == tier),
                     Fraction(0)))

  def _bytes(self, events: dict[str, int]) -> tuple[int, float]:
    """Payload (exact int) and wire bytes."""
    payload = sum(n * self.channels[c].payload_bytes for c, n in events.items())
    return payload, self._wire(events)

  def _tier_bytes(self, events: dict[str, int]) -> dict[str, float]:
    """Wire bytes of each tier (two-tier strategies only)."""
    return {t: self._wire(events, t) for t in self.tiers}

  def _fleet(self, taken: dict[str, int]) -> tuple[float, float]:
    """Bytes sent and received by the workers that took part (``taken``:
    channel -> worker-events), summed exactly and rounded once."""
    def total(per_worker):
      return float(sum((n * Fraction(per_worker(self.channels[c]))
                        for c, n in taken.items()), Fraction(0)))
    return total(lambda ch: ch.wire_bytes), total(received_wire)

  @property
  def sent_bytes(self) -> float:
    return self._fleet(self.taken)[0]

  def per_worker(self) -> tuple[list[float], list[float]]:
    """Each worker's bytes sent and received (what ``sent_bytes`` and
    ``received_bytes`` sum), from its own worker-events."""
    out = [self._fleet({c: int(v[w]) for c, v in self.taken_W.items()})
           for w in range(self.num_workers)]
    return [o[0] for o in out], [o[1] for o in out]

  @property
  def received_bytes(self) -> float:
    return self._fleet(self.taken)[1]

  @property
  def tier_wire_bytes(self) -> dict[str, float]:
    return self._tier_bytes(self.events)

  @property
  def payload_bytes(self) -> int:
    return self._bytes(self.events)[0]

  @property
  def wire_bytes(self) -> float:
    return self._bytes(self.events)[1]

  def _step_wire(self, counts: dict, n: int) -> np.ndarray:
    """(n,) wire bytes each step sent, per worker (syncs at their step)."""
    wire = np.zeros(n, np.float64)
    for c, k in counts.items():
      wire += np.asarray(k, np.float64) * float(self.channels[c].wire_bytes)
    return wire

  # ------------------------------------------------------------------ rows
  def as_arrays(self) -> dict[str, np.ndarray]:
    keys = []
    for row in self.rows:
      keys += [k for k in row if k not in keys]
    return {k: np.array([_num(r.get(k)) for r in self.rows]) for k in keys}

  def add(self, span: Span, wall_time_s: float) -> list[dict]:
    """Consumes the n consecutive steps of ``span``; returns the new rows
    (and keeps them). ``wall_time_s``: real seconds since the run started.

    Raises:
      NonFiniteLossError: after logging the rows before the bad step.
    """
    n = len(span.loss)
    steps = self.step + 1 + np.arange(n)
    bad = np.flatnonzero(np.asarray(span.bad_worker) >= 0)
    stop = int(bad[0]) if bad.size else n
    self._note_bad_grad(span, steps, stop)
    cursor = _Cursor(self, span, stop)
    if span.useful is not None and self.useful is not None:
      took = np.sum(np.asarray(span.useful, np.float64)[:stop])
      self.useful += int(took) if took.is_integer() else float(took)
    new_rows, prev = [], -1
    for j in np.flatnonzero(steps[:stop] % self.log_every == 0).tolist():
      s = int(steps[j])
      events, taken_now = cursor.at(j)
      row = self._bare_row(s, wall_time_s, {**self.events, **events},
                           {**self.taken, **taken_now})
      cursor.take(prev, j)
      self._train_means(row, self.carry)
      self.windows[s] = self.carry
      if not math.isnan(self.lr):
        row[names.LR] = self.lr
      new_rows.append(row)
      self._reset_carry()
      prev = j

    last = stop - 1
    if last > prev:
      cursor.take(prev, last)
    if last >= 0:
      events, taken_now = cursor.at(last)
      self.events.update(events)
      self.taken.update(taken_now)
      self._add_per_worker(span.counts, span.taken_W, stop)
    self.step += stop
    self.rows += new_rows
    if bad.size:
      raise self._non_finite(int(steps[stop]), int(span.bad_worker[stop]),
                             new_rows)
    return new_rows

  def _note_bad_grad(self, span: Span, steps, stop: int) -> None:
    """Keeps the first step before ``stop`` (all of whose losses were
    finite) at which a worker's own gradient was not."""
    if span.bad_grad is None or self.bad_grad is not None:
      return
    flags = np.asarray(span.bad_grad)[:stop]
    hit = np.flatnonzero(flags >= 0)
    if hit.size:
      j = int(hit[0])
      sent = any(int(np.asarray(c)[j]) > 0 for c in span.counts.values())
      self.bad_grad = [int(steps[j]), int(flags[j]), sent]

  def _non_finite(self, step: int, worker: int, new_rows: list):
    """The error for a loss non-finite at ``step``: named after the
    gradient that started it, if one was non-finite before."""
    if self.bad_grad is None:
      return NonFiniteLossError(step, worker, self.as_arrays(), new_rows)
    at, who, sent = self.bad_grad
    return NonFiniteLossError(at, who, self.as_arrays(), new_rows,
                              quantity="gradient", stopped_at=step,
                              spread=sent)

  def _add_per_worker(self, counts: dict, taken_W, stop: int) -> None:
    """Each worker's worker-events of the first ``stop`` steps (``taken_W``;
    None: every worker took part in every event)."""
    for c, k in counts.items():
      self.taken_W[c] = self.taken_W[c] + (
          int(np.sum(np.asarray(k, np.int64)[:stop])) if taken_W is None
          else np.sum(np.asarray(taken_W[c], np.int64)[:stop], axis=0))

  def _reset_carry(self):
    self.carry = {"n": 0, "loss": _sums.ZERO,
                  **{m: _sums.ZERO for m in self.metric_names}}

  def _train_means(self, row: dict, carry: dict) -> None:
    n = carry["n"]
    row[names.TRAIN_LOSS] = _sums.mean(carry["loss"], n)
    for m in self.metric_names:
      row[names.train_metric(m)] = _sums.mean(carry[m], n)
    if self.perplexity:
      # A loss with regularisers (moe_gpt's router terms) reports its
      # language-modelling part as cross_entropy, as for eval_perplexity.
      nll = row.get(names.train_metric("cross_entropy"), row[names.TRAIN_LOSS])
      row[names.TRAIN_PERPLEXITY] = math.exp(min(nll, 700.0))

  def finalize(self, step: int, wall_time_s: float,
               sim_time: float | None = None) -> dict:
    """The row at the last step, made from the steps since the last row.

    Kept apart from ``add`` so that rows and checkpoints before the end follow
    the periodic rules alone: a run of N steps checkpointed at N and resumed to
    2N logs exactly what a run of 2N steps logs. ``sim_time``: the clock once
    every message has arrived (later than the last step's with overlap).
    """
    if sim_time is not None:
      self.sim_time = sim_time
    if self.rows and self.rows[-1][names.STEP] == step:
      row = self.rows[-1]  # made by an evaluation at this step, or a log row
    else:
      row = self._bare_row(step, wall_time_s)
      self.rows.append(row)
    if self.carry["n"]:
      self._train_means(row, self.carry)
    if not math.isnan(self.lr):
      row[names.LR] = self.lr
    if self.sim_time is not None:
      self._clock_columns(row)
    self._reset_carry()
    return row

  def _row_bytes(self, events: dict, taken: dict) -> tuple:
    """``(payload, wire, sent, received, tier wire bytes)`` of cumulative
    ``events`` and ``taken``; the last answer is kept, as the rows of a
    round's steps without a sync ask the same (each an exact sum of
    fractions: most of a row's cost)."""
    key = (tuple(events.items()), tuple(taken.items()))
    if self._last_bytes is None or self._last_bytes[0] != key:
      self._last_bytes = (key, (*self._bytes(events), *self._fleet(taken),
                                self._tier_bytes(events)))
    return self._last_bytes[1]

  def _bare_row(self, step, wall_time_s, events=None, taken=None):
    events = self.events if events is None else events
    taken = self.taken if taken is None else taken
    payload, wire, sent, received, tiers = self._row_bytes(events, taken)
    row = {names.STEP: step, names.EXAMPLES: step * self.examples_per_step}
    if self.tokens_per_example:
      row[names.TOKENS] = row[names.EXAMPLES] * self.tokens_per_example
    if self.stage_bytes_per_step:
      row[names.STAGE_BYTES] = step * self.stage_bytes_per_step
    row.update({names.PAYLOAD_BYTES: payload, names.WIRE_BYTES: wire,
                names.SENT_BYTES: sent, names.RECEIVED_BYTES: received,
                **{names.tier_wire_bytes(t): b for t, b in tiers.items()},
                names.PEAK_STEP_BYTES: self.peak,
                names.WORKER_DIVERGENCE: self.divergence,
                **({names.WORKER_CORRELATION: self.correlation}
                   if self.track_correlation else {}),
                names.WALL_TIME_S: wall_time_s})
    if self.sim_time is not None:
      self._clock_columns(row)
    for m, value in self.strategy.items():
      row[names.strategy_metric(m)] = value
    return row

  def _clock_columns(self, row):
    row[names.SIM_TIME_S] = self.sim_time
    row[names.SYNC_WORKERS] = self.participants
    if self.track_members:
      row[names.WORKERS_UP] = self.members

  def add_eval(self, step: int, results: dict[str, float],
               perplexity: bool, wall_time_s: float) -> dict:
    """Attaches evaluation results to the row at ``step`` (made if missing)."""
    if self.rows and self.rows[-1][names.STEP] == step:
      row = self.rows[-1]
    else:
      row = self._bare_row(step, wall_time_s)
      self.rows.append(row)
    for name, value in results.items():
      row[_EVAL_COLUMNS.get(name) or names.eval_metric(name)] = float(value)
    if "shadow_loss" in results:
      row[names.SHADOW_GAP] = (float(results["loss"]) /
                               float(results["shadow_loss"]) - 1.0)
    if perplexity:
      # A model whose loss adds regularisers (moe_gpt's router terms)
      # reports the language-modelling part as its cross_entropy metric.
      nll = results.get("cross_entropy", results["loss"])
      row[names.EVAL_PERPLEXITY] = float(np.exp(nll))
    return row


class _Cursor:
  """A span's values made cumulative, and ``at(j)``: the history's latest
  values (divergence, lr, clock, ...) as of the span's index ``j``."""

  def __init__(self, history: History, span: Span, stop: int):
    h, n = history, len(span.loss)
    self.h, self.span = h, span
    self.events_cum = {c: np.cumsum(np.asarray(span.counts[c], np.int64))
                       for c in span.counts}
    taken = span.taken
    if taken is None:
      taken = {c: np.asarray(k, np.int64) * h.num_workers
               for c, k in span.counts.items()}
    self.taken_cum = {c: np.cumsum(np.asarray(taken[c], np.int64))
                      for c in taken}
    self.loss_cum = _sums.ExactCumsum(np.asarray(span.loss)[:stop])
    self.metric_cum = {m: _sums.ExactCumsum(np.asarray(span.metrics[m])[:stop])
                       for m in h.metric_names}
    self.ends = np.flatnonzero(span.round_end)
    self.correlation = None
    if span.correlation is not None:
      self.correlation = np.asarray(span.correlation, np.float64)
      self.due = np.flatnonzero(~np.isnan(self.correlation))
      self.due_ends = self.ends[self.due]
    if span.participants is not None:
      self.part = np.asarray(span.participants, np.float64)
      self.communicated = np.flatnonzero(self.part >= 0)
      h.syncs += int(np.sum(self.part[:stop] >= 0))
      h.empty_syncs += int(np.sum(self.part[:stop] == 0))
    self.reported = {
        m: (np.asarray(v, np.float64), np.flatnonzero(~np.isnan(v)))
        for m, v in (span.strategy or {}).items()}
    self.peak_cum = (np.maximum.accumulate(h._step_wire(span.counts, n))
                     if n else None)

  def at(self, j: int) -> tuple[dict, dict]:
    """Sets the history's latest values as of index ``j``; returns the
    cumulative events and worker-events there."""
    h, span = self.h, self.span
    k = np.searchsorted(self.ends, j, side="right") - 1
    if k >= 0:
      h.divergence, h.lr = float(span.divergence[k]), float(span.lr[k])
    if span.step_lr is not None and not math.isnan(span.step_lr[j]):
      h.lr = float(span.step_lr[j])  # every row, the first round's too
    if self.correlation is not None:
      c = np.searchsorted(self.due_ends, j, side="right") - 1
      if c >= 0:
        h.correlation = float(self.correlation[self.due[c]])
    if span.sim_time is not None:
      h.sim_time = float(span.sim_time[j])
      c = np.searchsorted(self.communicated, j, side="right") - 1
      if c >= 0:
        h.participants = float(self.part[self.communicated[c]])
    h.peak = max(h.peak, float(self.peak_cum[j]))
    if span.members is not None:
      h.members = float(span.members[j])
    for m, (values, at_steps) in self.reported.items():
      i = np.searchsorted(at_steps, j, side="right") - 1
      if i >= 0:
        h.strategy[m] = float(values[at_steps[i]])
    return ({c: h.events[c] + int(v[j]) for c, v in self.events_cum.items()},
            {c: h.taken[c] + int(v[j]) for c, v in self.taken_cum.items()})

  def take(self, prev: int, j: int) -> None:
    """Adds the steps after index ``prev`` up to ``j`` to the carry."""
    carry = self.h.carry
    carry["n"] += j - prev
    carry["loss"] += self.loss_cum.span(prev, j)
    for m in self.h.metric_names:
      carry[m] += self.metric_cum[m].span(prev, j)


# Evaluation results whose column is not eval_<name>.
_EVAL_COLUMNS = {"loss": names.EVAL_LOSS, "shadow_loss": names.SHADOW_EVAL_LOSS}


def worker_events(counts: dict, participants, sync_counts: dict = None,
                  sync_participants=None, period: int = 1) -> dict:
  """channel -> (n,) int64 worker-events per step: each event times the
  workers that took part in its communication.

  ``counts``/``participants``: the steps' events and how many took part in
  each step's communication ((n,), -1 where none); ``sync_counts`` /
  ``sync_participants``: the same for the syncs of n/period rounds, which
  land at the rounds' last steps.
  """
  k = np.maximum(np.asarray(participants, np.int64), 0)
  out = {c: np.asarray(v, np.int64) * k for c, v in counts.items()}
  if sync_counts:
    k_sync = np.maximum(np.asarray(sync_participants, np.int64), 0)
    for c, v in sync_counts.items():
      full = np.zeros(len(k), np.int64)
      full[period - 1::period] = np.asarray(v, np.int64) * k_sync
      out[c] = out.get(c, 0) + full
  return out


def worker_events_W(counts: dict, active_W, sync_counts: dict = None,
                    sync_active_W=None, period: int = 1) -> dict:
  """channel -> (n, W) int64 worker-events per step and worker: each event
  for every worker that took part in its communication (``active_W``,
  (n, W) bool; ``sync_*``: the syncs of n/period rounds, at their rounds'
  last steps), as ``worker_events`` counts them summed over workers."""
  a = np.asarray(active_W, np.int64)
  out = {c: np.asarray(v, np.int64)[:, None] * a for c, v in counts.items()}
  if sync_counts:
    s = np.asarray(sync_active_W, np.int64)
    for c, v in sync_counts.items():
      full = np.zeros_like(a)
      full[period - 1::period] = np.asarray(v, np.int64)[:, None] * s
      out[c] = out.get(c, 0) + full
  return out


def _merge(carries: list[dict]) -> dict:
  return {k: sum((c[k] for c in carries[1:]), carries[0][k])
          for k in carries[0]}


def _carry_json(carry: dict) -> dict:
  return {k: v if k == "n" else _sums.to_json(v) for k, v in carry.items()}


def _carry_from_json(d: dict) -> dict:
  return {k: int(v) if k == "n" else _sums.from_json(v) for k, v in d.items()}


def _num(value):
  return math.nan if value is None else value
