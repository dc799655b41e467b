"""Asynchronous DiLoCo: each worker's pseudo-gradient is applied when it
arrives (Liu et al. 2024, "Asynchronous Local-SGD Training for Language
Modeling", arXiv 2401.09135), with their Delayed Nesterov outer step and
dynamic local updates (DyLU).

The strategy says *what* happens at an arrival; the engine's schedule
(``simulation._pace``) says *when*: it masks the inner steps a slower worker
has not reached and traces ``sync`` inside ``transforms.participating`` with
the workers whose exchange with the server ended in that step.
"""

from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax

from lowbw import _validate
from lowbw._types import Array, Params, PyTree
from lowbw.network import exchange
from lowbw.strategies import _base, _optim, _spec, _stale
from lowbw.transforms import (Codec, Compression, all_workers,
                              broadcast_to_workers, compression, num_workers,
                              participants, participating, transmit,
                              where_workers, worker_mean, worker_sum)
from lowbw.transforms._compression import (aggregate, init_residual,
                                           message_bytes)
from lowbw.transforms._robust import current_weights, weighted_mean


class AsyncComm(NamedTuple):
  """The server's and the workers' state between arrivals.

  Attributes:
    global_params: the server's model.
    outer_state: the outer optimizer's state.
    anchor_W: the model each worker last pulled (its pseudo-gradient is
      anchor - theta_w).
    pulled_W: int32, the outer steps applied when each worker pulled.
    version: int32, outer steps applied so far.
    residual_W: per-worker error-feedback residuals, ``()`` without.
    sent_W: the parameters each worker had when it last sent (a strategy
      whose workers go on computing after they send: Decoupled DiLoCo);
      ``()`` for the others, whose parameters stay what they sent.
  """

  global_params: Params
  outer_state: PyTree
  anchor_W: PyTree
  pulled_W: Array
  version: Array
  residual_W: PyTree
  sent_W: PyTree = ()


class DelayedNesterovState(NamedTuple):
  momentum: PyTree   # m
  pending: PyTree    # the arrivals' pseudo-gradients since m last moved, / N
  arrivals: Array    # int32: how many since m last moved


def delayed_nesterov(learning_rate: float = 0.7, momentum: float = 0.9,
                     every: int = 1) -> optax.GradientTransformationExtraArgs:
  """Delayed Nesterov (arXiv 2401.09135, Algorithm 2), as an outer
  optimizer that takes the mean pseudo-gradient of ``arrivals`` workers.

  Each arrival's pseudo-gradient g moves the model at once by -lr x g / N;
  the momentum moves only every N = ``every`` arrivals, by the buffered
  ones: m <- momentum x m + (sum of the N arrivals' g) / N, and that step
  adds -lr x momentum x m. An update with ``arrivals`` = n is n arrivals of
  the mean g fed one at a time: when they cross the N-th arrival, only those
  that complete it enter the momentum (several moves if n spans several N)
  and the rest wait in the buffer. With N arrivals at once (an equal fleet,
  N = W) it is SGD with Nesterov momentum on their mean: DiLoCo's outer step.
  """
  every = _validate.positive_int("delayed_nesterov", every)

  def init(params):
    return DelayedNesterovState(optax.tree.zeros_like(params),
                                optax.tree.zeros_like(params),
                                jnp.zeros((), jnp.int32))

  def update(grads, state, params=None, *, arrivals=1, **extra):
    del params, extra
    n = jnp.asarray(arrivals, jnp.int32)
    total = state.arrivals + n
    moves = total // every          # momentum moves these arrivals complete
    left = total - moves * every    # arrivals buffered after them
    share = optax.tree.scale(1.0 / every, grads)   # one arrival's g / N
    times = lambda k, t: jax.tree.map(  # noqa: E731
        lambda x: k.astype(x.dtype) * x, t)
    # The first move takes the buffer and the arrivals that complete it;
    # any later one N arrivals of g, i.e. g itself.
    first = optax.tree.add(state.pending, times(every - state.arrivals, share))
    m, moved = _momentum_moves(momentum, moves, state.momentum, first, grads)
    step = jax.tree.map(lambda s, acc: -learning_rate * (
        n.astype(s.dtype) * s + momentum * acc), share, moved)
    pending = jax.tree.map(lambda p, s: jnp.where(
        moves > 0, left.astype(s.dtype) * s, p + n.astype(s.dtype) * s),
                           state.pending, share)
    return step, DelayedNesterovState(m, pending, left)

  return optax.GradientTransformationExtraArgs(init, update)


