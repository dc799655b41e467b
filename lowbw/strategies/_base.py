"""The strategy contract: a factory returns a NamedTuple of pure functions.

A strategy owns everything that happens after the workers' gradients exist: the
inner optimizer (applied per worker), communication every step (DDP, SPARTA) and
the periodic synchronisation (DiLoCo, FedAvg). Its state is one pytree.

Two ways to drive it, with identical results:

* ``step(state, grads_W)`` — one inner step; the periodic ``sync`` runs under
  ``lax.cond`` when the step counter reaches a multiple of ``period``. This is the
  optax-style interface for notebooks and custom loops.
* ``local`` then, every ``period`` steps, ``sync`` — what the engine compiles: a
  round is a scan of ``period`` local steps followed by one sync, with no
  conditional in the loop.

Communication is reported as event counts (int32 per channel and step); the byte
cost of one event of each channel is static (``channels``), so cumulative bytes
are exact Python integers however long the run. A report's other entries are
the strategy's own metrics (float32 scalars, ``metrics``), which reach the
CSV, TensorBoard and ``result.history`` as ``strategy_<name>``.
"""

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax
from jax.extend import core as jax_core

from lowbw import _validate
from lowbw.strategies import _optim
from lowbw._types import Array, Params, PRNGKey, PyTree
from lowbw.network import Channel
from lowbw.transforms import (broadcast_to_workers, call_participating,
                              participants, per_worker, worker_mean)

CommReport = dict[str, Array]


class StrategyState(NamedTuple):
  """The whole state of a strategy.

  Attributes:
    step: int32 scalar, inner steps completed by every worker.
    params_W: worker-stacked parameters.
    inner_W: worker-stacked inner optimizer state (kept across syncs).
    comm: strategy-specific communication state (global parameters, outer
      optimizer state, ...); ``()`` when there is none.
    key: a PRNG key shared by all workers (SPARTA indices, island draws).

  Which workers take part in a communication is not part of the state: the
  engine traces ``local``/``sync`` inside ``transforms.participating(mask)``
  under a fault or straggler model, and the worker reductions honour it.
  """

  step: Array
  params_W: PyTree
  inner_W: PyTree
  comm: PyTree
  key: PRNGKey


