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
does not recompile). ``pieces`` chooses them once from the ``RunConfig``
into an ``Engine`` of module-level functions; the programs below only call
its pieces, so a feature adds a piece rather than a branch and a parameter.

A strategy's report is split here: entries named after its channels are
event counts, the others are the strategy's own metrics (floats), logged as
``strategy/<name>``.
"""

import contextlib
import dataclasses
import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from lowbw import network as net_lib
from lowbw._types import Array, PRNGKey, PyTree
from lowbw.simulation import _shadow, _timing
from lowbw.simulation import _backward
from lowbw.simulation._grouping import (inner_lr_W, local_compute,
                                       steps_in_groups, when_shared)
from lowbw.simulation._leavers import redistributed
from lowbw.simulation._ordering import after
from lowbw.simulation._precision import Precision
from lowbw.simulation._track import clock_overlap
from lowbw.strategies import Strategy, StrategyState
from lowbw.transforms import (all_workers, local_workers, participating,
                              sharded_workers, worker_correlation,
                              worker_divergence, worker_mean)
from lowbw.transforms._reductions import worker_offset
from lowbw.transforms._quantize import leveling
from lowbw.transforms._topk import keeping


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
    period: with a traced H only (``RunConfig.traced_period``): int32, the
      run's H, how many of a round's step slots run; None otherwise.
    keep: with a traced top-k density only (``RunConfig.traced_density``):
      ``{str(n): int32}``, how many entries of an n-entry tensor or chunk
      the run's top-k keeps (``_topk.keeping``); None otherwise.
    levels: with a traced quantizer bit width only
      (``RunConfig.traced_bits``): ``{"count": float32, "inverse":
      float32}``, the run's linear quantizer's 2**bits - 1 steps and their
      reciprocal (``_quantize.leveling``); None otherwise.
  """

  strategy: StrategyState
  data_key: PRNGKey
  loss_key: PRNGKey
  active: Array | None = None
  fleet: Any = None
  time_s: Array | None = None
  shadow: Any = None
  period: Array | None = None
  keep: Any = None
  levels: Any = None


class StepOut(NamedTuple):
  """Per inner step, reduced over workers."""

  loss: Array              # mean loss over workers
  metrics: dict            # mean of each model metric over workers
  first_bad_worker: Array  # int32: first worker with a non-finite loss, or -1
  counts: dict             # int32 events per channel (per-step communication)
  clock: Any = None        # StepClock with a network
  strategy: dict = {}      # the strategy's own metrics of its local step
  lr: Any = None           # the inner learning rate after the step (mean
                           # over workers; nan if not discoverable)
  first_bad_grad: Any = None  # int32: first worker whose own gradient (before
                              # any reduction) was non-finite, or -1


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
  # The learning rate and the gradients' flags ride with the losses: one
  # gather for all of them (the flags' row is last, outside every mean).
  lr = [] if steps.lr is None else [steps.lr.astype(jnp.float32)]
  stacked_KHW = jnp.stack([loss_HW] + lr + [x.astype(jnp.float32)
                                            for x in leaves]
                          + [steps.first_bad_grad.astype(jnp.float32)])
  all_WKH = all_workers(jnp.moveaxis(stacked_KHW, -1, 0))
  mean_KH = jnp.mean(all_WKH[:, :-1], axis=0)
  metrics = jax.tree.unflatten(
      tree, [m.astype(x.dtype) for m, x in zip(mean_KH[1 + len(lr):],
                                                leaves)])
  return steps._replace(loss=mean_KH[0].astype(loss_HW.dtype),
                        metrics=metrics,
                        first_bad_worker=_first(~jnp.isfinite(all_WKH[:, 0])),
                        lr=mean_KH[1] if lr else None,
                        first_bad_grad=_first(all_WKH[:, -1] > 0))


def _first(bad_WH: Array) -> Array:
  """(H,) int32: the first worker flagged at each step, or -1."""
  return jnp.where(jnp.any(bad_WH, axis=0), jnp.argmax(bad_WH, axis=0),
                   -1).astype(jnp.int32)


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


