"""GASLoC: local updates, an outer step on every worker, then gossip with a
few peers instead of an all-reduce (Cagnasso, Belilovsky and Oyallon, 2026,
"Unifying Local Communications and Local Updates for LLM Pretraining",
arXiv 2606.11081).

Each worker i keeps its own outer weights phi_i and outer optimizer state;
its inner steps move its fast weights theta_i. Every H steps, with L the
Laplacian of the round's graph (unit weights on its edges):

  y_i   = phi_i + outer(phi_i - theta_i)    (its own outer step)
  phi_i <- y_i - rate (L y)_i + accel (y_i - y_i')   (y_i': last round's y_i)
  theta_i <- phi_i

(L y)_i = sum over i's peers j of (y_i - y_j): a worker needs its peers'
proposals y_j, one model copy from each. The outer optimizer's momentum is
the method's communication acceleration; ``accel`` is the paper's explicit
momentum on the proposals (0: none). With the complete graph and rate 1/W
the mix is the mean of the proposals: DiLoCo's average, whose outer
optimizer (per worker here) sees each worker's pseudo-gradient instead of
their mean, the same thing for a linear optimizer such as SGD with momentum.
"""

from typing import NamedTuple

import optax

from lowbw import _validate
from lowbw._types import Params, PyTree
from lowbw.network import channel
from lowbw.strategies import _base, _gossip, _optim, _spec
from lowbw.transforms import (broadcast_to_workers, participants, per_worker,
                              worker_mean)
from lowbw.transforms._reductions import total_workers


class GASLoCComm(NamedTuple):
  """Every worker's outer weights, outer optimizer state and last round's
  proposal (None without ``accel``)."""

  outer_params_W: Params
  outer_state_W: PyTree
  proposal_W: Params | None


def gasloc_sync(outer: optax.GradientTransformation, H: int, graph: str,
                rate: float, accel: float):

  def sync(state):
    c = state.comm
    peers_WK = _gossip.peers(graph, state.key, state.step, H,
                             total_workers(state.params_W))
    # optax steps along minus its input: the pseudo-gradient phi - theta.
    updates_W, outer_state_W = per_worker(outer).update(
        optax.tree.sub(c.outer_params_W, state.params_W), c.outer_state_W,
        c.outer_params_W)
    y_W = optax.apply_updates(c.outer_params_W, updates_W)
    active = participants()
    mixed_W = _gossip.mix(y_W, peers_WK, rate, active)
    proposal_W = None
    if accel:
      mixed_W = optax.tree.add_scale(
          mixed_W, accel, optax.tree.sub(y_W, c.proposal_W))
      proposal_W = _gossip.kept(active, y_W, c.proposal_W)
    # A worker that sat out keeps its state and goes on from where it was.
    outer_params_W = _gossip.kept(active, mixed_W, c.outer_params_W)
    outer_state_W = _gossip.kept(active, outer_state_W, c.outer_state_W)
    return state._replace(
        params_W=_gossip.kept(active, outer_params_W, state.params_W),
        comm=GASLoCComm(outer_params_W, outer_state_W, proposal_W),
    ), _base.events(gossip=1)

  return sync


def _rate(rate, graph: str, num_workers_: int) -> float:
  """The gossip step: 1/(K + 1) by default (each worker's new model is the
  mean of its own proposal and its K peers'); at most 1/K, where a worker's
  own weight in the mix, 1 - K rate, reaches 0."""
  k = _gossip.degree(graph, num_workers_)
  if rate is None:
    return 1.0 / (k + 1)
  if not 0.0 < rate <= 1.0 / k:
    raise _validate.fail("gossip", rate, f"expected 0 < gossip <= 1/K = "
                         f"{1.0 / k:g} (K = {k} peers in graph {graph!r})")
  return rate


