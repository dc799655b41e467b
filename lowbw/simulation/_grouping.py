"""The workers' gradients and inner update: all workers in one ``vmap``
(``all_at_once``, or ``one_replica`` for DDP's identical workers), or
``worker_batch`` workers at a time, each group running its steps back to back
(``steps_in_groups``).

The per-step forms return what the round's timing needs: the state to step
from, every worker's loss and metrics, ``bad_fn() -> bool (W,)``: whether
each worker's own gradient (before any reduction over workers) was
non-finite, computed only where the caller asks (``when_shared``), and
``step_fn(state) -> (state, report)``, the strategy's local step.
"""

import functools

import jax
import jax.numpy as jnp
import optax

from lowbw.simulation._backward import Backward
from lowbw.simulation._ordering import after
from lowbw.simulation._precision import Precision
from lowbw.strategies import Strategy, StrategyState
from lowbw.transforms import where_workers
from lowbw.transforms._codec import WORKER_AXIS


def inner_lr_W(inner_W, num_local: int) -> jax.Array:
  """These workers' inner learning rates, (num_local,) float32: the
  ``learning_rate`` that ``optax.inject_hyperparams`` keeps; nan where no
  single one is discoverable (reduced with the losses)."""
  try:
    hyper = optax.tree_utils.tree_get(inner_W, "hyperparams")
    lr = hyper.get("learning_rate") if isinstance(hyper, dict) else None
  except Exception:  # several or none: no single learning rate to report
    lr = None
  if lr is None or not hasattr(lr, "shape") or lr.size != num_local:
    return jnp.full((num_local,), jnp.nan, jnp.float32)
  return jnp.asarray(lr, jnp.float32).reshape(num_local)


def loss_and_grads(model, backward: Backward = Backward()):
  """``(params, batch, key) -> (loss, metrics, grads)`` of one worker (in
  ``backward``'s micro-batches and precision)."""
  loss = backward.loss(model)

  def grads(params, batch, key):
    (value, metrics), g = jax.value_and_grad(loss, has_aux=True)(
        params, batch, key)
    return value, metrics, g
  return backward.accumulated(grads)


def after_backward(grads):
  """``grads``, consumed only after the whole backward pass: then the update
  writes the parameters in place once nothing reads them any more. Without
  it, a layer's update may run before the backward matmul that reads the
  same weights for the layer below, and XLA copies those weights, for every
  worker, at every step (``_ordering``)."""
  return after(grads, grads)


def bad_grads_W(grads_W) -> jax.Array:
  """bool (W,): each worker's own gradient holds a NaN or an infinity (one
  reduction of the gradients, read once; it names the worker a non-finite
  value started from before a reduction spreads it to every worker)."""
  bad = [~jnp.all(jnp.isfinite(g).reshape(g.shape[0], -1), axis=1)
         for g in jax.tree.leaves(grads_W)
         if jnp.issubdtype(g.dtype, jnp.inexact)]
  return functools.reduce(jnp.logical_or, bad)


def when_shared(bad_fn, shared, num_workers: int) -> jax.Array:
  """``bad_fn()`` (bool (W,), the workers' own gradients non-finite) at a
  step whose gradients or parameters reach other workers (``shared``:
  True, or a traced bool), else no flag. A step that does not share them
  needs none: a worker's non-finite gradient makes its own next loss
  non-finite, which names it. Flags at every step were measured to cost
  about a third of DiLoCo's steps on the digits MLP (a reduction of every
  worker's gradients each step)."""
  if shared is True:
    return bad_fn()
  # The predicate comes from a scan's index: not batched over sweep points,
  # so this stays a branch (a batched one would compute both sides). With a
  # traced H it is the point's own last slot, batched when vmapped points
  # are: then both sides run (a cost only, never a wrong flag).
  return jax.lax.cond(shared, bad_fn,
                      lambda: jnp.zeros((num_workers,), bool))


def replica_bad_W(model, backward: Backward = Backward()):
  """``(params, batch_W, keys_W, grads) -> bool (W,)``: which workers' own
  gradients are non-finite, for one replica whose ``grads`` are those of
  the mean loss over all workers.

  A mean of finite gradients is finite, so only a non-finite ``grads``
  computes the workers' own, one worker at a time (one gradient's memory).
  A ``while_loop`` rather than a ``cond``: vmapped over sweep points, a
  ``cond`` would run both branches at every step, while the loop runs no
  iteration until some point's gradient is non-finite."""
  grads = loss_and_grads(model, backward)

  def bad_W(params, batch_W, keys_W, pooled):
    w = keys_W.shape[0]
    todo = jnp.where(bad_grads_W(jax.tree.map(lambda g: g[None], pooled))[0],
                     w, 0)

    def body(c):
      i, flags = c
      batch = jax.tree.map(lambda x: jax.lax.dynamic_index_in_dim(
          x, i, keepdims=False), batch_W)
      g = grads(params, batch, keys_W[i])[2]
      own = bad_grads_W(jax.tree.map(lambda x: x[None], g))[0]
      return i + 1, flags.at[i].set(own)

    return jax.lax.while_loop(lambda c: c[0] < todo, body,
                              (jnp.int32(0), jnp.zeros((w,), bool)))[1]

  return bad_W


