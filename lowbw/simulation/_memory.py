"""How much memory a run needs, and how many workers compute a step at once.

Before anything is compiled, ``plan`` estimates a run's bytes from shapes
alone:

- its state: every leaf of the abstract simulator state (exact);
- the data it holds: the training arrays and the evaluation batches;
- per worker that computes a step at the same time ("in flight"): the
  activations its backward pass keeps (the residuals of ``jax.vjp`` of the
  model's loss, found by tracing, not compiling), its gradients and, in
  groups, the group's own copy of its parameters and optimizer state.

``worker_batch="auto"`` (the default) computes every worker at once when
their in-flight bytes fit both ``activation_cap`` (128 MiB on a CPU, a
quarter of the budget on an accelerator) and what the budget leaves after
the state and data; otherwise the largest group of workers (a divisor of the
workers per device) that does. Activation memory is then bounded and
each added worker costs its state. The budget (``memory_budget``) defaults to
``DEFAULT_FRACTION`` of the memory free when the run is built (the device's,
or the host's on a CPU); a run whose estimate exceeds it even one worker at a
time is refused, before compiling, with the estimate and the limit.

The choice depends on free memory only when memory is short (the cap binds
first otherwise), so the same configuration computes in the same groups, and
gives the same bits, on an idle and on a busy machine alike. The chosen
``worker_batch`` is in the run's config.json, to pin it.
"""

import math
from typing import NamedTuple

import jax
import numpy as np
from jax.extend import core as jex_core

from lowbw import _validate
from lowbw import network as net_lib
from lowbw.config._resources import CPU_ACTIVATION_CAP, Budget
from lowbw.simulation import _backward

# On an accelerator, where large batches are what keeps it busy (not
# measured here: no GPU was lent), groups only once the workers in flight
# would take this share of the budget.
ACCELERATOR_ACTIVATION_SHARE = 0.25


class Plan(NamedTuple):
  """A run's memory estimate (bytes, per device on accelerators, per process
  on a CPU) and the ``worker_batch`` it chose (None: all workers at once).
  In flight per worker: ``in_flight_all`` when all compute at once,
  ``in_flight_group`` in groups."""
  worker_batch: int | None
  state_bytes: float
  data_bytes: float
  in_flight_all: float
  in_flight_group: float
  estimate_bytes: float
  budget: Budget | None
  buffer_bytes: float = 0.0   # the per-step outputs (``step_buffer_bytes``)
  lane_bytes: float = 0.0     # the counterfactual lanes' (``with_lanes``)

  def describe(self) -> dict:
    return {"estimate_bytes": self.estimate_bytes,
            "lane_bytes": self.lane_bytes,
            "state_bytes": self.state_bytes, "data_bytes": self.data_bytes,
            "step_buffer_bytes": self.buffer_bytes,
            "in_flight_bytes_per_worker": {"all_at_once": self.in_flight_all,
                                           "in_groups": self.in_flight_group},
            "budget_bytes": self.budget and self.budget.bytes,
            "budget_source": self.budget and self.budget.source}


def nbytes(tree) -> float:
  return float(sum(math.prod(x.shape) * np.dtype(x.dtype).itemsize
                   for x in jax.tree.leaves(tree)))


def residual_bytes(loss, params, batch, key) -> float:
  """Bytes of what the backward pass of ``loss(params, batch, key)`` keeps
  from the forward pass: the outputs of the traced ``jax.vjp`` that are not
  its inputs (the parameters it holds on to are not new memory)."""
  def pullback(p, b, k):
    return jax.vjp(lambda q: loss(q, b, k)[0], p)[1]

  jaxpr = jax.make_jaxpr(pullback)(params, batch, key).jaxpr
  given = {id(v) for v in list(jaxpr.invars) + list(jaxpr.constvars)}
  seen, total = set(), 0.0
  for v in jaxpr.outvars:
    if (isinstance(v, jex_core.Literal) or id(v) in given or
        id(v) in seen):
      continue
    seen.add(id(v))
    total += math.prod(v.aval.shape) * np.dtype(v.aval.dtype).itemsize
  return total


def _per_worker(tree, num_workers: int) -> tuple[float, float]:
  """(bytes of the leaves with a leading worker axis, bytes of the rest)."""
  mine = shared = 0.0
  for x in jax.tree.leaves(tree):
    size = math.prod(x.shape) * np.dtype(x.dtype).itemsize
    if x.shape[:1] == (num_workers,):
      mine += size
    else:
      shared += size
  return mine, shared


def _wide(tree, drop_leading: bool = False) -> float:
  """Bytes of ``tree`` (of one worker's slice of it with ``drop_leading``)
  with floating leaves in float32, as they are computed."""
  total = 0.0
  for x in jax.tree.leaves(tree):
    shape = x.shape[1:] if drop_leading else x.shape
    wide = jax.numpy.issubdtype(x.dtype, np.floating)
    total += math.prod(shape) * (4 if wide else np.dtype(x.dtype).itemsize)
  return total