class Strategy(NamedTuple):
  """A distributed training strategy as pure functions.

  Attributes:
    name: registry name, e.g. ``"diloco"``.
    period: inner steps per round (H); 1 when the strategy only communicates
      every step. Static.
    init: ``(params, num_workers, key) -> StrategyState``; every worker starts
      from ``params``.
    local: ``(state, grads_W) -> (state, report)``: one inner step on every
      worker, with any per-step communication.
    sync: ``(state) -> (state, report)``: the periodic communication, or None.
    step: ``(state, grads_W) -> (state, report)``: ``local`` plus ``sync`` when
      due, selected with ``lax.cond``.
    global_params: ``(state) -> params``: the shared model that evaluation uses.
    channels: ``(params, num_workers) -> {name: Channel}``: static byte cost of
      one event of each channel that ``local``/``sync`` report.
    config: JSON-able description (name and hyperparameters).
    overlap_steps: how many inner steps after a sync its result is first
      needed (Streaming DiLoCo's delay tau): the simulated clock overlaps the
      sync's communication with that many steps. None: the strategy needs it
      at once, and the network's ``overlap`` decides.
    outer_places: where each outer optimizer's state lives: optimizer name
      (``"outer"``, hierarchical DiLoCo's ``"global_outer"``) -> the field
      of the ``comm`` state holding it; ``{}`` for a strategy without one.
      Traced outer hyperparameters (``outer_lr``, ``global_outer_lr``) are
      set there and nowhere else. None (a strategy that does not say): the
      whole ``comm`` state is searched for ``outer_lr``.
    replicated: every worker applies the plain mean of the workers' raw
      gradients every step (DDP without a codec), so all workers hold the
      same parameters and optimizer state. The engine may then keep one
      replica and compute the gradient of the mean loss over all W*b
      examples directly (``init`` called with ``num_workers=1``, ``local``
      given that gradient with a leading axis of 1); it does so unless a
      fault or straggler mask or a device mesh needs the workers apart.
    asynchronous: H of an asynchronous strategy (``period`` 1): the engine
      schedules each worker's H inner steps on its own clock, masks the
      steps a slower worker has not reached, and runs ``sync`` after every
      step for the workers whose pseudo-gradients have arrived
      (``transforms.participants()``; see ``simulation._pace``). None: the
      workers move in lock step.
    time_budget: DyLU (arXiv 2401.09135; "weighted": the sync's mean
      weighted by the steps each worker took): each worker takes the inner steps
      its speed allows in the time the fastest takes for H, floor(H x its
      speed / the fastest's), at least 1.
    syncer: an asynchronous strategy's merge rule (``Quorum`` of
      ``decoupled_diloco``: a minimum quorum, a grace window, token
      weights): the engine holds the arrivals at the syncer until it says
      to merge them. None: every step's arrivals are merged at once.
    pull: ``(state, mask_W) -> state``: an asynchronous strategy's restart
      of the workers in ``mask_W`` (this device's) from the server's model,
      for workers back from a fault window; None for the others.
    send: ``(state, mask_W) -> state``: what an asynchronous strategy keeps
      of the workers in ``mask_W`` when they send their round (Decoupled
      DiLoCo, whose workers go on computing); None: nothing.
    inner: the optimizer the workers apply in their inner steps (what a
      paired DDP lane, ``shadow="ddp"``, applies to the mean gradient), or
      None for a strategy whose update is not a plain optimizer step on a
      gradient (DeMo).
    traceable_period: the round is ``period`` local steps then one sync,
      and nothing else depends on the period (DiLoCo and the strategies
      built on its round): a build may then make H a traced value
      (``lowbw.build(config, traced=("H",))``), the round a fixed number of
      step slots of which the first H run.
    clients: every sync puts the global model on every worker, and a
      worker keeps nothing between rounds but its inner optimizer's state
      (FedAvg, DiLoCo, FedAdam): its workers may be clients drawn afresh
      each round from a population (``clients=M``, ``sampled_clients``).
  """

  name: str
  period: int
  init: Callable[[Params, int, PRNGKey], StrategyState]
  local: Callable[[StrategyState, PyTree], tuple[StrategyState, CommReport]]
  sync: Callable[[StrategyState], tuple[StrategyState, CommReport]] | None
  step: Callable[[StrategyState, PyTree], tuple[StrategyState, CommReport]]
  global_params: Callable[[StrategyState], Params]
  channels: Callable[[Params, int], dict[str, Channel]]
  config: dict[str, Any]
  overlap_steps: int | None = None
  replicated: bool = False
  outer_places: dict[str, str] | None = None
  asynchronous: int | None = None
  time_budget: bool | str = False
  syncer: Any = None
  pull: Callable[[StrategyState, Array], StrategyState] | None = None
  send: Callable[[StrategyState, Array], StrategyState] | None = None
  inner: optax.GradientTransformation | None = None
  traceable_period: bool = False
  clients: bool = False

  def __repr__(self):
    """The factory call it describes, e.g. ``diloco(H=30, inner=adamw(...),
    outer=sgd(...), codec=None, ...)``, not its functions."""
    fields = {k: v for k, v in self.config.items() if k != "name"}
    return f"{self.name}(" + ", ".join(
        f"{k}={_shown(v)}" for k, v in fields.items()) + ")"


def _shown(value) -> str:
  """An optimizer's config (``{"hyperparams": {...}}``) as
  ``(learning_rate=0.7, momentum=0.9)``; other values as their repr."""
  if isinstance(value, dict) and set(value) == {"hyperparams"}:
    return "optimizer(" + ", ".join(
        f"{k}={v:g}" if isinstance(v, float) else f"{k}={v!r}"
        for k, v in value["hyperparams"].items()) + ")"
  return repr(value)


def default_inner() -> optax.GradientTransformation:
  """AdamW with DiLoCo's inner hyperparameters (arXiv 2311.08105): lr 4e-4,
  weight decay 0.1. Wrapped in ``inject_hyperparams`` so the learning rate is a
  state leaf: logged as ``lr`` and changeable without recompiling."""
  return _optim.inner(_optim.DILOCO_INNER)


