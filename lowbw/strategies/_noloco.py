"""NoLoCo: DiLoCo without an all-reduce; every round each worker averages
with one random peer (Kolehmainen et al., 2025, "NoLoCo: No-all-reduce Low
Communication Training Method for Large Models", arXiv 2506.10911).

Each worker i keeps its own outer (slow) weights phi_i and outer momentum;
its inner steps move its fast weights theta_i. Every H steps the workers are
paired by a fresh random matching (from the run's key), and with G_i the pair
of worker i and means over it:

  d_i   = mean_G(theta) - mean_G(phi) + pull (mean_G(phi) - phi_i)
  m_i  <- beta m_i + alpha d_i              (heavy-ball momentum)
  phi_i <- phi_i + m_i ;  theta_i <- phi_i

The first term is the pair's mean step (DiLoCo's pseudo-gradient, pair-wide);
the second pulls each worker towards the pair's mean model, which is what
keeps the workers together without a global average. With the authors'
pull = 1 it is d_i = mean_G(theta) - phi_i: a worker needs only its peer's
fast weights.
"""

from typing import NamedTuple

import jax
import optax

from lowbw import _validate
from lowbw._types import Params, PyTree
from lowbw.network import channel
from lowbw.strategies import _base, _gossip, _optim, _spec
from lowbw.strategies._gossip import pairs
from lowbw.transforms import (broadcast_to_workers, group_mean, participants,
                              per_worker, worker_mean)
from lowbw.transforms._reductions import total_workers


class NoLoCoComm(NamedTuple):
  """Every worker's outer weights and outer optimizer state."""

  outer_params_W: Params
  outer_state_W: PyTree


def noloco_sync(outer: optax.GradientTransformation, H: int, pull: float):

  def sync(state):
    c = state.comm
    perm = pairs(state.key, state.step, H, total_workers(state.params_W))
    fast = group_mean(state.params_W, perm, 2)
    if pull == 1.0:  # mean(theta) - phi_i: the peer's fast weights alone
      step_W = optax.tree.sub(fast, c.outer_params_W)
    else:
      slow = group_mean(c.outer_params_W, perm, 2)
      step_W = jax.tree.map(
          lambda f, s, p: f - s + pull * (s - p), fast, slow,
          c.outer_params_W)
    # optax's SGD steps along minus its input: feed minus the step.
    updates_W, outer_state_W = per_worker(outer).update(
        optax.tree.scale(-1.0, step_W), c.outer_state_W, c.outer_params_W)
    active = participants()
    # A worker that sat out keeps its state and goes on from where it was.
    outer_params_W = _gossip.kept(active, optax.apply_updates(
        c.outer_params_W, updates_W), c.outer_params_W)
    outer_state_W = _gossip.kept(active, outer_state_W, c.outer_state_W)
    params_W = _gossip.kept(active, outer_params_W, state.params_W)
    return state._replace(
        params_W=params_W, comm=NoLoCoComm(outer_params_W, outer_state_W)
    ), _base.events(pairs=1)

  return sync


def noloco(
    inner: optax.GradientTransformation | None = None,
    outer: optax.GradientTransformation | None = None,
    H: int = 50,
    pull: float = 1.0,
) -> _base.Strategy:
  """NoLoCo: H local steps, then each worker averages with one random peer
  and takes an outer momentum step with a pull towards the pair's mean.

  Defaults follow the authors' configuration of arXiv 2506.10911 (their code
  release's NoLoCo configurations): pairs (groups of 2), H = 50, outer
  learning rate 0.7 with heavy-ball momentum 0.5, the pull's coefficient
  equal to the outer learning rate (``pull=1``); inner Adam at lr 6e-4 (their
  125M model), gradients clipped to norm 1, cosine decay to 0.1x (1,000
  warm-up steps there; none by default here). Headline: DiLoCo's loss, up
  to 4 % faster convergence, with no global collective.

  Bytes per worker and sync: its fast weights to its peer (B; one hop, no
  collective); with ``pull`` other than 1 its outer weights as well (2B).
  Evaluation uses the workers' mean outer model; the workers' own models
  differ (``worker_divergence``).

  Args:
    inner: per-worker optimizer.
    outer: per-worker optimizer of each worker's outer weights, fed minus
      its step d_i (default SGD, lr 0.7, heavy-ball momentum 0.5).
    H: inner steps per round (>= 1).
    pull: gamma / alpha, the pull towards the pair's mean model relative to
      the outer learning rate (>= 0; the authors' 1).

  Example:
    >>> strategy = lowbw.strategies.noloco(H=30)
  """
  inner = _base.optimizer("inner", inner, lambda: _optim.inner(
      _optim.NOLOCO_INNER))
  outer = _base.optimizer("outer", outer, lambda: _optim.outer(
      _optim.NOLOCO_OUTER))
  H = _validate.positive_int("H", H)
  pull = _validate.non_negative("pull", pull)

  def init(params, num_workers_, key):
    if num_workers_ < 2 or num_workers_ % 2:
      raise _validate.fail("workers", num_workers_, "noloco pairs the "
                           "workers every round: give an even number, >= 2")
    state = _base.inner_init(inner, params, num_workers_, key, ())
    outer_W = broadcast_to_workers(params, num_workers_)
    return state._replace(comm=NoLoCoComm(
        outer_W, per_worker(outer).init(outer_W)))

  def channels(params, num_workers_):
    copies = 1 if pull == 1.0 else 2
    return {"pairs": channel("pairwise", copies * _base.payload_bytes(params),
                             2)}

  return _base.make(
      "noloco", H, _base.Parts(
          init, lambda s, g: (_base.inner_update(inner, s, g), {}),
          noloco_sync(outer, H, pull),
          lambda s: worker_mean(s.comm.outer_params_W), channels),
      {"name": "noloco", "inner": _base.describe(inner),
       "outer": _base.describe(outer), "H": H, "pull": pull},
      outer_places={"outer": "outer_state_W"},
      inner=inner)


SPEC = _spec.spec(
    noloco, inner=_optim.NOLOCO_INNER, outer=_optim.NOLOCO_OUTER,
    paper="Kolehmainen et al. 2025, arXiv 2506.10911",
    help={"pull": "the pull towards the pair's mean model, as a multiple of "
                  "the outer learning rate (>= 0; 1: only fast weights are "
                  "sent)"})