class Parts(NamedTuple):
  """What the simulator worked out that the programs need besides the
  run's ``RunConfig``.

  Attributes:
    channels: the names of the strategy's channels (report entries not
      among them are its metrics).
    mesh: a ``jax.sharding.Mesh`` with a ``"workers"`` axis, or None; the
      chunk and tail programs then run under ``shard_map``, each device
      vmapping over its slice of the workers. Evaluation stays a plain
      ``jit`` (the partitioner reduces over devices).
    specs: with a mesh, ``(sim_specs, sampler_specs)``: which leaves are
      per worker (``P("workers")``) and which are replicated.
  """

  channels: tuple
  mesh: Any = None
  specs: Any = None


class Engine(NamedTuple):
  """The pieces a run's programs are composed of, chosen once by
  ``pieces``. Each is a module-level function, bound with
  ``functools.partial`` to what it needs; a piece that needs the others
  takes the engine first. A feature adds a piece (or a choice of one in
  ``pieces``), not a flag threaded through the programs."""

  model: Any
  strategy: Strategy
  num_workers: int
  channels: tuple
  precision: Precision    # how the workers' state is stored (``_precision``)
  timing: Any             # net -> the round's clock and masks (``_timing``)
  compute: Any            # every worker's step (``_grouping.local_compute``)
  draw: Any               # (sim, sampler, step, timing) -> the workers' batches
  steps: Any              # (engine, sim, sampler, timing, length) -> (sim, StepOut, carry)
  lanes: tuple            # each (engine, sim, sampler, length) -> sim, before the steps
  probe: Any              # widened state -> pre-sync correlation, or None
  later: Any              # (time_s, clock) -> the trace lookup's time after a round
  evaluations: tuple      # each (engine, sim, eval_batches, key) -> dict of results
  slot: Any = None        # (sim, j) -> whether step slot j runs (traced H), or None


def build(config, parts: Parts) -> Programs:
  """Builds the run's pure functions from ``config`` (a ``RunConfig``,
  ``worker_batch`` chosen) and ``parts``; nothing is traced here.

  The programs take a ``NetParams`` (or None, no clock) as their last
  argument.
  """
  e = pieces(config, parts)
  # Traced once: the chunk's output shapes and its loop's body share it.
  round_traced = jax.jit(functools.partial(run_round, e))
  chunk = functools.partial(run_chunk, round_traced, config.rounds_per_chunk)
  tail = functools.partial(run_tail, e, config.tail_slots)
  if parts.mesh is not None:
    chunk, tail = _shard(chunk, tail, parts.mesh, parts.specs,
                         config.workers)
  return Programs(chunk=chunk, tail=tail if config.tail_slots else None,
                  evaluate=functools.partial(evaluate, e),
                  global_params=functools.partial(global_params, e))


def pieces(config, parts: Parts) -> Engine:
  """The pieces ``config`` chooses: ``worker_batch`` groups the steps
  (``_grouping``), ``shadow`` adds a lane and its evaluation
  (``_shadow``), ``eval_local`` an evaluation of every worker,
  ``correlation_every`` a pre-sync probe, a fault model that redistributes
  shards another draw (``_leavers``), the network's overlap the trace
  lookup's time (``network.round_end``)."""
  c = config
  precision = Precision(stored_dtype(c))
  return Engine(
      model=c.model, strategy=c.strategy, num_workers=c.workers,
      channels=parts.channels, precision=precision,
      timing=functools.partial(
          _timing.timing, masks=c.masks, num_workers=c.workers,
          channels=parts.channels, strategy=c.strategy),
      compute=local_compute(c.model, c.strategy, precision, c.one_replica,
                            _backward.of(c)),
      draw=draw_redistributed if c.redistributes else draw,
      steps=_steps_piece(c, precision),
      lanes=(() if c.shadow is None else (functools.partial(
          shadow_steps, _shadow.lane(c.model, c.shadow, _backward.of(c))),)),
      probe=(functools.partial(correlation, c.correlation_every)
             if c.correlation_every else no_correlation),
      later=functools.partial(
          _later, overlap=bool(clock_overlap(c.strategy, c.network))),
      evaluations=(evaluate_global,
                   *((evaluate_shadow,) if c.shadow is not None else ()),
                   *((evaluate_workers,) if c.eval_local else ())),
      slot=(functools.partial(slot_runs, c.steps) if c.traced_period
            else None))