def gasloc(
    inner: optax.GradientTransformation | None = None,
    outer: optax.GradientTransformation | None = None,
    H: int = 50,
    graph: str = "one_peer",
    gossip: float | None = None,
    accel: float = 0.0,
) -> _base.Strategy:
  """GASLoC: H local steps, an outer step on every worker, then gossip of
  the new models with a few peers (a random matching by default).

  The update follows arXiv 2606.11081 as far as it could be read (its
  method's equation: the outer step's proposal, minus the gossip step
  times the graph Laplacian applied to the proposals, plus a momentum on
  the proposals). Its hyperparameter tables could not be read: the
  defaults are lowbw's choices. Outer SGD at lr 0.7 with Nesterov momentum
  0.9 and inner AdamW at lr 4e-4 (DiLoCo's), H = 50, a fresh one-peer
  random matching every round, gossip 1/(K + 1), accel 0: with these and
  the complete graph, GASLoC is DiLoCo.

  Bytes per worker and sync: its proposal to each of its K peers, K B on
  the ``gossip`` channel, sent at once (one hop; no collective). Evaluation
  uses the workers' mean outer model; the workers' own models differ
  (``worker_divergence``).

  Args:
    inner: per-worker optimizer.
    outer: per-worker optimizer of each worker's outer weights, fed its
      pseudo-gradient phi_i - theta_i (default SGD, lr 0.7, Nesterov
      momentum 0.9).
    H: inner steps per round (>= 1).
    graph: who gossips with whom: ``one_peer`` (a fresh random matching),
      ``two_peer`` (a fresh random cycle: two peers each), ``ring`` (the
      fixed ring i - 1, i + 1) or ``complete`` (all the others).
    gossip: the gossip step, 0 < gossip <= 1/K for K peers; None: 1/(K + 1),
      the mean of a worker's and its peers' proposals.
    accel: momentum on the proposals, y_i - y_i' added to the mix (>= 0).

  Example:
    >>> strategy = lowbw.strategies.gasloc(H=30, graph="two_peer")
  """
  inner = _base.optimizer("inner", inner, lambda: _optim.inner(
      _optim.DILOCO_INNER))
  outer = _base.optimizer("outer", outer, lambda: _optim.outer(
      _optim.DILOCO_OUTER))
  H = _validate.positive_int("H", H)
  graph = _validate.one_of("graph", graph, _gossip.GRAPHS)
  if gossip is not None:
    gossip = _validate.positive_float("gossip", gossip)
    if graph != "complete":  # K known now; the complete graph's is W - 1
      _rate(gossip, graph, 0)
  accel = _validate.non_negative("accel", accel)

  def init(params, num_workers_, key):
    _gossip.check(graph, num_workers_)
    _rate(gossip, graph, num_workers_)
    state = _base.inner_init(inner, params, num_workers_, key, ())
    outer_W = broadcast_to_workers(params, num_workers_)
    return state._replace(comm=GASLoCComm(
        outer_W, per_worker(outer).init(outer_W),
        broadcast_to_workers(params, num_workers_) if accel else None))

  def sync(state):
    W = total_workers(state.params_W)
    return gasloc_sync(outer, H, graph, _rate(gossip, graph, W),
                       accel)(state)

  def channels(params, num_workers_):
    # K copies leave the worker's link together: one hop of K B.
    k = _gossip.degree(graph, num_workers_)
    return {"gossip": channel("pairwise", k * _base.payload_bytes(params),
                              2)}

  return _base.make(
      "gasloc", H, _base.Parts(
          init, lambda s, g: (_base.inner_update(inner, s, g), {}), sync,
          lambda s: worker_mean(s.comm.outer_params_W), channels),
      {"name": "gasloc", "inner": _base.describe(inner),
       "outer": _base.describe(outer), "H": H, "graph": graph,
       "gossip": gossip, "accel": accel},
      outer_places={"outer": "outer_state_W"},
      inner=inner)


SPEC = _spec.spec(
    gasloc, inner=_optim.DILOCO_INNER, outer=_optim.DILOCO_OUTER,
    paper="Cagnasso et al. 2026, arXiv 2606.11081",
    choices={"graph": _gossip.GRAPHS},
    where="the update of its method section as far as it could be read "
          "(outer step, then the Laplacian gossip step, momentum on the "
          "proposals); optimizers, H, graph and steps are lowbw's "
          "(DiLoCo's optimizers)",
    help={"graph": "who gossips with whom each round: one_peer (a random "
                   "matching), two_peer (a random cycle), ring or complete",
          "gossip": "the gossip step, in (0, 1/K] for K peers; none: "
                    "1/(K+1), the mean with the peers",
          "accel": "momentum on the outer proposals, >= 0 (0: the outer "
                   "optimizer's momentum alone)"})
