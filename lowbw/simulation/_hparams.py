"""Traced hyperparameters: the values a compiled simulator may change per run.

Each name says where its value lives:

* optimizer hyperparameters live in the strategy's state, as the values of
  ``optax.inject_hyperparams`` (lowbw's defaults and CLI wrap every optimizer
  so), or as the peak of a ``lowbw.strategies.peak_schedule``;
* the error-feedback beta lives in every ``ErrorFeedbackState`` of the
  strategy's message path (DeMo's momentum decay included);
* network numbers live in the ``NetParams`` argument of the compiled programs
  and are recomputed on the host from the ``Network`` with the new value.

Neither changes a shape, so ``Simulator.run(hparams=...)`` and ``lowbw.sweep``
never recompile for them; a sweep stacks S such values on a leading axis.
"""

import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from lowbw import _validate
from lowbw import network as net_lib
from lowbw.network import _topology
from lowbw.strategies._schedule import (OPTIONAL_LEAVES, OUTER_SCHEDULE,
                                        OuterScheduleState,
                                        PeakScheduleState,
                                        check_outer_schedule)
from lowbw.transforms import ErrorFeedbackState


class Knob(NamedTuple):
  where: str   # "inner" | "outer" | "global_outer" | "message" | "network"
  key: str     # the injected hyperparameter, or the network quantity
  help: str
  absent: str = ""  # why a build may keep no place for it, and the remedy


KNOBS = {
    "inner_lr": Knob("inner", "learning_rate",
                     "inner learning rate (a schedule's peak)"),
    "inner_weight_decay": Knob("inner", "weight_decay",
                               "inner optimizer's weight decay"),
    "inner_momentum": Knob("inner", "momentum", "inner SGD momentum"),
    "inner_b1": Knob("inner", "b1", "inner Adam's first-moment decay"),
    "inner_b2": Knob("inner", "b2", "inner Adam's second-moment decay"),
    "inner_eps": Knob("inner", "eps", "inner Adam's epsilon"),
    "outer_lr": Knob("outer", "learning_rate", "outer learning rate"),
    "outer_momentum": Knob("outer", "momentum", "outer momentum"),
    "outer_b1": Knob("outer", "b1", "outer Adam's first-moment decay"),
    "outer_b2": Knob("outer", "b2", "outer Adam's second-moment decay"),
    "outer_eps": Knob("outer", "eps", "outer Adam's epsilon"),
    **{"outer_" + name: Knob("outer", name, f"outer schedule: {name}",
                             OPTIONAL_LEAVES.get(name, ""))
       for name in OUTER_SCHEDULE},
    "global_outer_lr": Knob("global_outer", "learning_rate",
                            "global outer learning rate (hierarchical "
                            "DiLoCo's wide-area tier)"),
    "global_outer_momentum": Knob("global_outer", "momentum",
                                  "global outer momentum"),
    "ef_beta": Knob("message", "beta",
                    "error-feedback beta in [0, 1] (DeMo: momentum decay)"),
    "bandwidth": Knob("network", "bandwidth",
                      "WAN bandwidth per worker (\"100Mbps\" or bit/s)"),
    "latency": Knob("network", "latency",
                    "one-way latency per hop (\"50ms\" or seconds)"),
    "jitter": Knob("network", "jitter", "straggler lognormal sigma"),
    "drop_prob": Knob("network", "drop_prob",
                      "probability a worker is down for a round"),
    "message_loss": Knob("network", "message_loss",
                         "probability a worker's message is lost"),
}


def check_names(field: str, values: dict) -> dict:
  """``values`` with every name a known knob; else one line listing them."""
  if not isinstance(values, dict):
    raise _validate.fail(field, values, "expected a dict of name -> value")
  for name in values:
    if name not in KNOBS:
      raise _validate.fail(
          field, name, "not a traced hyperparameter; expected one of " +
          ", ".join(map(repr, KNOBS)) + _validate.suggest(name, KNOBS) +
          " (shapes such as workers, H or a codec's size need a new "
          "lowbw.build)")
  return dict(values)


