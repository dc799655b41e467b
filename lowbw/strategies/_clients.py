"""Sampled clients: a round's workers are clients drawn from a population,
each keeping nothing between the rounds it is drawn for (FedAvg, McMahan et
al. 2017, arXiv 1602.05629: clients start each round from the global model).

The worker slots of a run host different clients every round, so what a slot
keeps past a sync would be another client's: the parameters are the global
model again after every FedAvg or DiLoCo sync, and ``sampled_clients`` gives
the inner optimizer a fresh state there too.
"""

import optax

from lowbw import _validate
from lowbw.strategies import _base
from lowbw.strategies._schedule import PeakScheduleState
from lowbw.transforms import per_worker


def client_strategies() -> tuple[str, ...]:
  """The registered strategies whose workers may be sampled clients (those
  whose defaults build a ``Strategy.clients`` strategy), for messages."""
  return strategies_with("clients")


def strategies_with(attribute: str) -> tuple[str, ...]:
  """The registered strategies whose defaults build a strategy with
  ``attribute`` set (``Strategy.clients``, ``Strategy.traceable_period``),
  for messages that name them."""
  from lowbw.strategies import SPECS  # the registry imports this module
  key = (attribute, tuple(SPECS))
  if key not in _NAMES_WITH:
    _NAMES_WITH[key] = tuple(name for name, spec in SPECS.items()
                             if _builds_with(spec, attribute))
  return _NAMES_WITH[key]


_NAMES_WITH: dict = {}  # (attribute, registered names) -> names with it


def _builds_with(spec, attribute: str) -> bool:
  try:
    return bool(getattr(spec.factory(), attribute))
  except Exception:  # noqa: BLE001 -- a factory that needs arguments
    return False


def fresh_inner(old, new):
  """The inner optimizer state of a client drawn afresh: ``new`` (an
  ``init``), except what belongs to the run rather than to a client, taken
  from ``old``: injected hyperparameters (a traced learning rate), their
  step count, and a ``peak_schedule``'s step count and peak (the schedule
  follows the run's steps). Moments, Adam's bias-correction count and
  momentum buffers start again."""
  if isinstance(old, PeakScheduleState):
    return old._replace(inner_state=fresh_inner(old.inner_state,
                                                new.inner_state))
  if isinstance(old, optax.InjectStatefulHyperparamsState):
    return old._replace(inner_state=fresh_inner(old.inner_state,
                                                new.inner_state))
  if isinstance(old, tuple) and hasattr(old, "_fields"):  # a NamedTuple
    return type(old)(*(fresh_inner(o, n) for o, n in zip(old, new)))
  if isinstance(old, (tuple, list)):  # a chain's states
    return type(old)(fresh_inner(o, n) for o, n in zip(old, new))
  if isinstance(old, dict):  # a partition's states
    return {k: fresh_inner(old[k], new[k]) for k in old}
  return new


def sampled_clients(strategy: _base.Strategy) -> _base.Strategy:
  """``strategy`` with each sync followed by a fresh inner optimizer state
  (``fresh_inner``) on every worker: the workers of the next round are
  other clients.

  Args:
    strategy: one whose sync puts the global model on every worker
      (``Strategy.clients``: FedAvg, DiLoCo, FedAdam).

  Returns:
    The same strategy (name, channels, config) with the new ``sync`` and
    ``step``.

  Example:
    >>> s = lowbw.strategies.sampled_clients(lowbw.strategies.fedavg(H=10))
  """
  if not strategy.clients or strategy.inner is None:
    raise _validate.fail(
        "strategy", strategy.name, "sampled clients (clients=M) need one of "
        + ", ".join(client_strategies()) + ", whose workers keep nothing "
        "but the inner optimizer between rounds")
  tx = per_worker(strategy.inner)
  sync = strategy.sync

  def client_sync(state):
    state, report = sync(state)
    inner_W = fresh_inner(state.inner_W, tx.init(state.params_W))
    return state._replace(inner_W=inner_W), report

  return strategy._replace(
      sync=client_sync,
      step=_base.compose_step(strategy.local, client_sync, strategy.period))