def stored_dtype(config):
  """The dtype the workers' state is stored in; None: float32 as computed."""
  return None if config.worker_dtype == "float32" else jnp.bfloat16


def _steps_piece(c, precision: Precision):
  """The workers' steps: scanned all at once, or ``worker_batch`` workers at
  a time (``_grouping.steps_in_groups``)."""
  if c.grouping is None:
    return scanned_steps
  run = steps_in_groups(c.model, c.strategy, precision, c.grouping,
                        _backward.of(c))
  return functools.partial(grouped_steps, Groups(run, c.grouping, c.masks))


# ------------------------------------------------------------ local steps
@contextlib.contextmanager
def traced_codec(sim: SimState):
  """While the strategy's messages are traced, the run's own values of a
  codec's traced settings: top-k's counts (``keeping``) and the linear
  quantizer's levels (``leveling``); None where the build fixes them."""
  with keeping(sim.keep), leveling(sim.levels):
    yield


def keys_at(e: Engine, sim: SimState, step):
  """This device's workers' loss keys at ``step``."""
  return local_workers(jax.random.split(
      jax.random.fold_in(sim.loss_key, step), e.num_workers))


def draw(sim: SimState, sampler, step, timing):
  """This device's workers' batches at ``step``."""
  del timing  # the plain draw does not depend on who is up
  return sampler.sample(sim.data_key, step, worker_offset())


def draw_redistributed(sim: SimState, sampler, step, timing):
  """The batches at ``step`` with departed workers' data given to those
  that stay (``_leavers``)."""
  batch_W = draw(sim, sampler, step, timing)
  return redistributed(sampler, sim.data_key, step, batch_W, timing.net)


def local_step(e: Engine, sim: SimState, sampler, timing, carry,
               last=True):
  """One step of every worker; ``last``: the round's last step (a sync
  follows), traced or a bool."""
  stored = sim.strategy
  batch_W = e.draw(sim, sampler, stored.step, timing)
  st, loss_W, metrics_W, bad_fn, step_fn = e.compute(
      stored, batch_W, keys_at(e, sim, stored.step))
  with traced_codec(sim):
    st, report, carry, clock, active = timing.local(st, step_fn, carry,
                                                    sim.active)
  counts, own = _timing.split_report(report, e.channels)
  # A step that communicates, or the one before a sync, shares what the
  # workers' gradients made: flag the workers whose own were non-finite.
  bad_W = when_shared(bad_fn, True if counts else last, loss_W.shape[0])
  # This device's workers' values; reduced over workers once the steps are
  # done (``_reduced``), not at every step.
  out = StepOut(loss_W, metrics_W, None, counts, clock, own,
                inner_lr_W(st.inner_W, loss_W.shape[0]), bad_W)
  sim = sim._replace(strategy=e.precision.narrow(st), active=active)
  return sim, out, carry


def scanned_steps(e: Engine, sim: SimState, sampler, timing, length: int):
  """``length`` steps of every worker at once, a ``lax.scan``; with a
  traced H, ``length`` step slots of which those ``e.slot`` allows run."""
  carry = timing.begin(sim.strategy.step, sim.fleet)

  def body(c, j):
    sim, carry = c
    if e.slot is None:
      sim, out, carry = local_step(e, sim, sampler, timing, carry,
                                   j == length - 1)
    else:
      sim, out, carry = slotted_step(e, sim, sampler, timing, carry, j)
    return (sim, carry), out

  (sim, carry), steps = jax.lax.scan(body, (sim, carry),
                                     jnp.arange(length, dtype=jnp.int32))
  return sim, _reduced(steps), carry