def per_step_bytes(c, metric_names, local_report) -> tuple[float, float]:
  """(bytes one inner step's outputs keep until the chunk ends, bytes they
  take within the round before being reduced over workers): the loss and
  the model's metrics and the inner learning rate (per local worker
  before the reduction), the first worker with a non-finite loss and the
  first with a non-finite gradient (a flag per local worker before the
  reduction), the strategy's local report and, with a network, the step's
  clock (its time, participants, members, the worker-steps it merged and
  two masks over the workers)."""
  values = 2 + len(metric_names)
  clock = 0.0 if c.network is None else 16.0 + 2.0 * c.workers
  local_w = c.workers // c.devices
  return (4.0 * (values + 2) + nbytes(local_report) + clock,
          4.0 * local_w * (values + 1))


def step_buffer_bytes(c, step_bytes: tuple[float, float]) -> float:
  """Bytes that grow with H and the rounds of a chunk: the chunk's buffer
  of every step's outputs (rounds_per_chunk x H of them), the host's copy
  of it and its float64 columns, and within a round its H steps' outputs
  before they are reduced over workers."""
  kept, unreduced = step_bytes
  chunk_steps = c.rounds_per_chunk * c.period + c.tail_steps
  return 3.0 * chunk_steps * kept + c.period * (unreduced + kept)


def trace_bytes(c, num_channels: int) -> float:
  """The device arrays of a fleet trace (``network.Segments``): per segment
  its start, every worker's step time and, per channel, its seconds and
  every worker's own exchange seconds (float32)."""
  net = c.network
  hops = () if c.pipeline is None else c.pipeline.bandwidth_trace
  if net is None or (net.speed_trace is None and net.bandwidth_trace is None
                     and not hops):
    return 0.0
  segments = len({0.0}.union(*(t.times for t in (net.speed_trace,
                                                  net.bandwidth_trace, *hops)
                                if t is not None)))
  w = c.workers
  return 4.0 * segments * (1 + w + num_channels * (1 + w))