def all_at_once(model, strategy: Strategy, precision: Precision,
                backward: Backward = Backward()):
  """Every worker's gradients in one ``vmap``; the strategy's local step
  (with any per-step communication) is left to the caller."""
  grads = loss_and_grads(model, backward)

  def compute(stored: StrategyState, batch_W, keys_W):
    st = precision.widen(stored)
    # The axis is named so that a mixed fleet's boundary codecs know which
    # worker's loss they are in (``transforms.pipeline_worker``).
    loss_W, metrics_W, grads_W = jax.vmap(grads, axis_name=WORKER_AXIS)(
        st.params_W, batch_W, keys_W)
    grads_W = after_backward(grads_W)
    return (st, loss_W, metrics_W, lambda: bad_grads_W(grads_W),
            lambda s: strategy.local(s, grads_W))

  return compute


def replica_grads(model, backward: Backward = Backward()):
  """``(params, batch_W, keys_W) -> (loss_W, metrics_W, grads)``: one model
  (unbatched ``params``) on every worker's batch, and the gradient of the
  mean loss over all of them, which equals the mean of the workers'
  gradients. Its matmuls are the W*b-row GEMMs of one replica at batch W*b.
  Micro-batches split every worker's batch (axis 1 of ``batch_W``).

  A ``pooled`` model scores the W*b examples as one batch with worker 0's
  key, as a single-replica loop does: per-worker losses would make XLA lay
  the backward's weight-gradient matmuls out as batched (W, b) contractions,
  with a transposing copy of every activation gradient (measured: 0.85 of
  one replica's speed for the digits MLP at W = 8, 0.76 at W = 64, against
  0.98 pooled). Every worker then reports the pooled loss and metrics
  (their mean is the same mean); only a non-finite loss computes each
  worker's own, to name the first bad worker."""
  loss = backward.loss(model)
  worker_losses = jax.vmap(loss, in_axes=(None, 0, 0), axis_name=WORKER_AXIS)

  def mean_loss(params, batch_W, keys_W):
    loss_W, metrics_W = worker_losses(params, batch_W, keys_W)
    return jnp.mean(loss_W), (loss_W, metrics_W)

  def pooled_loss(params, batch_W, keys_W):
    flat = jax.tree.map(lambda x: x.reshape((-1,) + x.shape[2:]), batch_W)
    value, metrics = loss(params, flat, keys_W[0])
    w = keys_W.shape[0]

    def each(v):
      return jnp.full((w,), v, jnp.asarray(v).dtype)

    loss_W = jax.lax.cond(
        jnp.isfinite(value), lambda: each(value),
        lambda: worker_losses(params, batch_W, keys_W)[0].astype(value.dtype))
    return value, (loss_W, jax.tree.map(each, metrics))

  objective = pooled_loss if getattr(model, "pooled", False) else mean_loss

  def grads_of(params, batch_W, keys_W):
    (_, (loss_W, metrics_W)), grads = jax.value_and_grad(
        objective, has_aux=True)(params, batch_W, keys_W)
    return loss_W, metrics_W, grads

  return backward.accumulated(
      grads_of, axis=1,
      fold=jax.vmap(jax.random.fold_in, in_axes=(0, None)))


def one_replica(model, strategy: Strategy, precision: Precision,
                backward: Backward = Backward()):
  """A ``replicated`` strategy (DDP without a codec) on one replica: the
  state holds a single copy of the workers' identical parameters and
  optimizer state (leading axis 1), and the gradient is
  ``replica_grads``': one replica at batch W*b rather than W small batched
  models, with no reduction over workers left."""
  grads_of = replica_grads(model, backward)
  bad_W = replica_bad_W(model, backward)

  def compute(stored: StrategyState, batch_W, keys_W):
    st = precision.widen(stored)
    params = jax.tree.map(lambda x: x[0], st.params_W)
    loss_W, metrics_W, grads = grads_of(params, batch_W, keys_W)
    grads = after_backward(grads)
    grads_1 = jax.tree.map(lambda g: g[None], grads)
    return (st, loss_W, metrics_W,
            lambda: bad_W(params, batch_W, keys_W, grads),
            lambda s: strategy.local(s, grads_1))

  return compute


