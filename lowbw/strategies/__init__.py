"""Distributed training strategies: factories returning pure functions."""

from lowbw import _validate
from lowbw.strategies import (_optim, _async_diloco, _ddp, _demo, _desloc, _diloco, _fedadam, _fedavg,
                              _hierarchical_diloco, _muloco, _noloco, _sparseloco, _sparta,
                              _spes, _sparta_diloco, _streaming_diloco)
from lowbw.strategies._base import Strategy, StrategyState, default_inner
from lowbw.strategies._async_diloco import async_diloco, delayed_nesterov
from lowbw.strategies._clients import (client_strategies, sampled_clients,
                                      strategies_with)
from lowbw.strategies._ddp import ddp
from lowbw.strategies import _decoupled_diloco
from lowbw.strategies._decoupled_diloco import decoupled_diloco
from lowbw.strategies._demo import demo
from lowbw.strategies._desloc import desloc
from lowbw.strategies import _mtdao
from lowbw.strategies._mtdao import mtdao, multi_timescale
from lowbw.strategies._diloco import default_outer, diloco
from lowbw.strategies._fedadam import fedadam
from lowbw.strategies._fedavg import fedavg
from lowbw.strategies._hierarchical_diloco import hierarchical_diloco
from lowbw.strategies._muloco import muloco
from lowbw.strategies._optim import hidden_matrices, muon_inner
from lowbw.strategies._optim import (Optimizer, inner_optimizer, outer,
                                     outer_optimizer, unit_schedule)
from lowbw.strategies._schedule import OuterScheduleState, peak_schedule
from lowbw.strategies._stale import cgad, cgad_scale, scale_by_age
from lowbw.strategies._stale import (HeLoCoState, heloco, heloco_block,
                                     stale_outer)
from lowbw.strategies import _snoo
from lowbw.strategies._snoo import snoo, snoo_optimizer
from lowbw.strategies._spec import Param, Spec
from lowbw.strategies._spec import spec as make_spec
from lowbw.strategies._noloco import noloco
from lowbw.strategies import _gasloc
from lowbw.strategies._gasloc import gasloc
from lowbw.strategies import _partial_updates
from lowbw.strategies._partial_updates import partial_updates
from lowbw.strategies._sparseloco import sparseloco
from lowbw.strategies._spes import spes
from lowbw.strategies._sparta import sparta
from lowbw.strategies._sparta_diloco import sparta_diloco
from lowbw.strategies._streaming_diloco import streaming_diloco

# One line per strategy: its module's SPEC (factory, parameters, defaults).
SPECS: dict[str, Spec] = {spec.name: spec for spec in (
    _ddp.SPEC,
    _fedavg.SPEC,
    _diloco.SPEC,
    _fedadam.SPEC,
    _sparta.SPEC,
    _sparta_diloco.SPEC,
    _muloco.SPEC,
    _demo.SPEC,
    _streaming_diloco.SPEC,
    _hierarchical_diloco.SPEC,
    _spes.SPEC,
    _async_diloco.SPEC,
    _decoupled_diloco.SPEC,
    _sparseloco.SPEC,
    _desloc.SPEC,
    _mtdao.SPEC,
    _noloco.SPEC,
    _snoo.SPEC,
    _partial_updates.SPEC,
    _gasloc.SPEC,
)}
REGISTRY = {name: spec.factory for name, spec in SPECS.items()}
_BUILT_IN = frozenset(SPECS)


def register(spec_: Spec) -> None:
  """Makes a strategy of your own (its module's ``spec(factory, ...)``) one
  that ``lowbw.Config(strategy=NAME)``, ``lowbw train --strategy NAME``,
  config files and studies can name, as the built-in ones. Its parameters
  become settings (flags) as theirs do: register it before ``lowbw.Config``
  is first made, e.g. from a module named in ``LOWBW_PLUGINS``, which
  ``import lowbw`` imports first.

  Example:
    >>> SPEC = lowbw.strategies.make_spec(my_diloco, inner=..., outer=...,
    ...                                   paper="...", help={...})
    >>> lowbw.strategies.register(SPEC)
  """
  if not isinstance(spec_, Spec):
    raise _validate.fail("spec", spec_, "expected a lowbw.strategies.Spec "
                         "(made by lowbw.strategies.make_spec)")
  if spec_.name in _BUILT_IN:
    raise _validate.fail("spec", spec_.name, "is a built-in strategy")
  SPECS[spec_.name] = spec_
  REGISTRY[spec_.name] = spec_.factory


def get(name: str, **kwargs) -> Strategy:
  """A strategy by registry name, e.g. ``get("diloco", H=50)``."""
  _validate.one_of("strategy", name, REGISTRY)
  return REGISTRY[name](**kwargs)


def spec(name: str) -> Spec:
  """The ``Spec`` of a registered strategy (its parameters and defaults)."""
  _validate.one_of("strategy", name, SPECS)
  return SPECS[name]


def paper_inner(name: str, steps: int):
  """The inner optimizer of strategy ``name``'s paper with its schedule over
  a run of ``steps`` steps (MuLoCo: a 7.3 % warm-up, then cosine to 0.1x;
  SPES: 4 %, then cosine to 0.1x; a constant rate where the paper states no
  schedule). A factory called without ``inner=`` cannot know the run's
  length and trains at the constant peak; ``lowbw.Config`` and ``lowbw
  train`` apply the schedule themselves.

  Example:
    >>> strategy = lowbw.strategies.muloco(
    ...     inner=lowbw.strategies.paper_inner("muloco", steps=2000))
  """
  return _optim.paper_inner(spec(name).inner,
                            _validate.positive_int("steps", steps))


__all__ = [
    "make_spec", "register",
    "async_diloco", "delayed_nesterov", "Optimizer", "Param", "REGISTRY", "SPECS",
    "Spec", "spec", "Strategy", "StrategyState", "ddp", "demo", "desloc",
    "default_inner", "default_outer", "diloco", "fedadam", "fedavg", "get",
    "hierarchical_diloco", "inner_optimizer", "paper_inner", "outer_optimizer",
    "unit_schedule",
    "hidden_matrices", "muloco", "noloco", "muon_inner", "OuterScheduleState",
    "peak_schedule", "sparseloco", "spes", "sparta", "sparta_diloco", "streaming_diloco",
    "outer", "snoo", "snoo_optimizer",
    "mtdao", "multi_timescale",
    "cgad", "cgad_scale", "scale_by_age",
    "stale_outer", "heloco", "heloco_block", "HeLoCoState",
    "partial_updates", "decoupled_diloco", "gasloc",
    "client_strategies", "sampled_clients",
]