def _momentum_moves(momentum, moves, m, first, rest):
  """``moves`` (traced) momentum moves m <- momentum x m + p, p = ``first``
  then ``rest``; returns m and the sum of the moved m's (each move's step
  adds -lr x momentum x m)."""
  def move(i, carry):
    m, moved = carry
    p = jax.tree.map(lambda f, r: jnp.where(i == 0, f, r), first, rest)
    m = jax.tree.map(lambda m, p: momentum * m + p, m, p)
    return m, optax.tree.add(moved, m)
  return jax.lax.fori_loop(0, moves, move, (m, optax.tree.zeros_like(m)))


def _with_delayed_nesterov(outer: optax.GradientTransformation, every: int
                           ) -> optax.GradientTransformation:
  """Delayed Nesterov at ``outer``'s learning rate and momentum (read from
  its injected hyperparameters, as ``outer_optimizer`` builds it)."""
  try:
    hyper = optax.tree_utils.tree_get(outer.init(jnp.zeros(1)), "hyperparams")
    lr, momentum = float(hyper["learning_rate"]), float(hyper["momentum"]
                                                         or 0.0)
  except Exception:  # no injected learning rate and momentum to read
    raise _validate.fail(
        "outer", _base.describe(outer), "delayed_nesterov needs an outer "
        "optimizer whose learning rate and momentum it can read: "
        "lowbw.strategies.outer_optimizer(lr, momentum)") from None
  return optax.inject_hyperparams(delayed_nesterov, static_args="every")(
      learning_rate=lr, momentum=momentum, every=every)


def _pseudo_gradient(comp: Compression, c: AsyncComm, params_W, key,
                     scale_W) -> tuple:
  """The arrivals' mean of what the server decodes of anchor_w - theta_w
  (each scaled by ``scale_W``; weighted by the engine's weights when it
  gives some: a syncer's token weights), and the message states. theta_w
  is what the worker sent: its parameters now, or, for workers that went
  on computing, those it kept when it sent (``AsyncComm.sent_W``)."""
  params_W = c.sent_W if _keeps_sent(c) else params_W
  delta_W = optax.tree.sub(c.anchor_W, params_W)
  sent_W, residual_W = transmit(comp, delta_W, c.residual_W, key)
  if scale_W is not None:
    sent_W = jax.tree.map(lambda x: x * scale_W.reshape(
        (-1,) + (1,) * (x.ndim - 1)).astype(x.dtype), sent_W)
  weights = current_weights()
  if weights is not None:
    return weighted_mean(sent_W, weights), residual_W
  return aggregate(comp, sent_W, key), residual_W


def async_sync(outer, comp: Compression, staleness_scale: bool):
  """One outer step on the arriving workers' (``participants()``) mean
  pseudo-gradient, applied to the current server model; they restart from
  the new model. The outer optimizer's update gets ``arrivals`` (their
  number) and ``age`` (their mean staleness). Reports the arrivals, their
  staleness (outer steps applied since each pulled: mean and max) and the
  pseudo-gradient norm."""
  outer = optax.with_extra_args_support(outer)

  def sync(state):
    c, w = state.comm, num_workers(state.params_W)
    arrived = participants()
    if arrived is None:  # driven without the engine's schedule: everyone
      arrived = jnp.ones(w, bool)
    with participating(arrived):
      n = worker_sum(jnp.ones(w, jnp.int32))
      stale_W = (c.version - c.pulled_W).astype(jnp.float32)
      scale_W = 1.0 / (1.0 + stale_W) if staleness_scale else None
      pseudo_grad, residual_W = _pseudo_gradient(
          comp, c, state.params_W, _base.comm_key(state), scale_W)
      mean_stale = worker_mean(stale_W)
    # The outer step's age (``age=``, read by staleness-aware outers such
    # as ``cgad``): its arrivals' mean staleness.
    updates, outer_state = outer.update(pseudo_grad, c.outer_state,
                                        c.global_params, arrivals=n,
                                        age=mean_stale)
    global_params = optax.apply_updates(c.global_params, updates)
    new_W = broadcast_to_workers(global_params, w)
    if _keeps_sent(c):  # what it computed since it sent, on the new model
      new_W = jax.tree.map(lambda g, p, s: g + (p - s), new_W,
                           state.params_W, c.sent_W)
    version = c.version + 1
    comm = c._replace(
        global_params=global_params, outer_state=outer_state,
        anchor_W=where_workers(arrived, broadcast_to_workers(
            global_params, w), c.anchor_W),
        pulled_W=jnp.where(arrived, version, c.pulled_W), version=version,
        residual_W=residual_W)
    max_stale = jnp.max(jnp.where(all_workers(arrived),
                                  all_workers(stale_W), 0.0))
    return state._replace(
        params_W=where_workers(arrived, new_W, state.params_W), comm=comm,
    ), {**_base.events(pseudo_gradients=1),
        **_base.metrics(arrivals=n, staleness=mean_stale,
                        staleness_max=max_stale,
                        pseudo_grad_norm=optax.tree.norm(pseudo_grad))}

  return sync