def split(values: dict) -> tuple[dict, dict]:
  """(state values, network values)."""
  state = {k: v for k, v in values.items() if KNOBS[k].where != "network"}
  net = {k: v for k, v in values.items() if KNOBS[k].where == "network"}
  return state, net


# ----------------------------------------------------------------- the state
def _is_node(x) -> bool:
  return isinstance(x, (PeakScheduleState, OuterScheduleState)) or (
      hasattr(x, "hyperparams") and hasattr(x, "hyperparams_states"))


def _nodes(tree) -> list:
  return [x for x in jax.tree.leaves(tree, is_leaf=_is_node) if _is_node(x)]


def _settable(node, key: str) -> bool:
  if isinstance(node, OuterScheduleState):
    return key in node.peaks or key in node.shape
  if isinstance(node, PeakScheduleState):
    return key == "learning_rate" or any(
        _settable(n, key) for n in _nodes(node.inner_state))
  return key in node.hyperparams


def _scheduled(tree, key: str) -> bool:
  return any(not isinstance(n, (PeakScheduleState, OuterScheduleState)) and
             key in n.hyperparams_states for n in _nodes(tree))


def _place(strategy, where: str) -> str | None:
  """The ``comm`` field holding optimizer ``where``'s state, as the strategy
  declares it (``Strategy.outer_places``); "" for a strategy that does not
  say (its whole ``comm`` is searched for ``outer``); None if it has no such
  optimizer."""
  places = strategy.outer_places
  if places is None:
    return "" if where == "outer" else None
  return places.get(where)


def _part(sim_state, where: str, strategy):
  """The part of the state holding knob place ``where`` (None: absent)."""
  st = sim_state.strategy
  if where == "inner":
    return st.inner_W
  field = _place(strategy, where)
  return None if field is None else (getattr(st.comm, field) if field
                                     else st.comm)


def _with_part(sim_state, where: str, strategy, part):
  st = sim_state.strategy
  if where == "inner":
    st = st._replace(inner_W=part)
  else:
    field = _place(strategy, where)
    st = st._replace(comm=st.comm._replace(**{field: part}) if field
                     else part)
  return sim_state._replace(strategy=st)


def _is_feedback(x) -> bool:
  return isinstance(x, ErrorFeedbackState)


def _feedback(tree) -> list:
  return [x for x in jax.tree.leaves(tree, is_leaf=_is_feedback)
          if _is_feedback(x)]


def check_state_knobs(sim_state, strategy, values: dict) -> None:
  """Each state knob has a place in ``sim_state`` (abstract is fine), where
  ``strategy`` says its optimizers live."""
  strategy_name = strategy.name
  for name, value in values.items():
    if (isinstance(value, bool) or not isinstance(value, (int, float)) or
        not math.isfinite(value)):
      raise _validate.fail(name, value, "expected a finite number")
    knob = KNOBS[name]
    if knob.key == "learning_rate":
      _validate.positive_float(name, value)
    elif knob.key == "weight_decay":
      _validate.non_negative(name, value)
    elif knob.key == "momentum":
      _validate.momentum(name, value)
    elif knob.key in OUTER_SCHEDULE:
      check_outer_schedule({knob.key: value})
    if knob.where == "message":
      _validate.fraction(name, value, low_open=False)
      if not _feedback(sim_state.strategy.comm):
        raise _validate.fail(
            name, value, f"strategy {strategy_name!r} runs no error feedback "
            "(give it a codec and error_feedback=)")
      continue
    part = _part(sim_state, knob.where, strategy)
    if part is None:
      raise _validate.fail(name, value, f"strategy {strategy_name!r} has no "
                           f"{knob.where.replace('_', ' ')} optimizer")
    if knob.key == "learning_rate" and _scheduled(part, knob.key):
      raise _validate.fail(
          name, values[name], f"the {knob.where} learning rate is an optax "
          "schedule, whose peak is a constant; build it with "
          "lowbw.strategies.peak_schedule(...) to sweep its peak")
    if not any(_settable(n, knob.key) for n in _nodes(part)):
      raise _validate.fail(name, values[name], _not_settable(
          strategy_name, knob))


