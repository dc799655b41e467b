"""A pipeline's step on the simulated clock: the timeline of S stages running
M micro-batches forward and backward in a schedule, with a link of its own
on every stage-to-stage hop.

:func:`timeline` plays one step out op by op. Each stage runs one op (a
micro-batch's forward or backward) at a time, in its schedule's order,
starting it once its input is there: a forward needs the previous stage's
forward of that micro-batch and its activation's transfer; a backward needs
the stage's own forward of it and (but on the last stage) the next stage's
backward and its gradient's transfer. A hop has one link per direction; its
transfers queue on it in the order they are produced (a link sends one
message at a time), each holding it for ``bytes / bandwidth`` and arriving
``latency`` after it leaves.

Schedules (docs/pipelines.md):

* ``gpipe``: every forward (micro-batches 0..M-1), then every backward in
  the same order ("GPipe: Efficient Training of Giant Neural Networks using
  Pipeline Parallelism", arXiv 1811.06965).
* ``1f1b``: stage s runs ``min(S-1-s, M)`` warm-up forwards, then one
  forward and one backward in turn, then the backwards left (the schedule
  of "Memory-Efficient Pipeline-Parallel DNN Training", arXiv 2006.09503,
  PipeDream-Flush).
"""

import math
from typing import NamedTuple

from lowbw import _validate

SCHEDULES = ("1f1b", "gpipe")


class Pipeline(NamedTuple):
  """What the clock needs of a worker that is a pipeline.

  Attributes:
    stage_flops: each stage's share of the model's FLOPs (any unit: only
      their ratios are used), forward and backward alike.
    micro_batches: M, micro-batches per step.
    schedule: ``"1f1b"`` or ``"gpipe"``.
    forward_bytes, backward_bytes: per hop (S - 1), the bytes one
      micro-batch's activation (forward) and its gradient (backward) send.
    bandwidth: per hop, bit/s (``math.inf``: free); under a trace, its
      values at time 0.
    latency: per hop, one-way seconds.
    workers: in a mixed fleet, the workers that are this pipeline (the
      others run the whole model on one machine); None: every worker.
    bandwidth_trace: per hop, a ``Trace`` of its bandwidth (one value per
      row) over simulated time; empty: the hops keep ``bandwidth``.
  """

  stage_flops: tuple
  micro_batches: int
  schedule: str
  forward_bytes: tuple
  backward_bytes: tuple
  bandwidth: tuple
  latency: tuple
  workers: tuple | None = None
  bandwidth_trace: tuple = ()

  @property
  def stages(self) -> int:
    return len(self.stage_flops)

  def at(self, time_s: float) -> "Pipeline":
    """The pipeline with each hop's bandwidth in force at ``time_s`` (its
    trace's row then; itself without traces)."""
    if not self.bandwidth_trace:
      return self
    return self._replace(bandwidth=tuple(
        float(t.at(time_s)[0]) for t in self.bandwidth_trace))

  def bytes_per_step(self) -> int:
    """Boundary bytes one worker's pipeline sends per step: both
    directions, every hop, every micro-batch."""
    return self.micro_batches * (sum(self.forward_bytes) +
                                 sum(self.backward_bytes))


class Timeline(NamedTuple):
  """One step of a pipeline, played out.

  Attributes:
    makespan_s: from the first forward's start to the last op's end.
    bubble: the share of the makespan the busiest stage is idle
      (``1 - busy / makespan``); 0 for one stage without hops.
    busy_s: per stage, its seconds of compute.
    ops: per stage, ``(kind, micro_batch, start_s, end_s)`` in the order
      it ran them (kind ``"F"`` or ``"B"``).
  """

  makespan_s: float
  bubble: float
  busy_s: tuple
  ops: tuple


def order(schedule: str, stages: int, micro_batches: int,
          stage: int) -> list[tuple[str, int]]:
  """Stage ``stage``'s ops in ``schedule``: ``[("F", m) | ("B", m), ...]``.

  Example:
    >>> order("1f1b", 2, 3, 0)
    [('F', 0), ('F', 1), ('B', 0), ('F', 2), ('B', 1), ('B', 2)]
  """
  m = micro_batches
  if schedule == "gpipe":
    return [("F", i) for i in range(m)] + [("B", i) for i in range(m)]
  warm = min(stages - 1 - stage, m)
  ops = [("F", i) for i in range(warm)]
  for i in range(m - warm):
    ops += [("F", warm + i), ("B", i)]
  return ops + [("B", i) for i in range(m - warm, m)]


def _check(forward_s, backward_s, hop_forward_s, hop_backward_s,
           micro_batches, schedule) -> None:
  stages = len(forward_s)
  if stages < 1 or len(backward_s) != stages:
    raise _validate.fail("backward_s", backward_s, f"expected one value per "
                         f"stage, {stages}, and at least one stage")
  for name, hops in (("hop_forward_s", hop_forward_s),
                     ("hop_backward_s", hop_backward_s)):
    if len(hops) != stages - 1:
      raise _validate.fail(name, hops, f"expected one value per hop, "
                           f"{stages - 1}")
  for name, values in (("forward_s", forward_s), ("backward_s", backward_s),
                       ("hop_forward_s", hop_forward_s),
                       ("hop_backward_s", hop_backward_s)):
    for v in values:
      if not all(math.isfinite(x) and x >= 0 for x in _pair(v)):
        raise _validate.fail(name, values, "expected finite seconds >= 0")
  _validate.positive_int("micro_batches", micro_batches)
  if schedule not in SCHEDULES:
    raise _validate.fail("pipeline_schedule", schedule,
                         "expected one of " + ", ".join(SCHEDULES))


