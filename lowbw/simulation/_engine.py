"""The compiled programs of a run.

A *round* is ``period`` inner steps on every worker (a ``lax.scan``; the
workers are a vmapped axis inside each step) followed by the strategy's sync. A
*chunk* is a ``fori_loop`` over a traced number of rounds, so every chunk of a
run, whatever its length, runs the same compiled program. Per-round outputs
(losses per step, communication counts, divergence, lr) are written into a
fixed-size buffer and read by the host after the next chunk is dispatched.

Steps left over when ``steps`` is not a multiple of the period run in a *tail*
program: local steps only, no sync.

With a network (``lowbw.network``), the round also keeps the simulated clock
and, when a fault or straggler model is given, the participation masks: its
numbers (``NetParams``) are an argument of the compiled programs, so changing
them does not recompile.
"""

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from lowbw._types import Array, PRNGKey, PyTree
from lowbw.network import _clock
from lowbw.strategies import Strategy, StrategyState
from lowbw.transforms import (all_workers, any_worker, broadcast_to_workers,
                              local_workers, sharded_workers, where_workers,
                              worker_divergence, worker_mean, worker_offset)


class SimState(NamedTuple):
  """Everything a run carries from chunk to chunk (donated between chunks).

  Attributes:
    strategy: the strategy's state (worker params, optimizer states, counter).
    data_key: key of the data stream (workers fold in their index).
    loss_key: key passed to the model's loss (split per worker and step).
  """

  strategy: StrategyState
  data_key: PRNGKey
  loss_key: PRNGKey


class StepOut(NamedTuple):
  """Per inner step, reduced over workers."""

  loss: Array              # mean loss over workers
  metrics: dict            # mean of each model metric over workers
  first_bad_worker: Array  # int32: first worker with a non-finite loss, or -1
  counts: dict             # int32 events per channel (per-step communication)
  clock: Any = None        # StepClock with a network


class StepClock(NamedTuple):
  time_s: Array            # float32: the workers waited for done (from round start)
  participants: Array      # int32: workers averaged at this step, or -1


class RoundClock(NamedTuple):
  compute_s: Array         # float32: when the sync starts, from round start
  sync_s: Array            # float32: seconds of the sync's communication
  participants: Array      # int32: workers averaged by the sync, or -1


class RoundOut(NamedTuple):
  steps: StepOut           # leaves with leading axis ``period``
  sync_counts: dict        # int32 events per channel of the sync
  divergence: Array        # worker divergence at the end of the round, pre-sync
  lr: Array                # the inner learning rate if discoverable, else nan
  clock: Any = None        # RoundClock with a network


def _first_bad(loss_W: Array) -> Array:
  bad_W = ~jnp.isfinite(all_workers(loss_W))
  return jnp.where(jnp.any(bad_W), jnp.argmax(bad_W), -1).astype(jnp.int32)


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

  chunk: Any     # (sim, sampler, n_rounds) -> (sim, RoundOut with leading max_rounds)
  tail: Any      # (sim, sampler) -> (sim, StepOut with leading tail_steps) or None
  evaluate: Any  # (sim, eval_batches) -> dict of eval metrics


def _where_W(mask_W: Array, new: PyTree, old: PyTree) -> PyTree:
  """Per worker, ``new`` where ``mask_W`` (over all W workers) else ``old``."""
  return where_workers(local_workers(mask_W), new, old)


def _unless_nobody(fn, active_W: Array, steps: int):
  """``fn(state, *args)``, skipped when no worker takes part (the counter still
  advances by ``steps``; no events): the global model is never lost."""

  def run(state, *args):
    report_shape = jax.eval_shape(fn, state, *args)[1]

    def skip(state, *args):
      del args
      return state._replace(step=state.step + steps), jax.tree.map(
          lambda s: jnp.zeros(s.shape, s.dtype), report_shape)

    return jax.lax.cond(jnp.any(active_W), fn, skip, state, *args)

  return run