def async_pull(state, mask_W):
  """The workers in ``mask_W`` (this device's) restart from the server's
  model: their parameters and anchor become it, pulled at its version."""
  c, w = state.comm, num_workers(state.params_W)
  new_W = broadcast_to_workers(c.global_params, w)
  # pulled_W is (W,) or, per fragment, (W, P) against version (P,).
  per_worker = mask_W.reshape(mask_W.shape + (1,) * (c.pulled_W.ndim - 1))
  comm = c._replace(anchor_W=where_workers(mask_W, new_W, c.anchor_W),
                    pulled_W=jnp.where(per_worker, c.version, c.pulled_W))
  return state._replace(params_W=where_workers(mask_W, new_W,
                                               state.params_W), comm=comm)


def _keeps_sent(c: AsyncComm) -> bool:
  return not (isinstance(c.sent_W, tuple) and not c.sent_W)


def async_send(state, mask_W):
  """Keeps the parameters of the workers in ``mask_W`` (this device's) as
  what they sent (``AsyncComm.sent_W``)."""
  c = state.comm
  return state._replace(comm=c._replace(sent_W=where_workers(
      mask_W, state.params_W, c.sent_W)))


def async_init(inner, outer, comp: Compression, sends: bool = False,
               syncer=None):
  """The server's and workers' state; ``sends``: keep what each worker
  sent (``AsyncComm.sent_W``, for workers that go on computing); a
  ``syncer``'s quorum is checked against the fleet."""
  def init(params, num_workers_, key):
    if syncer is not None and syncer.count > num_workers_:
      raise _validate.fail("quorum", syncer.count, f"at most the "
                           f"{num_workers_} workers of the fleet")
    state = _base.inner_init(inner, params, num_workers_, key, ())
    copy = lambda: jax.tree.map(jnp.copy, state.params_W)  # noqa: E731
    return state._replace(comm=AsyncComm(
        params, outer.init(params), copy(),
        jnp.zeros(num_workers_, jnp.int32), jnp.zeros((), jnp.int32),
        init_residual(comp, state.params_W), copy() if sends else ()))
  return init


def async_channels(comp: Compression):
  def channels(params, num_workers_):
    model = _base.payload_bytes(params)
    return {"pseudo_gradients": exchange(message_bytes(comp, params), model,
                                         num_workers_)}
  return channels