def optimizer(field: str, tx, default) -> optax.GradientTransformation:
  """``tx``, or ``default()`` when None; ``optax.MultiSteps`` (gradient
  accumulation) is unwrapped to its transformation; anything else than an
  optax transformation is rejected at build time, naming ``field``."""
  tx = default() if tx is None else tx
  if isinstance(tx, optax.MultiSteps):
    tx = tx.gradient_transformation()
  if not isinstance(tx, optax.GradientTransformation):
    raise _validate.fail(field, tx, "expected an optax.GradientTransformation")
  return tx


def events(**counts) -> CommReport:
  """A report: how many events of each channel happened (per worker)."""
  return {name: jnp.asarray(c, jnp.int32) for name, c in counts.items()}


def metrics(**values) -> CommReport:
  """Report entries that are the strategy's own metrics (float32 scalars,
  not channels): the engine logs them as ``strategy_<name>`` columns."""
  return {name: jnp.asarray(v, jnp.float32) for name, v in values.items()}


def inner_init(inner: optax.GradientTransformation, params: Params,
               num_workers: int, key: PRNGKey, comm: PyTree) -> StrategyState:
  """A state where every worker holds ``params`` and a fresh inner state."""
  params_W = broadcast_to_workers(params, num_workers)
  return StrategyState(
      step=jnp.zeros((), jnp.int32),
      params_W=params_W,
      inner_W=per_worker(inner).init(params_W),
      comm=comm,
      key=key,
  )


def inner_update(inner: optax.GradientTransformation, state: StrategyState,
                 grads_W: PyTree) -> StrategyState:
  """One inner optimizer step on every worker; advances the step counter."""
  updates_W, inner_W = per_worker(inner).update(grads_W, state.inner_W,
                                                state.params_W)
  return state._replace(
      step=state.step + 1,
      params_W=optax.apply_updates(state.params_W, updates_W),
      inner_W=inner_W,
  )


def mean_of_workers(state: StrategyState) -> Params:
  """Global parameters of strategies without a server model: the mean of the
  (participating) workers."""
  return worker_mean(state.params_W)


def comm_key(state: StrategyState) -> PRNGKey:
  """The codec key of this step's messages: shared by all workers, fresh
  every step (random-k positions, stochastic rounding)."""
  return jax.random.fold_in(jax.random.fold_in(state.key, 0xC0DEC), state.step)


def payload_bytes(tree: PyTree) -> int:
  """Exact bytes of a tree of arrays (or ShapeDtypeStructs) sent as is."""
  return sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(tree))


def nothing_reported(shape) -> Array:
  """A report entry when the communication did not happen: no events, and
  nan for a metric (the log keeps the last value reported)."""
  if jnp.issubdtype(shape.dtype, jnp.floating):
    return jnp.full(shape.shape, jnp.nan, shape.dtype)
  return jnp.zeros(shape.shape, shape.dtype)


def compose_step(local, sync, period: int):
  """``local`` then, when the counter hits a multiple of ``period``, ``sync``."""
  if sync is None:
    return local

  def step(state, grads_W):
    state, report = local(state, grads_W)
    # A notebook's participation mask (if any) goes into the cond as an
    # operand and is set again inside the branch.
    mask = participants()

    def due(state, mask):
      return call_participating(mask, sync, state)

    sync_shape = jax.eval_shape(due, state, mask)[1]
    no_sync = jax.tree.map(nothing_reported, sync_shape)
    state, sync_report = jax.lax.cond(
        state.step % period == 0, due, lambda s, m: (s, no_sync), state, mask)
    return state, {**report, **sync_report}

  return step


class Parts(NamedTuple):
  """The pure functions a strategy is made of (``make``); each as the
  ``Strategy`` attribute of the same name."""

  init: Callable[[Params, int, PRNGKey], StrategyState]
  local: Callable[[StrategyState, PyTree], tuple[StrategyState, CommReport]]
  sync: Callable[[StrategyState], tuple[StrategyState, CommReport]] | None
  global_params: Callable[[StrategyState], Params]
  channels: Callable[[Params, int], dict[str, Channel]]