def plan(c, abstract_state, abstract_params, example, can_group: bool,
         data_bytes: float, step_bytes: tuple[float, float] = (0.0, 0.0),
         num_channels: int = 0) -> Plan:
  """The run's estimate and ``worker_batch`` (see the module docstring).

  ``c``: the ``RunConfig`` (``worker_batch`` "auto", None or a group
  size; ``memory_budget`` a ``Budget`` or None). ``can_group``: the
  strategy's inner steps do not communicate, so workers may compute in
  groups.

  In flight per worker, all at once: the residuals and the gradients (the
  update is fused in place). In groups: also the group's own copy of its
  parameters and optimizer state, stepped through the round and written
  back at its end (``_grouping.steps_in_groups``).

  ``step_bytes``: ``per_step_bytes``, for the buffers that grow with H
  and the chunk's rounds (``step_buffer_bytes``), fixed like the state, as
  are a fleet trace's arrays (``trace_bytes``, for ``num_channels``
  priced channels).

  Raises:
    ValueError: naming memory_budget, when the estimate exceeds it.
  """
  local_w = c.workers // c.devices
  stored = abstract_state.strategy
  workers = 1 if c.one_replica else c.workers
  mine, shared = _per_worker(stored, workers)
  # In micro-batches only one micro-batch's residuals exist at a time, next
  # to the gradients' running sum (``_backward``).
  backward = _backward.of(c)
  micro_example = jax.tree.map(lambda x: x[:x.shape[0] // backward.micro],
                               example)
  residuals = residual_bytes(backward.loss(c.model), abstract_params,
                             micro_example, jax.random.PRNGKey(0))
  grads = _wide(abstract_params) * (2 if backward.micro > 1 else 1)
  update = _wide((stored.params_W, stored.inner_W), drop_leading=True)
  # The paired DDP lane (``_shadow``): its replica's state, and while its
  # steps run (before the workers'), every local worker's examples through
  # one set of gradients.
  lane = 0.0 if abstract_state.shadow is None else _wide(abstract_state.shadow)
  lane_flight = (0.0 if abstract_state.shadow is None
                 else local_w * residuals + grads)
  state = mine / workers * (1 if c.one_replica else local_w) + shared + lane
  buffers = step_buffer_bytes(c, step_bytes) + trace_bytes(c, num_channels)
  # One replica computes every worker's examples through one set of
  # gradients; otherwise each worker in flight has its own.
  fixed = state + buffers + data_bytes + (grads if c.one_replica else 0.0)
  flight_all = residuals + (0.0 if c.one_replica else grads)
  flight_group = flight_all + update
  here = (min(c.devices, jax.local_device_count())
          if jax.default_backend() == "cpu" else 1)

  def flight(size: int) -> float:
    return flight_all if size == local_w else flight_group

  def estimate(size: int) -> float:
    return here * (fixed + max(size * flight(size), lane_flight))

  size = _group_size(c, local_w, can_group, estimate)
  chosen = estimate(size)
  if c.memory_budget is not None and chosen > c.memory_budget.bytes:
    raise _too_big(c, chosen, here * state, here * buffers, data_bytes,
                   size, flight(size), can_group)
  return Plan(None if size == local_w else size, here * state,
              here * data_bytes, flight_all, flight_group, chosen,
              c.memory_budget, here * buffers)


def with_lanes(run: Plan, lanes: list[Plan], shared=None) -> Plan:
  """The run's plan with its counterfactual lanes' (``_lanes``): each lane
  keeps its own state and per-step outputs for the whole run; its steps run
  after the run's in the same program, so only one of them has its
  activations in flight at a time. A lane whose data are the run's
  (``shared``, one flag per lane; all by default: ``_lanes.shares_data``)
  holds no copy of them; one that is not counts its own. A lane costs
  about one more run's state; refused, like the run, past the budget."""
  if not lanes:
    return run
  shared = [True] * len(lanes) if shared is None else shared
  extra = sum(p.state_bytes + p.buffer_bytes + (0.0 if share else
                                                p.data_bytes)
              for p, share in zip(lanes, shared))
  flight = max(p.estimate_bytes - p.state_bytes - p.buffer_bytes
               - p.data_bytes for p in [run, *lanes])
  estimate = (run.state_bytes + run.buffer_bytes + run.data_bytes + extra
              + flight)
  plan = run._replace(lane_bytes=extra, estimate_bytes=estimate)
  if run.budget is not None and estimate > run.budget.bytes:
    fmt = net_lib.format_bytes
    text = (f"the run and its {len(lanes)} lane(s) need about "
            f"{fmt(estimate)} ({fmt(extra)} for the lanes' state), more "
            f"than the budget ({run.budget.source}); give fewer lanes")
    if run.budget.given:
      raise _validate.fail("memory_budget", fmt(run.budget.bytes), text)
    raise ValueError("too big for memory: " + text)
  return plan


def _group_size(c, local_w: int, can_group: bool, estimate) -> int:
  """All workers at once while their in-flight bytes fit the cap and the
  budget, else the largest group that does (1 at least)."""
  if c.worker_batch != "auto":
    return c.worker_batch or local_w
  if not can_group:
    return local_w
  limit = estimate(0) + activation_cap(c.memory_budget)
  if c.memory_budget is not None:
    limit = min(limit, c.memory_budget.bytes)
  fits = [s for s in _divisors(local_w) if estimate(s) <= limit]
  return fits[0] if fits else 1


def _divisors(n: int) -> list[int]:
  """n's divisors, largest first (trial division up to sqrt(n))."""
  small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
  return sorted(set(small) | {n // d for d in small}, reverse=True)


def activation_cap(budget: Budget | None) -> float:
  """In-flight bytes beyond which ``worker_batch="auto"`` groups workers."""
  if jax.default_backend() == "cpu":
    return CPU_ACTIVATION_CAP
  if budget is None:
    return float("inf")
  return ACCELERATOR_ACTIVATION_SHARE * budget.bytes


def _too_big(c, chosen, state, buffers, data, size, flight,
             can_group) -> ValueError:
  """The refusal: the estimate, its parts, the budget, and what to lower,
  starting with the largest part. Names ``memory_budget`` only when it was
  given (the default is a share of free memory)."""
  fmt = net_lib.format_bytes
  parts = {
      "activations and gradients": (size * flight, (
          "batch_size or the model's size (a GPT's seq_len, d_model, layers)"
          + (", or compute fewer workers at a time (worker_batch)"
             if can_group and size > 1 else ""))),
      "state": (state, "workers or the model's size, or store the "
                "workers in worker_dtype='bfloat16'"),
      "data": (data, "the dataset's size"),
      "per-step outputs": (buffers, f"H ({c.period}) or rounds_per_chunk "
                           f"({c.rounds_per_chunk}): every step of a chunk "
                           "keeps its loss, metrics and clock until the "
                           "chunk ends" + (", or the fleet trace's rows"
                                           if trace_bytes(c, 1) else ""))}
  largest = max(parts, key=lambda k: parts[k][0])
  budget = c.memory_budget
  text = (f"the run needs about {fmt(chosen)} ({fmt(state)} of state, "
          f"{fmt(buffers)} of per-step outputs, "
          f"{fmt(data)} of data, and {size} worker(s) computing at once with "
          f"{fmt(flight)} of activations, gradients and updates each), more "
          f"than the budget ({budget.source}); the largest part is "
          f"{largest}: lower {parts[largest][1]}"
          + ("" if budget.given else ", or give memory_budget"))
  if budget.given:
    return _validate.fail("memory_budget", fmt(budget.bytes), text)
  return ValueError("too big for memory: " + text)
