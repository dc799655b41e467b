"""Counterfactual lanes (``lanes``): the run again, in the same compiled
program, with one cause removed or changed.

A lane is a ``lowbw.Config``: the run's given settings with the lane's
settings back to their defaults (or, for a codec lane, another codec),
resolved the normal way. The simulation steps every lane beside the run
on the same batches, initialisation and keys (``simulation._lanes``), so
the difference between the run and a lane is that one cause's cost.

Each cause's lane is one ``Lane`` in ``LANES``: the settings it resets
and how to tell whether the run has the cause at all (a lane that removes
nothing is refused when the config is made). Three kinds change a setting
instead: ``codec=SPEC`` (another codec), ``SETTING=VALUE`` (another value
of one of the strategy's settings: ``quorum=4``) and ``ddp`` (the method
replaced by DDP, with the run's inner optimizer, on the same fleet).
"""

from typing import Any, Callable, NamedTuple

from lowbw import _validate
from lowbw.config import _fields, _resolve, _strategy_fields

FIELD = "lanes"
CODEC_PREFIX = "codec="
# The fault settings besides the Byzantine workers (their own lane).
FAULTS = ("drop_prob", "message_loss", "failures", "windows", "joins")
BYZANTINE = ("byzantine", "byzantine_kind", "byzantine_scale")
STRAGGLERS = ("speeds", "jitter")
# What a lane leaves out whatever its kind: outputs of the run that only
# the run logs (the paired DDP replica, per-worker evaluations, the
# correlation probe) would cost each lane their compute for nothing.
RUN_ONLY = (FIELD, "shadow", "eval_local", "correlation_every")


class Lane(NamedTuple):
  """One kind of lane.

  Attributes:
    removes: what it takes away, for errors and the docs.
    fields: the settings it gives back their defaults.
    present: ``present(network) -> bool``: the run's network has the
      cause (a lane without it is refused).
  """

  removes: str
  fields: tuple
  present: Callable[[Any], bool]


def _faults(network) -> bool:
  f = network.faults
  return f is not None and bool(
      f.drop_prob or f.message_loss or f.failures or f.windows or f.joins)


def _byzantine(network) -> bool:
  return network.faults is not None and bool(network.faults.byzantine)


def _stragglers(network) -> bool:
  jitter = network.stragglers is not None and network.stragglers.jitter > 0
  speeds = network.hardware is not None and network.hardware.speeds
  uneven = bool(speeds) and len(set(map(float, speeds))) > 1
  return jitter or uneven or network.speed_trace is not None


LANES = {
    "no_faults": Lane("drops, lost messages, failures, down windows and "
                      "late joins (" + ", ".join(FAULTS) + ")", FAULTS,
                      _faults),
    "no_stragglers": Lane("uneven speeds and jitter (speeds, jitter)",
                          STRAGGLERS, _stragglers),
    "no_byzantine": Lane("Byzantine workers (byzantine)", BYZANTINE,
                         _byzantine),
}
DDP = "ddp"
KINDS = (*LANES, CODEC_PREFIX + "SPEC", "SETTING=VALUE", DDP)


class Run(NamedTuple):
  """What a lane is made from: the run's resolved settings ``s``, the
  network it built, the settings its strategy owns, and its period and
  rounds per compiled chunk."""

  s: dict
  network: Any
  owned: set
  period: int
  rounds_per_chunk: int


def names(value) -> tuple[str, ...]:
  """``lanes`` as a tuple of names: one name, or a list of them."""
  if value is None:
    return ()
  items = [value] if isinstance(value, str) else value
  if not isinstance(items, (list, tuple)) or not all(
      isinstance(v, str) and v.strip() for v in items):
    raise _validate.fail(FIELD, value, "expected lane names (a list, or one "
                         "name): " + ", ".join(KINDS))
  out = tuple(v.strip() for v in items)
  for v in out:
    if out.count(v) > 1:
      raise _validate.fail(FIELD, list(out), f"{v!r} is given twice")
  return out


def changes(name: str, run: Run) -> tuple:
  """``(settings to drop, settings to set)`` that make the run's lane
  ``name``; a ConfigError naming ``lanes`` when the run has no such cause,
  the name is unknown, or a codec lane meets a strategy without a codec."""
  s, network = run.s, run.network
  if name.startswith(CODEC_PREFIX):
    return _codec_changes(name, s, "codec" in run.owned)
  if "=" in name:
    return _setting_changes(name, run)
  if name == DDP:
    return _ddp_changes(run)
  if name not in LANES:
    raise _validate.fail(FIELD, name, "not a lane; expected one of " +
                         ", ".join(KINDS) + _validate.suggest(name, LANES))
  lane = LANES[name]
  if s.get("network") is not None:
    raise _validate.fail(FIELD, name, "a lane changes the network's settings; "
                         "describe the network by its settings, not as a "
                         "network object")
  if network is None or not lane.present(network):
    raise _validate.fail(FIELD, name, f"the run has no {lane.removes} to "
                         "remove (a lane equal to the run measures nothing)")
  return lane.fields, {}


