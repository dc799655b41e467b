"""The compiled programs of a run.

A *round* is ``period`` inner steps on every worker (a ``lax.scan``; the
workers are a vmapped axis inside each step) followed by the strategy's sync. A
*chunk* is a ``fori_loop`` over a traced number of rounds, so every chunk of a
run, whatever its length, runs the same compiled program. Per-round outputs
(losses per step, communication counts, divergence, lr) are written into a
fixed-size buffer and read by the host after the next chunk is dispatched.

Steps left over when ``steps`` is not a multiple of the period run in a *tail*
program: local steps only, no sync.

The round composes pieces with one job each: ``_grouping`` (the workers'
gradients, all at once or ``worker_batch`` at a time), ``_precision``
(low-precision worker state) and ``_timing`` (the simulated clock and, under
a fault or straggler model, the participation masks; its numbers,
``NetParams``, are an argument of the compiled programs, so changing them
does not recompile).

A strategy's report is split here: entries named after its channels are
event counts, the others are the strategy's own metrics (floats), logged as
``strategy/<name>``.
"""

import dataclasses
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from lowbw import network as net_lib
from lowbw._types import Array, PRNGKey, PyTree
from lowbw.simulation import _shadow, _timing
from lowbw.simulation._backward import Backward
from lowbw.simulation._grouping import local_compute, steps_in_groups
from lowbw.simulation._leavers import redistributed
from lowbw.simulation._ordering import after
from lowbw.simulation._precision import Precision
from lowbw.strategies import Strategy, StrategyState
from lowbw.transforms import (all_workers, local_workers, participating,
                              sharded_workers, worker_correlation,
                              worker_divergence, worker_mean, worker_offset)


class SimState(NamedTuple):
  """Everything a run carries from chunk to chunk (donated between chunks).

  Attributes:
    strategy: the strategy's state (worker params, optimizer states, counter).
    data_key: key of the data stream (workers fold in their index).
    loss_key: key passed to the model's loss (split per worker and step).
    active: engine-owned, under a fault or straggler model only: bool (W,),
      the workers the last communication counted (the global parameters of
      a strategy without a server model are their mean); None otherwise.
    fleet: engine-owned, for an asynchronous strategy only: each worker's
      place in the schedule (``_pace.Fleet``); None otherwise.
    time_s: engine-owned, under a network with a trace only: float32 (2,),
      the simulated time the next round starts and its last sync ends
      (``network.round_end``), to look up the trace's values in force; the
      reported clock is the host's, in float64.
    shadow: with a paired DDP lane only (``_shadow``): its replica's
      ``ShadowState``, replicated across devices; None otherwise.
  """

  strategy: StrategyState
  data_key: PRNGKey
  loss_key: PRNGKey
  active: Array | None = None
  fleet: Any = None
  time_s: Array | None = None
  shadow: Any = None


class StepOut(NamedTuple):
  """Per inner step, reduced over workers."""

  loss: Array              # mean loss over workers
  metrics: dict            # mean of each model metric over workers
  first_bad_worker: Array  # int32: first worker with a non-finite loss, or -1
  counts: dict             # int32 events per channel (per-step communication)
  clock: Any = None        # StepClock with a network
  strategy: dict = {}      # the strategy's own metrics of its local step


class RoundOut(NamedTuple):
  steps: StepOut           # leaves with leading axis ``period``
  sync_counts: dict        # int32 events per channel of the sync
  divergence: Array        # worker divergence at the end of the round, pre-sync
  lr: Array                # the inner learning rate if discoverable, else nan
  clock: Any = None        # RoundClock with a network
  sync_metrics: dict = {}  # the strategy's own metrics of its sync
  correlation: Any = None  # with correlation_every: pre-sync, nan when not due


def _reduced(steps: "StepOut") -> "StepOut":
  """Steps whose ``loss`` and ``metrics`` hold each of this device's
  workers' values (leading axes: steps, workers), reduced over all workers
  for every step at once.

  Over several devices the values of all workers are gathered once per
  round (one collective; a reduction per step, or one per quantity, made
  the devices wait for each other each time) and every device reduces the
  same (W, ...) array, so the logs have the one-device run's summation
  order whatever the number of devices."""
  loss_HW, metrics_HW = steps.loss, steps.metrics
  leaves, tree = jax.tree.flatten(metrics_HW)
  stacked_KHW = jnp.stack([loss_HW] + [x.astype(jnp.float32)
                                       for x in leaves])
  all_WKH = all_workers(jnp.moveaxis(stacked_KHW, -1, 0))
  mean_KH = jnp.mean(all_WKH, axis=0)
  bad_WH = ~jnp.isfinite(all_WKH[:, 0])
  first_bad_H = jnp.where(jnp.any(bad_WH, axis=0), jnp.argmax(bad_WH, axis=0),
                          -1).astype(jnp.int32)
  metrics = jax.tree.unflatten(
      tree, [m.astype(x.dtype) for m, x in zip(mean_KH[1:], leaves)])
  return steps._replace(loss=mean_KH[0].astype(loss_HW.dtype),
                        metrics=metrics, first_bad_worker=first_bad_H)