def _pair(v) -> tuple[float, float]:
  """A hop time as ``(seconds on the link, latency)``; a number is all
  link time."""
  return tuple(float(x) for x in v) if isinstance(v, tuple) else (float(v),
                                                                  0.0)


def timeline(forward_s, backward_s, hop_forward_s, hop_backward_s,
             micro_batches: int, schedule: str = "1f1b") -> Timeline:
  """One pipeline step, op by op (the module docstring says the rules).

  Args:
    forward_s, backward_s: per stage, seconds of one micro-batch's forward
      and backward.
    hop_forward_s, hop_backward_s: per hop (S - 1), one micro-batch's
      transfer forward (activation) and backward (gradient): seconds, all
      of them holding the link, or ``(link_s, latency_s)``, the link held
      for ``link_s`` and the message arriving ``latency_s`` later.
    micro_batches: M.
    schedule: ``"1f1b"`` or ``"gpipe"``.

  Example:
    >>> timeline([1, 1], [2, 2], [0], [0], 2, "gpipe").makespan_s
    9.0
  """
  _check(forward_s, backward_s, hop_forward_s, hop_backward_s,
         micro_batches, schedule)
  stages, m = len(forward_s), micro_batches
  queues = [order(schedule, stages, m, s) for s in range(stages)]
  end = {}  # (kind, stage, micro-batch) -> end of the op
  arrive = {}  # (kind, stage, micro-batch) -> its input's arrival there
  link_free = {}  # (kind, hop) -> when the link is free
  free = [0.0] * stages
  ops = [[] for _ in range(stages)]
  pending = sum(len(q) for q in queues)
  while pending:
    moved = False
    for s in range(stages):
      while queues[s]:
        ready = _ready(queues[s][0], s, stages, end, arrive)
        if ready is None:
          break
        kind, i = queues[s].pop(0)
        start = max(free[s], ready)
        took = (forward_s if kind == "F" else backward_s)[s]
        free[s] = end[kind, s, i] = start + float(took)
        ops[s].append((kind, i, start, free[s]))
        _send(kind, s, i, stages, free[s], hop_forward_s, hop_backward_s,
              link_free, arrive)
        pending -= 1
        moved = True
    if not moved:  # cannot happen with the schedules above
      raise RuntimeError("pipeline timeline deadlocked")
  busy = tuple(float(m * (forward_s[s] + backward_s[s]))
               for s in range(stages))
  makespan = max(free)
  bubble = 0.0 if makespan <= 0 else 1.0 - max(busy) / makespan
  return Timeline(makespan, bubble, busy,
                  tuple(tuple(o) for o in ops))


def _ready(op, s: int, stages: int, end: dict, arrive: dict):
  """When op ``(kind, i)`` on stage ``s`` may start (its inputs there), or
  None while one of them is not computed yet."""
  kind, i = op
  if kind == "F":
    if s == 0:
      return 0.0
    return arrive.get(("F", s, i))
  if ("F", s, i) not in end:
    return None
  if s == stages - 1:
    return end["F", s, i]
  at = arrive.get(("B", s, i))
  return None if at is None else max(at, end["F", s, i])


def _send(kind, s, i, stages, done, hop_forward_s, hop_backward_s,
          link_free, arrive) -> None:
  """Queues what op ``(kind, i)`` of stage ``s`` sends on its hop."""
  if kind == "F" and s < stages - 1:
    hop, to = s, s + 1
    link_s, latency = _pair(hop_forward_s[hop])
  elif kind == "B" and s > 0:
    hop, to = s - 1, s - 1
    link_s, latency = _pair(hop_backward_s[hop])
  else:
    return
  leave = max(done, link_free.get((kind, hop), 0.0))
  link_free[kind, hop] = leave + link_s
  arrive[kind, to, i] = leave + link_s + latency


def hop_seconds(nbytes: float, bandwidth: float, latency: float
                ) -> tuple[float, float]:
  """One message's ``(link_s, latency_s)`` on a hop: ``8 * nbytes /
  bandwidth`` (bit/s; infinite: 0) and the latency."""
  link_s = 0.0 if math.isinf(bandwidth) else 8.0 * nbytes / bandwidth
  return (link_s, float(latency))


def step_timeline(pipeline: Pipeline, compute_s: float) -> Timeline:
  """The timeline of a worker's step when its whole model's forward and
  backward take ``compute_s`` on its hardware: each stage gets its FLOPs'
  share of it, split over the micro-batches, a third forward and two
  thirds backward (the clock's 2 FLOPs per parameter forward and 4
  backward); each hop's times from its bytes, bandwidth and latency."""
  total = float(sum(pipeline.stage_flops))
  m = pipeline.micro_batches
  share = [compute_s * f / total / m for f in pipeline.stage_flops]
  hops = range(pipeline.stages - 1)
  return timeline(
      [x / 3.0 for x in share], [2.0 * x / 3.0 for x in share],
      [hop_seconds(pipeline.forward_bytes[h], pipeline.bandwidth[h],
                   pipeline.latency[h]) for h in hops],
      [hop_seconds(pipeline.backward_bytes[h], pipeline.bandwidth[h],
                   pipeline.latency[h]) for h in hops],
      m, pipeline.schedule)
