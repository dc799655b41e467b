"""The workers' gradients and inner update: all workers in one ``vmap``, or
``worker_batch`` workers at a time.

Both return what the round's timing needs: the state to step from, every
worker's loss and metrics, and ``step_fn(state) -> (state, report)``, the
strategy's local step (already applied, in groups, when grouped).
"""

import jax
import jax.numpy as jnp

from lowbw.simulation._precision import Precision
from lowbw.strategies import Strategy, StrategyState


def loss_and_grads(model):
  """``(params, batch, key) -> (loss, metrics, grads)`` of one worker."""
  def grads(params, batch, key):
    (loss, metrics), g = jax.value_and_grad(model.loss, has_aux=True)(
        params, batch, key)
    return loss, metrics, g
  return grads


def after_backward(grads):
  """``grads``, each leaf made to depend on every leaf (a select that always
  keeps them, on one element of each), so that whatever consumes them runs
  after the whole backward pass.

  The update then writes the parameters in place only once nothing reads
  them any more. Without the dependency, a layer's update is free to run
  before the backward pass's matmul that reads the same weights to carry
  the gradient to the layer below, and XLA copies those weights, for every
  worker, at every step. (``optimization_barrier`` does not order them on
  the CPU.)
  """
  token = sum(jnp.sum(x.reshape(-1)[:1].astype(jnp.float32))
              for x in jax.tree.leaves(grads))
  never = token > jnp.inf
  return jax.tree.map(lambda g: jnp.where(never, jnp.zeros_like(g), g), grads)


def all_at_once(model, strategy: Strategy, precision: Precision):
  """Every worker's gradients in one ``vmap``; the strategy's local step
  (with any per-step communication) is left to the caller."""
  grads = loss_and_grads(model)

  def compute(stored: StrategyState, batch_W, keys_W):
    st = precision.widen(stored)
    loss_W, metrics_W, grads_W = jax.vmap(grads)(st.params_W, batch_W, keys_W)
    grads_W = after_backward(grads_W)
    return st, loss_W, metrics_W, lambda s: strategy.local(s, grads_W)

  return compute


def one_replica(model, strategy: Strategy, precision: Precision):
  """A ``replicated`` strategy (DDP without a codec) on one replica: the
  state holds a single copy of the workers' identical parameters and
  optimizer state (leading axis 1), and the gradient is that of the mean
  loss over every worker's batch, which equals the mean of the workers'
  gradients. The model runs with unbatched parameters over the W batches,
  so its matmuls are the W*b-row GEMMs of one replica at batch W*b rather
  than W small batched ones, and no reduction over workers is left."""
  def mean_loss(params, batch_W, keys_W):
    loss_W, metrics_W = jax.vmap(model.loss, in_axes=(None, 0, 0))(
        params, batch_W, keys_W)
    return jnp.mean(loss_W), (loss_W, metrics_W)

  def compute(stored: StrategyState, batch_W, keys_W):
    st = precision.widen(stored)
    params = jax.tree.map(lambda x: x[0], st.params_W)
    (_, (loss_W, metrics_W)), grads = jax.value_and_grad(
        mean_loss, has_aux=True)(params, batch_W, keys_W)
    grads_1 = jax.tree.map(lambda g: g[None], after_backward(grads))
    return st, loss_W, metrics_W, lambda s: strategy.local(s, grads_1)

  return compute


def _materialized(pred, fn, same):
  """``fn()``, its result held in buffers of its own: the branch of a
  ``cond`` whose (always true) predicate the compiler cannot evaluate;
  ``same()`` is the other branch, of the same structure.

  A group's new state must exist before it is written back. Left to
  itself, XLA recomputes the new optimizer moments inside the fusion that
  updates the parameters, reading the old moments from the carried arrays
  that the same iteration overwrites in place, and copy insertion then
  copies every carried array, twice, in each group's iteration: the state's
  bytes times 2·W/size per step, and two more copies of the state in
  memory. ``jax.lax.optimization_barrier`` does not prevent it (XLA's CPU
  pipeline removes the barrier before fusion); a conditional's outputs are
  materialized on every backend.
  """
  return jax.lax.cond(pred, fn, same)


def in_groups(model, strategy: Strategy, precision: Precision, size: int):
  """A local step without communication, ``size`` workers at a time: each
  group's gradients and inner update are computed and written back into the
  state in place, so activations and gradients exist for one group only.
  ``size`` divides each device's number of workers (checked at build)."""
  grads = loss_and_grads(model)

  def compute(stored: StrategyState, batch_W, keys_W):
    local_w = jax.tree.leaves(stored.params_W)[0].shape[0]

    def body(g, carry):
      params_W, inner_W, loss_W, metrics_W, _ = carry

      def get(x):
        return jax.lax.dynamic_slice_in_dim(x, g * size, size, axis=0)

      def put(full, part):
        return jax.lax.dynamic_update_slice_in_dim(
            full, part.astype(full.dtype), g * size, axis=0)

      def group():
        return stored._replace(params_W=jax.tree.map(get, params_W),
                               inner_W=jax.tree.map(get, inner_W))

      loss_g, metrics_g, grads_g = jax.vmap(grads)(
          precision.widen(stored._replace(
              params_W=jax.tree.map(get, params_W), inner_W=())).params_W,
          jax.tree.map(get, batch_W), get(keys_W))
      # The update slices the carried arrays inside the branch, so that it
      # reads them in place rather than from copies of the group's slices.
      new = _materialized(
          stored.step >= 0,  # always true, but not known to the compiler
          lambda: precision.narrow(strategy.local(precision.widen(group()),
                                                  grads_g)[0]),
          group)
      return (jax.tree.map(put, params_W, new.params_W),
              jax.tree.map(put, inner_W, new.inner_W), put(loss_W, loss_g),
              jax.tree.map(put, metrics_W, metrics_g), new.step)

    shapes = jax.eval_shape(lambda p, b, k: jax.vmap(grads)(p, b, k),
                            stored.params_W, batch_W, keys_W)
    zeros = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype),
                         (shapes[0], shapes[1]))
    params_W, inner_W, loss_W, metrics_W, step = jax.lax.fori_loop(
        0, local_w // size, body,
        (stored.params_W, stored.inner_W, zeros[0], zeros[1], stored.step))
    new = stored._replace(step=step, params_W=params_W, inner_W=inner_W)
    return stored, loss_W, metrics_W, lambda s: (new, {})

  return compute


def local_compute(model, strategy: Strategy, precision: Precision,
                  worker_batch: int | None, replica: bool = False):
  """``one_replica`` when ``replica``, else ``all_at_once``, or
  ``in_groups`` of ``worker_batch`` workers."""
  if replica:
    return one_replica(model, strategy, precision)
  if worker_batch is None:
    return all_at_once(model, strategy, precision)
  return in_groups(model, strategy, precision, worker_batch)