def steps_in_groups(model, strategy: Strategy, precision: Precision,
                    size: int, backward: Backward = Backward()):
  """``length`` local steps of every worker, ``size`` workers at a time,
  each group running all its steps back to back.

  A group's parameters and optimizer state are sliced out of the carried
  state once, stepped in a small buffer of their own (updated in place, in
  the cache for small models), and written back once: activations and
  gradients exist for one group only, and the state is read and written
  once per round rather than once per step. It needs steps that do not
  communicate (checked at build), so the groups are independent.

  Returns ``run(stored, sample, keys_at, length, up) -> (stored, loss_HW,
  metrics_HW, bad_HW, lr_HW)`` (``bad_HW``: each worker's own gradient was
  non-finite; ``lr_HW``: its inner learning rate after the step, nan when
  not discoverable): ``sample(step, first)`` draws the batches of the ``size``
  workers from ``first``; ``keys_at(step)`` gives every local worker's loss
  key; ``up`` (bool, local workers, or None): a down worker's steps never
  happen (its state stays as it was; the step counter still advances).
  ``size`` divides each device's number of workers (checked at build).
  """
  grads = loss_and_grads(model, backward)

  def run(stored: StrategyState, sample, keys_at, length: int, up):
    local_w = jax.tree.leaves(stored.params_W)[0].shape[0]
    # Traced once: the loop's steps and the shapes below share the trace.
    group_grads = jax.jit(jax.vmap(grads))

    def group(g, carry):
      params_W, inner_W, outs_HW, _ = carry
      first = g * size

      def get(x):
        return jax.lax.dynamic_slice_in_dim(x, first, size, axis=0)

      up_g = None if up is None else get(up)

      def step(st, i):
        wide = precision.widen(st)
        keys = jax.lax.dynamic_slice_in_dim(keys_at(st.step), first, size)
        loss, metrics, grads_g = group_grads(
            wide.params_W, sample(st.step, first), keys)
        new = precision.narrow(strategy.local(wide, after_backward(grads_g))[0])
        if up_g is not None:  # static: the run has masks
          new = new._replace(
              params_W=where_workers(up_g, new.params_W, st.params_W),
              inner_W=where_workers(up_g, new.inner_W, st.inner_W))
        # Steps that do not communicate: a gradient reaches the other
        # workers only through the sync after the last one.
        bad = when_shared(lambda: bad_grads_W(grads_g), i == length - 1,
                          size)
        return new, (loss, metrics, bad, inner_lr_W(new.inner_W, size))

      start = stored._replace(params_W=jax.tree.map(get, params_W),
                              inner_W=jax.tree.map(get, inner_W))
      end, outs_h = jax.lax.scan(step, start, jnp.arange(length))

      def put(full, part, axis=0):
        return jax.lax.dynamic_update_slice_in_dim(
            full, part.astype(full.dtype), first, axis=axis)

      return (jax.tree.map(put, params_W, end.params_W),
              jax.tree.map(put, inner_W, end.inner_W),
              jax.tree.map(lambda f, p: put(f, p, 1), outs_HW, outs_h),
              end.step)

    def first_group(st):  # the shapes of a group's loss, metrics, flags, lr
      params = jax.tree.map(lambda x: x[:size], precision.widen(st).params_W)
      loss, metrics, grads_g = group_grads(params, sample(st.step, 0),
                                           keys_at(st.step)[:size])
      return (loss, metrics, bad_grads_W(grads_g),
              jnp.zeros((size,), jnp.float32))

    zeros = jax.tree.map(
        lambda s: jnp.zeros((length, local_w) + s.shape[1:], s.dtype),
        jax.eval_shape(first_group, stored))
    params_W, inner_W, outs_HW, step = jax.lax.fori_loop(
        0, local_w // size, group,
        (stored.params_W, stored.inner_W, zeros, stored.step))
    return (stored._replace(step=step, params_W=params_W, inner_W=inner_W),
            *outs_HW)

  return run


def local_compute(model, strategy: Strategy, precision: Precision,
                  replica: bool = False, backward: Backward = Backward()):
  """A step's gradients: ``one_replica`` when ``replica``, else
  ``all_at_once`` (``steps_in_groups`` runs whole rounds in groups)."""
  if replica:
    return one_replica(model, strategy, precision, backward)
  return all_at_once(model, strategy, precision, backward)