def _inner_lr(inner_W: PyTree) -> Array:
  # inject_hyperparams keeps the current value in ``hyperparams`` (and, for a
  # schedule, the schedule's own state under another "learning_rate" key).
  try:
    hyper = optax.tree_utils.tree_get(inner_W, "hyperparams")
    lr = hyper.get("learning_rate") if isinstance(hyper, dict) else None
  except Exception:  # several or none: no single learning rate to report
    lr = None
  if lr is None or not hasattr(lr, "shape"):
    return jnp.float32(jnp.nan)
  return worker_mean(jnp.asarray(lr, jnp.float32).reshape(-1))


class Programs(NamedTuple):
  """The run's functions, not yet jitted (the simulator jits them, or vmaps
  them over sweep points first)."""

  chunk: Any          # (sim, sampler, n_rounds, net) -> (sim, RoundOut with leading max_rounds)
  tail: Any           # (sim, sampler, net) -> (sim, StepOut with leading tail_steps) or None
  evaluate: Any       # (sim, eval_batches) -> dict of eval metrics
  global_params: Any  # sim -> the shared model's parameters (float32)


def build(model, strategy: Strategy, num_workers: int, max_rounds: int,
          tail_steps: int, channels, masks: bool = False, mesh=None,
          specs=None, worker_dtype=None,
          worker_batch: int | None = None,
          one_replica: bool = False,
          backward: Backward = Backward(),
          correlation_every: int | None = None,
          eval_local: bool = False, overlap: bool = False,
          redistribute: bool = False, shadow=None) -> Programs:
  """Builds the run's pure functions; nothing is traced here.

  The programs take a ``NetParams`` (or None, no clock) as their last
  argument. ``masks``: the run has a fault or straggler model (``_timing``).

  ``mesh``: a ``jax.sharding.Mesh`` with a ``"workers"`` axis; the chunk and
  tail programs then run under ``shard_map``, each device vmapping over its
  slice of the workers, with ``specs = (sim_specs, sampler_specs)`` saying
  which leaves are per worker (``P("workers")``) and which are replicated.
  Evaluation stays a plain ``jit`` (the partitioner reduces over devices).

  ``worker_dtype`` (e.g. bfloat16): the workers' state is stored in this
  type (``_precision``). ``worker_batch``: compute local steps that do not
  communicate this many workers at a time (``_grouping``); None: all at once.
  ``channels``: the names of the strategy's channels (report entries not
  among them are its metrics). ``one_replica``: the state holds one replica
  of a ``replicated`` strategy's identical workers (``_grouping``).
  ``backward``: micro-batches and autocast of the gradients (``_backward``).
  ``correlation_every``: at the end of the rounds whose last step is a
  multiple of it, the workers' mean pairwise parameter correlation
  (pre-sync). ``eval_local``: evaluation also runs every worker's own
  parameters (``local_*`` results: mean and spread over workers).
  ``overlap``: the clock overlaps syncs with the next round (for the trace
  lookup's time). ``redistribute``: departed workers' data goes to those
  that stay (``_leavers``). ``shadow``: the optimizer of a paired DDP lane
  (``_shadow``) stepped with every round and evaluated next to the run, or
  None.
  """
  precision = Precision(worker_dtype)
  compute = local_compute(model, strategy, precision, one_replica, backward)
  grouped = (None if worker_batch is None else
             steps_in_groups(model, strategy, precision, worker_batch,
                             backward))
  lane = None if shadow is None else _shadow.lane(model, shadow, backward)

  def global_params(sim: SimState):
    with participating(sim.active):
      return strategy.global_params(precision.widen(sim.strategy))

  def local_step(sim: SimState, sampler, timing, carry):
    stored = sim.strategy
    batch_W = sampler.sample(sim.data_key, stored.step, worker_offset())
    if redistribute:
      batch_W = redistributed(sampler, sim.data_key, stored.step, batch_W,
                              timing.net)
    st, loss_W, metrics_W, step_fn = compute(stored, batch_W,
                                             keys_at(sim, stored.step))
    st, report, carry, clock, active = timing.local(st, step_fn, carry,
                                                    sim.active)
    counts, own = _timing.split_report(report, channels)
    # This device's workers' values; reduced over workers once the steps are
    # done (``_reduced``), not at every step.
    out = StepOut(loss_W, metrics_W, None, counts, clock, own)
    sim = sim._replace(strategy=precision.narrow(st), active=active)
    return sim, out, carry

  def keys_at(sim: SimState, step):
    return local_workers(jax.random.split(
        jax.random.fold_in(sim.loss_key, step), num_workers))

  def shadow_steps(sim: SimState, sampler, length: int) -> SimState:
    """The paired DDP lane's steps over the ``length`` steps the workers
    take next, on the batches they draw at those steps."""
    if lane is None:
      return sim

    def sample(step):
      return sampler.sample(sim.data_key, step, worker_offset())

    return sim._replace(shadow=lane(
        sim.shadow, sample, lambda step: keys_at(sim, step),
        sim.strategy.step, length))

  def steps_by_group(sim: SimState, sampler, timing, length: int):
    """``local_steps`` with ``worker_batch``: the clock of steps that do
    not communicate depends on the step counter only, so it runs on its
    own; the workers' steps run a group at a time (``steps_in_groups``)."""
    def tick(c, _):
      st, carry = c
      st, _, carry, clock, _ = timing.local(
          st, lambda s: (s._replace(step=s.step + 1), {}), carry, sim.active)
      return (st, carry), clock

    bare = sim.strategy._replace(params_W=(), inner_W=())
    (_, carry), clocks = jax.lax.scan(
        tick, (bare, timing.begin(sim.strategy.step, sim.fleet)),
        length=length)

    def sample(step, first):
      rows = jax.tree.map(
          lambda x: jax.lax.dynamic_slice_in_dim(x, first, worker_batch),
          (sampler.shard_idx_W, sampler.shard_len_W))
      part = dataclasses.replace(sampler, shard_idx_W=rows[0],
                                 shard_len_W=rows[1])
      return part.sample(sim.data_key, step, worker_offset() + first)

    up = local_workers(carry.up_W) if masks else None
    stored, loss_HW, metrics_HW = grouped(
        sim.strategy, sample, lambda step: keys_at(sim, step), length, up)
    steps = _reduced(StepOut(loss_HW, metrics_HW, None, {}, clocks, {}))
    return sim._replace(strategy=stored), steps, carry

  def local_steps(sim: SimState, sampler, timing, length: int):
    if grouped is not None:
      return steps_by_group(sim, sampler, timing, length)
    carry = timing.begin(sim.strategy.step, sim.fleet)

    def body(c, _):
      sim, carry = c
      sim, out, carry = local_step(sim, sampler, timing, carry)
      return (sim, carry), out

    (sim, carry), steps = jax.lax.scan(body, (sim, carry), length=length)
    return sim, _reduced(steps), carry

  def run_round(sim: SimState, sampler, net) -> tuple[SimState, RoundOut]:
    net = _now(sim, net)
    timing = _timing.timing(net, masks, num_workers, channels, strategy)
    sim = shadow_steps(sim, sampler, strategy.period)
    sim, steps, carry = local_steps(sim, sampler, timing, strategy.period)
    st = precision.widen(sim.strategy)
    divergence = worker_divergence(st.params_W)
    correlation = None
    if correlation_every:
      correlation = jax.lax.cond(
          st.step % correlation_every == 0, worker_correlation,
          lambda p: jnp.float32(jnp.nan), st.params_W)
    lr = _inner_lr(st.inner_W)
    st, report, clock, active, carry = timing.sync(
        st, strategy.sync, carry, steps.clock, sim.active)
    st, active = timing.rejoin(st, carry, active, strategy.global_params)
    # The sync overwrites the buffer the divergence read (``_ordering``).
    st = st._replace(params_W=after(st.params_W, (divergence, correlation)))
    counts, own = _timing.split_report(report, channels)
    sim = sim._replace(strategy=precision.narrow(st), active=active,
                       fleet=None if carry is None else carry.fleet,
                       time_s=_later(sim.time_s, clock, overlap))
    return sim, RoundOut(steps, counts, divergence, lr, clock, own,
                         correlation)

  # Traced once: the shapes below and the loop's body share the trace.
  round_traced = jax.jit(run_round)

  def chunk(sim: SimState, sampler, n_rounds: Array, net=None):
    out_shape = jax.eval_shape(round_traced, sim, sampler, net)[1]
    buf = jax.tree.map(lambda s: jnp.zeros((max_rounds,) + s.shape, s.dtype),
                       out_shape)

    def body(r, carry):
      sim, buf = carry
      sim, out = round_traced(sim, sampler, net)
      buf = jax.tree.map(lambda b, o: b.at[r].set(o), buf, out)
      return sim, buf

    return jax.lax.fori_loop(0, n_rounds, body, (sim, buf))

  def tail(sim: SimState, sampler, net=None):
    net = _now(sim, net)
    timing = _timing.timing(net, masks, num_workers, channels, strategy)
    sim = shadow_steps(sim, sampler, tail_steps)
    sim, steps, carry = local_steps(sim, sampler, timing, tail_steps)
    st, active = timing.rejoin(precision.widen(sim.strategy), carry,
                               sim.active, strategy.global_params)
    return sim._replace(strategy=precision.narrow(st), active=active), steps

  def evaluate(sim: SimState, eval_batches):
    params = global_params(sim)
    key = jax.random.fold_in(sim.loss_key, 0xE7A1)  # not a step index

    def one(batch):
      loss, metrics = model.loss(params, batch, key)
      return loss, metrics

    losses, metrics = jax.lax.map(one, eval_batches)
    out = {"loss": jnp.mean(losses), **jax.tree.map(jnp.mean, metrics)}
    if lane is not None:
      shadow_losses, _ = jax.lax.map(
          lambda batch: model.loss(sim.shadow.params, batch, key),
          eval_batches)
      out["shadow_loss"] = jnp.mean(shadow_losses)
    if eval_local:
      out.update(evaluate_workers(sim, eval_batches, key))
    return out

  def evaluate_workers(sim: SimState, eval_batches, key):
    """Every worker's own parameters on the evaluation set, in one vmap:
    the mean of each result over workers and the loss's spread."""
    params_W = precision.widen(sim.strategy).params_W

    def one(batch):
      return jax.vmap(model.loss, in_axes=(0, None, None))(params_W, batch,
                                                           key)

    losses_BW, metrics_BW = jax.lax.map(one, eval_batches)
    loss_W = jnp.mean(losses_BW, axis=0)
    return {"local_loss": jnp.mean(loss_W), "local_loss_std": jnp.std(loss_W),
            **{"local_" + m: jnp.mean(v) for m, v in metrics_BW.items()}}

  if mesh is not None:
    chunk, tail = _shard(chunk, tail, mesh, specs, num_workers)
  return Programs(chunk=chunk, tail=tail if tail_steps else None,
                  evaluate=evaluate, global_params=global_params)


