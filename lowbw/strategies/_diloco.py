"""DiLoCo: distributed low-communication training (Douillard et al., 2023,
arXiv 2311.08105), with compressed pseudo-gradients and error feedback as in
MuLoCo's Algorithm 1 (Thérien et al., 2025, arXiv 2505.23725)."""

from typing import NamedTuple

import optax

from lowbw import _validate
from lowbw._types import Params, PyTree
from lowbw.strategies import _base, _delayed, _optim, _spec
from lowbw.strategies._pseudo_gradient import mean_pseudo_gradient
from lowbw.transforms import (Codec, Compression, broadcast_to_workers,
                              comm_channel, compression, num_workers)
from lowbw.transforms._compression import init_residual


class DiLoCoComm(NamedTuple):
  """DiLoCo's communication state.

  Attributes:
    global_params: the shared model theta.
    outer_state: the outer optimizer's state.
    residual_W: per-worker error-feedback residuals, ``()`` without feedback.
  """

  global_params: Params
  outer_state: PyTree
  residual_W: PyTree


def default_outer() -> optax.GradientTransformation:
  """DiLoCo's outer optimizer: SGD, lr 0.7, Nesterov momentum 0.9."""
  return _optim.outer(_optim.DILOCO_OUTER)


def diloco_init(inner, outer, comp: Compression):
  def init(params, num_workers_, key):
    state = _base.inner_init(inner, params, num_workers_, key, ())
    return state._replace(comm=DiLoCoComm(
        params, outer.init(params), init_residual(comp, state.params_W)))
  return init


def outer_step(outer: optax.GradientTransformation, comp: Compression):
  """The outer step of the DiLoCo family, on any tree of tensors (the whole
  model, one of Streaming DiLoCo's fragments, or hierarchical DiLoCo's group
  models), with ``outer`` and ``comp`` in its closure.

  Each worker's pseudo-gradient is global - theta_w. Each goes through the
  message chain (the codec, after its error-feedback residual is added); the
  participants' mean of what the receivers decode is fed to the outer
  optimizer as a gradient of the global parameters.

  Returns:
    ``step(global_params, params_W, outer_state, message_W, key,
    active_W=None, senders_W=None) -> (new global parameters, outer state,
    message states, the mean pseudo-gradient)``. ``active_W`` and
    ``senders_W`` are ``transmit``'s (who takes part, whose noise a worker
    encodes with); None: the engine's participants, each worker its own.
  """

  def step(global_params: PyTree, params_W: PyTree, outer_state: PyTree,
           message_W: PyTree, key, active_W=None, senders_W=None) -> tuple:
    pseudo_grad, message_W = mean_pseudo_gradient(
        comp, global_params, params_W, message_W, key, active_W, senders_W)
    updates, outer_state = outer.update(pseudo_grad, outer_state,
                                        global_params)
    return (optax.apply_updates(global_params, updates), outer_state,
            message_W, pseudo_grad)

  return step


def diloco_sync(outer: optax.GradientTransformation, comp: Compression):
  """The DiLoCo outer step (``outer_step``) on a state whose ``comm`` is a
  ``DiLoCoComm``; every worker restarts from the new global parameters.
  Reports the norm of the mean pseudo-gradient, ``pseudo_grad_norm``, as
  its own metric.
  """

  step = outer_step(outer, comp)

  def sync(state):
    c = state.comm
    global_params, outer_state, residual_W, pseudo_grad = step(
        c.global_params, state.params_W, c.outer_state, c.residual_W,
        _base.comm_key(state))
    return state._replace(
        params_W=broadcast_to_workers(global_params,
                                      num_workers(state.params_W)),
        comm=DiLoCoComm(global_params, outer_state, residual_W),
    ), {**_base.events(pseudo_gradients=1),
        **_base.metrics(pseudo_grad_norm=optax.tree.norm(pseudo_grad))}

  return sync


def diloco_channels(comp: Compression):
  def channels(params, num_workers_):
    return {"pseudo_gradients": comm_channel(comp, params, num_workers_)}
  return channels


def global_of(state):
  return state.comm.global_params


# outer_delay, eager -> (init, sync(outer, comp, H), global params, where
# the outer state is)
_VARIANTS = {
    (0, False): (diloco_init, lambda o, c, H: diloco_sync(o, c), global_of,
                 "outer_state"),
    (1, False): (_delayed.delayed_init, _delayed.delayed_sync, global_of,
                 "outer_state"),
    (1, True): (_delayed.eager_init, lambda o, c, H: _delayed.eager_sync(o, c),
                _delayed.eager_global, "outer_state_W"),
}


