"""DiLoCo: distributed low-communication training (Douillard et al., 2023,
arXiv 2311.08105)."""

import optax

from lowbw import _validate
from lowbw.network import ring_allreduce
from lowbw.strategies import _base
from lowbw.transforms import broadcast_to_workers, num_workers, worker_mean


def default_outer() -> optax.GradientTransformation:
  """DiLoCo's outer optimizer: SGD, lr 0.7, Nesterov momentum 0.9."""
  return optax.inject_hyperparams(optax.sgd)(learning_rate=0.7, momentum=0.9,
                                             nesterov=True)


def diloco_sync(outer: optax.GradientTransformation):
  """The DiLoCo outer step on a state whose ``comm`` is (global, outer_state).

  Each worker's pseudo-gradient is global - theta_w; their mean is fed to the
  outer optimizer as a gradient of the global parameters, and every worker
  restarts from the new global parameters.
  """

  def sync(state):
    global_params, outer_state = state.comm
    w = num_workers(state.params_W)
    delta_W = optax.tree.sub(broadcast_to_workers(global_params, w),
                             state.params_W)
    updates, outer_state = outer.update(worker_mean(delta_W), outer_state,
                                        global_params)
    global_params = optax.apply_updates(global_params, updates)
    return state._replace(
        params_W=broadcast_to_workers(global_params, w),
        comm=(global_params, outer_state),
    ), _base.events(pseudo_gradients=1)

  return sync


def diloco_channels(params, num_workers_):
  return {"pseudo_gradients": ring_allreduce(_base.payload_bytes(params),
                                             num_workers_)}


def diloco(
    inner: optax.GradientTransformation | None = None,
    outer: optax.GradientTransformation | None = None,
    H: int = 100,
) -> _base.Strategy:
  """DiLoCo: H local inner steps, then an outer step on the mean pseudo-gradient.

  Defaults follow arXiv 2311.08105: inner AdamW (lr 4e-4, weight decay 0.1),
  outer SGD with Nesterov momentum (lr 0.7, momentum 0.9). The paper's main runs
  use H = 500; the default here is H = 100, better suited to short simulations.
  With outer SGD(lr=1, no momentum) DiLoCo is FedAvg.

  Bytes per worker and sync: payload = the pseudo-gradient (4 bytes x P in
  float32); wire = 2(W-1)/W x payload (ring all-reduce).

  Args:
    inner: per-worker optimizer, state kept across rounds.
    outer: optimizer of the global parameters, fed the mean pseudo-gradient.
    H: inner steps per round (>= 1).

  Example:
    >>> strategy = lowbw.strategies.diloco(
    ...     inner=optax.adamw(1e-3),
    ...     outer=optax.sgd(0.7, momentum=0.9, nesterov=True), H=20)
  """
  inner = _base.optimizer("inner", inner, _base.default_inner)
  outer = _base.optimizer("outer", outer, default_outer)
  H = _validate.positive_int("H", H)

  def init(params, num_workers_, key):
    return _base.inner_init(inner, params, num_workers_, key,
                            (params, outer.init(params)))

  def local(state, grads_W):
    return _base.inner_update(inner, state, grads_W), {}

  return _base.make(
      "diloco", H, init, local, diloco_sync(outer), lambda s: s.comm[0],
      diloco_channels,
      {"name": "diloco", "inner": _base.describe(inner),
       "outer": _base.describe(outer), "H": H})