def _now(sim: SimState, net):
  """``net`` with a trace's values in force when the round starts."""
  return net if sim.time_s is None else net_lib.at_time(net, sim.time_s[0])


def _later(time_s, clock, overlap: bool):
  """The trace lookup's time after a round (``network.round_end``)."""
  if time_s is None:
    return None
  start, end = net_lib.round_end(time_s[0] + clock.compute_s, time_s[1],
                                 clock.sync_s, overlap)
  return jnp.stack([start, end])


MESH_AXIS = "workers"


def map_workers(fn, mesh, in_specs, out_specs, num_workers: int):
  """``fn`` under ``shard_map`` over ``mesh``'s workers axis, with the
  reductions of ``lowbw.transforms`` told that each device holds a slice of
  the ``num_workers`` workers."""
  shards = mesh.shape[MESH_AXIS]

  def body(*args):
    with sharded_workers(MESH_AXIS, shards, num_workers):
      return fn(*args)
  return jax.shard_map(body, mesh=mesh, in_specs=in_specs,
                       out_specs=out_specs, check_vma=False)


def _shard(chunk, tail, mesh, specs, num_workers: int):
  """``chunk`` and ``tail`` under ``shard_map`` over ``mesh``'s workers axis.

  Inside, every worker-stacked leaf holds this device's workers and the
  reductions of ``lowbw.transforms`` add a ``psum`` across devices; every
  per-round output is such a reduction, hence replicated.
  """
  sim_specs, sampler_specs = specs
  rep = jax.sharding.PartitionSpec()

  def mapped(fn, in_specs, out_specs):
    return map_workers(fn, mesh, in_specs, out_specs, num_workers)

  chunk_s = mapped(chunk, (sim_specs, sampler_specs, rep, rep),
                   (sim_specs, rep))
  tail_s = mapped(tail, (sim_specs, sampler_specs, rep), (sim_specs, rep))

  def sharded_chunk(sim, sampler, n_rounds, net=None):
    return chunk_s(sim, sampler, n_rounds, net)

  def sharded_tail(sim, sampler, net=None):
    return tail_s(sim, sampler, net)

  return sharded_chunk, sharded_tail