def make(name: str, period: int, parts: Parts, config: dict[str, Any],
         **options) -> Strategy:
  """A ``Strategy`` of ``parts``, its ``step`` composed of ``local`` and
  ``sync``.

  ``options`` are ``Strategy``'s optional attributes (``overlap_steps``,
  ``replicated``, ``outer_places``, ``asynchronous``, ``time_budget``,
  ``inner``, ``traceable_period``, ``clients``), passed to it as they are, except that ``outer_places``
  defaults to ``{}``: a strategy built here says where its outer optimizers
  live, and one that names none has none.
  """
  # The options are Strategy's own keywords rather than restated here, so
  # that their meaning and defaults live in one place (its docstring).
  options["outer_places"] = dict(options.get("outer_places") or {})
  return Strategy(name, period, parts.init, parts.local, parts.sync,
                  compose_step(parts.local, parts.sync, period),
                  parts.global_params, parts.channels, config, **options)


def describe(tx: optax.GradientTransformation | None) -> dict | None:
  """A JSON-able description of an optax transformation for config.json.

  Hyperparameters are visible when the transformation was built with
  ``optax.inject_hyperparams`` (as lowbw's defaults and CLI do); otherwise the
  transformation is opaque and described as such.
  """
  if tx is None:
    return None
  try:  # known: the same transformation, described before
    return _copy_description(_DESCRIBED[tx])
  except (KeyError, TypeError):  # new, or unhashable
    pass
  described = _describe(tx)
  try:
    _DESCRIBED[tx] = described
  except TypeError:
    return described
  if len(_DESCRIBED) > 256:
    _DESCRIBED.pop(next(iter(_DESCRIBED)))
  return _copy_description(described)


# Transformation -> its description: describing one runs its ``init`` op by
# op (about 3 ms), and a study's points describe the same few optimizers
# (the config layer makes one object per distinct setting,
# ``config._strategy_fields``). Keyed by the object (its functions'
# identity), which the entry keeps alive.
_DESCRIBED: dict = {}


# A value of ``_init_traced``'s state that ``init`` computes (not a
# constant).
_COMPUTED = type("Computed", (), {"__repr__": lambda self: "<computed>"})()


def _init_traced(tx):
  """``tx.init``'s state on a float32 2-vector, traced: each leaf that is a
  constant of the trace (a hyperparameter) as its value, the others
  ``_COMPUTED``."""
  closed, shape = jax.make_jaxpr(tx.init, return_shape=True)(
      jax.ShapeDtypeStruct((2,), jnp.float32))
  leaves = [v.val if isinstance(v, jax_core.Literal) else _COMPUTED
            for v in closed.jaxpr.outvars]
  return jax.tree.unflatten(jax.tree.structure(shape), leaves)


def _init_run(tx):
  return tx.init(jnp.zeros((2,)))


def _copy_description(d: dict) -> dict:
  return {k: dict(v) if isinstance(v, dict) else v for k, v in d.items()}


def _describe(tx: optax.GradientTransformation) -> dict:
  # Traced first: the hyperparameters are constants of ``init``, read
  # without compiling anything (running ``init`` op by op compiled a
  # handful of small programs in every fresh process, 0.1 s of a warm
  # start); run where one is computed (a schedule's rate at step 0).
  return _describe_with(tx, (_init_traced, _init_run))


def _describe_with(tx, inits) -> dict:
  """The description from the first of ``inits`` whose state holds every
  hyperparameter's value."""
  for init in inits:
    try:
      state = init(tx)
      hyper = optax.tree_utils.tree_get(state, "hyperparams")
    except Exception:  # several or none found, or init needs real params
      hyper = None
    if not isinstance(hyper, dict):
      continue
    try:  # a scheduled rate (peak_schedule): learning_rate is set every step
      peak = optax.tree_utils.tree_get(state, "peak_lr")
    except Exception:  # several
      peak = None
    if peak is not None:
      hyper = {**hyper, "peak_lr": peak}
    if not any(v is _COMPUTED for v in hyper.values()):
      break
  else:
    return {"hyperparams": "not exposed (wrap with optax.inject_hyperparams)"}
  # float32 hyperparameters, printed to float32 precision (0.9, not 0.8999...).
  return {"hyperparams": {k: float(f"{float(v):.7g}") if jnp.ndim(v) == 0
                          else repr(v) for k, v in hyper.items()}}
