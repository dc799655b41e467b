"""Distributed training strategies: factories returning pure functions."""

from lowbw import _validate
from lowbw.strategies._base import (CommReport, Strategy, StrategyState,
                                    default_inner)
from lowbw.strategies._ddp import ddp
from lowbw.strategies._demo import demo
from lowbw.strategies._diloco import default_outer, diloco
from lowbw.strategies._fedavg import fedavg
from lowbw.strategies._muloco import hidden_matrices, muloco, muon_inner
from lowbw.strategies._schedule import PeakScheduleState, peak_schedule
from lowbw.strategies._sparta import sparta
from lowbw.strategies._sparta_diloco import sparta_diloco

REGISTRY = {
    "ddp": ddp,
    "fedavg": fedavg,
    "diloco": diloco,
    "sparta": sparta,
    "sparta_diloco": sparta_diloco,
    "muloco": muloco,
    "demo": demo,
}


def get(name: str, **kwargs) -> Strategy:
  """A strategy by registry name, e.g. ``get("diloco", H=50)``."""
  _validate.one_of("strategy", name, REGISTRY)
  return REGISTRY[name](**kwargs)


__all__ = [
    "CommReport", "REGISTRY", "Strategy", "StrategyState", "ddp", "demo",
    "default_inner", "default_outer", "diloco", "fedavg", "get",
    "hidden_matrices", "muloco", "muon_inner", "PeakScheduleState",
    "peak_schedule", "sparta", "sparta_diloco",
]