class Variant(NamedTuple):
  """How a DiLoCo-family strategy departs from DiLoCo's round (``build``).

  Attributes:
    outer_delay: 1: each outer step applies the previous round's mean, so
      the sync's communication overlaps the next round (the clock hides it
      behind that round's H steps); 0: this round's.
    eager: each worker mixes in its own fresh pseudo-gradient
      (``_delayed``; needs ``outer_delay`` 1).
    dylu: time-budgeted rounds (``Strategy.time_budget``): False, True, or
      "weighted".
  """

  outer_delay: int = 0
  eager: bool = False
  dylu: bool | str = False


def build(name: str, inner, outer, H: int, comp: Compression,
          variant: Variant = Variant(), clients: bool = False
          ) -> _base.Strategy:
  """A DiLoCo-family strategy from validated parts (DiLoCo, MuLoCo);
  ``clients``: its workers may be sampled clients (``Strategy.clients``)."""
  outer_delay, eager, dylu = variant
  init, sync, global_params, place = _VARIANTS[outer_delay, eager]
  return _base.make(
      name, H, _base.Parts(
          init(inner, outer, comp),
          lambda s, g: (_base.inner_update(inner, s, g), {}),
          sync(outer, comp, H), global_params, diloco_channels(comp)),
      {"name": name, "inner": _base.describe(inner),
       "outer": _base.describe(outer), "H": H, **comp.config,
       **({"outer_delay": outer_delay} if outer_delay else {}),
       **({"eager": True} if eager else {}),
       **({"dylu": True} if dylu else {}),
       **({"dylu_weighted": True} if dylu == "weighted" else {})},
      overlap_steps=H if outer_delay else None,
      outer_places={"outer": place}, time_budget=dylu,
      inner=inner, traceable_period=variant == Variant(), clients=clients)


