"""The compiled programs of a run.

A *round* is ``period`` inner steps on every worker (a ``lax.scan``; the
workers are a vmapped axis inside each step) followed by the strategy's sync. A
*chunk* is a ``fori_loop`` over a traced number of rounds, so every chunk of a
run, whatever its length, runs the same compiled program. Per-round outputs
(losses per step, communication counts, divergence, lr) are written into a
fixed-size buffer and read by the host after the next chunk is dispatched.

Steps left over when ``steps`` is not a multiple of the period run in a *tail*
program: local steps only, no sync.
"""

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from lowbw._types import Array, PRNGKey, PyTree
from lowbw.strategies import Strategy, StrategyState
from lowbw.transforms import worker_divergence


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


class RoundOut(NamedTuple):
  steps: StepOut           # leaves with leading axis ``period``
  sync_counts: dict        # int32 events per channel of the sync
  divergence: Array        # worker divergence at the end of the round, pre-sync
  lr: Array                # the inner learning rate if discoverable, else nan


def _first_bad(loss_W: Array) -> Array:
  bad_W = ~jnp.isfinite(loss_W)
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
  return jnp.mean(jnp.asarray(lr, jnp.float32))


class Programs(NamedTuple):
  chunk: Any     # (sim, sampler, n_rounds) -> (sim, RoundOut with leading max_rounds)
  tail: Any      # (sim, sampler) -> (sim, StepOut with leading tail_steps) or None
  evaluate: Any  # (sim, eval_batches) -> dict of eval metrics


def build(model, strategy: Strategy, num_workers: int, max_rounds: int,
          tail_steps: int) -> Programs:
  """Builds the jitted programs; nothing is traced until first called."""

  def grads(params, batch, key):
    (loss, metrics), g = jax.value_and_grad(model.loss, has_aux=True)(
        params, batch, key)
    return loss, metrics, g

  def local_step(sim: SimState, sampler) -> tuple[SimState, StepOut]:
    st = sim.strategy
    batch_W = sampler.sample(sim.data_key, st.step)
    keys_W = jax.random.split(jax.random.fold_in(sim.loss_key, st.step),
                              num_workers)
    loss_W, metrics_W, grads_W = jax.vmap(grads)(st.params_W, batch_W, keys_W)
    st, counts = strategy.local(st, grads_W)
    out = StepOut(jnp.mean(loss_W), jax.tree.map(jnp.mean, metrics_W),
                  _first_bad(loss_W), counts)
    return sim._replace(strategy=st), out

  def run_round(sim: SimState, sampler) -> tuple[SimState, RoundOut]:
    sim, steps = jax.lax.scan(lambda s, _: local_step(s, sampler), sim,
                              length=strategy.period)
    st = sim.strategy
    divergence = worker_divergence(st.params_W)
    lr = _inner_lr(st.inner_W)
    sync_counts = {}
    if strategy.sync is not None:
      st, sync_counts = strategy.sync(st)
    return sim._replace(strategy=st), RoundOut(steps, sync_counts, divergence,
                                               lr)

  def chunk(sim: SimState, sampler, n_rounds: Array):
    out_shape = jax.eval_shape(run_round, sim, sampler)[1]
    buf = jax.tree.map(lambda s: jnp.zeros((max_rounds,) + s.shape, s.dtype),
                       out_shape)

    def body(r, carry):
      sim, buf = carry
      sim, out = run_round(sim, sampler)
      buf = jax.tree.map(lambda b, o: b.at[r].set(o), buf, out)
      return sim, buf

    return jax.lax.fori_loop(0, n_rounds, body, (sim, buf))

  def tail(sim: SimState, sampler):
    return jax.lax.scan(lambda s, _: local_step(s, sampler), sim,
                        length=tail_steps)

  def evaluate(sim: SimState, eval_batches):
    params = strategy.global_params(sim.strategy)
    key = jax.random.fold_in(sim.loss_key, 0xE7A1)  # not a step index

    def one(batch):
      loss, metrics = model.loss(params, batch, key)
      return loss, metrics

    losses, metrics = jax.lax.map(one, eval_batches)
    return {"loss": jnp.mean(losses), **jax.tree.map(jnp.mean, metrics)}

  return Programs(
      chunk=jax.jit(chunk, donate_argnums=0),
      tail=jax.jit(tail, donate_argnums=0) if tail_steps else None,
      evaluate=jax.jit(evaluate),
  )