def slot_runs(steps: int, sim: SimState, j) -> Array:
  """Whether step slot ``j`` of a round (or of the tail) runs under a
  traced H: the first H slots of a round, and no step past the run's
  ``steps`` (the tail's slots beyond the run's own tail)."""
  return (j < sim.period) & (sim.strategy.step < steps)


def slotted_step(e: Engine, sim: SimState, sampler, timing, carry, j):
  """``local_step`` in slot ``j`` when the slot runs; otherwise nothing
  happens (no step, no clock, no data drawn) and its outputs are zeros,
  which the host drops (``_loop``: only a run's own H slots are read)."""
  def run(args):
    # The round's last slot is the one before its sync (the gradient
    # flags of ``local_step``).
    return local_step(e, args[0], sampler, timing, args[1],
                      j == args[0].period - 1)

  def skip(args):
    shapes = jax.eval_shape(run, args)[1]
    return args[0], jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype),
                                 shapes), args[1]

  return jax.lax.cond(e.slot(sim, j), run, skip, (sim, carry))


class Groups(NamedTuple):
  """The workers' steps a group at a time (``worker_batch``)."""

  run: Any     # ``_grouping.steps_in_groups``'s function
  size: int    # workers per group
  masks: bool  # the run has a fault or straggler model


def grouped_steps(groups: Groups, e: Engine, sim: SimState, sampler, timing,
                  length: int):
  """The steps with ``worker_batch``: the clock of steps that do not
  communicate depends on the step counter only, so it runs on its own;
  the workers' steps run a group at a time (``steps_in_groups``)."""
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
        lambda x: jax.lax.dynamic_slice_in_dim(x, first, groups.size),
        (sampler.shard_idx_W, sampler.shard_len_W))
    part = dataclasses.replace(sampler, shard_idx_W=rows[0],
                               shard_len_W=rows[1])
    return part.sample(sim.data_key, step, worker_offset() + first)

  up = local_workers(carry.up_W) if groups.masks else None
  stored, loss_HW, metrics_HW, bad_HW, lr_HW = groups.run(
      sim.strategy, sample, lambda step: keys_at(e, sim, step), length, up)
  steps = _reduced(StepOut(loss_HW, metrics_HW, None, {}, clocks, {},
                           lr=lr_HW, first_bad_grad=bad_HW))
  return sim._replace(strategy=stored), steps, carry


def shadow_steps(lane, e: Engine, sim: SimState, sampler,
                 length: int) -> SimState:
  """The paired DDP lane's steps (``_shadow.lane``) over the ``length``
  steps the workers take next, on the batches they draw at those steps."""
  def sample(step):
    return sampler.sample(sim.data_key, step, worker_offset())

  return sim._replace(shadow=lane(
      sim.shadow, sample, lambda step: keys_at(e, sim, step),
      sim.strategy.step, length))


def _run_steps(e: Engine, sim: SimState, sampler, net, length: int):
  """The lanes, then the workers' ``length`` steps; returns ``(sim,
  steps, carry, timing)``."""
  timing = e.timing(_now(sim, net))
  for lane in e.lanes:
    sim = lane(e, sim, sampler, length)
  sim, steps, carry = e.steps(e, sim, sampler, timing, length)
  return sim, steps, carry, timing


# ------------------------------------------------------------------ sync
def no_correlation(st) -> None:
  del st  # not measured without correlation_every
  return None


def correlation(every: int, st):
  """The workers' mean pairwise correlation at a round whose last step is
  a multiple of ``every`` (pre-sync), nan at the others."""
  return jax.lax.cond(st.step % every == 0, worker_correlation,
                      lambda p: jnp.float32(jnp.nan), st.params_W)