def diloco(
    inner: optax.GradientTransformation | None = None,
    outer: optax.GradientTransformation | None = None,
    H: int = 100,
    codec: Codec | str | None = None,
    error_feedback: float | None = None,
    message: optax.GradientTransformation | None = None,
    aggregation: str = "all_gather",
    outer_delay: int = 0,
    eager: bool = False,
    dylu: bool = False,
    dylu_weighted: bool = False,
    robust: str = "mean",
) -> _base.Strategy:
  """DiLoCo: H local inner steps, then an outer step on the mean pseudo-gradient.

  Defaults follow arXiv 2311.08105: inner AdamW (lr 4e-4, weight decay 0.1),
  outer SGD with Nesterov momentum (lr 0.7, momentum 0.9). The paper's main runs
  use H = 500; the default here is H = 100, better suited to short simulations.
  With outer SGD(lr=1, no momentum) DiLoCo is FedAvg.

  With a ``codec`` the pseudo-gradients are compressed before they are
  averaged, and ``error_feedback`` beta keeps what compression dropped for the
  next round (MuLoCo's Algorithm 1; its AdamW-DiLoCo tuned beta is 0.7).

  Bytes per worker and sync: payload = the pseudo-gradient (4 bytes x P in
  float32, or the codec's payload); wire = 2(W-1)/W x payload (ring
  all-reduce), or (W-1) x payload for codecs that must be all-gathered.

  Args:
    inner: per-worker optimizer, state kept across rounds.
    outer: optimizer of the global parameters, fed the mean pseudo-gradient.
    H: inner steps per round (>= 1).
    codec: a ``lowbw.transforms`` codec (or spec string) for the
      pseudo-gradients, or None.
    error_feedback: residual decay beta in [0, 1] (needs a codec), or None.
    message: the per-worker message chain replacing codec's default one (an
      optax transformation ending in ``codec``'s round trip; see
      docs/codecs/custom.md), or None.
    aggregation: how a codec's payloads that cannot be summed are combined:
      "all_gather" ((W-1) x payload per worker) or "reduce_scatter" (a
      quantized all-reduce: the mean is encoded again, 2(W-1)/W x payload).
    outer_delay: 0 (default): the outer step applies this round's mean.
      1: it applies the previous round's, so each sync's communication
      overlaps the next round's H inner steps (the clock hides it there):
      the delayed outer gradients of Kale et al. 2025, "Eager Updates For
      Overlapped Communication and Computation in DiLoCo", arXiv 2502.12996
      (Algorithm 2), DiLoCoX's one-step delay (arXiv 2506.21263). The first
      sync applies nothing; the last round's mean is still in flight when
      the run ends (the final model does not include it).
    eager: with ``outer_delay=1``, the paper's eager updates (Algorithm 3):
      each worker keeps its own outer model and optimizer state and steps
      on the previous round's mean with its own stale pseudo-gradient
      replaced by its fresh one, mean(t-1) + (own(t) - own(t-1)) / W; the
      evaluated model is the workers' mean. With one worker it is DiLoCo.
      Under faults the swap keeps its 1/W weight while the mean is over
      the participants (the paper has no faults).
    dylu: time-budgeted rounds, the dynamic local updates of Liu et al.
      2024 (arXiv 2401.09135): on a fleet of unequal speeds each worker
      takes floor(H x its speed / the fastest's) of the round's H inner
      steps (at least 1, spread evenly), so every worker is done when the
      fastest is; the steps it skips never happen. The mean pseudo-
      gradient is unweighted. Without hardware speeds it changes nothing.
    dylu_weighted: with ``dylu``, the mean pseudo-gradient weighted by the
      inner steps each worker took in the round (sum h_w delta_w / sum h_w),
      as the paper's option.
    robust: "mean" (the paper's), "median" (coordinate-wise) or
      "trimmed_mean" ("trimmed_mean:F": F of the workers cut from each end
      of every coordinate, default 0.2): an aggregation that resists
      Byzantine workers (``lowbw.network.Faults(byzantine=...)``). Each
      worker then needs every other's pseudo-gradient, so they are
      all-gathered: (W-1) x payload per worker.

  Example:
    >>> strategy = lowbw.strategies.diloco(
    ...     inner=optax.adamw(1e-3),
    ...     outer=optax.sgd(0.7, momentum=0.9, nesterov=True), H=20,
    ...     codec=lowbw.transforms.quantize(4), error_feedback=0.7)
  """
  inner = _base.optimizer("inner", inner, _base.default_inner)
  outer = _base.optimizer("outer", outer, default_outer)
  H = _validate.positive_int("H", H)
  if isinstance(outer_delay, bool) or outer_delay not in (0, 1):
    raise _validate.fail("outer_delay", outer_delay, "expected 0 or 1 (the "
                         "outer step one round late)")
  for field, value in (("eager", eager), ("dylu", dylu),
                       ("dylu_weighted", dylu_weighted)):
    _validate.boolean(field, value)
  if dylu_weighted and not dylu:
    raise _validate.fail("dylu_weighted", dylu_weighted, "needs dylu=True "
                         "(it weights the mean by the steps DyLU allows)")
  if dylu_weighted and robust != "mean":
    raise _validate.fail("dylu_weighted", dylu_weighted, f"a weighted mean "
                         f"and robust={robust!r} are two aggregations; "
                         "choose one")
  if eager and not outer_delay:
    raise _validate.fail("eager", eager, "needs outer_delay=1 (it mixes the "
                         "delayed mean with each worker's fresh "
                         "pseudo-gradient)")
  return build("diloco", inner, outer, H,
               compression(codec, error_feedback, message, aggregation,
                           robust),
               Variant(outer_delay, eager,
                       "weighted" if dylu_weighted else dylu), clients=True)


SPEC = _spec.spec(
    diloco, inner=_optim.DILOCO_INNER, outer=_optim.DILOCO_OUTER,
    paper="Douillard et al. 2023, arXiv 2311.08105",
    where="§3 and its hyperparameter table: inner AdamW lr 4e-4, weight decay 0.1; outer Nesterov lr 0.7, momentum 0.9; H=100 is lowbw's (the paper's is 500)",
    help={"codec": "codec of the pseudo-gradients",
          "outer_delay": "1: each outer step applies the previous round's "
          "mean pseudo-gradient, overlapping the sync's communication with "
          "the next round (arXiv 2502.12996, Algorithm 2)",
          "eager": "with --outer-delay 1: each worker mixes its own fresh "
          "pseudo-gradient into the delayed mean (eager updates, arXiv "
          "2502.12996, Algorithm 3)"})