def _not_settable(strategy_name: str, knob) -> str:
  """Why a knob has no place in the state, and what gives it one."""
  if knob.absent:  # a leaf kept only by builds that use it
    return f"strategy {strategy_name!r}: {knob.absent}"
  return (f"strategy {strategy_name!r}'s {knob.where} optimizer exposes no "
          f"{knob.key!r} (wrap it with optax.inject_hyperparams; see "
          "docs/sweeps.md)")


def _set(tree, key: str, value):
  def one(node):
    if not _is_node(node):
      return node
    if isinstance(node, OuterScheduleState):
      for part in ("peaks", "shape"):
        values = getattr(node, part)
        if key in values:
          return node._replace(**{part: {**values, key: _like(values[key],
                                                               value)}})
      return node
    if isinstance(node, PeakScheduleState):
      if key == "learning_rate":
        return node._replace(peak_lr=_like(node.peak_lr, value))
      return node._replace(inner_state=_set(node.inner_state, key, value))
    if key in node.hyperparams:
      hyper = dict(node.hyperparams)
      hyper[key] = _like(hyper[key], value)
      return node._replace(hyperparams=hyper)
    return node
  return jax.tree.map(one, tree, is_leaf=_is_node)


def _set_beta(tree, value):
  return jax.tree.map(
      lambda n: n._replace(beta=_like(n.beta, value)) if _is_feedback(n)
      else n, tree, is_leaf=_is_feedback)


def _like(old, value):
  return jnp.broadcast_to(jnp.asarray(value, old.dtype), old.shape)


def set_state(sim_state, values: dict, strategy):
  """``sim_state`` with each state knob set where ``strategy`` says it lives
  (traceable; values may be traced scalars)."""
  for name, value in values.items():
    knob = KNOBS[name]
    if knob.where == "message":
      st = sim_state.strategy
      sim_state = sim_state._replace(strategy=st._replace(
          comm=_set_beta(st.comm, value)))
      continue
    part = _part(sim_state, knob.where, strategy)
    sim_state = _with_part(sim_state, knob.where, strategy,
                           _set(part, knob.key, value))
    if knob.where == "inner" and sim_state.shadow is not None:
      # The paired DDP lane applies the inner optimizer too (``_shadow``).
      shadow = sim_state.shadow
      sim_state = sim_state._replace(shadow=shadow._replace(
          inner=_set(shadow.inner, knob.key, value)))
  return sim_state


# --------------------------------------------------------------- the network
def set_network(net, values: dict):
  """A ``Network`` with the network knobs replaced (validated on the host)."""
  if not values:
    return net
  if net is None:
    name = next(iter(values))
    raise _validate.fail(name, values[name],
                         "needs a network= at build (the run has no clock)")
  topo = net.topology
  wan = topo.link if isinstance(topo, _topology.Flat) else topo.wan
  for name, value in values.items():
    if name in ("bandwidth", "latency"):  # one for all, or one per worker
      if name == "bandwidth" and net.bandwidth_trace is not None:
        raise _validate.fail(name, value, "the network's bandwidth is a "
                             "trace (bandwidth_trace); it cannot also be "
                             "swept")
      wan = _topology.relinked(wan, **{name: value})
    elif name == "jitter":
      stragglers = net.stragglers or net_lib.Stragglers()
      net = net._replace(stragglers=stragglers._replace(jitter=value))
    else:
      if net.faults is None:
        raise _validate.fail(
            name, value, "needs a network built with faults= (the fault "
            "masks are compiled in only then; Faults() with zero "
            "probabilities compiles them)")
      net = net._replace(faults=net.faults._replace(**{name: value}))
  topo = (topo._replace(link=wan) if isinstance(topo, _topology.Flat)
          else topo._replace(wan=wan))
  return net._replace(topology=topo)


def jsonable(values: dict) -> dict[str, Any]:
  return {k: v if isinstance(v, (str, int, float)) else float(v)
          for k, v in values.items()}