def sync(e: Engine, sim: SimState, steps: StepOut, carry, timing):
  """The round's end: what is measured before the sync, the strategy's
  sync under the clock and masks, the workers' returns."""
  st = e.precision.widen(sim.strategy)
  divergence = worker_divergence(st.params_W)
  corr = e.probe(st)
  lr = _inner_lr(st.inner_W)
  with traced_codec(sim):
    st, report, clock, active, carry = timing.sync(
        st, e.strategy.sync, carry, steps.clock, sim.active)
  st, active = timing.rejoin(st, carry, active, e.strategy.global_params)
  # The sync overwrites the buffer the divergence read (``_ordering``).
  st = st._replace(params_W=after(st.params_W, (divergence, corr)))
  counts, own = _timing.split_report(report, e.channels)
  sim = sim._replace(strategy=e.precision.narrow(st), active=active,
                     fleet=None if carry is None else carry.fleet,
                     time_s=e.later(sim.time_s, clock))
  return sim, RoundOut(steps, counts, divergence, lr, clock, own, corr)


# -------------------------------------------------------------- programs
def run_round(e: Engine, sim: SimState, sampler, net
              ) -> tuple[SimState, RoundOut]:
  sim, steps, carry, timing = _run_steps(e, sim, sampler, net,
                                         e.strategy.period)
  return sync(e, sim, steps, carry, timing)


def run_chunk(round_traced, max_rounds: int, sim: SimState, sampler,
              n_rounds: Array, net=None):
  """``n_rounds`` rounds (traced), their outputs in a buffer of
  ``max_rounds``."""
  out_shape = jax.eval_shape(round_traced, sim, sampler, net)[1]
  buf = jax.tree.map(lambda s: jnp.zeros((max_rounds,) + s.shape, s.dtype),
                     out_shape)

  def body(r, carry):
    sim, buf = carry
    sim, out = round_traced(sim, sampler, net)
    buf = jax.tree.map(lambda b, o: b.at[r].set(o), buf, out)
    return sim, buf

  return jax.lax.fori_loop(0, n_rounds, body, (sim, buf))


def run_tail(e: Engine, length: int, sim: SimState, sampler, net=None):
  """The ``length`` steps past the last round: local steps, no sync."""
  sim, steps, carry, timing = _run_steps(e, sim, sampler, net, length)
  st, active = timing.rejoin(e.precision.widen(sim.strategy), carry,
                             sim.active, e.strategy.global_params)
  return sim._replace(strategy=e.precision.narrow(st), active=active), steps


def global_params(e: Engine, sim: SimState):
  with participating(sim.active):
    return e.strategy.global_params(e.precision.widen(sim.strategy))


# ------------------------------------------------------------ evaluation
def evaluate(e: Engine, sim: SimState, eval_batches) -> dict:
  """Every evaluation piece's results, in order."""
  key = jax.random.fold_in(sim.loss_key, 0xE7A1)  # not a step index
  out = {}
  for piece in e.evaluations:
    out.update(piece(e, sim, eval_batches, key))
  return out


def evaluate_global(e: Engine, sim: SimState, eval_batches, key) -> dict:
  """The global parameters' loss and metrics."""
  params = global_params(e, sim)
  losses, metrics = jax.lax.map(
      lambda batch: e.model.loss(params, batch, key), eval_batches)
  return {"loss": jnp.mean(losses), **jax.tree.map(jnp.mean, metrics)}


def evaluate_shadow(e: Engine, sim: SimState, eval_batches, key) -> dict:
  """The paired DDP lane's loss (``_shadow``)."""
  losses, _ = jax.lax.map(
      lambda batch: e.model.loss(sim.shadow.params, batch, key), eval_batches)
  return {"shadow_loss": jnp.mean(losses)}


def evaluate_workers(e: Engine, sim: SimState, eval_batches, key) -> dict:
  """Every worker's own parameters on the evaluation set, in one vmap:
  the mean of each result over workers and the loss's spread."""
  params_W = e.precision.widen(sim.strategy).params_W

  def one(batch):
    return jax.vmap(e.model.loss, in_axes=(0, None, None))(params_W, batch,
                                                           key)

  losses_BW, metrics_BW = jax.lax.map(one, eval_batches)
  loss_W = jnp.mean(losses_BW, axis=0)
  return {"local_loss": jnp.mean(loss_W), "local_loss_std": jnp.std(loss_W),
          **{"local_" + m: jnp.mean(v) for m, v in metrics_BW.items()}}


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