def cast_workers(st: StrategyState, dtype) -> StrategyState:
  """Every worker's parameters and inner optimizer state as ``dtype``.

  Only tensors are cast (leaves with a dimension besides the worker axis):
  per-worker scalars such as step counts and learning rates keep their type.
  """
  def one(x):
    if x.ndim >= 2 and jnp.issubdtype(x.dtype, jnp.floating):
      return x.astype(dtype)
    return x
  return st._replace(params_W=jax.tree.map(one, st.params_W),
                     inner_W=jax.tree.map(one, st.inner_W))


def build(model, strategy: Strategy, num_workers: int, max_rounds: int,
          tail_steps: int, masks: bool = False, mesh=None,
          specs=None, worker_dtype=None,
          worker_batch: int | None = None) -> Programs:
  """Builds the run's pure functions; nothing is traced here.

  The programs take a ``NetParams`` (or None, no clock) as their last
  argument. ``masks``: the run has a fault or straggler model, so the engine
  sets ``StrategyState.active`` before each communication, freezes down
  workers and has them pull the global parameters when their round ends.

  ``mesh``: a ``jax.sharding.Mesh`` with a ``"workers"`` axis; the chunk and
  tail programs then run under ``shard_map``, each device vmapping over its
  slice of the workers, with ``specs = (sim_specs, sampler_specs)`` saying
  which leaves are per worker (``P("workers")``) and which are replicated.
  Evaluation stays a plain ``jit`` (the partitioner reduces over devices).

  ``worker_dtype`` (e.g. bfloat16): the workers' parameters and inner
  optimizer states are kept in this type between steps; every step and sync
  computes in float32 (cast on entry, rounded back on exit).

  ``worker_batch``: for strategies whose local step does not communicate,
  compute the workers' steps this many at a time (a loop over groups that
  updates the state in place), so that activations and gradients exist for
  one group only; must divide each device's number of workers. None: all at
  once (one vmap).
  """

  def widen(st):
    return st if worker_dtype is None else cast_workers(st, jnp.float32)

  def narrow(st):
    return st if worker_dtype is None else cast_workers(st, worker_dtype)

  def grads(params, batch, key):
    (loss, metrics), g = jax.value_and_grad(model.loss, has_aux=True)(
        params, batch, key)
    return loss, metrics, g

  def local_step(sim: SimState, sampler, net, up_W, ready_W):
    stored = sim.strategy
    batch_W = sampler.sample(sim.data_key, stored.step, worker_offset())
    keys_W = local_workers(jax.random.split(
        jax.random.fold_in(sim.loss_key, stored.step), num_workers))
    if worker_batch is None:
      st = widen(stored)
      loss_W, metrics_W, grads_W = jax.vmap(grads)(st.params_W, batch_W,
                                                   keys_W)
      step_fn = lambda s: strategy.local(s, grads_W)  # noqa: E731
    else:  # already in the stored type, groups widened one at a time
      st = stored
      new, loss_W, metrics_W = grouped_local(stored, batch_W, keys_W)
      step_fn = lambda s: (new, {})  # noqa: E731
    clock = None
    if net is None:
      st, counts = step_fn(st)
    else:
      st, counts, ready_W, clock = clocked_local(st, step_fn, net, up_W,
                                                 ready_W)
    out = StepOut(worker_mean(loss_W), worker_mean(metrics_W),
                  _first_bad(loss_W), counts, clock)
    return sim._replace(strategy=narrow(st)), out, ready_W

  def grouped_local(st: StrategyState, batch_W, keys_W):
    """A local step without communication, ``worker_batch`` workers at a
    time: each group's gradients and inner update are computed and written
    back into the state in place, so activations and gradients exist for one
    group only."""
    local_w = jax.tree.leaves(st.params_W)[0].shape[0]
    size = worker_batch

    def body(g, carry):
      params_W, inner_W, loss_W, metrics_W, _ = carry

      def get(x):
        return jax.lax.dynamic_slice_in_dim(x, g * size, size, axis=0)

      def put(full, part):
        return jax.lax.dynamic_update_slice_in_dim(
            full, part.astype(full.dtype), g * size, axis=0)

      sub = widen(st._replace(
          params_W=jax.tree.map(get, params_W),
          inner_W=jax.tree.map(get, inner_W),
          active=None if st.active is None else get(st.active)))
      loss_g, metrics_g, grads_g = jax.vmap(grads)(
          sub.params_W, jax.tree.map(get, batch_W), get(keys_W))
      new, _ = strategy.local(sub, grads_g)
      new = narrow(new)
      return (jax.tree.map(put, params_W, new.params_W),
              jax.tree.map(put, inner_W, new.inner_W), put(loss_W, loss_g),
              jax.tree.map(put, metrics_W, metrics_g), new.step)

    shapes = jax.eval_shape(
        lambda p, b, k: jax.vmap(grads)(p, b, k), st.params_W, batch_W,
        keys_W)
    zeros = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype),
                         (shapes[0], shapes[1]))
    params_W, inner_W, loss_W, metrics_W, step = jax.lax.fori_loop(
        0, local_w // size, body,
        (st.params_W, st.inner_W, zeros[0], zeros[1], st.step))
    return (st._replace(step=step, params_W=params_W, inner_W=inner_W),
            loss_W, metrics_W)

  def clocked_local(st: StrategyState, step_fn, net, up_W, ready_W):
    """``step_fn`` (the strategy's local step) with the clock (and the
    masks, when on)."""
    ready_W = ready_W + jnp.where(up_W, _clock.step_seconds(net, st.step), 0)
    if jax.eval_shape(step_fn, st)[1]:
      # Communication every step: a barrier of the workers waited for.
      local = step_fn
      if masks:
        active_W, start = _clock.participants(net, ready_W, up_W, st.step, 0)
        st = st._replace(active=local_workers(active_W))
        local = _unless_nobody(local, active_W, 1)
      else:
        active_W, start = up_W, jnp.max(ready_W)
      st, counts = local(st)
      ready_W = jnp.full_like(ready_W, start + _clock.comm_seconds(net, counts))
      n = jnp.sum(active_W.astype(jnp.int32))
    else:
      new, counts = step_fn(st)
      if masks:  # a down worker's steps never happened
        new = new._replace(params_W=_where_W(up_W, new.params_W, st.params_W),
                           inner_W=_where_W(up_W, new.inner_W, st.inner_W))
      st, n = new, jnp.int32(-1)
    clock = StepClock(_clock.waited_for(net, ready_W, up_W), n)
    return st, counts, ready_W, clock

  def local_steps(sim: SimState, sampler, net, length: int):
    up_W = ready_W = None
    if net is not None:
      up_W = (_clock.up_mask(net, sim.strategy.step) if masks
              else jnp.ones(num_workers, bool))
      ready_W = jnp.zeros(num_workers, jnp.float32)

    def body(carry, _):
      sim, ready_W = carry
      sim, out, ready_W = local_step(sim, sampler, net, up_W, ready_W)
      return (sim, ready_W), out

    (sim, ready_W), steps = jax.lax.scan(body, (sim, ready_W), length=length)
    return sim, steps, up_W, ready_W

  def rejoin(st: StrategyState, up_W) -> StrategyState:
    """Down workers pull the global parameters; the up ones are active again.

    Strategies without a server model define the global parameters as the
    mean of the active workers; when the last communication had nobody, the
    mean of the up workers stands in, and with nobody up, of all of them (a
    mean over nobody would be zeros).
    """
    if not masks:
      return st
    fallback = local_workers(jnp.where(jnp.any(up_W), up_W, True))
    counted = jnp.where(any_worker(st.active), st.active, fallback)
    global_W = broadcast_to_workers(
        strategy.global_params(st._replace(active=counted)),
        fallback.shape[0])
    return st._replace(params_W=_where_W(up_W, st.params_W, global_W),
                       active=fallback)

  def run_round(sim: SimState, sampler, net) -> tuple[SimState, RoundOut]:
    sim, steps, up_W, ready_W = local_steps(sim, sampler, net, strategy.period)
    st = widen(sim.strategy)
    divergence = worker_divergence(st.params_W)
    lr = _inner_lr(st.inner_W)
    sync_counts, clock = {}, None
    if net is not None:
      start, sync_s = _clock.waited_for(net, ready_W, up_W), jnp.float32(0)
      n = steps.clock.participants[-1]
    if strategy.sync is not None:
      sync = strategy.sync
      if masks:
        active_W, start = _clock.participants(net, ready_W, up_W, st.step, 1)
        st = st._replace(active=local_workers(active_W))
        sync = _unless_nobody(sync, active_W, 0)
        n = jnp.sum(active_W.astype(jnp.int32))
      elif net is not None:
        n = jnp.int32(num_workers)
      st, sync_counts = sync(st)
      if net is not None:
        sync_s = _clock.comm_seconds(net, sync_counts)
    if net is not None:
      st = rejoin(st, up_W)
      clock = RoundClock(start, sync_s, n)
    return sim._replace(strategy=narrow(st)), RoundOut(
        steps, sync_counts, divergence, lr, clock)

  def chunk(sim: SimState, sampler, n_rounds: Array, net=None):
    out_shape = jax.eval_shape(run_round, sim, sampler, net)[1]
    buf = jax.tree.map(lambda s: jnp.zeros((max_rounds,) + s.shape, s.dtype),
                       out_shape)

    def body(r, carry):
      sim, buf = carry
      sim, out = run_round(sim, sampler, net)
      buf = jax.tree.map(lambda b, o: b.at[r].set(o), buf, out)
      return sim, buf

    return jax.lax.fori_loop(0, n_rounds, body, (sim, buf))

  def tail(sim: SimState, sampler, net=None):
    sim, steps, up_W, _ = local_steps(sim, sampler, net, tail_steps)
    if net is not None:
      sim = sim._replace(strategy=narrow(rejoin(widen(sim.strategy), up_W)))
    return sim, steps

  def evaluate(sim: SimState, eval_batches):
    params = strategy.global_params(widen(sim.strategy))
    key = jax.random.fold_in(sim.loss_key, 0xE7A1)  # not a step index

    def one(batch):
      loss, metrics = model.loss(params, batch, key)
      return loss, metrics

    losses, metrics = jax.lax.map(one, eval_batches)
    return {"loss": jnp.mean(losses), **jax.tree.map(jnp.mean, metrics)}

  if mesh is not None:
    chunk, tail = _shard(chunk, tail, mesh, specs, num_workers)
  return Programs(chunk=chunk, tail=tail if tail_steps else None,
                  evaluate=evaluate)