def _codec_changes(name: str, s: dict, takes_codec: bool) -> tuple:
  spec = name[len(CODEC_PREFIX):].strip()
  if not takes_codec:
    raise _validate.fail(FIELD, name, f"strategy {s['strategy']!r} takes no "
                         "codec; a codec lane needs one that does (diloco, "
                         "ddp, sparta, ...)")
  if not spec:
    raise _validate.fail(FIELD, name, "expected codec=SPEC, e.g. codec=none "
                         "or codec=topk:0.1")
  if _same_codec(spec, s.get("codec")):
    raise _validate.fail(FIELD, name, f"the run's codec is {spec!r} already "
                         "(a lane equal to the run measures nothing)")
  if _resolve.uncompressed(spec):
    # Without a codec, what it encodes and its error feedback mean nothing.
    return ("codec", "compress", "ef"), {}
  return (), {"codec": spec}


def _setting_changes(name: str, run: Run) -> tuple:
  """``SETTING=VALUE``: the run with one of its strategy's settings at
  another value (``quorum=4``, ``grace=0``, ``H=50``)."""
  key, text = (part.strip() for part in name.split("=", 1))
  owned = sorted(run.owned)
  if key not in run.owned:
    raise _validate.fail(FIELD, name, f"{key!r} is not a setting of "
                         f"strategy {run.s['strategy']!r}; a setting lane "
                         "changes one of its settings: " + ", ".join(owned)
                         + _validate.suggest(key, owned))
  field = {f.name: f for f in _strategy_fields.fields()}[key]
  try:
    value = _fields.text_value(field, text)
  except _validate.ConfigError as e:
    raise _validate.fail(FIELD, name, f"{key}: {e.allowed}") from None
  if value == run.s.get(key):
    raise _validate.fail(FIELD, name, f"the run's {key} is {value!r} "
                         "already (a lane equal to the run measures "
                         "nothing)")
  return (), {key: value}


def _ddp_changes(run: Run) -> tuple:
  """The run's method replaced by DDP (every worker's gradient averaged at
  every step, uncompressed), on the same fleet and network, with the run's
  inner optimizer; evaluated and chunked as the run is, so that its rounds
  of one step run beside the run's rounds of H."""
  s = run.s
  if not isinstance(s["strategy"], str) or s["strategy"] == DDP:
    raise _validate.fail(FIELD, DDP, "the run's strategy is DDP already, "
                         "or an object (a lane equal to the run measures "
                         "nothing)")
  used = _resolve.used(s)
  # The inner optimizer's settings, at the run's values (the others of the
  # optimizers' group are outer ones, which DDP has not).
  optimizers = [f.name for f in _strategy_fields.fields()
                if f.group == "optimizers"]
  keep = {k: s[k] for k in optimizers if "outer" not in k and k in used}
  outer = [k for k in optimizers if "outer" in k]
  return (*run.owned, "strategy", *outer), {
      "strategy": DDP, **keep, "eval_every": s["eval_every"],
      "rounds_per_chunk": run.rounds_per_chunk * run.period}


def _same_codec(spec: str, codec) -> bool:
  if _resolve.uncompressed(spec) or _resolve.uncompressed(codec):
    return _resolve.uncompressed(spec) and _resolve.uncompressed(codec)
  return isinstance(codec, str) and codec.replace(" ", "") == spec.replace(
      " ", "")


def configs(cls, given: dict, s: dict, built) -> tuple:
  """``((name, Config, reset), ...)``: each lane of a config whose given
  settings are ``given``, resolved ones ``s`` and whose build ``built``
  made; ``reset``: the settings the lane drops or sets (the run's traced
  values of those never reach it)."""
  run = Run(s, built.checked["network"], _resolve.owned_by_strategy(s),
            built.strategy.period, built.checked["rounds_per_chunk"])
  out = []
  for name in names(given.get(FIELD)):
    drop, set_ = changes(name, run)
    values = {k: v for k, v in given.items()
              if k not in drop and k not in RUN_ONLY}
    try:
      out.append((name, cls(**{**values, **set_}),
                  tuple(sorted({*drop, *set_}))))
    except _validate.ConfigError as e:
      raise _validate.fail(FIELD, name, f"its run is not valid: {e}") from None
  return tuple(out)