def async_diloco(
    inner: optax.GradientTransformation | None = None,
    outer: optax.GradientTransformation | None = None,
    H: int = 100,
    codec: Codec | str | None = None,
    error_feedback: float | None = None,
    delayed_nesterov: int = 0,
    staleness_scale: bool = False,
    dylu: bool = False,
    stale_outer: str | None = None,
) -> _base.Strategy:
  """Asynchronous DiLoCo: each worker's pseudo-gradient updates the server's
  model when it arrives, and that worker alone restarts from the result.

  Liu et al. 2024, "Asynchronous Local-SGD Training for Language Modeling"
  (arXiv 2401.09135). Every worker takes H inner steps on its own clock
  (a slower worker takes longer), sends anchor - theta (anchor: the model it
  last pulled) to the server over its own link, and restarts from the
  server's model once its exchange ends. The server applies the arrivals in
  simulated-time order; the arrivals of one engine step (the fastest
  worker's inner step) are one outer step on their mean. With equal workers
  every round's arrivals land together and it is synchronous DiLoCo.

  Defaults: DiLoCo's inner AdamW (lr 4e-4, weight decay 0.1) and outer SGD
  with Nesterov momentum (lr 0.7, momentum 0.9), as the paper's baselines.
  The paper's recommendation is Delayed Nesterov with N = W and DyLU.

  Bytes per arrival: the worker uploads its pseudo-gradient (4 bytes x P, or
  the codec's payload) and downloads the model (4 bytes x P).

  Args:
    inner: per-worker optimizer, state kept across rounds.
    outer: the server's optimizer, fed the arrivals' mean pseudo-gradient.
    H: each worker's inner steps between pulls (>= 1).
    codec: a codec spec for the pseudo-gradients, or None.
    error_feedback: residual decay beta in [0, 1] (needs a codec), or None.
    delayed_nesterov: N > 0: the outer momentum moves every N arrivals
      (Delayed Nesterov, the paper's Algorithm 2) at the outer optimizer's
      learning rate and momentum; each arrival in between is a plain step of
      lr x g / N. 0 (default): ``outer`` at every arrival.
    staleness_scale: scale each arrival's pseudo-gradient by 1 / (1 + s),
      s its staleness (outer steps applied since it pulled).
    dylu: dynamic local updates (the paper's DyLU): worker w takes
      floor(H x v_w / v_max) inner steps per round (at least 1), v its
      speed, so all workers' rounds take about as long as the fastest's.
    stale_outer: a staleness rule chained before the outer optimizer
      (``stale_outer``): ``"cgad:alpha=A,cutoff=C"`` (CGAD, arXiv
      2605.09126; with ``outer`` Adam it is CGAD exactly),
      ``"heloco[:field=value,...]"`` (HeLoCo, arXiv 2606.00271), or None.

  Example:
    >>> strategy = lowbw.strategies.async_diloco(H=50, delayed_nesterov=4,
    ...                                          dylu=True)
  """
  inner = _base.optimizer("inner", inner, _base.default_inner)
  outer = _base.optimizer("outer", outer, _diloco_outer)
  H = _validate.positive_int("H", H)
  delayed_nesterov = _validate.non_negative_int("delayed_nesterov",
                                                delayed_nesterov)
  for field, value in (("staleness_scale", staleness_scale), ("dylu", dylu)):
    _validate.boolean(field, value)
  if delayed_nesterov:
    outer = _with_delayed_nesterov(outer, delayed_nesterov)
  outer = _stale.stale_outer(stale_outer, outer)
  comp = compression(codec, error_feedback)
  return asynchronous("async_diloco", inner, outer, comp, H, {
      "delayed_nesterov": delayed_nesterov,
      "staleness_scale": staleness_scale, "dylu": dylu,
      "stale_outer": stale_outer}, staleness_scale=staleness_scale,
      time_budget=dylu)


def asynchronous(name: str, inner, outer, comp: Compression, H: int,
                 settings: dict, staleness_scale: bool = False,
                 sends: bool = False, **options) -> _base.Strategy:
  """An asynchronous DiLoCo-family strategy: workers that take H inner
  steps on their own clocks and a server that applies ``async_sync`` to
  their arrivals, on the engine's schedule (``simulation._pace``).
  ``settings``: its config entries past the optimizers, H and the codec;
  ``sends``: keep what each worker sent (workers that go on computing);
  ``options``: ``Strategy`` attributes (``time_budget``, ``syncer``,
  ``send``)."""
  local = lambda s, g: (_base.inner_update(inner, s, g), {})  # noqa: E731
  sync = async_sync(outer, comp, staleness_scale)
  strategy = _base.make(
      name, 1, _base.Parts(
          async_init(inner, outer, comp, sends, options.get("syncer")),
          local, sync, lambda s: s.comm.global_params, async_channels(comp)),
      {"name": name, "inner": _base.describe(inner),
       "outer": _base.describe(outer), "H": H, **comp.config, **settings},
      outer_places={"outer": "outer_state"}, asynchronous=H, pull=async_pull,
      inner=inner, **options)
  # Driven step by step without the engine's schedule (a notebook), every
  # worker arrives after each H steps: synchronous DiLoCo.
  return strategy._replace(step=_base.compose_step(local, sync, H))


def _diloco_outer() -> optax.GradientTransformation:
  return _optim.outer(_optim.DILOCO_OUTER)


SPEC = _spec.spec(
    async_diloco, inner=_optim.DILOCO_INNER, outer=_optim.DILOCO_OUTER,
    paper="Liu et al. 2024, arXiv 2401.09135",
    help={"codec": "codec of the pseudo-gradients",
          "delayed_nesterov": "N > 0: Delayed Nesterov, the outer momentum "
          "moves every N arrivals (the paper uses N = W); 0: the outer step "
          "at every arrival",
          "staleness_scale": "scale each arrival by 1 / (1 + staleness)"})