MESH_AXIS = "workers"


def _shard(chunk, tail, mesh, specs, num_workers: int):
  """``chunk`` and ``tail`` under ``shard_map`` over ``mesh``'s workers axis.

  Inside, every worker-stacked leaf holds this device's workers and the
  reductions of ``lowbw.transforms`` add a ``psum`` across devices; every
  per-round output is such a reduction, hence replicated.
  """
  sim_specs, sampler_specs = specs
  shards = mesh.shape[MESH_AXIS]
  rep = jax.sharding.PartitionSpec()

  def mapped(fn, in_specs, out_specs):
    def body(*args):
      with sharded_workers(MESH_AXIS, shards, num_workers):
        return fn(*args)
    return jax.shard_map(body, mesh=mesh, in_specs=in_specs,
                         out_specs=out_specs, check_vma=False)

  chunk_s = mapped(chunk, (sim_specs, sampler_specs, rep, rep),
                   (sim_specs, rep))
  tail_s = mapped(tail, (sim_specs, sampler_specs, rep), (sim_specs, rep))

  def sharded_chunk(sim, sampler, n_rounds, net=None):
    return chunk_s(sim, sampler, n_rounds, net)

  def sharded_tail(sim, sampler, net=None):
    return tail_s(sim, sampler, net)

  return sharded_chunk, sharded_tail
